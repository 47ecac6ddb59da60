//! The static checks of a spec, shared by the operator (which runs them before deploying
//! anything), the replicator and the CLI: every refusal names its field and the fix.

use std::time::Duration;

use super::*;
use crate::api::rules::{alias_contains_separator, separator_problem};

/// The first `spec.topics` pattern that matches internal topics and no ordinary name: a
/// filter that can never copy anything, almost always a mistake (MirrorMaker 2 accepts it
/// silently and copies nothing).
fn only_internal_topics(spec: &MirrorFlowSpec) -> Option<&str> {
    let (s, t) = (&spec.source.alias, &spec.target.alias);
    let internal = [
        "__consumer_offsets".to_string(),
        "__transaction_state".to_string(),
        format!("mm2-offset-syncs.{t}.internal"),
        format!("{s}.checkpoints.internal"),
        format!("mirrorflow-positions.{s}.internal"),
        "mm2-configs.internal".to_string(),
    ];
    let ordinary = ["orders", "a", "topic-1", "app.events", "Payments_v2", "x"];
    spec.topics.iter().map(String::as_str).find(|pattern| {
        // The filters' own compiled-size limit: this runs in the shared operator.
        let Ok(re) = regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(1 << 20)
            .build()
        else {
            // Invalid patterns are reported by the filters, with their own message.
            return false;
        };
        internal.iter().any(|n| re.is_match(n)) && !ordinary.iter().any(|n| re.is_match(n))
    })
}

/// The static checks, shared with the operator (which runs them before deploying anything).
pub fn validate(spec: &MirrorFlowSpec) -> Result<(), FlowError> {
    check_aliases(spec)?;
    // Addresses, Secret references and client properties: the same checks as when the client
    // configuration is built, run here so the operator refuses them before deploying anything.
    kafka::check_cluster(&spec.source, "spec.source")?;
    kafka::check_cluster(&spec.target, "spec.target")?;
    check_counts(spec)?;
    check_intervals(spec)?;
    check_selection(spec)?;
    check_modes(spec)
}

