//! Classification by meaning, not by names: failures as frameworks outside the corpus record
//! them (tool, model and exception names none of the built-in rules spell out) get the error
//! type of what failed — the model's arguments or the tool's answer — from what the signal
//! says. One test per general cause.

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray};
use serde_json::{json, Value};
use toolspan_pipeline::{Encoding, Pipeline};
use toolspan_schema::columns::col;

const TRACE: &str = "7c0ffee0000000000000000000000001";

/// A tool span of a foreign instrumentation: id, attributes, status code (2 = ERROR) and
/// message, and exception events as (type, message).
struct Tool<'a> {
    id: &'a str,
    name: &'a str,
    attrs: Value,
    status: (u8, &'a str),
    exceptions: &'a [(&'a str, &'a str)],
}

fn tool<'a>(id: &'a str, attrs: Value, message: &'a str) -> Tool<'a> {
    Tool {
        id,
        name: "lookup_order",
        attrs,
        status: (2, message),
        exceptions: &[],
    }
}

/// OpenInference's tool span of `lookup_order`, with the recorded arguments when given.
fn oi(arguments: Option<Value>) -> Value {
    let mut a = json!({"openinference.span.kind": "TOOL", "tool.name": "lookup_order"});
    if let Some(args) = arguments {
        a["input.value"] = Value::String(args.to_string());
    }
    a
}

fn attr(k: &str, v: &Value) -> Value {
    match v {
        Value::Bool(b) => json!({"key": k, "value": {"boolValue": b}}),
        Value::Number(n) => json!({"key": k, "value": {"intValue": n.to_string()}}),
        other => json!({"key": k, "value": {"stringValue": other.as_str().unwrap_or_default()}}),
    }
}

