//! What every listener does with clients that hold on to it: idle connections are closed,
//! connections beyond the cap are refused at once with an answer, request bodies in flight
//! are bounded in bytes; out-of-range times (a request's, an operator's) are refused with
//! envelopes instead of panics; redirects stay on the server; the query API answers only
//! the host names it is meant for when bound to loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{bin, free_port, peak_rss_kib, start_query, Server};

/// An answer read off a raw connection.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    fn envelope_code(&self) -> String {
        let v: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not an envelope ({e}): {:?}", self.body));
        assert!(
            v["error"]["reference"]
                .as_str()
                .is_some_and(|r| r.starts_with("ts_")),
            "{v}"
        );
        v["error"]["code"].as_str().unwrap_or_default().to_string()
    }
}

/// Reads one answer (head, then a body of its Content-Length) from `s`.
fn read_answer(s: &mut TcpStream) -> Option<Answer> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let mut a = Answer {
        status,
        head,
        body: String::new(),
    };
    if let Some(len) = a
        .header("content-length")
        .and_then(|l| l.parse::<usize>().ok())
    {
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).ok()?;
        a.body = String::from_utf8_lossy(&body).to_string();
    }
    Some(a)
}

/// Sends `request` on a new connection and reads the answer.
fn exchange(port: u16, request: &str) -> Option<Answer> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(request.as_bytes()).ok()?;
    read_answer(&mut s)
}

fn get(port: u16, path: &str, host: &str) -> Option<Answer> {
    exchange(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
}

/// Whether the server closes `s` within `within` (end of file or a reset), without it
/// sending anything.
fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn idle_connections_are_closed_and_connections_beyond_the_cap_are_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let http = free_port();
    let server = Server::start_with_env(
        dir.path(),
        &["--http-addr", &format!("127.0.0.1:{http}")],
        &[
            ("TOOLSPAN_HTTP_IDLE_TIMEOUT_SECS", "2"),
            ("TOOLSPAN_HTTP_HEADER_TIMEOUT_SECS", "2"),
        ],
    );
    for port in [server.port, http] {
        // Connections that never send a byte.
        let mut silent: Vec<TcpStream> = (0..20)
            .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect"))
            .collect();
        // A kept-alive connection after one answer.
        let mut kept = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        kept.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .expect("write");
        assert_eq!(read_answer(&mut kept).expect("answer").status, 200);
        let started = Instant::now();
        for s in silent.iter_mut().chain(std::iter::once(&mut kept)) {
            let left = Duration::from_secs(20).saturating_sub(started.elapsed());
            assert!(
                closed_by_server(s, left.max(Duration::from_millis(10))),
                "port {port}: an idle connection is still open after {:?}",
                started.elapsed()
            );
        }
    }
    drop(server);

    // A cap of 4: the fifth connection is answered 503 with the envelope, at once.
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_with_env(
        dir.path(),
        &[],
        &[
            ("TOOLSPAN_MAX_CONNECTIONS", "4"),
            ("TOOLSPAN_HTTP_IDLE_TIMEOUT_SECS", "60"),
            ("TOOLSPAN_HTTP_HEADER_TIMEOUT_SECS", "60"),
        ],
    );
    // The server's readiness probe in `start` used a connection: let it close.
    std::thread::sleep(Duration::from_millis(500));
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port)).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let a = get(server.port, "/healthz", "localhost").expect("an answer beyond the cap");
    assert_eq!(a.status, 503, "{}{}", a.head, a.body);
    assert_eq!(a.envelope_code(), "overloaded");
    assert!(a.header("retry-after").is_some(), "{}", a.head);
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(held);
    // Slots come back when connections close.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match get(server.port, "/healthz", "localhost") {
            Some(a) if a.status == 200 => break,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            other => panic!(
                "no slot after the held connections closed: {:?}",
                other.map(|a| a.status)
            ),
        }
    }
}

