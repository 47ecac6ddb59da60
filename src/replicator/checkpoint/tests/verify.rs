//! The loop's verification jobs ([`super::super::verify`]): which checkpoints are verified.

use super::*;

#[test]
fn only_checkpoints_at_their_commit_are_verified_and_a_job_says_what_it_may_re_read() {
    use crate::replicator::checkpoint::events::Event;
    use crate::replicator::checkpoint::state::Commit;
    let n = names();
    let mut c = core(&n);
    for e in [
        Event::CheckpointsLoaded,
        Event::SyncsLoaded,
        Event::Assigned(vec![0]),
        Event::CaughtUp(0),
    ] {
        c.handle(e);
    }
    let (t0, t1) = (TopicPartition::new("t", 0), TopicPartition::new("t", 1));
    let (a0, a1) = (TopicPartition::new("A.t", 0), TopicPartition::new("A.t", 1));
    for (group, tp, offset) in [("g", &t0, 60), ("h", &t1, 30)] {
        c.handle(Event::Commit {
            co_partition: 0,
            group: group.into(),
            tp: tp.clone(),
            commit: Some(Commit {
                offset,
                metadata: "m".into(),
                commit_timestamp_ms: 1,
                live: false,
            }),
        });
    }
    let cp = |group: &str, tp: &TopicPartition, up, down| Checkpoint {
        group: group.into(),
        topic_partition: tp.clone(),
        upstream_offset: up,
        downstream_offset: down,
        metadata: "m".into(),
    };
    let at = std::time::UNIX_EPOCH;
    let by_5 = Exactness::Conservative { max_replay: 5 };
    c.written(&t0, &cp("g", &a0, 60, 67), by_5, at);
    // Behind its group's commit: about to be replaced, not verified.
    c.written(&t1, &cp("h", &a1, 20, 27), Exactness::Exact, at);
    let candidates = c.verify_candidates();
    assert_eq!(candidates, [(("g".to_string(), a0.clone()), t0.clone())]);
    let job = c.verify_job("g", &a0, &t0).expect("at the commit");
    assert_eq!(job.checkpoint, cp("g", &a0, 60, 67));
    assert_eq!(job.exactness, by_5);
    assert!(c.verify_job("h", &a1, &t1).is_none());
}
