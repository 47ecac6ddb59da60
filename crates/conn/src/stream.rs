//! The byte streams a connection runs over: a socket whose every read and write ends by a
//! deadline, TLS over it, or any other stream (tests, fuzzing); and whether an answer waits to
//! be read, so one caller can serve several connections without blocking on the slowest.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use openssl::ssl::SslStream;

/// Bytes both ways: what a connection runs over besides a socket ([`Conn::over`]).
pub trait Duplex: Read + Write + Send {}

impl<T: Read + Write + Send> Duplex for T {}

/// A socket whose reads and writes end by a deadline: before each, its timeouts are set to
/// what is left. Under TLS too, so that a broker cannot hold the handshake either.
#[derive(Debug)]
pub(crate) struct Timed {
    pub(crate) tcp: TcpStream,
    pub(crate) deadline: Instant,
}

impl Timed {
    fn arm(&self) -> std::io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        self.tcp.set_read_timeout(Some(left))?;
        self.tcp.set_write_timeout(Some(left))
    }
}

/// A socket's timeout, set to what was left: the deadline passed.
fn past_deadline(e: std::io::Error) -> std::io::Error {
    if e.kind() == std::io::ErrorKind::WouldBlock {
        timed_out()
    } else {
        e
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.arm()?;
        self.tcp.read(buf).map_err(past_deadline)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.arm()?;
        self.tcp.write(buf).map_err(past_deadline)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

pub(crate) enum Stream {
    Plain(Timed),
    Tls(Box<SslStream<Timed>>),
    /// Any other byte stream: its own timeouts, if any; the deadline is checked between reads.
    Other(Box<dyn Duplex>),
}

impl Stream {
    /// The deadline of the reads and writes that follow.
    pub(crate) fn until(&mut self, deadline: Instant) -> std::io::Result<()> {
        if deadline <= Instant::now() {
            return Err(timed_out());
        }
        match self {
            Stream::Plain(s) => s.deadline = deadline,
            Stream::Tls(s) => s.get_mut().deadline = deadline,
            Stream::Other(_) => {}
        }
        Ok(())
    }

    /// `read_exact`, done by `deadline`.
    pub(crate) fn read_exact_by(
        &mut self,
        mut buf: &mut [u8],
        deadline: Instant,
    ) -> std::io::Result<()> {
        while !buf.is_empty() {
            self.until(deadline)?;
            match self.read(buf) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(past_deadline(e)),
            }
        }
        Ok(())
    }

    /// `write_all` and `flush`, done by `deadline`.
    pub(crate) fn write_all_by(
        &mut self,
        mut buf: &[u8],
        deadline: Instant,
    ) -> std::io::Result<()> {
        while !buf.is_empty() {
            self.until(deadline)?;
            match self.write(buf) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(past_deadline(e)),
            }
        }
        self.until(deadline)?;
        self.flush().map_err(past_deadline)
    }
}

pub(crate) fn timed_out() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the broker took longer than the request timeout",
    )
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
            Stream::Other(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
            Stream::Other(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
            Stream::Other(s) => s.flush(),
        }
    }
}

impl Stream {
    /// Whether bytes of an answer (or the stream's end) wait to be read, after waiting at most
    /// `wait` for them (`ZERO`: a look, no wait). A stream that cannot tell says yes: its
    /// reader then blocks, by its own timeouts, as it would without asking.
    pub(crate) fn readable(&mut self, wait: Duration) -> std::io::Result<bool> {
        let tcp = match self {
            Stream::Plain(s) => &s.tcp,
            Stream::Tls(s) => {
                // Decrypted bytes held by TLS are not on the socket any more.
                if s.ssl().pending() > 0 {
                    return Ok(true);
                }
                &s.get_ref().tcp
            }
            Stream::Other(_) => return Ok(true),
        };
        peek_within(tcp, wait)
    }
}

/// Whether `tcp` has a byte to read (or its end) within `wait`, without taking it.
fn peek_within(tcp: &TcpStream, wait: Duration) -> std::io::Result<bool> {
    let mut byte = [0u8; 1];
    let peeked = if wait.is_zero() {
        tcp.set_nonblocking(true)?;
        let peeked = tcp.peek(&mut byte);
        tcp.set_nonblocking(false)?;
        peeked
    } else {
        // Every read sets its own timeout again ([`Timed::arm`]).
        tcp.set_read_timeout(Some(wait))?;
        tcp.peek(&mut byte)
    };
    match peeked {
        // A byte, or the end of the stream: the read that follows says which.
        Ok(_) => Ok(true),
        Err(e) => match e.kind() {
            std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted => Ok(false),
            _ => Err(e),
        },
    }
}
