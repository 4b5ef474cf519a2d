//! The metrics job's rollup writer: the Kafka worker ([`crate::kafka`]) with another output.
//! Every decoded message goes to an observer (the tool metrics) and is folded into per-minute
//! rollup rows ([`toolspan_schema::rollup::aggregate`]) committed to `failure_rates_1m` with
//! the message's offset, so the rollup counts each span exactly once. A poison message is
//! skipped (ingest dead-letters it); its offset still moves on.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use rdkafka::Offset;
use toolspan_pipeline::{Accumulator, Encoding, Offered, Pipeline, PipelineError, Stats};
use toolspan_schema::rollup;
use toolspan_store::{CommitInfo, Committer, SpanTable, TableKind, Writer};

use crate::kafka::output::{push_released, Assembly, Output, Polled, Refused, Txn};
use crate::kafka::worker::Shared;
use crate::kafka::{check_strategy, run, IngestSummary, KafkaIngestConfig};
use crate::observer::BatchObserver;
use crate::{IngestError, IngestMetrics};

/// Runs the metrics job's rollup writer until `stop` is set (see [`crate::kafka`] for the protocol): every
/// decoded batch goes to `observer`, and per-minute rollup rows are committed to `table` (a
/// [`TableKind::FailureRates`] table) exactly once. A partition the table has no offset for
/// starts at the end of the topic (rates from now on), or at its beginning with `-X
/// auto.offset.reset=earliest`. `config.dlq_topic` and `config.sampling` are not used.
pub fn run_rollup_worker(
    config: KafkaIngestConfig,
    table: SpanTable,
    pipeline: Arc<Pipeline>,
    metrics: Arc<IngestMetrics>,
    observer: Arc<dyn BatchObserver>,
    handle: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> Result<IngestSummary, IngestError> {
    check_strategy(&config)?;
    if table.kind() != TableKind::FailureRates {
        return Err(IngestError::Config(
            "the rollup worker writes a failure_rates_1m table".into(),
        ));
    }
    let earliest = config
        .client_options
        .iter()
        .rev()
        .find(|(k, _)| k == "auto.offset.reset")
        .is_some_and(|(_, v)| matches!(v.as_str(), "earliest" | "smallest" | "beginning"));
    let unrecorded = if earliest {
        Offset::Beginning
    } else {
        Offset::End
    };
    let config = KafkaIngestConfig {
        sampling: None,
        ..config
    };
    let output = RollupOutput::new(observer, RecordBatch::new_empty(table.kind().schema()));
    run(
        config,
        table,
        output,
        unrecorded,
        Shared {
            pipeline,
            metrics,
            handle,
            stop,
        },
    )
}

/// Per-minute rollup rows into `failure_rates_1m`; every decoded batch is observed first.
pub(crate) struct RollupOutput {
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
    pub(crate) fn new(observer: Arc<dyn BatchObserver>, empty: RecordBatch) -> RollupOutput {
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
