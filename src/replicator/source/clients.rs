//! Kafka client settings of the source loop: what correctness requires (forced) and what
//! throughput and memory want (defaults a flow's `config` may override).

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// Sets `key` unless the flow's own client properties already did.
fn default(config: &mut ClientConfig, key: &str, value: impl Into<String>) {
    if config.get(key).is_none() {
        config.set(key, value);
    }
}

/// How much the source consumer fetches at once and keeps queued. librdkafka keeps one fetch
/// in flight per broker, so copies run at most at a fetch per round trip: with 4 MiB fetches
/// a 50 ms round trip held 1 KiB copies to 42 k records/s, and 8 MiB fetches with a 16 MiB
/// queue doubled that (bench/results/2026-12-01-wan-fetch-trial). Near the source the small
/// window keeps RSS low; far from it the window grows with the round trip, to a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchWindow {
    /// `fetch.max.bytes`: one fetch response.
    pub fetch_bytes: usize,
    /// `max.partition.fetch.bytes`: one partition's share of it.
    pub partition_bytes: usize,
    /// `queued.max.messages.kbytes`: the prefetch queue, which must hold a whole response or
    /// the next fetch waits for the loop.
    pub queued_kbytes: usize,
}

impl FetchWindow {
    const MIB: usize = 1 << 20;
    /// The window near the source (and when the round trip is unknown).
    const BASE: usize = 4 * Self::MIB;
    /// One more base window per this much round trip...
    const STEP: Duration = Duration::from_micros(12_500);
    /// ...up to this: 16 MiB fetches and queue add about 25 MiB of RSS.
    const MAX: usize = 16 * Self::MIB;

    pub fn for_round_trip(round_trip: Option<Duration>) -> Self {
        let steps = round_trip
            .map(|rtt| rtt.as_micros() / Self::STEP.as_micros())
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .unwrap_or(0)
            .max(1);
        let fetch_bytes = Self::BASE.saturating_mul(steps).min(Self::MAX);
        FetchWindow {
            fetch_bytes,
            // A few partitions must be able to fill a response on their own.
            partition_bytes: (fetch_bytes / 4).max(Self::MIB),
            queued_kbytes: fetch_bytes / 1024,
        }
    }

    /// Each of `consumers`' share of this window, never under the base window near the source.
    fn shared_by(self, consumers: usize) -> Self {
        let fetch_bytes = (self.fetch_bytes / consumers.max(1)).max(Self::BASE);
        FetchWindow {
            fetch_bytes,
            partition_bytes: (fetch_bytes / 4).max(Self::MIB),
            queued_kbytes: fetch_bytes / 1024,
        }
    }
}

/// How many source consumers a replica runs, and the fetch window of each. One consumer has
/// one connection per source broker, and one connection carries about one TCP window per round
/// trip whatever the fetch size: at 50 ms one consumer copied 1 KiB records at 49.6 k/s, as
/// fast as MirrorMaker 2 tuned with 8 tasks (8 connections), and two replicas at 87 k/s
/// (bench/results/2026-12-04-wan-link, -wan-link-replicas). So far from the source a replica
/// runs one consumer per [`Self::PER_CONSUMER`] of round trip, each with its share of the window,
/// which keeps the memory of the fetch window where one consumer had it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceFetch {
    pub consumers: usize,
    pub window: FetchWindow,
    /// The whole-batch copy's window for each of its fetching connections: the whole window
    /// of the round trip, not a share. A batch fetch round pays the request's round trip once
    /// and then the answer's transfer, so the more a round carries, the less of the link's
    /// time goes to round trips: at 50 ms 7.5 MiB rounds moved about 38 MiB/s a connection,
    /// 16 MiB rounds 45 MiB/s (bench/results/2026-12-05-batches-wan-trials). Without
    /// librdkafka's prefetch queue beside it, what it holds is bounded by the copy's own
    /// queues (a few rounds).
    pub batch_window: FetchWindow,
}

impl SourceFetch {
    const PER_CONSUMER: Duration = Duration::from_millis(25);
    const MAX_AUTO: usize = 4;