/// One OTLP/JSON request: an agent root and the tools under it, from the instrumentation
/// scope `scope` of an SDK whose resource says `telemetry.sdk.name = sdk`.
fn request(scope: &str, sdk: &str, tools: &[Tool<'_>]) -> Vec<u8> {
    let t0 = 1_795_946_400_000_000_000u64;
    let mut spans = vec![json!({
        "traceId": TRACE, "spanId": "a000000000000001", "name": "orders_agent.run", "kind": 1,
        "startTimeUnixNano": t0.to_string(), "endTimeUnixNano": (t0 + 9_000_000_000).to_string(),
        "attributes": [attr("openinference.span.kind", &json!("AGENT"))],
        "status": {"code": 1}
    })];
    for (i, t) in tools.iter().enumerate() {
        let start = t0 + (i as u64 + 1) * 100_000_000;
        let events: Vec<Value> = t
            .exceptions
            .iter()
            .map(|(ty, msg)| {
                json!({"name": "exception", "timeUnixNano": (start + 1).to_string(),
                       "attributes": [attr("exception.type", &json!(ty)),
                                      attr("exception.message", &json!(msg))]})
            })
            .collect();
        spans.push(json!({
            "traceId": TRACE, "spanId": t.id, "parentSpanId": "a000000000000001",
            "name": t.name, "kind": 1,
            "startTimeUnixNano": start.to_string(), "endTimeUnixNano": (start + 50_000_000).to_string(),
            "attributes": t.attrs.as_object().unwrap().iter().map(|(k, v)| attr(k, v)).collect::<Vec<_>>(),
            "events": events,
            "status": {"code": t.status.0, "message": t.status.1}
        }));
    }
    serde_json::to_vec(&json!({"resourceSpans": [{
        "resource": {"attributes": [attr("service.name", &json!("orders")),
                                    attr("telemetry.sdk.name", &json!(sdk))]},
        "scopeSpans": [{"scope": {"name": scope}, "spans": spans}]}]}))
    .unwrap()
}

/// Per span id: (status, error type, tool).
fn rows(p: &Pipeline, body: &[u8]) -> BTreeMap<String, (String, String, String)> {
    let out = p.process_bytes(body, Encoding::Json).expect("process");
    let b = &out.batch;
    let s = |n: &str| b.column_by_name(n).unwrap().as_string::<i32>().clone();
    let (ids, status, et, tool) = (
        s(col::SPAN_ID),
        s(col::STATUS),
        s(col::ERROR_TYPE),
        s(col::TOOL),
    );
    (0..b.num_rows())
        .map(|r| {
            let et = if et.is_null(r) {
                String::new()
            } else {
                et.value(r).to_string()
            };
            (
                ids.value(r).to_string(),
                (status.value(r).to_string(), et, tool.value(r).to_string()),
            )
        })
        .collect()
}

fn error_types(p: &Pipeline, scope: &str, tools: &[Tool<'_>]) -> BTreeMap<String, String> {
    rows(p, &request(scope, "opentelemetry", tools))
        .into_iter()
        .filter(|(id, _)| tools.iter().any(|t| t.id == id))
        .map(|(id, (_, et, _))| (id, et))
        .collect()
}

fn expect(got: &BTreeMap<String, String>, want: &[(&str, &str)], what: &str) {
    let want: BTreeMap<String, String> = want
        .iter()
        .map(|(id, et)| (id.to_string(), et.to_string()))
        .collect();
    assert_eq!(got, &want, "{what}");
}

/// A pydantic validation error is about the arguments or the answer by what it validated: the
/// failing field is one of the call's arguments (whatever the model is called), or the model
/// says it holds the input or the answer; a CamelCase name alone does not make it the answer,
/// nor a snake_case one the arguments.
#[test]
fn which_object_failed_validation_decides_not_how_its_model_is_named() {
    let p = Pipeline::builtin();
    let args = json!({"order_id": "A-17", "include_items": "maybe"});
    let bad_field = "1 validation error for OrderLookupParams\ninclude_items\n  Input should be a valid boolean, unable to interpret input [type=bool_parsing, input_value='maybe', input_type=str]";
    let answer_missing = "1 validation error for lookup_order_result\nstatus\n  Field required [type=missing, input_value={'state': 'open', 'items': []}, input_type=dict]";
    let answer_type = "1 validation error for orders_v2\nitems\n  Input should be a valid list [type=list_type, input_value='none', input_type=str]";
    let got = error_types(
        &p,
        "openinference.instrumentation.acme",
        &[
            // Arguments recorded: the failing field is one of them.
            tool("b000000000000001", oi(Some(args.clone())), bad_field),
            // The answer's model named in snake_case: its field is no argument.
            tool("b000000000000002", oi(Some(args.clone())), answer_missing),
            tool("b000000000000003", oi(Some(args.clone())), answer_type),
            // No arguments recorded: the model's name says what it holds, in either case.
            tool(
                "b000000000000004",
                oi(None),
                "1 validation error for LookupOrderInput\norder_id\n  Field required",
            ),
            tool(
                "b000000000000005",
                oi(None),
                "2 validation errors for OrderToolArgs\norder_id\n  Input should be a valid string",
            ),
            tool(
                "b000000000000006",
                oi(None),
                "1 validation error for order_lookup_response\nstatus\n  Field required",
            ),
            // A tool's schema class and an answer's, by their words.
            tool(
                "b000000000000007",
                oi(None),
                "Arguments rejected: 1 validation error for LookupOrderToolSchema\norder_id\n  Input should be a valid string",
            ),
            tool(
                "b000000000000008",
                oi(None),
                "1 validation error for OrderResultSchema\nstatus\n  Field required",
            ),
        ],
    );
    expect(
        &got,
        &[
            ("b000000000000001", "PREPARE"),
            ("b000000000000002", "PARSE"),
            ("b000000000000003", "PARSE"),
            ("b000000000000004", "PREPARE"),
            ("b000000000000005", "PREPARE"),
            ("b000000000000006", "PARSE"),
            ("b000000000000007", "PREPARE"),
            ("b000000000000008", "PARSE"),
        ],
        "validation errors by what they validated",
    );
}

/// `error.type=TOOL_ERROR` from an instrumentation that writes it for any tool error is a
/// signal: the rules read the failure (here, rejected arguments) first. The same value is
/// explicit on spans that follow toolspan's conventions, or from an instrumentation a rules
/// file declares to mean toolspan's taxonomy.
#[test]
fn an_upper_case_error_type_is_explicit_only_where_it_means_the_taxonomy() {
    let rejected = |id| {
        let mut a = oi(Some(json!({"order_id": 17})));
        a["error.type"] = json!("TOOL_ERROR");
        tool(
            id,
            a,
            "Invalid arguments for tool lookup_order: order_id must be a string",
        )
    };
    let builtin = Pipeline::builtin();
    expect(
        &error_types(&builtin, "acme.agents", &[rejected("c000000000000001")]),
        &[("c000000000000001", "PREPARE")],
        "a foreign TOOL_ERROR is a signal",
    );
    // Nothing else to go on: the signal is the fallback.
    let mut bare = oi(None);
    bare["error.type"] = json!("NETWORK");
    expect(
        &error_types(
            &builtin,
            "acme.agents",
            &[tool("c000000000000002", bare, "call failed")],
        ),
        &[("c000000000000002", "NETWORK")],
        "the signal when nothing else decides",
    );
    // toolspan's conventions on the span: explicit.
    let mut ours = oi(Some(json!({"order_id": 17})));
    ours["error.type"] = json!("TOOL_ERROR");
    ours["toolspan.error.code"] = json!("order_locked");
    expect(
        &error_types(
            &builtin,
            "acme.agents",
            &[tool(
                "c000000000000003",
                ours,
                "Invalid arguments for tool lookup_order",
            )],
        ),
        &[("c000000000000003", "TOOL_ERROR")],
        "explicit with toolspan's conventions",
    );
    // A rules file declares the instrumentation's scope: explicit.
    let declared = Pipeline::new(
        Some("[[taxonomy]]\nid = \"acme\"\nscope = \"acme\\\\.agents\"\n"),
        &[],
    )
    .expect("a taxonomy declaration");
    expect(
        &error_types(&declared, "acme.agents", &[rejected("c000000000000004")]),
        &[("c000000000000004", "TOOL_ERROR")],
        "explicit where declared",
    );
}

/// An argument the framework could not convert to the declared type is a rejected argument:
/// the framework's own exception for it, or its words.
#[test]
fn an_argument_the_framework_could_not_convert_is_a_rejected_argument() {
    let p = Pipeline::builtin();
    let mut with_exception = tool("d000000000000001", oi(None), "conversion failed");
    with_exception.exceptions = &[(
        "acme.tools.errors.ToolArgumentCoercionError",
        "'many' for limit",
    )];
    let got = error_types(
        &p,
        "acme.agents",
        &[
            with_exception,
            tool(
                "d000000000000002",
                oi(None),
                "Could not convert argument 'limit' to int: 'many'",
            ),
            tool(
                "d000000000000003",
                oi(None),
                "ValueError: Arg limit is invalid: 'many' is not of type 'integer'",
            ),
        ],
    );
    expect(
        &got,
        &[
            ("d000000000000001", "PREPARE"),
            ("d000000000000002", "PREPARE"),
            ("d000000000000003", "PREPARE"),
        ],
        "conversion failures",
    );
}

/// A framework that passes the model's arguments straight to the tool function records
/// Python's own words when they do not fit its signature: the call never ran, the arguments
/// were rejected.
#[test]
fn arguments_the_tool_function_does_not_take_are_rejected_arguments() {
    let p = Pipeline::builtin();
    let got = error_types(
        &p,
        "acme.agents",
        &[
            tool(
                "d100000000000001",
                oi(Some(json!({"ordr_id": "A-17"}))),
                "lookup_order() got an unexpected keyword argument 'ordr_id'",
            ),
            tool(
                "d100000000000002",
                oi(Some(json!({}))),
                "Error: lookup_order() missing 1 required positional argument: 'order_id'",
            ),
            // The tool's own TypeError on a value is not about its signature.
            tool(
                "d100000000000003",
                oi(Some(json!({"order_id": "A-17"}))),
                "unsupported operand type(s) for +: 'int' and 'str'",
            ),
        ],
    );
    expect(
        &got,
        &[
            ("d100000000000001", "PREPARE"),
            ("d100000000000002", "PREPARE"),
            ("d100000000000003", "TOOL_ERROR"),
        ],
        "Python's call-binding errors",
    );
}

/// Python renders a `KeyError` as the quoted key alone; recorded as text only, after whatever
/// prefix the framework adds, it is read as the `KeyError` it is: a key missing from the data
/// the tool read (`PARSE`), as when its type is recorded.
#[test]
fn a_key_error_is_parse_whether_its_type_or_only_its_text_is_recorded() {
    let p = Pipeline::builtin();
    let mut typed = tool("e000000000000001", oi(None), "'status'");
    typed.exceptions = &[("KeyError", "'status'")];
    let got = error_types(
        &p,
        "acme.agents",
        &[
            typed,
            tool("e000000000000002", oi(None), "'status'"),
            tool(
                "e000000000000003",
                oi(None),
                "Error executing tool lookup_order: 'status'",
            ),
            tool(
                "e000000000000004",
                json!({"openinference.span.kind": "TOOL", "tool.name": "lookup_order",
                       "output.value": "{\"error\": \"'status'\"}"}),
                "{'error': \"'status'\"}",
            ),
            tool(
                "e000000000000006",
                oi(None),
                "Execution error in lookup_order: 'status'",
            ),
            // The exception's class and text, as frameworks format them.
            tool(
                "e000000000000008",
                oi(None),
                "Error executing tool 'lookup_order' with arguments {'order_id': 'A-17'}: KeyError: 'status'",
            ),
            tool("e000000000000009", oi(None), "KeyError('status')"),
            // Not a key: texts that happen to end in a quoted name.
            tool(
                "e000000000000005",
                oi(None),
                "order A-17 is locked by 'billing'",
            ),
            tool(
                "e000000000000007",
                oi(None),
                "[Errno 2] No such file or directory: 'orders.csv'",
            ),
        ],
    );
    expect(
        &got,
        &[
            ("e000000000000001", "PARSE"),
            ("e000000000000002", "PARSE"),
            ("e000000000000003", "PARSE"),
            ("e000000000000004", "PARSE"),
            ("e000000000000005", "TOOL_ERROR"),
            ("e000000000000006", "PARSE"),
            ("e000000000000007", "TOOL_ERROR"),
            ("e000000000000008", "PARSE"),
            ("e000000000000009", "PARSE"),
        ],
        "KeyError texts",
    );
}

/// A tool span that names its tool only in the span name (OpenInference's DSPy instrumentor:
/// `lookup_order.__call__`) is stored under that tool, not `_none`.
#[test]
fn a_tool_named_only_by_its_span_name_is_stored_under_it() {
    let p = Pipeline::builtin();
    let span = Tool {
        id: "f000000000000001",
        name: "lookup_order.__call__",
        attrs: json!({"openinference.span.kind": "TOOL"}),
        status: (2, "ConnectError: All connection attempts failed"),
        exceptions: &[],
    };
    let got = rows(
        &p,
        &request(
            "openinference.instrumentation.dspy",
            "opentelemetry",
            &[span],
        ),
    );
    let (status, et, tool) = &got["f000000000000001"];
    assert_eq!(
        (status.as_str(), et.as_str(), tool.as_str()),
        ("error", "NETWORK", "lookup_order")
    );
}

/// Haystack's own tracing: the tool span's status stays unset, `haystack.tool.error` and an
/// `{"error": …}` result say it failed; stored failed, typed by the error's text.
#[test]
fn a_haystack_tool_span_that_failed_is_stored_failed_with_its_type() {
    let p = Pipeline::builtin();
    let haystack = |id, error: &str| Tool {
        id,
        name: "haystack.agent.step.tool",
        attrs: json!({
            "haystack.tool.name": "lookup_order",
            "haystack.agent.step.tool.input": "{\"order_id\": \"A-17\"}",
            "haystack.tool.error": true,
            "haystack.agent.step.tool.output": json!({"error": format!(
                "Failed to invoke Tool `lookup_order` with parameters {{'order_id': 'A-17'}}. Error: {error}")}).to_string(),
        }),
        status: (0, ""),
        exceptions: &[],
    };
    let ok = Tool {
        id: "0a00000000000003",
        name: "haystack.agent.step.tool",
        attrs: json!({"haystack.tool.name": "lookup_order",
                      "haystack.agent.step.tool.output": "[\"A-17\"]"}),
        status: (0, ""),
        exceptions: &[],
    };
    let got = rows(
        &p,
        &request(
            "haystack",
            "opentelemetry",
            &[
                haystack("0a00000000000001", "[Errno -2] Name or service not known"),
                haystack("0a00000000000002", "'status'"),
                ok,
            ],
        ),
    );
    let pick = |id: &str| {
        let (s, e, t) = &got[id];
        (s.clone(), e.clone(), t.clone())
    };
    let row = |s: &str, e: &str| (s.to_string(), e.to_string(), "lookup_order".to_string());
    assert_eq!(pick("0a00000000000001"), row("error", "NETWORK"));
    assert_eq!(pick("0a00000000000002"), row("error", "PARSE"));
    assert_eq!(pick("0a00000000000003"), row("unset", ""));
}
