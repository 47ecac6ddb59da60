//! One reconcile, top to bottom: dereference Secrets (I/O) -> validate (pure) -> build desired
//! objects (pure) -> apply with server-side apply in a fixed order -> observe -> status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::conditions::{self, ClusterFault, Observation};
use super::desired::{self, BuildInputs};
use super::probe;
use super::{Context, Error, FIELD_MANAGER};
use crate::api::{FlowMode, MirrorFlow, MirrorFlowStatus, PolicyKind};
use crate::flow;
use crate::kafka::SecretFiles;

/// How often a healthy flow's status is refreshed from the clusters.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(10);

pub async fn reconcile(mf: Arc<MirrorFlow>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_duration.start_timer();
    ctx.metrics.reconciles.inc();
    if mf.meta().deletion_timestamp.is_some() {
        ctx.metrics
            .forget_flow(&mf.namespace().unwrap_or_default(), &mf.name_any());
        // Children carry owner references: the garbage collector removes them.
        return Ok(Action::await_change());
    }
    let ns = mf.namespace().ok_or(Error::NotNamespaced)?;
    let name = mf.name_any();
    let observe_only = mf.spec.mode == FlowMode::Observe;
    let mut obs = Observation {
        observe_only,
        desired_replicas: if observe_only { 0 } else { mf.spec.replicas },
        heartbeats_enabled: mf.spec.heartbeats.enabled,
        checkpoints_enabled: mf.spec.checkpoints.enabled,
        gaps_acknowledged: gaps_acknowledged(&mf),
        name: mf.name_any(),
        ..Observation::default()
    };

    // Static checks the CRD schema cannot express (regexes, ...); a flow that fails them is
    // never deployed.
    let looping = match flow::validate(&mf.spec) {
        Ok(()) => identity_loop(&ctx, &ns, &mf).await?,
        Err(_) => None,
    };
    let resolved_without_secrets = match (flow::validate(&mf.spec), &looping) {
        (Err(e), _) => Err(e.to_string()),
        (Ok(()), Some(msg)) => Err(msg.clone()),
        (Ok(()), None) => Ok(()),
    };
    let secrets = fetch_secrets(&ctx, &ns, &mf).await?;
    match (&resolved_without_secrets, &secrets) {
        (Err(msg), _) => obs.invalid_spec = Some(msg.clone()),
        (Ok(()), Err(msg)) => obs.missing_secret = Some(msg.clone()),
        _ => {}
    }
    let mut resolved = None;
    if obs.invalid_spec.is_none()
        && let Ok((values, _)) = &secrets
    {
        match flow::resolve(
            format!("{ns}/{name}"),
            mf.spec.clone(),
            &SecretFiles::from_values(values.clone()),
        ) {
            Ok(f) => resolved = Some(f),
            Err(e) if e.reason() == "SecretMissing" => obs.missing_secret = Some(e.to_string()),
            Err(e) => obs.invalid_spec = Some(e.to_string()),
        }
    }

    // A loop copies every record again and again: stop replicating at once, not just report.
    if observe_only || looping.is_some() {
        remove_workload(&ctx, &ns, &mf).await?;
    } else if let (Some(_), Ok((_, versions))) = (&resolved, &secrets) {
        let inputs = BuildInputs {
            image: ctx.replicator_image.clone(),
            secret_versions: versions.clone(),
        };
        let objects = desired::build(&mf, &inputs).map_err(Error::Build)?;
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        let client = ctx.client.clone();
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .patch(
                &desired::config_map_name(&mf),
                &pp,
                &Patch::Apply(&objects.config_map),
            )
            .await?;
        Api::<Service>::namespaced(client.clone(), &ns)
            .patch(
                &desired::service_name(&mf),
                &pp,
                &Patch::Apply(&objects.service),
            )
            .await?;
        let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns)
            .patch(&name, &pp, &Patch::Apply(&objects.stateful_set))
            .await?;
        Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
            .patch(&name, &pp, &Patch::Apply(&objects.pdb))
            .await?;
        obs.ready_replicas = sts
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
    }

    if let Some(f) = resolved {
        let probed = tokio::time::timeout(
            Duration::from_secs(45),
            tokio::task::spawn_blocking(move || probe::observe(&f)),
        )
        .await;
        match probed {
            Ok(Ok(c)) => c.record_into(&mut obs),
            Ok(Err(e)) => {
                obs.source_error = Some(ClusterFault::Unreachable(format!("the probe failed: {e}")))
            }
            Err(_) => {
                obs.source_error = Some(ClusterFault::Unreachable(
                    "the probe timed out after 45s".into(),
                ))
            }
        }
    }

    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let new_status = conditions::status(
        mf.status.as_ref(),
        &obs,
        &mf.spec.failover_readiness,
        mf.meta().generation,
        &now,
    );
    ctx.metrics.record_flow(
        &ns,
        &name,
        &obs,
        &new_status,
        mf.spec.failover_readiness.max_checkpoint_age.as_duration(),
    );
    publish(&ctx, &mf, &ns, new_status).await?;
    ctx.record_success(&super::Context::flow_key(&mf));
    // A broken flow is re-checked slowly: nothing changes until someone fixes it (an edit
    // triggers a reconcile at once anyway).
    let next = if obs.invalid_spec.is_some() || obs.missing_secret.is_some() {
        Duration::from_secs(60)
    } else {
        STATUS_INTERVAL
    };
    Ok(Action::requeue(next))
}

