//! What a diagnosis decides from the bytes it read, and how it is told: pure functions of
//! what was read, table-tested in `diagnose_tests.rs`.

use super::{MAX_PLAUSIBLE_FRAME, host_of};
use crate::status::reason;

/// What a listener is, as far as the spec's connection is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Class {
    /// The host name does not resolve.
    Unresolved,
    /// Connection refused.
    NothingListening,
    /// The connection attempt timed out: filtered, or the host is down.
    NoAnswer,
    /// The connection was accepted but nothing answered a Kafka request.
    Silent,
    /// We spoke plaintext; the listener speaks TLS.
    TlsExpected,
    /// We spoke TLS; the listener speaks Kafka without it.
    PlaintextExpected,
    /// The listener answers, but not as Kafka.
    NotKafka(Foreign),
    /// The broker's certificate is not signed by a CA the client trusts.
    CertificateUntrusted,
    /// The broker's certificate does not name the host connected to.
    HostnameMismatch,
    /// The broker's certificate, or a CA certificate of its chain, is outside its validity
    /// period (`expired`: past it; otherwise not valid yet, a clock that is wrong).
    CertificateOutOfDate { expired: bool },
    /// The broker refused the client certificate because it expired.
    ClientCertificateExpired,
    /// The broker refused the client certificate, or wants one and none was given.
    CertificateRefused,
    /// The listener requires SASL (it enables these mechanisms); the spec has none.
    SaslExpected(Vec<String>),
    /// The spec has SASL; the listener does not use it.
    SaslNotEnabled,
    /// The listener does not enable the spec's mechanism; it enables these.
    MechanismNotEnabled { asked: String, enabled: Vec<String> },
    /// A Kafka listener that speaks what the spec says: the connection is not the problem.
    Kafka,
}

/// What a listener that is not Kafka's seems to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Foreign {
    Http,
    Ssh,
    /// A service that greets or answers with a line of text (SMTP, Redis, ...).
    Text,
    /// Bytes that are no Kafka answer, or a close without any.
    Unknown,
}

impl Foreign {
    fn what(self) -> &'static str {
        match self {
            Foreign::Http => "an HTTP server",
            Foreign::Ssh => "an SSH server",
            Foreign::Text => "a service that answers with text",
            Foreign::Unknown => "a service that closes the connection or speaks another protocol",
        }
    }
}

/// The class found at one bootstrap address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnosis {
    pub address: String,
    pub class: Class,
}

/// How a read of an answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadEnd {
    /// The peer closed (or reset) the connection.
    Closed,
    /// Nothing more within the deadline.
    Deadline,
    /// Enough bytes were read.
    Enough,
}

/// What the first bytes answered to a plaintext Kafka request tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A frame answering the request: a Kafka broker.
    Kafka,
    /// A TLS record (a handshake or an alert): the listener speaks TLS.
    Tls,
    Foreign(Foreign),
    /// Closed without a byte.
    Closed,
    /// Nothing within the deadline.
    Silent,
}

/// Classifies the first bytes read after sending a Kafka request with correlation id `id`.
pub fn plain_answer(bytes: &[u8], end: ReadEnd, id: i32) -> Answer {
    if bytes.is_empty() {
        return match end {
            ReadEnd::Deadline => Answer::Silent,
            ReadEnd::Closed | ReadEnd::Enough => Answer::Closed,
        };
    }
    // A TLS record: content type alert (21) or handshake (22), then major version 3.
    if bytes.len() >= 2 && matches!(bytes[0], 0x15 | 0x16) && bytes[1] == 0x03 {
        return Answer::Tls;
    }
    let starts = |prefix: &[u8]| {
        bytes.len() >= prefix.len() && bytes[..prefix.len()].eq_ignore_ascii_case(prefix)
    };
    if starts(b"HTTP/") || starts(b"<!DOCTYPE") || starts(b"<html") {
        return Answer::Foreign(Foreign::Http);
    }
    if starts(b"SSH-") {
        return Answer::Foreign(Foreign::Ssh);
    }
    if let (Some(size), Some(correlation)) = (be_i32(bytes, 0), be_i32(bytes, 4))
        && (4..=MAX_PLAUSIBLE_FRAME).contains(&size)
        && correlation == id
    {
        return Answer::Kafka;
    }
    let text = bytes
        .iter()
        .take(64)
        .all(|b| b.is_ascii_graphic() || matches!(b, b' ' | b'\r' | b'\n' | b'\t'));
    Answer::Foreign(if text {
        Foreign::Text
    } else {
        Foreign::Unknown
    })
}

