//! `answer_shapes`: a tool whose answer renamed a field shows the new shape as a change, with
//! the PARSE failures that followed; a tool's first shapes are its baseline, not a change; a
//! new shape that two versions take up is one change of the tool, seen the same from both.

use serde_json::json;
use toolspan_schema::shape;

use crate::common::{engine_over, i, request, rows, s, Trace};

const URL: &str = r#"{"hits":[{"title":"Keys","url":"https://docs.example.com/keys"}]}"#;
const LINK: &str = r#"{"hits":[{"title":"Keys","link":"https://docs.example.com/keys"}]}"#;

/// A `search_docs` call in its own trace `seed`, at `start_ms`: one attempt whose send stage
/// records `answer` and whose parse stage fails when `parse_fails`.
fn staged_call(seed: u8, start_ms: u64, answer: &str, parse_fails: bool) -> Trace {
    let mut t = Trace::new(seed);
    let tool = |extra: Vec<_>| {
        let mut v = vec![
            s("gen_ai.tool.name", "search_docs"),
            s("gen_ai.tool.call.id", &format!("call_{seed}")),
        ];
        v.extend(extra);
        v
    };
    t.span(
        10,
        None,
        "execute_tool search_docs",
        start_ms,
        50,
        parse_fails,
        tool(vec![s("gen_ai.operation.name", "execute_tool")]),
    );
    t.span(
        11,
        Some(10),
        "attempt 1",
        start_ms + 1,
        40,
        parse_fails,
        tool(vec![i("toolspan.attempt", 1)]),
    );
    t.span(
        12,
        Some(11),
        "send search_docs",
        start_ms + 2,
        20,
        false,
        tool(vec![
            s("toolspan.stage", "send"),
            s("gen_ai.tool.call.result", answer),
        ]),
    );
    t.span(
        13,
        Some(11),
        "parse search_docs",
        start_ms + 25,
        5,
        parse_fails,
        tool(vec![s("toolspan.stage", "parse")]),
    );
    t
}

/// A `lookup` call without stages whose own result is `answer`.
fn plain_call(seed: u8, start_ms: u64, answer: &str) -> Trace {
    let mut t = Trace::new(seed);
    t.span(
        20,
        None,
        "execute_tool lookup",
        start_ms,
        10,
        false,
        vec![
            s("gen_ai.operation.name", "execute_tool"),
            s("gen_ai.tool.name", "lookup"),
            s("gen_ai.tool.call.result", answer),
        ],
    );
    t
}

