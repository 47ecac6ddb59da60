//! The engine's second feed ([`super::delivery::FetchedBatches`]): a thread that fetches whole
//! batches with a [`Fetcher`] on the source, moved by the copy thread's commands, handing each
//! round on through a bounded channel.
//!
//! Fetching has a thread of its own so that a round waiting for the source (a far region, a
//! leader that holds the fetch for `max_wait`) and a write waiting for the target overlap
//! instead of adding up. Every partition is fetched under the generation the copy thread gave
//! it when it last moved it; what comes back carries that generation, so a round that was out
//! while a partition was moved or given up is recognised and dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use mirrorflow_conn::fetcher::{Fetched, PartitionTrouble};
use mirrorflow_conn::{Cluster, FetchLimits, Fetcher};

use super::timing::TimeSplit;

/// Rounds waiting for the copy thread: with the writer's own bound, what a replica holds is
/// about this many fetch answers.
const ROUNDS_QUEUED: usize = 2;
/// How long the thread waits for a command while it has nothing to fetch.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// What the copy thread asks of the fetching thread.
#[derive(Debug)]
pub enum Command {
    /// Fetch `topic`'s `partition` from `offset` on, under `generation`.
    Fetch {
        topic: String,
        partition: i32,
        offset: i64,
        generation: u32,
    },
    /// Stop fetching it.
    Drop { topic: String, partition: i32 },
}

/// One round, each part with the generation it was fetched under.
#[derive(Debug, Default)]
pub struct Tagged {
    pub fetched: Vec<(u32, Fetched)>,
    pub troubles: Vec<(u32, PartitionTrouble)>,
    pub failure: Option<String>,
}

impl Tagged {
    /// The batches' bytes.
    pub fn bytes(&self) -> usize {
        (self.fetched.iter())
            .flat_map(|(_, f)| f.batches.iter())
            .map(|b| b.len())
            .sum()
    }
}

/// The copy thread's end: commands out, rounds in. Dropping it stops the thread.
pub struct FetchThread {
    pub commands: mpsc::Sender<Command>,
    pub rounds: Receiver<Tagged>,
}

impl FetchThread {
    pub fn spawn(source: Cluster, limits: FetchLimits, name: String) -> std::io::Result<Self> {
        let (commands, command_rx) = mpsc::channel();
        let (round_tx, rounds) = mpsc::sync_channel(ROUNDS_QUEUED);
        let span = tracing::Span::current();
        std::thread::Builder::new().name(name).spawn(move || {
            let _in = span.enter();
            run(Fetcher::new(source, limits), &command_rx, &round_tx);
        })?;
        Ok(FetchThread { commands, rounds })
    }

    /// Gives the thread a command. One for a thread that ended is dropped: the copy thread
    /// learns of the end from the rounds channel.
    pub fn send(&self, command: Command) {
        // An error only says the thread ended.
        let _ = self.commands.send(command);
    }
}

fn run(mut fetcher: Fetcher, commands: &Receiver<Command>, rounds: &SyncSender<Tagged>) {
    let mut generations: HashMap<(Arc<str>, i32), u32> = HashMap::new();
    let mut timing = TimeSplit::new("fetch", ["fetching", "handing over"]);
    loop {
        // Commands first: a round never fetches a partition the copy thread gave up before it.
        loop {
            let next = if generations.is_empty() {
                match commands.recv_timeout(IDLE_WAIT) {
                    Ok(c) => Ok(c),
                    Err(RecvTimeoutError::Timeout) => Err(TryRecvError::Empty),
                    Err(RecvTimeoutError::Disconnected) => Err(TryRecvError::Disconnected),
                }
            } else {
                commands.try_recv()
            };
            match next {
                Ok(Command::Fetch {
                    topic,
                    partition,
                    offset,
                    generation,
                }) => {
                    fetcher.assign(&topic, partition, offset);
                    generations.insert((Arc::from(topic.as_str()), partition), generation);
                }
                Ok(Command::Drop { topic, partition }) => {
                    fetcher.unassign(&topic, partition);
                    generations.remove(&(Arc::from(topic.as_str()), partition));
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        if generations.is_empty() {
            continue;
        }
        let fetching = Instant::now();
        let round = fetcher.round();
        timing.spent(0, fetching);
        let tag = |topic: &Arc<str>, partition: i32| {
            generations
                .get(&(topic.clone(), partition))
                .copied()
                .unwrap_or(0)
        };
        let tagged = Tagged {
            fetched: (round.fetched.into_iter())
                .map(|f| (tag(&f.topic, f.partition), f))
                .collect(),
            troubles: (round.troubles.into_iter())
                .map(|t| (tag(&t.topic, t.partition), t))
                .collect(),
            failure: round.failure,
        };
        if tagged.fetched.is_empty() && tagged.troubles.is_empty() && tagged.failure.is_none() {
            timing.round(0);
            continue;
        }
        let bytes = tagged.bytes();
        let handing = Instant::now();
        if rounds.send(tagged).is_err() {
            return; // the copy thread is gone
        }
        timing.spent(1, handing);
        timing.round(bytes);
    }
}
