//! The status rules, one observation at a time.

use super::*;
use crate::kafka::positions::{Gap, GapKind};

mod gaps;

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap())
}

fn healthy() -> Observation {
    Observation {
        desired_replicas: 1,
        ready_replicas: 1,
        heartbeats_enabled: true,
        checkpoints_enabled: true,
        heartbeat_age: Some(Duration::from_secs(2)),
        topics: Some(3),
        replication_lag: Some(0),
        groups: vec![GroupObservation {
            group: "g1".into(),
            checkpoint_age: Some(Duration::from_secs(1)),
            replay_records: 0,
            uncopied_records: 0,
            invalidated_checkpoints: 0,
            conservative: Conservative::default(),
            verified: Default::default(),
            kind: None,
        }],
        ..Observation::default()
    }
}

fn cond<'a>(s: &'a MirrorFlowStatus, t: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == t).unwrap()
}

#[test]
fn oauth_faults_name_the_oauthbearer_field_to_fix() {
    for (fault, side, want, field) in [
        (
            ClusterFault::ClientCredentialsRefused("invalid_client".into()),
            "source",
            reason::SOURCE_CLIENT_CREDENTIALS_REFUSED,
            "spec.source.sasl.oauthbearer.clientSecretSecretRef",
        ),
        (
            ClusterFault::TokenEndpointUnreachable("Could not connect".into()),
            "target",
            reason::TARGET_TOKEN_ENDPOINT_UNREACHABLE,
            "spec.target.sasl.oauthbearer.tokenEndpointUrl",
        ),
        (
            ClusterFault::TokenRefused("invalid_token".into()),
            "source",
            reason::SOURCE_TOKEN_REFUSED,
            "spec.source.sasl.oauthbearer.scope",
        ),
    ] {
        let (got, message) = fault.describe(side);
        assert_eq!(got, want);
        assert!(message.contains(field), "{message}");
    }
}

#[test]
fn an_endpoints_long_answer_is_cut_before_it_reaches_a_message() {
    // A token endpoint answering 400 with megabytes; multi-byte characters at the cut.
    let body = format!("MARKER{}", "é".repeat(5 << 20));
    let (_, message) = ClusterFault::ClientCredentialsRefused(body).describe("target");
    assert!(message.contains("MARKER"), "{message}");
    assert!(
        message.len() < MAX_FOREIGN_TEXT + 600,
        "{} bytes",
        message.len()
    );
    assert!(message.contains("bytes cut") && message.contains("clientSecretSecretRef"));
    assert_eq!(bounded_text("short"), "short");
}

#[test]
fn foreign_text_is_kept_on_one_line_and_cut_on_a_character_boundary() {
    assert!(matches!(
        one_line("plain", 10),
        std::borrow::Cow::Borrowed("plain")
    ));
    assert_eq!(one_line("a\nb\u{1b}[31mc", 64), "a b [31mc");
    // 'é' is two bytes: a cut inside it moves back to the boundary before it.
    assert_eq!(one_line("abcé fin", 4), "abc... (6 bytes cut)");
    assert_eq!(one_line("ab\ncd", 3), "ab ... (2 bytes cut)");
    assert_eq!(one_line("", 0), "");
}

#[test]
fn observe_mode_judges_replication_by_heartbeats_without_replicas() {
    let observed = Observation {
        observe_only: true,
        desired_replicas: 0,
        ready_replicas: 0,
        replication_lag: None,
        ..healthy()
    };
    let limits = FailoverReadinessSpec::default();
    let s = status(None, &observed, &limits, Some(1), &now());
    assert_eq!(cond(&s, READY).reason, reason::OBSERVING);
    assert_eq!(cond(&s, REPLICATING).reason, reason::OBSERVING);
    assert_eq!(cond(&s, FAILOVER_READY).status, "True");

    let silent = Observation {
        heartbeat_age: None,
        ..observed.clone()
    };
    let s = status(None, &silent, &limits, Some(1), &now());
    assert_eq!(cond(&s, REPLICATING).status, "False");
    assert_eq!(cond(&s, REPLICATING).reason, reason::NO_HEARTBEATS);
    assert_eq!(cond(&s, FAILOVER_READY).status, "False");

    let down = Observation {
        source_error: Some(ClusterFault::Unreachable("timed out".into())),
        ..observed
    };
    let s = status(None, &down, &limits, Some(1), &now());
    assert_eq!(cond(&s, READY).reason, reason::SOURCE_UNREACHABLE);
}

