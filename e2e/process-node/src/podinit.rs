//! `pod-init`: the hidden subcommand each container starts as.
//!
//! The node re-executes itself as `mirrorflow-process-node pod-init <spec-json>` in the
//! container's own process group; this enters a private mount namespace, bind-mounts the
//! pod's volumes at their mount paths, changes directory and `exec`s the real command.
//! Doing it in a fresh process keeps `unsafe` (`pre_exec`) out of the node.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Spec {
    pub mounts: Vec<Mount>,
    pub program: String,
    pub args: Vec<String>,
    /// container.workingDir; used when it exists (after mounting), else `fallback_dir`.
    pub working_dir: Option<PathBuf>,
    pub fallback_dir: PathBuf,
}

/// Exit code when the command cannot be started (what shells use for "not found").
const EXIT_CANNOT_EXEC: i32 = 127;
const EXIT_SETUP_FAILED: i32 = 126;

/// Runs the spec; only returns (with an exit code) when something failed.
pub fn run(spec_json: &str) -> i32 {
    let spec: Spec = match serde_json::from_str(spec_json) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("process-node pod-init: bad spec: {e}");
            return EXIT_SETUP_FAILED;
        }
    };
    if let Err(e) = setup_mounts(&spec.mounts) {
        eprintln!("process-node pod-init: {e}");
        return EXIT_SETUP_FAILED;
    }
    let dir = spec
        .working_dir
        .as_deref()
        .filter(|d| d.is_dir())
        .unwrap_or(&spec.fallback_dir);
    if let Err(e) = std::env::set_current_dir(dir) {
        eprintln!(
            "process-node pod-init: cannot chdir to {}: {e}",
            dir.display()
        );
        return EXIT_SETUP_FAILED;
    }
    let err = std::process::Command::new(&spec.program)
        .args(&spec.args)
        .exec();
    eprintln!(
        "process-node pod-init: cannot run {:?}: {err}",
        spec.program
    );
    EXIT_CANNOT_EXEC
}

fn setup_mounts(mounts: &[Mount]) -> Result<(), String> {
    if mounts.is_empty() {
        return Ok(());
    }
    unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare(CLONE_NEWNS): {e} (the process node must run as root)"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("making / private: {e}"))?;
    for m in mounts {
        ensure_target(&m.source, &m.target)?;
        mount(
            Some(&m.source),
            &m.target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| format!("bind {} -> {}: {e}", m.source.display(), m.target.display()))?;
        if m.read_only {
            let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
            mount(None::<&str>, &m.target, None::<&str>, flags, None::<&str>)
                .map_err(|e| format!("remount {} read-only: {e}", m.target.display()))?;
        }
    }
    Ok(())
}

/// Creates an empty directory (or file, for a file source) where the mount goes.
fn ensure_target(source: &Path, target: &Path) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("creating mount point {}: {e}", target.display());
    if source.is_dir() {
        std::fs::create_dir_all(target).map_err(fail)
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(fail)?;
        }
        if !target.exists() {
            std::fs::File::create(target).map_err(fail)?;
        }
        Ok(())
    }
}

/// Whether binding over `target` is allowed: it must not exist, be empty, or lie under the
/// service-account secrets directory (binding there per pod is the point). This keeps a pod
/// from hiding a populated host directory such as /etc or /usr from its own process.
pub fn target_allowed(target: &Path) -> bool {
    const OPEN: &[&str] = &["/var/run/secrets", "/run/secrets"];
    if OPEN.iter().any(|p| target.starts_with(p)) {
        return true;
    }
    match std::fs::metadata(target) {
        Err(_) => true,
        Ok(m) if m.is_dir() => std::fs::read_dir(target).is_ok_and(|mut d| d.next().is_none()),
        Ok(m) => m.len() == 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trips() {
        let s = Spec {
            mounts: vec![Mount {
                source: "/s".into(),
                target: "/t".into(),
                read_only: true,
            }],
            program: "sh".into(),
            args: vec!["-c".into(), "echo".into()],
            working_dir: None,
            fallback_dir: "/tmp".into(),
        };
        let j = serde_json::to_string(&s).unwrap_or_default();
        assert_eq!(serde_json::from_str::<Spec>(&j).ok(), Some(s));
    }

    #[test]
    fn targets() {
        assert!(target_allowed(Path::new(
            "/var/run/secrets/kubernetes.io/serviceaccount"
        )));
        assert!(target_allowed(Path::new("/definitely/not/here/xyz")));
        assert!(!target_allowed(Path::new("/etc")));
    }
}
