//! The switchover's fence: who may not write to the flow's source topics while it runs. DENY
//! WRITE ACLs of its own on the source (refused while such ACLs exist already, so `--abort`
//! deletes only its own), or the user's command for clusters without an authorizer.

use std::time::Instant;

use rdkafka::consumer::Consumer;

use super::{CALL_TIMEOUT, FencedTopic, Outcome, SwitchoverArgs, SwitchoverReport};
use crate::cli::{CliError, clusters};
use crate::flow::Flow;
use crate::kafka::acls::{
    AclBinding, AclError, AclFilter, Operation, PatternType, Permission, ResourceType,
};

/// What the fence needs on the source's cluster resource: DESCRIBE to read ACLs, ALTER to
/// create and delete them.
const FENCE_NEEDS: &[Operation] = &[Operation::Describe, Operation::Alter];

fn fenced(bindings: &[AclBinding]) -> Vec<FencedTopic> {
    bindings
        .iter()
        .map(|b| FencedTopic {
            topic: b.name.clone(),
            principal: b.principal.clone(),
        })
        .collect()
}

/// The DENY WRITE binding of `principal` on `topic`.
/// The filter that matches exactly `b`.
fn filter_of(b: AclBinding) -> AclFilter {
    AclFilter {
        resource_type: b.resource_type,
        name: Some(b.name),
        pattern: b.pattern,
        principal: Some(b.principal),
        host: Some(b.host),
        operation: b.operation,
        permission: b.permission,
    }
}

pub fn deny_write(topic: &str, principal: &str) -> AclBinding {
    crate::kafka::acls::topic_binding(topic, principal, Operation::Write, Permission::Deny)
}

/// The fence's bindings for `topics` and `principals`, refused when one exists already (then
/// `--abort` could not tell the switchover's own from those someone else made).
pub fn fence_plan(
    topics: &[String],
    principals: &[String],
    existing: &[AclBinding],
) -> Result<Vec<AclBinding>, String> {
    let wanted: Vec<AclBinding> = topics
        .iter()
        .flat_map(|t| principals.iter().map(move |p| deny_write(t, p)))
        .collect();
    match wanted.iter().find(|w| existing.contains(w)) {
        Some(w) => Err(format!(
            "a DENY WRITE ACL for {} on topic {} exists already, so --abort could not tell it from the switchover's own; remove it (or leave that principal out) and run again, or run --abort if an earlier switchover made it",
            w.principal, w.name
        )),
        None => Ok(wanted),
    }
}

/// Runs the user's fence command for `step` (`fence` or `unfence`).
fn run_fence_command(command: &str, step: &str, topics: &[String]) -> Result<String, String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("MIRRORFLOW_SWITCHOVER_STEP", step)
        .env("MIRRORFLOW_TOPICS", topics.join(","))
        .output()
        .map_err(|e| format!("--fence-command could not run: {e}"))?;
    let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if out.status.success() {
        Ok(format!("--fence-command ({step}) exited 0"))
    } else {
        Err(format!(
            "--fence-command ({step}) failed ({}): {said}",
            out.status
        ))
    }
}

fn acl_client(flow: &Flow) -> Result<rdkafka::consumer::BaseConsumer, CliError> {
    clusters::consumer(&flow.source_client, "source", "mirrorflow-cli")
}

/// Fails naming what to grant when the command's principal lacks DESCRIBE or ALTER on the
/// source cluster: DescribeAcls would answer "no bindings" instead of refusing (librdkafka
/// drops that error), and the fence would be planned on a wrong picture.
fn may_manage_acls(client: &rdkafka::consumer::BaseConsumer) -> Result<(), String> {
    let granted = mirrorflow_rdkafka_ext::acls::cluster_operations(client.client(), CALL_TIMEOUT)
        .map_err(|e| {
        acl_failure(
            "reading the principal's operations on the source cluster",
            &e,
        )
    })?;
    let lacking = crate::kafka::acls::lacking(granted.as_deref(), FENCE_NEEDS);
    if lacking.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the principal running this command lacks {lacking:?} on the source cluster, needed to read and create the fence's ACLs; grant them (kafka-acls --add --allow-principal <principal> --operation Describe --operation Alter --cluster), or use --fence-command"
    ))
}

fn existing_fences(flow: &Flow, principals: &[String]) -> Result<Vec<AclBinding>, String> {
    let client = acl_client(flow).map_err(|e| e.to_string())?;
    may_manage_acls(&client)?;
    let mut out = Vec::new();
    for principal in principals {
        let filter = AclFilter {
            resource_type: ResourceType::Topic,
            name: None,
            pattern: PatternType::Literal,
            principal: Some(principal.clone()),
            host: None,
            operation: Operation::Write,
            permission: Permission::Deny,
        };
        let found =
            mirrorflow_rdkafka_ext::acls::describe_acls(client.client(), &filter, CALL_TIMEOUT)
                .map_err(|e| acl_failure("reading the source's ACLs", &e))?;
        out.extend(found);
    }
    Ok(out)
}

fn acl_failure(what: &str, e: &AclError) -> String {
    format!(
        "{what} failed: {e}; the source needs an authorizer and the principal running this command ALTER and DESCRIBE on the source cluster (or use --fence-command)"
    )
}

