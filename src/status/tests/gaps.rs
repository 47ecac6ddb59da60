//! Gaps in the copy and the alignment of offsets: `Gapless` and `OffsetsAligned`.

use super::*;

fn gap(topic: &str, kind: GapKind, detected_ms: i64) -> Gap {
    Gap {
        topic: topic.into(),
        partition: 0,
        kind,
        from: 10,
        to: 40,
        detected_ms,
    }
}

#[test]
fn gaps_make_gapless_false_with_the_newest_reason_until_acknowledged() {
    let limits = FailoverReadinessSpec::default();
    let clean = status(None, &healthy(), &limits, None, &now());
    assert_eq!(cond(&clean, GAPLESS).status, "True");
    assert_eq!(cond(&clean, GAPLESS).reason, reason::NO_GAPS);

    let t1 = 1_800_000_000_000;
    let found = Observation {
        name: "orders".into(),
        gaps: Some(vec![
            gap("b", GapKind::SourceRewound, t1 + 5_000),
            gap("a", GapKind::SourceTruncated, t1),
        ]),
        ..healthy()
    };
    let s = status(None, &found, &limits, None, &now());
    let c = cond(&s, GAPLESS);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reason::SOURCE_TOPIC_RECREATED)
    );
    assert!(c.message.contains("2 unacknowledged"), "{}", c.message);
    assert!(
        c.message.contains("kubectl annotate mirrorflow orders mirrorflow.io/gaps-acknowledged=2027-01-15T08:00:05Z"),
        "{}",
        c.message
    );
    assert_eq!(s.gaps.len(), 2);
    assert_eq!(s.gaps[0].topic, "a", "oldest first");
    assert_eq!(s.gaps[0].reason, "SourceTruncated");
    assert_eq!((s.gaps[0].from, s.gaps[0].to), (10, 40));
    assert!(s.gaps[0].message.contains("30 records are missing"));

    // The probe could not read the positions: the previous list stands.
    let unknown = Observation {
        gaps: None,
        ..found.clone()
    };
    let kept = status(Some(&s), &unknown, &limits, None, &now());
    assert_eq!(kept.gaps, s.gaps);
    assert_eq!(cond(&kept, GAPLESS).status, "False");

    // Acknowledging the older one leaves the newer; acknowledging both clears it.
    let partly = Observation {
        gaps_acknowledged: Some(Ok(t1)),
        ..found.clone()
    };
    let s2 = status(Some(&s), &partly, &limits, None, &now());
    assert_eq!(s2.gaps.len(), 1);
    assert_eq!(s2.gaps[0].topic, "b");
    let garbled = Observation {
        gaps_acknowledged: Some(Err(
            "annotation mirrorflow.io/gaps-acknowledged is 'yesterday'".into(),
        )),
        ..found.clone()
    };
    let s4 = status(Some(&s), &garbled, &limits, None, &now());
    assert_eq!(
        s4.gaps.len(),
        2,
        "a garbled acknowledgement acknowledges nothing"
    );
    assert!(cond(&s4, GAPLESS).message.contains("'yesterday'"));
    let all = Observation {
        gaps_acknowledged: Some(Ok(t1 + 5_000)),
        gaps: None,
        ..found
    };
    let s3 = status(Some(&s2), &all, &limits, None, &now());
    assert!(s3.gaps.is_empty());
    assert_eq!(cond(&s3, GAPLESS).status, "True");
}

#[test]
fn undeleted_fillers_are_a_gap_that_names_the_grant_and_leaves_alignment_alone() {
    let limits = FailoverReadinessSpec::default();
    let o = Observation {
        aligned: true,
        gaps: Some(vec![gap(
            "orders",
            GapKind::FillersNotDeleted,
            1_800_000_000_000,
        )]),
        ..healthy()
    };
    let s = status(None, &o, &limits, None, &now());
    let c = cond(&s, GAPLESS);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reason::FILLERS_NOT_DELETED)
    );
    assert!(
        c.message
            .contains("30 filler records at target offsets 10..40")
            && c.message.contains("DELETE on the remote topic"),
        "{}",
        c.message
    );
    assert_eq!(s.gaps[0].reason, reason::FILLERS_NOT_DELETED);
    assert_eq!(cond(&s, OFFSETS_ALIGNED).reason, reason::OFFSETS_MATCH);
}

