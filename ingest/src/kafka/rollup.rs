//! The metrics job's rollup output: every decoded message goes to an observer (the tool
//! metrics) and is folded into per-minute rollup rows ([`toolspan_store::rollup`]) committed
//! to `failure_rates_1m` with the message's offset, so the rollup counts each span exactly
//! once. A poison message is skipped (ingest dead-letters it); its offset still moves on.

use std::sync::Arc;
use std::time::Instant;

use crate::IngestMetrics;
use arrow::array::RecordBatch;
use toolspan_pipeline::{Accumulator, Encoding, Offered, Pipeline, PipelineError, Stats};
use toolspan_store::{rollup, CommitInfo, Committer, Writer};

use super::output::{push_released, Assembly, Output, Polled, Refused, Txn};
use super::IngestSummary;
use crate::observer::BatchObserver;

/// Per-minute rollup rows into `failure_rates_1m`; every decoded batch is observed first.
pub(super) struct RollupOutput {
    observer: Arc<dyn BatchObserver>,
    /// Messages waiting for relatives of their spans.
    assembly: Assembly,
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
            assembly: Assembly::default(),
            buffered_spans: 0,
            empty,
        }
    }
}

impl RollupOutput {
    /// Observes and rolls up the released messages' rows, handing the writer their offsets.
    fn released<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        out: &Offered<Txn>,
        acc: &mut Accumulator,
    ) {
        if out.released.is_empty() {
            return;
        }
        let txns = out.released.iter().cloned();
        let batch = match acc.take() {
            Ok(b) => b,
            Err(e) => {
                // Cannot happen for the pipeline's rows; never stall on it.
                tracing::error!(error = %e, "cannot build released rows; skipping them");
                None
            }
        };
        let rows = batch.and_then(|b| {
            self.observer.observe(&b, &out.stats);
            self.buffered_spans += b.num_rows() as u64;
            match rollup::aggregate(std::slice::from_ref(&b)) {
                Ok(rows) => Some(rows),
                Err(e) => {
                    tracing::error!(error = %e, "cannot roll up a batch; skipping it");
                    None
                }
            }
        });
        push_released(writer, rows, txns, &self.empty);
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
        let mut acc = Accumulator::new();
        let out = self.assembly.offer(pipeline, encoding, m, &mut acc)?;
        self.released(writer, &out, &mut acc);
        Ok(Stats {
            rejected: out.rejected,
            ..out.stats
        })
    }

    fn expire<C: Committer>(&mut self, writer: &mut Writer<C>, pipeline: &Pipeline, now: Instant) {
        let mut acc = Accumulator::new();
        if let Some(out) = self.assembly.expire(pipeline, now, &mut acc) {
            self.released(writer, &out, &mut acc);
        }
    }

    fn poison<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        pipeline: &Pipeline,
        m: &Polled<'_>,
        error: PipelineError,
    ) {
        tracing::debug!(
            partition = m.partition,
            offset = m.offset,
            code = error.code().as_str(),
            "undecodable message skipped (ingest dead-letters it)"
        );
        let mut acc = Accumulator::new();
        let out = self.assembly.marker(pipeline, m, &mut acc);
        self.released(writer, &out, &mut acc);
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
        self.assembly.drop_all();
        std::mem::take(&mut self.buffered_spans)
    }
}
