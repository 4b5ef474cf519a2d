//! Where tables live: a local directory, or an object store through delta-rs's storage
//! handlers — `s3://bucket/prefix` (and `s3a://`) for AWS S3 and S3-compatible stores (MinIO,
//! Ceph, Cloudflare R2).
//!
//! Object stores are configured the standard way: delta-rs reads `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/
//! `AWS_SESSION_TOKEN` and the rest of the AWS credential chain (profiles, web identity, the
//! instance role) from the environment; [`set_process_options`] adds options for every table
//! the process opens (`--storage-option KEY=VALUE`), which win over the environment.
//!
//! Commits on S3 are safe with many writers on many machines without a lock service: each
//! commit writes `_delta_log/<version>.json` with `If-None-Match: *` (a conditional put), so of
//! two writers racing for one version exactly one wins and the other re-reads and retries.
//! AWS S3 (since 2024-08), MinIO, Ceph RGW and R2 honour it.

use std::collections::HashMap;
use std::sync::{Once, OnceLock};

use url::Url;

use crate::error::{StoreError, StoreErrorKind};

static HANDLERS: Once = Once::new();
static PROCESS_OPTIONS: OnceLock<HashMap<String, String>> = OnceLock::new();

/// Registers the object-store handlers this build links (S3) with delta-rs; idempotent, and
/// called by every function here that opens a table.
pub fn register_handlers() {
    HANDLERS.call_once(|| deltalake::aws::register_handlers(None));
}

/// Sets the object-store options every table of this process is opened with (keys as
/// delta-rs and object_store name them: `aws_region`, `aws_endpoint`, `aws_allow_http`,
/// `conditional_put`, …). Once per process, before the first table is opened; later calls are
/// ignored (and say so in the log).
pub fn set_process_options(options: HashMap<String, String>) {
    let keys: Vec<String> = options.keys().cloned().collect();
    if PROCESS_OPTIONS.set(options).is_err() {
        tracing::warn!("storage options were already set; ignoring the second set");
    } else if !keys.is_empty() {
        // Keys only: values may be credentials.
        tracing::debug!(?keys, "storage options set");
    }
}

/// Retries of one object-store request before its error reaches toolspan: few and short, so
/// that an unreachable store is reported within seconds (ingest then pauses, says so in its
/// log and `toolspan_ingest_store_failing`, keeps its buffer and retries the whole flush)
/// rather than hidden for minutes inside one request (object_store's default is 10 retries
/// within 3 minutes). `--storage-option max_retries=N` / `retry_timeout=…` override them.
const DEFAULT_RETRIES: [(&str, &str); 2] = [("max_retries", "3"), ("retry_timeout", "10s")];

/// The options a table is opened with: toolspan's retry defaults, the process's options, then
/// `extra`.
pub(crate) fn options_for(extra: HashMap<String, String>) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = DEFAULT_RETRIES
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    out.extend(PROCESS_OPTIONS.get().cloned().unwrap_or_default());
    out.extend(extra);
    out
}

/// Whether `location` names an object store (a URI whose scheme is not `file`) rather than a
/// local directory.
pub fn is_remote(location: &str) -> bool {
    match Url::parse(location) {
        // One-letter schemes are Windows drive letters (`C:\data`).
        Ok(u) => u.scheme().len() > 1 && u.scheme() != "file",
        Err(_) => false,
    }
}

/// `name` inside the directory or prefix `base`: `s3://b/p` + `spans` → `s3://b/p/spans`,
/// `./data` + `spans` → `./data/spans`.
pub fn join(base: &str, name: &str) -> String {
    if is_remote(base) || base.starts_with("file://") {
        format!("{}/{}", base.trim_end_matches('/'), name)
    } else {
        std::path::Path::new(base)
            .join(name)
            .to_string_lossy()
            .into_owned()
    }
}

/// Whether a Delta table exists at `location` (its log has a commit). Creates nothing.
pub async fn table_exists(location: &str) -> Result<bool, StoreError> {
    if !is_remote(location) {
        let dir = location.strip_prefix("file://").unwrap_or(location);
        return Ok(std::path::Path::new(dir).join("_delta_log").is_dir());
    }
    register_handlers();
    let url = Url::parse(location).map_err(|e| {
        StoreError::new(
            StoreErrorKind::InvalidLocation {
                reason: "the URI cannot be parsed".into(),
            },
            e,
        )
    })?;
    let table = deltalake::DeltaTableBuilder::from_url(url)
        .and_then(|b| b.with_storage_options(options_for(HashMap::new())).build())
        .map_err(|e| StoreError::from_delta("opening the table", e))?;
    table
        .verify_deltatable_existence()
        .await
        .map_err(|e| StoreError::from_delta("looking for the table", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_locations_are_uris_with_a_scheme() {
        assert!(is_remote("s3://bucket/prefix"));
        assert!(is_remote("s3a://bucket"));
        assert!(is_remote("memory:///t"));
        assert!(!is_remote("file:///tmp/t"));
        assert!(!is_remote("./toolspan-data"));
        assert!(!is_remote("/var/lib/toolspan"));
        assert!(!is_remote("C:\\data"));
    }

    #[test]
    fn join_keeps_uris_and_paths_apart() {
        assert_eq!(join("s3://b/p", "spans"), "s3://b/p/spans");
        assert_eq!(join("s3://b/p/", "spans"), "s3://b/p/spans");
        assert_eq!(join("file:///d", "spans"), "file:///d/spans");
        assert_eq!(join("toolspan-data", "spans"), "toolspan-data/spans");
    }
}
