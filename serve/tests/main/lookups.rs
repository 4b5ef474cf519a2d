//! The trace and reference lookups of the HTTP API (`/api/v1/traces/{id}`,
//! `/api/v1/references/{reference}`): whole traces as ordered trees, with their failures.

use axum::http::StatusCode;
use serde_json::Value;

use crate::http::{app_with, count, get, rows, sql};

/// Every node of a trace tree, depth first, with its parent's span id.
fn flatten(tree: &Value) -> Vec<(Value, Option<String>)> {
    let mut out = Vec::new();
    let mut stack: Vec<(&Value, Option<String>)> = tree["roots"]
        .as_array()
        .expect("roots")
        .iter()
        .rev()
        .map(|r| (r, None))
        .collect();
    while let Some((node, parent)) = stack.pop() {
        let id = node["span_id"].as_str().expect("span id").to_string();
        let children = node["children"].as_array().expect("children");
        let starts: Vec<&str> = children
            .iter()
            .map(|c| c["start_time"].as_str().expect("start"))
            .collect();
        assert!(
            starts.windows(2).all(|w| w[0] <= w[1]),
            "children in start order under {id}"
        );
        for c in children.iter().rev() {
            stack.push((c, Some(id.clone())));
        }
        out.push((node.clone(), parent));
    }
    out
}

#[tokio::test]
async fn traces_come_back_as_ordered_trees_with_failures() {
    let (_dir, app) = app_with(None).await;
    let r = get(&app, "/api/v1/traces/4B4B4B4B4B4B4B4B4B4B4B4B4B4B4B4B").await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let t = r.json();
    assert_eq!(t["span_count"], 15);
    let roots = t["roots"].as_array().expect("roots");
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0]["stage"], "agent");
    let calls: Vec<&str> = roots[0]["children"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| c["tool"].as_str().expect("tool"))
        .collect();
    assert_eq!(calls, ["search_docs", "fetch_page"]);
    let search = &roots[0]["children"][0];
    let attempts: Vec<i64> = search["children"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["attempt"].as_i64().expect("n"))
        .collect();
    assert_eq!(attempts, [1, 2]);
    assert_eq!(search["children"][0]["error"]["type"], "NETWORK");
    let stages: Vec<&str> = search["children"][1]["children"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["stage"].as_str().expect("stage"))
        .collect();
    assert_eq!(stages, ["send", "execute", "parse"]);
    let fetch = &roots[0]["children"][1];
    assert_eq!(fetch["error"]["type"], "RETRY_EXHAUSTED");
    assert_eq!(fetch["error"]["code"], "upstream_failed");
    assert_eq!(fetch["error"]["message"], "failed");
    assert_eq!(fetch["children"].as_array().expect("attempts").len(), 3);
    assert_eq!(flatten(&t).len(), 15);

    // A fleet trace with a retried call: every span once, each under its parent.
    let q = "SELECT trace_id FROM calls WHERE attempts > 1 AND trace_id <> '4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b' ORDER BY trace_id LIMIT 1";
    let id = rows(&sql(&app, q).await)[0]["trace_id"]
        .as_str()
        .expect("id")
        .to_string();
    let spans = count(
        &app,
        &format!("SELECT count(*) FROM spans WHERE trace_id = '{id}'"),
    )
    .await;
    let t = get(&app, &format!("/api/v1/traces/{id}")).await.json();
    let nodes = flatten(&t);
    assert_eq!(nodes.len() as i64, spans);
    assert_eq!(t["span_count"].as_i64(), Some(spans));
    for (node, parent) in &nodes {
        assert_eq!(
            node["parent_span_id"].as_str().map(str::to_string),
            parent.clone(),
            "{node}"
        );
        if node["status"] == "error" {
            assert!(
                node["error"]["type"].is_string(),
                "a failure names its type: {node}"
            );
        }
    }
    assert!(nodes.iter().any(|(n, _)| n["stage"] == "attempt"));
    assert!(nodes.iter().any(|(n, _)| n["stage"] == "parse"));

    let r = get(&app, "/api/v1/traces/not-a-trace").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::BAD_REQUEST, "invalid_argument")
    );
    let r = get(&app, "/api/v1/traces/0123456789abcdef0123456789abcdef").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::NOT_FOUND, "not_found")
    );
}

#[tokio::test]
async fn references_lead_to_their_span_and_whole_trace() {
    let (_dir, app) = app_with(None).await;
    let r = get(&app, "/api/v1/references/err_7c1f9a").await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let v = r.json();
    assert_eq!(v["span"]["tool"], "fetch_page");
    assert_eq!(v["span"]["stage"], "call");
    assert_eq!(v["span"]["error"]["reference"], "err_7c1f9a");
    assert_eq!(v["trace"]["trace_id"], "4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b");
    assert_eq!(v["trace"]["span_count"], 15);

    // A reference from fleet traffic.
    let q = "SELECT reference, trace_id FROM spans WHERE reference IS NOT NULL AND trace_id <> '4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b' ORDER BY reference LIMIT 1";
    let row = rows(&sql(&app, q).await)[0].clone();
    let reference = row["reference"].as_str().expect("reference");
    let v = get(&app, &format!("/api/v1/references/{reference}"))
        .await
        .json();
    assert_eq!(v["trace"]["trace_id"], row["trace_id"]);
    assert_eq!(v["span"]["reference"], reference);
    let ids: Vec<String> = flatten(&v["trace"])
        .iter()
        .map(|(n, _)| n["span_id"].as_str().expect("id").to_string())
        .collect();
    assert!(ids.contains(&v["span"]["span_id"].as_str().expect("id").to_string()));

    let r = get(&app, "/api/v1/references/err_nothing").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    let r = get(&app, "/api/v1/references/err%27%20OR%201=1").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::BAD_REQUEST, "invalid_argument")
    );
}
