//! [`Engine`]: a DataFusion session over the `spans` table and its views, read-only.
//!
//! Every query goes through the same gate: measure (statements too complex to plan safely,
//! [`crate::guard`]), parse (syntax errors), refuse anything but a
//! query (forbidden statements), check table names (unknown tables), plan (unknown columns
//! and other planning errors), verify the plan is read-only once more, then run under a time
//! limit in a memory-limited runtime.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::context::SQLOptions;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use futures::StreamExt;
use toolspan_store::SpanTable;

use crate::data_cache::DataCache;
use crate::error::{QueryError, QueryErrorKind};
use crate::optimize::PartitionKeyAggregate;
use crate::provider::LiveSpans;
use crate::views;

/// Limits and freshness of an [`Engine`].
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// How stale the table version a query reads may be: each scan checks the log for a new
    /// version at most this often (zero: on every scan).
    pub refresh_interval: Duration,
    /// Queries running longer are cancelled with `query_timeout`.
    pub query_timeout: Duration,
    /// Memory all running queries may use together; beyond it they fail with
    /// `resources_exhausted` (sorts and aggregations spill first where DataFusion can).
    pub memory_limit: Option<usize>,
    /// Parallelism of a query; `None` uses the number of cores.
    pub target_partitions: Option<usize>,
    /// Bytes of Parquet footers (schema, statistics, page indexes) kept in memory between
    /// queries, so a warm query does not re-read and re-decode the footer of every file it
    /// touches. Least recently used footers are evicted past the limit.
    pub metadata_cache_bytes: usize,
    /// Bytes of Parquet data of tables on object storage kept in memory between queries
    /// ([`crate::data_cache`]): what the page cache does for a local table. Zero turns it off;
    /// local tables never use it.
    pub data_cache_bytes: u64,
}

impl Default for EngineOptions {
    /// 1 s freshness, 30 s timeout, 1 GiB of memory, 512 MiB of Parquet footers cached,
    /// 1 GiB of remote tables' data cached.
    fn default() -> Self {
        EngineOptions {
            refresh_interval: Duration::from_secs(1),
            query_timeout: Duration::from_secs(30),
            memory_limit: Some(1 << 30),
            target_partitions: None,
            metadata_cache_bytes: 512 << 20,
            data_cache_bytes: 1 << 30,
        }
    }
}

/// A query result: the schema (also for empty results) and the batches. A result the engine
/// collected keeps its memory reserved in the query memory pool for as long as it lives.
#[derive(Debug, Clone)]
pub struct QueryResult {
    /// The result's columns.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
    /// The rows' memory, counted in the pool all running queries share.
    memory: Option<Arc<MemoryReservation>>,
}

impl QueryResult {
    /// A result made outside the engine (not counted in its memory pool).
    pub fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> QueryResult {
        QueryResult {
            schema,
            batches,
            memory: None,
        }
    }

    /// Bytes of the result reserved in the query memory pool.
    pub fn reserved_bytes(&self) -> usize {
        self.memory.as_ref().map_or(0, |m| m.size())
    }

    /// Rows in the result.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }
}

/// The query engine: `spans`, `calls` and `failure_rates` over one Delta table.
pub struct Engine {
    ctx: SessionContext,
    spans: Arc<LiveSpans>,
    options: EngineOptions,
    data_cache: Option<DataCache>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("spans", &self.spans)
            .field("options", &self.options)
            .finish()
    }
}

impl Engine {
    /// What the data cache of remote tables served (`None` when it is off).
    pub fn data_cache_stats(&self) -> Option<&crate::data_cache::CacheStats> {
        self.data_cache.as_ref().map(DataCache::stats)
    }

    /// Opens the table at `location` with `options`.
    pub async fn open_with(location: &str, options: EngineOptions) -> Result<Engine, QueryError> {
        let table = SpanTable::open_or_create(location)
            .await
            .map_err(|e| QueryError::from_store(&e))?;
        Engine::with_table(table, options).await
    }