    /// `configured`: `spec.sourceLoop.consumers`, which wins over the round trip.
    pub fn plan(round_trip: Option<Duration>, configured: Option<u8>) -> Self {
        let total = FetchWindow::for_round_trip(round_trip);
        let consumers = match configured {
            Some(n) => usize::from(n.max(1)),
            None => {
                // Rounded, so a link measured a little under 50 ms still gets its second one.
                let per = Self::PER_CONSUMER.as_micros();
                let n = round_trip
                    .map(|rtt| (rtt.as_micros().saturating_add(per / 2)) / per)
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
                    .unwrap_or(1);
                n.clamp(1, Self::MAX_AUTO)
            }
        };
        SourceFetch {
            consumers,
            window: total.shared_by(consumers),
            batch_window: total,
        }
    }
}

/// The round trip to the source cluster: the fastest of three metadata requests on an open
/// connection (the first request pays for connecting, TLS and authentication and is not
/// counted). `None` when the cluster does not answer; the copy then starts with the base
/// window.
pub fn round_trip(source: &ClientConfig) -> Option<Duration> {
    const TIMEOUT: Duration = Duration::from_secs(10);
    let client: BaseConsumer = watermarks(source).create().ok()?;
    client.fetch_metadata(None, TIMEOUT).ok()?;
    (0..3)
        .filter_map(|_| {
            let start = Instant::now();
            client.fetch_metadata(None, TIMEOUT).ok()?;
            Some(start.elapsed())
        })
        .min()
}

/// The source consumer: a group member for partition assignment only. Offsets are never
/// committed to the source; positions live on the target.
pub fn consumer(
    source: &ClientConfig,
    group: &str,
    metadata_refresh: Duration,
    window: FetchWindow,
) -> ClientConfig {
    let mut c = source.clone();
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // Never jump silently: the copy loop sets every start offset itself (the beginning
        // without a stored position, as MM2) and handles a position outside the log as a
        // break in continuity (`continuity.rs`).
        .set("auto.offset.reset", "error")
        .set("enable.partition.eof", "false");
    // Moves only the partitions that change owner when replicas come and go.
    default(
        &mut c,
        "partition.assignment.strategy",
        "cooperative-sticky",
    );
    // New partitions must be noticed about as fast as discovery notices new topics.
    default(
        &mut c,
        "topic.metadata.refresh.interval.ms",
        metadata_refresh.as_millis().to_string(),
    );
    // A full prefetch queue postpones the next fetch by `fetch.queue.backoff.ms`, 1 s by
    // default: the copy loop drained the queue in a fraction of that and then waited, which
    // capped 1 KiB copies at ~15 k records/s. With a short backoff a small queue keeps the loop
    // busy, and the small queue and fetches keep RSS low (bench/results/2026-11-30-run3).
    default(&mut c, "fetch.queue.backoff.ms", "10");
    default(&mut c, "fetch.max.bytes", window.fetch_bytes.to_string());
    default(
        &mut c,
        "max.partition.fetch.bytes",
        window.partition_bytes.to_string(),
    );
    default(
        &mut c,
        "queued.max.messages.kbytes",
        window.queued_kbytes.to_string(),
    );
    default(&mut c, "queued.min.messages", "10000");
    default(&mut c, "fetch.wait.max.ms", "100");
    c
}

/// A static member's session when the flow sets none: long enough for a pod to stop and start
/// again (a few seconds) without its partitions moving, and short enough that partitions of a
/// replica that does not come back (a scale-down, a lost node) move to the others within it.
pub const STATIC_SESSION_TIMEOUT: Duration = Duration::from_secs(20);

/// Makes the source consumer number `worker` of `replica` a static member of its group
/// (KIP-345): the same name after every restart that subscribes to the same topics (their
/// `shape`, [`super::engine::subscription`]), so the coordinator keeps its partitions for it
/// while it restarts, and a second process under that name fences the first.
pub fn static_member(config: &mut ClientConfig, replica: &str, worker: usize, shape: u32) {
    config.set(
        "group.instance.id",
        format!("{replica}-c{worker}-{shape:08x}"),
    );
    default(
        config,
        "session.timeout.ms",
        STATIC_SESSION_TIMEOUT.as_millis().to_string(),
    );
}

