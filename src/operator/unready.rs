//! Why a replicator pod is not ready, by class, with the spec field and the fix.
//!
//! A flow whose replicators cannot run used to read "0/1 replicator pods ready" whatever the
//! cause: a memory limit a batch of compressed records blows through, an image no node can
//! pull, a Secret deleted under it, a spread no node can satisfy, a replicator that exits on
//! an error of its own. The pods' status already says which; this reads it. Everything read
//! here is bounded before it reaches a status: a pod's messages come from the kubelet, the
//! scheduler and (the termination message) the replicator itself, which may repeat what a
//! broker said.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, Pod};
use kube::ResourceExt;

use crate::api::{CopyUnit, MirrorFlowSpec};
use crate::status::reason;

/// The longest piece of a pod's own words kept in a message.
const DETAIL_MAX: usize = 300;
/// Pods named in one condition; the rest are counted.
const NAMED_MAX: usize = 3;

/// What keeps one replicator pod from running, worst class first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Killed by the kernel for its memory limit.
    OutOfMemory { restarts: i32 },
    /// The replicator exited with an error of its own.
    Crashing { code: i32, restarts: i32 },
    /// A Secret, a key or the flow's ConfigMap the pod mounts is missing.
    ConfigMissing,
    /// The cluster refuses to create it (quota, LimitRange, Pod Security, admission webhook).
    NotCreated,
    /// No node can pull its image.
    ImageUnavailable,
    /// No node can take it.
    Unschedulable,
}

/// One pod that is not ready, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unready {
    pub pod: String,
    pub class: Class,
    /// The pod's own words (bounded): the scheduler's, the kubelet's or the replicator's.
    pub detail: String,
}

impl Class {
    pub fn reason(&self) -> &'static str {
        match self {
            Class::OutOfMemory { .. } => reason::REPLICATOR_OUT_OF_MEMORY,
            Class::Crashing { .. } => reason::REPLICATOR_CRASHING,
            Class::ConfigMissing => reason::REPLICATOR_CONFIG_MISSING,
            Class::NotCreated => reason::REPLICATOR_NOT_CREATED,
            Class::ImageUnavailable => reason::REPLICATOR_IMAGE_UNAVAILABLE,
            Class::Unschedulable => reason::REPLICATOR_UNSCHEDULABLE,
        }
    }
}

/// A replicator pod that does not exist because the cluster refused to create it, with the
/// refusal's words (the StatefulSet controller's `FailedCreate` Event), bounded.
pub fn not_created(pod: String, refusal: &str) -> Unready {
    Unready {
        pod,
        class: Class::NotCreated,
        detail: bounded(refusal),
    }
}

/// Why `pod` is not running, when its status says so; `None` for a pod on its way (being
/// created, starting, or running and not ready yet), which the generic count covers.
pub fn diagnose(pod: &Pod) -> Option<Unready> {
    let status = pod.status.as_ref()?;
    let container = (status.container_statuses.iter().flatten())
        .find(|c| c.name == "replicator")
        .or_else(|| status.container_statuses.as_ref()?.first());
    let class = container
        .and_then(|c| from_container(c).map(|(class, detail)| (class, bounded(&detail))))
        .or_else(|| {
            let unscheduled = (status.conditions.iter().flatten()).find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })?;
            let detail = bounded(unscheduled.message.as_deref().unwrap_or_default());
            Some((Class::Unschedulable, detail))
        })?;
    Some(Unready {
        pod: pod.name_any(),
        class: class.0,
        detail: class.1,
    })
}

