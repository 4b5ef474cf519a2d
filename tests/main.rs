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
mod fault_injection;
mod framework_corpus;
mod help;
mod hostile;
mod journey;
mod js_sdk;
mod kafka_ingest;
mod listeners;
mod logs;
mod malformed_http;
mod metrics_rollup;
mod one_call;
mod query_service;
mod readme;
mod replay;
mod s3;
mod sdk_agent;
mod sdk_export;
mod sdk_package;
mod sdk_readme;
mod split_traces;
mod store_outage;
mod tempo_api;
mod unmapped;
mod viewer;
