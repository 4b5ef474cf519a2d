//! Before and after a deploy: one tool's calls made by two `service.version`s, side by side
//! (`toolspan compare` and `GET /api/v1/compare`).
//!
//! For each version: the failure rate of calls and of each stage, the failure rate per error
//! code, the share of failures no named case caught (unmapped: code `internal_error` or none,
//! the `calls` view's `unmapped`), the share of results
//! that leaked internals and the tokens those leaked results cost (estimated at 4 bytes per
//! token of the full result), and from [`crate::views::RECOVERIES_SQL`] the model's recovery
//! across turns: the share of failure streaks recovered, calls to recovery (median, p90) and
//! the share of streaks with hammering.
//!
//! Each metric carries its counts, the difference (after − before), a 95 % confidence
//! interval where one is defined, a p-value and a verdict. Rates use a two-proportion z-test
//! and Newcombe's score interval; tokens per call Welch's test; calls to recovery the
//! Mann–Whitney U test. One comparison tests many metrics, so the p-values are adjusted with
//! Holm's method: a difference is significant when its adjusted p-value is below 0.05, which
//! keeps the chance of calling any difference real when none is at 5 % for the whole report.

use std::collections::BTreeMap;
use std::future::Future;
use toolspan_schema::vocab::{Stage, FAILED_SQL, TOOL_STAGES_SQL};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use toolspan_schema::{Code, Envelope};

use crate::engine::QueryResult;
use crate::error::QueryError;
use crate::rows::{each_row, Row};
use crate::sql::{check_name, invalid, literal};
use crate::{Engine, QueryService};

/// Family-wise significance level of one comparison.
pub const ALPHA: f64 = 0.05;
/// Bytes of a result per token, for the leaked-token estimate (English text and code average
/// about 4 with the GPT and Claude tokenizers).
pub const BYTES_PER_TOKEN: f64 = 4.0;
/// Error codes compared one by one: the most frequent (the rest are in the overall rate).
const MAX_CODES: usize = 10;
/// The verdict of a per-code rate when one version maps none of its failures to a code.
const NOT_COMPARABLE: &str = "not comparable";

/// What to compare.
#[derive(Debug, Clone)]
pub struct CompareRequest {
    /// The tool.
    pub tool: String,
    /// `service.version` before the change.
    pub before: String,
    /// `service.version` after the change.
    pub after: String,
    /// Only calls made by this `service.name`.
    pub service: Option<String>,
    /// Calls that started at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Calls that started before this time.
    pub until: Option<DateTime<Utc>>,
}

/// Runs SQL: the engine itself (the CLI) or the shared service (HTTP, with its admission).
pub trait RunSql {
    /// Runs one read-only statement.
    fn run(&self, sql: &str) -> impl Future<Output = Result<QueryResult, QueryError>> + Send;
}

impl RunSql for Engine {
    fn run(&self, sql: &str) -> impl Future<Output = Result<QueryResult, QueryError>> + Send {
        self.query(sql)
    }
}

impl RunSql for QueryService {
    fn run(&self, sql: &str) -> impl Future<Output = Result<QueryResult, QueryError>> + Send {
        self.query(sql)
    }
}

/// A count out of a total.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Side {
    /// The metric's value (a share, a mean or a quantile).
    pub value: Option<f64>,
    /// What was counted (failures, recovered streaks, …); for means and quantiles, absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Out of how many (calls, failed calls, streaks, stage spans).
    pub of: u64,
}

/// One metric, before and after.
#[derive(Debug, Clone, Serialize)]
pub struct Metric {
    /// `failure_rate`, `stage_failure_rate`, `error_code_rate`, `unmapped_failure_share`,
    /// `leaked_result_share`, `leaked_tokens_per_call`, `recovery_rate`,
    /// `calls_to_recovery_median`, `calls_to_recovery_p90`, `hammering_share`.
    pub metric: &'static str,
    /// The stage or error code the metric is about, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Before the change.
    pub before: Side,
    /// After the change.
    pub after: Side,
    /// `after − before`.
    pub difference: Option<f64>,
    /// 95 % confidence interval of the difference, where one is computed.
    pub ci95: Option<[f64; 2]>,
    /// The test's p-value; `None` when there is too little data to test.
    pub p_value: Option<f64>,
    /// The p-value adjusted for the number of metrics tested (Holm).
    pub p_adjusted: Option<f64>,
    /// `lower` or `higher`: which direction is better.
    pub better: &'static str,
    /// `better`, `worse`, `no significant difference`, `not enough data`, or for a per-code
    /// rate `not comparable` (one version maps none of its failures to a code).
    pub verdict: &'static str,
    /// Not tested (p90 is reported with the median's test).
    #[serde(skip)]
    tested: bool,
}

