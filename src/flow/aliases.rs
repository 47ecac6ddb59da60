//! An alias names one Kafka cluster, everywhere: remote topics (`<alias>.<topic>`), the
//! checkpoints and heartbeats of an alias, and MirrorMaker 2's cycle detection all take the
//! alias for the cluster. A flow that gives an alias to another cluster (by cluster id) than an
//! older flow of this operator gave it would mix two clusters' data under one name; it is
//! answered before anything is deployed. Only older flows that copy (mode Replicate) count, and
//! only the clusters whose ids are known; a flow of another namespace is never named.

use crate::api::{FlowMode, MirrorFlow};

/// The cluster ids of a flow's source and target, when known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ids {
    pub source: Option<String>,
    pub target: Option<String>,
}

/// Why `this` (with cluster ids `ids`) may not use its aliases: an older replicating flow
/// among `others` (with ids from `ids_of`, by `<namespace>/<name>`) gives one of them to
/// another cluster. `None` when no alias is given to two clusters, or the ids are not known.
pub fn alias_names_two_clusters(
    this: &MirrorFlow,
    ids: &Ids,
    others: &[std::sync::Arc<MirrorFlow>],
    ids_of: impl Fn(&str) -> Ids,
) -> Option<String> {
    if this.spec.mode != FlowMode::Replicate {
        return None;
    }
    let mine = [
        (
            "spec.source.alias",
            &this.spec.source.alias,
            ids.source.as_deref(),
        ),
        (
            "spec.target.alias",
            &this.spec.target.alias,
            ids.target.as_deref(),
        ),
    ];
    let this_key = key(this);
    for other in others
        .iter()
        .filter(|o| key(o) != this_key && replicating(o) && older(o, this))
    {
        let their_ids = ids_of(&key(other));
        let theirs = [
            (&other.spec.source.alias, their_ids.source.as_deref()),
            (&other.spec.target.alias, their_ids.target.as_deref()),
        ];
        for (field, alias, id) in mine {
            let Some(id) = id else { continue };
            let clash = theirs
                .iter()
                .find(|(a, i)| *a == alias && i.is_some_and(|i| i != id));
            if let Some((_, Some(other_id))) = clash {
                return Some(message(field, alias, id, other_id, this, other));
            }
        }
    }
    None
}

fn message(
    field: &str,
    alias: &str,
    id: &str,
    other_id: &str,
    this: &MirrorFlow,
    other: &MirrorFlow,
) -> String {
    // Another namespace's flows are not this tenant's to know by name.
    let who = if other.metadata.namespace == this.metadata.namespace {
        format!(
            "flow '{}'",
            other.metadata.name.as_deref().unwrap_or_default()
        )
    } else {
        "a flow of another namespace".to_string()
    };
    format!(
        "{field}: alias '{alias}' names Kafka cluster {other_id} in {who} (older), but this flow's cluster is {id}; an alias must name one cluster everywhere, or remote topics '{alias}.<topic>', its checkpoints and heartbeats would mix two clusters' data and cycle detection would take one cluster for the other; give this cluster another alias (or point the flow at cluster {other_id} if that was meant)"
    )
}

fn replicating(f: &MirrorFlow) -> bool {
    f.spec.mode == FlowMode::Replicate && f.metadata.deletion_timestamp.is_none()
}

fn key(f: &MirrorFlow) -> String {
    format!(
        "{}/{}",
        f.metadata.namespace.as_deref().unwrap_or_default(),
        f.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Older means created first; the key breaks ties, as for every rule between flows.
fn older(a: &MirrorFlow, b: &MirrorFlow) -> bool {
    let created = |f: &MirrorFlow| f.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (created(a), key(a)) < (created(b), key(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::sync::Arc;

    fn flow(ns: &str, name: &str, created_s: i64, src: &str, tgt: &str) -> Arc<MirrorFlow> {
        let yaml = format!(
            "source: {{alias: {src}, bootstrapServers: 's:1'}}\ntarget: {{alias: {tgt}, bootstrapServers: 't:1'}}\n"
        );
        let mut mf = MirrorFlow::new(name, serde_yaml::from_str(&yaml).expect("a spec"));
        mf.metadata.namespace = Some(ns.into());
        mf.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created_s).expect("a time"),
        ));
        Arc::new(mf)
    }

    fn ids(source: &str, target: &str) -> Ids {
        Ids {
            source: Some(source.into()),
            target: Some(target.into()),
        }
    }

    #[test]
    fn an_alias_given_to_a_second_cluster_is_refused_naming_the_field() {
        let older = flow("team", "east-to-west", 1, "east", "west");
        let known = |k: &str| match k {
            "team/east-to-west" => ids("C-east", "C-west"),
            _ => Ids::default(),
        };
        // The source alias 'east' for another cluster.
        let newer = flow("team", "other", 2, "east", "dr");
        let m = alias_names_two_clusters(
            &newer,
            &ids("C-other", "C-dr"),
            std::slice::from_ref(&older),
            known,
        )
        .expect("refused");
        assert!(
            m.starts_with("spec.source.alias: alias 'east' names Kafka cluster C-east in flow 'east-to-west' (older), but this flow's cluster is C-other"),
            "{m}"
        );
        // The target alias 'west' used as a source alias for another cluster.
        let newer = flow("team", "back", 2, "west", "x");
        let m = alias_names_two_clusters(
            &newer,
            &ids("C-x2", "C-x"),
            std::slice::from_ref(&older),
            known,
        )
        .expect("refused");
        assert!(m.starts_with("spec.source.alias: alias 'west'"), "{m}");
        // Another namespace's flow is not named.
        let elsewhere = flow("other-team", "mine", 2, "east", "dr");
        let m = alias_names_two_clusters(&elsewhere, &ids("C-other", "C-dr"), &[older], known)
            .expect("refused");
        assert!(
            m.contains("a flow of another namespace") && !m.contains("east-to-west"),
            "{m}"
        );
    }

    #[test]
    fn same_clusters_unknown_ids_newer_or_observing_flows_do_not_refuse() {
        let a = flow("team", "a", 1, "east", "west");
        let known = |k: &str| match k {
            "team/a" => ids("C-east", "C-west"),
            _ => Ids::default(),
        };
        let same = flow("team", "b", 2, "east", "dr");
        assert_eq!(
            alias_names_two_clusters(
                &same,
                &ids("C-east", "C-dr"),
                std::slice::from_ref(&a),
                known
            ),
            None,
            "the same cluster under its alias"
        );
        assert_eq!(
            alias_names_two_clusters(&same, &Ids::default(), std::slice::from_ref(&a), known),
            None,
            "ids not known yet"
        );
        // The older flow is not refused because of a newer one.
        let newer = flow("team", "z", 2, "east", "dr");
        assert_eq!(
            alias_names_two_clusters(&a, &ids("C-east", "C-west"), &[newer], |_| ids(
                "C-x", "C-y"
            )),
            None
        );
        // Observe flows neither block nor are blocked.
        let mut observing = (*flow("team", "o", 0, "east", "q")).clone();
        observing.spec.mode = FlowMode::Observe;
        let observing = Arc::new(observing);
        assert_eq!(
            alias_names_two_clusters(
                &same,
                &ids("C-other", "C-dr"),
                std::slice::from_ref(&observing),
                |_| { ids("C-east", "C-q") }
            ),
            None
        );
        assert_eq!(
            alias_names_two_clusters(&observing, &ids("C-other", "C-q"), &[a], known),
            None
        );
    }
}