#[test]
fn the_postgres_listener_closes_clients_that_do_not_log_in_and_caps_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, _http, pg) = start_query(
        dir.path(),
        "grafana",
        "listener-test-pw",
        &["--header-timeout-secs", "2", "--max-connections", "3"],
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(("127.0.0.1", pg)).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // The fourth: a Postgres ErrorResponse, SQLSTATE 53300.
    let mut extra = TcpStream::connect(("127.0.0.1", pg)).expect("connect");
    extra
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut answer = Vec::new();
    let _ = extra.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(
        answer.first() == Some(&b'E') && text.contains("53300"),
        "not a too-many-connections error: {text:?}"
    );
    // The three that never logged in are closed after the login timeout.
    let started = Instant::now();
    for s in &mut silent {
        let left = Duration::from_secs(20).saturating_sub(started.elapsed());
        assert!(
            closed_by_server(s, left.max(Duration::from_millis(10))),
            "a postgres connection that never logged in is open after {:?}",
            started.elapsed()
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends a `len`-byte body on a new connection with `Expect: 100-continue`: when the server
/// asks for it, all but its last byte, then (after `hold`) the last. The final status, the
/// `Retry-After` header and the body of the answer.
fn post_held(port: u16, len: usize, hold: Duration) -> (u16, Option<String>, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-protobuf\r\n\
         Content-Length: {len}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).expect("write head");
    let Some(first) = read_answer(&mut s) else {
        return (0, None, String::new());
    };
    if first.status != 100 {
        return (first.status, first.header("retry-after"), first.body);
    }
    let chunk = vec![0xffu8; 1 << 20];
    let mut left = len - 1;
    while left > 0 {
        let n = left.min(chunk.len());
        if s.write_all(&chunk[..n]).is_err() {
            return (0, None, String::new());
        }
        left -= n;
    }
    std::thread::sleep(hold);
    if s.write_all(&[0xff]).is_err() {
        return (0, None, String::new());
    }
    match read_answer(&mut s) {
        Some(a) => (a.status, a.header("retry-after"), a.body),
        None => (0, None, String::new()),
    }
}

#[test]
fn request_bytes_in_flight_are_bounded_with_429_and_retry_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path());
    let port = server.port;
    // 32 bodies of 19 MiB, all held unfinished at once: 608 MiB if every one were read.
    let clients: Vec<_> = (0..32)
        .map(|_| std::thread::spawn(move || post_held(port, 19 << 20, Duration::from_secs(3))))
        .collect();
    let answers: Vec<(u16, Option<String>, String)> = clients
        .into_iter()
        .map(|c| c.join().expect("client thread"))
        .collect();
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    eprintln!("answers: {statuses:?}");
    // Read ones are garbage (400); the rest are refused before their body is read.
    assert!(
        answers.iter().all(|a| matches!(a.0, 400 | 429)),
        "{statuses:?}"
    );
    let refused: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    assert!(!refused.is_empty(), "nothing refused: {statuses:?}");
    for (_, retry_after, body) in &refused {
        assert!(retry_after.is_some(), "429 without Retry-After");
        let v: Value = serde_json::from_str(body).expect("envelope");
        assert_eq!(v["error"]["code"], "overloaded", "{v}");
    }
    let peak_mib = peak_rss_kib(server.child.id()) / 1024;
    eprintln!("toolspan serve peak RSS: {peak_mib} MiB");
    assert!(peak_mib > 0 && peak_mib < 400, "peak RSS {peak_mib} MiB");
    // Still serving: a small request is taken.
    let (status, _, body) = post_held(port, 10, Duration::ZERO);
    assert_eq!(status, 400, "{body}");
}

#[test]
fn out_of_range_times_hostile_redirects_and_foreign_hosts_get_envelopes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let http = free_port();
    let _server = Server::start_with(
        dir.path(),
        &[
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--token",
            "listener-token",
            "--cookie-secure",
        ],
    );
    let host = format!("127.0.0.1:{http}");
    let authed = |path: &str| {
        exchange(
            http,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer listener-token\r\n\
                 Connection: close\r\n\r\n"
            ),
        )
    };
    // Time bounds at and past the representable extremes: 400, not a dropped connection.
    for path in [
        "/api/search?q=%7B%7D&end=8210266876799",
        "/api/search?q=%7B%7D&start=0&end=8210266876799",
        "/api/v2/search/tags?end=-8334601228800",
        "/api/v2/search/tags?start=-8334601228800&end=0",
        "/api/search/tag/name/values?end=99999999999999999",
    ] {
        let a = authed(path).unwrap_or_else(|| panic!("{path}: no answer"));
        assert_eq!(a.status, 400, "{path}: {}", a.body);
        assert_eq!(a.envelope_code(), "invalid_argument", "{path}");
    }
    assert_eq!(authed("/api/echo").expect("echo").status, 200);

    // Login: `next` stays on this server, whatever it holds; the cookie is Secure.
    for next in [
        "%2F%09%2Fevil.example%2F",
        "%2F%0A%2Fevil.example",
        "%2F%0D%0A%2Fevil.example",
        "%2F%0B%2Fevil.example",
        "%2F%5Cevil.example",
        "https%3A%2F%2Fevil.example%2F",
    ] {
        let body = format!("token=listener-token&next={next}");
        let a = exchange(
            http,
            &format!(
                "POST /login HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
        .unwrap_or_else(|| panic!("{next}: no answer"));
        assert_eq!(a.status, 303, "{next}: {}{}", a.head, a.body);
        assert_eq!(a.header("location").as_deref(), Some("/"), "{next}");
        let cookie = a.header("set-cookie").unwrap_or_default();
        assert!(cookie.contains("; Secure"), "{cookie}");
    }

    // A foreign Host (a DNS-rebinding page): 421 with the envelope; loopback names pass.
    let a = exchange(
        http,
        "GET /api/echo HTTP/1.1\r\nHost: evil.example:8080\r\nAuthorization: Bearer listener-token\r\nConnection: close\r\n\r\n",
    )
    .expect("answer");
    assert_eq!(a.status, 421, "{}", a.body);
    assert_eq!(a.envelope_code(), "invalid_argument");
    let a = get(http, "/login", "evil.example").expect("answer");
    assert_eq!(a.status, 421, "{}", a.body);
    for ok in [
        format!("localhost:{http}"),
        "127.0.0.1".to_string(),
        "[::1]:1".to_string(),
    ] {
        let a = get(http, "/login", &ok).expect("answer");
        assert_eq!(a.status, 200, "{ok}");
    }
    // Probes stay open to any host (health checkers do not all send a real name).
    assert_eq!(get(http, "/healthz", "x").expect("answer").status, 200);

    // The 404 of a page path: the envelope, with a policy, without the path.
    let a = get(http, "/tools/x/%3Cscript%3Ealert(1)%3C%2Fscript%3E", &host).expect("answer");
    assert_eq!(a.status, 404);
    assert!(a.header("content-security-policy").is_some(), "{}", a.head);
    assert!(
        !a.body.contains("script") && !a.body.contains("alert"),
        "{}",
        a.body
    );
}

#[test]
fn an_extra_allowed_host_is_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let http = free_port();
    let _server = Server::start_with(
        dir.path(),
        &[
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--allowed-host",
            "toolspan.internal",
        ],
    );
    assert_eq!(
        get(http, "/api/echo", "toolspan.internal:443")
            .expect("answer")
            .status,
        200
    );
    assert_eq!(
        get(http, "/api/echo", "other.internal")
            .expect("answer")
            .status,
        421
    );
}