#[tokio::test]
async fn a_renamed_field_is_a_change_with_the_parse_failures_that_followed() {
    let mut traces = Vec::new();
    // Twelve answers with `url`, one of which fails to parse anyway; then four with `link`,
    // all of which fail to parse.
    for k in 0..12u8 {
        traces.push(staged_call(k + 1, u64::from(k) * 100, URL, k == 5));
    }
    for k in 0..4u8 {
        traces.push(staged_call(k + 50, 2_000 + u64::from(k) * 100, LINK, true));
    }
    // `lookup` answers in two shapes from its second call: its baseline, not a change.
    traces.push(plain_call(80, 0, r#"{"id":1}"#));
    traces.push(plain_call(81, 100, r#"{"id":1,"note":"x"}"#));
    traces.push(plain_call(82, 200, r#"{"id":1,"note":"x"}"#));
    let (_dir, engine) = engine_over(&[request(traces)]).await;
    let rows = rows(
        &engine,
        "SELECT tool, service, service_version, shape, shape_doc, calls, share, \
         failures, parse_failures, parse_rate, previous_shape, previous_shape_doc, \
         calls_before, share_since, change \
         FROM answer_shapes ORDER BY tool, first_seen",
    )
    .await;
    let url = shape::of_text(URL);
    let link = shape::of_text(LINK);
    assert_eq!(rows.len(), 4, "{rows:#?}");
    let (lookup, before, after) = (&rows[0], &rows[2], &rows[3]);
    assert_eq!(
        before,
        &json!({
            "tool": "search_docs", "service": "agent-svc", "service_version": "1.2.3",
            "shape": shape::id(&url), "shape_doc": url, "calls": 12, "share": 0.75,
            "failures": 1, "parse_failures": 1, "parse_rate": 1.0 / 12.0,
            "previous_shape": null, "previous_shape_doc": null, "calls_before": 0,
            "share_since": 0.75, "change": false
        })
    );
    assert_eq!(
        after,
        &json!({
            "tool": "search_docs", "service": "agent-svc", "service_version": "1.2.3",
            "shape": shape::id(&link), "shape_doc": link, "calls": 4, "share": 0.25,
            "failures": 4, "parse_failures": 4, "parse_rate": 1.0,
            "previous_shape": shape::id(&url), "previous_shape_doc": url, "calls_before": 12,
            "share_since": 1.0, "change": true
        })
    );
    // The diff of the two documents names the renamed field.
    let changes = shape::diff(
        after["previous_shape_doc"].as_str().unwrap_or_default(),
        after["shape_doc"].as_str().unwrap_or_default(),
    );
    let named: Vec<(String, &str)> = changes.iter().map(|c| (c.path.clone(), c.kind())).collect();
    assert_eq!(
        named,
        [
            ("$.hits[].link".to_string(), "added"),
            ("$.hits[].url".to_string(), "removed")
        ]
    );
    assert_eq!(lookup["tool"], "lookup");
    assert_eq!(
        (rows[1]["tool"].as_str(), rows[1]["change"].as_bool()),
        (Some("lookup"), Some(false)),
        "a tool's second shape after one call is its baseline: {rows:#?}"
    );
}

/// `request(traces)` as sent by service version `version` of `agent-svc`.
fn from_version(
    traces: Vec<Trace>,
    version: &str,
) -> opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
    let mut req = request(traces);
    for rs in &mut req.resource_spans {
        if let Some(r) = rs.resource.as_mut() {
            r.attributes.retain(|kv| kv.key != "service.version");
            r.attributes.push(s("service.version", version));
        }
    }
    req
}

/// A new shape that one version answers first and an older one takes up later is one change
/// for the tool: both versions' rows name the shape the tool answered just before it first
/// appeared, when it first appeared and the calls before then, not what each version saw.
#[tokio::test]
async fn a_shape_taken_up_by_two_versions_is_one_change_of_the_tool() {
    // 1.0.0 answers with `url` twelve times; 2.0.0 then answers with `link` twice, and 1.0.0
    // answers with `link` three times after that.
    let old: Vec<Trace> = (0..12u8)
        .map(|k| staged_call(k + 1, u64::from(k) * 100, URL, false))
        .chain((0..3u8).map(|k| staged_call(k + 60, 2_300 + u64::from(k) * 100, LINK, false)))
        .collect();
    let new: Vec<Trace> = (0..2u8)
        .map(|k| staged_call(k + 70, 2_000 + u64::from(k) * 100, LINK, false))
        .collect();
    let (_dir, engine) =
        engine_over(&[from_version(old, "1.0.0"), from_version(new, "2.0.0")]).await;
    let rows = rows(
        &engine,
        "SELECT service_version, shape, calls, previous_shape, previous_shape_doc, \
         CAST(shape_first_seen AS BIGINT) AS first_us, calls_before, share_since, change \
         FROM answer_shapes WHERE tool = 'search_docs' \
         ORDER BY service_version, first_seen",
    )
    .await;
    let url = shape::of_text(URL);
    let link = shape::of_text(LINK);
    assert_eq!(rows.len(), 3, "{rows:#?}");
    assert_eq!(
        (
            &rows[0]["service_version"],
            &rows[0]["shape"],
            &rows[0]["calls"]
        ),
        (&json!("1.0.0"), &json!(shape::id(&url)), &json!(12))
    );
    assert_eq!(rows[0]["previous_shape"], json!(null));
    assert_eq!(rows[0]["share_since"], json!(12.0 / 17.0));
    assert_eq!(rows[0]["change"], json!(false));
    for (row, version, calls) in [(&rows[1], "1.0.0", 3), (&rows[2], "2.0.0", 2)] {
        assert_eq!(
            (&row["service_version"], &row["shape"], &row["calls"]),
            (&json!(version), &json!(shape::id(&link)), &json!(calls)),
            "{rows:#?}"
        );
        assert_eq!(row["previous_shape"], json!(shape::id(&url)), "{rows:#?}");
        assert_eq!(row["previous_shape_doc"], json!(url), "{rows:#?}");
        assert_eq!(row["calls_before"], json!(12), "{rows:#?}");
        assert_eq!(row["share_since"], json!(1.0), "{rows:#?}");
        assert_eq!(row["change"], json!(true), "{rows:#?}");
    }
    // First seen when 2.0.0 first answered with it, for both versions.
    assert_eq!(rows[1]["first_us"], rows[2]["first_us"]);
}

#[tokio::test]
async fn a_tool_whose_spans_carry_no_result_has_no_answers_recorded() {
    use toolspan_query::views::{answer_shapes_query, answers_recorded_query};
    // `search_docs` records its answer on a send stage, `lookup` on the call itself, `ping`
    // nowhere: its call has no result.
    let mut ping = Trace::new(90);
    ping.span(
        30,
        None,
        "execute_tool ping",
        0,
        10,
        false,
        vec![
            s("gen_ai.operation.name", "execute_tool"),
            s("gen_ai.tool.name", "ping"),
        ],
    );
    let traces = vec![
        staged_call(1, 0, URL, false),
        plain_call(2, 100, r#"{"id":1}"#),
        ping,
    ];
    let (_dir, engine) = engine_over(&[request(traces)]).await;
    for (tool, recorded) in [("search_docs", true), ("lookup", true), ("ping", false)] {
        let probe = rows(&engine, &answers_recorded_query(tool)).await;
        assert_eq!(!probe.is_empty(), recorded, "{tool}: {probe:?}");
        let shapes = rows(
            &engine,
            &format!("SELECT shape FROM ({}) a", answer_shapes_query(Some(tool))),
        )
        .await;
        assert_eq!(!shapes.is_empty(), recorded, "{tool}: {shapes:?}");
    }
}
