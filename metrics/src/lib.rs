//! Failure rates per tool and stage as Prometheus metrics: the contract is
//! `dashboards/METRICS.md` (names, labels, what each counts, caps, zero series).
//!
//! [`ToolMetrics::observe`] counts one batch of classified spans (the columns of
//! `toolspan_schema::spans_schema`); [`ToolMetrics::encode`] is the Prometheus text exposition
//! (format 0.0.4), served on `GET /metrics` by `toolspan_serve::exposition`. In embedded mode
//! (`toolspan serve`) the receiver calls `observe` once per committed batch, so a span shows in
//! `/metrics` as soon as its request is acknowledged.
//!
//! Encoding uses prometheus-client, the official Rust client: its `Family::remove` is what the
//! per-service version eviction needs. The label caps and the series cap are kept here
//! ([`series`], [`labels`]), since the client has neither.
//!
//! - [`labels`]: the tool, service and version caps;
//! - [`series`]: a family with a series cap and the label sets it holds;
//! - [`calls`]: attempts joined to their logical call, bounded in time and size;
//! - [`recovery`]: failure streaks across turns and their recovery, bounded in time and size;
//! - [`families`]: the families and their registration;
//! - [`shapes`]: answer shapes per tool, their share and new-shape events.

mod calls;
mod families;
mod labels;
pub mod recovery;
mod series;
mod shapes;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use toolspan_pipeline::redact::SecretKind;
use toolspan_schema::columns::NO_TOOL;
use toolspan_schema::{ErrorType, Stage};

use calls::{Attempt, CallJoin};
use families::ToolFamilies;
use labels::{LabelCaps, Resolved};
use recovery::{Call, Ended, Streaks};
use series::{Admission, Labels};
use toolspan_schema::span_rows::{SpanRow, SpanRows};

pub use series::OTHER;

/// Anything with a Prometheus text exposition (`toolspan_serve::exposition` serves several on
/// one listener).
pub trait Exposition: Send + Sync {
    /// The text exposition (format 0.0.4).
    fn exposition(&self) -> String;
}

impl Exposition for ToolMetrics {
    fn exposition(&self) -> String {
        self.encode()
    }
}

/// Metric settings (label caps, METRICS.md "Label values and the cardinality cap").
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Distinct tools kept before `__other__`.
    pub max_tools: usize,
    /// Distinct services kept before `__other__`.
    pub max_services: usize,
    /// Versions kept per service; a new one evicts the series of the least recently seen.
    pub max_versions_per_service: usize,
    /// Series per family; past it new label combinations fold tool, service and version.
    pub max_series: usize,
    /// How long a failure streak waits for the call that recovers it
    /// ([`recovery::DEFAULT_WINDOW`]).
    pub recovery_window: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            max_tools: 100,
            max_services: 50,
            max_versions_per_service: 5,
            max_series: 10_000,
            recovery_window: recovery::DEFAULT_WINDOW,
        }
    }
}

/// The tool metrics registry.
pub struct ToolMetrics {
    registry: Registry,
    state: Mutex<State>,
    overflow: Family<Labels, Counter>,
    ingest_spans: Counter,
    redactions: Family<Labels, Counter>,
}

/// What one batch updates under the lock: caps, call join and the capped families together,
/// so an eviction and a new series cannot interleave.
struct State {
    caps: LabelCaps,
    calls: CallJoin,
    streaks: Streaks,
    tool: ToolFamilies,
    shapes: shapes::AnswerShapes,
}

impl ToolMetrics {
    /// A new registry, with the series that start at zero already created.
    pub fn new(config: MetricsConfig) -> Arc<ToolMetrics> {
        let mut r = families::register(config.max_series);
        let shapes = shapes::AnswerShapes::register(&mut r.registry);
        Arc::new(ToolMetrics {
            registry: r.registry,
            state: Mutex::new(State {
                caps: LabelCaps::new(
                    config.max_tools,
                    config.max_services,
                    config.max_versions_per_service,
                ),
                calls: CallJoin::default(),
                streaks: Streaks::new(config.recovery_window, recovery::MAX_STREAKS),
                tool: r.tool,
                shapes,
            }),
            overflow: r.overflow,
            ingest_spans: r.ingest_spans,
            redactions: r.redactions,
        })
    }

