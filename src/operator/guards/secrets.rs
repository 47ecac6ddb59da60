//! Whether a Secret may be used by a flow, and sent where: the Secret's owner opts it in to
//! flows and names the brokers and token endpoints its values may go to. The operator and the
//! CLI decide with the same function ([`secret_grant`]).

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use crate::status::{Blocked, reason};

/// The annotation by which a Secret opts in to being used by flows: a comma-separated list of
/// flow names in the Secret's namespace, or `*` for every flow there. Whoever may write the
/// Secret decides; a flow author who may not read it cannot hand it to a broker of theirs.
pub const SECRET_ALLOWED_FLOWS: &str = "mirrorflow.io/allowed-flows";

/// Whether the Secret opted in to being used by the flow named `flow` (same namespace).
pub fn secret_allows(secret: &Secret, flow: &str) -> bool {
    secret
        .annotations()
        .get(SECRET_ALLOWED_FLOWS)
        .is_some_and(|v| v.split(',').map(str::trim).any(|f| f == "*" || f == flow))
}

/// The refusal for a Secret that did not opt in, naming the field and the command that fixes it.
pub fn secret_not_shared(field: &str, secret: &str, ns: &str, flow: &str) -> Blocked {
    Blocked::new(
        reason::SECRET_NOT_SHARED,
        format!(
            "{field}: Secret '{secret}' has not opted in to flow '{flow}', so it is not used (a flow may only send a Secret to a broker when the Secret's owner allows it); whoever manages the Secret can allow it: kubectl annotate secret {secret} -n {ns} {SECRET_ALLOWED_FLOWS}={flow} (a comma-separated list of flows, or '*' for every flow in the namespace)"
        ),
    )
}

/// The annotation by which a Secret's owner names where its values may be sent: comma-separated
/// `host:port`, `host` (any port), `*.domain[:port]` (any host under the domain) or `*`
/// (anywhere). Token endpoints are named by their URL's host and port. Opting in a flow is not
/// enough: whoever may edit that flow could point it at their own broker.
pub const SECRET_ALLOWED_DESTINATIONS: &str = "mirrorflow.io/allowed-destinations";
/// The annotation by which a Secret's owner lets its values cross the network unencrypted
/// (`"true"`): SASL without `tls`, or an `http://` token endpoint.
pub const SECRET_ALLOW_PLAINTEXT: &str = "mirrorflow.io/allow-plaintext";

/// A place a Secret's value is sent to: a broker or a token endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    host: String,
    port: u16,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// `host:port` or `[v6]:port`; `None` for anything else (the spec rules refuse it earlier).
fn host_port(s: &str) -> Option<Destination> {
    let s = s.trim();
    let (host, port) = match s.strip_prefix('[') {
        Some(rest) => {
            let (h, p) = rest.split_once("]:")?;
            (h, p)
        }
        None => s.rsplit_once(':')?,
    };
    Some(Destination {
        host: host.to_ascii_lowercase(),
        port: port.parse().ok()?,
    })
}

/// Where the value behind `field` (one of [`crate::kafka::config::secret_refs`]'s fields)
/// leaves the pod for, and whether it travels unencrypted. TLS material is only used for
/// proofs in the handshake and is never sent: `None`.
pub fn destinations(
    spec: &crate::api::MirrorFlowSpec,
    field: &str,
) -> Option<(Vec<Destination>, bool)> {
    let cluster = if field.starts_with("spec.source.") {
        &spec.source
    } else if field.starts_with("spec.target.") {
        &spec.target
    } else {
        return None;
    };
    if field.ends_with(".sasl.oauthbearer.clientSecretSecretRef") {
        let url = &cluster
            .sasl
            .as_ref()?
            .oauthbearer
            .as_ref()?
            .token_endpoint_url;
        let (scheme, rest) = url.split_once("://")?;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
        let plain = scheme.eq_ignore_ascii_case("http");
        let default_port = if plain { 80 } else { 443 };
        let d = host_port(authority).unwrap_or_else(|| Destination {
            host: authority.trim_matches(['[', ']']).to_ascii_lowercase(),
            port: default_port,
        });
        return Some((vec![d], plain));
    }
    if field.contains(".sasl.") {
        let brokers = cluster
            .bootstrap_servers
            .split(',')
            .filter_map(host_port)
            .collect();
        return Some((brokers, cluster.tls.is_none()));
    }
    None
}

/// Whether `entry` of the annotation allows `d`.
fn entry_allows(entry: &str, d: &Destination) -> bool {
    let entry = entry.trim().to_ascii_lowercase();
    if entry == "*" {
        return true;
    }
    let (host, port) = match host_port(&entry) {
        Some(hp) => (hp.host, Some(hp.port)),
        None => (entry.trim_matches(['[', ']']).to_string(), None),
    };
    let host_ok = match host.strip_prefix("*.") {
        Some(domain) => d
            .host
            .strip_suffix(domain)
            .is_some_and(|h| h.ends_with('.')),
        None => host == d.host,
    };
    host_ok && port.is_none_or(|p| p == d.port)
}

