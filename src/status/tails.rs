//! The target's internal topics as the probe follows them (positions, checkpoints, heartbeats),
//! read with the project's own connections ([`mirrorflow_conn`]) and batch decoder
//! ([`mirrorflow_core::batch::records`]), not with librdkafka, which inflates a compressed
//! batch without a limit: one gzip batch of 300 records of 1 MiB of zeros (420 KB on disk)
//! took the shared operator past its memory limit.
//!
//! Whoever can write a flow's target topics chooses what the probe reads there, so every read
//! is bounded before it is allocated: an answer frame at most [`MAX_FRAME`] bytes, a batch's
//! records at most [`BATCH_CAP`] bytes once inflated, and each tail's state at most a fixed
//! number of entries ([`TailKind::max_entries`]). A topic that breaks a bound is refused:
//! its tail stops reading (and frees what it held) and the flow's status says which topic,
//! where, and what to do ([`TailRefusal::message`]). Other flows are not affected.
//!
//! SASL/OAUTHBEARER targets are followed the same way, with tokens from the connections' own
//! bounded token client ([`mirrorflow_conn::oauth`]); librdkafka follows only what those
//! connections cannot speak ([`super::clients`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirrorflow_conn::fetcher::{Fetched, Trouble};
use mirrorflow_conn::{FetchLimits, Fetcher, OAuth, Options, Sasl, ScramHash, Security, Tls};
use mirrorflow_core::batch::{self, records};
use mirrorflow_core::protocol::list_offsets::{EARLIEST, LATEST};
use mirrorflow_core::protocol::{ErrorCode, Isolation};
use rdkafka::ClientConfig;

use crate::kafka::checkpoints::{self, CheckpointIndex, Exactness};
use crate::kafka::positions::{self, Frontier, Gaps};
use crate::kafka::refusals::Refusals;
use crate::kafka::writers::Claims;
use crate::mm2::Heartbeat;
use crate::verify::header::{VERIFICATION_HEADER, Verification};

/// The most bytes a batch's records may inflate to. The replicators write these topics in
/// batches of at most about 1 MB (the producer's default), of small records; a batch that
/// inflates past this was not written by them.
pub const BATCH_CAP: usize = 8 << 20;
/// The largest fetch answer read: a broker returns the first batch of a fetch whole, however
/// large, so this bounds a compressed batch too.
pub const MAX_FRAME: usize = 4 << 20;
/// The most source partitions the positions tail keeps.
pub const MAX_POSITIONS: usize = 100_000;
/// The most gaps the positions tail keeps (each a break a replicator recorded).
pub const MAX_GAPS: usize = 10_000;
/// The most writers' claims the positions tail keeps (a handful of flows at most).
pub const MAX_CLAIMS: usize = 256;
/// The most group-partitions the checkpoints tail keeps.
pub const MAX_CHECKPOINTS: usize = 200_000;

const LIMITS: FetchLimits = FetchLimits {
    max_bytes: 1 << 20,
    partition_max_bytes: 256 << 10,
    max_wait: Duration::from_millis(100),
};
/// Connecting and each read of a connection.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// What a followed topic holds, folded record by record. A probe takes a snapshot (a clone of
/// the `Arc`s) and the next record read copies the map only while a snapshot is out.
#[derive(Debug, Clone)]
pub enum TailState {
    /// The replicator's positions topic: per source partition the next offset to copy, and
    /// the gaps recorded beside them.
    Positions {
        positions: Arc<HashMap<(String, i32), Frontier>>,
        gaps: Arc<Gaps>,
        claims: Arc<Claims>,
        refusals: Arc<Refusals>,
    },
    /// The checkpoints topic: the newest checkpoint per group-partition.
    Checkpoints(Arc<CheckpointIndex>),
    /// The replicated heartbeats topic: the emission time of the newest heartbeat (`None`
    /// when the newest record is not one).
    Heartbeat(Option<i64>),
}

/// The kinds of topic a tail reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailKind {
    Positions,
    Checkpoints,
    Heartbeats,
}

impl TailKind {
    fn empty(self) -> TailState {
        match self {
            TailKind::Positions => TailState::Positions {
                positions: Arc::default(),
                gaps: Arc::default(),
                claims: Arc::default(),
                refusals: Arc::default(),
            },
            TailKind::Checkpoints => TailState::Checkpoints(Arc::default()),
            TailKind::Heartbeats => TailState::Heartbeat(None),
        }
    }
}