#[test]
fn only_the_newest_gaps_are_listed() {
    let many: Vec<Gap> = (0..30)
        .map(|i| gap(&format!("t{i:02}"), GapKind::TargetRewound, 1_000 + i))
        .collect();
    let o = Observation {
        gaps: Some(many),
        ..healthy()
    };
    let s = status(None, &o, &FailoverReadinessSpec::default(), None, &now());
    assert_eq!(s.gaps.len(), MAX_LISTED_GAPS);
    assert_eq!(s.gaps[0].topic, "t10");
    assert_eq!(cond(&s, GAPLESS).reason, reason::TARGET_TOPIC_RECREATED);
    assert!(cond(&s, GAPLESS).message.starts_with("30 unacknowledged"));
}

#[test]
fn aligned_flows_report_offsets_aligned_and_a_break_is_not_a_gap() {
    let limits = FailoverReadinessSpec::default();
    let translated = status(None, &healthy(), &limits, None, &now());
    assert!(
        translated
            .conditions
            .iter()
            .all(|c| c.type_ != OFFSETS_ALIGNED),
        "only aligned flows report it"
    );
    let aligned = Observation {
        aligned: true,
        gaps: Some(vec![]),
        ..healthy()
    };
    let s = status(None, &aligned, &limits, None, &now());
    assert_eq!(cond(&s, OFFSETS_ALIGNED).status, "True");
    assert_eq!(cond(&s, OFFSETS_ALIGNED).reason, reason::OFFSETS_MATCH);

    let t = 1_800_000_000_000;
    let broken = Observation {
        gaps: Some(vec![
            Gap {
                from: 120,
                to: 125,
                ..gap("orders", GapKind::Misaligned, t)
            },
            gap("orders", GapKind::SourceTruncated, t + 1),
        ]),
        ..aligned.clone()
    };
    let s = status(None, &broken, &limits, None, &now());
    let c = cond(&s, OFFSETS_ALIGNED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reason::OFFSETS_MISALIGNED)
    );
    assert!(
        c.message.contains("orders[0]")
            && c.message
                .contains("source offset 120 landed at target offset 125"),
        "{}",
        c.message
    );
    // The truncation is a gap; the misalignment is not (nothing was skipped).
    assert_eq!(s.gaps.len(), 1);
    assert_eq!(s.gaps[0].reason, "SourceTruncated");
    // Acknowledging gaps does not hide a misalignment.
    let acknowledged = Observation {
        gaps_acknowledged: Some(Ok(t + 1)),
        ..broken
    };
    let s = status(None, &acknowledged, &limits, None, &now());
    assert_eq!(cond(&s, OFFSETS_ALIGNED).status, "False");
    assert_eq!(cond(&s, GAPLESS).status, "True");
}

#[test]
fn an_open_transaction_is_the_alignment_break_shown_with_its_fix() {
    let limits = FailoverReadinessSpec::default();
    let t = 1_800_000_000_000;
    let open = Observation {
        aligned: true,
        gaps: Some(vec![
            Gap {
                from: 120,
                to: 125,
                ..gap("orders", GapKind::Misaligned, t)
            },
            Gap {
                partition: 4,
                from: 22,
                to: 30,
                ..gap("payments", GapKind::OpenTransaction, t + 1)
            },
        ]),
        ..healthy()
    };
    let s = status(None, &open, &limits, None, &now());
    let c = cond(&s, OFFSETS_ALIGNED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reason::OFFSETS_MISALIGNED)
    );
    assert!(
        c.message.starts_with("2 partition(s) lost alignment")
            && c.message.contains("an open transaction: payments[4]")
            && c.message.contains(
                "abort --topic <remote topic of payments> --partition 4 --start-offset 22"
            ),
        "{}",
        c.message
    );
    // Nothing was skipped: neither break is a gap.
    assert!(s.gaps.is_empty());
    assert_eq!(cond(&s, GAPLESS).status, "True");
}

#[test]
fn unread_positions_keep_the_last_alignment_verdict() {
    let limits = FailoverReadinessSpec::default();
    let unknown = Observation {
        aligned: true,
        gaps: None,
        ..healthy()
    };
    let first = status(None, &unknown, &limits, None, &now());
    assert_eq!(
        cond(&first, OFFSETS_ALIGNED).reason,
        reason::ALIGNMENT_UNKNOWN
    );
    let known = Observation {
        gaps: Some(vec![]),
        ..unknown.clone()
    };
    let aligned = status(Some(&first), &known, &limits, None, &now());
    assert_eq!(cond(&aligned, OFFSETS_ALIGNED).status, "True");
    let again = status(Some(&aligned), &unknown, &limits, None, &now());
    assert_eq!(cond(&again, OFFSETS_ALIGNED).status, "True");
    assert_eq!(cond(&again, OFFSETS_ALIGNED).reason, reason::OFFSETS_MATCH);
}
