//! Share groups (KIP-932) checkpointed like consumer groups. Where a share group's consumers
//! are is each share-partition's start offset (the first offset not yet acknowledged), kept by
//! the share coordinator, not in `__consumer_offsets`: the follower of [`super::commits`] never
//! sees it. This poller reads it with DescribeShareGroupOffsets on the project's own
//! connections (librdkafka has no call for it) every [`POLL`] and hands each start offset to
//! the loop as a commit of the group, so translation, MM2's checkpoint format, verification and
//! the status treat it as any group's position: a failover that starts the group at the
//! checkpoint skips nothing unacknowledged. It may deliver again what was acknowledged past the
//! start offset: Kafka 4.3's coordinator keeps the start offset at the first offset of the last
//! batch it acknowledged, that batch's state beside it (as `kafka-share-groups.sh` shows), and
//! the state batches are not given to clients.
//!
//! Each replica polls every share group the flow selects; the loop keeps only the commits of
//! the groups whose `__consumer_offsets` partition (where the group coordinator keeps the
//! group, by Kafka's own hash) it owns, so the replicas split share groups as they split the
//! others. A start offset keeps the time it was first seen as its commit time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mirrorflow_conn::{Cluster, ListingBounds, Options, Security};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::commits::CONSUMER_OFFSETS;
use super::events::Event;
use super::state::{Commit, group_wanted};
use crate::mm2::{NameFilter, TopicPartition};
use crate::replicator::metrics::Metrics;

/// How often start offsets are read: a share group acknowledges continuously, so its position
/// is polled, at a fraction of MM2's 60 s emission interval.
pub const POLL: Duration = Duration::from_secs(5);
/// At most this many share groups are read per poll (sorted by name); the rest wait.
pub const MAX_SHARE_GROUPS: usize = 500;
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// An answer larger than this ends the connection (a hostile broker's, not a group's).
const MAX_FRAME: usize = 8 << 20;
/// At most this many brokers are asked for their groups, and this many bytes of names kept.
const LISTED_BROKERS: usize = 256;
const LISTED_BYTES: usize = 8 << 20;
/// A failing poll is logged once in this many.
const WARN_EVERY: u32 = 12;

/// Kafka's partition of `__consumer_offsets` for `group` among `partitions`: Java's
/// `String.hashCode` (UTF-16 code units), its absolute value (`Integer.MIN_VALUE` is 0), modulo
/// the count.
pub fn coordinator_partition(group: &str, partitions: i32) -> i32 {
    let hash = group.encode_utf16().fold(0_i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    });
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % partitions.max(1)
}

/// What the poller last told the loop, per group: each pair's start offset and when it was
/// first seen there.
#[derive(Default)]
struct Told(BTreeMap<String, BTreeMap<TopicPartition, (i64, i64)>>);

impl Told {
    /// The loop's events for `group`'s start offsets now: every pair (the loop drops those of
    /// groups it does not own, and a replica that comes to own one learns it at the next poll),
    /// with the time the offset was first seen, and a deletion for each pair gone.
    fn events(
        &mut self,
        group: &str,
        co_partition: i32,
        starts: BTreeMap<TopicPartition, i64>,
        now_ms: i64,
    ) -> Vec<Event> {
        let before = self.0.remove(group).unwrap_or_default();
        let mut events = Vec::with_capacity(starts.len());
        let mut now = BTreeMap::new();
        for (tp, offset) in starts {
            let seen = match before.get(&tp) {
                Some(&(o, seen)) if o == offset => seen,
                _ => now_ms,
            };
            now.insert(tp.clone(), (offset, seen));
            events.push(Event::Commit {
                co_partition,
                group: group.to_owned(),
                tp,
                commit: Some(Commit {
                    offset,
                    metadata: String::new(),
                    commit_timestamp_ms: seen,
                    live: false,
                }),
            });
        }
        events.extend(
            before
                .into_keys()
                .filter(|tp| !now.contains_key(tp))
                .map(|tp| Event::Commit {
                    co_partition,
                    group: group.to_owned(),
                    tp,
                    commit: None,
                }),
        );
        if !now.is_empty() {
            self.0.insert(group.to_owned(), now);
        }
        events
    }

