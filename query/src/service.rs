//! [`QueryService`]: the engine as the network front ends share it, with admission control.
//!
//! Every query from HTTP or the Postgres protocol takes one of a fixed number of slots for
//! as long as it runs. A heavy query holds one slot and its share of the CPU, never the whole
//! service: the others keep their slots and the async runtime interleaves them (DataFusion's
//! operators yield to the scheduler). A query that finds every slot taken waits in line, at
//! most its own timeout, and then fails with `overloaded` (retryable).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::SchemaRef;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::engine::{Engine, QueryResult};
use crate::error::{QueryError, QueryErrorKind};

/// The shared query front: an [`Engine`] and its admission slots.
#[derive(Debug)]
pub struct QueryService {
    engine: Arc<Engine>,
    slots: Arc<Semaphore>,
    limit: usize,
    queue_wait: Duration,
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
    pub fn new(engine: Arc<Engine>, max_concurrent: usize) -> QueryService {
        let limit = max_concurrent.max(1);
        let queue_wait = engine.options().query_timeout;
        QueryService {
            engine,
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            queue_wait,
        }
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
    pub async fn query(&self, sql: &str) -> Result<QueryResult, QueryError> {
        let _slot = self.admit().await?;
        self.engine.query(sql).await
    }

    /// The result schema of a query, without running it (planning takes no slot).
    pub async fn schema_of(&self, sql: &str) -> Result<SchemaRef, QueryError> {
        self.engine.schema_of(sql).await
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
