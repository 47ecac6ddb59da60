//! Continuous, sampled verification of the checkpoints this replica writes, on the records
//! themselves: for a checkpoint (group, target partition, upstream U, downstream D), the
//! target's record at D against the source's around U, judged by the drill's rules
//! ([`crate::verify::outcome`]).
//!
//! The loop picks the checkpoints ([`sampler`]: each group-partition at most once per
//! `spec.checkpoints.verifyInterval`, at most [`PER_MINUTE`] a minute and [`BYTES_PER_MINUTE`]
//! read a minute per flow, shared by its replicas) and hands them to a thread of their own ([`spawn`]), whose blocking reads
//! ([`read`]) never hold the loop. Read-only on both clusters, with the flow's own principal:
//! no group joins, no commits. The outcome goes back to the loop, which writes it on the
//! checkpoint record it verified ([`crate::verify::header`]) when that is still the latest.

pub mod read;
pub mod sampler;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use self::read::{ReadFailure, Reader, Span, Window};
use crate::flow::Flow;
use crate::kafka::checkpoints::Exactness;
use crate::mm2::{Checkpoint, TopicPartition};
use crate::verify::header::Verification;
use crate::verify::judge::Around;
use crate::verify::outcome::{Outcome, Unverifiable, classify};

/// Verifications a minute per flow, at most (two reads each), shared by its replicas.
pub const PER_MINUTE: u32 = 1000;
/// Bytes the verifications' reads may bring a minute per flow, at most (both clusters), shared
/// by its replicas: a broker answers with whole batches, so where batches are large (up to
/// the 1 MB the copy writes) this binds before [`PER_MINUTE`] does.
pub const BYTES_PER_MINUTE: u64 = 128 << 20;
/// Checkpoints handed to the thread and not verified yet, at most.
pub const QUEUE: usize = 32;
/// Source offsets read before the checkpoint's upstream offset besides what its translation
/// may re-read: transaction markers and the copy's newest record before a pending one.
const SLACK: i64 = 8;
/// Source offsets read before the upstream offset, at most: a conservative translation that
/// may re-read more is judged only when the target's record lies within this.
const MAX_BACK: i64 = 256;
/// Source records read at and after the upstream offset.
const FORWARD: usize = 16;
/// Target offsets read before the downstream offset (its newest record, past markers).
const TARGET_BACK: i64 = 8;

/// One checkpoint to verify, as the loop wrote it.
#[derive(Debug, Clone)]
pub struct Job {
    /// The source partition of the commit it translates.
    pub source: TopicPartition,
    pub checkpoint: Checkpoint,
    pub exactness: Exactness,
}

/// A job done.
#[derive(Debug, Clone)]
pub struct Verified {
    pub job: Job,
    pub verification: Verification,
    /// Bytes the two reads brought from the source and from the target.
    pub read_bytes: (u64, u64),
}

/// Hands a job done to the checkpoint loop; false once the loop is gone.
pub type Report = Box<dyn Fn(Verified) -> bool + Send>;

/// The loop's end of the verifier thread.
pub struct Verifier {
    jobs: SyncSender<Job>,
    /// Jobs handed over and not finished.
    in_flight: Arc<AtomicUsize>,
}

impl Verifier {
    /// How many more jobs the thread takes now.
    pub fn room(&self) -> usize {
        QUEUE.saturating_sub(self.in_flight.load(Ordering::Relaxed))
    }

    /// Hands `job` over; false when the thread is gone or full.
    pub fn send(&self, job: Job) -> bool {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        match self.jobs.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.in_flight.fetch_sub(1, Ordering::Relaxed);
                false
            }
        }
    }
}

/// The verifications a minute this replica may make: the flow's share for one of `replicas`.
pub fn per_replica(replicas: i32) -> u32 {
    PER_MINUTE.div_ceil(replica_count(replicas))
}

/// The bytes a minute this replica's verifications may read: the flow's share.
pub fn bytes_per_replica(replicas: i32) -> u64 {
    BYTES_PER_MINUTE.div_ceil(u64::from(replica_count(replicas)))
}

fn replica_count(replicas: i32) -> u32 {
    u32::try_from(replicas).unwrap_or(1).max(1)
}

