//! One logical tool call, one call span: two instrumentations of one call, a framework's own
//! retries, MCP under a framework's tool span, and the GenAI conventions' tool keys.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use super::super::assemble::{AssembleConfig, Assembler};
use super::super::*;
use super::classified;

const TRACE: &str = "7c1f9a0000000000000000000000beef";
const T0: u64 = 1_764_410_400_000_000_000;

/// One span of a fixture.
struct S {
    id: &'static str,
    parent: Option<&'static str>,
    scope: &'static str,
    name: &'static str,
    kind: u8,
    /// Start and end, in milliseconds after `T0`.
    at: (u64, u64),
    attrs: serde_json::Value,
    /// Status code: 0 unset, 1 ok, 2 error.
    status: u8,
    /// Events: (name, attributes).
    events: Vec<(&'static str, serde_json::Value)>,
}

fn s(
    id: &'static str,
    parent: Option<&'static str>,
    scope: &'static str,
    name: &'static str,
    at: (u64, u64),
    attrs: serde_json::Value,
    status: u8,
) -> S {
    S {
        id,
        parent,
        scope,
        name,
        kind: 1,
        at,
        attrs,
        status,
        events: Vec::new(),
    }
}

fn attr(k: &str, v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Bool(b) => json!({"key": k, "value": {"boolValue": b}}),
        serde_json::Value::Number(n) => json!({"key": k, "value": {"intValue": n.to_string()}}),
        other => json!({"key": k, "value": {"stringValue": other.as_str().unwrap_or_default()}}),
    }
}

fn attrs(v: &serde_json::Value) -> Vec<serde_json::Value> {
    v.as_object()
        .map(|o| o.iter().map(|(k, v)| attr(k, v)).collect())
        .unwrap_or_default()
}

/// One OTLP/JSON request holding `spans`, a scope per distinct scope name.
fn request(spans: &[&S]) -> Vec<u8> {
    let mut scopes: Vec<(&str, Vec<serde_json::Value>)> = Vec::new();
    for sp in spans {
        let ms = |m: u64| (T0 + m * 1_000_000).to_string();
        let mut j = json!({
            "traceId": TRACE, "spanId": sp.id, "name": sp.name, "kind": sp.kind,
            "startTimeUnixNano": ms(sp.at.0), "endTimeUnixNano": ms(sp.at.1),
            "attributes": attrs(&sp.attrs),
            "events": sp.events.iter().map(|(n, a)| json!({
                "timeUnixNano": ms(sp.at.1), "name": n, "attributes": attrs(a)})).collect::<Vec<_>>(),
            "status": {"code": sp.status}
        });
        if let Some(p) = sp.parent {
            j["parentSpanId"] = json!(p);
        }
        match scopes.iter_mut().find(|(n, _)| *n == sp.scope) {
            Some((_, v)) => v.push(j),
            None => scopes.push((sp.scope, vec![j])),
        }
    }
    let scope_spans: Vec<_> = scopes
        .into_iter()
        .map(|(n, v)| json!({"scope": {"name": n}, "spans": v}))
        .collect();
    serde_json::to_vec(&json!({"resourceSpans": [{
        "resource": {"attributes": [attr("service.name", &json!("two-instrumentations"))]},
        "scopeSpans": scope_spans}]}))
    .expect("json")
}

/// Per span id: [tool, stage, call_id, attempt, status, error_type].
fn rows(p: &Pipeline, spans: &[&S]) -> BTreeMap<String, Vec<String>> {
    let out = p
        .process_bytes(&request(spans), Encoding::Json)
        .expect("process");
    classified(&[out.batch])
}

fn row(r: &BTreeMap<String, Vec<String>>, id: &str) -> Vec<String> {
    r.get(id).unwrap_or_else(|| panic!("no row {id}")).clone()
}

fn v(x: [&str; 6]) -> Vec<String> {
    x.iter().map(|s| s.to_string()).collect()
}

fn calls(r: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    r.iter()
        .filter(|(_, v)| v[1] == "call")
        .map(|(k, _)| k.clone())
        .collect()
}

fn agent() -> S {
    s(
        "a000000000000001",
        None,
        "pydantic-ai",
        "invoke_agent docs_agent",
        (0, 5000),
        json!({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "docs_agent"}),
        1,
    )
}

