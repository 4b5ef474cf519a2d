"""Eval cases: an exported evals file fails against the broken tool and passes against the
fixed one, from the command line (``evals run``) and as parametrized tests of a suite
(``toolspan.evals.cases``).

``data/search_docs.evals.jsonl`` holds two cases exported from calls the broken
``fleet_tools`` tool failed (its docs service renamed ``url`` to ``link``), with their recorded
responses, so every run here is offline."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolspan
import toolspan.evals
from conftest import Service, Spans, ok_json
from replaydocs import evals_lines, replay_document
from toolspan import _cli

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from fleet_tools import broken, fixed  # noqa: E402

CASES = HERE / "data" / "search_docs.evals.jsonl"


@pytest.fixture(autouse=True)
def no_docs_service(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    """Nobody answers at the docs service's address: the cases replay from their recordings."""
    monkeypatch.setenv("FLEET_DOCS_URL", f"http://127.0.0.1:{closed_port}/search")


@pytest.fixture
def app(provider: Any) -> Iterator[None]:
    before = toolspan._default
    toolspan.configure(tracer_provider=provider, capture_payloads=True)
    yield
    toolspan._default = before


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = _cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", toolspan.evals.cases(CASES))
def test_case_fails_against_broken_and_passes_against_fixed(case: toolspan.evals.Case, request: Any) -> None:
    assert request.node.callspec.id == case.name  # pytest takes the case's name as the id
    before = case.run(tools=[broken], recorded_responses=True)
    assert before.verdict == "same_failure" and not before.passed, before
    after = case.run(tools=[fixed], recorded_responses=True)
    assert after.passed and after.verdict == "fixed", after
    assert after.case == case.name


def test_evals_run_exits_1_with_broken_and_0_with_fixed(app: None, spans: Spans) -> None:
    code, out, _ = cli("evals", "run", str(CASES), "--tools", "fleet_tools.broken", "--recorded-responses")
    assert code == 1
    head, *rows, summary = out.splitlines()
    assert head.split() == ["case", "fingerprint", "before", "after", "result"]
    names = [c.name for c in toolspan.evals.cases(CASES)]
    assert [r.split()[0] for r in rows] == names
    assert all(r.split()[1] == "8e45c38305f3774a" and r.split()[-1] == "FAIL" for r in rows)
    assert all(r.count("PARSE bad_answer at parse") == 2 for r in rows)
    assert summary == "2 cases: 0 passed, 2 failed, 0 not run"
    # Each case is a replay like any other: a traced call linked to its original.
    of = {s.attributes["toolspan.replay.of"] for s in spans.calls("search_docs")}
    assert of == {f"{c.call['trace_id']}:{c.call['span_id']}" for c in toolspan.evals.cases(CASES)}

    code, out, _ = cli("evals", "run", str(CASES), "--tools", "fleet_tools.fixed", "--recorded-responses",
                       "--format", "json")
    assert code == 0
    got = json.loads(out)
    assert (got["passed"], got["failed"], got["not_run"], got["table_version"]) == (2, 0, 0, 12)
    assert [c["case"] for c in got["cases"]] == names
    assert {c["verdict"] for c in got["cases"]} == {"fixed"}


def test_python_m_toolspan_runs_an_evals_file_served_over_http(service: Service) -> None:
    service.route("/evals/search_docs.jsonl", lambda _req: (200, {"Content-Type": "application/jsonl"}, CASES.read_bytes()))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]))
    run = [sys.executable, "-m", "toolspan", "evals", "run", service.url + "/evals/search_docs.jsonl",
           "--recorded-responses", "--tools"]
    broken_run = subprocess.run([*run, "fleet_tools.broken"], capture_output=True, text=True, env=env, timeout=60)
    assert broken_run.returncode == 1, broken_run.stderr
    assert "2 failed" in broken_run.stdout
    fixed_run = subprocess.run([*run, "fleet_tools.fixed"], capture_output=True, text=True, env=env, timeout=60)
    assert fixed_run.returncode == 0, fixed_run.stderr
    assert "2 passed" in fixed_run.stdout


def test_cases_that_cannot_run_say_why_and_the_others_still_run(tmp_path: Path) -> None:
    lines = CASES.read_text().splitlines()
    header = json.loads(lines[0])
    cut = json.loads(lines[1])
    cut.update(arguments=None, arguments_text=None, exact=False, inexact=None)
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(cut), lines[2]]) + "\n")
    code, out, err = cli("evals", "run", str(path), "--tools", "fleet_tools.fixed", "--recorded-responses")
    assert code == 2, out
    assert f"{cut['case']}: refused: the call's arguments were not recorded" in err
    assert out.splitlines()[-1] == "2 cases: 1 passed, 0 failed, 1 not run"

    # A file that lost cases is not run at all.
    path.write_text("\n".join([json.dumps(dict(header, cases=3)), *lines[1:]]) + "\n")
    code, _, err = cli("evals", "run", str(path), "--tools", "fleet_tools.fixed")
    assert code == 2 and "holds 2 cases but its header says 3" in err
    path.write_text(lines[1] + "\n")
    code, _, err = cli("evals", "run", str(path), "--tools", "fleet_tools.fixed")
    assert code == 2 and "toolspan.evals/1" in err


def test_cases_exported_from_the_broken_tool_replay_its_failure(
    app: None, spans: Spans, exporter: Any, service: Service, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The checked-in file is what the broken tool records: export a fresh one and compare."""
    service.answers("/search", ok_json({"hits": [{"title": "Rotate API keys", "link": "https://docs.example/rotate"}]}))
    monkeypatch.setenv("FLEET_DOCS_URL", service.url + "/search")
    assert not broken.search_docs.invoke({"query": "rotate api keys"}).ok
    doc = replay_document(spans, spans.call("search_docs"))
    exporter.clear()
    path = tmp_path / "fresh.jsonl"
    path.write_text(evals_lines([doc], '{"query":"string"}'))
    (case,) = toolspan.evals.cases(path)
    (checked_in, _) = toolspan.evals.cases(CASES)
    assert case.fingerprint == dict(checked_in.fingerprint, failures=1)
    assert case.expect == checked_in.expect and case.name.rsplit("/", 1)[0] == checked_in.name.rsplit("/", 1)[0]
    assert case.run(tools=[broken], recorded_responses=True).verdict == "same_failure"
    assert case.run(tools=[fixed], recorded_responses=True).verdict == "fixed"
