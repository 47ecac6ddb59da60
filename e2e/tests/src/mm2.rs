//! The real MirrorMaker 2 next to ours: a dedicated-mode process (`e2e/lib/mm2.sh` through
//! `e2e/world.sh mm2`), its client library's offset translation and Kafka's console formatters
//! for its records (`e2e/interop/run.sh`), and `mirrorflow translate` parsed the same way, so
//! tests compare like with like.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::replicator::binary;

/// A MirrorMaker 2 process; stopped when dropped.
pub struct MirrorMaker {
    repo_root: PathBuf,
    name: String,
    env: Vec<(String, String)>,
    running: bool,
}

fn world_sh(repo_root: &Path, env: &[(String, String)], args: &[&str]) -> Result<String> {
    let out = Command::new(repo_root.join("e2e/world.sh"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .context("running e2e/world.sh")?;
    if !out.status.success() {
        bail!(
            "e2e/world.sh {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl MirrorMaker {
    /// Starts MirrorMaker replicating `src_alias` -> `tgt_alias` and returns once its source
    /// task copies at least one partition (create the topics first). `props` are `key=value`
    /// lines for the generated mm2.properties; `env` overrides the world's (e.g. `MF_STATE`).
    pub fn start(
        repo_root: &Path,
        env: &[(&str, &str)],
        name: &str,
        (src_alias, src_bootstrap): (&str, &str),
        (tgt_alias, tgt_bootstrap): (&str, &str),
        props: &[String],
    ) -> Result<MirrorMaker> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut mm = MirrorMaker {
            repo_root: repo_root.to_path_buf(),
            name: name.to_string(),
            env,
            running: true,
        };
        let mut args = vec![
            "mm2",
            "start",
            name,
            src_alias,
            src_bootstrap,
            tgt_alias,
            tgt_bootstrap,
        ];
        args.extend(props.iter().map(String::as_str));
        if let Err(e) = world_sh(repo_root, &mm.env, &args) {
            let log = mm.log_text();
            mm.running = false;
            return Err(e.context(log));
        }
        Ok(mm)
    }

    /// The tail of its log (for assertion messages).
    pub fn log_text(&self) -> String {
        let Ok(path) = world_sh(&self.repo_root, &self.env, &["mm2", "log", &self.name]) else {
            return String::new();
        };
        let text = std::fs::read_to_string(path.trim()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Kills the process at once (a crash, or a failover that does not wait for it).
    pub fn kill(&mut self) -> Result<()> {
        if !self.running {
            return Ok(());
        }
        let log = world_sh(&self.repo_root, &self.env, &["mm2", "log", &self.name])?;
        let pidfile = Path::new(log.trim()).with_file_name("mm2.pid");
        if let Ok(pid) = std::fs::read_to_string(&pidfile) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
        // Removes the pid file once the process is gone.
        self.stop()
    }

    pub fn stop(&mut self) -> Result<()> {
        if std::mem::take(&mut self.running) {
            world_sh(&self.repo_root, &self.env, &["mm2", "stop", &self.name])?;
        }
        Ok(())
    }
}

impl Drop for MirrorMaker {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("stopping MirrorMaker {}: {e:#}", self.name);
        }
    }
}

/// Translated positions of one group on the target: (target topic, partition) -> (offset,
/// metadata).
pub type Positions = BTreeMap<(String, i32), (i64, String)>;

fn interop(repo_root: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(repo_root.join("e2e/interop/run.sh"))
        .args(args)
        .output()
        .context("running e2e/interop/run.sh")?;
    if !out.status.success() {
        bail!(
            "e2e/interop/run.sh {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Reads `{"groups":[{"group":..,"partitions":[{"topic","partition","offset","metadata"}]}]}`,
/// the shape both `TranslateOffsets` and `mirrorflow translate --output json` print.
fn positions_by_group(json: &Value) -> Result<BTreeMap<String, Positions>> {
    let mut out = BTreeMap::new();
    for g in json["groups"].as_array().context("no groups array")? {
        let group = g["group"].as_str().context("group without a name")?;
        let mut positions = Positions::new();
        for p in g["partitions"].as_array().context("no partitions array")? {
            let topic = p["topic"].as_str().context("partition without topic")?;
            let partition = p["partition"].as_i64().context("no partition number")?;
            let offset = p["offset"].as_i64().context("no offset")?;
            let metadata = p["metadata"].as_str().unwrap_or_default();
            positions.insert(
                (topic.to_string(), i32::try_from(partition)?),
                (offset, metadata.to_string()),
            );
        }
        out.insert(group.to_string(), positions);
    }
    Ok(out)
}

/// MirrorMaker's `RemoteClusterUtils.translateOffsets(props, remote_alias, group)` for each
/// group against the cluster at `bootstrap` (the target). `props` go into the client's config
/// (e.g. `replication.policy.separator=_`).
pub fn remote_cluster_utils(
    repo_root: &Path,
    bootstrap: &str,
    remote_alias: &str,
    groups: &[&str],
    props: &[&str],
) -> Result<BTreeMap<String, Positions>> {
    let mut args = vec!["translate", bootstrap, remote_alias];
    args.extend(groups);
    for p in props {
        args.extend(["--prop", p]);
    }
    let text = interop(repo_root, &args)?;
    let json: Value = serde_json::from_str(text.trim())
        .with_context(|| format!("TranslateOffsets printed {text}"))?;
    positions_by_group(&json)
}

/// `mirrorflow translate --flow-file FLOW --group G... --output json`, by group.
pub fn mirrorflow_translate(
    repo_root: &Path,
    flow_file: &Path,
    groups: &[&str],
) -> Result<BTreeMap<String, Positions>> {
    let mut cmd = Command::new(binary(repo_root));
    cmd.arg("translate").arg("--flow-file").arg(flow_file);
    for g in groups {
        cmd.args(["--group", g]);
    }
    let out = cmd
        .args(["--output", "json"])
        .output()
        .context("running mirrorflow translate")?;
    if !out.status.success() {
        bail!(
            "mirrorflow translate failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let json: Value = serde_json::from_str(text.trim())
        .with_context(|| format!("mirrorflow translate printed {text}"))?;
    positions_by_group(&json)
}

/// Lines Kafka's console consumer prints for the first `count` records of partition 0 of
/// `topic` with MirrorMaker's formatter for `kind` (`checkpoint`, `heartbeat`, `offset-sync`).
pub fn format(
    repo_root: &Path,
    kind: &str,
    bootstrap: &str,
    topic: &str,
    count: usize,
) -> Result<Vec<String>> {
    Ok(interop(
        repo_root,
        &["format", kind, bootstrap, topic, &count.to_string()],
    )?
    .lines()
    .map(str::to_string)
    .filter(|l| !l.is_empty())
    .collect())
}

/// The values of `keys` in a Java `toString()` such as `Name{a=1, b=x, c=3}`; each value runs
/// to the next `, <key>=`, so only the last may contain that text.
fn fields(line: &str, name: &str, keys: &[&str]) -> Result<Vec<String>> {
    let body = line
        .strip_prefix(name)
        .and_then(|r| r.strip_prefix('{'))
        .and_then(|r| r.strip_suffix('}'))
        .with_context(|| format!("not a {name}: {line}"))?;
    let mut out = Vec::new();
    let mut rest = body;
    for (i, key) in keys.iter().enumerate() {
        rest = rest
            .strip_prefix(&format!("{key}="))
            .with_context(|| format!("{key} missing in {line}"))?;
        let end = match keys.get(i + 1) {
            Some(next) => rest
                .find(&format!(", {next}="))
                .with_context(|| format!("{next} missing in {line}"))?,
            None => rest.len(),
        };
        out.push(rest[..end].to_string());
        rest = rest[end..].strip_prefix(", ").unwrap_or("");
    }
    Ok(out)
}

/// `topic-partition` as Kafka's `TopicPartition.toString()` prints it.
fn topic_partition(s: &str) -> Result<(String, i32)> {
    let (topic, p) = s
        .rsplit_once('-')
        .with_context(|| format!("not a topic-partition: {s}"))?;
    Ok((topic.to_string(), p.parse()?))
}

/// A checkpoint as `CheckpointFormatter` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JavaCheckpoint {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub upstream_offset: i64,
    pub downstream_offset: i64,
    pub metadata: String,
}

pub fn parse_checkpoint(line: &str) -> Result<JavaCheckpoint> {
    let f = fields(
        line,
        "Checkpoint",
        &[
            "consumerGroupId",
            "topicPartition",
            "upstreamOffset",
            "downstreamOffset",
            "metadata",
        ],
    )?;
    let (topic, partition) = topic_partition(&f[1])?;
    Ok(JavaCheckpoint {
        group: f[0].clone(),
        topic,
        partition,
        upstream_offset: f[2].parse()?,
        downstream_offset: f[3].parse()?,
        metadata: f[4].clone(),
    })
}

/// (source alias, target alias, timestamp) as `HeartbeatFormatter` prints a heartbeat.
pub fn parse_heartbeat(line: &str) -> Result<(String, String, i64)> {
    let f = fields(
        line,
        "Heartbeat",
        &["sourceClusterAlias", "targetClusterAlias", "timestamp"],
    )?;
    Ok((f[0].clone(), f[1].clone(), f[2].parse()?))
}

/// (topic, partition, upstream offset, downstream offset) as `OffsetSyncFormatter` prints a
/// sync.
pub fn parse_offset_sync(line: &str) -> Result<(String, i32, i64, i64)> {
    let f = fields(
        line,
        "OffsetSync",
        &["topicPartition", "upstreamOffset", "downstreamOffset"],
    )?;
    let (topic, partition) = topic_partition(&f[0])?;
    Ok((topic, partition, f[1].parse()?, f[2].parse()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_formatters_output() -> Result<()> {
        let cp = parse_checkpoint(
            "Checkpoint{consumerGroupId=g-1, topicPartition=a.my-topic-12, upstreamOffset=250, downstreamOffset=201, metadata=}",
        )?;
        assert_eq!(
            cp,
            JavaCheckpoint {
                group: "g-1".into(),
                topic: "a.my-topic".into(),
                partition: 12,
                upstream_offset: 250,
                downstream_offset: 201,
                metadata: String::new(),
            }
        );
        assert_eq!(
            parse_heartbeat(
                "Heartbeat{sourceClusterAlias=A, targetClusterAlias=B, timestamp=1700000000000}"
            )?,
            ("A".into(), "B".into(), 1_700_000_000_000)
        );
        assert_eq!(
            parse_offset_sync(
                "OffsetSync{topicPartition=t-3, upstreamOffset=100, downstreamOffset=200}"
            )?,
            ("t".into(), 3, 100, 200)
        );
        Ok(())
    }
}
