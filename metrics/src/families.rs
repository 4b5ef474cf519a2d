//! The metric families of METRICS.md, registered for the text exposition.
//!
//! prometheus-client appends `_total` to counters when it encodes them, so counters are
//! registered without it (`toolspan_tool_spans` → `toolspan_tool_spans_total`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use toolspan_pipeline::redact::SecretKind;

use crate::series::{Capped, Labels};

/// Buckets of `toolspan_call_attempts`.
pub const ATTEMPT_BUCKETS: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 8.0];

/// Buckets of `toolspan_stage_duration_seconds`.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Buckets of `toolspan_calls_to_recovery` (fail then succeed is 2 calls).
pub const RECOVERY_BUCKETS: [f64; 6] = [2.0, 3.0, 4.0, 5.0, 6.0, 8.0];

/// Values of the `label` label of `toolspan_metrics_label_overflow_total`.
pub const OVERFLOW_LABELS: [&str; 5] = ["tool", "service", "service_version", "series", "shape"];

type CounterFamily = Family<Labels, Counter>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn attempts_histogram() -> Histogram {
    Histogram::new(ATTEMPT_BUCKETS)
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

fn recovery_histogram() -> Histogram {
    Histogram::new(RECOVERY_BUCKETS)
}

/// The tool metrics with labels that the caps bound.
pub struct ToolFamilies {
    pub spans: Capped<Counter, fn() -> Counter>,
    pub failures: Capped<Counter, fn() -> Counter>,
    pub call_attempts: Capped<Histogram, fn() -> Histogram>,
    pub recovered: Capped<Counter, fn() -> Counter>,
    pub unmapped: Capped<Counter, fn() -> Counter>,
    pub leaked: Capped<Counter, fn() -> Counter>,
    pub durations: Capped<Histogram, fn() -> Histogram>,
    pub streaks: Capped<Counter, fn() -> Counter>,
    pub calls_to_recovery: Capped<Histogram, fn() -> Histogram>,
    pub hammering: Capped<Counter, fn() -> Counter>,
}

/// Everything registered, with handles to update it.
pub struct Registered {
    pub registry: Registry,
    pub tool: ToolFamilies,
    pub overflow: CounterFamily,
    pub ingest_spans: Counter,
    pub redactions: CounterFamily,
}

/// Registers every family of the embedded mode and creates the series that start at zero at
/// startup (METRICS.md, "Counters that start at zero").
pub fn register(max_series: usize) -> Registered {
    let mut registry = Registry::default();
    let counters = |registry: &mut Registry, name: &str, help: &str| {
        let f = CounterFamily::default();
        registry.register(name, help, f.clone());
        Capped::new(f, max_series)
    };
    let spans = counters(
        &mut registry,
        "toolspan_tool_spans",
        "Tool spans consumed (tool not _none), by tool, stage, service and service_version; for stage call, logical calls",
    );
    let failures = counters(
        &mut registry,
        "toolspan_tool_failures",
        "Tool spans with status error, by classified error type (a call's final one)",
    );
    let call_attempts =
        HistogramFamily::new_with_constructor(attempts_histogram as fn() -> Histogram);
    registry.register(
        "toolspan_call_attempts",
        "Attempts per logical call, by outcome (ok, recovered, failed)",
        call_attempts.clone(),
    );
    let recovered = counters(
        &mut registry,
        "toolspan_calls_recovered",
        "Logical calls that succeeded after at least one failed attempt",
    );
    let unmapped = counters(
        &mut registry,
        "toolspan_unmapped_failures",
        "Failed call and attempt spans whose error code is missing, empty or internal_error, by tool, stage, service and service_version",
    );
    let leaked = counters(
        &mut registry,
        "toolspan_leaked_internals",
        "Logical calls whose result or an attempt's result leaked internals (stack frames, paths, SQL, driver text)",
    );
    let durations = HistogramFamily::new_with_constructor(duration_histogram as fn() -> Histogram);
    registry.register(
        "toolspan_stage_duration_seconds",
        "Duration of every counted tool span, by tool and stage",
        durations.clone(),
    );
    let streaks = counters(
        &mut registry,
        "toolspan_failure_streaks",
        "Failure streaks (consecutive failed calls of a tool in a trace) that ended, by outcome: recovered (a later call of the tool succeeded) or unrecovered",
    );
    let calls_to_recovery =
        HistogramFamily::new_with_constructor(recovery_histogram as fn() -> Histogram);
    registry.register(
        "toolspan_calls_to_recovery",
        "Calls of a tool from its first failure to the call that recovered (fail then succeed: 2), per recovered streak",
        calls_to_recovery.clone(),
    );
    let hammering = counters(
        &mut registry,
        "toolspan_hammering_streaks",
        "Failure streaks in which the tool was called two more times or more with the same failing arguments",
    );
    let overflow = CounterFamily::default();
    registry.register(
        "toolspan_metrics_label_overflow",
        "Label values replaced by __other__ (or versions evicted), by the cap that overflowed",
        overflow.clone(),
    );
    for label in OVERFLOW_LABELS {
        drop(overflow.get_or_create(&vec![("label", label.to_string())]));
    }
    let ingest_spans = Counter::default();
    registry.register(
        "toolspan_ingest_spans",
        "Spans committed to the spans table",
        ingest_spans.clone(),
    );
    let redactions = CounterFamily::default();
    registry.register(
        "toolspan_redactions",
        "Secrets replaced by [REDACTED:kind] in stored spans",
        redactions.clone(),
    );
    for kind in SecretKind::ALL {
        drop(redactions.get_or_create(&vec![("kind", kind.as_str().to_string())]));
    }
    Registered {
        registry,
        tool: ToolFamilies {
            spans,
            failures,
            call_attempts: Capped::new(call_attempts, max_series),
            recovered,
            unmapped,
            leaked,
            durations: Capped::new(durations, max_series),
            streaks,
            calls_to_recovery: Capped::new(calls_to_recovery, max_series),
            hammering,
        },
        overflow,
        ingest_spans,
        redactions,
    }
}