    /// An engine over an already open table (the embedded mode shares one [`SpanTable`]
    /// between its writer and its query service); `failure_rates` is computed from `spans`.
    pub async fn with_table(
        table: SpanTable,
        options: EngineOptions,
    ) -> Result<Engine, QueryError> {
        Engine::with_tables(table, None, options).await
    }

    /// An engine over `spans` whose `failure_rates` view reads the metrics job's per-minute
    /// rollup (`failure_rates_1m`, a [`toolspan_store::TableKind::FailureRates`] table) when
    /// `rollup` is given, and is computed from `spans` otherwise. The rollup follows new
    /// commits like `spans` does.
    pub async fn with_tables(
        table: SpanTable,
        rollup: Option<SpanTable>,
        options: EngineOptions,
    ) -> Result<Engine, QueryError> {
        // `information_schema.tables` and `.columns` (and `DESCRIBE`) say what there is to query;
        // its settings table is refused by the read-only gate (`forbidden_table`).
        let mut config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema("datafusion", "public");
        if let Some(n) = options.target_partitions {
            config = config.with_target_partitions(n.max(1));
        }
        // Strings stay `Utf8` in results, as in the table schema.
        config
            .options_mut()
            .execution
            .parquet
            .schema_force_view_types = false;
        config.options_mut().sql_parser.map_string_types_to_utf8view = false;
        // Joins here are the `calls` view's self-joins within traces: build and probe sides are
        // alike in size and every probe row finds its trace, so the runtime filters DataFusion
        // derives from a join's build side (a hash lookup per probe row in the scan) only
        // repeat the join's work (Q6 of bench/query: ~25 % slower with them). Filters the
        // query states (a trace id, a time range) are still pushed to both sides statically.
        config
            .options_mut()
            .optimizer
            .enable_join_dynamic_filter_pushdown = false;
        // Join sides are chosen with the row estimates of `estimate::registry`.
        config.options_mut().optimizer.use_statistics_registry = true;
        let mut runtime =
            RuntimeEnvBuilder::new().with_metadata_cache_limit(options.metadata_cache_bytes);
        if let Some(limit) = options.memory_limit {
            runtime = runtime.with_memory_limit(limit, 1.0);
        }
        let runtime = runtime
            .build_arc()
            .map_err(|e| QueryError::from_datafusion(&e))?;
        let pool = runtime.memory_pool.clone();
        let mut state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(PartitionKeyAggregate))
            .with_statistics_registry(crate::estimate::registry())
            .build();
        // JSON in SQL: `json_get_str(attributes, 'k')`, `attributes->>'k'`, `json_contains`...
        // over the JSON-text columns (attributes, input, output, error_frames).
        datafusion_functions_json::register_all(&mut state)
            .map_err(|e| QueryError::from_datafusion(&e))?;
        let ctx = SessionContext::new_with_state(state);
        crate::bounded::install(&ctx, &pool).map_err(|e| QueryError::from_datafusion(&e))?;