/// The producer of copied records and positions on the target.
pub fn producer(target: &ClientConfig, metadata_refresh: Duration) -> ClientConfig {
    let mut c = target.clone();
    c.set("acks", "all")
        .set("enable.idempotence", "true")
        // Remote topics are created by discovery with the right partitions and configs.
        .set("allow.auto.create.topics", "false");
    // Each copied record waits up to `linger.ms` here on top of its producer's own wait. At
    // 5 ms (Kafka's Java producer default, MirrorMaker 2's) ours was 1 ms slower at the median
    // than MirrorMaker 2 at 1000 records/s and lost two of three paired p99s
    // (bench/results/2026-12-04-latency-full-reps3). Part of that is how the wait is kept:
    // librdkafka sleeps in whole milliseconds rounded up, so 5 ms are 5-6 when other
    // partitions' records wake it in between, where the Java producer's millisecond clock
    // averages 5. At 3 ms ours won all three (bench/results/2026-12-05-latency-linger3-reps3; the
    // cost under heavy traffic: -compressed-linger3); a flow may set its own.
    default(&mut c, "linger.ms", "3");
    default(&mut c, "batch.size", "1000000");
    default(&mut c, "batch.num.messages", "10000");
    // The consumer hands over decompressed records, so the source producers' codec is gone by
    // the time a copy is written: uncompressed writes made lz4 topics 3x and zstd topics 6x
    // larger on the target and on the wire to it. lz4 took ~6 % more CPU than none there
    // (bench/results/2026-12-01-compressed/findings.md); a flow may choose another codec or none.
    default(&mut c, "compression.type", "lz4");
    // Each queued record also costs librdkafka ~100 bytes of bookkeeping: bound both. The
    // queue only has to cover linger plus a produce round trip; more only adds RSS.
    default(&mut c, "queue.buffering.max.kbytes", "4096");
    default(&mut c, "queue.buffering.max.messages", "20000");
    // A record as large as the source accepted must fit.
    default(&mut c, "message.max.bytes", "16777216");
    // A failed delivery rewinds the partition and copies again; no need to wait forever.
    default(&mut c, "message.timeout.ms", "120000");
    default(
        &mut c,
        "topic.metadata.refresh.interval.ms",
        metadata_refresh.as_millis().to_string(),
    );
    c
}

/// A client for high watermarks only (never in a group, never fetching): `read_uncommitted`,
/// so they include open transactions and markers (a `read_committed` client's ListOffsets
/// answers the last stable offset).
pub fn watermarks(cluster: &ClientConfig) -> ClientConfig {
    let mut c = cluster.clone();
    c.set("group.id", "mirrorflow-watermarks")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_uncommitted");
    c
}

