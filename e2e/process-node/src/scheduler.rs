//! The scheduler half: binds every unscheduled pod to our node.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{info, warn};

/// Whether this scheduler is responsible for the pod.
pub fn wants(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let unbound = spec
        .and_then(|s| s.node_name.as_deref())
        .is_none_or(str::is_empty);
    let ours = spec
        .and_then(|s| s.scheduler_name.as_deref())
        .is_none_or(|n| n.is_empty() || n == "default-scheduler");
    unbound && ours && pod.metadata.deletion_timestamp.is_none()
}

async fn bind(client: &Client, pod: &Pod, node: &str) {
    let (Some(ns), Some(name)) = (
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
    ) else {
        return;
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    };
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            name,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => info!(pod = %format!("{ns}/{name}"), node, "pod bound"),
        // Already bound (a stale event) or gone: nothing to do.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
        Err(e) => warn!(pod = %format!("{ns}/{name}"), error = %e, "binding failed"),
    }
}

pub async fn run(client: Client, node: String, mut shutdown: watch::Receiver<bool>) {
    let api: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default()
        .fields("spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed");
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    loop {
        let ev = tokio::select! {
            _ = shutdown.changed() => return,
            ev = stream.next() => ev,
        };
        match ev {
            None => return,
            Some(Err(e)) => warn!(error = %e, "unscheduled-pod watch error (retrying)"),
            Some(Ok(Event::Apply(p) | Event::InitApply(p))) if wants(&p) => {
                bind(&client, &p, &node).await
            }
            Some(Ok(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn wants_only_unbound_default_scheduled_pods() {
        let pod = |node: Option<&str>, sched: Option<&str>| Pod {
            spec: Some(PodSpec {
                node_name: node.map(Into::into),
                scheduler_name: sched.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(wants(&pod(None, None)));
        assert!(wants(&pod(Some(""), Some("default-scheduler"))));
        assert!(!wants(&pod(Some("n"), None)));
        assert!(!wants(&pod(None, Some("other"))));
    }
}
