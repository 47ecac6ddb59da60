use proptest::prelude::*;

use super::*;

const NOT_LEADER: ErrorCode = ErrorCode::NOT_LEADER_OR_FOLLOWER;
const TIMED_OUT: ErrorCode = ErrorCode(7);
const UNKNOWN_PRODUCER: ErrorCode = ErrorCode(59);
const TOO_LARGE: ErrorCode = ErrorCode(10);

fn sent(s: &mut Sequencer<&'static str>, records: i32, token: &'static str) -> Ticket {
    s.assign(records, token).expect("room").1
}

#[test]
fn batches_take_consecutive_sequences_under_the_producer() {
    let mut s = Sequencer::new(42, 3);
    let (stamp, ticket) = s.assign(10, "a").expect("room");
    assert_eq!(
        stamp,
        Stamp {
            producer_id: 42,
            producer_epoch: 3,
            base_sequence: 0,
            transactional: false
        }
    );
    assert_eq!(ticket.base_sequence, 0);
    assert_eq!(s.assign(5, "b").expect("room").0.base_sequence, 10);
    assert_eq!(s.assign(1, "c").expect("room").0.base_sequence, 15);
}

#[test]
fn at_most_five_batches_are_unacknowledged() {
    let mut s = Sequencer::new(1, 0);
    for _ in 0..MAX_IN_FLIGHT {
        assert!(s.assign(1, "x").is_some());
    }
    assert!(!s.has_room());
    assert!(s.assign(1, "x").is_none());
    let first = Ticket {
        producer_id: 1,
        producer_epoch: 0,
        base_sequence: 0,
        attempt: 0,
    };
    assert!(matches!(
        s.answer(first, ErrorCode::NONE, 7),
        Answer::Written { .. }
    ));
    assert!(s.has_room());
}

#[test]
fn the_first_batch_of_a_producer_goes_alone_until_acknowledged() {
    let mut s = Sequencer::new(1, 0);
    assert!(s.may_send());
    let a = sent(&mut s, 2, "a");
    assert!(
        !s.may_send(),
        "the broker would take a later batch at any sequence"
    );
    assert_eq!(s.answer(a, NOT_LEADER, -1), Answer::Resend(NOT_LEADER));
    let again = s.resend();
    assert_eq!(again.len(), 1);
    let a2 = again[0].1;
    assert!(!s.may_send(), "the resend is still the only one out");
    assert!(matches!(
        s.answer(a2, ErrorCode::NONE, 0),
        Answer::Written { token: "a", .. }
    ));
    for _ in 0..MAX_IN_FLIGHT {
        assert!(s.may_send());
        sent(&mut s, 1, "b");
    }
    assert!(
        !s.may_send(),
        "at most five once the broker knows the producer"
    );
}

#[test]
fn answers_acknowledge_in_order_with_the_target_offset() {
    let mut s = Sequencer::new(1, 0);
    let a = sent(&mut s, 3, "a");
    let b = sent(&mut s, 3, "b");
    assert_eq!(
        s.answer(a, ErrorCode::NONE, 100),
        Answer::Written {
            token: "a",
            base_offset: Some(100)
        }
    );
    assert_eq!(
        s.answer(b, ErrorCode::DUPLICATE_SEQUENCE_NUMBER, -1),
        Answer::Written {
            token: "b",
            base_offset: None
        },
        "a duplicate is written, at an offset the broker does not repeat"
    );
    assert_eq!(s.unacknowledged(), 0);
    assert_eq!(s.answer(a, ErrorCode::NONE, 100), Answer::Stale);
}

#[test]
fn a_moved_leader_sends_every_unacknowledged_batch_again_with_its_sequence() {
    let mut s = Sequencer::new(1, 0);
    let a = sent(&mut s, 3, "a");
    let b = sent(&mut s, 4, "b");
    assert_eq!(s.answer(a, NOT_LEADER, -1), Answer::Resend(NOT_LEADER));
    let again = s.resend();
    let resent: Vec<(i32, &str)> = again
        .iter()
        .map(|(stamp, _, token)| (stamp.base_sequence, **token))
        .collect();
    assert_eq!(resent, [(0, "a"), (3, "b")]);
    let (a2, b2) = (again[0].1, again[1].1);
    assert_eq!(
        s.answer(b, NOT_LEADER, -1),
        Answer::Stale,
        "the first attempt's answers no longer count"
    );
    assert!(matches!(
        s.answer(a2, ErrorCode::NONE, 50),
        Answer::Written { token: "a", .. }
    ));
    assert!(matches!(
        s.answer(b2, ErrorCode::NONE, 53),
        Answer::Written { token: "b", .. }
    ));
    assert_eq!(
        s.assign(1, "c").expect("room").0.base_sequence,
        7,
        "sequences go on after a resend"
    );
}

#[test]
fn a_timed_out_batch_that_was_written_is_a_duplicate_when_sent_again() {
    let mut s = Sequencer::new(1, 0);
    let a = sent(&mut s, 2, "a");
    let b = sent(&mut s, 2, "b");
    assert_eq!(s.answer(a, TIMED_OUT, -1), Answer::Resend(TIMED_OUT));
    let again = s.resend();
    let (a2, b2) = (again[0].1, again[1].1);
    assert_eq!(s.answer(b, ErrorCode::NONE, 12), Answer::Stale);
    assert_eq!(
        s.answer(a2, ErrorCode::DUPLICATE_SEQUENCE_NUMBER, -1),
        Answer::Written {
            token: "a",
            base_offset: None
        }
    );
    assert_eq!(
        s.answer(b2, ErrorCode::NONE, 12),
        Answer::Written {
            token: "b",
            base_offset: Some(12)
        }
    );
}

