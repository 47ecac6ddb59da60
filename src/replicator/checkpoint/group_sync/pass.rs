//! What one group sync pass works with: the groups due ([`DueGroup`]) and its own connection to
//! the target ([`OwnTarget`], for share groups, which librdkafka cannot set).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::mm2::TopicPartition;
use crate::replicator::kafka_io::Reachability;

/// A group a pass syncs: its latest checkpoints, its partitions without a translation, and
/// whether it is a share group.
pub(super) struct DueGroup {
    pub(super) group: String,
    pub(super) checkpoints: BTreeMap<TopicPartition, i64>,
    pub(super) uncovered: usize,
    pub(super) share: bool,
}

/// The target as the project's own connections reach it, for share groups (librdkafka has no
/// call for their start offsets); `None` when they do not speak its security settings.
#[derive(Debug, Clone)]
pub struct ShareTarget {
    pub bootstrap: String,
    pub security: mirrorflow_conn::Security,
    pub client_id: String,
}

impl ShareTarget {
    /// A connection to the target (nothing is connected yet).
    pub fn cluster(
        &self,
        timeout: Duration,
    ) -> Result<mirrorflow_conn::Cluster, mirrorflow_conn::ConnError> {
        let options = mirrorflow_conn::Options {
            client_id: self.client_id.clone(),
            timeout,
            max_frame: 8 << 20,
            // Replicators run in the flow's namespace; their egress is the NetworkPolicy's.
            address_check: None,
        };
        mirrorflow_conn::Cluster::new(&self.bootstrap, self.security.clone(), options)
    }

    /// `flow`'s target, with its principal.
    pub fn of(flow: &crate::flow::Flow) -> ShareTarget {
        ShareTarget {
            bootstrap: flow.spec.target.bootstrap_servers.clone(),
            security: flow.own_security.target.clone(),
            client_id: format!("mirrorflow-{}-group-sync", flow.name.replace('/', ".")),
        }
    }
}

/// The project's own connection to the target for one pass: made at its first use and kept
/// for every group after (a handshake per group was one TLS and SASL exchange each).
pub(super) struct OwnTarget {
    target: ShareTarget,
    cluster: Option<mirrorflow_conn::Cluster>,
    /// How long making the connection may take.
    timeout: Duration,
}

impl OwnTarget {
    pub(super) fn new(target: ShareTarget, timeout: Duration) -> Self {
        OwnTarget {
            target,
            cluster: None,
            timeout,
        }
    }

    /// The pass's connection; `None` (reported as `what`) when it cannot be made.
    pub(super) fn get(
        &mut self,
        reach: &Reachability,
        what: &str,
    ) -> Option<&mut mirrorflow_conn::Cluster> {
        if self.cluster.is_none() {
            match self.target.cluster(self.timeout) {
                Ok(c) => self.cluster = Some(c),
                Err(e) => {
                    reach.refused(what, &e);
                    return None;
                }
            }
        }
        self.cluster.as_mut()
    }
}
