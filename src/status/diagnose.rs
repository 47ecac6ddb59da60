//! Why a cluster's listener cannot be used, found out by asking it.
//!
//! When the probe's Kafka client could not use a cluster and did not say why ("transport
//! failure"), one small exchange per bootstrap address (at most [`MAX_ADDRESSES`]) tells nothing
//! listening from no answer, a TLS listener from a plaintext one, a Kafka broker from an HTTP or
//! SSH server, and which SASL mechanisms the listener enables. Each connection reads at most
//! [`MAX_READ`] bytes, and the whole diagnosis ends by its deadline whatever the listener does
//! (a watchdog shuts a trickling connection down). Only the class is reported, never the bytes
//! read: the probe must not become a way to read other services' banners from the operator's
//! network position.
//!
//! The decisions are pure functions of what was read ([`plain_answer`], [`tls_failure`],
//! [`sasl_answer`], in `decide`), table-tested; [`diagnose`] is the thin I/O around them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mirrorflow_core::protocol;
use openssl::pkey::PKey;
use openssl::ssl::{HandshakeError, SslConnector, SslMethod, SslStream};
use openssl::x509::X509;
use openssl::x509::store::X509StoreBuilder;
use rdkafka::ClientConfig;

mod decide;

pub use self::decide::*;

/// Bootstrap addresses tried, in the order given.
pub const MAX_ADDRESSES: usize = 3;
/// The most read from one connection: enough for the first bytes of any answer and a
/// SaslHandshake's mechanism list.
pub const MAX_READ: usize = 512;
/// The longest one connection attempt or one answer is waited for.
const STEP: Duration = Duration::from_secs(3);
/// The largest answer frame a broker sends to ApiVersions or SaslHandshake: a length prefix
/// beyond it is not Kafka's ("HTTP" read as a length is 1213486160).
const MAX_PLAUSIBLE_FRAME: i32 = 1024 * 1024;
/// Correlation ids of the diagnosis's requests.
const API_VERSIONS_ID: i32 = 0x4d46_0001;
const SASL_ID: i32 = 0x4d46_0002;
const CLIENT_ID: &str = "mirrorflow-diagnosis";
/// How long after the deadline the watchdog shuts a connection down.
const WATCHDOG_GRACE: Duration = Duration::from_millis(500);

/// The connection a flow's client configuration asks for.
#[derive(Clone, Default)]
pub struct Expected {
    pub addresses: Vec<String>,
    pub tls: Option<TlsMaterial>,
    /// The SASL mechanism, when SASL is on.
    pub sasl: Option<String>,
}

/// CA and client certificate, as PEM.
#[derive(Clone, Default)]
pub struct TlsMaterial {
    pub ca_pem: Option<String>,
    pub client: Option<(String, String)>,
}

impl Expected {
    /// From a probe client's configuration (`bootstrap.servers`, `security.protocol`, the PEM
    /// material and `sasl.mechanisms` that [`crate::kafka::client_config`] sets).
    pub fn from_client_config(config: &ClientConfig) -> Self {
        let protocol = config
            .get("security.protocol")
            .unwrap_or("PLAINTEXT")
            .to_ascii_uppercase();
        let addresses = config
            .get("bootstrap.servers")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        let tls = protocol.ends_with("SSL").then(|| TlsMaterial {
            ca_pem: config.get("ssl.ca.pem").map(String::from),
            client: config
                .get("ssl.certificate.pem")
                .zip(config.get("ssl.key.pem"))
                .map(|(c, k)| (c.to_string(), k.to_string())),
        });
        let sasl = protocol.starts_with("SASL").then(|| {
            config
                .get("sasl.mechanisms")
                .unwrap_or("GSSAPI")
                .to_string()
        });
        Expected {
            addresses,
            tls,
            sasl,
        }
    }
}

