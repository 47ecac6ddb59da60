//! Replicator pods the cluster refuses to create.
//!
//! A pod refused at its creation (a ResourceQuota with no room, a LimitRange, the namespace's
//! Pod Security level, an admission webhook) never exists, so no pod status says why: only the
//! StatefulSet controller's `FailedCreate` Events on the flow's StatefulSet do. They are read
//! for that one object, a few at most, and only while one of its replicas is missing.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

use super::Context;

/// Events read at most per reason and look. The StatefulSet controller's Events are
/// count-compressed (one object per pod and message), so a StatefulSet has few; a tenant who
/// may create Events could add more, each up to the apiserver's object size.
const READ_MAX: u32 = 10;

/// One look at a time across every flow: with [`READ_MAX`] it bounds what hostile Events
/// can make the shared operator hold (2 x 10 objects of at most 1.5 MiB).
static LOOKING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// The words of the StatefulSet controller's latest refusal to create a pod of `stateful_set`
/// in `ns`, unless a pod was created after it.
pub async fn newest(
    ctx: &Context,
    ns: &str,
    stateful_set: &str,
) -> Result<Option<String>, kube::Error> {
    let Ok(_turn) = LOOKING.acquire().await else {
        return Ok(None);
    };
    let api = Api::<Event>::namespaced(ctx.client.clone(), ns);
    let mut events = Vec::new();
    for reason in ["FailedCreate", "SuccessfulCreate"] {
        let params = ListParams::default()
            .fields(&format!(
                "involvedObject.kind=StatefulSet,involvedObject.name={stateful_set},reason={reason}"
            ))
            .limit(READ_MAX);
        events.extend(api.list(&params).await?.items);
    }
    Ok(unanswered_refusal(&events))
}

/// When `e` last happened, by whichever clock its reporter filled in.
fn last_seen(e: &Event) -> Option<Timestamp> {
    (e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
}

/// The message of the newest `FailedCreate` when no `SuccessfulCreate` came after it. Not a
/// time window: the controller's backoff grows to many minutes between attempts, and a
/// refusal stands until a creation succeeds. A pod merely on its way during a rollout follows
/// a `SuccessfulCreate`.
fn unanswered_refusal(events: &[Event]) -> Option<String> {
    let newest = events
        .iter()
        .filter(|e| {
            matches!(
                e.reason.as_deref(),
                Some("FailedCreate" | "SuccessfulCreate")
            )
        })
        .filter_map(|e| Some((last_seen(e)?, e)))
        .max_by_key(|(at, _)| *at)?
        .1;
    (newest.reason.as_deref() == Some("FailedCreate"))
        .then(|| newest.message.clone())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn event(reason: &str, message: &str, at: Timestamp) -> Event {
        Event {
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_timestamp: Some(Time(at)),
            ..Event::default()
        }
    }

    #[test]
    fn a_refusal_stands_until_a_creation_succeeds_after_it() {
        let now = Timestamp::now();
        let ago = |s: i64| now - k8s_openapi::jiff::SignedDuration::from_secs(s);
        let refused_long_ago = event("FailedCreate", "quota", ago(3000));
        let created = event(
            "SuccessfulCreate",
            "create Pod f-0 in StatefulSet f successful",
            ago(60),
        );
        let refused_again = event("FailedCreate", "webhook", ago(5));
        let other = event("SuccessfulDelete", "delete Pod f-1", ago(1));
        assert_eq!(
            unanswered_refusal(std::slice::from_ref(&refused_long_ago)).as_deref(),
            Some("quota"),
            "however old, while nothing was created after it"
        );
        assert_eq!(
            unanswered_refusal(&[refused_long_ago.clone(), created.clone(), other.clone()]),
            None,
            "a pod created since: a missing pod now is one on its way"
        );
        assert_eq!(
            unanswered_refusal(&[refused_long_ago, created, refused_again, other]).as_deref(),
            Some("webhook")
        );
        assert_eq!(unanswered_refusal(&[]), None);
    }
}
