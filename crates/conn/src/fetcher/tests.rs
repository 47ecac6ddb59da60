use super::*;
use crate::{Options, Security};

fn fetcher() -> Fetcher {
    let options = Options {
        client_id: "mf".into(),
        timeout: Duration::from_millis(200),
        max_frame: 1 << 20,
        address_check: None,
    };
    // Nothing is connected: answers are handed in with `take_answer`.
    let cluster = Cluster::new("127.0.0.1:9", Security::default(), options).expect("one address");
    let limits = FetchLimits {
        max_bytes: 1 << 20,
        partition_max_bytes: 1 << 20,
        max_wait: Duration::from_millis(1),
    };
    Fetcher::new(cluster, limits)
}

/// A batch header without records (what the fetcher reads of a batch).
fn batch(base_offset: i64, last_offset_delta: i32) -> Vec<u8> {
    let mut b = base_offset.to_be_bytes().to_vec();
    b.extend_from_slice(&49i32.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // leader epoch
    b.push(2);
    b.extend_from_slice(&[0; 4]); // CRC: the fetcher does not check it
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&last_offset_delta.to_be_bytes());
    b.extend_from_slice(&[0; 16]);
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&last_offset_delta.saturating_add(1).to_be_bytes());
    b
}

/// A Fetch v11 answer body: topic `t`, the given (partition, error, records).
fn answer(partitions: &[(i32, i16, &[u8])]) -> Vec<u8> {
    let mut a = Vec::new();
    a.extend_from_slice(&0i32.to_be_bytes()); // throttle
    a.extend_from_slice(&0i16.to_be_bytes());
    a.extend_from_slice(&0i32.to_be_bytes()); // session
    a.extend_from_slice(&1i32.to_be_bytes());
    a.extend_from_slice(&1i16.to_be_bytes());
    a.push(b't');
    a.extend_from_slice(&i32::try_from(partitions.len()).unwrap_or(0).to_be_bytes());
    for (partition, error, records) in partitions {
        a.extend_from_slice(&partition.to_be_bytes());
        a.extend_from_slice(&error.to_be_bytes());
        a.extend_from_slice(&[0; 24]); // watermarks, log start
        a.extend_from_slice(&0i32.to_be_bytes()); // no aborted transactions
        a.extend_from_slice(&(-1i32).to_be_bytes());
        a.extend_from_slice(&i32::try_from(records.len()).unwrap_or(0).to_be_bytes());
        a.extend_from_slice(records);
    }
    a
}

fn offsets_fetched(round: &Round) -> Vec<(i32, Vec<i64>)> {
    round
        .fetched
        .iter()
        .map(|f| {
            let bases = f
                .batches
                .iter()
                .map(|r| {
                    let one: Vec<_> = batch::batches(&f.body[r.clone()]).collect();
                    assert_eq!(one.len(), 1, "a range is one batch");
                    one[0].as_ref().map_or(-1, |b| b.header.base_offset)
                })
                .collect();
            (f.partition, bases)
        })
        .collect()
}

#[test]
fn a_newly_assigned_partition_asks_for_metadata_at_once_and_moved_leaders_wait() {
    let mut f = fetcher();
    f.assign("t", 0, 0);
    // Nothing listens at the bootstrap: a metadata request shows as the round's failure.
    assert!(f.round().failure.is_some(), "first metadata");
    f.unassign("t", 0);
    f.assign("t", 1, 0);
    assert!(
        f.round().failure.is_some(),
        "a new partition is not held back by the pacer"
    );
    // No leader still: that is a leader to find again, paced.
    assert!(f.round().failure.is_none(), "paced");
}

fn metadata(topic: &str, leaders: &[(i32, i32)]) -> Metadata {
    use mirrorflow_core::protocol::metadata::{PartitionLeader, TopicMetadata};
    Metadata {
        brokers: Vec::new(),
        controller: -1,
        topics: vec![TopicMetadata {
            name: topic.into(),
            error: ErrorCode::NONE,
            partitions: leaders
                .iter()
                .map(|&(partition, leader)| PartitionLeader {
                    partition,
                    error: ErrorCode::NONE,
                    leader,
                    leader_epoch: 0,
                })
                .collect(),
        }],
    }
}

