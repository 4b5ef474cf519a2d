//! Fakes for the worker's unit tests: a topic in memory, a consumer that fetches from it and
//! applies rebalances the way the real rebalance callback does (at the table's offsets), a
//! table that checks fences and stale versions like [`toolspan_store::SpanTable`], and a
//! dead-letter sink. All of them write what they did, in order, to one [`Journal`].

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arrow::array::{RecordBatch, StringArray};
use rdkafka::error::KafkaResult;
use rdkafka::message::{OwnedMessage, Timestamp};
use rdkafka::Offset;
use toolspan_schema::columns::col;
use toolspan_store::{CommitInfo, Committer, StoreError, StoreErrorKind};

use super::super::dead_letter::{DeadLetter, DeadLetterSink, Delivered};
use super::super::rebalance::Event;
use super::super::table::{recorded_blocking, resume_at, OffsetTable};
use super::super::{app_id, consumer::PartitionConsumer};

/// Locks a test mutex; a poisoned one only means another assertion already failed.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Something a fake did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happened {
    /// The broker acknowledged a dead letter of this source partition and offset.
    DeadLetter { partition: i32, offset: i64 },
    /// A commit landed, recording these versions.
    Commit {
        rows: usize,
        txns: Vec<(String, i64)>,
    },
    /// A commit was refused.
    Refused(String),
    /// The consumer was (re-)assigned partitions at offsets.
    Assign(Vec<(i32, Offset)>),
    /// Partitions paused.
    Pause(Vec<i32>),
    /// Partitions resumed.
    Resume(Vec<i32>),
}

/// What the fakes did, in order.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<Vec<Happened>>>);

impl Journal {
    fn push(&self, h: Happened) {
        lock(&self.0).push(h);
    }

    /// Everything so far.
    pub fn all(&self) -> Vec<Happened> {
        lock(&self.0).clone()
    }

    /// Where `h` is, if it happened.
    pub fn position(&self, h: &Happened) -> Option<usize> {
        lock(&self.0).iter().position(|x| x == h)
    }

    /// The commits that landed.
    pub fn commits(&self) -> Vec<Happened> {
        self.all()
            .into_iter()
            .filter(|h| matches!(h, Happened::Commit { .. }))
            .collect()
    }
}

/// A topic: per partition, each message's payload by offset.
#[derive(Clone, Default)]
pub struct Topic(Arc<Mutex<BTreeMap<i32, Vec<Vec<u8>>>>>);

impl Topic {
    /// Appends a message; returns its offset.
    pub fn produce(&self, partition: i32, payload: Vec<u8>) -> i64 {
        let mut t = lock(&self.0);
        let log = t.entry(partition).or_default();
        log.push(payload);
        log.len() as i64 - 1
    }

    /// The payload produced at `offset` of `partition`.
    pub fn payload(&self, partition: i32, offset: i64) -> Vec<u8> {
        self.get(partition, offset).expect("a produced message")
    }

    fn len(&self, partition: i32) -> i64 {
        lock(&self.0).get(&partition).map_or(0, |l| l.len() as i64)
    }

    fn get(&self, partition: i32, offset: i64) -> Option<Vec<u8>> {
        lock(&self.0)
            .get(&partition)?
            .get(usize::try_from(offset).ok()?)
            .cloned()
    }
}

#[derive(Default)]
struct TableState {
    version: u64,
    recorded: BTreeMap<String, i64>,
    batches: Vec<RecordBatch>,
    fail_commits: usize,
    lose_acks: usize,
    /// Span ids whose rows the table refuses for good (as a partition value no path may hold).
    refused_spans: Vec<String>,
}

/// A table in memory with [`toolspan_store::SpanTable::commit_fenced`]'s checks.
#[derive(Clone)]
pub struct FakeTable {
    state: Arc<Mutex<TableState>>,
    journal: Journal,
}

