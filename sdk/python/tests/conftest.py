"""Fixtures: an in-memory span exporter behind a real SDK TracerProvider, a Toolspan bound to
it, a log capture, and a local HTTP service with scripted answers."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import toolspan


class Spans:
    """The finished spans of one test, with lookups by convention."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    @property
    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def calls(self, tool: str | None = None) -> list[ReadableSpan]:
        return [
            s
            for s in self.all
            if s.attributes.get("gen_ai.operation.name") == "execute_tool"
            and (tool is None or s.attributes.get("gen_ai.tool.name") == tool)
        ]

    def call(self, tool: str | None = None) -> ReadableSpan:
        cs = self.calls(tool)
        assert len(cs) == 1, [s.name for s in cs]
        return cs[0]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        pid = parent.context.span_id
        return sorted(
            (s for s in self.all if s.parent is not None and s.parent.span_id == pid),
            key=lambda s: s.start_time,
        )

    def attempts(self, call: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in self.children(call) if "toolspan.attempt" in s.attributes]

    def stages(self, parent: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in self.children(parent) if "toolspan.stage" in s.attributes]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    yield exp
    exp.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Spans:
    return Spans(exporter)


class LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def by_reference(self, reference: str) -> list[str]:
        """Formatted records (message and traceback) that carry ``reference``."""
        return [
            self.format(r)
            for r in self.records
            if getattr(r, "toolspan_reference", None) == reference
        ]


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    logger = logging.getLogger("toolspan.test")
    h = LogCapture()
    logger.addHandler(h)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield h
    logger.removeHandler(h)


@pytest.fixture
def ts(provider: TracerProvider, logs: LogCapture) -> toolspan.Toolspan:
    return toolspan.Toolspan(
        tracer_provider=provider,
        logger=logging.getLogger("toolspan.test"),
    )


Handler = Callable[[BaseHTTPRequestHandler], tuple[int, dict[str, str], bytes]]


class Service:
    """A local HTTP service: ``route(path, handler)``; remembers every request's headers."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        svc = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                svc.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                route = svc.routes.get(self.path.split("?")[0])
                status, headers, body = route(self) if route else (404, {}, b"no route")
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll: close() (shutdown) waits for the loop to notice.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def route(self, path: str, handler: Handler) -> None:
        self.routes[path] = handler

    def answers(self, path: str, *answers: tuple[int, dict[str, str], bytes]) -> None:
        """Answer ``path`` with these in turn, repeating the last."""
        seq = list(answers)

        def h(_req: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
            return seq.pop(0) if len(seq) > 1 else seq[0]

        self.routes[path] = h

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service() -> Iterator[Service]:
    s = Service()
    yield s
    s.close()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ok_json(obj: Any) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps(obj).encode()


# Model-facing text must carry none of these (no stack trace, file path or dependency's error text reaches a caller).
LEAK_PATTERNS = (
    r"Traceback",
    r'File "',
    r"line \d+",
    r"/(home|work|usr|tmp|app|srv)/",
    r"site-packages",
    r"\.py\b",
    r"(?i)\bselect\b.+\bfrom\b",
    r"(?i)psycopg|sqlstate",
    r"hunter2",
)


def assert_clean(text: str) -> None:
    import re

    for m in LEAK_PATTERNS:
        assert not re.search(m, text), f"model-facing text leaks {m!r}: {text}"
