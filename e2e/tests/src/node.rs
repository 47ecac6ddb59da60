//! What the world's node (kubelet, containerd, runc) knows about a pod's containers: their log
//! files and their processes on the host.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;

use crate::{World, run};

impl World {
    /// Every log file kubelet keeps for the containers of the pods in `ns`, all restarts
    /// included: `<node>/pod-logs/<ns>_<pod>_<uid>/<container>/<restart>.log`.
    pub fn pod_log_files(&self, ns: &str) -> Result<Vec<PathBuf>> {
        let prefix = format!("{ns}_");
        let mut files = Vec::new();
        let dir = self.node_state.join("pod-logs");
        for pod in std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))? {
            let pod = pod?;
            if !pod.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            for container in std::fs::read_dir(pod.path())? {
                for file in std::fs::read_dir(container?.path())? {
                    files.push(file?.path());
                }
            }
        }
        Ok(files)
    }

    /// What the named pod's container wrote, all runs of it, oldest first.
    pub fn container_log(&self, ns: &str, pod: &str, container: &str) -> Result<String> {
        let prefix = format!("{ns}_{pod}_");
        let mut files: Vec<(u32, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(self.node_state.join("pod-logs"))? {
            let entry = entry?;
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            for file in std::fs::read_dir(entry.path().join(container))? {
                let path = file?.path();
                let restart = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(u32::MAX);
                files.push((restart, path));
            }
        }
        files.sort();
        let mut text = String::new();
        for (_, path) in files {
            text.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
        Ok(text)
    }
}

/// The containerd id of the pod's container `name`, from its status.
pub fn container_id(pod: &Pod, name: &str) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let id = statuses
        .iter()
        .find(|s| s.name == name)?
        .container_id
        .as_deref()?;
    id.strip_prefix("containerd://").map(str::to_owned)
}

/// The host pid of the container's first process (pid 1 in its pid namespace), as containerd
/// reports it (`ctr tasks ls`; the world's env names containerd's socket and namespace).
pub fn container_pid(pod: &Pod, name: &str) -> Result<i32> {
    let id = container_id(pod, name)
        .with_context(|| format!("no containerd id for container {name}"))?;
    let tasks = run("ctr", &["tasks", "ls"])?;
    for line in tasks.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.first() != Some(&id.as_str()) {
            continue;
        }
        return match cols.as_slice() {
            [_, pid, "RUNNING"] => pid.parse().with_context(|| format!("pid of {id}: {line}")),
            _ => bail!("container {name} ({id}) is not running: {line}"),
        };
    }
    bail!("containerd has no task {id} for container {name}")
}

/// True while the process exists and is no zombie.
pub fn process_alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
}

/// Signals a container's process from the host (`kill SIG PID`): pid 1 of a container's pid
/// namespace is reached from outside whatever handlers it has (SIGKILL, SIGSTOP, SIGCONT).
pub fn signal(pid: i32, sig: &str) -> Result<()> {
    run("kill", &[sig, &pid.to_string()]).map(|_| ())
}
