//! Continuous, sampled verification of the checkpoints this replica writes, on the records
//! themselves: for a checkpoint (group, target partition, upstream U, downstream D), the
//! target's record at D against the source's around U, judged by the drill's rules
//! ([`crate::verify::outcome`]).
//!
//! The loop picks the checkpoints ([`sampler`]: each group-partition at most once per
//! `spec.checkpoints.verifyInterval`, at most [`PER_MINUTE`] a minute per flow shared by its
//! replicas) and hands them to a thread of their own ([`spawn`]), whose blocking reads
//! ([`read`]) never hold the loop. Read-only on both clusters, with the flow's own principal:
//! no group joins, no commits. The outcome goes back to the loop, which writes it on the
//! checkpoint record it verified ([`crate::verify::header`]) when that is still the latest.

pub mod read;
pub mod sampler;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use tokio::sync::mpsc;

use self::read::{ReadFailure, Reader, Span};
use super::Event;
use crate::flow::Flow;
use crate::kafka::checkpoints::Exactness;
use crate::mm2::{Checkpoint, TopicPartition};
use crate::verify::header::Verification;
use crate::verify::judge::Around;
use crate::verify::outcome::{Outcome, Unverifiable, classify};

/// Verifications a minute per flow, at most (two reads each), shared by its replicas.
pub const PER_MINUTE: u32 = 1000;
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
}

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
    let replicas = u32::try_from(replicas).unwrap_or(1).max(1);
    PER_MINUTE.div_ceil(replicas)
}

/// Starts the verifier thread for `flow`; `None` (logged) when its connections cannot be made
/// (a mechanism the project's connections do not speak).
pub fn spawn(flow: &Flow, events: mpsc::Sender<Event>) -> Option<Verifier> {
    let (source, target) = match &flow.batch_security {
        Some(s) => (s.source.clone(), s.target.clone()),
        // The same principal as the loops', in the form the probe's own connections read.
        None => (
            crate::status::tails::conn_security(&flow.source_probe_client, false)?,
            crate::status::tails::conn_security(&flow.target_probe_client, false)?,
        ),
    };
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
            run(&mut readers, &rx, &events, &counter);
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
    events: &mpsc::Sender<Event>,
    in_flight: &AtomicUsize,
) {
    while let Ok(job) = jobs.recv() {
        let outcome = verify(source, target, &job);
        in_flight.fetch_sub(1, Ordering::Relaxed);
        let verification = Verification {
            at_ms: crate::clock::now_ms(),
            upstream: job.checkpoint.upstream_offset,
            downstream: job.checkpoint.downstream_offset,
            outcome,
        };
        // The loop ended: nobody wants the rest.
        if events
            .blocking_send(Event::Verified(Box::new(Verified { job, verification })))
            .is_err()
        {
            return;
        }
    }
}

/// Reads both sides of `job`'s checkpoint and judges it.
pub fn verify(source: &mut Reader, target: &mut Reader, job: &Job) -> Outcome {
    let cp = &job.checkpoint;
    let allowed = i64::try_from(job.exactness.max_replay()).unwrap_or(i64::MAX);
    let back = allowed.saturating_add(SLACK).min(MAX_BACK);
    let up = cp.upstream_offset;
    let down = cp.downstream_offset;
    let failed = |f: ReadFailure, unreadable: Unverifiable| {
        Outcome::Unverifiable(match f {
            ReadFailure::TooLarge => Unverifiable::TooLarge,
            ReadFailure::Corrupt => Unverifiable::Corrupt,
            ReadFailure::Unreadable => unreadable,
        })
    };
    let t = &cp.topic_partition;
    let target_read = target.read(
        &t.topic,
        t.partition,
        Span {
            from: down.saturating_sub(TARGET_BACK),
            past: down,
            wanted: 1,
        },
    );
    let target_window = match target_read {
        Ok(w) => w,
        Err(f) => return failed(f, Unverifiable::TargetUnreadable),
    };
    let source_read = source.read(
        &job.source.topic,
        job.source.partition,
        Span {
            from: up.saturating_sub(back),
            past: up,
            wanted: FORWARD,
        },
    );
    let source_window = match source_read {
        Ok(w) => w,
        Err(f) => return failed(f, Unverifiable::SourceUnreadable),
    };
    let first = target_window
        .records
        .iter()
        .find(|(o, _)| *o >= down)
        .copied();
    if first.is_none() && !target_window.to_end {
        return Outcome::Unverifiable(Unverifiable::Window);
    }
    let around = Around {
        committed: up,
        source: source_window.records,
        source_to_end: source_window.to_end,
        first,
        before: target_window
            .records
            .iter()
            .rfind(|(o, _)| *o < down)
            .copied(),
    };
    classify(&around, allowed, source_window.from)
}

impl super::Core<'_> {
    /// The checkpoints that may be verified: this replica's groups' latest checkpoints that
    /// are at the group's commit (one behind it is about to be replaced), as (group, target
    /// partition) with the source partition.
    pub(in crate::replicator::checkpoint) fn verify_candidates(
        &self,
    ) -> Vec<(sampler::Pair, TopicPartition)> {
        let mut out = Vec::new();
        for (group, commits) in self.commits.groups() {
            for (source, commit) in commits {
                let Some(target) = self.naming.target_partition(source) else {
                    continue;
                };
                if self
                    .tracker
                    .last(group, &target)
                    .is_some_and(|(up, _)| up == commit.offset)
                {
                    out.push(((group.clone(), target), source.clone()));
                }
            }
        }
        out
    }

    /// The job that verifies the latest checkpoint of `group` on `target`, if it is still at
    /// the commit on `source`.
    pub(in crate::replicator::checkpoint) fn verify_job(
        &self,
        group: &str,
        target: &TopicPartition,
        source: &TopicPartition,
    ) -> Option<Job> {
        let commit = self.commits.get(group, source)?;
        let (up, down) = self.tracker.last(group, target)?;
        if up != commit.offset {
            return None;
        }
        let exactness = match self.conservative.max_replay(group, target) {
            Some(max_replay) => Exactness::Conservative { max_replay },
            None => Exactness::Exact,
        };
        Some(Job {
            source: source.clone(),
            checkpoint: Checkpoint {
                group: group.to_owned(),
                topic_partition: target.clone(),
                upstream_offset: up,
                downstream_offset: down,
                metadata: commit.metadata.clone(),
            },
            exactness,
        })
    }
}
