//! lz4 and zstd inflated by the C decoders the binary links for librdkafka anyway (lz4's frame
//! decoder, bundled in librdkafka; libzstd), driven as streams: a chunk at a time into the
//! caller's sink, refused once past the limit. librdkafka's own calls of them allocate the
//! whole output first; these calls never hold more than one chunk of their own. A copy of
//! records pays the decoder on every batch it reads, and the C ones are the faster:
//! `cargo bench -p mirrorflow-rdkafka-ext --bench inflaters` on one batch of 1 MiB of JSON-like
//! records (2 to 3 times compressed) inflated lz4 at 2.8 GB/s here against 2.2 with the
//! core crate's pure-Rust decoder, zstd at 1.0 against 0.22 (librdkafka's own, allocating the
//! whole output: 3.4 and 1.0). gzip stays with the core crate's decoder (miniz_oxide), as fast
//! as zlib driven the same way (0.41 GB/s against 0.40; zlib in one pass: 0.44).

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use mirrorflow_core::batch::inflate::InflateError;

/// Bytes decoded at a time.
const CHUNK: usize = 64 << 10;
/// The largest zstd window a frame may ask for, as a power of two: 32 MiB, the limit the core
/// crate's decoder allows for whole batches too.
const ZSTD_WINDOW_LOG_MAX: c_int = 25;

/// The lz4 frame API's version.
pub const LZ4F_VERSION: c_uint = 100;
const ZSTD_D_WINDOW_LOG_MAX: c_int = 100;
const ZSTD_ERROR_WINDOW_TOO_LARGE: c_uint = 16;

#[repr(C)]
struct ZstdIn {
    src: *const c_void,
    size: usize,
    pos: usize,
}

#[repr(C)]
struct ZstdOut {
    dst: *mut c_void,
    size: usize,
    pos: usize,
}

// The decoders' entry points, also for the benchmark that compares librdkafka's use of them.
unsafe extern "C" {
    pub fn LZ4F_createDecompressionContext(ctx: *mut *mut c_void, version: c_uint) -> usize;
    pub fn LZ4F_freeDecompressionContext(ctx: *mut c_void) -> usize;
    pub fn LZ4F_decompress(
        ctx: *mut c_void,
        dst: *mut c_void,
        dst_size: *mut usize,
        src: *const c_void,
        src_size: *mut usize,
        options: *const c_void,
    ) -> usize;
    fn LZ4F_isError(code: usize) -> c_uint;
    pub fn ZSTD_decompress(dst: *mut c_void, cap: usize, src: *const c_void, size: usize) -> usize;

    fn ZSTD_createDCtx() -> *mut c_void;
    fn ZSTD_freeDCtx(dctx: *mut c_void) -> usize;
    fn ZSTD_DCtx_setParameter(dctx: *mut c_void, param: c_int, value: c_int) -> usize;
    fn ZSTD_decompressStream(dctx: *mut c_void, out: *mut ZstdOut, input: *mut ZstdIn) -> usize;
    fn ZSTD_isError(code: usize) -> c_uint;
    fn ZSTD_getErrorCode(code: usize) -> c_uint;
}

/// A decoder's context, freed with its own function when the call ends, on every path.
struct Ctx(*mut c_void, unsafe extern "C" fn(*mut c_void) -> usize);

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: a live context of the decoder whose free function this is, freed once.
        unsafe { (self.1)(self.0) };
    }
}

fn corrupt(codec: &'static str, what: &'static str) -> InflateError {
    InflateError::Corrupt { codec, what }
}