    /// Counts one batch of classified spans (columns of `toolspan_schema::spans_schema`) and
    /// the redactions of `stats`.
    pub fn observe(&self, batch: &RecordBatch, stats: &toolspan_pipeline::Stats) {
        self.ingest_spans.inc_by(batch.num_rows() as u64);
        for kind in SecretKind::ALL {
            let n = stats.redactions.get(kind);
            if n > 0 {
                self.redactions
                    .get_or_create(&vec![("kind", kind.as_str().to_string())])
                    .inc_by(n);
            }
        }
        let rows = match SpanRows::new(batch) {
            Ok(r) => r,
            Err(column) => {
                tracing::warn!(
                    column,
                    "span batch without the column the metrics read; tool metrics skip it"
                );
                return;
            }
        };
        let now = Instant::now();
        let mut st = self.lock();
        st.calls.expire(now);
        // Attempts first: a call ends after its attempts, which may sit later in the batch.
        for i in 0..rows.len() {
            if rows.stage(i) == Stage::Attempt.as_str() && rows.tool(i) != NO_TOOL {
                let r = rows.row(i);
                let attempt = Attempt {
                    parent: r.parent_span_id.map(str::to_string),
                    call_id: r.call_id.map(str::to_string),
                    number: r.attempt,
                    failed: r.failed,
                    leaked: r.leaked_internals,
                };
                st.calls.add(now, r.trace_id, attempt);
            }
        }
        for i in 0..rows.len() {
            if rows.tool(i) == NO_TOOL {
                continue;
            }
            let Some(stage) = tool_stage(rows.stage(i)) else {
                continue;
            };
            self.count_span(&mut st, &rows.row(i), stage);
        }
        self.count_answers(&mut st, &rows);
        // Calls in start order within each trace, for the failure streaks.
        let mut calls: Vec<usize> = (0..rows.len())
            .filter(|&i| rows.stage(i) == Stage::Call.as_str() && rows.tool(i) != NO_TOOL)
            .collect();
        calls.sort_by(|&a, &b| {
            rows.trace_id(a)
                .cmp(rows.trace_id(b))
                .then(rows.start_ns(a).cmp(&rows.start_ns(b)))
        });
        let mut ended = st.streaks.expire(now);
        for i in calls {
            let r = rows.row(i);
            let call = Call {
                trace_id: r.trace_id,
                tool: r.tool,
                service: r.service,
                version: r.service_version.unwrap_or(""),
                failed: r.failed,
                input_sha256: r.input_sha256,
            };
            ended.extend(st.streaks.call(now, &call));
        }
        for e in ended {
            self.count_streak(&mut st, e);
        }
    }

    /// Closes the failure streaks that waited longer than the window (as unrecovered).
    pub fn expire_streaks(&self) {
        let mut st = self.lock();
        for e in st.streaks.expire(Instant::now()) {
            self.count_streak(&mut st, e);
        }
    }

    fn count_streak(&self, st: &mut State, e: Ended) {
        let version = (!e.version.is_empty()).then_some(e.version.as_str());
        let (tool, service, version) = self.resolve(st, &e.tool, &e.service, version);
        let labels: Labels = vec![
            ("tool", tool),
            ("service", service),
            ("service_version", version),
        ];
        let f = &mut st.tool;
        let outcome = if e.calls_to_recovery.is_some() {
            "recovered"
        } else {
            "unrecovered"
        };
        let mut with_outcome = labels.clone();
        with_outcome.push(("outcome", outcome.to_string()));
        self.capped(f.streaks.with(with_outcome, |c| {
            c.inc();
        }));
        if let Some(n) = e.calls_to_recovery {
            self.capped(
                f.calls_to_recovery
                    .with(labels.clone(), |h| h.observe(f64::from(n))),
            );
        }
        if e.hammering {
            self.capped(f.hammering.with(labels, |c| {
                c.inc();
            }));
        }
    }