/// With the Identity policy nothing marks a record as copied, so a flow back the other way
/// copies every record again, forever. Flows in the same namespace between the same two
/// clusters (compared by bootstrap servers) are checked; the message names both flows.
async fn identity_loop(ctx: &Context, ns: &str, mf: &MirrorFlow) -> Result<Option<String>, Error> {
    let identity = |f: &MirrorFlow| f.spec.replication_policy.kind == PolicyKind::Identity;
    if !identity(mf) {
        return Ok(None);
    }
    let servers = |s: &str| {
        let mut v: Vec<String> = s
            .split(',')
            .map(|x| x.trim().to_ascii_lowercase())
            .collect();
        v.sort();
        v
    };
    let (src, tgt) = (
        servers(&mf.spec.source.bootstrap_servers),
        servers(&mf.spec.target.bootstrap_servers),
    );
    let flows = Api::<MirrorFlow>::namespaced(ctx.client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await?;
    Ok(flows
        .items
        .iter()
        .find(|other| {
            other.name_any() != mf.name_any()
                && servers(&other.spec.source.bootstrap_servers) == tgt
                && servers(&other.spec.target.bootstrap_servers) == src
        })
        .map(|other| {
            format!(
                "spec.replicationPolicy.type: Identity, and flow '{}' copies {} back to {}: records would be copied back and forth forever, since Identity names cannot tell a copy from an original; use type Prefix on {}",
                other.name_any(),
                mf.spec.target.alias,
                mf.spec.source.alias,
                if identity(other) { "both flows" } else { "this flow" },
            )
        }))
}

/// A flow switched to `mode: Observe` keeps no replicator: its children go (only objects this
/// flow owns are deleted).
async fn remove_workload(ctx: &Context, ns: &str, mf: &MirrorFlow) -> Result<(), Error> {
    let uid = mf.meta().uid.clone().unwrap_or_default();
    let c = &ctx.client;
    delete_owned::<StatefulSet>(c, ns, &mf.name_any(), &uid).await?;
    delete_owned::<PodDisruptionBudget>(c, ns, &mf.name_any(), &uid).await?;
    delete_owned::<Service>(c, ns, &desired::service_name(mf), &uid).await?;
    delete_owned::<ConfigMap>(c, ns, &desired::config_map_name(mf), &uid).await?;
    Ok(())
}

async fn delete_owned<K>(
    client: &kube::Client,
    ns: &str,
    name: &str,
    owner_uid: &str,
) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(client.clone(), ns);
    if let Some(o) = api.get_opt(name).await?
        && o.owner_references().iter().any(|r| r.uid == owner_uid)
    {
        api.delete(name, &DeleteParams::background()).await?;
    }
    Ok(())
}

