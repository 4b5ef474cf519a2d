//! Merging small files, committed so that two processes merging the same files cannot both
//! land.
//!
//! delta-rs's `optimize` commits its removes with `dataChange = false`, and delta-rs 1.1's
//! conflict checker only looks at removes with `dataChange = true` when it checks for a file
//! deleted twice: two optimizes of the same files from two processes (two ingest workers'
//! maintenance rounds, which start together) both land, and every merged row is then in the
//! table twice (minimal reproduction in bench/RESULTS.md "Notes"). So toolspan bin-packs
//! itself — the same plan as `optimize`: per partition, the files below the target, oldest
//! first, into files of about the target — writes the merged files with the file writer of
//! appends (statistics included; `crate::layout`: every partition value fits its directory),
//! and commits adds and removes itself with the application transaction [`MAINTENANCE_APP`]. delta-rs refuses a commit whose application
//! id a concurrent winning commit also carries (`ConcurrentTransaction`), so of two
//! maintenance commits racing, one lands and the other is retried at the next round; the
//! loser's written files are unreferenced and vacuum deletes them. Appends carry other
//! application ids (the Kafka partitions) and neither conflict with a merge nor change it.

use std::collections::{BTreeMap, HashMap};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{filter_record_batch, not};
use deltalake::datafusion::scalar::ScalarValue;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, Remove, Transaction};
use deltalake::logstore::object_store::ObjectStoreExt as _;
use deltalake::protocol::DeltaOperation;
use deltalake::{DeltaTable, ObjectStore};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use toolspan_schema::columns::col;

use super::CompactReport;
use crate::error::StoreError;
use crate::layout::{failed_rows, FileWriter};
use crate::table::SpanTable;

/// The application id every maintenance commit (merge, expiry) carries.
pub(crate) const MAINTENANCE_APP: &str = "toolspan-maintenance";

/// Commit properties of a maintenance commit on `table`: toolspan's usual ones
/// ([`crate::table::commit_properties`]) and the [`MAINTENANCE_APP`] transaction (its version is
/// the time, only its presence matters).
pub(crate) fn maintenance_commit(table: &DeltaTable) -> CommitProperties {
    crate::table::commit_properties(table).with_application_transaction(Transaction::new(
        MAINTENANCE_APP,
        chrono::Utc::now().timestamp_millis(),
    ))
}

/// A file below the target.
struct Small {
    path: deltalake::Path,
    size: u64,
    modified: i64,
    remove: Remove,
}

/// A partition's raw values, in a stable order.
type PartitionKey = Vec<(String, Option<String>)>;

impl SpanTable {
    /// Merges the files below `target_bytes` of every partition for which `select(values,
    /// small_files)` holds, into files of about `target_bytes`: one commit (see the module
    /// docs). A partition with fewer than two small files is left alone.
    pub(super) async fn merge_small_files(
        &self,
        select: impl Fn(&HashMap<String, Option<String>>, usize) -> bool,
        target_bytes: u64,
    ) -> Result<CompactReport, StoreError> {
        let table = self.latest().await?;
        let state = table
            .snapshot()
            .map_err(|e| StoreError::from_delta("reading the table state", e))?;
        let mut parts: BTreeMap<PartitionKey, Vec<Small>> = BTreeMap::new();
        for f in state.log_data().iter() {
            let size = f.size().max(0) as u64;
            if size >= target_bytes {
                continue;
            }
            let values = f.partition_values_map();
            let mut key: PartitionKey = values.into_iter().collect();
            key.sort();
            parts.entry(key).or_default().push(Small {
                path: f.object_store_path(),
                size,
                modified: f.modification_time(),
                remove: f.remove_action(false),
            });
        }
        let store = table.log_store().object_store(None);
        let mut report = CompactReport::default();
        let mut actions: Vec<Action> = Vec::new();
        for (key, mut files) in parts {
            let values: HashMap<String, Option<String>> = key.into_iter().collect();
            if files.len() < 2 || !select(&values, files.len()) {
                continue;
            }
            files.sort_by_key(|f| f.modified);
            let mut merged_any = false;
            for bin in bins(files, target_bytes) {
                let adds = self.rewrite(&table, store.as_ref(), &bin, &values).await?;
                report.files_added += adds.len() as u64;
                report.files_removed += bin.len() as u64;
                merged_any = true;
                actions.extend(adds.into_iter().map(|mut a| {
                    a.data_change = false;
                    Action::Add(a)
                }));
                actions.extend(bin.into_iter().map(|f| Action::Remove(f.remove)));
            }
            report.partitions += u64::from(merged_any);
        }
        if actions.is_empty() {
            return Ok(report);
        }
        let op = DeltaOperation::Optimize {
            predicate: None,
            target_size: target_bytes as i64,
        };
        CommitBuilder::from(maintenance_commit(&table))
            .with_actions(actions)
            .build(Some(state.snapshot()), table.log_store(), op)
            .await
            .map_err(|e| StoreError::from_delta("committing merged files", e))?;
        Ok(report)
    }

