//! SASL/OAUTHBEARER with tokens from an OAuth 2 token endpoint (client credentials grant), as
//! librdkafka's `sasl.oauthbearer.method=oidc` gets them: the client id and secret in HTTP
//! Basic, `grant_type=client_credentials` and the scope in the form, the token from the
//! answer's `access_token`.
//!
//! The endpoint is a flow author's choice and may be hostile, so the HTTP client is small and
//! bounded: one HTTP/1.1 POST, https only (plain http only to a loopback host, and only where
//! the caller allows loopback), no host that resolves to a loopback or link-local address
//! unless allowed (the address checked is the one connected to), no redirects, an answer of at
//! most [`MAX_ANSWER`] bytes, a deadline for the whole exchange. Errors name the class of the
//! failure (an HTTP status, "not JSON"), never the answer's bytes, which could be anything the
//! endpoint reflects.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openssl::ssl::{SslConnector, SslMethod};

use crate::ConnError;

/// The largest token endpoint answer read (headers and body).
pub const MAX_ANSWER: usize = 64 * 1024;

/// OAuth client credentials and where to exchange them for a token.
#[derive(Clone)]
pub struct OAuth {
    pub token_endpoint: String,
    pub client_id: String,
    pub client_secret: String,
    pub scope: Option<String>,
    /// SASL extensions sent with the token (`key`, `value`).
    pub extensions: Vec<(String, String)>,
    /// Whether the endpoint may be `http://` on a loopback host, or resolve to a loopback or
    /// link-local address: a CLI run on the user's machine, a test world. Never for the
    /// shared operator unless its installer said so.
    pub allow_loopback: bool,
    /// The installer's bound on the addresses called (`None`: any not refused above).
    pub address_check: Option<crate::AddressCheck>,
    /// The token while it is fresh, shared by every connection of a cluster.
    token: Arc<Mutex<Option<(String, Instant)>>>,
}

impl OAuth {
    pub fn new(
        token_endpoint: String,
        client_id: String,
        client_secret: String,
        scope: Option<String>,
        extensions: Vec<(String, String)>,
        allow_loopback: bool,
    ) -> Self {
        OAuth {
            token_endpoint,
            client_id,
            client_secret,
            scope,
            extensions,
            allow_loopback,
            address_check: None,
            token: Arc::default(),
        }
    }

    /// The same client, calling only addresses `check` allows.
    pub fn with_address_check(mut self, check: Option<crate::AddressCheck>) -> Self {
        self.address_check = check;
        self
    }

    /// A token: the one fetched before while it is fresh (80 % of its lifetime), else a new
    /// one.
    pub fn token(&self, timeout: Duration) -> Result<String, ConnError> {
        self.token_for(timeout).map(|(token, _)| token)
    }

    /// [`Self::token`] and how long it stays fresh.
    pub fn token_for(&self, timeout: Duration) -> Result<(String, Duration), ConnError> {
        if let Ok(cached) = self.token.lock()
            && let Some((token, until)) = cached.as_ref()
            && let Some(left) = until.checked_duration_since(Instant::now())
            && !left.is_zero()
        {
            return Ok((token.clone(), left));
        }
        let (token, lifetime) = fetch_token(self, timeout)?;
        let fresh = lifetime.mul_f64(0.8);
        if let Ok(mut cached) = self.token.lock() {
            *cached = Some((token.clone(), Instant::now() + fresh));
        }
        Ok((token, fresh))
    }

    /// The SASL/OAUTHBEARER client message (RFC 7628) carrying `token`.
    pub fn client_message(&self, token: &str) -> Vec<u8> {
        let mut m = format!("n,,\x01auth=Bearer {token}\x01");
        for (k, v) in &self.extensions {
            m.push_str(&format!("{k}={v}\x01"));
        }
        m.push('\x01');
        m.into_bytes()
    }
}

impl std::fmt::Debug for OAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuth")
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

fn token_error(message: impl Into<String>) -> ConnError {
    ConnError::Token {
        message: message.into(),
    }
}