/// The comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The tool.
    pub tool: String,
    /// The service, when one was given.
    pub service: Option<String>,
    /// The version before.
    pub before: String,
    /// The version after.
    pub after: String,
    /// The time range, RFC 3339, when given.
    pub since: Option<String>,
    /// Upper bound of the time range.
    pub until: Option<String>,
    /// Calls of the tool per version: `[before, after]`.
    pub calls: [u64; 2],
    /// Failure streaks (the `recoveries` view's rows) per version.
    pub failure_streaks: [u64; 2],
    /// Every metric.
    pub metrics: Vec<Metric>,
    /// Metric names (with their key) by verdict.
    pub summary: BTreeMap<&'static str, Vec<String>>,
    /// How to read this report.
    pub method: &'static str,
}

const METHOD: &str = "rates: two-proportion z-test with Newcombe's 95% score interval; \
tokens per call: Welch's test; calls to recovery: Mann-Whitney U test; p-values adjusted \
for the number of metrics with Holm's method, significant below 0.05";

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

impl CompareRequest {
    /// Checks the request; the WHERE clause of its tool, versions, service and time range, the
    /// range on `time` (`start_time` of `spans` and `calls`, `failed_at` of `recoveries`: a
    /// failure streak is in the range when its first failure is).
    fn filter(&self, time: &str) -> Result<String, Envelope> {
        self.filter_on("", time)
    }

    /// [`CompareRequest::filter`] on columns with the prefix `p` (`"c."`).
    fn filter_on(&self, p: &str, time: &str) -> Result<String, Envelope> {
        check_name("tool", &self.tool)?;
        check_name("before", &self.before)?;
        check_name("after", &self.after)?;
        if self.before == self.after {
            return Err(invalid(format!(
                "`before` and `after` are the same version ({:?}); give two versions",
                self.before
            )));
        }
        let mut f = vec![
            format!("{p}tool = {}", literal(&self.tool)),
            format!(
                "{p}service_version IN ({}, {})",
                literal(&self.before),
                literal(&self.after)
            ),
        ];
        if let Some(s) = &self.service {
            check_name("service", s)?;
            f.push(format!("{p}service = {}", literal(s)));
        }
        if let (Some(s), Some(u)) = (self.since, self.until) {
            if s >= u {
                return Err(invalid(format!(
                    "`since` ({}) must be before `until` ({})",
                    rfc3339(s),
                    rfc3339(u)
                )));
            }
        }
        if let Some(s) = self.since {
            f.push(format!("{p}date >= '{}'", s.format("%Y-%m-%d")));
            f.push(format!("{p}{time} >= TIMESTAMP '{}'", rfc3339(s)));
        }
        if let Some(u) = self.until {
            f.push(format!("{p}date <= '{}'", u.format("%Y-%m-%d")));
            f.push(format!("{p}{time} < TIMESTAMP '{}'", rfc3339(u)));
        }
        Ok(f.join(" AND "))
    }

    fn side(&self, version: &str) -> usize {
        usize::from(version == self.after)
    }
}

/// A count read from a row (absent, null or negative: 0).
fn count(r: &Row<'_>, name: &str) -> u64 {
    r.float(name).map_or(0, |v| v.max(0.0) as u64)
}

/// Per-version sums over the tool's calls.
#[derive(Default, Clone, Copy)]
struct CallSums {
    calls: u64,
    failed: u64,
    unmapped: u64,
    leaked: u64,
    /// Sum and sum of squares of estimated leaked tokens per call.
    tokens: f64,
    tokens_sq: f64,
}

/// The comparison's four statements, each reading one side of the change per row (its
/// `service_version`).
pub struct Statements {
    /// Calls: counts, unmapped failures, leaks and the tokens they cost.
    pub calls: String,
    /// Failed stage spans out of stage spans, per stage.
    pub stages: String,
    /// Error codes of failed calls.
    pub codes: String,
    /// Failure streaks and recovery (the `recoveries` view's rows).
    pub streaks: String,
}

