//! Trace trees: the spans of one trace, each under its parent, children in start order, each
//! failure with its type, code and message. Used by the trace and reference lookups.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::error::QueryError;
use toolspan_schema::Status;

use crate::rows::Span;
use crate::service::QueryService;

/// Spans one lookup returns at most; a larger trace is cut (and says so).
pub const MAX_SPANS: usize = 10_000;

/// Nesting kept in the tree; deeper spans hang under their ancestor at this depth, so that a
/// malformed trace cannot make the response (or its serialisation) arbitrarily deep.
pub const MAX_DEPTH: usize = 64;

/// Whether `id` is a trace id as stored: 32 hexadecimal characters (returned lowercased).
pub fn normalize_trace_id(id: &str) -> Option<String> {
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

/// Whether `r` looks like an error reference (`err_7c1f9a`, `ts_…`): 1 to 128 letters,
/// digits, `_`, `-`, `.` or `:`.
pub fn valid_reference(r: &str) -> bool {
    (1..=128).contains(&r.len())
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// Loads the trace `trace_id` (already normalized) as a tree, or `None` when no span has
/// that id. The spans are read as every page reads a trace ([`crate::rows::load_trace`]).
pub async fn load(service: &QueryService, trace_id: &str) -> Result<Option<Value>, QueryError> {
    let (spans, truncated) = crate::rows::load_trace(service, trace_id).await?;
    if spans.is_empty() {
        return Ok(None);
    }
    Ok(Some(build(
        trace_id,
        spans.iter().map(row).collect(),
        truncated,
    )))
}

/// The fields of one span a tree node shows, before [`node`] groups its error.
fn row(s: &Span) -> Value {
    json!({
        "span_id": s.span_id,
        "parent_span_id": s.parent_span_id,
        "name": s.name,
        "stage": s.stage,
        "tool": s.tool,
        "call_id": s.call_id,
        "attempt": s.attempt,
        "status": s.status,
        "start_time": s.start_time,
        "end_time": s.end_time,
        "duration_ms": s.duration_ms,
        "service": s.service,
        "service_version": s.service_version,
        "agent": s.agent,
        "model": s.model,
        "http_status": s.http_status,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "error_type": s.error_type,
        "error_code": s.error_code,
        "error_class": s.error_class,
        "error_message": s.error_message,
        "retryable": s.retryable,
        "retry_after_ms": s.retry_after_ms,
        "reference": s.reference,
        "leaked_internals": s.leaked_internals,
        "input_sha256": s.input_sha256,
    })
}

/// One span as a tree node (without children).
fn node(mut row: Map<String, Value>) -> Map<String, Value> {
    let failed = row
        .get("status")
        .and_then(Value::as_str)
        .is_some_and(Status::is_failed);
    let error = if failed || !row.get("error_type").is_none_or(Value::is_null) {
        json!({
            "type": row.remove("error_type").unwrap_or(Value::Null),
            "code": row.remove("error_code").unwrap_or(Value::Null),
            "class": row.remove("error_class").unwrap_or(Value::Null),
            "message": row.remove("error_message").unwrap_or(Value::Null),
            "retryable": row.remove("retryable").unwrap_or(Value::Null),
            "retry_after_ms": row.remove("retry_after_ms").unwrap_or(Value::Null),
            "reference": row.get("reference").cloned().unwrap_or(Value::Null),
        })
    } else {
        for k in [
            "error_type",
            "error_code",
            "error_class",
            "error_message",
            "retryable",
            "retry_after_ms",
        ] {
            row.remove(k);
        }
        Value::Null
    };
    row.insert("error".into(), error);
    row
}

/// The model's recovery across turns within the trace, as the `recoveries` view computes it
/// (`crate::views::RECOVERIES_SQL`) for a run that is one trace: one entry per failure streak
/// (consecutive failed calls of a tool, in start order), and on the streak's first failed
/// call node a `recovery` object with the same fields.
fn recoveries(nodes: &mut [Map<String, Value>]) -> Vec<Value> {
    struct Streak {
        first: usize,
        failures: u64,
        hashes: Vec<String>,
        identical: u64,
    }
    let s = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
    let mut open: HashMap<String, Streak> = HashMap::new();
    let mut done: Vec<(Streak, Option<usize>)> = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        if s(node, "stage").as_deref() != Some("call") {
            continue;
        }
        let Some(tool) = s(node, "tool") else {
            continue;
        };
        let failed = s(node, "status").as_deref().is_some_and(Status::is_failed);
        let hash = s(node, "input_sha256");
        match open.get_mut(&tool) {
            Some(st) => {
                if let Some(h) = &hash {
                    if st.hashes.contains(h) {
                        st.identical += 1;
                    } else if failed {
                        st.hashes.push(h.clone());
                    }
                }
                if failed {
                    st.failures += 1;
                } else if let Some(st) = open.remove(&tool) {
                    done.push((st, Some(i)));
                }
            }
            None if failed => {
                open.insert(
                    tool,
                    Streak {
                        first: i,
                        failures: 1,
                        hashes: hash.into_iter().collect(),
                        identical: 0,
                    },
                );
            }
            None => {}
        }
    }
    done.extend(open.into_values().map(|st| (st, None)));
    done.sort_by_key(|(st, _)| st.first);
    let mut out = Vec::with_capacity(done.len());
    for (st, by) in done {
        let recovery = json!({
            "tool": nodes[st.first].get("tool").cloned().unwrap_or(Value::Null),
            "span_id": nodes[st.first].get("span_id").cloned().unwrap_or(Value::Null),
            "failures": st.failures,
            "recovered": by.is_some(),
            "calls_to_recovery": by.map(|_| st.failures + 1),
            "recovered_by_span_id": by.and_then(|b| nodes[b].get("span_id").cloned()),
            "identical_retries": st.identical,
            "hammering": st.identical >= 2,
        });
        nodes[st.first].insert("recovery".into(), recovery.clone());
        out.push(recovery);
    }
    out
}

/// Builds the tree of one trace from its rows, ordered by start time.
pub fn build(trace_id: &str, rows: Vec<Value>, truncated: bool) -> Value {
    let mut nodes: Vec<Map<String, Value>> = Vec::with_capacity(rows.len());
    let mut index: HashMap<String, usize> = HashMap::new();
    for row in rows {
        let Value::Object(map) = row else { continue };
        let id = map
            .get("span_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        index.entry(id).or_insert(nodes.len());
        nodes.push(node(map));
    }
    let recoveries = recoveries(&mut nodes);
    let n = nodes.len();
    let span_count = n;
    let error_count = nodes
        .iter()
        .filter(|m| {
            m.get("status")
                .and_then(Value::as_str)
                .is_some_and(Status::is_failed)
        })
        .count();
    let start = nodes
        .iter()
        .filter_map(|m| m.get("start_time"))
        .next()
        .cloned();
    let end = nodes
        .iter()
        .filter_map(|m| m.get("end_time").and_then(Value::as_str))
        .max()
        .map(|s| Value::String(s.to_string()));
    let duration_ms = nodes
        .iter()
        .filter(|m| m.get("parent_span_id").is_none_or(Value::is_null))
        .filter_map(|m| m.get("duration_ms").and_then(Value::as_f64))
        .fold(None::<f64>, |acc, d| Some(acc.map_or(d, |a| a.max(d))));

    // Parent of each node (an index), when the parent is in the trace and not a cycle.
    let mut parent: Vec<Option<usize>> = nodes
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.get("parent_span_id")
                .and_then(Value::as_str)
                .and_then(|p| index.get(p).copied())
                .filter(|p| *p != i)
        })
        .collect();
    // Cut cycles: walk up from each node; a node met twice on one walk loses its parent.
    for i in 0..n {
        let mut on_walk = std::collections::HashSet::new();
        let mut cur = i;
        while let Some(p) = parent[cur] {
            if !on_walk.insert(cur) {
                parent[cur] = None;
                break;
            }
            cur = p;
        }
    }
    // Depths, memoized: each node's depth is its parent's plus one.
    let mut depth: Vec<Option<usize>> = vec![None; n];
    for i in 0..n {
        let mut stack = Vec::new();
        let mut cur = i;
        let base = loop {
            if let Some(d) = depth[cur] {
                break d;
            }
            match parent[cur] {
                Some(p) => {
                    stack.push(cur);
                    cur = p;
                }
                None => {
                    depth[cur] = Some(0);
                    break 0;
                }
            }
        };
        for (k, node) in stack.iter().rev().enumerate() {
            depth[*node] = Some(base + k + 1);
        }
    }
    let mut depth: Vec<usize> = depth.into_iter().map(|d| d.unwrap_or(0)).collect();
    // Re-hang nodes deeper than MAX_DEPTH under their ancestor at MAX_DEPTH - 1.
    let mut by_depth: Vec<usize> = (0..n).collect();
    by_depth.sort_by_key(|i| depth[*i]);
    let mut anchor: Vec<Option<usize>> = vec![None; n];
    for &i in &by_depth {
        if depth[i] + 1 == MAX_DEPTH {
            anchor[i] = Some(i);
        } else if depth[i] >= MAX_DEPTH {
            anchor[i] = parent[i].and_then(|p| anchor[p]);
        }
    }
    for i in 0..n {
        if depth[i] > MAX_DEPTH {
            parent[i] = anchor[i];
            depth[i] = MAX_DEPTH;
        }
    }
    // Children lists in row order (rows come ordered by start time).
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut roots = Vec::new();
    for (i, p) in parent.iter().enumerate() {
        match p {
            Some(p) => children[*p].push(i),
            None => roots.push(i),
        }
    }
    // Assemble bottom-up (deepest first) so that no recursion is needed.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|i| std::cmp::Reverse(depth[*i]));
    let mut built: Vec<Option<Map<String, Value>>> = nodes.into_iter().map(Some).collect();
    for &i in &order {
        let kids: Vec<Value> = children[i]
            .iter()
            .filter_map(|c| built[*c].take().map(Value::Object))
            .collect();
        if let Some(m) = built[i].as_mut() {
            m.insert("depth".into(), json!(depth[i]));
            m.insert("children".into(), Value::Array(kids));
        }
    }
    let roots: Vec<Value> = roots
        .iter()
        .filter_map(|r| built[*r].take().map(Value::Object))
        .collect();
    json!({
        "trace_id": trace_id,
        "span_count": span_count,
        "error_count": error_count,
        "start_time": start,
        "end_time": end,
        "duration_ms": duration_ms,
        "truncated": truncated,
        "recoveries": recoveries,
        "roots": roots,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: &str, parent: Option<&str>, start: &str, status: &str) -> Value {
        json!({"span_id": id, "parent_span_id": parent, "start_time": start, "end_time": start,
               "status": status, "error_type": if status == "error" { json!("PARSE") } else { Value::Null },
               "error_code": null, "error_message": "bad json", "duration_ms": 1.0})
    }

    fn call(id: &str, tool: &str, status: &str, args: &str) -> Value {
        json!({"span_id": id, "parent_span_id": "root", "start_time": id, "end_time": id,
               "stage": "call", "tool": tool, "status": status, "input_sha256": args,
               "duration_ms": 1.0})
    }

    #[test]
    fn failure_streaks_in_the_trace_and_their_recovery() {
        let rows = vec![
            span("root", None, "0", "ok"),
            call("1", "search", "error", "a"),
            call("2", "fetch", "error", "x"),
            call("3", "search", "error", "a"),
            call("4", "search", "ok", "b"),
            call("5", "fetch", "error", "x"),
            call("6", "fetch", "error", "x"),
        ];
        let t = build("t", rows, false);
        assert_eq!(
            t["recoveries"],
            json!([
                {"tool": "search", "span_id": "1", "failures": 2, "recovered": true,
                 "calls_to_recovery": 3, "recovered_by_span_id": "4", "identical_retries": 1,
                 "hammering": false},
                {"tool": "fetch", "span_id": "2", "failures": 3, "recovered": false,
                 "calls_to_recovery": null, "recovered_by_span_id": null, "identical_retries": 2,
                 "hammering": true},
            ])
        );
        let first = &t["roots"][0]["children"][0];
        assert_eq!(first["span_id"], "1");
        assert_eq!(first["recovery"]["recovered_by_span_id"], "4");
        assert!(t["roots"][0]["children"][1]["recovery"]["hammering"] == true);
        assert!(t["roots"][0]["children"][2].get("recovery").is_none());
    }

    #[test]
    fn nests_children_in_row_order() {
        let rows = vec![
            span("a", None, "1", "ok"),
            span("b", Some("a"), "2", "error"),
            span("c", Some("a"), "3", "ok"),
            span("d", Some("b"), "4", "error"),
            span("orphan", Some("zz"), "5", "ok"),
        ];
        let t = build("t", rows, false);
        assert_eq!(t["span_count"], 5);
        assert_eq!(t["error_count"], 2);
        let roots = t["roots"].as_array().expect("roots");
        assert_eq!(roots.len(), 2);
        let a = &roots[0];
        let kids: Vec<&str> = a["children"]
            .as_array()
            .expect("children")
            .iter()
            .map(|c| c["span_id"].as_str().expect("id"))
            .collect();
        assert_eq!(kids, ["b", "c"]);
        assert_eq!(a["children"][0]["error"]["type"], "PARSE");
        assert_eq!(a["children"][0]["error"]["message"], "bad json");
        assert_eq!(a["children"][0]["children"][0]["span_id"], "d");
        assert!(a["error"].is_null());
        assert!(a.get("error_message").is_none());
    }

    #[test]
    fn cycles_and_deep_chains_stay_bounded() {
        let mut rows = vec![
            span("x", Some("y"), "1", "ok"),
            span("y", Some("x"), "2", "ok"),
        ];
        for i in 0..500 {
            let parent = if i == 0 {
                None
            } else {
                Some(format!("n{}", i - 1))
            };
            rows.push(span(&format!("n{i}"), parent.as_deref(), "3", "ok"));
        }
        let t = build("t", rows, false);
        assert_eq!(t["span_count"], 502);
        let text = serde_json::to_string(&t).expect("serializes");
        assert_eq!(
            text.matches("\"span_id\"").count(),
            502,
            "every span appears once"
        );
    }

    #[test]
    fn ids_are_validated() {
        assert_eq!(
            normalize_trace_id("4B4B4B4B4B4B4B4B4B4B4B4B4B4B4B4B").as_deref(),
            Some("4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b")
        );
        assert!(normalize_trace_id("4b4b").is_none());
        assert!(normalize_trace_id("zz4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b").is_none());
        assert!(valid_reference("err_7c1f9a"));
        assert!(!valid_reference("err'; DROP"));
        assert!(!valid_reference(""));
    }
}
