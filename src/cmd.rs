//! Subcommands.

pub mod compare;
pub mod demo;
pub mod evals;
pub mod ingest;
pub mod listen;
pub mod metrics;
pub mod produce;
pub mod query;
pub mod serve;
pub mod sql;

/// The default data directory: `./toolspan-data` (the `spans` table lives in `spans/`).
pub const DEFAULT_DATA_DIR: &str = "toolspan-data";

/// A data directory: a local directory or an object-store prefix (`s3://bucket/prefix`,
/// `toolspan_store::storage`). The spans table is `<data-dir>/spans`, the metrics job's rollup
/// `<data-dir>/failure_rates_1m`.
#[derive(Clone, Debug)]
pub struct DataDir(String);

impl std::str::FromStr for DataDir {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Err("the data directory is empty".into());
        }
        Ok(DataDir(s.to_string()))
    }
}

impl std::fmt::Display for DataDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl DataDir {
    /// The location of the table `name` inside it.
    pub fn table(&self, name: &str) -> String {
        toolspan_store::storage::join(&self.0, name)
    }

    /// The spans table's location.
    pub fn spans(&self) -> String {
        self.table(toolspan_store::TABLE_NAME)
    }

    /// Creates a local directory (an object-store prefix needs nothing).
    pub fn create(&self) -> Result<(), crate::fail::Failure> {
        if toolspan_store::storage::is_remote(&self.0) {
            return Ok(());
        }
        let dir = self.0.strip_prefix("file://").unwrap_or(&self.0);
        std::fs::create_dir_all(dir).map_err(|e| {
            crate::fail::Failure::new(
                toolspan_schema::Code::StoreUnavailable,
                format!("cannot create data directory {}: {}", self.0, e.kind()),
                e,
            )
        })
    }

    /// The spans table must exist for the commands that only read it (`sql`, `compare`,
    /// `evals`): a clear `not_found` instead of an empty table created on the spot.
    pub async fn require_spans(&self) -> Result<(), crate::fail::Failure> {
        if toolspan_store::storage::table_exists(&self.spans()).await? {
            return Ok(());
        }
        Err(crate::fail::Failure::new(
            toolspan_schema::Code::NotFound,
            format!(
                "no spans table in data directory {:?}; run `toolspan demo --data-dir {}` or `toolspan serve` first",
                self.0, self.0
            ),
            "",
        ))
    }
}

/// The rollup's location: `explicit` when given, else `<data_dir>/failure_rates_1m` when a
/// metrics job has created it there (`failure_rates` is then read from it), else none
/// (`failure_rates` is computed from `spans`).
pub async fn rollup_location(
    data_dir: Option<&DataDir>,
    explicit: Option<&str>,
) -> Result<Option<String>, crate::fail::Failure> {
    if let Some(e) = explicit {
        return Ok(Some(e.to_string()));
    }
    let Some(dir) = data_dir else {
        return Ok(None);
    };
    let location = dir.table(toolspan_schema::rollup::TABLE_NAME);
    Ok(toolspan_store::storage::table_exists(&location)
        .await?
        .then_some(location))
}

/// Opens the spans table and, when there is one, the rollup, into one engine.
pub async fn open_engine(
    location: &str,
    rollup: Option<String>,
    options: toolspan_query::EngineOptions,
) -> Result<toolspan_query::Engine, crate::fail::Failure> {
    let spans = toolspan_store::SpanTable::open_or_create(location).await?;
    let rollup = match rollup {
        Some(r) => Some(
            toolspan_store::SpanTable::open_or_create_kind(
                &r,
                toolspan_store::TableKind::FailureRates,
                Default::default(),
            )
            .await?,
        ),
        None => None,
    };
    Ok(toolspan_query::Engine::with_tables(spans, rollup, options).await?)
}

/// Label caps of the tool metrics (`serve --metrics-addr` and `metrics`), one definition for
/// both so flags, environment variables and defaults cannot drift apart.
#[derive(clap::Args, Debug, Clone)]
pub struct LabelCapArgs {
    /// Metrics: distinct tools kept as label values before `__other__`.
    #[arg(long, env = "TOOLSPAN_METRICS_MAX_TOOLS", default_value_t = 100)]
    pub max_tools: usize,
    /// Metrics: distinct services kept before `__other__`.
    #[arg(long, env = "TOOLSPAN_METRICS_MAX_SERVICES", default_value_t = 50)]
    pub max_services: usize,
    /// Metrics: versions kept per service (the least recently seen is dropped).
    #[arg(long, env = "TOOLSPAN_METRICS_MAX_VERSIONS", default_value_t = 5)]
    pub max_versions_per_service: usize,
    /// Metrics: series kept per metric family.
    #[arg(long, env = "TOOLSPAN_METRICS_MAX_SERIES", default_value_t = 10_000)]
    pub max_series: usize,
    /// Metrics: seconds a failure streak (failed calls of a tool in a trace) waits for a
    /// call of that tool that succeeds before it counts as unrecovered.
    #[arg(
        long,
        env = "TOOLSPAN_METRICS_RECOVERY_WINDOW_SECS",
        default_value_t = 300,
        value_parser = listen::secs(0, 30 * 86_400)
    )]
    pub recovery_window_secs: u64,
}

impl LabelCapArgs {
    pub fn config(&self) -> toolspan_metrics::MetricsConfig {
        toolspan_metrics::MetricsConfig {
            max_tools: self.max_tools,
            max_services: self.max_services,
            max_versions_per_service: self.max_versions_per_service,
            max_series: self.max_series,
            recovery_window: std::time::Duration::from_secs(self.recovery_window_secs.max(1)),
        }
    }
}

