//! `toolspan compare`: did a change help? One tool's calls by two versions side by side.

use clap::{Args, ValueEnum};
use toolspan_query::compare::{compare, render_text, CompareRequest};

use crate::fail::Failure;

/// Arguments of `toolspan compare`.
#[derive(Args)]
pub struct CompareArgs {
    /// Directory or object-store prefix holding the spans table (as given to `serve`/`demo`).
    #[arg(long, env = "TOOLSPAN_DATA_DIR", default_value = super::DEFAULT_DATA_DIR)]
    pub data_dir: super::DataDir,
    /// The tool whose calls are compared.
    #[arg(long)]
    pub tool: String,
    /// `service.version` before the change.
    #[arg(long)]
    pub before: String,
    /// `service.version` after the change.
    #[arg(long)]
    pub after: String,
    /// Only calls made by this `service.name` (default: every service with those versions).
    #[arg(long)]
    pub service: Option<String>,
    /// Calls that started at or after: a duration before now (30s, 15m, 1h, 7d, 2w), an
    /// RFC 3339 time or a UTC day (YYYY-MM-DD). Default: all.
    #[arg(long)]
    pub since: Option<String>,
    /// Calls that started before (same forms as --since). Default: now.
    #[arg(long)]
    pub until: Option<String>,
    /// Output: a table for people, or the JSON of `GET /api/v1/compare`.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub format: Output,
}

/// Output formats of `toolspan compare`.
#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    /// Aligned text.
    Table,
    /// JSON.
    Json,
}

pub async fn run(args: CompareArgs) -> Result<(), Failure> {
    args.data_dir.require_spans().await?;
    let now = chrono::Utc::now();
    let time = |name: &str, v: &Option<String>| {
        v.as_deref()
            .map(|v| toolspan_query::sql::parse_time(name, v, now))
            .transpose()
            .map_err(Failure::from)
    };
    let req = CompareRequest {
        tool: args.tool,
        before: args.before,
        after: args.after,
        service: args.service,
        since: time("since", &args.since)?,
        until: time("until", &args.until)?,
    };
    let engine = super::open_engine(&args.data_dir.spans(), None, Default::default()).await?;
    let comparison = compare(&engine, &req).await?;
    match args.format {
        Output::Table => print!("{}", render_text(&comparison)),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&comparison)
                .map_err(|e| Failure::internal("cannot render the comparison", e))?
        ),
    }
    Ok(())
}
