//! Rules on spec strings that both the CRD schema and the Rust code enforce: the apiserver
//! refuses a resource with the pattern, and `mirrorflow::flow::validate` refuses a standalone flow
//! file (which never meets an apiserver) with the same rule. Each rule is written twice, once as
//! a pattern for the CRD and once as Rust code that says *what* is wrong; the tests below check
//! that the two agree on a table of examples.

// A host of `BOOTSTRAP_PATTERN` (a macro, so `concat!` can repeat it per entry).
macro_rules! host_pattern {
    () => {
        r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]*|\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\])"
    };
}

// A port of `BOOTSTRAP_PATTERN`: 1 to 65535, spelled out digit by digit.
macro_rules! port_pattern {
    () => {
        r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
    };
}

/// A comma-separated list of `host:port`, no spaces: a host is a name or an IPv4 address
/// (letters, digits, `_`, `.`, `-`, not starting with `.` or `-`) or an IPv6 address in
/// brackets, a port is 1 to 65535 without leading zeros.
pub const BOOTSTRAP_PATTERN: &str = concat!(
    "^",
    host_pattern!(),
    ":",
    port_pattern!(),
    "(?:,",
    host_pattern!(),
    ":",
    port_pattern!(),
    ")*$"
);

/// A Kubernetes object name (DNS-1123 subdomain): lower-case letters, digits, `-` and `.`,
/// starting and ending with a letter or digit. A `/` would make the name a subresource path
/// at the apiserver and a directory step in the secrets folder.
pub const SECRET_NAME_PATTERN: &str =
    r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$";

/// A Secret data key, as Kubernetes allows it (`[-._a-zA-Z0-9]+`, not `.`, not starting with
/// `..`): written so that no key can step out of its Secret's folder.
pub const SECRET_KEY_PATTERN: &str =
    r"^(?:[-_a-zA-Z0-9][-._a-zA-Z0-9]*|\.[-_a-zA-Z0-9][-._a-zA-Z0-9]*)$";

/// The longest Secret name and key Kubernetes allows.
pub const SECRET_NAME_MAX: usize = 253;

/// What is wrong with a `bootstrapServers` value, or `None` when it matches
/// [`BOOTSTRAP_PATTERN`].
pub fn bootstrap_problem(servers: &str) -> Option<String> {
    if servers.is_empty() {
        return Some("is empty: give at least one host:port".into());
    }
    if servers.chars().any(char::is_whitespace) {
        return Some(format!(
            "'{servers}' contains spaces: list host:port entries separated by commas only"
        ));
    }
    servers.split(',').find_map(entry_problem)
}

fn entry_problem(entry: &str) -> Option<String> {
    if entry.is_empty() {
        return Some("has an empty entry (two commas in a row, or one at an end)".into());
    }
    let split = match entry.strip_prefix('[') {
        Some(rest) => rest
            .split_once("]:")
            .map(|(ip, port)| (ip, port, ipv6_ok(ip))),
        None => entry
            .rsplit_once(':')
            .map(|(host, port)| (host, port, host_ok(host))),
    };
    let Some((host, port, host_ok)) = split else {
        return Some(format!(
            "'{entry}' has no port: write it as host:port (an IPv6 address as [address]:port)"
        ));
    };
    if host.is_empty() {
        return Some(format!("'{entry}' has no host before the port"));
    }
    if !host_ok {
        return Some(format!(
            "'{entry}': '{host}' is not a host name or address (letters, digits, '_', '.', '-'; an IPv6 address goes in brackets)"
        ));
    }
    if !port_ok(port) {
        return Some(format!(
            "'{entry}': the port '{port}' must be a number from 1 to 65535"
        ));
    }
    None
}

fn host_ok(host: &str) -> bool {
    let mut chars = host.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn ipv6_ok(ip: &str) -> bool {
    ip.contains(':')
        && ip
            .chars()
            .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.'))
}

fn port_ok(port: &str) -> bool {
    // No sign, no leading zero: the pattern cannot parse numbers, so the Rust side does not
    // accept what the pattern would refuse.
    port.len() <= 5
        && !port.starts_with('0')
        && port.chars().all(|c| c.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p))
}