    /// Deletions for every pair of the groups no longer listed.
    fn forget_except(&mut self, listed: &[String], co_partitions: i32) -> Vec<Event> {
        let gone: Vec<String> = (self.0.keys())
            .filter(|g| !listed.contains(g))
            .cloned()
            .collect();
        let mut events = Vec::new();
        for group in gone {
            let co_partition = coordinator_partition(&group, co_partitions);
            events.extend(self.events(&group, co_partition, BTreeMap::new(), 0));
        }
        events
    }
}

/// The start offsets of an answer that are positions: no error, not -1 (none kept yet).
pub struct Poller {
    pub bootstrap: String,
    pub security: Security,
    pub client_id: String,
    pub groups: NameFilter,
    pub metrics: Metrics,
}

impl Poller {
    /// Starts the poller of `ctx`'s flow, with its principal on the source.
    pub fn spawn_for(
        ctx: &crate::replicator::context::Context,
        events: mpsc::Sender<Event>,
        shutdown: CancellationToken,
    ) {
        let flow = &ctx.flow;
        Poller {
            bootstrap: flow.spec.source.bootstrap_servers.clone(),
            security: flow.own_security.source.clone(),
            client_id: format!("mirrorflow-{}-share-groups", flow.name.replace('/', ".")),
            groups: flow.groups.clone(),
            metrics: ctx.metrics.clone(),
        }
        .spawn(events, shutdown);
    }

    /// Polls until `shutdown` or the loop is gone, on a thread of its own (the calls block).
    pub fn spawn(self, events: mpsc::Sender<Event>, shutdown: CancellationToken) {
        let span = tracing::Span::current();
        let spawned = std::thread::Builder::new()
            .name("share-groups".into())
            .spawn(move || {
                let _in = span.enter();
                self.run(&events, &shutdown);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "share groups are not checkpointed: no thread to poll them");
        }
    }

