//! What a replay needs of a failed call, read from the table: the replay document
//! (`toolspan.replay/1`) that `GET /api/v1/calls/{id}/replay` answers and the Python SDK's
//! `python -m toolspan replay` runs.
//!
//! A call is named by its error reference (`err_5f0c2a9d41b3`), its call id (`call_1`, refused
//! when it names calls in several traces) or `TRACEID:SPANID` of its call span (any span of
//! the call leads to it). Every read of one document is pinned to one table version
//! ([`pinned::Pinned`]): the latest, or the one asked for (time travel); the document names it.
//!
//! The document ([`ReplayDocument`]): the call (tool, service and version, status, error type,
//! code and class, the failing stage, attempts, whether it leaked internals), the arguments as
//! stored and whether they are **exact** (the stored text is the whole payload: its SHA-256
//! equals the digest ingest took of the full payload, and no value was redacted), else which
//! values were redacted or that the text was cut; the result and its envelope; the backend
//! answers the attempts recorded (the send stage's result, else the parse stage's input).

pub mod document;
pub mod pinned;

use std::collections::BTreeMap;

use datafusion::arrow::array::RecordBatch;
use serde::Serialize;
use toolspan_schema::{Code, Envelope};

use crate::engine::Engine;
use crate::rows::{spans_in, Cols, SPAN_COLUMNS};
use crate::sql::literal;
use document::{Replayable, Stored, Trace};
use pinned::Pinned;

/// The schema name of a replay document.
pub const REPLAY_SCHEMA: &str = "toolspan.replay/1";

/// Spans of one trace read at most for a replay document.
pub const MAX_TRACE_SPANS: usize = crate::trace::MAX_SPANS;

/// Traces an ambiguous call id's message names at most.
const NAMED_TRACES: usize = 5;

/// Whether each payload is whole: its text's digest equals the stored digest of the payload.
pub(crate) const WHOLE_COLUMNS: &str = "(input_sha256 = encode(sha256(input), 'hex')) AS \
input_whole, (output_sha256 = encode(sha256(output), 'hex')) AS output_whole";

/// A replay document: the schema, the table version read, and the call's replay fields.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReplayDocument {
    /// [`REPLAY_SCHEMA`].
    pub schema: &'static str,
    /// The table version the document was read from.
    pub table_version: u64,
    /// The call.
    #[serde(flatten)]
    pub replay: Replayable,
}

/// How a caller named a call.
#[derive(Debug, Clone, PartialEq)]
pub enum CallRef {
    /// `TRACEID:SPANID` of a span of the call.
    Span {
        /// 32 lowercase hex digits.
        trace_id: String,
        /// 16 lowercase hex digits.
        span_id: String,
    },
    /// An error reference or a call id.
    Name(String),
}

fn invalid(message: String) -> Envelope {
    Envelope::new(Code::InvalidArgument, message.clone(), message)
}

fn not_found(message: String) -> Envelope {
    Envelope::new(Code::NotFound, message.clone(), message)
}

/// Parses a call's name: `TRACEID:SPANID`, or a reference or call id (1 to 128 letters,
/// digits, `_`, `-`, `.` or `:`).
pub fn parse_ref(id: &str) -> Result<CallRef, Envelope> {
    if let Some((t, s)) = id.split_once(':') {
        let hex = |v: &str, n: usize| v.len() == n && v.bytes().all(|b| b.is_ascii_hexdigit());
        if hex(t, 32) && hex(s, 16) {
            return Ok(CallRef::Span {
                trace_id: t.to_ascii_lowercase(),
                span_id: s.to_ascii_lowercase(),
            });
        }
    }
    if crate::trace::valid_reference(id) {
        return Ok(CallRef::Name(id.to_string()));
    }
    Err(invalid(
        "a call is named by its error reference (err_5f0c2a9d41b3), its call id, or \
         TRACEID:SPANID of its call span (32 and 16 hexadecimal digits); names are 1 to 128 \
         letters, digits, '_', '-', '.' or ':'"
            .into(),
    ))
}

/// The stored spans of `batches` (selected with [`SPAN_COLUMNS`] and [`WHOLE_COLUMNS`]).
pub(crate) fn stored(batches: &[RecordBatch]) -> Result<Vec<Stored>, Envelope> {
    let q = |e: crate::error::QueryError| toolspan_schema::EnvelopeError::envelope(&e);
    let mut out = Vec::new();
    for batch in batches {
        let mut spans = Vec::with_capacity(batch.num_rows());
        spans_in(batch, &mut spans).map_err(q)?;
        let c = Cols::new(batch);
        let (iw, ow) = (
            c.boolean("input_whole").map_err(q)?,
            c.boolean("output_whole").map_err(q)?,
        );
        out.extend(spans.into_iter().enumerate().map(|(i, span)| Stored {
            span,
            input_whole: iw.bool(i),
            output_whole: ow.bool(i),
        }));
    }
    Ok(out)
}

