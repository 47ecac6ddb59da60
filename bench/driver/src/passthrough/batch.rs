//! Record batches (magic 2) taken from a fetch answer and made fit to be produced again as
//! they are: the compressed records untouched, only the header fields a produce request must
//! not carry from another producer or another log rewritten, and the CRC computed anew.

use anyhow::{Result, bail};

/// Bytes of a magic-2 batch header up to and including its record count.
const HEADER_LEN: usize = 61;
/// Offset of the CRC field; the CRC covers everything after it (from the attributes on).
const CRC_AT: usize = 17;
const CRC_COVERS_FROM: usize = 21;
const ATTRIBUTES_AT: usize = 21;
const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;

/// What one partition's fetched bytes give: the batches to produce, and the offset to fetch
/// next (past every complete batch, control batches included).
#[derive(Debug, Default, PartialEq)]
pub struct Passable {
    pub batches: Vec<Vec<u8>>,
    pub next_offset: Option<i64>,
    pub records: u64,
}

/// Splits `records` (a fetch answer's partition bytes) into complete batches; a trailing
/// partial batch (the broker cuts at `max_bytes`) is left for the next fetch. Control batches
/// (transaction markers) are skipped: the target's own producer state makes its markers.
/// Batches before `fetch_offset` (the broker answers from the start of the batch holding
/// it) are skipped too.
pub fn passable(records: &[u8], fetch_offset: i64) -> Result<Passable> {
    let mut out = Passable::default();
    let mut at = 0usize;
    while records.len().saturating_sub(at) >= HEADER_LEN {
        let header = &records[at..at + HEADER_LEN];
        let base_offset = be_i64(&header[0..8]);
        let batch_len = be_i32(&header[8..12]);
        let magic = header[16] as i8;
        if magic != 2 {
            bail!("a batch at offset {base_offset} has magic {magic}; only magic 2 passes");
        }
        let Ok(batch_len) = usize::try_from(batch_len) else {
            bail!("a batch at offset {base_offset} has length {batch_len}");
        };
        let total = batch_len.saturating_add(12);
        if total < HEADER_LEN {
            bail!("a batch at offset {base_offset} is shorter than its header ({total} bytes)");
        }
        if records.len() - at < total {
            break;
        }
        let attributes = be_i16(&header[ATTRIBUTES_AT..ATTRIBUTES_AT + 2]);
        let last_delta = be_i32(&header[23..27]);
        let count = be_i32(&header[57..61]);
        let next = base_offset
            .saturating_add(i64::from(last_delta))
            .saturating_add(1);
        if next > fetch_offset && attributes & CONTROL == 0 {
            let mut batch = records[at..at + total].to_vec();
            clear_producer(&mut batch, attributes);
            out.batches.push(batch);
            out.records = out
                .records
                .saturating_add(u64::try_from(count).unwrap_or(0));
        }
        out.next_offset = Some(next.max(out.next_offset.unwrap_or(i64::MIN)));
        at += total;
    }
    Ok(out)
}

