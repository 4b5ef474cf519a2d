//! The consumer as the worker sees it: poll, the queued rebalances, and the few assignment
//! calls the protocol makes (pause and resume while the store fails, re-assign after fencing,
//! the advisory offset commit). librdkafka's [`BaseConsumer`] is the real one; the unit tests
//! drive the worker with a scripted consumer.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::rebalance::{Ctx, Event};

/// The consumer surface the worker uses, for one topic.
pub(super) trait PartitionConsumer {
    /// A polled message.
    type Msg<'a>: Message
    where
        Self: 'a;

    /// Waits up to `timeout` for a message or an error. Rebalances seen meanwhile are queued
    /// for [`PartitionConsumer::take_events`].
    fn poll(&self, timeout: Duration) -> Option<KafkaResult<Self::Msg<'_>>>;

    /// The rebalances since the last call, in order. Each assignment has already been applied
    /// at the offsets the table records.
    fn take_events(&self) -> Vec<Event>;

    /// The partitions assigned now.
    fn assignment(&self) -> KafkaResult<Vec<i32>>;

    /// Replaces the assignment: each partition resumes at its offset.
    fn assign(&self, starts: &[(i32, Offset)]) -> KafkaResult<()>;

    /// Stops fetching `partitions` (bounded memory while the store fails).
    fn pause(&self, partitions: &[i32]) -> KafkaResult<()>;

    /// Fetches `partitions` again.
    fn resume(&self, partitions: &[i32]) -> KafkaResult<()>;

    /// Commits `(partition, next offset)` pairs to Kafka without waiting. Advisory only (lag
    /// monitoring): the table's offsets are the ones the worker resumes from.
    fn commit_advisory(&self, next: &[(i32, i64)]) -> KafkaResult<()>;
}

/// A partition list of the consumer's topic; `None` offsets leave the offset unset.
fn partition_list(
    consumer: &BaseConsumer<Ctx>,
    parts: impl IntoIterator<Item = (i32, Option<Offset>)>,
) -> KafkaResult<TopicPartitionList> {
    let topic = &consumer.context().topic;
    let mut tpl = TopicPartitionList::new();
    for (p, offset) in parts {
        match offset {
            Some(o) => tpl.add_partition_offset(topic, p, o)?,
            None => {
                tpl.add_partition(topic, p);
            }
        }
    }
    Ok(tpl)
}

impl PartitionConsumer for BaseConsumer<Ctx> {
    type Msg<'a> = BorrowedMessage<'a>;

    fn poll(&self, timeout: Duration) -> Option<KafkaResult<BorrowedMessage<'_>>> {
        BaseConsumer::poll(self, timeout)
    }

    fn take_events(&self) -> Vec<Event> {
        self.context().take_events()
    }

    fn assignment(&self) -> KafkaResult<Vec<i32>> {
        Ok(Consumer::assignment(self)?
            .elements()
            .iter()
            .map(|e| e.partition())
            .collect())
    }

    fn assign(&self, starts: &[(i32, Offset)]) -> KafkaResult<()> {
        let tpl = partition_list(self, starts.iter().map(|(p, o)| (*p, Some(*o))))?;
        Consumer::assign(self, &tpl)
    }

    fn pause(&self, partitions: &[i32]) -> KafkaResult<()> {
        let tpl = partition_list(self, partitions.iter().map(|p| (*p, None)))?;
        Consumer::pause(self, &tpl)
    }

    fn resume(&self, partitions: &[i32]) -> KafkaResult<()> {
        let tpl = partition_list(self, partitions.iter().map(|p| (*p, None)))?;
        Consumer::resume(self, &tpl)
    }

    fn commit_advisory(&self, next: &[(i32, i64)]) -> KafkaResult<()> {
        let tpl = partition_list(
            self,
            next.iter().map(|(p, o)| (*p, Some(Offset::Offset(*o)))),
        )?;
        Consumer::commit(self, &tpl, CommitMode::Async)
    }
}