    /// Writes the rows of `files` (one partition, `values`) as new files; their add actions.
    async fn rewrite(
        &self,
        table: &DeltaTable,
        store: &dyn ObjectStore,
        files: &[Small],
        values: &HashMap<String, Option<String>>,
    ) -> Result<Vec<deltalake::kernel::Add>, StoreError> {
        let schema = self.kind().schema();
        let mut writer =
            FileWriter::for_table(table, &schema, self.kind().partition_columns(), false)?;
        let written = self.copy_rows(&mut writer, store, files, values).await;
        if let Err(e) = written {
            writer.abort().await;
            return Err(e);
        }
        writer.close().await
    }

    /// Streams the rows of `files` into `writer`, in the order a flush writes them: the failed
    /// spans of every file first, then the rest (two passes over the files, each file read
    /// once a pass, so memory stays one batch, not the bin); a table without a status column
    /// (the rollup) in one pass. Files are taken oldest first and each is in time order, so
    /// either part stays close to time order.
    async fn copy_rows(
        &self,
        writer: &mut FileWriter,
        store: &dyn ObjectStore,
        files: &[Small],
        values: &HashMap<String, Option<String>>,
    ) -> Result<(), StoreError> {
        let schema = self.kind().schema();
        let passes: &[Option<bool>] = match schema.index_of(col::STATUS) {
            Ok(_) => &[Some(true), Some(false)],
            Err(_) => &[None],
        };
        let filter_err = |e| StoreError::internal("ordering the rows to merge", e);
        for failed_pass in passes {
            for f in files {
                let bytes = store
                    .get(&f.path)
                    .await
                    .map_err(|e| StoreError::from_delta("reading a file to merge", e.into()))?
                    .bytes()
                    .await
                    .map_err(|e| StoreError::from_delta("reading a file to merge", e.into()))?;
                let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .and_then(|b| b.with_batch_size(8192).build())
                    .map_err(|e| StoreError::internal("reading a file to merge", e))?;
                for batch in reader {
                    let batch =
                        batch.map_err(|e| StoreError::internal("reading a file to merge", e))?;
                    let full = with_partition_columns(&schema, &batch, values)?;
                    let part = match (failed_pass, failed_rows(&full).map_err(filter_err)?) {
                        (Some(true), Some(failed)) => {
                            filter_record_batch(&full, &failed).map_err(filter_err)?
                        }
                        (Some(false), Some(failed)) => {
                            let rest = not(&failed).map_err(filter_err)?;
                            filter_record_batch(&full, &rest).map_err(filter_err)?
                        }
                        _ => full,
                    };
                    if part.num_rows() > 0 {
                        writer.write(&part).await?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The oldest-first files cut into bins of about `target` bytes; bins of one file are
/// dropped (nothing to merge).
fn bins(files: Vec<Small>, target: u64) -> Vec<Vec<Small>> {
    let mut out: Vec<Vec<Small>> = Vec::new();
    let mut bin: Vec<Small> = Vec::new();
    let mut size = 0u64;
    for f in files {
        if !bin.is_empty() && size + f.size > target {
            out.push(std::mem::take(&mut bin));
            size = 0;
        }
        size += f.size;
        bin.push(f);
    }
    out.push(bin);
    out.retain(|b| b.len() >= 2);
    out
}

/// A data file's rows (without the partition columns, as Delta stores them) with the
/// partition columns put back, in the table schema's order.
fn with_partition_columns(
    schema: &arrow::datatypes::SchemaRef,
    batch: &RecordBatch,
    values: &HashMap<String, Option<String>>,
) -> Result<RecordBatch, StoreError> {
    let n = batch.num_rows();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let name = field.name();
        if let Some(c) = batch.column_by_name(name) {
            let c = if c.data_type() == field.data_type() {
                c.clone()
            } else {
                arrow::compute::cast(c, field.data_type())
                    .map_err(|e| StoreError::internal("merging files", e))?
            };
            columns.push(c);
            continue;
        }
        let value = match values.get(name.as_str()) {
            Some(Some(raw)) => ScalarValue::try_from_string(raw.clone(), field.data_type()),
            Some(None) => ScalarValue::try_from(field.data_type()),
            // A nullable column added to the table after this file was written.
            None if field.is_nullable() => ScalarValue::try_from(field.data_type()),
            None => {
                return Err(StoreError::internal(
                    "merging files",
                    format!("column {name} is neither in the file nor a partition column"),
                ))
            }
        }
        .and_then(|v| v.to_array_of_size(n))
        .map_err(|e| StoreError::internal("merging files", e))?;
        columns.push(value);
    }
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| StoreError::internal("merging files", e))
}
