//! The docs say what the code does: the CRD reference is the generator's output, every condition
//! reason the operator can set has a troubleshooting entry, and docs/metrics.md lists exactly
//! the metrics the replicator and the operator register.
//!
//! The shell commands in the docs run against the local world in
//! `e2e/tests/tests/docs_commands.rs`.

use std::collections::BTreeSet;

use mirrorflow::api::reference;
use mirrorflow::status::reason;

fn doc(path: &str) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    std::fs::read_to_string(format!("{root}/{path}")).unwrap_or_default()
}

#[test]
fn committed_crd_reference_matches_the_generator() {
    let committed = doc(reference::REFERENCE_PATH);
    let generated = reference::crd_markdown().expect("reference renders");
    assert!(
        committed == generated,
        "{} is stale: run `{}`",
        reference::REFERENCE_PATH,
        reference::REGENERATE
    );
}

/// Every reason the operator can write into a condition or a `leastReadyGroups` row.
fn reasons() -> Vec<&'static str> {
    vec![
        reason::OK,
        reason::INVALID_SPEC,
        reason::SECRET_MISSING,
        reason::SOURCE_UNREACHABLE,
        reason::TARGET_UNREACHABLE,
        reason::SOURCE_AUTHENTICATION_FAILED,
        reason::TARGET_AUTHENTICATION_FAILED,
        reason::SOURCE_TLS_FAILED,
        reason::TARGET_TLS_FAILED,
        reason::SOURCE_CERTIFICATE_REFUSED,
        reason::TARGET_CERTIFICATE_REFUSED,
        reason::SOURCE_CLIENT_CREDENTIALS_REFUSED,
        reason::TARGET_CLIENT_CREDENTIALS_REFUSED,
        reason::SOURCE_TOKEN_ENDPOINT_UNREACHABLE,
        reason::TARGET_TOKEN_ENDPOINT_UNREACHABLE,
        reason::SOURCE_TOKEN_REFUSED,
        reason::TARGET_TOKEN_REFUSED,
        reason::REPLICAS_NOT_READY,
        reason::REPLICA_ON_LOST_NODE,
        reason::REPLICATOR_OUT_OF_MEMORY,
        reason::REPLICATOR_CRASHING,
        reason::REPLICATOR_CONFIG_MISSING,
        reason::REPLICATOR_IMAGE_UNAVAILABLE,
        reason::REPLICATOR_UNSCHEDULABLE,
        reason::REPLICATOR_NOT_CREATED,
        reason::NO_HEARTBEATS,
        reason::HEARTBEAT_LAG_HIGH,
        reason::NO_CHECKPOINTS,
        reason::CHECKPOINTS_STALE,
        reason::CHECKPOINTS_INVALIDATED,
        reason::CHECKPOINTS_CONSERVATIVE,
        reason::REPLICATION_LAG_HIGH,
        reason::TOPIC_CHANGES_REFUSED,
        reason::REPLICATION_BEHIND,
        reason::TOPIC_ACLS_MISSING,
        reason::TOPIC_ACLS_FORBIDDEN,
        reason::TOPIC_ACLS_UNKNOWN,
        reason::HEARTBEATS_DISABLED,
        reason::CHECKPOINTS_DISABLED,
        reason::OBSERVING,
        reason::NO_GAPS,
        reason::SOURCE_TRUNCATED,
        reason::SOURCE_TOPIC_RECREATED,
        reason::TARGET_TOPIC_RECREATED,
        reason::RECORD_REJECTED,
        reason::FILLERS_NOT_DELETED,
        reason::OFFSETS_MATCH,
        reason::OFFSETS_MISALIGNED,
        reason::ALIGNMENT_UNKNOWN,
        reason::CHILD_REJECTED,
        reason::CHILD_FORBIDDEN,
        reason::SAME_CLUSTER,
        reason::CONFLICTING_FLOW,
        reason::REPLICATION_LOOP,
        reason::CHILD_CONFLICT,
        reason::PARTITION_STALLED,
        reason::POD_METADATA_NOT_ALLOWED,
        reason::RESOURCES_NOT_ALLOWED,
        reason::ADDRESS_NOT_ALLOWED,
        reason::TOO_MANY_BROKERS,
        reason::SECRET_NOT_SHARED,
        reason::IMAGE_NOT_ALLOWED,
        reason::SOURCE_NOT_KAFKA,
        reason::TARGET_NOT_KAFKA,
        reason::SOURCE_SECURITY_MISMATCH,
        reason::TARGET_SECURITY_MISMATCH,
        reason::SOURCE_SASL_MECHANISM_NOT_ENABLED,
        reason::TARGET_SASL_MECHANISM_NOT_ENABLED,
        reason::NO_TOPICS_MATCHED,
        reason::NO_GROUPS_MATCHED,
        reason::REPLICAS_ABOVE_PARTITIONS,
        reason::PLACEMENT_CHANGED,
        reason::SOURCE_NOT_AUTHORIZED,
        reason::TARGET_NOT_AUTHORIZED,
        reason::ALIAS_NAMES_TWO_CLUSTERS,
        reason::INTERNAL_TOPIC_REFUSED,
        reason::RECORDS_MISMATCH,
        reason::GROUPS_NOT_MIRRORED,
        // Returned by `FlowError::reason()` for a value the Kafka client refuses; listed here
        // so the operator can add it to `conditions::reason` when it reports flow reasons.
        reason::INVALID_CLIENT_CONFIG,
        // Per-group reasons of `status.leastReadyGroups`.
        "Ready",
        "NoCheckpoint",
        "CheckpointStale",
        "CheckpointInvalidated",
        "CheckpointConservative",
        "ShareGroupNotMirrored",
    ]
}

