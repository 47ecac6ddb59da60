//! The probe's decisions from what the clusters answered, without a cluster.

use super::*;
use crate::kafka::checkpoints::Exactness;
use crate::mm2::Checkpoint;
use proptest::prelude::*;

/// A flow from alias `a` to `b` (remote topics `a.<topic>`), with `extra` spec lines.
fn flow(extra: &str) -> Flow {
    crate::flow::test_flow("ns/f", extra)
}

fn offsets(items: &[(&str, i32, Offset)]) -> Listed {
    items
        .iter()
        .map(|(t, p, o)| ((t.to_string(), *p), *o))
        .collect()
}

fn positions(items: &[(&str, i32, i64)]) -> Positions {
    items
        .iter()
        .map(|(t, p, o)| ((t.to_string(), *p), *o))
        .collect()
}

const NOW: i64 = 1_800_000_000_000;

fn age_at_now(since: i64) -> Duration {
    Duration::from_millis(u64::try_from(NOW.saturating_sub(since)).unwrap_or(0))
}

/// Checkpoints of `group` on the remote topic `a.orders`: (partition, upstream offset,
/// written ms).
fn checkpoints(
    group: &str,
    items: &[(i32, i64, Option<i64>)],
) -> BTreeMap<TopicPartition, StoredCheckpoint> {
    items
        .iter()
        .map(|&(partition, upstream_offset, written_ms)| {
            let topic_partition = TopicPartition::new("a.orders", partition);
            let checkpoint = Checkpoint {
                group: group.into(),
                topic_partition: topic_partition.clone(),
                upstream_offset,
                downstream_offset: upstream_offset,
                metadata: String::new(),
            };
            (
                topic_partition,
                StoredCheckpoint {
                    checkpoint,
                    written_ms,
                    exactness: Exactness::Unknown,
                    exact_ms: None,
                    verification: None,
                    share: false,
                },
            )
        })
        .collect()
}

fn commits(items: &[(i32, i64)]) -> Listed {
    items
        .iter()
        .map(|&(p, o)| (("orders".to_string(), p), Offset::Offset(o)))
        .collect()
}

#[test]
fn a_budget_caps_each_request_and_is_spent_at_its_deadline() {
    let long = Budget::new(Duration::from_secs(60));
    assert_eq!(long.next(TIMEOUT), TIMEOUT);
    assert!(!long.spent());
    let short = Budget::new(Duration::from_secs(2));
    assert!(short.next(TIMEOUT) <= Duration::from_secs(2));
    assert!(!short.next(TIMEOUT).is_zero());
    let gone = Budget::new(Duration::ZERO);
    assert_eq!(gone.next(TIMEOUT), Duration::ZERO);
    assert!(gone.spent());
}

#[test]
fn the_lag_counts_the_records_after_each_stored_position_within_the_log() {
    let ends = offsets(&[
        ("t", 0, Offset::Offset(100)),
        ("t", 1, Offset::Offset(50)),
        ("u", 0, Offset::Offset(30)),
        ("u", 1, Offset::Offset(70)),
    ]);
    let starts = offsets(&[
        ("t", 0, Offset::Offset(0)),
        ("t", 1, Offset::Offset(40)),
        ("u", 0, Offset::Offset(5)),
        ("u", 1, Offset::Offset(0)),
    ]);
    let copied = positions(&[
        ("t", 0, 90),
        // Behind the log start (retention): counted from the start.
        ("t", 1, 10),
        // Past the end (a recreated source topic): nothing left, not a negative count.
        ("u", 1, 95),
        // A topic no longer mirrored adds nothing.
        ("gone", 0, 0),
    ]);
    // t-0: 10, t-1: 10, u-0 (no position, counted from its start): 25, u-1: 0.
    assert_eq!(lag(&ends, &starts, &copied), Some(45));
    assert_eq!(lag(&Listed::new(), &Listed::new(), &copied), Some(0));
}

