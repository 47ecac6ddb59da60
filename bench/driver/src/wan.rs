//! `wan-link`: a cross-region link between the replicators and the source cluster, built from
//! two TUN devices because netem is not available here. The near device stays in the host's
//! network namespace; `bench/run.sh` moves the far one into the namespace of the source broker.
//! Every IP packet from one to the other is held for half the round trip, optionally behind a
//! bandwidth cap with a router's drop-tail queue in front of it.
//!
//! TCP runs end to end through the link, so what limits a connection across regions limits it
//! here: the receive window and the sender's socket buffer (a connection carries at most one
//! window per round trip), slow start after idle, and losses when the queue in front of a cap
//! is full. A TCP proxy cannot model that: it ends each connection on loopback, where windows
//! never fill.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Large enough for TCP to send few, big segments: the link's own CPU per byte stays small
/// beside the replicators it measures.
const MTU: u16 = 65_000;

const NANOS: u128 = 1_000_000_000;

/// Where a packet goes, and when: half the round trip after it has crossed the cap.
struct Schedule {
    one_way: Duration,
    /// Bytes per second; `None`: no cap.
    rate: Option<u64>,
    /// What the queue in front of the cap holds before it drops a packet.
    queue_bytes: u64,
    /// When the cap has sent everything queued so far.
    busy_until: Instant,
}

impl Schedule {
    fn new(rtt: Duration, rate: Option<u64>, queue_bytes: u64, now: Instant) -> Self {
        Schedule {
            one_way: rtt / 2,
            rate: rate.filter(|r| *r > 0),
            queue_bytes,
            busy_until: now,
        }
    }

    /// When a packet of `len` bytes read at `now` reaches the far end; `None`: dropped, the
    /// queue in front of the cap is full.
    fn admit(&mut self, now: Instant, len: usize) -> Option<Instant> {
        let Some(rate) = self.rate else {
            return Some(now + self.one_way);
        };
        // Whole nanoseconds and bytes: a packet that just fits is not dropped by rounding.
        let start = self.busy_until.max(now);
        let queued = start.duration_since(now).as_nanos() * u128::from(rate) / NANOS;
        if queued.saturating_add(len as u128) > u128::from(self.queue_bytes) {
            return None;
        }
        let sending = (len as u128 * NANOS).div_ceil(u128::from(rate));
        self.busy_until = start + Duration::from_nanos(u64::try_from(sending).unwrap_or(u64::MAX));
        Some(self.busy_until + self.one_way)
    }
}

#[derive(Default)]
struct Counts {
    packets: AtomicU64,
    bytes: AtomicU64,
    dropped: AtomicU64,
    refused: AtomicU64,
}

fn open(name: &str) -> Result<tun::Device> {
    let mut config = tun::Configuration::default();
    // Packets come without the 4-byte packet-information header (the crate's default).
    config.tun_name(name).mtu(MTU);
    tun::create(&config).with_context(|| format!("creating TUN device {name}"))
}

/// Carries packets read from `from` to `to` on `schedule`, in order (the schedule's times
/// never decrease), until `from` cannot be read.
fn forward(
    mut from: tun::Reader,
    mut to: tun::Writer,
    mut schedule: Schedule,
    counts: Arc<Counts>,
) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let sent = counts.clone();
    let writer = thread::spawn(move || {
        for (due, packet) in rx {
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            // A device that is down (the far one before it is moved and configured) refuses
            // packets: they are lost, as on a link whose end is not up yet.
            if to.write_all(&packet).is_err() {
                sent.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let mut buf = vec![0_u8; usize::from(MTU) + 4096];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => continue,
            Ok(n) => n,
            Err(e) => {
                eprintln!("wan-link: reading a device: {e}");
                break;
            }
        };
        let Some(due) = schedule.admit(Instant::now(), n) else {
            counts.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        counts.packets.fetch_add(1, Ordering::Relaxed);
        counts.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
}

/// Creates the devices `near` and `far` and carries packets between them until killed, with
/// `rtt` and, when `rate_mib_s` is given, that cap in each direction and a queue of
/// `queue_kib` in front of it. Prints what it carried and dropped every 10 s. Fails once a
/// direction stops (a device gone): a link that no longer carries packets must not look up.
pub fn link(
    near: &str,
    far: &str,
    rtt: Duration,
    rate_mib_s: Option<f64>,
    queue_kib: u64,
) -> Result<()> {
    let (near_rx, near_tx) = open(near)?.split();
    let (far_rx, far_tx) = open(far)?.split();
    let rate = rate_mib_s.map(|r| (r * 1024.0 * 1024.0) as u64);
    let now = Instant::now();
    let out = Arc::new(Counts::default());
    let back = Arc::new(Counts::default());
    let schedule = || Schedule::new(rtt, rate, queue_kib * 1024, now);
    let (s1, s2) = (schedule(), schedule());
    let (c1, c2) = (out.clone(), back.clone());
    let directions = [
        thread::spawn(move || forward(near_rx, far_tx, s1, c1)),
        thread::spawn(move || forward(far_rx, near_tx, s2, c2)),
    ];
    eprintln!(
        "wan-link: {near} <-> {far}, {} ms RTT, cap {}",
        rtt.as_millis(),
        rate_mib_s.map_or("none".to_string(), |r| format!(
            "{r} MiB/s, queue {queue_kib} KiB"
        ))
    );
    let mut reported = Instant::now();
    loop {
        thread::sleep(Duration::from_secs(1));
        if directions.iter().any(thread::JoinHandle::is_finished) {
            anyhow::bail!("wan-link: a direction stopped carrying packets");
        }
        if reported.elapsed() < Duration::from_secs(10) {
            continue;
        }
        reported = Instant::now();
        let line = |c: &Counts| {
            format!(
                "{} packets, {} MiB, {} dropped at the cap, {} refused by the device",
                c.packets.load(Ordering::Relaxed),
                c.bytes.load(Ordering::Relaxed) >> 20,
                c.dropped.load(Ordering::Relaxed),
                c.refused.load(Ordering::Relaxed)
            )
        };
        eprintln!(
            "wan-link: to {far}: {}; to {near}: {}",
            line(&out),
            line(&back)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_cap_every_packet_takes_half_the_round_trip() {
        let t0 = Instant::now();
        let mut s = Schedule::new(Duration::from_millis(50), None, 0, t0);
        for _ in 0..100 {
            assert_eq!(s.admit(t0, 65_000), Some(t0 + Duration::from_millis(25)));
        }
    }

    #[test]
    fn a_cap_spaces_packets_by_their_size_and_drops_beyond_the_queue() {
        let t0 = Instant::now();
        // 1 MB/s, a queue of 3,000 bytes: 1,000-byte packets leave 1 ms apart.
        let mut s = Schedule::new(Duration::from_millis(10), Some(1_000_000), 3_000, t0);
        let ms = Duration::from_millis;
        assert_eq!(s.admit(t0, 1_000), Some(t0 + ms(1) + ms(5)));
        assert_eq!(s.admit(t0, 1_000), Some(t0 + ms(2) + ms(5)));
        assert_eq!(s.admit(t0, 1_000), Some(t0 + ms(3) + ms(5)));
        assert_eq!(s.admit(t0, 1_000), None, "3,000 bytes queued");
        // Once the cap has sent one, there is room for one more.
        assert_eq!(s.admit(t0 + ms(1), 1_000), Some(t0 + ms(4) + ms(5)));
        // An idle link sends at once.
        assert_eq!(s.admit(t0 + ms(100), 1_000), Some(t0 + ms(101) + ms(5)));
    }
}
