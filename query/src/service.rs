//! [`QueryService`]: the engine as the network front ends share it, with admission control
//! and its own threads.
//!
//! Queries run on a dedicated multi-threaded runtime, never on the threads that accept
//! connections and parse requests: a CPU-bound operator (a nested-loop join over a huge
//! input) can hold a thread for seconds between yields, and on a shared runtime that stalls
//! every other request. The query runtime has several times more threads than cores, so a
//! heavy query keeps some of them busy while the operating system time-slices the others
//! between the remaining queries; the runtime's threads also get a large stack (deep
//! expressions recurse during planning and evaluation).
//!
//! Every query takes one of a fixed number of slots for as long as it runs. A query that
//! finds every slot taken waits in line, at most its own timeout, and then fails with
//! `overloaded` (retryable). A query whose caller goes away (a closed connection) is aborted.
//!
//! All queries share one memory pool, the engine's ([`Engine::memory_pool`]): what operators
//! buffer, collected results ([`QueryService::query`]) and the batches of streamed results in
//! flight ([`QueryService::query_stream`]) all count against the one `--memory-limit-mb`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::logical_expr::LogicalPlan;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::engine::{Engine, QueryResult};
use crate::error::{QueryError, QueryErrorKind};
use crate::metrics::{QueryMetrics, Snapshot};
use crate::stream::{Deadline, ResultStream};

/// The shared query front: an [`Engine`] and its admission slots.
pub struct QueryService {
    engine: Arc<Engine>,
    slots: Arc<Semaphore>,
    limit: usize,
    queue_wait: Duration,
    metrics: Arc<QueryMetrics>,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for QueryService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryService")
            .field("engine", &self.engine)
            .field("limit", &self.limit)
            .field("queue_wait", &self.queue_wait)
            .finish()
    }
}

impl Drop for QueryService {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is not allowed inside another runtime.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// How much longer than the query timeout a caller waits before abandoning the query's
/// task (the engine's own timer answers first whenever the query yields).
const CALLER_GRACE: Duration = Duration::from_millis(500);

/// Stack size of the query threads.
const QUERY_STACK_BYTES: usize = 16 << 20;

/// Threads of the query runtime: four per core, at least eight.
fn query_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 4).max(8)
}

/// Aborts a spawned query when the caller stops waiting for it.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Queries that may run at once when not configured: a few per core, at least four, so that
/// a dashboard's panels run side by side and one slow query leaves room for the rest.
pub fn default_concurrency() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 2).max(4)
}

impl QueryService {
    /// A service running at most `max_concurrent` queries at once (at least one); queries
    /// wait for a slot at most the engine's query timeout.
    ///
    /// # Panics
    ///
    /// When the operating system refuses the query runtime's threads.
    pub fn new(engine: Arc<Engine>, max_concurrent: usize) -> QueryService {
        let limit = max_concurrent.max(1);
        let queue_wait = engine.options().query_timeout;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(query_threads())
            .thread_stack_size(QUERY_STACK_BYTES)
            .thread_name("toolspan-query")
            .enable_all()
            .build()
            // Only fails when threads cannot be created: nothing can run then.
            .expect("the query runtime's threads can be created");
        QueryService {
            engine,
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            queue_wait,
            metrics: Arc::new(QueryMetrics::new()),
            runtime: Some(runtime),
        }
    }

    /// Sets how long a query waits for a slot before failing with `overloaded` (default:
    /// the engine's query timeout).
    pub fn with_queue_wait(mut self, wait: Duration) -> QueryService {
        self.queue_wait = wait;
        self
    }

    /// The engine behind the service.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Queries allowed to run at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Queries running right now.
    pub fn running(&self) -> usize {
        self.limit - self.slots.available_permits()
    }

    /// Runs one read-only query in a slot.
    ///
    /// The time limit is enforced here, on the caller's side, as well as inside the engine:
    /// work that never yields (planning, one scalar function over one batch) cannot be
    /// interrupted by the engine's own timer, but the caller gets its `query_timeout` answer
    /// on time all the same. The slot belongs to the query's task and is only given back when
    /// that work has really stopped, so abandoned work still counts against the slots.
    pub async fn query(&self, sql: &str) -> Result<QueryResult, QueryError> {
        let started = Instant::now();
        let result = self.query_in_slot(sql).await;
        self.metrics.statement(
            started.elapsed(),
            result.as_ref().map(QueryResult::num_rows),
        );
        result
    }

    async fn query_in_slot(&self, sql: &str) -> Result<QueryResult, QueryError> {
        let slot = self.admit().await?;
        let engine = self.engine.clone();
        let text = sql.to_string();
        self.on_query_runtime(sql, async move {
            let _slot = slot;
            engine.query(&text).await
        })
        .await
    }

