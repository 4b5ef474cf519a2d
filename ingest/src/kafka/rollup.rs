//! The metrics job's rollup output: every decoded message goes to an observer (the tool
//! metrics) and is folded into per-minute rollup rows ([`toolspan_store::rollup`]) committed
//! to `failure_rates_1m` with the message's offset, so the rollup counts each span exactly
//! once. A poison message is skipped (ingest dead-letters it); its offset still moves on.

use std::sync::Arc;
use std::time::Instant;

use crate::IngestMetrics;
use arrow::array::RecordBatch;
use toolspan_pipeline::{
    Accumulator, Assembler, Encoding, Offered, Pipeline, PipelineError, Stats,
};
use toolspan_store::{rollup, CommitInfo, Committer, Writer};

use super::output::{group, push_released, Output, Polled, Refused};
use super::IngestSummary;
use crate::observer::BatchObserver;

/// Per-minute rollup rows into `failure_rates_1m`; every decoded batch is observed first.
pub(super) struct RollupOutput {
    observer: Arc<dyn BatchObserver>,
    /// Messages waiting for relatives of their spans (app id, offset).
    assembler: Option<Assembler<(String, i64)>>,
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
            assembler: None,
            buffered_spans: 0,
            empty,
        }
    }
}

impl RollupOutput {
    fn assembler(&mut self, pipeline: &Pipeline) -> &mut Assembler<(String, i64)> {
        self.assembler
            .get_or_insert_with(|| Assembler::for_pipeline(pipeline))
    }

    /// Observes and rolls up the released messages' rows, handing the writer their offsets.
    fn released<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        out: &Offered<(String, i64)>,
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
        let out = self.assembler(pipeline).offer(
            pipeline,
            m.payload,
            encoding,
            group(m.partition),
            (m.app.clone(), m.offset),
            Instant::now(),
            &mut acc,
        )?;
        self.released(writer, &out, &mut acc);
        Ok(Stats {
            rejected: out.rejected,
            ..out.stats
        })
    }

    fn expire<C: Committer>(&mut self, writer: &mut Writer<C>, pipeline: &Pipeline, now: Instant) {
        if self.assembler.as_ref().is_none_or(|a| a.is_empty()) {
            return;
        }
        let mut acc = Accumulator::new();
        let out = self.assembler(pipeline).expire(pipeline, now, &mut acc);
        self.released(writer, &out, &mut acc);
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
        let out = self.assembler(pipeline).offer_marker(
            pipeline,
            group(m.partition),
            (m.app.clone(), m.offset),
            Instant::now(),
            &mut acc,
        );
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
        if let Some(a) = &mut self.assembler {
            a.drop_all();
        }
        std::mem::take(&mut self.buffered_spans)
    }
}
