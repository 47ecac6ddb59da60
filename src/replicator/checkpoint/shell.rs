//! The checkpoint loop's I/O around [`Core`]: checkpoint writes, metrics, readiness and the
//! group sync task's channel.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::core::{Core, Due};
use super::group_sync::GroupView;
use super::verify;
use crate::mm2::TopicPartition;
use crate::replicator::context::Context;
use crate::replicator::kafka_io::{AckedProducer, Reachability};

/// The loop's I/O around [`Core`]: checkpoint writes, metrics, readiness and the group sync
/// task's channel.
pub(super) struct Shell<'a> {
    pub(super) ctx: Arc<Context>,
    pub(super) topic: String,
    pub(super) producer: AckedProducer,
    pub(super) target_reach: Arc<Reachability>,
    pub(super) group_views: Option<mpsc::Sender<GroupView>>,
    pub(super) core: Core<'a>,
    /// `None` when verification is off or its thread could not start.
    pub(super) verification: Option<Verification>,
}

/// What the shell keeps of the verification: the thread, the sampler, what it stated on the
/// checkpoints topic and what the metrics say.
pub(super) struct Verification {
    verifier: verify::Verifier,
    sampler: verify::sampler::Sampler,
    /// A verification that finds what the last one stated of the same checkpoint is stated
    /// again only after this long: the status's evidence stays this recent at worst, and the
    /// checkpoints topic gets one record per pair per this time, not one per verification.
    restate_after: Duration,
    /// Per pair, what was last stated: the checkpoint's offsets, the outcome, and when.
    stated: HashMap<
        verify::sampler::Pair,
        (
            i64,
            i64,
            crate::verify::outcome::Outcome,
            std::time::Instant,
        ),
    >,
    /// The pairs whose latest verification was a mismatch.
    mismatched: HashSet<verify::sampler::Pair>,
    newest: Option<std::time::Instant>,
}

/// Verification periods after which an unchanged verification is stated again.
const RESTATE_PERIODS: u32 = 5;

impl Verification {
    pub(super) fn new(
        verifier: verify::Verifier,
        sampler: verify::sampler::Sampler,
        period: Duration,
    ) -> Self {
        Verification {
            verifier,
            sampler,
            restate_after: period.saturating_mul(RESTATE_PERIODS),
            stated: HashMap::new(),
            mismatched: HashSet::new(),
            newest: None,
        }
    }

    /// Whether `done` says something the checkpoints topic does not say yet (or said too long
    /// ago); if so it counts as stated now.
    fn worth_stating(
        &mut self,
        pair: &verify::sampler::Pair,
        done: &crate::verify::header::Verification,
    ) -> bool {
        let now = std::time::Instant::now();
        let same = self
            .stated
            .get(pair)
            .is_some_and(|(up, down, outcome, at)| {
                (*up, *down, *outcome) == (done.upstream, done.downstream, done.outcome)
                    && now.saturating_duration_since(*at) < self.restate_after
            });
        if !same {
            self.stated.insert(
                pair.clone(),
                (done.upstream, done.downstream, done.outcome, now),
            );
        }
        !same
    }
}