        let data_cache =
            (options.data_cache_bytes > 0).then(|| DataCache::new(options.data_cache_bytes));
        register_store(&ctx, &table, data_cache.as_ref()).await?;
        let footers = Some(ctx.runtime_env().cache_manager.get_file_metadata_cache());
        let spans = Arc::new(
            LiveSpans::new(table, options.refresh_interval, footers.clone())
                .await
                .map_err(|e| QueryError::from_store(&e))?,
        );
        ctx.register_table("spans", spans.clone())
            .map_err(|e| QueryError::from_datafusion(&e))?;
        let with_rollup = rollup.is_some();
        if let Some(rollup) = rollup {
            // The rollup may live in another bucket than the spans.
            register_store(&ctx, &rollup, data_cache.as_ref()).await?;
            let provider = LiveSpans::new(rollup, options.refresh_interval, footers)
                .await
                .map_err(|e| QueryError::from_store(&e))?;
            ctx.register_table(views::ROLLUP_TABLE, Arc::new(provider))
                .map_err(|e| QueryError::from_datafusion(&e))?;
        }
        views::register(&ctx, with_rollup)
            .await
            .map_err(|e| QueryError::from_datafusion(&e))?;
        // Debug: every command that reads the table opens an engine (the demo's summary opens
        // several); the services say they are ready when they listen.
        tracing::debug!(
            version = spans.version(),
            failure_rates = if with_rollup { "rollup" } else { "spans" },
            "query engine ready"
        );
        Ok(Engine {
            ctx,
            spans,
            options,
            data_cache,
        })
    }

    /// Runs one read-only query and returns its batches.
    pub async fn sql(&self, text: &str) -> Result<Vec<RecordBatch>, QueryError> {
        Ok(self.query(text).await?.batches)
    }

    /// Runs one read-only query and returns its schema and batches.
    pub async fn query(&self, text: &str) -> Result<QueryResult, QueryError> {
        let seconds = self.options.query_timeout.as_secs().max(1);
        match tokio::time::timeout(self.options.query_timeout, self.run(text)).await {
            Ok(result) => result,
            Err(_) => Err(QueryError::new(
                QueryErrorKind::Timeout { seconds },
                format_args!(
                    "query cancelled after {:?}: {}",
                    self.options.query_timeout,
                    shorten_sql(text)
                ),
            )),
        }
    }

    /// The result schema of a query, without running it (clients that describe a statement
    /// before executing it, such as the Postgres extended protocol, use this).
    pub async fn schema_of(&self, text: &str) -> Result<SchemaRef, QueryError> {
        let plan = self.plan(text).await?;
        Ok(Arc::new(plan.schema().as_arrow().clone()))
    }

    /// Moves queries to the latest committed table version now (queries also do this on
    /// their own, at most once per `refresh_interval`). Returns the version.
    pub async fn refresh(&self) -> Result<u64, QueryError> {
        self.spans
            .refresh()
            .await
            .map_err(|e| QueryError::from_store(&e))
    }

    /// The table version queries currently read.
    pub fn version(&self) -> u64 {
        self.spans.version()
    }

    /// The `spans` provider (reads pinned to one version start from its table).
    pub(crate) fn live_spans(&self) -> &LiveSpans {
        &self.spans
    }

    /// The DataFusion context, for protocol front ends that drive DataFusion directly (they
    /// must apply the same read-only gate: see [`Engine::plan`]).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The options the engine runs with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The memory pool every query of this engine reserves in: operators, collected and
    /// streamed results, and the functions of [`crate::bounded`].
    pub fn memory_pool(&self) -> Arc<dyn MemoryPool> {
        self.ctx.runtime_env().memory_pool.clone()
    }

    /// Gates, plans and starts one read-only statement: its result schema and the stream of
    /// its batches (no time limit of its own: the caller bounds it, see [`crate::stream`]).
    pub async fn stream(
        &self,
        text: &str,
    ) -> Result<(SchemaRef, SendableRecordBatchStream), QueryError> {
        let plan = self.plan(text).await?;
        let df = self
            .ctx
            .execute_logical_plan(plan)
            .await
            .map_err(|e| QueryError::from_datafusion(&e))?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let stream = df
            .execute_stream()
            .await
            .map_err(|e| QueryError::from_datafusion(&e))?;
        Ok((schema, stream))
    }

    async fn run(&self, text: &str) -> Result<QueryResult, QueryError> {
        let (schema, mut stream) = self.stream(text).await?;
        // The collected rows count in the pool all running queries share, for as long as the
        // result lives: operators spill or fail inside the pool, and so does the result.
        let pool = self.memory_pool();
        let memory = MemoryConsumer::new("collected query result").register(&pool);
        let mut batches = Vec::new();
        let mut rows = 0usize;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(|e| QueryError::from_datafusion(&e))?;
            let bytes = crate::stream::batch_bytes(&batch);
            rows += batch.num_rows();
            if memory.try_grow(bytes).is_err() {
                return Err(QueryError::new(
                    QueryErrorKind::ResourcesExhausted,
                    format_args!(
                        "result does not fit in the memory pool shared by all running queries \
                         ({} bytes held by this result, {} by all, limit {:?}) after {rows} \
                         rows: {}",
                        memory.size(),
                        pool.reserved(),
                        self.options.memory_limit,
                        shorten_sql(text)
                    ),
                ));
            }
            batches.push(batch);
        }
        Ok(QueryResult {
            schema,
            batches,
            memory: Some(Arc::new(memory)),
        })
    }

    /// Parses, gates and plans one statement: the read-only gate every entry point uses.
    pub async fn plan(&self, text: &str) -> Result<LogicalPlan, QueryError> {
        // Before any syntax tree exists: deep expression trees overflow the stack later.
        crate::guard::check(text)?;
        let state = self.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state
            .sql_to_statement(text, &dialect)
            .map_err(|e| QueryError::from_datafusion(&e))?;
        if let Some(what) = forbidden(&statement, text) {
            return Err(QueryError::new(
                QueryErrorKind::ForbiddenStatement { statement: what },
                format_args!("refused statement: {}", shorten_sql(text)),
            ));
        }
        // The syntax tree is shallow now (the token guard bounded it): count what the plan
        // would read once CTEs and views are expanded, before planning expands them.
        crate::guard::check_relations(&statement)?;
        let references = state
            .resolve_table_references(&statement)
            .map_err(|e| QueryError::from_datafusion(&e))?;
        for r in references {
            // The session's settings are the service's configuration, not data.
            if r.schema() == Some("information_schema") && r.table() == "df_settings" {
                return Err(QueryError::new(
                    QueryErrorKind::ForbiddenStatement {
                        statement: "reading the session's settings".into(),
                    },
                    format_args!("refused settings read: {}", shorten_sql(text)),
                ));
            }
            // Table functions (generate_series, range) appear among the references too.
            let known = self.ctx.table_exist(r.clone()).unwrap_or(false)
                || (r.schema().is_none() && state.table_functions().contains_key(r.table()));
            if !known {
                return Err(QueryError::new(
                    QueryErrorKind::UnknownTable {
                        table: r.to_string(),
                    },
                    format_args!("unknown table {r}"),
                ));
            }
        }
        let plan = state
            .statement_to_plan(statement)
            .await
            .map_err(|e| QueryError::from_datafusion(&e))?;
        crate::guard::check_plan(&plan)?;
        if let Some(what) = forbidden_plan(&plan) {
            return Err(QueryError::new(
                QueryErrorKind::ForbiddenStatement {
                    statement: what.into(),
                },
                format_args!("refused plan {}: {}", plan.display(), shorten_sql(text)),
            ));
        }
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)
            .map_err(|e| {
                QueryError::new(
                    QueryErrorKind::ForbiddenStatement {
                        statement: "this statement".into(),
                    },
                    e,
                )
            })?;
        Ok(plan)
    }
}

