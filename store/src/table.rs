//! [`SpanTable`]: the Delta Lake `spans` table, opened or created at a location, and the one
//! atomic commit that every writer uses.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use arrow::array::RecordBatch;
use arrow::array::TimestampMicrosecondArray;
use arrow::compute::{concat_batches, interleave};
use arrow::datatypes::SchemaRef;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel as _;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, StructField, StructType, Transaction};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::table::config::TablePropertiesExt as _;
use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use toolspan_schema::columns::{col, PARTITION_COLUMNS};
use toolspan_schema::spans_schema;
use url::Url;

use crate::error::{StoreError, StoreErrorKind};
use toolspan_schema::rollup;

/// The Delta table name written into the `spans` table's metadata.
pub const TABLE_NAME: &str = "spans";

/// The commit properties of every commit toolspan makes on `table` (appends and maintenance).
///
/// delta-rs 1.1 runs its expired-log cleanup after *every* commit when
/// `delta.enableExpiredLogCleanup` is on (the default), and that cleanup LISTs the whole
/// `_delta_log` (30 days of commits by default: hundreds of thousands of keys at a commit every
/// few seconds). The Delta protocol and Spark clean up only after writing a checkpoint, the only
/// point where cleanup can delete anything new, so toolspan asks for it on the commit that
/// writes the checkpoint (every `delta.checkpointInterval` versions) and on no other. On a local
/// disk the difference is a directory listing; on object storage, one LIST request per 1,000
/// log entries on every commit (bench/RESULTS.md, "Notes on the S3 test server").
pub(crate) fn commit_properties(table: &DeltaTable) -> CommitProperties {
    let (interval, cleanup_enabled) = table.snapshot().map_or((100, true), |s| {
        let config = s.table_config();
        (
            config.checkpoint_interval().get(),
            config.enable_expired_log_cleanup(),
        )
    });
    CommitProperties::default().with_cleanup_expired_logs(Some(
        cleanup_enabled && writes_checkpoint(table.version(), interval),
    ))
}

/// Whether the commit after `version` writes a checkpoint: delta-rs writes one after version
/// `v` when `v + 1` is a multiple of the interval. A commit that loses a race and lands one
/// version later than planned then skips (or adds) one cleanup; the next checkpoint catches up.
fn writes_checkpoint(version: Option<u64>, interval: u64) -> bool {
    let next = version.map_or(0, |v| v + 1);
    (next + 1).is_multiple_of(interval.max(1))
}

/// Which of toolspan's tables a [`SpanTable`] handle holds. All are written the same way
/// (one atomic append per flush, source positions as transaction versions); they differ in
/// columns, partitioning and the column rows are sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableKind {
    /// `spans`: one row per span, partitioned by tool, stage, date.
    Spans,
    /// `failure_rates_1m`: the metrics job's per-minute rollup (`toolspan_schema::rollup`),
    /// partitioned by date.
    FailureRates,
    /// `spans_quarantine`, next to `spans`: rows the `spans` table refused for a reason that
    /// retrying cannot fix, with the `spans` columns and no partitions, so that no value can
    /// keep them out.
    Quarantine,
}

/// The name of the quarantine table in the metadata, and its directory next to `spans`.
pub const QUARANTINE_TABLE_NAME: &str = "spans_quarantine";

impl TableKind {
    /// The table name in the Delta metadata.
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Spans => TABLE_NAME,
            TableKind::FailureRates => rollup::TABLE_NAME,
            TableKind::Quarantine => QUARANTINE_TABLE_NAME,
        }
    }

    /// The Arrow schema of the rows.
    pub fn schema(self) -> SchemaRef {
        match self {
            TableKind::Spans | TableKind::Quarantine => spans_schema(),
            TableKind::FailureRates => rollup::rollup_schema(),
        }
    }

    /// The partition columns, in order.
    pub fn partition_columns(self) -> &'static [&'static str] {
        match self {
            TableKind::Spans => &PARTITION_COLUMNS,
            TableKind::FailureRates => &rollup::PARTITION_COLUMNS,
            TableKind::Quarantine => &[],
        }
    }

    /// The column rows are sorted by within each data file (tight file statistics).
    pub fn sort_column(self) -> &'static str {
        match self {
            TableKind::Spans | TableKind::Quarantine => col::START_TIME,
            TableKind::FailureRates => rollup::col::MINUTE,
        }
    }

    fn comment(self) -> &'static str {
        match self {
            TableKind::Spans => "toolspan: one row per span",
            TableKind::Quarantine => {
                "toolspan: spans the spans table refused for a reason retrying cannot fix"
            }
            TableKind::FailureRates => {
                "toolspan: spans and failures per minute, tool, stage, error type, service (metrics job rollup)"
            }
        }
    }
}

