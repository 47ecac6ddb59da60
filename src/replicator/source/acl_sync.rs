//! Topic ACL sync (`spec.sourceLoop.syncTopicAcls`): the I/O around [`crate::kafka::acls`],
//! run by topic discovery every `topicsRefreshInterval`.
//!
//! A round reads the source's ALLOW bindings on literal topic names, keeps those of replicated
//! topics as MM2 would, and creates on the target what it lacks. It never removes a binding.
//! A source without an authorizer has nothing to copy; the target is only asked once there is.
//! Failures never stop topic replication: they are logged when they change, counted, and left
//! in `mirrorflow_topic_acls_missing`; the status probe reports them as a condition.

use rdkafka::error::RDKafkaErrorCode;

use super::topics::Mirrored;
use crate::kafka::acls;
use crate::kafka::admin::{Admin, AdminError};
use crate::replicator::metrics::Metrics;

pub struct AclSync {
    metrics: Metrics,
    /// The failure logged last, so a lasting one is logged once, not every round.
    last_failure: Option<String>,
}

fn code(e: &AdminError) -> Option<RDKafkaErrorCode> {
    match e {
        AdminError::Acl { source, .. } => Some(source.code),
        _ => None,
    }
}

/// Fails as CLUSTER_AUTHORIZATION_FAILED when the principal lacks a `needed` operation on the
/// cluster resource: DescribeAcls would answer "no bindings" instead ([`acls::lacking`]).
async fn forbidden_unless(admin: &Admin, needed: &[acls::Operation]) -> Result<(), AdminError> {
    let granted = admin.cluster_operations().await?;
    let lacking = acls::lacking(granted.as_deref(), needed);
    if lacking.is_empty() {
        return Ok(());
    }
    Err(AdminError::Acl {
        cluster: admin.side(),
        what: "checking the principal's operations on the cluster resource".into(),
        source: acls::AclError {
            code: RDKafkaErrorCode::ClusterAuthorizationFailed,
            message: format!("not granted {lacking:?} on the cluster"),
        },
    })
}

impl AclSync {
    pub fn new(metrics: Metrics) -> Self {
        AclSync {
            metrics,
            last_failure: None,
        }
    }

    pub async fn round(&mut self, source: &Admin, target: &Admin, mirrored: &[Mirrored]) {
        let missing = match self.sync(source, target, mirrored).await {
            Ok(missing) => {
                if self.last_failure.take().is_some() {
                    tracing::info!("topic ACL sync works again");
                }
                missing
            }
            Err((missing, e)) => {
                self.fail(&e);
                missing
            }
        };
        self.metrics
            .topic_acls_missing
            .set(i64::try_from(missing).unwrap_or(i64::MAX));
    }

    /// The number of bindings still missing on the target, or that and why.
    async fn sync(
        &self,
        source: &Admin,
        target: &Admin,
        mirrored: &[Mirrored],
    ) -> Result<usize, (usize, AdminError)> {
        forbidden_unless(source, acls::SOURCE_NEEDS)
            .await
            .map_err(|e| (0, e))?;
        let source_acls = match source.topic_acls().await {
            Ok(b) => b,
            // No authorizer on the source (most clusters): no ACLs, nothing to copy. (librdkafka
            // 2.12 answers "no bindings" then; a later one may say SECURITY_DISABLED.)
            Err(e) if code(&e) == Some(RDKafkaErrorCode::SecurityDisabled) => return Ok(0),
            Err(e) => return Err((0, e)),
        };
        let desired = acls::remote_bindings(&source_acls, |topic| {
            mirrored
                .iter()
                .find(|m| m.source == topic)
                .map(|m| m.remote.clone())
        });
        if desired.is_empty() {
            return Ok(0);
        }
        forbidden_unless(target, acls::TARGET_NEEDS)
            .await
            .map_err(|e| (desired.len(), e))?;
        let target_acls = target.topic_acls().await.map_err(|e| (desired.len(), e))?;
        let missing = acls::missing(&desired, &target_acls);
        if missing.is_empty() {
            return Ok(0);
        }
        let wanted = missing.len();
        let failures = target
            .create_acls(missing.clone())
            .await
            .map_err(|e| (wanted, e))?;
        let created = wanted.saturating_sub(failures.len());
        self.metrics
            .topic_acls_created
            .inc_by(u64::try_from(created).unwrap_or(u64::MAX));
        if failures.is_empty() {
            for b in &missing {
                tracing::info!(topic = %b.name, principal = %b.principal, host = %b.host,
                    operation = ?b.operation, "copied a topic ACL from the source");
            }
        }
        match failures.into_iter().next() {
            None => Ok(0),
            Some(first) => Err((wanted.saturating_sub(created), first)),
        }
    }

    fn fail(&mut self, e: &AdminError) {
        self.metrics
            .errors
            .with_label_values(&["source", "acl_sync"])
            .inc();
        let text = e.to_string();
        if self.last_failure.as_deref() != Some(text.as_str()) {
            let hint = match code(e) {
                Some(RDKafkaErrorCode::SecurityDisabled) => {
                    "the target has no authorizer: enable one, or set spec.sourceLoop.syncTopicAcls to false"
                }
                Some(RDKafkaErrorCode::ClusterAuthorizationFailed) => {
                    "grant the flow's principal DESCRIBE on the source's cluster resource and DESCRIBE and ALTER on the target's, or set spec.sourceLoop.syncTopicAcls to false"
                }
                _ => "retrying next round",
            };
            tracing::warn!(error = %e, hint, "topic ACL sync failed");
            self.last_failure = Some(text);
        }
    }
}
