//! The control plane and the node (kubelet, containerd, runc) behave like a small real cluster:
//! Deployments become ReplicaSets and running, ready pods with their own network namespace;
//! pods see their env, volumes and service-account identity; `kubectl logs` and `exec` work;
//! crashed containers restart; garbage collection stops what a deleted Deployment owned.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use mirrorflow_e2e::node::{container_pid, process_alive};
use mirrorflow_e2e::{World, eventually, run, run_with_input, unique};

const WAIT: Duration = Duration::from_secs(90);

fn manifest(ns: &str, image: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: greeting, namespace: {ns}}}
data: {{message: hello-from-configmap}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: read-configmaps, namespace: {ns}}}
rules: [{{apiGroups: [""], resources: [configmaps], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: read-configmaps, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-configmaps}}
subjects: [{{kind: ServiceAccount, name: default, namespace: {ns}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: probe, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: probe}}}}
  template:
    metadata: {{labels: {{app: probe}}}}
    spec:
      terminationGracePeriodSeconds: 5
      volumes:
      - name: config
        configMap: {{name: greeting}}
      containers:
      - name: main
        image: {image}
        imagePullPolicy: Never
        env:
        - {{name: GREETING, value: hi}}
        - name: POD_NAME
          valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
        - name: POD_NAMESPACE
          valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}
        - name: POD_IP
          valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}
        volumeMounts:
        - {{name: config, mountPath: /etc/mirrorflow-e2e-config, readOnly: true}}
        ports: [{{name: http, containerPort: 8080}}]
        readinessProbe:
          httpGet: {{path: /, port: http}}
          periodSeconds: 1
        command:
        - sh
        - -c
        - |
          echo "env: POD_NAME=$POD_NAME POD_NAMESPACE=$POD_NAMESPACE POD_IP=$POD_IP GREETING=$GREETING"
          echo "mounted: $(cat /etc/mirrorflow-e2e-config/message)"
          SA=/var/run/secrets/kubernetes.io/serviceaccount
          echo "api: $(curl -sS --cacert $SA/ca.crt -H "Authorization: Bearer $(cat $SA/token)" \
            https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/$POD_NAMESPACE/configmaps/greeting | tr -d '\n ')"
          exec /usr/bin/python3 -m http.server 8080 --bind "$POD_IP"
"#
    )
}

fn restart_count(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn ready_pod(pods: &Api<Pod>) -> Result<Pod> {
    eventually("a Running, Ready pod", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=probe"))
            .await?;
        Ok(list.items.into_iter().find(|p| {
            is_ready(p) && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        }))
    })
    .await
}