/// A container that waits for something that will not come, or that keeps ending.
fn from_container(c: &ContainerStatus) -> Option<(Class, String)> {
    let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
    let waiting_reason = waiting
        .and_then(|w| w.reason.as_deref())
        .unwrap_or_default();
    let waiting_message = waiting.and_then(|w| w.message.clone()).unwrap_or_default();
    match waiting_reason {
        "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull" => {
            return Some((Class::ImageUnavailable, waiting_message));
        }
        "CreateContainerConfigError" => return Some((Class::ConfigMissing, waiting_message)),
        _ => {}
    }
    // The end it keeps coming to: the current state when it just ended, else the last one
    // (a container in CrashLoopBackOff waits, and its last state says why).
    let ended = terminated(c.state.as_ref()).or_else(|| terminated(c.last_state.as_ref()))?;
    let crash_looping = waiting_reason == "CrashLoopBackOff";
    let just_ended = terminated(c.state.as_ref()).is_some();
    if !crash_looping && !just_ended {
        // Ran again since it ended and is still starting: not (yet) a pattern.
        return None;
    }
    let restarts = c.restart_count;
    if ended.reason.as_deref() == Some("OOMKilled") {
        return Some((Class::OutOfMemory { restarts }, String::new()));
    }
    if ended.exit_code == 0 && !crash_looping {
        return None;
    }
    let words = last_words(ended.message.as_deref().unwrap_or_default());
    Some((
        Class::Crashing {
            code: ended.exit_code,
            restarts,
        },
        words,
    ))
}

fn terminated(
    s: Option<&ContainerState>,
) -> Option<&k8s_openapi::api::core::v1::ContainerStateTerminated> {
    s?.terminated.as_ref()
}

/// The replicator's last words: its termination message is one line it wrote itself; when
/// the kubelet fell back to the log's tail (a crash before it could write), the last line,
/// and from a JSON log line its message and error.
fn last_words(message: &str) -> String {
    let line = message
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or_default();
    let Ok(serde_json::Value::Object(json)) = serde_json::from_str::<serde_json::Value>(line)
    else {
        return line.to_string();
    };
    let fields = json.get("fields").unwrap_or(&serde_json::Value::Null);
    let text = |k: &str| {
        (fields.get(k).or_else(|| json.get(k)))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    match (text("message"), text("error")) {
        (Some(m), Some(e)) => format!("{m}: {e}"),
        (Some(m), None) => m,
        (None, Some(e)) => e,
        (None, None) => line.to_string(),
    }
}

/// At most [`DETAIL_MAX`] bytes of `text` on one line ([`crate::status::one_line`]).
fn bounded(text: &str) -> String {
    crate::status::one_line(text.trim(), DETAIL_MAX).into_owned()
}

/// What the operator could not do to say why replicas are not ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// Read the replica pods (`get` on pods in the flow's namespace).
    ReadPods,
    /// Look for replicas on lost nodes and replace them (`get` on nodes, `delete` on pods).
    TendLostNodes,
}

/// The status of replicas the operator was refused a look at: the right it lacks and where,
/// or the apiserver's own (bounded) words when it was not a refusal. An RBAC without pods
/// must not leave the flow at a bare count with the cause only in the operator's log.
pub fn not_looked_at(
    look: Look,
    error: &kube::Error,
    ns: &str,
    ready: i32,
    desired: i32,
) -> (&'static str, String) {
    let (what, right) = match look {
        Look::ReadPods => (
            "read its replica pods to say why",
            format!("get on pods in namespace {ns}"),
        ),
        Look::TendLostNodes => (
            "look for replicas stranded on lost nodes",
            format!("get on nodes and delete on pods in namespace {ns}"),
        ),
    };
    let fix = match error {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => format!(
            "the apiserver refused it: grant the operator's service account {right} (the \
             chart's RBAC does; check a hand-written Role)"
        ),
        e => format!(
            "the apiserver answered: {}; the operator tries again at its next refresh",
            bounded(&e.to_string())
        ),
    };
    (
        reason::REPLICAS_NOT_READY,
        format!("{ready}/{desired} replicator pods ready and the operator cannot {what}: {fix}"),
    )
}