/// Asks the first [`MAX_ADDRESSES`] bootstrap addresses, until one answers, what they are;
/// `None` when a Kafka listener answered as the spec expects (the fault lies elsewhere) or
/// there is no address. Blocking; ends by `deadline`.
pub fn diagnose(expected: &Expected, deadline: Instant) -> Option<Diagnosis> {
    let mut unanswered = None;
    for address in expected.addresses.iter().take(MAX_ADDRESSES) {
        let class = at_address(address, expected, deadline);
        let found = Diagnosis {
            address: address.clone(),
            class: class.clone(),
        };
        match class {
            Class::Unresolved | Class::NothingListening | Class::NoAnswer => {
                unanswered.get_or_insert(found);
            }
            Class::Kafka => return None,
            _ => return Some(found),
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    unanswered
}

fn at_address(address: &str, expected: &Expected, deadline: Instant) -> Class {
    let sockets: Vec<SocketAddr> = match address.to_socket_addrs() {
        Ok(found) => found.take(MAX_ADDRESSES).collect(),
        Err(_) => Vec::new(),
    };
    if sockets.is_empty() {
        return Class::Unresolved;
    }
    let peer = Peer {
        sockets,
        host: host_of(address),
        deadline,
    };
    match &expected.tls {
        None => over_plaintext(&peer, expected),
        Some(tls) => over_tls(&peer, tls, expected),
    }
}

/// Where to connect, the host name certificates must name, and when to stop.
struct Peer<'a> {
    /// The name's addresses (a name may resolve to ::1 and 127.0.0.1), tried in turn.
    sockets: Vec<SocketAddr>,
    host: &'a str,
    deadline: Instant,
}

impl Peer<'_> {
    fn left(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .min(STEP)
    }

    fn connect(&self) -> Result<(TcpStream, Watchdog), Class> {
        let mut failed = Class::NoAnswer;
        for socket in &self.sockets {
            let left = self.left();
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(socket, left) {
                Ok(tcp) => return Ok(self.armed(tcp)),
                // Refused on one address of a name tells more than silence on another.
                Err(e) => {
                    if connect_failure(e.kind()) == Class::NothingListening {
                        failed = Class::NothingListening;
                    }
                }
            }
        }
        Err(failed)
    }

    fn armed(&self, tcp: TcpStream) -> (TcpStream, Watchdog) {
        let watchdog = Watchdog::arm(&tcp, self.deadline);
        let step = Some(self.left().max(Duration::from_millis(1)));
        // A socket that cannot take timeouts is read until the watchdog ends it.
        let _ = tcp.set_read_timeout(step).and(tcp.set_write_timeout(step));
        let _ = tcp.set_nodelay(true);
        (tcp, watchdog)
    }
}

/// The class of a failed connection attempt: refused (a RST, or a firewall's REJECT) is
/// nothing listening; a timeout or no route is no answer.
pub fn connect_failure(kind: std::io::ErrorKind) -> Class {
    match kind {
        std::io::ErrorKind::ConnectionRefused => Class::NothingListening,
        _ => Class::NoAnswer,
    }
}

fn over_plaintext(peer: &Peer, expected: &Expected) -> Class {
    let (mut tcp, _watchdog) = match peer.connect() {
        Ok(c) => c,
        Err(class) => return class,
    };
    match exchange(&mut tcp, api_versions(), API_VERSIONS_ID).0 {
        Answer::Kafka => sasl_check(peer, expected),
        Answer::Foreign(f) => Class::NotKafka(f),
        Answer::Silent => silent(peer),
        // A TLS answer, or (Kafka's TLS listeners) a close without a word: whether Kafka or
        // an HTTPS server is behind the TLS decides the fix.
        answer @ (Answer::Tls | Answer::Closed) => match behind_tls(peer) {
            Some(Answer::Foreign(f)) => Class::NotKafka(f),
            Some(_) => Class::TlsExpected,
            None if answer == Answer::Tls => Class::TlsExpected,
            None => Class::NotKafka(Foreign::Unknown),
        },
    }
}

/// What answers ApiVersions behind a TLS handshake that trusts any certificate; `None` when
/// the peer does not speak TLS. A listener that refuses to go on without a client
/// certificate is taken for Kafka's (mTLS).
fn behind_tls(peer: &Peer) -> Option<Answer> {
    match tls_connect(peer, &TlsMaterial::default(), false) {
        Ok(mut stream) => {
            let (answer, error) = exchange(&mut stream.stream, api_versions(), API_VERSIONS_ID);
            let refused = error.is_some_and(|t| tls_failure(0, &t).client_refusal().is_some());
            Some(if refused { Answer::Kafka } else { answer })
        }
        Err(end) if end.client_refusal().is_some() => Some(Answer::Kafka),
        Err(_) => None,
    }
}

fn over_tls(peer: &Peer, tls: &TlsMaterial, expected: &Expected) -> Class {
    let mut stream = match tls_connect(peer, tls, true) {
        Ok(s) => s,
        // An HTTPS server's certificate is as foreign as the server: that is the fix to name.
        Err(end @ (TlsEnd::Untrusted | TlsEnd::HostnameMismatch | TlsEnd::OutOfDate(_))) => {
            return match (behind_tls(peer), end) {
                (Some(Answer::Foreign(f)), _) => Class::NotKafka(f),
                (_, TlsEnd::OutOfDate(expired)) => Class::CertificateOutOfDate { expired },
                (_, TlsEnd::Untrusted) => Class::CertificateUntrusted,
                _ => Class::HostnameMismatch,
            };
        }
        Err(TlsEnd::CertificateRefused) => return Class::CertificateRefused,
        Err(TlsEnd::ClientCertificateExpired) => return Class::ClientCertificateExpired,
        Err(TlsEnd::Deadline) => return silent(peer),
        Err(TlsEnd::NotTls | TlsEnd::Closed | TlsEnd::Other) => return not_tls(peer),
    };
    let (answer, error) = exchange(&mut stream.stream, api_versions(), API_VERSIONS_ID);
    // TLS 1.3: the broker checks the client certificate after the client's handshake ended,
    // so its refusal arrives as the first read's alert.
    if let Some(refusal) = error.and_then(|text| tls_failure(0, &text).client_refusal()) {
        return refusal;
    }
    match answer {
        Answer::Kafka => sasl_check(peer, expected),
        Answer::Foreign(f) => Class::NotKafka(f),
        Answer::Silent => Class::Silent,
        Answer::Tls | Answer::Closed => Class::NotKafka(Foreign::Unknown),
    }
}

