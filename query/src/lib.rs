//! toolspan's query engine: DataFusion over the Delta `spans` table, read-only, every error an envelope.
//!
//! - [`Engine`] registers `spans` ([`provider`]: DataFusion's Parquet scan over the files of
//!   the latest Delta version, with partition pruning on tool, stage and date and file
//!   statistics on start_time) and the views `calls` and
//!   `failure_rates` ([`views`]); it runs one read-only statement at a time, following new
//!   commits within [`EngineOptions::refresh_interval`];
//! - [`error`] turns every failure into the error envelope, logging the detail under a
//!   reference;
//! - [`format`] renders results as a table, CSV or JSON;
//! - [`guard`] refuses statements too complex to plan safely, before they are parsed (and
//!   before they are planned, counting what CTEs and views expand to);
//! - [`bounded`] holds the scalar functions whose output can outgrow their input (`repeat`,
//!   `lpad`, `range`, …) to the memory limit;
//! - [`service`] shares one engine between the network front ends, with admission slots;
//! - [`stream`] hands a running query's result over batch by batch, within the memory pool;
//! - its front ends (the HTTP API, the viewer, the Tempo-compatible API and the Postgres wire
//!   protocol) are in `toolspan-serve`;
//! - [`trace`] assembles a trace's spans into a tree;
//! - [`compare`] sets one tool's calls by two versions side by side (`toolspan compare`);
//! - [`replay`] answers what a replay of a failed call needs, at one table version, and
//!   [`evals`] exports a tool's failures as eval cases grouped by fingerprint.

#![warn(missing_docs)]

pub mod bounded;
pub mod compare;
pub mod data_cache;
pub mod engine;
pub mod error;
mod estimate;
pub mod evals;
pub mod format;
pub mod guard;
pub mod metrics;
pub mod optimize;
pub mod provider;
pub mod replay;
pub mod rows;
mod scan;
pub mod service;
pub mod sql;
pub mod stream;
pub mod trace;
pub mod views;

pub use engine::{Engine, EngineOptions, QueryResult};
pub use error::{QueryError, QueryErrorKind, TABLES};
pub use format::{render, render_with_schema, Format};
pub use service::QueryService;
pub use stream::ResultStream;
