//! TEMPORARY stand-in until the leak detector lands (same API).
pub fn leaked_internals(s: &str) -> bool { s.contains("Traceback") }
