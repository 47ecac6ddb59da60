//! The records of a compressed batch, inflated with a hard cap on the bytes they inflate to.
//!
//! A batch of a few hundred KB on a broker's disk can inflate to hundreds of MiB (zeros compress
//! a thousandfold), and whoever may write a topic chooses its bytes. Every codec here is read as
//! a stream into a buffer that grows only as bytes come out, and the read stops as soon as one
//! byte more than the cap has come out: memory stays below twice the cap whatever the input
//! claims. A size the input declares (a snappy block's length, a zstd window) is checked
//! against the cap before anything of that size is allocated.
//!
//! Errors name only the class of the failure (the codec and what was wrong), never bytes of the
//! input, so they can go into a status that others read.

use std::borrow::Cow;
use std::io::Read;

use thiserror::Error;

use super::Codec;

/// Why a batch's records could not be inflated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InflateError {
    #[error("{codec} records inflate to more than {limit} bytes")]
    TooLarge { codec: &'static str, limit: usize },
    #[error("{codec} records are corrupt: {what}")]
    Corrupt {
        codec: &'static str,
        what: &'static str,
    },
    /// Only from [`inflate_into`], whose sink may run out of memory.
    #[error("{codec} records: no memory to inflate them into")]
    NoMemory { codec: &'static str },
}

/// Bytes read from a decoder at a time: what the output grows by at most beyond the cap.
const CHUNK: usize = 16 * 1024;

/// xerial snappy-java's stream header (magic, then version and compatible version, int32
/// each), which Kafka's Java clients write before length-prefixed raw snappy blocks.
pub(super) const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
pub(super) const XERIAL_HEADER_LEN: usize = 16;

/// zstd's frame magic (little-endian 0xFD2FB528).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// The largest zstd window accepted whatever the cap: a decoder keeps a window of this size,
/// so a frame may not ask for more. Kafka's producers use windows of a few MiB at most.
const ZSTD_MAX_WINDOW: u64 = 8 << 20;

/// `compressed` (a batch's records as written, after its header) inflated with `codec`, at most
/// `limit` bytes. Uncompressed records are returned as they are, also at most `limit` bytes.
pub fn inflate(
    codec: Codec,
    compressed: &[u8],
    limit: usize,
) -> Result<Cow<'_, [u8]>, InflateError> {
    if codec == Codec::None {
        if compressed.len() > limit {
            return Err(too_large(codec.name(), limit));
        }
        return Ok(Cow::Borrowed(compressed));
    }
    let mut out = Vec::new();
    inflate_into(codec, compressed, limit, &mut |bytes| {
        out.extend_from_slice(bytes);
        true
    })?;
    Ok(Cow::Owned(out))
}