/// The copy is written by a producer without an id: no producer id, epoch or sequence of the
/// source's producer (the target would take them for its own producer's), not transactional,
/// base offset and leader epoch for the target broker to set.
fn clear_producer(batch: &mut [u8], attributes: i16) {
    batch[0..8].copy_from_slice(&0i64.to_be_bytes());
    batch[12..16].copy_from_slice(&(-1i32).to_be_bytes());
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2]
        .copy_from_slice(&(attributes & !TRANSACTIONAL).to_be_bytes());
    batch[43..51].copy_from_slice(&(-1i64).to_be_bytes());
    batch[51..53].copy_from_slice(&(-1i16).to_be_bytes());
    batch[53..57].copy_from_slice(&(-1i32).to_be_bytes());
    let crc = crc32c(&batch[CRC_COVERS_FROM..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

fn be_i16(b: &[u8]) -> i16 {
    i16::from_be_bytes([b[0], b[1]])
}

fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_i64(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    i64::from_be_bytes(a)
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), slicing by 8: eight table
/// look-ups per 8 bytes instead of one per byte (no unsafe code for the CPU's instruction).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        crc = TABLES[7][(lo & 0xff) as usize]
            ^ TABLES[6][((lo >> 8) & 0xff) as usize]
            ^ TABLES[5][((lo >> 16) & 0xff) as usize]
            ^ TABLES[4][(lo >> 24) as usize]
            ^ TABLES[3][c[4] as usize]
            ^ TABLES[2][c[5] as usize]
            ^ TABLES[1][c[6] as usize]
            ^ TABLES[0][c[7] as usize];
    }
    for &b in chunks.remainder() {
        crc = TABLES[0][((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

static TABLES: [[u32; 256]; 8] = tables();

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut k = 0;
        while k < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
            k += 1;
        }
        t[0][i] = crc;
        i += 1;
    }
    let mut s = 1;
    while s < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 (iSCSI) B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }

    /// A magic-2 batch header followed by `body`, as a transactional producer wrote it.
    fn batch(base: i64, last_delta: i32, count: i32, attributes: i16, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&base.to_be_bytes());
        b.extend_from_slice(&((HEADER_LEN - 12 + body.len()) as i32).to_be_bytes());
        b.extend_from_slice(&7i32.to_be_bytes()); // leader epoch
        b.push(2);
        b.extend_from_slice(&0u32.to_be_bytes()); // crc, not checked here
        b.extend_from_slice(&attributes.to_be_bytes());
        b.extend_from_slice(&last_delta.to_be_bytes());
        b.extend_from_slice(&1_000i64.to_be_bytes());
        b.extend_from_slice(&2_000i64.to_be_bytes());
        b.extend_from_slice(&42i64.to_be_bytes()); // producer id
        b.extend_from_slice(&3i16.to_be_bytes()); // epoch
        b.extend_from_slice(&9i32.to_be_bytes()); // base sequence
        b.extend_from_slice(&count.to_be_bytes());
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn batches_pass_with_the_producer_cleared_and_a_valid_crc() {
        let lz4_txn = TRANSACTIONAL | 3;
        let mut fetched = batch(10, 4, 5, lz4_txn, b"compressed-bytes");
        fetched.extend(batch(15, 0, 1, CONTROL | TRANSACTIONAL, b"marker"));
        fetched.extend(batch(16, 1, 2, 3, b"more"));
        fetched.extend(&batch(18, 0, 1, 3, b"cut")[..20]);
        let p = passable(&fetched, 12).expect("well-formed batches");
        assert_eq!(p.batches.len(), 2, "the control batch is skipped");
        assert_eq!(p.records, 7);
        assert_eq!(
            p.next_offset,
            Some(18),
            "the partial batch is fetched again"
        );
        let first = &p.batches[0];
        assert_eq!(be_i64(&first[0..8]), 0);
        assert_eq!(be_i32(&first[12..16]), -1);
        assert_eq!(
            be_i16(&first[21..23]),
            3,
            "codec kept, transactional bit cleared"
        );
        assert_eq!(be_i64(&first[43..51]), -1);
        assert_eq!(be_i16(&first[51..53]), -1);
        assert_eq!(be_i32(&first[53..57]), -1);
        assert_eq!(&first[HEADER_LEN..], b"compressed-bytes");
        let crc = u32::from_be_bytes([first[17], first[18], first[19], first[20]]);
        assert_eq!(crc, crc32c(&first[21..]));
    }

    #[test]
    fn a_batch_before_the_fetch_offset_is_not_copied_twice() {
        let fetched = batch(0, 9, 10, 3, b"x");
        let p = passable(&fetched, 10).expect("well-formed batch");
        assert!(p.batches.is_empty());
        assert_eq!(p.next_offset, Some(10));
    }

    #[test]
    fn bad_batches_are_refused_not_copied() {
        let mut old = batch(0, 0, 1, 0, b"x");
        old[16] = 1;
        assert!(passable(&old, 0).is_err());
        let mut short = batch(0, 0, 1, 0, b"x");
        short[8..12].copy_from_slice(&10i32.to_be_bytes());
        assert!(passable(&short, 0).is_err());
        let mut negative = batch(0, 0, 1, 0, b"x");
        negative[8..12].copy_from_slice(&(-5i32).to_be_bytes());
        assert!(passable(&negative, 0).is_err());
    }
}
