//! [`TableFiles`]: one Delta snapshot of a table, scanned by DataFusion's own Parquet reader.
//!
//! The Delta log says which files make up a version; everything after that is a plain
//! partitioned Parquet scan, so queries read through DataFusion's `DataSourceExec` directly:
//! partition values (`tool`, `stage`, `date`) are per-file constants of the scan (as for a
//! hive-partitioned listing table), not per-row values built by a wrapper around it.
//!
//! - Filters on partition columns only are evaluated exactly, once per file, on a batch of the
//!   files' partition values; files that fail them are not scanned at all, and DataFusion drops
//!   those filters from the plan (`Exact` pushdown).
//! - Other filters prune files with the per-file statistics of the Delta log (min/max of
//!   `start_time`, …): a file they cannot match is skipped, a file they match entirely is read
//!   without them. Elsewhere they go into the Parquet reader (row groups, pages, bloom filters,
//!   then rows), evaluated on strings as the reader decodes them (`Utf8View`); returned
//!   filter columns are converted to the table's `Utf8` after filtering, other columns are
//!   decoded as `Utf8` directly. DataFusion leaves them to the
//!   scan (`Exact` pushdown), except filters with subqueries, outer references or parameters.
//! - Per-file row counts from the log make `count(*)` without filters a metadata answer.
//!
//! The files are ours (toolspan writes them without deletion vectors or column mapping), which
//! is what makes this direct reading valid; [`TableFiles::new`] refuses tables that use either.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions, StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, ScalarValue, Statistics};
use datafusion::config::TableParquetOptions;
use datafusion::datasource::object_store::ObjectStoreUrl;
use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::expressions::{cast as physical_cast, Column as PhysicalColumn};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::filter::FilterExecBuilder;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_datasource::{compute_all_files_statistics, PartitionedFile, TableSchema};
use deltalake::table::state::DeltaTableState;
use deltalake::{DeltaTable, ObjectMeta, Path};
use toolspan_schema::columns::col;
use toolspan_schema::parquet_props::BLOOM_FILTER_COLUMNS;

pub(crate) mod filters;
mod stats;

/// The mean file size from which a filter on the status loads the page index (see `read`).
const STATUS_PAGE_INDEX_FILE_BYTES: u64 = 4 << 20;

use stats::{FileStats, LogStatistics};

/// The files of one table version and what a scan needs to know about them.
pub(crate) struct TableFiles {
    version: u64,
    /// The table as SQL sees it (the Delta schema, partition columns in their place).
    schema: SchemaRef,
    df_schema: Arc<DFSchema>,
    /// The columns stored in the Parquet files (the table without its partition columns).
    file_schema: SchemaRef,
    partition_fields: Vec<FieldRef>,
    /// The scan's own column order: file columns, then partition columns.
    scan_schema: SchemaRef,
    /// For each column of `schema`, its index in `scan_schema`.
    to_scan: Vec<usize>,
    /// One row per file: its partition values, typed as in `schema`.
    partition_values: RecordBatch,
    files: Vec<PartitionedFile>,
    store_url: ObjectStoreUrl,
    /// The column rows are sorted by within each file (where page statistics prune pages).
    sorted_by: &'static str,
    /// The snapshot, for file pruning with the log's statistics (same file order as `files`).
    state: DeltaTableState,
    /// [`Self::null_counts`] of the columns asked for so far.
    null_counts: std::sync::Mutex<HashMap<String, NullCounts>>,
}

/// Per file (in `files` order), the null count and row count of one column, when the log has them.
type NullCounts = Arc<Vec<Option<(u64, u64)>>>;

impl std::fmt::Debug for TableFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableFiles")
            .field("version", &self.version)
            .field("files", &self.files.len())
            .finish()
    }
}

fn internal(what: &str, e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("{what}: {e}"))
}