/// Why a tail stopped reading its topic. Kept until the topic is made again (its end falls
/// below where the tail stopped) or the tail is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailRefusal {
    /// A batch's records inflate past [`BATCH_CAP`].
    BatchTooLarge { offset: i64, limit: usize },
    /// A fetch answer was larger than [`MAX_FRAME`] (one batch that large, compressed).
    AnswerTooLarge { offset: i64, size: i64, max: usize },
    /// A batch or record does not decode; `class` names how.
    Corrupt { offset: i64, class: &'static str },
    /// More entries than the tail keeps.
    TooManyEntries {
        offset: i64,
        what: &'static str,
        limit: usize,
    },
}

impl TailRefusal {
    /// The status message: the topic and offset, what was wrong, and what to do.
    pub fn message(&self, topic: &str) -> String {
        let (offset, what) = match self {
            TailRefusal::BatchTooLarge { offset, limit } => (
                offset,
                format!("a record batch whose records inflate to more than {limit} bytes"),
            ),
            TailRefusal::AnswerTooLarge { offset, size, max } => (
                offset,
                format!(
                    "a record batch of {size} bytes (the operator reads batches of at most {max})"
                ),
            ),
            TailRefusal::Corrupt { offset, class } => {
                (offset, format!("a record batch does not decode ({class})"))
            }
            TailRefusal::TooManyEntries {
                offset,
                what,
                limit,
            } => (offset, format!("more than {limit} {what}")),
        };
        format!(
            "the target's topic {topic} (partition 0, offset {offset}) holds {what}, which this flow's replicators never write; the operator stops reading that topic until it is created again, and reports the status it needs from it as unknown. Find who else writes to {topic} on the cluster in spec.target.bootstrapServers (only this flow's replicators should have WRITE on it), then delete the topic: the replicators create it again"
        )
    }
}

/// A share group's start offsets: (topic, partition) and offset.
pub type ShareStarts = Vec<((String, i32), i64)>;

/// Why a tail has nothing to give this time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailError {
    /// Not read to its end in time (absent topic, cluster away, slow broker).
    Unavailable,
    /// The topic broke a bound; see [`TailRefusal::message`].
    Refused(TailRefusal),
}

pub(super) struct Tail {
    pub(super) kind: TailKind,
    /// The next offset to read of partition 0.
    pub(super) next: i64,
    pub(super) wanted: Instant,
    pub(super) state: TailState,
    pub(super) refused: Option<TailRefusal>,
    /// Group-partitions in a checkpoints tail (its map is two levels deep).
    checkpoints: usize,
    /// A positions tail whose stable end stays before the topic's high watermark: a
    /// transaction open there (its first offset), seen first when.
    open_since: Option<(i64, Instant)>,
}

impl Tail {
    pub(super) fn new(kind: TailKind, next: i64) -> Self {
        Tail {
            kind,
            next,
            wanted: Instant::now(),
            state: kind.empty(),
            refused: None,
            checkpoints: 0,
            open_since: None,
        }
    }

    /// The topic ends at `stable` for `read_committed` readers, with records past it (`open`)
    /// or not, seen `now`: how long a transaction has been open at the same offset.
    pub(super) fn note_open(&mut self, stable: i64, open: bool, now: Instant) {
        self.open_since = match self.open_since {
            _ if !open => None,
            Some((at, since)) if at == stable => Some((at, since)),
            _ => Some((stable, now)),
        };
    }

    /// The offset of a transaction open at the tail's end, and for how long it has been.
    pub(super) fn open_transaction(&self, now: Instant) -> Option<(i64, Duration)> {
        self.open_since
            .map(|(at, since)| (at, now.saturating_duration_since(since)))
    }

    /// Folds the record at `offset` (`headers`: its checkpoint translation and verification
    /// headers, for the checkpoints topic); a record before [`Self::next`] was folded already
    /// (a fetch repeats the batch it starts in). A tail over its bound is refused and emptied.
    pub(super) fn apply(
        &mut self,
        offset: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp_ms: Option<i64>,
        exactness: Exactness,
    ) -> Result<(), TailRefusal> {
        self.apply_verified(offset, key, value, timestamp_ms, (exactness, None))
    }

