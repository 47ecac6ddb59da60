//! Checks that keep a flow from harming the clusters it touches or from using what its author
//! may not: pure functions over the flow, the other flows the operator sees, the Secrets it
//! references and the clusters' ids. The reconcile does the reading and applies the verdict.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use crate::api::{FlowMode, MirrorFlow, PolicyKind};
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

/// A flow may pick its replicator image (`spec.pod.image`) only among those the operator's
/// installer allowed: the image runs with the Secrets the flow names mounted. `allowed` are
/// image prefixes; the operator's own replicator image is always allowed.
pub fn image_not_allowed(mf: &MirrorFlow, own_image: &str, allowed: &[String]) -> Option<Blocked> {
    let image = mf.spec.pod.as_ref()?.image.as_deref()?;
    if image == own_image || allowed.iter().any(|p| image_has_prefix(image, p)) {
        return None;
    }
    let listed = if allowed.is_empty() {
        "none besides the operator's own".to_string()
    } else {
        allowed.join(", ")
    };
    Some(Blocked::new(
        reason::IMAGE_NOT_ALLOWED,
        format!(
            "spec.pod.image: '{image}' is not an image this operator may run (allowed prefixes: {listed}); remove spec.pod.image to run the operator's own image '{own_image}', or ask whoever installed the operator to allow it (chart value allowedImagePrefixes)"
        ),
    ))
}

/// `prefix` matches whole path segments or the repository: `reg.io/team/` and `reg.io/team`
/// allow `reg.io/team/app:1`, never `reg.io/teamevil/app`.
fn image_has_prefix(image: &str, prefix: &str) -> bool {
    let Some(rest) = image.strip_prefix(prefix) else {
        return false;
    };
    !prefix.is_empty()
        && (prefix.ends_with('/') || rest.is_empty() || rest.starts_with(['/', ':', '@']))
}

/// The clusters' ids as their brokers report them (`None`: not known yet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterIds {
    pub source: Option<String>,
    pub target: Option<String>,
}

/// A flow whose target is its own source copies its own copies: every round adds a prefix
/// (`a.a.a.heartbeats`...). Bootstrap strings can differ for one cluster, its id cannot.
pub fn same_cluster(ids: &ClusterIds) -> Option<Blocked> {
    crate::kafka::cluster_id::same_cluster_message(ids.source.as_deref(), ids.target.as_deref())
        .map(|m| Blocked::new(reason::SAME_CLUSTER, m))
}