/// The parts of a token endpoint URL.
#[derive(Debug, PartialEq, Eq)]
struct Endpoint<'a> {
    tls: bool,
    host: &'a str,
    port: u16,
    /// `host[:port]` as written, for the Host header.
    authority: &'a str,
    path: &'a str,
}

fn parse_endpoint(url: &str) -> Result<Endpoint<'_>, ConnError> {
    let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        _ => return Err(token_error("the token endpoint URL is not http(s)")),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let path = path.split('#').next().unwrap_or_default();
    let path = if path.is_empty() { "/" } else { path };
    if authority.is_empty()
        || authority.contains('@')
        || !path.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(token_error(
            "the token endpoint URL has no usable host or path",
        ));
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| token_error("the token endpoint URL's host is not an address"))?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    let port = match port {
        None => {
            if tls {
                443
            } else {
                80
            }
        }
        Some(p) => p
            .parse()
            .map_err(|_| token_error("the token endpoint URL's port is not a port"))?,
    };
    Ok(Endpoint {
        tls,
        host,
        port,
        authority,
        path,
    })
}

/// Loopback, link-local or unspecified: the operator pod itself, the node's metadata service.
fn is_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            let mapped_local = v6
                .to_ipv4_mapped()
                .is_some_and(|v4| is_local(IpAddr::V4(v4)));
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || mapped_local
        }
    }
}

/// The address to connect to: the first the host resolves to, refused when it is local and
/// loopback is not allowed, or when plain http goes anywhere but loopback.
fn checked_address(endpoint: &Endpoint<'_>, oauth: &OAuth) -> Result<SocketAddr, ConnError> {
    let allow_loopback = oauth.allow_loopback;
    let address = (endpoint.host, endpoint.port)
        .to_socket_addrs()
        .map_err(|_| token_error("the token endpoint's host does not resolve"))?
        .next()
        .ok_or_else(|| token_error("the token endpoint's host does not resolve"))?;
    if let Some(check) = &oauth.address_check
        && check.check(address.ip()).is_err()
    {
        return Err(token_error(
            "the token endpoint resolves to an address the operator's installer does not let it reach",
        ));
    }
    let local = is_local(address.ip());
    if local && !allow_loopback {
        return Err(token_error(
            "the token endpoint resolves to a loopback or link-local address, which the operator does not call",
        ));
    }
    let plain_http_allowed = allow_loopback && address.ip().is_loopback();
    if !(endpoint.tls || plain_http_allowed) {
        return Err(token_error(
            "the token endpoint uses http://: only https is called (the client secret travels in the request)",
        ));
    }
    Ok(address)
}

/// One client credentials exchange: the token and its lifetime.
pub fn fetch_token(oauth: &OAuth, timeout: Duration) -> Result<(String, Duration), ConnError> {
    let deadline = Instant::now() + timeout;
    let endpoint = parse_endpoint(&oauth.token_endpoint)?;
    let address = checked_address(&endpoint, oauth)?;
    let unreachable = |_| token_error("the token endpoint cannot be reached");
    let tcp = TcpStream::connect_timeout(&address, timeout).map_err(unreachable)?;
    tcp.set_read_timeout(Some(timeout)).map_err(unreachable)?;
    tcp.set_write_timeout(Some(timeout)).map_err(unreachable)?;
    let request = request(oauth, &endpoint);
    let answer = if endpoint.tls {
        let connector = SslConnector::builder(SslMethod::tls_client())
            .map_err(|_| token_error("TLS is not available"))?
            .build();
        let mut tls = connector
            .connect(endpoint.host, tcp)
            .map_err(|_| token_error("TLS with the token endpoint failed (is its certificate trusted by the system CAs?)"))?;
        exchange(&mut tls, &request, deadline)?
    } else {
        let mut tcp = tcp;
        exchange(&mut tcp, &request, deadline)?
    };
    token_of(&answer)
}

