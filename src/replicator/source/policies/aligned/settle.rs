//! The pure step of the aligned copy: the target's answers to plain writes applied to the owned
//! partitions, with no I/O. A record that landed where it had to moves its partition on (and
//! may ask for an offset sync); one that landed elsewhere broke alignment; a failed write
//! faults its partition; a filler moves nothing but its queue.

use std::time::Duration;

use super::slot::{AlignedSlot, LOG_START_FILLER};
use crate::kafka::positions::Frontier;
use crate::mm2::OffsetSync;
use crate::replicator::source::engine::send::Ack;
use crate::replicator::source::engine::slots::{SlotTable, unpack};

/// What the answers do ([`settle`]).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Settled {
    /// Offset syncs to write: (slot, its generation, the sync).
    pub syncs: Vec<(usize, u32, OffsetSync)>,
    /// Records that landed off their source offset: (slot, where it had to land, where it did).
    pub misaligned: Vec<(usize, i64, i64)>,
    /// Writes the target refused: (slot, why).
    pub failed: Vec<(usize, String)>,
    /// Error kinds to count: failed writes of positions or the log-start filler.
    pub errors: Vec<&'static str>,
    /// Records and bytes copied.
    pub copied: (u64, u64),
    /// The target acknowledged a record.
    pub delivered: bool,
}

/// Applies `acks` (in the order they came) to `slots` at `now` (the sync policies' clock).
/// Answers for a slot of another generation are ignored.
pub(super) fn settle(slots: &mut SlotTable<AlignedSlot>, acks: &[Ack], now: Duration) -> Settled {
    let mut settled = Settled::default();
    for ack in acks {
        let (idx, generation, is_position) = unpack(ack.opaque);
        if is_position {
            if ack.result.is_err() {
                // The fill itself is checked afterwards by the remote partition's end.
                settled.errors.push(match ack.opaque == LOG_START_FILLER {
                    true => "log_start_filler",
                    false => "positions",
                });
            }
            continue;
        }
        let Some(slot) = slots.get_mut(idx).filter(|s| s.generation == generation) else {
            continue;
        };
        let Some(sent) = slot.in_flight.pop_front() else {
            continue;
        };
        let landed = match &ack.result {
            Ok(landed) => landed.offset,
            Err(e) => {
                settled.failed.push((idx, e.to_string()));
                continue;
            }
        };
        settled.delivered = true;
        if sent.expected >= 0 && landed != sent.expected {
            settled.misaligned.push((idx, sent.expected, landed));
        }
        if sent.source < 0 {
            continue;
        }
        let next = (slot.latest).map_or(sent.source + 1, |l| l.next.max(sent.source + 1));
        slot.latest = Some(Frontier {
            next,
            downstream: landed,
        });
        settled.copied.0 += 1;
        settled.copied.1 += sent.bytes;
        if let Some(sync) = slot.sync.observe(sent.source, landed, now) {
            settled.syncs.push((idx, generation, sync));
        }
    }
    settled
}

#[cfg(test)]
pub(super) mod tests {

    use rdkafka::error::{KafkaError, RDKafkaErrorCode};

    use super::*;
    use crate::mm2::{SyncPolicy, SyncPolicyConfig, TopicPartition};
    use crate::replicator::backoff::Backoff;
    use crate::replicator::patience::Patience;
    use crate::replicator::source::engine::send::Landed;
    use crate::replicator::source::engine::slots::{InFlightQueue, Slot, UNOWNED, opaque};
    use crate::replicator::source::policies::aligned::slot::{AlignedPart, InFlight, State};

    /// One aligned partition `t-0` with `in_flight` written and unanswered.
    pub(in crate::replicator::source::policies::aligned) fn table(
        in_flight: &[InFlight],
    ) -> (SlotTable<AlignedSlot>, usize, u32) {
        let mut slots = SlotTable::default();
        let generation = slots.next_generation();
        let config = SyncPolicyConfig {
            max_records: 0,
            max_interval: None,
        };
        let mut queue = InFlightQueue::default();
        in_flight.iter().for_each(|s| queue.push_back(*s));
        let mut part = AlignedPart::new(
            "t".into(),
            State::Aligned,
            SyncPolicy::new(TopicPartition::new("t", 0), config),
            Patience::new(Duration::from_secs(2), Duration::from_secs(30)),
        );
        part.in_flight = queue;
        let backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        let slot = Slot::new("t".into(), 0, "a.t".into(), generation, backoff, part);
        let idx = slots.insert(slot).expect("a valid partition");
        (slots, idx, generation)
    }

    fn record(source: i64, expected: i64) -> InFlight {
        InFlight {
            source,
            expected,
            bytes: 10,
        }
    }

