//! The client properties a flow may set in `spec.<side>.config`: an allow-list of tuning
//! properties, in one table ([`ALLOWED`]) that the Kafka client configuration enforces and the
//! CRD reference (docs/crd-reference.md, "Client properties") lists.
//!
//! Why an allow-list: `config` reaches librdkafka in the replicator pods *and* in the shared
//! operator's probe. A deny-list could never keep up with librdkafka's properties that load
//! code (`plugin.library.paths`, `ssl.engine.location`), read files of the pod (`*.location`),
//! run commands (`sasl.kerberos.kinit.cmd`), silently override the typed fields
//! (`bootstrap.servers`, `security.protocol`, `ssl.*`, `sasl.*`), break the replicator's
//! guarantees (`acks`, `enable.idempotence`, `isolation.level`, ...) or let a hostile broker
//! grow memory (buffer sizes). Everything not listed here is refused, with the field to use
//! instead where there is one.

/// Why a group of properties is allowed: shown in the CRD reference next to each property.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Placement,
    Connection,
    Metadata,
    Fetching,
    Membership,
    Producing,
    Delivery,
}

impl Group {
    /// Every group, in the reference's order.
    pub const ALL: [Group; 7] = [
        Group::Placement,
        Group::Connection,
        Group::Metadata,
        Group::Fetching,
        Group::Membership,
        Group::Producing,
        Group::Delivery,
    ];

    /// One sentence per group, for the reference.
    pub fn why(self) -> &'static str {
        match self {
            Group::Placement => {
                "where the client runs: lets the brokers serve fetches from a replica in the same rack or zone"
            }
            Group::Connection => {
                "how connections are made and retried: needed to reach brokers behind NAT, load balancers or single-stack networks; no effect on what is copied"
            }
            Group::Metadata => {
                "how often topic and broker metadata is re-read: only how fast new partitions and leaders are noticed"
            }
            Group::Fetching => {
                "how the source is read: batch sizes and waits trade latency for throughput; sizes are bounded because they are memory the brokers' answers may fill"
            }
            Group::Membership => {
                "group membership timing of the source consumer: how fast a dead replica's partitions move to another one"
            }
            Group::Producing => {
                "how the target is written: batching and compression trade latency for throughput; queue sizes are bounded because they are memory"
            }
            Group::Delivery => {
                "how long a write may take before it is retried: a failed delivery makes the replicator copy the partition again from its last position, so nothing is lost"
            }
        }
    }
}

/// The values a property accepts beyond what librdkafka itself checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// librdkafka's own check is enough: the value cannot hurt.
    Client,
    /// An integer in this inclusive range (tighter than librdkafka's where a value is memory
    /// or would switch a safety off).
    Range(i64, i64),
}

/// One allowed property.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allowed {
    pub name: &'static str,
    pub group: Group,
    pub limit: Limit,
    /// Also applied by the operator's status probe. The probe runs in the shared operator, so it
    /// takes only what it needs to reach the brokers the way the replicators do, and nothing
    /// that sizes buffers or timings of the operator.
    pub probe: bool,
}

const KIB: i64 = 1024;
const MIB: i64 = 1024 * KIB;

const fn allow(name: &'static str, group: Group, limit: Limit, probe: bool) -> Allowed {
    Allowed {
        name,
        group,
        limit,
        probe,
    }
}

use Group::*;
use Limit::{Client, Range};

