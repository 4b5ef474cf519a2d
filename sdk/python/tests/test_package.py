"""The package as an application meets it: importing it changes nothing, it is typed, and
its only runtime dependency is the OpenTelemetry API."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import toolspan


def test_import_has_no_side_effects() -> None:
    code = (
        "import logging, sys\n"
        "before = set(sys.modules)\n"
        "import toolspan, toolspan.propagation, toolspan.adapters\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.trace import ProxyTracerProvider\n"
        "assert isinstance(trace.get_tracer_provider(), ProxyTracerProvider), 'configured the SDK'\n"
        "assert not logging.getLogger('toolspan').handlers, 'added a log handler'\n"
        "assert not logging.getLogger().handlers, 'configured logging'\n"
        "heavy = {'opentelemetry.sdk', 'httpx', 'requests', 'pydantic', 'jsonschema', 'langchain_core',\n"
        "         'pydantic_ai', 'agents', 'mcp'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "print('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr


def test_typed_and_depends_only_on_the_otel_api() -> None:
    assert (Path(toolspan.__file__).parent / "py.typed").is_file()
    reqs = metadata.requires("toolspan") or []
    runtime = [r for r in reqs if "extra ==" not in r]
    assert [r.split(">")[0].split("=")[0].strip() for r in runtime] == ["opentelemetry-api"]
    assert metadata.version("toolspan") == toolspan.__version__
