//! A decompression bomb (300 MiB of zeros in a few hundred KB) is refused at the cap, and the
//! process's peak memory grows by about the cap, not by what the bomb would inflate to. Its own
//! test binary, so nothing else moves the peak (`VmHWM`) meanwhile.

use std::io::Write;

use mirrorflow_core::batch::Codec;
use mirrorflow_core::batch::inflate::{InflateError, inflate};

const BOMB: usize = 300 << 20;
const CAP: usize = 8 << 20;

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn zeros_into<W: Write>(mut w: W) -> W {
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..BOMB / chunk.len() {
        w.write_all(&chunk).expect("in memory");
    }
    w
}

fn zeros_compressed(codec: Codec) -> Vec<u8> {
    match codec {
        Codec::Gzip => zeros_into(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::best(),
        ))
        .finish()
        .expect("in memory"),
        _ => zeros_into(lz4_flex::frame::FrameEncoder::new(Vec::new()))
            .finish()
            .expect("in memory"),
    }
}

#[test]
fn a_300_mib_bomb_is_refused_with_memory_bounded_by_the_cap() {
    for codec in [Codec::Gzip, Codec::Lz4] {
        let bomb = zeros_compressed(codec);
        let before = peak_rss_kib();
        let refused = inflate(codec, &bomb, CAP);
        let after = peak_rss_kib();
        assert_eq!(
            refused,
            Err(InflateError::TooLarge {
                codec: codec.name(),
                limit: CAP
            })
        );
        if let (Some(before), Some(after)) = (before, after) {
            let grown = after.saturating_sub(before);
            println!(
                "{}: bomb of {} bytes (inflates to {BOMB}): peak RSS grew by {grown} KiB",
                codec.name(),
                bomb.len()
            );
            assert!(
                grown < 3 * (CAP as u64 / 1024),
                "{}: grew {grown} KiB",
                codec.name()
            );
        }
    }
}
