//! The CRD schema's bounds on a flow file's spec. The apiserver refuses a resource past any of
//! them (a string's `maxLength`, a list's `maxItems`, a map's `maxProperties`, a number's
//! `minimum` and `maximum`); a standalone replicator's file never meets an apiserver, so the
//! same bounds are read from the schema the binary generates and applied here, all of them at
//! once rather than field by field. Patterns, enums and the rules the schema cannot state are
//! [`super::validate`]'s.

use kube::CustomResourceExt;
use serde_json::Value;

use crate::api::MirrorFlow;

/// A value past a bound: the field's path (`spec.source.bootstrapServers`, `spec.topics[3]`)
/// and what is wrong.
#[derive(Debug, PartialEq, Eq)]
pub struct OutOfBounds {
    pub field: String,
    pub message: String,
}

/// Checks `spec` (a flow file's `spec`, as written) against the bounds of the CRD's schema.
pub fn check(spec: &Value) -> Result<(), OutOfBounds> {
    let crd = serde_json::to_value(MirrorFlow::crd()).unwrap_or(Value::Null);
    match crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec") {
        Some(schema) => walk(schema, spec, "spec"),
        // The binary's own schema always has a spec; without it there is nothing to hold to.
        None => Ok(()),
    }
}

fn walk(schema: &Value, value: &Value, path: &str) -> Result<(), OutOfBounds> {
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    let out = |message: String| OutOfBounds {
        field: path.to_string(),
        message,
    };
    match value {
        Value::String(s) => {
            let chars = s.chars().count();
            if let Some(max) = bound("maxLength").filter(|&m| chars as f64 > m) {
                return Err(out(format!(
                    "{chars} characters; at most {max} are allowed"
                )));
            }
            if let Some(min) = bound("minLength").filter(|&m| (chars as f64) < m) {
                return Err(out(format!(
                    "{chars} characters; at least {min} are needed"
                )));
            }
        }
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or(f64::NAN);
            let (min, max) = (bound("minimum"), bound("maximum"));
            if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
                return Err(out(match (min, max) {
                    (Some(min), Some(max)) => format!("{n} is out of range: use {min} to {max}"),
                    (Some(min), None) => format!("{n} is out of range: use {min} or more"),
                    (_, _) => format!("{n} is out of range: use at most {}", max.unwrap_or(n)),
                }));
            }
        }
        Value::Array(items) => {
            if let Some(max) = bound("maxItems").filter(|&m| items.len() as f64 > m) {
                return Err(out(format!(
                    "{} entries; at most {max} are allowed",
                    items.len()
                )));
            }
            if let Some(min) = bound("minItems").filter(|&m| (items.len() as f64) < m) {
                return Err(out(format!(
                    "{} entries; at least {min} are needed",
                    items.len()
                )));
            }
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    walk(item, v, &format!("{path}[{i}]"))?;
                }
            }
        }
        Value::Object(fields) => {
            if let Some(max) = bound("maxProperties").filter(|&m| fields.len() as f64 > m) {
                return Err(out(format!(
                    "{} entries; at most {max} are allowed",
                    fields.len()
                )));
            }
            let properties = schema.get("properties");
            let rest = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, v) in fields {
                // Unknown fields are refused by name before this check.
                if let Some(s) = properties.and_then(|p| p.get(key)).or(rest) {
                    walk(s, v, &format!("{path}.{key}"))?;
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> Value {
        let yaml = format!(
            "source: {{alias: a, bootstrapServers: 'x:1'}}\ntarget: {{alias: b, bootstrapServers: 'y:1'}}\n{extra}"
        );
        serde_yaml::from_str(&yaml).expect("valid YAML")
    }

    #[test]
    fn a_spec_within_every_bound_passes() {
        assert_eq!(check(&spec("topics: [orders]\nreplicas: 3\n")), Ok(()));
    }

    #[test]
    fn every_kind_of_bound_is_held_with_the_fields_path() {
        let many = (0..3000)
            .map(|i| format!("h{i}:1"))
            .collect::<Vec<_>>()
            .join(",");
        let long_servers = format!(
            "source: {{alias: a, bootstrapServers: '{many}'}}\ntarget: {{alias: b, bootstrapServers: 'y:1'}}\n"
        );
        let long: Value = serde_yaml::from_str(&long_servers).expect("valid YAML");
        let topics = format!("topics: [{}]\n", vec!["t"; 300].join(","));
        for (value, field, says) in [
            (long, "spec.source.bootstrapServers", "at most 4096"),
            (spec(&topics), "spec.topics", "300 entries; at most 256"),
            (
                spec("replicas: 65\n"),
                "spec.replicas",
                "65 is out of range: use 1 to 64",
            ),
            (
                spec("replicas: 0\n"),
                "spec.replicas",
                "0 is out of range: use 1 to 64",
            ),
            (
                spec(&format!(
                    "heartbeats: {{interval: '{}s'}}\n",
                    "1".repeat(40)
                )),
                "spec.heartbeats.interval",
                "41 characters; at most 32",
            ),
        ] {
            let err = check(&value).expect_err(field);
            assert_eq!(err.field, field);
            assert!(err.message.contains(says), "{field}: {}", err.message);
        }
        // A map's bound, wherever the schema states one.
        let schema = serde_json::json!({"properties": {"m": {"maxProperties": 2, "additionalProperties": {"maxLength": 1}}}});
        let err = walk(
            &schema,
            &serde_json::json!({"m": {"a": "x", "b": "y", "c": "z"}}),
            "spec",
        )
        .expect_err("too many");
        assert_eq!(err.field, "spec.m");
        let err =
            walk(&schema, &serde_json::json!({"m": {"a": "long"}}), "spec").expect_err("too long");
        assert_eq!(err.field, "spec.m.a");
    }
}
