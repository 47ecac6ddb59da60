//! Starting, signalling and remembering container processes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::podinit;

/// The program the node re-executes for `pod-init`. `/proc/self/exe` still works after the
/// node's binary has been rebuilt (replaced) while the node runs.
fn self_exe() -> PathBuf {
    let proc_exe = PathBuf::from("/proc/self/exe");
    if proc_exe.exists() {
        proc_exe
    } else {
        std::env::current_exe().unwrap_or(proc_exe)
    }
}

/// Starts `pod-init` with the spec in its own process group, env replaced, output appended
/// to `log`.
pub fn spawn(
    spec: &podinit::Spec,
    env: &[(String, String)],
    log: &Path,
) -> std::io::Result<tokio::process::Child> {
    let spec_json = serde_json::to_string(spec).map_err(std::io::Error::other)?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let err = out.try_clone()?;
    let mut cmd = tokio::process::Command::new(self_exe());
    cmd.arg("pod-init")
        .arg(spec_json)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .process_group(0)
        .kill_on_drop(false);
    cmd.spawn()
}

/// Signals the whole process group of a container; false if no such group exists.
pub fn signal_group(pid: i32, signal: Signal) -> bool {
    pid > 0 && killpg(Pid::from_raw(pid), signal).is_ok()
}

/// Field 22 of /proc/PID/stat: the start time, to tell a pid from a reused one.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// Pid files: `<state>/pids/<pod-uid>_<container>.pid` with "PID STARTTIME".
#[derive(Clone, Debug)]
pub struct PidFiles {
    dir: PathBuf,
}

impl PidFiles {
    pub fn new(state_dir: &Path) -> std::io::Result<Self> {
        let dir = state_dir.join("pids");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    fn path(&self, uid: &str, container: &str) -> PathBuf {
        self.dir.join(format!("{uid}_{container}.pid"))
    }

    pub fn record(&self, uid: &str, container: &str, pid: i32) {
        let line = format!("{pid} {}\n", start_time(pid).unwrap_or(0));
        if let Ok(mut f) = std::fs::File::create(self.path(uid, container)) {
            let _ = f.write_all(line.as_bytes());
        }
    }

    pub fn forget(&self, uid: &str, container: &str) {
        let _ = std::fs::remove_file(self.path(uid, container));
    }

    /// Kills the process groups left by an earlier run of the node; returns how many.
    pub fn kill_orphans(&self) -> usize {
        let mut killed = 0;
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let mut parts = text.split_whitespace();
            let pid: Option<i32> = parts.next().and_then(|p| p.parse().ok());
            let started: Option<u64> = parts.next().and_then(|p| p.parse().ok());
            // The leader still runs (same start time: not a reused pid), or no process has
            // that pid any more: then the group id still names only the old group's
            // survivors (the kernel does not reuse a pid that is a live group's id).
            let leader = pid.map(start_time);
            if let Some(pid) = pid
                && pid > 0
                && (leader == Some(started) || leader == Some(None))
                && signal_group(pid, Signal::SIGKILL)
            {
                killed += 1;
                // Wait (briefly) until the group is gone, so its ports and files are free
                // before the pods start again.
                for _ in 0..100 {
                    if killpg(Pid::from_raw(pid), None).is_err() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            let _ = std::fs::remove_file(entry.path());
        }
        killed
    }
}

/// Points `<state>/logs/<ns>/<pod>/<container>.log` at the newest pod of that name.
pub fn link_log(state_dir: &Path, namespace: &str, pod: &str, container: &str, log: &Path) {
    let dir = state_dir.join("logs").join(namespace).join(pod);
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let link = dir.join(format!("{container}.log"));
    let tmp = dir.join(format!(".{container}.log.tmp"));
    let _ = std::fs::remove_file(&tmp);
    if std::os::unix::fs::symlink(log, &tmp).is_ok() {
        let _ = std::fs::rename(&tmp, &link);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_self_is_known() {
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        assert_eq!(start_time(-5), None);
    }

    #[tokio::test]
    async fn orphans_from_pid_files_are_killed() {
        // The test binary is not the node, so run a plain child to check the orphan logic.
        let dir = std::env::temp_dir().join(format!("pn-proc-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pids = PidFiles::new(&dir).unwrap_or_else(|e| panic!("{e}"));
        let mut child = tokio::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let pid = child.id().map(|p| p as i32).unwrap_or_default();
        pids.record("uid", "c", pid);
        assert_eq!(pids.kill_orphans(), 1);
        let status = child.wait().await.unwrap_or_else(|e| panic!("{e}"));
        assert!(!status.success());
        assert_eq!(pids.kill_orphans(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