/// The statements [`compare`] runs for `req` (also timed alone by bench/viewer).
pub fn statements(req: &CompareRequest) -> Result<Statements, Envelope> {
    let filter = req.filter("start_time")?;
    // The `calls` view's query for the two versions' calls of the tool only, with the tool's
    // attempts of the range (from an hour before its start), not every call's attempts in the
    // table.
    let on_calls = |p: &str| req.filter_on(p, "start_time").ok();
    let attempts =
        crate::views::attempts_of_tool(&req.tool, req.since, req.until.map(|u| u.date_naive()));
    let calls = crate::views::calls_query(&on_calls, Some(&attempts));
    Ok(Statements {
        calls: format!(
            "SELECT service_version,
                count(*) AS calls,
                sum(CASE WHEN {FAILED_SQL} THEN 1 ELSE 0 END) AS failed,
                sum(CASE WHEN unmapped THEN 1 ELSE 0 END) AS unmapped,
                sum(CASE WHEN leaked_internals THEN 1 ELSE 0 END) AS leaked,
                sum(CASE WHEN leaked_internals THEN CAST(coalesce(output_bytes, 0) AS DOUBLE) / {BYTES_PER_TOKEN} ELSE 0.0 END) AS tokens,
                sum(CASE WHEN leaked_internals THEN power(CAST(coalesce(output_bytes, 0) AS DOUBLE) / {BYTES_PER_TOKEN}, 2) ELSE 0.0 END) AS tokens_sq
         FROM ({calls}) c GROUP BY service_version"
        ),
        stages: format!(
            "SELECT service_version, stage, count(*) AS spans,
                sum(CASE WHEN {FAILED_SQL} THEN 1 ELSE 0 END) AS failed
         FROM spans WHERE {filter} AND stage IN ({TOOL_STAGES_SQL})
         GROUP BY service_version, stage"
        ),
        codes: format!(
            "SELECT service_version, error_code, count(*) AS n
         FROM spans WHERE stage = 'call' AND {filter} AND {FAILED_SQL} AND error_code IS NOT NULL
         GROUP BY service_version, error_code"
        ),
        streaks: format!(
            "SELECT service_version, recovered, calls_to_recovery, hammering
         FROM recoveries WHERE {}",
            req.filter("failed_at")?
        ),
    })
}

