//! Answers of a few bytes that declare huge arrays or byte strings. Each is decoded in a child
//! process, once as the machine allows and once under an address-space limit (`ulimit -v`),
//! because an allocation the system refuses ends a Rust process with an abort, not a panic a
//! caller could catch.

use crate::alloc::{human, measure};
use crate::decoders::{self, KINDS};
use bytes::Bytes;

/// Big-endian fields, as the answers lay them out.
#[derive(Default)]
struct Body(Vec<u8>);

impl Body {
    fn i8(mut self, v: i8) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn string(self, s: &str) -> Self {
        let mut b = self.i16(s.len() as i16);
        b.0.extend_from_slice(s.as_bytes());
        b
    }
    fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
}

const HUGE: i32 = i32::MAX;

fn fetch_head() -> Body {
    Body::default().i32(0).i16(0).i32(0)
}

fn fetch_partition_head() -> Body {
    fetch_head()
        .i32(1)
        .string("t")
        .i32(1)
        .i32(0)
        .i16(0)
        .i64(0)
        .i64(0)
        .i64(0)
}

fn metadata_partition_head() -> Body {
    Body::default()
        .i32(0) // throttle
        .i32(0) // brokers
        .i16(-1) // cluster id
        .i32(1) // controller
        .i32(1) // topics
        .i16(0)
        .string("t")
        .i8(0)
        .i32(1) // partitions
        .i16(0)
        .i32(0)
        .i32(1)
        .i32(0)
}

/// (name, kind as in `broker_answers`, body).
pub fn cases() -> Vec<(&'static str, usize, Vec<u8>)> {
    vec![
        ("fetch_topics_2^31", 2, fetch_head().i32(HUGE).0),
        (
            "fetch_partitions_2^31",
            2,
            fetch_head().i32(1).string("t").i32(HUGE).0,
        ),
        ("fetch_aborted_2^31", 2, fetch_partition_head().i32(HUGE).0),
        (
            "fetch_records_2^31_bytes",
            2,
            fetch_partition_head().i32(-1).i32(-1).i32(HUGE).0,
        ),
        (
            "metadata_brokers_2^31",
            0,
            Body::default().i32(0).i32(HUGE).0,
        ),
        (
            "metadata_replicas_2^31",
            0,
            metadata_partition_head().i32(HUGE).0,
        ),
        ("produce_topics_2^31", 3, Body::default().i32(HUGE).0),
        (
            "produce_record_errors_2^31",
            3,
            Body::default()
                .i32(1)
                .string("t")
                .i32(1)
                .i32(0)
                .i16(0)
                .i64(0)
                .i64(0)
                .i64(0)
                .i32(HUGE)
                .0,
        ),
        (
            "list_offsets_topics_2^31",
            1,
            Body::default().i32(0).i32(HUGE).0,
        ),
        ("api_versions_2^31", 4, Body::default().i16(0).i32(HUGE).0),
        (
            "sasl_mechanisms_2^31",
            6,
            Body::default().i16(0).i32(HUGE).0,
        ),
    ]
}

/// Metadata v12, a flexible version a move to the library would bring: a compact array whose
/// unsigned varint count is 2^32 - 1. The core decodes no flexible answer, so only the library.
fn flexible_case() -> Vec<u8> {
    Body::default()
        .i32(0)
        .raw(&[0xff, 0xff, 0xff, 0xff, 0x0f])
        .0
}

/// A record batch (magic 2, no codec, CRC right) announcing 2^31 - 1 records and holding none:
/// what the library's record decoder reserves before reading one. The core's copy of whole
/// batches reads no record; its record reader counts records as it reads them.
fn record_batch_case() -> Vec<u8> {
    let after_crc = Body::default()
        .i16(0)
        .i32(0)
        .i64(0)
        .i64(0)
        .i64(-1)
        .i16(-1)
        .i32(-1)
        .i32(HUGE)
        .0;
    Body::default()
        .i64(0)
        .i32(after_crc.len() as i32 + 9)
        .i32(0)
        .i8(2)
        .raw(&crc32c::crc32c(&after_crc).to_be_bytes())
        .raw(&after_crc)
        .0
}

