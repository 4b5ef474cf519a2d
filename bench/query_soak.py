"""bench/query-soak's driver: `toolspan serve` under steady OTLP/HTTP writes while `toolspan query`
on the same data directory answers the six searches every few seconds. See bench/query-soak for
what is measured and the bound; this file is run by it:

    python bench/query_soak.py BIN WORK MINUTES OUT_PREFIX
    python bench/query_soak.py --plot OUT_PREFIX    (redraws OUT_PREFIX.png from its .csv)

Environment (all optional): QSOAK_TRACES_PER_S (8), QSOAK_SENDERS (8), QSOAK_EVERY_S (5),
QSOAK_POOL_SPANS (20000), QSOAK_WINDOW_S (300).
"""
import csv
import datetime as dt
import http.client
import http.server
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time

if sys.argv[1] == "--plot":
    BIN = WORK = None
    MINUTES, OUT = 0.0, sys.argv[2]
else:
    BIN, WORK, MINUTES, OUT = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
TRACES_PER_S = float(os.environ.get("QSOAK_TRACES_PER_S", "8"))
SENDERS = int(os.environ.get("QSOAK_SENDERS", "8"))
EVERY_S = float(os.environ.get("QSOAK_EVERY_S", "5"))
POOL_SPANS = int(os.environ.get("QSOAK_POOL_SPANS", "20000"))
WINDOW_S = float(os.environ.get("QSOAK_WINDOW_S", "300"))
# The bound (stated in bench/query-soak's header).
LAT_FACTOR, LAT_SLACK_MS = 2.0, 50.0
RSS_FACTOR, RSS_SLACK_MB = 1.5, 100.0

DATA = os.path.join(WORK or "", "data")
TABLE = os.path.join(DATA, "spans")
QUERIES = ("q1", "q2", "q3", "q4", "q5", "q6")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_mb(pid, key="VmRSS"):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_s(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def ts(seconds_ago):
    t = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds_ago)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------------------------------
# 1. The traffic: the synthetic fleet's traces (with payloads), one trace per OTLP/JSON request,
# captured once from `toolspan produce --endpoint`; each replay gets a fresh trace id, fresh
# error references and its times moved so that the trace ends now.
def capture_pool():
    bodies = []

    class Capture(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            n = int(self.headers.get("content-length", 0))
            bodies.append(self.rfile.read(n))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    cap = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=cap.serve_forever, daemon=True).start()
    subprocess.run([BIN, "produce", "--log", "warn", "--payloads", "--format", "otlp_json",
                    "--seed", str(random.randrange(1, 1 << 31)), "--spans", str(POOL_SPANS),
                    "--endpoint", f"http://127.0.0.1:{cap.server_address[1]}/v1/traces"],
                   check=True, capture_output=True, text=True)
    cap.shutdown()
    return bodies


def spans_of(doc):
    for r in doc["resourceSpans"]:
        for ss in r["scopeSpans"]:
            yield from ss["spans"]


def replay(body, rng):
    """The body of one pooled trace as a new trace ending now (error references renewed wherever
    they appear: the attribute and any text quoting it)."""
    doc = json.loads(body)
    spans = list(spans_of(doc))
    refs = {a["value"]["stringValue"] for s in spans for a in s.get("attributes", [])
            if a["key"] == "toolspan.error.reference" and "stringValue" in a["value"]}
    trace = "%032x" % rng.getrandbits(128)
    end = max(int(s["endTimeUnixNano"]) for s in spans)
    shift = time.time_ns() - end
    for s in spans:
        s["traceId"] = trace
        s["startTimeUnixNano"] = str(int(s["startTimeUnixNano"]) + shift)
        s["endTimeUnixNano"] = str(int(s["endTimeUnixNano"]) + shift)
        for e in s.get("events", []):
            if "timeUnixNano" in e:
                e["timeUnixNano"] = str(int(e["timeUnixNano"]) + shift)
    text = json.dumps(doc)
    for old in refs:
        text = text.replace(old, "err_%08x" % rng.getrandbits(32))
    return text.encode(), len(spans)