/// The framework's own tool span and, inside it, OpenInference's span of the same call.
fn native_and_openinference(native_status: u8, oi_status: u8) -> (S, S) {
    let native = s(
        "b000000000000001",
        Some("a000000000000001"),
        "pydantic-ai",
        "execute_tool search_docs",
        (100, 900),
        json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
               "gen_ai.tool.call.id": "call_01", "gen_ai.tool.type": "function"}),
        native_status,
    );
    let mut oi = s(
        "b000000000000002",
        Some("b000000000000001"),
        "openinference.instrumentation.pydantic_ai",
        "search_docs",
        (110, 890),
        json!({"openinference.span.kind": "TOOL", "tool.name": "search_docs",
               "input.value": "{\"query\": \"install\"}"}),
        oi_status,
    );
    if oi_status == 2 {
        oi.events.push((
            "exception",
            json!({"exception.type": "httpx.ConnectError",
                   "exception.message": "All connection attempts failed"}),
        ));
    }
    (native, oi)
}

#[test]
fn two_instrumentations_of_one_call_are_one_call() {
    let p = Pipeline::builtin();
    let a = agent();
    // The framework's span says OK, OpenInference's inside it says the tool was not reached:
    // one call, failed, NETWORK; the inner span is kept as `other`.
    let (native, oi) = native_and_openinference(1, 2);
    let r = rows(&p, &[&a, &native, &oi]);
    assert_eq!(calls(&r), vec!["b000000000000001"], "{r:#?}");
    assert_eq!(
        row(&r, "b000000000000001"),
        v(["search_docs", "call", "call_01", "1", "error", "NETWORK"])
    );
    assert_eq!(
        row(&r, "b000000000000002"),
        v(["search_docs", "other", "call_01", "", "error", "NETWORK"])
    );
    // Both OK: one call, ok.
    let (native, oi) = native_and_openinference(1, 1);
    let r = rows(&p, &[&a, &native, &oi]);
    assert_eq!(calls(&r), vec!["b000000000000001"]);
    assert_eq!(r["b000000000000001"][4], "ok");
}

#[test]
fn the_inner_span_arriving_first_gives_the_same_rows() {
    let p = Pipeline::builtin();
    let a = agent();
    let (native, oi) = native_and_openinference(1, 2);
    let whole = rows(&p, &[&a, &native, &oi]);
    // As exporters send them: the inner span first, then the framework's, then the agent's.
    assert_eq!(assembled(&p, &[&oi, &native, &a]), whole);
    assert_eq!(assembled(&Pipeline::builtin(), &[&native, &oi, &a]), whole);
}

#[test]
fn overlapping_spans_of_two_instrumentations_under_one_parent_are_one_call() {
    let p = Pipeline::builtin();
    let a = agent();
    let native = s(
        "c000000000000001",
        Some("a000000000000001"),
        "agno",
        "search_docs",
        (100, 900),
        json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs"}),
        1,
    );
    let mut oi = s(
        "c000000000000002",
        Some("a000000000000001"),
        "openinference.instrumentation.agno",
        "search_docs",
        (105, 905),
        json!({"openinference.span.kind": "TOOL", "tool.name": "search_docs"}),
        2,
    );
    oi.events.push((
        "exception",
        json!({"exception.type": "json.decoder.JSONDecodeError",
               "exception.message": "Expecting value: line 1 column 1 (char 0)"}),
    ));
    let r = rows(&p, &[&a, &native, &oi]);
    // The failed one is the call.
    assert_eq!(calls(&r), vec!["c000000000000002"], "{r:#?}");
    assert_eq!(r["c000000000000002"][4..], ["error", "PARSE"]);
    assert_eq!(r["c000000000000001"][1], "other");

    // Two calls of one tool at once from one instrumentation are two calls.
    let mut twin = s(
        "c000000000000003",
        Some("a000000000000001"),
        "agno",
        "search_docs",
        (120, 700),
        json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs"}),
        1,
    );
    twin.kind = 1;
    let r = rows(&p, &[&a, &native, &twin]);
    assert_eq!(calls(&r).len(), 2, "{r:#?}");
}