/// Starts the verifier thread for `flow`, on the project's own connections with the flow's
/// principal ([`crate::flow::OwnSecurity`]: the replicator's rules, a token endpoint on the
/// pod's own loopback allowed as librdkafka's client beside them allows it).
pub fn spawn(flow: &Flow, report: Report) -> Option<Verifier> {
    let (source, target) = (
        flow.own_security.source.clone(),
        flow.own_security.target.clone(),
    );
    let client_id = format!("mirrorflow-{}-verify", flow.name.replace('/', "."));
    let mut readers = (
        Reader::new(
            &flow.spec.source.bootstrap_servers,
            source,
            client_id.clone(),
        ),
        Reader::new(&flow.spec.target.bootstrap_servers, target, client_id),
    );
    let (jobs, rx) = sync_channel(QUEUE);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let counter = in_flight.clone();
    let span = tracing::Span::current();
    let spawned = std::thread::Builder::new()
        .name("verifier".into())
        .spawn(move || {
            let _in = span.enter();
            run(&mut readers, &rx, &report, &counter);
        });
    match spawned {
        Ok(_) => Some(Verifier { jobs, in_flight }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the verifier thread; checkpoints are not verified");
            None
        }
    }
}

fn run(
    (source, target): &mut (Reader, Reader),
    jobs: &Receiver<Job>,
    report: &Report,
    in_flight: &AtomicUsize,
) {
    while let Ok(job) = jobs.recv() {
        let started = std::time::Instant::now();
        let outcome = verify(source, target, &job);
        let read_bytes = (source.take_read_bytes(), target.take_read_bytes());
        in_flight.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(
            group = %job.checkpoint.group,
            partition = %job.checkpoint.topic_partition,
            outcome = outcome.label(),
            took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            "checkpoint verified on the records"
        );
        let verification = Verification {
            at_ms: crate::clock::now_ms(),
            upstream: job.checkpoint.upstream_offset,
            downstream: job.checkpoint.downstream_offset,
            outcome,
        };
        // The loop ended: nobody wants the rest.
        if !report(Verified {
            job,
            verification,
            read_bytes,
        }) {
            return;
        }
    }
}

/// Reads both sides of `job`'s checkpoint and judges it.
pub fn verify(source: &mut Reader, target: &mut Reader, job: &Job) -> Outcome {
    let cp = &job.checkpoint;
    let t = &cp.topic_partition;
    let (target_span, source_span) = spans(job);
    let target_read = target.read(&t.topic, t.partition, target_span);
    // Nothing more is read once the target's side cannot be.
    let source_read = match &target_read {
        Ok(_) => source.read(&job.source.topic, job.source.partition, source_span),
        Err(_) => Ok(Window::default()),
    };
    judge_reads(job, target_read, source_read)
}

/// The records to read on the target and on the source.
fn spans(job: &Job) -> (Span, Span) {
    let cp = &job.checkpoint;
    let back = allowed_reread(job).saturating_add(SLACK).min(MAX_BACK);
    (
        Span {
            from: cp.downstream_offset.saturating_sub(TARGET_BACK),
            past: cp.downstream_offset,
            wanted: 1,
        },
        Span {
            from: cp.upstream_offset.saturating_sub(back),
            past: cp.upstream_offset,
            wanted: FORWARD,
        },
    )
}

fn allowed_reread(job: &Job) -> i64 {
    i64::try_from(job.exactness.max_replay()).unwrap_or(i64::MAX)
}