#[test]
fn leaders_are_kept_across_topics_and_reassignments_and_replaced_for_topics_asked_again() {
    let mut f = fetcher();
    f.learn(&["t"], &metadata("t", &[(0, 1), (1, 2)]));
    f.learn(&["u"], &metadata("u", &[(0, 3)]));
    f.stale = false;
    f.assign("t", 1, 0);
    f.unassign("t", 1);
    f.assign("t", 1, 5);
    assert!(!f.stale, "t's leaders are still known: no metadata needed");
    f.assign("v", 0, 0);
    assert!(f.stale, "an unknown topic asks for metadata");
    // Asked again, t's partition 1 has no leader now and partition 0 moved.
    f.learn(&["t"], &metadata("t", &[(0, 3), (1, -1)]));
    let key = |t: &str, p| (Arc::from(t), p);
    assert_eq!(f.leaders.get(&key("t", 0)), Some(&3));
    assert_eq!(f.leaders.get(&key("t", 1)), None);
    assert_eq!(f.leaders.get(&key("u", 0)), Some(&3), "kept");
    // An answer's topics not asked for are not taken.
    f.learn(&["t"], &metadata("w", &[(0, 1)]));
    assert_eq!(f.leaders.get(&key("w", 0)), None);
    assert_eq!(
        f.leaders.get(&key("t", 0)),
        None,
        "t asked, not in the answer"
    );
}

#[test]
fn batches_behind_the_position_or_repeated_are_not_handed_on_twice() {
    let mut f = fetcher();
    f.assign("t", 0, 10);
    // Old batches, out of order, and the same partition twice in one answer.
    let records = [batch(3, 1), batch(10, 2), batch(5, 0), batch(13, 0)].concat();
    let body = answer(&[(0, 0, &records), (0, 0, &records)]);
    let round = f.take_answer(1, body).expect("an answer that reads");
    assert_eq!(offsets_fetched(&round), vec![(0, vec![10, 13])]);
    assert_eq!(f.position("t", 0), Some(14));
    // The same answer again (a broker repeating itself): nothing new, no step back.
    let round = f
        .take_answer(1, answer(&[(0, 0, &records)]))
        .expect("reads");
    assert!(round.fetched.is_empty());
    assert_eq!(f.position("t", 0), Some(14));
}

#[test]
fn partitions_not_asked_for_are_ignored() {
    let mut f = fetcher();
    f.assign("t", 0, 0);
    let records = batch(0, 0);
    let round = f
        .take_answer(1, answer(&[(7, 0, &records), (-1, 0, &records)]))
        .expect("reads");
    assert!(round.fetched.is_empty() && round.troubles.is_empty());
    assert_eq!(f.position("t", 0), Some(0));
    assert_eq!(f.position("t", 7), None);
}

#[test]
fn offsets_at_the_end_of_the_range_saturate() {
    let mut f = fetcher();
    f.assign("t", 0, 0);
    let records = [batch(i64::MAX - 1, i32::MAX), batch(5, 0)].concat();
    let round = f
        .take_answer(1, answer(&[(0, 0, &records)]))
        .expect("reads");
    assert_eq!(offsets_fetched(&round), vec![(0, vec![i64::MAX - 1])]);
    assert_eq!(f.position("t", 0), Some(i64::MAX));
}

#[test]
fn damaged_records_pause_and_cut_batches_are_reported() {
    let mut f = fetcher();
    f.assign("t", 0, 0);
    f.assign("t", 1, 0);
    let mut bad = batch(0, 0);
    bad[16] = 1; // magic 1
    let cut = &batch(0, 0)[..40];
    let round = f
        .take_answer(1, answer(&[(0, 0, &bad), (1, 0, cut)]))
        .expect("reads");
    assert!(round.fetched.is_empty());
    let troubles: Vec<_> = round
        .troubles
        .iter()
        .map(|t| {
            (
                t.partition,
                t.paused,
                matches!(t.trouble, Trouble::Records(_)),
            )
        })
        .collect();
    assert_eq!(troubles, vec![(0, true, true), (1, false, false)]);
    assert!(matches!(
        round.troubles[1].trouble,
        Trouble::BatchTooLarge { partial: 40 }
    ));
    assert_eq!((f.position("t", 0), f.position("t", 1)), (Some(0), Some(0)));
}

