//! librdkafka's gzip inflater, replaced by a bounded one.
//!
//! librdkafka reads records for the copy of records, the loops that follow internal topics, the
//! CLI and the status probe's fallback client, and it inflates each compressed batch in full
//! before handing out a record. Its gzip inflater (`rd_gz_decompress`, rdgz.c, the only
//! function of its object file) measures the whole inflated size, then allocates it, however
//! large: a few hundred KB of zeros inflate to hundreds of MiB, and no setting limits it. The
//! other codecs are bounded by librdkafka itself: zstd by `receive.message.max.bytes`, lz4 and
//! snappy by their formats (at most about 255 and 21 times the batch's size).
//!
//! So this crate defines `rd_gz_decompress` itself, and the binary references it ([`linked`]):
//! the linker resolves librdkafka's calls to this definition, met first, and never pulls
//! rdgz.c's object from the static library (were both ever linked, the link fails on the
//! duplicate; it cannot pick one silently). Here a batch is inflated as a stream into one
//! `malloc`ed block that grows only as bytes come out (a large block grows by `mremap`,
//! without a copy) and is refused past [`INFLATE_LIMIT`], with librdkafka's contract kept: a
//! block it frees with `free`, a NUL after the inflated bytes, their length in
//! `*decompressed_lenp`, or NULL for a batch it then reports as `_BAD_COMPRESSION` (and reads
//! on after). Refusals are noted ([`refused`]): that error names no partition and no reason.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use mirrorflow_core::batch::inflate::{InflateError, gunzip_into};

/// The most one gzip batch may inflate to when librdkafka reads it.
pub const INFLATE_LIMIT: usize = 32 << 20;

/// The first block's size: most batches inflate to less.
const FIRST_BLOCK: usize = 64 << 10;

static REFUSED: AtomicU64 = AtomicU64::new(0);
static LAST: Mutex<Option<InflateError>> = Mutex::new(None);
/// The batches refused last (length and CRC-32C of their compressed bytes), answered again at
/// once: librdkafka tries a batch it could not read every half second or so, and inflating a
/// bomb to the limit each time would cost a core's tenth per bombed partition.
static RECENT: Mutex<VecDeque<(usize, u32)>> = Mutex::new(VecDeque::new());
const RECENT_KEPT: usize = 64;

/// How many gzip batches librdkafka was refused in this process, and why the last one was.
pub fn refused() -> (u64, Option<InflateError>) {
    let last = LAST.lock().ok().and_then(|l| l.clone());
    (REFUSED.load(Ordering::Relaxed), last)
}

fn note_refused(error: Option<InflateError>, fingerprint: (usize, u32)) {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    if let Some(error) = error
        && let Ok(mut last) = LAST.lock()
    {
        *last = Some(error);
    }
    if let Ok(mut recent) = RECENT.lock()
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

/// The inflater librdkafka calls. A binary that links librdkafka calls this once (its
/// reference is what makes the linker take this definition rather than rdgz.c's).
pub fn linked() -> unsafe extern "C" fn(*const c_void, c_int, *mut u64) -> *mut c_void {
    rd_gz_decompress
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

/// Called by librdkafka for every gzip batch it reads.
///
/// # Safety
/// `compressed` points to `compressed_len` readable bytes and `decompressed_lenp` to a
/// writable `u64`, as librdkafka passes them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rd_gz_decompress(
    compressed: *const c_void,
    compressed_len: c_int,
    decompressed_lenp: *mut u64,
) -> *mut c_void {
    let Ok(len) = usize::try_from(compressed_len) else {
        return null_mut();
    };
    if compressed.is_null() || decompressed_lenp.is_null() {
        return null_mut();
    }
    // SAFETY: the caller's contract: `len` readable bytes at `compressed`.
    let input = unsafe { std::slice::from_raw_parts(compressed.cast::<u8>(), len) };
    // A panic may not unwind into C: it ends as a refused batch.
    let inflated = std::panic::catch_unwind(|| {
        let fingerprint = (input.len(), crc32c::crc32c(input));
        if refused_before(fingerprint) {
            note_refused(None, fingerprint);
            return None;
        }
        let mut block = Block::new();
        match gunzip_into(input, INFLATE_LIMIT, &mut |bytes| block.push(bytes)) {
            Ok(_) => block.finish(),
            Err(error) => {
                block.release();
                note_refused(Some(error), fingerprint);
                None
            }
        }
    });
    match inflated {
        Ok(Some((block, n))) => {
            // SAFETY: the caller's contract: a writable u64.
            unsafe { *decompressed_lenp = n as u64 };
            block
        }
        _ => null_mut(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::{Duration, Instant};

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).expect("in memory");
        e.finish().expect("in memory")
    }

    /// Through the symbol librdkafka's reads call, as it calls it.
    fn inflate(input: &[u8]) -> Option<Vec<u8>> {
        unsafe extern "C" {
            #[link_name = "rd_gz_decompress"]
            fn by_name(c: *const c_void, n: c_int, out: *mut u64) -> *mut c_void;
        }
        let mut len = 0u64;
        let n = c_int::try_from(input.len()).expect("small");
        // SAFETY: a valid slice, its length, and a writable u64.
        let block = unsafe { by_name(input.as_ptr().cast(), n, &mut len) };
        if block.is_null() {
            return None;
        }
        let len = usize::try_from(len).expect("fits");
        // SAFETY: the contract: `len` bytes and a NUL in a block freed once, below.
        let out = unsafe { std::slice::from_raw_parts(block.cast::<u8>(), len + 1) }.to_vec();
        // SAFETY: a block of this allocator handed over by the call.
        unsafe { libc::free(block) };
        assert_eq!(out.last(), Some(&0), "NUL-terminated");
        Some(out[..len].to_vec())
    }

    #[test]
    fn a_gzip_batch_inflates_as_librdkafka_expects_it() {
        let data: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        assert_eq!(inflate(&gzip(&data)).as_deref(), Some(&data[..]));
        assert_eq!(inflate(&gzip(b"")).as_deref(), Some(&b""[..]));
        // Two members one after the other, as Kafka's own reader takes them.
        let mut two = gzip(b"first ");
        two.extend(gzip(b"second"));
        assert_eq!(inflate(&two).as_deref(), Some(&b"first second"[..]));
    }

    #[test]
    fn a_bomb_or_a_corrupt_batch_is_refused_and_noted() {
        let (before, _) = refused();
        let bomb = gzip(&vec![0u8; INFLATE_LIMIT + 1]);
        assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
        assert_eq!(inflate(&bomb), None);
        // Tried again (as librdkafka does): refused at once, counted again.
        let again = Instant::now();
        assert_eq!(inflate(&bomb), None);
        assert!(
            again.elapsed() < Duration::from_millis(20),
            "{:?}",
            again.elapsed()
        );
        let (after, last) = refused();
        assert!(after >= before + 2);
        assert!(
            last.is_some_and(|e| e.to_string().contains("more than 33554432")),
            "the reason kept"
        );
        let mut cut = gzip(b"some records");
        cut.truncate(cut.len() / 2);
        assert_eq!(inflate(&cut), None);
        assert_eq!(inflate(b"not gzip at all"), None);
        // Exactly the limit is still taken.
        let full = vec![7u8; INFLATE_LIMIT];
        assert_eq!(inflate(&gzip(&full)).map(|v| v.len()), Some(INFLATE_LIMIT));
    }
}