/// Names a statement that is not a query by its leading keywords (taken from the user's own
/// text), or `None` for a query.
fn forbidden(statement: &DfStatement, text: &str) -> Option<String> {
    use datafusion::sql::sqlparser::ast::DescribeAlias;
    match statement {
        DfStatement::Statement(s) if matches!(s.as_ref(), SqlStatement::Query(_)) => None,
        // A table's columns: `DESCRIBE calls` (read-only, planned
        // over the same catalog as queries; `EXPLAIN` of a statement stays refused).
        DfStatement::Statement(s)
            if matches!(
                s.as_ref(),
                SqlStatement::ExplainTable {
                    describe_alias: DescribeAlias::Describe | DescribeAlias::Desc,
                    hive_format: None,
                    ..
                }
            ) =>
        {
            None
        }
        DfStatement::CreateExternalTable(_) => Some("CREATE EXTERNAL TABLE".into()),
        DfStatement::CopyTo(_) => Some("COPY".into()),
        DfStatement::Explain(_) => Some("EXPLAIN".into()),
        DfStatement::Reset(_) => Some("RESET".into()),
        DfStatement::Statement(s) => Some(match s.as_ref() {
            SqlStatement::Explain { .. } | SqlStatement::ExplainTable { .. } => "EXPLAIN".into(),
            _ => leading_keywords(text),
        }),
    }
}