#[test]
fn a_partition_whose_offsets_were_not_answered_makes_the_lag_unknown() {
    let starts = offsets(&[("t", 0, Offset::Offset(0)), ("t", 1, Offset::Offset(0))]);
    let copied = positions(&[("t", 0, 1), ("t", 1, 1)]);
    let no_end = offsets(&[("t", 0, Offset::Offset(9)), ("t", 1, Offset::Invalid)]);
    assert_eq!(lag(&no_end, &starts, &copied), None);
    let ends = offsets(&[("t", 0, Offset::Offset(9)), ("t", 1, Offset::Offset(9))]);
    let no_start = offsets(&[("t", 0, Offset::Offset(0))]);
    assert_eq!(lag(&ends, &no_start, &copied), None);
}

proptest! {
    #[test]
    fn the_lag_is_never_negative_nor_more_than_the_logs_hold(
        logs in prop::collection::vec((any::<i64>(), any::<i64>(), prop::option::of(any::<i64>())), 0..6),
    ) {
        let mut ends = Listed::new();
        let mut starts = Listed::new();
        let mut copied = Positions::new();
        let mut held = 0i64;
        for (p, (start, end, position)) in (0i32..).zip(&logs) {
            let key = ("t".to_string(), p);
            ends.insert(key.clone(), Offset::Offset(*end));
            starts.insert(key.clone(), Offset::Offset(*start));
            if let Some(n) = position {
                copied.insert(key, *n);
            }
            held = held.saturating_add(end.saturating_sub(*start).max(0));
        }
        let Some(found) = lag(&ends, &starts, &copied) else {
            return Err(TestCaseError::fail("every offset was answered"));
        };
        prop_assert!(found >= 0);
        prop_assert!(found <= held);
        prop_assert_eq!(lag(&ends, &starts, &Positions::new()), Some(held));
    }
}

#[test]
fn a_group_whose_checkpoints_cover_its_commits_is_fresh_whatever_their_age() {
    let cps = checkpoints("g", &[(0, 10, Some(NOW - 3_600_000)), (1, 7, Some(NOW))]);
    let seen = observe_group(
        &flow(""),
        "g".into(),
        &commits(&[(0, 10), (1, 5)]),
        Some(&cps),
        None,
        &Recreations::new(),
        age_at_now,
    );
    assert_eq!(
        seen,
        Some(GroupObservation {
            group: "g".into(),
            checkpoint_age: Some(Duration::ZERO),
            replay_records: 0,
            uncopied_records: 0,
            invalidated_checkpoints: 0,
            conservative: Conservative::default(),
            // Two checkpointed partitions, neither verified on the records yet.
            verified: crate::status::verified::Verified {
                checkpointed: 2,
                ..Default::default()
            },
            kind: None,
        })
    );
}

#[test]
fn a_stale_group_is_as_old_as_its_oldest_uncovered_checkpoint() {
    let cps = checkpoints(
        "g",
        &[
            (0, 10, Some(NOW - 30_000)),
            (1, 5, Some(NOW - 10_000)),
            // Covered: its age does not matter.
            (2, 3, Some(NOW - 90_000)),
        ],
    );
    let seen = observe_group(
        &flow(""),
        "g".into(),
        &commits(&[(0, 20), (1, 15), (2, 3)]),
        Some(&cps),
        None,
        &Recreations::new(),
        age_at_now,
    )
    .unwrap();
    assert_eq!(seen.checkpoint_age, Some(Duration::from_secs(30)));
    assert_eq!(seen.replay_records, 20);
}

#[test]
fn a_committed_partition_without_a_checkpoint_leaves_the_age_unknown_and_replays_whole() {
    let cps = checkpoints("g", &[(0, 10, Some(NOW - 1_000))]);
    let seen = observe_group(
        &flow(""),
        "g".into(),
        &commits(&[(0, 12), (1, 8)]),
        Some(&cps),
        None,
        &Recreations::new(),
        age_at_now,
    )
    .unwrap();
    assert_eq!(seen.checkpoint_age, None);
    assert_eq!(seen.replay_records, 2 + 8);
    let none = observe_group(
        &flow(""),
        "g".into(),
        &commits(&[(0, 12)]),
        None,
        None,
        &Recreations::new(),
        age_at_now,
    )
    .unwrap();
    assert_eq!((none.checkpoint_age, none.replay_records), (None, 12));
}