#[test]
fn an_answer_that_does_not_read_drops_the_connection() {
    let mut f = fetcher();
    f.assign("t", 0, 0);
    let body = answer(&[(0, 0, &batch(0, 0))]);
    for len in 0..body.len() - 61 {
        assert!(
            matches!(
                f.take_answer(1, body[..len].to_vec()),
                Err(ConnError::Decode { .. })
            ),
            "{len}"
        );
    }
    // A count of partitions far past the answer's bytes.
    let mut huge = body.clone();
    huge[17..21].copy_from_slice(&i32::MAX.to_be_bytes());
    assert!(matches!(
        f.take_answer(1, huge),
        Err(ConnError::Decode { .. })
    ));
    assert_eq!(f.position("t", 0), Some(0));
}

/// Four partitions of `t` on leader 1, metadata known.
fn fetching_four() -> Fetcher {
    let mut f = fetcher();
    for p in 0..4 {
        f.assign("t", p, 0);
    }
    led_by_one(&mut f);
    f
}

/// New metadata: leader 1 leads every partition of `t`.
fn led_by_one(f: &mut Fetcher) {
    for p in 0..4 {
        f.leaders.insert((Arc::from("t"), p), 1);
    }
    f.stale = false;
}

/// Each request's partitions, in partition order (a round rotates them).
fn shapes(requests: &[Request]) -> Vec<Vec<i32>> {
    (requests.iter())
        .map(|(_, ps)| {
            let mut shape: Vec<i32> = ps.iter().map(|(_, p)| p.partition).collect();
            shape.sort_unstable();
            shape
        })
        .collect()
}

fn too_large() -> ConnError {
    ConnError::FrameSize {
        peer: "b1".into(),
        size: 40 << 20,
        max: 1 << 20,
    }
}

/// An answer too large to read names no partition: none of its partitions is held for it;
/// each is fetched alone until the one whose answer is too large alone is found, which
/// alone is reported (its copy names it), fetched last so the others' answers are read
/// first; an answer of its own that reads clears it.
#[test]
fn a_partition_whose_batch_is_too_large_to_read_is_found_and_alone_reported() {
    let mut f = fetching_four();
    let mut round = Round::default();
    let first = f.requests(&mut round);
    assert_eq!(first.len(), 1, "one request for the leader");
    let partitions = first[0].1.clone();
    f.lost(1, &partitions, too_large(), &mut round);
    assert!(
        (round.troubles.iter()).all(|t| t.trouble == Trouble::NoLeader && !t.paused),
        "none held for it: {:?}",
        round.troubles
    );

    led_by_one(&mut f);
    let mut round = Round::default();
    let alone = f.requests(&mut round);
    assert_eq!(alone.len(), 4, "{:?}", shapes(&alone));
    assert!(shapes(&alone).iter().all(|s| s.len() == 1));
    // Partition 2 is the culprit: its answer alone is too large.
    let two = (alone.iter())
        .find(|(_, ps)| ps[0].1.partition == 2)
        .cloned();
    let (_, two) = two.expect("partition 2 asked");
    f.lost(1, &two, too_large(), &mut round);
    assert_eq!(
        (round.troubles.iter())
            .map(|t| (t.partition, t.trouble.clone()))
            .collect::<Vec<_>>(),
        vec![(
            2,
            Trouble::FrameTooLarge {
                size: 40 << 20,
                max: 1 << 20
            }
        )]
    );
    // The others' own answers read: back in one request; the culprit alone, after it.
    led_by_one(&mut f);
    for (_, ps) in alone.iter().filter(|(_, ps)| ps[0].1.partition != 2) {
        f.cleared(ps);
    }
    let mut round = Round::default();
    assert_eq!(
        shapes(&f.requests(&mut round)),
        vec![vec![0, 1, 3], vec![2]]
    );
    // Retention removed the batch: its answer reads, and it is fetched with the others.
    f.cleared(&two);
    let mut round = Round::default();
    let together = shapes(&f.requests(&mut round));
    assert_eq!(together.len(), 1);
    assert_eq!(together[0].len(), 4);
    // Suspicion goes with the assignment.
    f.lost(1, &first[0].1, too_large(), &mut round);
    for p in 0..4 {
        f.unassign("t", p);
    }
    assert!(f.suspects.is_empty());
}
