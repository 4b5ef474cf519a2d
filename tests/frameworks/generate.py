#!/usr/bin/env python3
"""Generates the labelled framework corpus: what agent frameworks' own instrumentation emits
when a tool call fails, for every kind of failure, and when it succeeds.

    python tests/frameworks/generate.py            # all frameworks, into tests/frameworks/corpus/
    python tests/frameworks/generate.py --out DIR --framework langchain

Every span comes from the released packages (tests/frameworks/requirements.txt and
sdk/python/requirements-test.txt) driven by scripted models (no network LLM):

| framework                   | driven as                                           | tool span              |
|-----------------------------|-----------------------------------------------------|------------------------|
| `pydantic_ai`               | `Agent` + `FunctionModel`, pydantic-ai's native     | `execute_tool NAME`    |
|                             | OTel spans                                          |                        |
| `langchain`                 | LangGraph `StateGraph` + `ToolNode`,                | OpenInference `TOOL`   |
|                             | `GenericFakeChatModel`, OpenInference's LangChain   |                        |
|                             | instrumentor                                        |                        |
| `openai_agents`             | `Runner` with a scripted `Model`, OpenInference's   | OpenInference `TOOL`   |
|                             | instrumentor                                        |                        |
| `mcp`                       | `mcp.Client` over the in-memory transport to an     | `tools/call NAME`      |
|                             | `MCPServer`, the MCP SDK's own OTel spans           | (execute_tool)         |
| `openllmetry_langchain`     | the `langchain` driver, OpenLLMetry's (Traceloop's) | `traceloop.span.kind`  |
|                             | opentelemetry-instrumentation-langchain             | `= tool`               |
| `openllmetry_openai_agents` | the `openai_agents` driver, OpenLLMetry's           | `traceloop.span.kind`  |
|                             | opentelemetry-instrumentation-openai-agents         | `= tool`               |
| `agno`                      | `Agent` + a scripted Agno `Model`, OpenInference's  | OpenInference `TOOL`   |
|                             | Agno instrumentor                                   |                        |
| `haystack`                  | `Agent` + `MockChatGenerator`, Haystack's own       | `haystack.agent.step`  |
|                             | tracing (`haystack.tracing`) bridged to OTel        | `.tool`                |
| `dspy`                      | `dspy.ReAct` + `DummyLM`, OpenInference's DSPy      | OpenInference `TOOL`   |
|                             | instrumentor                                        |                        |

Haystack 3 keeps its tracing API (`haystack.tracing.Tracer`) but ships no OpenTelemetry
backend, and OpenInference's Haystack instrumentor records no span for an Agent's tool calls:
`haystack_tracer` bridges Haystack's spans to OpenTelemetry as Haystack 2's
`OpenTelemetryTracer` did (tags as attributes, content tags on). Haystack leaves a failed tool
span's status unset and tags it `haystack.tool.error`; it passes the model's arguments to the
function unchecked, so its `bad_args` failure is the tool's own TypeError (not gated).

OpenLLMetry's MCP instrumentor (opentelemetry-instrumentation-mcp 0.62.4, still the latest
release) cannot be driven: once instrumented, importing `mcp.client.streamable_http` fails,
because it patches `streamablehttp_client`, which mcp 2.x no longer has.

The tool (`search_docs(query: str, limit: int = 5)`) calls a real HTTP backend; each *case* is
one agent run (one trace) whose backend fails in one way: real local servers
(`http.server` on 127.0.0.1) answering 401/403/500/502/503/504, too slowly (a timeout), with
text that is not JSON or JSON of the wrong shape; a closed port (connection refused), an
`.invalid` host (a real DNS failure), TLS spoken to a plain-HTTP port (a real TLS failure). The
model's arguments are rejected by the framework's schema validation in `bad_args` (the model
then corrects them: a second, successful tool span), and the tool raises its own exception in
`tool_exception`. Each case runs in two *variants*: `httpx` (an async httpx client
instrumented by opentelemetry-instrumentation-httpx with the stable HTTP semantic conventions,
`OTEL_SEMCONV_STABILITY_OPT_IN=http`: HTTP client spans under the tool span) and `requests`
(uninstrumented: only what the framework records on its tool span). MCP runs the `httpx`
variant only: the MCP SDK records no error detail on its spans, so without HTTP child spans
every failure looks the same.

Output, under --out (default tests/frameworks/corpus/):
- `<framework>.json`: one OTLP/JSON ExportTraceServiceRequest (what the OTLP/HTTP JSON
  exporter sends) holding every span of that framework's runs;
- `labels.json`: `{span_id: expected error type}` for every tool span, `""` for a success,
  by the meaning in shared/DESIGN.md §3 (PREPARE: the model's arguments failed validation;
  NETWORK: DNS, connect, TLS, 401/403, or a gateway's 502/503/504; TOOL_ERROR: the tool's own
  error or a timeout; PARSE: the answer did not match what was expected);
- `cases.json`: `{span_id: {framework, variant, case}}`, for the evaluator's report; spans
  that the rules file cannot classify as labelled also carry `"gate": false` and `why`
  (`unobservable: ...`: the framework records nothing that tells this failure apart;
  `engine: ...`: toolspan's classification outside the rules decides). The evaluator shows
  them and counts them in the overall figure, and leaves them out of its 95 % gate.

Span and trace ids change from run to run; the labels (per framework, variant and case) do
not: a case whose tool spans do not fail and succeed as labelled is run again (twice at most:
a loaded machine can time out a request that should not), then the generator fails. Exception stack traces are cut to their last 1,500 characters to keep the corpus
small (no rule reads them); nothing else is changed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

# The stable HTTP semantic conventions for the httpx instrumentation (url.full,
# http.response.status_code, error.type); read when the instrumentation is imported.
os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
# No network but the local backends: the frameworks' usage telemetry off (Haystack, Agno), and
# LiteLLM (under DSPy) reads its bundled model cost map instead of fetching one.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
os.environ.setdefault("AGNO_TELEMETRY", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent
FRAMEWORKS = ("pydantic_ai", "langchain", "openai_agents", "mcp", "openllmetry_langchain",
              "openllmetry_openai_agents", "agno", "haystack", "dspy")
# Every framework in both variants but MCP (httpx only: see above).
VARIANTS = {fw: ("httpx",) if fw == "mcp" else ("httpx", "requests") for fw in FRAMEWORKS}
TIMEOUT_S = 1.5  # generous: an answer that should arrive must not time out on a loaded machine
STACK_KEEP = 1500

GOOD_ARGS = {"query": "install guide", "limit": 3}
BAD_ARGS = {"query": 42, "limit": "many"}


@dataclass(frozen=True)
class Case:
    name: str
    backend: str  # which URL the tool calls (see Backends.url)
    labels: tuple[str, ...]  # expected error type of each tool span, in start order
    args: tuple[dict, ...] = (GOOD_ARGS,)  # the model's arguments, one tool call each
    # framework -> why its spans cannot be classified as labelled through the rules file; the
    # evaluator shows these spans, and counts them in the overall figure, but leaves them out
    # of its 95 % gate
    exempt: tuple[tuple[str, str], ...] = ()


# The MCP SDK (mcp 2.3.0, mcp/server/_otel.py) marks a tool's error result with
# error.type=tool_error on its `tools/call` span and records nothing else about it.
MCP_SILENT = ("mcp", "unobservable: the MCP SDK records a tool's error result as error.type=tool_error "
              "and nothing else; the result's text is on no span")
# Haystack's Agent passes the model's arguments to the tool function unchecked (no schema
# validation, no conversion): the tool then fails on them with its own TypeError, recorded as
# text that says nothing about an argument.
HAYSTACK_UNCHECKED = ("haystack", "unobservable: Haystack does not check the model's arguments against the "
                      "tool's schema; the tool's own TypeError on them is recorded as text alone "
                      "(\"slice indices must be integers\")")


CASES = [
    Case("ok", "ok", ("",)),
    Case("bad_args", "ok", ("PREPARE", ""), (BAD_ARGS, GOOD_ARGS), (MCP_SILENT, HAYSTACK_UNCHECKED)),
    Case("refused", "refused", ("NETWORK",)),
    Case("dns", "dns", ("NETWORK",)),
    Case("tls", "tls", ("NETWORK",)),
    Case("http_401", "status/401", ("NETWORK",)),
    Case("http_403", "status/403", ("NETWORK",)),
    Case("http_502", "status/502", ("NETWORK",)),
    Case("http_503", "status/503", ("NETWORK",)),
    Case("http_504", "status/504", ("NETWORK",)),
    Case("http_500", "status/500", ("TOOL_ERROR",)),
    Case("tool_exception", "empty", ("TOOL_ERROR",)),
    Case("timeout", "slow", ("TOOL_ERROR",)),
    Case("bad_json", "badjson", ("PARSE",), exempt=(MCP_SILENT,)),
    Case("wrong_shape", "wrongshape", ("PARSE",), exempt=(MCP_SILENT,)),
]


# --- the backends ------------------------------------------------------------------------------

GATEWAY_PAGE = "<html>\r\n<head><title>{code} {reason}</title></head>\r\n<body>\r\n<center><h1>{code} {reason}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def handle(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            super().handle()

    def send(self, code: int, body: str, ctype: str = "application/json", extra: dict | None = None) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if path == "/search":
            self.send(200, json.dumps({"hits": ["Install guide", "Upgrade notes"]}))
        elif path == "/empty":
            self.send(200, json.dumps({"hits": []}))
        elif path == "/slow":
            time.sleep(TIMEOUT_S * 3)
            self.send(200, json.dumps({"hits": ["late"]}))
        elif path == "/badjson":
            self.send(200, '{"hits": ["Install guide", "Upgr', "application/json")
        elif path == "/wrongshape":
            self.send(200, json.dumps({"results": [{"title": "Install guide"}], "total": 1}))
        elif path.startswith("/status/"):
            code = int(path.rsplit("/", 1)[1])
            reason = self.responses.get(code, ("Error",))[0]
            if code == 401:
                self.send(401, '{"error": "invalid_token", "error_description": "the access token expired"}',
                          extra={"WWW-Authenticate": 'Bearer error="invalid_token"'})
            elif code == 403:
                self.send(403, '{"error": "forbidden", "message": "token lacks scope docs:read"}')
            elif code == 500:
                self.send(500, '{"error": "internal", "message": "search index unavailable"}')
            else:
                self.send(code, GATEWAY_PAGE.format(code=code, reason=reason), "text/html")
        else:
            self.send(404, '{"error": "not_found"}')


class Backends:
    """The real servers and addresses the cases fail against."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.closed_port = s.getsockname()[1]
        s.close()  # nothing listens here any more: connection refused

    def url(self, backend: str) -> str:
        if backend == "refused":
            return f"http://127.0.0.1:{self.closed_port}/search"
        if backend == "dns":
            return "http://docs.tool.invalid/search"  # RFC 6761: never resolves
        if backend == "tls":
            return f"https://127.0.0.1:{self.port}/search"  # TLS to a plain-HTTP port
        path = {"ok": "search"}.get(backend, backend)
        return f"http://127.0.0.1:{self.port}/{path}"

    def close(self) -> None:
        self.server.shutdown()