/// What one commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    /// The table version the commit created.
    pub version: u64,
    /// Rows written.
    pub rows: usize,
    /// Parquet files added (0 for a commit that only records transactions).
    pub files: usize,
}

/// One of toolspan's Delta tables ([`TableKind`]; `spans` unless opened with
/// [`SpanTable::open_or_create_kind`]) at one location. Cheap to clone: clones share the
/// cached table state, so two writers in one process may hold clones and commit concurrently.
#[derive(Clone)]
pub struct SpanTable {
    inner: Arc<Inner>,
}

struct Inner {
    /// The latest state this process has seen; refreshed incrementally before each commit.
    table: RwLock<DeltaTable>,
    /// The location as given (may hold credentials: never logged or returned).
    location: String,
    /// The location for logs, with any password removed.
    label: String,
    kind: TableKind,
}

impl std::fmt::Debug for SpanTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanTable")
            .field("location", &self.inner.label)
            .finish()
    }
}

impl SpanTable {
    /// Opens the `spans` table at `location`, creating it (and, for a local path, its
    /// directories) when absent; verifies the schema and partitioning when present.
    ///
    /// `location` is a local directory path, a `file://` URI, an `s3://bucket/prefix` URI
    /// (S3 and S3-compatible stores, [`crate::storage`]) or `memory://`.
    pub async fn open_or_create(location: &str) -> Result<SpanTable, StoreError> {
        SpanTable::open_or_create_with_options(location, HashMap::new()).await
    }

    /// [`SpanTable::open_or_create`] with object-store options (credentials, endpoints), as
    /// delta-rs `storage_options` take them.
    pub async fn open_or_create_with_options(
        location: &str,
        storage_options: HashMap<String, String>,
    ) -> Result<SpanTable, StoreError> {
        SpanTable::open_or_create_kind(location, TableKind::Spans, storage_options).await
    }

    /// Opens or creates the table of `kind` at `location` (see
    /// [`SpanTable::open_or_create_with_options`]).
    pub async fn open_or_create_kind(
        location: &str,
        kind: TableKind,
        storage_options: HashMap<String, String>,
    ) -> Result<SpanTable, StoreError> {
        crate::storage::register_handlers();
        let url = table_url(location)?;
        let label = redact_url(&url);
        let mut table = DeltaTableBuilder::from_url(url)
            .and_then(|b| {
                b.with_storage_options(crate::storage::options_for(storage_options))
                    .build()
            })
            .map_err(|e| location_error(e, &label))?;
        match table.load().await {
            Ok(()) => table = evolve(table, &label, kind).await?,
            Err(DeltaTableError::NotATable(_)) => {
                table = create(&table, &label, kind).await?;
            }
            Err(e) => return Err(StoreError::from_delta("opening the table", e)),
        }
        verify(&table, kind)?;
        tracing::info!(location = %label, table = kind.name(), version = table.version(), "table open");
        Ok(SpanTable {
            inner: Arc::new(Inner {
                table: RwLock::new(table),
                location: location.to_string(),
                label,
                kind,
            }),
        })
    }

    /// Which table this is.
    pub fn kind(&self) -> TableKind {
        self.inner.kind
    }

    /// The location, for logs and diagnostics (password removed; may contain a local path,
    /// so never return it to API callers).
    pub fn location_label(&self) -> &str {
        &self.inner.label
    }

    /// A copy of the table refreshed to the latest committed version, for readers (the query
    /// engine builds its DataFusion provider from it).
    pub async fn latest(&self) -> Result<DeltaTable, StoreError> {
        let mut table = self.cached();
        table
            .update_incremental(None)
            .await
            .map_err(|e| StoreError::from_delta("reading the transaction log", e))?;
        self.remember(&table);
        Ok(table)
    }

    /// The latest committed version, found by listing the log (no state is loaded).
    pub async fn latest_version(&self) -> Result<u64, StoreError> {
        let table = self.cached();
        let from = table.version().unwrap_or(0);
        let v = table
            .log_store()
            .get_latest_version(from)
            .await
            .map_err(|e| StoreError::from_delta("listing the transaction log", e))?;
        Ok(v)
    }

