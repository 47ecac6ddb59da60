//! The pod status the node reports, built from its view of the containers (pure).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub const POD_SCHEDULED: &str = "PodScheduled";
pub const INITIALIZED: &str = "Initialized";
pub const CONTAINERS_READY: &str = "ContainersReady";
pub const READY: &str = "Ready";

/// A finished run of a container.
#[derive(Clone, Debug, PartialEq)]
pub struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub message: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
    pub container_id: Option<String>,
}

impl Terminated {
    /// Kubernetes' reasons: `Completed` for exit 0, `Error` otherwise (`OOMKilled` is not
    /// detected here).
    pub fn reason_for(exit_code: i32) -> &'static str {
        if exit_code == 0 { "Completed" } else { "Error" }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated(Terminated),
}

/// What the node knows about one container.
#[derive(Clone, Debug)]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    pub image_id: String,
    pub container_id: Option<String>,
    pub state: State,
    pub last: Option<Terminated>,
    pub ready: bool,
    pub started: bool,
    pub restart_count: i32,
}

impl ContainerView {
    pub fn new(name: &str, image: &str) -> Self {
        Self {
            name: name.to_string(),
            image: image.to_string(),
            image_id: String::new(),
            container_id: None,
            state: State::Waiting {
                reason: "ContainerCreating".to_string(),
                message: None,
            },
            last: None,
            ready: false,
            started: false,
            restart_count: 0,
        }
    }

    pub fn succeeded(&self) -> bool {
        matches!(&self.state, State::Terminated(t) if t.exit_code == 0)
    }
}

fn time(t: Timestamp) -> Time {
    Time(t)
}

fn terminated(t: &Terminated) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code: t.exit_code,
        signal: t.signal,
        reason: Some(t.reason.clone()),
        message: t.message.clone(),
        started_at: t.started_at.map(time),
        finished_at: Some(time(t.finished_at)),
        container_id: t.container_id.clone(),
    }
}

fn state(s: &State) -> ContainerState {
    match s {
        State::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..Default::default()
        },
        State::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(time(*started_at)),
            }),
            ..Default::default()
        },
        State::Terminated(t) => ContainerState {
            terminated: Some(terminated(t)),
            ..Default::default()
        },
    }
}

pub fn container_status(c: &ContainerView) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: c.image_id.clone(),
        container_id: c.container_id.clone(),
        state: Some(state(&c.state)),
        last_state: Some(c.last.as_ref().map_or_else(ContainerState::default, |t| {
            ContainerState {
                terminated: Some(terminated(t)),
                ..Default::default()
            }
        })),
        ready: c.ready,
        started: Some(c.started),
        restart_count: c.restart_count,
        ..Default::default()
    }
}

/// Where the init containers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitProgress {
    Running,
    Done,
    Failed,
}

/// The pod phase from its containers, as the kubelet computes it.
pub fn phase(
    restart_policy: &str,
    init: InitProgress,
    containers: &[ContainerView],
) -> &'static str {
    match init {
        InitProgress::Failed => return "Failed",
        InitProgress::Running => return "Pending",
        InitProgress::Done => {}
    }
    let never_started = containers.iter().any(|c| {
        matches!(c.state, State::Waiting { .. }) && c.restart_count == 0 && c.last.is_none()
    });
    if never_started {
        return "Pending";
    }
    let all_terminated = containers
        .iter()
        .all(|c| matches!(c.state, State::Terminated(_)));
    if !all_terminated {
        return "Running";
    }
    let all_succeeded = containers.iter().all(ContainerView::succeeded);
    match restart_policy {
        "Never" if all_succeeded => "Succeeded",
        "Never" => "Failed",
        "OnFailure" if all_succeeded => "Succeeded",
        // Always, or OnFailure with failures: the node restarts them.
        _ => "Running",
    }
}

/// Conditions kept across status builds so `lastTransitionTime` changes only on flips.
#[derive(Clone, Debug, Default)]
pub struct Conditions {
    list: Vec<PodCondition>,
}

impl Conditions {
    /// Starts from what the apiserver has (after a node restart the times stay).
    pub fn from_status(status: Option<&PodStatus>) -> Self {
        Self {
            list: status
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default(),
        }
    }

    pub fn set(&mut self, type_: &str, value: bool, reason: Option<&str>, now: Timestamp) {
        let status = if value { "True" } else { "False" }.to_string();
        let reason = reason.map(str::to_string);
        match self.list.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = Some(time(now));
                }
                c.status = status;
                c.reason = reason;
            }
            None => self.list.push(PodCondition {
                type_: type_.to_string(),
                status,
                reason,
                last_transition_time: Some(time(now)),
                ..Default::default()
            }),
        }
    }

    pub fn list(&self) -> Vec<PodCondition> {
        self.list.clone()
    }
}

/// Everything that goes into the status patch.
pub struct PodView<'a> {
    pub restart_policy: &'a str,
    pub pod_ip: Option<String>,
    pub host_ip: &'a str,
    pub start_time: Timestamp,
    pub init: InitProgress,
    pub init_containers: &'a [ContainerView],
    pub containers: &'a [ContainerView],
}

