//! Leader election with a coordination.k8s.io Lease: every replica runs, only the holder
//! reconciles. A holder that cannot renew in time exits, so two operators never write at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_EVERY: Duration = Duration::from_secs(5);

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    holder: String,
}

impl LeaseLock {
    pub fn new(client: kube::Client, namespace: &str, name: &str, holder: &str) -> Self {
        LeaseLock {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            holder: holder.into(),
        }
    }

    /// Blocks until this replica holds the lease.
    pub async fn acquire(&self) -> Result<(), kube::Error> {
        loop {
            if self.try_acquire_or_renew().await? {
                tracing::info!(lease = %self.name, holder = %self.holder, "became leader");
                return Ok(());
            }
            tokio::time::sleep(RENEW_EVERY).await;
        }
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
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.holder.as_str());
        let expired = spec
            .renew_time
            .map(|t| {
                let secs = spec
                    .lease_duration_seconds
                    .unwrap_or(LEASE_DURATION.as_secs() as i32);
                t.0.as_second() + i64::from(secs) < now.as_second()
            })
            .unwrap_or(true);
        if !ours && !expired {
            return Ok(false);
        }
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
            Ok(_) => Ok(true),
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