/// Compares the two versions' calls of the tool.
pub async fn compare(sql: &impl RunSql, req: &CompareRequest) -> Result<Comparison, Envelope> {
    let q = |e: QueryError| toolspan_schema::EnvelopeError::envelope(&e);
    let st = statements(req)?;
    // The four statements are independent: run at once, they share the machine's cores.
    let (calls_result, stages_result, codes_result, streaks_result) = tokio::join!(
        sql.run(&st.calls),
        sql.run(&st.stages),
        sql.run(&st.codes),
        sql.run(&st.streaks),
    );
    let result = calls_result.map_err(q)?;
    let mut sums = [CallSums::default(); 2];
    each_row(&result, |r| {
        let Some(v) = r.text("service_version") else {
            return;
        };
        let s = &mut sums[req.side(&v)];
        s.calls = count(r, "calls");
        s.failed = count(r, "failed");
        s.unmapped = count(r, "unmapped");
        s.leaked = count(r, "leaked");
        s.tokens = r.float("tokens").unwrap_or(0.0);
        s.tokens_sq = r.float("tokens_sq").unwrap_or(0.0);
    });
    for (i, v) in [&req.before, &req.after].into_iter().enumerate() {
        if sums[i].calls == 0 {
            let scope = req
                .service
                .as_deref()
                .map(|s| format!(" of service {s:?}"))
                .unwrap_or_default();
            let message = format!(
                "no calls of tool {:?} by service.version {v:?}{scope} in the range; \
                 `SELECT DISTINCT service, service_version FROM calls WHERE tool = …` lists them",
                req.tool
            );
            return Err(Envelope::new(Code::NotFound, message.clone(), message));
        }
    }

    let result = stages_result.map_err(q)?;
    let mut stages: BTreeMap<String, [(u64, u64); 2]> = BTreeMap::new();
    each_row(&result, |r| {
        if let (Some(v), Some(stage)) = (r.text("service_version"), r.text("stage")) {
            stages.entry(stage).or_default()[req.side(&v)] =
                (count(r, "failed"), count(r, "spans"));
        }
    });

    let result = codes_result.map_err(q)?;
    let mut codes: BTreeMap<String, [u64; 2]> = BTreeMap::new();
    each_row(&result, |r| {
        if let (Some(v), Some(code)) = (r.text("service_version"), r.text("error_code")) {
            codes.entry(code).or_default()[req.side(&v)] = count(r, "n");
        }
    });

    let result = streaks_result.map_err(q)?;
    let mut streaks = [0u64; 2];
    let mut recovered = [0u64; 2];
    let mut hammering = [0u64; 2];
    let mut to_recovery: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    each_row(&result, |r| {
        let Some(v) = r.text("service_version") else {
            return;
        };
        let i = req.side(&v);
        streaks[i] += 1;
        if r.boolean("recovered").unwrap_or(false) {
            recovered[i] += 1;
            if let Some(n) = r.float("calls_to_recovery") {
                to_recovery[i].push(n);
            }
        }
        if r.boolean("hammering").unwrap_or(false) {
            hammering[i] += 1;
        }
    });

    let mut metrics = Vec::new();
    let [b, a] = sums;
    metrics.push(rate(
        "failure_rate",
        None,
        (b.failed, b.calls),
        (a.failed, a.calls),
        "lower",
    ));
    for stage in Stage::WORK_NAMES {
        if let Some(&[(bf, bn), (af, an)]) = stages.get(stage) {
            metrics.push(rate(
                "stage_failure_rate",
                Some(stage.to_string()),
                (bf, bn),
                (af, an),
                "lower",
            ));
        }
    }
    let mut by_count: Vec<(&String, &[u64; 2])> = codes.iter().collect();
    by_count.sort_by(|x, y| (y.1[0] + y.1[1]).cmp(&(x.1[0] + x.1[1])).then(x.0.cmp(y.0)));
    // Codes compare only when both versions map their failures to codes: a version that
    // maps none (all unmapped) has no rate per code to compare, only a share of unmapped.
    let comparable = b.failed > b.unmapped && a.failed > a.unmapped;
    for (code, n) in by_count.into_iter().take(MAX_CODES) {
        let mut m = rate(
            "error_code_rate",
            Some(code.clone()),
            (n[0], b.calls),
            (n[1], a.calls),
            "lower",
        );
        if !comparable {
            m.tested = false;
            m.p_value = None;
            m.verdict = NOT_COMPARABLE;
        }
        metrics.push(m);
    }
    metrics.push(rate(
        "unmapped_failure_share",
        None,
        (b.unmapped, b.failed),
        (a.unmapped, a.failed),
        "lower",
    ));
    metrics.push(rate(
        "leaked_result_share",
        None,
        (b.leaked, b.calls),
        (a.leaked, a.calls),
        "lower",
    ));
    metrics.push(mean_metric(
        "leaked_tokens_per_call",
        (b.tokens, b.tokens_sq, b.calls),
        (a.tokens, a.tokens_sq, a.calls),
    ));
    metrics.push(rate(
        "recovery_rate",
        None,
        (recovered[0], streaks[0]),
        (recovered[1], streaks[1]),
        "higher",
    ));
    let [mut rb, mut ra] = to_recovery;
    rb.sort_by(f64::total_cmp);
    ra.sort_by(f64::total_cmp);
    let p = mann_whitney(&rb, &ra);
    for (name, q) in [
        ("calls_to_recovery_median", 0.5),
        ("calls_to_recovery_p90", 0.9),
    ] {
        let (vb, va) = (quantile(&rb, q), quantile(&ra, q));
        metrics.push(Metric {
            metric: name,
            key: None,
            before: Side {
                value: vb,
                count: None,
                of: rb.len() as u64,
            },
            after: Side {
                value: va,
                count: None,
                of: ra.len() as u64,
            },
            difference: vb.zip(va).map(|(b, a)| a - b),
            ci95: None,
            p_value: p,
            p_adjusted: None,
            better: "lower",
            verdict: "",
            tested: name == "calls_to_recovery_median",
        });
    }
    metrics.push(rate(
        "hammering_share",
        None,
        (hammering[0], streaks[0]),
        (hammering[1], streaks[1]),
        "lower",
    ));
    holm(&mut metrics);

    let mut summary: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for m in &metrics {
        let name = match &m.key {
            Some(k) => format!("{}[{k}]", m.metric),
            None => m.metric.to_string(),
        };
        summary.entry(m.verdict).or_default().push(name);
    }
    Ok(Comparison {
        tool: req.tool.clone(),
        service: req.service.clone(),
        before: req.before.clone(),
        after: req.after.clone(),
        since: req.since.map(rfc3339),
        until: req.until.map(rfc3339),
        calls: [b.calls, a.calls],
        failure_streaks: streaks,
        metrics,
        summary,
        method: METHOD,
    })
}

