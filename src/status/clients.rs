//! The probe's Kafka clients, kept between probes and shared by the flows that may share them.
//!
//! A librdkafka client costs threads (one per broker and a few of its own), connections, TLS and
//! SASL handshakes and prefetch buffers. Building fresh clients for every flow on every probe
//! (every status interval) made an operator of 51 flows hold a gigabyte and use more than a core.
//! Here one client per cluster and set of credentials serves every flow of a namespace: the key
//! is the namespace and the whole client configuration (resolved bootstrap servers, security
//! settings, and the Secret contents the configuration carries inline), so one tenant's status is
//! never computed with another tenant's credentials, nor with other credentials of its own.
//!
//! The same client follows the target's internal topics (positions, checkpoints, heartbeats):
//! they stay assigned between probes and each probe reads only what was written since the last
//! one ([`Cluster::follow`]); and it reads every group's committed offsets (an OffsetFetch per
//! group, [`Cluster::committed`]), so a group costs no client of its own. Clients and topics
//! nobody asked for within the idle time are dropped ([`ProbeClients::evict_idle`]), so
//! deleting flows gives the memory back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mirrorflow_conn::{AddressCheck, OAuth};
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::metadata::Metadata;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::ClusterFault;
use super::probe::ProbeContext;
use super::tails::{OwnTails, Tail, TailError};
pub use super::tails::{TailKind, TailState};
use crate::kafka::reader::position_in;

pub type ProbeConsumer = BaseConsumer<TokenContext>;

/// The probe client's context: [`ProbeContext`] (the errors it reports), and for a
/// SASL/OAUTHBEARER cluster the bounded token client of [`mirrorflow_conn::oauth`] instead of
/// librdkafka's own OIDC client, which buffers up to 500 MiB of a token endpoint's answer and
/// copies an error answer's body into its error. librdkafka asks for a token through an event
/// that polling the client serves ([`Cluster::serve_token`]).
pub struct TokenContext {
    probe: ProbeContext,
    oauth: Option<OAuth>,
}

impl std::ops::Deref for TokenContext {
    type Target = ProbeContext;

    fn deref(&self) -> &ProbeContext {
        &self.probe
    }
}

impl ClientContext for TokenContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn error(&self, error: KafkaError, reason: &str) {
        self.probe.error(error, reason);
    }

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        let oauth = self
            .oauth
            .as_ref()
            .ok_or("no OAuth client credentials in the flow's spec")?;
        let (token, fresh) = oauth.token_for(TOKEN_TIMEOUT)?;
        let fresh_ms = i64::try_from(fresh.as_millis()).unwrap_or(i64::MAX);
        Ok(OAuthToken {
            token,
            // Only librdkafka's own bookkeeping uses it: the SASL message names no principal.
            principal_name: oauth.client_id.clone(),
            lifetime_ms: crate::clock::now_ms().saturating_add(fresh_ms),
        })
    }
}

impl ConsumerContext for TokenContext {}

/// The longest one token request may take.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(10);

/// librdkafka's OIDC settings, which the probe's clients leave out: their tokens come from
/// [`TokenContext`].
const OIDC_SETTINGS: [&str; 6] = [
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions",
];

/// How long a client, a followed topic or a group's client lives without being asked for: a
/// few status intervals, so a flow probed every interval keeps its clients, and a deleted one
/// gives them back soon.
pub const IDLE: Duration = Duration::from_secs(45);

/// The group id of the shared clients. They join no group and commit nothing: topics are
/// assigned, and a group's committed offsets are read with a client of that group's id.
const PROBE_GROUP: &str = "mirrorflow-operator-probe";

/// What makes two flows' clients interchangeable: the namespace and every client setting
/// (credentials included). Never printed: the settings hold secrets.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientKey {
    namespace: String,
    settings: BTreeMap<String, String>,
}