/// Counts a decoded chunk against `limit` and hands it to `sink`.
fn emit(
    chunk: &[u8],
    total: &mut usize,
    codec: &'static str,
    limit: usize,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<(), InflateError> {
    *total = total.saturating_add(chunk.len());
    if *total > limit {
        return Err(InflateError::TooLarge { codec, limit });
    }
    if !chunk.is_empty() && !sink(chunk) {
        return Err(InflateError::NoMemory { codec });
    }
    Ok(())
}

/// LZ4 frames one after another (Kafka writes one per batch), as librdkafka reads them.
pub(super) fn lz4_into(
    input: &[u8],
    limit: usize,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<usize, InflateError> {
    let mut raw = null_mut();
    // SAFETY: a writable pointer for the new context.
    let created = unsafe { LZ4F_createDecompressionContext(&mut raw, LZ4F_VERSION) };
    // SAFETY: a plain function of a code.
    if unsafe { LZ4F_isError(created) } != 0 || raw.is_null() {
        return Err(InflateError::NoMemory { codec: "lz4" });
    }
    let ctx = Ctx(raw, LZ4F_freeDecompressionContext);
    let mut chunk = vec![0u8; CHUNK];
    let (mut read, mut total) = (0usize, 0usize);
    loop {
        let rest = input.get(read..).unwrap_or_default();
        let (mut written, mut consumed) = (chunk.len(), rest.len());
        // SAFETY: `chunk` has `written` writable bytes, `rest` has `consumed` readable ones;
        // the context is live.
        let hint = unsafe {
            LZ4F_decompress(
                ctx.0,
                chunk.as_mut_ptr().cast(),
                &mut written,
                rest.as_ptr().cast(),
                &mut consumed,
                std::ptr::null(),
            )
        };
        // SAFETY: a plain function of a code.
        if unsafe { LZ4F_isError(hint) } != 0 {
            return Err(corrupt("lz4", "a frame does not decode"));
        }
        read = read.saturating_add(consumed);
        emit(&chunk[..written.min(CHUNK)], &mut total, "lz4", limit, sink)?;
        let at_end = read >= input.len();
        match (hint, at_end) {
            // A frame ended with the input: done. (The context starts a new frame after one.)
            (0, true) => return Ok(total),
            (0, false) => {}
            // The input ended inside a frame, and nothing more came out of it.
            (_, true) if written == 0 => return Err(corrupt("lz4", "a frame is cut short")),
            // Never a turn without progress.
            _ if written == 0 && consumed == 0 => {
                return Err(corrupt("lz4", "a frame does not decode"));
            }
            _ => {}
        }
    }
}

/// zstd frames one after another, as librdkafka reads them; a frame asking for a window past
/// 32 MiB is refused before the decoder allocates it.
pub(super) fn zstd_into(
    input: &[u8],
    limit: usize,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<usize, InflateError> {
    // SAFETY: no arguments; null when there is no memory.
    let raw = unsafe { ZSTD_createDCtx() };
    if raw.is_null() {
        return Err(InflateError::NoMemory { codec: "zstd" });
    }
    let ctx = Ctx(raw, ZSTD_freeDCtx);
    // SAFETY: a live context and a parameter of the linked libzstd.
    let set = unsafe { ZSTD_DCtx_setParameter(ctx.0, ZSTD_D_WINDOW_LOG_MAX, ZSTD_WINDOW_LOG_MAX) };
    // SAFETY: a plain function of a code.
    if unsafe { ZSTD_isError(set) } != 0 {
        return Err(corrupt("zstd", "the decoder refused its window limit"));
    }
    let mut chunk = vec![0u8; CHUNK];
    let mut src = ZstdIn {
        src: input.as_ptr().cast(),
        size: input.len(),
        pos: 0,
    };
    let mut total = 0usize;
    loop {
        let mut dst = ZstdOut {
            dst: chunk.as_mut_ptr().cast(),
            size: chunk.len(),
            pos: 0,
        };
        let before = src.pos;
        // SAFETY: both buffers describe live memory of their sizes; the context is live.
        let hint = unsafe { ZSTD_decompressStream(ctx.0, &mut dst, &mut src) };
        // SAFETY: plain functions of a code.
        if unsafe { ZSTD_isError(hint) } != 0 {
            // SAFETY: as above.
            return Err(match unsafe { ZSTD_getErrorCode(hint) } {
                ZSTD_ERROR_WINDOW_TOO_LARGE => InflateError::TooLarge {
                    codec: "zstd",
                    limit,
                },
                _ => corrupt("zstd", "a frame does not decode"),
            });
        }
        emit(
            &chunk[..dst.pos.min(CHUNK)],
            &mut total,
            "zstd",
            limit,
            sink,
        )?;
        let at_end = src.pos >= src.size;
        match (hint, at_end) {
            (0, true) => return Ok(total),
            (_, true) if dst.pos < dst.size => return Err(corrupt("zstd", "a frame is cut short")),
            // Never a turn without progress.
            _ if dst.pos == 0 && src.pos == before => {
                return Err(corrupt("zstd", "a frame does not decode"));
            }
            _ => {}
        }
    }
}
