//! The worker's protocol without a broker: fencing, rewind after revocation, dead-letter
//! ordering, store failures and the rollup output, driven through [`Worker::step`] and
//! [`Worker::flush`] with the fakes of [`fakes`].

mod fakes;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::IngestMetrics;
use arrow::array::RecordBatch;
use prost::Message as _;
use rdkafka::Offset;
use toolspan_pipeline::{Pipeline, Stats};
use toolspan_schema::Code;
use toolspan_store::{TableKind, WriterConfig};

use self::fakes::{
    app, span_ids, FakeConsumer, FakeDeadLetters, FakeTable, Happened, Journal, Topic,
};
use super::output::Output;
use super::spans::SpansOutput;
use super::worker::{Shared, Worker};
use super::KafkaIngestConfig;
use crate::metrics_job::rollup::RollupOutput;
use crate::observer::BatchObserver;

const TOPIC: &str = "spans";

/// A payload that is not OTLP in any encoding (wire type 7 does not exist).
const POISON: &[u8] = &[0xff, 0xff, 0xff, 0xff];

/// A topic, a table and a dead-letter sink sharing one journal, and a runtime for the table.
struct Rig {
    rt: tokio::runtime::Runtime,
    journal: Journal,
    topic: Topic,
    table: FakeTable,
    dead_letters: FakeDeadLetters,
    fleet: toolspan_gen::Fleet,
    /// Span ids of each produced message, by (partition, offset); empty for poison.
    produced: Vec<((i32, i64), Vec<String>)>,
}

impl Rig {
    fn new() -> Rig {
        let journal = Journal::default();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime for the fake table");
        Rig {
            rt,
            topic: Topic::default(),
            table: FakeTable::new(&journal),
            dead_letters: FakeDeadLetters::new(&journal),
            fleet: toolspan_gen::Fleet::new(toolspan_gen::FleetConfig::default()),
            produced: Vec::new(),
            journal,
        }
    }

    /// Produces `n` messages of two traces each to `partition`.
    fn produce(&mut self, partition: i32, n: usize) {
        for _ in 0..n {
            let req = self
                .fleet
                .request(2, 1_700_000_000_000_000_000, 60_000_000_000);
            let bytes = req.encode_to_vec();
            let done = Pipeline::builtin()
                .process_bytes(&bytes, toolspan_pipeline::Encoding::Protobuf)
                .expect("a fleet request decodes");
            let offset = self.topic.produce(partition, bytes);
            self.produced.push((
                (partition, offset),
                span_ids(std::slice::from_ref(&done.batch)),
            ));
        }
    }

    fn produce_poison(&mut self, partition: i32) -> i64 {
        let offset = self.topic.produce(partition, POISON.to_vec());
        self.produced.push(((partition, offset), Vec::new()));
        offset
    }

    /// The span ids of the messages of `partition` in `offsets`, in order.
    fn ids(&self, partition: i32, offsets: std::ops::Range<i64>) -> Vec<String> {
        self.produced
            .iter()
            .filter(|((p, o), _)| *p == partition && offsets.contains(o))
            .flat_map(|(_, ids)| ids.clone())
            .collect()
    }

    fn consumer(&self, unrecorded: Offset) -> FakeConsumer {
        FakeConsumer::new(
            TOPIC,
            &self.topic,
            &self.table,
            unrecorded,
            self.rt.handle(),
            &self.journal,
        )
    }

