//! librdkafka's lz4, zstd and snappy inflaters, replaced by `--wrap` (see the module above):
//! each `__wrap_<symbol>` takes librdkafka's call with its arguments and keeps its contract.
//! The originals are never called.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;

use mirrorflow_core::batch::inflate::{InflateError, snappy_block_len, xerial_blocks_into};
use rdkafka::types::RDKafkaRespErr;

use super::native::{lz4_into, zstd_into};
use super::{INFLATE_LIMIT, into_block, note_refused};

/// A streaming decoder: input, limit, sink; the bytes inflated.
type Decoder = fn(&[u8], usize, &mut dyn FnMut(&[u8]) -> bool) -> Result<usize, InflateError>;

/// `len` bytes at `ptr`, or `None` for a null pointer.
///
/// # Safety
/// `ptr` is null or points to `len` readable bytes that outlive the slice.
unsafe fn input<'a>(ptr: *const c_char, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// A block inflated by `decode` put where librdkafka's lz4 and zstd inflaters put theirs.
///
/// # Safety
/// `inbuf` points to `inlen` readable bytes; `outbuf` and `outlenp` are writable.
unsafe fn into_out(
    decode: Decoder,
    inbuf: *const c_char,
    inlen: usize,
    outbuf: *mut *mut c_void,
    outlenp: *mut usize,
) -> RDKafkaRespErr {
    if outbuf.is_null() || outlenp.is_null() {
        return RDKafkaRespErr::RD_KAFKA_RESP_ERR__BAD_COMPRESSION;
    }
    // SAFETY: the caller's contract: a writable pointer.
    unsafe { *outbuf = null_mut() };
    // SAFETY: the caller's contract.
    let Some(input) = (unsafe { input(inbuf, inlen) }) else {
        return RDKafkaRespErr::RD_KAFKA_RESP_ERR__BAD_COMPRESSION;
    };
    match into_block(input, |input, sink| decode(input, INFLATE_LIMIT, sink)) {
        Some((block, n)) => {
            // SAFETY: the caller's contract: writable pointers.
            unsafe {
                *outbuf = block;
                *outlenp = n;
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
        }
        None => RDKafkaRespErr::RD_KAFKA_RESP_ERR__BAD_COMPRESSION,
    }
}

/// librdkafka's lz4 inflater (rdkafka_lz4.c), for an LZ4 frame. `proper_hc` is 0 only for
/// message format 0 (Kafka before 0.10), whose frames carry a wrong header checksum that
/// librdkafka patches in place; such batches are refused (no broker of the supported versions
/// writes them).
///
/// # Safety
/// As librdkafka calls it: `inbuf` points to `inlen` readable bytes; `outbuf` and `outlenp`
/// are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __wrap_rd_kafka_lz4_decompress(
    _rkb: *mut c_void,
    proper_hc: c_int,
    _offset: i64,
    inbuf: *mut c_char,
    inlen: usize,
    outbuf: *mut *mut c_void,
    outlenp: *mut usize,
) -> RDKafkaRespErr {
    if proper_hc == 0 {
        if !outbuf.is_null() {
            // SAFETY: the caller's contract: a writable pointer.
            unsafe { *outbuf = null_mut() };
        }
        let legacy = InflateError::Corrupt {
            codec: "lz4",
            what: "message format 0 (Kafka before 0.10) is not read",
        };
        note_refused(Some(legacy), None);
        return RDKafkaRespErr::RD_KAFKA_RESP_ERR__BAD_COMPRESSION;
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { into_out(lz4_into, inbuf, inlen, outbuf, outlenp) }
}

/// librdkafka's zstd inflater (rdkafka_zstd.c): one or more zstd frames.
///
/// # Safety
/// As librdkafka calls it: `inbuf` points to `inlen` readable bytes; `outbuf` and `outlenp`
/// are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __wrap_rd_kafka_zstd_decompress(
    _rkb: *mut c_void,
    inbuf: *mut c_char,
    inlen: usize,
    outbuf: *mut *mut c_void,
    outlenp: *mut usize,
) -> RDKafkaRespErr {
    // SAFETY: the caller's contract, passed on.
    unsafe { into_out(zstd_into, inbuf, inlen, outbuf, outlenp) }
}

