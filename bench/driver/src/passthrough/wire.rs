//! The few Kafka requests a batch-passthrough copy needs, in their last non-flexible versions
//! (no tagged fields): ApiVersions v0, Fetch v11, Produce v8. Plaintext only: enough to measure
//! the copy's own cost on the bench's clusters.

use std::io::{Read, Write};
use std::net::TcpStream;

use anyhow::{Context, Result, bail};

const API_PRODUCE: i16 = 0;
const API_FETCH: i16 = 1;
const API_VERSIONS: i16 = 18;
const FETCH_VERSION: i16 = 11;
const PRODUCE_VERSION: i16 = 8;
/// Largest answer read: a fetch's `max_bytes` plus its framing, with room to spare.
const MAX_FRAME: usize = 256 << 20;
const CLIENT_ID: &str = "mirrorflow-bench-passthrough";

pub struct Conn {
    stream: TcpStream,
    next_correlation: i32,
    peer: String,
}

impl Conn {
    /// Connects and checks that the broker serves the versions used here.
    pub fn open(addr: &str) -> Result<Self> {
        let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let mut conn = Self {
            stream,
            next_correlation: 0,
            peer: addr.to_owned(),
        };
        let id = conn.send(API_VERSIONS, 0, &[])?;
        let answer = conn.recv(id)?;
        let mut r = Reader::new(&answer);
        let error = r.i16()?;
        if error != 0 {
            bail!("{addr}: ApiVersions error {error}");
        }
        let mut served = Vec::new();
        for _ in 0..r.len()? {
            served.push((r.i16()?, r.i16()?, r.i16()?));
        }
        for (api, version) in [(API_FETCH, FETCH_VERSION), (API_PRODUCE, PRODUCE_VERSION)] {
            let ok = served
                .iter()
                .any(|&(key, min, max)| key == api && (min..=max).contains(&version));
            if !ok {
                bail!("{addr} does not serve api {api} version {version}");
            }
        }
        Ok(conn)
    }

    /// Writes one request (header v1) and returns its correlation id.
    pub fn send(&mut self, api: i16, version: i16, body: &[u8]) -> Result<i32> {
        let id = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let mut frame = Writer::with_capacity(body.len() + 64);
        frame.i32(0);
        frame.i16(api);
        frame.i16(version);
        frame.i32(id);
        frame.string(CLIENT_ID);
        frame.0.extend_from_slice(body);
        let size = i32::try_from(frame.0.len() - 4).context("request over 2 GiB")?;
        frame.0[0..4].copy_from_slice(&size.to_be_bytes());
        self.stream
            .write_all(&frame.0)
            .with_context(|| format!("writing to {}", self.peer))?;
        Ok(id)
    }

    /// Reads the next answer, which must be the one to request `id` (answers come in order).
    pub fn recv(&mut self, id: i32) -> Result<Vec<u8>> {
        let mut size = [0u8; 4];
        self.stream
            .read_exact(&mut size)
            .with_context(|| format!("reading from {}", self.peer))?;
        let size = usize::try_from(i32::from_be_bytes(size)).unwrap_or(usize::MAX);
        if !(4..=MAX_FRAME).contains(&size) {
            bail!("{} answered a frame of {size} bytes", self.peer);
        }
        let mut frame = vec![0u8; size];
        self.stream.read_exact(&mut frame)?;
        let got = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
        if got != id {
            bail!("{} answered request {got}, expected {id}", self.peer);
        }
        frame.drain(..4);
        Ok(frame)
    }

    pub fn send_fetch(
        &mut self,
        topic: &str,
        wanted: &[(i32, i64)],
        limits: FetchLimits,
    ) -> Result<i32> {
        let mut w = Writer::with_capacity(64 + 28 * wanted.len());
        w.i32(-1); // replica id: a consumer
        w.i32(limits.max_wait_ms);
        w.i32(1); // min bytes
        w.i32(limits.max_bytes);
        w.i8(0); // read_uncommitted: markers and aborted records pass as the log holds them
        w.i32(0); // no fetch session
        w.i32(-1);
        w.i32(1);
        w.string(topic);
        w.len(wanted.len())?;
        for &(partition, offset) in wanted {
            w.i32(partition);
            w.i32(-1); // current leader epoch: unchecked
            w.i64(offset);
            w.i64(-1); // log start offset: a consumer's
            w.i32(limits.partition_max_bytes);
        }
        w.i32(0); // forgotten topics
        w.string(""); // rack
        self.send(API_FETCH, FETCH_VERSION, &w.0)
    }

    pub fn send_produce(&mut self, topic: &str, batches: &[(i32, Vec<u8>)]) -> Result<i32> {
        let bytes: usize = batches.iter().map(|(_, b)| b.len() + 8).sum();
        let mut w = Writer::with_capacity(64 + bytes);
        w.i16(-1); // no transactional id
        w.i16(-1); // acks=all, as the product's producer
        w.i32(30_000);
        w.i32(1);
        w.string(topic);
        w.len(batches.len())?;
        for (partition, batch) in batches {
            w.i32(*partition);
            w.len(batch.len())?;
            w.0.extend_from_slice(batch);
        }
        self.send(API_PRODUCE, PRODUCE_VERSION, &w.0)
    }
}