/// `compressed` inflated with `codec`, handed to `sink` a part at a time as it comes out, and
/// refused once more than `limit` bytes came out: for a reader that keeps the records in
/// memory of its own (the binary's inflaters for librdkafka grow one `malloc`ed block). `sink`
/// answers false when it cannot take a part (no memory). Returns the bytes inflated.
pub fn inflate_into(
    codec: Codec,
    compressed: &[u8],
    limit: usize,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<usize, InflateError> {
    let name = codec.name();
    match codec {
        Codec::None if compressed.len() > limit => Err(too_large(name, limit)),
        Codec::None if !sink(compressed) => Err(InflateError::NoMemory { codec: name }),
        Codec::None => Ok(compressed.len()),
        Codec::Gzip => stream_capped(
            flate2::read::MultiGzDecoder::new(compressed),
            name,
            limit,
            sink,
        ),
        Codec::Snappy => match compressed.strip_prefix(&XERIAL_MAGIC) {
            Some(_) => {
                let blocks = compressed
                    .get(XERIAL_HEADER_LEN..)
                    .ok_or(corrupt("snappy", "the xerial header is cut short"))?;
                xerial_blocks_into(blocks, limit, sink)
            }
            None => snappy_block(compressed, limit, sink),
        },
        Codec::Lz4 => stream_capped(
            lz4_flex::frame::FrameDecoder::new(compressed),
            name,
            limit,
            sink,
        ),
        Codec::Zstd => zstd(compressed, limit, sink),
    }
}

/// xerial snappy-java's length-prefixed raw snappy blocks, after the stream's header (which
/// librdkafka takes off before it asks for them), into `sink` ([`inflate_into`]).
pub fn xerial_blocks_into(
    mut blocks: &[u8],
    limit: usize,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<usize, InflateError> {
    let mut total = 0usize;
    while let Some((len, rest)) = blocks.split_first_chunk::<4>() {
        let len = usize::try_from(u32::from_be_bytes(*len)).unwrap_or(usize::MAX);
        let (block, rest) = rest
            .split_at_checked(len)
            .ok_or(corrupt("snappy", "a xerial block is cut short"))?;
        let n = snappy_block(block, limit.saturating_sub(total), sink)
            .map_err(|e| at_limit(e, "snappy", limit))?;
        total = total.saturating_add(n);
        blocks = rest;
    }
    if !blocks.is_empty() {
        return Err(corrupt("snappy", "a xerial block length is cut short"));
    }
    Ok(total)
}

fn too_large(codec: &'static str, limit: usize) -> InflateError {
    InflateError::TooLarge { codec, limit }
}

/// A part's refusal against what was left of the limit, named with the whole limit.
fn at_limit(e: InflateError, codec: &'static str, limit: usize) -> InflateError {
    match e {
        InflateError::TooLarge { .. } => too_large(codec, limit),
        other => other,
    }
}

fn corrupt(codec: &'static str, what: &'static str) -> InflateError {
    InflateError::Corrupt { codec, what }
}

fn stream_capped(
    mut reader: impl Read,
    codec: &'static str,
    limit: usize,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<usize, InflateError> {
    let mut chunk = vec![0u8; CHUNK];
    let mut total = 0usize;
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(corrupt(codec, "the compressed stream does not decode")),
        };
        if total.saturating_add(n) > limit {
            return Err(too_large(codec, limit));
        }
        if !sink(&chunk[..n]) {
            return Err(InflateError::NoMemory { codec });
        }
        total += n;
    }
}

/// The length a raw snappy block declares it inflates to (the block is not read further).
pub fn snappy_block_len(block: &[u8]) -> Result<usize, InflateError> {
    snap::raw::decompress_len(block)
        .map_err(|_| corrupt("snappy", "a block's length does not decode"))
}

/// One raw snappy block into `sink`; its declared length is checked before it is allocated.
fn snappy_block(
    block: &[u8],
    limit: usize,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<usize, InflateError> {
    let len = snappy_block_len(block)?;
    if len > limit {
        return Err(too_large("snappy", limit));
    }
    let mut out = vec![0u8; len];
    let written = snap::raw::Decoder::new()
        .decompress(block, &mut out)
        .map_err(|_| corrupt("snappy", "a block does not decode"))?;
    if !sink(&out[..written]) {
        return Err(InflateError::NoMemory { codec: "snappy" });
    }
    Ok(written)
}

/// zstd frames one after another; each frame's window is checked before a decoder keeps one.
fn zstd(
    compressed: &[u8],
    limit: usize,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<usize, InflateError> {
    let mut total = 0usize;
    let mut rest = compressed;
    while !rest.is_empty() {
        let window = zstd_window(rest)?;
        if window > ZSTD_MAX_WINDOW.max(u64::try_from(limit).unwrap_or(u64::MAX)) {
            return Err(too_large("zstd", limit));
        }
        let frame = ruzstd::decoding::StreamingDecoder::new_with_max_window_size(&mut rest, window)
            .map_err(|_| corrupt("zstd", "a frame header does not decode"))?;
        let n = stream_capped(frame, "zstd", limit.saturating_sub(total), sink)
            .map_err(|e| at_limit(e, "zstd", limit))?;
        total = total.saturating_add(n);
    }
    Ok(total)
}

/// The window size a zstd frame header asks for (RFC 8878 3.1.1.1): from the window
/// descriptor, or the frame content size for a single-segment frame.
fn zstd_window(frame: &[u8]) -> Result<u64, InflateError> {
    let bad = corrupt("zstd", "a frame header does not decode");
    let rest = frame.strip_prefix(&ZSTD_MAGIC).ok_or(bad.clone())?;
    let (&descriptor, rest) = rest.split_first().ok_or(bad.clone())?;
    let single_segment = descriptor & 0x20 != 0;
    if !single_segment {
        let &window = rest.first().ok_or(bad)?;
        let log = 10 + u32::from(window >> 3);
        let base = 1u64 << log;
        return Ok(base + (base / 8) * u64::from(window & 0x07));
    }
    let dict_id_len = [0usize, 1, 2, 4][usize::from(descriptor & 0x03)];
    let size_len = [1usize, 2, 4, 8][usize::from(descriptor >> 6)];
    let size = rest.get(dict_id_len..dict_id_len + size_len).ok_or(bad)?;
    let mut le = [0u8; 8];
    le[..size_len].copy_from_slice(size);
    let size = u64::from_le_bytes(le);
    // A two-byte size counts from 256.
    Ok(if size_len == 2 { size + 256 } else { size })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("in memory");
        e.finish().expect("in memory")
    }

    fn lz4(data: &[u8]) -> Vec<u8> {
        let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
        e.write_all(data).expect("in memory");
        e.finish().expect("in memory")
    }

    fn snappy_raw(data: &[u8]) -> Vec<u8> {
        snap::raw::Encoder::new()
            .compress_vec(data)
            .expect("in memory")
    }

    fn snappy_xerial(blocks: &[&[u8]]) -> Vec<u8> {
        let mut out = XERIAL_MAGIC.to_vec();
        out.extend_from_slice(&1i32.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes());
        for b in blocks {
            let c = snappy_raw(b);
            out.extend_from_slice(&u32::try_from(c.len()).expect("small").to_be_bytes());
            out.extend_from_slice(&c);
        }
        out
    }

    fn zstd_frame(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    fn sample() -> Vec<u8> {
        (0..50_000u32)
            .flat_map(|i| (i % 251).to_be_bytes())
            .collect()
    }

    #[test]
    fn every_codec_inflates_what_it_compressed() {
        let data = sample();
        let limit = data.len();
        for (codec, compressed) in [
            (Codec::Gzip, gzip(&data)),
            (Codec::Lz4, lz4(&data)),
            (Codec::Snappy, snappy_raw(&data)),
            (
                Codec::Snappy,
                snappy_xerial(&[&data[..1000], &data[1000..]]),
            ),
            (Codec::Zstd, zstd_frame(&data)),
            (Codec::None, data.clone()),
        ] {
            let out = inflate(codec, &compressed, limit)
                .unwrap_or_else(|e| panic!("{}: {e}", codec.name()));
            assert_eq!(out.as_ref(), data.as_slice(), "{}", codec.name());
        }
    }

    #[test]
    fn one_byte_over_the_cap_is_refused_by_every_codec() {
        let data = sample();
        let limit = data.len() - 1;
        for (codec, compressed) in [
            (Codec::Gzip, gzip(&data)),
            (Codec::Lz4, lz4(&data)),
            (Codec::Snappy, snappy_raw(&data)),
            (
                Codec::Snappy,
                snappy_xerial(&[&data[..limit], &data[limit..]]),
            ),
            (Codec::Zstd, zstd_frame(&data)),
            (Codec::None, data.clone()),
        ] {
            assert_eq!(
                inflate(codec, &compressed, limit),
                Err(InflateError::TooLarge {
                    codec: codec.name(),
                    limit
                }),
                "{}",
                codec.name()
            );
        }
    }

    #[test]
    fn damaged_streams_are_corrupt_not_a_panic() {
        let data = sample();
        for (codec, mut compressed) in [
            (Codec::Gzip, gzip(&data)),
            (Codec::Lz4, lz4(&data)),
            (Codec::Snappy, snappy_raw(&data)),
            (Codec::Snappy, snappy_xerial(&[&data])),
            (Codec::Zstd, zstd_frame(&data)),
        ] {
            compressed.truncate(compressed.len() / 2);
            let err = inflate(codec, &compressed, data.len()).expect_err(codec.name());
            assert!(
                matches!(err, InflateError::Corrupt { codec: c, .. } if c == codec.name()),
                "{}: {err}",
                codec.name()
            );
        }
    }

    #[test]
    fn a_snappy_block_declaring_more_than_the_cap_is_refused_before_allocation() {
        // A raw block whose varint length says 4 GiB - 1 and that holds nothing.
        let block = [0xff, 0xff, 0xff, 0xff, 0x0f];
        assert_eq!(
            inflate(Codec::Snappy, &block, 1 << 20),
            Err(InflateError::TooLarge {
                codec: "snappy",
                limit: 1 << 20
            })
        );
    }

    #[test]
    fn a_zstd_frame_asking_for_a_huge_window_is_refused_before_a_decoder_keeps_one() {
        // Magic, descriptor without single segment, window descriptor exponent 31 (2 TiB).
        let frame = [0x28, 0xb5, 0x2f, 0xfd, 0x00, 31 << 3, 0, 0, 0];
        assert_eq!(
            inflate(Codec::Zstd, &frame, 1 << 20),
            Err(InflateError::TooLarge {
                codec: "zstd",
                limit: 1 << 20
            })
        );
    }

    #[test]
    fn the_zstd_window_is_read_from_either_header_form() {
        assert_eq!(zstd_window(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x00]), Ok(1024));
        assert_eq!(
            zstd_window(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x09]),
            Ok(2048 + 256)
        );
        // Single segment, two-byte content size 0x0100 + 256.
        assert_eq!(
            zstd_window(&[0x28, 0xb5, 0x2f, 0xfd, 0x60, 0x00, 0x01]),
            Ok(512)
        );
        assert!(zstd_window(&[0x28, 0xb5, 0x2f]).is_err());
    }
}