# --- the tool, as tool authors write it ---------------------------------------------------------

# Set before each run: the tool's backend (the tool's configuration, not the model's input).
BACKEND: dict[str, str] = {"url": ""}


def _answer_hits(data: Any, query: str) -> list[str]:
    """The httpx variant checks the answer with a pydantic model, the requests variant by hand."""
    from pydantic import BaseModel

    class SearchAnswer(BaseModel):
        hits: list[str]

    hits = SearchAnswer.model_validate(data).hits
    if not hits:
        raise LookupError(f"no document matches {query!r}")
    return hits[:5]


async def search_docs_httpx(query: str, limit: int = 5) -> list[str]:
    """Search the product documentation; returns the titles of the best matches."""
    import httpx

    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        resp = await client.get(BACKEND["url"], params={"q": query, "limit": limit})
        resp.raise_for_status()
        return _answer_hits(resp.json(), query)[:limit]


def search_docs_requests(query: str, limit: int = 5) -> list[str]:
    """Search the product documentation; returns the titles of the best matches."""
    import requests

    resp = requests.get(BACKEND["url"], params={"q": query, "limit": limit}, timeout=TIMEOUT_S)
    resp.raise_for_status()
    hits = resp.json()["hits"]
    if not hits:
        raise LookupError(f"no document matches {query!r}")
    return hits[:limit]


