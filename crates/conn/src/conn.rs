//! One blocking connection to one broker.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mirrorflow_core::protocol::{self, ApiRange, ErrorCode};
use openssl::pkey::PKey;
use openssl::ssl::{SslConnector, SslMethod, SslStream};
use openssl::x509::X509;
use openssl::x509::store::X509StoreBuilder;

use crate::scram::Scram;
use crate::{ConnError, Sasl, Security, Tls};

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(0);

/// What every connection of a client shares.
#[derive(Debug, Clone)]
pub struct Options {
    pub client_id: String,
    /// For connecting, and for each read and write.
    pub timeout: Duration,
    /// The largest answer frame read (a fetch's `max_bytes` and its framing, with room).
    pub max_frame: usize,
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
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
    /// For requests a connection makes on the side (an OAuth token).
    timeout: Duration,
    next_correlation: i32,
    served: Vec<ApiRange>,
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
        let tcp = TcpStream::connect_timeout(&socket, options.timeout).map_err(io)?;
        tcp.set_nodelay(true).map_err(io)?;
        tcp.set_read_timeout(Some(options.timeout)).map_err(io)?;
        tcp.set_write_timeout(Some(options.timeout)).map_err(io)?;
        let stream = match &security.tls {
            None => Stream::Plain(tcp),
            Some(tls) => Stream::Tls(Box::new(handshake(addr, tls, tcp)?)),
        };
        let mut conn = Conn {
            stream,
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            peer,
            client_id: options.client_id.clone(),
            max_frame: options.max_frame,
            timeout: options.timeout,
            next_correlation: 0,
            served: Vec::new(),
        };
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

    pub fn serial(&self) -> u64 {
        self.serial
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

    pub fn send(&mut self, frame: &[u8]) -> Result<(), ConnError> {
        self.stream
            .write_all(frame)
            .and_then(|()| self.stream.flush())
            .map_err(|source| ConnError::Io {
                peer: self.peer.clone(),
                source,
            })
    }

    /// Reads the next answer's body, which must answer request `id` (a broker answers a
    /// connection's requests in order).
    pub fn recv(&mut self, id: i32) -> Result<Vec<u8>, ConnError> {
        let io = |peer: &str, source| ConnError::Io {
            peer: peer.to_owned(),
            source,
        };
        let mut size = [0u8; 4];
        self.stream
            .read_exact(&mut size)
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
        let mut frame = vec![0u8; len];
        self.stream
            .read_exact(&mut frame)
            .map_err(|e| io(&self.peer, e))?;
        let body_len = protocol::answer_body(&frame, id)
            .map_err(|e| self.decode(e))?
            .len();
        frame.drain(..len - body_len);
        Ok(frame)
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

    /// One SaslAuthenticate round: the broker's answer bytes.
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
        Ok(answer.auth_bytes.to_vec())
    }
}

/// The host part of `host:port` (an IPv6 address without its brackets).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

fn handshake(addr: &str, tls: &Tls, tcp: TcpStream) -> Result<SslStream<TcpStream>, ConnError> {
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
    use super::host_of;

    #[test]
    fn the_host_of_an_address() {
        assert_eq!(host_of("broker-1.kafka:9093"), "broker-1.kafka");
        assert_eq!(host_of("127.0.0.1:29094"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9092"), "::1");
    }
}
