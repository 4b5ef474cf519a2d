// A JavaScript agent as the official OpenTelemetry JS SDK exports it: one agent run with two
// tool calls, sent with a SimpleSpanProcessor (one OTLP/HTTP request per span, at the span's
// end) to toolspan serve. Children end before their parents, so every stage reaches toolspan
// before its attempt and call, in its own request: the trace arrives in pieces.
//
//   node tests/js/agent.mjs http://127.0.0.1:4318
//
// Prints one JSON line: the trace id, the requests made, and per tool call its call id and
// the span id of each of its spans (tests/js_sdk.rs checks the rows toolspan stored for them).
// Exits non-zero when any export failed.
//
// Only the tool call span carries the tool's name and call id; the attempt and the stages
// must inherit them. No span carries error.type: toolspan must derive PARSE from the failed
// parse stage (a failed stage decides its attempt's and call's error type). For the same reason the attempt and the call fail with a message
// and no exception event that a message or exception rule (pipeline/rules/default.toml)
// could classify on its own: their type can only come from the stage.

import { context, diag, DiagConsoleLogger, DiagLogLevel, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BasicTracerProvider, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { ATTR_SERVICE_NAME } from "@opentelemetry/semantic-conventions";
import {
  ATTR_GEN_AI_AGENT_NAME,
  ATTR_GEN_AI_OPERATION_NAME,
  ATTR_GEN_AI_TOOL_CALL_ID,
  ATTR_GEN_AI_TOOL_NAME,
  GEN_AI_OPERATION_NAME_VALUE_EXECUTE_TOOL,
  GEN_AI_OPERATION_NAME_VALUE_INVOKE_AGENT,
} from "@opentelemetry/semantic-conventions/incubating";
import { randomBytes } from "node:crypto";

const base = process.argv[2];
if (!base) {
  console.error("usage: node tests/js/agent.mjs <OTLP base URL, e.g. http://127.0.0.1:4318>");
  process.exit(2);
}

// Export errors are otherwise silent (the SDK's diag logger is a no-op by default).
diag.setLogger(new DiagConsoleLogger(), DiagLogLevel.WARN);

// Counts the requests and their outcomes: the SimpleSpanProcessor hands the exporter one
// span per call, and each call is one POST.
// A long timeout: the test machine may be loaded, and a request that does not wait in trace
// assembly is answered after its commit.
const inner = new OTLPTraceExporter({
  url: `${base.replace(/\/+$/, "")}/v1/traces`,
  timeoutMillis: 60000,
});
const exports = { requests: 0, spans: 0, failed: [] };
const exporter = {
  export(spans, done) {
    exports.requests += 1;
    exports.spans += spans.length;
    inner.export(spans, (result) => {
      if (result.code !== 0) {
        exports.failed.push(String(result.error ?? result.code));
      }
      done(result);
    });
  },
  shutdown: () => inner.shutdown(),
  forceFlush: () => inner.forceFlush(),
};

const provider = new BasicTracerProvider({
  resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: "js-agent" }),
  spanProcessors: [new SimpleSpanProcessor(exporter)],
});
const tracer = provider.getTracer("toolspan-js-sdk-test", "1.0.0");

// No context manager is registered, so parents are passed explicitly.
function child(parent, name, attributes, kind = SpanKind.INTERNAL) {
  return tracer.startSpan(name, { kind, attributes }, trace.setSpan(context.active(), parent));
}

function stage(parent, name, attributes = {}) {
  return child(parent, name, { "toolspan.stage": name, ...attributes });
}

const ids = (span) => span.spanContext().spanId;
const callId = () => `call_${randomBytes(12).toString("hex")}`;

const agent = tracer.startSpan("invoke_agent js-agent", {
  kind: SpanKind.INTERNAL,
  attributes: {
    [ATTR_GEN_AI_OPERATION_NAME]: GEN_AI_OPERATION_NAME_VALUE_INVOKE_AGENT,
    [ATTR_GEN_AI_AGENT_NAME]: "js-agent",
  },
});
const out = { trace_id: agent.spanContext().traceId, agent: ids(agent), calls: {} };

function toolCall(tool) {
  const id = callId();
  const call = child(agent, `execute_tool ${tool}`, {
    [ATTR_GEN_AI_OPERATION_NAME]: GEN_AI_OPERATION_NAME_VALUE_EXECUTE_TOOL,
    [ATTR_GEN_AI_TOOL_NAME]: tool,
    [ATTR_GEN_AI_TOOL_CALL_ID]: id,
    // toolspan's convention for a call: how many attempts it made. The exporter sends its
    // requests concurrently, so the call can arrive before its attempt; with this toolspan
    // knows to wait for the failing child (docs/ingest.md, "Traces that arrive in pieces").
    "toolspan.attempts": 1,
  });
  const spans = { call: ids(call) };
  out.calls[tool] = { call_id: id, spans };
  return { call, spans };
}

// js_search: one attempt; prepare, send and execute succeed, the answer is an HTML page
// where JSON was expected, so parse fails, then the attempt, then the call.
{
  const { call, spans } = toolCall("js_search");
  const attempt = child(call, "attempt 1", { "toolspan.attempt": 1 });
  spans.attempt = ids(attempt);
  for (const [name, attributes] of [
    ["prepare", {}],
    ["send", { "server.address": "search.internal", "server.port": 443 }],
    ["execute", { "http.response.status_code": 200 }],
  ]) {
    const s = stage(attempt, name, attributes);
    spans[name] = ids(s);
    s.setStatus({ code: SpanStatusCode.OK });
    s.end();
  }
  const parse = stage(attempt, "parse");
  spans.parse = ids(parse);
  try {
    JSON.parse("<!DOCTYPE html><title>Maintenance</title>");
    throw new Error("the HTML page parsed as JSON");
  } catch (err) {
    if (!(err instanceof SyntaxError)) throw err;
    parse.recordException(err);
    parse.setStatus({ code: SpanStatusCode.ERROR, message: err.message });
  }
  parse.end();
  attempt.setStatus({ code: SpanStatusCode.ERROR, message: "attempt 1 of js_search failed" });
  attempt.end();
  call.setStatus({ code: SpanStatusCode.ERROR, message: "js_search failed after 1 attempt" });
  call.end();
}

// js_lookup: succeeds in its single attempt, whose stages hang off the call (no attempt span).
{
  const { call, spans } = toolCall("js_lookup");
  for (const name of ["prepare", "send", "execute", "parse"]) {
    const s = stage(call, name);
    spans[name] = ids(s);
    s.setStatus({ code: SpanStatusCode.OK });
    s.end();
  }
  call.setStatus({ code: SpanStatusCode.OK });
  call.end();
}

agent.end();

// Waits for every request in flight (forceFlush rejects when one of them failed).
let flushError = null;
try {
  await provider.forceFlush();
} catch (err) {
  flushError = err;
}
await provider.shutdown();

out.requests = exports.requests;
out.spans = exports.spans;
if (flushError !== null || exports.failed.length > 0) {
  console.error(
    `${exports.failed.length} of ${exports.requests} export requests failed: ${exports.failed.join("; ")}`,
  );
  process.exit(1);
}
console.log(JSON.stringify(out));