/// librdkafka's snappy-java inflater (snappy.c): the length-prefixed blocks after the xerial
/// header, which librdkafka takes off. A `malloc`ed block, or NULL with the reason in
/// `errstr` (as librdkafka's own, empty records are refused too).
///
/// # Safety
/// As librdkafka calls it: `inbuf` points to `inlen` readable bytes, `outlenp` is writable,
/// `errstr` points to `errstr_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __wrap_rd_kafka_snappy_java_uncompress(
    inbuf: *const c_char,
    inlen: usize,
    outlenp: *mut usize,
    errstr: *mut c_char,
    errstr_size: usize,
) -> *mut c_char {
    // SAFETY: the caller's contract.
    let Some(input) = (unsafe { input(inbuf, inlen) }) else {
        return null_mut();
    };
    if outlenp.is_null() {
        return null_mut();
    }
    let inflated = into_block(input, |input, sink| {
        match xerial_blocks_into(input, INFLATE_LIMIT, sink) {
            Ok(0) => Err(InflateError::Corrupt {
                codec: "snappy",
                what: "the xerial stream holds no records",
            }),
            other => other,
        }
    });
    match inflated {
        Some((block, n)) => {
            // SAFETY: the caller's contract: a writable pointer.
            unsafe { *outlenp = n };
            block.cast()
        }
        None => {
            let why = super::refused()
                .1
                .map_or_else(|| "refused".to_string(), |e| e.to_string());
            // SAFETY: the caller's contract: `errstr_size` writable bytes.
            unsafe { write_errstr(errstr, errstr_size, &why) };
            null_mut()
        }
    }
}

/// The length a raw snappy block declares, as librdkafka asks before it allocates that much
/// for one (a block without xerial framing); a length past the limit is refused, so the block
/// is reported as `_BAD_COMPRESSION` before anything is allocated.
///
/// # Safety
/// As librdkafka calls it: `start` points to `n` readable bytes, `result` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __wrap_rd_kafka_snappy_uncompressed_length(
    start: *const c_char,
    n: usize,
    result: *mut usize,
) -> bool {
    // SAFETY: the caller's contract.
    let Some(block) = (unsafe { input(start, n) }) else {
        return false;
    };
    if result.is_null() {
        return false;
    }
    match snappy_block_len(block) {
        Ok(len) if len <= INFLATE_LIMIT => {
            // SAFETY: the caller's contract: a writable pointer.
            unsafe { *result = len };
            true
        }
        Ok(_) => {
            let error = InflateError::TooLarge {
                codec: "snappy",
                limit: INFLATE_LIMIT,
            };
            note_refused(Some(error), None);
            false
        }
        Err(error) => {
            note_refused(Some(error), None);
            false
        }
    }
}

