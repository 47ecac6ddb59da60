//! The NetworkPolicy in front of a flow's replicator pods: their `/metrics` names the flow's
//! topics and groups, so only the scrapers the installer names may reach port 9464, and no
//! other ingress is allowed. Egress stays open unless the installer lists the CIDR blocks the
//! replicators may reach (a flow's brokers can be anywhere, so only the installer can say) or
//! blocks no flow may reach (the probe's deny-list, e.g. cloud metadata), which are cut out.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;

use super::guards::cidr::{self, Cidr};

/// What the installer decided for replicator pods' network (chart value
/// `replicatorNetworkPolicy`, given to the operator as JSON).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicatorNetwork {
    /// Off: no NetworkPolicy per flow (one applied earlier is deleted).
    pub enabled: bool,
    /// Who may scrape the replicators' metrics port; empty: no one (ingress denied).
    pub metrics_from: Vec<NetworkPolicyPeer>,
    /// The blocks replicators may connect to; empty: egress open.
    pub egress: Vec<Cidr>,
    /// Where replicators may ask DNS (port 53) when egress is restricted.
    pub dns_to: Vec<NetworkPolicyPeer>,
    /// Blocks replicators may never reach (the probe's deny-list), cut out of their egress.
    pub deny: Vec<Cidr>,
}

/// The JSON the chart renders.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    metrics_from: Vec<NetworkPolicyPeer>,
    #[serde(default)]
    egress_cidrs: Vec<String>,
    #[serde(default)]
    dns_to: Vec<NetworkPolicyPeer>,
}

impl ReplicatorNetwork {
    /// From the operator's flag (JSON); empty text: no NetworkPolicy. Refused at start-up when
    /// it is not the expected JSON or a block is malformed.
    pub fn from_json(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(ReplicatorNetwork::default());
        }
        let s: Settings = serde_json::from_str(text)
            .map_err(|e| format!("--replicator-network-policy: not the expected JSON ({e})"))?;
        Ok(ReplicatorNetwork {
            enabled: s.enabled,
            metrics_from: s.metrics_from,
            egress: cidr::parse_list("--replicator-network-policy: egressCidrs", &s.egress_cidrs)?,
            dns_to: s.dns_to,
            deny: Vec::new(),
        })
    }

    /// The same, with `deny` kept out of replicator egress too.
    pub fn with_denied(self, deny: &[Cidr]) -> Self {
        ReplicatorNetwork {
            deny: deny.to_vec(),
            ..self
        }
    }
}

fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    }
}

/// The policy's spec for pods matching `selector` whose metrics listen on `metrics_port`.
pub fn spec(
    settings: &ReplicatorNetwork,
    selector: BTreeMap<String, String>,
    metrics_port: i32,
) -> NetworkPolicySpec {
    // A rule with no peers would admit everyone: with no scraper named, there is no rule.
    let ingress = if settings.metrics_from.is_empty() {
        Vec::new()
    } else {
        vec![NetworkPolicyIngressRule {
            from: Some(settings.metrics_from.clone()),
            ports: Some(vec![tcp(metrics_port)]),
        }]
    };
    let mut policy_types = vec!["Ingress".to_string()];
    let egress = (!settings.egress.is_empty() || !settings.deny.is_empty()).then(|| {
        policy_types.push("Egress".into());
        egress_rules(settings)
    });
    NetworkPolicySpec {
        pod_selector: Some(LabelSelector {
            match_labels: Some(selector),
            ..LabelSelector::default()
        }),
        policy_types: Some(policy_types),
        ingress: Some(ingress),
        egress,
    }
}

/// The blocks replicators may reach: the allow-list, or everything when there is none, less
/// the deny-list. A NetworkPolicy can only cut a strictly smaller block out of a larger one
/// (`except`); an allowed block inside a denied one is dropped whole.
fn reachable(settings: &ReplicatorNetwork) -> Vec<NetworkPolicyPeer> {
    let everything = || {
        ["0.0.0.0/0", "::/0"]
            .into_iter()
            .filter_map(|c| Cidr::parse(c).ok())
            .collect()
    };
    let allowed: Vec<Cidr> = if settings.egress.is_empty() {
        everything()
    } else {
        settings.egress.clone()
    };
    allowed
        .into_iter()
        .filter(|a| !settings.deny.iter().any(|d| d.covers(a)))
        .map(|a| {
            let except: Vec<String> = settings
                .deny
                .iter()
                .filter(|d| a.covers(d))
                .map(Cidr::to_string)
                .collect();
            NetworkPolicyPeer {
                ip_block: Some(IPBlock {
                    cidr: a.to_string(),
                    except: (!except.is_empty()).then_some(except),
                }),
                ..NetworkPolicyPeer::default()
            }
        })
        .collect()
}