impl Shell<'_> {
    /// Drops the metrics of the groups the core forgot and tells the group sync task.
    pub(super) fn drop_forgotten(&mut self) {
        if self.core.forgotten.is_empty() {
            return;
        }
        for group in std::mem::take(&mut self.core.forgotten) {
            self.ctx.metrics.forget_group(&group);
        }
        self.send_group_views();
    }

    /// Evaluates the dirty pairs and writes the checkpoints due. False when a write failed
    /// (the failed pairs stay dirty).
    pub(super) async fn flush(&mut self) -> bool {
        if !self.core.ready_to_evaluate() {
            return true;
        }
        let batch = self.core.due_checkpoints();
        let ok = self.write(batch).await;
        self.send_group_views();
        ok
    }

    async fn write(&mut self, batch: Vec<Due>) -> bool {
        if batch.is_empty() {
            return true;
        }
        let decided = std::time::Instant::now();
        let mut pending = Vec::with_capacity(batch.len());
        let mut batch = batch.into_iter();
        while let Some(mut due) = batch.next() {
            if self.core.frozen_since(decided) {
                // Frozen between the decision and the write: another replica may own these
                // groups by now and have written later checkpoints, not read here yet.
                self.core.write_failed(due.tp, due.checkpoint);
                for rest in batch.by_ref() {
                    self.core.write_failed(rest.tp, rest.checkpoint);
                }
                break;
            }
            let skew = super::fault::skew();
            due.checkpoint.downstream_offset =
                due.checkpoint.downstream_offset.saturating_add(skew);
            let record = match due.checkpoint.encode() {
                Ok(r) => r,
                Err(e) => {
                    // A group name over 32767 bytes cannot be written in MM2's format.
                    self.ctx
                        .metrics
                        .errors
                        .with_label_values(&["checkpoint", "encode"])
                        .inc();
                    tracing::warn!(group = %due.checkpoint.group, error = %e, "cannot encode a checkpoint; skipping it");
                    continue;
                }
            };
            let share = self.core.share_groups.contains(&due.checkpoint.group);
            let headers = checkpoint_headers(due.exactness, None, share);
            let delivery = self.producer.send_with_headers(
                &self.topic,
                &record.key,
                Some(&record.value),
                None,
                headers,
            );
            pending.push((due, delivery));
        }
        let mut all_ok = true;
        for (due, delivery) in pending {
            let outcome = match delivery {
                Ok(acked) => self.producer.acknowledged(acked).await,
                Err(e) => Err(e),
            };
            let Due {
                tp,
                checkpoint: cp,
                exactness,
                live_since,
            } = due;
            match outcome {
                Ok(()) => {
                    self.target_reach.ok();
                    self.core.written(&tp, &cp, exactness, SystemTime::now());
                    self.ctx.metrics.checkpoints_emitted.inc();
                    if let Some(committed_ms) = live_since {
                        let latency = crate::clock::age(committed_ms).as_secs_f64();
                        self.ctx.metrics.checkpoint_latency.observe(latency);
                        tracing::debug!(group = %cp.group, partition = %cp.topic_partition, latency_s = latency, "checkpoint written");
                    }
                }
                Err(e) => {
                    all_ok = false;
                    self.target_reach.failed("writing checkpoints", &e);
                    self.core.write_failed(tp, cp);
                }
            }
        }
        all_ok
    }

    /// Sends the group sync task what it has not seen yet.
    fn send_group_views(&mut self) {
        let Some(views) = &self.group_views else {
            self.core.discard_group_views();
            return;
        };
        let mut pending = self.core.take_group_views().into_iter();
        while let Some(view) = pending.next() {
            if let Err(full) = views.try_send(view) {
                // Full: the rest goes with the next flush or tick rather than block checkpoints.
                let unsent = std::iter::once(full.into_inner()).chain(pending);
                self.core.unsent_group_views(unsent);
                return;
            }
        }
    }

    /// Once a second: readiness and per-group checkpoint ages.
    pub(super) fn tick(&mut self) {
        self.ctx
            .readiness
            .turned(crate::replicator::health::Loop::Checkpoint);
        let readiness = &self.ctx.readiness.checkpoint;
        if !readiness.load(Ordering::Relaxed) && self.core.loaded() {
            readiness.store(true, Ordering::Relaxed);
            tracing::info!(
                "checkpoint loop ready: checkpoints, offset syncs and group offsets loaded"
            );
        }
        self.ctx
            .metrics
            .set_group_ages(self.core.checkpoint_ages(SystemTime::now()));
        self.schedule_verifications();
        // Keep coverage changes flowing to the group sync task even without new checkpoints.
        if self.core.has_group_views() {
            self.send_group_views();
        }
    }
}