    fn shared(&self) -> Shared {
        Shared {
            pipeline: Arc::new(Pipeline::builtin()),
            metrics: IngestMetrics::kafka(TOPIC),
            handle: self.rt.handle().clone(),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// An ingest worker that flushes only when told to (or when `max_rows` is reached).
    fn ingest(&self, max_rows: usize) -> Worker<FakeTable, SpansOutput<FakeDeadLetters>> {
        self.ingest_every(max_rows, Duration::from_secs(3600))
    }

    /// An ingest worker that flushes at `max_rows` or when its rows are `max_age` old.
    fn ingest_every(
        &self,
        max_rows: usize,
        max_age: Duration,
    ) -> Worker<FakeTable, SpansOutput<FakeDeadLetters>> {
        let mut config = KafkaIngestConfig::new("fake:9092", TOPIC);
        config.writer = WriterConfig {
            max_rows,
            max_bytes: usize::MAX,
            max_age,
        };
        let empty = RecordBatch::new_empty(TableKind::Spans.schema());
        let output = SpansOutput::new(
            self.dead_letters.clone(),
            TOPIC,
            &config.dlq_topic,
            None,
            empty,
        );
        Worker::new(
            config,
            self.table.clone(),
            output,
            Offset::Beginning,
            self.shared(),
        )
    }
}

impl Rig {
    /// `n` messages on `partition`, read (not flushed) by a worker that flushes when told to.
    fn reading(
        &mut self,
        partition: i32,
        n: usize,
    ) -> (
        FakeConsumer,
        Worker<FakeTable, SpansOutput<FakeDeadLetters>>,
    ) {
        self.produce(partition, n);
        let c = self.consumer(Offset::Beginning);
        let mut w = self.ingest(usize::MAX);
        c.rebalance_assign(&[partition]);
        drain(&mut w, &c);
        (c, w)
    }
}

/// Steps until a poll finds nothing (every produced message read, held rows staged).
fn drain<O: Output>(w: &mut Worker<FakeTable, O>, c: &FakeConsumer) {
    for _ in 0..10_000 {
        let before = w.summary().messages;
        w.step(c).expect("a step");
        if w.summary().messages == before {
            return;
        }
    }
    panic!("the worker never went idle");
}

fn commit(txns: &[(i32, i64)], rows: usize) -> Happened {
    Happened::Commit {
        rows,
        txns: txns.iter().map(|(p, v)| (app(TOPIC, *p), *v)).collect(),
    }
}

#[test]
fn a_flush_commits_the_rows_with_each_partitions_last_offset_and_a_restart_resumes_after_it() {
    let mut rig = Rig::new();
    rig.produce(0, 3);
    rig.produce(1, 2);
    let c = rig.consumer(Offset::Beginning);
    let mut w = rig.ingest(usize::MAX);
    c.rebalance_assign(&[0, 1]);
    drain(&mut w, &c);
    w.flush(&c);
    let rows = rig.ids(0, 0..3).len() + rig.ids(1, 0..2).len();
    assert_eq!(rig.journal.commits(), vec![commit(&[(0, 2), (1, 1)], rows)]);
    assert_eq!(w.summary().spans, rows as u64);

    // A new worker (a restart) resumes after the recorded offsets: only new messages land.
    rig.produce(0, 1);
    let c2 = rig.consumer(Offset::Beginning);
    // This one flushes as soon as rows are staged (at an idle poll): the worker's own trigger.
    let mut w2 = rig.ingest(1);
    c2.rebalance_assign(&[0, 1]);
    drain(&mut w2, &c2);
    w2.shutdown(&c2);
    assert_eq!(w2.summary().messages, 1);
    let mut want = rig.ids(0, 0..3);
    want.extend(rig.ids(1, 0..2));
    want.extend(rig.ids(0, 3..4));
    assert_eq!(
        rig.table.span_ids(),
        want,
        "every span once, in offset order"
    );
}

#[test]
fn a_zombie_flush_is_fenced_drops_its_buffer_and_rewinds_to_the_offset_the_table_records() {
    let mut rig = Rig::new();
    rig.produce(0, 3);
    // The zombie: assigned partition 0 when the table recorded nothing, reads 0..3.
    let zc = rig.consumer(Offset::Beginning);
    let mut zombie = rig.ingest(usize::MAX);
    zc.rebalance_assign(&[0]);
    drain(&mut zombie, &zc);
    // Meanwhile the partition's new owner reads 0..5 and commits them.
    rig.produce(0, 2);
    let oc = rig.consumer(Offset::Beginning);
    let mut owner = rig.ingest(usize::MAX);
    oc.rebalance_assign(&[0]);
    drain(&mut owner, &oc);
    owner.flush(&oc);
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(4));

    // The zombie's commit is refused; it drops its buffer and re-reads from offset 5.
    zombie.flush(&zc);
    let zombie_rows = rig.ids(0, 0..3).len() as u64;
    assert!(rig
        .journal
        .position(&Happened::Refused(format!("fenced {}", app(TOPIC, 0))))
        .is_some());
    assert_eq!(
        rig.journal.all().last(),
        Some(&Happened::Assign(vec![(0, Offset::Offset(5))]))
    );
    assert_eq!(zombie.summary().discarded_spans, zombie_rows);
    assert_eq!(zombie.summary().commits, 0);
    assert_eq!(
        rig.journal.commits().len(),
        1,
        "nothing of the zombie's landed"
    );

    // Fenced at the new version, it commits what comes next, once.
    rig.produce(0, 1);
    drain(&mut zombie, &zc);
    zombie.flush(&zc);
    assert_eq!(
        zombie.summary().messages,
        4,
        "3 before fencing, then only offset 5"
    );
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(5));
    assert_eq!(rig.table.span_ids(), rig.ids(0, 0..6));
}

