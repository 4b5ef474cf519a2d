//! Compaction and retention while ingest runs: a periodic task over the table (see
//! the parent module for why each operation is safe next to ingest and queries).
//!
//! Every `every`: merge the small files of closed days (UTC days before today: no more
//! regular appends land there) and of any partition crowded with small files (today's), delete the days older than the retention period, and vacuum
//! files unreferenced for longer than `vacuum_retention`. Several workers may run it: of two
//! maintenance commits racing, one lands and the other is refused and retried next round (see
//! `merge`). Failures are logged and retried next round; ingest never waits for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{SpanTable, StoreError};

/// Maintenance settings.
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// How often to run.
    pub every: Duration,
    /// Merge small files of closed days.
    pub compact: bool,
    /// Also merge the small files of any partition (today's included) holding at least this
    /// many, into files of about `crowded_target_bytes`; `None`: closed days only. Queries over
    /// the open day then open a few files per partition instead of one per flush.
    pub crowded_min_files: Option<usize>,
    /// Size the merging of crowded partitions aims for; files that reached it are not
    /// rewritten again, which bounds how often a row is rewritten during its day.
    pub crowded_target_bytes: u64,
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
            crowded_min_files: Some(16),
            crowded_target_bytes: 32 << 20,
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
pub async fn run_once(
    table: &SpanTable,
    cfg: &MaintenanceConfig,
    today: chrono::NaiveDate,
) -> Result<RoundReport, StoreError> {
    let mut r = RoundReport::default();
    if cfg.compact {
        let c = table
            .compact(&today.format("%Y-%m-%d").to_string(), cfg.target_file_bytes)
            .await?;
        r.files_compacted = c.files_removed;
        if let Some(min_files) = cfg.crowded_min_files {
            r.files_compacted += table
                .compact_crowded(min_files, cfg.crowded_target_bytes)
                .await?
                .files_removed;
        }
    }
    if let Some(days) = cfg.retention_days {
        let cutoff = today - chrono::Duration::days(i64::from(days));
        r.files_expired = table
            .expire(&cutoff.format("%Y-%m-%d").to_string())
            .await?
            .files_removed;
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
            Err(e) if matches!(e.kind(), crate::StoreErrorKind::Conflict { .. }) => {
                tracing::info!(reference = e.reference(), "another process's maintenance committed first; this round's merge is dropped, the next round retries")
            }
            Err(e) => {
                tracing::warn!(code = %e.code(), reference = e.reference(), detail = e.detail_text(), "maintenance round failed; retrying next round")
            }
        }
    }
}