#[test]
fn a_healthy_flow_is_failover_ready() {
    let s = status(
        None,
        &healthy(),
        &FailoverReadinessSpec::default(),
        Some(3),
        &now(),
    );
    for t in EVALUATED {
        assert_eq!(cond(&s, t).status, "True", "{t}: {}", cond(&s, t).message);
    }
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(s.heartbeat.unwrap().lag.as_deref(), Some("2s"));
}

#[test]
fn an_unreachable_source_stops_heartbeats_and_failover_with_its_reason() {
    let mut o = healthy();
    o.source_error = Some(ClusterFault::Unreachable("connection refused".into()));
    o.heartbeat_age = Some(Duration::from_secs(45));
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert_eq!(
        cond(&s, HEARTBEATS_FLOWING).reason,
        reason::SOURCE_UNREACHABLE
    );
    assert_eq!(cond(&s, FAILOVER_READY).status, "False");
    assert_eq!(cond(&s, FAILOVER_READY).reason, reason::SOURCE_UNREACHABLE);
}

#[test]
fn a_checkpoint_into_a_recreated_remote_log_blocks_failover() {
    let mut o = healthy();
    o.groups[0].invalidated_checkpoints = 1;
    let s = status(None, &o, &FailoverReadinessSpec::default(), Some(1), &now());
    assert_eq!(
        cond(&s, CHECKPOINTS_FRESH).reason,
        reason::CHECKPOINTS_INVALIDATED
    );
    assert_eq!(cond(&s, FAILOVER_READY).status, "False");
    assert_eq!(s.least_ready_groups[0].reason, "CheckpointInvalidated");
    assert!(
        s.least_ready_groups[0]
            .message
            .contains("TargetTopicRecreated")
    );
}

/// A share group the selection matches whose start offsets the source did not give cannot
/// fail over with the flow: named, with why and the fix, and FailoverReady is False for it; a
/// flow with only such a share group is not "nothing to fail over".
#[test]
fn a_selected_share_group_is_named_not_mirrored_and_blocks_failover() {
    let mut o = healthy();
    o.share_groups = vec![(
        "orders-queue".into(),
        "GROUP_AUTHORIZATION_FAILED (30)".into(),
    )];
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    let fresh = cond(&s, CHECKPOINTS_FRESH);
    assert_eq!(fresh.status, "False");
    assert_eq!(fresh.reason, reason::GROUPS_NOT_MIRRORED);
    assert!(
        fresh
            .message
            .starts_with("1 of 2 groups not ready; worst: orders-queue: a share group"),
        "{}",
        fresh.message
    );
    let failover = cond(&s, FAILOVER_READY);
    assert_eq!(failover.status, "False");
    assert!(
        failover.message.contains("spec.groupsExclude"),
        "{}",
        failover.message
    );
    let rows: Vec<_> = (s.least_ready_groups.iter())
        .map(|g| (g.group.as_str(), g.reason.as_str()))
        .collect();
    assert_eq!(
        rows,
        [("orders-queue", "ShareGroupNotMirrored"), ("g1", "Ready")]
    );

    o.groups.clear();
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert_eq!(
        cond(&s, CHECKPOINTS_FRESH).reason,
        reason::GROUPS_NOT_MIRRORED
    );
    assert_eq!(cond(&s, FAILOVER_READY).status, "False");
}

