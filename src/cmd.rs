//! Subcommands.

pub mod demo;
pub mod ingest;
pub mod metrics;
pub mod produce;
pub mod query;
pub mod serve;
pub mod sql;

/// The default data directory: `./toolspan-data` (the `spans` table lives in `spans/`).
pub const DEFAULT_DATA_DIR: &str = "toolspan-data";

/// The table location inside a data directory.
pub fn table_location(data_dir: &std::path::Path) -> String {
    data_dir.join("spans").to_string_lossy().into_owned()
}

/// Parses a `-X KEY=VALUE` librdkafka setting (shared by `ingest` and `metrics`).
pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// Reads a `--rules` file (shared by `serve`, `ingest` and `metrics`).
pub fn read_rules(path: &Option<std::path::PathBuf>) -> Result<Option<String>, crate::fail::Failure> {
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
