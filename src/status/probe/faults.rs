//! What a probe client's errors tell of a cluster: the fault's class, from the client's own
//! words or, when they hide it, from a diagnosis at the listener.

use super::*;

/// librdkafka's words when its OIDC client got no token (the token endpoint's answer or
/// libcurl's error follows).
pub(super) const NO_TOKEN: &str = "Failed to acquire SASL OAUTHBEARER token";

/// The error codes a token endpoint answers a refused client credentials grant with (RFC 6749
/// section 5.2): librdkafka passes the answer's body on, without the HTTP status.
pub(super) fn refuses_client_credentials(reason: &str) -> bool {
    [
        "invalid_client",
        "unauthorized_client",
        "invalid_scope",
        "invalid_grant",
        "invalid_request",
        "unsupported_grant_type",
        "access_denied",
    ]
    .iter()
    .any(|code| reason.contains(code))
}

/// The fault a client error tells, if it tells one (others, like a broker going down, are
/// left to the request's own error). `authentication`: librdkafka's code says so.
pub(super) fn classify(
    oauthbearer: bool,
    authentication: bool,
    reason: &str,
) -> Option<ClusterFault> {
    let authentication = authentication || reason.contains("SASL authentication");
    let fault = if oauthbearer && reason.contains(NO_TOKEN) {
        if refuses_client_credentials(reason) {
            ClusterFault::ClientCredentialsRefused(reason.to_string())
        } else {
            ClusterFault::TokenEndpointUnreachable(reason.to_string())
        }
    } else if oauthbearer && authentication {
        ClusterFault::TokenRefused(reason.to_string())
    } else if authentication {
        ClusterFault::Authentication(reason.to_string())
    } else if refuses_the_principal(reason) {
        ClusterFault::NotAuthorized(reason.to_string())
    } else if refuses_client_certificate(reason) {
        ClusterFault::CertificateRefused(reason.to_string())
    } else if reason.contains("SSL handshake failed") {
        ClusterFault::Tls(reason.to_string())
    } else {
        return None;
    };
    Some(fault)
}

/// The TLS alerts a broker sends when it refuses the client's certificate (OpenSSL's words);
/// our own refusal of the broker's certificate reads "certificate verify failed" instead.
pub(super) fn refuses_client_certificate(reason: &str) -> bool {
    [
        "alert bad certificate",
        "alert certificate required",
        "alert unknown ca",
        "alert certificate unknown",
        "alert certificate expired",
        "alert handshake failure",
    ]
    .iter()
    .any(|alert| reason.contains(alert))
}

/// The broker's authorization errors (Kafka's error names as librdkafka words them): the
/// credentials were accepted, the principal may not do what the probe asked.
pub(super) fn refuses_the_principal(reason: &str) -> bool {
    let reason = reason.to_ascii_lowercase();
    [
        "topic authorization failed",
        "group authorization failed",
        "cluster authorization failed",
        "transactional id authorization failed",
    ]
    .iter()
    .any(|e| reason.contains(e))
}

/// The client's own explanation when it tells the class (credentials, client certificate,
/// token); else what [`diagnose`] finds at the listener; else the request's error.
pub(super) fn fault(
    cluster: &Cluster,
    error: &KafkaError,
    config: &ClientConfig,
    budget: Budget,
) -> ClusterFault {
    // Client errors arrive as events on the consumer's queue: polling hands them to the
    // context (records of followed topics go to their tails).
    cluster.pump(Duration::from_millis(500));
    let context = cluster.client().context();
    let told = context.recent_cause();
    if let Some(fault) = &told
        && !needs_diagnosis(fault)
    {
        return fault.clone();
    }
    match context.diagnosis(config, budget) {
        Some(found) => ClusterFault::Connection(found),
        None => told.unwrap_or_else(|| ClusterFault::Unreachable(error.to_string())),
    }
}

/// Faults whose words may hide the class: "transport failure"; a TLS handshake that failed
/// for a reason the client does not tell (a plaintext listener, a host name the certificate
/// does not list, an untrusted CA); an authentication failure that is a mechanism the
/// listener does not enable (when it enables it, the diagnosis finds nothing and the
/// credentials are named).
pub(super) fn needs_diagnosis(fault: &ClusterFault) -> bool {
    matches!(
        fault,
        ClusterFault::Unreachable(_) | ClusterFault::Tls(_) | ClusterFault::Authentication(_)
    )
}
