//! Malformed requests get the documented statuses with an error body; the process stays up
//! and its memory stays bounded.

use std::io::Write;

use prost::Message;
use toolspan_gen::{Fleet, FleetConfig};

use crate::support::Server;

async fn post(url: &str, ct: &str, enc: Option<&str>, body: Vec<u8>) -> (u16, serde_json::Value) {
    let client = reqwest::Client::new();
    let mut req = client.post(url).header("content-type", ct).body(body);
    if let Some(e) = enc {
        req = req.header("content-encoding", e);
    }
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            (
                status,
                serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
            )
        }
        // The server may close the connection once it has answered 413 without reading
        // the rest of a huge body; that counts as refused.
        Err(_) => (413, serde_json::Value::Null),
    }
}

fn assert_envelope(v: &serde_json::Value, code: &str) {
    let e = &v["error"];
    assert_eq!(e["code"], code, "{v}");
    for k in ["class", "message", "retryable", "reference"] {
        assert!(!e[k].is_null(), "envelope has {k}: {v}");
    }
    let text = v.to_string();
    assert!(
        !text.contains("/src/") && !text.contains("panicked") && !text.contains(".rs:"),
        "no internals: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_statuses_and_the_server_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let url = server.url();

    // 100 MB body.
    let (status, body) = post(&url, "application/x-protobuf", None, vec![0x0a; 100 << 20]).await;
    assert_eq!(status, 413);
    if !body.is_null() {
        assert_envelope(&body, "payload_too_large");
    }

    // gzip bomb: 1 GiB of zeros, ~1 MB compressed.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..1024 {
        gz.write_all(&zeros).unwrap();
    }
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 20 << 20);
    let (status, body) = post(&url, "application/x-protobuf", Some("gzip"), bomb).await;
    assert_eq!(status, 413);
    assert_envelope(&body, "payload_too_large");

    // Garbage.
    let (status, body) = post(
        &url,
        "application/x-protobuf",
        None,
        b"\xff\xff\xff\xffnot protobuf".to_vec(),
    )
    .await;
    assert_eq!(status, 400);
    assert_envelope(&body, "otlp_decode");
    let (status, body) = post(
        &url,
        "application/json",
        None,
        b"{\"resourceSpans\": 5}".to_vec(),
    )
    .await;
    assert_eq!(status, 400);
    assert_envelope(&body, "otlp_json");
    let (status, body) = post(
        &url,
        "application/x-protobuf",
        Some("gzip"),
        b"not gzip at all".to_vec(),
    )
    .await;
    assert_eq!(status, 400);
    assert_envelope(&body, "otlp_decode");

    // Wrong content type.
    let (status, body) = post(&url, "text/plain", None, b"hello".to_vec()).await;
    assert_eq!(status, 415);
    assert_envelope(&body, "unsupported_media_type");

    // Still up, still writing: a valid request (gzip-compressed) is acknowledged.
    assert!(server.is_running());
    let req = Fleet::new(FleetConfig::default()).request(5, 1_764_410_400_000_000_000, 1_000_000);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&req.encode_to_vec()).unwrap();
    let (status, body) = post(
        &url,
        "application/x-protobuf",
        Some("gzip"),
        gz.finish().unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Partial success: one span with a short trace id is rejected, the other lands.
    let partial = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[
        {"traceId":"0102","spanId":"0102030405060708","name":"bad","startTimeUnixNano":"1764410400000000000","endTimeUnixNano":"1764410400100000000"},
        {"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060709","name":"good","startTimeUnixNano":"1764410400000000000","endTimeUnixNano":"1764410400100000000"}
    ]}]}]}"#;
    let (status, body) = post(&url, "application/json", None, partial.to_vec()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["partialSuccess"]["rejectedSpans"], "1", "{body}");
    assert!(
        body["partialSuccess"]["errorMessage"]
            .as_str()
            .unwrap()
            .contains("trace id"),
        "{body}"
    );

    // Bounded memory: the 100 MB body and the 1 GiB bomb were never held whole.
    let peak_mib = server.peak_rss_kib() / 1024;
    eprintln!("toolspan serve peak RSS: {peak_mib} MiB");
    assert!(peak_mib > 0 && peak_mib < 300, "peak RSS {peak_mib} MiB");
}
