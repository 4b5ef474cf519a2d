//! Failure datasets: a tool's failed calls exported as eval cases (`toolspan evals export`,
//! `GET /api/v1/evals/export`, the viewer's "Export as eval cases"), JSON Lines of schema
//! `toolspan.evals/1` that the Python SDK runs (`python -m toolspan evals run`).
//!
//! Failures are grouped by **fingerprint**: tool, the stage that failed, error type, error
//! code and the shape of the arguments (their key paths and JSON types, values ignored:
//! [`toolspan_schema::shape`]). Groups come most common first (ties by fingerprint id); each
//! gives a few cases, exact arguments first, then the newest. A case is a replay document's
//! fields ([`crate::replay::document::Replayable`]) plus its name, its fingerprint, what a fixed
//! tool must do (`expect`) and the model turn before the call (`context`).
//!
//! Every read is pinned to one table version, and the file holds nothing else that changes:
//! no clock time (a relative `since` counts back from the newest call of the tool at that
//! version, not from now), every order total. Exported twice at one version, the bytes are
//! the same.

use std::collections::{BTreeMap, HashMap};
use toolspan_schema::vocab::{Stage, FAILED_SQL};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use toolspan_schema::{shape, Code, Envelope, ErrorType};

use crate::engine::Engine;
use crate::replay::document::{Context, Replayable, Stored, Trace, REDACTION_MARKER};
use crate::replay::load_traces;
use crate::replay::pinned::Pinned;
use crate::rows::{Cols, Span};
use crate::sql::{check_name, invalid, literal};

/// The schema name of an evals file.
pub const EVALS_SCHEMA: &str = "toolspan.evals/1";
/// Cases per fingerprint unless asked otherwise.
pub const DEFAULT_PER_FINGERPRINT: usize = 3;
/// Cases per fingerprint at most.
pub const MAX_PER_FINGERPRINT: usize = 100;
/// Fingerprints exported at most (the most common); the header counts them all.
pub const MAX_FINGERPRINTS: usize = 200;

/// What to export.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportRequest {
    /// The tool (required).
    pub tool: String,
    /// Only failures of this error type (any case: `parse`, `PARSE`).
    pub error_type: Option<String>,
    /// Only failures with this error code.
    pub code: Option<String>,
    /// Only calls that started at or after: a duration (`7d`: before the newest call of the
    /// tool at the version read), an RFC 3339 time or a UTC day.
    pub since: Option<String>,
    /// Cases per fingerprint.
    pub per_fingerprint: usize,
    /// The table version to read (the latest when `None`).
    pub version: Option<u64>,
}

impl ExportRequest {
    /// A request for every failure of `tool`, three cases per fingerprint, latest version.
    pub fn new(tool: impl Into<String>) -> ExportRequest {
        ExportRequest {
            tool: tool.into(),
            error_type: None,
            code: None,
            since: None,
            per_fingerprint: DEFAULT_PER_FINGERPRINT,
            version: None,
        }
    }
}

/// An exported file.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// The table version read.
    pub version: u64,
    /// Fingerprints in the file.
    pub fingerprints: usize,
    /// Cases in the file.
    pub cases: usize,
    /// The file: the header line, then one case per line, each line ending in `\n`.
    pub text: String,
}

/// One failed call, as grouping sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// Its trace.
    pub trace_id: String,
    /// Its call span.
    pub span_id: String,
    /// Its start, nanoseconds since the epoch.
    pub start: i64,
    /// The tool stage that failed last.
    pub stage: Option<String>,
    /// The call's error type.
    pub error_type: Option<String>,
    /// The call's error code.
    pub error_code: Option<String>,
    /// The arguments' shape ([`shape::of_text`]; `empty` when not recorded).
    pub shape: String,
    /// The stored arguments are exact (whole, nothing redacted).
    pub exact: bool,
}

/// A kind of failure and how many calls failed so.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Fingerprint {
    /// [`fingerprint_id`].
    pub id: String,
    /// The tool.
    pub tool: String,
    /// The stage that failed.
    pub stage: Option<String>,
    /// The error type.
    pub error_type: Option<String>,
    /// The error code.
    pub error_code: Option<String>,
    /// The arguments' shape.
    pub arguments_shape: String,
    /// Failed calls of this kind.
    pub failures: u64,
}

/// 16 hex digits of FNV-1a (64 bit) over the fields joined by `\x1f` (absent fields empty):
/// stable across processes and versions.
pub fn fingerprint_id(
    tool: &str,
    stage: Option<&str>,
    error_type: Option<&str>,
    code: Option<&str>,
    arguments_shape: &str,
) -> String {
    let joined = [
        tool,
        stage.unwrap_or(""),
        error_type.unwrap_or(""),
        code.unwrap_or(""),
        arguments_shape,
    ]
    .join("\x1f");
    format!("{:016x}", shape::fnv1a(joined.as_bytes()))
}