    /// Runs `work` over the engine in one slot on the query threads, under the query time
    /// limit as a whole: for requests of several statements that belong together (a replay
    /// document or an evals export, all read at one table version).
    pub async fn run_in_slot<T, F, Fut>(&self, what: &str, work: F) -> Result<T, QueryError>
    where
        F: FnOnce(Arc<Engine>) -> Fut,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let started = Instant::now();
        let slot = self.admit().await?;
        let work = work(self.engine.clone());
        let result = self
            .on_query_runtime(what, async move {
                let _slot = slot;
                Ok(work.await)
            })
            .await;
        self.metrics
            .statement(started.elapsed(), result.as_ref().map(|_| 0));
        result
    }

    /// Runs one read-only query in a slot and streams its result: the batches come as the
    /// engine produces them, the next one only once the caller asks for it ([`ResultStream`]).
    /// The query's time limit covers the whole stream; the slot is held until the stream ends
    /// or is dropped. Errors before the result starts (planning, admission) come here.
    pub async fn query_stream(&self, sql: &str) -> Result<ResultStream, QueryError> {
        self.query_stream_until(sql, None).await
    }

    /// [`QueryService::query_stream`] with a deadline of its own when that comes before the
    /// query timeout (the statements of one Postgres `Query` message share one).
    pub async fn query_stream_until(
        &self,
        sql: &str,
        until: Option<tokio::time::Instant>,
    ) -> Result<ResultStream, QueryError> {
        let started = Instant::now();
        let slot = match self.admit().await {
            Ok(slot) => slot,
            Err(e) => {
                self.metrics.statement(started.elapsed(), Err(&e));
                return Err(e);
            }
        };
        let Some(runtime) = self.runtime.as_ref() else {
            return Err(QueryError::new(
                QueryErrorKind::Internal,
                "query runtime gone",
            ));
        };
        let limit = self.engine.options().query_timeout;
        let own = tokio::time::Instant::now() + limit;
        let deadline = Deadline {
            at: until.map_or(own, |u| u.min(own)),
            limit,
            sql: crate::engine::shorten_sql(sql),
        };
        crate::stream::start(
            runtime,
            self.engine.clone(),
            sql.to_string(),
            deadline,
            CALLER_GRACE,
            slot,
            self.metrics.clone(),
            started,
        )
        .await
    }

    /// The service's metrics.
    pub fn metrics(&self) -> &QueryMetrics {
        &self.metrics
    }

    /// The service's metrics in the Prometheus text format, as of now.
    pub fn metrics_text(&self) -> String {
        let now = Snapshot {
            running: self.running(),
            slots: self.limit,
            table_version: self.engine.version(),
        };
        self.metrics.encode(now, self.engine.data_cache_stats())
    }

    /// Plans one statement through the read-only gate on the query threads, under the time
    /// limit, without a slot (the complexity guard bounds what planning can cost).
    pub async fn plan(&self, sql: &str) -> Result<LogicalPlan, QueryError> {
        let engine = self.engine.clone();
        let text = sql.to_string();
        self.on_query_runtime(sql, async move { engine.plan(&text).await })
            .await
    }

    /// The result schema of a query, without running it (planning takes no slot).
    pub async fn schema_of(&self, sql: &str) -> Result<SchemaRef, QueryError> {
        let plan = self.plan(sql).await?;
        Ok(Arc::new(plan.schema().as_arrow().clone()))
    }

    /// Runs `work` on the query runtime; aborts it when the caller goes away or the query
    /// timeout (plus a moment for the engine's own, better worded, timeout) has passed.
    async fn on_query_runtime<T: Send + 'static>(
        &self,
        sql: &str,
        work: impl std::future::Future<Output = Result<T, QueryError>> + Send + 'static,
    ) -> Result<T, QueryError> {
        let Some(runtime) = self.runtime.as_ref() else {
            return Err(QueryError::new(
                QueryErrorKind::Internal,
                "query runtime gone",
            ));
        };
        let limit = self.engine.options().query_timeout;
        let mut task = AbortOnDrop(runtime.spawn(work));
        match tokio::time::timeout(limit + CALLER_GRACE, &mut task.0).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(QueryError::new(
                QueryErrorKind::Internal,
                format_args!("query task failed: {e}"),
            )),
            Err(_) => Err(QueryError::new(
                QueryErrorKind::Timeout {
                    seconds: limit.as_secs().max(1),
                },
                format_args!(
                    "query abandoned after {:?} without yielding (planning or one function call \
                     ran past the limit): {}",
                    limit + CALLER_GRACE,
                    crate::engine::shorten_sql(sql)
                ),
            )),
        }
    }

    async fn admit(&self) -> Result<OwnedSemaphorePermit, QueryError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let started = Instant::now();
        match tokio::time::timeout(self.queue_wait, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a timeout is the only way to get here.
            _ => Err(QueryError::new(
                QueryErrorKind::Overloaded {
                    limit: self.limit,
                    waited_seconds: started.elapsed().as_secs(),
                },
                format_args!("no query slot free after {:?}", started.elapsed()),
            )),
        }
    }
}
