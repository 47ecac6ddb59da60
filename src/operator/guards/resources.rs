//! The cpu, memory and ephemeral storage a flow's replicator container may ask for. The
//! installer sets defaults (for flows that set no `spec.resources`) and a maximum per container;
//! a flow asking for more, for a resource the operator does not bound, or for requests without
//! limits where the installer requires limits, is refused, never quietly clamped. Every
//! replicator container gets a memory limit: a copy loop without one can take a node's memory.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::{self, Milli};
use crate::api::MirrorFlow;
use crate::status::{Blocked, reason};

/// The resources a flow may set; the only ones with installer bounds.
pub const BOUNDED: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// The installer's bounds on replicator containers.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourcePolicy {
    /// What a flow without `spec.resources` gets; its limits always hold memory.
    pub default: ResourceRequirements,
    /// The most one container may request or be limited to, per resource (absent: unbounded).
    pub max: BTreeMap<String, (String, Milli)>,
    /// Every resource a flow requests must also have a limit.
    pub require_limits: bool,
}

impl Default for ResourcePolicy {
    /// The replicator's own defaults, no maximum: for tests and an operator run without the chart.
    fn default() -> Self {
        ResourcePolicy {
            default: requirements(
                &[("cpu", "100m"), ("memory", "128Mi")],
                &[("cpu", "2"), ("memory", "512Mi")],
            ),
            max: BTreeMap::new(),
            require_limits: false,
        }
    }
}

fn requirements(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
    let list = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        )
    };
    ResourceRequirements {
        requests: list(requests),
        limits: list(limits),
        ..ResourceRequirements::default()
    }
}

/// `name=quantity` pairs as the operator's flags take them, checked.
fn pairs(flag: &str, items: &[String]) -> Result<BTreeMap<String, (String, Milli)>, String> {
    let mut out = BTreeMap::new();
    for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
        let (name, value) = item
            .split_once('=')
            .map(|(n, v)| (n.trim(), v.trim()))
            .ok_or_else(|| format!("{flag}: '{item}' is not name=quantity"))?;
        if !BOUNDED.contains(&name) {
            return Err(format!(
                "{flag}: '{name}' is not one of {}",
                BOUNDED.join(", ")
            ));
        }
        let milli = quantity::parse(value, name == "cpu").ok_or_else(|| {
            format!(
                "{flag}: {name}={value} is not {}",
                quantity::expected(name == "cpu")
            )
        })?;
        out.insert(name.to_string(), (value.to_string(), milli));
    }
    Ok(out)
}

impl ResourcePolicy {
    /// The policy from the operator's flags (each `name=quantity` items), refused at start-up
    /// when a value is not a quantity, the default limits lack memory, or a default exceeds
    /// its limit or the maximum.
    pub fn from_flags(
        requests: &[String],
        limits: &[String],
        max: &[String],
        require_limits: bool,
    ) -> Result<Self, String> {
        let requests = pairs("--replicator-default-requests", requests)?;
        let limits = pairs("--replicator-default-limits", limits)?;
        let max = pairs("--replicator-max-resources", max)?;
        if !limits.contains_key("memory") {
            return Err("--replicator-default-limits: needs memory=<quantity>: every replicator container gets a memory limit".into());
        }
        for (kind, list) in [("request", &requests), ("limit", &limits)] {
            for (name, (text, milli)) in list {
                if let Some((max_text, max_milli)) = max.get(name)
                    && milli > max_milli
                {
                    return Err(format!(
                        "the default {kind} {name}={text} is above the maximum {name}={max_text}"
                    ));
                }
            }
        }
        if let Some((name, (text, _))) = requests
            .iter()
            .find(|(n, (_, m))| limits.get(*n).is_some_and(|(_, l)| m > l))
        {
            return Err(format!(
                "the default request {name}={text} is above the default limit"
            ));
        }
        let list = |m: &BTreeMap<String, (String, Milli)>| {
            Some(
                m.iter()
                    .map(|(k, (v, _))| (k.clone(), Quantity(v.clone())))
                    .collect(),
            )
        };
        Ok(ResourcePolicy {
            default: ResourceRequirements {
                requests: list(&requests).filter(|r: &BTreeMap<_, _>| !r.is_empty()),
                limits: list(&limits),
                ..ResourceRequirements::default()
            },
            max,
            require_limits,
        })
    }

    fn default_memory_limit(&self) -> Option<&Quantity> {
        self.default.limits.as_ref()?.get("memory")
    }
}

fn refused(field: String, what: String) -> Blocked {
    Blocked::new(reason::RESOURCES_NOT_ALLOWED, format!("{field}: {what}"))
}

