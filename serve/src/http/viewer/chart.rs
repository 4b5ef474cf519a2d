//! Server-rendered SVG charts of [`Series`]: failure rate per stage, calls and failed calls,
//! call latency (p50, p95, p99). SVG presentation attributes only (the policy admits no
//! inline style); colours come from the stylesheet's classes. Every point carries its
//! figures as `data-` attributes and a `<title>` (a tooltip, and what a test reads).

use maud::{html, Markup};

use super::page::duration;
use super::series::{Buckets, Series, STAGES};

const W: f64 = 720.0;
const H: f64 = 170.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 10.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 22.0;

fn plot_w() -> f64 {
    W - LEFT - RIGHT
}

fn plot_h() -> f64 {
    H - TOP - BOTTOM
}

fn x(b: &Buckets, k: i64) -> f64 {
    LEFT + (k as f64 + 0.5) * plot_w() / b.count as f64
}

fn y(v: f64, max: f64) -> f64 {
    TOP + plot_h() * (1.0 - (v / max).clamp(0.0, 1.0))
}

fn f1(v: f64) -> String {
    format!("{v:.1}")
}

/// A time label for bucket `k`: the hour and minute (UTC), or the day for day buckets.
fn tick(b: &Buckets, k: i64) -> String {
    let t = b.start(k);
    if b.width_s >= 86_400 {
        t.format("%Y-%m-%d").to_string()
    } else if b.count as f64 * b.width_s as f64 > 86_400.0 {
        t.format("%m-%d %H:%M").to_string()
    } else {
        t.format("%H:%M").to_string()
    }
}

/// Axes: horizontal grid lines with `labels`, the time ticks under the plot.
fn axes(b: &Buckets, grid: &[(f64, String)]) -> Markup {
    let ticks: Vec<i64> = {
        let mut t = vec![0, b.count / 2, b.count - 1];
        t.dedup();
        t
    };
    html! {
        @for (v, label) in grid {
            line.grid x1=(f1(LEFT)) x2=(f1(W - RIGHT)) y1=(f1(*v)) y2=(f1(*v)) {}
            text.ylabel x=(f1(LEFT - 4.0)) y=(f1(v + 4.0)) text-anchor="end" { (label) }
        }
        @for k in ticks {
            text.xlabel x=(f1(x(b, k))) y=(f1(H - 6.0)) text-anchor="middle" { (tick(b, k)) }
        }
    }
}

/// The smallest of 1 %, 2 %, 5 %, 10 %, 25 %, 50 %, 100 % at or above `max`.
fn rate_scale(max: f64) -> f64 {
    [0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0]
        .into_iter()
        .find(|s| max <= *s)
        .unwrap_or(1.0)
}

/// A round number at or above `max` (1, 2 or 5 times a power of ten).
fn nice(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|v| *v >= max)
        .unwrap_or(10.0 * p)
}

/// Polylines through consecutive points (a bucket without data breaks the line).
fn lines(b: &Buckets, points: &[(i64, f64)], max: f64, class: &str) -> Markup {
    let mut runs: Vec<Vec<String>> = Vec::new();
    let mut last: Option<i64> = None;
    for (k, v) in points {
        if last != Some(k - 1) {
            runs.push(Vec::new());
        }
        if let Some(run) = runs.last_mut() {
            run.push(format!("{},{}", f1(x(b, *k)), f1(y(*v, max))));
        }
        last = Some(*k);
    }
    html! {
        @for run in runs.iter().filter(|r| r.len() > 1) {
            polyline class=(class) points=(run.join(" ")) {}
        }
    }
}

/// Failure rate per stage over time.
pub fn rates(b: &Buckets, s: &Series) -> Markup {
    let max = rate_scale(
        s.stages
            .values()
            .flat_map(|m| m.values().filter_map(|c| c.rate()))
            .fold(0.0, f64::max),
    );
    let pct = |v: f64| format!("{} %", (v * 1000.0).round() / 10.0);
    let grid = [0.0, max / 2.0, max].map(|v| (y(v, max), pct(v)));
    let stages: Vec<&str> = STAGES
        .into_iter()
        .filter(|st| s.stages.contains_key(*st))
        .collect();
    html! {
        figure.chart {
            svg.chart.rates viewBox=(format!("0 0 {W} {H}")) data-bucket-s=(b.width_s) role="img" aria-label="failure rate per stage over time" {
                (axes(b, &grid))
                @for st in &stages {
                    @let m = &s.stages[*st];
                    @let pts: Vec<(i64, f64)> = m.iter().filter_map(|(k, c)| c.rate().map(|r| (*k, r))).collect();
                    (lines(b, &pts, max, &format!("line s-{st}")))
                    @for (k, c) in m {
                        @if let Some(r) = c.rate() {
                            circle class=(format!("pt s-{st}")) cx=(f1(x(b, *k))) cy=(f1(y(r, max))) r="2.5"
                                data-stage=(st) data-bucket=(b.label(*k)) data-spans=(format!("{:.0}", c.spans))
                                data-failed=(format!("{:.0}", c.failed)) data-rate=(format!("{r:.6}")) {
                                title { (st) " " (b.label(*k)) ": " (format!("{:.0}", c.failed)) " of " (format!("{:.0}", c.spans)) " failed (" (pct(r)) ")" }
                            }
                        }
                    }
                }
            }
            figcaption.legend {
                @for st in &stages { span class=(format!("key s-{st}")) { (st) } }
                @if stages.is_empty() { span.muted { "no spans in this range" } }
            }
        }
    }
}