/// Aliases: well-formed, distinct, and free of the naming policy's separator.
fn check_aliases(spec: &MirrorFlowSpec) -> Result<(), FlowError> {
    let alias_ok = |a: &str| {
        !a.is_empty()
            && a.len() <= 64
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if !alias_ok(&spec.source.alias) {
        return Err(FlowError::Invalid {
            field: "spec.source.alias",
            message: format!(
                "'{}' must be 1-64 letters, digits, '_' or '-'",
                spec.source.alias
            ),
        });
    }
    if !alias_ok(&spec.target.alias) {
        return Err(FlowError::Invalid {
            field: "spec.target.alias",
            message: format!(
                "'{}' must be 1-64 letters, digits, '_' or '-'",
                spec.target.alias
            ),
        });
    }
    if spec.source.alias == spec.target.alias {
        return Err(FlowError::Invalid {
            field: "spec.target.alias",
            message: "source and target aliases must differ: they name the clusters in topic names"
                .into(),
        });
    }
    if let Some(separator) = &spec.replication_policy.separator {
        check_separator(spec, separator)?;
    }
    Ok(())
}

/// A separator a topic name can hold, and (under `Prefix`) in neither alias.
fn check_separator(spec: &MirrorFlowSpec, separator: &str) -> Result<(), FlowError> {
    if let Some(problem) = separator_problem(separator) {
        return Err(FlowError::Invalid {
            field: "spec.replicationPolicy.separator",
            message: problem,
        });
    }
    if spec.replication_policy.kind == PolicyKind::Prefix {
        for (field, alias) in [
            ("spec.source.alias", &spec.source.alias),
            ("spec.target.alias", &spec.target.alias),
        ] {
            if alias_contains_separator(alias, separator) {
                return Err(FlowError::Invalid {
                    field,
                    message: format!(
                        "'{alias}' contains spec.replicationPolicy.separator '{separator}': remote topic names <alias>{separator}<topic> would be ambiguous; choose another separator or alias"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Replicas and source consumers within their ranges.
fn check_counts(spec: &MirrorFlowSpec) -> Result<(), FlowError> {
    if !(1..=64).contains(&spec.replicas) {
        return Err(FlowError::Invalid {
            field: "spec.replicas",
            message: format!("{} is out of range: use 1 to 64", spec.replicas),
        });
    }
    if let Some(n) = spec.source_loop.consumers
        && !(1..=8).contains(&n)
    {
        return Err(FlowError::Invalid {
            field: "spec.sourceLoop.consumers",
            message: format!(
                "{n} is out of range: use 1 to 8, or leave it unset to follow the round trip to the source"
            ),
        });
    }
    Ok(())
}

/// Every interval between its floor and its ceiling.
fn check_intervals(spec: &MirrorFlowSpec) -> Result<(), FlowError> {
    // Floors keep a typo from hammering the brokers; ceilings keep one ("5000h") from
    // silently switching a loop off.
    const HOUR: u64 = 3600;
    let intervals = [
        (
            "spec.sourceLoop.topicsRefreshInterval",
            spec.source_loop.topics_refresh_interval,
            1000,
            24 * HOUR,
        ),
        (
            "spec.sourceLoop.offsetSyncInterval",
            spec.source_loop.offset_sync_interval,
            100,
            HOUR,
        ),
        (
            "spec.checkpoints.interval",
            spec.checkpoints.interval,
            100,
            HOUR,
        ),
        (
            "spec.checkpoints.groupsRefreshInterval",
            spec.checkpoints.groups_refresh_interval,
            1000,
            24 * HOUR,
        ),
        (
            "spec.heartbeats.interval",
            spec.heartbeats.interval,
            100,
            HOUR,
        ),
        (
            "spec.failoverReadiness.maxCheckpointAge",
            spec.failover_readiness.max_checkpoint_age,
            1000,
            24 * HOUR,
        ),
        (
            "spec.failoverReadiness.maxHeartbeatLag",
            spec.failover_readiness.max_heartbeat_lag,
            1000,
            24 * HOUR,
        ),
    ];
    for (field, d, min_ms, max_s) in intervals {
        let d_ms = d.as_duration().as_millis();
        if d_ms < u128::from(min_ms) || d_ms > u128::from(max_s) * 1000 {
            let min = crate::api::SpecDuration::from_millis(min_ms);
            let max = crate::api::SpecDuration::from_secs(max_s);
            return Err(FlowError::Invalid {
                field,
                message: format!("{d} is out of range: use {min} to {max}"),
            });
        }
    }
    let verify = spec.checkpoints.verify_interval.as_duration();
    if !verify.is_zero()
        && !(Duration::from_secs(1)..=Duration::from_secs(24 * HOUR)).contains(&verify)
    {
        return Err(FlowError::Invalid {
            field: "spec.checkpoints.verifyInterval",
            message: format!(
                "{} is out of range: use 0s (off) or 1s to 24h",
                spec.checkpoints.verify_interval
            ),
        });
    }
    Ok(())
}

/// Topic and group selections that can match something.
fn check_selection(spec: &MirrorFlowSpec) -> Result<(), FlowError> {
    if let Some(pattern) = only_internal_topics(spec) {
        return Err(FlowError::Invalid {
            field: "spec.topics",
            message: format!(
                "'{pattern}' matches only internal topics (such as __consumer_offsets or *.internal), which are never replicated: remove it, or name the topics to copy"
            ),
        });
    }
    selection::check(spec)?;
    Ok(())
}

/// What keeps a spec from copying whole batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchesBlocker {
    /// Whole batches keep the source producer's commit markers out: no transaction per
    /// partition can be built on them.
    ExactlyOnce,
    /// Whole batches keep their offsets apart: aligned offsets cannot be built on them.
    Aligned,
}

/// The one rule of whether `spec` can copy whole batches, for the refusal of a spec that asks
/// for them and for the advice to a flow that copies records.
pub fn batches_blocker(spec: &MirrorFlowSpec) -> Option<BatchesBlocker> {
    if spec.exactly_once {
        Some(BatchesBlocker::ExactlyOnce)
    } else if spec.offsets == OffsetsMode::Aligned {
        Some(BatchesBlocker::Aligned)
    } else {
        None
    }
}

/// The unit `spec` copies: the one it names, else whole batches wherever they can carry what
/// the spec asks for, and records where only records can ([`batches_blocker`]).
pub fn copy_unit(spec: &MirrorFlowSpec) -> CopyUnit {
    match (spec.source_loop.copy, batches_blocker(spec)) {
        (Some(unit), _) => unit,
        (None, Some(_)) => CopyUnit::Records,
        (None, None) => CopyUnit::Batches,
    }
}

/// Delivery, offsets and copy modes that can be combined.
fn check_modes(spec: &MirrorFlowSpec) -> Result<(), FlowError> {
    if spec.exactly_once && spec.source_loop.offset_syncs_location != OffsetSyncsLocation::Target {
        // Syncs are committed with their records and positions in one target transaction; a
        // write to the source cluster cannot join it.
        return Err(FlowError::Invalid {
            field: "spec.sourceLoop.offsetSyncsLocation",
            message: "spec.exactlyOnce writes offset syncs in the target's transactions: set \
                      spec.sourceLoop.offsetSyncsLocation to Target (MM2's \
                      offset-syncs.topic.location=target), or turn spec.exactlyOnce off"
                .into(),
        });
    }
    if spec.exactly_once && spec.offsets == OffsetsMode::Aligned {
        return Err(FlowError::Invalid {
            field: "spec.offsets",
            message: "offsets: Aligned cannot be combined with spec.exactlyOnce: each \
                      exactly-once commit marker takes an offset the source record does not \
                      have; choose one"
                .into(),
        });
    }
    // Only a spec that names whole batches is refused: unset, the copy is records there.
    if spec.source_loop.copy == Some(CopyUnit::Batches) {
        let refused = |field, message| Err(FlowError::Invalid { field, message });
        let combined = |other: &str| {
            format!(
                "Batches copies at least once with translated offsets and cannot be combined with {other}: remove copy (unset, a flow with {other} copies records), or turn {other} off"
            )
        };
        match batches_blocker(spec) {
            None => {}
            Some(BatchesBlocker::ExactlyOnce) => {
                return refused("spec.sourceLoop.copy", combined("spec.exactlyOnce"));
            }
            Some(BatchesBlocker::Aligned) => {
                return refused("spec.sourceLoop.copy", combined("spec.offsets: Aligned"));
            }
        }
    }
    Ok(())
}
