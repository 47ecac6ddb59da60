//! The NetworkPolicy child: applied before the replicators when the installer wants one, held
//! to the same foreign-child rule as the other children, and removed with them.

use super::*;
use crate::operator::network::ReplicatorNetwork;

/// A fixture whose installer wants the chart's default policy (scrapers: Prometheus pods in
/// the operator's namespace).
fn with_policy() -> Fixture {
    Fixture::with(
        |_| None,
        |ctx| {
            ctx.network = ReplicatorNetwork::from_json(
                r#"{"enabled": true, "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mirrorflow-system"}}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]}"#,
            )
            .expect("valid settings")
        },
    )
}

#[tokio::test]
async fn the_policy_is_applied_before_the_replicators_and_admits_only_the_scrapers() {
    let fx = with_policy();
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(
        wrote_children(&seen),
        [CM, SVC, NP, STS, PDB]
            .iter()
            .map(|p| format!("PATCH {p}"))
            .collect::<Vec<_>>()
    );
    let policy = seen
        .iter()
        .find(|r| r.method == "PATCH" && r.path == NP)
        .expect("the NetworkPolicy is applied");
    assert_eq!(
        policy.body["metadata"]["ownerReferences"][0]["uid"],
        "uid-f"
    );
    assert_eq!(
        policy.body["spec"]["podSelector"]["matchLabels"][desired::FLOW_LABEL],
        "f"
    );
    assert_eq!(policy.body["spec"]["policyTypes"], json!(["Ingress"]));
    let rule = &policy.body["spec"]["ingress"][0];
    assert_eq!(rule["ports"], json!([{"port": 9464, "protocol": "TCP"}]));
    assert_eq!(
        rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "prometheus"
    );
    assert_eq!(
        policy.body["spec"]["ingress"].as_array().map(Vec::len),
        Some(1)
    );
}

#[tokio::test]
async fn a_foreign_network_policy_of_the_name_stops_the_apply_and_is_left_alone() {
    let fx = with_policy();
    // The tenant's own policy, say one that opens egress for their app.
    let mut theirs = child(NP, "uid-app");
    theirs["metadata"]["ownerReferences"] = json!([]);
    fx.children.put(NP, theirs);
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(wrote_children(&seen), Vec::<String>::new());
    let (status, _) = written(&seen);
    let ready = condition(&status, status::READY);
    assert_eq!(ready["reason"], reason::CHILD_CONFLICT);
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("the NetworkPolicy 'f'")),
        "{ready}"
    );
    let observe = flow_with(|v| v["spec"]["mode"] = json!("Observe"));
    fx.reconcile(&observe)
        .await
        .expect("the reconcile succeeds");
    assert_eq!(wrote_children(&fx.requests()), Vec::<String>::new());
    assert_eq!(fx.children.paths(), [NP]);
}

#[tokio::test]
async fn observe_mode_removes_the_flows_policy_with_its_replicators() {
    let fx = with_policy();
    for path in [CM, STS, NP] {
        fx.children.put(path, child(path, "uid-f"));
    }
    let observe = flow_with(|v| v["spec"]["mode"] = json!("Observe"));
    fx.reconcile(&observe)
        .await
        .expect("the reconcile succeeds");
    assert!(
        wrote_children(&fx.requests()).contains(&format!("DELETE {NP}")),
        "the policy goes"
    );
    assert_eq!(fx.children.paths(), Vec::<String>::new());
}

#[tokio::test]
async fn a_policy_the_installer_turned_off_is_deleted_at_the_next_apply() {
    // The operator runs without a policy now; the flow's earlier one is still there.
    let fx = Fixture::new();
    fx.children.put(NP, child(NP, "uid-f"));
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    let writes = wrote_children(&fx.requests());
    assert!(writes.contains(&format!("DELETE {NP}")), "{writes:?}");
    assert!(!fx.children.paths().contains(&NP.to_string()));
    // A foreign one of that name is not touched.
    let fx = Fixture::new();
    let mut theirs = child(NP, "uid-app");
    theirs["metadata"]["ownerReferences"] = json!([]);
    fx.children.put(NP, theirs);
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    assert_eq!(wrote_children(&fx.requests()), applies_of_all_four());
}

#[tokio::test]
async fn a_bootstrap_server_at_a_denied_address_is_never_connected_to() {
    let (client, seen) = fake_apiserver::client(serve(|_| None));
    let mut ctx = bare_context(client);
    ctx.addresses =
        guards::addresses::AddressPolicy::from_flags(&[], &["169.254.169.254/32".into()])
            .expect("a valid policy");
    let ctx = Arc::new(ctx);
    let mut metadata = flow();
    metadata.spec.target.bootstrap_servers = "b.example:9092,169.254.169.254:80".into();
    let action = reconcile(Arc::new(metadata), ctx.clone())
        .await
        .expect("the reconcile succeeds");
    let seen: Vec<Seen> = seen.lock().map(|s| s.clone()).unwrap_or_default();
    // Refused before the Secrets are read and before any cluster id look-up or probe.
    assert!(
        !seen.iter().any(|r| r.path.contains("/secrets/")),
        "{seen:?}"
    );
    assert_eq!(ctx.probe_clients.len(), 0, "no Kafka client was made");
    assert_eq!(wrote_children(&seen), Vec::<String>::new());
    let (status, events) = written(&seen);
    let ready = condition(&status, status::READY);
    assert_eq!(ready["reason"], reason::ADDRESS_NOT_ALLOWED);
    assert!(
        ready["message"].as_str().is_some_and(|m| m.starts_with(
            "spec.target.bootstrapServers: '169.254.169.254:80' resolves to an address"
        )),
        "{ready}"
    );
    assert!(events.contains(&("Warning".into(), reason::ADDRESS_NOT_ALLOWED.into())));
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
}