    /// [`Self::apply`] with the record's verification header too.
    pub(super) fn apply_verified(
        &mut self,
        offset: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp_ms: Option<i64>,
        headers: (Exactness, Option<Verification>),
    ) -> Result<(), TailRefusal> {
        if let Some(r) = &self.refused {
            return Err(r.clone());
        }
        if offset < self.next {
            return Ok(());
        }
        self.next = offset.saturating_add(1);
        self.fold(key, value, timestamp_ms, headers);
        if let Some((what, limit)) = self.over_bound() {
            return Err(self.refuse(TailRefusal::TooManyEntries {
                offset,
                what,
                limit,
            }));
        }
        Ok(())
    }

    fn fold(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp_ms: Option<i64>,
        (exactness, verification): (Exactness, Option<Verification>),
    ) {
        match &mut self.state {
            TailState::Positions {
                positions,
                gaps,
                claims,
                refusals,
            } => {
                positions::apply_record(
                    Arc::make_mut(positions),
                    Arc::make_mut(gaps),
                    Arc::make_mut(claims),
                    Arc::make_mut(refusals),
                    key,
                    value,
                );
            }
            TailState::Checkpoints(index) => {
                let index = Arc::make_mut(index);
                if checkpoints::index_verified_checkpoint(
                    index,
                    key,
                    value,
                    timestamp_ms,
                    exactness,
                    verification,
                ) == Some(true)
                {
                    self.checkpoints = self.checkpoints.saturating_add(1);
                }
            }
            TailState::Heartbeat(newest) => {
                *newest = key
                    .zip(value)
                    .and_then(|(k, v)| Heartbeat::decode(k, v).ok())
                    .map(|hb| hb.timestamp_ms);
            }
        }
    }

    fn over_bound(&self) -> Option<(&'static str, usize)> {
        match &self.state {
            TailState::Positions {
                positions,
                gaps,
                claims,
                ..
            } => {
                if positions.len() > MAX_POSITIONS {
                    Some(("positions (source partitions)", MAX_POSITIONS))
                } else if gaps.len() > MAX_GAPS {
                    Some(("gaps", MAX_GAPS))
                } else if claims.len() > MAX_CLAIMS {
                    Some(("writers' claims", MAX_CLAIMS))
                } else {
                    None
                }
            }
            TailState::Checkpoints(_) => (self.checkpoints > MAX_CHECKPOINTS)
                .then_some(("checkpointed group-partitions", MAX_CHECKPOINTS)),
            TailState::Heartbeat(_) => None,
        }
    }

    /// Stops reading for good (until the topic is made again) and frees what was read.
    pub(super) fn refuse(&mut self, why: TailRefusal) -> TailRefusal {
        self.state = self.kind.empty();
        self.checkpoints = 0;
        self.refused = Some(why.clone());
        why
    }
}

/// The TLS and SASL of the probe's client configuration for the project's own connections;
/// `None` for what they do not speak (an unknown protocol or mechanism). OAuth tokens come
/// from the bounded client of [`mirrorflow_conn::oauth`]; `allow_loopback`: whether its token
/// endpoint may be on loopback ([`super::clients::ProbeClients`]).
pub(crate) fn conn_security(config: &ClientConfig, allow_loopback: bool) -> Option<Security> {
    let protocol = config.get("security.protocol").unwrap_or("PLAINTEXT");
    let (tls, sasl) = match protocol.to_ascii_uppercase().as_str() {
        "PLAINTEXT" => (false, false),
        "SSL" => (true, false),
        "SASL_PLAINTEXT" => (false, true),
        "SASL_SSL" => (true, true),
        _ => return None,
    };
    let tls = tls.then(|| Tls {
        ca_pem: config.get("ssl.ca.pem").map(str::to_owned),
        client: config
            .get("ssl.certificate.pem")
            .zip(config.get("ssl.key.pem"))
            .map(|(c, k)| (c.to_owned(), k.to_owned())),
        // The spec cannot turn hostname checks off (`ssl.*` is refused).
        verify_hostname: true,
    });
    let sasl = match sasl {
        false => None,
        true if config.get("sasl.mechanisms")? == "OAUTHBEARER" => {
            Some(Sasl::OAuthBearer(oauth(config, allow_loopback)?))
        }
        true => {
            let user = config.get("sasl.username")?.to_owned();
            let password = config.get("sasl.password")?.to_owned();
            Some(match config.get("sasl.mechanisms")? {
                "PLAIN" => Sasl::Plain { user, password },
                "SCRAM-SHA-256" => Sasl::Scram {
                    hash: ScramHash::Sha256,
                    user,
                    password,
                },
                "SCRAM-SHA-512" => Sasl::Scram {
                    hash: ScramHash::Sha512,
                    user,
                    password,
                },
                _ => return None,
            })
        }
    };
    Some(Security { tls, sasl })
}

