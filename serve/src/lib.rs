//! Every listener of toolspan, as one layer over the engine (`toolspan-query`) and the span
//! sources (`toolspan-ingest`):
//!
//! - [`http`]: the HTTP server every service uses (connection limits, header, body and idle
//!   timeouts, the host check, the token, the one renderer of an error envelope as an HTTP
//!   answer with `Retry-After`), and on it the query HTTP API (port 8080), the viewer pages
//!   and the Tempo-compatible API;
//! - [`pg`]: the Postgres wire protocol (port 5433);
//! - [`otlp_http`]: the OTLP/HTTP receiver (`POST /v1/traces`, port 4318) of embedded mode;
//! - [`probes`]: `/healthz` and `/readyz` of the workers;
//! - [`exposition`]: `/metrics` of every service;
//! - [`listener`]: what the HTTP and Postgres listeners share (connection slots, idle limits).

#![warn(missing_docs)]

pub mod exposition;
pub mod http;
pub mod listener;
pub mod otlp_http;
pub mod pg;
pub mod probes;

pub use otlp_http::{ReceiverConfig, ReceiverState, MAX_INFLIGHT_BYTES};
