use super::*;
use crate::api::MirrorFlowStatus;

const BASE: &str = "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1,Z:2'}\n";

fn flow(
    extra: &str,
    deployed: Option<&str>,
    generation: i64,
    accepted: Option<&str>,
) -> MirrorFlow {
    let spec: MirrorFlowSpec = serde_yaml::from_str(&format!("{BASE}{extra}")).unwrap();
    let mut mf = MirrorFlow::new("orders", spec);
    mf.metadata.namespace = Some("team".into());
    mf.metadata.generation = Some(generation);
    if let Some(v) = accepted {
        mf.metadata.annotations =
            Some([(ACCEPT_PLACEMENT_CHANGE.to_string(), v.to_string())].into());
    }
    mf.status = deployed.map(|d| MirrorFlowStatus {
        deployed_placement: Some(of(&serde_yaml::from_str(&format!("{BASE}{d}")).unwrap())),
        ..MirrorFlowStatus::default()
    });
    mf
}

#[test]
fn the_placement_is_read_from_the_spec_in_one_form() {
    let a = of(&serde_yaml::from_str(BASE).unwrap());
    assert_eq!(a.policy, "Prefix");
    assert_eq!(a.separator.as_deref(), Some("."));
    assert_eq!(a.target_bootstrap_servers, "y:1,z:2");
    let b = of(&serde_yaml::from_str(&BASE.replace("'y:1,Z:2'", "' z:2, y:1'")).unwrap());
    assert_eq!(
        a, b,
        "the same servers in another order are the same target"
    );
    let identity = of(&serde_yaml::from_str(&format!(
        "{BASE}replicationPolicy: {{type: Identity}}\n"
    ))
    .unwrap());
    assert_eq!(
        (identity.policy.as_str(), identity.separator),
        ("Identity", None)
    );
}

#[test]
fn each_move_is_held_naming_its_field_and_what_it_does() {
    type Edit = fn(&mut MirrorFlowSpec);
    let cases: [(Edit, &str, &str); 4] = [
        (
            |s| s.replication_policy.kind = PolicyKind::Identity,
            "spec.replicationPolicy.type",
            "named '<topic>' instead of 'a.<topic>'",
        ),
        (
            |s| s.replication_policy.separator = Some("_".into()),
            "spec.replicationPolicy.separator",
            "named 'a_<topic>' instead of 'a.<topic>'",
        ),
        (
            |s| s.target.alias = "c".into(),
            "spec.target.alias",
            "mm2-offset-syncs.c.internal instead of mm2-offset-syncs.b.internal",
        ),
        (
            |s| s.target.bootstrap_servers = "w:1".into(),
            "spec.target.bootstrapServers",
            "records would go to 'w:1' instead of 'y:1,z:2'",
        ),
    ];
    for (edit, field, says) in cases {
        let mut mf = flow("", Some(""), 7, None);
        edit(&mut mf.spec);
        let m = refused_change(&mf).unwrap_or_else(|| panic!("{field}: not held"));
        assert!(m.starts_with(&format!("{field}: this change moves")), "{m}");
        assert!(m.contains(says), "{field}: {m}");
        assert!(
            m.contains(
                "kubectl annotate mirrorflow orders -n team --overwrite mirrorflow.io/accept-placement-change=7"
            ),
            "{m}"
        );
    }
    let m = refused_change(&flow(
        "",
        Some("replicationPolicy: {type: Identity}\n"),
        2,
        None,
    ));
    assert!(m.is_some_and(|m| m.contains("instead of '<topic>'")));
    // A source alias under Prefix: new names and new internal topics.
    let mut mf = flow("", Some(""), 3, None);
    mf.spec.source.alias = "a2".into();
    let m = refused_change(&mf).unwrap_or_default();
    assert!(
        m.starts_with("spec.source.alias") && m.contains("'a2.<topic>'") && m.contains("'a2.*'"),
        "{m}"
    );
}

#[test]
fn unchanged_accepted_observed_or_first_deployments_pass() {
    assert_eq!(
        refused_change(&flow("", Some(""), 4, None)),
        None,
        "unchanged"
    );
    assert_eq!(
        refused_change(&flow("", None, 4, None)),
        None,
        "never deployed"
    );
    let identity = "replicationPolicy: {type: Identity}\n";
    assert_eq!(
        refused_change(&flow(identity, Some(""), 4, Some("4"))),
        None,
        "accepted for this generation"
    );
    assert!(
        refused_change(&flow(identity, Some(""), 5, Some("4"))).is_some(),
        "an acceptance of an earlier generation"
    );
    assert!(refused_change(&flow(identity, Some(""), 5, Some("yes"))).is_some());
    assert_eq!(
        refused_change(&flow(
            &format!("{identity}mode: Observe\n"),
            Some(""),
            4,
            None
        )),
        None,
        "an Observe flow copies nothing"
    );
    // Changes that do not move the copies.
    assert_eq!(
        refused_change(&flow("replicas: 3\ntopics: [x]\n", Some(""), 4, None)),
        None
    );
    let mut mf = flow("", Some(""), 4, None);
    mf.spec.source.bootstrap_servers = "other:1".into();
    assert_eq!(refused_change(&mf), None);
}
