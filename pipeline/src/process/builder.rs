//! Arrow column builders for the `spans` table.

use std::fmt::Write as _;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, Date32Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder, TimestampMicrosecondBuilder,
};
use arrow::record_batch::RecordBatch;
use sha2::{Digest, Sha256};

use super::classify::extract::{is_mapped_key, Facts};
use super::classify::Stage;
use super::shapes::ShapeColumns;
use super::values::{
    as_str, cut, payload_text, write_object, write_text, ATTRIBUTES_LIMIT, EVENTS_LIMIT,
};
use super::Stats;
use crate::error::PipelineError;
use crate::leak::leaked_internals;
use crate::otlp::view::Kv;
use crate::redact::{RedactionCounts, Redactor};
use toolspan_schema::columns::{spans_schema, MESSAGE_LIMIT, NO_TOOL, PAYLOAD_LIMIT};
use toolspan_schema::Status;

/// Longest kept tool, agent, service, model, code or reference value.
const NAME_LIMIT: usize = 256;

/// Resource-level values, computed once per `ResourceSpans`.
pub struct ResourceCtx {
    tenant: String,
    service: String,
    service_version: Option<String>,
    attributes: String,
}

impl ResourceCtx {
    /// Length of the `resource_attributes` text each of the resource's spans carries.
    pub fn attributes_len(&self) -> usize {
        self.attributes.len()
    }