/// A line-based server (HTTP, and others that read a line first) waits for a newline that a
/// Kafka request or a ClientHello need not hold: ask once more with an HTTP request line. A
/// Kafka broker reads "GET " as a frame size of more than 1 GB and closes, so only a server
/// that answers it is named; otherwise the port stays silent.
fn silent(peer: &Peer) -> Class {
    let Ok((mut tcp, _watchdog)) = peer.connect() else {
        return Class::Silent;
    };
    match exchange(&mut tcp, HTTP_PROBE.to_vec(), API_VERSIONS_ID).0 {
        Answer::Foreign(f) => Class::NotKafka(f),
        Answer::Tls => Class::TlsExpected,
        Answer::Kafka | Answer::Closed | Answer::Silent => Class::Silent,
    }
}

/// The request line that makes a line-based server answer.
const HTTP_PROBE: &[u8] = b"GET / HTTP/1.0\r\n\r\n";

/// Our ClientHello got no TLS answer: a plaintext Kafka listener, or not Kafka at all.
fn not_tls(peer: &Peer) -> Class {
    let (mut tcp, _watchdog) = match peer.connect() {
        Ok(c) => c,
        Err(class) => return class,
    };
    match exchange(&mut tcp, api_versions(), API_VERSIONS_ID).0 {
        Answer::Kafka => Class::PlaintextExpected,
        Answer::Foreign(f) => Class::NotKafka(f),
        Answer::Silent => silent(peer),
        Answer::Tls | Answer::Closed => Class::NotKafka(Foreign::Unknown),
    }
}

/// A Kafka listener answered: does it take the spec's SASL (or none)?
fn sasl_check(peer: &Peer, expected: &Expected) -> Class {
    let asked = expected.sasl.as_deref();
    let Ok(request) =
        protocol::sasl_handshake_request(SASL_ID, CLIENT_ID, asked.unwrap_or("PLAIN"))
    else {
        return Class::Kafka;
    };
    let answer = match &expected.tls {
        None => match peer.connect() {
            Ok((mut tcp, _watchdog)) => sasl_exchange(&mut tcp, &request),
            Err(_) => return Class::Kafka,
        },
        Some(tls) => match tls_connect(peer, tls, true) {
            Ok(mut stream) => sasl_exchange(&mut stream.stream, &request),
            Err(_) => return Class::Kafka,
        },
    };
    sasl_answer(asked, answer)
}

fn sasl_exchange(stream: &mut impl ReadWrite, request: &[u8]) -> Option<(i16, Vec<String>)> {
    if stream.write_all(request).and(stream.flush()).is_err() {
        return None;
    }
    let (bytes, _, _) = read_some(stream, MAX_READ);
    let size = usize::try_from(be_i32(&bytes, 0)?).ok()?;
    let frame = bytes.get(4..4usize.checked_add(size)?)?;
    let body = protocol::answer_body(frame, SASL_ID).ok()?;
    let (error, mechanisms) = protocol::decode_sasl_handshake(body).ok()?;
    Some((error.0, mechanisms))
}

fn api_versions() -> Vec<u8> {
    protocol::api_versions_request(API_VERSIONS_ID, CLIENT_ID).unwrap_or_default()
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Sends `request` and classifies the first bytes of the answer; the error text of a read
/// that failed otherwise than by a close or the deadline (a TLS alert).
fn exchange(stream: &mut impl ReadWrite, request: Vec<u8>, id: i32) -> (Answer, Option<String>) {
    if let Err(e) = stream.write_all(&request).and(stream.flush()) {
        let end = io_end(&e);
        let answer = plain_answer(&[], end.unwrap_or(ReadEnd::Closed), id);
        return (answer, end.is_none().then(|| e.to_string()));
    }
    let (bytes, end, error) = read_some(stream, 8);
    (plain_answer(&bytes, end, id), error)
}

/// Reads until `want` bytes (at most [`MAX_READ`]), a close, the deadline or an error.
fn read_some(stream: &mut impl Read, want: usize) -> (Vec<u8>, ReadEnd, Option<String>) {
    let want = want.min(MAX_READ);
    let mut buf = vec![0u8; MAX_READ];
    let mut got = 0usize;
    while got < want {
        match stream.read(&mut buf[got..]) {
            Ok(0) => return (buf[..got].to_vec(), ReadEnd::Closed, None),
            Ok(n) => got = got.saturating_add(n).min(MAX_READ),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let end = io_end(&e);
                let text = end.is_none().then(|| e.to_string());
                return (buf[..got].to_vec(), end.unwrap_or(ReadEnd::Closed), text);
            }
        }
    }
    (buf[..got].to_vec(), ReadEnd::Enough, None)
}