pub(super) fn fence(
    flow: &Flow,
    args: &SwitchoverArgs,
    topics: &[String],
    report: &mut SwitchoverReport,
) {
    let started = Instant::now();
    if let Some(command) = &args.fence_command {
        if !args.apply {
            return report.step(
                "fence",
                started,
                Outcome::Planned,
                format!(
                    "would run --fence-command with fence for {} topics",
                    topics.len()
                ),
            );
        }
        let ran = run_fence_command(command, "fence", topics);
        return report.ended("fence", started, ran);
    }
    let planned = existing_fences(flow, &args.principals)
        .and_then(|existing| fence_plan(topics, &args.principals, &existing));
    let bindings = match planned {
        Ok(b) => b,
        Err(d) => return report.step("fence", started, Outcome::Failed, d),
    };
    report.fence = fenced(&bindings);
    if !args.apply {
        return report.step(
            "fence",
            started,
            Outcome::Planned,
            format!(
                "would create {} DENY WRITE ACLs on the source",
                bindings.len()
            ),
        );
    }
    let created = acl_client(flow).map_err(|e| e.to_string()).and_then(|c| {
        mirrorflow_rdkafka_ext::acls::create_acls(c.client(), &bindings, CALL_TIMEOUT)
            .map_err(|e| acl_failure("creating the fence's ACLs", &e))
    });
    let failed: Vec<String> = match created {
        Ok(results) => results
            .iter()
            .zip(&bindings)
            .filter_map(|(r, b)| {
                r.as_ref()
                    .err()
                    .map(|e| format!("{} on {}: {e}", b.principal, b.name))
            })
            .collect(),
        Err(d) => vec![d],
    };
    if failed.is_empty() {
        report.step(
            "fence",
            started,
            Outcome::Done,
            format!("created {} DENY WRITE ACLs on the source", bindings.len()),
        );
    } else {
        report.step("fence", started, Outcome::Failed, failed.join("; "));
    }
}

pub(super) fn abort(
    flow: &Flow,
    args: &SwitchoverArgs,
    topics: &[String],
    report: &mut SwitchoverReport,
) {
    let started = Instant::now();
    if let Some(command) = &args.fence_command {
        let ran = run_fence_command(command, "unfence", topics);
        return report.ended("unfence", started, ran);
    }
    // The fence's ACLs are found on the cluster, not rebuilt from today's topics: a topic
    // deleted since the fence (Kafka keeps its ACLs, and a topic created again under that name
    // would be fenced) or no longer in the flow's metadata still has its DENY to lift. Ours
    // are the DENY WRITEs of the named principals on topics the flow selects (or selected
    // when fenced, listed in `topics`).
    let deleted = acl_client(flow).map_err(|e| e.to_string()).and_then(|c| {
        let mut filters = Vec::new();
        for principal in &args.principals {
            let any_topic = AclFilter {
                name: None,
                ..filter_of(deny_write("*", principal))
            };
            let found =
                mirrorflow_rdkafka_ext::acls::describe_acls(c.client(), &any_topic, CALL_TIMEOUT)
                    .map_err(|e| acl_failure("reading the fence's ACLs", &e))?;
            filters.extend(
                found
                    .into_iter()
                    .filter(|b| b.pattern == PatternType::Literal && b.host == "*")
                    .filter(|b| flow.topics.matches(&b.name) || topics.contains(&b.name))
                    .map(filter_of),
            );
        }
        mirrorflow_rdkafka_ext::acls::delete_acls(c.client(), &filters, CALL_TIMEOUT)
            .map_err(|e| acl_failure("deleting the fence's ACLs", &e))
    });
    match deleted {
        Ok(gone) => {
            report.fence = fenced(&gone);
            report.step(
                "unfence",
                started,
                Outcome::Done,
                format!("deleted {} DENY WRITE ACLs on the source", gone.len()),
            );
        }
        Err(d) => report.step("unfence", started, Outcome::Failed, d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_is_a_deny_write_per_topic_and_principal() {
        let topics = vec!["orders".to_string(), "payments".to_string()];
        let principals = vec!["User:app".to_string()];
        let plan = fence_plan(&topics, &principals, &[]).unwrap();
        assert_eq!(
            plan,
            vec![
                deny_write("orders", "User:app"),
                deny_write("payments", "User:app")
            ]
        );
        assert_eq!(plan[0].permission, Permission::Deny);
        assert_eq!(plan[0].operation, Operation::Write);
        assert_eq!(
            (plan[0].pattern, plan[0].host.as_str()),
            (PatternType::Literal, "*")
        );
    }

    #[test]
    fn a_fence_that_exists_already_is_refused_so_abort_removes_only_its_own() {
        let topics = vec!["orders".to_string()];
        let principals = vec!["User:app".to_string(), "User:other".to_string()];
        let existing = vec![deny_write("orders", "User:other")];
        let err = fence_plan(&topics, &principals, &existing).unwrap_err();
        assert!(
            err.contains("User:other") && err.contains("orders"),
            "{err}"
        );
        // Someone else's unrelated ACL does not matter.
        let unrelated = vec![deny_write("audit", "User:app")];
        assert_eq!(
            fence_plan(&topics, &principals, &unrelated).unwrap().len(),
            2
        );
    }
}
