//! `wan-proxy`: a TCP proxy on 127.0.0.1 that holds every chunk of bytes, in each direction,
//! for half the round-trip time before passing it on: a cross-region link's latency between a
//! replicator and the source cluster (netem is not available here). Bandwidth is not capped and
//! the proxy buffers without limit, so TCP windows do not shrink the link; what it models is
//! the round trip every fetch and metadata request pays.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Copies `from` into `to`, each chunk `delay` after it was read.
fn delayed_copy(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = thread::spawn(move || {
        for (due, chunk) in rx {
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buf = vec![0_u8; 256 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
}

/// Serves until killed: every connection to `listen` is forwarded to `upstream` with `rtt`.
pub fn proxy(listen: &str, upstream: &str, rtt: Duration) -> Result<()> {
    let listener = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    let one_way = rtt / 2;
    eprintln!(
        "wan-proxy: {listen} -> {upstream}, {} ms RTT",
        rtt.as_millis()
    );
    for conn in listener.incoming() {
        let Ok(down) = conn else { continue };
        let up = match TcpStream::connect(upstream) {
            Ok(up) => up,
            Err(e) => {
                eprintln!("wan-proxy: connecting {upstream}: {e}");
                continue;
            }
        };
        // The delay is the proxy's; Nagle would add its own on small requests.
        let _ = down.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let (Ok(down2), Ok(up2)) = (down.try_clone(), up.try_clone()) else {
            continue;
        };
        thread::spawn(move || delayed_copy(down, up, one_way));
        thread::spawn(move || delayed_copy(up2, down2, one_way));
    }
    Ok(())
}
