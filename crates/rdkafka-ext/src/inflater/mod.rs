//! librdkafka's inflaters, replaced by bounded ones.
//!
//! librdkafka reads records for the copy of records, the loops that follow internal topics, the
//! CLI and the status probe's fallback client, and it inflates each compressed batch in full
//! before handing out a record, as large as the batch's records reach: a few hundred KB of
//! zeros inflate to hundreds of MiB. Its gzip inflater measures the whole inflated size, then
//! allocates it; its lz4 inflater grows its buffer until the frame ends (lz4 reaches about 255
//! times the batch, and a fetch may carry batches of many MiB); its zstd inflater is bounded
//! only by `receive.message.max.bytes` (about 100 MB by default), and its snappy-java inflater
//! by the sum of the lengths the blocks declare. No setting bounds them to what a replicator's
//! memory holds.
//!
//! So every batch librdkafka reads is inflated here, as a stream into one `malloc`ed block that
//! grows only as bytes come out and is refused past [`INFLATE_LIMIT`]:
//! - gzip ([`gzip`]): this crate defines `rd_gz_decompress` (the only function of rdgz.c's
//!   object), and the linker takes this definition, met first, over the static library's;
//! - lz4, zstd and snappy ([`wrapped`]): their inflaters share an object file with their
//!   compressors, so they cannot be replaced that way; the binary is linked with
//!   `--wrap=<symbol>` for each of [`WRAPPED`] (the root package's build script), which sends
//!   librdkafka's calls to this crate's `__wrap_<symbol>`.
//!
//! A binary calls [`linked`] once: the reference is what makes the linker take these
//! definitions. A refused batch is reported to librdkafka as `_BAD_COMPRESSION`; librdkafka
//! tries it again about every half second and never skips it, so the batch holds its
//! partition. Refusals are noted ([`refused`]): that error names no partition and no reason.

pub mod gzip;
pub mod native;
pub mod wrapped;

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use mirrorflow_core::batch::inflate::InflateError;

/// The most one batch may inflate to when librdkafka reads it.
pub const INFLATE_LIMIT: usize = 32 << 20;

include!("symbols.rs");

/// The first block's size: most batches inflate to less.
const FIRST_BLOCK: usize = 64 << 10;

static REFUSED: AtomicU64 = AtomicU64::new(0);
static LAST: Mutex<Option<InflateError>> = Mutex::new(None);
/// The batches refused last (length and CRC-32C of their compressed bytes), answered again at
/// once: librdkafka tries a batch it could not read every half second or so, and inflating a
/// bomb to the limit each time would cost a core's tenth per bombed partition.
static RECENT: Mutex<VecDeque<(usize, u32)>> = Mutex::new(VecDeque::new());
const RECENT_KEPT: usize = 64;

/// How many batches librdkafka was refused in this process, and why the last one was.
pub fn refused() -> (u64, Option<InflateError>) {
    let last = LAST.lock().ok().and_then(|l| l.clone());
    (REFUSED.load(Ordering::Relaxed), last)
}

fn note_refused(error: Option<InflateError>, fingerprint: Option<(usize, u32)>) {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    if let Some(error) = error
        && let Ok(mut last) = LAST.lock()
    {
        *last = Some(error);
    }
    if let Some(fingerprint) = fingerprint
        && let Ok(mut recent) = RECENT.lock()
        && !recent.contains(&fingerprint)
    {
        if recent.len() >= RECENT_KEPT {
            recent.pop_front();
        }
        recent.push_back(fingerprint);
    }
}

fn refused_before(fingerprint: (usize, u32)) -> bool {
    RECENT.lock().is_ok_and(|r| r.contains(&fingerprint))
}

/// The inflaters librdkafka calls, by address. A binary that links librdkafka calls this once:
/// its reference is what makes the linker take them.
pub fn linked() -> [*const c_void; 5] {
    [
        gzip::rd_gz_decompress as *const c_void,
        wrapped::__wrap_rd_kafka_lz4_decompress as *const c_void,
        wrapped::__wrap_rd_kafka_zstd_decompress as *const c_void,
        wrapped::__wrap_rd_kafka_snappy_java_uncompress as *const c_void,
        wrapped::__wrap_rd_kafka_snappy_uncompressed_length as *const c_void,
    ]
}