# Both are the tool `search_docs` (frameworks name the tool and its argument model after it).
search_docs_httpx.__name__ = search_docs_httpx.__qualname__ = "search_docs"
search_docs_requests.__name__ = search_docs_requests.__qualname__ = "search_docs"


def tool_for(variant: str) -> Callable[..., Any]:
    return search_docs_httpx if variant == "httpx" else search_docs_requests


# --- OpenTelemetry ------------------------------------------------------------------------------

def setup_otel(framework: str):
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({
        "service.name": f"corpus-{framework.replace('_', '-')}",
        "service.version": "1",
    }))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    return provider, exporter


def is_tool_span(framework: str, span: Any) -> bool:
    a = span.attributes or {}
    if framework == "dspy":  # ReAct's own `finish` tool ends every run: not the tool under test
        return a.get("openinference.span.kind") == "TOOL" and not span.name.startswith("finish.")
    if framework in ("langchain", "openai_agents", "agno"):
        return a.get("openinference.span.kind") == "TOOL"
    if framework.startswith("openllmetry_"):
        return a.get("traceloop.span.kind") == "tool"
    if framework == "haystack":
        return "haystack.tool.name" in a
    return a.get("gen_ai.operation.name") == "execute_tool"


def tool_span_failed(framework: str, span: Any) -> bool:
    """Whether the framework says its tool call failed: the span's status, or, for Haystack,
    which leaves the status unset, its `haystack.tool.error` tag."""
    if framework == "haystack":
        return (span.attributes or {}).get("haystack.tool.error") is True
    return span.status.status_code.name == "ERROR"