/// OpenInference's CrewAI spans: a framework that runs a failing tool again, each run a span
/// with a rising `tool.run_attempts`.
fn crewai_runs(last_fails: bool) -> Vec<S> {
    let mut out = vec![s(
        "a000000000000001",
        None,
        "openinference.instrumentation.crewai",
        "Crew.kickoff",
        (0, 9000),
        json!({"openinference.span.kind": "CHAIN"}),
        1,
    )];
    let ids = ["d000000000000001", "d000000000000002", "d000000000000003"];
    for (k, id) in ids.into_iter().enumerate() {
        let failed = k < 2 || last_fails;
        let start = 100 + k as u64 * 1000;
        let mut run = s(
            id,
            Some("a000000000000001"),
            "openinference.instrumentation.crewai",
            "search_docs.run",
            (start, start + 500),
            json!({"openinference.span.kind": "TOOL", "tool.name": "search_docs",
                   "tool.run_attempts": k as i64 + 1}),
            if failed { 2 } else { 1 },
        );
        if failed {
            run.events.push((
                "exception",
                json!({"exception.type": "httpx.ReadTimeout", "exception.message": "timed out"}),
            ));
        }
        out.push(run);
    }
    out
}

#[test]
fn a_framework_retrying_a_tool_three_times_is_one_call_of_three_attempts() {
    let p = Pipeline::builtin();
    let spans = crewai_runs(true);
    let r = rows(&p, &spans.iter().collect::<Vec<_>>());
    assert_eq!(calls(&r), vec!["d000000000000003"], "{r:#?}");
    // Runs that name no call id take the first run's span id as theirs.
    assert_eq!(
        row(&r, "d000000000000003"),
        v([
            "search_docs",
            "call",
            "d000000000000001",
            "3",
            "error",
            "RETRY_EXHAUSTED"
        ])
    );
    assert_eq!(
        row(&r, "d000000000000001"),
        v([
            "search_docs",
            "attempt",
            "d000000000000001",
            "1",
            "error",
            "TOOL_ERROR"
        ])
    );
    assert_eq!(
        r["d000000000000002"][1..4],
        ["attempt", "d000000000000001", "2"]
    );

    // The third run succeeds: one call, ok, after three attempts.
    let spans = crewai_runs(false);
    let r = rows(&p, &spans.iter().collect::<Vec<_>>());
    assert_eq!(calls(&r), vec!["d000000000000003"]);
    assert_eq!(r["d000000000000003"][3..5], ["3", "ok"]);
}

#[test]
fn repeated_execution_spans_of_one_call_id_are_its_attempts() {
    let p = Pipeline::builtin();
    let a = agent();
    let run = |id: &'static str, at: (u64, u64), status: u8| {
        s(
            id,
            Some("a000000000000001"),
            "pydantic-ai",
            "execute_tool search_docs",
            at,
            json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
                   "gen_ai.tool.call.id": "call_07"}),
            status,
        )
    };
    let (r1, r2) = (
        run("e000000000000001", (100, 200), 2),
        run("e000000000000002", (300, 400), 1),
    );
    let r = rows(&p, &[&a, &r1, &r2]);
    assert_eq!(calls(&r), vec!["e000000000000002"], "{r:#?}");
    assert_eq!(
        row(&r, "e000000000000002"),
        v(["search_docs", "call", "call_07", "2", "ok", ""])
    );
    assert_eq!(
        r["e000000000000001"][1..5],
        ["attempt", "call_07", "1", "error"]
    );
    // Calls of one tool with their own call ids stay calls (the model called again).
    let mut other = run("e000000000000003", (500, 600), 1);
    other.attrs["gen_ai.tool.call.id"] = json!("call_08");
    let r = rows(&p, &[&a, &r1, &r2, &other]);
    assert_eq!(calls(&r), vec!["e000000000000002", "e000000000000003"]);
}