    /// The version the latest snapshot records for an application id (a Kafka
    /// topic-partition), or `None` when the table has never seen it.
    pub async fn transaction_version(&self, app_id: &str) -> Result<Option<i64>, StoreError> {
        let table = self.latest().await?;
        let state = table
            .snapshot()
            .map_err(|e| StoreError::from_delta("reading the table state", e))?;
        state
            .transaction_version(table.log_store().as_ref(), app_id)
            .await
            .map_err(|e| StoreError::from_delta("reading transaction versions", e))
    }

    /// Writes `batches` as ONE atomic Delta commit (append, partitioned by tool, stage, date)
    /// that also records the application transactions `txns` (the fence of exactly-once commits).
    ///
    /// Refuses, with [`StoreErrorKind::StaleTransaction`], a transaction whose version is not
    /// newer than the one the table records: that data is already in the table. Concurrent
    /// commits carrying the same app id are refused by delta-rs's conflict checker, so two
    /// workers that both think they own a partition cannot both land the same offsets.
    ///
    /// Rows are sorted by `start_time` before writing so each file's time statistics are
    /// tight. A call with no rows and no transactions commits nothing and returns the current
    /// version with `rows == 0 && files == 0`.
    pub async fn commit(
        &self,
        batches: Vec<RecordBatch>,
        txns: &[(String, i64)],
    ) -> Result<CommitInfo, StoreError> {
        self.commit_fenced(batches, txns, &[]).await
    }

    /// [`SpanTable::commit`] that also requires, for each `(app_id, expected)` of `fences`,
    /// that the table still records exactly `expected` (`None`: nothing) for that app id:
    /// the version the writer resumed from. Otherwise it refuses with
    /// [`StoreErrorKind::Fenced`]: another worker owned the partition in between, and this
    /// writer's buffer would duplicate what that worker committed. This is the Kafka protocol
    /// (kafka-delta-ingest checks the same); "newer than recorded" alone would not catch a
    /// zombie worker whose range overlaps the new owner's.
    pub async fn commit_fenced(
        &self,
        batches: Vec<RecordBatch>,
        txns: &[(String, i64)],
        fences: &[(String, Option<i64>)],
    ) -> Result<CommitInfo, StoreError> {
        let kind = self.inner.kind;
        for b in &batches {
            check_batch_schema(b, kind)?;
        }
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        // Later entries for the same app id win; Delta allows one txn action per app id.
        let txns: BTreeMap<&str, i64> = txns.iter().map(|(a, v)| (a.as_str(), *v)).collect();

        let table = self.latest().await?;
        let current = table.version().unwrap_or(0);
        if rows == 0 && txns.is_empty() {
            return Ok(CommitInfo {
                version: current,
                rows: 0,
                files: 0,
            });
        }
        // The fence first: for a fenced writer it is the reason (another owner moved on), and a
        // stale version would only be its symptom.
        self.check_fences(&table, fences).await?;
        self.check_transactions(&table, &txns).await?;

        let app_txns: Vec<Transaction> =
            txns.iter().map(|(a, v)| Transaction::new(*a, *v)).collect();
        let props = commit_properties(&table).with_application_transactions(app_txns);
        let partitions: Vec<String> = kind
            .partition_columns()
            .iter()
            .map(|c| c.to_string())
            .collect();

        let (actions, files) = if rows == 0 {
            // Offsets only (every message in the range was dropped or dead-lettered): a commit
            // with no data files that still advances the recorded versions.
            (Vec::new(), 0)
        } else {
            let batch = sorted_by(&batches, kind)?;
            let adds = crate::layout::write_files(&table, &batch, kind.partition_columns()).await?;
            let files = adds.len();
            (adds.into_iter().map(Action::Add).collect(), files)
        };
        let op = DeltaOperation::Write {
            mode: SaveMode::Append,
            partition_by: (!partitions.is_empty()).then_some(partitions),
            predicate: None,
        };
        let version = land(&table, props, actions, op).await?;
        let info = CommitInfo {
            version,
            rows,
            files,
        };
        tracing::info!(
            table = kind.name(),
            version,
            rows,
            files,
            txns = txns.len(),
            "committed"
        );
        Ok(info)
    }