/// Calls and failed calls per bucket, as bars.
pub fn volume(b: &Buckets, s: &Series) -> Markup {
    let calls = s.stages.get("call");
    let max = nice(
        calls
            .map(|m| m.values().map(|c| c.spans).fold(0.0, f64::max))
            .unwrap_or(0.0),
    );
    let grid = [0.0, max / 2.0, max].map(|v| (y(v, max), format!("{v:.0}")));
    let bw = (plot_w() / b.count as f64 * 0.7).max(1.0);
    html! {
        figure.chart {
            svg.chart.volume viewBox=(format!("0 0 {W} {H}")) data-bucket-s=(b.width_s) role="img" aria-label="calls and failed calls over time" {
                (axes(b, &grid))
                @if let Some(m) = calls {
                    @for (k, c) in m {
                        g data-bucket=(b.label(*k)) data-calls=(format!("{:.0}", c.spans)) data-failed=(format!("{:.0}", c.failed)) {
                            title { (b.label(*k)) ": " (format!("{:.0}", c.spans)) " calls, " (format!("{:.0}", c.failed)) " failed" }
                            rect.calls x=(f1(x(b, *k) - bw / 2.0)) y=(f1(y(c.spans, max))) width=(f1(bw)) height=(f1(TOP + plot_h() - y(c.spans, max))) {}
                            rect.failed x=(f1(x(b, *k) - bw / 2.0)) y=(f1(y(c.failed, max))) width=(f1(bw)) height=(f1(TOP + plot_h() - y(c.failed, max))) {}
                        }
                    }
                }
            }
            figcaption.legend { span.key.calls { "calls" } span.key.failed { "failed calls" } }
        }
    }
}

/// Call latency p50, p95 and p99 per bucket.
pub fn latency(b: &Buckets, s: &Series) -> Markup {
    let max = nice(s.latency.values().map(|l| l.p99).fold(0.0, f64::max));
    let grid = [0.0, max / 2.0, max].map(|v| (y(v, max), duration(v)));
    type Pick = fn(&super::series::Latency) -> f64;
    let picks: [(&str, Pick); 3] = [("p50", |l| l.p50), ("p95", |l| l.p95), ("p99", |l| l.p99)];
    html! {
        figure.chart {
            svg.chart.latency viewBox=(format!("0 0 {W} {H}")) data-bucket-s=(b.width_s) role="img" aria-label="call latency over time" {
                (axes(b, &grid))
                @for (name, pick) in picks {
                    @let pts: Vec<(i64, f64)> = s.latency.iter().map(|(k, l)| (*k, pick(l))).collect();
                    (lines(b, &pts, max, &format!("line q-{name}")))
                    @for (k, l) in &s.latency {
                        circle class=(format!("pt q-{name}")) cx=(f1(x(b, *k))) cy=(f1(y(pick(l), max))) r="2"
                            data-quantile=(name) data-bucket=(b.label(*k)) data-ms=(format!("{:.3}", pick(l))) data-calls=(l.calls) {
                            title { (name) " " (b.label(*k)) ": " (duration(pick(l))) " over " (l.calls) " calls" }
                        }
                    }
                }
            }
            figcaption.legend { span.key.q-p50 { "p50" } span.key.q-p95 { "p95" } span.key.q-p99 { "p99" } }
        }
    }
}

/// The three charts with their headings and the bucket width.
pub fn all(b: &Buckets, s: &Series) -> Markup {
    html! {
        section.charts {
            p.muted { "Per " (duration(b.width_s as f64 * 1000.0)) " (UTC), spans weighted by their sampling weight." }
            div.chart-grid {
                div { h3 { "Failure rate per stage" } (rates(b, s)) }
                div { h3 { "Calls and failed calls" } (volume(b, s)) }
                div { h3 { "Call latency" } (latency(b, s)) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::series::{Counts, Latency};
    use super::*;
    use chrono::{DateTime, Utc};

    #[test]
    fn points_carry_their_figures_and_stay_in_the_plot() {
        let t = |s: &str| {
            DateTime::parse_from_rfc3339(s)
                .expect("time")
                .with_timezone(&Utc)
        };
        let b = Buckets::new(t("2025-06-01T11:00:00Z"), t("2025-06-01T12:00:00Z"));
        let mut s = Series::default();
        let parse = s.stages.entry("parse".into()).or_default();
        parse.insert(
            3,
            Counts {
                spans: 40.0,
                failed: 10.0,
            },
        );
        parse.insert(
            4,
            Counts {
                spans: 20.0,
                failed: 0.0,
            },
        );
        s.stages.entry("call".into()).or_default().insert(
            3,
            Counts {
                spans: 30.0,
                failed: 9.0,
            },
        );
        s.latency.insert(
            3,
            Latency {
                calls: 30,
                p50: 12.0,
                p95: 80.0,
                p99: 120.0,
            },
        );
        let html = all(&b, &s).into_string();
        assert!(html.contains("data-stage=\"parse\" data-bucket=\"2025-06-01T11:03:00Z\" data-spans=\"40\" data-failed=\"10\" data-rate=\"0.250000\""), "{html}");
        assert!(
            html.contains("data-calls=\"30\" data-failed=\"9\""),
            "{html}"
        );
        assert!(html.contains("data-quantile=\"p95\""), "{html}");
        assert!(!html.contains("NaN") && !html.contains("inf"), "{html}");
        assert!(!html.contains("style="), "no inline style");
    }
}
