//! The kubelet half: runs the pods bound to our node as local processes.

pub mod env;
pub mod image;
pub mod ippool;
mod pod;
pub mod probe;
pub mod process;
pub mod status;
pub mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use pod::{Update, Worker};

/// What all pod workers share.
pub struct Shared {
    pub client: Client,
    pub node: env::NodeFacts,
    pub state_dir: PathBuf,
    pub images: image::ImageMap,
    pub pool: Mutex<ippool::IpPool>,
    pub pids: process::PidFiles,
}

impl Shared {
    fn allocate_ip(&self, owner: &str, preferred: Option<&str>) -> Option<Ipv4Addr> {
        self.pool.lock().ok()?.allocate(owner, preferred)
    }

    fn release_ip(&self, owner: &str) {
        if let Ok(mut p) = self.pool.lock() {
            p.release(owner);
        }
    }
}

struct Entry {
    tx: mpsc::UnboundedSender<Update>,
    handle: tokio::task::JoinHandle<()>,
}

/// Watches the pods bound to our node and keeps one worker per pod until `shutdown` flips.
pub async fn run(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let config =
        watcher::Config::default().fields(&format!("spec.nodeName={}", shared.node.node_name));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut workers: BTreeMap<String, Entry> = BTreeMap::new();
    // Pods whose worker has ended (deleted by us): never start them again.
    let mut finished: BTreeSet<String> = BTreeSet::new();
    let mut relisted: BTreeSet<String> = BTreeSet::new();
    loop {
        let ev = tokio::select! {
            _ = shutdown.changed() => break,
            ev = stream.next() => ev,
        };
        let Some(ev) = ev else { break };
        workers.retain(|uid, e| {
            let done = e.handle.is_finished();
            if done {
                finished.insert(uid.clone());
            }
            !done
        });
        match ev {
            Err(e) => warn!(error = %e, "pod watch error (retrying)"),
            Ok(Event::Init) => relisted.clear(),
            Ok(Event::InitApply(p)) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    relisted.insert(uid);
                }
                apply(&shared, &mut workers, &finished, p);
            }
            Ok(Event::InitDone) => {
                for (uid, e) in &workers {
                    if !relisted.contains(uid) {
                        let _ = e.tx.send(Update::Gone);
                    }
                }
            }
            Ok(Event::Apply(p)) => apply(&shared, &mut workers, &finished, p),
            Ok(Event::Delete(p)) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    if let Some(e) = workers.get(uid) {
                        let _ = e.tx.send(Update::Gone);
                    }
                    finished.remove(uid);
                }
            }
        }
    }
    info!(pods = workers.len(), "kubelet stopping pods");
    for e in workers.values() {
        let _ = e.tx.send(Update::Shutdown);
    }
    for (_, e) in workers {
        let _ = e.handle.await;
    }
}

fn apply(
    shared: &Arc<Shared>,
    workers: &mut BTreeMap<String, Entry>,
    finished: &BTreeSet<String>,
    pod: Pod,
) {
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    if let Some(e) = workers.get(&uid) {
        let _ = e.tx.send(Update::Pod(Box::new(pod)));
        return;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let terminal = matches!(phase, Some("Succeeded") | Some("Failed"));
    if finished.contains(&uid) || (terminal && pod.metadata.deletion_timestamp.is_some()) {
        // Nothing runs for it here; make sure a terminating object goes away.
        if pod.metadata.deletion_timestamp.is_some() {
            let api: Api<Pod> = Api::namespaced(
                shared.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or("default"),
            );
            let name = pod.metadata.name.clone().unwrap_or_default();
            tokio::spawn(async move {
                let _ = api
                    .delete(&name, &DeleteParams::default().grace_period(0))
                    .await;
            });
        }
        return;
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let worker = Worker::new(shared.clone(), pod, uid.clone());
    let handle = tokio::spawn(worker.run(rx));
    workers.insert(uid, Entry { tx, handle });
}