/// Share and streams groups judged on their positions are rows like any group's, saying what
/// they are; they count toward FailoverReady like the others.
#[test]
fn share_and_streams_groups_are_rows_that_say_their_type() {
    let mut o = healthy();
    for (name, kind) in [("queue", "share"), ("app", "streams")] {
        let mut g = o.groups[0].clone();
        g.group = name.into();
        g.kind = Some(kind);
        o.groups.push(g);
    }
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert_eq!(cond(&s, FAILOVER_READY).status, "True");
    let rows: Vec<(&str, &str, &str)> = (s.least_ready_groups.iter())
        .map(|g| (g.group.as_str(), g.reason.as_str(), g.message.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            ("app", "Ready", "a streams group: the group can fail over"),
            ("g1", "Ready", "the group can fail over"),
            ("queue", "Ready", "a share group: the group can fail over"),
        ]
    );
}

#[test]
fn a_stale_group_is_listed_first_with_its_reason() {
    let mut o = healthy();
    o.groups.push(GroupObservation {
        group: "slow".into(),
        checkpoint_age: Some(Duration::from_secs(120)),
        replay_records: 40,
        uncopied_records: 0,
        invalidated_checkpoints: 0,
        conservative: Conservative::default(),
        verified: Default::default(),
        kind: None,
    });
    o.groups.push(GroupObservation {
        group: "new".into(),
        checkpoint_age: None,
        replay_records: 7,
        uncopied_records: 0,
        invalidated_checkpoints: 0,
        conservative: Conservative::default(),
        verified: Default::default(),
        kind: None,
    });
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    let names: Vec<_> = s
        .least_ready_groups
        .iter()
        .map(|g| (g.group.as_str(), g.reason.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("new", "NoCheckpoint"),
            ("slow", "CheckpointStale"),
            ("g1", "Ready")
        ]
    );
    assert_eq!(cond(&s, CHECKPOINTS_FRESH).reason, reason::NO_CHECKPOINTS);
    assert_eq!(
        s.checkpoints.as_ref().unwrap().oldest_age.as_deref(),
        Some("never")
    );
    assert_eq!(cond(&s, FAILOVER_READY).status, "False");
}

#[test]
fn a_group_ahead_of_the_copy_is_blamed_on_replication_not_checkpoints() {
    let mut o = healthy();
    o.groups.push(GroupObservation {
        group: "fast".into(),
        checkpoint_age: Some(Duration::from_secs(90)),
        replay_records: 500,
        uncopied_records: 480,
        invalidated_checkpoints: 0,
        conservative: Conservative::default(),
        verified: Default::default(),
        kind: None,
    });
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    let row = &s.least_ready_groups[0];
    assert_eq!(
        (row.group.as_str(), row.reason.as_str()),
        ("fast", "ReplicationBehind")
    );
    assert!(row.message.contains("480 records"), "{}", row.message);
    assert_eq!(
        cond(&s, CHECKPOINTS_FRESH).reason,
        reason::REPLICATION_BEHIND
    );
    // Behind but still within the checkpoint age limit: the group is ready.
    o.groups[1].checkpoint_age = Some(Duration::from_secs(5));
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert!(s.least_ready_groups.iter().all(|g| g.reason == "Ready"));
}

#[test]
fn transition_time_moves_only_on_a_flip() {
    let limits = FailoverReadinessSpec::default();
    let t0 = now();
    let first = status(None, &healthy(), &limits, None, &t0);
    let later = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_100).unwrap());
    let same = status(Some(&first), &healthy(), &limits, None, &later);
    assert_eq!(cond(&same, READY).last_transition_time, t0);
    let mut down = healthy();
    down.ready_replicas = 0;
    let flipped = status(Some(&same), &down, &limits, None, &later);
    assert_eq!(cond(&flipped, READY).last_transition_time, later);
    assert_eq!(cond(&flipped, READY).reason, reason::REPLICAS_NOT_READY);
}