#[test]
fn a_conservative_checkpoint_at_the_commit_is_not_exact_coverage() {
    let conservative = |max_replay| Exactness::Conservative { max_replay };
    let one = |max_replay, exact_age: Option<u64>| Conservative {
        partitions: 1,
        max_replay,
        exact_age: exact_age.map(Duration::from_secs),
    };
    // (commit, checkpoint upstream, what its writer said, when the pair was last exact) on one
    // partition, its checkpoint written 5 s ago -> (records replayed, conservative at the
    // commit, checkpoint age)
    let cases = [
        // The bug: upstream equals the commit, so the offsets alone say "covered, 0".
        (
            (60, 60, conservative(59), None),
            (59, one(59, None), Some(0)),
        ),
        (
            (60, 60, conservative(59), Some(NOW - 8_000)),
            (59, one(59, Some(8)), Some(0)),
        ),
        (
            (60, 60, Exactness::Exact, Some(NOW - 5_000)),
            (0, Conservative::default(), Some(0)),
        ),
        // MM2 or an older replicator: no evidence either way, as before.
        (
            (60, 60, Exactness::Unknown, None),
            (0, Conservative::default(), Some(0)),
        ),
        (
            (60, 60, conservative(0), None),
            (0, Conservative::default(), Some(0)),
        ),
        // The group moved on: uncovered as any commit past its checkpoint, and the checkpoint's
        // own imprecision comes on top.
        (
            (70, 60, conservative(59), None),
            (10 + 59, Conservative::default(), Some(5)),
        ),
        (
            (60, 60, conservative(u64::MAX), None),
            (i64::MAX, one(i64::MAX, None), Some(0)),
        ),
    ];
    for ((commit, up, exactness, exact_ms), (replay, at_commit, age)) in cases {
        let mut cps = checkpoints("g", &[(0, up, Some(NOW - 5_000))]);
        for stored in cps.values_mut() {
            stored.exactness = exactness;
            stored.exact_ms = exact_ms;
        }
        let seen = observe_group(
            &flow(""),
            "g".into(),
            &commits(&[(0, commit)]),
            Some(&cps),
            None,
            &Recreations::new(),
            age_at_now,
        )
        .expect("committed on a mirrored partition");
        let case = format!("commit {commit}, checkpoint {up} {exactness:?} exact at {exact_ms:?}");
        assert_eq!(seen.replay_records, replay, "{case}");
        assert_eq!(seen.conservative, at_commit, "{case}");
        assert_eq!(seen.checkpoint_age, age.map(Duration::from_secs), "{case}");
    }
}

#[test]
fn conservative_partitions_of_a_group_add_up_and_the_least_recently_exact_counts() {
    // (partition, checkpoint upstream, commit, max replay, last exact)
    let observe = |items: &[(i32, i64, i64, u64, Option<i64>)]| {
        let mut cps = checkpoints(
            "g",
            &items
                .iter()
                .map(|&(p, up, ..)| (p, up, Some(NOW)))
                .collect::<Vec<_>>(),
        );
        for (stored, &(.., max_replay, exact_ms)) in cps.values_mut().zip(items) {
            stored.exactness = Exactness::Conservative { max_replay };
            stored.exact_ms = exact_ms;
        }
        let committed: Vec<(i32, i64)> = items.iter().map(|&(p, _, c, ..)| (p, c)).collect();
        observe_group(
            &flow(""),
            "g".into(),
            &commits(&committed),
            Some(&cps),
            None,
            &Recreations::new(),
            age_at_now,
        )
        .expect("committed on mirrored partitions")
    };
    let seen = observe(&[
        (0, 60, 60, 59, Some(NOW - 1_000)),
        (1, 30, 30, 7, Some(NOW - 4_000)),
        // Moved past its checkpoint: not at the commit, whenever it was exact.
        (2, 9, 10, 3, Some(NOW - 90_000)),
    ]);
    assert_eq!(
        seen.conservative,
        Conservative {
            partitions: 2,
            max_replay: 66,
            exact_age: Some(Duration::from_secs(4)),
        }
    );
    assert_eq!(seen.replay_records, 59 + 7 + (1 + 3));
    let never = observe(&[(0, 60, 60, 59, Some(NOW - 1_000)), (1, 30, 30, 7, None)]);
    assert_eq!(
        never.conservative.exact_age, None,
        "one partition never exact"
    );
}

