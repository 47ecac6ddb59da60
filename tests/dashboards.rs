//! The Grafana dashboard and the PrometheusRule alerts shipped in the chart query only metrics
//! the replicator and the operator export, so they cannot silently go blank after a rename.

use std::collections::BTreeSet;
use std::time::Duration;

use mirrorflow::api::MirrorFlowStatus;
use mirrorflow::operator::OperatorMetrics;
use mirrorflow::replicator::Metrics;
use mirrorflow::status::{GroupObservation, Observation};

const DASHBOARD: &str = include_str!("../charts/mirrorflow/dashboards/mirrorflow.json");
const ALERTS: &str = include_str!("../charts/mirrorflow/templates/prometheusrule.yaml");

/// `mirrorflow_*` names in a text, histogram series suffixes removed.
fn queried(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"mirrorflow_[a-z_]+").expect("static regex");
    re.find_iter(text)
        .map(|m| {
            let name = m.as_str();
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name)
                .to_string()
        })
        .collect()
}

/// Every family both registries export once each metric has a sample.
fn exported() -> BTreeSet<String> {
    let replicator = Metrics::new().expect("replicator metrics");
    replicator
        .group_checkpoint_age
        .with_label_values(&["g"])
        .set(1.0);
    replicator.errors.with_label_values(&["source", "x"]).inc();
    replicator
        .cluster_unreachable
        .with_label_values(&["source"])
        .set(0);
    replicator.verified_now();
    let operator = OperatorMetrics::new().expect("operator metrics");
    let obs = Observation {
        heartbeat_age: Some(Duration::from_secs(1)),
        replication_lag: Some(0),
        groups: vec![GroupObservation {
            group: "g".into(),
            checkpoint_age: Some(Duration::ZERO),
            replay_records: 0,
            uncopied_records: 0,
            invalidated_checkpoints: 0,
            conservative: Default::default(),
            verified: Default::default(),
            kind: None,
        }],
        ..Observation::default()
    };
    let status = MirrorFlowStatus {
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "FailoverReady".into(),
            status: "True".into(),
            reason: "AsExpected".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }],
        ..Default::default()
    };
    operator.record_flow("ns", "flow", &obs, &status, Duration::from_secs(30));
    operator.reconcile_errors.with_label_values(&["x"]).inc();
    replicator
        .registry
        .gather()
        .into_iter()
        .chain(operator.registry.gather())
        .map(|f| f.name().to_string())
        .collect()
}

#[test]
fn the_dashboard_and_alerts_query_exported_metrics_only() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| p.len() >= 10),
        "the dashboard has its panels"
    );
    let exported = exported();
    for (what, text) in [("dashboard", DASHBOARD), ("alerts", ALERTS)] {
        let names = queried(text);
        assert!(names.len() >= 2, "{what} queries metrics: {names:?}");
        let unknown: Vec<_> = names.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{what} queries metrics nobody exports: {unknown:?}"
        );
    }
}
