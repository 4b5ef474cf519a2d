//! `toolspan evals export`: a tool's failures as eval cases (JSON Lines, `toolspan.evals/1`),
//! grouped by fingerprint and pinned to the table version read; the bytes
//! `GET /api/v1/evals/export` answers.

use std::io::Write;

use clap::{Args, ValueEnum};
use toolspan_query::evals::{export, ExportRequest, MAX_PER_FINGERPRINT};
use toolspan_schema::Code;

use crate::fail::Failure;

/// Arguments of `toolspan evals`.
#[derive(Args)]
pub struct EvalsArgs {
    /// What to do: `export` writes a tool's failures as an evals file (run it with
    /// `python -m toolspan evals run FILE --tools MODULE`).
    #[arg(value_enum)]
    pub action: Action,
    /// Directory or object-store prefix holding the spans table (as given to `serve`/`demo`).
    #[arg(long, env = "TOOLSPAN_DATA_DIR", default_value = super::DEFAULT_DATA_DIR)]
    pub data_dir: super::DataDir,
    /// The tool whose failures are exported.
    #[arg(long)]
    pub tool: String,
    /// Only failures of this error type: PREPARE, NETWORK, TOOL_ERROR, PARSE or
    /// RETRY_EXHAUSTED.
    #[arg(long)]
    pub error_type: Option<String>,
    /// Only failures with this error code (the envelope's `code`).
    #[arg(long)]
    pub code: Option<String>,
    /// Only calls that started at or after: a duration (30s, 15m, 1h, 7d, 2w) counted back
    /// from the newest call of the tool in the table version read (not from now, so that the
    /// same version gives the same file), an RFC 3339 time or a UTC day (YYYY-MM-DD).
    /// Default: all.
    #[arg(long)]
    pub since: Option<String>,
    /// Cases per fingerprint (exact arguments first, then the newest).
    #[arg(long, default_value_t = toolspan_query::evals::DEFAULT_PER_FINGERPRINT as u64, value_parser = clap::value_parser!(u64).range(1..=MAX_PER_FINGERPRINT as u64))]
    pub per_fingerprint: u64,
    /// Read this version of the spans table (default: the latest); the file names the version
    /// it read, and exporting at that version again gives the same bytes.
    #[arg(long)]
    pub table_version: Option<u64>,
    /// Write the file here instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
    /// The statements are cancelled with `query_timeout` after this many seconds.
    #[arg(long, env = "TOOLSPAN_QUERY_TIMEOUT_SECS", default_value_t = 30, value_parser = super::listen::secs(1, 86_400))]
    pub query_timeout_secs: u64,
}

/// What `toolspan evals` does.
#[derive(Clone, Copy, ValueEnum)]
pub enum Action {
    /// Export failures as eval cases.
    Export,
}

pub async fn run(args: EvalsArgs) -> Result<(), Failure> {
    let Action::Export = args.action;
    args.data_dir.require_spans().await?;
    let engine = super::open_engine(
        &args.data_dir.spans(),
        None,
        toolspan_query::EngineOptions {
            query_timeout: std::time::Duration::from_secs(args.query_timeout_secs.max(1)),
            ..Default::default()
        },
    )
    .await?;
    let req = ExportRequest {
        tool: args.tool,
        error_type: args.error_type,
        code: args.code,
        since: args.since,
        per_fingerprint: args.per_fingerprint as usize,
        version: args.table_version,
    };
    let file = export(&engine, &req).await?;
    match &args.out {
        Some(path) => {
            std::fs::write(path, &file.text).map_err(|e| {
                Failure::new(
                    Code::InvalidArgument,
                    format!("cannot write {}: {}", path.display(), e.kind()),
                    e,
                )
            })?;
            say!(
                "toolspan evals export: {} cases of {} fingerprints of {} at table version {} written to {}",
                file.cases,
                file.fingerprints,
                req.tool,
                file.version,
                path.display()
            );
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(file.text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| Failure::internal("cannot write to standard output", e))?;
        }
    }
    Ok(())
}
