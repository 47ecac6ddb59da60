//! Leader election with a coordination.k8s.io Lease: every replica runs, only the holder
//! reconciles. A holder that cannot renew in time exits, so two operators never write at once.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How often a standby tries for the lease (client-go's retry period): a released lease is
/// taken within this, so the status stands still for less during a rollout.
pub const RETRY_EVERY: Duration = Duration::from_secs(2);
/// A holder that has not renewed for this long stops writing at once and exits: well inside
/// [`LEASE_DURATION`], so it is gone before a standby may take the lease.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    holder: String,
    /// The other holder's record as last read, and when (local monotonic clock) it was first
    /// seen unchanged: expiry is judged on this clock, never by comparing the remote
    /// `renewTime` with ours (clocks differ between nodes).
    observed: std::sync::Mutex<Option<(Observed, Instant)>>,
    /// When this replica last renewed (monotonic; a frozen process sees it age).
    renewed: std::sync::Mutex<Option<Instant>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<String>,
    lease_seconds: Option<i32>,
}

impl LeaseLock {
    pub fn new(client: kube::Client, namespace: &str, name: &str, holder: &str) -> Self {
        LeaseLock {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            holder: holder.into(),
            observed: Default::default(),
            renewed: Default::default(),
        }
    }

    /// Whether this replica renewed within [`RENEW_DEADLINE`]: checked before every write.
    pub fn leading(&self) -> bool {
        self.renewed
            .lock()
            .ok()
            .and_then(|r| *r)
            .is_some_and(|at| at.elapsed() < RENEW_DEADLINE)
    }

    /// How long ago this replica last renewed (`None`: never).
    pub fn since_renewed(&self) -> Option<Duration> {
        self.renewed
            .lock()
            .ok()
            .and_then(|r| *r)
            .map(|at| at.elapsed())
    }

    fn mark_renewed(&self, at: Instant) {
        if let Ok(mut r) = self.renewed.lock() {
            *r = Some(at);
        }
    }

    /// True once another holder's record has stayed the same for its lease duration, as
    /// measured here.
    fn other_expired(&self, seen: Observed) -> bool {
        let Ok(mut observed) = self.observed.lock() else {
            return false;
        };
        let duration = seen
            .lease_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(LEASE_DURATION, Duration::from_secs);
        match observed.as_ref() {
            Some((last, since)) if *last == seen => since.elapsed() > duration,
            _ => {
                *observed = Some((seen, Instant::now()));
                false
            }
        }
    }

    /// Blocks until this replica holds the lease: tried every [`RETRY_EVERY`], and at once
    /// whenever the Lease changes, so a lease its holder releases on a graceful stop is taken
    /// within a round trip instead of up to a poll later (the status stands still for that
    /// long during a rollout).
    pub async fn acquire(&self) -> Result<(), kube::Error> {
        let mut changes = std::pin::pin!(self.changes());
        loop {
            if self.try_acquire_or_renew().await? {
                tracing::info!(lease = %self.name, holder = %self.holder, "became leader");
                return Ok(());
            }
            tokio::select! {
                _ = tokio::time::sleep(RETRY_EVERY) => {}
                _ = changes.next() => {}
            }
        }
    }

    /// The Lease's changes that may let a standby take it, from a watch on it alone (RBAC:
    /// `list` and `watch` on this one name). A watch the apiserver refuses (an installer's
    /// Role without them) or drops is retried with kube's backoff and wakes nobody, so the
    /// poll alone remains; the stream never ends, so it cannot wake the loop in a spin either.
    fn changes(&self) -> impl futures::Stream<Item = ()> + use<> {
        use kube::runtime::{WatchStreamExt, watcher};
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        watcher(self.api.clone(), config)
            .default_backoff()
            .filter_map(|event| {
                futures::future::ready(match event {
                    Ok(watcher::Event::Apply(lease)) => may_be_taken(&lease).then_some(()),
                    Ok(watcher::Event::Delete(_)) => Some(()),
                    Ok(_) => None,
                    Err(e) => {
                        tracing::debug!(error = %e, "no watch on the leader lease; polling it");
                        None
                    }
                })
            })
            .chain(futures::stream::pending())
    }

