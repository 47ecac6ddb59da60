//! One pod's life on the node: IP, volumes, init containers, containers, probes, restarts,
//! status, and termination. One task per pod; it owns everything the pod has.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::Shared;
use super::env::{self, Sources};
use super::image::{self, Target};
use super::probe::{self, Kind, Outcome, Tracker};
use super::status::{self, Conditions, ContainerView, InitProgress, PodView, State, Terminated};
use super::volumes;
use crate::podinit;

/// What the dispatcher tells a pod worker.
#[derive(Debug)]
pub enum Update {
    /// The pod as the apiserver has it now.
    Pod(Box<Pod>),
    /// The pod object is gone: stop everything, do not delete.
    Gone,
    /// The node stops: stop everything, leave the pod object as it is.
    Shutdown,
}

#[derive(Debug)]
enum Event {
    Exited {
        init: bool,
        index: usize,
        run: u64,
        status: std::process::ExitStatus,
    },
    Probe(Outcome),
}

const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
const VOLUME_REFRESH: Duration = Duration::from_secs(60);
const RETRY: Duration = Duration::from_secs(2);
/// Grace cap when the node itself stops or the pod object vanished.
const STOP_GRACE_CAP: Duration = Duration::from_secs(10);

struct Ctr {
    spec: Container,
    view: ContainerView,
    pid: Option<i32>,
    run: u64,
    started: Option<Instant>,
    next_start: Instant,
    backoff: Duration,
    probes: Vec<tokio::task::JoinHandle<()>>,
    trackers: [Tracker; 3],
    startup_done: bool,
    /// Start attempts that failed before a process existed: keeps the last message logged once.
    last_problem: Option<String>,
    /// Finished for good (no restart coming).
    done: bool,
}

impl Ctr {
    fn new(spec: Container, previous_restarts: i32) -> Self {
        let mut view = ContainerView::new(&spec.name, spec.image.as_deref().unwrap_or_default());
        view.restart_count = previous_restarts;
        Self {
            spec,
            view,
            pid: None,
            run: 0,
            started: None,
            next_start: Instant::now(),
            backoff: BACKOFF_START,
            probes: Vec::new(),
            trackers: Default::default(),
            startup_done: false,
            last_problem: None,
            done: false,
        }
    }

    fn stop_probes(&mut self) {
        for p in self.probes.drain(..) {
            p.abort();
        }
    }

    fn wait(&mut self, reason: &str, message: String) {
        self.view.state = State::Waiting {
            reason: reason.to_string(),
            message: Some(message),
        };
    }
}

fn tracker_index(kind: Kind) -> usize {
    match kind {
        Kind::Startup => 0,
        Kind::Readiness => 1,
        Kind::Liveness => 2,
    }
}

pub struct Worker {
    shared: Arc<Shared>,
    pod: Pod,
    uid: String,
    ns: String,
    name: String,
    dir: PathBuf,
    ip: Option<Ipv4Addr>,
    volumes: Option<BTreeMap<String, PathBuf>>,
    volumes_at: Instant,
    next_volume_try: Instant,
    init: Vec<Ctr>,
    init_progress: InitProgress,
    containers: Vec<Ctr>,
    conditions: Conditions,
    start_time: Timestamp,
    last_status: Option<serde_json::Value>,
    /// The pod was already finished when this worker started (node restart): run nothing.
    finished_before: bool,
    /// Termination has begun: exits are final.
    stopping: bool,
    last_patch_error: Option<String>,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
}

fn previous_restarts(pod: &Pod, name: &str, init: bool) -> i32 {
    let status = pod.status.as_ref();
    let list = if init {
        status.and_then(|s| s.init_container_statuses.as_ref())
    } else {
        status.and_then(|s| s.container_statuses.as_ref())
    };
    list.into_iter()
        .flatten()
        .find(|c| c.name == name)
        .map_or(0, |c| c.restart_count)
}