# --- the drivers: one agent run per case ---------------------------------------------------------

def run_pydantic_ai(provider: Any, case: Case, variant: str) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings

    calls = list(case.args)

    def model(messages: list, info: AgentInfo) -> ModelResponse:
        if calls:
            n = len(case.args) - len(calls) + 1
            return ModelResponse(parts=[ToolCallPart("search_docs", calls.pop(0), tool_call_id=f"pa_{case.name}_{n}")])
        return ModelResponse(parts=[TextPart("Here is what I found.")])

    fn = tool_for(variant)
    agent = Agent(FunctionModel(model), name="docs_agent", retries=2)
    agent.tool_plain(fn)
    agent.instrument = InstrumentationSettings(tracer_provider=provider)
    with contextlib.suppress(Exception):  # a tool's exception ends the run, as it does in production
        agent.run_sync("How do I install it?")


def run_langchain(provider: Any, case: Case, variant: str) -> None:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import StructuredTool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    fn = tool_for(variant)
    if variant == "httpx":
        tool = StructuredTool.from_function(coroutine=fn, name="search_docs")
    else:
        tool = StructuredTool.from_function(func=fn, name="search_docs")
    script = [AIMessage(content="", tool_calls=[{"name": "search_docs", "args": a, "id": f"lc_{case.name}_{i}"}])
              for i, a in enumerate(case.args, 1)]
    script.append(AIMessage(content="Here is what I found."))
    llm = GenericFakeChatModel(messages=iter(script))

    async def model(state):  # noqa: ANN001 - langgraph reads annotations at run time
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def route(state):  # noqa: ANN001
        return "tools" if state["messages"][-1].tool_calls else END

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    # Errors go back to the model as a ToolMessage, as agents are usually configured.
    g.add_node("tools", ToolNode([tool], handle_tool_errors=True))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    asyncio.run(g.compile().ainvoke({"messages": [HumanMessage("How do I install it?")]}))


