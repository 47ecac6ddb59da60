//! One plaintext connection to a broker, speaking the requests of `mirrorflow_core::protocol`.

use std::io::{Read, Write};
use std::net::TcpStream;

use anyhow::{Context, Result, bail};
use mirrorflow_core::protocol::{self, API_FETCH, API_INIT_PRODUCER_ID, API_PRODUCE};

/// Largest answer read: a fetch's `max_bytes` plus its framing, with room to spare.
const MAX_FRAME: usize = 256 << 20;
pub const CLIENT_ID: &str = "mirrorflow-bench-passthrough";

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
        let id = conn.correlation();
        conn.send(&protocol::api_versions_request(id, CLIENT_ID)?)?;
        let answer = conn.recv(id)?;
        let (error, served) = protocol::decode_api_versions(&answer)?;
        if error.is_error() {
            bail!("{addr}: ApiVersions: {error}");
        }
        for (api, version) in [
            (API_FETCH, protocol::FETCH_VERSION),
            (API_PRODUCE, protocol::PRODUCE_VERSION),
            (API_INIT_PRODUCER_ID, protocol::INIT_PRODUCER_ID_VERSION),
        ] {
            if !served
                .iter()
                .any(|r| r.api == api && (r.min..=r.max).contains(&version))
            {
                bail!("{addr} does not serve api {api} version {version}");
            }
        }
        Ok(conn)
    }

    /// The correlation id of the next request.
    pub fn correlation(&mut self) -> i32 {
        let id = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        id
    }

    pub fn send(&mut self, frame: &[u8]) -> Result<()> {
        self.stream
            .write_all(frame)
            .with_context(|| format!("writing to {}", self.peer))
    }

    /// Reads the next answer's body, which must answer request `id` (answers come in order).
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
        let body_len = protocol::answer_body(&frame, id)
            .with_context(|| format!("{} answered out of turn", self.peer))?
            .len();
        frame.drain(..frame.len() - body_len);
        Ok(frame)
    }
}