    async fn check_transactions(
        &self,
        table: &DeltaTable,
        txns: &BTreeMap<&str, i64>,
    ) -> Result<(), StoreError> {
        if txns.is_empty() {
            return Ok(());
        }
        let state = table
            .snapshot()
            .map_err(|e| StoreError::from_delta("reading the table state", e))?;
        for (app_id, attempted) in txns {
            let recorded = state
                .transaction_version(table.log_store().as_ref(), *app_id)
                .await
                .map_err(|e| StoreError::from_delta("reading transaction versions", e))?;
            if let Some(recorded) = recorded {
                if *attempted <= recorded {
                    return Err(StoreError::new(
                        StoreErrorKind::StaleTransaction {
                            app_id: app_id.to_string(),
                            recorded,
                            attempted: *attempted,
                        },
                        format_args!("table {}", self.inner.label),
                    ));
                }
            }
        }
        Ok(())
    }

    async fn check_fences(
        &self,
        table: &DeltaTable,
        fences: &[(String, Option<i64>)],
    ) -> Result<(), StoreError> {
        if fences.is_empty() {
            return Ok(());
        }
        let state = table
            .snapshot()
            .map_err(|e| StoreError::from_delta("reading the table state", e))?;
        for (app_id, expected) in fences {
            let recorded = state
                .transaction_version(table.log_store().as_ref(), app_id)
                .await
                .map_err(|e| StoreError::from_delta("reading transaction versions", e))?;
            if recorded != *expected {
                return Err(StoreError::new(
                    StoreErrorKind::Fenced {
                        app_id: app_id.clone(),
                        recorded,
                        expected: *expected,
                    },
                    format_args!("table {}", self.inner.label),
                ));
            }
        }
        Ok(())
    }