/// The resources the flow's replicator container gets, or why the flow's `spec.resources` is
/// refused (naming the field and the fix).
pub fn replicator_resources(
    mf: &MirrorFlow,
    policy: &ResourcePolicy,
) -> Result<ResourceRequirements, Blocked> {
    let Some(asked) = mf.spec.resources.clone() else {
        return Ok(policy.default.clone());
    };
    if asked.claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(refused(
            "spec.resources.claims".into(),
            "replicators use no dynamically allocated resources; remove it".into(),
        ));
    }
    let requests = read_list(&asked.requests, "requests", policy)?;
    let limits = read_list(&asked.limits, "limits", policy)?;
    for (name, (text, milli)) in &requests {
        match limits.get(name) {
            Some((limit, l)) if milli > l => {
                return Err(refused(
                    format!("spec.resources.requests.{name}"),
                    format!(
                        "{text} is above its limit {limit}; lower the request or raise spec.resources.limits.{name}"
                    ),
                ));
            }
            None if policy.require_limits => {
                return Err(refused(
                    format!("spec.resources.limits.{name}"),
                    format!(
                        "spec.resources.requests.{name} is {text} but no limit is set, and this operator runs replicators only with limits on what they request; set spec.resources.limits.{name}{}",
                        max_hint(policy, name)
                    ),
                ));
            }
            _ => {}
        }
    }
    let mut out = asked;
    if !limits.contains_key("memory") {
        let Some(default) = policy.default_memory_limit() else {
            return Ok(out);
        };
        // A container that requests more memory than the default limit needs its own limit.
        if let Some((text, milli)) = requests.get("memory")
            && quantity::parse(&default.0, false).is_none_or(|d| *milli > d)
        {
            return Err(refused(
                "spec.resources.limits.memory".into(),
                format!(
                    "not set, and the default memory limit {} is below spec.resources.requests.memory {text}; set spec.resources.limits.memory{}",
                    default.0,
                    max_hint(policy, "memory")
                ),
            ));
        }
        out.limits
            .get_or_insert_with(BTreeMap::new)
            .insert("memory".into(), default.clone());
    }
    Ok(out)
}

/// ` (at most <max>)` when the installer bounds this resource.
fn max_hint(policy: &ResourcePolicy, name: &str) -> String {
    policy
        .max
        .get(name)
        .map(|(max, _)| format!(" (at most {max})"))
        .unwrap_or_default()
}

