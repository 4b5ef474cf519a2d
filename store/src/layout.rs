//! Where data files go, and writing them: one directory per partition, named so that every
//! partition value fits in a path segment.
//!
//! A Delta reader takes a file's partition values from its add action in the log, never from
//! its path (the Hive-style `tool=search_docs/stage=call/date=2025-06-01/` is a convention of
//! writers). toolspan writes that convention as long as a value's encoded segment is short;
//! a value whose segment would be too long for a file system (255 bytes on most) or an
//! object-store key, such as a 10 KB tool name or 85 CJK characters (percent-encoding
//! triples them), is written under a bounded directory instead: a readable prefix of the
//! value, `~`, and a SHA-256 digest of the whole value. The add action still records the real
//! value, so `WHERE tool = '<the real name>'` finds the rows and prunes to their files as it
//! does for any other tool.
//!
//! The bounded name is collision-free: a digest is of the whole value, and a plain segment
//! never contains `~` (a value whose encoding contains `~` is written bounded too), so no two
//! values share a directory.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Date32Array, RecordBatch, StringArray};
use arrow::datatypes::{Schema, SchemaRef};
use delta_kernel::expressions::Scalar;
use deltalake::kernel::scalars::ScalarExt as _;
use deltalake::kernel::Add;
use deltalake::operations::write::writer::{PartitionWriter, PartitionWriterConfig};
use deltalake::operations::write::WriterStatsConfig;
use deltalake::table::config::TablePropertiesExt as _;
use deltalake::{DeltaTable, Path};
use indexmap::IndexMap;
use sha2::{Digest, Sha256};

use crate::error::StoreError;

/// Which rows of `batch` are failed spans (`status` is `error`), for files that keep their
/// failures first; `None` for a table without a status column (the rollup).
pub(crate) fn failed_rows(
    batch: &RecordBatch,
) -> Result<Option<arrow::array::BooleanArray>, arrow::error::ArrowError> {
    let Some(status) = batch.column_by_name(toolspan_schema::columns::col::STATUS) else {
        return Ok(None);
    };
    let status = arrow::compute::cast(status, &arrow::datatypes::DataType::Utf8)?;
    let error = StringArray::new_scalar(toolspan_schema::vocab::Status::Error.as_str());
    let failed = arrow::compute::kernels::cmp::eq(&status, &error)?;
    // A null status is not a failure.
    Ok(Some(match failed.nulls() {
        Some(_) => arrow::compute::prep_null_mask_filter(&failed),
        None => failed,
    }))
}

/// The longest partition directory name (`column=value`, encoded) written as it is.
pub const MAX_SEGMENT_BYTES: usize = 120;

/// Bytes of the encoded value kept before the digest in a bounded directory name.
const READABLE_PREFIX_BYTES: usize = 40;

/// Hex digits of the SHA-256 digest in a bounded directory name (128 bits).
const DIGEST_HEX: usize = 32;

/// Separates the readable prefix from the digest; never part of a plain segment.
const MARK: char = '~';

/// The directory name of one partition value: `column=<encoded value>` when that is at most
/// [`MAX_SEGMENT_BYTES`] and holds no `~`, else `column=<prefix>~<digest>`. `None` is Delta's
/// null partition (`__HIVE_DEFAULT_PARTITION__`).
pub fn partition_segment(column: &str, value: Option<&str>) -> String {
    let scalar = match value {
        Some(v) => Scalar::String(v.to_string()),
        None => Scalar::Null(delta_kernel::schema::DataType::STRING),
    };
    segment_of(column, &scalar)
}

fn segment_of(column: &str, value: &Scalar) -> String {
    let encoded = value.serialize_encoded();
    let plain = format!("{column}={encoded}");
    if plain.len() <= MAX_SEGMENT_BYTES && !encoded.contains(MARK) {
        return plain;
    }
    let raw = value.serialize();
    let digest = hex::encode(Sha256::digest(raw.as_bytes()));
    // The readable prefix is cut on a character of the raw value, so no escape is split.
    let mut prefix = String::new();
    for ch in raw.chars() {
        let enc = Scalar::String(ch.to_string()).serialize_encoded();
        if ch == MARK || prefix.len() + enc.len() > READABLE_PREFIX_BYTES {
            break;
        }
        prefix.push_str(&enc);
    }
    format!("{column}={prefix}{MARK}{}", &digest[..DIGEST_HEX])
}

/// The directory of a partition: its segments joined by `/`.
fn partition_dir(values: &IndexMap<String, Scalar>) -> String {
    values
        .iter()
        .map(|(c, v)| segment_of(c, v))
        .collect::<Vec<_>>()
        .join("/")
}