#[test]
fn revocation_drops_the_unflushed_buffer_and_the_next_assignment_rereads_it_from_the_table() {
    let mut rig = Rig::new();
    let (c, mut w) = rig.reading(0, 3);
    w.flush(&c);
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(2));

    // Two more are read (and staged) but not flushed when the partition is revoked.
    rig.produce(0, 2);
    drain(&mut w, &c);
    assert_eq!(w.summary().messages, 5);
    c.rebalance_revoke();
    w.step(&c).expect("a step");
    assert_eq!(w.summary().discarded_spans, rig.ids(0, 3..5).len() as u64);
    w.flush(&c);
    assert_eq!(
        rig.table.recorded_now(&app(TOPIC, 0)),
        Some(2),
        "nothing after the revocation committed"
    );

    // Assigned again, the worker resumes after offset 2: it re-reads 3 and 4, then 5.
    rig.produce(0, 1);
    c.rebalance_assign(&[0]);
    drain(&mut w, &c);
    w.flush(&c);
    assert_eq!(
        w.summary().messages,
        8,
        "offsets 3 and 4 read twice, 5 once"
    );
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(5));
    assert_eq!(
        rig.table.span_ids(),
        rig.ids(0, 0..6),
        "every span exactly once"
    );
}

#[test]
fn a_poison_message_is_dead_lettered_before_the_commit_that_moves_past_it() {
    let mut rig = Rig::new();
    rig.produce(0, 1);
    let poison = rig.produce_poison(0);
    let c = rig.consumer(Offset::Beginning);
    let mut w = rig.ingest(usize::MAX);
    c.rebalance_assign(&[0]);
    drain(&mut w, &c);
    w.flush(&c);

    // The letter is acknowledged first, then the commit records the poison's offset (the rows
    // before it were staged first, so the recorded offset did not go back to 0).
    let letter = Happened::DeadLetter {
        partition: 0,
        offset: poison,
    };
    let landed = commit(&[(0, poison)], rig.ids(0, 0..1).len());
    let (l, k) = (rig.journal.position(&letter), rig.journal.position(&landed));
    assert!(
        l.is_some() && k.is_some() && l < k,
        "dead letter before the commit: {:?}",
        rig.journal.all()
    );
    assert_eq!(w.summary().dead_letters, 1);

    let sent = rig.dead_letters.sent();
    assert_eq!(sent.len(), 1);
    let (source, dlq, d) = &sent[0];
    assert_eq!((source.as_str(), dlq.as_str()), (TOPIC, "spans.dlq"));
    assert_eq!((d.partition, d.offset), (0, poison));
    assert_eq!(d.payload, POISON, "the payload is kept as is");
    assert_eq!(d.key.as_deref(), Some(format!("key-{poison}").as_bytes()));
    assert_eq!(d.code, Code::OtlpDecode);
    assert!(!d.message.is_empty() && d.message.len() <= 1024);

    // The partition moves on: later messages commit after it.
    rig.produce(0, 1);
    drain(&mut w, &c);
    w.flush(&c);
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(poison + 1));
    assert_eq!(rig.table.span_ids(), rig.ids(0, 0..3));
}

