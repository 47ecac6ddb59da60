//! One group's state and members as its coordinator reports them, for groups of both
//! protocols: classic, and the consumer protocol of KIP-848 (`group.protocol=consumer`), which
//! the classic DescribeGroups (rust-rdkafka's `fetch_group_list`) reports as `Dead` with no
//! members while its consumers run. Through librdkafka's DescribeConsumerGroups
//! ([`mirrorflow_rdkafka_ext`]). A streams group (KIP-1071) is no consumer group to that call,
//! which answers as for no group at all: [`describe_any`] asks the coordinator once more, with
//! StreamsGroupDescribe on the project's own connections.

use std::time::{Duration, Instant};

use rdkafka::client::{Client, ClientContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The protocol type a share group (KIP-932) is listed with: its consumers' positions are the
/// share coordinator's start offsets, not committed offsets.
pub const SHARE: &str = "share";
/// The protocol type a streams group (KIP-1071) is listed with: it commits offsets as a
/// consumer group does.
pub const STREAMS: &str = "streams";

/// A group as its coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Membership {
    /// `Empty`, `Stable`, `PreparingRebalance`, `CompletingRebalance`, `Dead` (no such group);
    /// a streams group's `NotReady`, `Assigning`, `Reconciling` too.
    pub state: String,
    /// `classic`, `consumer` (KIP-848) or `streams` (KIP-1071, [`describe_any`]); `unknown`
    /// for a group that does not exist.
    pub protocol: String,
    pub members: usize,
}

impl Membership {
    /// Members present: a commit now would race the running consumers.
    pub fn is_active(&self) -> bool {
        self.members > 0
    }
}

/// While a group's coordinator moves or loads, the answer is an error worth asking again.
fn is_transient(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::NotCoordinator
            | RDKafkaErrorCode::CoordinatorLoadInProgress
            | RDKafkaErrorCode::CoordinatorNotAvailable
    )
}

/// Describes `group` through `client`, asking again while its coordinator moves, within
/// `timeout` in all. Errors are [`KafkaError::AdminOp`] with the coordinator's code, so
/// [`super::is_unreachable`] tells an unreachable cluster apart.
pub fn describe<C: ClientContext>(
    client: &Client<C>,
    group: &str,
    timeout: Duration,
) -> Result<Membership, KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let answer = mirrorflow_rdkafka_ext::describe_groups(client, &[group], left)
            .map_err(|e| KafkaError::AdminOp(e.code))?;
        let code = match answer.into_iter().next() {
            Some(Ok(d)) => {
                return Ok(Membership {
                    state: d.state.to_string(),
                    protocol: d.protocol.to_string(),
                    members: d.members,
                });
            }
            Some(Err((_, e))) if e.code == RDKafkaErrorCode::GroupIdNotFound => {
                return Ok(Membership {
                    state: "Dead".into(),
                    protocol: "unknown".into(),
                    members: 0,
                });
            }
            Some(Err((_, e))) => e.code,
            None => RDKafkaErrorCode::Fail,
        };
        if !is_transient(code) || Instant::now() + Duration::from_millis(200) >= deadline {
            return Err(KafkaError::AdminOp(code));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// [`describe`], and when it finds no group of the name, whether a streams group has it,
/// asked through `own` (the project's own connection to the same cluster): a Kafka Streams
/// application running with `group.protocol=streams` must not be taken for an absent group
/// and committed into. Without `own` (a security setting those connections do not speak) or
/// on a broker without the API (no streams groups there), the group stays absent. Failing to
/// ask is an error: the group is not known to be idle.
pub fn describe_any<C: ClientContext>(
    client: &Client<C>,
    own: Option<&mut mirrorflow_conn::Cluster>,
    group: &str,
    timeout: Duration,
) -> Result<Membership, KafkaError> {
    let found = describe(client, group, timeout)?;
    // A streams group is answered as a dead group (the classic description) or as no group.
    let absent = found.state == "Dead" && found.members == 0;
    let Some(own) = own.filter(|_| absent) else {
        return Ok(found);
    };
    match own.describe_streams_group(group) {
        Ok(s) if !s.error.is_error() => Ok(Membership {
            state: s.state,
            protocol: "streams".into(),
            members: s.members,
        }),
        Ok(_) | Err(mirrorflow_conn::ConnError::Unsupported { .. }) => Ok(found),
        Err(e) => {
            tracing::debug!(group, error = %e, "asking whether a group is a streams group failed");
            Err(KafkaError::AdminOp(RDKafkaErrorCode::Fail))
        }
    }
}