/// The producer of offset syncs. Syncs never time out (0 = forever): a sync that fails while a
/// later one of the same partition succeeds would hide a delta change from dense readers.
pub fn sync_producer(cluster: &ClientConfig) -> ClientConfig {
    let mut c = cluster.clone();
    c.set("acks", "all")
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "0")
        .set("allow.auto.create.topics", "false");
    default(&mut c, "linger.ms", "5");
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_consumer_of_a_replica_is_its_own_static_member_with_a_short_session_unless_set() {
        let mut c = ClientConfig::new();
        static_member(&mut c, "flow-2", 1, 0xab);
        assert_eq!(c.get("group.instance.id"), Some("flow-2-c1-000000ab"));
        assert_eq!(c.get("session.timeout.ms"), Some("20000"));
        let mut own = ClientConfig::new();
        own.set("session.timeout.ms", "60000");
        static_member(&mut own, "flow-0", 0, 0);
        assert_eq!(own.get("session.timeout.ms"), Some("60000"));
    }

    #[test]
    fn durability_is_forced_and_tuning_yields_to_the_flow() {
        let mut user = ClientConfig::new();
        user.set("bootstrap.servers", "x:1")
            .set("acks", "1")
            .set("linger.ms", "50");
        let p = producer(&user, Duration::from_secs(10));
        assert_eq!(p.get("acks"), Some("all"));
        assert_eq!(p.get("enable.idempotence"), Some("true"));
        assert_eq!(p.get("linger.ms"), Some("50"));
        assert_eq!(p.get("compression.type"), Some("lz4"));
        let mut none = user.clone();
        none.set("compression.type", "none");
        assert_eq!(
            producer(&none, Duration::from_secs(10)).get("compression.type"),
            Some("none")
        );
        let c = consumer(
            &user,
            "g",
            Duration::from_secs(10),
            FetchWindow::for_round_trip(None),
        );
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("auto.offset.reset"), Some("error"));
        assert_eq!(c.get("topic.metadata.refresh.interval.ms"), Some("10000"));
        // The prefetch queue must not stall the loop for a second each time it fills.
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("10"));
        let mut tuned = user.clone();
        tuned.set("fetch.queue.backoff.ms", "100");
        let c = consumer(
            &tuned,
            "g",
            Duration::from_secs(10),
            FetchWindow::for_round_trip(None),
        );
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("100"));
        assert_eq!(sync_producer(&user).get("message.timeout.ms"), Some("0"));
    }

    #[test]
    fn the_fetch_window_grows_with_the_round_trip_to_a_cap() {
        let window = |ms: u64| FetchWindow::for_round_trip(Some(Duration::from_millis(ms)));
        let mib = 1 << 20;
        let base = FetchWindow {
            fetch_bytes: 4 * mib,
            partition_bytes: mib,
            queued_kbytes: 4096,
        };
        // Loopback, a data centre, or unknown: the window the LAN benchmarks were tuned with.
        assert_eq!(FetchWindow::for_round_trip(None), base);
        assert_eq!(window(0), base);
        assert_eq!(window(12), base);
        assert_eq!(window(25).fetch_bytes, 8 * mib);
        assert_eq!(window(25).partition_bytes, 2 * mib);
        assert_eq!(window(25).queued_kbytes, 8192);
        assert_eq!(window(50).fetch_bytes, 16 * mib);
        assert_eq!(window(50).partition_bytes, 4 * mib);
        assert_eq!(window(100), window(50));
        assert_eq!(
            FetchWindow::for_round_trip(Some(Duration::MAX)).fetch_bytes,
            16 * mib
        );
    }

    #[test]
    fn far_from_the_source_a_replica_runs_more_consumers_sharing_the_window() {
        let plan =
            |ms: u64, configured| SourceFetch::plan(Some(Duration::from_millis(ms)), configured);
        let mib = 1 << 20;
        let near = SourceFetch::plan(None, None);
        assert_eq!(near.consumers, 1);
        assert_eq!(near.window, FetchWindow::for_round_trip(None));
        assert_eq!(plan(0, None).consumers, 1);
        assert_eq!(plan(25, None).consumers, 1);
        assert_eq!(plan(25, None).window.fetch_bytes, 8 * mib);
        // A 50 ms link measured a little short still gets two.
        assert_eq!(plan(48, None).consumers, 2);
        assert_eq!(plan(50, None).consumers, 2);
        assert_eq!(plan(50, None).window.fetch_bytes, 8 * mib);
        assert_eq!(plan(50, None).window.queued_kbytes, 8192);
        assert_eq!(plan(100, None).consumers, 4);
        assert_eq!(plan(100, None).window.fetch_bytes, 4 * mib);
        assert_eq!(plan(100, None).window.partition_bytes, mib);
        // Each whole-batch fetching connection takes the whole window of the round trip.
        assert_eq!(near.batch_window, near.window);
        assert_eq!(plan(50, None).batch_window.fetch_bytes, 16 * mib);
        assert_eq!(
            plan(100, None).batch_window,
            FetchWindow::for_round_trip(Some(Duration::from_millis(100)))
        );
        assert_eq!(SourceFetch::plan(Some(Duration::MAX), None).consumers, 4);
        // The spec wins either way; a share never drops under the base window.
        assert_eq!(plan(100, Some(1)).consumers, 1);
        assert_eq!(plan(100, Some(1)).window.fetch_bytes, 16 * mib);
        assert_eq!(plan(0, Some(3)).consumers, 3);
        assert_eq!(plan(0, Some(3)).window.fetch_bytes, 4 * mib);
    }

    #[test]
    fn a_flows_own_fetch_settings_win_over_the_window() {
        let mut user = ClientConfig::new();
        user.set("fetch.max.bytes", "1000000");
        let far = FetchWindow::for_round_trip(Some(Duration::from_millis(80)));
        let c = consumer(&user, "g", Duration::from_secs(10), far);
        assert_eq!(c.get("fetch.max.bytes"), Some("1000000"));
        assert_eq!(c.get("max.partition.fetch.bytes"), Some("4194304"));
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("16384"));
    }
}
