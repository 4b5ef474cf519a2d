//! Durability under faults, many rounds each with randomised timings: SIGKILL during commits,
//! SIGTERM under load, a full disk that is then freed, two `serve` processes on one table.
//! Every round compares what the exporters were told with what the table holds: each
//! acknowledged (trace id, span id) pair is stored, and no pair is stored twice.
//!
//! What an acknowledgement promises (docs/ingest.md, "What a 200 promises"): a request
//! answered 200 after its commit survives anything; a request answered 200 while it waits for
//! trace assembly survives a graceful shutdown (SIGTERM), not a SIGKILL, so the SIGKILL rounds
//! send whole traces only and the SIGTERM rounds also send pieces that wait. A request that
//! got no answer (killed mid-flight, timed out) may or may not be stored, but never twice.
//!
//! The seed of each scenario is printed; `TOOLSPAN_FAULT_SEED=N` replays one.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message;
use toolspan_gen::{Fleet, FleetConfig};

use crate::support::{sql_json, Server};

/// Rounds of every scenario.
const ROUNDS: u64 = 20;

/// A small deterministic generator for the timings (xorshift64*).
struct Rng(u64);

impl Rng {
    fn for_scenario(name: &str) -> Rng {
        let seed = std::env::var("TOOLSPAN_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("fault injection {name}: TOOLSPAN_FAULT_SEED={seed}");
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A duration uniformly in `lo..hi` milliseconds.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo).max(1))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// (trace id, span id) pairs the exporters were answered 200 for, with how often.
#[derive(Default)]
struct Acked {
    pairs: Mutex<HashMap<(String, String), u32>>,
    requests: AtomicU64,
}

impl Acked {
    fn add(&self, pairs: Vec<(String, String)>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut m = self.pairs.lock().unwrap_or_else(|e| e.into_inner());
        for p in pairs {
            *m.entry(p).or_default() += 1;
        }
    }

