//! [`LiveSpans`]: the `spans` table as a DataFusion [`TableProvider`] that follows new commits.
//!
//! Views (`calls`, `failure_rates`) are planned once, at registration, against this provider,
//! so the provider itself must move to new table versions: each scan first checks, at most
//! once per refresh interval, whether the Delta log has a newer version and, if so, swaps in a
//! scan over the new snapshot's files ([`TableFiles`]: DataFusion's Parquet scan, partition
//! pruning on tool, stage and date, file pruning on the log's statistics).
//!
//! Maintenance replaces small files with merged ones every minute or so; the decoded footers
//! of the files a version no longer has are dropped from the engine's footer cache when the
//! provider moves past them, so the cache holds the live files' footers rather than filling
//! its whole budget with files that no query can read again.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use datafusion::logical_expr::{Expr, LogicalPlan, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use deltalake::delta_datafusion::{DeltaScanConfig, DeltaScanNext};
use deltalake::{DeltaTable, Path};

use crate::scan::TableFiles;
use toolspan_store::{SpanTable, StoreError, StoreErrorKind};

/// The provider behind the `spans` table name.
pub struct LiveSpans {
    table: SpanTable,
    interval: Duration,
    schema: SchemaRef,
    /// The engine's cache of decoded Parquet footers, which forgets removed files.
    footers: Option<Arc<FileMetadataCache>>,
    current: RwLock<Current>,
    /// One refresh at a time; concurrent queries wait for it and then use its result.
    refreshing: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Current {
    scan: Arc<TableFiles>,
    version: u64,
    checked: Instant,
}

impl std::fmt::Debug for LiveSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSpans")
            .field("version", &self.current().version)
            .finish()
    }
}

/// How delta-rs should present the table: plain `Utf8` strings and undecorated partition
/// values, so query results have exactly the types of `toolspan_schema::spans_schema()`
/// (clients of the HTTP and Postgres interfaces see one stable set of types).
fn scan_config() -> DeltaScanConfig {
    let mut config = DeltaScanConfig::new().with_wrap_partition_values(false);
    config.schema_force_view_types = false;
    config
}

/// The scan over the files of `table`'s loaded version, and that version.
pub(crate) fn build_scan(
    table: &DeltaTable,
    sorted_by: &'static str,
) -> Result<(Arc<TableFiles>, u64), StoreError> {
    let state = table
        .snapshot()
        .map_err(|e| StoreError::from_delta("reading the table state", e))?;
    // The SQL schema is the one delta-rs's own provider would present with this config.
    let schema = DeltaScanNext::new(state.snapshot().clone(), scan_config())
        .map_err(|e| internal("building the table scan", e))?
        .schema();
    let files = TableFiles::new(table, schema, sorted_by)
        .map_err(|e| internal("building the table scan", e))?;
    let version = files.version();
    Ok((Arc::new(files), version))
}

fn internal(op: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::new(StoreErrorKind::Internal { op }, e)
}

impl LiveSpans {
    /// A provider over the latest version of `table`, re-checking for new versions at most
    /// once per `interval` (zero: on every scan). When it moves to a new version it drops the
    /// removed files from `footers`, the footer cache its scans read through.
    pub async fn new(
        table: SpanTable,
        interval: Duration,
        footers: Option<Arc<FileMetadataCache>>,
    ) -> Result<LiveSpans, StoreError> {
        let latest = table.latest().await?;
        let (scan, version) = build_scan(&latest, table.kind().sort_column())?;
        let schema = scan.schema();
        Ok(LiveSpans {
            table,
            interval,
            schema,
            footers,
            current: RwLock::new(Current {
                scan,
                version,
                checked: Instant::now(),
            }),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    /// The table version queries currently read.
    pub fn version(&self) -> u64 {
        self.current().version
    }

    /// The table behind the provider (for reads pinned to one version).
    pub(crate) fn table(&self) -> &SpanTable {
        &self.table
    }

    /// Moves to the latest committed version now, whatever the interval. Returns the version.
    pub async fn refresh(&self) -> Result<u64, StoreError> {
        let _guard = self.refreshing.lock().await;
        self.refresh_locked().await
    }

    /// Moves to the latest version if the last check is older than the interval.
    pub async fn refresh_if_stale(&self) -> Result<u64, StoreError> {
        if self.current().checked.elapsed() < self.interval {
            return Ok(self.version());
        }
        let _guard = self.refreshing.lock().await;
        // Another query may have refreshed while this one waited for the lock.
        if self.current().checked.elapsed() < self.interval {
            return Ok(self.version());
        }
        self.refresh_locked().await
    }

    async fn refresh_locked(&self) -> Result<u64, StoreError> {
        let have = self.version();
        let latest = self.table.latest_version().await?;
        if latest <= have {
            self.set_checked();
            return Ok(have);
        }
        let table = self.table.latest().await?;
        let (scan, version) = build_scan(&table, self.table.kind().sort_column())?;
        let replaced = {
            let mut guard = self.write_current();
            if version < guard.version {
                return Ok(guard.version);
            }
            std::mem::replace(
                &mut *guard,
                Current {
                    scan: scan.clone(),
                    version,
                    checked: Instant::now(),
                },
            )
        };
        let forgotten = self.forget_removed(&replaced.scan, &scan);
        tracing::debug!(version, forgotten, "spans provider refreshed");
        Ok(version)
    }

    /// Drops from the footer cache the files `old` has and `new` does not; returns how many
    /// were cached. A query still running on `old` reads such a footer again if it needs it.
    fn forget_removed(&self, old: &TableFiles, new: &TableFiles) -> usize {
        let Some(footers) = &self.footers else {
            return 0;
        };
        let live: HashSet<&Path> = new.locations().collect();
        old.locations()
            .filter(|l| !live.contains(l))
            .filter(|l| {
                // The file's bloom filters read so far are kept beside its footer.
                footers.remove(&crate::scan::filters::filters_key(l));
                footers.remove(l).is_some()
            })
            .count()
    }

    fn set_checked(&self) {
        self.write_current().checked = Instant::now();
    }

    fn current(&self) -> Current {
        // A poisoned lock means a panic while swapping in a complete value: still consistent.
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn write_current(&self) -> std::sync::RwLockWriteGuard<'_, Current> {
        match self.current.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    async fn fresh_scan(&self) -> DfResult<Arc<TableFiles>> {
        self.refresh_if_stale()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(self.current().scan)
    }
}

#[async_trait]
impl TableProvider for LiveSpans {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn get_logical_plan(&self) -> Option<Cow<'_, LogicalPlan>> {
        None
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        // The same for every table version: no need to look at the current one.
        Ok(filters.iter().map(|f| crate::scan::pushdown(f)).collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.fresh_scan()
            .await?
            .plan_scan(state, projection, filters, limit)
    }
}