    /// Reads and redacts a resource.
    pub fn new(attrs: &[Kv<'_>], redactor: &Redactor, counts: &mut RedactionCounts) -> ResourceCtx {
        let mut tenant = None;
        let mut service = None;
        let mut version = None;
        for kv in attrs {
            match kv.key {
                "tenant.id" => tenant = as_str(kv.value),
                "service.name" => service = as_str(kv.value),
                "service.version" => version = as_str(kv.value),
                _ => {}
            }
        }
        let clean = |s: &str, counts: &mut RedactionCounts| {
            cut(&redactor.redact(s, counts), NAME_LIMIT).to_string()
        };
        let mut attributes = String::new();
        write_object(
            &mut attributes,
            attrs
                .iter()
                .copied()
                .filter(|kv| !matches!(kv.key, "tenant.id" | "service.name" | "service.version")),
            0,
            redactor,
            counts,
            ATTRIBUTES_LIMIT,
        );
        ResourceCtx {
            tenant: tenant
                .filter(|s| !s.is_empty())
                .map(|s| clean(s, counts))
                .unwrap_or_else(|| "default".into()),
            service: service
                .filter(|s| !s.is_empty())
                .map(|s| clean(s, counts))
                .unwrap_or_else(|| "unknown_service".into()),
            service_version: version.filter(|s| !s.is_empty()).map(|s| clean(s, counts)),
            attributes,
        }
    }
}

/// Builders for every column, in schema order.
pub struct Builder {
    tenant: StringBuilder,
    trace_id: StringBuilder,
    span_id: StringBuilder,
    parent_span_id: StringBuilder,
    name: StringBuilder,
    kind: StringBuilder,
    service: StringBuilder,
    service_version: StringBuilder,
    agent: StringBuilder,
    tool: StringBuilder,
    stage: StringBuilder,
    call_id: StringBuilder,
    attempt: Int32Builder,
    start_time: TimestampMicrosecondBuilder,
    end_time: TimestampMicrosecondBuilder,
    start_nanos: Int64Builder,
    date: Date32Builder,
    duration_ms: Float64Builder,
    status: StringBuilder,
    error_type: StringBuilder,
    error_code: StringBuilder,
    error_class: StringBuilder,
    retryable: BooleanBuilder,
    retry_after_ms: Int64Builder,
    reference: StringBuilder,
    error_message: StringBuilder,
    http_status: Int32Builder,
    model: StringBuilder,
    input_tokens: Int64Builder,
    output_tokens: Int64Builder,
    input: StringBuilder,
    output: StringBuilder,
    input_sha: StringBuilder,
    output_sha: StringBuilder,
    input_bytes: Int64Builder,
    output_bytes: Int64Builder,
    leaked: BooleanBuilder,
    redactions: Int32Builder,
    sample_weight: Float64Builder,
    attributes: StringBuilder,
    resource_attributes: StringBuilder,
    events: StringBuilder,
    status_from_result: BooleanBuilder,
    shapes: ShapeColumns,
    scratch: String,
    hexbuf: String,
}

fn hex_into(buf: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf.clear();
    for &b in bytes {
        buf.push(HEX[(b >> 4) as usize] as char);
        buf.push(HEX[(b & 15) as usize] as char);
    }
}

fn opt_str(b: &mut StringBuilder, v: Option<&str>) {
    match v {
        Some(s) => b.append_value(s),
        None => b.append_null(),
    }
}

impl Builder {
    /// Builders sized for `n` rows whose resource attributes take `resource_bytes` in all;
    /// `shapes: false` leaves the payload shape columns null ([`super::Pipeline::with_shapes`]).
    pub fn with_capacity(n: usize, resource_bytes: usize, shapes: bool) -> Builder {
        let s = |bytes: usize| StringBuilder::with_capacity(n, n * bytes);
        Builder {
            tenant: s(8),
            trace_id: s(32),
            span_id: s(16),
            parent_span_id: s(16),
            name: s(24),
            kind: s(8),
            service: s(16),
            service_version: s(8),
            agent: s(12),
            tool: s(12),
            stage: s(8),
            call_id: s(16),
            attempt: Int32Builder::with_capacity(n),
            start_time: TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC"),
            end_time: TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC"),
            start_nanos: Int64Builder::with_capacity(n),
            date: Date32Builder::with_capacity(n),
            duration_ms: Float64Builder::with_capacity(n),
            status: s(5),
            error_type: s(4),
            error_code: s(4),
            error_class: s(4),
            retryable: BooleanBuilder::with_capacity(n),
            retry_after_ms: Int64Builder::with_capacity(n),
            reference: s(4),
            error_message: s(8),
            http_status: Int32Builder::with_capacity(n),
            model: s(4),
            input_tokens: Int64Builder::with_capacity(n),
            output_tokens: Int64Builder::with_capacity(n),
            input: s(16),
            output: s(16),
            input_sha: s(8),
            output_sha: s(8),
            input_bytes: Int64Builder::with_capacity(n),
            output_bytes: Int64Builder::with_capacity(n),
            leaked: BooleanBuilder::with_capacity(n),
            redactions: Int32Builder::with_capacity(n),
            sample_weight: Float64Builder::with_capacity(n),
            attributes: s(48),
            resource_attributes: StringBuilder::with_capacity(n, resource_bytes),
            events: s(8),
            status_from_result: BooleanBuilder::with_capacity(n),
            shapes: ShapeColumns::with_capacity(n, shapes),
            scratch: String::with_capacity(256),
            hexbuf: String::with_capacity(32),
        }
    }

    fn clean_opt(
        &mut self,
        which: Col,
        v: Option<&str>,
        redactor: &Redactor,
        counts: &mut RedactionCounts,
    ) {
        let b = self.col(which);
        match v {
            Some(s) => {
                let r = redactor.redact(s, counts);
                b.append_value(cut(&r, NAME_LIMIT));
            }
            None => b.append_null(),
        }
    }

    fn col(&mut self, c: Col) -> &mut StringBuilder {
        match c {
            Col::Agent => &mut self.agent,
            Col::CallId => &mut self.call_id,
            Col::Code => &mut self.error_code,
            Col::Class => &mut self.error_class,
            Col::Reference => &mut self.reference,
            Col::Model => &mut self.model,
        }
    }

