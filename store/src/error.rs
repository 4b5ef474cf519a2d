//! The store's errors: one [`StoreError`] carrying a [`StoreErrorKind`] and a reference.
//!
//! An error is not logged where it is made: it carries its reference and the full internal
//! detail (the dependency's error text, the table location) to the boundary that handles it —
//! a writer's retry loop, the query service's answer, the command line — which logs it once,
//! with [`StoreError::detail_text`]. What a caller is shown is only the short, caller-safe
//! message: no absolute paths, no raw delta-rs or object-store text.

use std::fmt;

use toolspan_schema::error::{new_reference, Code};

/// What went wrong, in terms a caller can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreErrorKind {
    /// The table location could not be parsed or used.
    #[error("the table location is not usable: {reason}")]
    InvalidLocation {
        /// A short description, e.g. "unsupported URI scheme".
        reason: String,
    },
    /// The table exists but its schema or partitioning is not toolspan's `spans` table.
    #[error("the table at the configured location is not a toolspan spans table: {details}")]
    TableMismatch {
        /// Which columns differ (names only).
        details: String,
    },
    /// A batch handed to the store does not have the `spans` schema.
    #[error("record batch does not match the spans schema: {details}")]
    BatchSchema {
        /// Which columns differ (names only).
        details: String,
    },
    /// A transaction version is not newer than the one the table already records for the app
    /// id: the data was committed before (by this worker or another one), so committing it
    /// again would duplicate it.
    #[error(
        "transaction {app_id} version {attempted} is not newer than the version {recorded} \
         recorded in the table; the data was already committed"
    )]
    StaleTransaction {
        /// The application id, e.g. `otlp_spans-3`.
        app_id: String,
        /// The version the table records.
        recorded: i64,
        /// The version this commit carried.
        attempted: i64,
    },
    /// The table records another version for an app id than the one this writer resumed
    /// from: another worker took the partition over and committed. The buffered data must be
    /// dropped and the partition re-read from the table (the table's offsets, not Kafka's, decide).
    #[error(
        "transaction {app_id} was advanced by another writer (table records {recorded:?}, this \
         writer resumed from {expected:?}); the buffered data is dropped and re-read"
    )]
    Fenced {
        /// The application id, e.g. `otlp_spans-3`.
        app_id: String,
        /// The version the table records (`None`: never recorded).
        recorded: Option<i64>,
        /// The version this writer expected to find.
        expected: Option<i64>,
    },
    /// Another writer committed something this commit conflicts with; retrying re-checks.
    #[error("the commit conflicted with a concurrent commit while {op}; retry")]
    Conflict {
        /// What the store was doing.
        op: &'static str,
    },
    /// Storage could not be read or written (IO, object store): retry later.
    #[error("the table storage is unavailable while {op}; retry later")]
    Unavailable {
        /// What the store was doing.
        op: &'static str,
    },
    /// The store refused these rows for a reason retrying cannot fix (a value that cannot be
    /// part of a file name or key); other rows are not affected.
    #[error("the store refused these rows while {op}; retrying cannot fix it")]
    Rejected {
        /// What was being done.
        op: &'static str,
    },
    /// A fault inside toolspan or delta-rs.
    #[error("internal store error while {op}")]
    Internal {
        /// What the store was doing.
        op: &'static str,
    },
}

impl StoreErrorKind {
    /// The stable code of this kind.
    pub fn code(&self) -> Code {
        match self {
            StoreErrorKind::InvalidLocation { .. } | StoreErrorKind::TableMismatch { .. } => {
                Code::InvalidConfig
            }
            StoreErrorKind::Conflict { .. } | StoreErrorKind::Unavailable { .. } => {
                Code::StoreUnavailable
            }
            StoreErrorKind::BatchSchema { .. }
            | StoreErrorKind::Rejected { .. }
            | StoreErrorKind::StaleTransaction { .. }
            | StoreErrorKind::Fenced { .. }
            | StoreErrorKind::Internal { .. } => Code::Internal,
        }
    }
}

