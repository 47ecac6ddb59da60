//! A cluster as a copy sees it: its bootstrap addresses, the brokers its metadata names, and
//! one connection per broker, opened on first use and forgotten when it fails (the next use
//! opens it again). Requests go to the broker that leads a partition; which one that is comes
//! from [`Cluster::metadata`], asked again by the caller after an answer says it moved.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirrorflow_core::protocol::list_groups::{self, ListedGroup};
use mirrorflow_core::protocol::list_offsets::{self, ListedOffset};
use mirrorflow_core::protocol::metadata::{self, Metadata, TopicMetadata};
use mirrorflow_core::protocol::{self, ErrorCode, Isolation};

use crate::{Conn, ConnError, Options, Security};

mod coordinated;

/// At most this many bootstrap addresses are tried (a spec lists a handful).
pub const MAX_BOOTSTRAP: usize = 32;

/// What [`Cluster::list_groups`] may ask and keep.
#[derive(Debug, Clone, Copy)]
pub struct ListingBounds {
    /// The most brokers asked.
    pub brokers: usize,
    /// The most bytes of group names and types kept, over every broker's answer.
    pub bytes: usize,
    /// No broker is asked after this.
    pub deadline: Instant,
}

pub struct Cluster {
    bootstrap: Vec<String>,
    security: Security,
    options: Options,
    /// Node id to `host:port`, as the last metadata answer gave them.
    addresses: HashMap<i32, String>,
    conns: HashMap<i32, Conn>,
    /// The connection metadata was last read on, kept for the next metadata request and used
    /// for nothing else.
    metadata_conn: Option<Conn>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("bootstrap", &self.bootstrap)
            .field("addresses", &self.addresses)
            .finish()
    }
}

impl Cluster {
    /// `bootstrap` is a comma-separated `host:port` list, as in a client's
    /// `bootstrap.servers`. Nothing is connected yet.
    pub fn new(bootstrap: &str, security: Security, options: Options) -> Result<Self, ConnError> {
        let bootstrap: Vec<String> = bootstrap
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        if bootstrap.is_empty() || bootstrap.len() > MAX_BOOTSTRAP {
            return Err(ConnError::Bootstrap {
                count: bootstrap.len(),
                max: MAX_BOOTSTRAP,
            });
        }
        Ok(Cluster {
            bootstrap,
            security,
            options,
            addresses: HashMap::new(),
            conns: HashMap::new(),
            metadata_conn: None,
        })
    }