/// What is wrong with a Secret name, or `None` when it matches [`SECRET_NAME_PATTERN`] and is
/// at most [`SECRET_NAME_MAX`] long.
pub fn secret_name_problem(name: &str) -> Option<String> {
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        bytes.first().is_some_and(edge)
            && bytes.last().is_some_and(edge)
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    };
    if name.is_empty() || name.len() > SECRET_NAME_MAX {
        return Some(format!(
            "the Secret name must be 1 to {SECRET_NAME_MAX} characters"
        ));
    }
    if !name.split('.').all(label_ok) {
        return Some(format!(
            "'{name}' is not a Secret name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit (no '/')"
        ));
    }
    None
}

/// What is wrong with a Secret key, or `None` when it matches [`SECRET_KEY_PATTERN`] and is
/// at most [`SECRET_NAME_MAX`] long.
pub fn secret_key_problem(key: &str) -> Option<String> {
    if key.is_empty() || key.len() > SECRET_NAME_MAX {
        return Some(format!(
            "the Secret key must be 1 to {SECRET_NAME_MAX} characters"
        ));
    }
    let chars_ok = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !chars_ok || key == "." || key.starts_with("..") {
        return Some(format!(
            "'{key}' is not a Secret key: letters, digits, '-', '_' and '.', not '.' and not starting with '..' (no '/')"
        ));
    }
    None
}

/// An OAuth token endpoint: `https://` with a host (no user or password: the client secret
/// has its own Secret), or `http://` to a loopback host only (`localhost`, `127.x.x.x`,
/// `[::1]`, e.g. a token proxy in the pod), since the client secret travels in the request;
/// then a path, query or fragment of printable ASCII.
pub const TOKEN_ENDPOINT_PATTERN: &str = concat!(
    r"^(?:https://[-A-Za-z0-9._~%!$&'()*+,;=:\[\]]+",
    r"|http://(?:localhost|127(?:\.[0-9]{1,3}){3}|\[::1\])(?::[0-9]{1,5})?)",
    r"(?:[/?#][\x21-\x7E]*)?$"
);

/// The longest token endpoint URL.
pub const TOKEN_ENDPOINT_MAX: usize = 2048;

/// An OAuth client id: printable ASCII without spaces and without `:`, which would split the
/// HTTP Basic credentials the client sends to the token endpoint (the Kafka client does not
/// escape it).
pub const CLIENT_ID_PATTERN: &str = r"^[\x21-\x39\x3B-\x7E]+$";

/// An OAuth scope: scope tokens separated by single spaces. The Kafka client puts the scope
/// into the form it posts without escaping, so a token has only characters a form carries as
/// they are: letters, digits and `._~:/!$'()*,;@-` (no `&`, `=`, `+`, `%`).
pub const SCOPE_PATTERN: &str = r"^[-A-Za-z0-9._~:/!$'()*,;@]+(?: [-A-Za-z0-9._~:/!$'()*,;@]+)*$";

/// The most SASL extensions an OAUTHBEARER client sends, and the longest key and value.
pub const MAX_EXTENSIONS: usize = 16;
pub const EXTENSION_KEY_MAX: usize = 64;
pub const EXTENSION_VALUE_MAX: usize = 256;

fn is_loopback_host(host: &str) -> bool {
    let octets: Vec<&str> = host.split('.').collect();
    host == "localhost"
        || host == "[::1]"
        || (octets.len() == 4
            && octets[0] == "127"
            && octets
                .iter()
                .all(|o| (1..=3).contains(&o.len()) && o.chars().all(|c| c.is_ascii_digit())))
}