/// The OAuth client credentials librdkafka's `oidc` method would use.
pub(super) fn oauth(config: &ClientConfig, allow_loopback: bool) -> Option<OAuth> {
    let extensions = config
        .get("sasl.oauthbearer.extensions")
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Some(OAuth::new(
        config
            .get("sasl.oauthbearer.token.endpoint.url")?
            .to_owned(),
        config.get("sasl.oauthbearer.client.id")?.to_owned(),
        config.get("sasl.oauthbearer.client.secret")?.to_owned(),
        config.get("sasl.oauthbearer.scope").map(str::to_owned),
        extensions,
        allow_loopback,
    ))
}

/// `security` whose token endpoint, if any, is held to `check` as the brokers are.
/// Other credentials (SCRAM, PLAIN) stay as they are.
fn checked(mut security: Security, check: &Option<mirrorflow_conn::AddressCheck>) -> Security {
    security.sasl = match security.sasl.take() {
        Some(Sasl::OAuthBearer(oauth)) => {
            Some(Sasl::OAuthBearer(oauth.with_address_check(check.clone())))
        }
        other => other,
    };
    security
}

/// The followed topics of one cluster (as one set of credentials in one namespace sees it),
/// read with one fetcher: each round fetches every followed topic, so the reads of a probe's
/// three topics share their round trips.
pub(super) struct OwnTails {
    bootstrap: String,
    security: Security,
    client_id: String,
    /// The installer's bound on the addresses these connections may reach.
    address_check: Option<mirrorflow_conn::AddressCheck>,
    fetcher: Option<Fetcher>,
    /// Connections of their own for group listings: a fetcher's connections may carry its
    /// requests, whose answers another request must not read.
    groups: Option<mirrorflow_conn::Cluster>,
    pub(super) tails: HashMap<String, Tail>,
}

impl OwnTails {
    /// `None` when the configuration needs what these connections do not speak.
    pub(super) fn new(
        config: &ClientConfig,
        allow_loopback: bool,
        address_check: Option<mirrorflow_conn::AddressCheck>,
    ) -> Option<Self> {
        Some(OwnTails {
            bootstrap: config.get("bootstrap.servers")?.to_owned(),
            security: checked(conn_security(config, allow_loopback)?, &address_check),
            client_id: config
                .get("client.id")
                .unwrap_or("mirrorflow-operator-probe")
                .to_owned(),
            address_check,
            fetcher: None,
            groups: None,
            tails: HashMap::new(),
        })
    }

    fn cluster(&self) -> Result<mirrorflow_conn::Cluster, TailError> {
        let options = Options {
            client_id: self.client_id.clone(),
            timeout: IO_TIMEOUT,
            max_frame: MAX_FRAME,
            address_check: self.address_check.clone(),
        };
        mirrorflow_conn::Cluster::new(&self.bootstrap, self.security.clone(), options)
            .map_err(|_| TailError::Unavailable)
    }

    fn fetcher(&mut self) -> Result<&mut Fetcher, TailError> {
        if self.fetcher.is_none() {
            self.fetcher = Some(Fetcher::new(self.cluster()?, LIMITS));
        }
        self.fetcher.as_mut().ok_or(TailError::Unavailable)
    }

    /// Every group of the cluster with its protocol type (ListGroups to each broker, answers
    /// bounded as every other answer these connections read), within `bounds`.
    pub(super) fn list_groups(
        &mut self,
        bounds: mirrorflow_conn::ListingBounds,
    ) -> Result<Vec<mirrorflow_core::protocol::list_groups::ListedGroup>, TailError> {
        if self.groups.is_none() {
            self.groups = Some(self.cluster()?);
        }
        let cluster = self.groups.as_mut().ok_or(TailError::Unavailable)?;
        cluster.list_groups(bounds).map_err(|e| {
            tracing::debug!(error = %e, "listing the cluster's groups by type failed");
            TailError::Unavailable
        })
    }