class Senders:
    """SENDERS threads, each on its own keep-alive connection, sending one trace a request on a
    shared schedule of TRACES_PER_S (a thread whose slot is past sends at once)."""

    def __init__(self, port, pool):
        self.port, self.pool = port, pool
        self.lock = threading.Lock()
        self.slot = 0
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.ok_requests = self.ok_spans = self.refused = self.failed = 0
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(SENDERS)]

    def start(self):
        self.t0 = time.monotonic()
        for t in self.threads:
            t.start()

    def run(self, i):
        rng = random.Random()
        conn = None
        while not self.stop.is_set():
            with self.lock:
                at = self.t0 + self.slot / TRACES_PER_S
                self.slot += 1
            wait = at - time.monotonic()
            if wait > 0 and self.stop.wait(wait):
                break
            body, n = replay(rng.choice(self.pool), rng)
            while not self.stop.is_set():
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                    conn.request("POST", "/v1/traces", body, {"content-type": "application/json"})
                    r = conn.getresponse()
                    r.read()
                    status = r.status
                except (OSError, http.client.HTTPException):
                    conn, status = None, -1
                if status == 200:
                    with self.lock:
                        self.ok_requests += 1
                        self.ok_spans += n
                    break
                with self.lock:
                    if status in (429, 503):
                        self.refused += 1
                    else:
                        self.failed += 1
                self.stop.wait(0.5)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(70)


# ---------------------------------------------------------------------------------------------
# 2. The table as the log says: live data files (adds minus removes, read incrementally) and the
# latest committed version.
class LogReader:
    def __init__(self):
        self.next_version = 0
        self.live = set()

    def poll(self):
        d = os.path.join(TABLE, "_delta_log")
        while True:
            path = os.path.join(d, "%020d.json" % self.next_version)
            try:
                with open(path) as f:
                    lines = f.read().splitlines()
            except FileNotFoundError:
                break
            for line in lines:
                if not line.strip():
                    continue
                a = json.loads(line)
                if "add" in a:
                    self.live.add(a["add"]["path"])
                elif "remove" in a:
                    self.live.discard(a["remove"]["path"])
            self.next_version += 1
        return self.next_version - 1, len(self.live)


def files_on_disk():
    n = 0
    for root, dirs, files in os.walk(TABLE):
        if "_delta_log" in dirs:
            dirs.remove("_delta_log")
        n += sum(1 for f in files if f.endswith(".parquet"))
    return n


# ---------------------------------------------------------------------------------------------
# 3. The six searches, as bench/src/bin/query.rs writes them for toolspan.
def queries(trace_id, reference):
    hour, day = ts(3600), ts(86400)
    return [
        ("q1", "SELECT trace_id, span_id, start_time, error_code, error_message FROM spans "
               "WHERE tool = 'search_docs' AND error_type = 'PARSE' AND start_time >= "
               f"'{hour}' ORDER BY start_time DESC LIMIT 100"),
        ("q2", "SELECT tool, stage, count(*) AS spans, "
               "sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS failures, "
               "avg(CASE WHEN status = 'error' THEN 1.0 ELSE 0.0 END) AS rate "
               f"FROM spans WHERE start_time >= '{day}' GROUP BY tool, stage ORDER BY tool, stage"),
        ("q3", f"SELECT * FROM spans WHERE trace_id = '{trace_id}' ORDER BY start_time"),
        ("q4", f"SELECT * FROM spans WHERE reference = '{reference}'"),
        ("q5", "SELECT tool, error_code, n FROM (SELECT tool, error_code, count(*) AS n, "
               "row_number() OVER (PARTITION BY tool ORDER BY count(*) DESC, error_code) AS r "
               "FROM spans WHERE status = 'error' AND error_code IS NOT NULL AND start_time >= "
               f"'{day}' GROUP BY tool, error_code) t WHERE r <= 10 ORDER BY tool, n DESC"),
        ("q6", "SELECT count(*) AS n FROM calls WHERE recovered_after_retry AND start_time >= "
               f"'{day}'"),
    ]