    fn landed(idx: usize, generation: u32, offset: i64) -> Ack {
        Ack {
            opaque: opaque(idx, generation, false),
            result: Ok(Landed {
                offset,
                timestamp: None,
            }),
        }
    }

    fn refused(idx: usize, generation: u32) -> Ack {
        Ack {
            opaque: opaque(idx, generation, false),
            result: Err(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageSizeTooLarge,
            )),
        }
    }

    #[test]
    fn the_targets_answers_move_sync_break_or_fault_each_partition() {
        struct Case {
            name: &'static str,
            sent: Vec<InFlight>,
            acks: fn(usize, u32) -> Vec<Ack>,
            /// The partition's next source offset and target offset after.
            latest: Option<(i64, i64)>,
            syncs: Vec<(i64, i64)>,
            misaligned: Vec<(i64, i64)>,
            failed: bool,
            errors: Vec<&'static str>,
            copied: (u64, u64),
        }
        let cases = [
            Case {
                name: "records landing on their offsets move the partition; the first is synced",
                sent: vec![record(5, 5), record(6, 6)],
                acks: |i, g| vec![landed(i, g, 5), landed(i, g, 6)],
                latest: Some((7, 6)),
                syncs: vec![(5, 5)],
                misaligned: vec![],
                failed: false,
                errors: vec![],
                copied: (2, 20),
            },
            Case {
                name: "a record landing elsewhere broke alignment, and is still copied",
                sent: vec![record(5, 5)],
                acks: |i, g| vec![landed(i, g, 9)],
                latest: Some((6, 9)),
                syncs: vec![(5, 9)],
                misaligned: vec![(5, 9)],
                failed: false,
                errors: vec![],
                copied: (1, 10),
            },
            Case {
                name: "translated records land anywhere",
                sent: vec![record(5, -1)],
                acks: |i, g| vec![landed(i, g, 9)],
                latest: Some((6, 9)),
                syncs: vec![(5, 9)],
                misaligned: vec![],
                failed: false,
                errors: vec![],
                copied: (1, 10),
            },
            Case {
                name: "a filler moves its queue only",
                sent: vec![record(-1, 3), record(4, 4)],
                acks: |i, g| vec![landed(i, g, 3), landed(i, g, 4)],
                latest: Some((5, 4)),
                syncs: vec![(4, 4)],
                misaligned: vec![],
                failed: false,
                errors: vec![],
                copied: (1, 10),
            },
            Case {
                name: "a refused write faults the partition",
                sent: vec![record(5, 5)],
                acks: |i, g| vec![refused(i, g)],
                latest: None,
                syncs: vec![],
                misaligned: vec![],
                failed: true,
                errors: vec![],
                copied: (0, 0),
            },
            Case {
                name: "answers of an older generation are ignored",
                sent: vec![record(5, 5)],
                acks: |i, g| vec![landed(i, g + 1, 5)],
                latest: None,
                syncs: vec![],
                misaligned: vec![],
                failed: false,
                errors: vec![],
                copied: (0, 0),
            },
            Case {
                name: "failed position and filler writes are counted, nothing else",
                sent: vec![],
                acks: |_, _| {
                    let failed = |opaque| Ack {
                        opaque,
                        result: Err(KafkaError::MessageProduction(
                            RDKafkaErrorCode::RequestTimedOut,
                        )),
                    };
                    vec![
                        failed(opaque(0, 1, true)),
                        failed(LOG_START_FILLER),
                        failed(UNOWNED),
                    ]
                },
                latest: None,
                syncs: vec![],
                misaligned: vec![],
                failed: false,
                errors: vec!["positions", "log_start_filler", "positions"],
                copied: (0, 0),
            },
        ];
        for case in cases {
            let (mut slots, idx, generation) = table(&case.sent);
            let got = settle(&mut slots, &(case.acks)(idx, generation), Duration::ZERO);
            let slot = slots.get(idx).expect("still owned");
            let latest = slot.latest.map(|l| (l.next, l.downstream));
            assert_eq!(latest, case.latest, "{}", case.name);
            let syncs: Vec<(i64, i64)> = (got.syncs.iter())
                .map(|(_, _, s)| (s.upstream_offset, s.downstream_offset))
                .collect();
            assert_eq!(syncs, case.syncs, "{}", case.name);
            let misaligned: Vec<(i64, i64)> = got.misaligned.iter().map(|m| (m.1, m.2)).collect();
            assert_eq!(misaligned, case.misaligned, "{}", case.name);
            assert_eq!(!got.failed.is_empty(), case.failed, "{}", case.name);
            assert_eq!(got.errors, case.errors, "{}", case.name);
            assert_eq!(got.copied, case.copied, "{}", case.name);
        }
    }
}
