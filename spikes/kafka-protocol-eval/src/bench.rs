//! CPU per MiB of the copy's two large messages, the core's code against kafka-protocol's: a
//! Fetch v11 answer decoded, a Produce v8 request encoded, each 8 MiB over 100 partitions.
//! Time is the thread's own CPU time (`/proc/thread-self/schedstat`), which a busy shared
//! machine stretches less than the wall clock; it advances in scheduler ticks, so each
//! repetition runs 0.1-1.5 s of CPU; 5 repetitions, median and spread.

use crate::fixture;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{FetchResponse, ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use mirrorflow_core::EncodeError;
use mirrorflow_core::protocol;
use std::hint::black_box;

fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// ns of CPU per MiB for `iterations` runs of `op` over `mib` MiB each.
fn ns_per_mib(iterations: u32, mib: f64, mut op: impl FnMut() -> usize) -> f64 {
    let start = thread_cpu_ns();
    let mut sink = 0usize;
    for _ in 0..iterations {
        sink = sink.wrapping_add(op());
    }
    black_box(sink);
    (thread_cpu_ns().saturating_sub(start)) as f64 / (f64::from(iterations) * mib)
}

fn project_decode(body: &[u8]) -> usize {
    match protocol::decode_fetch(body) {
        Ok(a) => a
            .topics
            .iter()
            .flat_map(|(_, p)| p)
            .map(|p| p.records.len())
            .sum(),
        Err(_) => 0,
    }
}

fn library_decode(body: &Bytes) -> usize {
    match FetchResponse::decode(&mut body.clone(), 11) {
        Ok(a) => a
            .responses
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| p.records.as_ref().map_or(0, Bytes::len))
            .sum(),
        Err(_) => 0,
    }
}

/// The core's Produce request: each partition's batches written straight into the frame, as
/// the writer's restamp does.
fn project_produce(parts: &[(i32, Vec<u8>)], capacity: usize) -> usize {
    let build = || -> Result<Vec<u8>, EncodeError> {
        let mut r = protocol::ProduceRequest::new(7, "mirrorflow", None, -1, 30_000, capacity)?;
        r.topic("orders")?;
        for (p, bytes) in parts {
            r.partition(*p, |buf| {
                buf.extend_from_slice(bytes);
                Ok::<(), EncodeError>(())
            })?;
        }
        r.finish()
    };
    build().map_or(0, |f| f.len())
}

/// How the records reach kafka-protocol's request, which takes each partition's as one `Bytes`.
enum Records<'a> {
    /// The batches as they are: the least the library can cost, but the writer's restamp
    /// rewrites each batch's header and CRC, so it cannot hand the fetched bytes over.
    Shared(&'a [Bytes]),
    /// Restamped into a staging buffer allocated for the request, split per partition; the
    /// encoder then copies them into the frame.
    StagedFresh,
    /// The same, the staging buffer reclaimed from the previous request (all its `Bytes`
    /// dropped), so no new pages are touched.
    StagedReused(&'a mut BytesMut),
}

/// kafka-protocol's Produce request: the header and the request encoded into one buffer sized
/// by `compute_size`, the size prefix written first.
fn library_produce(parts: &[(i32, Vec<u8>)], records: Records<'_>) -> usize {
    let total: usize = parts.iter().map(|(_, b)| b.len()).sum();
    let mut fresh = BytesMut::new();
    let (shared, staging) = match records {
        Records::Shared(shared) => (Some(shared), None),
        Records::StagedFresh => {
            fresh.reserve(total);
            (None, Some(&mut fresh))
        }
        Records::StagedReused(staging) => {
            staging.clear();
            staging.reserve(total);
            (None, Some(staging))
        }
    };
    let mut staging = staging;
    let partition_data = parts
        .iter()
        .enumerate()
        .map(|(i, (p, bytes))| {
            let records = match (shared, staging.as_deref_mut()) {
                (Some(shared), _) => shared.get(i).cloned().unwrap_or_default(),
                (None, Some(staging)) => {
                    staging.extend_from_slice(bytes);
                    staging.split().freeze()
                }
                (None, None) => Bytes::new(),
            };
            PartitionProduceData::default()
                .with_index(*p)
                .with_records(Some(records))
        })
        .collect();
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("orders")))
                .with_partition_data(partition_data),
        ]);
    let header = RequestHeader::default()
        .with_request_api_key(0)
        .with_request_api_version(8)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("mirrorflow")));
    let encode = || -> anyhow::Result<BytesMut> {
        let size = header.compute_size(1)? + request.compute_size(8)?;
        let mut buf = BytesMut::with_capacity(size + 4);
        buf.put_i32(i32::try_from(size)?);
        header.encode(&mut buf, 1)?;
        request.encode(&mut buf, 8)?;
        Ok(buf)
    };
    encode().map_or(0, |b| b.len())
}