/// The standard normal's two-sided p-value for `z`.
fn two_sided(z: f64) -> f64 {
    libm::erfc(z.abs() / std::f64::consts::SQRT_2).clamp(0.0, 1.0)
}

/// Wilson's 95 % score interval of `x` out of `n`.
fn wilson(x: u64, n: u64) -> (f64, f64) {
    let z = 1.959_963_984_540_054_f64;
    let (x, n) = (x as f64, n as f64);
    let p = x / n;
    let denom = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / denom;
    let half = z * ((p * (1.0 - p) + z * z / (4.0 * n)) / n).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// A rate: `x` out of `n` before and after; two-proportion z-test (pooled) and Newcombe's
/// hybrid score interval for the difference.
fn rate(
    metric: &'static str,
    key: Option<String>,
    (xb, nb): (u64, u64),
    (xa, na): (u64, u64),
    better: &'static str,
) -> Metric {
    let side = |x: u64, n: u64| Side {
        value: (n > 0).then(|| x as f64 / n as f64),
        count: Some(x),
        of: n,
    };
    let (before, after) = (side(xb, nb), side(xa, na));
    let (mut difference, mut ci95, mut p_value) = (None, None, None);
    if nb > 0 && na > 0 {
        let (pb, pa) = (xb as f64 / nb as f64, xa as f64 / na as f64);
        let d = pa - pb;
        difference = Some(d);
        let (lb, ub) = wilson(xb, nb);
        let (la, ua) = wilson(xa, na);
        ci95 = Some([
            d - ((pa - la).powi(2) + (ub - pb).powi(2)).sqrt(),
            d + ((ua - pa).powi(2) + (pb - lb).powi(2)).sqrt(),
        ]);
        let pooled = (xb + xa) as f64 / (nb + na) as f64;
        let se = (pooled * (1.0 - pooled) * (1.0 / nb as f64 + 1.0 / na as f64)).sqrt();
        p_value = Some(if se > 0.0 { two_sided(d / se) } else { 1.0 });
    }
    Metric {
        metric,
        key,
        before,
        after,
        difference,
        ci95,
        p_value,
        p_adjusted: None,
        better,
        verdict: "",
        tested: true,
    }
}

/// A mean per call from its sum and sum of squares; Welch's test (normal approximation).
fn mean_metric(metric: &'static str, b: (f64, f64, u64), a: (f64, f64, u64)) -> Metric {
    let stats = |(sum, sq, n): (f64, f64, u64)| {
        let n_f = n as f64;
        let mean = sum / n_f;
        let var = if n > 1 {
            ((sq - n_f * mean * mean) / (n_f - 1.0)).max(0.0)
        } else {
            0.0
        };
        (mean, var, n_f)
    };
    let (mb, vb, nb) = stats(b);
    let (ma, va, na) = stats(a);
    let d = ma - mb;
    let se = (vb / nb + va / na).sqrt();
    let (ci95, p_value) = if se > 0.0 {
        (
            Some([
                d - 1.959_963_984_540_054 * se,
                d + 1.959_963_984_540_054 * se,
            ]),
            Some(two_sided(d / se)),
        )
    } else {
        (Some([d, d]), Some(if d == 0.0 { 1.0 } else { 0.0 }))
    };
    Metric {
        metric,
        key: None,
        before: Side {
            value: Some(mb),
            count: None,
            of: b.2,
        },
        after: Side {
            value: Some(ma),
            count: None,
            of: a.2,
        },
        difference: Some(d),
        ci95,
        p_value,
        p_adjusted: None,
        better: "lower",
        verdict: "",
        tested: true,
    }
}

/// The `q` quantile of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// The Mann–Whitney U test's two-sided p-value (normal approximation with the tie correction
/// and a continuity correction); `None` when a side is empty.
fn mann_whitney(b: &[f64], a: &[f64]) -> Option<f64> {
    if b.is_empty() || a.is_empty() {
        return None;
    }
    let mut all: Vec<(f64, bool)> = b
        .iter()
        .map(|&v| (v, false))
        .chain(a.iter().map(|&v| (v, true)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len() as f64;
    let (mut rank_b, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let avg = (i + 1 + j) as f64 / 2.0;
        let t = (j - i) as f64;
        ties += t * t * t - t;
        rank_b += avg * all[i..j].iter().filter(|x| !x.1).count() as f64;
        i = j;
    }
    let (n1, n2) = (b.len() as f64, a.len() as f64);
    let u = rank_b - n1 * (n1 + 1.0) / 2.0;
    let mu = n1 * n2 / 2.0;
    let sigma = (n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)))).sqrt();
    if sigma.is_nan() || sigma <= 0.0 {
        return Some(1.0);
    }
    let z = ((u - mu).abs() - 0.5).max(0.0) / sigma;
    Some(two_sided(z))
}

