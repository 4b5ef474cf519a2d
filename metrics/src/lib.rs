//! Failure rates per tool and stage as Prometheus metrics (dashboards/METRICS.md).
//! (Being implemented: API fixed, internals in progress.)

use std::sync::Arc;

use arrow::record_batch::RecordBatch;

/// Metric settings (label caps).
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Distinct tools kept before `__other__`.
    pub max_tools: usize,
    /// Distinct services kept before `__other__`.
    pub max_services: usize,
    /// Versions kept per service.
    pub max_versions_per_service: usize,
    /// Series per family.
    pub max_series: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { max_tools: 100, max_services: 50, max_versions_per_service: 5, max_series: 10_000 }
    }
}

/// The tool metrics registry.
pub struct ToolMetrics {
    _config: MetricsConfig,
}

impl ToolMetrics {
    /// A new registry.
    pub fn new(config: MetricsConfig) -> Arc<ToolMetrics> {
        Arc::new(ToolMetrics { _config: config })
    }

    /// Counts one batch of classified spans (columns of `toolspan_schema::spans_schema`).
    pub fn observe(&self, _batch: &RecordBatch, _stats: &toolspan_schema::Stats) {}

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        String::new()
    }
}

/// `GET /metrics`.
pub fn router(metrics: Arc<ToolMetrics>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let m = metrics.clone();
            async move { ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], m.encode()) }
        }),
    )
}