/// Writes rows as data files of one table, under the directories of [`partition_segment`]:
/// one open file per partition, rolled at the target size. Nothing is committed: `close`
/// returns the add actions (statistics included, partition values as they are in the rows).
pub(crate) struct FileWriter {
    store: deltalake::logstore::ObjectStoreRef,
    stats: WriterStatsConfig,
    target: Option<NonZeroU64>,
    props: parquet::file::properties::WriterProperties,
    partition_columns: Vec<String>,
    /// Indices of the columns that go into the files (all but the partition columns).
    keep: Vec<usize>,
    file_schema: SchemaRef,
    writers: Vec<PartitionWriter>,
    by_dir: HashMap<String, usize>,
}

impl FileWriter {
    /// A writer for `table`, whose rows have `schema` and are partitioned by
    /// `partition_columns`; files roll at the table's target file size when
    /// `use_table_target`, else each partition gets one file.
    pub(crate) fn for_table(
        table: &DeltaTable,
        schema: &SchemaRef,
        partition_columns: &[&str],
        use_table_target: bool,
    ) -> Result<FileWriter, StoreError> {
        let state = table
            .snapshot()
            .map_err(|e| StoreError::from_delta("reading the table state", e))?;
        let stats = WriterStatsConfig::from_config(state.snapshot().table_configuration());
        let target = use_table_target.then(|| state.table_config().target_file_size());
        let keep: Vec<usize> = (0..schema.fields().len())
            .filter(|i| !partition_columns.contains(&schema.field(*i).name().as_str()))
            .collect();
        let file_schema: SchemaRef = Arc::new(Schema::new(
            keep.iter()
                .map(|i| schema.field(*i).clone())
                .collect::<Vec<_>>(),
        ));
        Ok(FileWriter {
            store: table.log_store().object_store(None),
            stats,
            target,
            props: toolspan_schema::parquet_props::writer_properties(),
            partition_columns: partition_columns.iter().map(|c| c.to_string()).collect(),
            keep,
            file_schema,
            writers: Vec::new(),
            by_dir: HashMap::new(),
        })
    }

    /// Adds the rows of `batch` (all columns, partition columns included) in their order.
    pub(crate) async fn write(&mut self, batch: &RecordBatch) -> Result<(), StoreError> {
        let columns: Vec<&str> = self.partition_columns.iter().map(String::as_str).collect();
        for (values, rows) in groups(batch, &columns)? {
            let part = take_rows(batch, &self.keep, &self.file_schema, &rows)?;
            let dir = partition_dir(&values);
            let slot = match self.by_dir.get(&dir) {
                Some(slot) => *slot,
                None => {
                    let writer = self.partition_writer(&dir, values)?;
                    self.writers.push(writer);
                    self.by_dir.insert(dir, self.writers.len() - 1);
                    self.writers.len() - 1
                }
            };
            self.writers[slot]
                .write(&part)
                .await
                .map_err(|e| StoreError::from_delta("writing data files", e))?;
        }
        Ok(())
    }

    fn partition_writer(
        &self,
        dir: &str,
        values: IndexMap<String, Scalar>,
    ) -> Result<PartitionWriter, StoreError> {
        let prefix = Path::parse(dir)
            .map_err(|e| StoreError::internal("naming a partition directory", e))?;
        let config = PartitionWriterConfig::try_new(
            self.file_schema.clone(),
            values,
            Some(self.props.clone()),
            self.target,
            None,
            None,
            Some(prefix),
        )
        .map_err(|e| StoreError::from_delta("preparing a data file", e))?;
        PartitionWriter::try_with_config(
            self.store.clone(),
            config,
            self.stats.num_indexed_cols,
            self.stats.stats_columns.clone(),
        )
        .map_err(|e| StoreError::from_delta("preparing a data file", e))
    }

