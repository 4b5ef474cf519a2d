//! A synthetic agent fleet: the traffic `toolspan demo` sends and the benchmarks measure.
//!
//! Several agents in several services (with versions) run; each run calls models and tools
//! (`search_docs`, `update_ticket`, `fetch_url`, `run_sql`); each tool call has attempts, and
//! each attempt the four stages prepare → send → execute → parse. Failures happen at every
//! stage at per-tool rates; retryable ones are retried (some recover, some exhaust); failing
//! tools return an error envelope with code, class and reference — or, for some tools, a raw
//! stack trace (the leak toolspan flags). Arguments carry secrets that toolspan must redact.
//!
//! Output is deterministic for a seed.

mod fleet;
mod json;
mod otlp;
pub mod split;

pub use fleet::{Fleet, FleetConfig, TOOLS};
pub use json::encode_json;

/// Secrets the fleet plants in arguments and results; none may survive redaction.
pub const PLANTED_SECRETS: [&str; 6] = [
    "AKIAZ7DEMO4EXAMPLE99",
    "demo-Sup3rSecret-pw",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJkZW1vLXVzZXIiLCJyb2xlIjoiYWRtaW4ifQ.c2lnbmF0dXJlLWRlbW8tb25seQ",
    "4111 1111 1111 1111",
    "customer.jane@example.com",
    "9f0c1d2e3b4a59687766554433221100aabbccddeeff00112233445566778899",
];