def run_openai_agents(provider: Any, case: Case, variant: str) -> None:
    from agents import Agent, Runner, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    calls = list(case.args)

    class Scripted(Model):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            if calls:
                n = len(case.args) - len(calls) + 1
                out: list[Any] = [ResponseFunctionToolCall(
                    arguments=json.dumps(calls.pop(0)), call_id=f"oa_{case.name}_{n}", name="search_docs",
                    type="function_call", id=f"fc_{case.name}_{n}", status="completed")]
            else:
                out = [ResponseOutputMessage(
                    id="msg_1", role="assistant", status="completed", type="message",
                    content=[ResponseOutputText(annotations=[], text="Here is what I found.", type="output_text")])]
            return ModelResponse(output=out, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    # The default failure_error_function answers the model with a fixed text and records only
    # "Error details are redacted." on the span; applications that let the model recover
    # answer with the error's text, which the SDK then also records (the span's error data).
    tool = function_tool(tool_for(variant), name_override="search_docs",
                         failure_error_function=lambda ctx, error: f"search_docs failed: {error}")
    agent = Agent(name="docs_agent", model=Scripted(), tools=[tool])
    asyncio.run(Runner.run(agent, "How do I install it?"))


def run_mcp(provider: Any, case: Case, variant: str) -> None:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer
    from opentelemetry import trace

    server = MCPServer("docs")
    server.tool()(tool_for(variant))
    tracer = trace.get_tracer("corpus.mcp_client_app")

    async def run() -> None:
        # The client application's own span around its MCP session (an agent turn).
        with tracer.start_as_current_span("invoke_agent docs_agent", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "docs_agent"}):
            async with Client(server) as client:
                for args in case.args:
                    await client.call_tool("search_docs", args)

    asyncio.run(run())


def scripted_agno_model(case: Case) -> Any:
    """An Agno `Model` that answers with the case's tool calls, one per turn, then a text."""
    from dataclasses import dataclass

    from agno.models.base import Model
    from agno.models.response import ModelResponse

    calls = list(case.args)

    @dataclass
    class Scripted(Model):
        id: str = "scripted"
        name: str = "Scripted"
        provider: str = "local"

        def _next(self) -> ModelResponse:
            if calls:
                n = len(case.args) - len(calls) + 1
                return ModelResponse(role="assistant", tool_calls=[{
                    "id": f"ag_{case.name}_{n}", "type": "function",
                    "function": {"name": "search_docs", "arguments": json.dumps(calls.pop(0))}}])
            return ModelResponse(role="assistant", content="Here is what I found.")

        def invoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
            return self._next()

        async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
            return self._next()

        def invoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            yield self._next()

        async def ainvoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            yield self._next()

        def _parse_provider_response(self, response: Any, **kwargs: Any) -> ModelResponse:
            return response

        def _parse_provider_response_delta(self, response: Any) -> ModelResponse:
            return response

    return Scripted()


def run_agno(provider: Any, case: Case, variant: str) -> None:
    from agno.agent import Agent

    # Agno validates the model's arguments with pydantic's validate_call and answers the model
    # with the error's text; the run goes on.
    agent = Agent(name="docs_agent", model=scripted_agno_model(case), tools=[tool_for(variant)],
                  telemetry=False)
    if variant == "httpx":
        asyncio.run(agent.arun("How do I install it?"))
    else:
        agent.run("How do I install it?")


def search_docs_sync_httpx(query: str, limit: int = 5) -> list[str]:
    """Search the product documentation; returns the titles of the best matches."""
    return asyncio.run(search_docs_httpx(query, limit))


search_docs_sync_httpx.__name__ = search_docs_sync_httpx.__qualname__ = "search_docs"


def run_haystack(provider: Any, case: Case, variant: str) -> None:
    from haystack.components.agents import Agent
    from haystack.components.generators.chat import MockChatGenerator
    from haystack.dataclasses import ChatMessage, ToolCall
    from haystack.tools import create_tool_from_function

    # Haystack's Agent runs a sync tool in a worker thread: the httpx variant runs the async
    # client there (its HTTP spans still sit under the tool span: the context is copied).
    fn = search_docs_sync_httpx if variant == "httpx" else search_docs_requests
    replies: list[Any] = [
        ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="search_docs", arguments=a, id=f"hs_{case.name}_{i}")])
        for i, a in enumerate(case.args, 1)]
    replies.append("Here is what I found.")
    # Errors go back to the model as a tool result, as agents are usually configured.
    agent = Agent(chat_generator=MockChatGenerator(responses=replies), tools=[create_tool_from_function(fn)],
                  raise_on_tool_invocation_failure=False)
    agent.run([ChatMessage.from_user("How do I install it?")])


