//! The operator killed in the middle of a reconcile and started again (perhaps upgraded), and a
//! flow whose namespace is being deleted. A kill is a request the fake apiserver never answers:
//! that write and every later one never happen, and the reconcile is dropped where it waits.

use std::sync::atomic::AtomicUsize;

use super::*;

const IN_ORDER: [&str; 4] = [CM, SVC, STS, PDB];

/// Every write of a child or the status (not Events) after the first `writes` is never
/// answered: the operator dies there.
/// The counter it returns is how many such writes were asked for: past `writes`, the operator
/// waits where it died.
fn dies_after(
    writes: usize,
) -> (
    impl Fn(&Seen) -> Option<(StatusCode, Value)> + Send + 'static,
    Arc<AtomicUsize>,
) {
    let done = Arc::new(AtomicUsize::new(0));
    let asked = done.clone();
    let die = move |r: &Seen| {
        let counted = r.method == "PATCH" && !r.path.starts_with("/apis/events.k8s.io/");
        (counted && done.fetch_add(1, Ordering::SeqCst) >= writes).then(fake_apiserver::no_answer)
    };
    (die, asked)
}

/// Paths of every child written (applied or deleted) in `seen`.
fn child_paths(seen: &[Seen]) -> Vec<String> {
    wrote_children(seen)
        .into_iter()
        .filter_map(|w| w.split_once(' ').map(|(_, p)| p.to_string()))
        .collect()
}

/// The object at `path` is the flow's: controlled by it (the garbage collector removes it with
/// the flow) and labelled so that the operator's watches and a person find it.
fn assert_owned_and_labelled(children: &Children, path: &str) {
    let object: Value = children.get(path);
    assert_eq!(
        object["metadata"]["name"].as_str(),
        path.rsplit('/').next(),
        "{path}: named as its path (the apiserver refuses another name)"
    );
    let owners = &object["metadata"]["ownerReferences"];
    assert_eq!(owners.as_array().map(Vec::len), Some(1), "{path}: {owners}");
    assert_eq!(
        (&owners[0]["uid"], &owners[0]["controller"]),
        (&json!("uid-f"), &json!(true)),
        "{path}"
    );
    let labels = &object["metadata"]["labels"];
    assert_eq!(
        labels["app.kubernetes.io/managed-by"], "mirrorflow-operator",
        "{path}"
    );
    assert_eq!(labels[desired::FLOW_LABEL], "f", "{path}");
}

#[tokio::test]
async fn an_operator_killed_between_any_two_writes_leaves_one_set_of_owned_children_once_restarted()
{
    // 0-3: killed before the CM, SVC, STS or PDB; 4: after all four, before the status.
    for writes in 0..=IN_ORDER.len() {
        let children = Children::default();
        let (die, asked) = dies_after(writes);
        let dying = Fixture::sharing(children.clone(), die, |_| {});
        // Killed once it asked for the write it dies at (however long a loaded machine takes
        // to get there); it must not have finished by then.
        let died = async {
            while asked.load(Ordering::SeqCst) <= writes {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            finished = reconcile(Arc::new(flow()), dying.ctx.clone()) => {
                panic!("{writes}: the reconcile went on where it died: {finished:?}")
            }
            () = died => {}
            () = tokio::time::sleep(Duration::from_secs(60)) => {
                panic!("{writes}: the reconcile never reached the write it dies at")
            }
        }
        let before_kill = child_paths(&dying.requests());
        drop(dying);
        let mut left: Vec<String> = IN_ORDER[..writes].iter().map(|p| p.to_string()).collect();
        assert_eq!(
            children.paths(),
            sorted(&left),
            "{writes}: the kill left this"
        );
        for path in &left {
            assert_owned_and_labelled(&children, path);
        }

        // Started again, and upgraded meanwhile (another replicator image), the flow changed
        // while it was down (a new generation and resourceVersion): nothing is remembered but
        // what the apiserver holds, and nothing a name is made of may change with these.
        let restarted = Fixture::sharing(
            children.clone(),
            |_| None,
            |ctx| {
                ctx.replicator_image = "mirrorflow:next".into();
            },
        );
        let changed = flow_with(|v| {
            v["metadata"]["generation"] = json!(2);
            v["metadata"]["resourceVersion"] = json!("999");
            v["spec"]["replicas"] = json!(2);
        });
        restarted
            .reconcile(&changed)
            .await
            .expect("the restarted reconcile succeeds");
        let after = child_paths(&restarted.requests());
        assert_eq!(
            after, IN_ORDER,
            "{writes}: every child applied again, by name"
        );
        left = IN_ORDER.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            children.paths(),
            sorted(&left),
            "{writes}: one set, no child under a second name (written before the kill: {before_kill:?})"
        );
        for path in IN_ORDER {
            assert_owned_and_labelled(&children, path);
        }
        let sts: StatefulSet = children.get(STS);
        let image = sts
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|p| p.containers.first().and_then(|c| c.image.clone()));
        assert_eq!(image.as_deref(), Some("mirrorflow:next"), "{writes}");
    }
}