    /// `topics`' partitions and leaders, from any broker that answers: on the cluster's own
    /// metadata connection, never on a broker connection a fetch or write may have requests
    /// outstanding on (an answer read there would be theirs). That connection is opened to a
    /// broker the last answer named, or else to the bootstrap addresses in order. The brokers
    /// the answer names replace the ones known; connections to brokers gone or moved are
    /// closed.
    pub fn metadata(&mut self, topics: &[&str]) -> Result<Metadata, ConnError> {
        let ask = |conn: &mut Conn| {
            conn.require(
                protocol::API_METADATA,
                "Metadata",
                protocol::METADATA_VERSION,
            )?;
            conn.ask(
                |id, client| metadata::metadata_request(id, client, topics),
                metadata::decode_metadata,
            )
        };
        let mut last = None;
        let mut answer = None;
        // A connection whose session is about to end is dropped for a new one.
        if let Some(mut conn) = (self.metadata_conn.take()).filter(|c| !c.session_ending()) {
            match ask(&mut conn) {
                Ok(m) => {
                    answer = Some(m);
                    self.metadata_conn = Some(conn);
                }
                Err(e) => last = Some(e),
            }
        }
        if answer.is_none() {
            let mut known: Vec<String> = self.addresses.values().cloned().collect();
            known.sort();
            for addr in known.iter().chain(&self.bootstrap) {
                match Conn::open(addr, &self.security, &self.options).and_then(|mut conn| {
                    let m = ask(&mut conn)?;
                    Ok((conn, m))
                }) {
                    Ok((conn, m)) => {
                        answer = Some(m);
                        self.metadata_conn = Some(conn);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
        }
        let Some(metadata) = answer else {
            return Err(last.unwrap_or(ConnError::Bootstrap {
                count: 0,
                max: MAX_BOOTSTRAP,
            }));
        };
        self.addresses = metadata
            .brokers
            .iter()
            .map(|b| (b.node_id, b.address()))
            .collect();
        let addresses = &self.addresses;
        self.conns
            .retain(|node, conn| addresses.get(node).is_some_and(|a| a == conn.peer()));
        Ok(metadata)
    }

    /// The connection to broker `node_id` as the last metadata answer addressed it, opened
    /// when there is none.
    pub fn broker(&mut self, node_id: i32) -> Result<&mut Conn, ConnError> {
        if !self.conns.contains_key(&node_id) {
            let addr = self
                .addresses
                .get(&node_id)
                .ok_or(ConnError::UnknownBroker { node_id })?;
            let conn = Conn::open(addr, &self.security, &self.options)?;
            self.conns.insert(node_id, conn);
        }
        self.conns
            .get_mut(&node_id)
            .ok_or(ConnError::UnknownBroker { node_id })
    }

    /// The open connection to broker `node_id`, if there is one (none is opened).
    pub fn connected(&mut self, node_id: i32) -> Option<&mut Conn> {
        self.conns.get_mut(&node_id)
    }

    /// Uses `conn` as broker `node_id`'s connection (in tests: one over bytes in memory).
    #[cfg(test)]
    pub(crate) fn adopt(&mut self, node_id: i32, conn: Conn) {
        self.conns.insert(node_id, conn);
    }

    /// Uses `conn` for metadata requests (in tests: one over bytes in memory).
    #[cfg(test)]
    pub(crate) fn adopt_metadata(&mut self, conn: Conn) {
        self.metadata_conn = Some(conn);
    }

    /// The connection to broker `node_id` for a caller with nothing outstanding on it (a
    /// request and its answer, or a fetch round): one whose authenticated session is about to
    /// end ([`Conn::session_ending`]) is replaced by a new one first, so the broker never
    /// closes it under a request (KIP-368).
    pub fn broker_at_rest(&mut self, node_id: i32) -> Result<&mut Conn, ConnError> {
        self.renew_ending(node_id);
        self.broker(node_id)
    }

    /// Closes the connection to `node_id` when its authenticated session is about to end;
    /// for callers with nothing outstanding on it.
    pub(crate) fn renew_ending(&mut self, node_id: i32) {
        if self.conns.get(&node_id).is_some_and(Conn::session_ending) {
            self.conns.remove(&node_id);
        }
    }

    /// Closes the connection to `node_id` (after it failed); the next use opens a new one.
    pub fn forget(&mut self, node_id: i32) {
        self.conns.remove(&node_id);
    }

    /// Every group of the cluster with its protocol type: each broker lists the groups it
    /// coordinates. An error when any broker could not answer (a partial list would tell
    /// groups apart wrongly), and when the cluster goes past what `bounds` allow: more brokers
    /// to ask, more bytes of group names kept, or asking past its deadline (each answer is
    /// bounded by the connection's frame size, not their sum).
    pub fn list_groups(&mut self, bounds: ListingBounds) -> Result<Vec<ListedGroup>, ConnError> {
        let metadata = self.metadata(&[])?;
        if metadata.brokers.len() > bounds.brokers {
            return Err(ConnError::Limit {
                what: "brokers to list groups on",
                count: metadata.brokers.len(),
                max: bounds.brokers,
            });
        }
        let mut groups = Vec::new();
        let mut kept = 0_usize;
        for (asked, broker) in metadata.brokers.iter().enumerate() {
            if Instant::now() >= bounds.deadline {
                return Err(ConnError::Limit {
                    what: "brokers still to ask for their groups at the deadline",
                    count: metadata.brokers.len().saturating_sub(asked),
                    max: 0,
                });
            }
            let answer = self.broker_at_rest(broker.node_id).and_then(|conn| {
                conn.require(
                    protocol::API_LIST_GROUPS,
                    "ListGroups",
                    protocol::LIST_GROUPS_VERSION,
                )?;
                let listed = conn.ask(
                    list_groups::list_groups_request,
                    list_groups::decode_list_groups,
                )?;
                conn.check("ListGroups", listed.error, "")?;
                Ok(listed.groups)
            });
            match answer {
                Ok(listed) => {
                    kept = listed.iter().fold(kept, |n, g| {
                        n.saturating_add(g.group.len())
                            .saturating_add(g.protocol_type.len())
                    });
                    if kept > bounds.bytes {
                        return Err(ConnError::Limit {
                            what: "bytes of group names listed",
                            count: kept,
                            max: bounds.bytes,
                        });
                    }
                    groups.extend(listed);
                }
                Err(e) => {
                    self.forget(broker.node_id);
                    return Err(e);
                }
            }
        }
        Ok(groups)
    }

    /// The offsets `asks` (partition, timestamp: [`list_offsets::LATEST`],
    /// [`list_offsets::EARLIEST`] or a time) name, each asked of its partition's leader in
    /// `topic`. A partition without a leader, or whose leader failed to answer, comes back
    /// with an error code (retriable ones mean: ask for metadata again); only a request that
    /// could not be encoded fails the whole call.
    pub fn list_offsets(
        &mut self,
        topic: &TopicMetadata,
        asks: &[(i32, i64)],
        isolation: Isolation,
    ) -> Result<Vec<ListedOffset>, ConnError> {
        let mut by_leader: HashMap<i32, Vec<(i32, i64)>> = HashMap::new();
        let mut listed = Vec::with_capacity(asks.len());
        for &(partition, timestamp) in asks {
            match topic.partitions.iter().find(|p| p.partition == partition) {
                Some(p) if p.leader >= 0 => by_leader
                    .entry(p.leader)
                    .or_default()
                    .push((partition, timestamp)),
                found => listed.push(ListedOffset {
                    partition,
                    error: if found.is_some() {
                        ErrorCode::LEADER_NOT_AVAILABLE
                    } else {
                        ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
                    },
                    offset: -1,
                    leader_epoch: -1,
                }),
            }
        }
        for (leader, asks) in by_leader {
            let answer = self.broker_at_rest(leader).and_then(|conn| {
                conn.ask(
                    |id, client| {
                        list_offsets::list_offsets_request(
                            id,
                            client,
                            isolation,
                            &topic.name,
                            &asks,
                        )
                    },
                    list_offsets::decode_list_offsets,
                )
            });
            match answer {
                Ok(answered) => {
                    for &(partition, _) in &asks {
                        let got = answered
                            .iter()
                            .find(|(t, l)| *t == topic.name && l.partition == partition);
                        listed.push(got.map(|(_, l)| *l).unwrap_or(ListedOffset {
                            partition,
                            error: ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                            offset: -1,
                            leader_epoch: -1,
                        }));
                    }
                }
                Err(ConnError::Encode(e)) => return Err(ConnError::Encode(e)),
                Err(_) => {
                    self.forget(leader);
                    listed.extend(asks.iter().map(|&(partition, _)| ListedOffset {
                        partition,
                        error: ErrorCode::NOT_LEADER_OR_FOLLOWER,
                        offset: -1,
                        leader_epoch: -1,
                    }));
                }
            }
        }
        listed.sort_by_key(|l| l.partition);
        Ok(listed)
    }
}

/// Spaces out the metadata requests of a fetcher or writer whose leaders moved: at most one
/// per `every`.
#[derive(Debug)]
pub(crate) struct Pacer {
    every: Duration,
    last: Option<Instant>,
}

impl Pacer {
    pub(crate) fn new(every: Duration) -> Self {
        Pacer { every, last: None }
    }

    /// Whether a request may go now; if so, it counts as sent.
    pub(crate) fn ready(&mut self) -> bool {
        if self.last.is_some_and(|at| at.elapsed() < self.every) {
            return false;
        }
        self.last = Some(Instant::now());
        true
    }
}

/// The topics of partition keys, each once (keys in topic order).
pub(crate) fn topics_of<'a, V>(
    keys: impl Iterator<Item = (&'a (Arc<str>, i32), V)>,
) -> Vec<&'a str> {
    let mut topics: Vec<&str> = keys.map(|((t, _), _)| t.as_ref()).collect();
    topics.dedup();
    topics
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    pub(super) fn options() -> Options {
        Options {
            client_id: "mf".into(),
            timeout: Duration::from_millis(200),
            max_frame: 1 << 20,
            address_check: None,
        }
    }

    #[test]
    fn metadata_requests_are_spaced_out() {
        let mut slow = Pacer::new(Duration::from_secs(3600));
        assert!(slow.ready());
        assert!(!slow.ready(), "a second request within the interval");
        let mut fast = Pacer::new(Duration::ZERO);
        assert!(fast.ready() && fast.ready());
    }

    #[test]
    fn a_bootstrap_list_is_one_to_thirty_two_addresses() {
        assert!(Cluster::new(" , ", Security::default(), options()).is_err());
        let many = vec!["127.0.0.1:1"; MAX_BOOTSTRAP + 1].join(",");
        assert!(Cluster::new(&many, Security::default(), options()).is_err());
        let cluster = Cluster::new("a:1, b:2", Security::default(), options());
        assert_eq!(
            cluster.map(|c| c.bootstrap).ok(),
            Some(vec!["a:1".into(), "b:2".into()])
        );
    }

    #[test]
    fn no_answering_bootstrap_address_is_the_last_connection_error() {
        // A port nothing listens on: refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = listener.local_addr().expect("its address").to_string();
        drop(listener);
        let mut cluster = Cluster::new(&addr, Security::default(), options()).expect("one address");
        match cluster.metadata(&["orders"]) {
            Err(ConnError::Io { peer, .. }) => assert_eq!(peer, addr),
            other => panic!("expected a connection error, got {other:?}"),
        }
    }

    #[test]
    fn a_connection_whose_session_is_about_to_end_is_renewed_and_no_other() {
        let mut cluster =
            Cluster::new("127.0.0.1:1", Security::default(), options()).expect("one address");
        // Broker 1 gave a session of 1 ms (renewed at once), broker 2 one of an hour, broker 3
        // none (0: no end), a hostile -1 is none too.
        let lifetimes = [(1, 1), (2, 3_600_000), (3, 0), (4, -1)];
        for (node, lifetime) in lifetimes {
            let mut conn = scripted(&format!("b{node}:9092"), Vec::new());
            conn.session_lasts(lifetime);
            cluster.adopt(node, conn);
        }
        let serials: Vec<u64> = (2..=4)
            .filter_map(|node| cluster.connected(node).map(|c| c.serial()))
            .collect();
        // Broker 1's ending connection is dropped for a new one (none can be opened here: its
        // address is unknown without metadata); the others are handed out as they are.
        assert!(matches!(
            cluster.broker_at_rest(1),
            Err(ConnError::UnknownBroker { node_id: 1 })
        ));
        assert!(cluster.connected(1).is_none());
        for (node, serial) in (2..=4).zip(serials) {
            let conn = cluster.broker_at_rest(node).expect("kept");
            assert_eq!(conn.serial(), serial, "{node}");
        }
    }

    #[test]
    fn a_broker_no_metadata_named_is_unknown() {
        let mut cluster =
            Cluster::new("127.0.0.1:1", Security::default(), options()).expect("one address");
        assert!(matches!(
            cluster.broker(3),
            Err(ConnError::UnknownBroker { node_id: 3 })
        ));
    }

    #[test]
    fn partitions_without_a_leader_answer_an_error_without_a_request() {
        let mut cluster =
            Cluster::new("127.0.0.1:1", Security::default(), options()).expect("one address");
        let topic = TopicMetadata {
            name: "orders".into(),
            error: ErrorCode::NONE,
            partitions: vec![mirrorflow_core::protocol::metadata::PartitionLeader {
                partition: 0,
                error: ErrorCode::LEADER_NOT_AVAILABLE,
                leader: -1,
                leader_epoch: -1,
            }],
        };
        let listed = cluster
            .list_offsets(
                &topic,
                &[(0, list_offsets::LATEST), (1, list_offsets::LATEST)],
                Isolation::ReadCommitted,
            )
            .expect("nothing to encode wrongly");
        assert_eq!(listed[0].error, ErrorCode::LEADER_NOT_AVAILABLE);
        assert_eq!(listed[1].error, ErrorCode::UNKNOWN_TOPIC_OR_PARTITION);
    }
    /// A broker that answers with the bytes it was given, whatever is sent to it.
    struct Scripted(std::io::Cursor<Vec<u8>>);

    impl std::io::Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(buf)
        }
    }