#[test]
fn a_failed_dead_letter_delivery_commits_nothing_pauses_and_the_retry_sends_the_letter_once() {
    let mut rig = Rig::new();
    rig.produce(0, 1);
    let poison = rig.produce_poison(0);
    let c = rig.consumer(Offset::Beginning);
    let mut w = rig.ingest(usize::MAX);
    c.rebalance_assign(&[0]);
    drain(&mut w, &c);
    rig.dead_letters.fail_next(1);
    w.flush(&c);
    assert!(
        rig.journal.commits().is_empty(),
        "no commit past an unacknowledged letter"
    );
    assert!(c.is_paused(0), "consumption paused while the flush fails");
    assert_eq!(w.summary().dead_letters, 0);

    w.flush(&c);
    let letter = Happened::DeadLetter {
        partition: 0,
        offset: poison,
    };
    let landed = commit(&[(0, poison)], rig.ids(0, 0..1).len());
    let (l, k) = (rig.journal.position(&letter), rig.journal.position(&landed));
    assert!(
        l.is_some() && l < k,
        "dead letter before the commit: {:?}",
        rig.journal.all()
    );
    assert!(!c.is_paused(0), "resumed after the retry");
    assert_eq!(rig.dead_letters.sent().len(), 1);
    assert_eq!(w.summary().dead_letters, 1);
}

#[test]
fn rows_the_store_refuses_for_good_send_their_message_alone_to_the_dead_letter_topic() {
    let mut rig = Rig::new();
    rig.produce(0, 2);
    rig.produce(1, 1);
    rig.produce(0, 2);
    // One span of the partition-0 message at offset 1 can never be written.
    let bad = rig.ids(0, 1..2)[0].clone();
    rig.table.refuse_rows_of(&bad);
    let c = rig.consumer(Offset::Beginning);
    let mut w = rig.ingest(usize::MAX);
    c.rebalance_assign(&[0, 1]);
    drain(&mut w, &c);
    w.flush(&c);
    assert!(
        rig.journal.commits().is_empty(),
        "the whole buffer was refused"
    );
    assert!(
        !c.is_paused(0),
        "a refusal for good does not pause as an outage does"
    );

    // Read again, a release at a time: everything but the refused message lands, once.
    for _ in 0..20 {
        drain(&mut w, &c);
    }
    let mut want = rig.ids(0, 0..1);
    want.extend(rig.ids(0, 2..4));
    want.extend(rig.ids(1, 0..1));
    let mut got = rig.table.span_ids();
    got.sort();
    want.sort();
    assert_eq!(got, want, "every other span exactly once");
    let sent = rig.dead_letters.sent();
    assert_eq!(sent.len(), 1, "one dead letter: {:?}", rig.journal.all());
    let (_, dlq, d) = &sent[0];
    assert_eq!((dlq.as_str(), d.partition, d.offset), ("spans.dlq", 0, 1));
    assert_eq!(
        d.payload,
        rig.topic.payload(0, 1),
        "the message as it was produced"
    );
    assert!(
        d.message.contains("retrying cannot fix it"),
        "{}",
        d.message
    );
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(3));
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 1)), Some(0));

    // Past the refused message, flushes batch again: two new messages, one commit.
    let before = rig.journal.commits().len();
    rig.produce(0, 2);
    drain(&mut w, &c);
    w.flush(&c);
    assert_eq!(
        rig.journal.commits().len(),
        before + 1,
        "one commit for both"
    );
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(5));
}