def run_dspy(provider: Any, case: Case, variant: str) -> None:
    import dspy
    from dspy.utils.dummies import DummyLM

    # DSPy's test LM answers ReAct's fields: a tool call per turn, then `finish`, then the
    # answer. ReAct checks the arguments against the tool's JSON schema and turns a tool's
    # exception into an observation for the model; the run goes on.
    script: list[dict[str, Any]] = [
        {"next_thought": "Search the docs.", "next_tool_name": "search_docs", "next_tool_args": a} for a in case.args]
    script += [{"next_thought": "Done.", "next_tool_name": "finish", "next_tool_args": {}},
               {"reasoning": "Found it.", "answer": "Here is what I found."}]
    dspy.configure(lm=DummyLM(script))
    react = dspy.ReAct("question -> answer", tools=[tool_for(variant)], max_iters=len(case.args) + 1)
    if variant == "httpx":
        asyncio.run(react.acall(question="How do I install it?"))
    else:
        react(question="How do I install it?")


# OpenLLMetry instruments the same applications: the same drivers, other instrumentors.
DRIVERS = {"pydantic_ai": run_pydantic_ai, "langchain": run_langchain,
           "openai_agents": run_openai_agents, "mcp": run_mcp,
           "openllmetry_langchain": run_langchain, "openllmetry_openai_agents": run_openai_agents,
           "agno": run_agno, "haystack": run_haystack, "dspy": run_dspy}


def haystack_tracer(provider: Any) -> Any:
    """Haystack's own tracing (`haystack.tracing`) bridged to OpenTelemetry as its former
    `OpenTelemetryTracer` did: one OpenTelemetry span per Haystack span, its tags as attributes
    (coerced as Haystack coerces them), content tags included. Haystack 3 keeps the tracing
    API and leaves the backend to the application."""
    import haystack.tracing
    from haystack.tracing.utils import coerce_tag_value
    from opentelemetry import trace

    otel = provider.get_tracer("haystack")

    class Span(haystack.tracing.Span):
        def __init__(self, span: Any) -> None:
            self._span = span

        def set_tag(self, key: str, value: Any) -> None:
            self._span.set_attribute(key, coerce_tag_value(value))

        def raw_span(self) -> Any:
            return self._span

    class Tracer(haystack.tracing.Tracer):
        @contextlib.contextmanager
        def trace(self, operation_name: str, tags: dict | None = None, parent_span: Any = None) -> Any:
            ctx = trace.set_span_in_context(parent_span.raw_span()) if parent_span is not None else None
            with otel.start_as_current_span(operation_name, context=ctx) as raw:
                span = Span(raw)
                if tags:
                    span.set_tags(tags)
                yield span

        def current_span(self) -> Any:
            raw = trace.get_current_span()
            return Span(raw) if raw.get_span_context().is_valid else None

    haystack.tracing.enable_tracing(Tracer())
    haystack.tracing.tracer.is_content_tracing_enabled = True


def setup_framework(framework: str, provider: Any) -> None:
    if framework == "langchain":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        LangChainInstrumentor().instrument(tracer_provider=provider)
    elif framework == "openai_agents":
        from agents import set_trace_processors
        from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

        set_trace_processors([])  # no upload to OpenAI; OpenInference adds its own processor
        OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    elif framework == "openllmetry_langchain":
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor

        LangchainInstrumentor().instrument(tracer_provider=provider)
    elif framework == "openllmetry_openai_agents":
        from agents import set_trace_processors
        from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor as TraceloopAgents

        set_trace_processors([])  # no upload to OpenAI; OpenLLMetry adds its own processor
        TraceloopAgents().instrument(tracer_provider=provider)
    elif framework == "agno":
        from openinference.instrumentation.agno import AgnoInstrumentor

        AgnoInstrumentor().instrument(tracer_provider=provider)
    elif framework == "haystack":
        haystack_tracer(provider)
    elif framework == "dspy":
        from openinference.instrumentation.dspy import DSPyInstrumentor

        DSPyInstrumentor().instrument(tracer_provider=provider)


# --- one framework, in its own process -----------------------------------------------------------

def trim(spans: list) -> list:
    """Stack traces cut to their last STACK_KEEP characters (no rule reads them)."""
    from opentelemetry.sdk.trace import Event

    for s in spans:
        events = []
        for e in s.events:
            st = (e.attributes or {}).get("exception.stacktrace")
            if isinstance(st, str) and len(st) > STACK_KEEP:
                attrs = dict(e.attributes)
                attrs["exception.stacktrace"] = "...\n" + st[-STACK_KEEP:]
                e = Event(e.name, attrs, e.timestamp)
            events.append(e)
        s._events = tuple(events)  # ReadableSpan keeps them in _events
    return spans


