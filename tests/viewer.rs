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

/// The value of attribute `name` in the tag text `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let key = format!(" {name}=\"");
    let at = tag.find(&key).unwrap_or_else(|| panic!("{name} in {tag}")) + key.len();
    &tag[at..at + tag[at..].find('"').expect("closing quote")]
}

/// The tool page's chart draws, per stage, the failure rate `failure_rates` answers for the
/// same minutes: a range of 24 minutes is 24 buckets of one minute, the view's own grain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_page_charts_the_failure_rates_sql_answers() {
    fixture();
    // The range ends in the minute after the newest span (the fixture may be older than a
    // few minutes when the suite is long).
    let newest = sql(
        "SELECT CAST(to_unixtime(max(start_time)) AS BIGINT) AS t FROM spans \
         WHERE tool = 'search_docs'",
    )
    .await[0]["t"]
        .as_i64()
        .expect("the fixture has search_docs spans");
    let since = newest / 60 * 60 - 23 * 60;
    let until = since + 24 * 60;
    let time = |t: i64| {
        chrono::DateTime::from_timestamp(t, 0)
            .expect("a time")
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let (status, _, body) = page(&format!(
        "/tools/search_docs?since={}&until={}",
        time(since),
        time(until)
    ))
    .await;
    assert_eq!(status, 200, "{body}");
    let rows = sql(&format!(
        "SELECT CAST(to_unixtime(minute) AS BIGINT) AS minute, stage, \
         sum(failures) AS failures, max(calls) AS calls FROM failure_rates \
         WHERE tool = 'search_docs' AND minute >= TIMESTAMP '{}' AND minute < TIMESTAMP '{}' \
         GROUP BY 1, 2",
        time(since),
        time(until)
    ))
    .await;
    let mut expected: std::collections::BTreeMap<(String, i64), f64> = Default::default();
    for r in &rows {
        let (f, n) = (
            r["failures"].as_f64().expect("failures"),
            r["calls"].as_f64().expect("calls"),
        );
        expected.insert(
            (
                r["stage"].as_str().expect("stage").to_string(),
                r["minute"].as_i64().expect("minute"),
            ),
            if n > 0.0 { f / n } else { 0.0 },
        );
    }
    assert!(
        expected.values().any(|r| *r > 0.0),
        "the demo's search_docs fails in the range: {rows:?}"
    );
    let mut charted = std::collections::BTreeMap::new();
    for tag in body
        .split("<svg")
        .skip(1)
        .map(|t| &t[..t.find('>').expect("tag end")])
        .filter(|t| t.contains("data-stage"))
    {
        let stage = attr(tag, "data-stage").to_string();
        let starts = attr(tag, "data-buckets").split(' ');
        let rates = attr(tag, "data-rates").split(' ');
        for (b, r) in starts.zip(rates) {
            let (b, r): (i64, f64) = (b.parse().expect("bucket"), r.parse().expect("rate"));
            assert_eq!(b % 60, 0, "buckets are minutes");
            charted.insert((stage.clone(), b), r);
        }
    }
    assert!(
        charted.values().any(|r| *r > 0.0),
        "the chart is not flat: {charted:?}"
    );
    for (key, rate) in &expected {
        let drawn = charted
            .get(key)
            .unwrap_or_else(|| panic!("{key:?} is charted: {charted:?}"));
        assert!(
            (drawn - rate).abs() < 1e-6,
            "{key:?}: chart {drawn}, failure_rates {rate}"
        );
    }
    for (key, drawn) in &charted {
        if !expected.contains_key(key) {
            assert_eq!(*drawn, 0.0, "{key:?}: no spans, no rate");
        }
    }
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
    // The failed parse stage is selected without clicking, with its frames.
    assert!(body.contains("data-span=\"a000000000000004\""));
    assert!(body.contains("class=\"frames\""));
    // The reference leads to the span with the frames.
    let (status, h, _) = page(&format!("/r/{HOSTILE_REF}")).await;
    assert_eq!(status, 303);
    assert_eq!(
        h["location"],
        format!("/traces/{HOSTILE_TRACE}?span=a000000000000004#span-a000000000000004")
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