def sql(port, statement, timeout=60):
    """(ms, rows or None on failure, error text)."""
    t = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/api/v1/sql", json.dumps({"sql": statement}),
                  {"content-type": "application/json", "accept": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        ms = (time.perf_counter() - t) * 1000
        if r.status != 200:
            try:
                env = json.loads(data)
                code = env.get("error", env).get("code", "?")
            except (ValueError, AttributeError):
                code = "?"
            return ms, None, f"HTTP {r.status} {code}"
        return ms, json.loads(data)["rows"], ""
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        return (time.perf_counter() - t) * 1000, None, type(e).__name__


def wait_ready(port, proc, what, limit=120):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench/query-soak: {what} exited at start (see its log)")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/readyz")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"bench/query-soak: {what} not ready after {limit} s")


def metric(port, name):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/metrics")
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    except (OSError, http.client.HTTPException, ValueError):
        pass
    return float("nan")


def version_read(port):
    v = metric(port, "toolspan_query_table_version")
    return -1 if v != v else int(v)


def log_levels(path):
    """(errors, warnings, the first few distinct warning/error messages) of a JSON-lines log."""
    errors = warnings = 0
    seen = {}
    with open(path, errors="replace") as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            level = e.get("level", "")
            if level in ("ERROR", "WARN"):
                if level == "ERROR":
                    errors += 1
                else:
                    warnings += 1
                key = (level, e.get("message", "")[:120])
                seen[key] = seen.get(key, 0) + 1
    return errors, warnings, seen


