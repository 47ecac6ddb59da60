//! What a cluster's Metadata answer may name before the probe follows it. The answer comes from
//! whoever runs the brokers: a hostile one lists tens of thousands of brokers (librdkafka
//! starts a thread for each) or brokers at addresses the operator must not reach (cloud
//! metadata, the apiserver), which librdkafka would connect to for partition leaders and group
//! lists. The probe checks each answer first and refuses the cluster, dropping its client,
//! instead of following it.

use std::net::{IpAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use mirrorflow_conn::AddressCheck;
use rdkafka::metadata::Metadata;

/// The most brokers a cluster's metadata may list: far above real clusters, far below what
/// costs the operator its threads.
pub const MAX_BROKERS: usize = 256;

/// The longest the look-ups of one answer's broker names may take together.
pub const RESOLVE_BUDGET: Duration = Duration::from_secs(5);

/// Why a cluster's metadata was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    TooManyBrokers {
        count: usize,
    },
    /// `broker` (`host:port` as the answer gave it, bounded) and why it may not be reached.
    Address {
        broker: String,
        why: String,
    },
}

/// The refusal for `md`, or `None` when the probe may follow it. Broker names are resolved
/// only when the installer restricts addresses (`check`).
pub fn refusal(md: &Metadata, check: Option<&AddressCheck>) -> Option<Refusal> {
    let brokers: Vec<(String, i32)> = md
        .brokers()
        .iter()
        .take(MAX_BROKERS.saturating_add(1))
        .map(|b| (b.host().to_string(), b.port()))
        .collect();
    judge(
        md.brokers().len(),
        &brokers,
        check,
        |host| {
            (host, 0)
                .to_socket_addrs()
                .map(|a| a.map(|s| s.ip()).collect())
                .map_err(|e| e.to_string())
        },
        Instant::now() + RESOLVE_BUDGET,
    )
}

/// [`refusal`] with the look-up given: `count` brokers listed, the first of them in
/// `brokers`, resolved one by one until `deadline` (brokers left unresolved then are refused:
/// they cannot be checked).
pub fn judge(
    count: usize,
    brokers: &[(String, i32)],
    check: Option<&AddressCheck>,
    resolve: impl Fn(&str) -> Result<Vec<IpAddr>, String>,
    deadline: Instant,
) -> Option<Refusal> {
    if count > MAX_BROKERS {
        return Some(Refusal::TooManyBrokers { count });
    }
    let check = check?;
    let mut seen = std::collections::HashSet::new();
    for (host, port) in brokers {
        if !seen.insert(host.as_str()) {
            continue;
        }
        let broker = crate::status::bounded_text(&format!("{host}:{port}")).into_owned();
        let refused = |why: String| {
            Some(Refusal::Address {
                broker: broker.clone(),
                why,
            })
        };
        if Instant::now() >= deadline {
            return refused(format!(
                "it was not resolved within {}s, so it cannot be checked",
                RESOLVE_BUDGET.as_secs()
            ));
        }
        let addrs = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => match resolve(host) {
                Ok(a) if !a.is_empty() => a,
                Ok(_) => return refused("it resolves to no address".into()),
                Err(e) => return refused(format!("it could not be resolved ({e})")),
            },
        };
        if let Some(why) = addrs.into_iter().find_map(|a| check.check(a).err()) {
            return refused(why);
        }
    }
    None
}

/// The condition's message for a refusal on `side` (`source` or `target`).
pub fn describe(refusal: &Refusal, side: &str) -> String {
    match refusal {
        Refusal::TooManyBrokers { count } => format!(
            "spec.{side}.bootstrapServers: the {side} cluster's metadata lists {count} brokers, more than the {MAX_BROKERS} the operator's probe follows, so it stopped probing this cluster; check that spec.{side}.bootstrapServers names the intended Kafka cluster"
        ),
        Refusal::Address { broker, why } => format!(
            "spec.{side}.bootstrapServers: the {side} cluster's metadata names broker '{broker}', and {why}; the operator stopped probing this cluster before connecting to it; check the brokers' advertised listeners, or ask whoever installed the operator to allow the address (chart value probeAddresses.allow / .deny)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deny_metadata_address() -> AddressCheck {
        AddressCheck::new(|ip: IpAddr| {
            if ip == IpAddr::from([169, 254, 169, 254]) {
                Err(
                    "169.254.169.254 is in 169.254.169.254/32, which the operator may not reach"
                        .into(),
                )
            } else {
                Ok(())
            }
        })
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn brokers(list: &[(&str, i32)]) -> Vec<(String, i32)> {
        list.iter().map(|(h, p)| (h.to_string(), *p)).collect()
    }

    fn no_dns(host: &str) -> Result<Vec<IpAddr>, String> {
        match host {
            "b1.kafka" => Ok(vec![IpAddr::from([10, 0, 0, 1])]),
            "sneaky.kafka" => Ok(vec![
                IpAddr::from([10, 0, 0, 2]),
                IpAddr::from([169, 254, 169, 254]),
            ]),
            _ => Err("NXDOMAIN".into()),
        }
    }

    #[test]
    fn too_many_brokers_are_refused_whatever_the_addresses() {
        assert_eq!(
            judge(MAX_BROKERS + 1, &[], None, no_dns, later()),
            Some(Refusal::TooManyBrokers {
                count: MAX_BROKERS + 1
            })
        );
        assert_eq!(judge(MAX_BROKERS, &[], None, no_dns, later()), None);
        let text = describe(&Refusal::TooManyBrokers { count: 20_000 }, "target");
        assert!(
            text.starts_with(
                "spec.target.bootstrapServers: the target cluster's metadata lists 20000 brokers"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_broker_at_a_denied_address_is_refused_before_it_is_followed() {
        let check = deny_metadata_address();
        let fine = brokers(&[("b1.kafka", 9092), ("10.0.0.3", 9092)]);
        assert_eq!(judge(2, &fine, Some(&check), no_dns, later()), None);
        for (list, says) in [
            (
                &[("b1.kafka", 9092), ("169.254.169.254", 80)][..],
                "169.254.169.254:80",
            ),
            (&[("sneaky.kafka", 9092)], "sneaky.kafka:9092"),
            (&[("gone.kafka", 9092)], "could not be resolved (NXDOMAIN)"),
        ] {
            let r = judge(list.len(), &brokers(list), Some(&check), no_dns, later())
                .unwrap_or_else(|| panic!("{list:?}"));
            let text = describe(&r, "source");
            assert!(
                text.starts_with(
                    "spec.source.bootstrapServers: the source cluster's metadata names broker"
                ) && text.contains(says)
                    && text.contains("probeAddresses"),
                "{text}"
            );
        }
        // Without restrictions nothing is resolved.
        let gone = brokers(&[("gone.kafka", 9092)]);
        assert_eq!(judge(1, &gone, None, no_dns, later()), None);
    }

    #[test]
    fn look_ups_past_the_budget_refuse_rather_than_wait() {
        let check = deny_metadata_address();
        let list = brokers(&[("b1.kafka", 9092)]);
        let r = judge(1, &list, Some(&check), no_dns, Instant::now()).expect("refused");
        assert!(
            matches!(&r, Refusal::Address { why, .. } if why.contains("not resolved within")),
            "{r:?}"
        );
    }
}

#[cfg(test)]
#[path = "brokers_tests.rs"]
mod with_a_broker;
