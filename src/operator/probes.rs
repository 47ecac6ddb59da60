//! How many probes run at once: one per flow, a few per namespace, a bounded number in all.
//!
//! A probe blocks a thread while it talks to the clusters. A flow whose broker accepts
//! connections and never answers must not make the operator start a second probe for it on
//! every reconcile, and a namespace full of such flows must not take every slot: the other
//! tenants' flows keep being probed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Probes running at once in the whole operator.
pub const MAX_PROBES: usize = 16;
/// Probes running at once for the flows of one namespace: a quarter of all, so three other
/// namespaces always find slots. A probe on shared, followed clients takes a few round trips,
/// and 4 lanes keep a namespace of hundreds of flows within the status interval.
pub const MAX_PROBES_PER_NAMESPACE: usize = 4;

pub struct Probes {
    running: Arc<Mutex<HashSet<String>>>,
    all: Arc<Semaphore>,
    per_namespace_limit: usize,
    per_namespace: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Default for Probes {
    fn default() -> Self {
        Probes::new(MAX_PROBES, MAX_PROBES_PER_NAMESPACE)
    }
}

/// A flow's probe is running while this lives.
pub struct Running {
    running: Arc<Mutex<HashSet<String>>>,
    key: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut r) = self.running.lock() {
            r.remove(&self.key);
        }
    }
}

/// The slots a running probe holds.
pub struct Slots {
    _namespace: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
}

impl Probes {
    pub fn new(all: usize, per_namespace: usize) -> Self {
        Probes {
            running: Default::default(),
            all: Arc::new(Semaphore::new(all)),
            per_namespace_limit: per_namespace,
            per_namespace: Mutex::new(HashMap::new()),
        }
    }

    /// Marks the flow's probe as running; `None` when one already is.
    pub fn claim(&self, flow_key: &str) -> Option<Running> {
        let mut r = self.running.lock().ok()?;
        r.insert(flow_key.to_string()).then(|| Running {
            running: self.running.clone(),
            key: flow_key.to_string(),
        })
    }

    /// A namespace slot, then an operator-wide one, waiting at most `wait` for both.
    pub async fn slots(&self, namespace: &str, wait: Duration) -> Option<Slots> {
        let ns = {
            let mut m = self.per_namespace.lock().ok()?;
            m.entry(namespace.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_namespace_limit)))
                .clone()
        };
        tokio::time::timeout(wait, async {
            let namespace = ns.acquire_owned().await.ok()?;
            let all = self.all.clone().acquire_owned().await.ok()?;
            Some(Slots {
                _namespace: namespace,
                _all: all,
            })
        })
        .await
        .ok()
        .flatten()
    }

    /// Forgets the slots of namespaces without flows (made again on use); a semaphore with
    /// permits out is kept, or its holders would count against nothing.
    pub fn retain_namespaces(&self, live: &HashSet<String>) {
        let limit = self.per_namespace_limit;
        if let Ok(mut m) = self.per_namespace.lock() {
            m.retain(|ns, s| live.contains(ns) || s.available_permits() < limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_probe_per_flow_at_a_time() {
        let p = Probes::default();
        let first = p.claim("ns/a").expect("free");
        assert!(p.claim("ns/a").is_none(), "still running");
        assert!(p.claim("ns/b").is_some(), "another flow");
        drop(first);
        assert!(p.claim("ns/a").is_some(), "free again when the probe ends");
    }

    #[tokio::test]
    async fn a_namespace_cannot_take_every_slot() {
        let p = Probes::new(3, 2);
        let wait = Duration::from_millis(50);
        let a1 = p.slots("tenant-a", wait).await.expect("slot");
        let _a2 = p.slots("tenant-a", wait).await.expect("slot");
        assert!(
            p.slots("tenant-a", wait).await.is_none(),
            "tenant-a is at its limit"
        );
        let _b1 = p
            .slots("tenant-b", wait)
            .await
            .expect("tenant-b still gets one");
        assert!(
            p.slots("tenant-c", wait).await.is_none(),
            "the operator is at its limit"
        );
        drop(a1);
        assert!(
            p.slots("tenant-c", wait).await.is_some(),
            "a slot came free"
        );
    }

    #[tokio::test]
    async fn idle_namespaces_are_forgotten_busy_ones_kept() {
        let p = Probes::new(4, 2);
        let wait = Duration::from_millis(50);
        let held = p.slots("busy", wait).await.expect("slot");
        drop(p.slots("idle", wait).await);
        p.retain_namespaces(&HashSet::new());
        let left: Vec<String> = p.per_namespace.lock().unwrap().keys().cloned().collect();
        assert_eq!(left, ["busy"]);
        drop(held);
    }
}
