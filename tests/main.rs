//! End-to-end tests of the `toolspan` binary: one test binary, one module per concern.
//! Every test starts the processes it needs (the binary itself, the Python SDK).

mod kafka_support;
mod s3_support;
mod support;

mod alerting;
mod config;
mod crash;
mod demo;
mod embedded_api;
mod framework_corpus;
mod hostile;
mod journey;
mod js_sdk;
mod kafka_ingest;
mod logs;
mod malformed_http;
mod metrics_rollup;
mod query_service;
mod s3;
mod sdk_agent;
mod sdk_export;
mod split_traces;
mod store_outage;
mod tempo_api;
mod viewer;