/// Values of the Secret keys the flow references and every Secret's resourceVersion; or a
/// message naming the first missing Secret or key, the field that references it, and the fix.
async fn fetch_secrets(
    ctx: &Context,
    ns: &str,
    mf: &MirrorFlow,
) -> Result<Result<(BTreeMap<(String, String), String>, BTreeMap<String, String>), String>, Error> {
    let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
    let mut values = BTreeMap::new();
    let mut versions = BTreeMap::new();
    for (field, r) in desired::secret_refs(mf) {
        let Some(secret) = api.get_opt(&r.name).await? else {
            return Ok(Err(format!(
                "{field}: Secret '{}' not found in namespace '{ns}'; create it with key '{}'",
                r.name, r.key
            )));
        };
        let data = secret.data.unwrap_or_default();
        let Some(bytes) = data.get(&r.key) else {
            return Ok(Err(format!(
                "{field}: Secret '{}' has no key '{}'; add it",
                r.name, r.key
            )));
        };
        let text = String::from_utf8_lossy(&bytes.0).into_owned();
        values.insert((r.name.clone(), r.key.clone()), text);
        versions.insert(
            r.name.clone(),
            secret.metadata.resource_version.unwrap_or_default(),
        );
    }
    Ok(Ok((values, versions)))
}

/// The time in the `mirrorflow.io/gaps-acknowledged` annotation (ms since the epoch), or why
/// it is not one (then nothing is acknowledged and `Gapless` says so).
fn gaps_acknowledged(mf: &MirrorFlow) -> Option<Result<i64, String>> {
    let value = mf.annotations().get(conditions::GAPS_ACKNOWLEDGED)?;
    Some(
        value
            .parse::<k8s_openapi::jiff::Timestamp>()
            .map(|t| t.as_millisecond())
            .map_err(|e| {
                format!(
                    "annotation {} is '{value}', not an RFC 3339 time ({e}); set it to the detectedAt of the newest gap to acknowledge, e.g. 2026-11-30T08:00:00Z",
                    conditions::GAPS_ACKNOWLEDGED
                )
            }),
    )
}

/// Writes the status if it changed and records an Event for every condition that flipped
/// and for every newly found gap.
async fn publish(
    ctx: &Context,
    mf: &MirrorFlow,
    ns: &str,
    status: MirrorFlowStatus,
) -> Result<(), Error> {
    // The cached object can lag behind our own last write when reconciles come in quick
    // succession; comparing against what we last wrote keeps events to real flips.
    let key = format!("{ns}/{}", mf.name_any());
    let old = ctx
        .last_status
        .lock()
        .ok()
        .and_then(|m| m.get(&key).cloned())
        .or_else(|| mf.status.clone())
        .unwrap_or_default();
    if old == status && mf.status.as_ref() == Some(&status) {
        return Ok(());
    }
    for c in &status.conditions {
        let before = old.conditions.iter().find(|o| o.type_ == c.type_);
        if before.map(|b| (&b.status, &b.reason)) != Some((&c.status, &c.reason)) {
            let event = Event {
                type_: if c.status == "True" {
                    EventType::Normal
                } else {
                    EventType::Warning
                },
                // A True condition's reason is the generic AsExpected; naming the event after
                // the condition keeps `kubectl describe` readable (one series per condition).
                reason: if c.status == "True" {
                    c.type_.clone()
                } else {
                    c.reason.clone()
                },
                note: Some(format!("{} is {}: {}", c.type_, c.status, c.message)),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(e) = ctx.recorder.publish(&event, &mf.object_ref(&())).await {
                tracing::warn!(error = %e, "could not record an event");
            }
        }
    }
    for gap in status.gaps.iter().filter(|g| !old.gaps.contains(g)) {
        let event = Event {
            type_: EventType::Warning,
            reason: gap.reason.clone(),
            note: Some(gap.message.clone()),
            action: "Replicate".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&event, &mf.object_ref(&())).await {
            tracing::warn!(error = %e, "could not record an event");
        }
    }
    let api = Api::<MirrorFlow>::namespaced(ctx.client.clone(), ns);
    let patch = json!({
        "apiVersion": "mirrorflow.io/v1alpha1",
        "kind": "MirrorFlow",
        "status": status,
    });
    api.patch_status(
        &mf.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    if let Ok(mut m) = ctx.last_status.lock() {
        m.insert(key, status);
    }
    Ok(())
}