impl FakeTable {
    /// An empty table writing to `journal`.
    pub fn new(journal: &Journal) -> FakeTable {
        FakeTable {
            state: Arc::default(),
            journal: journal.clone(),
        }
    }

    /// The version the table records for `app`.
    pub fn recorded_now(&self, app: &str) -> Option<i64> {
        lock(&self.state).recorded.get(app).copied()
    }

    /// Makes the next `n` commits fail as an unavailable store does.
    pub fn fail_next_commits(&self, n: usize) {
        lock(&self.state).fail_commits = n;
    }

    /// Makes the next `n` commits land but report an unavailable store, as when the
    /// connection drops after the object store wrote the commit.
    pub fn lose_next_acks(&self, n: usize) {
        lock(&self.state).lose_acks = n;
    }

    /// Makes every commit holding a row of `span_id` fail as rows the store cannot take do.
    pub fn refuse_rows_of(&self, span_id: &str) {
        lock(&self.state).refused_spans.push(span_id.to_string());
    }

    /// Every committed batch.
    pub fn batches(&self) -> Vec<RecordBatch> {
        lock(&self.state).batches.clone()
    }

    /// The span ids of every committed row, in commit order.
    pub fn span_ids(&self) -> Vec<String> {
        span_ids(&self.batches())
    }

    fn apply(
        &self,
        batches: Vec<RecordBatch>,
        txns: &[(String, i64)],
        fences: &[(String, Option<i64>)],
    ) -> Result<CommitInfo, StoreError> {
        let mut s = lock(&self.state);
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        if rows == 0 && txns.is_empty() {
            return Ok(CommitInfo {
                version: s.version,
                rows: 0,
                files: 0,
            });
        }
        if s.fail_commits > 0 {
            s.fail_commits -= 1;
            self.journal.push(Happened::Refused("unavailable".into()));
            return Err(StoreError::new(
                StoreErrorKind::Unavailable {
                    op: "writing data files and committing",
                },
                "fake",
            ));
        }
        if !s.refused_spans.is_empty()
            && span_ids(&batches)
                .iter()
                .any(|id| s.refused_spans.contains(id))
        {
            self.journal.push(Happened::Refused("rejected".into()));
            return Err(StoreError::new(
                StoreErrorKind::Rejected {
                    op: "writing data files",
                },
                "fake",
            ));
        }
        for (app_id, expected) in fences {
            let recorded = s.recorded.get(app_id).copied();
            if recorded != *expected {
                self.journal
                    .push(Happened::Refused(format!("fenced {app_id}")));
                return Err(StoreError::new(
                    StoreErrorKind::Fenced {
                        app_id: app_id.clone(),
                        recorded,
                        expected: *expected,
                    },
                    "fake",
                ));
            }
        }
        for (app_id, attempted) in txns {
            if let Some(&recorded) = s.recorded.get(app_id) {
                if *attempted <= recorded {
                    self.journal
                        .push(Happened::Refused(format!("stale {app_id}")));
                    return Err(StoreError::new(
                        StoreErrorKind::StaleTransaction {
                            app_id: app_id.clone(),
                            recorded,
                            attempted: *attempted,
                        },
                        "fake",
                    ));
                }
            }
        }
        for (app_id, v) in txns {
            s.recorded.insert(app_id.clone(), *v);
        }
        let files = batches.iter().filter(|b| b.num_rows() > 0).count();
        s.batches
            .extend(batches.into_iter().filter(|b| b.num_rows() > 0));
        s.version += 1;
        self.journal.push(Happened::Commit {
            rows,
            txns: txns.to_vec(),
        });
        if s.lose_acks > 0 {
            s.lose_acks -= 1;
            return Err(StoreError::new(
                StoreErrorKind::Unavailable {
                    op: "writing data files and committing",
                },
                "fake",
            ));
        }
        Ok(CommitInfo {
            version: s.version,
            rows,
            files,
        })
    }
}