    /// Finishes every file; their add actions.
    pub(crate) async fn close(self) -> Result<Vec<Add>, StoreError> {
        let mut adds = Vec::new();
        let mut first_err = None;
        for w in self.writers {
            match w.close().await {
                Ok(a) => adds.extend(a),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(adds),
            Some(e) => Err(StoreError::from_delta("writing data files", e)),
        }
    }

    /// Abandons every file (uploads in progress are aborted; finished files stay unreferenced
    /// until vacuum deletes them).
    pub(crate) async fn abort(self) {
        for w in self.writers {
            let _ = w.abort().await;
        }
    }
}

/// Writes `batch` (all table columns, partition columns included, rows in the order they
/// should be stored) as data files of `table`; their add actions. Nothing is committed.
pub(crate) async fn write_files(
    table: &DeltaTable,
    batch: &RecordBatch,
    partition_columns: &[&str],
) -> Result<Vec<Add>, StoreError> {
    let mut writer = FileWriter::for_table(table, &batch.schema(), partition_columns, true)?;
    if let Err(e) = writer.write(batch).await {
        writer.abort().await;
        return Err(e);
    }
    writer.close().await
}

/// A partition value as a grouping key.
#[derive(PartialEq, Eq, Hash)]
enum Key<'a> {
    Null,
    Str(&'a str),
    Day(i32),
    Other(String),
}

/// A partition's values and the indices of its rows.
type Group = (IndexMap<String, Scalar>, Vec<u32>);

/// The rows of each partition of `batch`, in first-seen order of partitions and in batch
/// order within one.
fn groups(batch: &RecordBatch, partition_columns: &[&str]) -> Result<Vec<Group>, StoreError> {
    let columns: Vec<&ArrayRef> = partition_columns
        .iter()
        .map(|c| {
            batch.column_by_name(c).ok_or_else(|| {
                StoreError::internal("splitting rows by partition", format!("no column {c}"))
            })
        })
        .collect::<Result<_, _>>()?;
    // Group by cheap borrowed keys first; build the scalars once per group.
    let strings: Vec<Option<&StringArray>> = columns
        .iter()
        .map(|c| c.as_any().downcast_ref::<StringArray>())
        .collect();
    let dates: Vec<Option<&Date32Array>> = columns
        .iter()
        .map(|c| c.as_any().downcast_ref::<Date32Array>())
        .collect();
    let mut index: HashMap<Vec<Key<'_>>, usize> = HashMap::new();
    let mut out: Vec<Group> = Vec::new();
    for row in 0..batch.num_rows() {
        let key: Vec<Key<'_>> = (0..columns.len())
            .map(|i| {
                if columns[i].is_null(row) {
                    Key::Null
                } else if let Some(s) = strings[i] {
                    Key::Str(s.value(row))
                } else if let Some(d) = dates[i] {
                    Key::Day(d.value(row))
                } else {
                    Key::Other(
                        Scalar::from_array(columns[i].as_ref(), row)
                            .map(|v| v.serialize())
                            .unwrap_or_default(),
                    )
                }
            })
            .collect();
        let slot = match index.get(&key) {
            Some(slot) => *slot,
            None => {
                let mut values = IndexMap::new();
                for (name, c) in partition_columns.iter().zip(&columns) {
                    let v = Scalar::from_array(c.as_ref(), row).ok_or_else(|| {
                        StoreError::internal(
                            "splitting rows by partition",
                            format!("column {name} has no partition value"),
                        )
                    })?;
                    values.insert(name.to_string(), v);
                }
                out.push((values, Vec::new()));
                index.insert(key, out.len() - 1);
                out.len() - 1
            }
        };
        out[slot].1.push(row as u32);
    }
    Ok(out)
}

/// The columns `keep` of the rows `rows` (a slice when they are one contiguous run).
fn take_rows(
    batch: &RecordBatch,
    keep: &[usize],
    schema: &SchemaRef,
    rows: &[u32],
) -> Result<RecordBatch, StoreError> {
    let err = |e: arrow::error::ArrowError| StoreError::internal("splitting rows by partition", e);
    let contiguous = rows.first().is_some_and(|f| {
        rows.last()
            .is_some_and(|l| (l - f) as usize + 1 == rows.len())
    });
    let columns: Vec<ArrayRef> = if contiguous {
        let (offset, len) = (rows[0] as usize, rows.len());
        keep.iter()
            .map(|i| batch.column(*i).slice(offset, len))
            .collect()
    } else {
        let indices = arrow::array::UInt32Array::from(rows.to_vec());
        keep.iter()
            .map(|i| arrow::compute::take(batch.column(*i).as_ref(), &indices, None))
            .collect::<Result<_, _>>()
            .map_err(err)?
    };
    RecordBatch::try_new(schema.clone(), columns).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_keep_the_hive_directory_delta_writes() {
        assert_eq!(
            partition_segment("tool", Some("search_docs")),
            "tool=search_docs"
        );
        assert_eq!(partition_segment("tool", Some("a/b c")), "tool=a%2Fb%20c");
        assert_eq!(
            partition_segment("tool", None),
            "tool=__HIVE_DEFAULT_PARTITION__"
        );
    }

    #[test]
    fn long_values_get_a_bounded_distinct_directory() {
        let hostile = [
            "x".repeat(251),
            "/".repeat(100),
            "検".repeat(85),
            "y".repeat(10_000),
            format!("{}a", "y".repeat(10_000)),
            "..".to_string(),
            "short~mark".to_string(),
        ];
        let mut seen = std::collections::HashSet::new();
        for v in &hostile {
            let s = partition_segment("tool", Some(v));
            assert!(s.len() <= MAX_SEGMENT_BYTES, "{} bytes: {s}", s.len());
            assert!(!s.contains('/'), "{s}");
            assert!(s.starts_with("tool="), "{s}");
            assert!(seen.insert(s.clone()), "two values share {s}");
        }
        // A plain value that looks like a bounded name is itself bounded, not the same name.
        let bounded = partition_segment("tool", Some(&"z".repeat(300)));
        let lookalike = bounded.trim_start_matches("tool=").to_string();
        assert_ne!(partition_segment("tool", Some(&lookalike)), bounded);
        // A readable prefix survives.
        assert!(partition_segment("tool", Some(&"x".repeat(251))).starts_with("tool=xxxx"));
    }
}