impl Shell<'_> {
    /// Hands the checkpoints due for verification to the verifier thread (once a second).
    fn schedule_verifications(&mut self) {
        let Some(v) = self.verification.as_mut() else {
            return;
        };
        if let Some(newest) = v.newest {
            self.ctx
                .metrics
                .verification_age
                .set(newest.elapsed().as_secs_f64());
        }
        let room = v.verifier.room();
        let now = std::time::Instant::now();
        if room == 0 || !self.core.ready_to_evaluate() || !v.sampler.may_pick(now) {
            return;
        }
        let candidates = self.core.verify_candidates();
        let pairs: Vec<verify::sampler::Pair> = candidates.iter().map(|(p, _)| p.clone()).collect();
        // Pairs gone from the candidates are not mismatched (nor stated) any more here.
        let present: HashSet<&verify::sampler::Pair> = pairs.iter().collect();
        v.mismatched.retain(|p| present.contains(p));
        v.stated.retain(|p, _| present.contains(p));
        let mismatched = i64::try_from(v.mismatched.len()).unwrap_or(i64::MAX);
        self.ctx.metrics.verification_mismatches.set(mismatched);
        let picked = v.sampler.pick(&pairs, room, now);
        if picked.is_empty() {
            return;
        }
        let sources: HashMap<&verify::sampler::Pair, &TopicPartition> =
            candidates.iter().map(|(p, s)| (p, s)).collect();
        for pair in &picked {
            let Some(job) = sources
                .get(pair)
                .and_then(|source| self.core.verify_job(&pair.0, &pair.1, source))
            else {
                continue;
            };
            if !v.verifier.send(job) {
                break;
            }
        }
    }

    /// Writes the verifications back from the thread on the checkpoints they verified: the
    /// same key and value again, with the translation header, the verification header and the
    /// checkpoint's own time (its age stays what it was). A checkpoint replaced meanwhile is
    /// left alone: the verification is about offsets no longer written.
    pub(super) async fn write_verified(&mut self) {
        let started = std::time::Instant::now();
        let mut frozen = false;
        for done in std::mem::take(&mut self.core.verified) {
            // Each statement waits for its acknowledgement: frozen meanwhile, the next would
            // restate a checkpoint another owner may have passed ([`super::freeze`]).
            frozen = frozen || self.core.frozen_since(started);
            let verify::Verified {
                job,
                verification,
                read_bytes: (source_bytes, target_bytes),
            } = done;
            let cp = &job.checkpoint;
            let outcome = verification.outcome;
            let metrics = &self.ctx.metrics;
            metrics
                .verifications
                .with_label_values(&[outcome.label()])
                .inc();
            for (cluster, bytes) in [("source", source_bytes), ("target", target_bytes)] {
                metrics
                    .verification_read_bytes
                    .with_label_values(&[cluster])
                    .inc_by(bytes);
            }
            let pair = (cp.group.clone(), cp.topic_partition.clone());
            // A checkpoint replaced meanwhile is not stated: the verification is about offsets
            // no longer written. Nor one of a group another replica took meanwhile, nor any
            // while an assignment's mark is awaited: a later checkpoint of another replica may
            // not be read back yet.
            let latest = self.core.ready_to_evaluate()
                && self.core.commits.is_owned_group(&cp.group)
                && self.core.tracker.last(&cp.group, &cp.topic_partition)
                    == Some((cp.upstream_offset, cp.downstream_offset));
            let mut to_state = false;
            if let Some(v) = self.verification.as_mut() {
                v.sampler.charge(
                    source_bytes.saturating_add(target_bytes),
                    std::time::Instant::now(),
                );
                to_state = latest && v.worth_stating(&pair, &verification);
                v.newest = Some(std::time::Instant::now());
                self.ctx.metrics.verified_now();
                if matches!(outcome, crate::verify::outcome::Outcome::Mismatch(_)) {
                    v.mismatched.insert(pair);
                } else {
                    v.mismatched.remove(&pair);
                }
                let mismatched = i64::try_from(v.mismatched.len()).unwrap_or(i64::MAX);
                self.ctx.metrics.verification_mismatches.set(mismatched);
            }
            if let crate::verify::outcome::Outcome::Mismatch(m) = outcome {
                tracing::warn!(group = %cp.group, partition = %cp.topic_partition, upstream = cp.upstream_offset, downstream = cp.downstream_offset, "verification: {}", m.failover());
            }
            if !to_state {
                continue;
            }
            let written_ms = self.core.tracker.written_ms(&cp.group, &cp.topic_partition);
            self.restamp(&job, &verification.header_value(), written_ms)
                .await;
        }
    }

    async fn restamp(&mut self, job: &verify::Job, verification: &str, written_ms: Option<i64>) {
        let Ok(record) = job.checkpoint.encode() else {
            return;
        };
        let share = self.core.share_groups.contains(&job.checkpoint.group);
        let headers = checkpoint_headers(job.exactness, Some(verification), share);
        let outcome = match self.producer.send_with_headers(
            &self.topic,
            &record.key,
            Some(&record.value),
            written_ms,
            headers,
        ) {
            Ok(acked) => self.producer.acknowledged(acked).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => self.target_reach.ok(),
            Err(e) => {
                // The verification is made again within a period.
                self.ctx
                    .metrics
                    .errors
                    .with_label_values(&["checkpoint", "verification_write"])
                    .inc();
                tracing::debug!(error = %e, group = %job.checkpoint.group, "writing a verification failed");
            }
        }
    }
}

/// A checkpoint record's headers: how it was translated, how it was verified, and whether it is
/// a share group's ([`crate::kafka::checkpoints::GROUP_TYPE_HEADER`]); `None` when none says
/// anything.
fn checkpoint_headers(
    exactness: crate::kafka::checkpoints::Exactness,
    verification: Option<&str>,
    share: bool,
) -> Option<rdkafka::message::OwnedHeaders> {
    use crate::kafka::checkpoints::{GROUP_TYPE_HEADER, SHARE_GROUP, TRANSLATION_HEADER};
    use rdkafka::message::Header;
    let translation = exactness.header_value();
    let said = [
        (TRANSLATION_HEADER, translation.as_deref()),
        (crate::verify::header::VERIFICATION_HEADER, verification),
        (GROUP_TYPE_HEADER, share.then_some(SHARE_GROUP)),
    ];
    said.into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .fold(
            None,
            |headers: Option<rdkafka::message::OwnedHeaders>, (key, value)| {
                Some(headers.unwrap_or_default().insert(Header {
                    key,
                    value: Some(value),
                }))
            },
        )
}