/// A framework's tool span, the MCP client's `tools/call` span under it and the MCP server's
/// under that (trace context carried in `params._meta`).
fn framework_mcp(rpc_code: Option<&str>) -> Vec<S> {
    let failed = rpc_code.is_some();
    let mcp = |code: Option<&str>| {
        let mut a = json!({"mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool",
                           "gen_ai.tool.name": "search_docs", "jsonrpc.request.id": "2",
                           "mcp.protocol.version": "2025-06-18"});
        if let Some(c) = code {
            a["rpc.response.status_code"] = json!(c);
            a["error.type"] = json!(c);
        }
        a
    };
    let mut client = s(
        "f000000000000002",
        Some("f000000000000001"),
        "mcp-python-sdk",
        "tools/call search_docs",
        (110, 890),
        mcp(rpc_code),
        if failed { 2 } else { 0 },
    );
    client.kind = 3;
    // The server's span names no operation: its method says what it is.
    let mut server_attrs = mcp(rpc_code);
    server_attrs
        .as_object_mut()
        .expect("object")
        .remove("gen_ai.operation.name");
    let mut server = s(
        "f000000000000003",
        Some("f000000000000002"),
        "mcp-python-sdk",
        "tools/call search_docs",
        (120, 880),
        server_attrs,
        if failed { 2 } else { 0 },
    );
    server.kind = 2;
    vec![
        agent(),
        s(
            "f000000000000001",
            Some("a000000000000001"),
            "pydantic-ai",
            "execute_tool search_docs",
            (100, 900),
            json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
                   "gen_ai.tool.call.id": "call_mcp"}),
            1,
        ),
        client,
        server,
    ]
}

#[test]
fn mcp_spans_annotate_the_frameworks_tool_call() {
    let p = Pipeline::builtin();
    let spans = framework_mcp(Some("-32602"));
    let r = rows(&p, &spans.iter().collect::<Vec<_>>());
    assert_eq!(calls(&r), vec!["f000000000000001"], "{r:#?}");
    // JSON-RPC's Invalid params: the server rejected the arguments.
    assert_eq!(
        row(&r, "f000000000000001"),
        v(["search_docs", "call", "call_mcp", "1", "error", "PREPARE"])
    );
    assert_eq!(r["f000000000000002"][1], "other");
    assert_eq!(r["f000000000000003"][1], "other");
    let spans = framework_mcp(None);
    let r = rows(&p, &spans.iter().collect::<Vec<_>>());
    assert_eq!(calls(&r), vec!["f000000000000001"]);
    assert_eq!(r["f000000000000001"][4], "ok");
}

#[test]
fn an_mcp_server_span_alone_is_the_call() {
    let p = Pipeline::builtin();
    let spans = framework_mcp(Some("-32602"));
    // Only the server's span, under a parent no one sent.
    let r = rows(&p, &[&spans[3]]);
    assert_eq!(
        row(&r, "f000000000000003"),
        v(["search_docs", "call", "", "1", "error", "PREPARE"])
    );
}

#[test]
fn the_sdk_inside_a_frameworks_tool_span_is_the_call() {
    let p = Pipeline::builtin();
    let a = agent();
    let native = s(
        "1000000000000001",
        Some("a000000000000001"),
        "pydantic-ai",
        "execute_tool update_ticket",
        (100, 900),
        json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "update_ticket",
               "gen_ai.tool.call.id": "call_sdk",
               "gen_ai.tool.call.result": "{\"error\": {\"code\": \"invalid_status\", \"class\": \"invalid_request\", \"message\": \"status must be open\"}}"}),
        1,
    );
    let sdk = s(
        "1000000000000002",
        Some("1000000000000001"),
        "toolspan",
        "execute_tool update_ticket",
        (110, 890),
        json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "update_ticket",
               "gen_ai.tool.call.id": "call_sdk", "toolspan.attempts": 1,
               "toolspan.error.code": "invalid_status", "toolspan.error.class": "invalid_request"}),
        2,
    );
    let prepare = s(
        "1000000000000003",
        Some("1000000000000002"),
        "toolspan",
        "update_ticket prepare",
        (115, 120),
        json!({"toolspan.stage": "prepare", "toolspan.attempt": 1, "gen_ai.tool.name": "update_ticket",
               "gen_ai.tool.call.id": "call_sdk"}),
        2,
    );
    let r = rows(&p, &[&a, &native, &sdk, &prepare]);
    assert_eq!(calls(&r), vec!["1000000000000002"], "{r:#?}");
    assert_eq!(r["1000000000000002"][4..], ["error", "PREPARE"]);
    assert_eq!(r["1000000000000001"][1], "other");
}