#[test]
fn a_checkpoint_written_before_its_remote_partition_was_recreated_is_invalidated() {
    let recreated = Recreations::from([
        (("orders".to_string(), 0), NOW - 5_000),
        (("orders".to_string(), 1), NOW - 5_000),
        (("orders".to_string(), 2), NOW - 5_000),
    ]);
    let cps = checkpoints(
        "g",
        &[
            (0, 10, Some(NOW - 10_000)),
            // Written from the new log: valid.
            (1, 10, Some(NOW - 1_000)),
            // When it was written is unknown: it may point into the old log.
            (2, 10, None),
        ],
    );
    let seen = observe_group(
        &flow(""),
        "g".into(),
        &commits(&[(0, 10), (1, 10), (2, 10), (3, 1)]),
        Some(&cps),
        None,
        &recreated,
        age_at_now,
    )
    .unwrap();
    assert_eq!(seen.invalidated_checkpoints, 2);
}

#[test]
fn commits_past_the_stored_positions_count_as_uncopied_only_when_positions_are_known() {
    let cps = checkpoints("g", &[(0, 10, Some(NOW)), (1, 4, Some(NOW))]);
    let copied = positions(&[("orders", 0, 15), ("orders", 1, 9)]);
    let observe = |positions| {
        observe_group(
            &flow(""),
            "g".into(),
            &commits(&[(0, 20), (1, 4), (2, 6)]),
            Some(&cps),
            positions,
            &Recreations::new(),
            age_at_now,
        )
        .unwrap()
    };
    // Partition 2 has no position: nothing of it was copied.
    assert_eq!(observe(Some(&copied)).uncopied_records, 5 + 6);
    assert_eq!(observe(None).uncopied_records, 0);
}

#[test]
fn a_group_without_commits_on_the_mirrored_partitions_has_no_row() {
    let nothing = offsets(&[("orders", 0, Offset::Invalid)]);
    let seen = observe_group(
        &flow(""),
        "g".into(),
        &nothing,
        None,
        None,
        &Recreations::new(),
        age_at_now,
    );
    assert_eq!(seen, None);
}

proptest! {
    #[test]
    fn replayed_and_uncopied_records_are_never_negative(
        parts in prop::collection::vec(
            (0..i64::MAX, prop::option::of(any::<i64>()), prop::option::of(any::<i64>())),
            1..5,
        ),
    ) {
        let mut committed = Listed::new();
        let mut cps = Vec::new();
        let mut copied = Positions::new();
        for (p, (commit, upstream, position)) in (0i32..).zip(&parts) {
            committed.insert(("orders".to_string(), p), Offset::Offset(*commit));
            if let Some(up) = upstream {
                cps.push((p, *up, Some(NOW)));
            }
            if let Some(n) = position {
                copied.insert(("orders".to_string(), p), *n);
            }
        }
        let cps = checkpoints("g", &cps);
        let seen = observe_group(
            &flow(""),
            "g".into(),
            &committed,
            Some(&cps),
            Some(&copied),
            &Recreations::new(),
            age_at_now,
        );
        let Some(seen) = seen else {
            return Err(TestCaseError::fail("every partition has a commit"));
        };
        prop_assert!(seen.replay_records >= 0);
        prop_assert!(seen.uncopied_records >= 0);
    }
}