#[test]
fn a_replica_on_a_lost_node_is_named_in_ready_before_the_plain_count() {
    let mut o = healthy();
    o.desired_replicas = 3;
    o.ready_replicas = 2;
    o.stranded = vec!["replicator pod f-1 is on node n2, which has not answered for 20s".into()];
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    let ready = cond(&s, READY);
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, reason::REPLICA_ON_LOST_NODE);
    assert!(
        ready.message.contains("f-1") && ready.message.contains("n2"),
        "{}",
        ready.message
    );
    // Its partitions are not copied until it is replaced: no failover now, and why.
    let failover = cond(&s, FAILOVER_READY);
    assert_eq!(
        (failover.status.as_str(), failover.reason.as_str()),
        ("False", reason::REPLICA_ON_LOST_NODE)
    );
}

#[test]
fn a_replica_that_cannot_run_is_named_by_class_in_ready_replicating_and_failover() {
    let mut o = healthy();
    o.desired_replicas = 1;
    o.ready_replicas = 0;
    o.unready = Some((
        reason::REPLICATOR_OUT_OF_MEMORY,
        "replicator pod f-0 was killed 3 times for using more memory than its limit".into(),
    ));
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    for type_ in [READY, REPLICATING, FAILOVER_READY] {
        let c = cond(&s, type_);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason::REPLICATOR_OUT_OF_MEMORY),
            "{type_}: {}",
            c.message
        );
        assert!(
            c.message.contains("f-0 was killed 3 times"),
            "{type_}: {}",
            c.message
        );
    }
    // Once every replica is ready again, an old diagnosis no longer speaks.
    o.ready_replicas = 1;
    let s = status(
        Some(&s),
        &o,
        &FailoverReadinessSpec::default(),
        None,
        &now(),
    );
    assert_eq!(cond(&s, READY).status, "True");
}

#[test]
fn invalid_specs_and_missing_secrets_set_every_condition_false_with_the_message() {
    let o = Observation {
        blocked: Some(Blocked::new(
            reason::SECRET_MISSING,
            "spec.source.sasl.passwordSecretRef: Secret 'creds' not found",
        )),
        ..healthy()
    };
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    // Gapless is about records already skipped or not, which no spec error changes.
    assert!(
        s.conditions
            .iter()
            .filter(|c| c.type_ != GAPLESS)
            .all(|c| c.status == "False" && c.reason == reason::SECRET_MISSING)
    );
    assert!(cond(&s, READY).message.contains("'creds'"));
}

#[test]
fn a_flow_yielding_to_one_the_operator_cannot_see_says_so_everywhere() {
    let o = Observation {
        conflict: Some("spec.source.alias: flow 'other/first' (older; ...".into()),
        ..healthy()
    };
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    for t in EVALUATED {
        let c = cond(&s, t);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason::CONFLICTING_FLOW),
            "{t}"
        );
        assert!(c.message.contains("'other/first'"), "{t}");
    }
    assert_eq!(
        cond(
            &status(
                None,
                &healthy(),
                &FailoverReadinessSpec::default(),
                None,
                &now()
            ),
            READY
        )
        .status,
        "True"
    );
}

#[test]
fn topic_acls_synced_is_reported_only_when_compared_and_never_holds_back_failover() {
    let limits = FailoverReadinessSpec::default();
    let s = status(None, &healthy(), &limits, None, &now());
    assert!(
        !s.conditions
            .iter()
            .any(|c| c.type_ == acls::TOPIC_ACLS_SYNCED)
    );

    let mut obs = healthy();
    obs.topic_acls = Some((
        acls::TopicAcls::Forbidden {
            side: crate::kafka::Side::Target,
            lacking: vec![crate::kafka::acls::Operation::Alter],
        },
        "10s".into(),
    ));
    let s = status(None, &obs, &limits, None, &now());
    let c = cond(&s, acls::TOPIC_ACLS_SYNCED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reason::TOPIC_ACLS_FORBIDDEN)
    );
    assert!(c.message.contains("spec.sourceLoop.syncTopicAcls"));
    assert_eq!(cond(&s, FAILOVER_READY).status, "True");

    obs.blocked = Some(Blocked::new(reason::INVALID_SPEC, "bad"));
    let s = status(None, &obs, &limits, None, &now());
    assert!(
        !s.conditions
            .iter()
            .any(|c| c.type_ == acls::TOPIC_ACLS_SYNCED)
    );
}

