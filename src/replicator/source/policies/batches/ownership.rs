//! Partitions coming and going: each starts where its stored position, checked against both
//! logs, says; one given up is settled first. The consumer fetches none of them (the engine
//! pauses what this policy is assigned, [`Owner::PAUSE_ASSIGNED`]); the fetching thread does.

use rdkafka::{Offset, TopicPartitionList};

use super::*;
use crate::replicator::source::continuity::Resume;
use crate::replicator::source::engine::rebalance::{self, Owner};

impl Owner for Batches {
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
        while self.shared.read_positions().is_err() {
            if self.shared.shutdown.is_cancelled() {
                return;
            }
            std::thread::sleep(backoff.next_delay());
        }
        let fresh: Vec<(String, i32, String)> = rebalance::partitions(tpl)
            .into_iter()
            .filter(|(t, p)| self.slots.index(t, *p).is_none())
            .map(|(t, p)| {
                let remote = self.shared.remote_topic(&t);
                (t, p, remote)
            })
            .collect();
        let resumes = continuity::resume_all(&self.shared.positions, &self.shared.probe, &fresh);
        for ((topic, partition, remote), r) in fresh.into_iter().zip(resumes) {
            if let Some(found) = r.gap {
                let gap = continuity::found_now(&topic, partition, found);
                self.write_gap(&gap, r.start);
            }
            let Resume { offset, start, .. } = r;
            // The consumer's own position does not matter (it fetches nothing), but it must be
            // a valid one.
            if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
            }
            let generation = self.slots.next_generation();
            let progress = Progress::new(
                TopicPartition::new(topic.clone(), partition),
                self.shared.sync_config,
                start,
            );
            let slot = Slot {
                topic,
                partition,
                remote: remote.into(),
                generation,
                progress,
                last_fault: None,
                // Fetched by the retry, which reads the log start where `offset` is not one.
                fault: Some(Fault {
                    retry_at: Instant::now(),
                    resume_from: match offset {
                        Offset::Offset(next) => Some(Frontier {
                            next,
                            downstream: start.map_or(-1, |f| f.downstream),
                        }),
                        _ => start,
                    },
                }),
                backoff: Backoff::new(RETRY_MIN, RETRY_MAX),
                stopped: false,
                too_large_since: None,
            };
            tracing::debug!(topic = %slot.topic, partition, ?offset, "partition assigned");
            self.slots.insert(slot);
        }
        self.retry_faults();
        self.report_assignment();
    }

    fn revoked(&mut self, tpl: &TopicPartitionList, lost: bool) {
        let idxs: Vec<usize> = (tpl.elements().iter())
            .filter_map(|e| self.slots.index(e.topic(), e.partition()))
            .collect();
        if !lost {
            self.persist_and_wait(&idxs);
        }
        for e in tpl.elements() {
            if let Some(slot) = self.slots.remove(e.topic(), e.partition())
                && slot.stopped
            {
                lock(&self.stops).remove(&(slot.remote.to_string(), slot.partition));
            }
            self.fetch.send(Command::Drop {
                topic: e.topic().to_string(),
                partition: e.partition(),
            });
        }
        if lost {
            // See the at-least-once policy: the slots are gone before the outstanding writes
            // end, so their answers move nothing.
            tracing::warn!(
                partitions = idxs.len(),
                "assignment lost (session timed out)"
            );
            self.drain(Duration::from_secs(5));
        }
        self.report_assignment();
    }

    type Slot = Slot;

    fn slots(&self) -> &SlotTable<Slot> {
        &self.slots
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }

    const FAILED_REBALANCE_IS_LOST: bool = false;
    const PAUSE_ASSIGNED: bool = true;
    const MODE: &str = "batches";
}
