//! One reconcile, top to bottom: check (the spec, the other flows, the Secrets and whether they
//! opted in, the clusters' ids) -> build desired objects (pure) -> apply with server-side apply
//! in a fixed order, a refused child told as the flow field behind it -> observe -> status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, ResourceRequirements, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::desired::{self, BuildInputs};
use super::owned::{delete_owned, foreign_child, uid_of};
use super::{Context, Error, FIELD_MANAGER, applied, guards, rejections};
use crate::api::{FlowMode, MirrorFlow, MirrorFlowStatus};
use crate::flow;
use crate::kafka::SecretFiles;
use crate::status::probe::{self, PROBE_BUDGET};
use crate::status::{self, Blocked, ClusterFault, Observation, reason};

/// How often a healthy flow's status is refreshed from the clusters.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(10);

pub async fn reconcile(mf: Arc<MirrorFlow>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.liveness.beat();
    // A replica whose lease lapsed (frozen, cut off from the apiserver) writes nothing; it
    // exits at its next renewal check.
    if !ctx.leading() {
        return Ok(Action::requeue(super::lease::RENEW_EVERY));
    }
    let _timer = ctx.metrics.reconcile_duration.start_timer();
    ctx.metrics.reconciles.inc();
    if mf.meta().deletion_timestamp.is_some() {
        ctx.metrics
            .forget_flow(&mf.namespace().unwrap_or_default(), &mf.name_any());
        ctx.forget(&Context::flow_key(&mf));
        // ChildInputs carry owner references: the garbage collector removes them.
        return Ok(Action::await_change());
    }
    let ns = mf.namespace().ok_or(Error::NotNamespaced)?;
    let name = mf.name_any();
    let observe_only = mf.spec.mode == FlowMode::Observe;
    let mut obs = Observation {
        observe_only,
        aligned: mf.spec.offsets == crate::api::OffsetsMode::Aligned,
        desired_replicas: if observe_only { 0 } else { mf.spec.replicas },
        heartbeats_enabled: mf.spec.heartbeats.enabled,
        checkpoints_enabled: mf.spec.checkpoints.enabled,
        gaps_acknowledged: gaps_acknowledged(&mf),
        name: mf.name_any(),
        placement: Some(flow::placement::of(&mf.spec)),
        ..Observation::default()
    };

    let verdict = match check(&ctx, &ns, &mf).await? {
        Check::Hold(b) => revoked_while_held(&ctx, &ns, &mf)
            .await?
            .unwrap_or(Check::Hold(b)),
        v => v,
    };
    if !ctx.leading() {
        return Ok(Action::requeue(super::lease::RENEW_EVERY));
    }
    // When a replica on a lost node is due to be replaced, if sooner than the next refresh.
    let mut replace_due: Option<Duration> = None;
    match workload(&verdict, observe_only) {
        Workload::Apply(children) => match apply_children(&ctx, &ns, &mf, children).await {
            Err(Error::Kube(kube::Error::Api(s))) if rejections::namespace_terminating(&s) => {
                return Ok(namespace_going(&ctx, &ns, &mf));
            }
            Err(e) => return Err(e),
            Ok(Ok(ready)) => {
                obs.ready_replicas = ready;
                if ready < obs.desired_replicas {
                    replace_due = look_at_replicas(&ctx, &ns, &mf, &mut obs).await;
                }
            }
            Ok(Err(rejected)) => obs.blocked = Some(rejected),
        },
        Workload::Remove => {
            remove_workload(&ctx, &ns, &mf).await?;
            // The status counts the replicators the operator runs: none now, whatever the
            // spec asks for.
            obs.desired_replicas = 0;
        }
        Workload::Keep => {}
    }
    match verdict {
        Check::Hold(b) | Check::Stop(b) => obs.blocked = Some(b),
        Check::Deploy(f, _) if obs.blocked.is_none() => {
            if !probe_into(&ctx, &ns, &mf, *f, &mut obs).await {
                // No probe slot in time: the status stays what was last measured rather
                // than say something not measured.
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
        }
        Check::Deploy(..) => {}
    }

    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let new_status = status::status(
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
    // The probe can take seconds: the lease may have lapsed meanwhile.
    if !ctx.leading() {
        return Ok(Action::requeue(super::lease::RENEW_EVERY));
    }
    publish(&ctx, &mf, &ns, new_status).await?;
    ctx.record_success(&super::Context::flow_key(&mf));
    // A broken flow is re-checked slowly: nothing changes until someone fixes it (an edit
    // triggers a reconcile at once anyway).
    let next = if obs.blocked.is_some() {
        Duration::from_secs(60)
    } else {
        // A replacement is made at its time, not up to a refresh later (a second past it, so
        // the node has been lost for the whole bound).
        replace_due
            .filter(|d| !d.is_zero())
            .map_or(STATUS_INTERVAL, |d| {
                let whole = d.as_secs() + u64::from(d.subsec_nanos() > 0);
                STATUS_INTERVAL.min(Duration::from_secs(whole + 1))
            })
    };
    Ok(Action::requeue(next))
}

/// The flow's namespace is being deleted: nothing can be created in it, and the namespace
/// controller deletes the flow and its children. No probe, no status, no Event (creating one
/// is refused too) and no retry: the flow's deletion ends it, and a child's deletion seen
/// meanwhile triggers one more reconcile that ends here again.
fn namespace_going(ctx: &Context, ns: &str, mf: &MirrorFlow) -> Action {
    tracing::info!(flow = %mf.name_any(), namespace = %ns,
        "the namespace is being deleted: nothing applied, the flow goes with it");
    ctx.forget(&Context::flow_key(mf));
    Action::await_change()
}

/// What a reconcile does with a flow's replicators.
#[derive(Debug, PartialEq)]
enum Workload<'a> {
    /// Apply the children, built with these inputs.
    Apply(&'a ChildInputs),
    /// Delete the children this flow owns.
    Remove,
    /// Leave whatever runs as it is.
    Keep,
}

fn workload(check: &Check, observe_only: bool) -> Workload<'_> {
    match check {
        Check::Deploy(_, children) if !observe_only => Workload::Apply(children),
        // Observe mode runs no replicator; nor does a flow that would harm a cluster or use
        // what it may not.
        Check::Deploy(..) | Check::Stop(_) => Workload::Remove,
        // A spec error or a missing Secret leaves running replicators as they are: a typo in
        // an edit should not stop what ran before it.
        Check::Hold(_) => Workload::Keep,
    }
}

/// A flow switched to `mode: Observe` keeps no replicator: its children go (only objects this
/// flow owns are deleted).
async fn remove_workload(ctx: &Context, ns: &str, mf: &MirrorFlow) -> Result<(), Error> {
    let key = Context::flow_key(mf);
    let cached = ctx
        .stateful_sets
        .get(&ObjectRef::new(&mf.name_any()).within(ns))
        .is_some()
        || ctx
            .config_maps
            .get(&ObjectRef::new(&desired::config_map_name(mf)).within(ns))
            .is_some();
    let last = ctx.removed.lock().ok().and_then(|m| m.get(&key).copied());
    if !applied::removal_needed(last, cached, Instant::now()) {
        return Ok(());
    }
    let uid = mf.meta().uid.clone().unwrap_or_default();
    let c = &ctx.client;
    delete_owned::<StatefulSet>(c, ns, &mf.name_any(), &uid).await?;
    delete_owned::<PodDisruptionBudget>(c, ns, &mf.name_any(), &uid).await?;
    delete_owned::<NetworkPolicy>(c, ns, &mf.name_any(), &uid).await?;
    delete_owned::<Service>(c, ns, &desired::service_name(mf), &uid).await?;
    delete_owned::<ConfigMap>(c, ns, &desired::config_map_name(mf), &uid).await?;
    if let Ok(mut m) = ctx.applied.lock() {
        m.remove(&key);
    }
    if let Ok(mut m) = ctx.removed.lock() {
        m.insert(key, Instant::now());
    }
    Ok(())
}

/// Probes the flow's clusters into `obs`; false when no probe slot came free in time (the
/// namespace or the operator has as many probes running as it allows). A probe still running
/// from an earlier reconcile is not started again: its clusters do not answer in time.
async fn probe_into(
    ctx: &Context,
    ns: &str,
    mf: &MirrorFlow,
    flow: flow::Flow,
    obs: &mut Observation,
) -> bool {
    let Some(in_flight) = ctx.probes.claim(&Context::flow_key(mf)) else {
        obs.source_error = Some(ClusterFault::Unreachable(format!(
            "the previous probe of this flow has not finished within {}s: a cluster accepts connections but does not answer",
            PROBE_BUDGET.as_secs()
        )));
        return true;
    };
    let Some(slots) = ctx.probes.slots(ns, STATUS_INTERVAL).await else {
        return false;
    };
    let budget = probe::Budget::new(PROBE_BUDGET);
    let clients = ctx.probe_clients.clone();
    let namespace = ns.to_string();
    // The slots and the claim go with the blocking thread: they are free again when the
    // probe really ends, not when this reconcile stops waiting for it.
    let probed = tokio::time::timeout(
        PROBE_BUDGET + Duration::from_secs(10),
        tokio::task::spawn_blocking(move || {
            let _held = (slots, in_flight);
            probe::observe_with(&clients, &namespace, &flow, budget)
        }),
    )
    .await;
    match probed {
        Ok(Ok(c)) => c.record_into(obs),
        Ok(Err(e)) => {
            obs.source_error = Some(ClusterFault::Unreachable(format!("the probe failed: {e}")))
        }
        Err(_) => {
            obs.source_error = Some(ClusterFault::Unreachable(format!(
                "the probe did not end within {}s",
                PROBE_BUDGET.as_secs() + 10
            )))
        }
    }
    true
}

/// What the checks decided the flow's children are built with.
#[derive(Debug, PartialEq)]
struct ChildInputs {
    /// The resourceVersion of every Secret the flow references.
    versions: BTreeMap<String, String>,
    /// The replicator container's resources, within the installer's bounds.
    resources: ResourceRequirements,
}

/// What the reconcile does with a flow.
enum Check {
    /// Valid, its Secrets readable and allowed, harming no cluster: deploy and probe it.
    Deploy(Box<flow::Flow>, ChildInputs),
    /// Not deployable as it stands; replicators already running are left as they are.
    Hold(Blocked),
    /// Harmful (a loop, one cluster on both sides, shared internal topics) or using a Secret
    /// it may not: no replicator may run.
    Stop(Blocked),
}

/// Every check before anything is deployed, cheapest first: the spec alone, then the other
/// flows, then the Secrets, then the clusters' ids.
async fn check(ctx: &Context, ns: &str, mf: &MirrorFlow) -> Result<Check, Error> {
    if let Err(e) = flow::validate(&mf.spec) {
        return Ok(Check::Hold(Blocked::new(e.reason(), e.to_string())));
    }
    if let Some(m) = flow::placement::refused_change(mf) {
        return Ok(Check::Hold(Blocked::new(reason::PLACEMENT_CHANGED, m)));
    }
    if let Some(b) =
        guards::image_not_allowed(mf, &ctx.replicator_image, &ctx.allowed_image_prefixes)
    {
        return Ok(Check::Stop(b));
    }
    if let Some(b) = guards::pod_metadata_not_allowed(mf, &ctx.allowed_pod_metadata_keys) {
        return Ok(Check::Stop(b));
    }
    // Held, not stopped: replicators already running were built with resources that passed
    // (and keep writing, so the flow keeps its standing against later flows).
    let resources = match guards::replicator_resources(mf, &ctx.resources) {
        Ok(r) => r,
        // An Observe flow runs no pod: what it would ask for does not matter yet.
        Err(_) if mf.spec.mode == FlowMode::Observe => ctx.resources.default.clone(),
        Err(b) => return Ok(Check::Hold(b)),
    };
    let others = ctx.flows.state();
    if let Some(b) = guards::replication_loop(mf, &others, |k| ctx.known_cluster_ids(k)) {
        return Ok(Check::Stop(b));
    }
    // Before anything connects to the flow's clusters (the id look-up, the probe).
    if let Some(b) = guards::addresses::bootstrap_refusal(mf, &ctx.addresses).await {
        return Ok(match b.reason {
            reason::ADDRESS_NOT_ALLOWED => Check::Stop(b),
            // Not resolvable now, so not checkable: running replicators stay.
            _ => Check::Hold(b),
        });
    }
    let (values, versions) = match fetch_secrets(ctx, ns, mf).await? {
        Ok(found) => found,
        Err(SecretRefusal::Missing(b)) => return Ok(Check::Hold(b)),
        Err(SecretRefusal::NotShared(b)) => return Ok(Check::Stop(b)),
    };
    let name = mf.name_any();
    let full = format!("{ns}/{name}");
    let mut resolved = match flow::resolve(
        full.clone(),
        mf.spec.clone(),
        &SecretFiles::from_values(values),
    ) {
        Ok(f) => f,
        Err(e) => return Ok(Check::Hold(Blocked::new(e.reason(), e.to_string()))),
    };
    resolved.writer = flow::writer_of(&full, &mf.metadata);
    let key = Context::flow_key(mf);
    let ids = cluster_ids(ctx, &key, mf, &resolved).await;
    if let Some(b) = guards::same_cluster(&ids) {
        return Ok(Check::Stop(b));
    }
    if let Some(b) = guards::conflicting_flow(mf, &others, |k| ctx.known_cluster_ids(k)) {
        return Ok(Check::Stop(b));
    }
    // Held, not stopped: ids can become known after a flow started (a side that did not
    // answer at first), and its replicators harm nothing of the older flow's.
    if let Some(b) = guards::alias_names_two_clusters(mf, &others, |k| ctx.known_cluster_ids(k)) {
        return Ok(Check::Hold(b));
    }
    Ok(Check::Deploy(
        Box::new(resolved),
        ChildInputs {
            versions,
            resources,
        },
    ))
}

/// A held flow keeps its replicators, which mount the Secrets they were deployed with. If the
/// owner of one of those Secrets withdrew this flow's opt-in meanwhile, holding would keep
/// using it: the replicators must go. `None`: nothing was withdrawn.
async fn revoked_while_held(
    ctx: &Context,
    ns: &str,
    mf: &MirrorFlow,
) -> Result<Option<Check>, Error> {
    let Some(sts) = ctx
        .stateful_sets
        .get(&ObjectRef::new(&mf.name_any()).within(ns))
    else {
        return Ok(None);
    };
    let mounted: Vec<String> = sts
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
        .collect();
    let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
    for name in mounted {
        // A deleted Secret is not a withdrawal: the pods keep what they mounted, and the
        // held flow already says which Secret is missing.
        let withdrawn = api
            .get_opt(&name)
            .await?
            .is_some_and(|s| !guards::secret_allows(&s, &mf.name_any()));
        if withdrawn {
            return Ok(Some(Check::Stop(guards::secret_not_shared(
                "spec",
                &name,
                ns,
                &mf.name_any(),
            ))));
        }
    }
    Ok(None)
}

/// The clusters' ids, asked once per spec generation (again while a side did not answer).
async fn cluster_ids(
    ctx: &Context,
    key: &str,
    mf: &MirrorFlow,
    flow: &flow::Flow,
) -> guards::ClusterIds {
    let generation = mf.meta().generation;
    if let Some((g, ids)) = ctx.cluster_ids_of(key)
        && g == generation
        && ids.source.is_some()
        && ids.target.is_some()
    {
        return ids;
    }
    // The look-up talks to the flow's clusters like a probe, so it takes the same slots: one
    // per flow, a few per namespace. A namespace of flows whose brokers never answer then
    // holds its own slots only, and every other tenant's flows are still probed.
    let known = ctx.known_cluster_ids(key);
    let Some(in_flight) = ctx.probes.claim(key) else {
        return known;
    };
    let namespace = mf.namespace().unwrap_or_default();
    let Some(slots) = ctx.probes.slots(&namespace, STATUS_INTERVAL).await else {
        return known;
    };
    let f = flow.clone();
    let clients = ctx.probe_clients.clone();
    let ids = tokio::time::timeout(
        Duration::from_secs(15),
        tokio::task::spawn_blocking(move || {
            let _held = (slots, in_flight);
            let (source, target) = probe::cluster_ids_with(&clients, &namespace, &f);
            guards::ClusterIds { source, target }
        }),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .unwrap_or_default();
    ctx.remember_cluster_ids(key, generation, ids.clone());
    ids
}

/// Applies the children in a fixed order with server-side apply. `Ok(Err(_))`: the apiserver
/// refused one of them, told as the flow field that produced the bad value.
async fn apply_children(
    ctx: &Context,
    ns: &str,
    mf: &MirrorFlow,
    children: &ChildInputs,
) -> Result<Result<i32, Blocked>, Error> {
    let inputs = BuildInputs {
        image: ctx.replicator_image.clone(),
        secret_versions: children.versions.clone(),
        resources: children.resources.clone(),
        network: ctx.network.clone(),
    };
    let objects = desired::build(mf, &inputs).map_err(Error::Build)?;
    let name = mf.name_any();
    let cm = desired::config_map_name(mf);
    let key = Context::flow_key(mf);
    let digest = applied::digest(&objects);
    let cached_sts = ctx.stateful_sets.get(&ObjectRef::new(&name).within(ns));
    let cached_cm = ctx.config_maps.get(&ObjectRef::new(&cm).within(ns));
    let last = ctx.applied.lock().ok().and_then(|m| m.get(&key).cloned());
    tracing::debug!(flow = %key, digest, last = ?last,
        cached_config_map = ?cached_cm.as_ref().and_then(|c| c.resource_version()),
        cached_stateful_set = ?cached_sts.as_ref().and_then(|s| s.resource_version()),
        "children: apply or not");
    if applied::unchanged(
        last.as_ref(),
        digest,
        cached_cm
            .as_ref()
            .and_then(|c| c.resource_version())
            .as_deref(),
        cached_sts
            .as_ref()
            .and_then(|s| s.resource_version())
            .as_deref(),
        Instant::now(),
    ) {
        return Ok(Ok(ready_replicas(cached_sts.as_deref())));
    }
    if let Some(b) = foreign_child(&ctx.client, ns, mf, objects.network_policy.is_some()).await? {
        return Ok(Err(b));
    }
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let client = ctx.client.clone();
    let refused = |kind: &str, name: &str, e: kube::Error| match &e {
        kube::Error::Api(status) => {
            let rejected = rejections::describe(kind, name, status)
                .map(|msg| Blocked::new(reason::CHILD_REJECTED, msg));
            let forbidden = || {
                rejections::forbidden(kind, name, ns, status)
                    .map(|msg| Blocked::new(reason::CHILD_FORBIDDEN, msg))
            };
            rejected.or_else(forbidden).ok_or(Error::Kube(e))
        }
        _ => Err(Error::Kube(e)),
    };
    let applied_cm = match Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(&cm, &pp, &Patch::Apply(&objects.config_map))
        .await
    {
        Ok(applied) => applied,
        Err(e) => return refused("ConfigMap", &cm, e).map(Err),
    };
    let svc = desired::service_name(mf);
    if let Err(e) = Api::<Service>::namespaced(client.clone(), ns)
        .patch(&svc, &pp, &Patch::Apply(&objects.service))
        .await
    {
        return refused("Service", &svc, e).map(Err);
    }
    // Before the StatefulSet, so its pods never run without the policy.
    if let Err(e) = network_policy(&client, ns, mf, objects.network_policy.as_ref(), &pp).await? {
        return refused("NetworkPolicy", &name, e).map(Err);
    }
    let sts = match Api::<StatefulSet>::namespaced(client.clone(), ns)
        .patch(&name, &pp, &Patch::Apply(&objects.stateful_set))
        .await
    {
        Ok(sts) => sts,
        Err(e) => return refused("StatefulSet", &name, e).map(Err),
    };
    if let Err(e) = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .patch(&name, &pp, &Patch::Apply(&objects.pdb))
        .await
    {
        return refused("PodDisruptionBudget", &name, e).map(Err);
    }
    if let Ok(mut m) = ctx.removed.lock() {
        m.remove(&key);
    }
    if let Ok(mut m) = ctx.applied.lock() {
        m.insert(
            key,
            applied::Applied {
                digest,
                config_map: applied_cm.resource_version(),
                stateful_set: sts.resource_version(),
                at: Instant::now(),
            },
        );
    }
    Ok(Ok(ready_replicas(Some(&sts))))
}

/// Applies the flow's NetworkPolicy, or deletes the one it applied earlier when the installer
/// turned the policy off. `Ok(Err(_))`: the apiserver refused the policy.
async fn network_policy(
    client: &kube::Client,
    ns: &str,
    mf: &MirrorFlow,
    policy: Option<&NetworkPolicy>,
    pp: &PatchParams,
) -> Result<Result<(), kube::Error>, Error> {
    let name = mf.name_any();
    match policy {
        Some(p) => Ok(Api::<NetworkPolicy>::namespaced(client.clone(), ns)
            .patch(&name, pp, &Patch::Apply(p))
            .await
            .map(drop)),
        None => delete_owned::<NetworkPolicy>(client, ns, &name, &uid_of(mf))
            .await
            .map(Ok),
    }
}

fn ready_replicas(sts: Option<&StatefulSet>) -> i32 {
    sts.and_then(|s| s.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

enum SecretRefusal {
    /// Absent Secret or key: the flow waits for it.
    Missing(Blocked),
    /// The Secret did not opt in to this flow.
    NotShared(Blocked),
}

/// Values of the Secret keys the flow references and every Secret's resourceVersion; or why
/// one cannot be used, naming the field that references it and the fix.
async fn fetch_secrets(
    ctx: &Context,
    ns: &str,
    mf: &MirrorFlow,
) -> Result<
    Result<
        (
            BTreeMap<(String, String), Vec<u8>>,
            BTreeMap<String, String>,
        ),
        SecretRefusal,
    >,
    Error,
> {
    let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
    let mut values = BTreeMap::new();
    let mut versions = BTreeMap::new();
    let missing = |m: String| {
        Ok(Err(SecretRefusal::Missing(Blocked::new(
            reason::SECRET_MISSING,
            m,
        ))))
    };
    for (field, r) in desired::secret_refs(mf) {
        let Some(secret) = api.get_opt(&r.name).await? else {
            return missing(format!(
                "{field}: Secret '{}' not found in namespace '{ns}'; create it with key '{}'",
                r.name, r.key
            ));
        };
        if let Err(b) = guards::secret_grant(&secret, &mf.name_any(), &mf.spec, &field, ns) {
            return Ok(Err(SecretRefusal::NotShared(b)));
        }
        let data = secret.data.unwrap_or_default();
        let Some(bytes) = data.get(&r.key) else {
            return missing(format!(
                "{field}: Secret '{}' has no key '{}'; add it",
                r.name, r.key
            ));
        };
        values.insert((r.name.clone(), r.key.clone()), bytes.0.clone());
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
    let value = mf.annotations().get(status::GAPS_ACKNOWLEDGED)?;
    Some(
        value
            .parse::<k8s_openapi::jiff::Timestamp>()
            .map(|t| t.as_millisecond())
            .map_err(|e| {
                format!(
                    "annotation {} is '{value}', not an RFC 3339 time ({e}); set it to the detectedAt of the newest gap to acknowledge, e.g. 2026-11-30T08:00:00Z",
                    status::GAPS_ACKNOWLEDGED
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

/// Why the flow's replicas are not ready, read from their pods, and those stranded on lost
/// nodes replaced; returns when the next replacement is due. What the apiserver refuses is
/// named in the status, not only logged.
async fn look_at_replicas(
    ctx: &Context,
    ns: &str,
    mf: &MirrorFlow,
    obs: &mut Observation,
) -> Option<Duration> {
    use super::unready::{Look, not_looked_at};
    let (ready, desired) = (obs.ready_replicas, obs.desired_replicas);
    let pods = match super::lost_nodes::replica_pods(ctx, ns, mf).await {
        Ok(pods) => pods,
        Err(e) => {
            obs.unready = Some(not_looked_at(Look::ReadPods, &e, ns, ready, desired));
            return None;
        }
    };
    let mut unready: Vec<_> = (pods.found.iter())
        .filter_map(super::unready::diagnose)
        .collect();
    if let Some(pod) = pods.missing.into_iter().next() {
        // A pod the cluster refuses to create has no status of its own to read.
        match super::failed_creates::newest(ctx, ns, &mf.name_any()).await {
            Ok(Some(refusal)) => unready.push(super::unready::not_created(pod, &refusal)),
            Ok(None) => {}
            // Without `list` on events (a hand-written Role) the count stays generic: a
            // missing pod is most often one on its way, not worth a condition of its own.
            Err(e) => tracing::debug!(flow = %mf.name_any(), namespace = ns, error = %e,
                "could not read the StatefulSet's FailedCreate events"),
        }
    }
    obs.unready = super::unready::summary(unready, &mf.spec, ns);
    match super::lost_nodes::tend(ctx, ns, mf, &pods.found).await {
        Ok(stranded) => {
            obs.stranded = stranded.iter().map(|s| s.message()).collect();
            stranded.iter().filter_map(|s| s.replace_in).min()
        }
        // With replacement off the installer grants no look at nodes: nothing to name.
        Err(e) if ctx.replace_after.is_none() => {
            tracing::debug!(flow = %mf.name_any(), namespace = ns, error = %e,
                "no look for replicas on lost nodes (replacement is off)");
            None
        }
        Err(e) => {
            // A diagnosis read from the pods says more than the refusal does.
            if obs.unready.is_none() {
                obs.unready = Some(not_looked_at(Look::TendLostNodes, &e, ns, ready, desired));
            }
            None
        }
    }
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