/// Whether the Secret may be used by flow `flow` (spec `spec`) for the key behind `field`: the
/// Secret opted in to the flow, names every place the value would be sent, and allows
/// plaintext where the value would cross the network unencrypted. The operator and the CLI
/// both decide with this; `Err` names the field and the annotation that fixes it.
pub fn secret_grant(
    secret: &Secret,
    flow: &str,
    spec: &crate::api::MirrorFlowSpec,
    field: &str,
    ns: &str,
) -> Result<(), Blocked> {
    let name = secret.name_any();
    if !secret_allows(secret, flow) {
        return Err(secret_not_shared(field, &name, ns, flow));
    }
    let Some((to, plaintext)) = destinations(spec, field) else {
        return Ok(());
    };
    let annotations = secret.annotations();
    let listed: Vec<&str> = annotations
        .get(SECRET_ALLOWED_DESTINATIONS)
        .map(|v| v.split(',').filter(|e| !e.trim().is_empty()).collect())
        .unwrap_or_default();
    let wanted = to
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let refuse = |why: String| {
        Blocked::new(
            reason::SECRET_NOT_SHARED,
            format!("{field}: Secret '{name}' {why}, so it is not used"),
        )
    };
    if let Some(d) = to
        .iter()
        .find(|d| !listed.iter().any(|e| entry_allows(e, d)))
    {
        let named = if listed.is_empty() {
            "names no place its value may be sent to".to_string()
        } else {
            format!("may be sent only to {}, not to {d}", listed.join(","))
        };
        return Err(refuse(format!(
            "{named} (this flow would send it to {wanted}); if those are the Secret's own brokers or token endpoint, whoever manages the Secret can allow them: kubectl annotate secret {name} -n {ns} --overwrite {SECRET_ALLOWED_DESTINATIONS}={wanted}"
        )));
    }
    let plaintext_allowed = annotations
        .get(SECRET_ALLOW_PLAINTEXT)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if plaintext && !plaintext_allowed {
        return Err(refuse(format!(
            "would cross the network unencrypted to {wanted} (no TLS on that side, or an http:// token endpoint); turn on TLS for it (spec.<side>.tls, an https:// token endpoint), or whoever manages the Secret can allow plaintext: kubectl annotate secret {name} -n {ns} {SECRET_ALLOW_PLAINTEXT}=true"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn annotated_secret(name: &str, annotations: BTreeMap<String, String>) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.annotations = Some(annotations);
        s
    }

    #[test]
    fn a_secret_is_used_only_by_the_flows_it_names() {
        let none = annotated_secret("creds", BTreeMap::new());
        assert!(!secret_allows(&none, "orders"));
        let list = annotated_secret(
            "creds",
            [(
                SECRET_ALLOWED_FLOWS.to_string(),
                "billing, orders".to_string(),
            )]
            .into(),
        );
        assert!(secret_allows(&list, "orders"));
        assert!(secret_allows(&list, "billing"));
        assert!(!secret_allows(&list, "order"));
        let any = annotated_secret(
            "creds",
            [(SECRET_ALLOWED_FLOWS.to_string(), "*".into())].into(),
        );
        assert!(secret_allows(&any, "anything"));
        let b = secret_not_shared(
            "spec.source.sasl.passwordSecretRef",
            "creds",
            "ns",
            "orders",
        );
        assert_eq!(b.reason, reason::SECRET_NOT_SHARED);
        assert!(
            b.message
                .starts_with("spec.source.sasl.passwordSecretRef: Secret 'creds'")
        );
        assert!(
            b.message
                .contains("kubectl annotate secret creds -n ns mirrorflow.io/allowed-flows=orders")
        );
    }

    fn granted(annotations: &[(&str, &str)]) -> Secret {
        annotated_secret(
            "creds",
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn spec_of(yaml: &str) -> crate::api::MirrorFlowSpec {
        serde_yaml::from_str(yaml).expect("a test spec")
    }

    const SASL: &str = "source: {alias: a, bootstrapServers: 'kafka-0.prod.example:9093,kafka-1.prod.example:9093', tls: {}, sasl: {mechanism: PLAIN, usernameSecretRef: {name: creds, key: u}, passwordSecretRef: {name: creds, key: p}}}\ntarget: {alias: b, bootstrapServers: 'b:1'}\n";
    const PASSWORD_FIELD: &str = "spec.source.sasl.passwordSecretRef";

    #[test]
    fn a_secret_goes_only_where_its_owner_named() {
        let spec = spec_of(SASL);
        let to = |dest: &str| {
            granted(&[
                (SECRET_ALLOWED_FLOWS, "orders"),
                (SECRET_ALLOWED_DESTINATIONS, dest),
            ])
        };
        for ok in [
            "kafka-0.prod.example:9093,kafka-1.prod.example:9093",
            "*.prod.example:9093",
            "*.prod.example",
            "KAFKA-0.prod.example, kafka-1.prod.example",
            "*",
        ] {
            assert_eq!(
                secret_grant(&to(ok), "orders", &spec, PASSWORD_FIELD, "ns"),
                Ok(()),
                "{ok}"
            );
        }
        for bad in [
            "",
            "kafka-0.prod.example:9093",
            "*.prod.example:9092",
            "*.example.evil",
            "prod.example",
            "*.kafka-0.prod.example",
        ] {
            let b = secret_grant(&to(bad), "orders", &spec, PASSWORD_FIELD, "ns").expect_err(bad);
            assert_eq!(b.reason, reason::SECRET_NOT_SHARED);
            assert!(b.message.starts_with(PASSWORD_FIELD), "{}", b.message);
            assert!(
                b.message.contains("mirrorflow.io/allowed-destinations=kafka-0.prod.example:9093,kafka-1.prod.example:9093"),
                "{}",
                b.message
            );
        }
        // The attack: the flow re-pointed at another broker after the owner opted it in.
        let moved = spec_of(&SASL.replace(
            "kafka-0.prod.example:9093,kafka-1",
            "evil.example:9093,kafka-1",
        ));
        let owner = to("kafka-0.prod.example:9093,kafka-1.prod.example:9093");
        let b =
            secret_grant(&owner, "orders", &moved, PASSWORD_FIELD, "ns").expect_err("re-pointed");
        assert!(
            b.message.contains("not to evil.example:9093"),
            "{}",
            b.message
        );
        // Not opted in to the flow at all: the flow-level refusal comes first.
        let other_flow = granted(&[
            (SECRET_ALLOWED_FLOWS, "billing"),
            (SECRET_ALLOWED_DESTINATIONS, "*"),
        ]);
        let b = secret_grant(&other_flow, "orders", &spec, PASSWORD_FIELD, "ns")
            .expect_err("not shared");
        assert!(b.message.contains(SECRET_ALLOWED_FLOWS), "{}", b.message);
    }

    #[test]
    fn a_secret_crosses_plaintext_only_when_its_owner_said_so() {
        let plain = spec_of(&SASL.replace(" tls: {},", ""));
        let base = [
            (SECRET_ALLOWED_FLOWS, "*"),
            (SECRET_ALLOWED_DESTINATIONS, "*"),
        ];
        let b = secret_grant(&granted(&base), "orders", &plain, PASSWORD_FIELD, "ns")
            .expect_err("plaintext");
        assert!(
            b.message.contains("unencrypted") && b.message.contains(SECRET_ALLOW_PLAINTEXT),
            "{}",
            b.message
        );
        let mut allowed = base.to_vec();
        allowed.push((SECRET_ALLOW_PLAINTEXT, "true"));
        assert_eq!(
            secret_grant(&granted(&allowed), "orders", &plain, PASSWORD_FIELD, "ns"),
            Ok(())
        );
        // With TLS the same Secret needs no such word.
        assert_eq!(
            secret_grant(
                &granted(&base),
                "orders",
                &spec_of(SASL),
                PASSWORD_FIELD,
                "ns"
            ),
            Ok(())
        );
    }

    #[test]
    fn an_oauth_client_secret_goes_only_to_its_token_endpoint() {
        let spec = spec_of(
            "source: {alias: a, bootstrapServers: 'k:9093', tls: {}, sasl: {mechanism: OAUTHBEARER, oauthbearer: {tokenEndpointUrl: 'https://idp.example.com/realms/k/token', clientId: c, clientSecretSecretRef: {name: creds, key: s}}}}\ntarget: {alias: b, bootstrapServers: 'b:1'}\n",
        );
        let field = "spec.source.sasl.oauthbearer.clientSecretSecretRef";
        let with = |d: &str| {
            granted(&[
                (SECRET_ALLOWED_FLOWS, "*"),
                (SECRET_ALLOWED_DESTINATIONS, d),
            ])
        };
        assert_eq!(
            secret_grant(&with("idp.example.com:443"), "orders", &spec, field, "ns"),
            Ok(())
        );
        assert_eq!(
            secret_grant(&with("idp.example.com"), "orders", &spec, field, "ns"),
            Ok(())
        );
        let b = secret_grant(&with("k:9093"), "orders", &spec, field, "ns")
            .expect_err("the broker is not the endpoint");
        assert!(b.message.contains("idp.example.com:443"), "{}", b.message);
        // TLS material is never sent anywhere: no destination needed.
        let tls = spec_of(
            "source: {alias: a, bootstrapServers: 'k:9093', tls: {caSecretRef: {name: creds, key: ca}}}\ntarget: {alias: b, bootstrapServers: 'b:1'}\n",
        );
        let only_flow = granted(&[(SECRET_ALLOWED_FLOWS, "*")]);
        assert_eq!(
            secret_grant(
                &only_flow,
                "orders",
                &tls,
                "spec.source.tls.caSecretRef",
                "ns"
            ),
            Ok(())
        );
    }
}
