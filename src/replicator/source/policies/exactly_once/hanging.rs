//! Transactions a fenced writer left open for good ([`crate::replicator::source::engine::hanging`])
//! on the partitions an exactly-once partition's producer writes: its remote partition (no other
//! producer writes there, so once `init_transactions` fenced the last writer, anything still
//! open there is hanging) and the positions topic (which every partition's producer writes, so
//! an open transaction there is known for hanging only when the read of it stops short).
//!
//! Both are ended by the partition's own producer aborting a filler there: the lost
//! transaction's copies and its position become invisible together, and the partition is
//! prepared again, resuming at the position committed before it. A transaction open on the
//! positions topic that no producer of this replica's partitions ends stops the read until the
//! partition that left it is prepared (by whichever replica owns it: each does the same).

use std::collections::{HashMap, HashSet};

use super::*;
use crate::kafka::log_bounds::log_bounds;
use crate::replicator::source::continuity::Ends;
use crate::replicator::source::engine::hanging::{Unread, abort_fillers, open_at_end};

/// A partition (topic, number).
type Key = (String, i32);
/// A fenced partition and the partitions its closing transaction writes a filler to.
pub type Closing = (Key, Vec<Key>);

/// How long the look-up of the remote partitions' high watermarks may take.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(5);

/// For each fenced partition (source topic, partition, remote topic), the partitions its
/// closing transaction writes a filler to: its remote partition when a transaction is open
/// there (`open_remotes`), and the positions topic's when the read of it stopped at an open
/// transaction (`positions`, by every producer: the read does not tell whose it is). Partitions
/// with nothing to close are left out.
pub fn closings(
    fenced: &[(String, i32, String)],
    open_remotes: &HashSet<(String, i32)>,
    positions: Option<&str>,
) -> Vec<Closing> {
    fenced
        .iter()
        .filter_map(|(topic, partition, remote)| {
            let remote = (remote.clone(), *partition);
            let mut close = Vec::new();
            if open_remotes.contains(&remote) {
                close.push(remote);
            }
            if let Some(positions) = positions {
                close.push((positions.to_string(), 0));
            }
            (!close.is_empty()).then(|| ((topic.clone(), *partition), close))
        })
        .collect()
}

impl ExactlyOnce {
    /// The remote partitions of `fenced` with a transaction open at their end, and where each
    /// ends for `read_committed` readers (what resuming them checks stored positions against:
    /// only their own fenced producer writes there, so it holds until they copy again).
    pub(super) fn open_remotes(
        &self,
        fenced: &[(String, i32, String)],
    ) -> (HashSet<(String, i32)>, Ends) {
        let remotes: Vec<(String, i32)> = fenced.iter().map(|(_, p, r)| (r.clone(), *p)).collect();
        let stable = self.shared.probe.target_ends(&remotes);
        let high = match log_bounds(&self.target_watermarks, &remotes, WATERMARK_TIMEOUT) {
            Ok(bounds) => bounds.into_iter().map(|(k, b)| (k, b.end)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the remote partitions' high watermarks; open transactions there are looked for at the next preparation");
                HashMap::new()
            }
        };
        let open = open_at_end(&stable, &high, Unread::Closed)
            .into_keys()
            .collect();
        (open, stable)
    }

    /// Ends the transactions [`closings`] finds open for the partitions of `fenced` (on their
    /// remote partitions in `open_remotes`; on the positions topic when its read `stopped` at
    /// one), each with its partition's producer, and prepares those partitions again; the
    /// partitions closed.
    pub(super) fn end_hanging(
        &mut self,
        fenced: &[(String, i32, String)],
        open_remotes: &HashSet<(String, i32)>,
        stopped: Option<&str>,
    ) -> HashSet<(String, i32)> {
        self.close_hanging(closings(fenced, open_remotes, stopped))
    }

    fn close_hanging(&mut self, closings: Vec<Closing>) -> HashSet<(String, i32)> {
        let mut closed = HashSet::new();
        for ((topic, partition), partitions) in closings {
            if self
                .slots
                .find(&topic, partition)
                .is_none_or(|s| s.producer.is_none())
            {
                continue;
            }
            tracing::warn!(%topic, partition, ends = ?partitions,
                "a transaction is open where the partition's fenced writer wrote (a hanging transaction: its markers were lost, as when the target broker restarts while it ends; or a newer owner's, and this producer is fenced); ending it with an aborted filler of the partition's producer, then copying again from the position committed before it");
            self.count_error("hanging_transaction");
            let shutdown = self.shared.shutdown.clone();
            let Some(slot) = self.slots.find_mut(&topic, partition) else {
                continue;
            };
            let ended = slot
                .producer
                .as_ref()
                .map(|producer| abort_fillers(producer, &partitions, &shutdown, CALL_TIMEOUT));
            match ended {
                Some(Ok(())) => tracing::info!(%topic, partition, ends = ?partitions,
                    "ended the transaction left open: aborted"),
                Some(Err(e)) => {
                    tracing::warn!(%topic, partition, error = %e, "ending the open transaction failed; the partition's producer is replaced and it is tried again");
                    // A producer in doubt is replaced: the next one's init fences it.
                    slot.producer = None;
                }
                None => {}
            }
            slot.prepare_after(Instant::now());
            closed.insert((topic, partition));
        }
        closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fenced() -> Vec<(String, i32, String)> {
        vec![
            ("t".into(), 0, "src.t".into()),
            ("t".into(), 1, "src.t".into()),
        ]
    }

    #[test]
    fn an_open_remote_partition_is_closed_by_its_own_partition_only() {
        let open: HashSet<_> = [("src.t".to_string(), 1)].into();
        let got = closings(&fenced(), &open, None);
        assert_eq!(got, vec![(("t".into(), 1), vec![("src.t".into(), 1)])]);
    }

    #[test]
    fn a_stopped_positions_read_is_closed_by_every_fenced_producer_with_its_own_remote() {
        let open: HashSet<_> = [("src.t".to_string(), 0)].into();
        let got = closings(&fenced(), &open, Some("positions"));
        assert_eq!(
            got,
            vec![
                (
                    ("t".into(), 0),
                    vec![("src.t".into(), 0), ("positions".into(), 0)]
                ),
                (("t".into(), 1), vec![("positions".into(), 0)]),
            ]
        );
    }

    #[test]
    fn nothing_open_closes_nothing() {
        assert!(closings(&fenced(), &HashSet::new(), None).is_empty());
    }
}