    /// Appends one span.
    pub fn append(
        &mut self,
        f: &Facts<'_>,
        res: &ResourceCtx,
        redactor: &Redactor,
        stats: &mut Stats,
    ) {
        let span = f.span;
        let mut counts = RedactionCounts::default();
        self.tenant.append_value(&res.tenant);
        hex_into(&mut self.hexbuf, span.trace_id);
        self.trace_id.append_value(&self.hexbuf);
        hex_into(&mut self.hexbuf, span.span_id);
        self.span_id.append_value(&self.hexbuf);
        if span.parent_span_id.is_empty() {
            self.parent_span_id.append_null();
        } else {
            hex_into(&mut self.hexbuf, span.parent_span_id);
            self.parent_span_id.append_value(&self.hexbuf);
        }
        let name = redactor.redact(span.name, &mut counts);
        self.name.append_value(cut(&name, NAME_LIMIT * 4));
        self.kind
            .append_value(crate::otlp::span_kind_name(span.kind));
        self.service.append_value(&res.service);
        opt_str(&mut self.service_version, res.service_version.as_deref());
        self.clean_opt(Col::Agent, f.agent, redactor, &mut counts);
        let stage = f.stage.unwrap_or(Stage::Other);
        match f.tool {
            Some(t) => {
                let r = redactor.redact(t, &mut counts);
                self.tool.append_value(cut(&r, NAME_LIMIT));
            }
            None => self.tool.append_value(NO_TOOL),
        }
        self.stage.append_value(stage.as_str());
        self.clean_opt(Col::CallId, f.call_id, redactor, &mut counts);
        self.attempt
            .append_option(f.attempt.and_then(|a| i32::try_from(a).ok()));

        let start = span.start_time_unix_nano;
        let end = span.end_time_unix_nano.max(start);
        let start_i = i64::try_from(start).unwrap_or(i64::MAX);
        let end_i = i64::try_from(end).unwrap_or(i64::MAX);
        self.start_time.append_value(start_i / 1000);
        self.end_time.append_value(end_i / 1000);
        self.start_nanos.append_value(start_i);
        self.date
            .append_value((start_i / 86_400_000_000_000) as i32);
        self.duration_ms.append_value((end - start) as f64 / 1e6);

        let code = span.status.as_ref().map(|s| s.code).unwrap_or(0);
        self.status
            .append_value(Status::of(code, f.status_from_result).as_str());
        self.status_from_result.append_value(f.status_from_result);
        if f.failed {
            stats.errors += 1;
        }
        opt_str(&mut self.error_type, f.error_type.map(|e| e.as_str()));
        self.clean_opt(Col::Code, f.error_code, redactor, &mut counts);
        self.clean_opt(Col::Class, f.error_class, redactor, &mut counts);
        self.retryable.append_option(f.retryable);
        self.retry_after_ms.append_option(f.retry_after_ms);
        self.clean_opt(Col::Reference, f.reference, redactor, &mut counts);
        match f.error_text() {
            Some(m) => {
                let r = redactor.redact(m, &mut counts);
                self.error_message.append_value(cut(&r, MESSAGE_LIMIT));
            }
            None => self.error_message.append_null(),
        }
        self.http_status
            .append_option(f.http_status.and_then(|h| i32::try_from(h).ok()));
        self.clean_opt(Col::Model, f.model, redactor, &mut counts);
        self.input_tokens.append_option(f.input_tokens);
        self.output_tokens.append_option(f.output_tokens);

        let input = f.input.and_then(|v| payload_text(v, redactor, &mut counts));
        let output = f
            .output
            .and_then(|v| payload_text(v, redactor, &mut counts));
        let leaked = output.as_deref().is_some_and(leaked_internals);
        for (dir, (payload, text, sha, bytes)) in [
            (
                input,
                &mut self.input,
                &mut self.input_sha,
                &mut self.input_bytes,
            ),
            (
                output,
                &mut self.output,
                &mut self.output_sha,
                &mut self.output_bytes,
            ),
        ]
        .into_iter()
        .enumerate()
        {
            match payload {
                Some(p) => {
                    // Hash and size are of the full body after redaction, so neither can be
                    // used to confirm a guessed secret.
                    let red = redactor.redact(&p, &mut counts);
                    text.append_value(cut(&red, PAYLOAD_LIMIT));
                    let digest = Sha256::digest(red.as_bytes());
                    hex_into(&mut self.hexbuf, &digest);
                    sha.append_value(&self.hexbuf);
                    bytes.append_value(red.len() as i64);
                    self.shapes.append(dir, Some((&red, &digest)));
                }
                None => {
                    text.append_null();
                    sha.append_null();
                    bytes.append_null();
                    self.shapes.append(dir, None);
                }
            }
        }
        self.leaked.append_value(leaked);
        if leaked {
            stats.leaked_internals += 1;
        }

        self.scratch.clear();
        write_object(
            &mut self.scratch,
            span.attributes
                .iter()
                .copied()
                .filter(|kv| !is_mapped_key(kv.key)),
            0,
            redactor,
            &mut counts,
            ATTRIBUTES_LIMIT,
        );
        self.attributes.append_value(&self.scratch);
        self.resource_attributes.append_value(&res.attributes);
        self.scratch.clear();
        self.scratch.push('[');
        let mut dropped = 0;
        for (i, ev) in span.events.iter().enumerate() {
            if self.scratch.len() > EVENTS_LIMIT {
                dropped += 1;
                continue;
            }
            if i > 0 {
                self.scratch.push(',');
            }
            self.scratch.push_str("{\"name\":");
            write_text(&mut self.scratch, ev.name, redactor, &mut counts);
            let _ = write!(
                self.scratch,
                ",\"time_unix_nano\":{},\"attributes\":",
                ev.time_unix_nano
            );
            write_object(
                &mut self.scratch,
                ev.attributes.iter().copied(),
                0,
                redactor,
                &mut counts,
                EVENTS_LIMIT,
            );
            self.scratch.push('}');
        }
        if dropped > 0 {
            let _ = write!(
                self.scratch,
                ",{{\"name\":\"toolspan.dropped_events\",\"count\":{dropped}}}"
            );
        }
        self.scratch.push(']');
        self.events.append_value(&self.scratch);
        self.redactions
            .append_value(i32::try_from(counts.total()).unwrap_or(i32::MAX));
        self.sample_weight.append_value(1.0);
        stats.redactions.merge(&counts);
    }