/// Every property a flow may set, by group.
pub const ALLOWED: &[Allowed] = &[
    allow("client.rack", Placement, Client, false),
    allow("broker.address.family", Connection, Client, true),
    allow("broker.address.ttl", Connection, Client, true),
    allow("client.dns.lookup", Connection, Client, true),
    allow("connections.max.idle.ms", Connection, Client, true),
    // Floors: with no backoff a partition whose leader is a closed port is reconnected in a
    // tight loop, from the operator's probe too (which follows the flow's topics).
    allow("reconnect.backoff.ms", Connection, Range(100, 60_000), true),
    allow(
        "reconnect.backoff.max.ms",
        Connection,
        Range(1_000, 3_600_000),
        true,
    ),
    allow("retry.backoff.ms", Connection, Client, false),
    allow("retry.backoff.max.ms", Connection, Client, false),
    allow(
        "socket.connection.setup.timeout.ms",
        Connection,
        Client,
        true,
    ),
    allow("socket.keepalive.enable", Connection, Client, true),
    allow("socket.nagle.disable", Connection, Client, true),
    allow(
        "socket.receive.buffer.bytes",
        Connection,
        Range(0, 16 * MIB),
        false,
    ),
    allow(
        "socket.send.buffer.bytes",
        Connection,
        Range(0, 16 * MIB),
        false,
    ),
    allow("socket.timeout.ms", Connection, Client, false),
    allow("metadata.max.age.ms", Metadata, Client, false),
    allow(
        "topic.metadata.refresh.fast.interval.ms",
        Metadata,
        Client,
        false,
    ),
    allow(
        "topic.metadata.refresh.interval.ms",
        Metadata,
        Client,
        false,
    ),
    allow("check.crcs", Fetching, Client, false),
    allow("fetch.error.backoff.ms", Fetching, Client, false),
    allow("fetch.max.bytes", Fetching, Range(1, 64 * MIB), false),
    allow("fetch.min.bytes", Fetching, Range(1, 16 * MIB), false),
    allow("fetch.queue.backoff.ms", Fetching, Client, false),
    allow("fetch.wait.max.ms", Fetching, Client, false),
    allow(
        "max.partition.fetch.bytes",
        Fetching,
        Range(1, 16 * MIB),
        false,
    ),
    allow(
        "queued.max.messages.kbytes",
        Fetching,
        Range(1, 128 * KIB),
        false,
    ),
    allow("queued.min.messages", Fetching, Range(1, 100_000), false),
    allow("heartbeat.interval.ms", Membership, Client, false),
    allow("max.poll.interval.ms", Membership, Client, false),
    allow("session.timeout.ms", Membership, Client, false),
    allow("batch.num.messages", Producing, Client, false),
    allow("batch.size", Producing, Range(1, 64 * MIB), false),
    allow("compression.level", Producing, Client, false),
    allow("compression.type", Producing, Client, false),
    allow("linger.ms", Producing, Client, false),
    allow(
        "message.max.bytes",
        Producing,
        Range(1000, 100 * MIB),
        false,
    ),
    allow(
        "queue.buffering.max.kbytes",
        Producing,
        Range(1, 256 * KIB),
        false,
    ),
    allow(
        "queue.buffering.max.messages",
        Producing,
        Range(1, 1_000_000),
        false,
    ),
    // 0 means "forever" to librdkafka: a write that never times out stalls its partition
    // instead of being copied again.
    allow(
        "message.timeout.ms",
        Delivery,
        Range(1000, 3_600_000),
        false,
    ),
    allow("request.timeout.ms", Delivery, Client, false),
    // Brokers cap it with transaction.max.timeout.ms (15 min by default).
    allow(
        "transaction.timeout.ms",
        Delivery,
        Range(1000, 900_000),
        false,
    ),
];

/// Why a property is refused, and what to do instead. `side` is the cluster's spec path
/// (`spec.source`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The property is not allowed at all.
    NotAllowed(String),
    /// Allowed, with a value outside its [`Limit`].
    OutOfRange { min: i64, max: i64 },
}

impl Refusal {
    pub fn message(&self) -> String {
        match self {
            Refusal::NotAllowed(why) => why.clone(),
            Refusal::OutOfRange { min, max } => {
                format!("must be an integer from {min} to {max}")
            }
        }
    }
}

/// Alternative spellings librdkafka accepts for allowed properties: refused, because the
/// replicator's own defaults are keyed by the canonical name and would silently win.
const ALIASES: &[(&str, &str)] = &[
    ("queue.buffering.max.ms", "linger.ms"),
    ("compression.codec", "compression.type"),
    ("delivery.timeout.ms", "message.timeout.ms"),
    ("fetch.message.max.bytes", "max.partition.fetch.bytes"),
];

/// Properties the replicator sets itself because correctness depends on them.
const REPLICATOR_OWNED: &[&str] = &[
    "acks",
    "request.required.acks",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "max.in.flight",
    "max.in.flight.requests.per.connection",
    "retries",
    "message.send.max.retries",
    "transactional.id",
    "isolation.level",
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.remote.assignor",
    "partition.assignment.strategy",
    "client.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "auto.offset.reset",
    "enable.partition.eof",
    "allow.auto.create.topics",
    "queuing.strategy",
    "partitioner",
];