impl Committer for FakeTable {
    fn commit(
        &self,
        batches: Vec<RecordBatch>,
        txns: &[(String, i64)],
        fences: &[(String, Option<i64>)],
    ) -> impl Future<Output = Result<CommitInfo, StoreError>> + Send {
        std::future::ready(self.apply(batches, txns, fences))
    }
}

impl OffsetTable for FakeTable {
    fn recorded(
        &self,
        app_id: &str,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send {
        std::future::ready(Ok(self.recorded_now(app_id)))
    }
}

#[derive(Default)]
struct ConsumerState {
    /// Assigned partitions and the next offset each fetches.
    position: BTreeMap<i32, i64>,
    /// Paused partitions. As in librdkafka, a pause outlives revocation and re-assignment
    /// (confluentinc/librdkafka#1849): only `resume` ends it.
    paused: BTreeSet<i32>,
    events: Vec<Event>,
    /// The timestamp the messages read next carry (none by default).
    timestamp: Option<Timestamp>,
}

/// One group member reading [`Topic`].
pub struct FakeConsumer {
    topic_name: String,
    topic: Topic,
    table: FakeTable,
    unrecorded: Offset,
    handle: tokio::runtime::Handle,
    journal: Journal,
    state: RefCell<ConsumerState>,
}

impl FakeConsumer {
    /// A consumer of `topic` (named `topic_name`) resuming from `table`.
    pub fn new(
        topic_name: &str,
        topic: &Topic,
        table: &FakeTable,
        unrecorded: Offset,
        handle: &tokio::runtime::Handle,
        journal: &Journal,
    ) -> FakeConsumer {
        FakeConsumer {
            topic_name: topic_name.to_string(),
            topic: topic.clone(),
            table: table.clone(),
            unrecorded,
            handle: handle.clone(),
            journal: journal.clone(),
            state: RefCell::default(),
        }
    }

    fn resolve(&self, partition: i32, start: Offset) -> i64 {
        match start {
            Offset::Offset(o) => o,
            Offset::End => self.topic.len(partition),
            _ => 0,
        }
    }

    /// The messages read from now on were produced at `ms` (milliseconds since the epoch).
    pub fn produced_at(&self, ms: i64) {
        self.state.borrow_mut().timestamp = Some(Timestamp::CreateTime(ms));
    }

    /// The messages read from now on carry no timestamp.
    pub fn without_timestamps(&self) {
        self.state.borrow_mut().timestamp = None;
    }

    /// A rebalance assigning `partitions`, as the rebalance callback does it: each resumes
    /// after the offset the table records, and the worker hears of it at its next poll.
    pub fn rebalance_assign(&self, partitions: &[i32]) {
        let stop = AtomicBool::new(false);
        let mut assigned = Vec::new();
        let mut st = self.state.borrow_mut();
        st.position.clear();
        for &p in partitions {
            let recorded = recorded_blocking(&self.table, &self.handle, &stop, &self.topic_name, p);
            let start = self.resolve(p, resume_at(recorded, self.unrecorded));
            st.position.insert(p, start);
            assigned.push((p, recorded));
        }
        st.events.push(Event::Assigned(assigned));
    }

    /// A rebalance revoking every partition (eager rebalancing).
    pub fn rebalance_revoke(&self) {
        let mut st = self.state.borrow_mut();
        let parts: Vec<i32> = st.position.keys().copied().collect();
        st.position.clear();
        st.events.push(Event::Revoked(parts));
    }

    /// Whether `partition` is paused.
    pub fn is_paused(&self, partition: i32) -> bool {
        self.state.borrow().paused.contains(&partition)
    }
}

impl PartitionConsumer for FakeConsumer {
    type Msg<'a> = OwnedMessage;

