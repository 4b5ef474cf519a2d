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
