//! Where the operator's probe may connect. A flow's bootstrap servers may name any host:port,
//! so without a bound the probe is a Kafka-protocol port scanner from the operator's network
//! position (cloud metadata, the apiserver, other tenants' services). The installer lists the
//! CIDR blocks bootstrap servers may resolve to (empty: any) and the blocks they never may;
//! every address a server resolves to must pass, before anything connects to it.

use std::net::IpAddr;
use std::time::Duration;

use super::cidr::{self, Cidr};
use crate::api::MirrorFlow;
use crate::status::{Blocked, reason};

/// The longest all of a flow's bootstrap look-ups may take together.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The installer's allow- and deny-lists for the addresses the probe connects to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AddressPolicy {
    /// Empty: every address not denied.
    pub allow: Vec<Cidr>,
    pub deny: Vec<Cidr>,
}

impl AddressPolicy {
    /// From the operator's flags; a malformed block stops the operator at start-up.
    pub fn from_flags(allow: &[String], deny: &[String]) -> Result<Self, String> {
        Ok(AddressPolicy {
            allow: cidr::parse_list("--probe-allow-cidrs", allow)?,
            deny: cidr::parse_list("--probe-deny-cidrs", deny)?,
        })
    }

    /// Nothing to check: every address passes, so no look-up is needed.
    pub fn is_open(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// The check the probe's connections apply to every address they connect to (`None`
    /// when every address may be reached).
    pub fn connect_check(&self) -> Option<mirrorflow_conn::AddressCheck> {
        let policy = self.clone();
        (!self.is_open()).then(|| {
            mirrorflow_conn::AddressCheck::new(move |a| policy.refusal(a).map_or(Ok(()), Err))
        })
    }

    /// Why `addr` may not be connected to, or `None` when it may.
    pub fn refusal(&self, addr: IpAddr) -> Option<String> {
        if let Some(block) = self.deny.iter().find(|b| b.contains(addr)) {
            return Some(format!(
                "{addr} is in {block}, which the operator may not reach"
            ));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|b| b.contains(addr)) {
            let listed: Vec<String> = self.allow.iter().map(Cidr::to_string).collect();
            return Some(format!(
                "{addr} is outside the blocks the operator may reach ({})",
                listed.join(", ")
            ));
        }
        None
    }
}

/// The host of a `host:port` entry (an IPv6 address without its brackets).
fn host_of(server: &str) -> &str {
    match server.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(h, _)| h),
        None => server.rsplit_once(':').map_or(server, |(h, _)| h),
    }
}

/// Each of the flow's bootstrap servers with the field that names it.
pub fn bootstrap_servers(mf: &MirrorFlow) -> Vec<(&'static str, String)> {
    let side = |field: &'static str, list: &str| {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| (field, s.to_string()))
            .collect::<Vec<_>>()
    };
    let mut all = side(
        "spec.source.bootstrapServers",
        &mf.spec.source.bootstrap_servers,
    );
    all.extend(side(
        "spec.target.bootstrapServers",
        &mf.spec.target.bootstrap_servers,
    ));
    all
}

/// The verdict on one server from what it resolved to: refused when any address is denied
/// or outside the allow-list (a name that also resolves to a forbidden address could be
/// answered with it next time), or when it could not be resolved (it cannot be checked).
pub fn judge(
    policy: &AddressPolicy,
    field: &str,
    server: &str,
    resolved: Result<Vec<IpAddr>, String>,
) -> Option<Blocked> {
    let unreachable = if field.starts_with("spec.source") {
        reason::SOURCE_UNREACHABLE
    } else {
        reason::TARGET_UNREACHABLE
    };
    let addrs = match resolved {
        Ok(addrs) if !addrs.is_empty() => addrs,
        Ok(_) => return Some(unresolved(unreachable, field, server, "no address")),
        Err(e) => return Some(unresolved(unreachable, field, server, &e)),
    };
    let why = addrs.into_iter().find_map(|a| policy.refusal(a))?;
    Some(Blocked::new(
        reason::ADDRESS_NOT_ALLOWED,
        format!(
            "{field}: '{server}' resolves to an address the operator may not connect to ({why}), so the operator neither probes this flow nor runs its replicators; use a broker address the operator may reach, or ask whoever installed the operator to allow it (chart value probeAddresses.allow / .deny)"
        ),
    ))
}

fn unresolved(reason: &'static str, field: &str, server: &str, why: &str) -> Blocked {
    Blocked::new(
        reason,
        format!(
            "{field}: '{server}' could not be resolved ({why}), so it cannot be checked against the addresses the operator may connect to, and the probe does not connect; check the host name and the cluster's DNS"
        ),
    )
}

/// Resolves every bootstrap server of the flow (at once, all within [`RESOLVE_TIMEOUT`]) and
/// judges them: the first forbidden address, else the first server that did not resolve, or
/// `None` when all may be reached. No look-up when the policy is open.
pub async fn bootstrap_refusal(mf: &MirrorFlow, policy: &AddressPolicy) -> Option<Blocked> {
    if policy.is_open() {
        return None;
    }
    let servers = bootstrap_servers(mf);
    let lookups = servers.iter().map(|(_, server)| resolve(server));
    let resolved = tokio::time::timeout(RESOLVE_TIMEOUT, futures::future::join_all(lookups))
        .await
        .unwrap_or_else(|_| {
            let late = format!("no answer within {}s", RESOLVE_TIMEOUT.as_secs());
            servers.iter().map(|_| Err(late.clone())).collect()
        });
    let verdicts: Vec<Blocked> = servers
        .iter()
        .zip(resolved)
        .filter_map(|((field, server), r)| judge(policy, field, server, r))
        .collect();
    // A forbidden address is the news, whatever else did not resolve.
    let refused = verdicts
        .iter()
        .position(|b| b.reason == reason::ADDRESS_NOT_ALLOWED)
        .unwrap_or(0);
    verdicts.into_iter().nth(refused)
}