/// Judges `job`'s checkpoint from what was read of both sides.
fn judge_reads(
    job: &Job,
    target: Result<Window, ReadFailure>,
    source: Result<Window, ReadFailure>,
) -> Outcome {
    let failed = |f: ReadFailure, unreadable: Unverifiable| {
        Outcome::Unverifiable(match f {
            ReadFailure::TooLarge => Unverifiable::TooLarge,
            ReadFailure::Corrupt => Unverifiable::Corrupt,
            ReadFailure::Unreadable => unreadable,
        })
    };
    let target = match target {
        Ok(w) => w,
        Err(f) => return failed(f, Unverifiable::TargetUnreadable),
    };
    let source = match source {
        Ok(w) => w,
        Err(f) => return failed(f, Unverifiable::SourceUnreadable),
    };
    let (up, down) = (
        job.checkpoint.upstream_offset,
        job.checkpoint.downstream_offset,
    );
    let first = target.records.iter().find(|(o, _)| *o >= down).copied();
    if first.is_none() && !target.to_end {
        return Outcome::Unverifiable(Unverifiable::Window);
    }
    let around = Around {
        committed: up,
        source: source.records,
        source_to_end: source.to_end,
        first,
        before: target.records.iter().rfind(|(o, _)| *o < down).copied(),
    };
    classify(&around, allowed_reread(job), source.from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::judge::Fingerprint;
    use crate::verify::outcome::Mismatch;

    /// Source 60 committed, translated to target 67 (source offsets + 7).
    fn job() -> Job {
        Job {
            source: TopicPartition::new("t", 0),
            checkpoint: Checkpoint {
                group: "g".into(),
                topic_partition: TopicPartition::new("A.t", 0),
                upstream_offset: 60,
                downstream_offset: 67,
                metadata: String::new(),
            },
            exactness: Exactness::Exact,
        }
    }

    /// Records `from..to` of the source (fingerprints are source offsets), read from `from`.
    fn source(from: i64, to: i64, to_end: bool) -> Window {
        Window {
            from,
            records: (from..to).map(|o| (o, o as Fingerprint)).collect(),
            to_end,
        }
    }

    /// The target's copies of source records `from..to`, at their offsets plus 7.
    fn target(from: i64, to: i64, to_end: bool) -> Window {
        Window {
            from: from + 7,
            records: (from..to).map(|o| (o + 7, o as Fingerprint)).collect(),
            to_end,
        }
    }

    #[test]
    fn the_spans_read_around_both_offsets_and_widen_for_a_conservative_translation() {
        let (t, s) = spans(&job());
        assert_eq!((t.from, t.past, t.wanted), (59, 67, 1));
        assert_eq!((s.from, s.past, s.wanted), (52, 60, FORWARD));
        let mut conservative = job();
        conservative.exactness = Exactness::Conservative { max_replay: 20 };
        assert_eq!(spans(&conservative).1.from, 32);
        conservative.exactness = Exactness::Conservative {
            max_replay: u64::MAX,
        };
        assert_eq!(spans(&conservative).1.from, 60 - MAX_BACK, "bounded");
    }

    #[test]
    fn what_was_read_is_judged_by_the_drills_rules() {
        let j = job();
        assert_eq!(
            judge_reads(&j, Ok(target(52, 61, false)), Ok(source(52, 76, false))),
            Outcome::Match
        );
        // The target holds the copy of source 63 at 67: three records skipped.
        let shifted = Window {
            records: (52..61).map(|o| (o + 7, (o + 3) as Fingerprint)).collect(),
            ..target(52, 61, false)
        };
        assert_eq!(
            judge_reads(&j, Ok(shifted), Ok(source(52, 76, false))),
            Outcome::Mismatch(Mismatch {
                skipped: Some(3),
                reread: Some(0)
            })
        );
        // Not copied yet: the target ends at 67 with the copy of source 59.
        assert_eq!(
            judge_reads(&j, Ok(target(52, 60, true)), Ok(source(52, 76, false))),
            Outcome::Match
        );
        // The target's read stopped before 67 without reaching its end.
        assert_eq!(
            judge_reads(&j, Ok(target(52, 58, false)), Ok(source(52, 76, false))),
            Outcome::Unverifiable(Unverifiable::Window)
        );
    }

    #[test]
    fn a_read_refused_for_size_is_too_large_not_an_allocation() {
        let j = job();
        for (target_read, source_read, want) in [
            (
                Err(ReadFailure::TooLarge),
                Ok(Window::default()),
                Unverifiable::TooLarge,
            ),
            (
                Ok(target(52, 61, false)),
                Err(ReadFailure::TooLarge),
                Unverifiable::TooLarge,
            ),
            (
                Err(ReadFailure::Corrupt),
                Ok(Window::default()),
                Unverifiable::Corrupt,
            ),
            (
                Err(ReadFailure::Unreadable),
                Ok(Window::default()),
                Unverifiable::TargetUnreadable,
            ),
            (
                Ok(target(52, 61, false)),
                Err(ReadFailure::Unreadable),
                Unverifiable::SourceUnreadable,
            ),
        ] {
            assert_eq!(
                judge_reads(&j, target_read, source_read),
                Outcome::Unverifiable(want)
            );
        }
    }

    #[test]
    fn a_replica_takes_its_share_of_the_flows_cap() {
        assert_eq!(per_replica(1), PER_MINUTE);
        assert_eq!(per_replica(3), PER_MINUTE.div_ceil(3));
        assert_eq!(per_replica(0), PER_MINUTE, "a bad count is one replica");
        assert_eq!(bytes_per_replica(1), BYTES_PER_MINUTE);
        assert_eq!(bytes_per_replica(4), BYTES_PER_MINUTE / 4);
        assert_eq!(bytes_per_replica(-2), BYTES_PER_MINUTE);
    }
}