#[test]
fn a_store_failure_keeps_the_buffer_pauses_and_the_retry_commits_it_once() {
    let mut rig = Rig::new();
    let (c, mut w) = rig.reading(0, 2);
    rig.table.fail_next_commits(1);
    w.flush(&c);
    assert_eq!(w.summary().commit_failures, 1);
    assert!(c.is_paused(0));
    assert!(rig.journal.commits().is_empty());

    w.flush(&c);
    assert!(!c.is_paused(0));
    assert_eq!(
        rig.journal.commits(),
        vec![commit(&[(0, 1)], rig.ids(0, 0..2).len())]
    );
    assert_eq!(rig.table.span_ids(), rig.ids(0, 0..2));
}

#[test]
fn a_commit_whose_answer_was_lost_is_fenced_on_retry_and_the_partitions_read_again() {
    // The object store wrote the commit but the connection dropped before its answer (as in
    // an outage that starts mid-request): the worker pauses and retries; the retry finds the
    // table already past its buffer, drops it and re-reads from the table's offsets. The
    // partitions were paused while failing and must be read again after the re-assignment.
    let mut rig = Rig::new();
    let (c, mut w) = rig.reading(0, 3);
    rig.table.lose_next_acks(1);
    w.flush(&c);
    assert!(
        c.is_paused(0),
        "paused while the commit's outcome is unknown"
    );
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(2));

    w.flush(&c);
    assert_eq!(
        rig.journal.all().last(),
        Some(&Happened::Resume(vec![0])),
        "re-assigned after the fence, then resumed: {:?}",
        rig.journal.all()
    );
    assert!(!c.is_paused(0));

    rig.produce(0, 2);
    drain(&mut w, &c);
    w.flush(&c);
    assert_eq!(w.summary().messages, 5, "offsets 0..3, then 3 and 4");
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(4));
    assert_eq!(rig.table.span_ids(), rig.ids(0, 0..5), "every span once");
}

#[test]
fn partitions_revoked_while_paused_are_read_again_when_assigned_back() {
    let mut rig = Rig::new();
    let (c, mut w) = rig.reading(0, 2);
    rig.table.fail_next_commits(1);
    w.flush(&c);
    assert!(c.is_paused(0));

    // Revoked while failing (the buffer is dropped), then assigned back.
    c.rebalance_revoke();
    w.step(&c).expect("a step");
    c.rebalance_assign(&[0]);
    w.step(&c).expect("a step");
    assert!(!c.is_paused(0), "resumed on the new assignment");
    rig.produce(0, 1);
    drain(&mut w, &c);
    w.flush(&c);
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(2));
    assert_eq!(rig.table.span_ids(), rig.ids(0, 0..3), "every span once");
}

/// Counts the spans it observes.
#[derive(Default)]
struct Counting(Mutex<(u64, u64)>);

impl BatchObserver for Counting {
    fn observe(&self, batch: &RecordBatch, _stats: &Stats) {
        let mut n = self.0.lock().unwrap_or_else(|p| p.into_inner());
        n.0 += 1;
        n.1 += batch.num_rows() as u64;
    }
}

fn rollup_worker(
    rig: &Rig,
    observer: Arc<Counting>,
    unrecorded: Offset,
) -> Worker<FakeTable, RollupOutput> {
    let mut config = KafkaIngestConfig::new("fake:9092", TOPIC);
    config.writer = WriterConfig {
        max_rows: usize::MAX,
        max_bytes: usize::MAX,
        max_age: Duration::from_secs(3600),
    };
    let output = RollupOutput::new(
        observer,
        RecordBatch::new_empty(TableKind::FailureRates.schema()),
    );
    Worker::new(config, rig.table.clone(), output, unrecorded, rig.shared())
}