impl ClientKey {
    pub fn new(namespace: &str, config: &ClientConfig) -> Self {
        ClientKey {
            namespace: namespace.to_string(),
            // `config_map` masks passwords and keys ("***"): the values come from `get`, or
            // two tenants differing only in their password would share a client.
            settings: config
                .config_map()
                .into_keys()
                .filter_map(|k| Some((k.to_string(), config.get(k)?.to_string())))
                .collect(),
        }
    }
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientKey")
            .field("namespace", &self.namespace)
            .field("bootstrap.servers", &self.settings.get("bootstrap.servers"))
            .finish_non_exhaustive()
    }
}

/// Every shared client of the operator (or of one CLI run).
pub struct ProbeClients {
    clusters: Mutex<HashMap<ClientKey, Arc<Cluster>>>,
    idle: Duration,
    /// Whether OAuth tokens may be fetched over `http://` from a loopback host. A flow may
    /// name one for its replicator pods (a token proxy beside them); from the shared operator
    /// the same URL reaches the operator pod itself (a mesh sidecar's admin port, anything
    /// listening there), so the operator refuses it unless its installer allowed it
    /// ([`LOOPBACK_TOKEN_ENDPOINTS_ENV`] = `allow`, chart value
    /// `probe.loopbackTokenEndpoints`). A CLI run fetches from the user's own machine.
    loopback_token_endpoints: bool,
    /// Which addresses the probe may connect to (the installer's `probeAddresses`): the
    /// project's own connections check every address they connect to, and metadata naming a
    /// broker elsewhere is refused before librdkafka follows it (`None`: any).
    address_check: Option<AddressCheck>,
    /// Clusters whose metadata was refused ([`Self::brokers_refused`]), and when: not asked
    /// again for [`REFUSED_FOR`], so a cluster listing thousands of brokers does not make a
    /// client (and its threads) every probe.
    refused: Mutex<HashMap<ClientKey, (Instant, ClusterFault)>>,
}

/// How long a cluster whose metadata was refused is not connected to again.
pub const REFUSED_FOR: Duration = Duration::from_secs(300);

/// The operator's environment variable that lets its probe fetch OAuth tokens from `http://`
/// loopback endpoints (`allow`); test worlds whose token endpoint runs on the node set it.
pub const LOOPBACK_TOKEN_ENDPOINTS_ENV: &str = "MIRRORFLOW_PROBE_LOOPBACK_TOKEN_ENDPOINTS";

impl Default for ProbeClients {
    /// The operator's clients: loopback token endpoints as its installer said.
    fn default() -> Self {
        let allowed = std::env::var(LOOPBACK_TOKEN_ENDPOINTS_ENV).is_ok_and(|v| v == "allow");
        ProbeClients::new(IDLE).with_loopback_token_endpoints(allowed)
    }
}

impl ProbeClients {
    pub fn new(idle: Duration) -> Self {
        ProbeClients {
            clusters: Mutex::new(HashMap::new()),
            idle,
            loopback_token_endpoints: false,
            address_check: None,
            refused: Mutex::new(HashMap::new()),
        }
    }

    /// The fault of the cluster `config` reaches in `namespace` when its metadata was refused
    /// within [`REFUSED_FOR`]: the probe does not connect to it again until then.
    pub fn recently_refused(&self, namespace: &str, config: &ClientConfig) -> Option<ClusterFault> {
        let mut refused = self.refused.lock().ok()?;
        refused.retain(|_, (at, _)| at.elapsed() < REFUSED_FOR);
        refused
            .get(&ClientKey::new(namespace, config))
            .map(|(_, f)| f.clone())
    }

    pub fn with_address_check(mut self, check: Option<AddressCheck>) -> Self {
        self.address_check = check;
        self
    }

    /// Why the probe must not follow `md`, the metadata of the cluster `config` reaches in
    /// `namespace`: too many brokers, or one at an address it may not connect to. The client
    /// is dropped then (its broker threads end when the probe lets go of it).
    pub fn brokers_refused(
        &self,
        namespace: &str,
        config: &ClientConfig,
        md: &Metadata,
    ) -> Option<ClusterFault> {
        let fault =
            ClusterFault::Brokers(super::brokers::refusal(md, self.address_check.as_ref())?);
        let key = ClientKey::new(namespace, config);
        let gone = self.clusters.lock().ok().and_then(|mut c| c.remove(&key));
        // Outside the lock: dropping a client waits for its threads.
        drop(gone);
        if let Ok(mut refused) = self.refused.lock() {
            refused.insert(key, (Instant::now(), fault.clone()));
        }
        Some(fault)
    }

