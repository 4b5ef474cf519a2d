//! `toolspan serve --http-addr` runs the query HTTP API in the same process: what the receiver
//! acknowledged is searchable over HTTP without a second service.

use prost::Message;
use toolspan_gen::{Fleet, FleetConfig};

use crate::support::{free_port, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_http_addr_answers_sql_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let api_port = free_port();
    let server = Server::start_with(
        dir.path(),
        &["--http-addr", &format!("127.0.0.1:{api_port}")],
    );
    let client = reqwest::Client::new();
    let req =
        Fleet::new(FleetConfig::default()).request(10, 1_764_410_400_000_000_000, 1_000_000_000);
    let spans: usize = req
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum();
    let resp = client
        .post(server.url())
        .header("content-type", "application/x-protobuf")
        .body(req.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    let api = format!("http://127.0.0.1:{api_port}");
    let mut count = 0;
    // Searchable within the documented delay: a request whose spans wait for relatives is
    // held up to the assembly wait (5 s), then flushed and committed, and the API follows new
    // commits within its refresh interval (1 s). 30 s leaves room for a loaded machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let r = client
            .post(format!("{api}/api/v1/sql"))
            .header("content-type", "application/json")
            .body(r#"{"sql": "SELECT count(*) AS n FROM spans"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let text = r.text().await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        count = v["rows"][0]["n"]
            .as_i64()
            .or_else(|| v["rows"][0][0].as_i64())
            .unwrap_or_else(|| panic!("count in {text}"));
        if count as usize == spans {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        count as usize, spans,
        "every acknowledged span is searchable over the in-process API"
    );
    drop(server);
}

/// An error is logged once, by the front end that answers with it, with its detail: the
/// engine that makes a query error and the layers it passes through write nothing, and the
/// answer's reference names exactly one log line, which carries the code and the detail a
/// caller is not shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answered_error_is_logged_once_with_its_detail() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log_path = dir.path().join("serve.log");
    let api_port = free_port();
    let server = Server::start_logging(
        &data,
        &[
            "--http-addr",
            &format!("127.0.0.1:{api_port}"),
            "--log-format",
            "json",
        ],
        &log_path,
    );
    let client = reqwest::Client::new();
    let api = format!("http://127.0.0.1:{api_port}");
    // A query the engine refuses (an unknown column) and a parameter the front end refuses.
    let mut answers = Vec::new();
    let r = client
        .post(format!("{api}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(r#"{"sql": "SELECT no_such_column FROM spans"}"#)
        .send()
        .await
        .unwrap();
    answers.push((r.status().as_u16(), r.text().await.unwrap()));
    let r = client
        .get(format!("{api}/api/v1/traces/not-a-trace-id"))
        .send()
        .await
        .unwrap();
    answers.push((r.status().as_u16(), r.text().await.unwrap()));
    drop(server);

    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for (k, (status, body)) in answers.iter().enumerate() {
        assert!(*status >= 400, "{status} {body}");
        let v: serde_json::Value = serde_json::from_str(body).expect("an envelope");
        let reference = v["error"]["reference"].as_str().expect("a reference");
        let code = v["error"]["code"].as_str().expect("a code");
        let logged: Vec<&serde_json::Value> = lines
            .iter()
            .filter(|l| l.to_string().contains(reference))
            .collect();
        assert_eq!(
            logged.len(),
            1,
            "{reference} ({code}) is on exactly one log line:\n{text}"
        );
        assert_eq!(logged[0]["code"], code, "{text}");
        let detail = logged[0]["detail"].as_str().unwrap_or_default();
        assert!(!detail.is_empty(), "the line carries the detail:\n{text}");
        if k == 0 {
            // The engine's own text (DataFusion's) stays in the log.
            assert!(
                !body.contains(detail),
                "the detail is for the log, not the caller: {body}"
            );
        }
    }
}
