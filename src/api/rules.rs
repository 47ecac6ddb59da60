//! Rules on spec strings that both the CRD schema and the Rust code enforce: the apiserver
//! refuses a resource with the pattern, and [`crate::flow::validate`] refuses a standalone flow
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
    fn an_alias_that_contains_the_separator_is_ambiguous() {
        assert!(alias_contains_separator("us-east", "-"));
        assert!(alias_contains_separator("a__b", "__"));
        assert!(!alias_contains_separator("us_east", "-"));
        assert!(!alias_contains_separator("us-east", "."));
        assert!(!alias_contains_separator("us-east", ""));
    }
}
