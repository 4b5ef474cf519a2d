//! The HTTP API of the demo server: a demo trace with a retried call as a full tree, and an
//! error reference resolved to its span and whole trace.

use serde_json::{json, Value};

use super::demo;

async fn http_get(url: &str) -> (u16, Value) {
    let r = reqwest::Client::new().get(url).send().await.expect("GET");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")),
    )
}

async fn http_sql(base: &str, sql: &str) -> Vec<Value> {
    let r = reqwest::Client::new()
        .post(format!("{base}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(json!({ "sql": sql }).to_string())
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 200, "{sql}");
    let v: Value = serde_json::from_str(&r.text().await.expect("body")).expect("JSON");
    v["rows"].as_array().expect("rows").clone()
}

/// Every node of a trace tree with its parent's id; checks children are in start order.
fn walk(tree: &Value) -> Vec<(Value, Option<String>)> {
    let mut out = Vec::new();
    let mut stack: Vec<(Value, Option<String>)> = tree["roots"]
        .as_array()
        .expect("roots")
        .iter()
        .map(|r| (r.clone(), None))
        .collect();
    while let Some((node, parent)) = stack.pop() {
        let id = node["span_id"].as_str().expect("id").to_string();
        let kids = node["children"].as_array().expect("children").clone();
        let starts: Vec<String> = kids
            .iter()
            .map(|k| k["start_time"].as_str().expect("start").to_string())
            .collect();
        assert!(
            starts.windows(2).all(|w| w[0] <= w[1]),
            "children of {id} in start order"
        );
        stack.extend(kids.into_iter().map(|k| (k, Some(id.clone()))));
        out.push((node, parent));
    }
    out
}

#[tokio::test]
async fn a_demo_trace_with_a_retried_call_comes_back_as_a_full_tree() {
    let base = demo().server.base();
    let rows = http_sql(
        &base,
        "SELECT trace_id FROM calls WHERE attempts > 1 ORDER BY trace_id LIMIT 1",
    )
    .await;
    let trace_id = rows[0]["trace_id"].as_str().expect("trace id").to_string();
    let spans = http_sql(
        &base,
        &format!("SELECT count(*) AS n FROM spans WHERE trace_id = '{trace_id}'"),
    )
    .await[0]["n"]
        .as_i64()
        .expect("n");
    let (status, tree) = http_get(&format!("{base}/api/v1/traces/{trace_id}")).await;
    assert_eq!(status, 200, "{tree}");
    let nodes = walk(&tree);
    assert_eq!(
        nodes.len() as i64,
        spans,
        "every span of the trace is in the tree"
    );
    for (node, parent) in &nodes {
        assert_eq!(
            node["parent_span_id"].as_str().map(str::to_string),
            *parent,
            "{node}"
        );
    }
    let stages: Vec<&str> = nodes
        .iter()
        .filter_map(|(n, _)| n["stage"].as_str())
        .collect();
    for s in ["agent", "call", "attempt", "prepare", "send", "execute"] {
        assert!(stages.contains(&s), "stage {s} in the tree: {stages:?}");
    }
    assert!(
        nodes.iter().any(|(n, _)| n["error"]["type"].is_string()),
        "a failure with its type"
    );
}

#[tokio::test]
async fn an_error_reference_resolves_to_its_span_and_whole_trace() {
    let base = demo().server.base();
    let rows = http_sql(&base, "SELECT reference, trace_id, span_id FROM spans WHERE reference IS NOT NULL AND stage = 'call' ORDER BY start_time LIMIT 1").await;
    let reference = rows[0]["reference"]
        .as_str()
        .expect("reference")
        .to_string();
    let (status, v) = http_get(&format!("{base}/api/v1/references/{reference}")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["trace"]["trace_id"], rows[0]["trace_id"]);
    assert_eq!(v["span"]["reference"], reference.as_str());
    assert!(v["span"]["error"]["code"].is_string(), "{v}");
    let in_trace = walk(&v["trace"]);
    let spans = http_sql(
        &base,
        &format!(
            "SELECT count(*) AS n FROM spans WHERE trace_id = '{}'",
            rows[0]["trace_id"].as_str().expect("id")
        ),
    )
    .await[0]["n"]
        .as_i64()
        .expect("n");
    assert_eq!(in_trace.len() as i64, spans, "the reference's whole trace");
    let (status, v) = http_get(&format!("{base}/api/v1/references/err_not_there")).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}