/// What is wrong with a token endpoint URL, or `None` when it matches
/// [`TOKEN_ENDPOINT_PATTERN`] and is at most [`TOKEN_ENDPOINT_MAX`] long.
pub fn token_endpoint_problem(url: &str) -> Option<String> {
    if url.is_empty() || url.len() > TOKEN_ENDPOINT_MAX {
        return Some(format!(
            "the token endpoint URL must be 1 to {TOKEN_ENDPOINT_MAX} characters"
        ));
    }
    if !url.chars().all(|c| c.is_ascii_graphic()) {
        return Some(format!(
            "'{url}' contains spaces or characters outside printable ASCII: percent-encode them"
        ));
    }
    let (rest, plain_http) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(rest), _) => (rest, false),
        (None, Some(rest)) => (rest, true),
        _ => {
            return Some(format!(
                "'{url}' must start with https:// (the client secret travels in the request)"
            ));
        }
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() {
        return Some(format!("'{url}' has no host"));
    }
    if authority.contains('@') {
        return Some(format!(
            "'{url}' carries a user or password: remove it, the client secret comes from clientSecretSecretRef"
        ));
    }
    let authority_ok = authority
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._~%!$&'()*+,;=:[]".contains(c));
    if !authority_ok {
        return Some(format!("'{url}': '{authority}' is not a host[:port]"));
    }
    if plain_http {
        let (host, port) = match authority.strip_prefix("[::1]") {
            Some(port) => ("[::1]", port),
            None => authority.split_at(authority.find(':').unwrap_or(authority.len())),
        };
        let port_ok = port.is_empty()
            || port.strip_prefix(':').is_some_and(|p| {
                (1..=5).contains(&p.len()) && p.chars().all(|c| c.is_ascii_digit())
            });
        if !is_loopback_host(host) || !port_ok {
            return Some(format!(
                "'{url}' uses http:// to a host that is not loopback: use https:// (http:// only for localhost, 127.x.x.x or [::1]), since the client secret travels in the request"
            ));
        }
    }
    None
}

/// What is wrong with an OAuth client id, or `None` when it matches [`CLIENT_ID_PATTERN`] and
/// is at most 255 long.
pub fn client_id_problem(id: &str) -> Option<String> {
    if id.is_empty() || id.len() > 255 {
        return Some("the client id must be 1 to 255 characters".into());
    }
    if !id.chars().all(|c| c.is_ascii_graphic() && c != ':') {
        return Some(format!(
            "'{id}' is not a client id: printable ASCII without spaces or ':'"
        ));
    }
    None
}

fn scope_token_ok(token: &str) -> bool {
    !token.is_empty()
        && token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._~:/!$'()*,;@".contains(c))
}

/// What is wrong with an OAuth scope, or `None` when it matches [`SCOPE_PATTERN`] and is at
/// most 1024 long.
pub fn scope_problem(scope: &str) -> Option<String> {
    if scope.is_empty() || scope.len() > 1024 {
        return Some("the scope must be 1 to 1024 characters".into());
    }
    if !scope.split(' ').all(scope_token_ok) {
        return Some(format!(
            "'{scope}' is not a scope: tokens of letters, digits and ._~:/!$'()*,;@- separated by single spaces (no &, =, +, %)"
        ));
    }
    None
}

/// What is wrong with one SASL extension (RFC 7628: the key is letters only and not `auth`;
/// the Kafka client sends the list comma-separated as `key=value`, so a value has neither).
pub fn extension_problem(key: &str, value: &str) -> Option<String> {
    if key.is_empty()
        || key.len() > EXTENSION_KEY_MAX
        || !key.chars().all(|c| c.is_ascii_alphabetic())
    {
        return Some(format!(
            "the extension key '{key}' must be 1 to {EXTENSION_KEY_MAX} letters (RFC 7628)"
        ));
    }
    if key == "auth" {
        return Some("the extension key 'auth' is reserved for the token itself (RFC 7628)".into());
    }
    if value.is_empty()
        || value.len() > EXTENSION_VALUE_MAX
        || !value
            .chars()
            .all(|c| c.is_ascii_graphic() && c != ',' && c != '=')
    {
        return Some(format!(
            "the value of extension '{key}' must be 1 to {EXTENSION_VALUE_MAX} printable ASCII characters without spaces, ',' or '='"
        ));
    }
    None
}

/// The `Prefix` policy's separator: it becomes part of every remote topic name, so it has only
/// the characters Kafka allows in one.
pub const SEPARATOR_PATTERN: &str = r"^[A-Za-z0-9._-]{1,8}$";