/// Runs `toolspan` with `args` and `env` under a 2 GiB address-space limit (a reader that
/// never stops fails instead of taking the machine's memory); its exit code and stderr, or
/// `None` when it is still running after 20 s (it was killed).
fn run_bounded(args: &[&str], env: &[(&str, &str)]) -> Option<(i32, String)> {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(r#"ulimit -v 2097152; exec "$0" "$@""#)
        .arg(bin())
        .args(args)
        .env_remove("TOOLSPAN_CONFIG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("start toolspan");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Some((status.code().unwrap_or(-1), err));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Arguments, environment, and the flag the refusal must name.
type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);

#[test]
fn operator_time_values_out_of_range_and_unreadable_configs_stop_the_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_string_lossy().to_string();
    let otlp = format!("127.0.0.1:{}", free_port());
    let serve = [
        "serve",
        "--data-dir",
        data.as_str(),
        "--otlp-addr",
        otlp.as_str(),
    ];
    let max = u64::MAX.to_string();
    let cases: Vec<Case> = vec![
        (
            serve.to_vec(),
            vec![("TOOLSPAN_HTTP_HEADER_TIMEOUT_SECS", max.as_str())],
            "header-timeout-secs",
        ),
        (
            serve.to_vec(),
            vec![("TOOLSPAN_HTTP_BODY_TIMEOUT_SECS", "0")],
            "body-timeout-secs",
        ),
        (
            [&serve[..], &["--flush-ms", max.as_str()][..]].concat(),
            vec![],
            "flush-ms",
        ),
        (
            [&serve[..], &["--assembly-wait-secs", "inf"][..]].concat(),
            vec![],
            "assembly-wait-secs",
        ),
        (
            vec![
                "sql",
                "--data-dir",
                data.as_str(),
                "--query-timeout-secs",
                max.as_str(),
                "SELECT 1",
            ],
            vec![],
            "query-timeout-secs",
        ),
    ];
    for (args, env, flag) in cases {
        let (code, err) = run_bounded(&args, &env)
            .unwrap_or_else(|| panic!("{args:?} {env:?}: still running after 20 s"));
        assert_eq!(code, 2, "{args:?} {env:?}: {err}");
        assert!(
            err.contains("invalid_argument") && err.contains(flag) && err.contains("..="),
            "{args:?} {env:?}: {err}"
        );
    }
    // A config file that is a device, or too large: refused before it is read.
    let big = dir.path().join("big.toml");
    std::fs::write(&big, format!("# {}\n", "x".repeat(2 << 20))).expect("write");
    let big = big.to_string_lossy().to_string();
    for (config, says) in [
        ("/dev/zero", "not a regular file"),
        (big.as_str(), "larger than"),
    ] {
        let (code, err) = run_bounded(&["--config", config, "sql", "SELECT 1"], &[])
            .unwrap_or_else(|| panic!("--config {config}: still running after 20 s"));
        assert_eq!(code, 2, "--config {config}: {err}");
        assert!(
            err.contains("invalid_argument") && err.contains(says),
            "--config {config}: {err}"
        );
    }
}