/// Bootstrap servers as a set, so `b:1,a:1` and `A:1, b:1` compare equal.
pub fn servers(list: &str) -> Vec<String> {
    let mut v: Vec<String> = list
        .split(',')
        .map(|x| x.trim().to_ascii_lowercase())
        .filter(|x| !x.is_empty())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The flows that run replicators (Observe flows write nothing).
fn replicating(f: &MirrorFlow) -> bool {
    f.spec.mode == FlowMode::Replicate && f.metadata.deletion_timestamp.is_none()
}

fn key(f: &MirrorFlow) -> String {
    format!("{}/{}", f.namespace().unwrap_or_default(), f.name_any())
}

/// Older flows win a conflict; the later one is refused, so a new flow never breaks a running one.
fn older(a: &MirrorFlow, b: &MirrorFlow) -> bool {
    let created = |f: &MirrorFlow| f.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (created(a), key(a)) < (created(b), key(b))
}

/// Two flows with the same source alias into one target cluster keep their positions,
/// checkpoints and (with syncs on the target) offset syncs in the same topics there, and each
/// reads the other's records as its own. Clusters are the same when their ids are (both
/// known) or their bootstrap server sets are.
pub fn conflicting_flow(
    this: &MirrorFlow,
    others: &[Arc<MirrorFlow>],
    ids_of: impl Fn(&str) -> ClusterIds,
) -> Option<Blocked> {
    if !replicating(this) {
        return None;
    }
    let this_key = key(this);
    let this_ids = ids_of(&this_key);
    let same_target = |other: &MirrorFlow| match (&this_ids.target, &ids_of(&key(other)).target) {
        (Some(a), Some(b)) => a == b,
        _ => {
            servers(&this.spec.target.bootstrap_servers)
                == servers(&other.spec.target.bootstrap_servers)
        }
    };
    others
        .iter()
        .filter(|o| key(o) != this_key && replicating(o) && older(o, this))
        .find(|o| o.spec.source.alias == this.spec.source.alias && same_target(o))
        .map(|o| {
            let alias = &this.spec.source.alias;
            Blocked::new(
                reason::CONFLICTING_FLOW,
                format!(
                    "spec.source.alias: flow '{}' (older) already replicates source alias '{alias}' into this target cluster; both would keep their positions and checkpoints in the same topics there (mirrorflow-positions.{alias}.internal, {alias}.checkpoints.internal) and corrupt each other, so this flow is not deployed; put this flow's topics into that flow, or give one of the two source clusters another alias",
                    key(o)
                ),
            )
        })
}

/// With the Identity policy nothing marks a record as copied, so a flow back the other way
/// copies every record again, forever. Flows between the same two clusters (compared by
/// bootstrap servers) are checked; the message names both flows.
pub fn identity_loop(this: &MirrorFlow, others: &[Arc<MirrorFlow>]) -> Option<Blocked> {
    let identity = |f: &MirrorFlow| f.spec.replication_policy.kind == PolicyKind::Identity;
    if !identity(this) {
        return None;
    }
    let (src, tgt) = (
        servers(&this.spec.source.bootstrap_servers),
        servers(&this.spec.target.bootstrap_servers),
    );
    others
        .iter()
        .find(|other| {
            key(other) != key(this)
                && servers(&other.spec.source.bootstrap_servers) == tgt
                && servers(&other.spec.target.bootstrap_servers) == src
        })
        .map(|other| {
            Blocked::new(
                reason::INVALID_SPEC,
                format!(
                    "spec.replicationPolicy.type: Identity, and flow '{}' copies {} back to {}: records would be copied back and forth forever, since Identity names cannot tell a copy from an original; use type Prefix on {}",
                    other.name_any(),
                    this.spec.target.alias,
                    this.spec.source.alias,
                    if identity(other) { "both flows" } else { "this flow" },
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::collections::BTreeMap;

    fn annotated_secret(name: &str, annotations: BTreeMap<String, String>) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.annotations = Some(annotations);
        s
    }

    fn flow(ns: &str, name: &str, created_s: i64, yaml: &str) -> Arc<MirrorFlow> {
        let spec = serde_yaml::from_str(yaml).expect("a test spec");
        let mut mf = MirrorFlow::new(name, spec);
        mf.metadata.namespace = Some(ns.into());
        mf.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created_s).expect("a time"),
        ));
        Arc::new(mf)
    }

    const A_TO_B: &str = "source: {alias: a, bootstrapServers: 'a:1'}\ntarget: {alias: b, bootstrapServers: 'b:1,b2:1'}\n";

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

    #[test]
    fn only_allowed_images_run() {
        let own = "ghcr.io/mirrorflow/mirrorflow:0.1.0";
        let with = |image: &str| flow("x", "f", 1, &format!("{A_TO_B}pod: {{image: '{image}'}}\n"));
        let none: Vec<String> = Vec::new();
        assert_eq!(
            image_not_allowed(&flow("x", "f", 1, A_TO_B), own, &none),
            None
        );
        assert_eq!(image_not_allowed(&with(own), own, &none), None);
        let b = image_not_allowed(&with("evil.io/miner:1"), own, &none).expect("refused");
        assert_eq!(b.reason, reason::IMAGE_NOT_ALLOWED);
        assert!(
            b.message.starts_with("spec.pod.image: 'evil.io/miner:1'"),
            "{}",
            b.message
        );
        let team = vec!["reg.io/team".to_string(), "mirror.io/base/".to_string()];
        for ok in [
            "reg.io/team:2",
            "reg.io/team/app:1",
            "reg.io/team@sha256:ab",
            "mirror.io/base/x",
        ] {
            assert_eq!(image_not_allowed(&with(ok), own, &team), None, "{ok}");
        }
        for bad in ["reg.io/teamevil/app", "reg.io/tea", "mirror.io/basement/x"] {
            assert!(image_not_allowed(&with(bad), own, &team).is_some(), "{bad}");
        }
    }

    #[test]
    fn one_cluster_on_both_sides_is_refused_by_id() {
        let same = ClusterIds {
            source: Some("X".into()),
            target: Some("X".into()),
        };
        assert_eq!(
            same_cluster(&same).map(|b| b.reason),
            Some(reason::SAME_CLUSTER)
        );
        let differ = ClusterIds {
            source: Some("X".into()),
            target: Some("Y".into()),
        };
        assert_eq!(same_cluster(&differ), None);
        assert_eq!(same_cluster(&ClusterIds::default()), None);
    }

    #[test]
    fn the_later_of_two_flows_sharing_internal_topics_is_refused() {
        let first = flow("x", "first", 100, A_TO_B);
        // Another namespace, other bootstrap order and case: the same target cluster.
        let second = flow(
            "y",
            "second",
            200,
            "source: {alias: a, bootstrapServers: 'other:1'}\ntarget: {alias: c, bootstrapServers: 'B2:1, b:1'}\n",
        );
        let all = [first.clone(), second.clone()];
        let unknown = |_: &str| ClusterIds::default();
        assert_eq!(conflicting_flow(&first, &all, unknown), None);
        let b = conflicting_flow(&second, &all, unknown).expect("a conflict");
        assert_eq!(b.reason, reason::CONFLICTING_FLOW);
        assert!(b.message.contains("flow 'x/first'"), "{}", b.message);

        // Different bootstrap strings, one cluster id: still a conflict.
        let third = flow(
            "y",
            "third",
            300,
            "source: {alias: a, bootstrapServers: 'a:1'}\ntarget: {alias: b, bootstrapServers: 'lb:9092'}\n",
        );
        let ids = |k: &str| ClusterIds {
            source: None,
            target: Some(if k == "y/second" { "other" } else { "T" }.into()),
        };
        let all = [first.clone(), third.clone()];
        assert!(conflicting_flow(&third, &all, ids).is_some());
        // Another source alias, or an Observe flow, shares nothing.
        let other_alias = flow("x", "z", 400, &A_TO_B.replace("alias: a", "alias: a2"));
        assert_eq!(
            conflicting_flow(&other_alias, &[first.clone(), other_alias.clone()], unknown),
            None
        );
        let observe = flow("x", "o", 500, &format!("{A_TO_B}mode: Observe\n"));
        assert_eq!(
            conflicting_flow(&observe, &[first.clone(), observe.clone()], unknown),
            None
        );
    }

    #[test]
    fn identity_flows_back_and_forth_are_a_loop() {
        let there = flow(
            "x",
            "there",
            1,
            "source: {alias: a, bootstrapServers: 'a:1'}\ntarget: {alias: b, bootstrapServers: 'b:1'}\nreplicationPolicy: {type: Identity}\n",
        );
        let back = flow(
            "x",
            "back",
            2,
            "source: {alias: b, bootstrapServers: 'b:1'}\ntarget: {alias: a, bootstrapServers: 'a:1'}\n",
        );
        let all = [there.clone(), back.clone()];
        let b = identity_loop(&there, &all).expect("a loop");
        assert!(
            b.message.contains("flow 'back'") && b.message.contains("this flow"),
            "{}",
            b.message
        );
        assert_eq!(
            identity_loop(&back, &all),
            None,
            "a Prefix flow marks its copies"
        );
    }
}