/// Whether librdkafka's calls reach the wrapped inflaters in this binary: a call to one of
/// librdkafka's symbols by its name comes to the wrapped one only when the binary is linked
/// with the `--wrap`s (one list for every symbol). The length a raw snappy block declares is
/// the one safe to ask either way: librdkafka's answers any length, the bounded one refuses
/// one past the limit.
pub fn wrapped_here() -> bool {
    unsafe extern "C" {
        fn rd_kafka_snappy_uncompressed_length(
            start: *const std::ffi::c_char,
            n: usize,
            result: *mut usize,
        ) -> bool;
    }
    std::hint::black_box(linked());
    // A varint declaring 64 MiB.
    let declared = [0x80u8, 0x80, 0x80, 0x20];
    let mut len = 0usize;
    // SAFETY: a valid buffer and its length, and a writable result.
    let taken = unsafe {
        rd_kafka_snappy_uncompressed_length(declared.as_ptr().cast(), declared.len(), &mut len)
    };
    !taken
}

/// `input` inflated by `inflate` (which hands the bytes to its sink as they come out) into a
/// `malloc`ed block the caller frees with `free`, NUL-terminated, with its length; `None` when
/// refused (noted), when the same bytes were refused lately, or on a panic, which may not
/// unwind into C.
fn into_block(
    input: &[u8],
    inflate: impl FnOnce(&[u8], &mut dyn FnMut(&[u8]) -> bool) -> Result<usize, InflateError>,
) -> Option<(*mut c_void, usize)> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let fingerprint = (input.len(), crc32c::crc32c(input));
        if refused_before(fingerprint) {
            note_refused(None, Some(fingerprint));
            return None;
        }
        let mut block = Block::new();
        match inflate(input, &mut |bytes| block.push(bytes)) {
            Ok(_) => block.finish(),
            Err(error) => {
                block.release();
                // Memory may be there at the next try: only what the bytes decide is final.
                let final_ = !matches!(error, InflateError::NoMemory { .. });
                note_refused(Some(error), final_.then_some(fingerprint));
                None
            }
        }
    }))
    .ok()
    .flatten()
}

/// A `malloc`ed block grown by doubling, never past the limit and its NUL byte.
struct Block {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

impl Block {
    fn new() -> Self {
        Block {
            ptr: null_mut(),
            len: 0,
            cap: 0,
        }
    }

    /// Room for `more` bytes and a NUL after them; false when there is no memory.
    fn reserve(&mut self, more: usize) -> bool {
        let need = self.len.saturating_add(more).saturating_add(1);
        if need <= self.cap {
            return true;
        }
        let cap = self
            .cap
            .saturating_mul(2)
            .clamp(FIRST_BLOCK, INFLATE_LIMIT + 1)
            .max(need);
        // SAFETY: `ptr` is null or a block of this allocator not yet freed; on failure it is
        // left as it was.
        let grown = unsafe { libc::realloc(self.ptr.cast(), cap) }.cast::<u8>();
        if grown.is_null() {
            return false;
        }
        self.ptr = grown;
        self.cap = cap;
        true
    }

    fn push(&mut self, bytes: &[u8]) -> bool {
        if !self.reserve(bytes.len()) {
            return false;
        }
        // SAFETY: `reserve` made room for `bytes` past `len` in the block, which `bytes` (the
        // decoder's own buffer) does not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(self.len), bytes.len())
        };
        self.len += bytes.len();
        true
    }

    /// The block, NUL-terminated, handed over to the caller (who frees it).
    fn finish(mut self) -> Option<(*mut c_void, usize)> {
        if !self.reserve(0) {
            self.release();
            return None;
        }
        // SAFETY: `reserve(0)` made room for one byte at `len`.
        unsafe { *self.ptr.add(self.len) = 0 };
        Some((self.ptr.cast(), self.len))
    }

    fn release(&mut self) {
        // SAFETY: null or a block of this allocator, freed once (the pointer is cleared).
        unsafe { libc::free(self.ptr.cast()) };
        self.ptr = null_mut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Two tries of the same bytes with a decoder failing with `error`: how often it ran.
    fn runs_over_two_tries(input: &[u8], error: InflateError) -> u32 {
        let runs = Cell::new(0);
        for _ in 0..2 {
            let out = into_block(input, |_, _| {
                runs.set(runs.get() + 1);
                Err(error.clone())
            });
            assert!(out.is_none());
        }
        runs.get()
    }

    #[test]
    fn only_what_the_bytes_decide_is_refused_again_without_decoding() {
        let too_large = InflateError::TooLarge {
            codec: "lz4",
            limit: 1,
        };
        assert_eq!(runs_over_two_tries(b"first batch", too_large), 1);
        let corrupt = InflateError::Corrupt {
            codec: "lz4",
            what: "test",
        };
        assert_eq!(runs_over_two_tries(b"second batch", corrupt), 1);
        // No memory this time says nothing of the next try.
        let no_memory = InflateError::NoMemory { codec: "lz4" };
        assert_eq!(runs_over_two_tries(b"third batch", no_memory), 2);
    }
}