def main():
    pool = capture_pool()
    log(f"bench/query-soak: {os.cpu_count()} CPUs, load {load1():.2f}; {len(pool)} pooled traces; "
        f"{TRACES_PER_S:g} traces/s from {SENDERS} senders; a round of Q1-Q6 every {EVERY_S:g} s "
        f"for {MINUTES:g} min")
    otlp, qhttp = free_port(), free_port()
    serve_log = open(os.path.join(WORK, "serve.log"), "w")
    query_log = open(os.path.join(WORK, "query.log"), "w")
    serve = subprocess.Popen([BIN, "serve", "--data-dir", DATA, "--otlp-addr", f"127.0.0.1:{otlp}",
                              "--log", "info", "--log-format", "json"],
                             stdout=subprocess.DEVNULL, stderr=serve_log)
    procs = [serve]
    senders = None
    try:
        wait_ready(otlp, serve, "serve")
        senders = Senders(otlp, pool)
        senders.start()
        t_start = time.monotonic()
        # The query service starts on the table serve has created.
        while not os.path.exists(os.path.join(TABLE, "_delta_log", "%020d.json" % 0)):
            time.sleep(0.2)
        query = subprocess.Popen([BIN, "query", "--data-dir", DATA, "--http-addr",
                                  f"127.0.0.1:{qhttp}", "--pg-addr", "off", "--log", "info",
                                  "--log-format", "json"],
                                 stdout=subprocess.DEVNULL, stderr=query_log)
        procs.append(query)
        wait_ready(qhttp, query, "query")
        # Q3 and Q4 look up a trace and a reference that exist: picked as bench/query picks them.
        trace_id = reference = None
        deadline = time.time() + 180
        while (trace_id is None or reference is None) and time.time() < deadline:
            _, rows, _ = sql(qhttp, "SELECT trace_id FROM calls WHERE attempts > 1 "
                                    "ORDER BY trace_id LIMIT 1")
            trace_id = rows[0]["trace_id"] if rows else None
            _, rows, _ = sql(qhttp, "SELECT reference FROM spans WHERE reference IS NOT NULL "
                                    "ORDER BY reference LIMIT 1")
            reference = rows[0]["reference"] if rows else None
            time.sleep(1)
        if trace_id is None or reference is None:
            raise SystemExit("bench/query-soak: no retried call or reference after 3 minutes")
        log(f"bench/query-soak: Q3 trace {trace_id}, Q4 reference {reference}")

        lr = LogReader()
        rounds, errors, error_kinds = [], 0, {}
        end = t_start + MINUTES * 60
        k = 0
        next_minute = 60
        while True:
            at = t_start + k * EVERY_S
            if at >= end:
                break
            if at > time.monotonic():
                time.sleep(at - time.monotonic())
            t = time.monotonic() - t_start
            row = {"t_s": round(t, 1)}
            for name, statement in queries(trace_id, reference):
                ms, rows, err = sql(qhttp, statement)
                row[f"{name}_ms"] = round(ms, 2)
                if rows is None:
                    errors += 1
                    error_kinds[err] = error_kinds.get(err, 0) + 1
                    row[f"{name}_rows"] = -1
                else:
                    row[f"{name}_rows"] = len(rows)
                    if name == "q2":
                        row["spans_in_table"] = sum(int(r["spans"]) for r in rows)
            version, live = lr.poll()
            row.update({
                "query_rss_mb": round(rss_mb(query.pid), 1),
                "serve_rss_mb": round(rss_mb(serve.pid), 1),
                "query_cpu_s": round(cpu_s(query.pid), 2),
                "serve_cpu_s": round(cpu_s(serve.pid), 2),
                "version": version,
                "version_read": version_read(qhttp),
                "live_files": live,
                "disk_files": files_on_disk(),
                "spans_sent": senders.ok_spans,
                "load1": load1(),
            })
            row.setdefault("spans_in_table", -1)
            rounds.append(row)
            if t >= next_minute:
                last = [r for r in rounds if r["t_s"] > t - 60]
                med = " ".join(f"{q}={statistics.median(r[q + '_ms'] for r in last):.0f}"
                               for q in QUERIES)
                log(f"  min {t / 60:.0f}: ms {med} | query {row['query_rss_mb']:.0f} MiB, serve "
                    f"{row['serve_rss_mb']:.0f} MiB | v{version}, {live} live files "
                    f"({row['disk_files']} on disk), {row['spans_in_table']} spans | "
                    f"load {row['load1']:.2f} | errors {errors}")
                next_minute += 60
            k = max(k + 1, int((time.monotonic() - t_start) // EVERY_S) + 1)
            if serve.poll() is not None or query.poll() is not None:
                raise SystemExit("bench/query-soak: serve or query exited during the soak")
        peak_query = rss_mb(query.pid, "VmHWM")
        peak_serve = rss_mb(serve.pid, "VmHWM")
    finally:
        if senders:
            senders.finish()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        serve_log.close()
        query_log.close()

    write_csv(rounds)
    plot(rounds)
    report(rounds, errors, error_kinds, senders, peak_query, peak_serve, lr)


def write_csv(rounds):
    with open(OUT + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rounds[0].keys()))
        w.writeheader()
        w.writerows(rounds)


def plot(rounds):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = [r["t_s"] / 60 for r in rounds]
    fig, ax = plt.subplots(5, 1, figsize=(11, 14), sharex=True,
                           gridspec_kw={"height_ratios": [3, 1.5, 1.5, 1.5, 1.2]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    half = max(1, int(60 / EVERY_S) // 2)
    for i, q in enumerate(QUERIES):
        ys = [r[q + "_ms"] for r in rounds]
        ax[0].scatter(m, ys, s=3, alpha=0.25, color=colors[i])
        # A centred one-minute rolling median over the dots.
        roll = [statistics.median(ys[max(0, j - half):j + half + 1]) for j in range(len(ys))]
        ax[0].plot(m, roll, color=colors[i], lw=1.6, label=f"{q.upper()} (1-min median)")
    ax[0].set_yscale("log")
    ax[0].set_ylabel("latency, ms (log)")
    ax[0].legend(ncol=3, fontsize=8, loc="upper left")
    ax[0].set_title("toolspan query: Q1-Q6 every %gs while serve writes %g traces/s" %
                    (EVERY_S, TRACES_PER_S))
    ax[1].plot(m, [r["query_rss_mb"] for r in rounds], label="toolspan query")
    ax[1].plot(m, [r["serve_rss_mb"] for r in rounds], label="toolspan serve")
    ax[1].set_ylabel("RSS, MiB")
    ax[1].set_ylim(bottom=0)
    ax[1].legend(fontsize=8, loc="upper left")
    def two_scales(a, left, right, right_style):
        """One panel, a series on each y axis: each (values, label, axis label); one legend."""
        a.plot(m, left[0], label=left[1])
        a.set_ylabel(left[2])
        a.set_ylim(bottom=0)
        t = a.twinx()
        t.plot(m, right[0], color=colors[1], label=right[1], **right_style)
        t.set_ylabel(right[2])
        t.set_ylim(bottom=0)
        h1, l1 = a.get_legend_handles_labels()
        h2, l2 = t.get_legend_handles_labels()
        a.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")

    two_scales(ax[2],
               ([r["live_files"] for r in rounds], "live data files (in the log)", "live files"),
               ([r["disk_files"] for r in rounds],
                "Parquet files on disk (removed ones until vacuum)", "files on disk"),
               {"ls": "--"})
    two_scales(ax[3],
               ([r["version"] for r in rounds], "table version (commits)", "table version"),
               ([r["spans_in_table"] / 1000 for r in rounds], "spans in table (thousands)",
                "spans, thousands"),
               {})
    ax[4].plot(m, [r["load1"] for r in rounds], color="gray")
    ax[4].axhline(os.cpu_count() or 2, color="gray", ls=":", lw=1)
    ax[4].set_ylabel("load avg (1 min)")
    ax[4].set_ylim(bottom=0)
    ax[4].set_xlabel("minutes since serve started writing")
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT + ".png", dpi=90)


def report(rounds, errors, error_kinds, senders, peak_query, peak_serve, lr):
    t_end = rounds[-1]["t_s"]
    first = [r for r in rounds if r["t_s"] < WINDOW_S]
    last = [r for r in rounds if r["t_s"] >= t_end - WINDOW_S]
    kv = {"minutes": round(t_end / 60, 1), "rounds": len(rounds),
          "commits": rounds[-1]["version"], "spans_sent": senders.ok_spans,
          "spans_end": rounds[-1]["spans_in_table"], "files_end": rounds[-1]["live_files"],
          "files_disk_end": rounds[-1]["disk_files"],
          "files_max": max(r["live_files"] for r in rounds)}
    bounded = errors == 0
    over = []
    for q in QUERIES:
        a = statistics.median(r[q + "_ms"] for r in first)
        b = statistics.median(r[q + "_ms"] for r in last)
        kv[f"{q}_ms_first"], kv[f"{q}_ms_last"] = round(a, 1), round(b, 1)
        if b > LAT_FACTOR * a + LAT_SLACK_MS:
            bounded = False
            over.append(q)
    ra = statistics.median(r["query_rss_mb"] for r in first)
    rb = statistics.median(r["query_rss_mb"] for r in last)
    kv.update({"rss_mb_first": round(ra), "rss_mb_last": round(rb),
               "rss_mb_max": round(max(max(r["query_rss_mb"] for r in rounds), peak_query)),
               "serve_rss_mb_max": round(max(max(r["serve_rss_mb"] for r in rounds), peak_serve)),
               "load_min": min(r["load1"] for r in rounds),
               "load_max": max(r["load1"] for r in rounds),
               "errors": errors, "send_refused": senders.refused, "send_failed": senders.failed})
    if rb > RSS_FACTOR * ra + RSS_SLACK_MB:
        bounded = False
        over.append("rss")
    s_err, s_warn, s_seen = log_levels(os.path.join(WORK, "serve.log"))
    q_err, q_warn, q_seen = log_levels(os.path.join(WORK, "query.log"))
    kv.update({"serve_log_errors": s_err, "serve_log_warnings": s_warn,
               "query_log_errors": q_err, "query_log_warnings": q_warn})
    kv["bounded"] = "yes" if bounded else "no"
    for who, seen in (("serve", s_seen), ("query", q_seen)):
        for (level, msg), n in sorted(seen.items(), key=lambda x: -x[1])[:8]:
            log(f"  {who} log: {n}x {level} {msg}")
    if error_kinds:
        log(f"  failed queries: {error_kinds}")
    if over:
        log(f"  over the bound: {' '.join(over)}")
    log(f"bench/query-soak: rounds in {OUT}.csv, plot in {OUT}.png")
    print(" ".join(f"{k}={v}" for k, v in kv.items()), flush=True)


def read_csv():
    with open(OUT + ".csv", newline="") as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


if __name__ == "__main__":
    if BIN is None:
        plot(read_csv())
    else:
        main()
