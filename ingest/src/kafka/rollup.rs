//! The metrics job's rollup output: every decoded message goes to an observer (the tool
//! metrics) and is folded into per-minute rollup rows ([`toolspan_store::rollup`]) committed
//! to `failure_rates_1m` with the message's offset, so the rollup counts each span exactly
//! once. A poison message is skipped (ingest dead-letters it); its offset still moves on.

use std::sync::Arc;

use crate::IngestMetrics;
use arrow::array::RecordBatch;
use toolspan_pipeline::{Encoding, Pipeline, PipelineError, Stats};
use toolspan_store::{rollup, CommitInfo, Committer, Writer};

use super::output::{Output, Polled, Refused};
use super::IngestSummary;
use crate::observer::BatchObserver;

/// Per-minute rollup rows into `failure_rates_1m`; every decoded batch is observed first.
pub(super) struct RollupOutput {
    observer: Arc<dyn BatchObserver>,
    /// Spans behind the rollup rows in the writer (the rows themselves are far fewer).
    buffered_spans: u64,
    /// An empty batch of the rollup table's schema (an offset without rows).
    empty: RecordBatch,
}

impl RollupOutput {
    /// An output handing each decoded batch to `observer`; `empty` has the table's schema.
    pub(super) fn new(observer: Arc<dyn BatchObserver>, empty: RecordBatch) -> RollupOutput {
        RollupOutput {
            observer,
            buffered_spans: 0,
            empty,
        }
    }
}

impl Output for RollupOutput {
    const NAME: &'static str = "rollup writer";

    fn message<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        pipeline: &Pipeline,
        encoding: Encoding,
        m: &Polled<'_>,
    ) -> Result<Stats, PipelineError> {
        let done = pipeline.process_bytes(m.payload, encoding)?;
        self.observer.observe(&done.batch, &done.stats);
        self.buffered_spans += done.batch.num_rows() as u64;
        match rollup::aggregate(std::slice::from_ref(&done.batch)) {
            Ok(rows) => writer.push(rows, Some((m.app.clone(), m.offset))),
            Err(e) => {
                // Cannot happen for the pipeline's batches; never stall on it.
                tracing::error!(error = %e, app = %m.app, offset = m.offset, "cannot roll up a batch; skipping it");
                writer.push(self.empty.clone(), Some((m.app.clone(), m.offset)));
            }
        }
        Ok(done.stats)
    }

    fn poison<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        m: &Polled<'_>,
        error: PipelineError,
    ) {
        tracing::debug!(
            partition = m.partition,
            offset = m.offset,
            code = error.code().as_str(),
            "undecodable message skipped (ingest dead-letters it)"
        );
        writer.push(self.empty.clone(), Some((m.app.clone(), m.offset)));
    }

    fn prepare<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        _metrics: &IngestMetrics,
        _summary: &mut IngestSummary,
    ) -> Result<(), Refused> {
        if writer.buffered_rows() > 0 {
            // One file per flush: the message-sized rollups merged (idempotent if retried).
            writer.map_batches(|b| match rollup::aggregate(&b) {
                Ok(merged) => vec![merged],
                Err(_) => b,
            });
        }
        Ok(())
    }

    fn committed(&mut self, _info: Option<&CommitInfo>) -> u64 {
        std::mem::take(&mut self.buffered_spans)
    }

    fn discard(&mut self, _buffered_rows: u64) -> u64 {
        std::mem::take(&mut self.buffered_spans)
    }
}
