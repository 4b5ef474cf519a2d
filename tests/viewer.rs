//! The trace viewer, on `toolspan demo` traffic plus one hostile trace, served by
//! `toolspan serve --http-addr --token` (the pages and the API in the ingesting process):
//! - over HTTP: the token as a cookie, the security headers, the search page's filters and
//!   counts against SQL over the same table, hostile text escaped;
//! - in real headless Chromium (`tests/browser/viewer.py`, Selenium): the debugging loop a
//!   person follows, and a hostile trace rendering as text with no script run.

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{bin, free_port, python, reaper, repo_root, Server};

/// The token the server requires.
pub const TOKEN: &str = "viewer-test-token";
/// The hostile trace's id.
pub const HOSTILE_TRACE: &str = "4b1d0000000000000000000000000bad";
/// The error reference of its failed stage.
pub const HOSTILE_REF: &str = "err_hostile1";

/// A demo table plus the hostile trace, and the server over it.
pub struct Fixture {
    pub dir: std::path::PathBuf,
    /// Kept for the life of the test binary; the reaper stops it.
    _server: Server,
    pub http: u16,
    /// Its stdin is held open for the life of the test binary (see `support::reaper`).
    _reaper: std::sync::Mutex<std::process::Child>,
}

impl Fixture {
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();

/// Made by the first test that asks (on a thread of its own: async tests ask too); the
/// server is killed at exit.
pub fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        std::thread::spawn(make_fixture)
            .join()
            .expect("the fixture was made")
    })
}

fn make_fixture() -> Fixture {
    {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        let out = Command::new(bin())
            .args([
                "demo",
                "--duration",
                "12",
                "--runs-per-second",
                "100",
                "--log",
                "warn",
            ])
            .arg("--otlp-addr")
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--data-dir")
            .arg(&dir)
            .output()
            .expect("run toolspan demo");
        assert!(
            out.status.success(),
            "demo failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let http = free_port();
        let server = Server::start_with(
            &dir,
            &[
                "--http-addr",
                &format!("127.0.0.1:{http}"),
                "--token",
                TOKEN,
            ],
        );
        post_hostile_trace(&server.url());
        let reaper = reaper(server.child.id(), &dir);
        let f = Fixture {
            dir,
            _server: server,
            http,
            _reaper: std::sync::Mutex::new(reaper),
        };
        wait_for_trace(&f.base(), HOSTILE_TRACE);
        f
    }
}

fn s(key: &str, v: &str) -> Value {
    json!({"key": key, "value": {"stringValue": v}})
}

/// One trace whose every string is an attack on the page: agent run → call → attempt →
/// failed parse stage with an exception event.
pub fn hostile_request() -> Value {
    let t0: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64
        - 2 * 3600 * 1_000_000_000;
    let span = |id: &str,
                parent: Option<&str>,
                name: &str,
                off_ms: u64,
                dur_ms: u64,
                attrs: Vec<Value>,
                status: Value,
                events: Vec<Value>| {
        let mut v = json!({
            "traceId": HOSTILE_TRACE,
            "spanId": id,
            "name": name,
            "kind": 1,
            "startTimeUnixNano": (t0 + off_ms * 1_000_000).to_string(),
            "endTimeUnixNano": (t0 + (off_ms + dur_ms) * 1_000_000).to_string(),
            "attributes": attrs,
            "status": status,
            "events": events,
        });
        if let Some(p) = parent {
            v["parentSpanId"] = json!(p);
        }
        v
    };
    let err = json!({"code": 2, "message": "</pre><script>window.__pwned='status'</script>"});
    let tool = "search_docs";
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            s("service.name", "<script>window.__pwned='service'</script>"),
            s("host.name", "<img src=x onerror=\"window.__pwned='host'\">"),
        ]},
        "scopeSpans": [{"scope": {"name": "hostile"}, "spans": [
            span("a000000000000001", None, "<img src=x onerror=\"window.__pwned='name'\">", 0, 900,
                 vec![s("gen_ai.operation.name", "invoke_agent"), s("gen_ai.agent.name", "<b>agent</b>")],
                 json!({"code": 2}), vec![]),
            span("a000000000000002", Some("a000000000000001"), "execute_tool <script>window.__pwned='call'</script>", 10, 800,
                 vec![s("gen_ai.operation.name", "execute_tool"), s("gen_ai.tool.name", tool),
                      s("gen_ai.tool.call.id", "call_hostile"),
                      s("gen_ai.tool.call.arguments", "{\"query\": \"<script>window.__pwned='args'</script>\"}"),
                      s("toolspan.error.reference", HOSTILE_REF),
                      s("note", "<svg onload=\"window.__pwned='attr'\">")],
                 err.clone(), vec![]),
            span("a000000000000003", Some("a000000000000002"), "attempt 1", 20, 700,
                 vec![json!({"key": "toolspan.attempt", "value": {"intValue": "1"}}),
                      s("toolspan.error.reference", HOSTILE_REF)],
                 err.clone(), vec![]),
            span("a000000000000004", Some("a000000000000003"), "parse <iframe src=javascript:alert(1)>", 600, 50,
                 vec![s("toolspan.stage", "parse"), s("toolspan.error.code", "bad_json<script>x</script>"),
                      s("toolspan.error.reference", HOSTILE_REF),
                      s("gen_ai.tool.call.result", "<html><script>window.__pwned='result'</script></html>")],
                 err,
                 vec![json!({"name": "exception", "timeUnixNano": (t0 + 640_000_000).to_string(), "attributes": [
                     s("exception.type", "JSONDecodeError<script>window.__pwned='etype'</script>"),
                     s("exception.message", "Expecting value"),
                     s("exception.stacktrace", "Traceback:\n  File \"</pre><script>window.__pwned='frames'</script>\", line 1"),
                 ]})]),
        ]}],
    }]})
}