/// Groups failures by fingerprint, the most common first (ties by id), each with at most
/// `per` chosen cases: exact arguments first, then the newest (ties by trace and span id).
pub fn group(tool: &str, failures: Vec<Failure>, per: usize) -> Vec<(Fingerprint, Vec<Failure>)> {
    let mut groups: BTreeMap<String, (Fingerprint, Vec<Failure>)> = BTreeMap::new();
    for f in failures {
        let id = fingerprint_id(
            tool,
            f.stage.as_deref(),
            f.error_type.as_deref(),
            f.error_code.as_deref(),
            &f.shape,
        );
        let entry = groups.entry(id.clone()).or_insert_with(|| {
            (
                Fingerprint {
                    id,
                    tool: tool.to_string(),
                    stage: f.stage.clone(),
                    error_type: f.error_type.clone(),
                    error_code: f.error_code.clone(),
                    arguments_shape: f.shape.clone(),
                    failures: 0,
                },
                Vec::new(),
            )
        });
        entry.0.failures += 1;
        entry.1.push(f);
    }
    let mut out: Vec<(Fingerprint, Vec<Failure>)> = groups.into_values().collect();
    out.sort_by(|a, b| b.0.failures.cmp(&a.0.failures).then(a.0.id.cmp(&b.0.id)));
    for (_, cases) in &mut out {
        cases.sort_by(|a, b| {
            b.exact
                .cmp(&a.exact)
                .then(b.start.cmp(&a.start))
                .then(a.trace_id.cmp(&b.trace_id))
                .then(a.span_id.cmp(&b.span_id))
        });
        cases.truncate(per);
    }
    out
}

/// The failure a fixed tool must no longer show, and what it must answer instead.
#[derive(Debug, Serialize)]
struct Expect {
    not: NotAgain,
    envelope_on_failure: bool,
    leaked_internals: bool,
}

#[derive(Debug, Serialize)]
struct NotAgain {
    stage: Option<String>,
    error_type: Option<String>,
    error_code: Option<String>,
}

#[derive(Debug, Serialize)]
struct Filters<'a> {
    error_type: Option<&'a str>,
    code: Option<&'a str>,
    since: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct Header<'a> {
    schema: &'static str,
    table_version: u64,
    tool: &'a str,
    filters: Filters<'a>,
    per_fingerprint: usize,
    exported_at_version: u64,
    fingerprints: usize,
    cases: usize,
}

#[derive(Debug, Serialize)]
struct Case<'a> {
    case: String,
    fingerprint: &'a Fingerprint,
    #[serde(flatten)]
    replay: &'a Replayable,
    expect: Expect,
    context: Context,
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

fn line(v: &impl Serialize) -> Result<String, Envelope> {
    serde_json::to_string(v)
        .map_err(|e| Envelope::new(Code::Internal, "cannot render the evals file", e))
}

fn q(e: crate::error::QueryError) -> Envelope {
    toolspan_schema::EnvelopeError::envelope(&e)
}