def generate_one(framework: str, out: Path) -> None:
    import logging

    from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans

    # The frameworks log each tool failure with its traceback; the spans are what matters here.
    logging.basicConfig(level=logging.CRITICAL)
    for name in ("mcp", "openai.agents", "langchain", "langgraph", "pydantic_ai", "httpx", "agno", "haystack",
                 "dspy", "LiteLLM"):
        logging.getLogger(name).setLevel(logging.CRITICAL)

    provider, exporter = setup_otel(framework)
    setup_framework(framework, provider)
    backends = Backends()
    labels: dict[str, str] = {}
    cases: dict[str, dict] = {}
    all_spans: list = []
    try:
        for variant in VARIANTS[framework]:
            for case in CASES:
                BACKEND["url"] = backends.url(case.backend)
                for attempt in range(3):  # a loaded machine may time a request out that should not
                    exporter.clear()
                    DRIVERS[framework](provider, case, variant)
                    provider.force_flush()
                    spans = list(exporter.get_finished_spans())
                    tools = sorted((s for s in spans if is_tool_span(framework, s)), key=lambda s: s.start_time)
                    shape = [tool_span_failed(framework, s) for s in tools]
                    if shape == [bool(label) for label in case.labels]:
                        break
                    print(f"{framework}/{variant}/{case.name}: tool spans failed {shape}, expected "
                          f"{[bool(label) for label in case.labels]}; running it again", file=sys.stderr)
                else:
                    raise SystemExit(f"{framework}/{variant}/{case.name}: the tool spans never came out as labelled: "
                                     + ", ".join(f"{s.name} {s.status.status_code.name}" for s in tools))
                for s, label in zip(tools, case.labels):
                    sid = format(s.context.span_id, "016x")
                    labels[sid] = label
                    cases[sid] = {"framework": framework, "variant": variant, "case": case.name}
                    why = dict(case.exempt).get(framework) if label else None
                    if why:
                        cases[sid].update(gate=False, why=why)
                all_spans.extend(spans)
    finally:
        backends.close()
    body = encode_spans(trim(all_spans)).to_json()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{framework}.json").write_text(json.dumps(json.loads(body), indent=None, separators=(",", ":")) + "\n")
    (out / f"{framework}.labels.tmp").write_text(json.dumps({"labels": labels, "cases": cases}))
    print(f"{framework}: {len(all_spans)} spans, {len(labels)} tool spans labelled, "
          f"{len(body)} bytes", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "corpus")
    ap.add_argument("--framework", choices=FRAMEWORKS, action="append",
                    help="only these (repeatable); default all")
    ap.add_argument("--one", choices=FRAMEWORKS, help=argparse.SUPPRESS)  # the per-framework child
    args = ap.parse_args()
    if args.one:
        generate_one(args.one, args.out)
        return
    frameworks = args.framework or list(FRAMEWORKS)
    # Each framework in its own process: instrumentors patch modules globally.
    for fw in frameworks:
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", fw, "--out", str(args.out)],
                       check=True)
    labels_path, cases_path = args.out / "labels.json", args.out / "cases.json"
    labels = json.loads(labels_path.read_text()) if labels_path.exists() else {}
    cases = json.loads(cases_path.read_text()) if cases_path.exists() else {}
    for fw in frameworks:  # replace what an earlier run said about these frameworks
        stale = [sid for sid, c in cases.items() if c["framework"] == fw]
        for sid in stale:
            labels.pop(sid, None)
            cases.pop(sid, None)
        tmp = args.out / f"{fw}.labels.tmp"
        part = json.loads(tmp.read_text())
        tmp.unlink()
        labels.update(part["labels"])
        cases.update(part["cases"])
    labels_path.write_text(json.dumps(labels, indent=1, sort_keys=True) + "\n")
    cases_path.write_text(json.dumps(cases, indent=1, sort_keys=True) + "\n")
    print(f"{len(labels)} tool spans labelled in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