    /// The Prometheus text exposition (format 0.0.4), after closing the failure streaks that
    /// waited longer than the window (so they close on a scrape without new traffic).
    pub fn encode(&self) -> String {
        self.expire_streaks();
        let mut out = String::new();
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            // Writing to a String cannot fail; a failing metric encoder would be a bug.
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while counting leaves counts that are still valid numbers: keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn overflowed(&self, label: &'static str) {
        self.overflow
            .get_or_create(&vec![("label", label.to_string())])
            .inc();
    }

    /// The label values of (tool, service, version) under the caps, counting overflows and
    /// removing the series of a version the new one evicts.
    fn resolve(
        &self,
        st: &mut State,
        tool: &str,
        service: &str,
        version: Option<&str>,
    ) -> (String, String, String) {
        let Resolved {
            tool,
            service,
            version,
            tool_overflow,
            service_overflow,
            evicted_version,
        } = st.caps.resolve(tool, service, version);
        if tool_overflow {
            self.overflowed("tool");
        }
        if service_overflow {
            self.overflowed("service");
        }
        if let Some(old) = evicted_version {
            let gone = |l: &Labels| {
                series::value(l, "service") == Some(service.as_str())
                    && series::value(l, "service_version") == Some(old.as_str())
            };
            let f = &mut st.tool;
            let n = f.spans.remove_where(gone)
                + f.failures.remove_where(gone)
                + f.unmapped.remove_where(gone)
                + f.streaks.remove_where(gone)
                + f.calls_to_recovery.remove_where(gone)
                + f.hammering.remove_where(gone);
            tracing::debug!(
                service,
                version = old,
                series = n,
                "service version evicted from the metrics"
            );
            self.overflowed("service_version");
        }
        (tool, service, version)
    }

    /// The answers of the batch's calls by shape: a `send` or `execute` stage's recorded
    /// answer (an attempt's stages belong to the attempt's parent call), or else the result of
    /// a call that did not fail; in start order.
    fn count_answers(&self, st: &mut State, rows: &SpanRows<'_>) {
        if !rows.has_shapes() {
            return;
        }
        let mut attempt_parent: HashMap<(&str, &str), &str> = HashMap::new();
        for i in 0..rows.len() {
            if rows.stage(i) == Stage::Attempt.as_str() {
                let r = rows.row(i);
                if let Some(p) = r.parent_span_id {
                    attempt_parent.insert((r.trace_id, r.span_id), p);
                }
            }
        }
        let mut answered: HashSet<(&str, &str)> = HashSet::new();
        let mut answers: Vec<(usize, &str)> = Vec::new();
        for i in 0..rows.len() {
            let stage = rows.stage(i);
            if rows.tool(i) == NO_TOOL
                || (stage != Stage::Send.as_str() && stage != Stage::Execute.as_str())
            {
                continue;
            }
            let Some(shape) = rows.output_shape(i) else {
                continue;
            };
            let r = rows.row(i);
            if let Some(p) = r.parent_span_id {
                let call = attempt_parent.get(&(r.trace_id, p)).copied().unwrap_or(p);
                answered.insert((r.trace_id, call));
            }
            answers.push((i, shape));
        }
        for i in 0..rows.len() {
            if rows.stage(i) != Stage::Call.as_str() || rows.tool(i) == NO_TOOL {
                continue;
            }
            let r = rows.row(i);
            if r.failed || answered.contains(&(r.trace_id, r.span_id)) {
                continue;
            }
            if let Some(shape) = rows.output_shape(i) {
                answers.push((i, shape));
            }
        }
        answers.sort_by_key(|(i, _)| rows.start_ns(*i));
        for (i, shape) in answers {
            let r = rows.row(i);
            let (tool, _, _) = self.resolve(st, r.tool, r.service, r.service_version);
            if st.shapes.answer(&tool, shape) {
                self.overflowed("shape");
            }
        }
    }

    fn count_span(&self, st: &mut State, r: &SpanRow<'_>, stage: &'static str) {
        let (tool, service, version) = self.resolve(st, r.tool, r.service, r.service_version);
        let f = &mut st.tool;

        let spans_labels: Labels = vec![
            ("tool", tool.clone()),
            ("stage", stage.to_string()),
            ("service", service.clone()),
            ("service_version", version.clone()),
        ];
        let admission = f.spans.with(spans_labels.clone(), |c| {
            c.inc();
        });
        match admission {
            Admission::Existing => {}
            Admission::New => zero_series(f, &spans_labels, stage),
            Admission::Folded => self.overflowed("series"),
        }
        let ts_labels: Labels = vec![("tool", tool.clone()), ("stage", stage.to_string())];
        let secs = (r.duration_ms / 1000.0).max(0.0);
        self.capped(f.durations.with(ts_labels.clone(), |h| h.observe(secs)));

        if r.failed {
            let error_type = r
                .error_type
                .and_then(|t| ErrorType::ALL.into_iter().find(|e| e.as_str() == t))
                .map_or("UNCLASSIFIED", ErrorType::as_str);
            let labels = vec![
                ("tool", tool.clone()),
                ("stage", stage.to_string()),
                ("error_type", error_type.to_string()),
                ("service", service.clone()),
                ("service_version", version.clone()),
            ];
            self.capped(f.failures.with(labels, |c| {
                c.inc();
            }));
            let unmapped = toolspan_schema::vocab::is_unmapped(r.error_code);
            if unmapped && matches!(Stage::parse(stage), Some(Stage::Call | Stage::Attempt)) {
                let mut labels = ts_labels;
                labels.push(("service", service.clone()));
                labels.push(("service_version", version.clone()));
                self.capped(f.unmapped.with(labels, |c| {
                    c.inc();
                }));
            }
        }

        if stage == Stage::Call.as_str() {
            let joined = st.calls.take(r.trace_id, r.span_id, r.call_id);
            let f = &mut st.tool;
            let attempts = i64::from(r.attempt.unwrap_or(1))
                .max(joined.max_number)
                .max(joined.count)
                .max(1);
            let outcome = if r.failed {
                "failed"
            } else if attempts > 1 || joined.failed > 0 {
                "recovered"
            } else {
                "ok"
            };
            let labels = vec![("tool", tool.clone()), ("outcome", outcome.to_string())];
            self.capped(f.call_attempts.with(labels, |h| h.observe(attempts as f64)));
            if outcome == "recovered" {
                self.capped(f.recovered.with(vec![("tool", tool.clone())], |c| {
                    c.inc();
                }));
            }
            if r.leaked_internals || joined.leaked {
                self.capped(
                    f.leaked
                        .with(vec![("tool", tool), ("service", service)], |c| {
                            c.inc();
                        }),
                );
            }
        }
    }

    fn capped(&self, admission: Admission) {
        if admission == Admission::Folded {
            self.overflowed("series");
        }
    }
}

/// The `stage` label of a tool span, or `None` for spans the tool metrics leave out (`agent`
/// and `llm`; METRICS.md). An unknown stage value counts as `other`.
fn tool_stage(stage: &str) -> Option<&'static str> {
    match Stage::parse(stage) {
        Some(Stage::Agent | Stage::Llm) => None,
        Some(s) if s.is_tool_stage() => Some(s.as_str()),
        _ => Some(Stage::Other.as_str()),
    }
}

