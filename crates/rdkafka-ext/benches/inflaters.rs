//! What the bounded inflaters cost against librdkafka's own decoders and the core crate's
//! pure-Rust ones, on one batch of 1 MiB of JSON-like records per codec: GB/s of inflated
//! bytes. `cargo bench -p mirrorflow-rdkafka-ext --bench inflaters` (release; linked with the
//! binary's `--wrap`s).

use std::ffi::{c_char, c_void};
use std::io::Write;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use mirrorflow_core::batch::Codec;
use mirrorflow_core::batch::inflate::inflate;
use mirrorflow_rdkafka_ext::inflater::gzip::rd_gz_decompress;
use mirrorflow_rdkafka_ext::inflater::native::{
    LZ4F_VERSION, LZ4F_createDecompressionContext, LZ4F_decompress, LZ4F_freeDecompressionContext,
    ZSTD_decompress,
};
use mirrorflow_rdkafka_ext::inflater::wrapped::{
    __wrap_rd_kafka_lz4_decompress, __wrap_rd_kafka_zstd_decompress,
};
use rdkafka::types::RDKafkaRespErr;

/// About 1 MiB of JSON-like records of about 1 KiB, as the benchmarks' data sets: fields of
/// words drawn from a vocabulary (compressing about as real event records do, a few times).
fn records() -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut out = Vec::new();
    for i in 0u64..1000 {
        let note: Vec<String> = (0..100)
            .map(|_| {
                let r = next();
                format!("{}{}", WORDS[(r % 16) as usize], r % 1000)
            })
            .collect();
        let record = format!(
            "{{\"id\":{i},\"user\":\"user-{}\",\"ts\":{},\"session\":\"{:016x}\",\"note\":\"{}\"}}",
            next() % 100_000,
            1_700_000_000_000 + i * 13,
            next(),
            note.join(" "),
        );
        out.extend_from_slice(record.as_bytes());
    }
    out
}

/// Inflated GB/s of `run` over at least a second.
fn rate(bytes: usize, mut run: impl FnMut()) -> f64 {
    let started = Instant::now();
    let mut rounds = 0u32;
    while started.elapsed() < Duration::from_secs(1) {
        run();
        rounds += 1;
    }
    (bytes as f64 * f64::from(rounds)) / started.elapsed().as_secs_f64() / 1e9
}

/// Through the wrapped symbol, as librdkafka calls it; the block freed as it frees it.
fn bounded(
    wrapped: &dyn Fn(*mut c_char, usize, *mut *mut c_void, *mut usize) -> RDKafkaRespErr,
    input: &[u8],
    want: usize,
) {
    let mut input = input.to_vec();
    let (mut out, mut len) = (null_mut(), 0usize);
    let err = wrapped(input.as_mut_ptr().cast(), input.len(), &mut out, &mut len);
    assert_eq!(
        (err, len),
        (RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR, want)
    );
    // SAFETY: a block handed over by the call, freed once.
    unsafe { libc_free(out) };
}

unsafe extern "C" {
    #[link_name = "free"]
    fn libc_free(p: *mut c_void);
    #[link_name = "calloc"]
    fn libc_calloc(items: usize, size: usize) -> *mut c_void;
}

