//! The reconcile when it refuses or holds a flow (resources beyond the installer's bounds, a
//! placement change), a flow goes away, the apiserver fails, the lease lapsed or no probe slot
//! came in time.

use super::*;

#[tokio::test]
async fn replicas_zero_is_refused_by_field_and_leaves_running_replicators_alone() {
    let mut fx = Fixture::new();
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    fx.watches_see_the_children();
    fx.requests();
    let zero = flow_with(|v| {
        v["metadata"]["generation"] = json!(2);
        v["spec"]["replicas"] = json!(0);
    });
    let action = fx.reconcile(&zero).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(wrote_children(&seen), Vec::<String>::new());
    assert_eq!(children_read(&seen), Vec::<String>::new());
    assert_eq!(fx.children.paths().len(), 4, "the replicators keep running");
    let (status, events) = written(&seen);
    let ready = condition(&status, status::READY);
    assert_eq!(ready["reason"], reason::INVALID_SPEC);
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.replicas") && m.contains("1 to 64")),
        "{ready}"
    );
    assert_eq!(ready["observedGeneration"], 2);
    assert!(events.contains(&("Warning".into(), reason::INVALID_SPEC.into())));
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
}

#[tokio::test]
async fn a_flow_being_deleted_is_left_to_the_garbage_collector() {
    let fx = Fixture::new();
    let deleted = flow_with(|v| v["metadata"]["deletionTimestamp"] = json!("2026-12-01T08:00:00Z"));
    let action = fx
        .reconcile(&deleted)
        .await
        .expect("the reconcile succeeds");
    assert_eq!(action, Action::await_change());
    let seen = fx.requests();
    assert!(seen.is_empty(), "children carry owner references: {seen:?}");
}

#[tokio::test]
async fn a_deleted_flow_leaves_nothing_kept_per_flow() {
    let fx = Fixture::new();
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    let [ids, status, _, applied, _] = fx.ctx.per_flow_entries();
    assert_eq!(
        (ids, status, applied),
        (1, 1, 1),
        "a deployed flow is remembered"
    );
    let deleted = flow_with(|v| v["metadata"]["deletionTimestamp"] = json!("2026-12-01T08:00:00Z"));
    // The test's reconcile records the cluster ids first, as a real one asks them.
    tokio::time::timeout(
        Duration::from_secs(30),
        reconcile(Arc::new(deleted), fx.ctx.clone()),
    )
    .await
    .expect("the reconcile ends")
    .expect("the reconcile succeeds");
    assert_eq!(fx.ctx.per_flow_entries(), [0; 5]);
}

#[tokio::test]
async fn pruning_forgets_gone_flows_in_every_map() {
    let fx = Fixture::new();
    for key in ["ns/f", "ns/gone"] {
        fx.ctx.remember_cluster_ids(key, Some(1), fx.ids.clone());
        if let Ok(mut m) = fx.ctx.last_status.lock() {
            m.insert(key.into(), Default::default());
        }
        if let Ok(mut m) = fx.ctx.removed.lock() {
            m.insert(key.into(), Instant::now());
        }
    }
    // A flow that failed before its first status is known to `failures` alone.
    fx.ctx.record_failure("ns/failing".into());
    fx.ctx
        .retain_flows(&["ns/f".to_string()].into_iter().collect());
    assert_eq!(fx.ctx.per_flow_entries(), [1, 1, 0, 0, 1]);
    assert!(fx.ctx.cluster_ids_of("ns/f").is_some());
}

#[tokio::test]
async fn source_and_target_on_one_cluster_keep_no_replicator() {
    let mut fx = Fixture::new();
    fx.ids = guards::ClusterIds {
        source: Some("one-cluster".into()),
        target: Some("one-cluster".into()),
    };
    fx.children.put(STS, child(STS, "uid-f"));
    let action = fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(wrote_children(&seen), [format!("DELETE {STS}")]);
    let (status, events) = written(&seen);
    assert_eq!(
        condition(&status, status::READY)["reason"],
        reason::SAME_CLUSTER
    );
    assert!(events.contains(&("Warning".into(), reason::SAME_CLUSTER.into())));
    assert_eq!(status["replicas"], 0, "the operator runs none: {status}");
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
}