/// What is wrong with a separator, or `None` when it matches [`SEPARATOR_PATTERN`].
pub fn separator_problem(separator: &str) -> Option<String> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if (1..=8).contains(&separator.len()) && separator.chars().all(legal) {
        return None;
    }
    Some(format!(
        "'{separator}' cannot be part of a topic name: use 1 to 8 of a-z, A-Z, 0-9, '.', '_' and '-' (MirrorMaker 2's default is '.')"
    ))
}

/// Whether an alias contains the `Prefix` policy's separator, which makes remote topic names
/// ambiguous: with alias `us-east` and separator `-`, `us-east-orders` reads both as topic
/// `east-orders` from `us` and as `orders` from `us-east`.
pub fn alias_contains_separator(alias: &str, separator: &str) -> bool {
    !separator.is_empty() && alias.contains(separator)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agree(pattern: &str, problem: impl Fn(&str) -> Option<String>, ok: &[&str], bad: &[&str]) {
        let re = regex::Regex::new(pattern).expect("the pattern compiles");
        for value in ok {
            assert!(re.is_match(value), "the pattern refuses '{value}'");
            assert_eq!(problem(value), None, "the Rust check refuses '{value}'");
        }
        for value in bad {
            assert!(!re.is_match(value), "the pattern accepts '{value}'");
            assert!(problem(value).is_some(), "the Rust check accepts '{value}'");
        }
    }

    #[test]
    fn bootstrap_pattern_and_check_agree() {
        agree(
            BOOTSTRAP_PATTERN,
            bootstrap_problem,
            &[
                "kafka:9092",
                "127.0.0.1:1",
                "a:65535",
                "kafka-0.kafka.ns.svc.cluster.local:9092,kafka-1.kafka:9093",
                "[::1]:9092",
                "[2001:db8::7]:9092,b:2",
                "kafka_1:19092",
                "x:1",
            ],
            &[
                "",
                "kafka",
                "kafka:",
                ":9092",
                "kafka:0",
                "kafka:65536",
                "kafka:99999",
                "kafka:09092",
                "kafka:-1",
                "kafka:+92",
                "a:1, b:2",
                " a:1",
                "a:1,",
                ",a:1",
                "a:1,,b:2",
                "-kafka:9092",
                ".kafka:9092",
                "ka/fka:9092",
                "PLAINTEXT://kafka:9092",
                "::1:9092",
                "[::1]",
                "[]:9092",
                "[1.2.3.4]:9092",
                "[::1]:0",
                "kafka:9092:1",
                "kä:1",
            ],
        );
    }

    #[test]
    fn bootstrap_problems_say_what_is_wrong() {
        let p = |s| bootstrap_problem(s).unwrap_or_default();
        assert!(p("kafka").contains("no port"), "{}", p("kafka"));
        assert!(p("kafka:70000").contains("1 to 65535"));
        assert!(p(":9092").contains("no host"));
        assert!(p("a:1, b:2").contains("spaces"));
        assert!(p("a:1,").contains("empty entry"));
    }

    #[test]
    fn secret_name_pattern_and_check_agree() {
        let long = "a".repeat(SECRET_NAME_MAX + 1);
        agree(
            SECRET_NAME_PATTERN,
            secret_name_problem,
            &["creds", "kafka-creds", "a", "my.creds.v2", "0x"],
            &[
                "", "a/b", "../x", "..", ".", "Creds", "-a", "a-", "a..b", "a_b", "a b",
            ],
        );
        // Length is the CRD's maxLength, not the pattern's.
        assert!(secret_name_problem(&long).is_some());
        assert!(secret_name_problem(&"a".repeat(SECRET_NAME_MAX)).is_none());
    }

    #[test]
    fn secret_key_pattern_and_check_agree() {
        agree(
            SECRET_KEY_PATTERN,
            secret_key_problem,
            &[
                "password",
                "ca.crt",
                "tls_key",
                "-x",
                ".hidden",
                "a..b",
                "user-name.v1",
            ],
            &[
                "",
                ".",
                "..",
                "../../x",
                "..x",
                "a/b",
                "/etc/passwd",
                "a b",
                "ké",
            ],
        );
        assert!(secret_key_problem(&"k".repeat(SECRET_NAME_MAX + 1)).is_some());
    }

    #[test]
    fn token_endpoint_pattern_and_check_agree() {
        agree(
            TOKEN_ENDPOINT_PATTERN,
            token_endpoint_problem,
            &[
                "https://keycloak.example.com/realms/kafka/protocol/openid-connect/token",
                "https://login.microsoftonline.com/tenant/oauth2/v2.0/token",
                "https://idp:8443/token?audience=kafka",
                "https://[2001:db8::1]:443/t",
                "https://idp",
                "http://127.0.0.1:18000/token",
                "http://localhost/token",
                "http://[::1]:8080/t",
                "http://127.1.2.3",
            ],
            &[
                "",
                "idp.example.com/token",
                "ftp://idp/token",
                "http://idp.example.com/token",
                "http://10.0.0.1:8080/token",
                "http://127.0.0.1.nip.io/token",
                "http://localhost.evil.com/token",
                "http://127.0.0.1:123456/t",
                "https://user:pass@idp/token",
                "https://idp/to ken",
                "https:///token",
                "https://",
                "https://idé/token",
                "HTTPS://idp/token",
            ],
        );
        let p = |s| token_endpoint_problem(s).unwrap_or_default();
        assert!(
            p("http://idp/t").contains("https://"),
            "{}",
            p("http://idp/t")
        );
        assert!(p("https://a:b@idp/t").contains("clientSecretSecretRef"));
        assert!(token_endpoint_problem(&format!("https://idp/{}", "a".repeat(2048))).is_some());
    }

    #[test]
    fn client_id_and_scope_patterns_and_checks_agree() {
        agree(
            CLIENT_ID_PATTERN,
            client_id_problem,
            &["mirrorflow", "0oa1b2c3", "sa-1234@project.iam", "a.b_c-d"],
            &["", "a b", "a:b", "ké", "a\tb"],
        );
        agree(
            SCOPE_PATTERN,
            scope_problem,
            &[
                "kafka",
                "openid profile",
                "api://kafka/.default",
                "kafka:write",
            ],
            &[
                "", " kafka", "kafka ", "a  b", "a&b", "a=b", "a+b", "a%20b", "ké",
            ],
        );
    }

    #[test]
    fn extensions_are_letters_keys_and_plain_values() {
        assert_eq!(extension_problem("logicalCluster", "lkc-abc123"), None);
        assert_eq!(extension_problem("identityPoolId", "pool-Ab1_x"), None);
        for (k, v) in [
            ("auth", "x"),
            ("logical_cluster", "x"),
            ("", "x"),
            ("a", ""),
            ("a", "x,y"),
            ("a", "x=y"),
            ("a", "x y"),
        ] {
            assert!(extension_problem(k, v).is_some(), "{k}={v} accepted");
        }
    }

    #[test]
    fn a_separator_has_only_topic_name_characters() {
        let pattern = regex::Regex::new(SEPARATOR_PATTERN).expect("the pattern compiles");
        for ok in [".", "_", "-", "__", "to", ".x-"] {
            assert_eq!(separator_problem(ok), None, "{ok:?}");
            assert!(pattern.is_match(ok), "{ok:?}");
        }
        for bad in ["", "/", " ", "::", "a b", "é", "123456789", ".\n"] {
            assert!(separator_problem(bad).is_some(), "{bad:?}");
            assert!(!pattern.is_match(bad), "{bad:?}");
        }
    }

    #[test]
    fn an_alias_that_contains_the_separator_is_ambiguous() {
        assert!(alias_contains_separator("us-east", "-"));
        assert!(alias_contains_separator("a__b", "__"));
        assert!(!alias_contains_separator("us_east", "-"));
        assert!(!alias_contains_separator("us-east", "."));
        assert!(!alias_contains_separator("us-east", ""));
    }
}