/// A plan that writes or changes the session even though its text parsed as a query
/// (`SELECT … INTO t` creates a table).
fn forbidden_plan(plan: &LogicalPlan) -> Option<&'static str> {
    match plan {
        LogicalPlan::Ddl(_) => Some("creating or dropping objects (e.g. SELECT … INTO)"),
        LogicalPlan::Dml(_) | LogicalPlan::Copy(_) => Some("writing data"),
        LogicalPlan::Statement(_) => Some("session statements"),
        LogicalPlan::Explain(_) | LogicalPlan::Analyze(_) => Some("EXPLAIN"),
        _ => None,
    }
}

/// `drop table spans` → `DROP TABLE`; `insert into …` → `INSERT`.
fn leading_keywords(text: &str) -> String {
    let words: Vec<String> = text
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
        .take(3)
        .map(|w| w.to_ascii_uppercase())
        .collect();
    let Some(first) = words.first() else {
        return "this statement".into();
    };
    let n = match first.as_str() {
        "CREATE" | "DROP" | "ALTER" | "TRUNCATE"
            if words
                .get(1)
                .is_some_and(|w| w == "EXTERNAL" || w == "OR" || w == "TEMPORARY") =>
        {
            3
        }
        "CREATE" | "DROP" | "ALTER" | "SHOW" | "DELETE" => 2,
        _ => 1,
    };
    words.into_iter().take(n).collect::<Vec<_>>().join(" ")
}

/// The statement text for logs: one line, bounded.
pub(crate) fn shorten_sql(text: &str) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(500) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

/// Lets DataFusion find a table's object store by URL when it reads data files (the scan
/// asks the runtime for the store of the table's scheme and bucket). A remote table's store
/// gets `cache` in front of it; delta-rs's registration below then leaves it in place.
async fn register_store(
    ctx: &SessionContext,
    table: &SpanTable,
    cache: Option<&DataCache>,
) -> Result<(), QueryError> {
    let latest = table
        .latest()
        .await
        .map_err(|e| QueryError::from_store(&e))?;
    let root = latest.log_store().root_url().clone();
    if let (Some(cache), true) = (cache, toolspan_store::storage::is_remote(root.as_str())) {
        let store_url =
            crate::scan::store_url(&root).map_err(|e| QueryError::from_datafusion(&e))?;
        let runtime = ctx.runtime_env();
        if runtime.object_store(&store_url).is_err() {
            let store = cache.wrap(latest.log_store().root_object_store(None));
            runtime.register_object_store(store_url.as_ref(), store);
        }
    }
    latest.update_datafusion_session(&ctx.state()).map_err(|e| {
        QueryError::new(
            QueryErrorKind::Internal,
            format_args!("registering the object store: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_name_the_statement() {
        assert_eq!(leading_keywords("drop table spans"), "DROP TABLE");
        assert_eq!(leading_keywords("  INSERT INTO spans VALUES (1)"), "INSERT");
        assert_eq!(
            leading_keywords("create external table x stored as csv location '/tmp'"),
            "CREATE EXTERNAL TABLE"
        );
        assert_eq!(leading_keywords("SET x = 1"), "SET");
    }
}
