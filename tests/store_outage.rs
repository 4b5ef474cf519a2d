//! When the store cannot be written, requests are refused with 503 and `Retry-After` once the
//! writer's queue is full; requests already queued are acknowledged after the store recovers,
//! and their spans are in the table.

use std::time::Duration;

use prost::Message;
use toolspan_gen::{Fleet, FleetConfig};

use crate::support::{sql_count, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_gives_503_with_retry_after_and_loses_nothing_queued() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--writer-queue", "2"]);
    let url = server.url();
    let client = reqwest::Client::new();
    let mut fleet = Fleet::new(FleetConfig::default());
    let body = |f: &mut Fleet, k: u64| {
        f.request(3, 1_764_410_400_000_000_000 + k * 1_000_000_000, 1_000_000)
            .encode_to_vec()
    };

    // A first request creates the partition directories; then the store breaks: the log
    // directory becomes a file, so every commit fails.
    let ok = client
        .post(&url)
        .header("content-type", "application/x-protobuf")
        .body(body(&mut fleet, 0))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    let log = dir.path().join("spans/_delta_log");
    let saved = dir.path().join("saved_log");
    std::fs::rename(&log, &saved).unwrap();
    std::fs::write(&log, b"not a directory").unwrap();

    let mut pending = Vec::new();
    for k in 1..=8u64 {
        let req = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(body(&mut fleet, k));
        pending.push(tokio::spawn(async move { req.send().await }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Alive but not ready while commits fail (an orchestrator takes the receiver out of its
    // load balancer instead of restarting it), with the envelope of an unavailable store.
    let probe = |path: &'static str| {
        let client = client.clone();
        let url = format!("{}{path}", server.base());
        async move {
            let r = client.get(url).send().await.expect("probe answered");
            let retry_after = r.headers().get("retry-after").is_some();
            (
                r.status().as_u16(),
                retry_after,
                r.text().await.unwrap_or_default(),
            )
        }
    };
    let (status, retry_after, body) = probe("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(retry_after, "Retry-After on a 503 probe");
    let v: serde_json::Value = serde_json::from_str(&body).expect("an envelope");
    assert_eq!(v["error"]["code"], "store_unavailable", "{v}");
    assert_eq!(probe("/healthz").await.0, 200);
    // Repair the store: queued requests are committed and acknowledged.
    std::fs::remove_file(&log).unwrap();
    std::fs::rename(&saved, &log).unwrap();

    let (mut acked, mut refused) = (0, 0);
    for p in pending {
        let resp = tokio::time::timeout(Duration::from_secs(60), p)
            .await
            .expect("answered")
            .unwrap()
            .unwrap();
        match resp.status().as_u16() {
            200 => acked += 1,
            503 | 429 => {
                assert!(
                    resp.headers().get("retry-after").is_some(),
                    "Retry-After on {}",
                    resp.status()
                );
                let v: serde_json::Value =
                    serde_json::from_str(&resp.text().await.unwrap()).unwrap();
                assert!(v["error"]["retryable"].as_bool().unwrap(), "{v}");
                refused += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(
        refused > 0,
        "a full queue during the outage refuses requests"
    );
    assert!(acked > 0, "queued requests are acknowledged after recovery");
    let (status, _, body) = probe("/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"status":"ready"}"#),
        "ready once commits succeed again"
    );
    drop(server);
    // Every acknowledged request's spans are in the table (3 runs each, same fleet sizes).
    let total = sql_count(dir.path(), "SELECT count(DISTINCT trace_id) FROM spans");
    assert_eq!(total, 3 * (1 + acked), "acknowledged traces in the table");
}

/// A store outage is logged once per failure, by the loop that retries: every reference the
/// log names is on one line (not also where the error was made and on its way up), the line
/// carries the store's detail, and the same failure repeating is not logged on every retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_logs_each_failure_once_with_its_detail() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log_path = dir.path().join("serve.log");
    let server = Server::start_logging(&data, &["--log-format", "json"], &log_path);
    let url = server.url();
    let client = reqwest::Client::new();
    let mut fleet = Fleet::new(FleetConfig::default());
    let post = |f: &mut Fleet, k: u64| {
        client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(
                f.request(2, 1_764_410_400_000_000_000 + k * 1_000_000_000, 1_000_000)
                    .encode_to_vec(),
            )
            .send()
    };
    assert_eq!(post(&mut fleet, 0).await.unwrap().status().as_u16(), 200);
    let log = data.join("spans/_delta_log");
    let saved = data.join("saved_log");
    std::fs::rename(&log, &saved).unwrap();
    std::fs::write(&log, b"not a directory").unwrap();

    let pending = tokio::spawn(post(&mut fleet, 1));
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let failed = |v: &serde_json::Value| {
        v["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("commit failed"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !lines().iter().any(failed) {
        assert!(
            std::time::Instant::now() < deadline,
            "no failed commit logged within 30 s:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the writer retry a few times (backoff from 200 ms), then repair the store.
    tokio::time::sleep(Duration::from_secs(3)).await;
    std::fs::remove_file(&log).unwrap();
    std::fs::rename(&saved, &log).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(60), pending)
        .await
        .expect("answered")
        .unwrap()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "acknowledged after the repair");
    drop(server);

    let lines = lines();
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut per_reference: std::collections::BTreeMap<String, usize> = Default::default();
    for v in &lines {
        if let Some(r) = v["reference"].as_str() {
            *per_reference.entry(r.to_string()).or_default() += 1;
        }
    }
    let repeated: Vec<_> = per_reference.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "one failure, one log line: these references are logged more than once: {repeated:?}\n{text}"
    );
    let failures: Vec<_> = lines.iter().filter(|v| failed(v)).collect();
    assert_eq!(
        failures.len(),
        1,
        "the same failure repeating within half a minute is logged once:\n{text}"
    );
    let detail = failures[0]["detail"].as_str().unwrap_or_default();
    assert!(
        !detail.is_empty() && failures[0]["code"] == "store_unavailable",
        "the line carries the code and the store's detail:\n{text}"
    );
    assert_eq!(failures[0]["level"], "WARN", "{text}");
}