#[test]
fn refused_topic_changes_stop_replicating_and_name_the_oldest_refusal() {
    let refusal = |topic: &str, at: i64| crate::kafka::refusals::Refusal {
        topic: topic.into(),
        detected_ms: at,
        message: format!("the target cluster refused creating topic {topic}; the fix"),
    };
    let limits = FailoverReadinessSpec::default();
    let mut o = healthy();
    o.refusals = Some(
        (0..8)
            .map(|i| refusal(&format!("A.t{i}"), 100 - i))
            .collect(),
    );
    let s = status(None, &o, &limits, None, &now());
    let replicating = cond(&s, REPLICATING);
    assert_eq!(
        (replicating.status.as_str(), replicating.reason.as_str()),
        ("False", reason::TOPIC_CHANGES_REFUSED)
    );
    let m = &replicating.message;
    assert!(
        m.starts_with("8 topic(s) not copied as they should be"),
        "{m}"
    );
    assert!(
        m.contains("A.t7: the target cluster refused creating topic A.t7; the fix"),
        "the oldest in full: {m}"
    );
    assert!(
        m.contains("also A.t6, A.t5, A.t4, A.t3, A.t2 and 2 more"),
        "{m}"
    );
    assert_eq!(
        cond(&s, FAILOVER_READY).reason,
        reason::TOPIC_CHANGES_REFUSED
    );

    // An unreachable cluster says more than its refusals. Observe mode (and the CLI's
    // measurement) reports what the positions topic of the alias holds.
    let mut down = o.clone();
    down.target_error = Some(ClusterFault::Unreachable("connection refused".into()));
    let s = status(None, &down, &limits, None, &now());
    assert_eq!(cond(&s, REPLICATING).reason, reason::TARGET_UNREACHABLE);
    let observe = Observation {
        observe_only: true,
        replication_lag: None,
        ..o.clone()
    };
    let s = status(None, &observe, &limits, None, &now());
    assert_eq!(cond(&s, REPLICATING).reason, reason::TOPIC_CHANGES_REFUSED);

    // Fixed (tombstones read) or not readable: replicating again.
    for none in [Some(Vec::new()), None] {
        o.refusals = none;
        let s = status(None, &o, &limits, None, &now());
        assert_eq!(cond(&s, REPLICATING).status, "True");
    }
}

#[test]
fn a_selection_that_matches_no_source_topic_is_never_failover_ready() {
    let mut o = healthy();
    o.topics = Some(0);
    o.groups.clear();
    o.selected.topics_seen = Some(42);
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    let failover = cond(&s, FAILOVER_READY);
    assert_eq!(
        (failover.status.as_str(), failover.reason.as_str()),
        ("False", reason::NO_TOPICS_MATCHED)
    );
    assert!(
        failover
            .message
            .starts_with("spec.topics and spec.topicsExclude select none of the 42 topics"),
        "{}",
        failover.message
    );
    assert_eq!(
        cond(&s, CHECKPOINTS_FRESH).reason,
        reason::NO_TOPICS_MATCHED
    );
    // Unknown count: still said, without a number.
    o.selected.topics_seen = None;
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert!(
        cond(&s, FAILOVER_READY)
            .message
            .contains("select none of the topics")
    );
    // Topics named one by one that the source lacks have not been created yet (a reverse
    // flow before its first topic): not a wrong selection.
    o.selected.topics_named = true;
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert_ne!(cond(&s, FAILOVER_READY).reason, reason::NO_TOPICS_MATCHED);
    assert_ne!(
        cond(&s, CHECKPOINTS_FRESH).reason,
        reason::NO_TOPICS_MATCHED
    );
}