/// An error of the store: what went wrong, a reference, and the detail that the boundary
/// handling it logs under that reference.
#[derive(Debug, Clone)]
pub struct StoreError {
    kind: StoreErrorKind,
    reference: String,
    detail: String,
    /// Whether the handler logged it already ([`StoreError::logged`]).
    logged: bool,
}

impl StoreError {
    /// A fault inside toolspan or delta-rs while doing `op` ([`StoreErrorKind::Internal`]).
    pub(crate) fn internal(op: &'static str, detail: impl fmt::Display) -> StoreError {
        StoreError::new(StoreErrorKind::Internal { op }, detail)
    }

    /// Makes an error of `kind` under a new reference. `detail` (which may hold paths and
    /// dependency text) is kept for the log, never shown to a caller; nothing is logged here.
    pub fn new(kind: StoreErrorKind, detail: impl fmt::Display) -> StoreError {
        StoreError {
            kind,
            reference: new_reference(),
            detail: detail.to_string(),
            logged: false,
        }
    }

    /// The same error, marked as logged: a handler that wrote it to the log and passes it on
    /// (a writer loop answering a caller) marks it so that the front end does not log it again.
    pub fn logged(mut self) -> StoreError {
        self.logged = true;
        self
    }

    /// Classifies a delta-rs error raised while doing `op` (e.g. "writing data files").
    pub fn from_delta(op: &'static str, err: deltalake::DeltaTableError) -> StoreError {
        let kind = classify(op, &err);
        StoreError::new(kind, format_chain(&err))
    }

    /// What went wrong.
    pub fn kind(&self) -> &StoreErrorKind {
        &self.kind
    }

    /// The stable code.
    pub fn code(&self) -> Code {
        self.kind.code()
    }

    /// Whether retrying the same call may succeed (IO, object store and commit conflicts).
    pub fn retryable(&self) -> bool {
        self.code().retryable()
    }

    /// The reference the boundary logs the detail under, and a caller is shown.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The internal detail, for the log only (paths, the dependency's error chain).
    pub fn detail_text(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.kind.fmt(f)
    }
}

impl std::error::Error for StoreError {}

impl toolspan_schema::EnvelopeError for StoreError {
    fn code(&self) -> Code {
        self.kind.code()
    }

    fn message(&self) -> String {
        self.kind.to_string()
    }

    fn reference(&self) -> Option<&str> {
        Some(&self.reference)
    }

    fn detail(&self) -> Option<String> {
        (!self.logged).then(|| self.detail.clone())
    }
}

/// The error and its sources, one line, for the log only.
fn format_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

fn classify(op: &'static str, err: &deltalake::DeltaTableError) -> StoreErrorKind {
    use deltalake::kernel::transaction::TransactionError;
    use deltalake::DeltaTableError as E;
    if chain_says_rejected(err) {
        return StoreErrorKind::Rejected { op };
    }
    match err {
        E::ObjectStore { .. } | E::Io { .. } => return StoreErrorKind::Unavailable { op },
        E::VersionAlreadyExists(_) => return StoreErrorKind::Conflict { op },
        E::Transaction { source } => match source {
            TransactionError::CommitConflict(_)
            | TransactionError::MaxCommitAttempts(_)
            | TransactionError::VersionAlreadyExists(_) => {
                return StoreErrorKind::Conflict { op };
            }
            TransactionError::ObjectStore { .. } | TransactionError::LogStoreError { .. } => {
                return StoreErrorKind::Unavailable { op };
            }
            _ => {}
        },
        E::InvalidTableLocation(_) => {
            return StoreErrorKind::InvalidLocation {
                reason: "the path or URI cannot be used".into(),
            };
        }
        _ => {}
    }
    if chain_has_io(err) {
        return StoreErrorKind::Unavailable { op };
    }
    StoreErrorKind::Internal { op }
}