/// Secret-bearing properties, with the field that holds the secret instead (`{side}` is
/// replaced by the cluster's spec path).
const SECRETS: &[(&str, &str)] = &[
    ("sasl.username", "{side}.sasl.usernameSecretRef"),
    ("sasl.password", "{side}.sasl.passwordSecretRef"),
    (
        "sasl.jaas.config",
        "{side}.sasl.usernameSecretRef and {side}.sasl.passwordSecretRef",
    ),
    ("ssl.ca.pem", "{side}.tls.caSecretRef"),
    ("ssl.key.pem", "{side}.tls.keySecretRef"),
    (
        "ssl.key.password",
        "{side}.tls.keySecretRef (an unencrypted key) or {side}.tls.pkcs12SecretRef",
    ),
    ("ssl.certificate.pem", "{side}.tls.certSecretRef"),
    (
        "ssl.keystore.password",
        "{side}.tls.pkcs12PasswordSecretRef",
    ),
    ("ssl.truststore.password", "{side}.tls.caSecretRef"),
    (
        "sasl.oauthbearer.client.secret",
        "{side}.sasl.oauthbearer.clientSecretSecretRef",
    ),
    (
        "sasl.oauthbearer.config",
        "{side}.sasl.oauthbearer (tokens from a token endpoint; unsecured JWTs are not offered)",
    ),
];

/// Looks `name` up; `None` when it is not allowed.
pub fn allowed(name: &str) -> Option<&'static Allowed> {
    ALLOWED.iter().find(|a| a.name == name)
}

/// The table entry of `name`, or why it may not be set in a cluster whose spec path is `side`.
pub fn check_name(side: &str, name: &str) -> Result<&'static Allowed, Refusal> {
    allowed(name).ok_or_else(|| Refusal::NotAllowed(refusal_text(side, name)))
}

impl Allowed {
    /// Whether `value` is within this property's [`Limit`]. Run after librdkafka accepted the
    /// value, so a value that is no integer at all gets librdkafka's own explanation first.
    pub fn check_value(&self, value: &str) -> Result<(), Refusal> {
        match self.limit {
            Limit::Client => Ok(()),
            Limit::Range(min, max) => value
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|v| (min..=max).contains(v))
                .map(|_| ())
                .ok_or(Refusal::OutOfRange { min, max }),
        }
    }
}

/// Pairs librdkafka checks only when a client is created, long after the spec was accepted.
struct Ordered {
    larger: &'static str,
    smaller: &'static str,
    /// librdkafka's defaults; `None` means the pair is checked only when the flow sets both
    /// (the replicator sets its own default for that property).
    defaults: (Option<i64>, Option<i64>),
    /// Equal values are refused too.
    strict: bool,
}

const ORDERED: &[Ordered] = &[
    Ordered {
        larger: "reconnect.backoff.max.ms",
        smaller: "reconnect.backoff.ms",
        defaults: (Some(10_000), Some(100)),
        strict: false,
    },
    Ordered {
        larger: "max.poll.interval.ms",
        smaller: "session.timeout.ms",
        defaults: (Some(300_000), Some(45_000)),
        strict: false,
    },
    Ordered {
        larger: "fetch.max.bytes",
        smaller: "message.max.bytes",
        defaults: (None, None),
        strict: false,
    },
    Ordered {
        larger: "message.timeout.ms",
        smaller: "linger.ms",
        defaults: (None, None),
        strict: true,
    },
];

/// A pair of set properties the Kafka client would refuse together: (the property to name,
/// its value, why). `get` looks a property up in the flow's `config`.
pub fn contradiction<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
) -> Option<(&'static str, String, String)> {
    let number = |name: &str| get(name).and_then(|v| v.trim().parse::<i64>().ok());
    ORDERED.iter().find_map(|pair| {
        let set = (number(pair.larger), number(pair.smaller));
        if set == (None, None) {
            return None;
        }
        let big = set.0.or(pair.defaults.0)?;
        let small = set.1.or(pair.defaults.1)?;
        if big > small || (big == small && !pair.strict) {
            return None;
        }
        let shown = |name: &str, set: Option<i64>, value: i64| match set {
            Some(_) => format!("{name} ({value})"),
            None => format!("{name} ({value}, librdkafka's default)"),
        };
        // Name the property the flow set; when it set both, the smaller one.
        let (named, value, other) = match set.1 {
            Some(v) => (pair.smaller, v, shown(pair.larger, set.0, big)),
            None => (pair.larger, big, shown(pair.smaller, set.1, small)),
        };
        let relation = if pair.strict {
            "greater than"
        } else {
            "at least"
        };
        Some((
            named,
            value.to_string(),
            format!(
                "{} must be {relation} {}; here it is not: {other}",
                pair.larger, pair.smaller
            ),
        ))
    })
}