pub(super) fn be_i32(bytes: &[u8], at: usize) -> Option<i32> {
    let four: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(i32::from_be_bytes(four))
}

/// Why a TLS handshake (or the first read after it) failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsEnd {
    /// The peer answered the ClientHello with something that is not TLS.
    NotTls,
    Untrusted,
    HostnameMismatch,
    /// A certificate of the broker's chain is past (`true`) or before its validity period.
    OutOfDate(bool),
    /// The broker refused the client certificate (a TLS alert).
    CertificateRefused,
    /// The broker refused the client certificate as expired (a TLS alert).
    ClientCertificateExpired,
    Closed,
    Deadline,
    Other,
}

impl TlsEnd {
    /// The class of a broker's refusal of the client certificate, `None` for any other end:
    /// such a refusal also tells that the listener is Kafka's (mTLS) and wants a certificate.
    pub fn client_refusal(self) -> Option<Class> {
        match self {
            TlsEnd::CertificateRefused => Some(Class::CertificateRefused),
            TlsEnd::ClientCertificateExpired => Some(Class::ClientCertificateExpired),
            _ => None,
        }
    }
}

/// OpenSSL's verify result for a certificate that does not name the host.
const X509_V_ERR_HOSTNAME_MISMATCH: i32 = 62;
const X509_V_ERR_IP_ADDRESS_MISMATCH: i32 = 64;
/// OpenSSL's verify results for a certificate outside its validity period.
const X509_V_ERR_CERT_NOT_YET_VALID: i32 = 9;
const X509_V_ERR_CERT_HAS_EXPIRED: i32 = 10;

/// Classifies a failed TLS handshake from OpenSSL's verify result (`verify`, 0 when the
/// certificate was accepted or not yet seen) and its error text.
pub fn tls_failure(verify: i32, text: &str) -> TlsEnd {
    let text = text.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if matches!(
        verify,
        X509_V_ERR_HOSTNAME_MISMATCH | X509_V_ERR_IP_ADDRESS_MISMATCH
    ) || has(&["hostname mismatch", "ip address mismatch"])
    {
        TlsEnd::HostnameMismatch
    } else if verify == X509_V_ERR_CERT_HAS_EXPIRED || has(&["certificate has expired"]) {
        TlsEnd::OutOfDate(true)
    } else if verify == X509_V_ERR_CERT_NOT_YET_VALID || has(&["certificate is not yet valid"]) {
        TlsEnd::OutOfDate(false)
    } else if verify != 0 || has(&["certificate verify failed"]) {
        TlsEnd::Untrusted
    } else if has(&["alert certificate expired"]) {
        TlsEnd::ClientCertificateExpired
    } else if has(&[
        "alert bad certificate",
        "alert certificate required",
        "alert unknown ca",
        "alert certificate unknown",
        "alert handshake failure",
    ]) {
        TlsEnd::CertificateRefused
    } else if has(&[
        "wrong version number",
        "packet length too long",
        "unknown protocol",
        "http request",
        "record layer failure",
        "record overflow",
        "ssl3_get_record",
    ]) {
        TlsEnd::NotTls
    } else if has(&["timed out", "would block", "temporarily unavailable"]) {
        TlsEnd::Deadline
    } else if has(&[
        "unexpected eof",
        "connection reset",
        "broken pipe",
        "syscall",
        "eof",
    ]) {
        TlsEnd::Closed
    } else {
        TlsEnd::Other
    }
}

/// Error codes of a SaslHandshake answer.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const ILLEGAL_SASL_STATE: i16 = 34;