/// `text` into librdkafka's error buffer, cut to fit and NUL-terminated.
///
/// # Safety
/// `errstr` is null or points to `size` writable bytes.
unsafe fn write_errstr(errstr: *mut c_char, size: usize, text: &str) {
    if errstr.is_null() || size == 0 {
        return;
    }
    let n = text.len().min(size - 1);
    // SAFETY: the caller's contract: `size` writable bytes, of which `n + 1` are written.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), errstr.cast::<u8>(), n);
        *errstr.add(n) = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflater::refused;
    use mirrorflow_core::batch::Codec;
    use std::io::Write;

    const FRAMED: usize = super::super::FIRST_BLOCK;

    fn lz4(data: &[u8]) -> Vec<u8> {
        let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
        e.write_all(data).expect("in memory");
        e.finish().expect("in memory")
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    /// xerial blocks as librdkafka passes them: without the stream's header.
    fn xerial_blocks(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            let c = snap::raw::Encoder::new()
                .compress_vec(p)
                .expect("in memory");
            out.extend_from_slice(&u32::try_from(c.len()).expect("small").to_be_bytes());
            out.extend_from_slice(&c);
        }
        out
    }

    /// The block handed over, copied out and freed as librdkafka frees it.
    fn taken(block: *mut c_void, len: usize) -> Vec<u8> {
        // SAFETY: a block of `len` bytes handed over by the call, freed once here.
        let out = unsafe { std::slice::from_raw_parts(block.cast::<u8>(), len) }.to_vec();
        // SAFETY: as above.
        unsafe { libc::free(block) };
        out
    }

    /// lz4 (`proper_hc` as given) or zstd through the wrapped symbol, as librdkafka calls it.
    fn inflate(codec: Codec, proper_hc: c_int, input: &[u8]) -> Result<Vec<u8>, RDKafkaRespErr> {
        let mut input = input.to_vec();
        let (mut out, mut len) = (null_mut(), 0usize);
        let ptr = input.as_mut_ptr().cast::<c_char>();
        // SAFETY: a valid buffer and its length, writable out pointers.
        let err = unsafe {
            match codec {
                Codec::Lz4 => __wrap_rd_kafka_lz4_decompress(
                    null_mut(),
                    proper_hc,
                    0,
                    ptr,
                    input.len(),
                    &mut out,
                    &mut len,
                ),
                _ => __wrap_rd_kafka_zstd_decompress(
                    null_mut(),
                    ptr,
                    input.len(),
                    &mut out,
                    &mut len,
                ),
            }
        };
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            assert!(out.is_null(), "no block on an error");
            return Err(err);
        }
        Ok(taken(out, len))
    }

    fn sample() -> Vec<u8> {
        (0..(FRAMED as u32))
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn lz4_and_zstd_inflate_as_librdkafka_expects_and_a_bomb_is_refused() {
        let data = sample();
        let bad = Err(RDKafkaRespErr::RD_KAFKA_RESP_ERR__BAD_COMPRESSION);
        let bomb = vec![0u8; INFLATE_LIMIT + 1];
        for (codec, pack) in [
            (Codec::Lz4, lz4 as fn(&[u8]) -> Vec<u8>),
            (Codec::Zstd, zstd),
        ] {
            assert_eq!(
                inflate(codec, 1, &pack(&data)),
                Ok(data.clone()),
                "{codec:?}"
            );
            let (before, _) = refused();
            assert_eq!(inflate(codec, 1, &pack(&bomb)), bad, "{codec:?}");
            assert!(refused().0 > before, "{codec:?}: noted");
            assert_eq!(inflate(codec, 1, b"not compressed"), bad, "{codec:?}");
            let mut cut = pack(&data);
            cut.truncate(cut.len() / 2);
            assert_eq!(inflate(codec, 1, &cut), bad, "{codec:?}: cut short");
            // Frames one after another are all read (a batch holds one; libzstd takes more).
            let mut two = pack(b"first ");
            two.extend(pack(b"second"));
            assert_eq!(
                inflate(codec, 1, &two),
                Ok(b"first second".to_vec()),
                "{codec:?}"
            );
            let limit = vec![3u8; INFLATE_LIMIT];
            let full = inflate(codec, 1, &pack(&limit)).map(|v| v.len());
            assert_eq!(
                full,
                Ok(INFLATE_LIMIT),
                "{codec:?}: the limit itself is taken"
            );
        }
        // Message format 0's lz4 framing is refused, however small.
        assert_eq!(inflate(Codec::Lz4, 0, &lz4(b"old")), bad);
    }

    fn java(input: &[u8]) -> Result<Vec<u8>, String> {
        let mut len = 0usize;
        let mut errstr = [0 as c_char; 128];
        // SAFETY: a valid buffer and its length, a writable length and error buffer.
        let block = unsafe {
            __wrap_rd_kafka_snappy_java_uncompress(
                input.as_ptr().cast(),
                input.len(),
                &mut len,
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        };
        if block.is_null() {
            // SAFETY: NUL-terminated by the call.
            let why = unsafe { std::ffi::CStr::from_ptr(errstr.as_ptr()) };
            return Err(why.to_string_lossy().into_owned());
        }
        Ok(taken(block.cast(), len))
    }

    #[test]
    fn snappy_java_blocks_inflate_and_their_sum_is_bounded_not_each_one() {
        let data = sample();
        let (a, b) = data.split_at(1000);
        assert_eq!(java(&xerial_blocks(&[a, b])), Ok(data.clone()));
        // Blocks of 1 MiB each, under the limit one by one, over it together.
        let mib = vec![0u8; 1 << 20];
        let many: Vec<&[u8]> = (0..INFLATE_LIMIT / mib.len() + 1)
            .map(|_| &mib[..])
            .collect();
        let refused_why = java(&xerial_blocks(&many)).expect_err("over the limit");
        assert!(refused_why.contains("more than 33554432"), "{refused_why}");
        assert!(java(&xerial_blocks(&[])).is_err(), "no records");
        assert!(java(&[0, 0, 0, 9, 1]).is_err(), "cut short");
    }

    #[test]
    fn a_raw_snappy_block_declaring_more_than_the_limit_is_refused_before_allocation() {
        let length = |block: &[u8]| {
            let mut len = 0usize;
            // SAFETY: a valid buffer and its length, a writable result.
            let ok = unsafe {
                __wrap_rd_kafka_snappy_uncompressed_length(
                    block.as_ptr().cast(),
                    block.len(),
                    &mut len,
                )
            };
            ok.then_some(len)
        };
        let small = snap::raw::Encoder::new()
            .compress_vec(b"records")
            .expect("in memory");
        assert_eq!(length(&small), Some(7));
        // A varint declaring 64 MiB, then nothing: refused on its word alone.
        let declared = [0x80, 0x80, 0x80, 0x20];
        assert_eq!(length(&declared), None);
        assert_eq!(
            length(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            None,
            "no varint"
        );
    }
}