#[test]
fn a_later_batch_out_of_order_behind_a_failed_one_is_resent_with_it() {
    let mut s = Sequencer::new(1, 0);
    let _a = sent(&mut s, 2, "a");
    let b = sent(&mut s, 2, "b");
    assert_eq!(
        s.answer(b, ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER, -1),
        Answer::Resend(ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER)
    );
}

#[test]
fn a_broker_that_lost_the_producer_gives_every_unacknowledged_batch_back() {
    for error in [
        ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER,
        UNKNOWN_PRODUCER,
        TOO_LARGE,
    ] {
        let mut s = Sequencer::new(1, 0);
        let a = sent(&mut s, 2, "a");
        let b = sent(&mut s, 2, "b");
        assert_eq!(
            s.answer(a, error, -1),
            Answer::Fault {
                error,
                tokens: vec!["a", "b"]
            }
        );
        assert_eq!(s.unacknowledged(), 0);
        assert_eq!(s.answer(b, ErrorCode::NONE, 9), Answer::Stale);
    }
}

#[test]
fn a_later_batch_acknowledged_before_an_earlier_one_is_a_fault() {
    let mut s = Sequencer::new(1, 0);
    let _a = sent(&mut s, 2, "a");
    let b = sent(&mut s, 2, "b");
    assert!(matches!(
        s.answer(b, ErrorCode::NONE, 9),
        Answer::Fault { tokens, .. } if tokens == ["a", "b"]
    ));
}

/// One step of a partition's life: send a batch, or the broker answers the oldest write of the
/// current attempt (written, retriable, lost producer), or an answer of an old attempt arrives.
#[derive(Debug, Clone, Copy)]
enum Step {
    Send(i32),
    Written,
    Duplicate,
    Retriable,
    Lost,
    Stale,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1i32..1000).prop_map(Step::Send),
        4 => Just(Step::Written),
        1 => Just(Step::Duplicate),
        1 => Just(Step::Retriable),
        1 => Just(Step::Lost),
        1 => Just(Step::Stale),
    ]
}

proptest! {
    /// Every batch ends exactly once, as written or given back, in the order it was sent;
    /// written batches' sequences follow each other without a gap.
    #[test]
    fn every_batch_ends_once_in_order(steps in prop::collection::vec(step(), 1..200)) {
        let mut epoch = 0i16;
        let mut s: Sequencer<u32> = Sequencer::new(7, epoch);
        let mut next_token = 0u32;
        let mut outstanding: VecDeque<(Ticket, i32)> = VecDeque::new();
        let mut ended: Vec<u32> = Vec::new();
        let mut old_tickets: Vec<Ticket> = Vec::new();
        let mut expected_sequence = 0i32;
        for step in steps {
            let oldest = outstanding.front().copied();
            match (step, oldest) {
                (Step::Send(records), _) => {
                    if let Some((stamp, ticket)) = s.assign(records, next_token) {
                        prop_assert_eq!(ticket.attempt, s.attempt());
                        outstanding.push_back((ticket, records));
                        next_token += 1;
                        prop_assert_eq!(stamp.producer_id, 7);
                    } else {
                        prop_assert_eq!(outstanding.len(), MAX_IN_FLIGHT);
                    }
                }
                (Step::Written | Step::Duplicate, Some((ticket, records))) => {
                    let (error, offset) = match step {
                        Step::Written => (ErrorCode::NONE, 10),
                        _ => (ErrorCode::DUPLICATE_SEQUENCE_NUMBER, -1),
                    };
                    match s.answer(ticket, error, offset) {
                        Answer::Written { token, .. } => {
                            prop_assert_eq!(ticket.base_sequence, expected_sequence);
                            expected_sequence = next_sequence(expected_sequence, records);
                            ended.push(token);
                        }
                        other => prop_assert!(false, "oldest write answered {:?}", other),
                    }
                    outstanding.pop_front();
                }
                (Step::Retriable, Some((ticket, _))) => {
                    prop_assert_eq!(s.answer(ticket, NOT_LEADER, -1), Answer::Resend(NOT_LEADER));
                    old_tickets.extend(outstanding.iter().map(|(t, _)| *t));
                    let again = s.resend();
                    prop_assert_eq!(again.len(), outstanding.len());
                    for ((stamp, t, _), (old, _)) in again.iter().zip(outstanding.iter_mut()) {
                        prop_assert_eq!(stamp.base_sequence, old.base_sequence);
                        *old = *t;
                    }
                }
                (Step::Lost, Some((ticket, _))) => {
                    old_tickets.extend(outstanding.iter().map(|(t, _)| *t));
                    match s.answer(ticket, UNKNOWN_PRODUCER, -1) {
                        Answer::Fault { tokens, .. } => {
                            prop_assert_eq!(tokens.len(), outstanding.len());
                            ended.extend(tokens);
                        }
                        other => prop_assert!(false, "lost producer answered {:?}", other),
                    }
                    outstanding.clear();
                    // A new epoch: sequences start again.
                    epoch += 1;
                    s = Sequencer::new(7, epoch);
                    expected_sequence = 0;
                }
                (Step::Stale, _) => {
                    if let Some(&t) = old_tickets.last() {
                        prop_assert_eq!(s.answer(t, ErrorCode::NONE, 1), Answer::Stale);
                    }
                }
                (_, None) => {}
            }
        }
        ended.extend(outstanding.iter().map(|_| u32::MAX));
        let done: Vec<u32> = ended.iter().copied().filter(|&t| t != u32::MAX).collect();
        prop_assert!(done.windows(2).all(|w| w[0] < w[1]), "ended out of order: {:?}", done);
        prop_assert_eq!(ended.len(), next_token as usize, "every batch ends once or is in flight");
    }
}
