//! Where a partition resumes: its previous writer fenced, the remote partition's end read, the
//! log start aligned, or the partition copied on translated when alignment cannot hold there.

use std::collections::HashSet;

use super::restart::{self, Restart, Tail};
use super::write::{SetOpaque, filler, filler_headers};
use super::*;
use crate::kafka::log_bounds::LogBounds;

/// What [`Aligned::remote_ends`] read for the partitions being prepared.
struct Ends {
    sources: HashMap<(String, i32), LogBounds>,
    ends: HashMap<(String, i32), i64>,
    /// Remote partitions that end in an open transaction: their high watermark.
    open: HashMap<(String, i32), i64>,
    /// Remote partitions whose last transaction wrapping a record was aborted.
    aborted: HashSet<(String, i32)>,
    /// Remote partitions whose last transaction wrapping a record ended before its record
    /// reached them ([`tail::unwritten_wraps`]).
    unwritten: HashSet<(String, i32)>,
}

impl Aligned {
    pub(super) fn retry_unready(&mut self, consumer: &Source<Self>) {
        if self.shared.shutdown.is_cancelled() {
            return;
        }
        let now = Instant::now();
        let due: Vec<(String, i32)> = self
            .slots
            .iter()
            .filter(|(_, s)| matches!(s.state, State::Preparing { retry_at } if retry_at <= now))
            .map(|(_, s)| (s.topic.clone(), s.partition))
            .collect();
        if due.is_empty() {
            return;
        }
        for (topic, partition, offset) in self.prepare(&due) {
            if let Err(e) = rebalance::reposition(consumer, &topic, partition, offset) {
                tracing::debug!(%topic, partition, error = %e, "seek failed; retrying later");
                if let Some(idx) = self.slots.index(&topic, partition) {
                    self.prepare_again(idx, Duration::from_secs(1));
                }
            }
        }
    }

    /// Fences the partitions' previous writers, then decides where each resumes: where its
    /// remote partition ends, aligned with the source's log start first. Returns the ready
    /// ones with the source offset to read from.
    pub(super) fn prepare(&mut self, keys: &[(String, i32)]) -> Vec<(String, i32, Offset)> {
        let fenced = self.fence(keys);
        if fenced.is_empty() {
            return Vec::new();
        }
        let Some(ends) = self.remote_ends(&fenced) else {
            for (topic, partition) in &fenced {
                if let Some(idx) = self.slots.index(topic, *partition) {
                    self.prepare_again(idx, Duration::from_secs(1));
                }
            }
            return Vec::new();
        };
        (fenced.into_iter())
            .filter_map(|(topic, partition)| {
                let offset = self.resume_at(&topic, partition, &ends)?;
                Some((topic, partition, offset))
            })
            .collect()
    }

    /// Fences the previous writer of each of `keys` (its own transactional producer's
    /// initialisation); those it could not fence wait with a backoff. The fenced ones.
    fn fence(&mut self, keys: &[(String, i32)]) -> Vec<(String, i32)> {
        let mut fenced = Vec::new();
        for (topic, partition) in keys {
            let Some(slot) = self.slots.find_mut(topic, *partition) else {
                continue;
            };
            if slot.txn.is_none() {
                let mut config =
                    crate::replicator::source::policies::exactly_once::txn::producer_config(
                        &self.producer_base,
                        &slot.transactional_id,
                        None,
                    );
                // Each transaction writes a record or a few fillers and waits for them at once:
                // a linger would only add to every commit marker's copy.
                config.set("linger.ms", "0");
                let created: Result<BaseProducer<AckContext>, _> =
                    config.create_with_context(AckContext::new(self.shared.target_health.clone()));
                let ready = created.and_then(|p| p.init_transactions(CALL_TIMEOUT).map(|()| p));
                match ready {
                    Ok(p) => slot.txn = Some(p),
                    Err(e) => {
                        tracing::warn!(%topic, partition, error = %e, "cannot fence the partition's previous writer; retrying");
                        let delay = slot.backoff.next_delay();
                        slot.state = State::Preparing {
                            retry_at: Instant::now() + delay,
                        };
                        continue;
                    }
                }
            }
            fenced.push((topic.clone(), *partition));
        }
        fenced
    }

