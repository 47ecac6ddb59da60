//! A partition's record batches as a `read_committed` reader gets them, read with the project's
//! own connection: what the batch tests check batch by batch (codecs, producers, markers).

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use mirrorflow_conn::Conn;
use mirrorflow_core::batch::{self, Admission, Committed};
use mirrorflow_core::protocol::{self, FetchPartition, FetchRequest};

/// Every batch of `topic`'s `partition` on `conn`'s broker (its leader) from offset 0 to the
/// last stable offset, waiting up to 30 s for it to be past 0, with what a `read_committed`
/// reader makes of each: (admission, the batch's bytes), in offset order.
pub fn committed_batches(
    conn: &mut Conn,
    topic: &str,
    partition: i32,
) -> Result<Vec<(Admission, Vec<u8>)>> {
    let mut read = Vec::new();
    let mut offset = 0i64;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        ensure!(
            Instant::now() < deadline,
            "fetching {topic}-{partition} stalled at {offset}"
        );
        let id = conn.correlation();
        let wanted = FetchPartition {
            partition,
            offset,
            max_bytes: 1 << 20,
        };
        let request = FetchRequest::committed(topic, vec![wanted], 1 << 20);
        let body = conn.call(
            id,
            &protocol::fetch_request(id, conn.client_id(), &request)?,
        )?;
        let answer = protocol::decode_fetch(&body)?;
        let Some(part) = answer.topics.first().and_then(|(_, p)| p.first()) else {
            bail!("the fetch answer has no partition");
        };
        ensure!(!part.error.is_error(), "fetch: {}", part.error);
        let mut committed = Committed::new(&part.aborted);
        for b in batch::batches(part.records) {
            let b = b?;
            if b.header.next_offset() <= offset {
                continue;
            }
            offset = b.header.next_offset();
            read.push((committed.admit(&b)?, b.bytes().to_vec()));
        }
        if offset >= part.last_stable_offset && part.last_stable_offset > 0 {
            return Ok(read);
        }
    }
}