fn post_hostile_trace(url: &str) {
    let (status, answer) = crate::support::post_json(url, hostile_request().to_string());
    assert_eq!(status, 200, "{answer}");
}

fn wait_for_trace(base: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        loop {
            let r = reqwest::Client::new()
                .get(format!("{base}/api/v1/traces/{id}"))
                .bearer_auth(TOKEN)
                .send()
                .await;
            if let Ok(r) = r {
                if r.status().as_u16() == 200 {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "trace {id} never became readable"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

async fn page(path: &str) -> (u16, reqwest::header::HeaderMap, String) {
    let f = fixture();
    let r = client()
        .get(format!("{}{path}", f.base()))
        .header("cookie", format!("toolspan_token={TOKEN}"))
        .send()
        .await
        .expect("GET");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().await.expect("body"))
}

async fn sql(q: &str) -> Vec<Value> {
    let f = fixture();
    let r = client()
        .post(format!("{}/api/v1/sql", f.base()))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(json!({ "sql": q }).to_string())
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 200, "{q}");
    let v: Value = serde_json::from_str(&r.text().await.expect("body")).expect("JSON");
    v["rows"].as_array().expect("rows").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_ask_for_the_token_and_take_it_from_a_link_as_a_cookie() {
    let f = fixture();
    let c = client();
    let r = c
        .get(format!("{}/?tool=search_docs", f.base()))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        r.headers()["location"],
        "/login?next=%2F%3Ftool%3Dsearch_docs"
    );
    let r = c
        .get(format!("{}/login?next=/", f.base()))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 200);
    let r = c
        .get(format!("{}/?tool=search_docs&token={TOKEN}", f.base()))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        r.headers()["location"],
        "/?tool=search_docs",
        "the token leaves the address"
    );
    let cookie = r.headers()["set-cookie"].to_str().expect("ascii");
    assert!(
        cookie.starts_with(&format!("toolspan_token={TOKEN};")),
        "{cookie}"
    );
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let r = c
        .get(format!("{}/?tool=search_docs&token=wrong", f.base()))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 303);
    assert!(r.headers()["location"]
        .to_str()
        .expect("ascii")
        .starts_with("/login"));
    // A wrong token at the form is refused; the right one sets the cookie.
    let r = c
        .post(format!("{}/login", f.base()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=nope&next=%2Ftools%2Fsearch_docs")
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .post(format!("{}/login", f.base()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={TOKEN}&next=%2F%2Fevil.example%2F"))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        r.headers()["location"],
        "/",
        "never redirected off the server"
    );
    // The Tempo API and /api/v1 keep asking for the bearer token.
    let r = c
        .get(format!("{}/api/search", f.base()))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_is_sent_with_a_strict_content_security_policy() {
    for path in [
        "/".to_string(),
        format!("/traces/{HOSTILE_TRACE}"),
        "/tools/search_docs".into(),
        "/login".into(),
        "/traces/zz".into(),
    ] {
        let (status, h, body) = page(&path).await;
        let csp = h["content-security-policy"].to_str().expect("ascii");
        assert!(
            csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
            "{path}: {csp}"
        );
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert!(
            h["content-type"]
                .to_str()
                .expect("ascii")
                .starts_with("text/html"),
            "{path}"
        );
        assert!(
            !body.contains("<script>") && !body.contains("style="),
            "{path}: no inline script or style"
        );
        if path == "/traces/zz" {
            assert_eq!(status, 400, "a malformed id is a 400 page");
            assert!(body.contains("invalid_argument"), "{body}");
        } else {
            assert_eq!(status, 200, "{path}");
        }
    }
    let (status, _, body) = page("/traces/00000000000000000000000000000001").await;
    assert_eq!(status, 404);
    assert!(body.contains("not_found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_page_lists_parse_failures_of_search_docs_as_sql_counts_them() {
    let (status, _, body) = page("/?tool=search_docs&stage=parse&error_type=PARSE&since=1d").await;
    assert_eq!(status, 200);
    let expected = sql(
        "SELECT count(DISTINCT c.span_id) AS n FROM calls c JOIN spans s \
         ON s.trace_id = c.trace_id AND s.call_id = c.call_id \
         WHERE c.tool = 'search_docs' AND c.status = 'error' AND c.error_type = 'PARSE' \
         AND s.stage = 'parse' AND s.status = 'error'",
    )
    .await[0]["n"]
        .as_i64()
        .expect("count");
    assert!(expected > 0, "the demo has PARSE failures of search_docs");
    let rows = body.matches("<tr class=\"failed\">").count();
    assert_eq!(
        rows as i64,
        expected.min(50),
        "one row per matching call (50 a page)"
    );
    assert_eq!(body.matches("trace →").count(), rows);
    // The error-type facet over the same filters counts them too.
    assert!(
        body.contains(&format!("PARSE <span class=\"num\">{expected}</span>")),
        "facet count {expected}"
    );
    // Every row is search_docs with PARSE.
    assert_eq!(body.matches(">PARSE</span>").count(), rows);
}

/// The page reads its calls from the call spans and then their attempts, for those calls
/// only: attempts, "recovered after retry" and "leaks internals" are still what the `calls`
/// view says of the same fifty calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_page_shows_what_the_calls_view_says_of_each_calls_attempts() {
    // The first page of all calls (fifty a page, newest first) with a recovered call on it.
    let mut found = None;
    for page_no in 0..40 {
        let expected = sql(&format!(
            "SELECT CAST(sum(attempts) AS BIGINT) AS attempts, \
             CAST(sum(CASE WHEN recovered_after_retry THEN 1 ELSE 0 END) AS BIGINT) AS recovered, \
             CAST(sum(CASE WHEN leaked_internals THEN 1 ELSE 0 END) AS BIGINT) AS leaked, \
             count(*) AS n \
             FROM (SELECT attempts, recovered_after_retry, leaked_internals FROM calls \
                   WHERE start_time >= now() - INTERVAL '1 day' \
                   ORDER BY start_time DESC, span_id LIMIT 50 OFFSET {})",
            page_no * 50
        ))
        .await
        .remove(0);
        if expected["recovered"].as_i64().unwrap_or(0) > 0 {
            found = Some((page_no, expected));
            break;
        }
    }
    let (page_no, expected) = found.expect("the demo has calls recovered after a retry");
    let n = |k: &str| {
        expected[k]
            .as_i64()
            .unwrap_or_else(|| panic!("{k}: {expected}"))
    };
    let (status, _, body) = page(&format!("/?status=all&since=1d&page={page_no}")).await;
    assert_eq!(status, 200);
    let table = &body[body
        .find("<table class=\"calls\">")
        .expect("the calls table")..];
    let table = &table[..table.find("</table>").expect("table end")];
    assert_eq!(
        table.matches("trace →").count() as i64,
        n("n"),
        "page {page_no}"
    );
    assert_eq!(
        table.matches("recovered after retry").count() as i64,
        n("recovered"),
        "page {page_no}"
    );
    assert_eq!(table.matches("leaks internals").count() as i64, n("leaked"));
    // The attempts cell is each row's first number cell.
    let cell = "<td class=\"num\">";
    let attempts: i64 = table
        .split("<tr")
        .skip(2)
        .map(|row| {
            let at = &row[row.find(cell).expect("a number cell") + cell.len()..];
            at[..at.find('<').expect("cell end")]
                .parse::<i64>()
                .expect("attempts")
        })
        .sum();
    assert_eq!(attempts, n("attempts"), "page {page_no}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_span_content_is_escaped_on_the_trace_page() {
    let (status, _, body) = page(&format!("/traces/{HOSTILE_TRACE}")).await;
    assert_eq!(status, 200);
    assert!(!body.contains("<script>window"), "no raw script");
    assert!(!body.contains("<img src=x"), "no raw img");
    assert!(!body.contains("<iframe"), "no raw iframe");
    assert!(body.contains("&lt;html&gt;&lt;script&gt;window.__pwned='result'&lt;/script&gt;"));
    assert!(body.contains("&lt;/pre&gt;&lt;script&gt;window.__pwned='frames'"));
    // The page opens on the failed call; "What failed" names its parse stage, with the
    // frames, above the waterfall.
    assert!(body.contains("data-span=\"a000000000000002\""));
    let panel = body
        .find("id=\"what-failed\"")
        .expect("the What failed panel");
    assert!(panel < body.find("class=\"waterfall\"").expect("waterfall"));
    assert!(body[panel..].contains("class=\"frames\""));
    // The reference leads to the span with the frames, the page at "What failed".
    let (status, h, _) = page(&format!("/r/{HOSTILE_REF}")).await;
    assert_eq!(status, 303);
    assert_eq!(
        h["location"],
        format!("/traces/{HOSTILE_TRACE}?span=a000000000000004#what-failed")
    );
}

/// Runs a browser script from tests/browser with the fixture's address.
pub fn run_browser(script: &str, args: &[&str]) {
    let path = repo_root().join("tests/browser").join(script);
    let out = Command::new(python())
        .arg(&path)
        .args(args)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{} failed:\n{}\n{}",
        script,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn in_chromium_a_person_finds_a_parse_failure_and_no_hostile_script_runs() {
    let f = fixture();
    run_browser("viewer.py", &[&f.base(), TOKEN, HOSTILE_TRACE, HOSTILE_REF]);
}

/// The value of attribute `name` in the first tag of `html` after `from`.
fn attr_after<'a>(html: &'a str, from: usize, name: &str) -> Option<&'a str> {
    let tag_end = from + html[from..].find('>')?;
    let tag = &html[from..tag_end];
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

/// The trace page opens on the failed call: "What failed" above the waterfall names the
/// failing stage and error, and shows what the model received and the arguments it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_page_opens_on_the_failed_call_with_what_the_model_received() {
    // A call of the demo fleet, alone in failing in its trace (the page opens on a trace's
    // first failed call; the hostile test's trace, posted beside it, is another case).
    let call = sql(&format!(
        "SELECT trace_id, span_id, reference, output_sha256, input_sha256, leaked_internals \
         FROM spans WHERE stage = 'call' AND tool = 'search_docs' AND error_type = 'PARSE' \
         AND output IS NOT NULL AND input IS NOT NULL AND reference IS NOT NULL \
         AND reference <> '{HOSTILE_REF}' AND coalesce(call_id, '') <> 'call_hostile' \
         AND trace_id IN (SELECT trace_id FROM calls GROUP BY trace_id \
                          HAVING sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END) = 1) \
         ORDER BY start_time DESC LIMIT 1"
    ))
    .await;
    let c = &call[0];
    let s = |k: &str| c[k].as_str().expect(k).to_string();
    let (status, _, body) = page(&format!("/traces/{}", s("trace_id"))).await;
    assert_eq!(status, 200);
    assert!(
        body.contains(&format!("data-span=\"{}\"", s("span_id"))),
        "the failed call is selected"
    );
    let panel = body.find("id=\"what-failed\"").expect("What failed");
    assert!(panel < body.find("class=\"waterfall\"").expect("waterfall"));
    let p = &body[panel..body.find("class=\"waterfall\"").expect("waterfall")];
    assert!(p.contains("What the model received"), "{p}");
    assert!(
        p.contains("failed in <span class=\"badge stage\">parse</span>"),
        "{p}"
    );
    assert!(p.contains(&s("output_sha256")[..16]), "the result's hash");
    assert!(p.contains(&s("input_sha256")[..16]), "the arguments' hash");
    assert!(p.contains("Arguments it sent"), "{p}");
    assert!(
        p.contains(&format!(">{}</a>", s("reference"))),
        "the reference"
    );
    let leak = if c["leaked_internals"] == true {
        "leaked internals to the model"
    } else {
        "no internals leaked"
    };
    assert!(p.contains(leak), "{p}");
}

/// The tool page's totals read the call spans and only this tool's calls' attempts: the
/// same figures as the `calls` view gives over the same range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_page_totals_are_what_the_calls_view_counts() {
    // Other tests post spans to the same table: read page and SQL again until they agree
    // on the number of calls (a few tries).
    let value = |body: &str, label: &str| -> i64 {
        let at = body
            .find(&format!("<dt>{label}</dt>"))
            .unwrap_or_else(|| panic!("{label} on the page"));
        let dd = &body[at..];
        let dd = &dd[dd.find("<dd").expect("dd")..];
        let dd = &dd[dd.find('>').expect(">") + 1..];
        dd[..dd.find('<').expect("end")]
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{label}: {e}"))
    };
    for tries in 1.. {
        let (status, _, body) = page("/tools/search_docs?since=1d").await;
        assert_eq!(status, 200);
        let expected = sql("SELECT count(*) AS calls, \
             CAST(sum(CASE WHEN attempts > 1 THEN 1 ELSE 0 END) AS BIGINT) AS retried, \
             CAST(sum(CASE WHEN recovered_after_retry THEN 1 ELSE 0 END) AS BIGINT) AS recovered, \
             CAST(sum(CASE WHEN leaked_internals THEN 1 ELSE 0 END) AS BIGINT) AS leaked \
             FROM calls WHERE tool = 'search_docs' AND start_time >= now() - INTERVAL '1 day'")
        .await
        .remove(0);
        let n = |k: &str| {
            expected[k]
                .as_i64()
                .unwrap_or_else(|| panic!("{k}: {expected}"))
        };
        if value(&body, "calls") != n("calls") && tries < 5 {
            continue;
        }
        assert!(n("retried") > 0 && n("recovered") > 0, "{expected}");
        assert_eq!(value(&body, "calls"), n("calls"));
        assert_eq!(value(&body, "retried"), n("retried"));
        assert_eq!(value(&body, "recovered after retry"), n("recovered"));
        assert_eq!(value(&body, "leaked internals to the model"), n("leaked"));
        break;
    }
}

/// Every point of the tool page's failure-rate chart is what `failure_rates` answers for
/// the minutes of its bucket; the page shows latency percentiles and compare links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_page_charts_what_sql_over_failure_rates_answers() {
    // Other tests of this module post spans to the same table while this one reads: the page
    // and SQL are read again until both saw the same spans (a few tries).
    let mut tries = 0;
    let (body, points, nonzero) = loop {
        tries += 1;
        let (status, _, body) = page("/tools/search_docs?since=1d").await;
        assert_eq!(status, 200);
        let svg = body
            .find("<svg class=\"chart rates\"")
            .expect("the rates chart");
        let width_s: i64 = attr_after(&body, svg, "data-bucket-s")
            .expect("bucket width")
            .parse()
            .expect("number");
        let mut nonzero = 0;
        let mut points = 0;
        let mut mismatch = None;
        for stage in ["call", "parse", "execute"] {
            let needle = format!("<circle class=\"pt s-{stage}\"");
            for (at, _) in body.match_indices(&needle) {
                points += 1;
                let a = |n: &str| attr_after(&body, at, n).expect(n).to_string();
                let rate: f64 = a("data-rate").parse().expect("rate");
                let (spans, failed): (f64, f64) = (
                    a("data-spans").parse().expect("spans"),
                    a("data-failed").parse().expect("failed"),
                );
                let start = chrono::DateTime::parse_from_rfc3339(&a("data-bucket")).expect("time");
                let end = start + chrono::Duration::seconds(width_s);
                let row = &sql(&format!(
                    "SELECT sum(f) AS failures, sum(c) AS calls FROM (SELECT minute, max(calls) AS c, \
                     sum(failures) AS f FROM failure_rates WHERE tool = 'search_docs' AND stage = '{stage}' \
                     AND minute >= TIMESTAMP '{}' AND minute < TIMESTAMP '{}' GROUP BY minute) t",
                    start.to_rfc3339(),
                    end.to_rfc3339()
                ))
                .await[0];
                let (want_f, want_c) = (
                    row["failures"].as_f64().expect("failures"),
                    row["calls"].as_f64().expect("calls"),
                );
                if (spans - want_c).abs() >= 0.5
                    || (failed - want_f).abs() >= 0.5
                    || (rate - want_f / want_c).abs() >= 1e-6
                {
                    mismatch = Some(format!(
                        "{stage} at {start}: chart {failed}/{spans} ({rate}), failure_rates {want_f}/{want_c}"
                    ));
                }
                if rate > 0.0 {
                    nonzero += 1;
                }
            }
        }
        match mismatch {
            None => break (body, points, nonzero),
            Some(m) if tries >= 5 => panic!("{m}"),
            Some(_) => tokio::time::sleep(std::time::Duration::from_secs(1)).await,
        }
    };
    assert!(points > 0 && nonzero > 0, "the chart is not flat");
    assert!(body.contains("<span class=\"p95\">"), "p95 latency");
    assert!(
        body.contains("error_code="),
        "top codes link to their calls"
    );
}

/// The search page's text box finds a call by its reference, `key=value` by an attribute
/// (hostile text stays text), and a duration bound keeps only the calls past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_page_finds_calls_by_text_attribute_and_duration() {
    let (status, _, body) = page(&format!("/?q={HOSTILE_REF}&since=2d")).await;
    assert_eq!(status, 200);
    assert_eq!(body.matches("trace →").count(), 1, "one call carries it");
    assert!(body.contains(&format!("/traces/{HOSTILE_TRACE}?span=a000000000000002")));
    let attr = "note=\"<svg onload=\\\"window.__pwned='attr'\\\">\"";
    let encoded: String = attr
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let (status, _, body) = page(&format!("/?attr={encoded}&since=2d")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body.matches("trace →").count(),
        1,
        "the hostile call has it"
    );
    assert!(!body.contains("<svg onload"), "the filter is shown as text");
    let (status, _, body) = page("/?duration=%3E%201%20s&status=all&since=2d").await;
    assert_eq!(status, 200);
    let n = sql("SELECT count(*) AS n FROM calls WHERE duration_ms > 1000 \
         AND start_time >= now() - INTERVAL '2 days'")
    .await[0]["n"]
        .as_i64()
        .expect("n");
    assert_eq!(body.matches("trace →").count() as i64, n.min(50));
    let (status, _, body) = page("/?duration=%3E%20soon").await;
    assert_eq!(status, 400);
    assert!(body.contains("invalid_argument") && body.contains("duration"));
}

/// The compare page shows the verdicts `toolspan compare` answers, metric by metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compare_page_shows_the_verdicts_of_toolspan_compare() {
    let q = "tool=update_ticket&service=support-bot&before=1.4.2&after=1.5.0";
    let (status, _, body) = page(&format!("/compare?{q}")).await;
    assert_eq!(status, 200, "{body}");
    let f = fixture();
    let api: Value = serde_json::from_str(
        &client()
            .get(format!("{}/api/v1/compare?{q}", f.base()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("GET")
            .text()
            .await
            .expect("body"),
    )
    .expect("JSON");
    let metrics = api["metrics"].as_array().expect("metrics");
    assert_eq!(body.matches("<tr data-metric=").count(), metrics.len());
    for m in metrics {
        let key = m["key"]
            .as_str()
            .map(|k| format!(" data-key=\"{k}\""))
            .unwrap_or_default();
        let row = format!(
            "<tr data-metric=\"{}\"{key} data-verdict=\"{}\">",
            m["metric"].as_str().expect("metric"),
            m["verdict"].as_str().expect("verdict")
        );
        assert!(body.contains(&row), "{row}");
    }
    // The tool page links to it.
    let (_, _, tool) = page("/tools/update_ticket").await;
    assert!(
        tool.contains(
            "/compare?tool=update_ticket&amp;service=support-bot&amp;before=1.4.2&amp;after=1.5.0"
        ),
        "the tool page links to the comparison"
    );
}

/// Hostile query strings on the new inputs: each page answers 200 or 400 with the value
/// escaped, never 500, never the markup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_query_strings_are_refused_or_escaped() {
    let script = "%3Cscript%3Ewindow.__pwned%3D1%3C%2Fscript%3E";
    for path in [
        format!("/?q={script}"),
        format!("/?q=%27%20OR%201%3D1%20--&attr=a%3D{script}"),
        format!("/?attr={script}%3Dx%20b%3D%22unclosed"),
        "/?duration=%3E%201%20s%3B%20DROP%20TABLE%20spans".into(),
        format!("/?refresh={script}"),
        format!("/compare?tool={script}&before=1%27&after=2"),
        format!("/compare?tool=update_ticket&before={script}&after=1.5.0"),
        format!("/tools/{script}?since=1h"),
        "/tools/search_docs?since=1h&until=2h".into(),
        "/compare?tool=update_ticket&before=1.4.2&after=1.5.0&since=soon".into(),
    ] {
        let (status, _, body) = page(&path).await;
        assert!(
            status == 200 || status == 400 || status == 404,
            "{path}: {status}\n{body}"
        );
        assert!(!body.contains("<script>window"), "{path}: markup escaped");
        if status != 200 {
            assert!(
                body.contains("<code>"),
                "{path}: the envelope's code is shown"
            );
        }
    }
}
