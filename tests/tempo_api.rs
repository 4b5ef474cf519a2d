//! The Tempo-compatible API of `toolspan query`, driven as Grafana's Tempo data source drives
//! it: `tests/grafana/tempo_replay.py` replays its requests (health, build info, trace by id v2
//! then v1 as protobuf, TraceQL search, tags and tag values) and decodes the answers as
//! Grafana does; the trace it fetches is a demo trace with a failed call, whose span count
//! SQL gives.

use std::process::Command;

use serde_json::{json, Value};

use crate::support::{python, repo_root, start_query};
use crate::viewer::{fixture, TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_tempo_requests_are_answered_as_grafana_decodes_them() {
    let f = fixture();
    let (mut child, http, _pg) =
        start_query(&f.dir, "grafana", "tempo-test-pw", &["--token", TOKEN]);
    let base = format!("http://127.0.0.1:{http}");
    let r = reqwest::Client::new()
        .post(format!("{base}/api/v1/sql"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(
            json!({"sql": "SELECT s.trace_id, count(*) AS n FROM spans s WHERE s.trace_id IN \
                (SELECT trace_id FROM spans WHERE tool = 'search_docs' AND error_type = 'PARSE' \
                 AND stage = 'parse' LIMIT 1) GROUP BY 1"})
            .to_string(),
        )
        .send()
        .await
        .expect("POST");
    let v: Value = serde_json::from_str(&r.text().await.expect("body")).expect("JSON");
    let row = &v["rows"][0];
    let trace = row["trace_id"]
        .as_str()
        .expect("a demo trace with a PARSE failure");
    let n = row["n"].as_i64().expect("count");
    let out = Command::new(python())
        .arg(repo_root().join("tests/grafana/tempo_replay.py"))
        .args([&base, TOKEN, trace, &n.to_string()])
        .output()
        .expect("run python");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "tempo_replay.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tempo_routes_ask_for_the_bearer_token() {
    let f = fixture();
    for path in ["/api/echo", "/api/search?q={}", "/api/v2/search/tags"] {
        let r = reqwest::Client::new()
            .get(format!("{}{path}", f.base()))
            .send()
            .await
            .expect("GET");
        assert_eq!(r.status().as_u16(), 401, "{path}");
        let v: Value = serde_json::from_str(&r.text().await.expect("body")).expect("envelope");
        assert_eq!(v["error"]["code"], "unauthorized");
    }
}