fn median_and_spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    (median, v[0], v[v.len() - 1])
}

pub fn report() -> Result<(), String> {
    const REPS: usize = 5;
    let parts = fixture::partitions();
    let batches = fixture::check(&parts)?;
    let records: usize = parts.iter().map(|(_, b)| b.len()).sum();
    let body = fixture::fetch_answer(&parts);
    let mib = records as f64 / f64::from(1u32 << 20);
    let shared: Vec<Bytes> = parts.iter().map(|(_, b)| Bytes::from(b.clone())).collect();
    let body_bytes = Bytes::from(body.clone());
    if project_decode(&body) != records || library_decode(&body_bytes) != records {
        return Err("a decoder lost record bytes".into());
    }
    let frame_len = project_produce(&parts, records + 4096);
    if frame_len != library_produce(&parts, Records::StagedFresh) {
        return Err("the two Produce requests differ in length".into());
    }
    println!(
        "## CPU per MiB ({} partitions, {batches} batches, {:.2} MiB of records, thread CPU time, {REPS} repetitions)\n",
        fixture::PARTITIONS,
        mib
    );
    let (_, core_alloc) = crate::alloc::measure(|| project_decode(&body));
    let (_, library_alloc) = crate::alloc::measure(|| library_decode(&body_bytes));
    println!(
        "Allocated per decode of this answer: core peak {}, kafka-protocol peak {} (neither copies record bytes: the core borrows them, the library slices the `Bytes`).\n",
        crate::alloc::human(core_alloc.peak),
        crate::alloc::human(library_alloc.peak)
    );
    println!("| operation | median ns/MiB | min | max |");
    println!("|---|---|---|---|");
    let mut staging = BytesMut::new();
    type Op<'a> = (&'a str, u32, Box<dyn FnMut() -> usize + 'a>);
    let ops: Vec<Op> = vec![
        (
            "Fetch v11 decode, core (borrows the frame)",
            100_000,
            Box::new(|| project_decode(&body)),
        ),
        (
            "Fetch v11 decode, kafka-protocol (Bytes slices)",
            100_000,
            Box::new(|| library_decode(&body_bytes)),
        ),
        (
            "Produce v8 encode, core (batches written into the frame)",
            400,
            Box::new(|| project_produce(&parts, records + 4096)),
        ),
        (
            "Produce v8 encode, kafka-protocol, the fetched Bytes handed over (no restamp)",
            400,
            Box::new(|| library_produce(&parts, Records::Shared(&shared))),
        ),
        (
            "Produce v8 encode, kafka-protocol, restamped into a fresh staging buffer",
            100,
            Box::new(|| library_produce(&parts, Records::StagedFresh)),
        ),
        (
            "Produce v8 encode, kafka-protocol, restamped into a reused staging buffer",
            400,
            Box::new(|| library_produce(&parts, Records::StagedReused(&mut staging))),
        ),
    ];
    for (name, iterations, mut op) in ops {
        op(); // warm the allocator and caches
        let runs = (0..REPS)
            .map(|_| ns_per_mib(iterations, mib, &mut op))
            .collect();
        let (median, min, max) = median_and_spread(runs);
        println!("| {name} | {median:.0} | {min:.0} | {max:.0} |");
    }
    println!();
    Ok(())
}
