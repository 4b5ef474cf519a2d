"""Replays the requests Grafana's built-in Tempo data source makes against `toolspan query`,
and decodes each answer the way Grafana does (pkg/tsdb/tempo and its frontend):

- health check: GET /api/echo, any 200;
- GET /api/status/buildinfo, JSON with a semver `version`;
- trace by id: GET /api/v2/traces/{id}?start=&end= with `Accept: application/protobuf`,
  decoded as Tempo's `TraceByIDResponse` (field 1: `Trace`, whose field 1 is the OTLP
  `ResourceSpans`); after a 404 Grafana retries GET /api/traces/{id}, decoded as `Trace`;
- TraceQL search: GET /api/search?q=&limit=&spss=&start=&end=, JSON `traces[]`;
- autocompletion: GET /api/v2/search/tags?scope=, /api/v2/search/tag/{tag}/values, and the
  v1 forms.

usage: tempo_replay.py BASE_URL TOKEN TRACE_ID EXPECTED_SPANS
Prints one line per check; exits non-zero on the first failure.
"""

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.trace.v1 import trace_pb2  # registers trace.proto in the pool

BASE, TOKEN, TRACE_ID, EXPECTED_SPANS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def tempo_messages():
    """Tempo's `Trace` and `TraceByIDResponse` (tempo/pkg/tempopb/tempo.proto), built on the
    OpenTelemetry `ResourceSpans` like Tempo's own generated code."""
    f = descriptor_pb2.FileDescriptorProto(
        name="tempopb/tempo_replay.proto", package="tempopb", syntax="proto3",
        dependency=["opentelemetry/proto/trace/v1/trace.proto"])
    t = f.message_type.add(name="Trace")
    t.field.add(name="resourceSpans", number=1, type=11, label=3,
                type_name=".opentelemetry.proto.trace.v1.ResourceSpans")
    r = f.message_type.add(name="TraceByIDResponse")
    r.field.add(name="trace", number=1, type=11, label=1, type_name=".tempopb.Trace")
    r.field.add(name="status", number=3, type=5, label=1)
    r.field.add(name="message", number=4, type=9, label=1)
    pool = descriptor_pool.Default()
    pool.Add(f)
    get = message_factory.GetMessageClass
    return get(pool.FindMessageTypeByName("tempopb.Trace")), \
        get(pool.FindMessageTypeByName("tempopb.TraceByIDResponse"))


Trace, TraceByIDResponse = tempo_messages()


def get(path, params=None, accept=None):
    url = BASE + path + ("?" + urllib.parse.urlencode(params) if params else "")
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    if accept:
        req.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def envelope(body):
    err = json.loads(body)["error"]
    for k in ("code", "class", "message", "retryable", "reference"):
        check(k in err, f"the envelope has `{k}`")
    return err


def spans_of(resource_spans):
    return [(rs, s) for rs in resource_spans for ss in rs.scope_spans for s in ss.spans]


def attrs(kvs):
    out = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
    return out


now = int(time.time())
start, end = now - 86400, now + 60

# Health check and version.
status, _, body = get("/api/echo")
check(status == 200 and body == b"echo", "GET /api/echo answers echo")
status, _, body = get("/api/status/buildinfo")
info = json.loads(body)
check(status == 200 and len(info["version"].split(".")) == 3, f"buildinfo version {info['version']}")

# Trace by id, v2 then v1, protobuf as Grafana asks.
status, headers, body = get(f"/api/v2/traces/{TRACE_ID}", {"start": start, "end": end},
                            accept="application/protobuf")
check(status == 200, "v2 trace by id: 200")
check(headers["Content-Type"] == "application/protobuf", "as protobuf")
resp = TraceByIDResponse.FromString(body)
v2_spans = spans_of(resp.trace.resourceSpans)
check(len(v2_spans) == EXPECTED_SPANS, f"v2 holds the trace's {EXPECTED_SPANS} spans")
for rs, s in v2_spans:
    check(s.trace_id.hex() == TRACE_ID, "span carries the trace id") if s is v2_spans[0][1] else None
    res = attrs(rs.resource.attributes)
    a = attrs(s.attributes)
    if s is v2_spans[0][1]:
        check("service.name" in res, f"resource has service.name ({res.get('service.name')})")
    assert "toolspan.stage" in a, f"every span carries toolspan.stage: {a}"
    if s.status.code == 2:
        assert a.get("error.type") or a.get("toolspan.stage") in ("agent", "llm", "other"), a
check(True, "every span carries toolspan.stage; failed tool spans carry error.type")
failed = [(rs, s) for rs, s in v2_spans if s.status.code == 2]
check(failed, f"{len(failed)} failed spans with status ERROR and a message")
tools = {attrs(s.attributes).get("gen_ai.tool.name") for _, s in v2_spans} - {None}
check(tools, f"original attributes are back: gen_ai.tool.name {sorted(tools)}")
ids = {s.span_id for _, s in v2_spans}
parents = [s.parent_span_id for _, s in v2_spans if s.parent_span_id]
check(all(p in ids for p in parents), "every parent span id is in the trace")

status, headers, body = get(f"/api/traces/{TRACE_ID}", {"start": start, "end": end},
                            accept="application/protobuf")