fn request(oauth: &OAuth, endpoint: &Endpoint<'_>) -> Vec<u8> {
    let mut form = String::from("grant_type=client_credentials");
    if let Some(scope) = &oauth.scope {
        // The spec rules allow only characters a form carries as they are, and spaces.
        form.push_str("&scope=");
        form.push_str(&scope.replace(' ', "+"));
    }
    let basic = base64(format!("{}:{}", oauth.client_id, oauth.client_secret).as_bytes());
    format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nAuthorization: Basic {basic}\r\nContent-Type: application/x-www-form-urlencoded\r\nAccept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
        endpoint.path,
        endpoint.authority,
        form.len()
    )
    .into_bytes()
}

/// Sends `request` and reads the answer to its end (the endpoint closes the connection), at
/// most [`MAX_ANSWER`] bytes, by `deadline`.
fn exchange(
    stream: &mut (impl Read + Write),
    request: &[u8],
    deadline: Instant,
) -> Result<Vec<u8>, ConnError> {
    stream
        .write_all(request)
        .and_then(|()| stream.flush())
        .map_err(|_| token_error("the token endpoint cannot be reached"))?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if Instant::now() >= deadline {
            return Err(token_error("the token endpoint did not answer in time"));
        }
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // A TLS peer that closes without close_notify ends the answer too.
            Err(_) if !answer.is_empty() => 0,
            Err(_) => return Err(token_error("the token endpoint did not answer")),
        };
        if n == 0 {
            return Ok(answer);
        }
        if answer.len() + n > MAX_ANSWER {
            return Err(token_error(format!(
                "the token endpoint's answer is larger than {MAX_ANSWER} bytes"
            )));
        }
        answer.extend_from_slice(&chunk[..n]);
    }
}

/// The token and its lifetime from an HTTP answer.
fn token_of(answer: &[u8]) -> Result<(String, Duration), ConnError> {
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| token_error("the token endpoint's answer is not HTTP"))?;
    let (head, body) = (&answer[..split], &answer[split + 4..]);
    let head = std::str::from_utf8(head)
        .map_err(|_| token_error("the token endpoint's answer is not HTTP"))?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.strip_prefix("HTTP/1."))
        .and_then(|l| l.get(2..5))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| token_error("the token endpoint's answer is not HTTP"))?;
    if status != 200 {
        // The body stays out: it is whatever the endpoint chose to reflect. Only an RFC 6749
        // error code it names, from a fixed list, is told.
        let code = oauth_error_code(body)
            .map(|c| format!(" ({c})"))
            .unwrap_or_default();
        return Err(token_error(format!(
            "the token endpoint answered {status}{code}"
        )));
    }
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    let json: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|_| token_error("the token endpoint's answer is not JSON"))?;
    let token = json
        .get("access_token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_graphic()))
        .ok_or_else(|| token_error("the token endpoint's answer has no access_token"))?;
    let lifetime = json
        .get("expires_in")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(300)
        .clamp(10, 24 * 3600);
    Ok((token.to_owned(), Duration::from_secs(lifetime)))
}

/// The error codes of a refused token request (RFC 6749 section 5.2).
const OAUTH_ERRORS: [&str; 6] = [
    "invalid_request",
    "invalid_client",
    "invalid_grant",
    "unauthorized_client",
    "unsupported_grant_type",
    "invalid_scope",
];

/// The `error` an error answer's JSON body names, when it is one of [`OAUTH_ERRORS`].
fn oauth_error_code(body: &[u8]) -> Option<&'static str> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let code = json.get("error")?.as_str()?;
    OAUTH_ERRORS.into_iter().find(|c| *c == code)
}

/// A chunked body (`size CRLF data CRLF`... `0 CRLF`), every size checked against what is left.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, ConnError> {
    let bad = || token_error("the token endpoint's chunked answer is malformed");
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").ok_or_else(bad)?;
        let size = std::str::from_utf8(&body[..line_end]).map_err(|_| bad())?;
        let size = size.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| bad())?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let data = body.get(..size).ok_or_else(bad)?;
        out.extend_from_slice(data);
        body = body.get(size + 2..).ok_or_else(bad)?;
    }
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
