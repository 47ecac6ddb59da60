//! The source consumer's rebalance callback, shared by both copy modes: librdkafka calls it
//! from inside `poll` on the copy thread; the copier decides where partitions start and what
//! happens to those taken away, this applies the answer with the group's protocol.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaResult;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};

use super::shared::{self, Shared};
use super::slots::{Keyed, SlotTable};
use crate::replicator::context::Context;
use crate::replicator::stops::lock;

/// What a copier does when its assignment changes.
pub trait Owner {
    /// Partitions were given to this replica: set each one's start offset in `tpl`.
    fn assigned(&mut self, tpl: &mut TopicPartitionList);
    /// Partitions were taken away; `lost` when another replica may already own them.
    fn revoked(&mut self, tpl: &TopicPartitionList, lost: bool);
    /// The partitions owned now, one slot each.
    type Slot: Keyed;
    fn slots(&self) -> &SlotTable<Self::Slot>;
    fn shared(&self) -> &Shared;

    fn context(&self) -> &Context {
        &self.shared().ctx
    }

    /// Every partition owned now.
    fn owned(&self) -> TopicPartitionList {
        self.slots().assignment()
    }

    fn count_error(&self, kind: &str) {
        shared::count_error(self.context(), kind);
    }
    /// After a failed rebalance everything is given up; whether as lost (exactly-once: the
    /// next owner's fencing settles open transactions) or in good order (positions stored).
    const FAILED_REBALANCE_IS_LOST: bool;
    /// The delivery mode, as log lines name it.
    const MODE: &str;

    /// Publishes how many partitions this consumer, and its replica, copy now, and of which
    /// topics (the first few: an assignment that misses a topic is seen in the log).
    fn report_assignment(&self) {
        let n = self.slots().len();
        let worker = &self.shared().worker;
        let replica = worker.assigned(self.context(), n);
        let mut per_topic = std::collections::BTreeMap::<String, usize>::new();
        for (topic, _) in self.slots().keys() {
            *per_topic.entry(topic).or_default() += 1;
        }
        let more = per_topic.len().saturating_sub(ASSIGNMENT_TOPICS_LOGGED);
        let topics: Vec<String> = per_topic
            .iter()
            .take(ASSIGNMENT_TOPICS_LOGGED)
            .map(|(t, n)| format!("{t}:{n}"))
            .collect();
        tracing::info!(
            partitions = n,
            topics = %topics.join(","),
            more_topics = more,
            consumer = worker.index(),
            replica_partitions = replica,
            mode = Self::MODE,
            "source partitions assigned to this consumer"
        );
    }
}

/// How many topics an assignment's log line names.
const ASSIGNMENT_TOPICS_LOGGED: usize = 8;

/// Applies a rebalance; `pause` pauses what is assigned (a policy that fetches it itself).
pub fn rebalance<C: ConsumerContext, O: Owner>(
    owner: &Mutex<O>,
    consumer: &BaseConsumer<C>,
    err: RDKafkaRespErr,
    tpl: &mut TopicPartitionList,
    pause: bool,
) {
    let outcome = match err {
        RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
            lock(owner).assigned(tpl);
            // Before `poll` returns: no fetch of them has started yet.
            match take(consumer, tpl) {
                Ok(()) if pause => consumer.pause(tpl),
                other => other,
            }
        }
        RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
            let lost = consumer.assignment_lost();
            lock(owner).revoked(tpl, lost);
            release(consumer, Some(tpl))
        }
        other => {
            tracing::error!(error = ?other, "rebalance failed; giving up the assignment");
            let mut o = lock(owner);
            o.count_error("rebalance");
            let all = o.owned();
            o.revoked(&all, O::FAILED_REBALANCE_IS_LOST);
            drop(o);
            release(consumer, None)
        }
    };
    if let Err(e) = outcome {
        lock(owner).count_error("rebalance");
        tracing::error!(error = %e, "applying a rebalance failed");
    }
}

/// Revokes every owned partition through the owner, as a graceful revocation does, and
/// unassigns them in this consumer only: the group is not told (a static member that stops
/// keeps its assignment in the group until it returns or its session ends).
pub fn give_up_locally<C: ConsumerContext, O: Owner>(owner: &Mutex<O>, consumer: &BaseConsumer<C>) {
    let mut o = lock(owner);
    let all = o.owned();
    o.revoked(&all, false);
    drop(o);
    if let Err(e) = release(consumer, None) {
        tracing::warn!(error = %e, "unassigning at shutdown failed");
    }
}

fn cooperative<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> bool {
    matches!(
        consumer.rebalance_protocol(),
        RebalanceProtocol::Cooperative
    )
}

/// Adds `tpl` to this consumer's assignment: incrementally under the cooperative protocol,
/// as the whole assignment under the eager one.
fn take<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: &TopicPartitionList,
) -> KafkaResult<()> {
    match cooperative(consumer) {
        true => consumer.incremental_assign(tpl),
        false => consumer.assign(tpl),
    }
}

/// Gives `tpl` up in this consumer (`None`: everything it holds). Under the cooperative
/// protocol librdkafka refuses a plain unassign ("Erroneous state"), so the partitions are
/// given up incrementally there; under the eager one a revocation is always of everything.
fn release<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: Option<&TopicPartitionList>,
) -> KafkaResult<()> {
    if !cooperative(consumer) {
        return consumer.unassign();
    }
    match tpl {
        Some(tpl) => consumer.incremental_unassign(tpl),
        None => consumer.incremental_unassign(&consumer.assignment()?),
    }
}

/// The (topic, partition) of every element of `tpl`.
pub fn partitions(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    let elements = tpl.elements();
    elements
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

/// Sets the start offset of every partition of `keys` in an assignment: `ready`'s where the
/// policy knows it, the beginning for the others (their records are skipped until the policy
/// has prepared them and moved them to their position). A partition left unset would fall back
/// to a committed offset (there is none) and stop on `auto.offset.reset=error`.
pub fn set_start_offsets(
    tpl: &mut TopicPartitionList,
    keys: &[(String, i32)],
    ready: Vec<(String, i32, Offset)>,
) {
    let all = keys.iter().map(|(t, p)| (t.clone(), *p, Offset::Beginning));
    for (topic, partition, offset) in all.chain(ready) {
        if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
            tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
        }
    }
}

/// Moves an owned partition's fetch position to `offset`. A partition librdkafka stopped after
/// an offset reset error (`auto.offset.reset=error`) refuses `seek` ("Erroneous state"), so a
/// refused seek assigns the partition again, starting at `offset`.
pub fn reposition<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    offset: Offset,
) -> KafkaResult<()> {
    let Err(refused) = consumer.seek(topic, partition, offset, Duration::from_secs(5)) else {
        return Ok(());
    };
    tracing::debug!(%topic, partition, error = %refused, "seek refused; assigning the partition again");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, offset)?;
    consumer.incremental_unassign(&tpl)?;
    consumer.incremental_assign(&tpl)
}
