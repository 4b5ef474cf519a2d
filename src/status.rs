//! What a command says on stderr besides its log: status lines (the `say!` macro) and, under
//! `--log-format json`, the same as log events. A leaf: the commands and the failure report
//! (`fail.rs`) both use it, and it uses neither.

static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set once at startup from `--log-format`.
pub fn set_json_logs(on: bool) {
    JSON_LOGS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether stderr carries JSON log lines only (`--log-format json`).
pub fn json_logs() -> bool {
    JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Writes a status line (the `say!` macro): as written on stderr, or with `--log-format json`
/// as an info event of target `toolspan::status`, so that every line a log collector reads is
/// one JSON object (blank spacer lines are dropped there).
pub fn status(line: std::fmt::Arguments) {
    if !json_logs() {
        eprintln!("{line}");
        return;
    }
    let line = line.to_string();
    if !line.trim().is_empty() {
        tracing::info!(target: "toolspan::status", "{line}");
    }
}