/// What a SaslHandshake answer says, for the mechanism the spec asks (`None`: the spec has no
/// SASL, and `PLAIN` was asked only to learn whether the listener requires SASL). `answer` is
/// the error code and the enabled mechanisms, `None` when the listener closed instead.
pub fn sasl_answer(asked: Option<&str>, answer: Option<(i16, Vec<String>)>) -> Class {
    let enabled = |list: Vec<String>| -> Vec<String> {
        list.into_iter()
            .filter(|m| {
                !m.is_empty()
                    && m.len() <= 32
                    && m.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
            .take(8)
            .collect()
    };
    match (asked, answer) {
        (Some(_), Some((0, _))) => Class::Kafka,
        (Some(asked), Some((UNSUPPORTED_SASL_MECHANISM, list))) => Class::MechanismNotEnabled {
            asked: asked.to_string(),
            enabled: enabled(list),
        },
        (Some(_), Some((ILLEGAL_SASL_STATE, _)) | None) => Class::SaslNotEnabled,
        (Some(_), Some(_)) => Class::Kafka,
        (None, Some((0 | UNSUPPORTED_SASL_MECHANISM, list))) => Class::SaslExpected(enabled(list)),
        (None, _) => Class::Kafka,
    }
}

/// The condition reason and message for what the diagnosis found on `side` (`source` or
/// `target`): the class, the field to fix and how, never the bytes read.
pub fn describe(d: &Diagnosis, side: &str) -> (&'static str, String) {
    let source = side == "source";
    let pick = |s: &'static str, t: &'static str| if source { s } else { t };
    let field = format!("spec.{side}");
    let reason = match &d.class {
        Class::Unresolved
        | Class::NothingListening
        | Class::NoAnswer
        | Class::Silent
        | Class::Kafka => pick(reason::SOURCE_UNREACHABLE, reason::TARGET_UNREACHABLE),
        Class::NotKafka(_) => pick(reason::SOURCE_NOT_KAFKA, reason::TARGET_NOT_KAFKA),
        Class::TlsExpected
        | Class::PlaintextExpected
        | Class::SaslExpected(_)
        | Class::SaslNotEnabled => pick(
            reason::SOURCE_SECURITY_MISMATCH,
            reason::TARGET_SECURITY_MISMATCH,
        ),
        Class::MechanismNotEnabled { .. } => pick(
            reason::SOURCE_SASL_MECHANISM_NOT_ENABLED,
            reason::TARGET_SASL_MECHANISM_NOT_ENABLED,
        ),
        Class::CertificateUntrusted
        | Class::HostnameMismatch
        | Class::CertificateOutOfDate { .. } => {
            pick(reason::SOURCE_TLS_FAILED, reason::TARGET_TLS_FAILED)
        }
        Class::CertificateRefused | Class::ClientCertificateExpired => pick(
            reason::SOURCE_CERTIFICATE_REFUSED,
            reason::TARGET_CERTIFICATE_REFUSED,
        ),
    };
    let message = address_message(&d.class, &field, &d.address)
        .or_else(|| security_message(&d.class, &field, &d.address))
        .or_else(|| certificate_message(&d.class, &field, &d.address))
        .unwrap_or_default();
    (reason, message)
}

/// Messages for an address that does not lead to a Kafka listener.
fn address_message(class: &Class, field: &str, addr: &str) -> Option<String> {
    Some(match class {
        Class::Unresolved => format!(
            "{field}.bootstrapServers: the host of '{addr}' does not resolve; correct the host name (a Kubernetes Service is <service>.<namespace>.svc:<port>)"
        ),
        Class::NothingListening => format!(
            "{field}.bootstrapServers: nothing listens at '{addr}' (connection refused); check that the port is a Kafka listener's and that the brokers run"
        ),
        Class::NoAnswer => format!(
            "{field}.bootstrapServers: no answer from '{addr}' (the connection timed out: a firewall drops it, or the host is down); check the address, and that the operator and the replicator pods may reach it"
        ),
        Class::Silent => format!(
            "{field}.bootstrapServers: '{addr}' accepts connections but does not answer a Kafka request in time (not a Kafka listener, or an overloaded broker); check the port"
        ),
        Class::NotKafka(f) => format!(
            "{field}.bootstrapServers: '{addr}' answers, but as {}, not as a Kafka broker; use the host:port of a Kafka listener (the brokers' advertised listener, often port 9092, or 9093 with TLS)",
            f.what()
        ),
        Class::Kafka => format!(
            "{field}.bootstrapServers: '{addr}' is a Kafka listener that speaks what the spec says, yet the client could not use the cluster; check that the brokers' advertised listeners are reachable from the operator"
        ),
        _ => return None,
    })
}

/// Messages for a Kafka listener whose TLS or SASL differs from the spec's.
fn security_message(class: &Class, field: &str, addr: &str) -> Option<String> {
    Some(match class {
        Class::TlsExpected => format!(
            "{field}.tls: the listener at '{addr}' speaks TLS but {field}.tls is not set; add {field}.tls (with caSecretRef when a private CA signed the brokers' certificates), or point {field}.bootstrapServers at the brokers' plaintext listener"
        ),
        Class::PlaintextExpected => format!(
            "{field}.tls: {field}.tls is set but the listener at '{addr}' speaks Kafka without TLS; remove {field}.tls, or point {field}.bootstrapServers at the brokers' TLS listener"
        ),
        Class::SaslExpected(enabled) => format!(
            "{field}.sasl: the listener at '{addr}' requires SASL authentication (it enables {}) but {field}.sasl is not set; add {field}.sasl with one of these mechanisms and its credentials, or use a listener without SASL",
            listed(enabled)
        ),
        Class::SaslNotEnabled => format!(
            "{field}.sasl: {field}.sasl is set but the listener at '{addr}' does not use SASL; remove {field}.sasl, or point {field}.bootstrapServers at the brokers' SASL listener"
        ),
        Class::MechanismNotEnabled { asked, enabled } => format!(
            "{field}.sasl.mechanism: {asked} is not enabled on the listener at '{addr}', which enables {}; set {field}.sasl.mechanism to one of them (with credentials for it)",
            listed(enabled)
        ),
        _ => return None,
    })
}

/// Messages for a certificate one side does not accept.
fn certificate_message(class: &Class, field: &str, addr: &str) -> Option<String> {
    Some(match class {
        Class::CertificateUntrusted => format!(
            "{field}.tls.caSecretRef: the certificate of the broker at '{addr}' is not signed by a CA the client trusts; put the CA that signed the brokers' certificates (PEM) in the Secret key named by {field}.tls.caSecretRef, or remove caSecretRef when a public CA signed them"
        ),
        Class::HostnameMismatch => format!(
            "{field}.bootstrapServers: the certificate of the broker at '{addr}' does not name '{}'; use a host name the brokers' certificates list (their subject alternative names)",
            host_of(addr)
        ),
        Class::CertificateRefused => format!(
            "{field}.tls.certSecretRef: the broker at '{addr}' refused the client certificate, or requires one and none was given; set {field}.tls.certSecretRef and keySecretRef (or pkcs12SecretRef) to a certificate signed by the CA the brokers trust for clients"
        ),
        Class::CertificateOutOfDate { expired: true } => format!(
            "{field}.bootstrapServers: the certificate of the broker at '{addr}', or of a CA in its chain or in {field}.tls.caSecretRef, has expired; renew the brokers' certificates (or put the renewed CA in the Secret caSecretRef names)"
        ),
        Class::CertificateOutOfDate { expired: false } => format!(
            "{field}.bootstrapServers: the certificate of the broker at '{addr}', or of a CA in its chain, is not valid yet; check the clocks of the operator's node and of the CA that issued it, or wait until its validity starts"
        ),
        Class::ClientCertificateExpired => format!(
            "{field}.tls.certSecretRef: the broker at '{addr}' refused the client certificate because it expired; renew it and update the Secret {field}.tls.certSecretRef (or pkcs12SecretRef) names"
        ),
        _ => return None,
    })
}

fn listed(mechanisms: &[String]) -> String {
    if mechanisms.is_empty() {
        "no mechanism it names".into()
    } else {
        mechanisms.join(", ")
    }
}