#[tokio::test]
async fn the_later_of_two_flows_sharing_internal_topics_keeps_no_replicator() {
    let mut fx = Fixture::new();
    let older = flow_with(|v| {
        v["metadata"]["name"] = json!("e");
        v["metadata"]["uid"] = json!("uid-e");
        v["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    });
    fx.flows.apply_watcher_event(&watcher::Event::Apply(older));
    let later = flow_with(|v| v["metadata"]["creationTimestamp"] = json!("2026-02-01T00:00:00Z"));
    let action = fx.reconcile(&later).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    assert!(
        wrote_children(&seen)
            .iter()
            .all(|w| w.starts_with("DELETE")),
        "{seen:?}"
    );
    let (status, _) = written(&seen);
    let ready = condition(&status, status::READY);
    assert_eq!(ready["reason"], reason::CONFLICTING_FLOW);
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("spec.source.alias") && m.contains("'ns/e'")),
        "{ready}"
    );
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
}

#[tokio::test]
async fn a_child_the_apiserver_refuses_is_told_as_the_flow_field_and_applied_again_next_time() {
    let fx = Fixture::with(
        |r| {
            (r.method == "PATCH" && r.path == STS).then(|| {
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "Invalid", "code": 422,
                        "message": "StatefulSet.apps \"f\" is invalid: spec.template.spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit",
                        "details": {"name": "f", "group": "apps", "kind": "StatefulSet",
                            "causes": [{"reason": "FieldValueInvalid", "message": "must be less than or equal to cpu limit",
                                "field": "spec.template.spec.containers[0].resources.requests"}]}}),
                )
            })
        },
        |_| {},
    );
    let action = fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(
        wrote_children(&seen),
        [CM, SVC, STS].map(|p| format!("PATCH {p}")),
        "nothing after the refused child"
    );
    let (status, events) = written(&seen);
    let ready = condition(&status, status::READY);
    assert_eq!(ready["reason"], reason::CHILD_REJECTED);
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("spec.resources") && m.contains("fix spec.resources")),
        "{ready}"
    );
    assert!(events.contains(&("Warning".into(), reason::CHILD_REJECTED.into())));
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));

    // Not recorded as applied: the next reconcile tries again.
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    assert_eq!(
        wrote_children(&fx.requests()),
        [CM, SVC, STS].map(|p| format!("PATCH {p}"))
    );
}

#[tokio::test]
async fn an_apiserver_error_while_applying_is_an_error_to_retry_not_a_condition() {
    let fx = Fixture::with(
        |r| (r.method == "PATCH" && r.path == CM).then(apiserver_failure),
        |_| {},
    );
    let error = fx
        .reconcile(&flow())
        .await
        .expect_err("the reconcile fails");
    assert!(matches!(error, Error::Kube(_)), "{error}");
    assert_eq!(error.metric_label(), "apiserver");
    let seen = fx.requests();
    assert_eq!(status_writes(&seen), 0, "a hiccup is no condition");
    assert_eq!(wrote_children(&seen), [format!("PATCH {CM}")]);
}

#[tokio::test]
async fn a_failed_status_write_is_an_error_retried_with_backoff_and_written_next_time() {
    let failing = Arc::new(AtomicBool::new(true));
    let fails = failing.clone();
    let fx = Fixture::with(
        move |r| {
            (fails.load(Ordering::SeqCst) && r.method == "PATCH" && r.path.ends_with("/status"))
                .then(apiserver_failure)
        },
        |_| {},
    );
    let mf = Arc::new(flow());
    for expected in [5, 10] {
        let error = fx.reconcile(&mf).await.expect_err("the reconcile fails");
        assert!(matches!(error, Error::Kube(_)), "{error}");
        assert_eq!(
            crate::operator::error_policy(mf.clone(), &error, fx.ctx.clone()),
            Action::requeue(Duration::from_secs(expected))
        );
    }
    assert_eq!(status_writes(&fx.requests()), 2, "each reconcile tried");

    failing.store(false, Ordering::SeqCst);
    let action = fx.reconcile(&mf).await.expect("the reconcile succeeds");
    assert_eq!(action, Action::requeue(STATUS_INTERVAL));
    let (status, _) = written(&fx.requests());
    assert_eq!(status["observedGeneration"], 1);
    // A success resets the backoff.
    let error = Error::NotNamespaced;
    assert_eq!(
        crate::operator::error_policy(mf, &error, fx.ctx.clone()),
        Action::requeue(Duration::from_secs(5))
    );
}