    /// A share group's start offsets (DescribeShareGroupOffsets to its coordinator), each
    /// partition's as (topic, partition) -> offset; none for a group the coordinator does not
    /// know. A refusal (not authorized, an API the broker lacks) is the error, in words.
    pub(super) fn share_starts(&mut self, group: &str) -> Result<ShareStarts, String> {
        if self.groups.is_none() {
            self.groups = Some(
                self.cluster()
                    .map_err(|_| "the bootstrap addresses cannot be used".to_string())?,
            );
        }
        let cluster = self.groups.as_mut().ok_or("no connection")?;
        let answer = cluster.share_group_offsets(group).map_err(|e| {
            self.groups = None;
            e.to_string()
        })?;
        let starts = answer.starts().map_err(|r| match r.message.is_empty() {
            true => r.error.to_string(),
            false => format!("{}: {}", r.error, r.message),
        })?;
        Ok((starts.into_iter())
            .map(|(topic, partition, start)| ((topic, partition), start))
            .collect())
    }

    /// Partition 0's first offset and the end a `read_committed` reader reaches.
    fn bounds(&mut self, topic: &str) -> Result<(i64, i64), TailError> {
        self.bounds_and_high(topic, false)
            .map(|(low, stable, _)| (low, stable))
    }

    /// [`Self::bounds`], and the high watermark when `high` (one request more).
    fn bounds_and_high(
        &mut self,
        topic: &str,
        high: bool,
    ) -> Result<(i64, i64, Option<i64>), TailError> {
        let cluster = self.fetcher()?.cluster_mut();
        let metadata = cluster
            .metadata(&[topic])
            .map_err(|_| TailError::Unavailable)?;
        let t = metadata
            .topics
            .iter()
            .find(|t| t.name == topic && !t.error.is_error())
            .ok_or(TailError::Unavailable)?;
        // One partition may be asked once per request.
        let mut offset = |at: i64, isolation| -> Result<i64, TailError> {
            let listed = cluster
                .list_offsets(t, &[(0, at)], isolation)
                .map_err(|_| TailError::Unavailable)?;
            match listed.as_slice() {
                [l] if !l.error.is_error() && l.offset >= 0 => Ok(l.offset),
                _ => Err(TailError::Unavailable),
            }
        };
        let low = offset(EARLIEST, Isolation::ReadCommitted)?;
        let stable = offset(LATEST, Isolation::ReadCommitted)?;
        let high = match high {
            true => Some(offset(LATEST, Isolation::ReadUncommitted)?),
            false => None,
        };
        Ok((low, stable, high))
    }

    /// Reads `topic` from where the last read stopped to its current end (a first read
    /// starts at its beginning; for a heartbeats topic at its newest record), by `deadline`.
    pub(super) fn follow(
        &mut self,
        topic: &str,
        kind: TailKind,
        deadline: Instant,
    ) -> Result<&TailState, TailError> {
        // Positions are written in transactions by exactly-once copies: one left open for good
        // holds the topic's stable end, which the status names ([`Self::open_transaction`]).
        let positions = kind == TailKind::Positions;
        let (low, high, uncommitted) = self.bounds_and_high(topic, positions)?;
        let start = match kind {
            TailKind::Heartbeats => low.max(high - 1),
            _ => low,
        };
        match self.tails.get_mut(topic) {
            // Fewer records than already read: the topic was deleted and made again.
            Some(t) if t.kind == kind && high >= t.next => t.wanted = Instant::now(),
            _ => {
                self.tails.insert(topic.to_owned(), Tail::new(kind, start));
            }
        }
        let open = uncommitted.is_some_and(|h| h > high);
        self.tail(topic)?.note_open(high, open, Instant::now());
        let next = self.tail(topic)?.next;
        if let Some(r) = &self.tail(topic)?.refused {
            return Err(TailError::Refused(r.clone()));
        }
        // Retention may have removed records the tail has not read.
        let next = next.max(low);
        self.tail(topic)?.next = next;
        self.fetcher()?.assign(topic, 0, next);
        while self.tail(topic)?.next < high {
            if Instant::now() >= deadline {
                return Err(TailError::Unavailable);
            }
            self.round()?;
            if let Some(r) = &self.tail(topic)?.refused {
                return Err(TailError::Refused(r.clone()));
            }
        }
        Ok(&self.tail(topic)?.state)
    }

    /// A transaction open at the end of `topic` (a positions topic followed before): its
    /// offset and how long it has been open there, as far as the reads saw.
    pub(super) fn open_transaction(&self, topic: &str) -> Option<(i64, Duration)> {
        self.tails.get(topic)?.open_transaction(Instant::now())
    }

    fn tail(&mut self, topic: &str) -> Result<&mut Tail, TailError> {
        self.tails.get_mut(topic).ok_or(TailError::Unavailable)
    }