impl Worker {
    pub fn new(shared: Arc<Shared>, pod: Pod, uid: String) -> Self {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let dir = shared
            .state_dir
            .join("pods")
            .join(format!("{ns}_{name}_{uid}"));
        let spec = pod.spec.clone().unwrap_or_default();
        let init: Vec<Ctr> = spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .map(|c| {
                let n = previous_restarts(&pod, &c.name, true);
                Ctr::new(c, n)
            })
            .collect();
        let containers = spec
            .containers
            .into_iter()
            .map(|c| {
                let n = previous_restarts(&pod, &c.name, false);
                Ctr::new(c, n)
            })
            .collect();
        let status = pod.status.as_ref();
        let start_time = status
            .and_then(|s| s.start_time.as_ref())
            .map_or_else(Timestamp::now, |t| t.0);
        let finished_before = matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            conditions: Conditions::from_status(status),
            init_progress: if init.is_empty() {
                InitProgress::Done
            } else {
                InitProgress::Running
            },
            shared,
            pod,
            uid,
            ns,
            name,
            dir,
            ip: None,
            volumes: None,
            volumes_at: Instant::now(),
            next_volume_try: Instant::now(),
            init,
            containers,
            start_time,
            last_status: None,
            finished_before,
            stopping: false,
            last_patch_error: None,
            tx,
            rx,
        }
    }

    fn restart_policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    fn deleting(&self) -> bool {
        self.pod.metadata.deletion_timestamp.is_some()
    }

    fn grace(&self) -> Duration {
        let secs = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        Duration::from_secs(secs.max(0) as u64)
    }

    pub async fn run(mut self, mut updates: mpsc::UnboundedReceiver<Update>) {
        info!(pod = %self.key(), "pod worker started");
        if let Err(e) = std::fs::create_dir_all(&self.dir) {
            warn!(pod = %self.key(), error = %e, "cannot create pod dir");
        }
        let mut end = None;
        while end.is_none() {
            if self.deleting() {
                end = Some(Update::Pod(Box::new(self.pod.clone())));
                break;
            }
            if !self.finished_before {
                self.step().await;
            }
            self.flush_status().await;
            tokio::select! {
                u = updates.recv() => match u {
                    Some(Update::Pod(p)) => self.pod = *p,
                    Some(other) => end = Some(other),
                    None => end = Some(Update::Shutdown),
                },
                Some(ev) = self.rx.recv() => self.handle(ev),
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        let grace = match end {
            Some(Update::Pod(_)) => self.grace(),
            _ => self.grace().min(STOP_GRACE_CAP),
        };
        self.stop_all(grace).await;
        if matches!(end, Some(Update::Pod(_))) {
            self.delete_object().await;
        }
        self.shared.release_ip(&self.uid);
        info!(pod = %self.key(), "pod worker finished");
    }

    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }

    /// Starts whatever is due.
    async fn step(&mut self) {
        let now = Instant::now();
        if self.ip.is_none() {
            let preferred = self.pod.status.as_ref().and_then(|s| s.pod_ip.clone());
            self.ip = self.shared.allocate_ip(&self.uid, preferred.as_deref());
            if self.ip.is_none() {
                self.all_waiting(
                    "ContainerCreating",
                    "no free pod IP in --pod-ip-range".into(),
                );
                return;
            }
        }
        let refresh_due =
            self.volumes.is_some() && now.duration_since(self.volumes_at) >= VOLUME_REFRESH;
        if (self.volumes.is_none() && now >= self.next_volume_try) || refresh_due {
            self.setup_volumes().await;
        }
        if self.volumes.is_none() {
            return;
        }
        if self.init_progress == InitProgress::Running {
            let next = self.init.iter().position(|c| !c.view.succeeded());
            match next {
                None => self.init_progress = InitProgress::Done,
                Some(i) => {
                    if self.init[i].pid.is_none()
                        && !self.init[i].done
                        && self.init[i].next_start <= now
                    {
                        self.start(true, i).await;
                    }
                    return;
                }
            }
        }
        if self.init_progress != InitProgress::Done {
            return;
        }
        for i in 0..self.containers.len() {
            let c = &self.containers[i];
            if c.pid.is_none() && !c.done && c.next_start <= now {
                self.start(false, i).await;
            }
        }
    }

    fn all_waiting(&mut self, reason: &str, message: String) {
        for c in self.init.iter_mut().chain(self.containers.iter_mut()) {
            if c.pid.is_none() && !c.done {
                c.wait(reason, message.clone());
            }
        }
    }

    fn pod_ip(&self) -> String {
        self.ip.map(|ip| ip.to_string()).unwrap_or_default()
    }

    async fn setup_volumes(&mut self) {
        let pod_ip = self.pod_ip();
        let ctx = volumes::Ctx {
            client: &self.shared.client,
            pod: &self.pod,
            pod_ip: &pod_ip,
            node: &self.shared.node,
        };
        match volumes::materialise(&ctx, &self.dir).await {
            Ok(v) => {
                self.volumes = Some(v);
                self.volumes_at = Instant::now();
            }
            Err(e) => {
                let message = error_chain(&e);
                if self.volumes.is_none() {
                    warn!(pod = %self.key(), error = %message, "volumes not ready");
                    self.all_waiting(volumes::VolumeError::REASON, message);
                    self.next_volume_try = Instant::now() + RETRY;
                } else {
                    warn!(pod = %self.key(), error = %message, "volume refresh failed");
                    self.volumes_at = Instant::now();
                }
            }
        }
    }

    async fn fetch_sources(&self, c: &Container) -> Result<Sources, String> {
        let (cms, secrets) = env::referenced_sources(c);
        let mut sources = Sources::default();
        let cm_api: Api<ConfigMap> = Api::namespaced(self.shared.client.clone(), &self.ns);
        for n in cms {
            match cm_api.get_opt(&n).await {
                Ok(Some(cm)) => {
                    sources.config_maps.insert(n, cm);
                }
                Ok(None) => {}
                Err(e) => return Err(format!("reading configmap {n}: {e}")),
            }
        }
        let s_api: Api<Secret> = Api::namespaced(self.shared.client.clone(), &self.ns);
        for n in secrets {
            match s_api.get_opt(&n).await {
                Ok(Some(s)) => {
                    sources.secrets.insert(n, s);
                }
                Ok(None) => {}
                Err(e) => return Err(format!("reading secret {n}: {e}")),
            }
        }
        Ok(sources)
    }

    /// Everything a start needs, or the waiting reason and message why it cannot start.
    async fn prepare(
        &self,
        c: &Container,
    ) -> Result<(podinit::Spec, Vec<(String, String)>, String), (String, String)> {
        let image = c.image.clone().unwrap_or_default();
        let target = self.shared.images.resolve(&image).cloned().ok_or_else(|| {
            (
                "ImageNotMapped".to_string(),
                format!(
                    "image {image:?} matches no rule in {}; add a rule mapping it to a host executable",
                    self.shared.images.source
                ),
            )
        })?;
        let image_id = match &target {
            Target::Binary(b) => {
                if !b.is_file() {
                    return Err((
                        "ErrImagePull".into(),
                        format!(
                            "image {image:?} maps to {} which does not exist (build it first)",
                            b.display()
                        ),
                    ));
                }
                format!("process://{}", b.display())
            }
            Target::HostCommand => "process://host".to_string(),
        };
        let sources = self
            .fetch_sources(c)
            .await
            .map_err(|m| (env::EnvError::REASON.to_string(), m))?;
        let env = env::container_env(&self.pod, c, &self.pod_ip(), &self.shared.node, &sources)
            .map_err(|e| (env::EnvError::REASON.to_string(), e.to_string()))?;
        let mut env = env;
        if !env.iter().any(|(k, _)| k == "HOME") {
            env.push(("HOME".into(), self.dir.display().to_string()));
        }
        let mounts = self.mounts(c, &env)?;
        let command = env::expand_all(c.command.as_deref().unwrap_or_default(), &env);
        let args = env::expand_all(c.args.as_deref().unwrap_or_default(), &env);
        let (program, args) = image::command_line(&target, &command, &args);
        let spec = podinit::Spec {
            mounts,
            program,
            args,
            working_dir: c.working_dir.clone().map(PathBuf::from),
            fallback_dir: self.dir.clone(),
        };
        Ok((spec, env, image_id))
    }

    fn mounts(
        &self,
        c: &Container,
        env: &[(String, String)],
    ) -> Result<Vec<podinit::Mount>, (String, String)> {
        let volumes = self.volumes.clone().unwrap_or_default();
        let config_err = |m: String| ("CreateContainerConfigError".to_string(), m);
        let mut out = Vec::new();
        for vm in c.volume_mounts.iter().flatten() {
            let base = volumes.get(&vm.name).ok_or_else(|| {
                config_err(format!(
                    "volumeMount {:?}: no such volume in the pod",
                    vm.name
                ))
            })?;
            let sub = match (&vm.sub_path, &vm.sub_path_expr) {
                (Some(s), _) if !s.is_empty() => Some(s.clone()),
                (_, Some(e)) if !e.is_empty() => {
                    Some(env::expand_all(std::slice::from_ref(e), env).concat())
                }
                _ => None,
            };
            let source = match sub {
                Some(s) => {
                    if Path::new(&s)
                        .components()
                        .any(|c| !matches!(c, std::path::Component::Normal(_)))
                    {
                        return Err(config_err(format!(
                            "volumeMount {:?}: bad subPath {s:?}",
                            vm.name
                        )));
                    }
                    let p = base.join(&s);
                    if !p.exists() {
                        // As the kubelet does: a missing subPath becomes a directory.
                        let _ = std::fs::create_dir_all(&p);
                    }
                    p
                }
                None => base.clone(),
            };
            let target = PathBuf::from(&vm.mount_path);
            if !target.is_absolute() {
                return Err(config_err(format!(
                    "mountPath {:?} is not absolute",
                    vm.mount_path
                )));
            }
            if !podinit::target_allowed(&target) {
                return Err((
                    "CreateContainerError".into(),
                    format!(
                        "mountPath {} is a non-empty host directory or file; the process node only binds over empty or missing paths (or under /var/run/secrets)",
                        target.display()
                    ),
                ));
            }
            out.push(podinit::Mount {
                source,
                target,
                read_only: vm.read_only == Some(true),
            });
        }
        Ok(out)
    }

    async fn start(&mut self, init: bool, i: usize) {
        let spec = {
            let list = if init { &self.init } else { &self.containers };
            list[i].spec.clone()
        };
        let prepared = self.prepare(&spec).await;
        let key = self.key();
        let log = self.dir.join(format!("{}.log", spec.name));
        let pod_ip = self.pod_ip();
        let shared = self.shared.clone();
        let uid = self.uid.clone();
        let tx = self.tx.clone();
        let c = if init {
            &mut self.init[i]
        } else {
            &mut self.containers[i]
        };
        let (run_spec, env, image_id) = match prepared {
            Ok(p) => p,
            Err((reason, message)) => {
                if c.last_problem.as_deref() != Some(message.as_str()) {
                    warn!(pod = %key, container = %spec.name, %reason, %message, "container cannot start");
                    c.last_problem = Some(message.clone());
                }
                c.wait(&reason, message);
                c.next_start = Instant::now() + RETRY;
                return;
            }
        };
        c.last_problem = None;
        let child = match super::process::spawn(&run_spec, &env, &log) {
            Ok(child) => child,
            Err(e) => {
                warn!(pod = %key, container = %spec.name, error = %e, "spawn failed");
                c.wait("RunContainerError", format!("spawn: {e}"));
                c.next_start = Instant::now() + RETRY;
                return;
            }
        };
        super::process::link_log(&shared.state_dir, &self.ns, &self.name, &spec.name, &log);
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        shared.pids.record(&uid, &spec.name, pid);
        if c.run > 0 || c.view.last.is_some() {
            c.view.restart_count += 1;
        }
        c.run += 1;
        c.pid = Some(pid);
        c.started = Some(Instant::now());
        c.view.state = State::Running {
            started_at: Timestamp::now(),
        };
        c.view.container_id = Some(format!("process://{pid}"));
        c.view.image_id = image_id;
        c.view.ready = false;
        c.trackers = Default::default();
        c.startup_done = c.spec.startup_probe.is_none();
        c.view.started = c.startup_done;
        info!(pod = %key, container = %spec.name, pid, program = %run_spec.program, "container started");
        let run = c.run;
        let mut child = child;
        let exit_tx = tx.clone();
        tokio::spawn(async move {
            if let Ok(status) = child.wait().await {
                let _ = exit_tx.send(Event::Exited {
                    init,
                    index: i,
                    run,
                    status,
                });
            }
        });
        if !init {
            let exec = probe::ExecCtx {
                env,
                spec: run_spec,
            };
            let probes = [
                (Kind::Startup, c.spec.startup_probe.clone()),
                (Kind::Readiness, c.spec.readiness_probe.clone()),
                (Kind::Liveness, c.spec.liveness_probe.clone()),
            ];
            for (kind, p) in probes {
                if let Some(p) = p {
                    let runner = probe::Runner {
                        kind,
                        probe: p,
                        container: c.spec.clone(),
                        index: i,
                        run,
                        pod_ip: pod_ip.clone(),
                        exec: exec.clone(),
                    };
                    let (ptx, mut prx) = mpsc::unbounded_channel();
                    let fwd = tx.clone();
                    c.probes.push(runner.spawn(ptx));
                    c.probes.push(tokio::spawn(async move {
                        while let Some(o) = prx.recv().await {
                            if fwd.send(Event::Probe(o)).is_err() {
                                return;
                            }
                        }
                    }));
                }
            }
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Exited {
                init,
                index,
                run,
                status,
            } => self.exited(init, index, run, status),
            Event::Probe(o) => self.probed(o),
        }
    }

    fn exited(&mut self, init: bool, index: usize, run: u64, status: std::process::ExitStatus) {
        let policy = self.restart_policy();
        let deleting = self.deleting();
        let stopping = self.stopping;
        let key = self.key();
        let uid = self.uid.clone();
        let shared = self.shared.clone();
        let list = if init {
            &mut self.init
        } else {
            &mut self.containers
        };
        let Some(c) = list.get_mut(index) else { return };
        if c.run != run {
            return;
        }
        c.stop_probes();
        // Like a container whose PID 1 died: nothing of it survives (background children).
        if let Some(pid) = c.pid {
            super::process::signal_group(pid, Signal::SIGKILL);
        }
        shared.pids.forget(&uid, &c.spec.name);
        let signal = status.signal();
        let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
        let started_at = match &c.view.state {
            State::Running { started_at } => Some(*started_at),
            _ => None,
        };
        let term = Terminated {
            exit_code,
            signal,
            reason: Terminated::reason_for(exit_code).to_string(),
            message: None,
            started_at,
            finished_at: Timestamp::now(),
            container_id: c.view.container_id.clone(),
        };
        info!(pod = %key, container = %c.spec.name, exit_code, ?signal, "container exited");
        c.pid = None;
        c.view.ready = false;
        c.view.started = false;
        let restart = !(deleting || stopping)
            && match policy.as_str() {
                "Never" => false,
                "OnFailure" => exit_code != 0,
                // Init containers are not rerun after success, whatever the policy.
                _ => !(init && exit_code == 0),
            };
        if !restart {
            c.done = true;
            c.view.state = State::Terminated(term);
            if init && exit_code != 0 {
                self.init_progress = InitProgress::Failed;
            }
            return;
        }
        if c.started
            .is_some_and(|s| s.elapsed() >= BACKOFF_RESET_AFTER)
        {
            c.backoff = BACKOFF_START;
        }
        c.next_start = Instant::now() + c.backoff;
        let message = format!(
            "back-off {}s restarting failed container={} pod={key}",
            c.backoff.as_secs(),
            c.spec.name
        );
        c.backoff = (c.backoff * 2).min(BACKOFF_MAX);
        c.view.last = Some(term);
        c.wait("CrashLoopBackOff", message);
    }

    fn probed(&mut self, o: Outcome) {
        let key = self.key();
        let Some(c) = self.containers.get_mut(o.container) else {
            return;
        };
        if c.run != o.run || c.pid.is_none() {
            return;
        }
        let probe = match o.kind {
            Kind::Startup => c.spec.startup_probe.clone(),
            Kind::Readiness => c.spec.readiness_probe.clone(),
            Kind::Liveness => c.spec.liveness_probe.clone(),
        };
        let Some(probe) = probe else { return };
        if o.kind != Kind::Startup && !c.startup_done {
            return;
        }
        if !o.ok {
            debug!(pod = %key, container = %c.spec.name, kind = ?o.kind, message = %o.message, "probe failed");
        }
        let Some(verdict) = c.trackers[tracker_index(o.kind)].record(o.ok, &probe) else {
            return;
        };
        match (o.kind, verdict) {
            (Kind::Startup, true) => {
                c.startup_done = true;
                c.view.started = true;
                if c.spec.readiness_probe.is_none() {
                    c.view.ready = true;
                }
            }
            (Kind::Readiness, v) => {
                if c.view.ready != v {
                    info!(pod = %key, container = %c.spec.name, ready = v, "readiness changed");
                }
                c.view.ready = v;
            }
            (Kind::Startup | Kind::Liveness, false) => {
                warn!(pod = %key, container = %c.spec.name, kind = ?o.kind, message = %o.message, "probe failed; killing container");
                if let Some(pid) = c.pid {
                    super::process::signal_group(pid, Signal::SIGKILL);
                }
            }
            (Kind::Liveness, true) => {}
        }
    }

    /// Ready without a readiness probe: running and started.
    fn settle_readiness(&mut self) {
        for c in &mut self.containers {
            if c.pid.is_some() && c.startup_done && c.spec.readiness_probe.is_none() {
                c.view.ready = true;
            }
        }
    }

    fn views(list: &[Ctr]) -> Vec<ContainerView> {
        list.iter().map(|c| c.view.clone()).collect()
    }

    async fn flush_status(&mut self) {
        if self.finished_before {
            return;
        }
        self.settle_readiness();
        let policy = self.restart_policy();
        let init_views = Self::views(&self.init);
        let views = Self::views(&self.containers);
        let view = PodView {
            restart_policy: &policy,
            pod_ip: self.ip.map(|ip| ip.to_string()),
            host_ip: &self.shared.node.host_ip,
            start_time: self.start_time,
            init: self.init_progress,
            init_containers: &init_views,
            containers: &views,
        };
        // Compare without timestamps of condition flips that did not happen: build on a copy.
        let mut conditions = self.conditions.clone();
        let status = status::build(&view, &mut conditions, Timestamp::now());
        let Ok(json) = serde_json::to_value(&status) else {
            return;
        };
        if self.last_status.as_ref() == Some(&json) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.ns);
        let patch = serde_json::json!({ "status": json });
        match api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                debug!(pod = %self.key(), phase = ?status.phase, "status patched");
                self.conditions = conditions;
                self.last_status = Some(json);
                self.last_patch_error = None;
            }
            Err(e) => {
                // Logged once per distinct error: the patch is retried every second.
                let message = e.to_string();
                if self.last_patch_error.as_deref() != Some(message.as_str()) {
                    warn!(pod = %self.key(), error = %message, "status patch failed");
                    self.last_patch_error = Some(message);
                }
            }
        }
    }

    /// SIGTERM to every running container, SIGKILL after `grace`, and wait for the exits.
    async fn stop_all(&mut self, grace: Duration) {
        self.stopping = true;
        let groups: Vec<i32> = self
            .init
            .iter()
            .chain(self.containers.iter())
            .filter_map(|c| c.pid)
            .collect();
        let running = |w: &Self| {
            w.init
                .iter()
                .chain(w.containers.iter())
                .any(|c| c.pid.is_some())
        };
        for c in self.init.iter_mut().chain(self.containers.iter_mut()) {
            c.stop_probes();
            c.done = true;
            if let Some(pid) = c.pid {
                super::process::signal_group(pid, Signal::SIGTERM);
            }
        }
        if running(self) {
            info!(pod = %self.key(), grace_secs = grace.as_secs(), "stopping containers");
        }
        let deadline = tokio::time::Instant::now() + grace;
        let mut killed = false;
        while running(self) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(ev)) => self.handle(ev),
                Ok(None) => break,
                Err(_) if !killed => {
                    for c in self.init.iter().chain(self.containers.iter()) {
                        if let Some(pid) = c.pid {
                            warn!(pod = %self.key(), container = %c.spec.name, "grace period over; SIGKILL");
                            super::process::signal_group(pid, Signal::SIGKILL);
                        }
                    }
                    killed = true;
                    // Exits after SIGKILL arrive promptly; wait for them without a deadline.
                    while running(self) {
                        match self.rx.recv().await {
                            Some(ev) => self.handle(ev),
                            None => break,
                        }
                    }
                }
                Err(_) => break,
            }
        }
        // Children that outlived their group leader.
        for pid in groups {
            super::process::signal_group(pid, Signal::SIGKILL);
        }
    }

    async fn delete_object(&self) {
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.ns);
        let dp = DeleteParams::default()
            .grace_period(0)
            .preconditions(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            });
        match api.delete(&self.name, &dp).await {
            Ok(_) => info!(pod = %self.key(), "pod object deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => warn!(pod = %self.key(), error = %e, "final pod delete failed"),
        }
    }
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