    impl std::io::Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    pub(super) fn scripted(peer: &str, answer: Vec<u8>) -> Conn {
        Conn::over(peer, Scripted(std::io::Cursor::new(answer)), &options())
    }

    /// A frame answering correlation id `id` with `body`.
    pub(super) fn answer(id: i32, body: &[u8]) -> Vec<u8> {
        let size = i32::try_from(body.len() + 4).unwrap_or(i32::MAX);
        let mut f = size.to_be_bytes().to_vec();
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    pub(super) fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&i16::try_from(s.len()).unwrap_or(i16::MAX).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    /// A Metadata v8 answer naming `brokers` brokers (`b<n>:9092`) and no topic.
    pub(super) fn metadata_body(brokers: i32) -> Vec<u8> {
        let mut md = Vec::new();
        md.extend_from_slice(&0_i32.to_be_bytes());
        md.extend_from_slice(&brokers.to_be_bytes());
        for node in 1..=brokers {
            md.extend_from_slice(&node.to_be_bytes());
            string(&mut md, &format!("b{node}"));
            md.extend_from_slice(&9092_i32.to_be_bytes());
            md.extend_from_slice(&(-1_i16).to_be_bytes());
        }
        md.extend_from_slice(&(-1_i16).to_be_bytes());
        md.extend_from_slice(&1_i32.to_be_bytes());
        md.extend_from_slice(&0_i32.to_be_bytes());
        md.extend_from_slice(&0_i32.to_be_bytes());
        md
    }

    /// A cluster whose metadata names `brokers` brokers (`b<n>:9092`), each answering its
    /// ListGroups with one group of `name_len` bytes of type `share`.
    fn listing_cluster(brokers: i32, name_len: usize) -> Cluster {
        let mut cluster =
            Cluster::new("127.0.0.1:1", Security::default(), options()).expect("one address");
        let mut metadata = scripted("m", answer(0, &metadata_body(brokers)));
        metadata.serve(protocol::API_METADATA, protocol::METADATA_VERSION);
        cluster.adopt_metadata(metadata);
        for node in 1..=brokers {
            let mut body = Vec::new();
            body.extend_from_slice(&0_i32.to_be_bytes());
            body.extend_from_slice(&0_i16.to_be_bytes());
            body.extend_from_slice(&1_i32.to_be_bytes());
            string(&mut body, &"g".repeat(name_len));
            string(&mut body, "share");
            let address = format!("b{node}:9092");
            let mut conn = scripted(&address, answer(0, &body));
            conn.serve(protocol::API_LIST_GROUPS, protocol::LIST_GROUPS_VERSION);
            cluster.adopt(node, conn);
        }
        cluster
    }

    fn bounds(brokers: usize, bytes: usize) -> ListingBounds {
        ListingBounds {
            brokers,
            bytes,
            deadline: Instant::now() + Duration::from_secs(60),
        }
    }

    #[test]
    fn a_group_listing_gathers_every_broker_within_its_bounds() {
        let listed = listing_cluster(2, 10).list_groups(bounds(2, 30));
        let listed = listed.expect("within bounds: 2 brokers, 30 bytes");
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().all(|g| g.protocol_type == "share"));

        // More brokers than allowed: none is asked.
        match listing_cluster(3, 10).list_groups(bounds(2, 1000)) {
            Err(ConnError::Limit {
                count: 3, max: 2, ..
            }) => {}
            other => panic!("expected the broker bound, got {other:?}"),
        }
        // Names past the byte bound over the answers together (15 bytes each).
        match listing_cluster(2, 10).list_groups(bounds(2, 29)) {
            Err(ConnError::Limit {
                count: 30, max: 29, ..
            }) => {}
            other => panic!("expected the byte bound, got {other:?}"),
        }
        // Past the deadline, no broker is asked.
        let mut late = bounds(2, 1000);
        late.deadline = Instant::now();
        match listing_cluster(2, 10).list_groups(late) {
            Err(ConnError::Limit { count: 2, .. }) => {}
            other => panic!("expected the deadline, got {other:?}"),
        }
    }
}