    fn run(self, events: &mpsc::Sender<Event>, shutdown: &CancellationToken) {
        let mut told = Told::default();
        let mut cluster = None;
        let mut failures = 0_u32;
        while !shutdown.is_cancelled() && !events.is_closed() {
            let started = Instant::now();
            match self.poll_once(&mut cluster, &mut told) {
                Ok(batch) => {
                    failures = 0;
                    for event in batch {
                        if events.blocking_send(event).is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    cluster = None;
                    self.metrics
                        .errors
                        .with_label_values(&["checkpoint", "share_groups"])
                        .inc();
                    if failures.is_multiple_of(WARN_EVERY) {
                        tracing::warn!(error = %e, "could not read the source's share groups; their checkpoints wait");
                    }
                    failures = failures.saturating_add(1);
                }
            }
            let wait = POLL.saturating_sub(started.elapsed());
            let until = Instant::now() + wait;
            while Instant::now() < until && !shutdown.is_cancelled() {
                std::thread::sleep(Duration::from_millis(200).min(wait));
            }
        }
    }

    fn poll_once(
        &self,
        cluster: &mut Option<Cluster>,
        told: &mut Told,
    ) -> Result<Vec<Event>, mirrorflow_conn::ConnError> {
        if cluster.is_none() {
            let options = Options {
                client_id: self.client_id.clone(),
                timeout: IO_TIMEOUT,
                max_frame: MAX_FRAME,
                // Replicators run in the flow's namespace; their egress is the NetworkPolicy's.
                address_check: None,
            };
            *cluster = Some(Cluster::new(
                &self.bootstrap,
                self.security.clone(),
                options,
            )?);
        }
        let Some(c) = cluster.as_mut() else {
            return Ok(Vec::new());
        };
        let mut groups: Vec<String> = (c.list_groups(ListingBounds {
            brokers: LISTED_BROKERS,
            bytes: LISTED_BYTES,
            deadline: Instant::now() + IO_TIMEOUT,
        })?)
        .into_iter()
        .filter(|g| g.protocol_type == "share" && group_wanted(&self.groups, &g.group))
        .map(|g| g.group)
        .collect();
        groups.sort();
        groups.dedup();
        groups.truncate(MAX_SHARE_GROUPS);
        let co_partitions = (c.metadata(&[CONSUMER_OFFSETS])?.topics.iter())
            .find(|t| t.name == CONSUMER_OFFSETS)
            .map_or(0, |t| t.partitions.len());
        let co_partitions = i32::try_from(co_partitions).unwrap_or(i32::MAX);
        if co_partitions == 0 {
            return Ok(Vec::new());
        }
        let mut out = vec![Event::ShareGroups(groups.iter().cloned().collect())];
        out.extend(told.forget_except(&groups, co_partitions));
        let now_ms = crate::clock::now_ms();
        for group in &groups {
            let answer = c.share_group_offsets(group)?;
            // A group listed a moment ago and gone now has none: nothing to checkpoint.
            let starts = match answer.starts() {
                Ok(starts) => (starts.into_iter())
                    .map(|(topic, partition, start)| (TopicPartition::new(topic, partition), start))
                    .collect(),
                Err(refused) => {
                    tracing::debug!(group, error = %refused.error, message = refused.message, "a share group's start offsets were refused");
                    continue;
                }
            };
            let co_partition = coordinator_partition(group, co_partitions);
            out.extend(told.events(group, co_partition, starts, now_ms));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_land_in_the_partition_kafka_gives_them() {
        // Java: Math.abs("orders-queue".hashCode()) % 50, and "".hashCode() == 0.
        assert_eq!(coordinator_partition("", 50), 0);
        assert_eq!(coordinator_partition("a", 50), 97 % 50);
        assert_eq!(coordinator_partition("ab", 50), (97 * 31 + 98) % 50);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE: Kafka's abs makes it 0.
        assert_eq!(coordinator_partition("polygenelubricants", 50), 0);
        // Past the BMP: two UTF-16 units, as Java counts them.
        let h = (0xd83d_i32 * 31).wrapping_add(0xde00);
        assert_eq!(coordinator_partition("\u{1f600}", 7), h.abs() % 7);
    }

    /// `group/topic`, partition, and the commit's (offset, time) or `None` for a deletion.
    type Said = (String, i32, Option<(i64, i64)>);

    fn commits(events: &[Event]) -> Vec<Said> {
        (events.iter())
            .filter_map(|e| match e {
                Event::Commit {
                    tp, commit, group, ..
                } => Some((
                    format!("{group}/{}", tp.topic),
                    tp.partition,
                    commit.as_ref().map(|c| (c.offset, c.commit_timestamp_ms)),
                )),
                _ => None,
            })
            .collect()
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("orders", p)
    }

    #[test]
    fn a_start_offset_keeps_the_time_it_was_first_seen_and_a_gone_pair_is_deleted() {
        let mut told = Told::default();
        let first = told.events("q", 3, BTreeMap::from([(tp(0), 5), (tp(1), 9)]), 1_000);
        assert_eq!(
            commits(&first),
            [
                ("q/orders".into(), 0, Some((5, 1_000))),
                ("q/orders".into(), 1, Some((9, 1_000)))
            ]
        );
        let second = told.events("q", 3, BTreeMap::from([(tp(0), 5), (tp(2), 1)]), 2_000);
        assert_eq!(
            commits(&second),
            [
                ("q/orders".into(), 0, Some((5, 1_000))),
                ("q/orders".into(), 2, Some((1, 2_000))),
                ("q/orders".into(), 1, None)
            ]
        );
        let gone = told.forget_except(&["other".into()], 50);
        assert_eq!(
            commits(&gone),
            [("q/orders".into(), 0, None), ("q/orders".into(), 2, None)]
        );
        assert!(told.forget_except(&[], 50).is_empty(), "told once");
    }
}