#[tokio::test]
async fn a_replica_whose_lease_lapsed_writes_nothing() {
    let fx = Fixture::with(
        |_| None,
        |ctx| {
            // Never acquired: as good as lapsed.
            ctx.lease = Some(Arc::new(lease::LeaseLock::new(
                ctx.client.clone(),
                "ns",
                "mirrorflow-operator",
                "me",
            )))
        },
    );
    let action = fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    assert_eq!(action, Action::requeue(lease::RENEW_EVERY));
    let seen = fx.requests();
    assert!(seen.is_empty(), "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn without_a_probe_slot_in_time_the_status_stays_as_last_measured_and_is_retried_in_5s() {
    let mut fx = Fixture::with(
        |_| None,
        // No slot ever comes free.
        |ctx| ctx.probes = probes::Probes::new(0, 0),
    );
    fx.probe = None;
    let action = fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    let seen = fx.requests();
    assert_eq!(status_writes(&seen), 0, "nothing measured, nothing said");
    assert_eq!(wrote_children(&seen), applies_of_all_four());
}

#[test]
fn the_verdict_and_the_mode_decide_whether_replicators_run_stop_or_stay() {
    let spec = flow_with(|v| {
        if let Some(source) = v["spec"]["source"].as_object_mut() {
            source.remove("sasl");
        }
    })
    .spec;
    let resolved = flow::resolve(
        "ns/f".into(),
        spec,
        &SecretFiles::from_values(BTreeMap::new()),
    )
    .expect("a flow without Secrets resolves");
    let children = || ChildInputs {
        versions: BTreeMap::from([("creds".to_string(), "7".to_string())]),
        resources: guards::ResourcePolicy::default().default,
    };
    let deploy = Check::Deploy(Box::new(resolved), children());
    let blocked = || Blocked::new(reason::INVALID_SPEC, "spec.replicas: 0 is out of range");
    assert_eq!(workload(&deploy, false), Workload::Apply(&children()));
    assert_eq!(workload(&deploy, true), Workload::Remove, "Observe");
    assert_eq!(
        workload(&Check::Stop(blocked()), false),
        Workload::Remove,
        "harmful"
    );
    assert_eq!(workload(&Check::Stop(blocked()), true), Workload::Remove);
    assert_eq!(
        workload(&Check::Hold(blocked()), false),
        Workload::Keep,
        "a spec error keeps what ran"
    );
    assert_eq!(workload(&Check::Hold(blocked()), true), Workload::Keep);
}

#[tokio::test]
async fn a_child_name_taken_by_an_object_of_someone_else_is_neither_changed_nor_deleted() {
    for path in [CM, SVC, STS, PDB] {
        let fx = Fixture::new();
        // The tenant's app owns a PDB (or a ConfigMap, ...) of the name the flow's child needs.
        let mut theirs = child(path, "uid-app");
        theirs["metadata"]["ownerReferences"] = json!([]);
        fx.children.put(path, theirs.clone());
        let action = fx.reconcile(&flow()).await.expect("the reconcile succeeds");
        let seen = fx.requests();
        assert_eq!(wrote_children(&seen), Vec::<String>::new(), "{path}");
        let (status, events) = written(&seen);
        let ready = condition(&status, status::READY);
        assert_eq!(ready["reason"], reason::CHILD_CONFLICT, "{path}");
        assert!(
            ready["message"]
                .as_str()
                .is_some_and(|m| m.contains("exists and does not belong to this flow")),
            "{ready}"
        );
        assert!(events.contains(&("Warning".into(), reason::CHILD_CONFLICT.into())));
        assert_eq!(action, Action::requeue(Duration::from_secs(60)));
        // Switching the flow to Observe (removal) leaves the foreign object too.
        let observe = flow_with(|v| v["spec"]["mode"] = json!("Observe"));
        fx.reconcile(&observe)
            .await
            .expect("the reconcile succeeds");
        assert_eq!(
            wrote_children(&fx.requests()),
            Vec::<String>::new(),
            "{path}"
        );
        assert_eq!(fx.children.paths(), vec![path.to_string()]);
    }
}

#[tokio::test]
async fn a_later_flow_the_other_way_never_removes_an_older_running_flow() {
    let mut fx = Fixture::new();
    let identity = |v: &mut Value| {
        v["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        v["spec"]["replicationPolicy"] = json!({"type": "Identity"});
    };
    fx.reconcile(&flow_with(identity))
        .await
        .expect("the reconcile succeeds");
    fx.watches_see_the_children();
    fx.requests();
    // Another tenant's flows pointing back: Observe (copies nothing) and Replicate, both later.
    for (name, mode) in [("watch", "Observe"), ("back", "Replicate")] {
        let reverse: MirrorFlow = serde_json::from_value(json!({
            "apiVersion": "mirrorflow.io/v1alpha1", "kind": "MirrorFlow",
            "metadata": {"name": name, "namespace": "tenant-b", "uid": format!("uid-{name}"),
                "generation": 1, "creationTimestamp": "2026-02-01T00:00:00Z"},
            "spec": {
                "mode": mode,
                "source": {"alias": "b", "bootstrapServers": "b.example:9092"},
                "target": {"alias": "a", "bootstrapServers": "a.example:9092"},
            },
        }))
        .expect("a valid MirrorFlow");
        fx.flows
            .apply_watcher_event(&watcher::Event::Apply(reverse));
    }
    fx.reconcile(&flow_with(identity))
        .await
        .expect("the reconcile succeeds");
    let seen = fx.requests();
    assert!(
        !wrote_children(&seen)
            .iter()
            .any(|w| w.starts_with("DELETE")),
        "{seen:?}"
    );
    assert_eq!(
        fx.children.paths().len(),
        4,
        "the older flow's replicators stay"
    );
    let (status, _) = written(&seen);
    assert_ne!(
        condition(&status, status::READY)["reason"],
        reason::REPLICATION_LOOP
    );
}

#[tokio::test]
async fn a_held_flow_whose_secret_owner_withdrew_the_opt_in_keeps_no_replicator() {
    let withdrawn = Arc::new(AtomicBool::new(false));
    let flag = withdrawn.clone();
    let mut fx = Fixture::with(
        move |r| {
            (flag.load(Ordering::SeqCst) && r.method == "GET" && r.path == SECRET).then(|| {
                let mut s = opted_in_secret();
                s["metadata"]["annotations"] = json!({});
                (StatusCode::OK, s)
            })
        },
        |_| {},
    );
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    fx.watches_see_the_children();
    fx.requests();
    // An invalid edit holds the flow: its replicators keep running...
    let invalid = flow_with(|v| {
        v["metadata"]["generation"] = json!(2);
        v["spec"]["replicas"] = json!(0);
    });
    fx.reconcile(&invalid)
        .await
        .expect("the reconcile succeeds");
    assert_eq!(wrote_children(&fx.requests()), Vec::<String>::new());
    // ...until the Secret they mount no longer allows this flow.
    withdrawn.store(true, Ordering::SeqCst);
    fx.reconcile(&invalid)
        .await
        .expect("the reconcile succeeds");
    let seen = fx.requests();
    assert!(
        wrote_children(&seen).contains(&format!("DELETE {STS}")),
        "{seen:?}"
    );
    let (status, _) = written(&seen);
    assert_eq!(
        condition(&status, status::READY)["reason"],
        reason::SECRET_NOT_SHARED
    );
}

#[tokio::test]
async fn resources_above_the_installers_maximum_are_refused_before_anything_is_read() {
    let (seen, observe_reads) = (reconcile_big(false).await, reconcile_big(true).await);
    // An Observe flow runs no pod: its resources are not judged, so it goes on to its Secrets.
    assert!(
        observe_reads.iter().any(|r| r.path.contains("/secrets/")),
        "{observe_reads:?}"
    );
    assert!(seen.iter().all(|r| r.method != "GET"), "{seen:?}");
    assert_eq!(wrote_children(&seen), Vec::<String>::new());
    let (status, events) = written(&seen);
    assert!(
        reasons(&status)
            .iter()
            .any(|(t, r)| t == status::READY && r == reason::RESOURCES_NOT_ALLOWED),
        "{status}"
    );
    assert!(
        status["conditions"][0]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("spec.resources.limits.memory: 64Gi")),
        "{status}"
    );
    assert!(events.contains(&("Warning".into(), reason::RESOURCES_NOT_ALLOWED.into())));
}

/// What one reconcile of a flow asking for 64Gi (at most 1Gi allowed) asked the apiserver.
async fn reconcile_big(observe: bool) -> Vec<Seen> {
    let (client, seen) = fake_apiserver::client(serve(|_| None));
    let mut ctx = bare_context(client);
    ctx.resources = guards::ResourcePolicy::from_flags(
        &[],
        &["memory=512Mi".into()],
        &["memory=1Gi".into()],
        true,
    )
    .expect("a valid policy");
    let mut big = flow();
    big.spec.resources =
        serde_json::from_value(json!({"limits": {"memory": "64Gi"}})).expect("resources");
    if observe {
        big.spec.mode = crate::api::FlowMode::Observe;
    }
    reconcile(Arc::new(big), Arc::new(ctx))
        .await
        .expect("the reconcile succeeds");
    seen.lock().map(|s| s.clone()).unwrap_or_default()
}

#[tokio::test]
async fn a_placement_change_on_a_running_flow_is_held_keeping_its_replicators() {
    let (client, seen) = fake_apiserver::client(serve(events_and_status));
    let ctx = context(client);
    let mut moved = flow();
    moved.status = Some(MirrorFlowStatus {
        deployed_placement: Some(flow::placement::of(&moved.spec)),
        ..MirrorFlowStatus::default()
    });
    moved.metadata.generation = Some(2);
    moved.spec.replication_policy.kind = crate::api::PolicyKind::Identity;
    reconcile(Arc::new(moved.clone()), ctx.clone())
        .await
        .expect("the reconcile succeeds");
    let requests: Vec<Seen> = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        wrote_children(&requests).is_empty(),
        "held: the running replicators are neither changed nor deleted: {requests:?}"
    );
    let (status, _) = written(&requests);
    let ready = condition(&status, status::READY);
    assert_eq!(ready["reason"], reason::PLACEMENT_CHANGED, "{status}");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("spec.replicationPolicy.type: this change moves")
            && message.contains("accept-placement-change=2"),
        "{message}"
    );
    assert_eq!(status["deployedPlacement"]["policy"], "Prefix", "{status}");
    // Accepted for this generation: no longer held by the placement.
    let mut accepted = moved;
    accepted.metadata.annotations = Some(
        [(
            flow::placement::ACCEPT_PLACEMENT_CHANGE.to_string(),
            "2".to_string(),
        )]
        .into(),
    );
    let (client, seen) = fake_apiserver::client(serve(events_and_status));
    reconcile(Arc::new(accepted), context(client))
        .await
        .expect("the reconcile succeeds");
    let requests: Vec<Seen> = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let (status, _) = written(&requests);
    assert_ne!(
        condition(&status, status::READY)["reason"],
        reason::PLACEMENT_CHANGED,
        "{status}"
    );
}