    /// Takes the lease when it is free, expired or ours; false when another holder has it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": self.name},
                "spec": self.spec(now, true),
            }))
            .map_err(kube::Error::SerdeError)?;
            let asked = Instant::now();
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.mark_renewed(asked);
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.holder.as_str());
        let free = is_free(&spec);
        if !ours
            && !free
            && !self.other_expired(Observed {
                holder: spec.holder_identity.clone(),
                renew_time: spec.renew_time.as_ref().map(|t| t.0.to_string()),
                lease_seconds: spec.lease_duration_seconds,
            })
        {
            return Ok(false);
        }
        let asked = Instant::now();
        // The resourceVersion makes the update fail if another replica took it meanwhile.
        let patch = json!({
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": self.spec(now, !ours),
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                // The lease runs from when we asked, not from when the answer came.
                self.mark_renewed(asked);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (on a graceful stop) so a standby takes over at its next try instead
    /// of waiting for the lease to expire. Only a lease we still hold is touched.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.holder.as_str()) {
            return Ok(());
        }
        let patch = json!({
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {"holderIdentity": null, "renewTime": null},
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(lease = %self.name, "released the leader lease");
                Ok(())
            }
            // Someone else took it meanwhile: nothing left to give up.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn spec(&self, now: Timestamp, taking: bool) -> serde_json::Value {
        let mut spec = json!({
            "holderIdentity": self.holder,
            "leaseDurationSeconds": LEASE_DURATION.as_secs(),
            "renewTime": MicroTime(now),
        });
        if taking {
            spec["acquireTime"] = json!(MicroTime(now));
        }
        spec
    }
}

/// A lease nobody holds: released on a graceful stop (holder and renew time cleared).
fn is_free(spec: &k8s_openapi::api::coordination::v1::LeaseSpec) -> bool {
    spec.holder_identity.is_none() || spec.renew_time.is_none()
}

/// Whether a change of the Lease is worth a standby's try: it was released. A renewal (every
/// [`RENEW_EVERY`]) is not; the standby's own poll judges expiry, so a wake on each renewal
/// only added a read of the Lease per renewal per standby.
fn may_be_taken(lease: &Lease) -> bool {
    lease.spec.as_ref().is_none_or(is_free)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock() -> LeaseLock {
        // No request is made by the functions under test; any client will do.
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("a URL"));
        let client = kube::Client::try_from(config).expect("a client");
        LeaseLock::new(client, "ns", "l", "me")
    }

    fn record(renew: &str) -> Observed {
        Observed {
            holder: Some("other".into()),
            renew_time: Some(renew.into()),
            lease_seconds: Some(1),
        }
    }

    #[test]
    fn only_a_released_lease_wakes_a_standby() {
        let lease = |spec: serde_json::Value| -> Lease {
            serde_json::from_value(json!({"metadata": {"name": "l"}, "spec": spec}))
                .expect("a lease")
        };
        let renewed = lease(json!({"holderIdentity": "other",
            "renewTime": "2026-12-06T13:00:00.000000Z", "leaseDurationSeconds": 15}));
        assert!(!may_be_taken(&renewed), "a renewal wakes nobody");
        let released = lease(json!({"holderIdentity": null, "renewTime": null,
            "leaseDurationSeconds": 15}));
        assert!(may_be_taken(&released));
        let half_released = lease(json!({"holderIdentity": "other", "leaseDurationSeconds": 15}));
        assert!(may_be_taken(&half_released));
        let no_spec: Lease =
            serde_json::from_value(json!({"metadata": {"name": "l"}})).expect("a lease");
        assert!(may_be_taken(&no_spec));
    }

    #[tokio::test]
    async fn another_holder_expires_by_our_clock_only_while_its_record_stands_still() {
        let l = lock();
        // Its renewTime may be far in the past by our clock (skew): first sight is not expiry.
        assert!(!l.other_expired(record("2000-01-01T00:00:00Z")));
        std::thread::sleep(Duration::from_millis(1100));
        assert!(
            l.other_expired(record("2000-01-01T00:00:00Z")),
            "unchanged for its 1 s"
        );
        // A renewal (any change of the record) starts the wait again.
        assert!(!l.other_expired(record("2000-01-01T00:00:05Z")));
    }

    #[tokio::test]
    async fn leadership_lapses_at_the_renew_deadline() {
        let l = lock();
        assert!(!l.leading(), "never renewed");
        l.mark_renewed(Instant::now());
        assert!(l.leading());
        l.mark_renewed(Instant::now() - RENEW_DEADLINE - Duration::from_millis(1));
        assert!(!l.leading());
    }
}