#[test]
fn a_selection_that_matches_no_group_says_so_in_failover_ready() {
    let mut o = healthy();
    o.groups.clear();
    // The source has groups and the patterns match none: maybe a wrong selection, maybe
    // consumers still to come; ready (nothing blocks), with the reason and the fix.
    o.selected.groups = Some((0, 17));
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    let fresh = cond(&s, CHECKPOINTS_FRESH);
    assert_eq!(
        (fresh.status.as_str(), fresh.reason.as_str()),
        ("True", reason::NO_GROUPS_MATCHED)
    );
    assert!(
        fresh
            .message
            .contains("select none of the 17 consumer groups"),
        "{}",
        fresh.message
    );
    let failover = cond(&s, FAILOVER_READY);
    assert_eq!(
        (failover.status.as_str(), failover.reason.as_str()),
        ("True", reason::NO_GROUPS_MATCHED)
    );
    assert!(
        failover
            .message
            .starts_with("nothing blocks a failover, but no consumer group is checkpointed"),
        "{}",
        failover.message
    );
    // Groups named one by one that the source does not list yet have not committed yet.
    o.selected.groups_named = true;
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert_eq!(cond(&s, CHECKPOINTS_FRESH).status, "True");
    assert_eq!(cond(&s, FAILOVER_READY).status, "True");
    o.selected.groups_named = false;
    // Selected groups that have not committed yet, or a source without groups: nothing to
    // fail over now, said so, and not reported broken.
    for (groups, says) in [
        (
            Some((3, 17)),
            "3 consumer group(s) match spec.groups but none has committed",
        ),
        (
            Some((0, 0)),
            "no consumer group on the source has committed",
        ),
        (None, "no consumer group on the source has committed"),
    ] {
        o.selected.groups = groups;
        let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
        let fresh = cond(&s, CHECKPOINTS_FRESH);
        assert_eq!(fresh.status, "True", "{groups:?}");
        assert!(fresh.message.contains(says), "{}", fresh.message);
        assert!(fresh.message.contains("nothing to fail over now"));
    }
    // Checkpoints off: its own reason, as before.
    o.checkpoints_enabled = false;
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert_eq!(
        cond(&s, CHECKPOINTS_FRESH).reason,
        reason::CHECKPOINTS_DISABLED
    );
}

#[test]
fn replicas_above_the_partitions_are_named_idle_without_failing_ready() {
    let mut o = healthy();
    o.desired_replicas = 64;
    o.ready_replicas = 64;
    o.selected.partitions = Some(3);
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    let ready = cond(&s, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", reason::REPLICAS_ABOVE_PARTITIONS)
    );
    assert!(
        ready.message.contains("spec.replicas is 64")
            && ready.message.contains("61 replica(s) idle")
            && ready.message.contains("lower spec.replicas to 3"),
        "{}",
        ready.message
    );
    assert_eq!(cond(&s, FAILOVER_READY).status, "True");
    for partitions in [Some(64), Some(100), Some(0), None] {
        o.selected.partitions = partitions;
        let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
        assert_eq!(cond(&s, READY).reason, reason::OK, "{partitions:?}");
    }
}

#[test]
fn the_placement_is_recorded_once_deployed_and_kept_while_held() {
    let placement = |alias: &str| crate::api::DeployedPlacement {
        policy: "Prefix".into(),
        separator: Some(".".into()),
        source_alias: alias.into(),
        target_alias: "b".into(),
        target_bootstrap_servers: "y:1".into(),
    };
    let limits = FailoverReadinessSpec::default();
    let mut o = healthy();
    o.placement = Some(placement("a"));
    let deployed = status(None, &o, &limits, Some(1), &now());
    assert_eq!(deployed.deployed_placement, Some(placement("a")));
    // Held (a refused change): the deployed placement stays.
    o.placement = Some(placement("a2"));
    o.blocked = Some(Blocked::new(
        reason::PLACEMENT_CHANGED,
        "spec.source.alias: ...",
    ));
    let held = status(Some(&deployed), &o, &limits, Some(2), &now());
    assert_eq!(held.deployed_placement, Some(placement("a")));
    // Observe mode deploys no replicator; the CLI's status has no placement.
    o.blocked = None;
    o.observe_only = true;
    let observed = status(Some(&deployed), &o, &limits, Some(2), &now());
    assert_eq!(observed.deployed_placement, Some(placement("a")));
    o.observe_only = false;
    o.placement = None;
    let cli = status(Some(&deployed), &o, &limits, Some(2), &now());
    assert_eq!(cli.deployed_placement, Some(placement("a")));
}