/// Exports the failures `req` selects as an evals file.
pub async fn export(engine: &Engine, req: &ExportRequest) -> Result<Export, Envelope> {
    check_name("tool", &req.tool)?;
    let error_type = match req.error_type.as_deref() {
        None => None,
        Some(e) => Some(ErrorType::parse(e.trim()).ok_or_else(|| {
            invalid(format!(
                "unknown error type {:?}: use one of {}",
                e.chars().take(40).collect::<String>(),
                ErrorType::ALL.map(ErrorType::as_str).join(", ")
            ))
        })?),
    };
    if let Some(c) = &req.code {
        check_name("code", c)?;
    }
    if !(1..=MAX_PER_FINGERPRINT).contains(&req.per_fingerprint) {
        return Err(invalid(format!(
            "`per-fingerprint` must be from 1 to {MAX_PER_FINGERPRINT}, got {}",
            req.per_fingerprint
        )));
    }
    let pinned = Pinned::open(engine, req.version).await?;
    let v = pinned.version();
    let tool = literal(&req.tool);

    // A relative `since` counts back from the newest call at this version, not from now.
    let newest = pinned
        .query(&format!(
            "SELECT max(start_time_unix_nano) AS newest FROM spans \
             WHERE tool = {tool} AND stage = 'call'"
        ))
        .await?;
    let newest = newest
        .iter()
        .find(|b| b.num_rows() > 0)
        .map(|b| Cols::new(b).int("newest").map(|c| c.i64(0)))
        .transpose()
        .map_err(q)?
        .flatten();
    let Some(newest) = newest else {
        let message = format!(
            "no call of tool {:?} at table version {v}: check its spelling (the tools are \
             `SELECT DISTINCT tool FROM calls`)",
            req.tool.chars().take(80).collect::<String>()
        );
        return Err(Envelope::new(Code::NotFound, message.clone(), message));
    };
    let mut filter = vec![format!("tool = {tool}")];
    if let Some(s) = req.since.as_deref() {
        let at = DateTime::from_timestamp_nanos(newest);
        let since = crate::sql::parse_time("since", s, at)?;
        filter.push(format!("date >= '{}'", since.format("%Y-%m-%d")));
        filter.push(format!("start_time >= TIMESTAMP '{}'", rfc3339(since)));
    }
    let mut call_filter = filter.clone();
    call_filter.push("stage = 'call'".into());
    call_filter.push(FAILED_SQL.into());
    if let Some(e) = error_type {
        call_filter.push(format!("error_type = '{}'", e.as_str()));
    }
    if let Some(c) = &req.code {
        call_filter.push(format!("error_code = {}", literal(c)));
    }
    let calls = pinned
        .query(&format!(
            "SELECT trace_id, span_id, parent_span_id, call_id, start_time_unix_nano, \
             error_type, error_code, input, \
             (input_sha256 = encode(sha256(input), 'hex')) AS input_whole, \
             NULL AS output_whole, 'call' AS stage, 'error' AS status FROM spans WHERE {}",
            call_filter.join(" AND ")
        ))
        .await?;
    let calls = crate::replay::stored(&calls)?;
    // The failed attempts and stages of the same calls: where each failed.
    let mut stage_filter = filter;
    stage_filter.push(FAILED_SQL.into());
    stage_filter.push(format!(
        "stage IN ('attempt', {})",
        Stage::WORK_NAMES.map(|s| format!("'{s}'")).join(", ")
    ));
    let stages = pinned
        .query(&format!(
            "SELECT trace_id, span_id, parent_span_id, call_id, attempt, stage, status, \
             start_time_unix_nano, NULL AS input_whole, NULL AS output_whole FROM spans WHERE {}",
            stage_filter.join(" AND ")
        ))
        .await?;
    let stages = crate::replay::stored(&stages)?;

    let mut by_trace: HashMap<&str, Vec<Stored>> = HashMap::new();
    for s in stages.iter().chain(calls.iter()) {
        by_trace
            .entry(s.span.trace_id.as_str())
            .or_default()
            .push(s.clone());
    }
    let failures: Vec<Failure> = calls
        .iter()
        .map(|c| {
            let spans = by_trace
                .get(c.span.trace_id.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            let stage = Trace::new(spans)
                .failed_stage(&c.span)
                .map(|s| s.span.stage.clone());
            failure(c, stage)
        })
        .collect();
    let total_fingerprints;
    let groups = {
        let mut g = group(&req.tool, failures, req.per_fingerprint);
        total_fingerprints = g.len();
        g.truncate(MAX_FINGERPRINTS);
        g
    };
    if total_fingerprints > MAX_FINGERPRINTS {
        tracing::info!(
            fingerprints = total_fingerprints,
            kept = MAX_FINGERPRINTS,
            "evals export keeps the most common fingerprints"
        );
    }

    // The chosen cases, whole: every span of their traces.
    let mut trace_ids: Vec<String> = groups
        .iter()
        .flat_map(|(_, cases)| cases.iter().map(|c| c.trace_id.clone()))
        .collect();
    trace_ids.sort();
    trace_ids.dedup();
    let traces = load_traces(&pinned, &trace_ids).await?;
    let mut lines = Vec::new();
    let mut cases = 0;
    for (fp, chosen) in &groups {
        for (n, f) in chosen.iter().enumerate() {
            let spans = traces
                .get(&f.trace_id)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let trace = Trace::new(spans);
            let Some(call) = trace.find(&f.span_id) else {
                continue; // the trace was cut before its call (a huge trace)
            };
            let replay = trace.replayable(call);
            let case = Case {
                case: format!(
                    "{}/{}/{}/{}",
                    req.tool,
                    fp.error_type.as_deref().unwrap_or("ERROR"),
                    fp.id,
                    n + 1
                ),
                fingerprint: fp,
                expect: Expect {
                    not: NotAgain {
                        stage: fp.stage.clone(),
                        error_type: fp.error_type.clone(),
                        error_code: fp.error_code.clone(),
                    },
                    envelope_on_failure: true,
                    leaked_internals: false,
                },
                context: trace.context(&call.span),
                replay: &replay,
            };
            lines.push(line(&case)?);
            cases += 1;
        }
    }
    let header = Header {
        schema: EVALS_SCHEMA,
        table_version: v,
        tool: &req.tool,
        filters: Filters {
            error_type: error_type.map(ErrorType::as_str),
            code: req.code.as_deref(),
            since: req.since.as_deref(),
        },
        per_fingerprint: req.per_fingerprint,
        exported_at_version: v,
        fingerprints: groups.len(),
        cases,
    };
    let mut text = line(&header)?;
    text.push('\n');
    for l in lines {
        text.push_str(&l);
        text.push('\n');
    }
    Ok(Export {
        version: v,
        fingerprints: groups.len(),
        cases,
        text,
    })
}

/// A failure from its call row and the stage that failed.
fn failure(c: &Stored, stage: Option<String>) -> Failure {
    let s: &Span = &c.span;
    let text = s.input.as_deref();
    Failure {
        trace_id: s.trace_id.clone(),
        span_id: s.span_id.clone(),
        start: s.start_unix_nano,
        stage,
        error_type: s.error_type.clone(),
        error_code: s.error_code.clone(),
        shape: shape::of_text(text.unwrap_or("")),
        exact: c.input_whole == Some(true) && text.is_some_and(|t| !t.contains(REDACTION_MARKER)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(span: &str, start: i64, code: &str, args: &str, exact: bool) -> Failure {
        Failure {
            trace_id: format!("t{span}"),
            span_id: span.into(),
            start,
            stage: Some("parse".into()),
            error_type: Some("PARSE".into()),
            error_code: Some(code.into()),
            shape: shape::of_text(args),
            exact,
        }
    }

    #[test]
    fn the_id_is_the_sdks() {
        // sdk/python/tests/replaydocs.py computes the same id the same way.
        let shape = r#"{"query":"string"}"#;
        let id = fingerprint_id(
            "search_docs",
            Some("parse"),
            Some("PARSE"),
            Some("bad_answer"),
            shape,
        );
        let joined = format!("search_docs\x1fparse\x1fPARSE\x1fbad_answer\x1f{shape}");
        assert_eq!(id, format!("{:016x}", shape::fnv1a(joined.as_bytes())));
        assert_eq!(id.len(), 16);
        assert_ne!(
            id,
            fingerprint_id("search_docs", Some("parse"), Some("PARSE"), None, shape)
        );
    }

    #[test]
    fn failures_group_by_kind_and_argument_shape_not_values() {
        let failures = vec![
            f("a", 1, "bad_answer", r#"{"query": "reset"}"#, true),
            f("b", 2, "bad_answer", r#"{"query": "rotate keys"}"#, false),
            f("c", 3, "bad_answer", r#"{"query": "x", "limit": 3}"#, true),
            f("d", 4, "bad_answer", r#"{"query": "billing"}"#, true),
            f("e", 5, "empty_answer", r#"{"query": "y"}"#, true),
            f("g", 6, "bad_answer", r#"{"query": "z"}"#, true),
        ];
        let groups = group("search_docs", failures, 2);
        let counts: Vec<(u64, Option<&str>, &str)> = groups
            .iter()
            .map(|(fp, _)| {
                (
                    fp.failures,
                    fp.error_code.as_deref(),
                    fp.arguments_shape.as_str(),
                )
            })
            .collect();
        assert_eq!(counts[0], (4, Some("bad_answer"), r#"{"query":"string"}"#));
        assert_eq!(counts.len(), 3, "{counts:?}");
        assert_eq!(counts[1].0 + counts[2].0, 2);
        // Two cases of the biggest group: exact ones first, the newest of those first.
        let chosen: Vec<&str> = groups[0].1.iter().map(|c| c.span_id.as_str()).collect();
        assert_eq!(chosen, ["g", "d"]);
        // The same failures in another order group the same.
        let again = group(
            "search_docs",
            vec![
                f("g", 6, "bad_answer", r#"{"query": "z"}"#, true),
                f("e", 5, "empty_answer", r#"{"query": "y"}"#, true),
                f("d", 4, "bad_answer", r#"{"query": "billing"}"#, true),
                f("c", 3, "bad_answer", r#"{"query": "x", "limit": 3}"#, true),
                f("b", 2, "bad_answer", r#"{"query": "rotate keys"}"#, false),
                f("a", 1, "bad_answer", r#"{"query": "reset"}"#, true),
            ],
            2,
        );
        assert_eq!(again, groups);
    }

    #[test]
    fn an_inexact_case_is_chosen_only_when_no_exact_one_is_left() {
        let groups = group(
            "t",
            vec![
                f("new", 9, "c", r#"{"a": 1}"#, false),
                f("old", 1, "c", r#"{"a": 2}"#, true),
            ],
            1,
        );
        assert_eq!(groups[0].1[0].span_id, "old");
        assert_eq!(groups[0].0.failures, 2);
    }
}