/// Whether an IO or object-store error is somewhere in the chain. delta-rs sometimes flattens
/// a DataFusion error into text (`DeltaTableError::Generic`), so the text is checked too; this
/// only decides retryability, it is never shown.
/// Whether the error says the rows themselves cannot be stored where they were going: a name
/// too long for the file system (ENAMETOOLONG) or a key the object store cannot take. These
/// come from a value in the rows, so they fail the same way on every retry, while other rows
/// are written fine.
fn chain_says_rejected(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.raw_os_error() == Some(36) {
                return true;
            }
        }
        if let Some(os) = e.downcast_ref::<deltalake::ObjectStoreError>() {
            if matches!(os, deltalake::ObjectStoreError::InvalidPath { .. }) {
                return true;
            }
        }
        cur = e.source();
    }
    let text = format_chain(err);
    ["File name too long", "os error 36", "KeyTooLongError"]
        .iter()
        .any(|needle| text.contains(needle))
}

fn chain_has_io(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.downcast_ref::<std::io::Error>().is_some()
            || e.downcast_ref::<deltalake::ObjectStoreError>().is_some()
        {
            return true;
        }
        if let Some(df) = e.downcast_ref::<deltalake::datafusion::error::DataFusionError>() {
            use deltalake::datafusion::error::DataFusionError as D;
            if matches!(df.find_root(), D::ObjectStore(_) | D::IoError(_)) {
                return true;
            }
        }
        cur = e.source();
    }
    let text = err.to_string();
    [
        "Permission denied",
        "permission denied",
        "No such file or directory",
        "Read-only file system",
        "Object Store error",
        // The delta kernel's wrapping of an object-store error (an unreachable S3 endpoint).
        "Error interacting with object store",
        "Generic LocalFileSystem error",
        "os error",
        "Connection refused",
        "timed out",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_retryable_and_messages_hide_detail() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "/secret/path denied");
        let err = StoreError::from_delta(
            "writing data files",
            deltalake::DeltaTableError::Io { source: io },
        );
        assert_eq!(err.code(), Code::StoreUnavailable);
        assert!(err.retryable());
        assert!(!err.to_string().contains("/secret"), "{err}");
        assert!(
            err.detail_text().contains("/secret"),
            "the log keeps the detail"
        );
        assert!(err.reference().starts_with("ts_"));
    }

    #[test]
    fn a_name_too_long_is_refused_for_good_not_retried() {
        let io = std::io::Error::from_raw_os_error(36);
        let err = StoreError::from_delta(
            "writing data files",
            deltalake::DeltaTableError::Io { source: io },
        );
        assert!(
            matches!(err.kind(), StoreErrorKind::Rejected { .. }),
            "{err}"
        );
        assert!(!err.retryable());
        // Disk full stays retryable: space can come back.
        let full = std::io::Error::from_raw_os_error(28);
        let err = StoreError::from_delta(
            "writing data files",
            deltalake::DeltaTableError::Io { source: full },
        );
        assert!(err.retryable(), "{err}");
    }

    #[test]
    fn kernel_errors_around_an_unreachable_object_store_are_retryable() {
        // As delta-rs reports a failed LIST of the log when the S3 endpoint refuses connections.
        let err = StoreError::from_delta(
            "reading the transaction log",
            deltalake::DeltaTableError::Generic(
                "Kernel error: Error interacting with object store: Generic S3 error: Error \
                 performing list request: Connection refused"
                    .into(),
            ),
        );
        assert_eq!(err.code(), Code::StoreUnavailable);
        assert!(err.retryable());
    }

    #[test]
    fn generic_errors_are_internal() {
        let err = StoreError::from_delta(
            "committing",
            deltalake::DeltaTableError::Generic("boom".into()),
        );
        assert_eq!(err.code(), Code::Internal);
        assert!(!err.retryable());
        assert!(!err.to_string().contains("boom"));
    }

    #[test]
    fn stale_transactions_name_the_app_id() {
        let err = StoreError::new(
            StoreErrorKind::StaleTransaction {
                app_id: "otlp_spans-0".into(),
                recorded: 9,
                attempted: 7,
            },
            "test",
        );
        assert!(err.to_string().contains("otlp_spans-0"));
        assert!(!err.retryable());
    }
}
