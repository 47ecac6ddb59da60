//! A child object the apiserver refused, told as the spec field that produced the bad value.
//!
//! The operator derives the StatefulSet, ConfigMap, Service and PodDisruptionBudget from the
//! flow; when the apiserver refuses one (a name too long for a derived object, an invalid label
//! or annotation key, limits below requests, an invalid toleration...), its error names a field
//! of the child, which the flow's author never wrote. This maps it back to theirs.

use kube::core::Status;

/// Child field paths (as the apiserver prints them, prefix match) and the flow field their
/// value comes from. Most specific first.
const FIELD_ORIGINS: &[(&str, &str)] = &[
    // The apiserver names the pod template's metadata either way.
    ("spec.template.metadata.labels", "spec.pod.labels"),
    ("spec.template.labels", "spec.pod.labels"),
    ("spec.template.metadata.annotations", "spec.pod.annotations"),
    ("spec.template.annotations", "spec.pod.annotations"),
    ("spec.template.spec.tolerations", "spec.pod.tolerations"),
    ("spec.template.spec.nodeSelector", "spec.pod.nodeSelector"),
    (
        "spec.template.spec.topologySpreadConstraints",
        "spec.pod.topologySpreadConstraints",
    ),
    ("spec.template.spec.containers[0].image", "spec.pod.image"),
    (
        "spec.template.spec.containers[0].resources",
        "spec.resources",
    ),
    (
        "spec.template.spec.volumes",
        "the Secret names in spec.*.tls and spec.*.sasl",
    ),
    ("metadata.labels", "spec.pod.labels"),
    // Derived names (`<flow>`, `<flow>-flow`, `<flow>-metrics`) and the pods' revision label
    // (`<flow>-<hash>`, at most 63 characters) all grow from the flow's own name.
    ("metadata.name", "metadata.name"),
    ("spec.selector", "metadata.name"),
    ("spec.serviceName", "metadata.name"),
];

/// The longest flow name whose derived names all fit: pods carry the label
/// `controller-revision-hash: <name>-<10 characters>`, and label values have at most 63.
pub const MAX_FITTING_NAME: usize = 52;

/// Which flow field a child's field path comes from, when it is one the flow controls.
pub fn flow_field(child_field: &str) -> Option<&'static str> {
    FIELD_ORIGINS
        .iter()
        .find(|(prefix, _)| {
            child_field == *prefix
                || child_field
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with(['.', '[']))
        })
        .map(|(_, origin)| *origin)
}

/// The condition message for a refused child, or `None` when the error is not a refusal of
/// the object itself (apiserver down, conflicts, permissions: those are retried).
pub fn describe(kind: &str, name: &str, status: &Status) -> Option<String> {
    let refused = status.is_invalid() || status.code == 400 || status.reason == "BadRequest";
    if !refused {
        return None;
    }
    let causes: Vec<_> = status
        .details
        .as_ref()
        .map(|d| d.causes.iter().collect())
        .unwrap_or_default();
    let mut fields: Vec<&'static str> =
        causes.iter().filter_map(|c| flow_field(&c.field)).collect();
    if fields.is_empty() {
        // Some refusals carry no causes, only text that quotes the field.
        fields.extend(
            FIELD_ORIGINS
                .iter()
                .filter(|(prefix, _)| status.message.contains(prefix))
                .map(|(_, origin)| *origin)
                .take(1),
        );
    }
    fields.dedup();
    let field = match fields.as_slice() {
        [] => "the flow".to_string(),
        many => many.join(", "),
    };
    // The apiserver's own message names the rule that failed; it is bounded so one bad value
    // cannot blow up the status.
    let detail = crate::status::bounded_text(&status.message);
    let fix = match fields.first() {
        Some(&"metadata.name") => format!(
            "a flow's name cannot change: recreate the flow with a name of at most {MAX_FITTING_NAME} characters, which fits every object derived from it"
        ),
        Some(f) if f.starts_with("spec.") => {
            format!("fix {f} (`kubectl explain mirrorflow.{f}` says what is allowed)")
        }
        _ => format!("fix {field}"),
    };
    Some(format!(
        "{field}: the apiserver refused the replicators' {kind} '{name}' built from it: {detail}; {fix}"
    ))
}

/// The condition message for a write the cluster's policy refused: a 403 other than the
/// namespace being deleted (that one ends the reconcile: [`namespace_terminating`]). A
/// ResourceQuota, an admission webhook or policy, or the operator's own RBAC: each names who
/// refused and who can fix it, with the apiserver's words, bounded.
pub fn forbidden(kind: &str, name: &str, ns: &str, status: &Status) -> Option<String> {
    if status.code != 403 || namespace_terminating(status) {
        return None;
    }
    let detail = crate::status::bounded_text(&status.message);
    let lower = status.message.to_ascii_lowercase();
    let fix = if lower.contains("exceeded quota") {
        format!(
            "a ResourceQuota of namespace {ns} has no room for it: raise the quota (`kubectl describe resourcequota -n {ns}`)"
        )
    } else if lower.contains("admission webhook") || lower.contains("denied the request") {
        "an admission policy of the cluster refused it: its owners say what it requires".into()
    } else {
        format!(
            "the operator's service account may not write {kind} objects in namespace {ns}: the installer grants it there (the chart's RBAC does; with watchNamespace, only in that namespace)"
        )
    };
    Some(format!(
        "the apiserver refused to write the replicators' {kind} '{name}': {detail}; {fix}"
    ))
}

