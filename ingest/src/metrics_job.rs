//! The metrics job (`toolspan metrics`): the tool failure metrics Prometheus scrapes, from a
//! consumer group of its own on the spans topic (so the store's tail sampling never biases
//! the rates), and optionally the per-minute rollup `failure_rates_1m` the `failure_rates`
//! view reads. Its parts:
//!
//! - [`tap`]: the Kafka source when the job keeps no rollup: decode, hand each batch to the
//!   tool metrics, write nothing;
//! - [`rollup`]: the rollup writer, the exactly-once Kafka worker with an output that hands
//!   each batch to the tool metrics and commits per-minute rollup rows with the offsets;
//! - the rollup table's definition and what a span adds to it are in
//!   `toolspan_schema::rollup`, beside the spans table's; the metrics themselves (families,
//!   label caps, the recovery window) are `toolspan_metrics::ToolMetrics`, which the
//!   OTLP/HTTP receiver feeds too.

pub mod rollup;
pub mod tap;

pub use rollup::run_rollup_worker;
pub use tap::{run_tap, TapConfig, TapSummary};