check(status == 200, "v1 trace by id: 200")
v1 = Trace.FromString(body)
check(len(spans_of(v1.resourceSpans)) == EXPECTED_SPANS, "v1 holds the same spans")
# Tempo's Trace has the same bytes as OTLP TracesData.
check(len(spans_of(trace_pb2.TracesData.FromString(body).resource_spans)) == EXPECTED_SPANS,
      "v1 decodes as OTLP TracesData too")

# Without Accept: OTLP JSON.
status, _, body = get(f"/api/v2/traces/{TRACE_ID}")
j = json.loads(body)
check(j["trace"]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] == TRACE_ID,
      "v2 JSON is OTLP JSON with hex ids")

# Unknown and malformed ids: Grafana falls back from a v2 404 to v1.
missing = "0" * 31 + "1"
status, _, body = get(f"/api/v2/traces/{missing}", accept="application/protobuf")
check(status == 404, "unknown id on v2: 404")
check(envelope(body)["code"] == "not_found", "not_found envelope")
status, _, body = get(f"/api/traces/{missing}", accept="application/protobuf")
check(status == 404, "unknown id on v1: 404")
status, _, body = get("/api/v2/traces/not-a-trace-id", accept="application/protobuf")
check(status == 400 and envelope(body)["code"] == "invalid_argument", "malformed id: 400")

# TraceQL search as the query editor sends it.
q = '{ span.gen_ai.tool.name = "search_docs" && span.error.type = "PARSE" }'
status, _, body = get("/api/search", {"q": q, "limit": 20, "spss": 3, "start": start, "end": end})
check(status == 200, f"search {q}: 200")
res = json.loads(body)
traces = res["traces"]
check(0 < len(traces) <= 20, f"{len(traces)} traces, at most the limit")
starts = [int(t["startTimeUnixNano"]) for t in traces]
for t in traces:
    check(len(t["traceID"]) == 32 and t["rootServiceName"] and isinstance(t["durationMs"], int),
          f"trace {t['traceID']} has its root service and duration") if t is traces[0] else None
    ss = t["spanSets"][0]
    assert 0 < len(ss["spans"]) <= 3, ss
    assert ss["matched"] >= len(ss["spans"]), ss
    for sp in ss["spans"]:
        a = {kv["key"]: kv["value"] for kv in sp["attributes"]}
        assert a["gen_ai.tool.name"] == {"stringValue": "search_docs"}, a
        assert a["error.type"] == {"stringValue": "PARSE"}, a
        assert int(sp["durationNanos"]) >= 0 and len(sp["spanID"]) == 16, sp
check(True, "every matched span is a PARSE failure of search_docs, at most spss per trace")
# Each returned trace really holds such a span (its spans, fetched by id, say so).
t0 = traces[0]["traceID"]
_, _, body = get(f"/api/v2/traces/{t0}", accept="application/protobuf")
found = [s for _, s in spans_of(TraceByIDResponse.FromString(body).trace.resourceSpans)
         if attrs(s.attributes).get("gen_ai.tool.name") == "search_docs"
         and attrs(s.attributes).get("error.type") == "PARSE"]
check(found, "the first result's trace holds a matching span")

status, _, body = get("/api/search", {"q": '{ status = error && duration > 0ms } && { span.gen_ai.tool.name =~ "search.*" }',
                                      "limit": 5, "start": start, "end": end})
check(status == 200 and len(json.loads(body)["traces"]) <= 5, "spansets joined by && with a regex")

status, _, body = get("/api/search", {"q": "{ status = error } | count() > 2", "start": start, "end": end})
err = envelope(body)
check(status == 400 and "supported" in err["message"], f"unsupported TraceQL: 400 naming what is supported")

# Autocompletion.
status, _, body = get("/api/v2/search/tags", {"scope": "span", "start": start, "end": end})
scopes = json.loads(body)["scopes"]
check(status == 200 and scopes[0]["name"] == "span" and "gen_ai.tool.name" in scopes[0]["tags"],
      "v2 span tags include gen_ai.tool.name")
status, _, body = get("/api/v2/search/tags", {"start": start, "end": end})
names = {s["name"]: s["tags"] for s in json.loads(body)["scopes"]}
check({"span", "resource", "intrinsic"} <= set(names) and "service.name" in names["resource"],
      "v2 tags in every scope")
status, _, body = get("/api/v2/search/tag/span.gen_ai.tool.name/values", {"start": start, "end": end})
values = json.loads(body)["tagValues"]
check({"type": "string", "value": "search_docs"} in values, "v2 tool name values include search_docs")
status, _, body = get("/api/v2/search/tag/span.error.type/values", {"start": start, "end": end})
check({"type": "string", "value": "PARSE"} in json.loads(body)["tagValues"], "error type values")
status, _, body = get("/api/v2/search/tag/status/values")
check({"type": "keyword", "value": "error"} in json.loads(body)["tagValues"], "status values")
status, _, body = get("/api/search/tags")
check("gen_ai.tool.name" in json.loads(body)["tagNames"], "v1 tag names")
status, _, body = get("/api/search/tag/service.name/values")
check(json.loads(body)["tagValues"], "v1 service name values")
print("all Grafana requests answered")