    /// The stored positions read again, the source partitions' bounds and the remote ones'
    /// ends, with which of them end in an open transaction and which in an aborted wrap;
    /// `None` when any of that could not be read (every partition tries again).
    fn remote_ends(&mut self, fenced: &[(String, i32)]) -> Option<Ends> {
        self.shared.read_positions().ok()?;
        let remotes: Vec<(String, i32)> = fenced
            .iter()
            .filter_map(|(t, p)| Some((self.slots.find(t, *p)?.remote.to_string(), *p)))
            .collect();
        let sources = self.shared.probe.source(fenced);
        let ends = self.shared.probe.target_ends(&remotes);
        let tails: Vec<((String, i32), i64)> = ends.iter().map(|(k, e)| (k.clone(), *e)).collect();
        let flow = &self.shared.ctx.flow;
        let (target, source) = (&flow.target_client, &flow.source_client);
        let copies: HashMap<(String, i32), (String, i32)> = remotes
            .iter()
            .cloned()
            .zip(fenced.iter().cloned())
            .collect();
        let settled =
            tail::open_transactions((&self.target_watermarks, &self.target_patience), &tails)
                .and_then(|open| {
                    let closed: Vec<((String, i32), i64)> = tails
                        .iter()
                        .filter(|(k, _)| !open.contains_key(k))
                        .cloned()
                        .collect();
                    let aborted = tail::aborted_wraps(target, &closed)?;
                    let unsure: Vec<tail::Copy> = closed
                        .iter()
                        .filter(|(k, _)| !aborted.contains(k))
                        .filter_map(|(k, end)| Some((k.clone(), copies.get(k)?.clone(), *end)))
                        .collect();
                    let unwritten = tail::unwritten_wraps((target, source), &unsure)?;
                    Ok((open, aborted, unwritten))
                });
        match settled {
            Ok((open, aborted, unwritten)) => Some(Ends {
                sources,
                ends,
                open,
                aborted,
                unwritten,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the ends of the remote partitions; retrying");
                None
            }
        }
    }

    /// Where one fenced partition resumes, given what [`Self::remote_ends`] read; `None` when
    /// it is not ready yet (it tries again) or waits for an open transaction to close.
    fn resume_at(&mut self, topic: &str, partition: i32, found: &Ends) -> Option<Offset> {
        let idx = self.slots.index(topic, partition)?;
        let slot = self.slots.get(idx)?;
        let remote = slot.remote.to_string();
        let (Some(bounds), Some(&end)) = (
            found.sources.get(&(topic.to_string(), partition)),
            found.ends.get(&(remote.clone(), partition)),
        ) else {
            self.prepare_again(idx, Duration::from_secs(1));
            return None;
        };
        if let Some(&high) = found.open.get(&(remote.clone(), partition)) {
            return self.open_at_end(idx, *bounds, end, high);
        }
        if let Some(slot) = self.slots.get_mut(idx) {
            slot.open_closes = 0;
        }
        let stored = self.shared.positions.get(topic, partition);
        let broke_before = self
            .shared
            .positions
            .gaps()
            .iter()
            .any(|g| g.kind.breaks_alignment() && g.topic == topic && g.partition == partition);
        let key = (remote, partition);
        let tail = if found.aborted.contains(&key) {
            Tail::AbortedWrap
        } else if found.unwritten.contains(&key) {
            Tail::UnwrittenWrap
        } else {
            Tail::Clean
        };
        let decision = restart::decide(&restart::Found {
            broke_before,
            tail,
            // Weighed here and settled by the decision, whichever it is.
            wrap_failed: self.slots.get_mut(idx)?.wrap_failed.take(),
            end,
            source: *bounds,
            stored: stored.is_some(),
        });
        match decision {
            Restart::CopyAgain { from, why } => {
                self.copy_again((topic, partition), from, end, why);
                self.resume_translated(idx, stored, *bounds, end, Some(from))
            }
            Restart::Translated { from } => self.resume_translated(idx, stored, *bounds, end, from),
            Restart::MisalignedAtStart => {
                self.misaligned_at_start(idx, bounds.start, end);
                self.resume_translated(idx, stored, *bounds, end, None)
            }
            Restart::AlignLogStart => {
                self.align_log_start(idx, end, bounds.start, stored.is_some())
            }
            Restart::Aligned => self.resume_aligned(idx, end),
        }
    }

    /// Records from source offset `at` on are not visible on the target (`why`): the break
    /// from `at` to the target's `end` is recorded (they are copied again, translated).
    fn copy_again(&mut self, (topic, partition): (&str, i32), at: i64, end: i64, why: &str) {
        let gap = continuity::found_now(topic, partition, (GapKind::Misaligned, at, end));
        tracing::warn!(%topic, partition, offset = at, target_end = end, "{why}");
        self.write_gap(&gap);
    }

    pub(super) fn resume_aligned(&mut self, idx: usize, next: i64) -> Option<Offset> {
        let config = self.shared.sync_config;
        let slot = self.slots.get_mut(idx)?;
        slot.state = State::Aligned;
        slot.next_target = next;
        slot.held = None;
        slot.latest = Some(Frontier {
            next,
            downstream: next.saturating_sub(1),
        });
        slot.stored = None;
        slot.sync = SyncPolicy::new(slot.tp(), config);
        // Source `next` is target `next` by construction, so a group committed anywhere before
        // the first record read (a compacted-away head) translates to its own number.
        slot.sync.reading_from(next, Some(next));
        slot.backoff.reset();
        tracing::debug!(topic = %slot.topic, partition = slot.partition, next, "partition ready (aligned)");
        Some(Offset::Offset(next))
    }

    /// Copying on with translated offsets, from the stored position checked against both logs,
    /// or `from` (the first record without a visible copy) when records are copied again.
    pub(super) fn resume_translated(
        &mut self,
        idx: usize,
        stored: Option<Frontier>,
        bounds: crate::kafka::log_bounds::LogBounds,
        end: i64,
        from: Option<i64>,
    ) -> Option<Offset> {
        let config = self.shared.sync_config;
        let slot = self.slots.get_mut(idx)?;
        let resume = continuity::resume(stored, Some(bounds), Some(end));
        let offset = match (from, resume.offset) {
            (Some(o), _) => Offset::Offset(o.max(bounds.start)),
            (None, o) => o,
        };
        slot.state = State::Translated;
        slot.held = None;
        slot.latest = resume.start;
        slot.sync = SyncPolicy::new(slot.tp(), config);
        if let Offset::Offset(position) = offset {
            slot.sync.reading_from(position, None);
        }
        Some(offset)
    }

    pub(super) fn misaligned_at_start(&mut self, idx: usize, at: i64, end: i64) {
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        let (topic, partition) = (slot.topic.clone(), slot.partition);
        tracing::warn!(%topic, partition, source_start = at, target_end = end,
            "the remote partition cannot be aligned with the source; translating offsets");
        let gap = continuity::found_now(&topic, partition, (GapKind::Misaligned, at, -1));
        self.write_gap(&gap);
    }

    /// The remote partition ends at `end`, before the source's log start `start`: fillers up
    /// to it, then DeleteRecords, so the next copy lands on `start`. `copied`: records had
    /// been copied before, so those between `end` and `start` are lost (recorded as a gap).
    pub(super) fn align_log_start(
        &mut self,
        idx: usize,
        end: i64,
        start: i64,
        copied: bool,
    ) -> Option<Offset> {
        let count = start.saturating_sub(end);
        let slot = self.slots.get(idx)?;
        let (topic, partition, remote) = (slot.topic.clone(), slot.partition, slot.remote.clone());
        if count > MAX_LOG_START_FILL {
            self.misaligned_at_start(idx, start, end);
            let bounds = crate::kafka::log_bounds::LogBounds { start, end: start };
            return self.resume_translated(idx, None, bounds, end, None);
        }
        tracing::info!(%topic, partition, fillers = count, "aligning the remote partition with the source's log start");
        let headers = filler_headers();
        for _ in 0..count {
            let mut record = filler(&remote, partition, &headers, None);
            record = record.set_opaque_log_start();
            loop {
                match send::offer(&self.producer, record) {
                    Offered::Queued => break,
                    Offered::Full(back) => {
                        record = back;
                        self.producer.poll(QUEUE_FULL_WAIT);
                        if self.shared.shutdown.is_cancelled() {
                            return None;
                        }
                    }
                    Offered::Refused(e) => {
                        tracing::warn!(%topic, partition, error = %e, "writing fillers failed; retrying");
                        self.prepare_again(idx, Duration::from_secs(1));
                        return None;
                    }
                }
            }
        }
        if let Err(e) = self.producer.flush(CALL_TIMEOUT) {
            tracing::warn!(%topic, partition, error = %e, "fillers unacknowledged; retrying");
            self.prepare_again(idx, Duration::from_secs(1));
            return None;
        }
        let landed = self
            .shared
            .probe
            .target_ends(&[(remote.to_string(), partition)])
            .get(&(remote.to_string(), partition))
            .copied();
        if landed != Some(start) {
            // Retried: the next round sees where the target really ends.
            self.prepare_again(idx, Duration::from_secs(1));
            return None;
        }
        let admin = self.target_admin.clone();
        let deleted = self
            .runtime
            .block_on(async move { admin.delete_before(&remote, partition, start).await });
        if let Err(e) = deleted {
            // Offsets are aligned; the fillers stay visible below the log start until a
            // retention pass removes them, which consumers reading from the start must hear.
            tracing::warn!(%topic, partition, error = %e, "deleting the fillers failed");
            self.count_error("delete_records");
            let gap =
                continuity::found_now(&topic, partition, (GapKind::FillersNotDeleted, end, start));
            self.write_gap(&gap);
        }
        if copied && end < start {
            let gap =
                continuity::found_now(&topic, partition, (GapKind::SourceTruncated, end, start));
            self.write_gap(&gap);
        }
        self.resume_aligned(idx, start)
    }
}
