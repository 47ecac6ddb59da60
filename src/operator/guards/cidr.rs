//! CIDR blocks as the installer writes them (`10.0.0.0/8`, `169.254.169.254/32`, `fd00::/8`),
//! read strictly: a block with host bits set or a prefix longer than its family allows is
//! refused at start-up rather than read as something the installer did not mean.

use std::fmt;
use std::net::IpAddr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `address/prefix`; a bare address is one host (`/32`, `/128`).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("'{text}' is not a CIDR block (e.g. 10.0.0.0/8 or fd00::/8)"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| p.parse::<u8>().ok())
                .flatten()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("'{text}': the prefix length must be 0 to {max}"))?,
        };
        let cidr = Cidr { network, prefix };
        if cidr.masked(network) != bits(network) {
            return Err(format!(
                "'{text}' has bits set beyond its /{prefix} prefix; write the network address"
            ));
        }
        Ok(cidr)
    }

    /// Whether `addr` is in this block. An IPv4 address written as IPv6 (`::ffff:a.b.c.d`)
    /// is compared as the IPv4 address it is, so it cannot slip past an IPv4 block.
    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = match addr {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
            v4 => v4,
        };
        addr.is_ipv4() == self.network.is_ipv4() && self.masked(addr) == bits(self.network)
    }

    /// Whether every address of `other` is in this block (blocks of one family only: a
    /// NetworkPolicy cannot cut an IPv6 block out of an IPv4 one).
    pub fn covers(&self, other: &Cidr) -> bool {
        other.is_ipv4() == self.is_ipv4()
            && other.prefix >= self.prefix
            && self.contains(other.network)
    }

    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    fn masked(&self, addr: IpAddr) -> u128 {
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let host_bits = width - u32::from(self.prefix);
        let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
        bits(addr) & mask
    }
}

fn bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// A list of blocks from the operator's flags; the first bad one stops the operator.
pub fn parse_list(flag: &str, items: &[String]) -> Result<Vec<Cidr>, String> {
    items
        .iter()
        .map(|i| i.trim())
        .filter(|i| !i.is_empty())
        .map(|i| Cidr::parse(i).map_err(|e| format!("{flag}: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).expect("a block")
    }

    #[test]
    fn ipv4_blocks_contain_their_addresses_only() {
        let metadata = cidr("169.254.169.254/32");
        assert!(metadata.contains(ip("169.254.169.254")));
        assert!(!metadata.contains(ip("169.254.169.253")));
        let ten = cidr("10.0.0.0/8");
        assert!(ten.contains(ip("10.255.1.2")) && !ten.contains(ip("11.0.0.0")));
        let all = cidr("0.0.0.0/0");
        assert!(all.contains(ip("203.0.113.9")) && !all.contains(ip("2001:db8::1")));
        assert_eq!(cidr("192.0.2.7"), cidr("192.0.2.7/32"));
        // An IPv4 address in IPv6 form is still that IPv4 address.
        assert!(metadata.contains(ip("::ffff:169.254.169.254")));
    }

    #[test]
    fn ipv6_blocks_contain_their_addresses_only() {
        let ula = cidr("fd00::/8");
        assert!(ula.contains(ip("fd12:3456::1")) && !ula.contains(ip("fe80::1")));
        let all = cidr("::/0");
        assert!(all.contains(ip("2001:db8::1")) && !all.contains(ip("10.0.0.1")));
        let one = cidr("fd00:ec2::254/128");
        assert!(one.contains(ip("fd00:ec2::254")) && !one.contains(ip("fd00:ec2::253")));
        assert!(ula.covers(&one) && !one.covers(&ula));
        assert!(!cidr("10.0.0.0/8").covers(&one));
        assert!(!cidr("0.0.0.0/0").covers(&cidr("::ffff:10.0.0.0/104")));
    }

    #[test]
    fn malformed_blocks_are_refused_with_what_is_wrong() {
        for (bad, says) in [
            ("10.0.0.0/33", "0 to 32"),
            ("fd00::/129", "0 to 128"),
            ("10.0.0.1/8", "network address"),
            ("10.0.0.0/", "prefix"),
            ("10.0.0.0/+8", "prefix"),
            ("10.0.0/8", "not a CIDR"),
            ("example.com/32", "not a CIDR"),
            ("", "not a CIDR"),
        ] {
            let e = Cidr::parse(bad).err().unwrap_or_else(|| panic!("{bad}"));
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = parse_list("--probe-deny-cidrs", &["10.0.0.0/8".into(), "x".into()])
            .err()
            .unwrap_or_default();
        assert!(e.starts_with("--probe-deny-cidrs: 'x'"), "{e}");
    }
}