#[test]
fn every_reason_has_a_troubleshooting_entry() {
    let text = doc("docs/troubleshooting.md");
    // Headings are `### `Reason``: an entry, not a passing mention. `FlowError::reason()` is
    // what the status and the CLI report for a spec that resolve or validate refuse.
    let missing: Vec<_> = reasons()
        .into_iter()
        .chain(mirrorflow::flow::reasons())
        .filter(|r| !text.contains(&format!("### `{r}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md has no `### `Reason`` entry for {missing:?}"
    );
}

#[test]
fn the_client_properties_reference_lists_the_allow_list() {
    // The reference is generated (see the drift test above); this names what is missing when
    // a property was added to the table without regenerating.
    let text = doc(reference::REFERENCE_PATH);
    let section = text
        .split("## Client properties")
        .nth(1)
        .unwrap_or_default();
    let missing: Vec<_> = mirrorflow::api::client_properties::ALLOWED
        .iter()
        .map(|a| a.name)
        .filter(|name| !section.contains(&format!("| `{name}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "{} does not list {missing:?}: run `{}`",
        reference::REFERENCE_PATH,
        reference::REGENERATE
    );
}

#[test]
fn the_reason_list_is_complete() {
    // A reason const added to src/status/reason.rs must be added above (and documented).
    let module = doc("src/status/reason.rs");
    let known = reasons();
    assert!(
        module.contains("pub const OK: &str"),
        "src/status/reason.rs moved?"
    );
    for line in module.lines() {
        let Some(value) = line
            .trim()
            .strip_prefix("pub const ")
            .and_then(|l| l.split('"').nth(1))
        else {
            continue;
        };
        assert!(
            known.contains(&value),
            "reason {value} is not in tests/docs.rs"
        );
    }
}

/// Metric names as the registries' source files declare them (prefix + each literal name
/// passed to a metric constructor), so a labelled family that no code path has touched yet
/// counts too.
fn declared_metrics() -> BTreeSet<String> {
    let name = regex::Regex::new(r#"(?:Counter|Gauge|Opts|histogram)(?:::new)?\(\s*"([a-z_]+)""#)
        .expect("regex");
    let prefix = regex::Regex::new(r#"Registry::new_custom\(Some\("([a-z_]+)""#).expect("regex");
    let mut out = BTreeSet::new();
    for file in ["src/replicator/metrics.rs", "src/operator/mod.rs"] {
        let src = doc(file);
        let p = prefix
            .captures(&src)
            .map(|c| c[1].to_string())
            .unwrap_or_else(|| panic!("{file}: no Registry::new_custom prefix"));
        out.extend(name.captures_iter(&src).map(|c| format!("{p}_{}", &c[1])));
    }
    out
}

/// Names the registries really expose, with the labelled families known here touched once (a
/// family without a child is not gathered): a check on [`declared_metrics`].
fn gathered_metrics() -> BTreeSet<String> {
    let r = mirrorflow::replicator::Metrics::new().expect("replicator metrics");
    r.group_checkpoint_age.with_label_values(&["g"]).set(0.0);
    r.errors.with_label_values(&["source", "kafka"]).inc();
    r.cluster_unreachable.with_label_values(&["source"]).set(0);
    let o = mirrorflow::operator::OperatorMetrics::new().expect("operator metrics");
    o.reconcile_errors.with_label_values(&["build"]).inc();
    r.registry
        .gather()
        .into_iter()
        .chain(o.registry.gather())
        .map(|f| f.name().to_string())
        .collect()
}

#[test]
fn metrics_doc_lists_exactly_the_registered_metrics() {
    let text = doc("docs/metrics.md");
    let declared = declared_metrics();
    let gathered = gathered_metrics();
    let unseen: Vec<_> = gathered.difference(&declared).collect();
    assert!(
        unseen.is_empty(),
        "the source scan in tests/docs.rs misses {unseen:?}"
    );
    // The doc's tables name each family as `mirrorflow_...` in the first column.
    let documented: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("mirrorflow_"))
        .map(String::from)
        .collect();
    let undocumented: Vec<_> = declared.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&declared).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/metrics.md: not documented {undocumented:?}; documented but not registered {unknown:?}"
    );
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn relative_links_between_docs_resolve() {
    let root = env!("CARGO_MANIFEST_DIR");
    let link = regex::Regex::new(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)").expect("regex");
    let code_span = regex::Regex::new(r"`[^`\n]*`").expect("regex");
    let mut broken = Vec::new();
    let pages = std::fs::read_dir(format!("{root}/docs")).expect("docs/");
    for page in pages.filter_map(Result::ok).map(|e| e.path()) {
        if page.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&page).unwrap_or_default();
        // Code spans are not links: a pattern such as `[a-z](?:...)` in the CRD reference
        // only looks like one.
        let text = code_span.replace_all(&text, "");
        for c in link.captures_iter(&text) {
            let file = &c[1];
            if file.contains("://") {
                continue;
            }
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().expect("docs/").join(file)
            };
            let Ok(body) = std::fs::read_to_string(&target) else {
                broken.push(format!("{}: {file}", page.display()));
                continue;
            };
            if let Some(anchor) = c.get(2) {
                let found = body
                    .lines()
                    .filter(|l| l.starts_with('#'))
                    .filter_map(|l| l.trim_start_matches('#').strip_prefix(' '))
                    .any(|h| slug(h) == anchor.as_str());
                if !found {
                    broken.push(format!("{}: {file}#{}", page.display(), anchor.as_str()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:?}");
}
