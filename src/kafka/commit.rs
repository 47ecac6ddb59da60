//! Committing a group's offsets with a bound on the wait.
//!
//! librdkafka's synchronous commit takes no timeout: it waits for the group's coordinator for
//! as long as that takes. One in flight while a broker restarted never returned (in the
//! project's chaos test, over an hour), so a command that commits would hang the same way.

use std::sync::mpsc;
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};

/// Commits `offsets` through `consumer` and hands the consumer back, or fails with
/// `OperationTimedOut` when the commit has not returned within `timeout`. The commit runs on
/// a thread of its own; past the timeout that thread keeps the consumer and is left to finish
/// (or to end with the process).
pub fn commit_within<C>(
    consumer: BaseConsumer<C>,
    offsets: TopicPartitionList,
    timeout: Duration,
) -> KafkaResult<BaseConsumer<C>>
where
    C: ConsumerContext + 'static,
{
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("commit".into())
        .spawn(move || {
            let result = consumer.commit(&offsets, CommitMode::Sync);
            // The receiver is gone when the wait timed out: the consumer ends here then.
            let _ = tx.send(result.map(|()| consumer));
        })
        .map_err(|_| KafkaError::ConsumerCommit(RDKafkaErrorCode::Fail))?;
    match rx.recv_timeout(timeout) {
        Ok(result) => result,
        Err(_) => Err(KafkaError::ConsumerCommit(
            RDKafkaErrorCode::OperationTimedOut,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::ClientConfig;
    use rdkafka::Offset;
    use std::time::Instant;

    #[test]
    fn a_commit_nobody_answers_fails_at_the_timeout() {
        // Port 9 (discard) on loopback: nothing serves Kafka there, so the coordinator is
        // never found and librdkafka's own wait has no end.
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("group.id", "commit-within-test")
            .set("log_level", "0")
            .create()
            .unwrap();
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset("t", 0, Offset::Offset(5))
            .unwrap();
        let started = Instant::now();
        let result = commit_within(consumer, offsets, Duration::from_millis(500));
        let took = started.elapsed();
        assert!(
            matches!(
                result,
                Err(KafkaError::ConsumerCommit(
                    RDKafkaErrorCode::OperationTimedOut
                ))
            ),
            "{:?}",
            result.err()
        );
        assert!(took < Duration::from_secs(5), "waited {took:?}");
    }
}