impl TableFiles {
    /// The files of `table`'s loaded version; `schema` is how SQL sees the table.
    pub(crate) fn new(
        table: &DeltaTable,
        schema: SchemaRef,
        sorted_by: &'static str,
    ) -> DfResult<TableFiles> {
        let state = table
            .snapshot()
            .map_err(|e| internal("reading the table state", e))?
            .clone();
        let version = state.version();
        let partition_names: Vec<String> = state.metadata().partition_columns().to_vec();
        // Column mapping renames physical columns; deletion vectors (checked per file below)
        // hide rows. toolspan writes neither, and a table that has them is not read directly.
        let mapping = format!("{:?}", state.table_config().column_mapping_mode);
        if mapping != "None" && mapping != "Some(None)" {
            return Err(internal(
                "reading the table",
                "column mapping is not supported on toolspan tables",
            ));
        }

        let mut partition_fields = Vec::new();
        let mut file_fields = Vec::new();
        for field in schema.fields() {
            if partition_names.iter().any(|p| p == field.name()) {
                partition_fields.push(field.clone());
            } else {
                file_fields.push(field.clone());
            }
        }
        let file_schema = Arc::new(Schema::new(file_fields.clone()));
        let scan_schema = Arc::new(Schema::new(
            file_fields
                .iter()
                .chain(&partition_fields)
                .cloned()
                .collect::<Vec<_>>(),
        ));
        let to_scan = schema
            .fields()
            .iter()
            .map(|f| scan_schema.index_of(f.name()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| internal("mapping table columns", e))?;

        let root = Path::from_url_path(table.table_url().path())
            .map_err(|e| internal("reading the table location", e))?;
        let store_url = store_url(table.table_url())?;
        let log = state.log_data();
        let mut raw: Vec<Vec<Option<String>>> = vec![Vec::new(); partition_fields.len()];
        let mut metas = Vec::with_capacity(log.num_files());
        for file in log.iter() {
            if file.deletion_vector_descriptor().is_some() {
                return Err(internal(
                    "reading the table",
                    "deletion vectors are not supported on toolspan tables",
                ));
            }
            let values: HashMap<String, Option<String>> = file.partition_values_map();
            for (column, field) in raw.iter_mut().zip(&partition_fields) {
                column.push(values.get(field.name()).cloned().flatten());
            }
            let rel = file.object_store_path();
            let location = Path::from_iter(root.parts().chain(rel.parts()));
            metas.push((
                ObjectMeta {
                    location,
                    last_modified: chrono::DateTime::<chrono::Utc>::default(),
                    size: file.size().max(0) as u64,
                    e_tag: None,
                    version: None,
                },
                file.num_records(),
            ));
        }
        let columns: Vec<ArrayRef> = raw
            .into_iter()
            .zip(&partition_fields)
            .map(|(values, field)| {
                let strings: ArrayRef = Arc::new(StringArray::from(values));
                cast(&strings, field.data_type())
                    .map_err(|e| internal("reading partition values", e))
            })
            .collect::<DfResult<_>>()?;
        let partition_schema = Arc::new(Schema::new(partition_fields.clone()));
        let partition_values = RecordBatch::try_new_with_options(
            partition_schema,
            columns,
            &RecordBatchOptions::new().with_row_count(Some(metas.len())),
        )
        .map_err(|e| internal("reading partition values", e))?;

        let mut files = Vec::with_capacity(metas.len());
        for (i, (meta, rows)) in metas.into_iter().enumerate() {
            let mut file = PartitionedFile::from(meta);
            file.partition_values = partition_values
                .columns()
                .iter()
                .map(|c| ScalarValue::try_from_array(c, i))
                .collect::<DfResult<_>>()?;
            // Row counts only: per-column statistics (which `with_statistics` would add for
            // the partition columns) make DataFusion build a pruning predicate for every file
            // it opens, and the file list is already pruned here.
            let mut stats = Statistics::new_unknown(&scan_schema);
            if let Some(rows) = rows {
                stats.num_rows = Precision::Exact(rows);
            }
            file.statistics = Some(Arc::new(stats));
            files.push(file);
        }

        Ok(TableFiles {
            version,
            df_schema: Arc::new(DFSchema::try_from(schema.clone())?),
            schema,
            file_schema,
            partition_fields,
            scan_schema,
            to_scan,
            partition_values,
            files,
            store_url,
            sorted_by,
            state,
            null_counts: Default::default(),
        })
    }

    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    pub(crate) fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Where each data file of this version is, as the Parquet reader's caches key it.
    pub(crate) fn locations(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| &f.object_meta.location)
    }