/// Holm's step-down adjustment over the tested metrics, then each metric's verdict.
fn holm(metrics: &mut [Metric]) {
    let mut order: Vec<usize> = (0..metrics.len())
        .filter(|&i| metrics[i].tested && metrics[i].p_value.is_some())
        .collect();
    order.sort_by(|&x, &y| {
        metrics[x]
            .p_value
            .unwrap_or(1.0)
            .total_cmp(&metrics[y].p_value.unwrap_or(1.0))
    });
    let m = order.len();
    let mut running: f64 = 0.0;
    for (k, &i) in order.iter().enumerate() {
        let p = metrics[i].p_value.unwrap_or(1.0);
        running = running.max(((m - k) as f64 * p).min(1.0));
        metrics[i].p_adjusted = Some(running);
    }
    // The p90 shares the median's test.
    let median = metrics
        .iter()
        .find(|m| m.metric == "calls_to_recovery_median")
        .and_then(|m| m.p_adjusted);
    for m in metrics.iter_mut() {
        if m.metric == "calls_to_recovery_p90" {
            m.p_adjusted = median;
        }
        if m.verdict == NOT_COMPARABLE {
            continue;
        }
        m.verdict = match (m.p_adjusted, m.difference) {
            (Some(p), Some(d)) if p < ALPHA && d != 0.0 => {
                if (d < 0.0) == (m.better == "lower") {
                    "better"
                } else {
                    "worse"
                }
            }
            (Some(_), Some(_)) => "no significant difference",
            _ => "not enough data",
        };
    }
}

/// The comparison as a text table for a terminal.
pub fn render_text(c: &Comparison) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let scope = c
        .service
        .as_deref()
        .map(|s| format!(" in {s}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "tool {}{scope}: {} (before, {} calls, {} failure streaks) vs {} (after, {} calls, {} failure streaks)",
        c.tool, c.before, c.calls[0], c.failure_streaks[0], c.after, c.calls[1], c.failure_streaks[1]
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<34} {:>18} {:>18} {:>10} {:>22} {:>9}  verdict",
        "metric", "before", "after", "diff", "95% CI", "p (Holm)"
    );
    let fmt_side = |s: &Side, pct: bool| -> String {
        match (s.value, s.count) {
            (None, _) => "-".to_string(),
            (Some(v), Some(x)) if pct => format!("{:.1}% ({x}/{})", v * 100.0, s.of),
            (Some(v), _) => format!("{v:.2} (n={})", s.of),
        }
    };
    for m in &c.metrics {
        let pct = m.before.count.is_some();
        let name = match &m.key {
            Some(k) => format!("{}[{k}]", m.metric),
            None => m.metric.to_string(),
        };
        let scale = if pct { 100.0 } else { 1.0 };
        let unit = if pct { " pt" } else { "" };
        let diff = m
            .difference
            .map(|d| format!("{:+.1}{unit}", d * scale))
            .unwrap_or_else(|| "-".into());
        let ci = m
            .ci95
            .map(|[l, h]| format!("[{:+.1}, {:+.1}]", l * scale, h * scale))
            .unwrap_or_else(|| "-".into());
        let p = m
            .p_adjusted
            .map(|p| {
                if p < 0.001 {
                    "<0.001".to_string()
                } else {
                    format!("{p:.3}")
                }
            })
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{name:<34} {:>18} {:>18} {diff:>10} {ci:>22} {p:>9}  {}",
            fmt_side(&m.before, pct),
            fmt_side(&m.after, pct),
            m.verdict
        );
    }
    let _ = writeln!(out);
    for (verdict, names) in &c.summary {
        let _ = writeln!(out, "{verdict}: {}", names.join(", "));
    }
    let _ = writeln!(out, "({})", c.method);
    out
}

#[cfg(test)]
mod tests;