#[test]
fn the_rollup_observes_each_message_skips_poison_and_commits_one_merged_batch_with_the_offsets() {
    let mut rig = Rig::new();
    rig.produce(0, 2);
    let poison = rig.produce_poison(0);
    let observer = Arc::new(Counting::default());
    let c = rig.consumer(Offset::Beginning);
    let mut w = rollup_worker(&rig, observer.clone(), Offset::Beginning);
    c.rebalance_assign(&[0]);
    drain(&mut w, &c);
    w.flush(&c);
    let spans = rig.ids(0, 0..2).len() as u64;
    assert_eq!(
        *observer.0.lock().unwrap_or_else(|p| p.into_inner()),
        (2, spans)
    );
    assert!(
        rig.dead_letters.sent().is_empty(),
        "the rollup does not dead-letter"
    );
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(poison));
    assert_eq!(rig.table.batches().len(), 1, "one merged batch per flush");
    assert_eq!(w.summary().spans, spans);

    // Revoked before a flush, the buffered spans are counted as discarded.
    rig.produce(0, 1);
    drain(&mut w, &c);
    c.rebalance_revoke();
    w.step(&c).expect("a step");
    assert_eq!(w.summary().discarded_spans, rig.ids(0, 3..4).len() as u64);
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(poison));
}

#[test]
fn a_partition_the_table_has_no_offset_for_starts_at_the_unrecorded_offset() {
    let mut rig = Rig::new();
    rig.produce(0, 2);
    let observer = Arc::new(Counting::default());
    let c = rig.consumer(Offset::End);
    let mut w = rollup_worker(&rig, observer.clone(), Offset::End);
    c.rebalance_assign(&[0]);
    drain(&mut w, &c);
    assert_eq!(w.summary().messages, 0, "rates from now on");
    rig.produce(0, 1);
    drain(&mut w, &c);
    w.flush(&c);
    assert_eq!(w.summary().messages, 1);
    assert_eq!(rig.table.recorded_now(&app(TOPIC, 0)), Some(2));
}

/// Milliseconds since the epoch, `ago` before now.
fn produced(ago: Duration) -> i64 {
    (std::time::SystemTime::now() - ago)
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as i64
}

/// Steps until the worker has read one more message.
fn read_one<O: Output>(w: &mut Worker<FakeTable, O>, c: &FakeConsumer) {
    let before = w.summary().messages;
    for _ in 0..100 {
        w.step(c).expect("a step");
        if w.summary().messages > before {
            return;
        }
    }
    panic!("no message was read");
}

#[test]
fn a_worker_behind_its_topic_flushes_less_often_until_it_has_caught_up() {
    let mut rig = Rig::new();
    rig.produce(0, 4);
    let c = rig.consumer(Offset::Beginning);
    let mut w = rig.ingest_every(usize::MAX, Duration::from_secs(1));
    c.rebalance_assign(&[0]);

    // A backlog: messages produced a minute ago. Fewer, larger commits end it sooner.
    c.produced_at(produced(Duration::from_secs(60)));
    read_one(&mut w, &c);
    assert_eq!(w.flush_interval(), Duration::from_secs(5));

    // Caught up: a message produced a moment ago brings the configured interval back.
    c.produced_at(produced(Duration::from_millis(200)));
    read_one(&mut w, &c);
    assert_eq!(w.flush_interval(), Duration::from_secs(1));

    // A message without a timestamp says nothing of a lag: the configured interval.
    c.produced_at(produced(Duration::from_secs(60)));
    read_one(&mut w, &c);
    assert_eq!(w.flush_interval(), Duration::from_secs(5));
    c.without_timestamps();
    read_one(&mut w, &c);
    assert_eq!(w.flush_interval(), Duration::from_secs(1));

    // An interval configured above the catch-up one is kept while behind.
    let mut rig = Rig::new();
    rig.produce(0, 1);
    let c = rig.consumer(Offset::Beginning);
    let mut w = rig.ingest(usize::MAX);
    c.rebalance_assign(&[0]);
    c.produced_at(produced(Duration::from_secs(60)));
    read_one(&mut w, &c);
    assert_eq!(w.flush_interval(), Duration::from_secs(3600));
}
