//! Helpers shared by the schema integration tests.

use std::path::PathBuf;
use std::process::Command;

use arrow::array::RecordBatch;

/// `schema/` of the checkout the tests run in: cargo sets CARGO_MANIFEST_DIR when it runs
/// them; the compile-time value is only a fallback (a test binary reused from a cache shared
/// by two checkouts would otherwise read the other checkout's files).
pub fn schema_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    schema_dir()
        .parent()
        .expect("schema/ has a parent")
        .to_path_buf()
}

/// The Python that has the OpenTelemetry SDK: `TOOLSPAN_PYTHON`, else the venv `.ci/run`
/// makes, else `python3`. A missing SDK fails the test (it never skips).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TOOLSPAN_PYTHON") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let venv = home.join(".cache/toolspan/venv/bin/python");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("python3")
}

/// Runs the OpenTelemetry Python SDK generator into a fresh directory.
pub fn generate_golden_inputs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = repo_root().join("tests/otel/gen_spans.py");
    let out = Command::new(python())
        .arg(&script)
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run python (set TOOLSPAN_PYTHON or run .ci/run to make the venv)");
    assert!(
        out.status.success(),
        "gen_spans.py failed (is the OpenTelemetry SDK installed? `.ci/run` installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Every string value in a batch, for leak checks.
pub fn all_strings(batch: &RecordBatch) -> Vec<String> {
    use arrow::array::{Array, StringArray};
    let mut out = Vec::new();
    for col in batch.columns() {
        if let Some(s) = col.as_any().downcast_ref::<StringArray>() {
            for i in 0..s.len() {
                if s.is_valid(i) {
                    out.push(s.value(i).to_string());
                }
            }
        }
    }
    out
}

/// Rows as JSON lines (arrow's writer: nulls omitted, timestamps as RFC 3339).
pub fn rows_as_json_lines(batch: &RecordBatch) -> String {
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
        w.write(batch).expect("json rows");
        w.finish().expect("json finish");
    }
    String::from_utf8(buf).expect("utf8")
}