#[tokio::test]
async fn a_deployment_runs_as_a_ready_pod_that_sees_env_volumes_and_the_apiserver() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-deploy");
    run("kubectl", &["create", "namespace", &ns])?;
    // Pods are admitted only once kube-controller-manager made the namespace's ServiceAccount.
    eventually("the default ServiceAccount", WAIT, || async {
        Ok(run("kubectl", &["get", "sa", "default", "-n", &ns]).ok())
    })
    .await?;
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &manifest(&ns, &world.tools_image),
    )?;

    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let rs = eventually("a ReplicaSet owned by the Deployment", WAIT, || async {
        Ok(replicasets
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .next())
    })
    .await?;
    let owner = rs.metadata.owner_references.unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "Deployment" && o.name == "probe")
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = ready_pod(&pods).await?;
    let name = pod.metadata.name.clone().context("pod name")?;
    let status = pod.status.clone().context("pod status")?;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("mirrorflow-node")
    );
    let ip = status.pod_ip.context("pod IP")?;
    let pod_range = std::env::var("NODE_POD_CIDR")?;
    let pod_prefix = pod_range.trim_end_matches("0/24");
    assert!(
        ip.starts_with(pod_prefix) && ip != format!("{pod_prefix}1"),
        "the pod has an address of its own in {pod_range}: {ip}"
    );

    let log = eventually("the container's log lines", WAIT, || async {
        let text = run("kubectl", &["logs", &name, "-n", &ns, "-c", "main"])?;
        Ok(text.contains("api: ").then_some(text))
    })
    .await?;
    assert!(
        log.contains(&format!(
            "POD_NAME={name} POD_NAMESPACE={ns} POD_IP={ip} GREETING=hi"
        )),
        "{log}"
    );
    assert!(log.contains("mounted: hello-from-configmap"), "{log}");
    // The apiserver answered the pod's own service-account token with the ConfigMap it may read.
    assert!(
        log.contains(r#""kind":"ConfigMap""#)
            && log.contains(r#""message":"hello-from-configmap""#),
        "{log}"
    );

    // exec runs in the container: its own hostname (the pod's name) and network namespace.
    let inside = run(
        "kubectl",
        &[
            "exec",
            &name,
            "-n",
            &ns,
            "-c",
            "main",
            "--",
            "sh",
            "-c",
            "hostname; readlink /proc/self/ns/net",
        ],
    )?;
    let host_netns = std::fs::read_link("/proc/self/ns/net")?;
    let mut lines = inside.lines();
    assert_eq!(lines.next(), Some(name.as_str()), "{inside}");
    assert_ne!(
        lines.next().map(std::path::PathBuf::from),
        Some(host_netns),
        "the container has a network namespace of its own: {inside}"
    );

    // A killed process is restarted by kubelet and counted.
    let pid = container_pid(&pod, "main")?;
    run("kill", &["-9", &pid.to_string()])?;
    let restarted = eventually(
        "restartCount to rise and the pod to be ready again",
        WAIT,
        || async {
            let p = pods.get(&name).await?;
            let restarted = restart_count(&p) >= 1 && is_ready(&p);
            Ok((restarted && container_pid(&p, "main").is_ok_and(|new| new != pid)).then_some(p))
        },
    )
    .await?;
    let new_pid = container_pid(&restarted, "main")?;
    assert!(process_alive(new_pid));

    // Deleting the Deployment garbage-collects the ReplicaSet and the pod, which stops the process.
    run(
        "kubectl",
        &["delete", "deployment", "probe", "-n", &ns, "--wait=false"],
    )?;
    eventually(
        "the pod to be gone and its process stopped",
        WAIT,
        || async {
            let left = pods
                .list(&ListParams::default().labels("app=probe"))
                .await?
                .items;
            Ok((left.is_empty() && !process_alive(new_pid)).then_some(()))
        },
    )
    .await?;
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}

#[tokio::test]
async fn helm_installs_a_local_chart() -> Result<()> {
    let world = World::from_env()?;
    let ns = unique("e2e-helm");
    let chart = world.repo_root.join("e2e/tests/charts/hello");
    let chart = chart.to_str().context("chart path")?;
    run(
        "helm",
        &[
            "install",
            "hello",
            chart,
            "-n",
            &ns,
            "--create-namespace",
            "--wait",
        ],
    )?;
    let value = run(
        "kubectl",
        &[
            "get",
            "configmap",
            "hello-greeting",
            "-n",
            &ns,
            "-o",
            "jsonpath={.data.greeting}",
        ],
    )?;
    assert_eq!(value, "hello-from-helm");
    let releases = run("helm", &["list", "-n", &ns, "-o", "json"])?;
    let releases: serde_json::Value = serde_json::from_str(&releases)?;
    if releases[0]["status"] != "deployed" {
        bail!("helm release not deployed: {releases}");
    }
    run("helm", &["uninstall", "hello", "-n", &ns, "--wait"])?;
    let gone = run("kubectl", &["get", "configmap", "-n", &ns, "-o", "name"])?;
    assert!(
        !gone.contains("hello-greeting"),
        "uninstall removed the chart's objects: {gone}"
    );
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}
