//! Pod IPs: a pool of loopback addresses, one per running pod.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RangeError {
    #[error("pod IP range {0:?} is not FIRST-LAST with IPv4 addresses")]
    Syntax(String),
    #[error(
        "pod IP range {0:?} must lie in 127.0.0.0/8, not include 127.0.0.1, and have FIRST <= LAST"
    )]
    Bounds(String),
}

#[derive(Debug)]
pub struct IpPool {
    first: u32,
    last: u32,
    /// address -> owner (pod uid)
    used: BTreeMap<u32, String>,
}

impl IpPool {
    /// Parses `127.0.1.1-127.0.1.254`.
    pub fn parse(range: &str) -> Result<Self, RangeError> {
        let (a, b) = range
            .split_once('-')
            .ok_or_else(|| RangeError::Syntax(range.to_string()))?;
        let parse = |s: &str| {
            s.trim()
                .parse::<Ipv4Addr>()
                .map_err(|_| RangeError::Syntax(range.to_string()))
        };
        let (first, last) = (u32::from(parse(a)?), u32::from(parse(b)?));
        let loopback = |x: u32| Ipv4Addr::from(x).octets()[0] == 127;
        let localhost = u32::from(Ipv4Addr::LOCALHOST);
        if first > last
            || !loopback(first)
            || !loopback(last)
            || (first..=last).contains(&localhost)
        {
            return Err(RangeError::Bounds(range.to_string()));
        }
        Ok(Self {
            first,
            last,
            used: BTreeMap::new(),
        })
    }

    /// The owner's address: the one it already has, else `preferred` when free and in
    /// range (a pod keeps its IP across node restarts), else the lowest free one.
    pub fn allocate(&mut self, owner: &str, preferred: Option<&str>) -> Option<Ipv4Addr> {
        if let Some((ip, _)) = self.used.iter().find(|(_, o)| *o == owner) {
            return Some(Ipv4Addr::from(*ip));
        }
        let preferred = preferred
            .and_then(|p| p.parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .filter(|p| (self.first..=self.last).contains(p) && !self.used.contains_key(p));
        let ip = preferred
            .or_else(|| (self.first..=self.last).find(|ip| !self.used.contains_key(ip)))?;
        self.used.insert(ip, owner.to_string());
        Some(Ipv4Addr::from(ip))
    }

    pub fn release(&mut self, owner: &str) {
        self.used.retain(|_, o| o != owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_lowest_free_and_reuses() {
        let mut p = IpPool::parse("127.0.1.1-127.0.1.3").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.allocate("a", None), Some(Ipv4Addr::new(127, 0, 1, 1)));
        assert_eq!(
            p.allocate("b", Some("127.0.1.3")),
            Some(Ipv4Addr::new(127, 0, 1, 3))
        );
        assert_eq!(p.allocate("a", None), Some(Ipv4Addr::new(127, 0, 1, 1)));
        assert_eq!(
            p.allocate("c", Some("127.0.1.3")),
            Some(Ipv4Addr::new(127, 0, 1, 2))
        );
        assert_eq!(p.allocate("d", None), None);
        p.release("a");
        assert_eq!(
            p.allocate("d", Some("10.0.0.1")),
            Some(Ipv4Addr::new(127, 0, 1, 1))
        );
    }

    #[test]
    fn rejects_bad_ranges() {
        assert!(IpPool::parse("127.0.0.1-127.0.0.9").is_err());
        assert!(IpPool::parse("10.0.0.1-10.0.0.9").is_err());
        assert!(IpPool::parse("127.0.1.9-127.0.1.1").is_err());
        assert!(IpPool::parse("127.0.1.1").is_err());
        assert!(IpPool::parse("127.0.1.1-127.0.2.254").is_ok());
    }
}
