//! librdkafka's gzip inflater, `rd_gz_decompress` (rdgz.c, the only function of its object
//! file), defined here: the linker resolves librdkafka's calls to this definition, met first,
//! and never pulls rdgz.c's object from the static library (were both ever linked, the link
//! fails on the duplicate; it cannot pick one silently). librdkafka's contract is kept: a
//! block it frees with `free`, a NUL after the inflated bytes, their length in
//! `*decompressed_lenp`, or NULL for a batch it then reports as `_BAD_COMPRESSION`.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use mirrorflow_core::batch::Codec;
use mirrorflow_core::batch::inflate::inflate_into;

use super::{INFLATE_LIMIT, into_block};

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
    match into_block(input, |input, sink| {
        inflate_into(Codec::Gzip, input, INFLATE_LIMIT, sink)
    }) {
        Some((block, n)) => {
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
    use crate::inflater::refused;
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