    /// One fetch round; every followed topic takes what came for it.
    fn round(&mut self) -> Result<(), TailError> {
        let round = self.fetcher()?.round();
        let mut refused = Vec::new();
        for fetched in round.fetched.iter().filter(|f| f.partition == 0) {
            if let Some(tail) = self.tails.get_mut(fetched.topic.as_ref())
                && let Err(why) = take(tail, fetched)
            {
                refused.push((fetched.topic.to_string(), why));
            }
        }
        let mut behind_start = Vec::new();
        for trouble in round.troubles.iter().filter(|t| t.partition == 0) {
            let offset = trouble.offset;
            let why = match &trouble.trouble {
                Trouble::Broker(ErrorCode::OFFSET_OUT_OF_RANGE) => {
                    behind_start.push(trouble.topic.to_string());
                    continue;
                }
                Trouble::FrameTooLarge { size, max } => TailRefusal::AnswerTooLarge {
                    offset,
                    size: *size,
                    max: *max,
                },
                Trouble::BatchTooLarge { partial } => TailRefusal::AnswerTooLarge {
                    offset,
                    size: i64::try_from(*partial).unwrap_or(i64::MAX),
                    max: MAX_FRAME,
                },
                Trouble::Records(_) => TailRefusal::Corrupt {
                    offset,
                    class: "corrupt_batch",
                },
                // Leaders moving, a topic it may not read: retried until the deadline.
                Trouble::Broker(_) | Trouble::NoLeader => continue,
            };
            refused.push((trouble.topic.to_string(), why));
        }
        for (topic, why) in refused {
            if let Some(tail) = self.tails.get_mut(&topic) {
                tail.refuse(why);
            }
            self.unfollow(&topic);
        }
        // Behind the log's start (retention removed records not read yet): go on from there.
        for topic in behind_start {
            let (low, _) = self.bounds(&topic)?;
            let next = self.tail(&topic)?.next.max(low);
            self.tail(&topic)?.next = next;
            self.fetcher()?.assign(&topic, 0, next);
        }
        Ok(())
    }

    fn unfollow(&mut self, topic: &str) {
        if let Some(f) = self.fetcher.as_mut() {
            f.unassign(topic, 0);
        }
    }

    /// Stops following `topic`: its records and memory go.
    pub(super) fn forget(&mut self, topic: &str) {
        self.tails.remove(topic);
        self.unfollow(topic);
    }

    /// Forgets the tails idle for longer than `idle`.
    pub(super) fn evict_idle(&mut self, idle: Duration) {
        let gone: Vec<String> = self
            .tails
            .iter()
            .filter(|(_, t)| t.wanted.elapsed() > idle)
            .map(|(k, _)| k.clone())
            .collect();
        for topic in gone {
            self.forget(&topic);
        }
    }
}

/// Folds the records of one fetched answer into `tail`.
fn take(tail: &mut Tail, fetched: &Fetched) -> Result<(), TailRefusal> {
    for range in &fetched.batches {
        let Some(bytes) = fetched.body.get(range.clone()) else {
            continue;
        };
        for b in batch::batches(bytes) {
            let b = b.map_err(|_| TailRefusal::Corrupt {
                offset: tail.next,
                class: "corrupt_batch",
            })?;
            if b.header.next_offset() <= tail.next {
                continue;
            }
            let offset = b.header.base_offset;
            let opened = records::open(&b, BATCH_CAP).map_err(|e| match e {
                records::RecordsError::BatchTooLarge { limit, .. } => {
                    TailRefusal::BatchTooLarge { offset, limit }
                }
                e => TailRefusal::Corrupt {
                    offset,
                    class: e.class(),
                },
            })?;
            for r in opened.records() {
                let r = r.map_err(|e| TailRefusal::Corrupt {
                    offset,
                    class: e.class(),
                })?;
                let timestamp = (r.timestamp >= 0).then_some(r.timestamp);
                let header = |name: &str| {
                    r.headers
                        .iter()
                        .find(|h| h.key == name.as_bytes())
                        .map(|h| h.value.unwrap_or_default())
                };
                let exactness = Exactness::from_header(header(checkpoints::TRANSLATION_HEADER));
                let verification = Verification::from_header(header(VERIFICATION_HEADER));
                tail.apply_verified(
                    r.offset,
                    r.key,
                    r.value,
                    timestamp,
                    (exactness, verification),
                )?;
            }
        }
    }
    tail.next = tail.next.max(fetched.next_offset);
    Ok(())
}

#[cfg(test)]
mod tests;