/// One of `requests` or `limits`, each value read and within the installer's maximum.
fn read_list(
    list: &Option<BTreeMap<String, Quantity>>,
    which: &str,
    policy: &ResourcePolicy,
) -> Result<BTreeMap<String, (String, Milli)>, Blocked> {
    let mut out = BTreeMap::new();
    for (name, Quantity(text)) in list.iter().flatten() {
        let field = format!("spec.resources.{which}.{name}");
        if !BOUNDED.contains(&name.as_str()) {
            return Err(refused(
                field,
                format!(
                    "replicators may ask only for {}; remove it",
                    BOUNDED.join(", ")
                ),
            ));
        }
        let cpu = name == "cpu";
        let Some(milli) = quantity::parse(text, cpu) else {
            return Err(refused(
                field,
                format!(
                    "'{text}' is not a quantity this operator reads; write {}",
                    quantity::expected(cpu)
                ),
            ));
        };
        if let Some((max, max_milli)) = policy.max.get(name)
            && milli > *max_milli
        {
            return Err(refused(
                field,
                format!(
                    "{text} is more than this operator allows per replicator container ({max}); lower it, or ask whoever installed the operator to raise the maximum (chart value replicatorResources.max.{name})"
                ),
            ));
        }
        out.insert(name.clone(), (text.clone(), milli));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(resources: &str) -> MirrorFlow {
        let spec = serde_yaml::from_str(&format!(
            "source: {{alias: a, bootstrapServers: 'a:1'}}\ntarget: {{alias: b, bootstrapServers: 'b:1'}}\n{resources}"
        ))
        .expect("a test spec");
        MirrorFlow::new("f", spec)
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    /// The chart's defaults.
    fn chart() -> ResourcePolicy {
        ResourcePolicy::from_flags(
            &strings(&["cpu=100m", "memory=128Mi"]),
            &strings(&["cpu=2", "memory=512Mi"]),
            &strings(&["cpu=4", "memory=8Gi", "ephemeral-storage=1Gi"]),
            true,
        )
        .expect("the chart's defaults are valid")
    }

    fn refusal(resources: &str, policy: &ResourcePolicy) -> Blocked {
        replicator_resources(&flow(resources), policy)
            .err()
            .unwrap_or_else(|| panic!("refused: {resources}"))
    }

    #[test]
    fn a_flow_without_resources_gets_the_installers_defaults() {
        let got = replicator_resources(&flow(""), &chart()).expect("defaults");
        assert_eq!(got, chart().default);
        assert_eq!(
            got.limits.and_then(|l| l.get("memory").cloned()),
            Some(Quantity("512Mi".into()))
        );
    }

    #[test]
    fn resources_within_the_maximum_pass_unchanged() {
        let asked = "resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {cpu: '4', memory: 8Gi, ephemeral-storage: 1Gi}}\n";
        let got = replicator_resources(&flow(asked), &chart()).expect("allowed");
        assert_eq!(Some(got), flow(asked).spec.resources);
    }

    #[test]
    fn more_than_the_maximum_is_refused_naming_the_field_and_the_fix() {
        let b = refusal(
            "resources: {requests: {memory: 1Gi}, limits: {memory: 16Gi}}\n",
            &chart(),
        );
        assert_eq!(b.reason, reason::RESOURCES_NOT_ALLOWED);
        assert!(
            b.message.starts_with("spec.resources.limits.memory: 16Gi")
                && b.message.contains("(8Gi)")
                && b.message.contains("replicatorResources.max.memory"),
            "{}",
            b.message
        );
        for (asked, field) in [
            (
                "resources: {requests: {cpu: 4001m}, limits: {cpu: '5'}}\n",
                "spec.resources.requests.cpu",
            ),
            (
                "resources: {limits: {cpu: '4.5', memory: 1Gi}}\n",
                "spec.resources.limits.cpu",
            ),
            (
                "resources: {limits: {ephemeral-storage: 2Gi, memory: 1Gi}}\n",
                "spec.resources.limits.ephemeral-storage",
            ),
        ] {
            let b = refusal(asked, &chart());
            assert!(b.message.starts_with(field), "{asked}: {}", b.message);
        }
    }

    #[test]
    fn requests_without_limits_are_refused_where_limits_are_required() {
        let asked = "resources: {requests: {cpu: 200m, memory: 256Mi}}\n";
        let b = refusal(asked, &chart());
        assert!(
            b.message.starts_with("spec.resources.limits.cpu") && b.message.contains("(at most 4)"),
            "{}",
            b.message
        );
        // Without the requirement the memory limit is still set, from the defaults.
        let lenient = ResourcePolicy {
            require_limits: false,
            ..chart()
        };
        let got = replicator_resources(&flow(asked), &lenient).expect("allowed");
        let limits = got.limits.expect("limits");
        assert_eq!(limits.get("memory"), Some(&Quantity("512Mi".into())));
        assert_eq!(limits.get("cpu"), None);
        // ... unless the request is above that default: the flow must set its own limit.
        let b = refusal("resources: {requests: {memory: 1Gi}}\n", &lenient);
        assert!(
            b.message
                .starts_with("spec.resources.limits.memory: not set"),
            "{}",
            b.message
        );
    }

    #[test]
    fn a_cpu_limit_alone_gets_the_default_memory_limit() {
        let got =
            replicator_resources(&flow("resources: {limits: {cpu: '1'}}\n"), &chart()).expect("ok");
        assert_eq!(
            got.limits.and_then(|l| l.get("memory").cloned()),
            Some(Quantity("512Mi".into()))
        );
    }

    #[test]
    fn malformed_or_unbounded_resources_are_refused() {
        for (asked, field, says) in [
            (
                "resources: {limits: {memory: '1e9'}}\n",
                "spec.resources.limits.memory",
                "not a quantity",
            ),
            (
                "resources: {limits: {memory: 512m}}\n",
                "spec.resources.limits.memory",
                "512Mi",
            ),
            (
                "resources: {limits: {cpu: 1Pi, memory: 1Gi}}\n",
                "spec.resources.limits.cpu",
                "500m",
            ),
            (
                "resources: {limits: {memory: 1Gi, nvidia.com/gpu: '1'}}\n",
                "spec.resources.limits.nvidia.com/gpu",
                "only for cpu",
            ),
            (
                "resources: {requests: {memory: 2Gi}, limits: {memory: 1Gi}}\n",
                "spec.resources.requests.memory",
                "above its limit",
            ),
            (
                "resources: {claims: [{name: gpu}], limits: {memory: 1Gi}}\n",
                "spec.resources.claims",
                "remove",
            ),
        ] {
            let b = refusal(asked, &chart());
            assert_eq!(b.reason, reason::RESOURCES_NOT_ALLOWED);
            assert!(
                b.message.starts_with(field) && b.message.contains(says),
                "{asked}: {}",
                b.message
            );
        }
    }

    #[test]
    fn bad_installer_values_stop_the_operator_at_start() {
        let ok = strings(&["memory=512Mi"]);
        for (requests, limits, max, says) in [
            (strings(&[]), strings(&["cpu=1"]), strings(&[]), "memory"),
            (
                strings(&["memory=1Gi"]),
                ok.clone(),
                strings(&[]),
                "above the default limit",
            ),
            (
                strings(&[]),
                ok.clone(),
                strings(&["memory=256Mi"]),
                "above the maximum",
            ),
            (
                strings(&[]),
                ok.clone(),
                strings(&["memory=lots"]),
                "not a whole",
            ),
            (strings(&["gpu=1"]), ok.clone(), strings(&[]), "not one of"),
            (strings(&["cpu"]), ok.clone(), strings(&[]), "name=quantity"),
        ] {
            let e = ResourcePolicy::from_flags(&requests, &limits, &max, true)
                .err()
                .unwrap_or_else(|| panic!("refused: {requests:?} {limits:?} {max:?}"));
            assert!(e.contains(says), "{e}");
        }
    }
}