    fn snapshot(&self) -> HashMap<(String, String), u32> {
        self.pairs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Sends fleet requests (whole traces, `traces` each) to `url` until `stop`; records the pairs
/// of every request answered 200. A request is never resent: a pair is sent once.
async fn send_whole(
    url: String,
    stop: Arc<AtomicBool>,
    acked: Arc<Acked>,
    seed: u64,
    traces: usize,
) {
    let client = reqwest::Client::new();
    let mut fleet = Fleet::new(FleetConfig {
        seed,
        ..FleetConfig::default()
    });
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let req = fleet.request(traces, now + k * 1_000_000, 1_000_000);
        k += 1;
        let pairs: Vec<(String, String)> = req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| (hex(&s.trace_id), hex(&s.span_id)))
            .collect();
        let resp = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(req.encode_to_vec())
            .timeout(Duration::from_secs(60))
            .send()
            .await;
        match resp {
            Ok(r) if r.status().as_u16() == 200 => acked.add(pairs),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Sends, until `stop`, requests that each hold one piece of a trace that waits for trace
/// assembly (a `parse` stage whose attempt never comes): answered 200 as soon as it waits,
/// and written when the wait ends or the server shuts down gracefully.
async fn send_waiting(url: String, stop: Arc<AtomicBool>, acked: Arc<Acked>, seed: u64) {
    let client = reqwest::Client::new();
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let trace = format!("{:016x}{:016x}", seed, k);
        let span = format!("{:016x}", (seed << 20) ^ k ^ 0x5a5a);
        let parent = format!("{:016x}", (seed << 20) ^ k ^ 0xa5a5);
        let body = serde_json::json!({"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "pieces"}}]},
            "scopeSpans": [{"spans": [{
                "traceId": trace, "spanId": span, "parentSpanId": parent,
                "name": "parse", "kind": 1,
                "startTimeUnixNano": "1764410400000000000",
                "endTimeUnixNano": "1764410400100000000",
                "status": {"code": 2},
                "attributes": [{"key": "toolspan.stage", "value": {"stringValue": "parse"}}],
            }]}],
        }]});
        let resp = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(Duration::from_secs(60))
            .send()
            .await;
        if matches!(&resp, Ok(r) if r.status().as_u16() == 200) {
            acked.add(vec![(trace, span)]);
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Starts `n` whole-trace senders (and `waiting` senders of pieces) against `url`.
fn senders(
    url: &str,
    acked: &Arc<Acked>,
    seed: u64,
    n: u64,
    waiting: bool,
) -> (Arc<AtomicBool>, Vec<tokio::task::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = (0..n)
        .map(|i| {
            tokio::spawn(send_whole(
                url.to_string(),
                stop.clone(),
                acked.clone(),
                seed * 16 + i,
                2,
            ))
        })
        .collect();
    if waiting {
        tasks.push(tokio::spawn(send_waiting(
            url.to_string(),
            stop.clone(),
            acked.clone(),
            seed,
        )));
    }
    (stop, tasks)
}

async fn stop_senders(stop: Arc<AtomicBool>, tasks: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(90), t).await;
    }
}

/// SIGTERM and wait for the exit; fails when it takes more than 30 s.
fn terminate(mut server: Server) {
    let pid = server.child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.is_running() {
        assert!(
            Instant::now() < deadline,
            "serve did not exit within 30 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The table's (trace id, span id) pairs with how often each is stored.
fn stored(data_dir: &Path) -> HashMap<(String, String), u32> {
    let rows = sql_json(
        data_dir,
        "SELECT trace_id, span_id, count(*) AS n FROM spans GROUP BY trace_id, span_id",
    );
    rows.iter()
        .map(|r| {
            (
                (
                    r["trace_id"].as_str().unwrap_or_default().to_string(),
                    r["span_id"].as_str().unwrap_or_default().to_string(),
                ),
                r["n"].as_u64().unwrap_or(0) as u32,
            )
        })
        .collect()
}

/// Every acknowledged pair stored exactly once, no pair stored twice; with `exact`, also
/// nothing stored that was not acknowledged (no request was cut off without an answer).
fn check(name: &str, acked: &Acked, data_dir: &Path, exact: bool) {
    let acked_pairs = acked.snapshot();
    let stored = stored(data_dir);
    let requests = acked.requests.load(Ordering::Relaxed);
    assert!(
        requests >= ROUNDS,
        "{name}: only {requests} requests were acknowledged"
    );
    let twice_sent: Vec<_> = acked_pairs
        .iter()
        .filter(|(_, n)| **n > 1)
        .take(3)
        .collect();
    assert!(
        twice_sent.is_empty(),
        "{name}: the test sent a pair twice: {twice_sent:?}"
    );
    let missing: Vec<_> = acked_pairs
        .keys()
        .filter(|p| !stored.contains_key(*p))
        .collect();
    let twice: Vec<_> = stored.iter().filter(|(_, n)| **n > 1).collect();
    let unacked: HashSet<_> = stored
        .keys()
        .filter(|p| !acked_pairs.contains_key(*p))
        .collect();
    eprintln!(
        "{name}: {requests} requests, {} pairs acknowledged, {} stored, {} missing, {} stored twice, {} stored without an answer",
        acked_pairs.len(),
        stored.len(),
        missing.len(),
        twice.len(),
        unacked.len()
    );
    assert!(
        missing.is_empty(),
        "{name}: {} acknowledged spans missing, e.g. {:?}",
        missing.len(),
        missing.iter().take(3).collect::<Vec<_>>()
    );
    assert!(
        twice.is_empty(),
        "{name}: {} spans stored more than once, e.g. {:?}",
        twice.len(),
        twice.iter().take(3).collect::<Vec<_>>()
    );
    if exact {
        assert!(
            unacked.is_empty(),
            "{name}: {} spans stored that no answer acknowledged, e.g. {:?}",
            unacked.len(),
            unacked.iter().take(3).collect::<Vec<_>>()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_commits_loses_and_duplicates_nothing_acknowledged() {
    let mut rng = Rng::for_scenario("sigkill");
    let dir = tempfile::tempdir().unwrap();
    let acked = Arc::new(Acked::default());
    for round in 0..ROUNDS {
        let server = Server::start_with(dir.path(), &["--flush-ms", "50"]);
        let (stop, tasks) = senders(&server.url(), &acked, 1000 + round, 2, false);
        tokio::time::sleep(rng.millis(300, 1200)).await;
        server.kill(); // SIGKILL while the senders send and the sink commits
        stop_senders(stop, tasks).await;
    }
    check("sigkill", &acked, dir.path(), false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_commits_everything_acknowledged_once() {
    let mut rng = Rng::for_scenario("sigterm");
    let dir = tempfile::tempdir().unwrap();
    let acked = Arc::new(Acked::default());
    for round in 0..ROUNDS {
        let server = Server::start(dir.path());
        let (stop, tasks) = senders(&server.url(), &acked, 2000 + round, 2, true);
        tokio::time::sleep(rng.millis(200, 1000)).await;
        // SIGTERM while the senders still send: in-flight requests finish, held pieces are
        // written, then the process exits.
        let term = tokio::task::spawn_blocking(move || terminate(server));
        stop_senders(stop, tasks).await;
        term.await.expect("terminate");
    }
    check("sigterm", &acked, dir.path(), false);
}

/// A tmpfs of `mb` MiB mounted at `dir`, unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, mb: u64) -> Tmpfs {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", format!("size={mb}M").as_str(), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs for the disk-full rounds failed (the suite runs as root in CI): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with a file until no byte is left.
fn fill(dir: &Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("create the filler");
    let chunk = vec![0u8; 1 << 16];
    while f.write_all(&chunk).is_ok() {}
    for _ in 0..64 {
        if f.write_all(&chunk[..512]).is_err() && f.write_all(&chunk[..1]).is_err() {
            break;
        }
    }
    let _ = f.sync_all();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_then_freed_stores_every_acknowledged_span_once() {
    let mut rng = Rng::for_scenario("disk-full");
    let root = tempfile::tempdir().unwrap();
    let mount = root.path().join("fs");
    std::fs::create_dir_all(&mount).unwrap();
    let _fs = Tmpfs::mount(&mount, 96);
    let data = mount.join("data");
    let server = Server::start_with(&data, &["--writer-queue", "16"]);
    let acked = Arc::new(Acked::default());
    let client = reqwest::Client::new();
    let ready = format!("{}/readyz", server.base());
    for round in 0..ROUNDS {
        let (stop, tasks) = senders(&server.url(), &acked, 3000 + round, 2, false);
        tokio::time::sleep(rng.millis(50, 400)).await;
        let filler = fill(&mount);
        tokio::time::sleep(rng.millis(100, 1200)).await;
        std::fs::remove_file(&filler).expect("free the disk");
        tokio::time::sleep(rng.millis(50, 300)).await;
        stop_senders(stop, tasks).await;
        // Ready again once space is back (the sink retries with back-off up to 10 s).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = client.get(&ready).send().await;
            if matches!(&r, Ok(r) if r.status().as_u16() == 200) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: not ready 60 s after the disk was freed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    terminate(server);
    check("disk-full", &acked, &data, true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_on_one_table_store_every_acknowledged_span_once() {
    let mut rng = Rng::for_scenario("two-writers");
    let dir = tempfile::tempdir().unwrap();
    let acked = Arc::new(Acked::default());
    for round in 0..ROUNDS {
        let a = Server::start(dir.path());
        let b = Server::start(dir.path());
        let (stop_a, tasks_a) = senders(&a.url(), &acked, 4000 + 2 * round, 1, false);
        let (stop_b, tasks_b) = senders(&b.url(), &acked, 4001 + 2 * round, 1, false);
        tokio::time::sleep(rng.millis(300, 1200)).await;
        let term_a = tokio::task::spawn_blocking(move || terminate(a));
        // The other writer goes on a little longer, alone.
        tokio::time::sleep(rng.millis(0, 300)).await;
        let term_b = tokio::task::spawn_blocking(move || terminate(b));
        stop_senders(stop_a, tasks_a).await;
        stop_senders(stop_b, tasks_b).await;
        term_a.await.expect("terminate");
        term_b.await.expect("terminate");
    }
    check("two-writers", &acked, dir.path(), false);
}