pub fn build(view: &PodView<'_>, conditions: &mut Conditions, now: Timestamp) -> PodStatus {
    let phase = phase(view.restart_policy, view.init, view.containers);
    let initialized = view.init == InitProgress::Done;
    let containers_ready = initialized && view.containers.iter().all(|c| c.ready);
    let not_ready_reason = if phase == "Succeeded" || phase == "Failed" {
        Some("PodCompleted")
    } else if containers_ready {
        None
    } else {
        Some("ContainersNotReady")
    };
    conditions.set(POD_SCHEDULED, true, None, now);
    conditions.set(
        INITIALIZED,
        initialized,
        (!initialized).then_some("ContainersNotInitialized"),
        now,
    );
    conditions.set(CONTAINERS_READY, containers_ready, not_ready_reason, now);
    conditions.set(READY, containers_ready, not_ready_reason, now);
    PodStatus {
        phase: Some(phase.to_string()),
        pod_ip: view.pod_ip.clone(),
        pod_ips: view.pod_ip.clone().map(|ip| vec![PodIP { ip }]),
        host_ip: Some(view.host_ip.to_string()),
        host_ips: Some(vec![HostIP {
            ip: view.host_ip.to_string(),
        }]),
        start_time: Some(time(view.start_time)),
        conditions: Some(conditions.list()),
        container_statuses: Some(view.containers.iter().map(container_status).collect()),
        init_container_statuses: (!view.init_containers.is_empty())
            .then(|| view.init_containers.iter().map(container_status).collect()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn running(name: &str) -> ContainerView {
        let mut c = ContainerView::new(name, "busybox");
        c.state = State::Running { started_at: ts(10) };
        c
    }

    fn exited(name: &str, code: i32) -> ContainerView {
        let mut c = ContainerView::new(name, "busybox");
        c.state = State::Terminated(Terminated {
            exit_code: code,
            signal: None,
            reason: Terminated::reason_for(code).into(),
            message: None,
            started_at: Some(ts(10)),
            finished_at: ts(20),
            container_id: None,
        });
        c
    }

    #[test]
    fn phases() {
        let done = InitProgress::Done;
        assert_eq!(
            phase("Always", InitProgress::Running, &[running("a")]),
            "Pending"
        );
        assert_eq!(
            phase("Always", done, &[ContainerView::new("a", "x")]),
            "Pending"
        );
        assert_eq!(
            phase("Always", done, &[running("a"), exited("b", 1)]),
            "Running"
        );
        assert_eq!(phase("Always", done, &[exited("a", 0)]), "Running");
        assert_eq!(
            phase("Never", done, &[exited("a", 0), exited("b", 0)]),
            "Succeeded"
        );
        assert_eq!(
            phase("Never", done, &[exited("a", 0), exited("b", 2)]),
            "Failed"
        );
        assert_eq!(phase("OnFailure", done, &[exited("a", 0)]), "Succeeded");
        assert_eq!(phase("OnFailure", done, &[exited("a", 3)]), "Running");
        assert_eq!(phase("Never", InitProgress::Failed, &[]), "Failed");
        let mut restarting = ContainerView::new("a", "x");
        restarting.restart_count = 1;
        assert_eq!(phase("Always", done, &[restarting]), "Running");
    }

    #[test]
    fn conditions_only_move_on_flips() {
        let mut c = Conditions::default();
        c.set(READY, false, Some("ContainersNotReady"), ts(1));
        c.set(READY, false, Some("ContainersNotReady"), ts(2));
        let t = |c: &Conditions| c.list()[0].last_transition_time.clone().map(|t| t.0);
        assert_eq!(t(&c), Some(ts(1)));
        c.set(READY, true, None, ts(3));
        assert_eq!(t(&c), Some(ts(3)));
        c.set(READY, true, None, ts(4));
        assert_eq!(t(&c), Some(ts(3)));
        assert_eq!(c.list()[0].status, "True");
    }

    #[test]
    fn build_reports_ready_and_ips() {
        let mut a = running("a");
        a.ready = true;
        let containers = vec![a];
        let view = PodView {
            restart_policy: "Always",
            pod_ip: Some("127.0.1.1".into()),
            host_ip: "127.0.0.1",
            start_time: ts(1),
            init: InitProgress::Done,
            init_containers: &[],
            containers: &containers,
        };
        let mut conds = Conditions::default();
        let s = build(&view, &mut conds, ts(5));
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("127.0.1.1"));
        let ready = s.conditions.iter().flatten().find(|c| c.type_ == READY);
        assert_eq!(ready.map(|c| c.status.as_str()), Some("True"));
        assert!(s.init_container_statuses.is_none());
        let cs = &s.container_statuses.unwrap_or_default()[0];
        assert!(cs.ready);
        assert!(cs.state.as_ref().and_then(|s| s.running.as_ref()).is_some());
    }
}