    /// The clients of a CLI run, on the user's machine: a loopback token endpoint is theirs.
    pub fn for_cli() -> Self {
        ProbeClients::new(IDLE).with_loopback_token_endpoints(true)
    }

    pub fn with_loopback_token_endpoints(mut self, allowed: bool) -> Self {
        self.loopback_token_endpoints = allowed;
        self
    }

    /// Why the probe may not use `config` at all: a plain-http token endpoint (only loopback
    /// ones pass the spec rules) where these clients refuse them.
    pub fn refused(&self, config: &ClientConfig) -> Option<ClusterFault> {
        let url = config.get("sasl.oauthbearer.token.endpoint.url")?;
        (!self.loopback_token_endpoints && url.get(..7)?.eq_ignore_ascii_case("http://")).then(|| {
            ClusterFault::TokenEndpointUnreachable(
                "the operator fetches OAuth tokens over https only: an http:// loopback endpoint reaches the operator's own pod, not a token proxy beside the replicators, so the operator cannot judge this cluster (its installer may allow it with the chart value probe.loopbackTokenEndpoints)".into(),
            )
        })
    }

    /// The client for `config` in `namespace`, made on first use.
    pub fn cluster(
        &self,
        namespace: &str,
        config: &ClientConfig,
    ) -> Result<Arc<Cluster>, KafkaError> {
        if let Some(refused) = self
            .refused(config)
            .or_else(|| self.recently_refused(namespace, config))
        {
            return Err(KafkaError::ClientCreation(format!("{refused:?}")));
        }
        let key = ClientKey::new(namespace, config);
        let mut clusters = self
            .clusters
            .lock()
            .map_err(|_| KafkaError::ClientCreation("probe clients poisoned".into()))?;
        if let Some(c) = clusters.get(&key) {
            c.touch();
            return Ok(c.clone());
        }
        let c = Arc::new(Cluster::new(
            config,
            self.loopback_token_endpoints,
            self.address_check.clone(),
        )?);
        clusters.insert(key, c.clone());
        Ok(c)
    }

    /// Drops the clients and followed topics idle for longer than the idle
    /// time; returns how many clients remain. Blocking (closing a client joins its threads).
    pub fn evict_idle(&self) -> usize {
        let idle = self.idle;
        let (gone, left) = {
            let Ok(mut clusters) = self.clusters.lock() else {
                return 0;
            };
            let gone: Vec<Arc<Cluster>> = clusters
                .extract_if(|_, c| c.idle_for() > idle)
                .map(|(_, c)| c)
                .collect();
            let left: Vec<Arc<Cluster>> = clusters.values().cloned().collect();
            (gone, left)
        };
        // Outside the lock: dropping a client waits for its threads.
        drop(gone);
        for c in &left {
            c.evict_idle(idle);
        }
        left.len()
    }

