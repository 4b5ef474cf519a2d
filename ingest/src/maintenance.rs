//! Compaction and retention while ingest runs: a periodic task over the table (see
//! `toolspan_store::maintenance` for why each operation is safe next to ingest and queries).
//!
//! Every `every`: merge the small files of closed days (UTC days before today: no more
//! regular appends land there), delete the days older than the retention period, and vacuum
//! files unreferenced for longer than `vacuum_retention`. Several workers may run it: Delta's
//! conflict checker lets one of two concurrent compactions of a partition win and the other
//! retries next round. Failures are logged and retried next round; ingest never waits for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use toolspan_store::{SpanTable, StoreError};

/// Maintenance settings.
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// How often to run.
    pub every: Duration,
    /// Merge small files of closed days.
    pub compact: bool,
    /// Also merge today's files (the rollup table, whose daily data is small: a few rewrites
    /// of it cost less than reading thousands of per-flush files).
    pub compact_open_day: bool,
    /// Size compaction aims for.
    pub target_file_bytes: u64,
    /// Delete days older than this many days (`None`: keep everything).
    pub retention_days: Option<u32>,
    /// Physically delete unreferenced files older than this.
    pub vacuum_retention: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            every: Duration::from_secs(600),
            compact: true,
            compact_open_day: false,
            target_file_bytes: 128 << 20,
            retention_days: None,
            vacuum_retention: Duration::from_secs(3600),
        }
    }
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Small files merged away.
    pub files_compacted: u64,
    /// Files of expired days removed from the table.
    pub files_expired: u64,
    /// Unreferenced files deleted from storage.
    pub files_vacuumed: usize,
}

/// One round, with `today` as the first open day.
pub async fn run_once(table: &SpanTable, cfg: &MaintenanceConfig, today: chrono::NaiveDate) -> Result<RoundReport, StoreError> {
    let mut r = RoundReport::default();
    if cfg.compact {
        let before = if cfg.compact_open_day { today + chrono::Duration::days(1) } else { today };
        let c = table.compact(&before.format("%Y-%m-%d").to_string(), cfg.target_file_bytes).await?;
        r.files_compacted = c.files_removed;
    }
    if let Some(days) = cfg.retention_days {
        let cutoff = today - chrono::Duration::days(i64::from(days));
        r.files_expired = table.expire(&cutoff.format("%Y-%m-%d").to_string()).await?.files_removed;
    }
    r.files_vacuumed = table.vacuum(cfg.vacuum_retention).await?;
    Ok(r)
}

/// Runs rounds every `cfg.every` until `stop` is set.
pub async fn run(table: SpanTable, cfg: MaintenanceConfig, stop: Arc<AtomicBool>) {
    let mut tick = tokio::time::interval(cfg.every.max(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; start after one period
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let today = chrono::Utc::now().date_naive();
        match run_once(&table, &cfg, today).await {
            Ok(r) => tracing::debug!(?r, "maintenance round done"),
            Err(e) => tracing::warn!(code = %e.code(), reference = e.reference(), "maintenance round failed; retrying next round"),
        }
    }
}