/// How an I/O error ended a read; `None` for other errors (a TLS alert's text tells more).
fn io_end(e: &std::io::Error) -> Option<ReadEnd> {
    use std::io::ErrorKind::*;
    match e.kind() {
        WouldBlock | TimedOut => Some(ReadEnd::Deadline),
        ConnectionReset | ConnectionAborted | UnexpectedEof | BrokenPipe | NotConnected => {
            Some(ReadEnd::Closed)
        }
        _ => None,
    }
}

/// A TLS stream and the watchdog that ends it at the deadline.
struct Tls {
    stream: SslStream<TcpStream>,
    _watchdog: Watchdog,
}

/// A TLS handshake with `tls`'s CA (none: the system's) and client certificate. `verify`
/// off only asks whether the peer speaks TLS at all.
fn tls_connect(peer: &Peer, tls: &TlsMaterial, verify: bool) -> Result<Tls, TlsEnd> {
    let (tcp, watchdog) = peer.connect().map_err(|c| match c {
        Class::NothingListening => TlsEnd::Closed,
        _ => TlsEnd::Deadline,
    })?;
    let connector = connector(tls, verify).map_err(|_| TlsEnd::Other)?;
    let config = connector
        .configure()
        .map_err(|_| TlsEnd::Other)?
        .verify_hostname(verify);
    match config.connect(peer.host, tcp) {
        Ok(stream) => Ok(Tls {
            stream,
            _watchdog: watchdog,
        }),
        Err(HandshakeError::Failure(mid)) => {
            let verify = mid.ssl().verify_result().as_raw();
            let error = mid.error();
            let text = match error.io_error() {
                Some(io) => format!("{error} {io}"),
                None if error.ssl_error().is_none() => format!("{error} eof"),
                None => error.to_string(),
            };
            Err(tls_failure(verify, &text))
        }
        Err(HandshakeError::WouldBlock(_)) => Err(TlsEnd::Deadline),
        Err(HandshakeError::SetupFailure(_)) => Err(TlsEnd::Other),
    }
}

fn connector(tls: &TlsMaterial, verify: bool) -> Result<SslConnector, openssl::error::ErrorStack> {
    let mut builder = SslConnector::builder(SslMethod::tls_client())?;
    if !verify {
        builder.set_verify(openssl::ssl::SslVerifyMode::NONE);
    }
    if let Some(pem) = &tls.ca_pem {
        let mut store = X509StoreBuilder::new()?;
        for cert in X509::stack_from_pem(pem.as_bytes())? {
            store.add_cert(cert)?;
        }
        builder.set_cert_store(store.build());
    }
    if let Some((cert, key)) = &tls.client {
        let mut chain = X509::stack_from_pem(cert.as_bytes())?.into_iter();
        if let Some(leaf) = chain.next() {
            builder.set_certificate(&leaf)?;
        }
        for extra in chain {
            builder.add_extra_chain_cert(extra)?;
        }
        let key = PKey::private_key_from_pem(key.as_bytes())?;
        builder.set_private_key(&key)?;
    }
    Ok(builder.build())
}

/// The host part of `host:port` (an IPv6 address without its brackets).
pub(super) fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Shuts a connection down at the deadline, so a peer that trickles bytes cannot hold the
/// diagnosis past it (socket timeouts bound each read, not their number). Dropping it
/// disarms it.
struct Watchdog {
    _disarm: mpsc::Sender<()>,
}

impl Watchdog {
    fn arm(tcp: &TcpStream, deadline: Instant) -> Self {
        let (disarm, disarmed) = mpsc::channel::<()>();
        if let Ok(socket) = tcp.try_clone() {
            // After the deadline: a read that times out by then tells "no answer", not a close.
            let wait = deadline.saturating_duration_since(Instant::now()) + WATCHDOG_GRACE;
            std::thread::spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = disarmed.recv_timeout(wait) {
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
            });
        }
        Watchdog { _disarm: disarm }
    }
}

#[cfg(test)]
#[path = "diagnose_tests.rs"]
mod tests;