/// The trace memory (`serve`, `ingest`, `metrics`): what the pipeline remembers of recent
/// spans so that a trace arriving in pieces (one request per span, batches that split traces,
/// a tool service exporting its own spans) classifies as if it had arrived whole.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceMemoryArgs {
    /// How long recent spans are remembered at least (they are forgotten by twice this): the
    /// longest gap between two pieces of one trace that still classify together (0 turns the
    /// memory off).
    #[arg(long, env = "TOOLSPAN_TRACE_MEMORY_SECS", default_value_t = 300, value_parser = listen::secs(0, 30 * 86_400))]
    pub trace_memory_secs: u64,
    /// At most this many MiB of remembered spans (about 50 bytes each: a 40-byte entry, and
    /// each call's tool, call id and agent once); past it the older
    /// half is forgotten first, with a warning in the log.
    #[arg(long, env = "TOOLSPAN_TRACE_MEMORY_MB", default_value_t = 64)]
    pub trace_memory_mb: usize,
    /// How long a request (or Kafka message) whose spans miss a relative waits for it before
    /// it is stored as it is: a stage whose call has not arrived, a failed call whose failing
    /// stage has not. Over OTLP/HTTP the request is answered when its spans are committed, so
    /// keep it below the exporters' timeout (10 s by default). 0 turns assembly off.
    #[arg(long, env = "TOOLSPAN_ASSEMBLY_WAIT_SECS", default_value_t = 5.0, value_parser = listen::secs_f64(3600.0))]
    pub assembly_wait_secs: f64,
    /// At most this many MiB of requests wait for relatives at once; past it the oldest are
    /// stored as they are, with a warning in the log.
    #[arg(long, env = "TOOLSPAN_ASSEMBLY_MAX_MB", default_value_t = 128)]
    pub assembly_max_mb: usize,
}

impl TraceMemoryArgs {
    pub fn config(&self) -> toolspan_pipeline::MemoryConfig {
        toolspan_pipeline::MemoryConfig {
            ttl: std::time::Duration::from_secs(self.trace_memory_secs),
            max_entries: usize::MAX,
            max_bytes: self.trace_memory_mb << 20,
        }
    }

    /// The assembly settings (off with the memory: assembly needs it).
    pub fn assembly(&self) -> toolspan_pipeline::AssembleConfig {
        let wait = if self.trace_memory_secs == 0 || !self.assembly_wait_secs.is_finite() {
            std::time::Duration::ZERO
        } else {
            std::time::Duration::from_secs_f64(self.assembly_wait_secs.clamp(0.0, 3600.0))
        };
        toolspan_pipeline::AssembleConfig {
            wait,
            max_units: 1_000_000,
            max_bytes: self.assembly_max_mb << 20,
        }
    }
}

/// Compaction and retention while a service writes the table (`ingest`, and `serve`/`demo`
/// in embedded mode): the periodic maintenance task of the store.
#[derive(clap::Args, Debug, Clone)]
pub struct MaintenanceArgs {
    /// Run compaction and retention every this many seconds; 0 disables [default: 60].
    #[arg(long, env = "TOOLSPAN_MAINTENANCE_EVERY_S", value_parser = listen::secs(0, 30 * 86_400))]
    pub maintenance_every_s: Option<u64>,
    /// Also merge the small files of a partition of the open day once it holds this many
    /// (into files of about 32 MiB, which are then left alone); 0 merges closed days only.
    #[arg(long, env = "TOOLSPAN_COMPACT_MIN_FILES", default_value_t = 16)]
    pub compact_min_files: usize,
    /// Delete data older than this many days (by the `date` partition). Off when not given.
    #[arg(long, env = "TOOLSPAN_RETENTION_DAYS")]
    pub retention_days: Option<u32>,
    /// Physically delete unreferenced files (after compaction or expiry) once they are older
    /// than this many minutes; queries running longer than this may fail.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=5_256_000))]
    pub vacuum_retention_mins: u64,
}

impl MaintenanceArgs {
    /// The settings, with `default_every_s` when `--maintenance-every-s` is not given; `None`
    /// when maintenance is off.
    pub fn config(
        &self,
        default_every_s: u64,
    ) -> Option<toolspan_store::maintenance::periodic::MaintenanceConfig> {
        let every = self.maintenance_every_s.unwrap_or(default_every_s);
        (every > 0).then(
            || toolspan_store::maintenance::periodic::MaintenanceConfig {
                every: std::time::Duration::from_secs(every),
                retention_days: self.retention_days,
                crowded_min_files: (self.compact_min_files > 0).then_some(self.compact_min_files),
                vacuum_retention: std::time::Duration::from_secs(
                    self.vacuum_retention_mins.saturating_mul(60),
                ),
                ..Default::default()
            },
        )
    }

    /// Starts the periodic task on `table` (unless maintenance is off); it stops once `stop`
    /// is set.
    pub fn spawn(
        &self,
        default_every_s: u64,
        table: &toolspan_store::SpanTable,
        stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) {
        if let Some(cfg) = self.config(default_every_s) {
            tokio::spawn(toolspan_store::maintenance::periodic::run(
                table.clone(),
                cfg,
                stop.clone(),
            ));
        }
    }
}

/// Parses a `-X KEY=VALUE` librdkafka setting (shared by `ingest` and `metrics`).
pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// Reads a `--rules` file (shared by `serve`, `ingest` and `metrics`).
pub fn read_rules(
    path: &Option<std::path::PathBuf>,
) -> Result<Option<String>, crate::fail::Failure> {
    match path {
        Some(p) => std::fs::read_to_string(p).map(Some).map_err(|e| {
            crate::fail::Failure::new(
                toolspan_schema::Code::InvalidArgument,
                format!("cannot read rules file {}: {}", p.display(), e.kind()),
                e,
            )
        }),
        None => Ok(None),
    }
}
