//! Applying a flow's children only when that can change something. Every reconcile (every
//! 10 s per healthy flow) applied four objects with server-side apply, although almost always
//! nothing had changed: at 500 flows that was most of the operator's apiserver requests
//! (184-234 requests/s, bench/results/2026-12-01-operator-scale). Now a reconcile applies when
//! the desired objects changed (their digest), when the StatefulSet or ConfigMap in the watch
//! caches is no longer the one the last apply answered (someone edited or deleted it, or its
//! status moved), and at least every [`REAPPLY_EVERY`], which also repairs the Service and
//! the PodDisruptionBudget (not watched) should someone change them. A flow that runs no
//! replicator looks for children to delete only when the caches show one or its last look
//! is that old.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use super::desired::Desired;

/// The longest a flow's children go without being applied.
pub const REAPPLY_EVERY: Duration = Duration::from_secs(300);

/// What the last apply of a flow's children was and what the apiserver answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub digest: u64,
    /// The resource versions the apply answered for the ConfigMap and the StatefulSet.
    pub config_map: Option<String>,
    pub stateful_set: Option<String>,
    pub at: Instant,
}

/// A digest of the desired objects (in this process only: it is never stored).
pub fn digest(desired: &Desired) -> u64 {
    let mut h = DefaultHasher::new();
    for part in [
        serde_json::to_vec(&desired.config_map),
        serde_json::to_vec(&desired.service),
        serde_json::to_vec(&desired.stateful_set),
        serde_json::to_vec(&desired.pdb),
        serde_json::to_vec(&desired.network_policy),
    ] {
        // An object that cannot be serialised is applied (and refused) every time.
        match part {
            Ok(bytes) => bytes.hash(&mut h),
            Err(_) => Instant::now().hash(&mut h),
        }
    }
    h.finish()
}

/// Whether applying again can be skipped: the same desired objects, the watch caches still
/// holding what the last apply answered, and that apply recent.
pub fn unchanged(
    last: Option<&Applied>,
    digest: u64,
    cached_config_map: Option<&str>,
    cached_stateful_set: Option<&str>,
    now: Instant,
) -> bool {
    let Some(last) = last else {
        return false;
    };
    let same = |answered: &Option<String>, cached: Option<&str>| {
        answered.is_some() && answered.as_deref() == cached
    };
    last.digest == digest
        && same(&last.config_map, cached_config_map)
        && same(&last.stateful_set, cached_stateful_set)
        && now.saturating_duration_since(last.at) < REAPPLY_EVERY
}

/// Whether a flow that runs no replicator (Observe, or stopped) must look for children to
/// delete: the watch caches hold its StatefulSet or ConfigMap, or its last removal is not
/// recent. Each look costs four GETs, which Observe flows paid every reconcile.
pub fn removal_needed(last_removed: Option<Instant>, cached_children: bool, now: Instant) -> bool {
    cached_children
        || last_removed.is_none_or(|at| now.saturating_duration_since(at) >= REAPPLY_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(at: Instant) -> Applied {
        Applied {
            digest: 7,
            config_map: Some("10".into()),
            stateful_set: Some("11".into()),
            at,
        }
    }

    #[test]
    fn nothing_changed_is_not_applied_again_until_the_repair_interval() {
        let t = Instant::now();
        let last = applied(t);
        assert!(unchanged(Some(&last), 7, Some("10"), Some("11"), t));
        let later = t + REAPPLY_EVERY - Duration::from_secs(1);
        assert!(unchanged(Some(&last), 7, Some("10"), Some("11"), later));
        assert!(!unchanged(
            Some(&last),
            7,
            Some("10"),
            Some("11"),
            t + REAPPLY_EVERY
        ));
    }

    #[test]
    fn a_new_spec_an_edited_or_deleted_child_or_no_record_is_applied() {
        let t = Instant::now();
        let last = applied(t);
        assert!(!unchanged(None, 7, Some("10"), Some("11"), t), "first time");
        assert!(
            !unchanged(Some(&last), 8, Some("10"), Some("11"), t),
            "spec"
        );
        assert!(
            !unchanged(Some(&last), 7, Some("12"), Some("11"), t),
            "ConfigMap edited"
        );
        assert!(
            !unchanged(Some(&last), 7, Some("10"), Some("13"), t),
            "StatefulSet edited or its status moved"
        );
        assert!(
            !unchanged(Some(&last), 7, Some("10"), None, t),
            "StatefulSet deleted"
        );
        assert!(
            !unchanged(Some(&last), 7, None, Some("11"), t),
            "not cached yet"
        );
        let unanswered = Applied {
            stateful_set: None,
            ..last
        };
        assert!(
            !unchanged(Some(&unanswered), 7, Some("10"), None, t),
            "an answer without a version proves nothing"
        );
    }

    #[test]
    fn a_flow_without_replicators_looks_for_children_only_when_they_may_exist() {
        let t = Instant::now();
        assert!(removal_needed(None, false, t), "never removed");
        assert!(removal_needed(Some(t), true, t), "a child is cached");
        assert!(!removal_needed(Some(t), false, t + Duration::from_secs(10)));
        assert!(
            removal_needed(Some(t), false, t + REAPPLY_EVERY),
            "repair interval"
        );
    }

    #[test]
    fn the_digest_follows_every_desired_object() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let desired = Desired {
            config_map: ConfigMap::default(),
            service: Default::default(),
            stateful_set: Default::default(),
            pdb: Default::default(),
            network_policy: None,
        };
        let same = Desired {
            config_map: ConfigMap::default(),
            service: Default::default(),
            stateful_set: Default::default(),
            pdb: Default::default(),
            network_policy: None,
        };
        assert_eq!(digest(&desired), digest(&same));
        let mut changed = same;
        changed.stateful_set.metadata.name = Some("f".into());
        assert_ne!(digest(&desired), digest(&changed));
        let mut with_policy = Desired {
            network_policy: Some(Default::default()),
            ..changed
        };
        let before = digest(&with_policy);
        assert_ne!(digest(&desired), before);
        if let Some(p) = with_policy.network_policy.as_mut() {
            p.metadata.name = Some("f".into());
        }
        assert_ne!(before, digest(&with_policy));
    }
}