    fn cached(&self) -> DeltaTable {
        // A poisoned lock only means another thread panicked while swapping in a newer state;
        // the value inside is still a valid table.
        match self.inner.table.read() {
            Ok(t) => t.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub(crate) fn remember_public(&self, table: &DeltaTable) {
        self.remember(table)
    }

    fn remember(&self, table: &DeltaTable) {
        let mut guard = match self.inner.table.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if table.version() > guard.version() {
            *guard = table.clone();
        }
    }
}

/// Where the quarantine table of `table` lives: next to it, its location with `_quarantine`
/// appended (`<data dir>/spans_quarantine` for `<data dir>/spans`).
pub fn quarantine_location(table: &SpanTable) -> String {
    format!("{}_quarantine", table.inner.location.trim_end_matches('/'))
}

/// Parses a location: a URI with a scheme, or a local path (directories created).
fn table_url(location: &str) -> Result<Url, StoreError> {
    if location.trim().is_empty() {
        return Err(StoreError::new(
            StoreErrorKind::InvalidLocation {
                reason: "the location is empty".into(),
            },
            "empty table location",
        ));
    }
    deltalake::ensure_table_uri(location).map_err(|e| {
        let reason = match Url::parse(location) {
            Ok(u) if u.scheme().len() > 1 && u.scheme() != "file" => format!(
                "URI scheme `{}` is not supported (use a local directory, file://, s3:// or s3a://)",
                u.scheme()
            ),
            _ => "the directory cannot be created or accessed".to_string(),
        };
        StoreError::new(StoreErrorKind::InvalidLocation { reason }, e)
    })
}

fn location_error(e: DeltaTableError, label: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::InvalidLocation {
            reason: "no storage handler for this location".into(),
        },
        format_args!("{label}: {e}"),
    )
}

fn redact_url(url: &Url) -> String {
    let mut u = url.clone();
    if u.password().is_some() {
        // set_password only fails for URLs that cannot have credentials, which have none.
        let _ = u.set_password(Some("***"));
    }
    u.to_string()
}

/// Creates the table. When another process creates it first, loads theirs.
async fn create(
    table: &DeltaTable,
    label: &str,
    kind: TableKind,
) -> Result<DeltaTable, StoreError> {
    let schema = kernel_schema(kind)?;
    let created = table
        .create()
        .with_table_name(kind.name())
        .with_comment(kind.comment())
        .with_columns(schema.fields().cloned())
        .with_partition_columns(kind.partition_columns().iter().copied())
        .with_save_mode(SaveMode::Ignore)
        .await;
    match created {
        Ok(t) => {
            tracing::info!(location = %label, table = kind.name(), "created table");
            Ok(t)
        }
        Err(first) => {
            // Lost a creation race: the other creator's table is as good as ours.
            let mut again = table.clone();
            match again.load().await {
                Ok(()) => Ok(again),
                Err(_) => Err(StoreError::from_delta("creating the table", first)),
            }
        }
    }
}

fn kernel_schema(kind: TableKind) -> Result<StructType, StoreError> {
    kind.schema()
        .as_ref()
        .try_into_kernel()
        .map_err(|e| StoreError::internal("converting the table schema", e))
}

/// The columns a table made by an earlier toolspan lacks: the schema's nullable columns after
/// the table's last one, when the table's columns are exactly the schema's first ones. Columns
/// are only ever added at the end and nullable, so this is the whole of schema evolution;
/// anything else is a mismatch for [`verify`] to name.
fn missing_tail(table: &DeltaTable, kind: TableKind) -> Result<Vec<StructField>, StoreError> {
    let state = table
        .snapshot()
        .map_err(|e| StoreError::from_delta("reading the table state", e))?;
    let expected = kernel_schema(kind)?;
    let actual = state.schema();
    let have: Vec<&str> = actual.fields().map(|f| f.name().as_str()).collect();
    let want: Vec<&StructField> = expected.fields().collect();
    if have.len() >= want.len() || want.iter().zip(&have).any(|(w, h)| w.name().as_str() != *h) {
        return Ok(Vec::new());
    }
    let tail = &want[have.len()..];
    if tail.iter().any(|f| !f.is_nullable()) {
        return Ok(Vec::new());
    }
    Ok(tail.iter().map(|f| (*f).clone()).collect())
}

/// Adds the columns a table made by an earlier toolspan lacks ([`missing_tail`]), in one
/// metadata-only commit: rows written before read NULL in them. When another process adds
/// them first, its table is as good as ours.
async fn evolve(table: DeltaTable, label: &str, kind: TableKind) -> Result<DeltaTable, StoreError> {
    let missing = missing_tail(&table, kind)?;
    if missing.is_empty() {
        return Ok(table);
    }
    let names: Vec<String> = missing.iter().map(|f| f.name().to_string()).collect();
    let mut again = table.clone();
    match table.add_columns().with_fields(missing).await {
        Ok(t) => {
            tracing::info!(location = %label, table = kind.name(), columns = ?names, "added columns to a table made by an earlier version");
            Ok(t)
        }
        Err(first) => {
            again
                .update_incremental(None)
                .await
                .map_err(|e| StoreError::from_delta("reading the transaction log", e))?;
            if missing_tail(&again, kind)?.is_empty() {
                Ok(again)
            } else {
                Err(StoreError::from_delta("adding columns to the table", first))
            }
        }
    }
}

/// Checks that an existing table has the expected columns, types and partitioning.
fn verify(table: &DeltaTable, kind: TableKind) -> Result<(), StoreError> {
    let state = table
        .snapshot()
        .map_err(|e| StoreError::from_delta("reading the table state", e))?;
    let expected = kernel_schema(kind)?;
    let actual = state.schema();
    let mut problems = Vec::new();
    for f in expected.fields() {
        match actual.field(f.name()) {
            None => problems.push(format!("missing column {}", f.name())),
            Some(a) if a.data_type() != f.data_type() => {
                problems.push(format!("column {} has another type", f.name()))
            }
            Some(a) if a.is_nullable() != f.is_nullable() => {
                problems.push(format!("column {} has another nullability", f.name()))
            }
            Some(_) => {}
        }
    }
    for a in actual.fields() {
        if expected.field(a.name()).is_none() {
            problems.push(format!("unexpected column {}", a.name()));
        }
    }
    let parts = state.metadata().partition_columns();
    let expected_parts = kind.partition_columns();
    if parts
        .iter()
        .map(String::as_str)
        .ne(expected_parts.iter().copied())
    {
        problems.push(format!(
            "partitioned by [{}], expected [{}]",
            parts.join(", "),
            expected_parts.join(", ")
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        let details = problems.join("; ");
        Err(StoreError::new(
            StoreErrorKind::TableMismatch {
                details: details.clone(),
            },
            details,
        ))
    }
}

/// Checks one batch against the table's schema (names, types, order; nullability may be
/// stricter in the batch).
fn check_batch_schema(batch: &RecordBatch, kind: TableKind) -> Result<(), StoreError> {
    let expected = kind.schema();
    let actual = batch.schema();
    let mut problems = Vec::new();
    if actual.fields().len() != expected.fields().len() {
        problems.push(format!(
            "{} columns, expected {}",
            actual.fields().len(),
            expected.fields().len()
        ));
    }
    for (a, e) in actual.fields().iter().zip(expected.fields().iter()) {
        if a.name() != e.name() || a.data_type() != e.data_type() {
            problems.push(format!(
                "column {} where {} was expected",
                a.name(),
                e.name()
            ));
        } else if a.is_nullable() && !e.is_nullable() {
            problems.push(format!("column {} is nullable", a.name()));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        let details = problems.join("; ");
        Err(StoreError::new(
            StoreErrorKind::BatchSchema {
                details: details.clone(),
            },
            details,
        ))
    }
}

/// One batch with all rows, failed spans first, each part ordered by `start_time` (`minute` for
/// the rollup, which has no status; the writer keeps the order inside each partition, so every
/// file's time statistics cover a narrow range).
///
/// Failures first because nearly every search a user runs asks for failed spans, a few percent
/// of the rows: with them together at the head of each file, the status statistics of the
/// pages and row groups that hold only successes let the reader skip them, trace ids and all.
///
/// The rows are gathered straight from the buffered batches in time order (one copy), not
/// concatenated first and then reordered (two): a flush's peak memory is the buffer plus one
/// sorted copy while Parquet is written. Equal times keep their arrival order.
fn sorted_by(batches: &[RecordBatch], kind: TableKind) -> Result<RecordBatch, StoreError> {
    let arrow_err =
        |e: arrow::error::ArrowError| StoreError::internal("sorting rows by start time", e);
    let schema = kind.schema();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let mut keys: Vec<(bool, i64, u32, u32)> = Vec::with_capacity(rows);
    for (b, batch) in batches.iter().enumerate() {
        let times = batch
            .column_by_name(kind.sort_column())
            .and_then(|c| c.as_any().downcast_ref::<TimestampMicrosecondArray>());
        let Some(times) = times else {
            // check_batch_schema guarantees the column; keep the input order if it ever is not.
            return concat_batches(&schema, batches).map_err(arrow_err);
        };
        let failed = crate::layout::failed_rows(batch).map_err(arrow_err)?;
        keys.extend(times.values().iter().enumerate().map(|(r, t)| {
            let failed = failed.as_ref().is_some_and(|f| f.value(r));
            (!failed, *t, b as u32, r as u32)
        }));
    }
    keys.sort_by_key(|k| (k.0, k.1));
    let indices: Vec<(usize, usize)> = keys
        .into_iter()
        .map(|(_, _, b, r)| (b as usize, r as usize))
        .collect();
    let refs: Vec<&RecordBatch> = batches.iter().collect();
    let columns: Vec<arrow::array::ArrayRef> = (0..schema.fields().len())
        .map(|c| {
            let arrays: Vec<&dyn arrow::array::Array> =
                refs.iter().map(|b| b.column(c).as_ref()).collect();
            interleave(&arrays, &indices)
        })
        .collect::<Result<_, _>>()
        .map_err(arrow_err)?;
    RecordBatch::try_new(schema, columns).map_err(arrow_err)
}

/// Commits `actions` (and the transactions of `props`) on top of `table`'s snapshot; the new
/// version.
///
/// Once the log entry is written the commit has landed, whatever happens next: a failure of
/// the steps after it (a checkpoint, log cleanup, reading the new state, e.g. on a full disk)
/// is logged and the commit reported as made, never as failed, since a writer that retried
/// it would store its rows twice. Those steps catch up on a later commit.
async fn land(
    table: &DeltaTable,
    props: CommitProperties,
    actions: Vec<Action>,
    op: DeltaOperation,
) -> Result<u64, StoreError> {
    let state = table
        .snapshot()
        .map_err(|e| StoreError::from_delta("reading the table state", e))?;
    let post = CommitBuilder::from(props)
        .with_actions(actions)
        .build(Some(state.snapshot()), table.log_store(), op)
        .into_prepared_commit_future()
        .await
        .map_err(|e| StoreError::from_delta("writing data files and committing", e))?
        .await
        .map_err(|e| StoreError::from_delta("writing data files and committing", e))?;
    let version = post.version;
    if let Err(e) = post.await {
        tracing::warn!(
            version,
            error = %e,
            "committed; the checkpoint or the new table state after the commit failed"
        );
    }
    Ok(version)
}
