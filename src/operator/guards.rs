//! Checks that keep a flow from harming the clusters it touches or from using what its author
//! may not: pure functions over the flow, the other flows the operator sees, the Secrets it
//! references and the clusters' ids. The reconcile does the reading and applies the verdict.

use std::sync::Arc;

use kube::ResourceExt;

use crate::api::{FlowMode, MirrorFlow, PolicyKind};
use crate::status::{Blocked, reason};

pub mod addresses;
pub mod cidr;
mod quantity;
pub mod resources;
mod secrets;
pub use resources::{ResourcePolicy, replicator_resources};
pub use secrets::*;

/// A child of the flow would take the name of an object the flow does not own.
pub fn child_conflict(kind: &str, name: &str, ns: &str) -> Blocked {
    Blocked::new(
        reason::CHILD_CONFLICT,
        format!(
            "metadata.name: the {kind} '{name}' in namespace '{ns}' exists and does not belong to this flow, so nothing of this flow is applied (it would replace that object's content and delete it with the flow); rename the flow, or delete or rename that {kind} if it is not needed"
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

/// A flow may put on its pods (`spec.pod.labels`, `spec.pod.annotations`) only keys its
/// installer allowed: the pods mount the flow's Secrets, and a label or annotation can take
/// them out of a mesh's egress control (`sidecar.istio.io/inject`), drop AppArmor, join
/// another Service's endpoints or match a NetworkPolicy that grants egress. `allowed` entries
/// are exact keys, prefixes ending in `/` or `*`, or `*` for any key.
pub fn pod_metadata_not_allowed(mf: &MirrorFlow, allowed: &[String]) -> Option<Blocked> {
    let pod = mf.spec.pod.as_ref()?;
    let permitted = |key: &str| {
        allowed.iter().any(|a| {
            a == "*"
                || a == key
                || (a.ends_with('/') && key.starts_with(a.as_str()))
                || a.strip_suffix('*')
                    .is_some_and(|p| !p.is_empty() && key.starts_with(p))
        })
    };
    let (field, key) = pod
        .labels
        .keys()
        .map(|k| ("spec.pod.labels", k))
        .chain(pod.annotations.keys().map(|k| ("spec.pod.annotations", k)))
        .find(|(_, k)| !permitted(k))?;
    let listed = if allowed.is_empty() {
        "none".to_string()
    } else {
        allowed.join(", ")
    };
    Some(Blocked::new(
        reason::POD_METADATA_NOT_ALLOWED,
        format!(
            "{field}: key '{key}' is not one this operator lets a flow put on its pods (allowed: {listed}); remove it, or ask whoever installed the operator to allow it (chart value allowedPodMetadataKeys: exact keys, prefixes ending in '/' or '*')"
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

/// The reasons a flow's `Ready` carries when it did not pass its own checks (refused, waiting
/// for a Secret, rejected children) or cannot reach its target: such a flow writes nothing
/// there, so it shares nothing with another flow and blocks none. A squatter that names a
/// victim's target without being able to use it therefore changes nothing.
const NOT_STANDING: &[&str] = &[
    reason::INVALID_SPEC,
    reason::INVALID_CLIENT_CONFIG,
    reason::SECRET_MISSING,
    reason::SECRET_NOT_SHARED,
    reason::IMAGE_NOT_ALLOWED,
    reason::POD_METADATA_NOT_ALLOWED,
    reason::ADDRESS_NOT_ALLOWED,
    reason::SAME_CLUSTER,
    reason::CONFLICTING_FLOW,
    reason::REPLICATION_LOOP,
    reason::CHILD_REJECTED,
    reason::CHILD_FORBIDDEN,
    reason::CHILD_CONFLICT,
    reason::TARGET_UNREACHABLE,
    reason::TARGET_AUTHENTICATION_FAILED,
    reason::TARGET_TLS_FAILED,
    reason::TARGET_CERTIFICATE_REFUSED,
    reason::TARGET_CLIENT_CREDENTIALS_REFUSED,
    reason::TARGET_TOKEN_ENDPOINT_UNREACHABLE,
    reason::TARGET_TOKEN_REFUSED,
];

/// Whether `f` passed its own checks and reached its target when last probed. A flow with no
/// status yet (seconds old) counts: two flows applied together must not both deploy.
fn in_good_standing(f: &MirrorFlow) -> bool {
    let ready = f.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == crate::status::READY)
    });
    ready.is_none_or(|c| c.status == "True" || !NOT_STANDING.contains(&c.reason.as_str()))
}

/// The one rule by which another flow may change this flow's fate: it is older, it replicates
/// (an Observe flow writes nothing, so it blocks nothing), it is in good standing, and it is
/// not this flow. Every cross-flow check goes through here.
fn contenders<'a>(
    this: &'a MirrorFlow,
    others: &'a [Arc<MirrorFlow>],
) -> impl Iterator<Item = &'a MirrorFlow> + 'a {
    let this_key = key(this);
    others
        .iter()
        .map(|o| o.as_ref())
        .filter(move |o| key(o) != this_key)
        .filter(|o| replicating(o) && in_good_standing(o) && older(o, this))
}

fn same_namespace(a: &MirrorFlow, b: &MirrorFlow) -> bool {
    a.namespace() == b.namespace()
}

/// How a message names another flow: by `namespace/name` in this flow's namespace, and never
/// across namespaces (a message must not tell one tenant what another runs).
fn named(this: &MirrorFlow, other: &MirrorFlow) -> String {
    if same_namespace(this, other) {
        format!("flow '{}'", key(other))
    } else {
        "an older flow in another namespace".to_string()
    }
}

/// Whether two flows' clusters are one. Within a namespace by cluster id when both are known
/// (bootstrap strings can differ for one cluster), else by bootstrap servers. Across
/// namespaces by bootstrap servers only: a cluster id is whatever the tenant's own broker
/// says, so it must not let one tenant claim another's cluster.
fn one_cluster(
    same_ns: bool,
    (this_servers, this_id): (&str, Option<&String>),
    (other_servers, other_id): (&str, Option<&String>),
) -> bool {
    match (this_id, other_id) {
        (Some(a), Some(b)) if same_ns => a == b,
        _ => servers(this_servers) == servers(other_servers),
    }
}

/// The internal topics a flow keeps its state in on its target: positions and checkpoints,
/// and the offset syncs when they are kept on the target, all named by the source alias. (The
/// offset syncs MirrorMaker 2 keeps on the source, `mm2-offset-syncs.<target alias>.internal`,
/// are shared by design between flows from one source with one target alias: they harm each
/// other only when they copy the same topics, which their selections cannot tell in general.)
fn internal_topics(f: &MirrorFlow) -> Vec<String> {
    let s = &f.spec.source.alias;
    let mut topics = vec![
        format!("mirrorflow-positions.{s}.internal"),
        format!("{s}.checkpoints.internal"),
    ];
    if f.spec.source_loop.offset_syncs_location == crate::api::OffsetSyncsLocation::Target {
        topics.push(format!("mm2-offset-syncs.{s}.internal"));
    }
    topics
}

/// Two flows that keep state in an internal topic of the same name on one target cluster each
/// read the other's records as their own and corrupt each other: the later one is refused.
pub fn conflicting_flow(
    this: &MirrorFlow,
    others: &[Arc<MirrorFlow>],
    ids_of: impl Fn(&str) -> ClusterIds,
) -> Option<Blocked> {
    if !replicating(this) {
        return None;
    }
    let this_ids = ids_of(&key(this));
    let mine = internal_topics(this);
    contenders(this, others).find_map(|o| {
        let same_target = one_cluster(
            same_namespace(this, o),
            (&this.spec.target.bootstrap_servers, this_ids.target.as_ref()),
            (&o.spec.target.bootstrap_servers, ids_of(&key(o)).target.as_ref()),
        );
        let theirs = internal_topics(o);
        let topic = mine.iter().find(|t| same_target && theirs.contains(t))?;
        Some(Blocked::new(
            reason::CONFLICTING_FLOW,
            format!(
                "spec.source.alias: {} (older) already keeps its state in {topic} on this flow's target cluster; both would read each other's records as their own and corrupt each other, so this flow is not deployed; put this flow's topics into that flow, or give one of the two source clusters another alias",
                named(this, o),
            ),
        ))
    })
}

/// An alias names one Kafka cluster: remote topics `<alias>.<topic>`, checkpoints and
/// heartbeats say where records came from, and a failover or failback reads them so. Within a
/// namespace (where cluster ids are the tenant's own word either way), a later flow that uses
/// an alias an older flow uses for another cluster (by id) is refused.
pub fn alias_names_two_clusters(
    this: &MirrorFlow,
    others: &[Arc<MirrorFlow>],
    ids_of: impl Fn(&str) -> ClusterIds,
) -> Option<Blocked> {
    if !replicating(this) {
        return None;
    }
    let named_by = |f: &MirrorFlow, ids: &ClusterIds| {
        [
            (
                "spec.source.alias",
                f.spec.source.alias.clone(),
                ids.source.clone(),
            ),
            (
                "spec.target.alias",
                f.spec.target.alias.clone(),
                ids.target.clone(),
            ),
        ]
    };
    let this_ids = ids_of(&key(this));
    let mine = named_by(this, &this_ids);
    contenders(this, others)
        .filter(|o| same_namespace(this, o))
        .find_map(|o| {
            let theirs = named_by(o, &ids_of(&key(o)));
            mine.iter().find_map(|(field, alias, id)| {
                let id = id.as_ref()?;
                theirs.iter().find_map(|(_, o_alias, o_id)| {
                    let o_id = o_id.as_ref()?;
                    (o_alias == alias && o_id != id).then(|| {
                        Blocked::new(
                            reason::ALIAS_NAMES_TWO_CLUSTERS,
                            format!(
                                "{field}: '{alias}' names cluster {id} here, and {} (older) uses '{alias}' for cluster {o_id}; an alias names one cluster everywhere (remote topics {alias}.<topic>, checkpoints and failovers read it so), so this flow is not deployed; give this cluster another alias",
                                named(this, o)
                            ),
                        )
                    })
                })
            })
        })
}

/// With the Identity policy nothing marks a record as copied, so two flows in opposite
/// directions between the same clusters, either of them Identity, copy records back and forth
/// forever. The later of the two is refused; the older keeps running.
pub fn replication_loop(
    this: &MirrorFlow,
    others: &[Arc<MirrorFlow>],
    ids_of: impl Fn(&str) -> ClusterIds,
) -> Option<Blocked> {
    if !replicating(this) {
        return None;
    }
    let identity = |f: &MirrorFlow| f.spec.replication_policy.kind == PolicyKind::Identity;
    let this_ids = ids_of(&key(this));
    contenders(this, others)
        .filter(|o| identity(this) || identity(o))
        .find(|o| {
            let same_ns = same_namespace(this, o);
            let o_ids = ids_of(&key(o));
            one_cluster(
                same_ns,
                (&this.spec.source.bootstrap_servers, this_ids.source.as_ref()),
                (&o.spec.target.bootstrap_servers, o_ids.target.as_ref()),
            ) && one_cluster(
                same_ns,
                (&this.spec.target.bootstrap_servers, this_ids.target.as_ref()),
                (&o.spec.source.bootstrap_servers, o_ids.source.as_ref()),
            )
        })
        .map(|o| {
            let fix = match (identity(this), identity(o)) {
                (true, true) => "use type Prefix on this flow, and on the older one",
                (true, false) => "use type Prefix on this flow",
                _ => "the older flow uses Identity: change that flow to Prefix first",
            };
            Blocked::new(
                reason::REPLICATION_LOOP,
                format!(
                    "spec.replicationPolicy.type: {} (older) copies from this flow's target to its source, and Identity names cannot tell a copy from an original, so records would be copied back and forth forever; this flow is not deployed; {fix}",
                    named(this, o)
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
    fn only_allowed_pod_metadata_keys_reach_the_pods() {
        let with = |meta: &str| flow("x", "f", 1, &format!("{A_TO_B}pod: {meta}\n"));
        let allowed: Vec<String> = ["team.example.com/", "cost-center", "app.example.io/*"]
            .map(String::from)
            .into();
        assert_eq!(
            pod_metadata_not_allowed(&flow("x", "f", 1, A_TO_B), &[]),
            None
        );
        for ok in [
            "{labels: {team.example.com/owner: a}}",
            "{labels: {cost-center: '42'}, annotations: {app.example.io/tier: x}}",
        ] {
            assert_eq!(pod_metadata_not_allowed(&with(ok), &allowed), None, "{ok}");
        }
        for (bad, field, key) in [
            (
                "{annotations: {sidecar.istio.io/inject: 'false'}}",
                "spec.pod.annotations",
                "sidecar.istio.io/inject",
            ),
            (
                "{annotations: {container.apparmor.security.beta.kubernetes.io/replicator: unconfined}}",
                "spec.pod.annotations",
                "container.apparmor",
            ),
            ("{labels: {app: payments-api}}", "spec.pod.labels", "'app'"),
            (
                "{labels: {team.example.com.evil/x: a}}",
                "spec.pod.labels",
                "team.example.com.evil/x",
            ),
            (
                "{labels: {cost-center-2: a}}",
                "spec.pod.labels",
                "cost-center-2",
            ),
        ] {
            let b = pod_metadata_not_allowed(&with(bad), &allowed).expect(bad);
            assert_eq!(b.reason, reason::POD_METADATA_NOT_ALLOWED);
            assert!(
                b.message.starts_with(field) && b.message.contains(key),
                "{}",
                b.message
            );
        }
        // Nothing is allowed by default; `*` allows every key.
        assert!(pod_metadata_not_allowed(&with("{labels: {a: b}}"), &[]).is_some());
        assert_eq!(
            pod_metadata_not_allowed(&with("{labels: {a: b}}"), &["*".into()]),
            None
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

    /// A flow with a `Ready` condition of this reason, as the operator last wrote it.
    fn with_ready(f: &Arc<MirrorFlow>, status: &str, why: &str) -> Arc<MirrorFlow> {
        let mut mf = (**f).clone();
        mf.status = Some(crate::api::MirrorFlowStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: crate::status::READY.into(),
                status: status.into(),
                reason: why.into(),
                message: String::new(),
                last_transition_time: Time(
                    k8s_openapi::jiff::Timestamp::from_second(0).expect("a time"),
                ),
                observed_generation: None,
            }],
            ..Default::default()
        });
        Arc::new(mf)
    }

    const B_TO_A: &str = "source: {alias: b, bootstrapServers: 'b2:1,b:1'}\ntarget: {alias: a, bootstrapServers: 'A:1'}\n";
    const UNKNOWN: fn(&str) -> ClusterIds = |_| ClusterIds::default();

    /// Every cross-flow check, as (name, check): both follow one rule.
    #[allow(clippy::type_complexity)]
    fn checks() -> [(
        &'static str,
        fn(&MirrorFlow, &[Arc<MirrorFlow>]) -> Option<Blocked>,
    ); 2] {
        [
            ("conflict", |t, o| conflicting_flow(t, o, UNKNOWN)),
            ("loop", |t, o| replication_loop(t, o, UNKNOWN)),
        ]
    }

    /// For each check, a pair (older, later) that the check finds harmful.
    fn harmful_pair(check: &str) -> (Arc<MirrorFlow>, Arc<MirrorFlow>) {
        match check {
            "conflict" => (
                flow("x", "first", 100, A_TO_B),
                flow(
                    "x",
                    "second",
                    200,
                    "source: {alias: a, bootstrapServers: 'other:1'}\ntarget: {alias: c, bootstrapServers: 'B2:1, b:1'}\n",
                ),
            ),
            _ => (
                flow(
                    "x",
                    "there",
                    100,
                    &format!("{A_TO_B}replicationPolicy: {{type: Identity}}\n"),
                ),
                flow("x", "back", 200, B_TO_A),
            ),
        }
    }

    #[test]
    fn only_the_later_of_two_harmful_flows_is_refused() {
        for (name, check) in checks() {
            let (first, second) = harmful_pair(name);
            let all = [first.clone(), second.clone()];
            assert_eq!(check(&first, &all), None, "{name}: the older flow runs on");
            let b = check(&second, &all).unwrap_or_else(|| panic!("{name}: refused"));
            assert!(
                b.message.contains("flow 'x/first'") || b.message.contains("flow 'x/there'"),
                "{name}: {}",
                b.message
            );
        }
    }

    #[test]
    fn observe_flows_neither_block_nor_are_blocked() {
        for (name, check) in checks() {
            let (first, second) = harmful_pair(name);
            let observe = |f: &Arc<MirrorFlow>| {
                let mut mf = (**f).clone();
                mf.spec.mode = FlowMode::Observe;
                Arc::new(mf)
            };
            // The audit's attack: a later Observe flow pointing the other way, or an older one.
            let later_observer = observe(&second);
            assert_eq!(
                check(&first, &[first.clone(), later_observer.clone()]),
                None,
                "{name}"
            );
            assert_eq!(
                check(&later_observer, &[first.clone(), later_observer.clone()]),
                None,
                "{name}"
            );
            let older_observer = observe(&first);
            assert_eq!(
                check(&second, &[older_observer, second.clone()]),
                None,
                "{name}"
            );
        }
    }

    #[test]
    fn a_later_flow_never_stops_an_older_one_in_any_namespace() {
        for (name, check) in checks() {
            let (first, second) = harmful_pair(name);
            let mut attacker = (*second).clone();
            attacker.metadata.namespace = Some("tenant-b".into());
            let attacker = Arc::new(attacker);
            let all = [first.clone(), attacker.clone()];
            assert_eq!(check(&first, &all), None, "{name}");
            // The later attacker is the one refused, and learns nothing about the victim.
            let b = check(&attacker, &all).unwrap_or_else(|| panic!("{name}: refused"));
            assert!(
                b.message.contains("an older flow in another namespace"),
                "{name}: {}",
                b.message
            );
            assert!(
                !b.message.contains("'x/"),
                "{name}: names the victim: {}",
                b.message
            );
        }
    }

    #[test]
    fn an_older_flow_that_cannot_write_blocks_nothing() {
        for (name, check) in checks() {
            let (first, second) = harmful_pair(name);
            for (status, why, blocks) in [
                ("False", reason::TARGET_AUTHENTICATION_FAILED, false),
                ("False", reason::TARGET_UNREACHABLE, false),
                ("False", reason::SECRET_NOT_SHARED, false),
                ("False", reason::CONFLICTING_FLOW, false),
                ("False", reason::REPLICATION_LOOP, false),
                ("False", reason::INVALID_SPEC, false),
                // Running, or running with a problem that does not stop it writing.
                ("True", reason::OK, true),
                ("False", reason::REPLICAS_NOT_READY, true),
                ("False", reason::SOURCE_UNREACHABLE, true),
            ] {
                let first = with_ready(&first, status, why);
                let all = [first, second.clone()];
                assert_eq!(
                    check(&second, &all).is_some(),
                    blocks,
                    "{name}: older flow {status}/{why}"
                );
            }
        }
    }

    #[test]
    fn cluster_ids_count_within_a_namespace_only() {
        let first = flow("x", "first", 100, A_TO_B);
        let squat = |ns: &str| {
            flow(
                ns,
                "third",
                300,
                "source: {alias: a, bootstrapServers: 'a-lb:1'}\ntarget: {alias: b, bootstrapServers: 'lb:9092'}\n",
            )
        };
        // Both targets report id T: one cluster behind two bootstrap strings (the sources
        // are told apart by their servers: no offset-syncs topic is shared on them).
        let ids = |_: &str| ClusterIds {
            source: None,
            target: Some("T".into()),
        };
        let same_ns = squat("x");
        assert!(conflicting_flow(&same_ns, &[first.clone(), same_ns.clone()], ids).is_some());
        // In another namespace the id is only what that tenant's broker says.
        let other_ns = squat("y");
        assert_eq!(
            conflicting_flow(&other_ns, &[first.clone(), other_ns.clone()], ids),
            None
        );
        // Other ids, or another source alias: nothing shared.
        let differ = |k: &str| ClusterIds {
            source: None,
            target: Some(if k == "x/third" { "U" } else { "T" }.into()),
        };
        assert_eq!(
            conflicting_flow(&same_ns, &[first.clone(), same_ns.clone()], differ),
            None
        );
        let other_aliases = A_TO_B
            .replace("alias: a", "alias: a2")
            .replace("alias: b", "alias: b2");
        let other_alias = flow("x", "z", 400, &other_aliases);
        assert_eq!(
            conflicting_flow(&other_alias, &[first, other_alias.clone()], UNKNOWN),
            None
        );
    }

    #[test]
    fn an_alias_names_one_cluster_within_a_namespace() {
        let first = flow("x", "first", 100, A_TO_B);
        // `a` for another source cluster, into another target: nothing shared, but the name
        // means two clusters.
        let other = |ns: &str| {
            flow(
                ns,
                "other",
                200,
                "source: {alias: a, bootstrapServers: 'z:1'}\ntarget: {alias: c, bootstrapServers: 'c:1'}\n",
            )
        };
        let ids = |k: &str| ClusterIds {
            source: Some(if k.ends_with("/first") { "X" } else { "Z" }.into()),
            target: Some(if k.ends_with("/first") { "B" } else { "C" }.into()),
        };
        let same_ns = other("x");
        let b = alias_names_two_clusters(&same_ns, &[first.clone(), same_ns.clone()], ids)
            .expect("two clusters named a");
        assert!(
            b.message
                .starts_with("spec.source.alias: 'a' names cluster Z")
                && b.message.contains("cluster X"),
            "{}",
            b.message
        );
        // The older flow is not refused, nor a flow of another namespace, nor unknown ids.
        assert_eq!(
            alias_names_two_clusters(&first, &[first.clone(), same_ns.clone()], ids),
            None
        );
        let other_ns = other("y");
        assert_eq!(
            alias_names_two_clusters(&other_ns, &[first.clone(), other_ns.clone()], ids),
            None
        );
        assert_eq!(
            alias_names_two_clusters(&same_ns, &[first, same_ns.clone()], UNKNOWN),
            None
        );
    }

    #[test]
    fn prefix_flows_both_ways_are_no_loop() {
        let there = flow("x", "there", 100, A_TO_B);
        let back = flow("x", "back", 200, B_TO_A);
        let all = [there.clone(), back.clone()];
        assert_eq!(replication_loop(&back, &all, UNKNOWN), None);
        // Either side Identity is a loop; the message says which flow to change.
        let identity_back = flow(
            "x",
            "back",
            200,
            &format!("{B_TO_A}replicationPolicy: {{type: Identity}}\n"),
        );
        let b = replication_loop(&identity_back, &[there, identity_back.clone()], UNKNOWN)
            .expect("a loop");
        assert_eq!(b.reason, reason::REPLICATION_LOOP);
        assert!(
            b.message.contains("use type Prefix on this flow"),
            "{}",
            b.message
        );
    }
}
