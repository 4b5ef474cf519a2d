//! [`BatchObserver`]: what sees every batch of spans a source took in, apart from the table.
//!
//! Every source hands its batches to observers the same way: the OTLP/HTTP receiver
//! (`toolspan_serve::otlp_http`) after the batch is committed, the metrics job's tap
//! ([`crate::metrics_job::tap`]) and rollup writer ([`crate::metrics_job::rollup`]) after
//! decoding.
//! The tool metrics ([`toolspan_metrics::ToolMetrics`]) are the observer in every case, so the
//! trait is implemented for them here, once.

use arrow::record_batch::RecordBatch;
use toolspan_metrics::ToolMetrics;
use toolspan_pipeline::Stats;

/// Something that sees every batch of spans a source took in (the tool metrics). Called once
/// per batch: by the OTLP/HTTP receiver after the batch is committed, by the Kafka sources of
/// the metrics job after it is decoded.
pub trait BatchObserver: Send + Sync {
    /// Observes one batch of classified spans and the stats of processing it.
    fn observe(&self, batch: &RecordBatch, stats: &Stats);
}

impl BatchObserver for ToolMetrics {
    fn observe(&self, batch: &RecordBatch, stats: &Stats) {
        // The inherent method: counts the batch and its redactions.
        ToolMetrics::observe(self, batch, stats);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn tool_metrics_observe_through_the_trait_counts_the_batch() {
        let metrics = ToolMetrics::new(Default::default());
        let observer: Arc<dyn BatchObserver> = metrics.clone();
        let mut fleet = toolspan_gen::Fleet::new(toolspan_gen::FleetConfig::default());
        let req = fleet.request(3, 1_700_000_000_000_000_000, 60_000_000_000);
        let done = toolspan_pipeline::Pipeline::builtin()
            .process(&req)
            .expect("process");
        observer.observe(&done.batch, &done.stats);
        let text = metrics.encode();
        let line = text
            .lines()
            .find(|l| l.starts_with("toolspan_ingest_spans_total"))
            .unwrap_or_else(|| panic!("no span counter in {text}"));
        assert!(
            line.ends_with(&format!(" {}", done.batch.num_rows())),
            "{line}"
        );
    }
}
