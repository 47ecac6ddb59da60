//! Share groups (KIP-932) in `failover`: their position is a start offset per share-partition,
//! kept by the share coordinator, read with DescribeShareGroupOffsets and set with
//! AlterShareGroupOffsets on the project's own connections (librdkafka has neither call). An
//! OffsetCommit under a share group's name would make a consumer group of it on the target,
//! which the share group's consumers could then not join.
//!
//! The coordinator itself refuses to set start offsets while the group has members
//! (NON_EMPTY_GROUP): that check is atomic with the change, so it is the member guard here,
//! and `--force` cannot override it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mirrorflow_conn::{Cluster, ConnError, ListingBounds, Options};
use mirrorflow_core::protocol::ErrorCode;
use rdkafka::ClientConfig;

use super::CliError;
use super::clusters::Partition;
use crate::kafka::checkpoints::CheckpointIndex;

const TIMEOUT: Duration = Duration::from_secs(10);
/// A hostile cluster's answers are bounded like the probe's.
const MAX_FRAME: usize = 8 << 20;
const LISTED_BROKERS: usize = 256;
const LISTED_BYTES: usize = 8 << 20;
/// The share type ListGroups gives.
const SHARE: &str = "share";

/// A connection to one of the flow's clusters for share-group calls.
pub struct ShareSide {
    cluster: Cluster,
    name: &'static str,
}

impl ShareSide {
    /// `config` is the flow's client of that cluster; `bootstrap` its addresses.
    pub fn new(config: &ClientConfig, name: &'static str) -> Result<Self, CliError> {
        let refuse = |message: String| CliError::Share {
            what: "connecting for share-group offsets".into(),
            cluster: name,
            message,
        };
        let security = crate::status::tails::conn_security(config, true).ok_or_else(|| {
            refuse(
                "the cluster's security settings are not ones the project's own connections \
                 speak"
                    .into(),
            )
        })?;
        let bootstrap = config.get("bootstrap.servers").unwrap_or_default();
        let options = Options {
            client_id: "mirrorflow-cli".into(),
            timeout: TIMEOUT,
            max_frame: MAX_FRAME,
            address_check: None,
        };
        let cluster =
            Cluster::new(bootstrap, security, options).map_err(|e| refuse(e.to_string()))?;
        Ok(ShareSide { cluster, name })
    }

    /// The connection, for other calls of the project's own client.
    pub fn cluster_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }

    fn failed(&self, what: String, e: &ConnError) -> CliError {
        CliError::Share {
            what,
            cluster: self.name,
            message: e.to_string(),
        }
    }

    /// The cluster's share groups, by name.
    pub fn share_groups(&mut self) -> Result<HashSet<String>, CliError> {
        let listed = self.cluster.list_groups(ListingBounds {
            brokers: LISTED_BROKERS,
            bytes: LISTED_BYTES,
            deadline: Instant::now() + TIMEOUT,
        });
        let listed = listed.map_err(|e| self.failed("listing the groups by type".into(), &e))?;
        Ok(listed
            .into_iter()
            .filter(|g| g.protocol_type == SHARE)
            .map(|g| g.group)
            .collect())
    }

    /// `group`'s start offsets; none when the group does not exist there.
    pub fn starts(&mut self, group: &str) -> Result<BTreeMap<Partition, i64>, CliError> {
        let what = || format!("reading the start offsets of share group '{group}'");
        let answer =
            (self.cluster.share_group_offsets(group)).map_err(|e| self.failed(what(), &e))?;
        let starts = (answer.starts()).map_err(|r| self.refused(what(), r.error, &r.message))?;
        Ok((starts.into_iter())
            .map(|(topic, partition, start)| ((topic, partition), start))
            .collect())
    }

    fn refused(&self, what: String, error: ErrorCode, message: &str) -> CliError {
        let fix = match error.name() {
            "NON_EMPTY_GROUP" => {
                "; the group has members on this cluster: stop its share consumers there first"
            }
            "GROUP_AUTHORIZATION_FAILED" | "TOPIC_AUTHORIZATION_FAILED" => {
                "; the flow's principal needs DESCRIBE (to read) or READ (to set) on the group \
                 and READ on its topics"
            }
            _ => "",
        };
        let said = if message.is_empty() {
            String::new()
        } else {
            format!(": {message}")
        };
        CliError::Share {
            what,
            cluster: self.name,
            message: format!("{error}{said}{fix}"),
        }
    }

    /// Sets `group`'s start offsets; any partition refused fails the whole call (the others
    /// may have been set).
    pub fn alter(&mut self, group: &str, offsets: &[(Partition, i64)]) -> Result<(), CliError> {
        let what = || format!("setting the start offsets of share group '{group}'");
        let starts: Vec<(&str, i32, i64)> = (offsets.iter())
            .map(|((t, p), o)| (t.as_str(), *p, *o))
            .collect();
        let answer = (self.cluster.alter_share_group_offsets(group, &starts))
            .map_err(|e| self.failed(what(), &e))?;
        if answer.error.is_error() {
            return Err(self.refused(what(), answer.error, &answer.message));
        }
        match answer.partitions.iter().find(|p| p.error.is_error()) {
            Some(p) => Err(self.refused(
                format!("{} ({}-{})", what(), p.topic, p.partition),
                p.error,
                &p.message,
            )),
            None => Ok(()),
        }
    }
}

/// One cluster of a plan, its connections for share-group calls opened once and reused by the
/// groups planned after (several at a time: at most one connection per worker).
pub struct Side<'a> {
    pub client: &'a ClientConfig,
    pub name: &'static str,
    idle: Mutex<Vec<ShareSide>>,
}

impl<'a> Side<'a> {
    pub fn new(client: &'a ClientConfig, name: &'static str) -> Self {
        Side {
            client,
            name,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `call` on an idle connection, or a new one; a connection whose call failed is
    /// closed (it may be broken), the others kept for the next group.
    pub fn with<T>(
        &self,
        call: impl FnOnce(&mut ShareSide) -> Result<T, CliError>,
    ) -> Result<T, CliError> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let mut side = match idle {
            Some(side) => side,
            None => ShareSide::new(self.client, self.name)?,
        };
        let answer = call(&mut side);
        if answer.is_ok()
            && let Ok(mut idle) = self.idle.lock()
        {
            idle.push(side);
        }
        answer
    }

    /// `group`'s positions on this cluster, whatever its kind: a share group's start offsets
    /// (of every partition it has them for), a consumer group's commits on `parts`.
    pub fn positions(
        &self,
        group: &str,
        parts: &[Partition],
        share: bool,
    ) -> Result<BTreeMap<Partition, i64>, CliError> {
        if share {
            self.with(|side| side.starts(group))
        } else {
            super::clusters::committed(self.client, self.name, group, parts)
        }
    }
}

/// The groups of `index` that are share groups: those whose checkpoints say so, and those
/// either cluster lists as one (a cluster that cannot be listed adds none: the source may be
/// down in a failover; the checkpoints' header still tells).
pub fn share_groups(index: &CheckpointIndex, sides: &[&Side<'_>]) -> HashSet<String> {
    let mut share: HashSet<String> = (index.iter())
        .filter(|(_, cps)| cps.values().any(|c| c.share))
        .map(|(g, _)| g.clone())
        .collect();
    for side in sides {
        if let Ok(listed) = side.with(ShareSide::share_groups) {
            share.extend(listed.into_iter().filter(|g| index.contains_key(g)));
        }
    }
    share
}