    pub fn len(&self) -> usize {
        self.clusters.lock().map(|c| c.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One cluster as one set of credentials in one namespace sees it.
pub struct Cluster {
    client: ProbeConsumer,
    /// The followed topics, read with the project's own connections and bounded decoder
    /// ([`super::tails`]); `None` for a cluster they cannot speak to (a mechanism they do not
    /// know), whose topics `client` follows.
    own: Option<Mutex<OwnTails>>,
    /// The topics `client` follows, by name. Also the lock for polling `client`: whoever polls
    /// hands every record to its topic's tail.
    tails: Mutex<HashMap<String, Tail>>,
    used: Mutex<Instant>,
    /// The cluster's metadata and group names as last fetched: every flow probed within
    /// [`SHARED_FOR`] of a fetch uses it instead of asking again.
    metadata: SharedAnswer<Metadata>,
    group_names: SharedAnswer<Vec<String>>,
    /// The protocol types of the groups that are not plain consumer groups, as last listed.
    group_kinds: SharedAnswer<GroupKinds>,
}

/// An answer about the whole cluster and when it was fetched: every flow probed within
/// [`SHARED_FOR`] of a fetch uses it instead of asking again.
struct SharedAnswer<T>(Mutex<Option<(Instant, Arc<T>)>>);

impl<T> Default for SharedAnswer<T> {
    fn default() -> Self {
        SharedAnswer(Mutex::new(None))
    }
}

impl<T> SharedAnswer<T> {
    /// The answer fetched less than [`SHARED_FOR`] ago, or a new one from `fetch` (kept when
    /// it succeeded). `poisoned`: the error when the lock is.
    fn get<E>(
        &self,
        poisoned: impl FnOnce() -> E,
        fetch: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        let mut cached = self.0.lock().map_err(|_| poisoned())?;
        if let Some((at, answer)) = cached.as_ref()
            && at.elapsed() < SHARED_FOR
        {
            return Ok(answer.clone());
        }
        let answer = Arc::new(fetch()?);
        *cached = Some((Instant::now(), answer.clone()));
        Ok(answer)
    }
}

/// Group name to protocol type (`share`, `streams`, ...), for the groups whose type is not
/// `consumer` or empty.
pub type GroupKinds = HashMap<String, String>;

/// The largest answer a probe client reads from a broker (`receive.message.max.bytes`).
pub const MAX_ANSWER_BYTES: usize = 8 << 20;

/// How long one answer about the whole cluster (metadata, its groups) serves the flows that
/// share the client: far below the status interval, so a status is never older for it.
const SHARED_FOR: Duration = Duration::from_secs(2);

/// The probe's settings on top of the flow's: no group membership, no commits, and small
/// prefetch buffers (librdkafka's defaults queue up to 64 MiB per partition for throughput a
/// probe never needs). The queue is bounded by size only: a count threshold below what one
/// fetch brings makes librdkafka wait `fetch.queue.backoff.ms` (1 s) before every next fetch,
/// and a first read of a long topic then takes minutes. A probe reads a few records per topic
/// once it follows it, so fetches of 256 KiB and a queue of two of them only cost the first
/// read of a long topic some round trips (20 MB: 80 fetches), while every client's buffers
/// stay small (a 2 MiB queue and 1 MiB partition reads before). `fetch.max.bytes` stays at
/// 1 MiB: librdkafka refuses a client whose `fetch.max.bytes` is below `message.max.bytes`
/// (1 MB); the partition bound keeps a fetch of the few followed partitions small anyway. No
/// statistics: nobody reads them. Answers are bounded at 8 MiB (`receive.message.max.bytes`,
/// librdkafka's default 100 MB): a Metadata or ListGroups answer of a cluster with tens of
/// thousands of partitions or groups fits, and a hostile broker's answer costs at most that
/// per client instead of a hundred MB; that bound holds whatever the flow's configuration
/// says. Other settings the flow gave stand.
fn probe_config(base: &ClientConfig, group: &str) -> ClientConfig {
    let mut c = base.clone();
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        // A followed topic whose start was deleted (retention) goes on from its new start.
        .set("auto.offset.reset", "earliest")
        .set("socket.timeout.ms", "5000")
        .set("receive.message.max.bytes", MAX_ANSWER_BYTES.to_string());
    for (name, value) in [
        ("queued.max.messages.kbytes", "512"),
        ("fetch.max.bytes", "1048576"),
        ("max.partition.fetch.bytes", "262144"),
        ("statistics.interval.ms", "0"),
        ("fetch.queue.backoff.ms", "10"),
        ("fetch.wait.max.ms", "200"),
        ("topic.metadata.refresh.interval.ms", "60000"),
    ] {
        if base.get(name).is_none() {
            c.set(name, value);
        }
    }
    c
}

fn consumer(
    base: &ClientConfig,
    group: &str,
    loopback_token_endpoints: bool,
    address_check: Option<AddressCheck>,
) -> Result<ProbeConsumer, KafkaError> {
    let oauthbearer = base.get("sasl.mechanisms") == Some("OAUTHBEARER");
    // rdkafka sets a token from the context without SASL extensions: a flow that needs them
    // (Confluent Cloud's logicalCluster) keeps librdkafka's own OIDC client, whose answers are
    // not bounded (the status text is, `super::bounded_text`).
    let oauth = oauthbearer
        .then(|| super::tails::oauth(base, loopback_token_endpoints))
        .flatten()
        .filter(|o| o.extensions.is_empty())
        .map(|o| o.with_address_check(address_check));
    librdkafka_config(base, group, oauth.is_some()).create_with_context(TokenContext {
        probe: ProbeContext::new(oauthbearer),
        oauth,
    })
}

/// [`probe_config`], without librdkafka's OIDC settings when [`TokenContext`] gives the tokens.
fn librdkafka_config(base: &ClientConfig, group: &str, own_tokens: bool) -> ClientConfig {
    let mut config = probe_config(base, group);
    if own_tokens {
        for name in OIDC_SETTINGS {
            config.remove(name);
        }
    }
    config
}

/// How many queued events one use of a client hands to its context at most: enough for the
/// errors a client reports between two probes, bounded so a use never spins.
const DRAIN: usize = 64;

impl Cluster {
    fn new(
        config: &ClientConfig,
        loopback_token_endpoints: bool,
        address_check: Option<AddressCheck>,
    ) -> Result<Self, KafkaError> {
        Ok(Cluster {
            client: consumer(
                config,
                PROBE_GROUP,
                loopback_token_endpoints,
                address_check.clone(),
            )?,
            own: OwnTails::new(config, loopback_token_endpoints, address_check).map(Mutex::new),
            tails: Mutex::new(HashMap::new()),
            used: Mutex::new(Instant::now()),
            metadata: SharedAnswer::default(),
            group_names: SharedAnswer::default(),
            group_kinds: SharedAnswer::default(),
        })
    }

    /// Metadata of every topic, fetched at most once per [`SHARED_FOR`]. Callers wait for
    /// one fetch rather than each making their own.
    pub fn metadata(&self, timeout: Duration) -> Result<Arc<Metadata>, KafkaError> {
        self.metadata.get(
            || KafkaError::ClientCreation("probe metadata poisoned".into()),
            || self.client().fetch_metadata(None, timeout),
        )
    }

    /// The names of the cluster's consumer groups, fetched at most once per [`SHARED_FOR`].
    pub fn group_names(&self, timeout: Duration) -> Result<Arc<Vec<String>>, KafkaError> {
        self.group_names.get(
            || KafkaError::ClientCreation("probe group list poisoned".into()),
            || {
                let list = self.client().fetch_group_list(None, timeout)?;
                Ok(list.groups().iter().map(|g| g.name().to_string()).collect())
            },
        )
    }

    /// The cluster's groups that are not plain consumer groups, with their protocol types,
    /// listed at most once per [`SHARED_FOR`] with the project's own connections (librdkafka
    /// lists every group without its type). Empty when they could not be listed (a cluster
    /// they cannot speak to, a broker that did not answer): the groups are then taken for
    /// consumer groups, as before types were known. A hostile cluster's listing is bounded:
    /// at most [`super::brokers::MAX_BROKERS`] brokers asked, [`MAX_ANSWER_BYTES`] of names
    /// kept, no broker asked after `timeout`.
    pub fn group_kinds(&self, timeout: Duration) -> Arc<GroupKinds> {
        let Some(own) = self.own.as_ref() else {
            return Arc::default();
        };
        let kinds = self.group_kinds.get(
            || (),
            || {
                let listed = own
                    .lock()
                    .map_err(|_| TailError::Unavailable)
                    .and_then(|mut o| {
                        o.list_groups(mirrorflow_conn::ListingBounds {
                            brokers: super::brokers::MAX_BROKERS,
                            bytes: MAX_ANSWER_BYTES,
                            deadline: Instant::now() + timeout,
                        })
                    });
                Ok(listed
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|g| !matches!(g.protocol_type.as_str(), "" | "consumer"))
                    .map(|g| (g.group, g.protocol_type))
                    .collect())
            },
        );
        kinds.unwrap_or_default()
    }

    /// The librdkafka client, its token first brought up to date ([`Self::serve_token`]).
    pub fn client(&self) -> &ProbeConsumer {
        self.serve_token();
        &self.client
    }

    /// Serves librdkafka's requests for an OAuth token, which wait in the client's queue
    /// until it is polled ([`TokenContext`]): on creation, and before a token expires.
    fn serve_token(&self) {
        if self.client.context().oauth.is_some() {
            self.pump(Duration::ZERO);
        }
    }

    fn touch(&self) {
        if let Ok(mut u) = self.used.lock() {
            *u = Instant::now();
        }
    }

    fn idle_for(&self) -> Duration {
        self.used.lock().map(|u| u.elapsed()).unwrap_or_default()
    }

    /// Hands the client's queued events (errors, records of followed topics) to their places
    /// for up to `wait`, so the context holds the newest error.
    pub fn pump(&self, wait: Duration) {
        let Ok(mut tails) = self.tails.lock() else {
            return;
        };
        let deadline = Instant::now() + wait;
        for _ in 0..DRAIN {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.client.poll(left.min(Duration::from_millis(100))) {
                Some(Ok(m)) => dispatch(&mut tails, &m),
                Some(Err(_)) => {}
                None if left.is_zero() => break,
                None => {}
            }
        }
    }

    /// Reads `topic` (partition 0) from where the last read stopped to its current end and
    /// returns what `read` takes from its state. [`TailError::Unavailable`] when it could not
    /// be read to its end within `timeout` (absent topic, cluster away);
    /// [`TailError::Refused`] when it broke a bound ([`super::tails`]). The first read of a
    /// topic starts at its beginning (for a heartbeats topic: at its newest record).
    pub fn follow<R>(
        &self,
        topic: &str,
        kind: TailKind,
        timeout: Duration,
        read: impl FnOnce(&TailState) -> R,
    ) -> Result<R, TailError> {
        let deadline = Instant::now() + timeout;
        match &self.own {
            Some(own) => {
                let mut own = own.lock().map_err(|_| TailError::Unavailable)?;
                own.follow(topic, kind, deadline).map(read)
            }
            None => self.follow_with_client(topic, kind, deadline, read),
        }
    }

    /// A transaction open at the end of the positions topic `topic`, followed before: its
    /// offset and for how long the reads found it there. Only the own connections look (the
    /// librdkafka fallback reads the stable end only).
    pub fn open_transaction(&self, topic: &str) -> Option<(i64, Duration)> {
        self.own.as_ref()?.lock().ok()?.open_transaction(topic)
    }

    /// [`Self::follow`] with the librdkafka client, for clusters the own connections cannot
    /// speak to. librdkafka inflates batches without a limit, so answers are bounded by
    /// `receive.message.max.bytes` only ([`probe_config`]).
    fn follow_with_client<R>(
        &self,
        topic: &str,
        kind: TailKind,
        deadline: Instant,
        read: impl FnOnce(&TailState) -> R,
    ) -> Result<R, TailError> {
        let unavailable = TailError::Unavailable;
        let timeout = deadline.saturating_duration_since(Instant::now());
        // Before taking the lock: the other flows' reads need not wait for this request.
        let watermarks = self.client().fetch_watermarks(topic, 0, timeout);
        let mut tails = self.tails.lock().map_err(|_| unavailable.clone())?;
        let (low, high) = match watermarks {
            Ok(w) => w,
            Err(e) => {
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition) {
                    self.forget_locked(&mut tails, topic);
                }
                return Err(unavailable);
            }
        };
        let start = match kind {
            TailKind::Heartbeats => low.max(high - 1),
            _ => low,
        };
        let mut reassign = false;
        match tails.get_mut(topic) {
            // Fewer records than already read: the topic was deleted and made again.
            Some(t) if t.kind == kind && high >= t.next => t.wanted = Instant::now(),
            _ => {
                tails.insert(topic.to_string(), Tail::new(kind, start));
                reassign = true;
            }
        }
        if reassign {
            self.assign(&tails).map_err(|_| unavailable.clone())?;
        }
        loop {
            let t = tails.get(topic).ok_or(unavailable.clone())?;
            if t.next >= high || t.refused.is_some() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(unavailable);
            }
            match self.client.poll(left.min(Duration::from_millis(100))) {
                Some(Ok(m)) => dispatch(&mut tails, &m),
                Some(Err(_)) => {}
                None => {
                    // Compaction or transaction markers can leave the last offsets without a
                    // record: the consumer's position tells how far the log was read.
                    if let Some(o) = position_in(&self.client, topic)
                        && let Some(t) = tails.get_mut(topic)
                    {
                        t.next = t.next.max(o);
                    }
                }
            }
        }
        match tails.get(topic) {
            Some(Tail {
                refused: Some(why), ..
            }) => Err(TailError::Refused(why.clone())),
            Some(t) => Ok(read(&t.state)),
            None => Err(unavailable),
        }
    }

