//! A realistic Fetch v11 answer: 100 partitions of one topic, 8 MiB of magic-2 record batches
//! (16 records of 1 KiB values each, uncompressed, CRC-32C computed), checked by the core's
//! own batch reader
//! (whole batches, CRC, records).

use mirrorflow_core::batch::{self, records};

pub const PARTITIONS: i32 = 100;
pub const TOTAL_BYTES: usize = 8 << 20;
const RECORDS_PER_BATCH: i32 = 16;
const VALUE_LEN: usize = 1024;

fn varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// One magic-2 batch at `base_offset`.
fn record_batch(base_offset: i64, seed: u8) -> Vec<u8> {
    let mut records = Vec::new();
    for i in 0..RECORDS_PER_BATCH {
        let mut r = vec![0u8]; // attributes
        varint(&mut r, i64::from(i)); // timestamp delta
        varint(&mut r, i64::from(i)); // offset delta
        varint(&mut r, -1); // null key
        varint(&mut r, VALUE_LEN as i64);
        r.extend((0..VALUE_LEN).map(|j| (j as u8).wrapping_mul(31).wrapping_add(seed)));
        varint(&mut r, 0); // headers
        varint(&mut records, r.len() as i64);
        records.extend_from_slice(&r);
    }
    let mut after_crc = Vec::with_capacity(records.len() + 40);
    after_crc.extend_from_slice(&0i16.to_be_bytes()); // attributes: no codec, create time
    after_crc.extend_from_slice(&(RECORDS_PER_BATCH - 1).to_be_bytes());
    after_crc.extend_from_slice(&1_765_000_000_000i64.to_be_bytes());
    after_crc.extend_from_slice(&1_765_000_000_015i64.to_be_bytes());
    after_crc.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    after_crc.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    after_crc.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    after_crc.extend_from_slice(&RECORDS_PER_BATCH.to_be_bytes());
    after_crc.extend_from_slice(&records);
    let mut out = Vec::with_capacity(after_crc.len() + 21);
    out.extend_from_slice(&base_offset.to_be_bytes());
    out.extend_from_slice(&((after_crc.len() + 9) as i32).to_be_bytes());
    out.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
    out.push(2); // magic
    out.extend_from_slice(&crc32c::crc32c(&after_crc).to_be_bytes());
    out.extend_from_slice(&after_crc);
    out
}

/// Each partition's record batches, as many whole ones as fit in `TOTAL_BYTES / PARTITIONS`.
pub fn partitions() -> Vec<(i32, Vec<u8>)> {
    let per = TOTAL_BYTES / PARTITIONS as usize;
    (0..PARTITIONS)
        .map(|p| {
            let mut bytes = Vec::with_capacity(per + 20_000);
            let mut offset = 0i64;
            loop {
                let batch = record_batch(offset, p as u8);
                if bytes.len() + batch.len() > per {
                    break;
                }
                bytes.extend_from_slice(&batch);
                offset += i64::from(RECORDS_PER_BATCH);
            }
            (p, bytes)
        })
        .collect()
}

/// The Fetch v11 answer body (after the correlation id) carrying `parts`.
pub fn fetch_answer(parts: &[(i32, Vec<u8>)]) -> Vec<u8> {
    let total: usize = parts.iter().map(|(_, b)| b.len() + 64).sum();
    let mut w = Vec::with_capacity(total + 64);
    w.extend_from_slice(&0i32.to_be_bytes()); // throttle
    w.extend_from_slice(&0i16.to_be_bytes()); // error
    w.extend_from_slice(&0i32.to_be_bytes()); // session id
    w.extend_from_slice(&1i32.to_be_bytes()); // topics
    w.extend_from_slice(&6i16.to_be_bytes());
    w.extend_from_slice(b"orders");
    w.extend_from_slice(&(parts.len() as i32).to_be_bytes());
    for (p, bytes) in parts {
        w.extend_from_slice(&p.to_be_bytes());
        w.extend_from_slice(&0i16.to_be_bytes());
        for v in [1_000_000i64, 1_000_000, 0] {
            w.extend_from_slice(&v.to_be_bytes()); // high watermark, LSO, log start
        }
        w.extend_from_slice(&0i32.to_be_bytes()); // no aborted transactions
        w.extend_from_slice(&(-1i32).to_be_bytes()); // preferred read replica
        w.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
        w.extend_from_slice(bytes);
    }
    w
}

/// Every partition's bytes read back by the core as whole batches with a right CRC and all
/// their records: the fixture is what a broker sends. The number of batches.
pub fn check(parts: &[(i32, Vec<u8>)]) -> Result<usize, String> {
    let mut count = 0;
    for (p, bytes) in parts {
        for b in batch::batches(bytes) {
            let b = b.map_err(|e| format!("partition {p}: {e}"))?;
            b.header
                .whole()
                .map_err(|e| format!("partition {p}: {e:?}"))?;
            let opened = records::open(&b, 1 << 20).map_err(|e| format!("partition {p}: {e}"))?;
            let mut read = 0;
            for r in opened.records() {
                r.map_err(|e| format!("partition {p}: {e}"))?;
                read += 1;
            }
            if read != RECORDS_PER_BATCH {
                return Err(format!("partition {p}: {read} records in a batch"));
            }
            count += 1;
        }
    }
    Ok(count)
}