    fn poll(&self, _timeout: Duration) -> Option<KafkaResult<OwnedMessage>> {
        let mut st = self.state.borrow_mut();
        let ready: Vec<(i32, i64)> = st
            .position
            .iter()
            .filter(|(p, _)| !st.paused.contains(p))
            .map(|(p, o)| (*p, *o))
            .collect();
        for (p, offset) in ready {
            if let Some(payload) = self.topic.get(p, offset) {
                st.position.insert(p, offset + 1);
                let m = OwnedMessage::new(
                    Some(payload),
                    Some(format!("key-{offset}").into_bytes()),
                    self.topic_name.clone(),
                    st.timestamp.unwrap_or(Timestamp::NotAvailable),
                    p,
                    offset,
                    None,
                );
                return Some(Ok(m));
            }
        }
        None
    }

    fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut self.state.borrow_mut().events)
    }

    fn assignment(&self) -> KafkaResult<Vec<i32>> {
        Ok(self.state.borrow().position.keys().copied().collect())
    }

    fn assign(&self, starts: &[(i32, Offset)]) -> KafkaResult<()> {
        self.journal.push(Happened::Assign(starts.to_vec()));
        let position = starts
            .iter()
            .map(|(p, o)| (*p, self.resolve(*p, *o)))
            .collect();
        let mut st = self.state.borrow_mut();
        st.position = position;
        Ok(())
    }

    fn pause(&self, partitions: &[i32]) -> KafkaResult<()> {
        self.journal.push(Happened::Pause(partitions.to_vec()));
        self.state.borrow_mut().paused.extend(partitions);
        Ok(())
    }

    fn resume(&self, partitions: &[i32]) -> KafkaResult<()> {
        self.journal.push(Happened::Resume(partitions.to_vec()));
        let mut st = self.state.borrow_mut();
        for p in partitions {
            st.paused.remove(p);
        }
        Ok(())
    }

    fn commit_advisory(&self, _next: &[(i32, i64)]) -> KafkaResult<()> {
        Ok(())
    }
}

/// A dead-letter topic that acknowledges letters, or refuses them while told to.
#[derive(Clone)]
pub struct FakeDeadLetters {
    journal: Journal,
    failures: Arc<Mutex<usize>>,
    sent: Arc<Mutex<Vec<(String, String, DeadLetter)>>>,
}

impl FakeDeadLetters {
    /// A sink writing to `journal`.
    pub fn new(journal: &Journal) -> FakeDeadLetters {
        FakeDeadLetters {
            journal: journal.clone(),
            failures: Arc::default(),
            sent: Arc::default(),
        }
    }

    /// Makes the next `n` deliveries fail.
    pub fn fail_next(&self, n: usize) {
        *lock(&self.failures) = n;
    }

    /// `(source topic, dead-letter topic, letter)` of every acknowledged letter.
    pub fn sent(&self) -> Vec<(String, String, DeadLetter)> {
        lock(&self.sent).clone()
    }
}

impl DeadLetterSink for FakeDeadLetters {
    fn serve_events(&self) {}

    fn deliver(&self, source_topic: &str, dlq_topic: &str, letters: Vec<DeadLetter>) -> Delivered {
        let mut failures = lock(&self.failures);
        if *failures > 0 {
            *failures -= 1;
            return Delivered {
                sent: Vec::new(),
                failed: letters,
                first_error: Some("broker unavailable".into()),
            };
        }
        for d in &letters {
            self.journal.push(Happened::DeadLetter {
                partition: d.partition,
                offset: d.offset,
            });
            lock(&self.sent).push((source_topic.to_string(), dlq_topic.to_string(), d.clone()));
        }
        Delivered {
            sent: letters,
            failed: Vec::new(),
            first_error: None,
        }
    }
}

/// The span ids of `batches`' rows.
pub fn span_ids(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b
            .column_by_name(col::SPAN_ID)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .unwrap_or_else(|| panic!("no span_id strings in {:?}", b.schema()));
        out.extend(ids.iter().map(|v| v.unwrap_or_default().to_string()));
    }
    out
}

/// The app id of partition `p` of the test topic.
pub fn app(topic: &str, p: i32) -> String {
    app_id(topic, p)
}