    /// Stops following `topic` (it is gone): its records and memory go.
    pub fn forget(&self, topic: &str) {
        if let Some(own) = &self.own
            && let Ok(mut own) = own.lock()
        {
            own.forget(topic);
        }
        if let Ok(mut tails) = self.tails.lock() {
            self.forget_locked(&mut tails, topic);
        }
    }

    fn forget_locked(&self, tails: &mut HashMap<String, Tail>, topic: &str) {
        if tails.remove(topic).is_some() {
            let _ = self.assign(tails);
        }
    }

    /// Assigns every followed topic at the offset its tail reads next.
    fn assign(&self, tails: &HashMap<String, Tail>) -> Result<(), KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (topic, t) in tails {
            tpl.add_partition_offset(topic, 0, Offset::Offset(t.next))?;
        }
        self.client.assign(&tpl)
    }

    /// A share group's start offsets, read on the probe's own connections (librdkafka has no
    /// call for them); the error says why they could not be read.
    pub fn share_starts(&self, group: &str) -> Result<super::tails::ShareStarts, String> {
        let own = (self.own.as_ref()).ok_or_else(|| {
            "the cluster's security settings are not ones the project's own connections speak"
                .to_string()
        })?;
        let mut own = own
            .lock()
            .map_err(|_| "the connection is poisoned".to_string())?;
        own.share_starts(group)
    }

    /// Every committed offset of each of `groups`: one OffsetFetch per group, all in flight
    /// at once through the shared client (no client per group).
    pub fn committed(
        &self,
        groups: &[&str],
        timeout: Duration,
    ) -> Vec<Result<TopicPartitionList, KafkaError>> {
        mirrorflow_rdkafka_ext::offsets::list_group_offsets(self.client().client(), groups, timeout)
            .into_iter()
            .map(|answer| answer.map_err(|e| KafkaError::AdminOp(e.code)))
            .collect()
    }

    /// Forgets the followed topics idle for longer than `idle`; true when something was
    /// dropped.
    fn evict_idle(&self, idle: Duration) -> bool {
        if let Some(own) = &self.own
            && let Ok(mut own) = own.lock()
        {
            own.evict_idle(idle);
        }
        let Ok(mut tails) = self.tails.lock() else {
            return false;
        };
        let before = tails.len();
        tails.retain(|_, t| t.wanted.elapsed() <= idle);
        if tails.len() == before {
            return false;
        }
        let _ = self.assign(&tails);
        true
    }
}

fn dispatch(tails: &mut HashMap<String, Tail>, m: &BorrowedMessage<'_>) {
    if m.partition() != 0 {
        return;
    }
    if let Some(t) = tails.get_mut(m.topic()) {
        // A refused tail keeps its refusal; the next follow reports it.
        let _ = t.apply(
            m.offset(),
            m.key(),
            m.payload(),
            m.timestamp().to_millis(),
            crate::kafka::checkpoints::Exactness::of_record(m),
        );
    }
}

#[cfg(test)]
mod tests;