#[test]
fn refused_group_offsets_and_principals_are_named_not_authorized() {
    let mut o = healthy();
    o.selected.groups_forbidden = 4;
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    let fresh = cond(&s, CHECKPOINTS_FRESH);
    assert_eq!(
        (fresh.status.as_str(), fresh.reason.as_str()),
        ("False", reason::SOURCE_NOT_AUTHORIZED)
    );
    assert!(
        fresh.message.contains("4 selected consumer group(s)")
            && fresh.message.contains("spec.source.sasl"),
        "{}",
        fresh.message
    );
    assert_eq!(
        cond(&s, FAILOVER_READY).reason,
        reason::SOURCE_NOT_AUTHORIZED
    );
    let mut o = healthy();
    o.target_error = Some(ClusterFault::NotAuthorized(
        "Broker: Topic authorization failed".into(),
    ));
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    let ready = cond(&s, READY);
    assert_eq!(ready.reason, reason::TARGET_NOT_AUTHORIZED);
    assert!(
        ready.message.contains("spec.target.sasl"),
        "{}",
        ready.message
    );
}

#[test]
fn an_internal_topic_the_replicator_cannot_read_on_is_named_with_its_fix() {
    let metrics = crate::replicator::metrics::Metrics::new().expect("metrics");
    let clusters = crate::replicator::reach::Clusters::new(&metrics);
    let reach = crate::replicator::reach::Reachability::new(&clusters.source, "checkpoint");
    reach.hold(
        "offset syncs",
        "mm2-offset-syncs.B.internal",
        "gzip records inflate to more than 33554432 bytes",
    );
    let mut o = healthy();
    o.refusals = Some(crate::replicator::stops::stops_now(&clusters.stops));
    assert_internal_topic_refused(
        &o,
        &[
            "mm2-offset-syncs.B.internal holds a batch the replicator cannot read",
            "more than 33554432 bytes",
            "offset syncs waits at it",
            "kafka-delete-records on the source cluster",
        ],
    );
    // Read on past it: the record is taken out, and the flow is replicating again.
    reach.release("mm2-offset-syncs.B.internal");
    o.refusals = Some(crate::replicator::stops::stops_now(&clusters.stops));
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert_eq!(cond(&s, REPLICATING).status, "True");
}

#[test]
fn a_positions_topic_held_by_an_open_transaction_stops_replicating_with_its_fix() {
    let mut o = healthy();
    o.held_topic = Some(format!(
        "mirrorflow-positions.a.internal{}: a transaction has been open at offset 13 for 61s; kafka-transactions.sh abort --topic mirrorflow-positions.a.internal --partition 0 --start-offset 13",
        crate::kafka::refusals::HELD_MARK
    ));
    assert_internal_topic_refused(&o, &["held by an open transaction", "--start-offset 13"]);
    o.held_topic = None;
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert_eq!(cond(&s, REPLICATING).status, "True");
}

/// `Replicating` and `FailoverReady` are False with `InternalTopicRefused`, and their message
/// holds every one of `parts`.
fn assert_internal_topic_refused(o: &Observation, parts: &[&str]) {
    let s = status(None, o, &FailoverReadinessSpec::default(), None, &now());
    for condition in [REPLICATING, FAILOVER_READY] {
        let c = cond(&s, condition);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason::INTERNAL_TOPIC_REFUSED),
            "{condition}"
        );
        for part in parts {
            assert!(
                c.message.contains(part),
                "{condition}: {part} not in {}",
                c.message
            );
        }
    }
}
