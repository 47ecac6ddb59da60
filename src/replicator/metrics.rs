//! The replicator's Prometheus metrics, all prefixed `mirrorflow_`.
//!
//! Labels stay low-cardinality: no per-partition labels; per-group checkpoint age is labelled,
//! since groups are what users fail over, for the [`MAX_GROUP_SERIES`] stalest groups only
//! (whoever may create groups on the source must not grow every scrape without bound), and
//! refused records by topic, since only topics whose records the target refuses ever get a
//! series.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Groups with a `group_checkpoint_age_seconds` series of their own: the stalest.
pub const MAX_GROUP_SERIES: usize = 500;

/// Every metric the three loops update; cloned handles are cheap (`Arc` inside).
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub records_replicated: IntCounter,
    pub bytes_replicated: IntCounter,
    /// Age of a record (now - its timestamp) when the target acknowledged its copy.
    pub record_age: Histogram,
    /// Time from a record being read from the source to its copy being acknowledged.
    pub replication_latency: Histogram,
    pub offset_syncs: IntCounter,
    /// Topic discovery rounds that listed both clusters: the marker tests wait on to know
    /// discovery has looked again, instead of sleeping for its interval.
    pub discovery_rounds: IntCounter,
    pub checkpoints_emitted: IntCounter,
    /// Time from a group's commit on the source to its checkpoint being written on the target.
    pub checkpoint_latency: Histogram,
    /// Seconds since each group's latest checkpoint (the stalest [`MAX_GROUP_SERIES`]).
    pub group_checkpoint_age: GaugeVec,
    /// Groups with a checkpoint age but no series of their own (beyond the cap).
    pub groups_unlabelled: IntGauge,
    /// The groups that have a series now.
    labelled_groups: Arc<Mutex<HashSet<String>>>,
    /// Age of the newest replicated source heartbeat seen on the target.
    pub heartbeat_lag: Gauge,
    pub heartbeats_emitted: IntCounter,
    pub assigned_partitions: IntGauge,
    /// Source consumers (copy loops) this replica runs (`spec.sourceLoop.consumers`).
    pub source_consumers: IntGauge,
    /// 1 while this flow waits for an older flow that writes the same internal topics.
    pub writer_yielding: IntGauge,
    /// Errors by loop (`source`, `checkpoint`, `heartbeat`) and kind (`unreachable`, ...).
    pub errors: IntCounterVec,
    /// 1 while the named cluster (`source`, `target`) cannot be reached.
    pub cluster_unreachable: prometheus::IntGaugeVec,
    /// Breaks in a partition's continuity by reason (`SourceTruncated`, ...).
    pub continuity_breaks: IntCounterVec,
    /// Records the target refused as too large and the source loop skipped, by source topic.
    pub records_rejected: IntCounterVec,
    /// Source batches the whole-batch copy wrote anew, by why (`compacted`, `log_append_time`,
    /// `too_large`).
    pub batches_rewritten: IntCounterVec,
    /// Topic ACL bindings the source loop created on the target (`spec.sourceLoop.syncTopicAcls`).
    pub topic_acls_created: IntCounter,
    /// Bindings the target should have for the source's ACLs and lacked after the latest round
    /// (0 when in sync; stays above 0 while the target refuses them).
    pub topic_acls_missing: IntGauge,
    /// The source offset each stalled partition waits at (present only while it is stalled).
    pub partition_stalled: prometheus::IntGaugeVec,
    /// Partitions found stalled (no progress for a minute with records beyond them).
    pub partition_stalls: IntCounter,
    /// Checkpoints verified on their records, by outcome (`match`, `mismatch`, `unverifiable`).
    pub verifications: IntCounterVec,
    /// Bytes of the fetch answers the verification's reads brought, by cluster (`source`,
    /// `target`): what verification costs each cluster.
    pub verification_read_bytes: IntCounterVec,
    /// Group-partitions of this replica whose latest verification was a mismatch.
    pub verification_mismatches: IntGauge,
    /// Seconds since this replica's newest verification (absent before the first).
    pub verification_age: Gauge,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("mirrorflow".into()), None)?;
        let histogram = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()))
        };
        let m = Metrics {
            records_replicated: IntCounter::new(
                "records_replicated_total",
                "Records copied and acknowledged by the target",
            )?,
            bytes_replicated: IntCounter::new(
                "bytes_replicated_total",
                "Key and value bytes copied and acknowledged",
            )?,
            record_age: histogram(
                "record_age_seconds",
                "Age of records when their copy was acknowledged",
            )?,
            replication_latency: histogram(
                "replication_latency_seconds",
                "Time from reading a record to the target's acknowledgement",
            )?,
            offset_syncs: IntCounter::new("offset_syncs_total", "Offset syncs written")?,
            discovery_rounds: IntCounter::new(
                "discovery_rounds_total",
                "Topic discovery rounds completed on both clusters",
            )?,
            checkpoints_emitted: IntCounter::new(
                "checkpoints_emitted_total",
                "Checkpoints written",
            )?,
            checkpoint_latency: histogram(
                "checkpoint_latency_seconds",
                "Time from a source commit to its checkpoint on the target",
            )?,
            group_checkpoint_age: GaugeVec::new(
                Opts::new(
                    "group_checkpoint_age_seconds",
                    "Seconds since the group's latest checkpoint",
                ),
                &["group"],
            )?,
            groups_unlabelled: IntGauge::new(
                "groups_unlabelled",
                "Groups whose checkpoint age has no series of its own (only the stalest groups have one)",
            )?,
            labelled_groups: Arc::default(),
            heartbeat_lag: Gauge::new(
                "heartbeat_lag_seconds",
                "Age of the newest replicated source heartbeat on the target",
            )?,
            heartbeats_emitted: IntCounter::new("heartbeats_emitted_total", "Heartbeats written")?,
            assigned_partitions: IntGauge::new(
                "assigned_partitions",
                "Source partitions this replica copies",
            )?,
            source_consumers: IntGauge::new(
                "source_consumers",
                "Source consumers this replica runs, each with its own connections and partitions",
            )?,
            writer_yielding: IntGauge::new(
                "writer_yielding",
                "1 while an older flow writes this flow's internal topics on the target and this replicator copies nothing",
            )?,
            errors: IntCounterVec::new(
                Opts::new("errors_total", "Errors by loop and kind"),
                &["loop", "kind"],
            )?,
            cluster_unreachable: prometheus::IntGaugeVec::new(
                Opts::new(
                    "cluster_unreachable",
                    "1 while the cluster cannot be reached",
                ),
                &["cluster"],
            )?,
            continuity_breaks: IntCounterVec::new(
                Opts::new(
                    "continuity_breaks_total",
                    "Partitions whose copy had to break continuity (records deleted on the source before they were copied, a recreated source or target topic)",
                ),
                &["reason"],
            )?,
            partition_stalled: prometheus::IntGaugeVec::new(
                Opts::new(
                    "partition_stalled",
                    "Source offset a partition waits at while it copies nothing for a minute with records beyond it",
                ),
                &["topic", "partition"],
            )?,
            partition_stalls: IntCounter::new(
                "partition_stalls_total",
                "Partitions found copying nothing for a minute while the source held records beyond them",
            )?,
            records_rejected: IntCounterVec::new(
                Opts::new(
                    "records_rejected_total",
                    "Records the target refused as larger than the remote topic's max.message.bytes; skipped and recorded as a gap",
                ),
                &["topic"],
            )?,
            batches_rewritten: IntCounterVec::new(
                Opts::new(
                    "batches_rewritten_total",
                    "Source record batches the whole-batch copy could not write as they were and wrote anew (compaction gaps, the source broker's append time, larger than the remote topic's max.message.bytes)",
                ),
                &["reason"],
            )?,
            topic_acls_created: IntCounter::new(
                "topic_acls_created_total",
                "Topic ACL bindings copied from the source and created on the target",
            )?,
            topic_acls_missing: IntGauge::new(
                "topic_acls_missing",
                "Bindings for the source's topic ACLs the target lacked after the latest round",
            )?,
            verifications: IntCounterVec::new(
                Opts::new(
                    "verifications_total",
                    "Checkpoints verified on their records (the target's record at the checkpoint against the source's at the commit), by outcome",
                ),
                &["outcome"],
            )?,
            verification_read_bytes: IntCounterVec::new(
                Opts::new(
                    "verification_read_bytes_total",
                    "Bytes of the fetch answers read to verify checkpoints on their records, by cluster",
                ),
                &["cluster"],
            )?,
            verification_mismatches: IntGauge::new(
                "verification_mismatches",
                "Group-partitions whose latest verification found that a failover to the checkpoint would not resume on the group's next record",
            )?,
            verification_age: Gauge::new(
                "verification_age_seconds",
                "Seconds since the newest verification of a checkpoint on its records",
            )?,
            registry,
        };
        m.registry
            .register(Box::new(m.records_replicated.clone()))?;
        m.registry.register(Box::new(m.bytes_replicated.clone()))?;
        m.registry.register(Box::new(m.record_age.clone()))?;
        m.registry
            .register(Box::new(m.replication_latency.clone()))?;
        m.registry.register(Box::new(m.offset_syncs.clone()))?;
        m.registry.register(Box::new(m.discovery_rounds.clone()))?;
        m.registry
            .register(Box::new(m.checkpoints_emitted.clone()))?;
        m.registry
            .register(Box::new(m.checkpoint_latency.clone()))?;
        m.registry
            .register(Box::new(m.group_checkpoint_age.clone()))?;
        m.registry.register(Box::new(m.groups_unlabelled.clone()))?;
        m.registry.register(Box::new(m.heartbeat_lag.clone()))?;
        m.registry.register(Box::new(m.verifications.clone()))?;
        m.registry
            .register(Box::new(m.verification_read_bytes.clone()))?;
        m.registry
            .register(Box::new(m.verification_mismatches.clone()))?;
        m.registry
            .register(Box::new(m.heartbeats_emitted.clone()))?;
        m.registry
            .register(Box::new(m.assigned_partitions.clone()))?;
        m.registry.register(Box::new(m.source_consumers.clone()))?;
        m.registry.register(Box::new(m.writer_yielding.clone()))?;
        m.registry.register(Box::new(m.errors.clone()))?;
        m.registry
            .register(Box::new(m.cluster_unreachable.clone()))?;
        m.registry.register(Box::new(m.continuity_breaks.clone()))?;
        m.registry.register(Box::new(m.records_rejected.clone()))?;
        m.registry.register(Box::new(m.batches_rewritten.clone()))?;
        m.registry.register(Box::new(m.partition_stalled.clone()))?;
        m.registry.register(Box::new(m.partition_stalls.clone()))?;
        m.registry
            .register(Box::new(m.topic_acls_created.clone()))?;
        m.registry
            .register(Box::new(m.topic_acls_missing.clone()))?;
        // Series that exist from the start at 0: a rate over a series that appears with its
        // first error misses that error, and a healthy flow's error and reach panels would
        // show no data rather than zero.
        for lp in ["source", "checkpoint", "heartbeat"] {
            m.errors.with_label_values(&[lp, "unreachable"]);
        }
        for cluster in ["source", "target"] {
            m.cluster_unreachable.with_label_values(&[cluster]);
        }
        Ok(m)
    }

    /// Sets the checkpoint age of the stalest [`MAX_GROUP_SERIES`] groups and drops the series
    /// of groups no longer among them.
    pub fn set_group_ages(&self, mut ages: Vec<(&str, Duration)>) {
        ages.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let unlabelled = ages.len().saturating_sub(MAX_GROUP_SERIES);
        ages.truncate(MAX_GROUP_SERIES);
        let Ok(mut labelled) = self.labelled_groups.lock() else {
            return;
        };
        let now: HashSet<String> = ages.iter().map(|(g, _)| g.to_string()).collect();
        for gone in labelled.difference(&now) {
            let _ = self.group_checkpoint_age.remove_label_values(&[gone]);
        }
        for (group, age) in &ages {
            self.group_checkpoint_age
                .with_label_values(&[*group])
                .set(age.as_secs_f64());
        }
        *labelled = now;
        self.groups_unlabelled
            .set(i64::try_from(unlabelled).unwrap_or(i64::MAX));
    }

    /// Forgets a group's series (the group is gone).
    /// A checkpoint was verified just now: the age of the newest verification is 0 (its series
    /// exists from the first verification on; an age of 0 before it would say what is not).
    pub fn verified_now(&self) {
        // Registered already after the first time: nothing else can fail here.
        let _ = self
            .registry
            .register(Box::new(self.verification_age.clone()));
        self.verification_age.set(0.0);
    }

    pub fn forget_group(&self, group: &str) {
        let _ = self.group_checkpoint_age.remove_label_values(&[group]);
        if let Ok(mut labelled) = self.labelled_groups.lock() {
            labelled.remove(group);
        }
    }

    /// The text exposition format served on `/metrics`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_stalest_groups_get_a_series() {
        let m = Metrics::new().expect("metrics");
        let names: Vec<String> = (0..MAX_GROUP_SERIES + 20)
            .map(|i| format!("g{i}"))
            .collect();
        let ages = |stalest: usize| {
            names
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let age = if i == stalest { 10_000 } else { i as u64 };
                    (g.as_str(), Duration::from_secs(age))
                })
                .collect::<Vec<_>>()
        };
        m.set_group_ages(ages(0));
        let series = |m: &Metrics| {
            m.render()
                .lines()
                .filter(|l| l.starts_with("mirrorflow_group_checkpoint_age_seconds{"))
                .count()
        };
        assert_eq!(series(&m), MAX_GROUP_SERIES);
        assert_eq!(m.groups_unlabelled.get(), 20);
        // g0 is the stalest: it has a series although its index is the lowest.
        assert!(
            m.render()
                .contains("mirrorflow_group_checkpoint_age_seconds{group=\"g0\"} 10000")
        );
        // A fresh checkpoint for g0 moves it out of the stalest: its series goes.
        m.set_group_ages(ages(1));
        assert_eq!(series(&m), MAX_GROUP_SERIES);
        assert!(!m.render().contains("{group=\"g0\"}"));
        m.forget_group("g1");
        assert_eq!(series(&m), MAX_GROUP_SERIES - 1);
    }

    #[test]
    fn every_family_is_exposed_with_the_prefix() {
        let m = Metrics::new().unwrap();
        m.records_replicated.inc();
        m.group_checkpoint_age.with_label_values(&["g1"]).set(1.0);
        m.errors.with_label_values(&["source", "unreachable"]).inc();
        m.cluster_unreachable.with_label_values(&["source"]).set(0);
        m.record_age.observe(0.1);
        let text = m.render();
        for name in [
            "mirrorflow_records_replicated_total 1",
            "mirrorflow_group_checkpoint_age_seconds{group=\"g1\"} 1",
            "mirrorflow_errors_total{kind=\"unreachable\",loop=\"source\"} 1",
            "mirrorflow_record_age_seconds_bucket",
            "mirrorflow_heartbeat_lag_seconds",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