/// Whether `spec` copies records where it could copy whole batches (which never decompress):
/// it names `Records` where the default would copy batches.
fn batches_possible(spec: &MirrorFlowSpec) -> bool {
    crate::flow::copy_unit(spec) == CopyUnit::Records
        && crate::flow::batches_blocker(spec).is_none()
}

fn times(n: i32) -> String {
    match n {
        0 | 1 => "once".into(),
        n => format!("{n} times"),
    }
}

/// What `u` means for the flow, the field to look at and the fix.
pub fn message(u: &Unready, spec: &MirrorFlowSpec, ns: &str) -> String {
    let pod = &u.pod;
    let detail = |lead: &str| {
        if u.detail.is_empty() {
            String::new()
        } else {
            format!("{lead}{}", u.detail)
        }
    };
    match &u.class {
        Class::OutOfMemory { restarts } => {
            let limit = (spec.resources.as_ref())
                .and_then(|r| r.limits.as_ref()?.get("memory"))
                .map_or("the installer's default".to_string(), |q| q.0.clone());
            let records = if batches_possible(spec) {
                "; spec.sourceLoop.copy: Records decompresses every batch it reads, so a topic \
                 with batches that inflate far (a compression bomb) needs the memory: \
                 spec.sourceLoop.copy: Batches (the default when unset) copies them without \
                 decompressing"
            } else {
                ""
            };
            format!(
                "replicator pod {pod} was killed {} for using more memory than its limit ({limit}, spec.resources.limits.memory): raise spec.resources.limits.memory{records}",
                times((*restarts).max(1))
            )
        }
        Class::Crashing { code, restarts } => format!(
            "replicator pod {pod} exited with code {code} {}{}; the rest is in its log: kubectl logs -n {ns} {pod} --previous",
            times((*restarts).max(1)),
            detail(": "),
        ),
        Class::ConfigMissing => format!(
            "replicator pod {pod} cannot start{}: a Secret or key the flow names (spec.source.sasl, spec.target.sasl, spec.*.tls) is missing; create it or fix the reference",
            detail(": "),
        ),
        Class::NotCreated => {
            let said = u.detail.to_ascii_lowercase();
            let fix = if said.contains("exceeded quota") {
                format!(
                    "a ResourceQuota of namespace {ns} has no room for it: raise the quota, or lower spec.replicas or spec.resources"
                )
            } else if said.contains("per container") || said.contains("limitrange") {
                format!("bring spec.resources within the LimitRange of namespace {ns}")
            } else if said.contains("podsecurity") {
                format!(
                    "the Pod Security level of namespace {ns} refuses it: its administrators say what it requires (spec.pod holds what the flow adds to its pods)"
                )
            } else {
                "an admission policy of the cluster refuses it: its owners say what it requires (spec.pod holds what the flow adds to its pods)".to_string()
            };
            format!(
                "replicator pod {pod} cannot be created{}; {fix}",
                detail(": ")
            )
        }
        Class::ImageUnavailable => {
            let (image, fix) = match spec.pod.as_ref().and_then(|p| p.image.as_deref()) {
                Some(image) => (image.to_string(), "fix spec.pod.image, or remove it to use the operator's image".to_string()),
                None => (
                    "the operator's image".to_string(),
                    "the installer's image value (chart values image.repository and image.tag) names an image the node cannot pull: push it, or add imagePullSecrets".to_string(),
                ),
            };
            format!(
                "replicator pod {pod} cannot pull {image}{}; {fix}",
                detail(": ")
            )
        }
        Class::Unschedulable => format!(
            "replicator pod {pod} cannot be scheduled{}; lower spec.resources.requests, or relax spec.pod.nodeSelector, spec.pod.tolerations or spec.pod.topologySpreadConstraints",
            detail(": "),
        ),
    }
}