#[test]
fn the_probe_asks_about_the_flows_groups_and_every_checkpointed_group_by_name() {
    let listed: Vec<String> = [
        "orders-app",
        "console-consumer-1",
        "mirrorflow.f.source",
        "b-app",
    ]
    .map(String::from)
    .into();
    let index = CheckpointIndex::from([
        ("zz-old".to_string(), BTreeMap::new()),
        ("b-app".to_string(), BTreeMap::new()),
    ]);
    assert_eq!(
        groups_to_probe(&flow(""), &listed, &index),
        ["b-app", "orders-app", "zz-old"]
    );
    let many: Vec<String> = (0..MAX_PROBED_GROUPS + 10)
        .rev()
        .map(|i| format!("g{i:03}"))
        .collect();
    let probed = groups_to_probe(&flow(""), &many, &CheckpointIndex::new());
    assert_eq!(probed.len(), MAX_PROBED_GROUPS);
    assert_eq!(probed.first().map(String::as_str), Some("g000"));
    // 50k listed and 50k other checkpointed groups: a set merge, not a scan per group.
    let listed: Vec<String> = (0..50_000).map(|i| format!("l{i}")).collect();
    let index: CheckpointIndex = (0..50_000)
        .map(|i| (format!("c{i}"), BTreeMap::new()))
        .collect();
    let started = std::time::Instant::now();
    let probed = groups_to_probe(&flow(""), &listed, &index);
    assert_eq!(probed.first().map(String::as_str), Some("c0"));
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn the_probe_counts_the_topics_the_replicator_mirrors() {
    let flow = flow("topics: ['orders', 'payments']\n");
    let names = [
        "orders",
        "payments",
        "other",
        "heartbeats",
        "b.orders",
        "b.heartbeats",
        "__consumer_offsets",
        "mm2-offset-syncs.b.internal",
        "a.checkpoints.internal",
    ];
    let filters = crate::mm2::Filters {
        topics: flow.topics.clone(),
        groups: flow.groups.clone(),
    };
    let listing = names.iter().map(|t| (t.to_string(), 1)).collect();
    let plan = crate::replicator::source::topics::plan(
        &filters,
        flow.policy.as_ref(),
        "a",
        "b",
        &listing,
        &BTreeMap::new(),
    );
    assert_eq!(plan.mirrored.len(), 3);
    assert_eq!(mirrored_topics(&flow, names.into_iter()).len(), 3);
}

#[test]
fn only_a_flow_that_copies_or_copied_is_judged_by_the_positions_topic() {
    let copied = positions(&[("orders", 0, 5)]);
    let empty = Positions::new();
    let off = flow("sourceLoop: {enabled: false}\n");
    assert!(!positions_are_the_flows(&off, Some(&empty)));
    assert!(!positions_are_the_flows(&off, None));
    assert!(positions_are_the_flows(&off, Some(&copied)));
    assert!(positions_are_the_flows(&flow(""), Some(&empty)));
    assert!(positions_are_the_flows(
        &flow("mode: Observe\n"),
        Some(&empty)
    ));
}

#[test]
fn acls_not_compared_name_the_cluster_that_failed_or_the_budget() {
    let down = ClusterFault::Unreachable("down".into());
    let unusable = "the cluster cannot be used (see the Ready condition)".to_string();
    assert_eq!(
        acls_not_compared(None, Some(&down)),
        TopicAcls::Unreadable {
            side: Side::Target,
            error: unusable.clone()
        }
    );
    assert_eq!(
        acls_not_compared(Some(&down), Some(&down)),
        TopicAcls::Unreadable {
            side: Side::Source,
            error: unusable
        }
    );
    assert_eq!(
        acls_not_compared(None, None),
        TopicAcls::Unreadable {
            side: Side::Source,
            error: "the probe ran out of time before comparing them".into()
        }
    );
}

#[test]
fn a_heartbeat_time_out_of_range_is_left_out_rather_than_wrong() {
    let mut obs = Observation::default();
    ClusterObservation {
        heartbeat: Some((Duration::from_secs(3), i64::MAX)),
        ..Default::default()
    }
    .record_into(&mut obs);
    assert_eq!(obs.heartbeat_age, Some(Duration::from_secs(3)));
    assert_eq!(obs.heartbeat_time, None);
    ClusterObservation {
        heartbeat: Some((Duration::ZERO, 1_700_000_000_000)),
        ..Default::default()
    }
    .record_into(&mut obs);
    assert_eq!(
        obs.heartbeat_time.map(|t| t.0.as_millisecond()),
        Some(1_700_000_000_000)
    );
}

#[test]
fn the_flows_default_client_id_is_shared_and_its_own_is_kept() {
    let mut config = ClientConfig::new();
    config.set("client.id", "mirrorflow-a");
    assert_eq!(
        shared_config(&config, "a").get("client.id"),
        Some("mirrorflow-operator-probe")
    );
    config.set("client.id", "quota-holder");
    assert_eq!(
        shared_config(&config, "a").get("client.id"),
        Some("quota-holder")
    );
}

#[test]
fn client_errors_tell_credentials_certificates_and_handshakes_apart() {
    assert!(matches!(
        classify(false, true, "broker: authentication failed"),
        Some(ClusterFault::Authentication(_))
    ));
    assert!(matches!(
        classify(
            false,
            false,
            "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed"
        ),
        Some(ClusterFault::Tls(_))
    ));
    assert!(matches!(
        classify(false, false, "SSL handshake failed: tlsv1 alert unknown ca"),
        Some(ClusterFault::CertificateRefused(_))
    ));
    // Token words mean nothing to a client that uses no tokens.
    assert_eq!(
        classify(false, false, "Failed to acquire SASL OAUTHBEARER token: x"),
        None
    );
}

#[test]
fn the_newest_recreation_of_each_remote_partition_counts() {
    let gap = |topic: &str, kind, at| Gap {
        topic: topic.into(),
        partition: 0,
        kind,
        from: 20,
        to: 0,
        detected_ms: at,
    };
    let found = recreations(&[
        gap("t", positions::GapKind::TargetRewound, 5),
        gap("t", positions::GapKind::TargetRewound, 9),
        gap("u", positions::GapKind::SourceTruncated, 7),
    ]);
    assert_eq!(found, Recreations::from([(("t".to_string(), 0), 9)]));
}

#[test]
fn oauthbearer_errors_tell_the_endpoint_the_credentials_and_the_brokers_apart() {
    // What librdkafka reported against the world's token endpoint and brokers.
    let fault = |auth, reason| classify(true, auth, reason);
    assert!(matches!(
        fault(
            true,
            r#"Failed to acquire SASL OAUTHBEARER token: {"error": "invalid_client", "error_description": "unknown client or wrong secret"}"#
        ),
        Some(ClusterFault::ClientCredentialsRefused(_))
    ));
    assert!(matches!(
        fault(
            true,
            "Failed to acquire SASL OAUTHBEARER token: Failed to connect to 127.0.0.1:39713 after 0 ms: Could not connect to server"
        ),
        Some(ClusterFault::TokenEndpointUnreachable(_))
    ));
    assert!(matches!(
        fault(
            true,
            "Failed to acquire SASL OAUTHBEARER token: Response is not JSON encoded: text/html"
        ),
        Some(ClusterFault::TokenEndpointUnreachable(_))
    ));
    assert!(matches!(
        fault(
            false,
            r#"sasl_plaintext://127.0.0.1:19396/bootstrap: SASL authentication error: {"status":"invalid_token"} (after 303ms in state AUTH_REQ)"#
        ),
        Some(ClusterFault::TokenRefused(_))
    ));
    // The same broker refusal with a password is the credentials' fault.
    assert!(matches!(
        classify(
            false,
            false,
            "SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
        ),
        Some(ClusterFault::Authentication(_))
    ));
    assert_eq!(fault(false, "1/1 brokers are down"), None);
}

#[test]
fn a_refused_client_certificate_is_told_from_a_broker_we_do_not_trust() {
    assert!(refuses_client_certificate(
        "ssl://127.0.0.1:19095/bootstrap: SSL handshake failed: ssl/record/rec_layer_s3.c:1605: error:0A000418:SSL routines::tlsv1 alert unknown ca"
    ));
    assert!(refuses_client_certificate(
        "SSL handshake failed: error:0A00045C:SSL routines::tlsv13 alert certificate required"
    ));
    // What the world's brokers answered to an unknown certificate and to none (TLS 1.3:
    // the alert comes after the handshake, on the first read).
    assert!(refuses_client_certificate(
        "ssl://127.0.0.1:19095/bootstrap: Receive failed: error:0A000412:SSL routines::sslv3 alert bad certificate: SSL alert number 42 (after 6ms in state APIVERSION_QUERY)"
    ));
    assert!(!refuses_client_certificate(
        "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified"
    ));
}

#[test]
fn a_replication_factor_above_the_targets_brokers_is_refused_from_the_spec() {
    let three = flow("sourceLoop: {replicationFactor: 3}\n");
    let r = replication_factor_refused(&three, 1).expect("3 > 1 broker");
    assert_eq!(r.topic, positions::positions_topic("a"));
    assert!(
        r.message.contains("spec.sourceLoop.replicationFactor is 3")
            && r.message.contains("1 broker(s)"),
        "{}",
        r.message
    );
    assert_eq!(replication_factor_refused(&three, 3), None);
    assert_eq!(
        replication_factor_refused(&three, 0),
        None,
        "no broker list"
    );
    let default = flow("sourceLoop: {replicationFactor: -1}\n");
    assert_eq!(replication_factor_refused(&default, 1), None);
    let observe = flow("mode: Observe\nsourceLoop: {replicationFactor: 3}\n");
    assert_eq!(replication_factor_refused(&observe, 1), None);
}

#[test]
fn authorization_errors_are_told_apart_from_credentials() {
    for reason in [
        "Broker: Topic authorization failed",
        "GroupCoordinator: Broker: Group authorization failed",
        "Broker: Cluster authorization failed",
    ] {
        assert!(
            matches!(
                classify(false, false, reason),
                Some(ClusterFault::NotAuthorized(_))
            ),
            "{reason}"
        );
    }
    // Refused credentials stay credentials.
    assert!(matches!(
        classify(
            false,
            true,
            "SASL authentication error: Authentication failed"
        ),
        Some(ClusterFault::Authentication(_))
    ));
}

#[test]
fn a_positions_topic_held_longer_than_a_transaction_can_last_is_named_with_its_fix() {
    let f = flow("");
    let topic = "mirrorflow-positions.a.internal";
    assert_eq!(
        observe::held_message(&f, topic, 13, Duration::from_secs(59)),
        None,
        "a transaction may still end by itself"
    );
    let m = observe::held_message(&f, topic, 13, Duration::from_secs(61)).expect("held");
    for part in [
        "mirrorflow-positions.a.internal is held by an open transaction",
        "open at offset 13 for 61s",
        "kafka-transactions.sh",
        "--topic mirrorflow-positions.a.internal --partition 0 --start-offset 13",
    ] {
        assert!(m.contains(part), "{part} not in {m}");
    }
    // A flow whose own transactions may last 2 minutes: held after twice that.
    let mut patient = flow("");
    patient
        .target_client
        .set("transaction.timeout.ms", "120000");
    assert!(observe::held_message(&patient, topic, 13, Duration::from_secs(200)).is_none());
    assert!(observe::held_message(&patient, topic, 13, Duration::from_secs(241)).is_some());
}