#[derive(Clone, Copy)]
pub struct FetchLimits {
    pub max_wait_ms: i32,
    pub max_bytes: i32,
    pub partition_max_bytes: i32,
}

/// One partition of a fetch answer.
pub struct FetchedPartition<'a> {
    pub partition: i32,
    pub records: &'a [u8],
}

/// The partitions of a Fetch v11 answer; any error code fails the copy (a spike, not a
/// client: no leader changes, no retries).
pub fn fetched(answer: &[u8]) -> Result<Vec<FetchedPartition<'_>>> {
    let mut r = Reader::new(answer);
    r.i32()?; // throttle
    let error = r.i16()?;
    if error != 0 {
        bail!("fetch error {error}");
    }
    r.i32()?; // session
    let mut out = Vec::new();
    for _ in 0..r.len()? {
        r.string()?;
        for _ in 0..r.len()? {
            let partition = r.i32()?;
            let error = r.i16()?;
            if error != 0 {
                bail!("fetch error {error} on partition {partition}");
            }
            r.i64()?; // high watermark
            r.i64()?; // last stable offset
            r.i64()?; // log start offset
            let aborted = r.i32()?;
            for _ in 0..aborted.max(0) {
                r.i64()?;
                r.i64()?;
            }
            r.i32()?; // preferred read replica
            let records = r.bytes()?.unwrap_or(&[]);
            out.push(FetchedPartition { partition, records });
        }
    }
    Ok(out)
}

/// Checks a Produce v8 answer: every partition without an error.
pub fn produced(answer: &[u8]) -> Result<()> {
    let mut r = Reader::new(answer);
    for _ in 0..r.len()? {
        r.string()?;
        for _ in 0..r.len()? {
            let partition = r.i32()?;
            let error = r.i16()?;
            r.i64()?; // base offset
            r.i64()?; // log append time
            r.i64()?; // log start offset
            let mut why = String::new();
            for _ in 0..r.len()? {
                r.i32()?;
                if let Some(m) = r.nullable_string()? {
                    why = m.to_owned();
                }
            }
            let message = r.nullable_string()?;
            if error != 0 {
                bail!(
                    "produce error {error} on partition {partition}: {} {why}",
                    message.unwrap_or("")
                );
            }
        }
    }
    Ok(())
}

struct Writer(Vec<u8>);

impl Writer {
    fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }
    fn i8(&mut self, v: i8) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i16(&mut self, v: i16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn len(&mut self, n: usize) -> Result<()> {
        self.i32(i32::try_from(n).context("array or bytes over 2 GiB")?);
        Ok(())
    }
    fn string(&mut self, s: &str) {
        // Topic names and the client id: far below i16::MAX.
        self.i16(s.len() as i16);
        self.0.extend_from_slice(s.as_bytes());
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            bail!(
                "answer cut short: {n} bytes wanted at {} of {}",
                self.at,
                self.buf.len()
            );
        };
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn i16(&mut self) -> Result<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self) -> Result<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self) -> Result<i64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }
    /// An array length; a null array (-1) counts as empty.
    fn len(&mut self) -> Result<usize> {
        Ok(usize::try_from(self.i32()?).unwrap_or(0))
    }
    fn string(&mut self) -> Result<&'a str> {
        Ok(self.nullable_string()?.unwrap_or(""))
    }
    fn nullable_string(&mut self) -> Result<Option<&'a str>> {
        let Ok(n) = usize::try_from(self.i16()?) else {
            return Ok(None);
        };
        Ok(Some(std::str::from_utf8(self.take(n)?)?))
    }
    fn bytes(&mut self) -> Result<Option<&'a [u8]>> {
        let Ok(n) = usize::try_from(self.i32()?) else {
            return Ok(None);
        };
        Ok(Some(self.take(n)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_answer_is_read_partition_by_partition() {
        let mut w = Writer::with_capacity(128);
        w.i32(0);
        w.i16(0);
        w.i32(0);
        w.i32(1);
        w.string("t");
        w.i32(2);
        for (p, records) in [(0, &b"abc"[..]), (1, &b""[..])] {
            w.i32(p);
            w.i16(0);
            w.i64(10);
            w.i64(10);
            w.i64(0);
            w.i32(1);
            w.i64(5);
            w.i64(3);
            w.i32(-1);
            w.i32(records.len() as i32);
            w.0.extend_from_slice(records);
        }
        let parts = fetched(&w.0).expect("well-formed answer");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].records, b"abc");
        assert_eq!(parts[1].partition, 1);
        assert!(
            fetched(&w.0[..w.0.len() - 8]).is_err(),
            "a cut answer is an error"
        );
    }

    #[test]
    fn a_produce_error_is_reported() {
        let mut w = Writer::with_capacity(128);
        w.i32(1);
        w.string("t");
        w.i32(1);
        w.i32(3);
        w.i16(87); // INVALID_RECORD
        w.i64(-1);
        w.i64(-1);
        w.i64(0);
        w.i32(1);
        w.i32(0);
        w.string("bad crc");
        w.string("invalid");
        w.i32(0);
        let e = produced(&w.0).expect_err("an error code fails");
        assert!(
            e.to_string().contains("87") && e.to_string().contains("bad crc"),
            "{e}"
        );
    }
}