#[test]
fn the_genai_tool_exception_event_is_read() {
    let p = Pipeline::builtin();
    let a = agent();
    let mut tool = s(
        "2000000000000001",
        Some("a000000000000001"),
        "acme_agents",
        "execute_tool fetch_url",
        (100, 900),
        json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fetch_url",
               "gen_ai.tool.call.id": "call_ev", "gen_ai.tool.type": "extension",
               "gen_ai.conversation.id": "conv_1"}),
        2,
    );
    tool.events.push((
        "gen_ai.execute_tool.exception",
        json!({"exception.type": "httpx.ConnectTimeout", "exception.message": "connect timeout"}),
    ));
    let r = rows(&p, &[&a, &tool]);
    assert_eq!(
        row(&r, "2000000000000001"),
        v(["fetch_url", "call", "call_ev", "1", "error", "NETWORK"])
    );
}

/// `spans` sent one request each, in the given order, through an assembler; the rows.
fn assembled(p: &Pipeline, spans: &[&S]) -> BTreeMap<String, Vec<String>> {
    let mut asm: Assembler<usize> = Assembler::new(AssembleConfig::default());
    let mut acc = Accumulator::new();
    let t0 = Instant::now();
    for (i, piece) in spans.iter().enumerate() {
        asm.offer(
            p,
            &request(&[piece]),
            Encoding::Json,
            0,
            i,
            t0 + Duration::from_millis(i as u64),
            &mut acc,
        )
        .expect("offer");
    }
    asm.expire(p, t0 + Duration::from_secs(3600), &mut acc);
    classified(&[acc.take().expect("batch").expect("rows")])
}

#[test]
fn overlapping_spans_sent_apart_give_the_same_rows() {
    let a = agent();
    let native = s(
        "c000000000000001",
        Some("a000000000000001"),
        "agno",
        "execute_tool search_docs",
        (100, 900),
        json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
               "gen_ai.tool.call.id": "call_09"}),
        1,
    );
    // Failed, without children: it waits until its wait runs out, and the span of the other
    // instrumentation, whose row depends on it, waits with it.
    let oi = s(
        "c000000000000002",
        Some("a000000000000001"),
        "openinference.instrumentation.agno",
        "search_docs",
        (105, 905),
        json!({"openinference.span.kind": "TOOL", "tool.name": "search_docs"}),
        2,
    );
    let whole = rows(&Pipeline::builtin(), &[&a, &native, &oi]);
    assert_eq!(calls(&whole), vec!["c000000000000002"]);
    assert_eq!(
        whole["c000000000000002"][2], "call_09",
        "the call takes its mirror's call id"
    );
    // As exporters send spans (each when it ends, children before their parent); a mirror
    // that comes after its parent, once its partner was written, is not merged (docs).
    for order in [[&native, &oi, &a], [&oi, &native, &a]] {
        assert_eq!(assembled(&Pipeline::builtin(), &order), whole);
    }
}

#[test]
fn spans_of_one_call_are_released_together() {
    let a = agent();
    let native = s(
        "c000000000000001",
        Some("a000000000000001"),
        "agno",
        "execute_tool search_docs",
        (100, 900),
        json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs"}),
        1,
    );
    let oi = s(
        "c000000000000002",
        Some("a000000000000001"),
        "openinference.instrumentation.agno",
        "search_docs",
        (105, 905),
        json!({"openinference.span.kind": "TOOL", "tool.name": "search_docs"}),
        2,
    );
    let p = Pipeline::builtin();
    let whole = rows(&p, &[&a, &native, &oi]);
    let p = Pipeline::builtin();
    let mut asm: Assembler<usize> = Assembler::new(AssembleConfig::default());
    let mut acc = Accumulator::new();
    let t0 = Instant::now();
    // The failed call waits for a failing child that never comes; the other instrumentation's
    // span of it came 2 s before it: when that one's wait runs out, both go.
    for (i, (piece, at)) in [(&native, 0), (&oi, 2000), (&a, 2100)]
        .into_iter()
        .enumerate()
    {
        asm.offer(
            &p,
            &request(&[piece]),
            Encoding::Json,
            i as u64,
            i,
            t0 + Duration::from_millis(at),
            &mut acc,
        )
        .expect("offer");
    }
    let out = asm.expire(&p, t0 + Duration::from_millis(5500), &mut acc);
    let mut released = out.released;
    released.sort_unstable();
    assert_eq!(released, vec![0, 1], "the two spans of the call, together");
    // (The agent's row was written when it came: nothing of it waited.)
    assert_eq!(
        classified(&[acc.take().expect("batch").expect("rows")]),
        whole
    );
}
