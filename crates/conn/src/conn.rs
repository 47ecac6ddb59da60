//! One blocking connection to one broker.

use std::net::{IpAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mirrorflow_core::protocol::{self, ApiRange, ErrorCode};
use openssl::pkey::PKey;
use openssl::ssl::{SslConnector, SslMethod, SslStream};
use openssl::x509::X509;
use openssl::x509::store::X509StoreBuilder;

use crate::scram::Scram;
pub use crate::stream::Duplex;
use crate::stream::{Stream, Timed};
use crate::{ConnError, Sasl, Security, Tls};

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(0);

/// The first read of an answer's frame; later reads double what was read.
const FIRST_READ: usize = 64 * 1024;

/// What every connection of a client shares.
#[derive(Debug, Clone)]
pub struct Options {
    pub client_id: String,
    /// For connecting, and for each request: sending it, and reading its answer, each end to
    /// end (a broker that trickles an answer byte by byte does not hold a connection longer).
    pub timeout: Duration,
    /// The largest answer frame read (a fetch's `max_bytes` and its framing, with room).
    pub max_frame: usize,
    /// Whether a resolved address may be connected to (`None`: any). Checked on the very
    /// address connected to, so a broker named in a metadata answer, or a name that resolves
    /// elsewhere the next time, is held to it as well as the bootstrap servers.
    pub address_check: Option<AddressCheck>,
}

/// Decides whether an address may be connected to; `Err` says why not.
#[derive(Clone)]
pub struct AddressCheck(Arc<dyn Fn(IpAddr) -> Result<(), String> + Send + Sync>);

impl AddressCheck {
    pub fn new(check: impl Fn(IpAddr) -> Result<(), String> + Send + Sync + 'static) -> Self {
        AddressCheck(Arc::new(check))
    }

    pub fn check(&self, addr: IpAddr) -> Result<(), String> {
        (self.0)(addr)
    }
}

impl std::fmt::Debug for AddressCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AddressCheck")
    }
}

/// A connection, authenticated when the cluster asks for it, that knows the versions its
/// broker serves.
pub struct Conn {
    stream: Stream,
    /// Unique among the process's connections: a caller that sent a request on one
    /// connection can tell it from a newer one to the same broker.
    serial: u64,
    peer: String,
    client_id: String,
    max_frame: usize,
    /// Each request's sending, and each answer's reading, end to end; also for requests a
    /// connection makes on the side (an OAuth token).
    timeout: Duration,
    next_correlation: i32,
    served: Vec<ApiRange>,
    /// When to stop using the connection because its authenticated session ends (KIP-368:
    /// the broker closes a connection whose session expired at its next request); none when
    /// the broker set no end.
    renew_at: Option<Instant>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("peer", &self.peer).finish()
    }
}

