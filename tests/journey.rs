//! A new user's path through the viewer, end to end, in real headless Chromium: `toolspan
//! demo` with the query HTTP API (`--http-addr`) kept serving after its fleet stops, then
//! `tests/browser/journey.py` (Selenium) opens the viewer at the URL the demo printed and walks
//! from the search page to a PARSE failure of
//! search_docs, what the model received, its reference, the tool page's charts (checked
//! against SQL over `failure_rates`) and the compare page of support-bot's update_ticket,
//! 1.4.2 vs 1.5.0. Screenshots of every page are kept under the test's target directory.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{bin, free_port, python, repo_root};

/// The demo process, killed when the test ends (however it ends).
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The number of spans the API answers, or `None` while it does not answer.
fn span_count(base: &str) -> Option<i64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{base}/api/v1/sql"))
            .header("content-type", "application/json")
            .body(json!({"sql": "SELECT count(*) AS n FROM spans"}).to_string())
            .send()
            .await
            .ok()?;
        let v: Value = serde_json::from_str(&r.text().await.ok()?).ok()?;
        v["rows"][0]["n"].as_i64()
    })
}

#[test]
fn a_new_user_walks_from_the_search_page_to_the_compare_page_in_chromium() {
    let dir = tempfile::tempdir().expect("temp dir");
    let http = free_port();
    let base = format!("http://127.0.0.1:{http}");
    let mut child = Command::new(bin())
        .args([
            "demo",
            "--duration",
            "12",
            "--runs-per-second",
            "200",
            "--keep-serving",
            "--log",
            "warn",
        ])
        .arg("--otlp-addr")
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--http-addr")
        .arg(format!("127.0.0.1:{http}"))
        .arg("--data-dir")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start toolspan demo");
    let stderr = child.stderr.take().expect("stderr");
    let demo = Demo(child);
    // The demo's status lines, read on a thread: the fleet has stopped when it says so.
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut said = String::new();
    // The URL a user would open: the one the demo prints, not the address the test chose.
    let mut printed: Option<String> = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(line) => {
                said.push_str(&line);
                said.push('\n');
                if let Some(rest) = line.split("viewer on ").nth(1) {
                    printed = rest.split_whitespace().next().map(str::to_string);
                }
                if line.contains("still serving") {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the demo exited:\n{said}"),
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never stopped:\n{said}"
        );
    }
    // The last flushes land: wait until two reads a second apart agree.
    let mut last = None;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let n = span_count(&base);
        if n.is_some() && n == last {
            break;
        }
        last = n;
        assert!(
            Instant::now() < deadline,
            "the table never settled:\n{said}"
        );
    }
    let printed =
        printed.unwrap_or_else(|| panic!("the demo never printed the viewer's URL:\n{said}"));
    assert_eq!(
        printed.trim_end_matches('/'),
        base,
        "the printed URL is where the viewer is"
    );
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("journey");
    println!("screenshots in {}", shots.display());
    let out = Command::new(python())
        .arg(repo_root().join("tests/browser/journey.py"))
        .arg(&printed)
        .arg(&shots)
        .output()
        .expect("run python");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "journey.py failed:\n{}\n{}\ndemo said:\n{said}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop(demo);
}