fn egress_rules(settings: &ReplicatorNetwork) -> Vec<NetworkPolicyEgressRule> {
    let blocks = reachable(settings);
    let mut rules = vec![NetworkPolicyEgressRule {
        to: Some(blocks),
        ports: None,
    }];
    // With no allow-list DNS is among what is reachable already.
    if !settings.egress.is_empty() && !settings.dns_to.is_empty() {
        let dns = |protocol: &str| NetworkPolicyPort {
            port: Some(IntOrString::Int(53)),
            protocol: Some(protocol.into()),
            ..NetworkPolicyPort::default()
        };
        rules.push(NetworkPolicyEgressRule {
            to: Some(settings.dns_to.clone()),
            ports: Some(vec![dns("UDP"), dns("TCP")]),
        });
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector() -> BTreeMap<String, String> {
        BTreeMap::from([("mirrorflow.io/flow".to_string(), "f".to_string())])
    }

    /// The chart's default settings in namespace `mirrorflow-system`.
    const CHART: &str = r#"{"enabled": true, "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mirrorflow-system"}}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}], "egressCidrs": [], "dnsTo": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]}"#;

    #[test]
    fn only_the_named_scrapers_reach_the_metrics_port_and_egress_stays_open() {
        let settings = ReplicatorNetwork::from_json(CHART).expect("the chart's JSON");
        let spec = spec(&settings, selector(), 9464);
        assert_eq!(
            spec.pod_selector.and_then(|s| s.match_labels),
            Some(selector())
        );
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        assert_eq!(spec.egress, None, "egress open by default");
        let ingress = spec.ingress.expect("ingress rules");
        assert_eq!(ingress.len(), 1);
        assert_eq!(ingress[0].ports, Some(vec![tcp(9464)]));
        let from = ingress[0].from.as_ref().expect("peers");
        assert_eq!(from, &settings.metrics_from);
        assert!(from[0].namespace_selector.is_some() && from[0].pod_selector.is_some());
    }

    #[test]
    fn with_no_scraper_named_all_ingress_is_denied() {
        let settings = ReplicatorNetwork {
            enabled: true,
            ..ReplicatorNetwork::default()
        };
        let spec = spec(&settings, selector(), 9464);
        assert_eq!(spec.ingress, Some(Vec::new()), "no rule, not an empty rule");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    }

    #[test]
    fn an_egress_allow_list_restricts_replicators_to_it_and_dns() {
        let json = CHART.replace(
            r#""egressCidrs": []"#,
            r#""egressCidrs": ["10.20.0.0/16", "fd00::/8"]"#,
        );
        let settings = ReplicatorNetwork::from_json(&json).expect("valid");
        let spec = spec(&settings, selector(), 9464);
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_string(), "Egress".to_string()])
        );
        let egress = spec.egress.expect("egress rules");
        let cidrs: Vec<String> = egress[0]
            .to
            .iter()
            .flatten()
            .filter_map(|p| p.ip_block.as_ref().map(|b| b.cidr.clone()))
            .collect();
        assert_eq!(cidrs, ["10.20.0.0/16", "fd00::/8"]);
        assert_eq!(egress[0].ports, None, "any port of those blocks");
        assert_eq!(egress[1].to.as_ref(), Some(&settings.dns_to));
        let dns_ports: Vec<_> = egress[1]
            .ports
            .iter()
            .flatten()
            .map(|p| (p.protocol.clone(), p.port.clone()))
            .collect();
        assert_eq!(
            dns_ports,
            [
                (Some("UDP".into()), Some(IntOrString::Int(53))),
                (Some("TCP".into()), Some(IntOrString::Int(53)))
            ]
        );
    }

    #[test]
    fn denied_blocks_are_cut_out_of_replicator_egress() {
        let deny = ["169.254.169.254/32", "10.96.0.0/12", "fd00:ec2::254/128"]
            .map(|c| Cidr::parse(c).expect("a block"));
        // No allow-list: everything but the denied blocks, and no separate DNS rule.
        let open = ReplicatorNetwork::from_json(CHART)
            .expect("valid")
            .with_denied(&deny);
        let spec = spec(&open, selector(), 9464);
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_string(), "Egress".to_string()])
        );
        let egress = spec.egress.expect("egress rules");
        assert_eq!(egress.len(), 1, "{egress:?}");
        let blocks: Vec<(String, Option<Vec<String>>)> = egress[0]
            .to
            .iter()
            .flatten()
            .filter_map(|p| p.ip_block.clone().map(|b| (b.cidr, b.except)))
            .collect();
        assert_eq!(
            blocks,
            [
                (
                    "0.0.0.0/0".to_string(),
                    Some(vec!["169.254.169.254/32".into(), "10.96.0.0/12".into()])
                ),
                ("::/0".to_string(), Some(vec!["fd00:ec2::254/128".into()])),
            ]
        );
        // An allow-list: each block less what is denied inside it; a block inside a denied
        // one is dropped.
        let json = CHART.replace(
            r#""egressCidrs": []"#,
            r#""egressCidrs": ["10.0.0.0/8", "10.100.0.0/16", "192.168.0.0/16"]"#,
        );
        let listed = ReplicatorNetwork::from_json(&json)
            .expect("valid")
            .with_denied(&deny);
        let egress = super::spec(&listed, selector(), 9464)
            .egress
            .expect("egress");
        let blocks: Vec<(String, Option<Vec<String>>)> = egress[0]
            .to
            .iter()
            .flatten()
            .filter_map(|p| p.ip_block.clone().map(|b| (b.cidr, b.except)))
            .collect();
        assert_eq!(
            blocks,
            [
                ("10.0.0.0/8".to_string(), Some(vec!["10.96.0.0/12".into()])),
                ("192.168.0.0/16".to_string(), None),
            ]
        );
        assert_eq!(egress.len(), 2, "and DNS");
    }

    #[test]
    fn bad_settings_stop_the_operator_at_start() {
        assert_eq!(
            ReplicatorNetwork::from_json(""),
            Ok(ReplicatorNetwork::default())
        );
        for (bad, says) in [
            ("{", "not the expected JSON"),
            (
                r#"{"enabled": true, "metricsFrom": {}}"#,
                "not the expected JSON",
            ),
            (r#"{"enabeld": true}"#, "unknown field"),
            (
                r#"{"egressCidrs": ["10.0.0.0/33"]}"#,
                "egressCidrs: '10.0.0.0/33'",
            ),
        ] {
            let e = ReplicatorNetwork::from_json(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad}"));
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
