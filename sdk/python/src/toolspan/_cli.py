"""``python -m toolspan``: replay a failed call, run an evals file.

    python -m toolspan replay REF --query-url URL --tools my_pkg.tools [--arg FIELD=VALUE]...
        [--args-file FILE] [--allow-side-effects] [--recorded-responses] [--token T]
        [--table-version N] [--format text|json]
    python -m toolspan evals run FILE --tools my_pkg.tools [the same flags]

Exit codes: 0 fixed (every case passed), 1 same or different failure (a case failed), 2
refused or a usage error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, Optional, TextIO

from opentelemetry import trace

from ._replaying import ReplayError, ReplayRefused
from ._verdict import Outcome

EXIT_FIXED, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m toolspan", description="Replay failed tool calls and run evals files.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--tools",
        action="append",
        required=True,
        metavar="MODULE",
        help="a module whose @toolspan.tool functions may be replayed (repeat, or separate with commas)",
    )
    common.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="supply an argument: FIELD=TEXT (a string) or FIELD:=JSON; FIELD is a top-level name or a "
        "JSON path ($.a.b, $.items[0].c); needed for each redacted value",
    )
    common.add_argument("--args-file", metavar="FILE", help="the whole arguments, a JSON file ('-': standard input)")
    common.add_argument(
        "--allow-side-effects", action="store_true", help="run tools declared with side_effects=True"
    )
    common.add_argument(
        "--recorded-responses",
        action="store_true",
        help="answer the tool's outbound HTTP from the original attempts' recorded responses (offline)",
    )
    common.add_argument(
        "--token", default=os.environ.get("TOOLSPAN_TOKEN"), help="bearer token of the query service (TOOLSPAN_TOKEN)"
    )
    common.add_argument("--format", choices=("text", "json"), default="text", help="the output (default: text, a table)")
    common.add_argument(
        "--verbose",
        action="store_true",
        help="print the replayed tools' failure logs (with tracebacks) to standard error",
    )

    rp = sub.add_parser("replay", parents=[common], help="replay one failed call", description="Replay one failed call.")
    rp.add_argument("ref", metavar="REF", help="an error reference (err_...), a call id, or TRACEID:SPANID")
    rp.add_argument(
        "--query-url",
        default=os.environ.get("TOOLSPAN_QUERY_URL"),
        help="the query service's HTTP address, e.g. http://127.0.0.1:8080 (TOOLSPAN_QUERY_URL)",
    )
    rp.add_argument("--table-version", type=int, metavar="N", help="read the spans table at this version")

    ev = sub.add_parser("evals", help="eval cases", description="Eval cases.")
    evsub = ev.add_subparsers(dest="evals_command", required=True, metavar="COMMAND")
    run = evsub.add_parser(
        "run", parents=[common], help="replay every case of an evals file", description="Replay every case of an evals file."
    )
    run.add_argument("file", metavar="FILE", help="a toolspan.evals/1 JSON Lines file (a path or an http(s) URL)")
    return ap


def _overrides(a: argparse.Namespace) -> Optional[dict[str, Any]]:
    out: dict[str, Any] = {}
    if a.args_file:
        try:
            if a.args_file == "-":
                text = sys.stdin.read()
            else:
                with open(a.args_file, encoding="utf-8") as f:
                    text = f.read()
            out["$"] = json.loads(text)
        except OSError as e:
            raise ReplayError(f"cannot read --args-file {a.args_file}: {e.strerror or e}") from None
        except ValueError as e:
            raise ReplayError(f"--args-file {a.args_file} is not JSON ({e})") from None
    for item in a.arg:
        key, sep, value = item.partition("=")
        if not sep or key in ("", ":"):
            raise ReplayError(f"--arg {item!r}: write FIELD=TEXT or FIELD:=JSON")
        if key.endswith(":"):
            try:
                out[key[:-1]] = json.loads(value)
            except ValueError:
                raise ReplayError(f"--arg {item!r}: {value!r} is not JSON (write FIELD=TEXT for a string)") from None
        else:
            out[key] = value
    return out or None


def _modules(a: argparse.Namespace) -> list[str]:
    return [m.strip() for group in a.tools for m in group.split(",") if m.strip()]


def _table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def _replay(a: argparse.Namespace, out: TextIO) -> int:
    from ._replay import replay

    if not a.query_url:
        raise ReplayError("--query-url is required (or TOOLSPAN_QUERY_URL), e.g. http://127.0.0.1:8080")
    r = replay(
        a.ref,
        query_url=a.query_url,
        tools=_modules(a),
        token=a.token,
        args_override=_overrides(a),
        allow_side_effects=a.allow_side_effects,
        recorded_responses=a.recorded_responses,
        table_version=a.table_version,
    )
    if a.format == "json":
        out.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")
    else:
        o, n = r.original, r.replay
        _table(
            [
                ("", "original", "replay"),
                ("call", r.of, f"{n.trace_id}:{n.span_id}" if n.trace_id else "(not traced)"),
                ("reference", o.reference or "-", n.reference or "-"),
                ("outcome", o.describe(), n.describe()),
                ("attempts", str(o.attempts), str(n.attempts)),
                ("verdict", r.verdict.replace("_", " "), ""),
            ],
            out,
        )
    return r.exit_code


def _evals_run(a: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .evals import load

    f = load(a.file, token=a.token)
    overrides = _overrides(a)
    tools = _modules(a)
    rows: list[tuple[str, str, str, str, str]] = [("case", "fingerprint", "before", "after", "result")]
    results: list[dict[str, Any]] = []
    failed = not_run = 0
    for case in f.cases:
        before = Outcome.of_call(case.call).describe()
        fp = str(case.fingerprint.get("id") or "-")
        try:
            r = case.run(
                tools=tools,
                args_override=overrides,
                allow_side_effects=a.allow_side_effects,
                recorded_responses=a.recorded_responses,
            )
        except ReplayError as e:
            # A case that cannot run says why and the others still run.
            what = "refused" if isinstance(e, ReplayRefused) else "error"
            not_run += 1
            rows.append((case.name, fp, before, "-", what))
            results.append({"case": case.name, "fingerprint": fp, "result": what, "reason": str(e)})
            err.write(f"{case.name}: {what}: {e}\n")
            continue
        failed += not r.passed
        rows.append((case.name, fp, before, r.replay.describe(), "pass" if r.passed else "FAIL"))
        results.append({"fingerprint": fp, "result": "pass" if r.passed else "fail", **r.to_dict()})
    passed = len(f.cases) - failed - not_run
    if a.format == "json":
        out.write(
            json.dumps(
                {
                    "file": os.fspath(a.file),
                    "table_version": f.header.get("table_version"),
                    "cases": results,
                    "passed": passed,
                    "failed": failed,
                    "not_run": not_run,
                },
                ensure_ascii=False,
            )
            + "\n"
        )
    else:
        _table(rows, out)
        out.write(f"{len(f.cases)} cases: {passed} passed, {failed} failed, {not_run} not run\n")
    if failed:
        return EXIT_FAILED
    return EXIT_REFUSED if not_run else EXIT_FIXED


def _logging_configured() -> bool:
    logger: Optional[logging.Logger] = logging.getLogger("toolspan")
    while logger is not None:
        if logger.handlers:
            return True
        logger = logger.parent if logger.propagate else None
    return False


def main(argv: Optional[Sequence[str]] = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Runs the command line; returns the exit code."""
    ap = _parser()
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:  # argparse's usage errors (exit 2) and --help (exit 0)
        return int(e.code or 0)
    quiet: Optional[logging.Handler] = None
    if not a.verbose and not _logging_configured():
        # The failures being replayed are expected: without --verbose, their log records (and
        # tracebacks) stay out of the table's way (the spans keep them, under the references).
        quiet = logging.NullHandler()
        logging.getLogger("toolspan").addHandler(quiet)
    try:
        if a.command == "replay":
            return _replay(a, out)
        return _evals_run(a, out, err)
    except ReplayRefused as e:
        err.write(f"toolspan {a.command}: refused: {e}\n")
        return EXIT_REFUSED
    except ReplayError as e:
        err.write(f"toolspan {a.command}: {e}\n")
        return EXIT_REFUSED
    finally:
        if quiet is not None:
            logging.getLogger("toolspan").removeHandler(quiet)
        # The replayed calls' spans go through the application's tracer provider: flush them
        # before the process exits.
        flush = getattr(trace.get_tracer_provider(), "force_flush", None)
        if callable(flush):
            flush()