/// The cases only the library decodes: (name, what, body).
fn library_only() -> [(&'static str, &'static str, Vec<u8>); 2] {
    [
        ("metadata_v12_compact_2^32", "Metadata v12", flexible_case()),
        (
            "record_batch_count_2^31",
            "RecordBatchDecoder",
            record_batch_case(),
        ),
    ]
}

fn decode_library_only(name: &str, body: Bytes) -> decoders::Outcome {
    use kafka_protocol::messages::MetadataResponse;
    use kafka_protocol::protocol::Decodable;
    use kafka_protocol::records::RecordBatchDecoder;
    let mut b = body;
    let ok = if name.starts_with("metadata") {
        MetadataResponse::decode(&mut b, 12).is_ok()
    } else {
        RecordBatchDecoder::decode(&mut b).is_ok()
    };
    if ok {
        decoders::Outcome::Decoded
    } else {
        decoders::Outcome::Refused
    }
}

/// Runs in the child: decodes one case and prints what it allocated.
pub fn run_case(name: &str, decoder: &str) -> Result<(), String> {
    if let Some((_, _, body)) = library_only().into_iter().find(|(n, _, _)| *n == name) {
        if decoder != "library" {
            return Err(format!("{name}: only the library decodes it"));
        }
        let bytes = Bytes::from(body);
        let (outcome, allocated) = measure(|| decode_library_only(name, bytes));
        println!(
            "{outcome:?} largest={} peak={}",
            allocated.largest, allocated.peak
        );
        return Ok(());
    }
    let (_, kind, body) = cases()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .ok_or_else(|| format!("no case {name}"))?;
    let bytes = Bytes::from(body.clone());
    let (outcome, allocated) = if decoder == "library" {
        measure(|| decoders::library(kind, &bytes))
    } else {
        measure(|| decoders::project(kind, &body))
    };
    println!(
        "{outcome:?} largest={} peak={}",
        allocated.largest, allocated.peak
    );
    Ok(())
}

/// One child run: its exit and what it printed.
fn child(name: &str, decoder: &str, limit_kib: Option<u64>) -> String {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return format!("no executable: {e}"),
    };
    let limit = limit_kib.map_or("unlimited".to_owned(), |k| k.to_string());
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v \"$1\" && exec \"$2\" hostile-case \"$3\" \"$4\"")
        .arg("sh")
        .arg(&limit)
        .arg(&exe)
        .arg(name)
        .arg(decoder)
        .output();
    match out {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let first = err.lines().next().unwrap_or("").trim().to_owned();
            format!("DIED ({}): {first}", out.status)
        }
        Err(e) => format!("not run: {e}"),
    }
}

fn summary(line: &str) -> String {
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse::<usize>().ok())
    };
    match (field("largest="), field("peak=")) {
        (Some(largest), Some(peak)) => format!(
            "{}, largest request {}, peak {}",
            line.split_whitespace().next().unwrap_or(""),
            human(largest),
            human(peak)
        ),
        _ => line.to_owned(),
    }
}

/// The table of the README: every case through both decoders, unlimited and under 4 GiB of
/// address space.
pub fn report() {
    const LIMIT_KIB: u64 = 4 << 20;
    println!("## Hostile answers (children; limit = ulimit -v {LIMIT_KIB} KiB)\n");
    println!("| case | kind | bytes | core | library | library under the limit |");
    println!("|---|---|---|---|---|---|");
    let mut all: Vec<(&str, &str, usize, bool)> = cases()
        .iter()
        .map(|(n, k, b)| (*n, KINDS[*k].0, b.len(), true))
        .collect();
    all.extend(
        library_only()
            .iter()
            .map(|(n, w, b)| (*n, *w, b.len(), false)),
    );
    for (name, what, len, core_too) in all {
        let core = if core_too {
            summary(&child(name, "project", Some(LIMIT_KIB)))
        } else {
            "(not decoded by the core)".to_owned()
        };
        let library = summary(&child(name, "library", None));
        let limited = summary(&child(name, "library", Some(LIMIT_KIB)));
        println!("| {name} | {what} | {len} | {core} | {library} | {limited} |");
    }
    println!();
}