/// The series METRICS.md creates at 0 when a (tool, stage, service, service_version) is first
/// seen: the stage's derived failure type, unmapped failures of calls and attempts, and per
/// tool and (tool, service) the recovered and leaked counters.
fn zero_series(f: &mut ToolFamilies, spans_labels: &Labels, stage: &str) {
    let get = |k| {
        series::value(spans_labels, k)
            .unwrap_or_default()
            .to_string()
    };
    let (tool, service, version) = (get("tool"), get("service"), get("service_version"));
    let derived = Stage::parse(stage)
        .and_then(Stage::implied_error)
        .map(ErrorType::as_str);
    if let Some(t) = derived {
        f.failures.touch(vec![
            ("tool", tool.clone()),
            ("stage", stage.to_string()),
            ("error_type", t.to_string()),
            ("service", service.clone()),
            ("service_version", version.clone()),
        ]);
    }
    if matches!(Stage::parse(stage), Some(Stage::Call | Stage::Attempt)) {
        f.unmapped.touch(vec![
            ("tool", tool.clone()),
            ("stage", stage.to_string()),
            ("service", service.clone()),
            ("service_version", version.clone()),
        ]);
    }
    if matches!(Stage::parse(stage), Some(Stage::Call)) {
        for outcome in ["recovered", "unrecovered"] {
            f.streaks.touch(vec![
                ("tool", tool.clone()),
                ("service", service.clone()),
                ("service_version", version.clone()),
                ("outcome", outcome.to_string()),
            ]);
        }
        f.hammering.touch(vec![
            ("tool", tool.clone()),
            ("service", service.clone()),
            ("service_version", version.clone()),
        ]);
    }
    f.recovered.touch(vec![("tool", tool.clone())]);
    f.leaked.touch(vec![("tool", tool), ("service", service)]);
}

#[cfg(test)]
mod tests;