/// Whether the apiserver refused a write because the namespace is being deleted (its
/// NamespaceLifecycle admission: a 403 with the cause `NamespaceTerminating`, or, from older
/// apiservers, only the message). Nothing new can be created there again, and the namespace
/// controller deletes the flow itself: retrying would only repeat the refusal until then.
pub fn namespace_terminating(status: &Status) -> bool {
    const CAUSE: &str = "NamespaceTerminating";
    status.is_forbidden()
        && (status
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.reason == CAUSE))
            || status.message.contains("because it is being terminated"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::response::{StatusCause, StatusDetails};

    fn invalid(message: &str, fields: &[&str]) -> Status {
        Status {
            code: 422,
            reason: "Invalid".into(),
            message: message.into(),
            details: Some(StatusDetails {
                name: "f".into(),
                group: "apps".into(),
                kind: "StatefulSet".into(),
                uid: String::new(),
                causes: fields
                    .iter()
                    .map(|f| StatusCause {
                        reason: "FieldValueInvalid".into(),
                        message: "bad".into(),
                        field: (*f).into(),
                    })
                    .collect(),
                retry_after_seconds: 0,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn child_fields_map_back_to_the_flow_fields_that_made_them() {
        for (child, flow) in [
            ("spec.template.metadata.labels", "spec.pod.labels"),
            (
                "spec.template.metadata.annotations[bad key]",
                "spec.pod.annotations",
            ),
            (
                "spec.template.spec.tolerations[0].operator",
                "spec.pod.tolerations",
            ),
            (
                "spec.template.spec.containers[0].resources.requests",
                "spec.resources",
            ),
            ("metadata.labels", "spec.pod.labels"),
            ("metadata.name", "metadata.name"),
        ] {
            assert_eq!(flow_field(child), Some(flow), "{child}");
        }
        // A prefix must end at a path boundary.
        assert_eq!(flow_field("metadata.namespace"), None);
        assert_eq!(flow_field("spec.replicas"), None);
    }

    #[test]
    fn a_refusal_names_the_flow_field_and_keeps_the_apiservers_reason() {
        let s = invalid(
            "StatefulSet.apps \"f\" is invalid: spec.template.spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1",
            &["spec.template.spec.containers[0].resources.requests"],
        );
        let msg = describe("StatefulSet", "f", &s).expect("a refusal");
        assert!(msg.starts_with("spec.resources: "), "{msg}");
        assert!(
            msg.contains("must be less than or equal to cpu limit"),
            "{msg}"
        );
        assert!(
            msg.contains("kubectl explain mirrorflow.spec.resources"),
            "{msg}"
        );
    }

    #[test]
    fn refusals_without_causes_are_matched_on_their_text() {
        let mut s = invalid(
            "StatefulSet.apps \"f\" is invalid: spec.template.spec.nodeSelector: Invalid value: \"a b\"",
            &[],
        );
        s.details = None;
        let msg = describe("StatefulSet", "f", &s).expect("a refusal");
        assert!(msg.starts_with("spec.pod.nodeSelector: "), "{msg}");
    }

    #[test]
    fn transient_errors_are_not_refusals() {
        for (code, reason) in [
            (409, "Conflict"),
            (500, "InternalError"),
            (403, "Forbidden"),
        ] {
            let s = Status {
                code,
                reason: reason.into(),
                ..Default::default()
            };
            assert_eq!(describe("ConfigMap", "f-flow", &s), None, "{reason}");
        }
    }

    #[test]
    fn a_namespace_being_deleted_is_told_from_other_refusals() {
        let terminating = |causes: Vec<StatusCause>, message: &str| Status {
            code: 403,
            reason: "Forbidden".into(),
            message: message.into(),
            details: Some(StatusDetails {
                name: "f-flow".into(),
                group: String::new(),
                kind: "configmaps".into(),
                uid: String::new(),
                causes,
                retry_after_seconds: 0,
            }),
            ..Default::default()
        };
        let cause = StatusCause {
            reason: "NamespaceTerminating".into(),
            message: "namespace ns is being terminated".into(),
            field: "metadata.namespace".into(),
        };
        let said = "configmaps \"f-flow\" is forbidden: unable to create new content in namespace ns because it is being terminated";
        assert!(namespace_terminating(&terminating(vec![cause], said)));
        assert!(namespace_terminating(&terminating(Vec::new(), said)));
        // RBAC's refusal is a 403 too: not the namespace going.
        let rbac = "configmaps \"f-flow\" is forbidden: User \"system:serviceaccount:op:mirrorflow\" cannot patch resource \"configmaps\"";
        assert!(!namespace_terminating(&terminating(Vec::new(), rbac)));
        let mut invalid = terminating(Vec::new(), said);
        invalid.code = 422;
        invalid.reason = "Invalid".into();
        assert!(!namespace_terminating(&invalid));
    }
}