    fn on_partitions_only(&self, filter: &Expr) -> bool {
        if filter.is_volatile() {
            return false;
        }
        let mut columns = 0;
        let mut only_partitions = true;
        let _ = filter.apply(|e| {
            if let Expr::Column(c) = e {
                columns += 1;
                if !self.partition_fields.iter().any(|f| f.name() == &c.name) {
                    only_partitions = false;
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
            Ok(TreeNodeRecursion::Continue)
        });
        columns > 0 && only_partitions
    }

    /// Which files pass partition-only `filters` (evaluated on the files' partition values).
    fn partitions_pass(&self, state: &dyn Session, filters: Vec<Expr>) -> DfResult<Vec<bool>> {
        let n = self.files.len();
        let Some(predicate) = conjunction(filters) else {
            return Ok(vec![true; n]);
        };
        let schema = DFSchema::try_from(self.partition_values.schema())?;
        let expr = state.create_physical_expr(predicate, &schema)?;
        let mask = expr.evaluate(&self.partition_values)?.into_array(n)?;
        let mask = mask.as_boolean_opt().ok_or_else(|| {
            internal(
                "filtering partitions",
                "the filter is not a boolean expression",
            )
        })?;
        Ok((0..n).map(|i| mask.is_valid(i) && mask.value(i)).collect())
    }

    /// Per file, what the log's statistics prove about `filter` for all of the file's rows.
    /// Statistics are an optimisation: whatever they cannot decide is [`Decided::Unknown`].
    fn decide(&self, state: &dyn Session, filter: &Expr) -> Vec<Decided> {
        let n = self.files.len();
        let may_match = self.may_match(state, filter.clone());
        // All rows pass when no row can fail: neither `NOT filter` nor a NULL input.
        let mut columns = Vec::new();
        let _ = filter.apply(|e| {
            if let Expr::Column(c) = e {
                columns.push(c.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        });
        let fails = columns
            .into_iter()
            .fold(Expr::Not(Box::new(filter.clone())), |acc, c| {
                acc.or(Expr::Column(c).is_null())
            });
        let may_fail = self.may_match(state, fails);
        (0..n)
            .map(|i| {
                match (
                    may_match.as_ref().map(|m| m[i]),
                    may_fail.as_ref().map(|m| m[i]),
                ) {
                    (Some(false), _) => Decided::False,
                    (_, Some(false)) => Decided::True,
                    _ => Decided::Unknown,
                }
            })
            .collect()
    }

    /// Per file, whether some row may satisfy `predicate` (None: the statistics cannot say).
    fn may_match(&self, state: &dyn Session, predicate: Expr) -> Option<Vec<bool>> {
        // `NOT (a >= b)` becomes `a < b`, a form statistics pruning understands.
        let predicate = simplifier(state, self.df_schema.clone())
            .simplify(predicate)
            .ok()?;
        let expr = state
            .create_physical_expr(predicate, &self.df_schema)
            .ok()?;
        let pruning = PruningPredicateBuilder::new()
            .with_file_schema(self.schema.clone())
            .with_max_in_list_size(state.config_options().execution.parquet.max_in_list_size)
            .build(expr)?;
        let mask = pruning
            .prune(&LogStatistics {
                log: self.state.log_data(),
                files: self,
            })
            .ok()?;
        (mask.len() == self.files.len()).then_some(mask)
    }

    /// A scan of `projection` (indexes into [`Self::schema`]) that returns exactly the rows
    /// passing `filters` (the ones [`Self::pushdown`] accepted; others are ignored here).
    ///
    /// Files whose partition values fail a partition filter, or whose statistics prove a
    /// filter false for every row, are not read. The rest are scanned in groups by the
    /// filters their statistics leave undecided: a group with none (e.g. files wholly inside
    /// the queried time range) is read without evaluating any filter, the others through a
    /// filter that DataFusion pushes into the Parquet reader (row-group, page and bloom-filter
    /// pruning, then row filtering).
    pub(crate) fn plan_scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let filters = datafusion::logical_expr::expr_rewriter::unnormalize_cols(
            filters.iter().filter(|f| handled(f)).cloned(),
        );
        let (on_partitions, on_rows): (Vec<Expr>, Vec<Expr>) = filters
            .into_iter()
            .partition(|f| self.on_partitions_only(f));
        let mut keep = self.partitions_pass(state, on_partitions)?;
        let mut undecided: Vec<Vec<usize>> = vec![Vec::new(); self.files.len()];
        for (k, filter) in on_rows.iter().enumerate() {
            for (i, d) in self.decide(state, filter).into_iter().enumerate() {
                match d {
                    Decided::False => keep[i] = false,
                    Decided::True => {}
                    Decided::Unknown => undecided[i].push(k),
                }
            }
        }
        let mut groups: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for (i, need) in undecided.into_iter().enumerate() {
            if keep[i] {
                groups.entry(need).or_default().push(i);
            }
        }

        let projection: Vec<usize> = match projection {
            Some(p) => p.iter().map(|&i| self.to_scan[i]).collect(),
            None => self.to_scan.clone(),
        };
        let mut parts = Vec::with_capacity(groups.len());
        for (mut need, indexes) in groups {
            self.most_selective_first(&mut need, &on_rows, &indexes);
            let Some(predicate) = conjunction(need.iter().map(|&k| on_rows[k].clone())) else {
                parts.push(self.read(state, &indexes, projection.clone(), None, limit)?);
                continue;
            };
            // Read the filter's columns too, filter, then keep the projected ones.
            let mut read = projection.clone();
            for column in predicate.column_refs() {
                let i = self.scan_schema.index_of(&column.name)?;
                if !read.contains(&i) {
                    read.push(i);
                }
            }
            let input = self.read(state, &indexes, read.clone(), Some(&predicate), None)?;
            // The filter runs on the strings as read (no conversion of rows it drops); a
            // filter that does not type-check on them runs on the table's types instead.
            let (input, expr) = match on_types_of(state, predicate.clone(), &input) {
                Ok(expr) => (input, expr),
                Err(_) => {
                    let input = self.as_table_types(input)?;
                    let expr = on_types_of(state, predicate, &input)?;
                    (input, expr)
                }
            };
            let filter = FilterExecBuilder::new(expr, input)
                .apply_projection(Some((0..projection.len()).collect()))?
                .with_fetch(limit)
                .build()?;
            parts.push(self.as_table_types(Arc::new(filter))?);
        }
        match parts.len() {
            0 => Ok(Arc::new(EmptyExec::new(Arc::new(
                self.scan_schema.project(&projection)?,
            )))),
            _ => UnionExec::try_new(parts),
        }
    }

    /// Orders `need` (indexes into `filters`) so that null tests the log's statistics show to
    /// pass at most half of the rows of `files` come first, fewest passing first; the others
    /// keep their order. The Parquet reader applies filters in this order, each to the rows the
    /// previous ones kept: `error_code IS NOT NULL` (true for ~6 % of spans) before
    /// `status = 'error'` decodes `status` for those rows only.
    fn most_selective_first(&self, need: &mut [usize], filters: &[Expr], files: &[usize]) {
        // (filter, column, whether the test passes nulls)
        let tests: Vec<(usize, &str, bool)> = need
            .iter()
            .filter_map(|&k| match &filters[k] {
                Expr::IsNotNull(e) => Some((k, e, false)),
                Expr::IsNull(e) => Some((k, e, true)),
                _ => None,
            })
            .filter_map(|(k, e, nulls)| match e.as_ref() {
                Expr::Column(c) if !self.partition_fields.iter().any(|f| f.name() == &c.name) => {
                    Some((k, c.name.as_str(), nulls))
                }
                _ => None,
            })
            .collect();
        let mut share: HashMap<usize, f64> = HashMap::new();
        for (k, column, passes_nulls) in tests {
            let Some(nulls) = self.null_share(column, files) else {
                return;
            };
            let passing = if passes_nulls { nulls } else { 1.0 - nulls };
            if passing <= 0.5 {
                share.insert(k, passing);
            }
        }
        need.sort_by(|a, b| {
            let (a, b) = (
                share.get(a).copied().unwrap_or(1.0),
                share.get(b).copied().unwrap_or(1.0),
            );
            a.total_cmp(&b)
        });
    }

    /// The share of the rows of `files` (indexes into [`Self::files`]) where `column` is null,
    /// from the log's counts; None for a partition column or where a file has no counts.
    fn null_share(&self, column: &str, files: &[usize]) -> Option<f64> {
        if self.partition_fields.iter().any(|f| f.name() == column) {
            return None;
        }
        let counts = self.null_counts(column);
        let (mut nulls, mut rows) = (0u64, 0u64);
        for &i in files {
            let (n, r) = counts.get(i).copied().flatten()?;
            nulls += n;
            rows += r;
        }
        (rows > 0).then(|| nulls as f64 / rows as f64)
    }

    /// Per file (in `files` order), the null count of `column` and the row count, from the
    /// file's statistics in the log (delta-rs's own accessors for them return nothing for this
    /// table); read once per table version and column, on the first query that needs them.
    fn null_counts(&self, column: &str) -> Arc<Vec<Option<(u64, u64)>>> {
        let mut cache = self.null_counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(counts) = cache.get(column) {
            return counts.clone();
        }
        let counts: Arc<Vec<Option<(u64, u64)>>> = Arc::new(
            self.state
                .log_data()
                .iter()
                .map(|file| {
                    let stats = serde_json::from_str::<FileStats>(&file.stats()?).ok()?;
                    let nulls = stats.null_count.get(column)?.as_u64()?;
                    Some((nulls, stats.num_records))
                })
                .collect(),
        );
        cache.insert(column.to_string(), counts.clone());
        counts
    }

    /// The share of the rows of `files` `predicate` is expected to keep: null tests from the
    /// log's null counts, `<>` and `NOT` as the complement, `AND`/`OR` as for independent tests, anything
    /// else DataFusion's default filter selectivity (20 %).
    fn selectivity(&self, predicate: &Expr, files: &[usize]) -> f64 {
        const DEFAULT: f64 = 0.2;
        let null_share = |e: &Expr| -> f64 {
            match e {
                Expr::Column(c) => self.null_share(&c.name, files).unwrap_or(0.5),
                _ => 0.5,
            }
        };
        let share = match predicate {
            Expr::BinaryExpr(b) => match b.op {
                Operator::And => {
                    self.selectivity(&b.left, files) * self.selectivity(&b.right, files)
                }
                Operator::Or => {
                    1.0 - (1.0 - self.selectivity(&b.left, files))
                        * (1.0 - self.selectivity(&b.right, files))
                }
                Operator::NotEq => 1.0 - DEFAULT,
                _ => DEFAULT,
            },
            Expr::Not(e) => 1.0 - self.selectivity(e, files),
            Expr::IsNull(e) => null_share(e),
            Expr::IsNotNull(e) => 1.0 - null_share(e),
            _ => DEFAULT,
        };
        share.clamp(0.0, 1.0)
    }

    /// The file and scan schemas with the string columns in `columns` (a filter's) as
    /// `Utf8View`: the reader decodes those as views, which the filter compares fastest (on
    /// the table's `Utf8` it would convert every string it reads first), and every other
    /// column straight into the table's type, so that only returned filter columns are
    /// converted after filtering ([`Self::as_table_types`]).
    fn viewing(&self, columns: &HashSet<&Column>) -> (SchemaRef, SchemaRef) {
        let view = |fields: &[FieldRef]| -> SchemaRef {
            let fields: Vec<FieldRef> = fields
                .iter()
                .map(|f| match f.data_type() {
                    DataType::Utf8 if columns.iter().any(|c| &c.name == f.name()) => {
                        Arc::new(f.as_ref().clone().with_data_type(DataType::Utf8View))
                    }
                    _ => f.clone(),
                })
                .collect();
            Arc::new(Schema::new(fields))
        };
        (
            view(self.file_schema.fields()),
            view(self.scan_schema.fields()),
        )
    }

    /// `plan`'s rows with the table's types. Filtered scans read their filter's string columns
    /// as `Utf8View` (see [`Self::viewing`]) and convert them here, after filtering, for the
    /// rows and columns that are returned. Other columns, and unfiltered scans, decode straight
    /// into the table's types (see [`Self::read`]), so that expressions DataFusion pushes into
    /// them (the `status = 'error'` of a `CASE`) need no conversion either.
    fn as_table_types(&self, plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let schema = plan.schema();
        if !schema
            .fields()
            .iter()
            .any(|f| f.data_type() == &DataType::Utf8View)
        {
            return Ok(plan);
        }
        let exprs = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let column: Arc<dyn PhysicalExpr> = Arc::new(PhysicalColumn::new(f.name(), i));
                let expr = match f.data_type() {
                    DataType::Utf8View => physical_cast(column, &schema, DataType::Utf8)?,
                    _ => column,
                };
                Ok((expr, f.name().clone()))
            })
            .collect::<DfResult<Vec<_>>>()?;
        Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
    }

    /// A Parquet scan of the files at `indexes` (into [`Self::files`]), columns `projection`
    /// (indexes into the scan's schema); with a `predicate`, its string columns come as
    /// `Utf8View` (see [`Self::viewing`]).
    fn read(
        &self,
        state: &dyn Session,
        indexes: &[usize],
        projection: Vec<usize>,
        predicate: Option<&Expr>,
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut parquet = state.config_options().execution.parquet.clone();
        // String columns are decoded as the schemas below say (see `viewing`).
        parquet.schema_force_view_types = false;
        if let Some(predicate) = predicate {
            let columns = predicate.column_refs();
            let on = |name: &str| columns.iter().any(|c| c.name == name);
            // A lookup by a bloom-filtered column (a trace, a reference) selects a few rows.
            let lookup = BLOOM_FILTER_COLUMNS.iter().any(|c| on(c));
            // The page index pays off for ranges of the sort column (page statistics prune
            // pages: rows are ordered), for the status in files of many pages (files keep
            // their failed spans first, so the pages of successes are skipped when failures
            // are asked for; a freshly flushed file is a page or two, and loading its index
            // costs more than it skips) and for lookups (only the pages holding the few rows
            // found are read); elsewhere every page holds every value and loading it for
            // each file only costs time. Bloom filters exist only for the lookup columns.
            let bytes: u64 = indexes
                .iter()
                .map(|&i| self.files[i].object_meta.size)
                .sum();
            let large = bytes >= STATUS_PAGE_INDEX_FILE_BYTES * indexes.len().max(1) as u64;
            parquet.enable_page_index &= lookup || on(self.sorted_by) || (large && on(col::STATUS));
            parquet.bloom_filter_on_read &= lookup;
            // The reader's predicate cache keeps decoded filter columns for the output; for
            // broad filters (Q5: `status = 'error'`) copying them costs more than decoding
            // the selected rows again.
            if !lookup {
                parquet.max_predicate_cache_size = Some(0);
            }
        }
        let (file_schema, scan_schema) = match predicate {
            Some(predicate) => self.viewing(&predicate.column_refs()),
            None => (self.file_schema.clone(), self.scan_schema.clone()),
        };
        let table_schema = TableSchema::builder(file_schema)
            .with_table_partition_cols(self.partition_fields.clone())
            .build();
        // Whether this scan prunes pages (and so wants page indexes kept with the footers).
        let page_index = predicate.is_some() && parquet.enable_page_index;
        let options = TableParquetOptions {
            global: parquet,
            ..TableParquetOptions::default()
        };
        // Footers and bloom filters come from the runtime's metadata cache
        // (`EngineOptions::metadata_cache_bytes`), not from disk at every query.
        let store = state.runtime_env().object_store(&self.store_url)?;
        let footers = state.runtime_env().cache_manager.get_file_metadata_cache();
        // Filters DataFusion pushes into this source become row filters of the Parquet reader.
        let source = ParquetSource::new(table_schema)
            .with_table_parquet_options(options)
            .with_parquet_file_reader_factory(Arc::new(filters::FilterCachingFactory::new(
                store, footers, page_index,
            )))
            .with_pushdown_filters(true);
        let files: Vec<PartitionedFile> = indexes.iter().map(|&i| self.files[i].clone()).collect();
        let groups = crate::optimize::spread(
            files,
            crate::optimize::scan_groups(
                &self.store_url,
                state.config_options().execution.target_partitions.max(1),
            ),
        );
        let (groups, mut statistics) =
            compute_all_files_statistics(groups, scan_schema, true, false)?;
        if let Some(predicate) = predicate {
            // The rows the filter is expected to keep, for DataFusion's choice of join sides
            // (the filter goes into the reader, so no operator above the scan estimates it).
            let kept = self.selectivity(predicate, indexes);
            statistics.num_rows = statistics.num_rows.with_estimated_selectivity(kept);
            statistics.total_byte_size =
                statistics.total_byte_size.with_estimated_selectivity(kept);
        }
        let config = FileScanConfigBuilder::new(self.store_url.clone(), Arc::new(source))
            .with_file_groups(groups)
            .with_statistics(statistics)
            .with_limit(limit)
            .with_projection_indices(Some(projection))?
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }
}

/// `predicate` for the rows of `input`: coerced to its column types, then simplified so that
/// literals stay literals (what the reader's statistics and bloom-filter pruning look for).
fn on_types_of(
    state: &dyn Session,
    predicate: Expr,
    input: &Arc<dyn ExecutionPlan>,
) -> DfResult<Arc<dyn PhysicalExpr>> {
    let schema = Arc::new(DFSchema::try_from(input.schema())?);
    let simplifier = simplifier(state, schema.clone());
    let predicate = simplifier.simplify(simplifier.coerce(predicate, &schema)?)?;
    state.create_physical_expr(predicate, &schema)
}

/// DataFusion's expression simplifier for expressions over `schema` in this query.
fn simplifier(state: &dyn Session, schema: Arc<DFSchema>) -> ExprSimplifier {
    let context = SimplifyContext::builder()
        .with_schema(schema)
        .with_query_execution_start_time(state.execution_props().query_execution_start_time)
        .build();
    ExprSimplifier::new(context)
}

/// What statistics prove about a filter for all rows of one file.
enum Decided {
    True,
    False,
    Unknown,
}

/// The files of one table version as a table of their own: what a read pinned to a version
/// registers (a replay document, an evals export). [`crate::provider::LiveSpans`] plans the
/// same scans over whichever version is current.
#[async_trait::async_trait]
impl datafusion::catalog::TableProvider for TableFiles {
    fn schema(&self) -> SchemaRef {
        TableFiles::schema(self)
    }

