//! `toolspan sql`: one statement against the table, printed as a table, CSV or JSON.

use std::path::PathBuf;

use clap::Args;
use toolspan_query::Format;

use crate::fail::Failure;

/// Arguments of `toolspan sql`.
#[derive(Args)]
pub struct SqlArgs {
    /// Directory holding the spans table (as given to `serve`/`demo`).
    #[arg(long, env = "TOOLSPAN_DATA_DIR", default_value = super::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Output format: table, csv or json.
    #[arg(long, default_value = "table", value_parser = parse_format)]
    pub format: Format,
    /// The metrics job's per-minute rollup for `failure_rates` (default:
    /// `<data-dir>/failure_rates_1m` when it exists; otherwise computed from `spans`).
    #[arg(long, env = "TOOLSPAN_ROLLUP_TABLE")]
    pub rollup_table: Option<String>,
    /// The SQL statement (read-only). Tables: spans; views: calls, failure_rates.
    pub sql: String,
}

fn parse_format(s: &str) -> Result<Format, String> {
    s.parse()
}

pub async fn run(args: SqlArgs) -> Result<(), Failure> {
    super::require_table(&args.data_dir)?;
    let rollup = super::rollup_location(Some(&args.data_dir), args.rollup_table.as_deref());
    let engine = super::open_engine(
        &super::table_location(&args.data_dir),
        rollup,
        Default::default(),
    )
    .await?;
    let result = engine.query(&args.sql).await?;
    let text = toolspan_query::render_with_schema(&result.schema, &result.batches, args.format)?;
    println!("{}", text.trim_end());
    Ok(())
}
