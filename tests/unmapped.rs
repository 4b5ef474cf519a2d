//! One definition of an unmapped failure (no named case caught it: error code
//! `internal_error` or none): `/metrics`, the `calls` and `recoveries` views and
//! `toolspan compare` count the same failures on the same data.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kafka_support::reqwest::blocking_get;
use crate::support::{bin, free_port, sql_count, sql_json, Server};

/// Unmapped failed calls of support-bot per (tool, version) in a `/metrics` text.
fn unmapped_in_metrics(text: &str) -> BTreeMap<(String, String), u64> {
    let label = |l: &str, k: &str| -> String {
        let at = l.find(&format!("{k}=\"")).map(|i| i + k.len() + 2);
        at.and_then(|i| l[i..].split('"').next())
            .unwrap_or_default()
            .to_string()
    };
    let mut m = BTreeMap::new();
    for l in text.lines().filter(|l| {
        l.starts_with("toolspan_unmapped_failures_total{")
            && l.contains("stage=\"call\"")
            && l.contains("service=\"support-bot\"")
    }) {
        let n: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if n == 0.0 {
            // A series the exporter touched before its first failure.
            continue;
        }
        *m.entry((label(l, "tool"), label(l, "service_version")))
            .or_default() += n as u64;
    }
    m
}

#[test]
fn metrics_views_and_compare_count_the_same_unmapped_failures() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let server = Server::start_with(
        dir.path(),
        &[
            "--metrics-addr",
            &format!("127.0.0.1:{metrics}"),
            "--flush-ms",
            "50",
        ],
    );
    let manifest = dir.path().join("manifest.txt");
    let out = Command::new(bin())
        .args([
            "produce",
            "--spans",
            "2500",
            "--payloads",
            "--failure-scale",
            "3",
        ])
        .arg("--manifest")
        .arg(&manifest)
        .args(["--endpoint", &server.url(), "--log", "warn"])
        .output()
        .expect("run toolspan produce");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = std::fs::read_to_string(&manifest)
        .expect("manifest")
        .lines()
        .filter(|l| l.len() == 16 && l.chars().all(|c| c.is_ascii_hexdigit()))
        .count() as i64;
    let deadline = Instant::now() + Duration::from_secs(90);
    while sql_count(dir.path(), "SELECT count(*) FROM spans") < sent {
        assert!(
            Instant::now() < deadline,
            "the table never held the {sent} spans sent"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    let mut in_calls = BTreeMap::new();
    for r in sql_json(
        dir.path(),
        "SELECT tool, service_version, count(*) AS n FROM calls \
         WHERE unmapped AND service = 'support-bot' GROUP BY 1, 2",
    ) {
        in_calls.insert(
            (
                r["tool"].as_str().unwrap().to_string(),
                r["service_version"].as_str().unwrap().to_string(),
            ),
            r["n"].as_u64().unwrap(),
        );
    }
    // The counters follow the commit closely; give them a moment.
    let deadline = Instant::now() + Duration::from_secs(20);
    let scraped = loop {
        let scraped = unmapped_in_metrics(&blocking_get(&format!(
            "http://127.0.0.1:{metrics}/metrics"
        )));
        if scraped == in_calls || Instant::now() > deadline {
            break scraped;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(scraped, in_calls, "/metrics and the calls view");
    assert!(
        sql_count(
            dir.path(),
            "SELECT count(*) FROM calls WHERE unmapped AND error_code = 'internal_error'"
        ) > 0,
        "the traffic has failures the SDK answered with internal_error"
    );

    // Each failure streak is unmapped exactly when its first failed call is.
    assert_eq!(
        sql_count(
            dir.path(),
            "SELECT count(*) FROM recoveries r JOIN calls c \
             ON r.trace_id = c.trace_id AND r.span_id = c.span_id WHERE r.unmapped <> c.unmapped"
        ),
        0
    );
    assert!(sql_count(dir.path(), "SELECT count(*) FROM recoveries WHERE unmapped") > 0);

    // compare's unmapped share counts the same failed calls.
    let out = Command::new(bin())
        .args([
            "compare",
            "--tool",
            "update_ticket",
            "--service",
            "support-bot",
        ])
        .args(["--before", "1.4.2", "--after", "1.5.0", "--format", "json"])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .expect("run toolspan compare");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let share = c["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .find(|m| m["metric"] == "unmapped_failure_share")
        .unwrap_or_else(|| panic!("no unmapped_failure_share in {c:#}"));
    for (side, version) in [("before", "1.4.2"), ("after", "1.5.0")] {
        let key = ("update_ticket".to_string(), version.to_string());
        assert_eq!(
            share[side]["count"].as_u64().unwrap_or(0),
            scraped.get(&key).copied().unwrap_or(0),
            "compare's {side} ({version}) against /metrics: {share:#}"
        );
    }
    drop(server);
}
