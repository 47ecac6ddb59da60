//! `load-json`: a data set of JSON-like event records, produced in batches of a chosen codec,
//! as applications write them (a few fields drawn from small vocabularies, ids, timestamps,
//! numbers): compressible about as much as real event streams, unlike random bytes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use serde_json::json;

use crate::client;

const EVENTS: &[&str] = &[
    "page_view",
    "add_to_cart",
    "checkout_started",
    "payment_authorized",
    "order_shipped",
    "search",
    "login",
    "logout",
];
const PAGES: &[&str] = &[
    "/",
    "/products/shoes/running",
    "/products/jackets/rain",
    "/cart",
    "/checkout/payment",
    "/account/orders",
    "/search",
    "/help/returns",
];
const AGENTS: &[&str] = &[
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0",
];
const COUNTRIES: &[&str] = &["DE", "FR", "US", "BR", "JP", "IN", "NL", "ES", "GB", "CA"];

/// xorshift64*: reproducible, no dependency, good enough to spread the fields.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// One event of exactly `size` bytes (padded inside an `x_note` field, or cut if `size` is small).
fn event(rng: &mut Rng, seq: u64, size: usize) -> Vec<u8> {
    let mut items = Vec::new();
    for _ in 0..(1 + rng.next() % 3) {
        items.push(json!({
            "sku": format!("SKU-{:06}", rng.next() % 50_000),
            "qty": 1 + rng.next() % 4,
            "price_cents": 199 + rng.next() % 20_000,
        }));
    }
    let mut v = json!({
        "seq": seq,
        "ts": format!("2026-12-01T{:02}:{:02}:{:02}.{:03}Z", (seq / 3_600_000) % 24, (seq / 60_000) % 60, (seq / 1000) % 60, seq % 1000),
        "event": rng.pick(EVENTS),
        "user_id": format!("user-{:07}", rng.next() % 2_000_000),
        "session": format!("{:016x}", rng.next()),
        "page": rng.pick(PAGES),
        "referrer": rng.pick(PAGES),
        "country": rng.pick(COUNTRIES),
        "user_agent": rng.pick(AGENTS),
        "items": items,
        "experiment": {"name": "checkout-v2", "variant": if rng.next().is_multiple_of(2) { "a" } else { "b" }},
        "latency_ms": rng.next() % 900,
        // Last in both key orders (sorted, or as written), so the pad below lands in it.
        "x_note": "",
    })
    .to_string()
    .into_bytes();
    if v.len() < size {
        // The pad repeats words of the record itself, as free-text fields do.
        let words = [
            "ok ", "retry ", "cached ", "user ", "cart ", "view ", "eu-west ",
        ];
        let mut pad = String::new();
        while v.len() + pad.len() < size {
            pad.push_str(words[(rng.next() % words.len() as u64) as usize]);
        }
        pad.truncate(size - v.len());
        // Into the empty "x_note" value: the record stays valid JSON.
        let at = v.len() - 2;
        v.splice(at..at, pad.into_bytes());
    }
    v.truncate(size);
    v
}

/// Produces `n` records of `size` bytes over every partition of `topic`, in `codec` batches.
pub fn load_json(
    bootstrap: &str,
    topics: &[String],
    n: u64,
    size: usize,
    codec: &str,
) -> Result<()> {
    if topics.is_empty() {
        bail!("no topic to load");
    }
    let mut c = client(bootstrap);
    c.set("acks", "all")
        .set("enable.idempotence", "true")
        .set("compression.type", codec)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.kbytes", "65536");
    let producer: BaseProducer = c.create()?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let started = Instant::now();
    let mut bytes = 0_u64;
    for seq in 0..n {
        let value = event(&mut rng, seq, size);
        bytes += value.len() as u64;
        // Keys cycle per topic, so each topic sees up to 10,000 of them: keyed by `seq` alone,
        // 200 topics got 50 keys each, and 50 keys hashed over 10 partitions left some empty.
        let per_topic = topics.len() as u64;
        let key = format!("user-{}", (seq / per_topic) % 10_000);
        let topic = &topics[(seq % per_topic) as usize];
        let mut record = BaseRecord::to(topic).key(key.as_bytes()).payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, back)) => {
                    if e.rdkafka_error_code() != Some(RDKafkaErrorCode::QueueFull) {
                        bail!("producing: {e}");
                    }
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(120))?;
    println!(
        "{}",
        json!({
            "records": n,
            "bytes": bytes,
            "codec": codec,
            "seconds": started.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}

/// Kafka's record batch (magic 2) header: base offset (8), length (4), leader epoch (4), magic
/// (1), CRC (4), attributes (2, codec in the low 3 bits). Counts batches and their bytes per
/// codec over every segment of every partition of `topic` under a broker's `log.dirs` (`data`):
/// the codec the broker stored them in.
pub fn codecs(data: &Path, topic: &str) -> Result<()> {
    const NAMES: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];
    let mut batches: BTreeMap<&str, u64> = BTreeMap::new();
    let mut bytes: BTreeMap<&str, u64> = BTreeMap::new();
    let is_partition = |name: &str| {
        name.strip_prefix(topic)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(data).with_context(|| format!("reading {}", data.display()))? {
        let dir = entry?.path();
        if !dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(is_partition)
        {
            continue;
        }
        for seg in std::fs::read_dir(&dir)? {
            let seg = seg?.path();
            if seg.extension().is_some_and(|x| x == "log") {
                segments.push(seg);
            }
        }
    }
    segments.sort();
    for seg in &segments {
        let data = std::fs::read(seg).with_context(|| format!("reading {}", seg.display()))?;
        let mut at = 0_usize;
        while let Some(head) = data.get(at..at + 23) {
            let len = i32::from_be_bytes([head[8], head[9], head[10], head[11]]);
            // A preallocated tail of zeros ends the segment.
            let Ok(len @ 1..) = usize::try_from(len) else {
                break;
            };
            let codec = NAMES
                .get(usize::from(head[22] & 0x07))
                .copied()
                .unwrap_or("unknown");
            if head[16] == 2 {
                *batches.entry(codec).or_default() += 1;
                *bytes.entry(codec).or_default() += len as u64 + 12;
            }
            at += 12 + len;
        }
    }
    println!(
        "{}",
        json!({"segments": segments.len(), "batches": batches, "bytes": bytes})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_the_size_asked_for_and_stay_json() {
        let mut rng = Rng(7);
        for seq in 0..200 {
            let e = event(&mut rng, seq, 1024);
            assert_eq!(e.len(), 1024);
            let v: serde_json::Value = serde_json::from_slice(&e).expect("valid JSON");
            assert_eq!(v["seq"], seq);
            // The pad went into the note, not into another field.
            assert!(v["x_note"].as_str().is_some_and(|n| n.len() > 100));
        }
    }
}
