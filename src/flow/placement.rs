//! Where a flow's copies go, and the refusal of a spec change that would move them on a
//! running flow. Switching `Prefix` to `Identity`, renaming an alias or pointing the flow at
//! another target would make the replicators copy every partition again into other remote
//! topics, leave the old ones behind, and leave the checkpoints consumers fail over with
//! naming the old topics. Such a change is held (the running replicators keep the old
//! placement) until the flow's owner accepts it for that generation.

use crate::api::{DeployedPlacement, FlowMode, MirrorFlow, MirrorFlowSpec, PolicyKind};

/// The annotation that accepts a placement change: the `metadata.generation` it was made in.
pub const ACCEPT_PLACEMENT_CHANGE: &str = "mirrorflow.io/accept-placement-change";

/// The placement `spec` asks for.
pub fn of(spec: &MirrorFlowSpec) -> DeployedPlacement {
    let (policy, separator) = match spec.replication_policy.kind {
        PolicyKind::Prefix => (
            "Prefix",
            Some(
                spec.replication_policy
                    .separator
                    .clone()
                    .unwrap_or_else(|| ".".into()),
            ),
        ),
        PolicyKind::Identity => ("Identity", None),
    };
    let mut servers: Vec<String> = spec
        .target
        .bootstrap_servers
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    servers.sort();
    servers.dedup();
    DeployedPlacement {
        policy: policy.into(),
        separator,
        source_alias: spec.source.alias.clone(),
        target_alias: spec.target.alias.clone(),
        target_bootstrap_servers: servers.join(","),
    }
}

/// Why `mf`'s spec may not be deployed as it stands: it moves the copies away from where its
/// status says they were deployed, and the annotation does not accept that for this
/// generation. `None` for an Observe flow (it copies nothing), a flow never deployed, or an
/// unchanged or accepted placement.
pub fn refused_change(mf: &MirrorFlow) -> Option<String> {
    if mf.spec.mode != FlowMode::Replicate {
        return None;
    }
    let deployed = mf.status.as_ref()?.deployed_placement.as_ref()?;
    let wanted = of(&mf.spec);
    let generation = mf.metadata.generation;
    let accepted = mf
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ACCEPT_PLACEMENT_CHANGE))
        .and_then(|v| v.trim().parse::<i64>().ok());
    if *deployed == wanted || (accepted.is_some() && accepted == generation) {
        return None;
    }
    let name = mf.metadata.name.as_deref().unwrap_or("<name>");
    let ns = mf.metadata.namespace.as_deref().unwrap_or("<namespace>");
    Some(message(deployed, &wanted, name, ns, generation))
}

/// The refusal: the first field changed, what the change does to the remote topics and the
/// checkpoints, and the ways on.
fn message(
    deployed: &DeployedPlacement,
    wanted: &DeployedPlacement,
    name: &str,
    ns: &str,
    generation: Option<i64>,
) -> String {
    let effects = effects(deployed, wanted);
    let field = effects.first().map_or("spec", |(f, _)| f);
    let what: Vec<&str> = effects.iter().map(|(_, e)| e.as_str()).collect();
    let generation = generation.map_or_else(|| "<metadata.generation>".into(), |g| g.to_string());
    format!(
        "{field}: this change moves where the flow's copies go: {}. The running replicators keep the deployed placement; nothing new is deployed. To go ahead, accept the change for this generation: kubectl annotate mirrorflow {name} -n {ns} --overwrite {ACCEPT_PLACEMENT_CHANGE}={generation} (consumers that fail over afterwards need the new topics' checkpoints); or undo the change; or create a new flow for the new placement and delete this one",
        what.join("; ")
    )
}

/// Per changed field: its spec path and what the change does.
fn effects(
    deployed: &DeployedPlacement,
    wanted: &DeployedPlacement,
) -> Vec<(&'static str, String)> {
    let remote = |p: &DeployedPlacement| match &p.separator {
        Some(sep) => format!("'{}{sep}<topic>'", p.source_alias),
        None => "'<topic>'".to_string(),
    };
    let mut out = Vec::new();
    let naming_changed = deployed.policy != wanted.policy
        || deployed.separator != wanted.separator
        || (deployed.source_alias != wanted.source_alias && wanted.separator.is_some());
    if naming_changed {
        let field = if deployed.policy != wanted.policy {
            "spec.replicationPolicy.type"
        } else if deployed.separator != wanted.separator {
            "spec.replicationPolicy.separator"
        } else {
            "spec.source.alias"
        };
        out.push((
            field,
            format!(
                "remote topics would be named {} instead of {}, so every source partition would be copied again from its log start into new topics, the existing remote topics would stop receiving records (they stay on the target), and the checkpoints written so far name the old topics",
                remote(wanted),
                remote(deployed)
            ),
        ));
    }
    if deployed.source_alias != wanted.source_alias {
        out.push((
            "spec.source.alias",
            format!(
                "the flow's heartbeats, checkpoints and positions would move from the '{0}.*' internal topics on the target to '{1}.*', so copying restarts with no stored position and groups have no checkpoint until new ones are written",
                deployed.source_alias, wanted.source_alias
            ),
        ));
    }
    if deployed.target_alias != wanted.target_alias {
        out.push((
            "spec.target.alias",
            format!(
                "offset syncs would go to mm2-offset-syncs.{}.internal instead of mm2-offset-syncs.{}.internal, so checkpoints are translated from new syncs only",
                wanted.target_alias, deployed.target_alias
            ),
        ));
    }
    if deployed.target_bootstrap_servers != wanted.target_bootstrap_servers {
        out.push((
            "spec.target.bootstrapServers",
            format!(
                "records would go to '{}' instead of '{}': everything would be copied again there, and the existing remote topics and checkpoints stay on the old target",
                wanted.target_bootstrap_servers, deployed.target_bootstrap_servers
            ),
        ));
    }
    out
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