/// The explanation for a property that is not allowed: the field to use, or why not at all.
fn refusal_text(side: &str, name: &str) -> String {
    let with_side = |s: &str| s.replace("{side}", side);
    if name == "bootstrap.servers" || name == "metadata.broker.list" {
        return format!("not allowed: set {side}.bootstrapServers instead");
    }
    // Before `ssl.*` and `sasl.*`: these are refused for what they do, whatever their prefix.
    if name.ends_with(".location")
        || name.starts_with("plugin.")
        || name.starts_with("ssl.engine.")
        || name == "ssl_engine_callback_data"
        || name == "sasl.kerberos.keytab"
        || name == "interceptors"
    {
        return "not allowed: it loads or reads a file from the pod".into();
    }
    if name == "sasl.kerberos.kinit.cmd" {
        return "not allowed: it runs a command in the pod".into();
    }
    if let Some((_, instead)) = SECRETS.iter().find(|(n, _)| *n == name) {
        return format!(
            "not allowed: it carries a secret, which would be stored in the flow's ConfigMap; use {} instead",
            with_side(instead)
        );
    }
    if name == "sasl.mechanisms" || name == "sasl.mechanism" {
        return format!("not allowed: set {side}.sasl.mechanism instead");
    }
    if name == "security.protocol"
        || name.starts_with("ssl.")
        || name.starts_with("sasl.")
        || name.starts_with("enable.ssl.")
        || name.starts_with("enable.sasl.")
        || name == "https.ca.pem"
    {
        return format!(
            "not allowed: TLS and SASL are set by {side}.tls and {side}.sasl (present or absent), which this would silently override"
        );
    }
    if let Some((_, canonical)) = ALIASES.iter().find(|(a, _)| *a == name) {
        return format!("not allowed: it is another name of {canonical}; set {canonical} instead");
    }
    if REPLICATOR_OWNED.contains(&name) {
        return "not allowed: the replicator sets it itself, because copying without loss, duplicates or reordering depends on it".into();
    }
    "not allowed: only the tuning properties listed in docs/crd-reference.md (Client properties) are passed to the Kafka client".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(side: &str, name: &str, value: &str) -> Result<&'static Allowed, Refusal> {
        let entry = check_name(side, name)?;
        entry.check_value(value).map(|()| entry)
    }

    fn refusal(name: &str) -> String {
        match check("spec.source", name, "1") {
            Err(r) => r.message(),
            Ok(_) => panic!("{name} is allowed"),
        }
    }

    #[test]
    fn the_table_has_each_property_once_and_no_refused_name() {
        for (i, a) in ALLOWED.iter().enumerate() {
            assert!(
                ALLOWED[i + 1..].iter().all(|b| b.name != a.name),
                "{} twice",
                a.name
            );
            let refused = a.name.ends_with(".location")
                || a.name.starts_with("ssl.")
                || a.name.starts_with("sasl.")
                || REPLICATOR_OWNED.contains(&a.name)
                || ALIASES.iter().any(|(alias, _)| *alias == a.name)
                || SECRETS.iter().any(|(s, _)| *s == a.name);
            assert!(!refused, "{} is both allowed and refused", a.name);
        }
    }

    #[test]
    fn typed_fields_are_named_for_what_they_replace() {
        assert!(refusal("bootstrap.servers").contains("spec.source.bootstrapServers"));
        assert!(refusal("security.protocol").contains("spec.source.tls and spec.source.sasl"));
        assert!(refusal("ssl.endpoint.identification.algorithm").contains("spec.source.tls"));
        assert!(refusal("sasl.mechanisms").contains("spec.source.sasl.mechanism"));
        assert!(refusal("sasl.password").contains("spec.source.sasl.passwordSecretRef"));
        assert!(refusal("sasl.username").contains("spec.source.sasl.usernameSecretRef"));
        assert!(
            refusal("sasl.oauthbearer.client.secret")
                .contains("spec.source.sasl.oauthbearer.clientSecretSecretRef")
        );
        assert!(refusal("ssl.ca.pem").contains("spec.source.tls.caSecretRef"));
        assert!(refusal("compression.codec").contains("set compression.type instead"));
        assert!(refusal("acks").contains("the replicator sets it"));
        assert!(refusal("transactional.id").contains("the replicator sets it"));
        assert!(refusal("debug").contains("docs/crd-reference.md"));
    }

    #[test]
    fn properties_that_load_or_read_files_are_refused_for_that() {
        for name in [
            "plugin.library.paths",
            "ssl.engine.location",
            "ssl.ca.location",
            "ssl.key.location",
            "ssl.keystore.location",
            "ssl.crl.location",
            "sasl.kerberos.keytab",
            "ssl.certificate.location",
        ] {
            assert!(
                refusal(name).contains("loads or reads a file from the pod"),
                "{name}: {}",
                refusal(name)
            );
        }
        assert!(refusal("sasl.kerberos.kinit.cmd").contains("runs a command"));
    }

    #[test]
    fn sizes_are_bounded_and_tuning_passes() {
        assert!(check("s", "fetch.max.bytes", "4194304").is_ok());
        assert_eq!(
            check("s", "fetch.max.bytes", "2147483135"),
            Err(Refusal::OutOfRange {
                min: 1,
                max: 64 * MIB
            })
        );
        assert!(check("s", "queued.max.messages.kbytes", "2097151").is_err());
        assert!(check("s", "message.timeout.ms", "0").is_err());
        assert!(check("s", "message.timeout.ms", "120000").is_ok());
        // Values of unbounded ones are checked by librdkafka (kafka::config), not here.
        assert!(check("s", "fetch.wait.max.ms", "banana").is_ok());
        assert!(check("s", "linger.ms", "20").is_ok());
        let probe: Vec<_> = ALLOWED.iter().filter(|a| a.probe).map(|a| a.name).collect();
        assert!(probe.contains(&"broker.address.family"), "{probe:?}");
        assert!(
            ALLOWED
                .iter()
                .filter(|a| a.probe)
                .all(|a| a.group == Group::Connection
                    && (a.limit == Limit::Client || a.name.starts_with("reconnect.backoff"))),
            "the probe takes connection settings only, never a size"
        );
        // No backoff would reconnect to a closed port in a tight loop.
        assert!(check("s", "reconnect.backoff.ms", "0").is_err());
        assert!(check("s", "reconnect.backoff.max.ms", "0").is_err());
        assert!(check("s", "reconnect.backoff.ms", "250").is_ok());
    }

    #[test]
    fn contradicting_pairs_are_found_with_librdkafka_defaults() {
        let find = |pairs: &'static [(&'static str, &'static str)]| {
            contradiction(|name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v))
        };
        let (name, value, why) = find(&[("reconnect.backoff.ms", "20000")]).unwrap();
        assert_eq!((name, value.as_str()), ("reconnect.backoff.ms", "20000"));
        assert!(
            why.contains("reconnect.backoff.max.ms (10000, librdkafka's default)"),
            "{why}"
        );
        let (name, _, _) = find(&[("max.poll.interval.ms", "10000")]).unwrap();
        assert_eq!(name, "max.poll.interval.ms");
        let (name, _, _) = find(&[
            ("fetch.max.bytes", "1048576"),
            ("message.max.bytes", "2097152"),
        ])
        .unwrap();
        assert_eq!(name, "message.max.bytes");
        assert_eq!(find(&[("message.max.bytes", "2097152")]), None);
        let (name, _, why) =
            find(&[("message.timeout.ms", "5000"), ("linger.ms", "5000")]).unwrap();
        assert!(name == "linger.ms" && why.contains("greater than"), "{why}");
        assert_eq!(find(&[("reconnect.backoff.ms", "5000")]), None);
        assert_eq!(
            find(&[
                ("session.timeout.ms", "6000"),
                ("heartbeat.interval.ms", "1000")
            ]),
            None
        );
        assert_eq!(find(&[]), None);
    }
}