impl Conn {
    /// Connects to `addr` (`host:port`), with TLS and SASL as `security` says, and reads the
    /// versions the broker serves.
    pub fn open(addr: &str, security: &Security, options: &Options) -> Result<Self, ConnError> {
        let peer = addr.to_owned();
        let io = |source| ConnError::Io {
            peer: peer.clone(),
            source,
        };
        let socket = addr.to_socket_addrs().map_err(io)?.next().ok_or_else(|| {
            io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the name resolves to no address",
            ))
        })?;
        if let Some(check) = &options.address_check {
            check
                .check(socket.ip())
                .map_err(|why| ConnError::AddressRefused {
                    peer: peer.clone(),
                    why,
                })?;
        }
        let tcp = TcpStream::connect_timeout(&socket, options.timeout).map_err(io)?;
        tcp.set_nodelay(true).map_err(io)?;
        // The TLS handshake, like each request, ends by the timeout.
        let tcp = Timed {
            tcp,
            deadline: Instant::now() + options.timeout,
        };
        let stream = match &security.tls {
            None => Stream::Plain(tcp),
            Some(tls) => Stream::Tls(Box::new(handshake(addr, tls, tcp)?)),
        };
        let mut conn = Conn::with_stream(stream, peer, options);
        let id = conn.correlation();
        let frame = protocol::api_versions_request(id, &conn.client_id)?;
        let body = conn.call(id, &frame)?;
        let (error, served) = protocol::decode_api_versions(&body).map_err(|e| conn.decode(e))?;
        conn.check("ApiVersions", error, "")?;
        conn.served = served;
        if let Some(sasl) = &security.sasl {
            conn.authenticate(sasl)?;
        }
        Ok(conn)
    }

    fn with_stream(stream: Stream, peer: String, options: &Options) -> Self {
        Conn {
            stream,
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            peer,
            client_id: options.client_id.clone(),
            max_frame: options.max_frame,
            timeout: options.timeout,
            next_correlation: 0,
            served: Vec::new(),
            renew_at: None,
        }
    }

    /// A connection over a stream opened elsewhere (in tests and fuzzing: bytes in memory),
    /// named `peer`, without the versions exchange: it serves no API until told otherwise. The
    /// request timeout is checked between the stream's reads and writes; a read that blocks is
    /// the stream's to end.
    pub fn over(peer: &str, stream: impl Duplex + 'static, options: &Options) -> Self {
        Conn::with_stream(Stream::Other(Box::new(stream)), peer.to_owned(), options)
    }

    /// A connection over a socket opened elsewhere (in tests: a broker on loopback played by
    /// the test), without the versions exchange, like [`Self::over`], but with the request
    /// timeout on each read and write and [`Self::answer_waiting`] answered by the socket.
    #[cfg(test)]
    pub(crate) fn over_tcp(peer: &str, tcp: TcpStream, options: &Options) -> Self {
        let timed = Timed {
            tcp,
            deadline: Instant::now() + options.timeout,
        };
        Conn::with_stream(Stream::Plain(timed), peer.to_owned(), options)
    }

    /// Whether an answer has begun to arrive, after waiting at most `wait` (`ZERO`: a look).
    /// Lets a caller with requests out on several connections read the one that answers
    /// first instead of blocking on the oldest. A connection over another kind of stream
    /// always says yes.
    pub fn answer_waiting(&mut self, wait: Duration) -> Result<bool, ConnError> {
        self.stream.readable(wait).map_err(|source| ConnError::Io {
            peer: self.peer.clone(),
            source,
        })
    }

    /// How long a request's sending, or its answer's reading, may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Takes the broker to serve `version` of `api` (in tests: a connection [`Self::over`]
    /// bytes, which has had no versions exchange).
    #[cfg(test)]
    pub(crate) fn serve(&mut self, api: i16, version: i16) {
        self.served.push(ApiRange {
            api,
            min: version,
            max: version,
        });
    }

    /// The time by which a request started now is to be sent, or its answer read.
    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// Whether the authenticated session is close to its end: a caller with nothing
    /// outstanding on the connection drops it for a new one (a new token), instead of a
    /// request meeting the broker's close.
    pub fn session_ending(&self) -> bool {
        self.renew_at.is_some_and(|at| Instant::now() >= at)
    }

    /// Notes the session lifetime the broker gave at authentication: renewed a tenth of it
    /// (at least a second, at most a minute) before it ends.
    pub(crate) fn session_lasts(&mut self, lifetime_ms: i64) {
        let Ok(ms) = u64::try_from(lifetime_ms) else {
            return;
        };
        if ms == 0 {
            return;
        }
        let lifetime = Duration::from_millis(ms);
        let margin = (lifetime / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
        self.renew_at = Instant::now().checked_add(lifetime.saturating_sub(margin));
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Fails unless the broker serves `version` of `api`.
    pub fn require(&self, api: i16, name: &'static str, version: i16) -> Result<(), ConnError> {
        let served = self
            .served
            .iter()
            .any(|r| r.api == api && (r.min..=r.max).contains(&version));
        if served {
            Ok(())
        } else {
            Err(ConnError::Unsupported {
                peer: self.peer.clone(),
                api: name,
                version,
            })
        }
    }

    /// The correlation id of the next request.
    pub fn correlation(&mut self) -> i32 {
        let id = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        id
    }

    /// Sends `frame`, within the request timeout.
    pub fn send(&mut self, frame: &[u8]) -> Result<(), ConnError> {
        let deadline = self.deadline();
        self.stream
            .write_all_by(frame, deadline)
            .map_err(|source| ConnError::Io {
                peer: self.peer.clone(),
                source,
            })
    }

    /// Reads the next answer's body, which must answer request `id` (a broker answers a
    /// connection's requests in order), within the request timeout from the first byte read
    /// to the last.
    pub fn recv(&mut self, id: i32) -> Result<Vec<u8>, ConnError> {
        let deadline = self.deadline();
        let io = |peer: &str, source| ConnError::Io {
            peer: peer.to_owned(),
            source,
        };
        let mut size = [0u8; 4];
        self.stream
            .read_exact_by(&mut size, deadline)
            .map_err(|e| io(&self.peer, e))?;
        let size = i32::from_be_bytes(size);
        let len = usize::try_from(size)
            .ok()
            .filter(|&n| (4..=self.max_frame).contains(&n))
            .ok_or_else(|| ConnError::FrameSize {
                peer: self.peer.clone(),
                size: i64::from(size),
                max: self.max_frame,
            })?;
        // The header (the correlation id) read on its own, so the body is read where it stays:
        // dropping a header in front of a fetch answer of many MiB would move all of it.
        let mut header = [0u8; 4];
        self.stream
            .read_exact_by(&mut header, deadline)
            .map_err(|e| io(&self.peer, e))?;
        protocol::answer_body(&header, id).map_err(|e| self.decode(e))?;
        let len = len - header.len();
        // Grown as bytes come (doubling), not allocated whole at the size the broker claims.
        let mut body = Vec::new();
        while body.len() < len {
            let at = body.len();
            body.resize(at + (len - at).min(at.max(FIRST_READ)), 0);
            self.stream
                .read_exact_by(&mut body[at..], deadline)
                .map_err(|e| io(&self.peer, e))?;
        }
        Ok(body)
    }

    /// Sends `frame` (request `id`) and reads its answer.
    pub fn call(&mut self, id: i32, frame: &[u8]) -> Result<Vec<u8>, ConnError> {
        self.send(frame)?;
        self.recv(id)
    }

    /// Sends the request `build` writes for the next correlation id and decodes its answer
    /// into something that outlives the answer's bytes.
    pub fn ask<T>(
        &mut self,
        build: impl FnOnce(i32, &str) -> Result<Vec<u8>, mirrorflow_core::EncodeError>,
        decode: impl FnOnce(&[u8]) -> Result<T, mirrorflow_core::DecodeError>,
    ) -> Result<T, ConnError> {
        let id = self.correlation();
        let frame = build(id, &self.client_id)?;
        let body = self.call(id, &frame)?;
        decode(&body).map_err(|e| self.decode(e))
    }

    /// An answer that could not be read.
    pub fn decode(&self, source: mirrorflow_core::DecodeError) -> ConnError {
        ConnError::Decode {
            peer: self.peer.clone(),
            source,
        }
    }

    /// An error code of `api`'s answer, as an error.
    pub fn check(
        &self,
        api: &'static str,
        error: ErrorCode,
        message: &str,
    ) -> Result<(), ConnError> {
        if error.is_error() {
            return Err(ConnError::Broker {
                peer: self.peer.clone(),
                api,
                error,
                message: message.to_owned(),
            });
        }
        Ok(())
    }

    fn authenticate(&mut self, sasl: &Sasl) -> Result<(), ConnError> {
        self.require(
            protocol::API_SASL_HANDSHAKE,
            "SaslHandshake",
            protocol::SASL_HANDSHAKE_VERSION,
        )?;
        let mechanism = sasl.mechanism();
        let id = self.correlation();
        let frame = protocol::sasl_handshake_request(id, &self.client_id, mechanism)?;
        let body = self.call(id, &frame)?;
        let (error, enabled) =
            protocol::decode_sasl_handshake(&body).map_err(|e| self.decode(e))?;
        self.check(
            "SaslHandshake",
            error,
            &format!(
                "{mechanism} asked, the broker enables {}",
                enabled.join(", ")
            ),
        )?;
        match sasl {
            Sasl::Plain { user, password } => {
                let mut message = Vec::with_capacity(user.len() + password.len() + 2);
                message.push(0);
                message.extend_from_slice(user.as_bytes());
                message.push(0);
                message.extend_from_slice(password.as_bytes());
                self.sasl_step(&message)?;
            }
            Sasl::Scram {
                hash,
                user,
                password,
            } => {
                let mut scram = Scram::new(*hash, user, password, Scram::nonce()?);
                let server_first = self.sasl_step(scram.client_first().as_bytes())?;
                let client_final = scram.client_final(&server_first)?;
                let server_final = self.sasl_step(client_final.as_bytes())?;
                scram.verify_server_final(&server_final)?;
            }
            Sasl::OAuthBearer(oauth) => {
                let token = oauth.token(self.timeout)?;
                self.sasl_step(&oauth.client_message(&token))?;
            }
        }
        Ok(())
    }

    /// One SaslAuthenticate round: the broker's answer bytes (the last round's session
    /// lifetime is the session's).
    fn sasl_step(&mut self, message: &[u8]) -> Result<Vec<u8>, ConnError> {
        let id = self.correlation();
        let frame = protocol::sasl_authenticate_request(id, &self.client_id, message)?;
        let body = self.call(id, &frame)?;
        let answer = protocol::decode_sasl_authenticate(&body).map_err(|e| self.decode(e))?;
        if answer.error.is_error() {
            return Err(ConnError::Authentication {
                message: format!("{}: {} {}", self.peer, answer.error, answer.message),
            });
        }
        self.session_lasts(answer.session_lifetime_ms);
        Ok(answer.auth_bytes.to_vec())
    }
}

/// The host part of `host:port` (an IPv6 address without its brackets).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

fn handshake(addr: &str, tls: &Tls, tcp: Timed) -> Result<SslStream<Timed>, ConnError> {
    let err = |message: String| ConnError::Tls {
        peer: addr.to_owned(),
        message,
    };
    let mut builder =
        SslConnector::builder(SslMethod::tls_client()).map_err(|e| err(e.to_string()))?;
    if let Some(pem) = &tls.ca_pem {
        // Only these CAs: a flow that names its CA does not also trust every system CA.
        let certs = X509::stack_from_pem(pem.as_bytes())
            .map_err(|e| err(format!("the CA certificates cannot be read: {e}")))?;
        if certs.is_empty() {
            return Err(err("the CA PEM holds no certificate".into()));
        }
        let mut store = X509StoreBuilder::new().map_err(|e| err(e.to_string()))?;
        for cert in certs {
            store.add_cert(cert).map_err(|e| err(e.to_string()))?;
        }
        builder.set_cert_store(store.build());
    }
    if let Some((cert_pem, key_pem)) = &tls.client {
        let chain = X509::stack_from_pem(cert_pem.as_bytes())
            .map_err(|e| err(format!("the client certificate cannot be read: {e}")))?;
        let mut chain = chain.into_iter();
        let leaf = chain
            .next()
            .ok_or_else(|| err("the client certificate PEM holds no certificate".into()))?;
        builder
            .set_certificate(&leaf)
            .map_err(|e| err(e.to_string()))?;
        for extra in chain {
            builder
                .add_extra_chain_cert(extra)
                .map_err(|e| err(e.to_string()))?;
        }
        let key = PKey::private_key_from_pem(key_pem.as_bytes())
            .map_err(|e| err(format!("the client key cannot be read: {e}")))?;
        builder
            .set_private_key(&key)
            .and_then(|()| builder.check_private_key())
            .map_err(|e| {
                err(format!(
                    "the client key does not match its certificate: {e}"
                ))
            })?;
    }
    let connector = builder.build();
    let config = connector
        .configure()
        .map_err(|e| err(e.to_string()))?
        .verify_hostname(tls.verify_hostname);
    config
        .connect(host_of(addr), tcp)
        .map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{IpAddr, TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use super::{AddressCheck, Conn, Options, Stream, Timed, host_of};
    use crate::ConnError;

    fn options(timeout: Duration) -> Options {
        Options {
            client_id: "mf".into(),
            timeout,
            max_frame: 1 << 20,
            address_check: None,
        }
    }

    /// A broker that reads the request (or TLS hello), then sends `head` and 1000 zeros one byte
    /// every `every`, until the client hangs up or all are sent.
    fn trickling_broker(head: Vec<u8>, every: Duration) -> (String, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
        let addr = listener.local_addr().expect("its address").to_string();
        let broker = std::thread::spawn(move || {
            let Ok((mut socket, _)) = listener.accept() else {
                return;
            };
            let mut request = [0u8; 256];
            let _ = socket.read(&mut request);
            let mut answer = head;
            answer.extend_from_slice(&[0; 1000]);
            for byte in answer {
                if socket.write_all(&[byte]).is_err() {
                    return;
                }
                std::thread::sleep(every);
            }
        });
        (addr, broker)
    }

    /// N12: an address the installer does not allow is never connected to; the check sees
    /// the resolved address, so a name is held to it as well as an address.
    #[test]
    fn a_refused_address_is_not_connected_to() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("its address").port();
        let mut refusing = options(Duration::from_secs(2));
        refusing.address_check = Some(AddressCheck::new(|ip: IpAddr| {
            if ip.is_loopback() {
                Err(format!("{ip} is in 127.0.0.0/8"))
            } else {
                Ok(())
            }
        }));
        for addr in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
            match Conn::open(&addr, &crate::Security::default(), &refusing) {
                Err(ConnError::AddressRefused { peer, why }) => {
                    assert_eq!(peer, addr);
                    assert!(why.contains("127.0.0.0/8"), "{why}");
                }
                other => panic!("{addr}: expected a refusal, got {other:?}"),
            }
        }
        assert!(
            listener.accept().is_err(),
            "nothing connected to the refused address"
        );
    }

    /// N14: each byte comes well within the read timeout, but the answer as a whole does not
    /// come within the request timeout: the read ends at that timeout, as a timeout.
    #[test]
    fn a_broker_trickling_an_answer_is_cut_off_at_the_request_timeout() {
        let (addr, broker) =
            trickling_broker(1000i32.to_be_bytes().to_vec(), Duration::from_millis(20));
        let timeout = Duration::from_millis(400);
        let started = Instant::now();
        let outcome = Conn::open(&addr, &crate::Security::default(), &options(timeout));
        let elapsed = started.elapsed();
        match outcome {
            Err(ConnError::Io { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::TimedOut, "{source}")
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        // 1000 bytes at 20 ms would take 20 s; the request timeout is 0.4 s.
        assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
        assert!(elapsed >= timeout, "ended before the timeout: {elapsed:?}");
        broker
            .join()
            .expect("the broker thread ends once the client hangs up");
    }

    /// A TLS "server" that announces a 16 KiB handshake record and trickles it: the handshake
    /// ends at the timeout too.
    #[test]
    fn a_broker_trickling_its_tls_handshake_is_cut_off_at_the_timeout() {
        let record_header = vec![0x16, 0x03, 0x03, 0x40, 0x00];
        let (addr, broker) = trickling_broker(record_header, Duration::from_millis(20));
        let security = crate::Security {
            tls: Some(crate::Tls::default()),
            sasl: None,
        };
        let timeout = Duration::from_millis(400);
        let started = Instant::now();
        let outcome = Conn::open(&addr, &security, &options(timeout));
        let elapsed = started.elapsed();
        assert!(
            matches!(outcome, Err(ConnError::Tls { .. })),
            "expected a failed handshake, got {outcome:?}"
        );
        assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
        broker
            .join()
            .expect("the broker thread ends once the client hangs up");
    }

    /// The deadline is the request's, not the connection's: a new request has its own.
    #[test]
    fn each_answer_has_its_own_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
        let addr = listener.local_addr().expect("its address");
        let broker = std::thread::spawn(move || {
            let Ok((mut socket, _)) = listener.accept() else {
                return;
            };
            for id in 0..3i32 {
                std::thread::sleep(Duration::from_millis(150));
                let mut frame = 6i32.to_be_bytes().to_vec();
                frame.extend_from_slice(&id.to_be_bytes());
                frame.extend_from_slice(&[7, 7]);
                if socket.write_all(&frame).is_err() {
                    return;
                }
            }
        });
        let tcp = TcpStream::connect(addr).expect("connected");
        let tcp = Timed {
            tcp,
            deadline: Instant::now(),
        };
        let mut conn = Conn::with_stream(
            Stream::Plain(tcp),
            "local".into(),
            &options(Duration::from_millis(300)),
        );
        // 450 ms in all, more than one timeout, each answer within it.
        for id in 0..3 {
            assert_eq!(conn.recv(id).expect("an answer in time"), vec![7, 7]);
        }
        broker.join().expect("the broker thread ends");
    }

    fn frame(correlation: i32, body: &[u8]) -> Vec<u8> {
        let size = i32::try_from(body.len() + 4).unwrap_or(i32::MAX);
        let mut f = size.to_be_bytes().to_vec();
        f.extend_from_slice(&correlation.to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    fn over(bytes: Vec<u8>) -> Conn {
        Conn::over(
            "memory",
            std::io::Cursor::new(bytes),
            &options(Duration::from_secs(5)),
        )
    }

    #[test]
    fn hostile_answer_frames_are_errors() {
        // A size past the frame limit, negative, or too small for a correlation id.
        for size in [i32::MAX, (1 << 20) + 1, -1, i32::MIN, 0, 3] {
            let mut conn = over(size.to_be_bytes().to_vec());
            assert!(
                matches!(conn.recv(0), Err(ConnError::FrameSize { .. })),
                "size {size}"
            );
        }
        // Another request's answer.
        let mut conn = over(frame(5, b"body"));
        assert!(matches!(conn.recv(4), Err(ConnError::Decode { .. })));
        // Cut short: in the size, and in the frame (a claimed 1 MiB that never comes).
        for bytes in [vec![0, 0], frame(0, b"body")[..7].to_vec(), {
            let mut f = (1i32 << 20).to_be_bytes().to_vec();
            f.extend_from_slice(&[0; 100]);
            f
        }] {
            let mut conn = over(bytes);
            match conn.recv(0) {
                Err(ConnError::Io { source, .. }) => {
                    assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof)
                }
                other => panic!("expected the end of the stream, got {other:?}"),
            }
        }
        // Answers read in order, each its own body.
        let mut conn = over([frame(0, b"a"), frame(1, b""), frame(2, b"ccc")].concat());
        assert_eq!(conn.recv(0).expect("first"), b"a");
        assert_eq!(conn.recv(1).expect("second"), b"");
        assert_eq!(conn.recv(2).expect("third"), b"ccc");
    }

    #[test]
    fn the_host_of_an_address() {
        assert_eq!(host_of("broker-1.kafka:9093"), "broker-1.kafka");
        assert_eq!(host_of("127.0.0.1:29094"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9092"), "::1");
    }
}