/// The `Ready` condition's reason and message for the pods that cannot run: the worst class's
/// reason, and up to [`NAMED_MAX`] pods named (worst first).
pub fn summary(
    mut unready: Vec<Unready>,
    spec: &MirrorFlowSpec,
    ns: &str,
) -> Option<(&'static str, String)> {
    unready.sort_by(|a, b| (&a.class, &a.pod).cmp(&(&b.class, &b.pod)));
    let worst = unready.first()?.class.reason();
    let mut parts: Vec<String> = (unready.iter().take(NAMED_MAX))
        .map(|u| message(u, spec, ns))
        .collect();
    if unready.len() > NAMED_MAX {
        parts.push(format!(
            "{} more replicator pods cannot run",
            unready.len() - NAMED_MAX
        ));
    }
    Some((worst, parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(extra: &str) -> MirrorFlowSpec {
        serde_yaml::from_str(&format!(
            "source: {{alias: a, bootstrapServers: 'x:1'}}\ntarget: {{alias: b, bootstrapServers: 'y:1'}}\n{extra}"
        ))
        .expect("a valid spec")
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "f-0", "namespace": "ns"},
            "status": status,
        }))
        .expect("a pod")
    }

    fn container(state: serde_json::Value, last: serde_json::Value, restarts: i32) -> Pod {
        pod(json!({"phase": "Running", "containerStatuses": [{
            "name": "replicator", "ready": false, "restartCount": restarts,
            "image": "i", "imageID": "", "state": state, "lastState": last}]}))
    }

    fn class(p: &Pod) -> Option<Class> {
        diagnose(p).map(|u| u.class)
    }

    #[test]
    fn an_oom_kill_in_a_crash_loop_is_out_of_memory_and_names_the_limit_and_batches() {
        let p = container(
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}),
            json!({"terminated": {"reason": "OOMKilled", "exitCode": 137}}),
            3,
        );
        let u = diagnose(&p).expect("diagnosed");
        assert_eq!(u.class, Class::OutOfMemory { restarts: 3 });
        let s = spec("resources: {limits: {memory: 96Mi}}\nsourceLoop: {copy: Records}");
        let m = message(&u, &s, "ns");
        assert!(
            m.contains("96Mi") && m.contains("spec.resources.limits.memory"),
            "{m}"
        );
        assert!(m.contains("3 times"), "{m}");
        assert!(m.contains("spec.sourceLoop.copy: Batches"), "{m}");
        // The default already copies batches: nothing to offer.
        let m = message(&u, &spec("resources: {limits: {memory: 96Mi}}"), "ns");
        assert!(!m.contains("Batches") && m.contains("96Mi"), "{m}");
        // Exactly-once cannot copy batches: not offered.
        let m = message(&u, &spec("exactlyOnce: true"), "ns");
        assert!(
            !m.contains("Batches") && m.contains("installer's default"),
            "{m}"
        );
    }

    #[test]
    fn an_oom_kill_just_now_counts_before_the_back_off() {
        let p = container(
            json!({"terminated": {"reason": "OOMKilled", "exitCode": 137}}),
            json!({}),
            0,
        );
        assert_eq!(class(&p), Some(Class::OutOfMemory { restarts: 0 }));
        let m = message(&diagnose(&p).expect("diagnosed"), &spec(""), "ns");
        assert!(m.contains("killed once"), "{m}");
    }

    #[test]
    fn a_crash_loop_gives_the_exit_code_and_the_replicators_last_words() {
        let own = container(
            json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            json!({"terminated": {"reason": "Error", "exitCode": 1,
                "message": "creating metrics: duplicate registration"}}),
            5,
        );
        let u = diagnose(&own).expect("diagnosed");
        assert_eq!(
            u.class,
            Class::Crashing {
                code: 1,
                restarts: 5
            }
        );
        let m = message(&u, &spec(""), "apps");
        assert!(
            m.contains("code 1 5 times: creating metrics: duplicate registration"),
            "{m}"
        );
        assert!(m.contains("kubectl logs -n apps f-0 --previous"), "{m}");

        // The kubelet's fallback to the log's tail: the last JSON line's message and error.
        let tail = "{\"level\":\"INFO\",\"fields\":{\"message\":\"starting\"}}\n{\"level\":\"ERROR\",\"fields\":{\"message\":\"source loop failed\",\"error\":\"broker said no\"}}\n";
        let fallback = container(
            json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            json!({"terminated": {"reason": "Error", "exitCode": 2, "message": tail}}),
            1,
        );
        assert_eq!(
            diagnose(&fallback).expect("diagnosed").detail,
            "source loop failed: broker said no"
        );
    }

    #[test]
    fn what_the_pod_says_is_bounded_and_kept_on_one_line() {
        let long = format!("line one\u{1b}[31m\n{}", "x".repeat(100_000));
        let p = container(
            json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            json!({"terminated": {"reason": "Error", "exitCode": 1, "message": long}}),
            2,
        );
        let u = diagnose(&p).expect("diagnosed");
        let most = DETAIL_MAX + "... (100000 bytes cut)".len();
        assert!(u.detail.len() <= most, "{}", u.detail.len());
        assert!(u.detail.ends_with("bytes cut)") && !u.detail.contains('\u{1b}'));
        let img = container(
            json!({"waiting": {"reason": "ImagePullBackOff", "message": "a\u{7}b\nc"}}),
            json!({}),
            0,
        );
        assert_eq!(diagnose(&img).expect("diagnosed").detail, "a b c");
    }

    #[test]
    fn image_config_and_scheduling_failures_name_their_fields() {
        let img = container(
            json!({"waiting": {"reason": "ErrImagePull", "message": "not found"}}),
            json!({}),
            0,
        );
        let u = diagnose(&img).expect("diagnosed");
        assert_eq!(u.class, Class::ImageUnavailable);
        let m = message(&u, &spec("pod: {image: 'reg/x:1'}"), "ns");
        assert!(m.contains("reg/x:1") && m.contains("spec.pod.image"), "{m}");
        let m = message(&u, &spec(""), "ns");
        assert!(m.contains("image.repository"), "{m}");

        let cfg = container(
            json!({"waiting": {"reason": "CreateContainerConfigError",
                "message": "secret \"creds\" not found"}}),
            json!({}),
            0,
        );
        let u = diagnose(&cfg).expect("diagnosed");
        assert_eq!(u.class, Class::ConfigMissing);
        assert!(message(&u, &spec(""), "ns").contains("secret \"creds\" not found"));

        let pending = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 Insufficient memory."}]}),
        );
        let u = diagnose(&pending).expect("diagnosed");
        assert_eq!(u.class, Class::Unschedulable);
        let m = message(&u, &spec(""), "ns");
        assert!(
            m.contains("Insufficient memory") && m.contains("spec.resources.requests"),
            "{m}"
        );
    }

    #[test]
    fn pods_on_their_way_are_not_diagnosed() {
        let creating = container(
            json!({"waiting": {"reason": "ContainerCreating"}}),
            json!({}),
            0,
        );
        let starting = container(json!({"running": {}}), json!({}), 0);
        // Ran again after an OOM kill and has not ended since: not a pattern yet.
        let recovered = container(
            json!({"running": {}}),
            json!({"terminated": {"reason": "OOMKilled", "exitCode": 137}}),
            1,
        );
        let scheduled = pod(json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True"}]}));
        let bare = pod(json!({}));
        for p in [creating, starting, recovered, scheduled, bare] {
            assert_eq!(class(&p), None, "{:?}", p.status);
        }
    }

    #[test]
    fn the_summary_leads_with_the_worst_class_and_names_three_pods() {
        let u = |pod: &str, class: Class| Unready {
            pod: pod.into(),
            class,
            detail: String::new(),
        };
        let all = vec![
            u("f-3", Class::Unschedulable),
            u("f-1", Class::ImageUnavailable),
            u("f-0", Class::Unschedulable),
            u("f-2", Class::OutOfMemory { restarts: 2 }),
            u("f-4", Class::Unschedulable),
        ];
        let (reason, m) = summary(all, &spec(""), "ns").expect("a summary");
        assert_eq!(reason, reason::REPLICATOR_OUT_OF_MEMORY);
        assert!(m.starts_with("replicator pod f-2 was killed"), "{m}");
        assert!(m.contains("f-1 cannot pull") && m.contains("f-0 cannot be scheduled"));
        assert!(!m.contains("f-3") && m.ends_with("2 more replicator pods cannot run"));
        assert_eq!(summary(Vec::new(), &spec(""), "ns"), None);
    }

    #[test]
    fn a_refused_look_names_the_right_and_the_namespace_and_other_errors_stay_bounded() {
        let refusal = |code| {
            kube::Error::Api(
                kube::core::Status {
                    message: "pods \"f-0\" is forbidden".into(),
                    reason: "Forbidden".into(),
                    code,
                    ..Default::default()
                }
                .into(),
            )
        };
        let (reason, m) = not_looked_at(Look::ReadPods, &refusal(403), "team-a", 0, 2);
        assert_eq!(reason, reason::REPLICAS_NOT_READY);
        assert!(m.starts_with("0/2 replicator pods ready"), "{m}");
        assert!(
            m.contains("grant the operator's service account get on pods in namespace team-a"),
            "{m}"
        );
        let (_, m) = not_looked_at(Look::TendLostNodes, &refusal(403), "team-a", 1, 2);
        assert!(
            m.contains("get on nodes and delete on pods in namespace team-a"),
            "{m}"
        );
        let huge = kube::Error::Api(
            kube::core::Status {
                message: format!("etcdserver: {}\n", "x".repeat(100_000)),
                reason: "InternalError".into(),
                code: 500,
                ..Default::default()
            }
            .into(),
        );
        let (_, m) = not_looked_at(Look::ReadPods, &huge, "team-a", 0, 1);
        assert!(
            m.contains("the apiserver answered: ") && !m.contains("grant"),
            "{m}"
        );
        assert!(m.len() < 600 && !m.contains('\n'), "{} bytes", m.len());
    }

    #[test]
    fn a_pod_the_cluster_refuses_to_create_is_told_by_who_refused() {
        let cases = [
            (
                "create Pod f-0 in StatefulSet f failed error: pods \"f-0\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1",
                "a ResourceQuota of namespace team-a has no room",
            ),
            (
                "create Pod f-0 in StatefulSet f failed error: pods \"f-0\" is forbidden: maximum memory usage per Container is 64Mi, but limit is 1Gi",
                "within the LimitRange of namespace team-a",
            ),
            (
                "create Pod f-0 in StatefulSet f failed error: pods \"f-0\" is forbidden: violates PodSecurity \"restricted:latest\": seccompProfile",
                "the Pod Security level of namespace team-a",
            ),
            (
                "create Pod f-0 in StatefulSet f failed error: admission webhook \"x\" denied the request",
                "an admission policy of the cluster refuses it",
            ),
        ];
        for (refusal, fix) in cases {
            let u = not_created("f-0".into(), refusal);
            assert_eq!(u.class.reason(), reason::REPLICATOR_NOT_CREATED);
            let m = message(&u, &spec(""), "team-a");
            assert!(
                m.starts_with("replicator pod f-0 cannot be created: create Pod"),
                "{m}"
            );
            assert!(m.contains(fix), "{fix}: {m}");
        }
        let long = not_created("f-0".into(), &format!("{}\n", "y".repeat(50_000)));
        let most = DETAIL_MAX + "... (100000 bytes cut)".len();
        assert!(long.detail.len() <= most && !long.detail.contains('\n'));
    }
}