async fn resolve(server: &str) -> Result<Vec<IpAddr>, String> {
    let host = host_of(server);
    // An address needs no look-up (and `lookup_host` wants a port anyway).
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    tokio::net::lookup_host((host, 0))
        .await
        .map(|addrs| addrs.map(|a| a.ip()).collect())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> AddressPolicy {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        AddressPolicy::from_flags(&list(allow), &list(deny)).expect("valid blocks")
    }

    fn ips(list: &[&str]) -> Result<Vec<IpAddr>, String> {
        Ok(list
            .iter()
            .map(|s| s.parse().expect("an address"))
            .collect())
    }

    const FIELD: &str = "spec.source.bootstrapServers";

    #[test]
    fn denied_or_unlisted_addresses_are_refused_naming_the_field_and_the_fix() {
        let p = policy(
            &["10.0.0.0/8", "fd00::/8"],
            &["169.254.169.254/32", "10.96.0.0/12"],
        );
        for ok in [&["10.1.2.3"][..], &["fd00::5", "10.0.0.1"]] {
            assert_eq!(judge(&p, FIELD, "kafka:9092", ips(ok)), None, "{ok:?}");
        }
        for (bad, says) in [
            (&["169.254.169.254"][..], "in 169.254.169.254/32"),
            (&["10.96.0.1"], "in 10.96.0.0/12"),
            (&["192.168.1.1"], "outside the blocks"),
            // One good address does not excuse a bad one: DNS may answer with either.
            (&["10.1.2.3", "169.254.169.254"], "169.254.169.254/32"),
            (&["2001:db8::1"], "outside"),
        ] {
            let b = judge(&p, FIELD, "evil:80", ips(bad)).expect("refused");
            assert_eq!(b.reason, reason::ADDRESS_NOT_ALLOWED);
            assert!(
                b.message
                    .starts_with("spec.source.bootstrapServers: 'evil:80'")
                    && b.message.contains(says)
                    && b.message.contains("probeAddresses"),
                "{bad:?}: {}",
                b.message
            );
        }
    }

    #[test]
    fn an_empty_allow_list_allows_all_but_the_denied() {
        let p = policy(&[], &["169.254.169.254/32"]);
        assert_eq!(judge(&p, FIELD, "k:1", ips(&["203.0.113.7"])), None);
        assert!(judge(&p, FIELD, "k:1", ips(&["169.254.169.254"])).is_some());
        assert!(judge(&p, FIELD, "k:1", ips(&["::ffff:169.254.169.254"])).is_some());
        assert!(AddressPolicy::default().is_open() && !p.is_open());
    }

    #[test]
    fn a_server_that_does_not_resolve_is_not_connected_to() {
        let p = policy(&[], &["169.254.169.254/32"]);
        let b = judge(
            &p,
            "spec.target.bootstrapServers",
            "nowhere:9092",
            Err("NXDOMAIN".into()),
        )
        .expect("refused");
        assert_eq!(b.reason, reason::TARGET_UNREACHABLE);
        assert!(
            b.message.contains("could not be resolved (NXDOMAIN)"),
            "{}",
            b.message
        );
        assert!(judge(&p, FIELD, "k:1", ips(&[])).is_some());
    }

    #[test]
    fn hosts_are_read_from_both_sides_and_ipv6_brackets() {
        assert_eq!(host_of("[fd00::1]:9092"), "fd00::1");
        assert_eq!(host_of("kafka.example:9092"), "kafka.example");
        let spec = serde_yaml::from_str(
            "source: {alias: a, bootstrapServers: 'a1:1,[fd00::1]:2'}\ntarget: {alias: b, bootstrapServers: 'b:3'}\n",
        )
        .expect("a spec");
        let mf = MirrorFlow::new("f", spec);
        assert_eq!(
            bootstrap_servers(&mf),
            [
                ("spec.source.bootstrapServers", "a1:1".to_string()),
                ("spec.source.bootstrapServers", "[fd00::1]:2".to_string()),
                ("spec.target.bootstrapServers", "b:3".to_string()),
            ]
        );
    }

    #[tokio::test]
    async fn the_check_resolves_and_refuses_before_any_connection() {
        let spec = serde_yaml::from_str(
            "source: {alias: a, bootstrapServers: '10.0.0.1:9092'}\ntarget: {alias: b, bootstrapServers: '[::ffff:169.254.169.254]:80'}\n",
        )
        .expect("a spec");
        let mf = MirrorFlow::new("f", spec);
        let b = bootstrap_refusal(&mf, &policy(&[], &["169.254.169.254/32"]))
            .await
            .expect("the target is refused");
        assert!(
            b.message.starts_with("spec.target.bootstrapServers"),
            "{}",
            b.message
        );
        assert_eq!(
            bootstrap_refusal(&mf, &AddressPolicy::default()).await,
            None
        );
        // A name, resolved by the system resolver.
        let local = serde_yaml::from_str(
            "source: {alias: a, bootstrapServers: 'localhost:9092'}\ntarget: {alias: b, bootstrapServers: '10.0.0.2:1'}\n",
        )
        .expect("a spec");
        let b = bootstrap_refusal(&MirrorFlow::new("f", local), &policy(&["10.0.0.0/8"], &[]))
            .await
            .expect("localhost is outside 10/8");
        assert!(b.message.contains("'localhost:9092'"), "{}", b.message);
    }
}
