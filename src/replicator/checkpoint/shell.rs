//! The checkpoint loop's I/O around [`Core`]: checkpoint writes, metrics, readiness and the
//! group sync task's channel.

use super::*;

/// The loop's I/O around [`Core`]: checkpoint writes, metrics, readiness and the group sync
/// task's channel.
pub(super) struct Shell<'a> {
    pub(super) ctx: Arc<Context>,
    pub(super) topic: String,
    pub(super) producer: AckedProducer,
    pub(super) target_reach: Arc<Reachability>,
    pub(super) group_views: Option<mpsc::Sender<GroupView>>,
    pub(super) core: Core<'a>,
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
        let mut pending = Vec::with_capacity(batch.len());
        for due in batch {
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
            let header = due.exactness.header_value().map(|value| {
                rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                    key: crate::kafka::checkpoints::TRANSLATION_HEADER,
                    value: Some(value.as_str()),
                })
            });
            let delivery = self.producer.send_with_headers(
                &self.topic,
                &record.key,
                Some(&record.value),
                None,
                header,
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
        // Keep coverage changes flowing to the group sync task even without new checkpoints.
        if self.core.has_group_views() {
            self.send_group_views();
        }
    }
}