fn sorted(paths: &[String]) -> Vec<String> {
    let mut v = paths.to_vec();
    v.sort();
    v
}

#[tokio::test]
async fn a_restarted_operator_applies_the_same_children_so_nothing_rolls() {
    let children = Children::default();
    let first = Fixture::sharing(children.clone(), |_| None, |_| {});
    first
        .reconcile(&flow())
        .await
        .expect("the reconcile succeeds");
    let before = first.requests();
    drop(first);
    let again = Fixture::sharing(children, |_| None, |_| {});
    again
        .reconcile(&flow())
        .await
        .expect("the reconcile succeeds");
    let after = again.requests();
    let body = |seen: &[Seen], path: &str| {
        seen.iter()
            .find(|r| r.method == "PATCH" && r.path == path)
            .map(|r| r.body.clone())
            .unwrap_or_else(|| panic!("{path} applied"))
    };
    for path in IN_ORDER {
        // The pod template's config hash among them: a new process hashes as the old one did.
        assert_eq!(body(&before, path), body(&after, path), "{path}");
    }
}

/// The refusal of the NamespaceLifecycle admission for a namespace being deleted.
fn namespace_terminating() -> (StatusCode, Value) {
    (
        StatusCode::FORBIDDEN,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
            "code": 403,
            "message": "configmaps \"f-flow\" is forbidden: unable to create new content in namespace ns because it is being terminated",
            "details": {"name": "f-flow", "kind": "configmaps", "causes": [{
                "reason": "NamespaceTerminating", "field": "metadata.namespace",
                "message": "namespace ns is being terminated"}]}}),
    )
}

#[tokio::test]
async fn a_namespace_being_deleted_ends_the_reconcile_with_no_retry_no_status_and_no_event() {
    let fx = Fixture::with(
        |r| (r.method == "PATCH" && r.path == CM).then(namespace_terminating),
        |_| {},
    );
    let action = fx.reconcile(&flow()).await.expect("no error to retry");
    assert_eq!(
        action,
        Action::await_change(),
        "the flow's deletion ends it, nothing is requeued"
    );
    let seen = fx.requests();
    assert_eq!(wrote_children(&seen), [format!("PATCH {CM}")]);
    assert_eq!(status_writes(&seen), 0);
    assert_eq!(event_notes(&seen), Vec::<String>::new());
    assert_eq!(
        fx.ctx.per_flow_entries(),
        [0; 5],
        "nothing kept for a flow that goes"
    );
}

#[tokio::test]
async fn a_forbidden_write_for_any_other_reason_names_who_refused_in_the_status_and_is_tried_again()
{
    for (message, who) in [
        (
            "configmaps \"f-flow\" is forbidden: User \"system:serviceaccount:op:mirrorflow\" cannot patch resource \"configmaps\"",
            "may not write ConfigMap objects in namespace ns",
        ),
        (
            "configmaps \"f-flow\" is forbidden: exceeded quota: q, requested: configmaps=1, used: configmaps=1, limited: configmaps=1",
            "a ResourceQuota of namespace ns has no room",
        ),
        (
            "admission webhook \"policy.example.com\" denied the request: no",
            "an admission policy of the cluster refused it",
        ),
    ] {
        let fx = Fixture::with(
            move |r| {
                (r.method == "PATCH" && r.path == CM).then(|| {
                    (
                        StatusCode::FORBIDDEN,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "Forbidden", "code": 403, "message": message}),
                    )
                })
            },
            |_| {},
        );
        let action = fx
            .reconcile(&flow())
            .await
            .expect("told in the status, not an error");
        assert_eq!(action, Action::requeue(Duration::from_secs(60)));
        let seen = fx.requests();
        assert_eq!(wrote_children(&seen), [format!("PATCH {CM}")]);
        assert_eq!(status_writes(&seen), 1);
        let notes = event_notes(&seen);
        assert!(
            notes
                .iter()
                .any(|n| n.contains(who) && n.contains("f-flow")),
            "{who}: {notes:?}"
        );
    }
}