    /// Finishes the batch.
    pub fn finish(mut self) -> Result<RecordBatch, PipelineError> {
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(self.tenant.finish()),
            Arc::new(self.trace_id.finish()),
            Arc::new(self.span_id.finish()),
            Arc::new(self.parent_span_id.finish()),
            Arc::new(self.name.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.service.finish()),
            Arc::new(self.service_version.finish()),
            Arc::new(self.agent.finish()),
            Arc::new(self.tool.finish()),
            Arc::new(self.stage.finish()),
            Arc::new(self.call_id.finish()),
            Arc::new(self.attempt.finish()),
            Arc::new(self.start_time.finish()),
            Arc::new(self.end_time.finish()),
            Arc::new(self.start_nanos.finish()),
            Arc::new(self.date.finish()),
            Arc::new(self.duration_ms.finish()),
            Arc::new(self.status.finish()),
            Arc::new(self.error_type.finish()),
            Arc::new(self.error_code.finish()),
            Arc::new(self.error_class.finish()),
            Arc::new(self.retryable.finish()),
            Arc::new(self.retry_after_ms.finish()),
            Arc::new(self.reference.finish()),
            Arc::new(self.error_message.finish()),
            Arc::new(self.http_status.finish()),
            Arc::new(self.model.finish()),
            Arc::new(self.input_tokens.finish()),
            Arc::new(self.output_tokens.finish()),
            Arc::new(self.input.finish()),
            Arc::new(self.output.finish()),
            Arc::new(self.input_sha.finish()),
            Arc::new(self.output_sha.finish()),
            Arc::new(self.input_bytes.finish()),
            Arc::new(self.output_bytes.finish()),
            Arc::new(self.leaked.finish()),
            Arc::new(self.redactions.finish()),
            Arc::new(self.sample_weight.finish()),
            Arc::new(self.attributes.finish()),
            Arc::new(self.resource_attributes.finish()),
            Arc::new(self.events.finish()),
            Arc::new(self.status_from_result.finish()),
        ];
        cols.extend(self.shapes.finish());
        RecordBatch::try_new(spans_schema(), cols).map_err(|e| PipelineError::Arrow(e.to_string()))
    }
}

#[derive(Clone, Copy)]
enum Col {
    Agent,
    CallId,
    Code,
    Class,
    Reference,
    Model,
}