/// Every span of the traces `trace_ids` (validated hex), by trace, in start order.
pub(crate) async fn load_traces(
    pinned: &Pinned,
    trace_ids: &[String],
) -> Result<BTreeMap<String, Vec<Stored>>, Envelope> {
    let mut out: BTreeMap<String, Vec<Stored>> = BTreeMap::new();
    if trace_ids.is_empty() {
        return Ok(out);
    }
    let list: Vec<String> = trace_ids.iter().map(|t| literal(t)).collect();
    let sql = format!(
        "SELECT {SPAN_COLUMNS}, {WHOLE_COLUMNS} FROM spans WHERE trace_id IN ({}) \
         ORDER BY trace_id, start_time_unix_nano, span_id LIMIT {}",
        list.join(", "),
        MAX_TRACE_SPANS * trace_ids.len()
    );
    for s in stored(&pinned.query(&sql).await?)? {
        let spans = out.entry(s.span.trace_id.clone()).or_default();
        if spans.len() < MAX_TRACE_SPANS {
            spans.push(s);
        }
    }
    Ok(out)
}

/// Finds the call span `name` names: the call carrying the reference (or the call of a span
/// that carries it), else the one call with that call id.
async fn resolve_name(pinned: &Pinned, name: &str) -> Result<(String, String), Envelope> {
    let v = pinned.version();
    let lit = literal(name);
    let sql = format!(
        "SELECT trace_id, span_id, stage, reference FROM spans \
         WHERE reference = {lit} OR (stage = 'call' AND call_id = {lit}) \
         ORDER BY start_time_unix_nano, span_id LIMIT 1000"
    );
    let batches = pinned.query(&sql).await?;
    let q = |e: crate::error::QueryError| toolspan_schema::EnvelopeError::envelope(&e);
    let mut by_reference: Vec<(String, String, bool)> = Vec::new();
    let mut by_call_id: Vec<(String, String)> = Vec::new();
    for batch in &batches {
        let c = Cols::new(batch);
        let (t, s, st, r) = (
            c.text("trace_id").map_err(q)?,
            c.text("span_id").map_err(q)?,
            c.text("stage").map_err(q)?,
            c.text("reference").map_err(q)?,
        );
        for i in 0..batch.num_rows() {
            let ids = (
                t.str(i).unwrap_or_default().to_string(),
                s.str(i).unwrap_or_default().to_string(),
            );
            if r.str(i) == Some(name) {
                by_reference.push((ids.0, ids.1, st.str(i) == Some("call")));
            } else {
                by_call_id.push(ids);
            }
        }
    }
    if let Some((t, s, _)) = by_reference
        .iter()
        .find(|r| r.2)
        .or_else(|| by_reference.first())
    {
        return Ok((t.clone(), s.clone()));
    }
    match by_call_id.as_slice() {
        [] => Err(not_found(format!(
            "no call has the reference or call id {name} at table version {v}: check its \
             spelling, or it may not be ingested yet"
        ))),
        [one] => Ok(one.clone()),
        many => {
            let mut traces: Vec<&str> = Vec::new();
            for (t, _) in many {
                if !traces.contains(&t.as_str()) {
                    traces.push(t);
                }
            }
            let named: Vec<&str> = traces.iter().take(NAMED_TRACES).copied().collect();
            Err(invalid(format!(
                "the call id {name} names {} calls, in traces {}{}: name one by TRACEID:SPANID \
                 of its call span, or by its error reference",
                many.len(),
                named.join(", "),
                if traces.len() > NAMED_TRACES {
                    ", …"
                } else {
                    ""
                }
            )))
        }
    }
}

/// The replay document of the call `id` names, read at table `version` (the latest when
/// `None`).
pub async fn document(
    engine: &Engine,
    id: &str,
    version: Option<u64>,
) -> Result<ReplayDocument, Envelope> {
    let call_ref = parse_ref(id)?;
    let pinned = Pinned::open(engine, version).await?;
    let v = pinned.version();
    let (trace_id, span_id) = match call_ref {
        CallRef::Span { trace_id, span_id } => (trace_id, span_id),
        CallRef::Name(name) => resolve_name(&pinned, &name).await?,
    };
    let traces = load_traces(&pinned, std::slice::from_ref(&trace_id)).await?;
    let spans = traces.get(&trace_id).map(Vec::as_slice).unwrap_or_default();
    let trace = Trace::new(spans);
    if trace.find(&span_id).is_none() {
        return Err(not_found(format!(
            "no span {trace_id}:{span_id} at table version {v}: it may not be ingested yet, or \
             it was sampled out"
        )));
    }
    let Some(call) = trace.call_of(&span_id) else {
        return Err(not_found(format!(
            "span {trace_id}:{span_id} belongs to no tool call, so there is nothing to replay"
        )));
    };
    Ok(ReplayDocument {
        schema: REPLAY_SCHEMA,
        table_version: v,
        replay: trace.replayable(call),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_named_three_ways() {
        let t = "4BF92F3577B34DA6A3CE929D0E0E4736";
        assert_eq!(
            parse_ref(&format!("{t}:00F067AA0BA902B7")).expect("ids"),
            CallRef::Span {
                trace_id: t.to_ascii_lowercase(),
                span_id: "00f067aa0ba902b7".into()
            }
        );
        assert_eq!(
            parse_ref("err_5f0c2a9d41b3").expect("reference"),
            CallRef::Name("err_5f0c2a9d41b3".into())
        );
        assert_eq!(
            parse_ref("call_1").expect("call id"),
            CallRef::Name("call_1".into())
        );
        for bad in ["", "a'b", "x y", &"a".repeat(129)] {
            assert_eq!(parse_ref(bad).expect_err(bad).code, Code::InvalidArgument);
        }
    }
}
