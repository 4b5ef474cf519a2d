//! `toolspan sql`: one statement against the table, printed as a table, CSV or JSON.

use clap::Args;
use toolspan_query::Format;

use crate::fail::Failure;

/// Arguments of `toolspan sql`.
#[derive(Args)]
pub struct SqlArgs {
    /// Directory or object-store prefix holding the spans table (as given to `serve`/`demo`).
    #[arg(long, env = "TOOLSPAN_DATA_DIR", default_value = super::DEFAULT_DATA_DIR)]
    pub data_dir: super::DataDir,
    /// Output format: table, csv or json.
    #[arg(long, default_value = "table", value_parser = parse_format)]
    pub format: Format,
    /// The metrics job's per-minute rollup for `failure_rates` (default:
    /// `<data-dir>/failure_rates_1m` when it exists; otherwise computed from `spans`).
    #[arg(long, env = "TOOLSPAN_ROLLUP_TABLE")]
    pub rollup_table: Option<String>,
    /// The statement is cancelled with `query_timeout` after this many seconds (a table on a
    /// distant object store may need more than the default for a full scan).
    #[arg(long, env = "TOOLSPAN_QUERY_TIMEOUT_SECS", default_value_t = 30, value_parser = super::listen::secs(1, 86_400))]
    pub query_timeout_secs: u64,
    /// The SQL statement (read-only). Tables: spans; views: calls, recoveries, failure_rates, answer_shapes
    /// (their columns: docs/table.md, or `DESCRIBE calls`).
    pub sql: String,
}

fn parse_format(s: &str) -> Result<Format, String> {
    s.parse()
}

pub async fn run(args: SqlArgs) -> Result<(), Failure> {
    args.data_dir.require_spans().await?;
    let rollup = super::rollup_location(Some(&args.data_dir), args.rollup_table.as_deref()).await?;
    let engine = super::open_engine(
        &args.data_dir.spans(),
        rollup,
        toolspan_query::EngineOptions {
            query_timeout: std::time::Duration::from_secs(args.query_timeout_secs.max(1)),
            ..Default::default()
        },
    )
    .await?;
    let result = engine.query(&args.sql).await?;
    let text = toolspan_query::render_with_schema(&result.schema, &result.batches, args.format)?;
    println!("{}", text.trim_end());
    Ok(())
}