    fn table_type(&self) -> datafusion::logical_expr::TableType {
        datafusion::logical_expr::TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters.iter().map(|f| pushdown(f)).collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.plan_scan(state, projection, filters, limit)
    }
}

/// How [`TableFiles::scan`] applies `filter`: exactly, unless it has subqueries, outer
/// references or unbound parameters, which are left to DataFusion above the scan.
pub(crate) fn pushdown(filter: &Expr) -> TableProviderFilterPushDown {
    if handled(filter) {
        TableProviderFilterPushDown::Exact
    } else {
        TableProviderFilterPushDown::Inexact
    }
}

/// Whether the scan evaluates `filter` itself: not with subqueries, outer references or unbound
/// parameters (DataFusion plans those above the scan).
fn handled(filter: &Expr) -> bool {
    let mut ok = true;
    let _ = filter.apply(|e| {
        if matches!(
            e,
            Expr::ScalarSubquery(_)
                | Expr::Exists(_)
                | Expr::InSubquery(_)
                | Expr::OuterReferenceColumn(..)
                | Expr::Placeholder(_)
        ) {
            ok = false;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    ok
}

/// The object store DataFusion reads the table's files from: the scheme and host of the
/// table's location (delta-rs registers its store there, see `update_datafusion_session`).
pub(crate) fn store_url(url: &url::Url) -> DfResult<ObjectStoreUrl> {
    let host = &url[url::Position::BeforeHost..url::Position::AfterPort];
    ObjectStoreUrl::parse(format!("{}://{}", url.scheme(), host))
}