fn main() {
    std::hint::black_box(mirrorflow_rdkafka_ext::inflater::linked());
    let _ = rdkafka::util::get_rdkafka_version();
    let data = records();
    let n = data.len();
    let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
    e.write_all(&data).expect("in memory");
    let lz4 = e.finish().expect("in memory");
    let zstd =
        ruzstd::encoding::compress_to_vec(&data[..], ruzstd::encoding::CompressionLevel::Fastest);
    println!("one batch of {n} B of JSON-like records; inflated GB/s");
    println!("codec  compressed  bounded (this crate)  librdkafka's decoder  core (pure Rust)");

    let ours = rate(n, || {
        bounded(
            // SAFETY: librdkafka's arguments: a readable buffer, writable out pointers.
            &|i, l, o, ol| unsafe { __wrap_rd_kafka_lz4_decompress(null_mut(), 1, 0, i, l, o, ol) },
            &lz4,
            n,
        )
    });
    let theirs = rate(n, || {
        // librdkafka's way: the whole output allocated, one frame decoded into it.
        let mut ctx = null_mut();
        // SAFETY: a writable pointer for the context.
        unsafe { LZ4F_createDecompressionContext(&mut ctx, LZ4F_VERSION) };
        let mut out = Vec::<u8>::with_capacity(n);
        let (mut dst, mut src) = (n, lz4.len());
        // SAFETY: `out` has room for `dst` bytes, `lz4` holds `src`.
        let r = unsafe {
            LZ4F_decompress(
                ctx,
                out.as_mut_ptr().cast(),
                &mut dst,
                lz4.as_ptr().cast(),
                &mut src,
                std::ptr::null(),
            )
        };
        assert_eq!((r, dst), (0, n));
        // SAFETY: the context created above, freed once.
        unsafe { LZ4F_freeDecompressionContext(ctx) };
    });
    let core = rate(n, || {
        assert_eq!(inflate(Codec::Lz4, &lz4, 32 << 20).map(|v| v.len()), Ok(n));
    });
    println!(
        "lz4    {:>10}  {ours:>20.2}  {theirs:>20.2}  {core:>16.2}",
        lz4.len()
    );

    let ours = rate(n, || {
        bounded(
            // SAFETY: librdkafka's arguments: a readable buffer, writable out pointers.
            &|i, l, o, ol| unsafe { __wrap_rd_kafka_zstd_decompress(null_mut(), i, l, o, ol) },
            &zstd,
            n,
        )
    });
    let theirs = rate(n, || {
        let mut out = Vec::<u8>::with_capacity(n);
        // SAFETY: `out` has room for `n` bytes, `zstd` holds its length.
        let r = unsafe {
            ZSTD_decompress(out.as_mut_ptr().cast(), n, zstd.as_ptr().cast(), zstd.len())
        };
        assert_eq!(r, n);
    });
    let core = rate(n, || {
        assert_eq!(
            inflate(Codec::Zstd, &zstd, 32 << 20).map(|v| v.len()),
            Ok(n)
        );
    });
    println!(
        "zstd   {:>10}  {ours:>20.2}  {theirs:>20.2}  {core:>16.2}",
        zstd.len()
    );

    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(&data).expect("in memory");
    let gzip = e.finish().expect("in memory");
    let ours = rate(n, || {
        let mut len = 0u64;
        let size = i32::try_from(gzip.len()).expect("small");
        // SAFETY: librdkafka's arguments: a readable buffer and its length, a writable length.
        let block = unsafe { rd_gz_decompress(gzip.as_ptr().cast(), size, &mut len) };
        assert_eq!(len, n as u64);
        // SAFETY: a block handed over by the call, freed once.
        unsafe { libc_free(block) };
    });
    // zlib, one pass into a block allocated whole (librdkafka's own, which the bounded one
    // replaced, made two: the first to measure the inflated size).
    let theirs = rate(n, || assert_eq!(zlib_once(&gzip, n), n));
    let core = rate(n, || {
        assert_eq!(
            inflate(Codec::Gzip, &gzip, 32 << 20).map(|v| v.len()),
            Ok(n)
        );
    });
    println!(
        "gzip   {:>10}  {ours:>20.2}  {theirs:>20.2}  {core:>16.2}",
        gzip.len()
    );
}

/// One gzip member inflated by zlib into a block of `n` bytes; the bytes inflated.
fn zlib_once(gzip: &[u8], n: usize) -> usize {
    use libz_sys as z;
    extern "C" fn alloc(_: z::voidpf, items: z::uInt, size: z::uInt) -> z::voidpf {
        // SAFETY: a plain allocation.
        unsafe { libc_calloc(items as usize, size as usize) }
    }
    extern "C" fn free(_: z::voidpf, p: z::voidpf) {
        // SAFETY: a block of `alloc`, freed once by zlib.
        unsafe { libc_free(p) }
    }
    let mut out = vec![0u8; n];
    let mut strm = Box::new(z::z_stream {
        next_in: gzip.as_ptr().cast_mut(),
        avail_in: u32::try_from(gzip.len()).expect("small"),
        total_in: 0,
        next_out: out.as_mut_ptr(),
        avail_out: u32::try_from(n).expect("small"),
        total_out: 0,
        msg: null_mut(),
        state: null_mut(),
        zalloc: alloc,
        zfree: free,
        opaque: null_mut(),
        data_type: 0,
        adler: 0,
        reserved: 0,
    });
    let size = i32::try_from(std::mem::size_of::<z::z_stream>()).expect("small");
    // SAFETY: a stream that stays in its box; zlib's own version string.
    let init = unsafe { z::inflateInit2_(&mut *strm, 15 + 32, z::zlibVersion(), size) };
    assert_eq!(init, z::Z_OK);
    // SAFETY: an initialised stream over live buffers.
    let r = unsafe { z::inflate(&mut *strm, z::Z_FINISH) };
    assert_eq!(r, z::Z_STREAM_END);
    let done = n - strm.avail_out as usize;
    // SAFETY: the stream initialised above, ended once.
    unsafe { z::inflateEnd(&mut *strm) };
    done
}
