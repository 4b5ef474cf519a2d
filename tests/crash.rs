//! SIGKILL mid-write: after a restart the table is readable and holds every batch that was
//! acknowledged with 200.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use toolspan_gen::{Fleet, FleetConfig};

use crate::support::{sql_count, sql_json, Server};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Sends requests until stopped; returns the trace ids of acknowledged requests.
async fn send_until(
    url: String,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<HashSet<String>>>,
    seed: u64,
) {
    let client = reqwest::Client::new();
    let mut fleet = Fleet::new(FleetConfig {
        seed,
        ..FleetConfig::default()
    });
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut k = 0;
    while !stop.load(Ordering::Relaxed) {
        let req = fleet.request(20, now + k * 1_000_000, 1_000_000);
        k += 1;
        let traces: HashSet<String> = req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| hex(&s.trace_id))
            .collect();
        let resp = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(req.encode_to_vec())
            .send()
            .await;
        match resp {
            Ok(r) if r.status().as_u16() == 200 => acked.lock().unwrap().extend(traces),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_write_keeps_every_acknowledged_batch() {
    let dir = tempfile::tempdir().unwrap();
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    for round in 0..3u64 {
        let server = Server::start(dir.path());
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(send_until(
            server.url(),
            stop.clone(),
            acked.clone(),
            100 + round,
        ));
        tokio::time::sleep(Duration::from_millis(1500 + 700 * round)).await;
        server.kill(); // SIGKILL, mid-write: the sender is still sending
        stop.store(true, Ordering::Relaxed);
        let _ = task.await;
    }
    // Restart once more: the table opens and accepts writes after the crashes.
    let server = Server::start(dir.path());
    drop(server);

    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 50,
        "requests were acknowledged ({})",
        acked.len()
    );
    let total = sql_count(dir.path(), "SELECT count(*) FROM spans");
    assert!(total > 0);
    let mut found = HashSet::new();
    let ids: Vec<String> = acked.iter().cloned().collect();
    for chunk in ids.chunks(500) {
        let list = chunk
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(",");
        for row in sql_json(
            dir.path(),
            &format!("SELECT DISTINCT trace_id FROM spans WHERE trace_id IN ({list})"),
        ) {
            found.insert(row["trace_id"].as_str().unwrap().to_string());
        }
    }
    let missing: Vec<_> = acked.difference(&found).take(5).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged traces missing after SIGKILL, e.g. {missing:?}",
        acked.len() - found.len()
    );
}
