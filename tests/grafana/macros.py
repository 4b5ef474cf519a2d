"""Grafana's PostgreSQL data source, as it turns a panel's rawSql into the SQL it sends: the
one implementation of that expansion, used by both checks of the dashboards' SQL.

  - scripts/check-dashboards imports `expand` and checks, offline, that the expanded SQL names
    only known tables, columns and DataFusion-compatible functions (with sample values for
    the template variables);
  - tests/query_service/grafana.rs runs this file as a program and sends the expanded SQL to a
    running `toolspan query` through psql and psycopg (with the variables' real values).

The expansion, in Grafana's order:
  1. template variables (the frontend): `${name}` and `$name` replaced by their interpolated
     value, longest names first (`$__interval` is a variable: the data source's minimum
     interval);
  2. macros (pkg/tsdb/grafana-postgresql-datasource/macros.go): `$__name(args)` with the
     arguments split on commas and trimmed. Only the macros toolspan's panels may use are
     expanded; any other raises ValueError.

As a program: reads {"from": RFC3339, "to": RFC3339, "items": [{"sql": ..., "variables":
{name: value}}]} on stdin and writes a JSON list, one {"sql": expanded} or {"error": message}
per item.
"""

import json
import re
import sys

MACRO = re.compile(r"\$__(\w+)\(([^)]*)\)")
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def interval_seconds(iv):
    """`'5m'` -> 300; the interval units Grafana accepts in $__timeGroup."""
    iv = iv.strip().strip("'")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", iv)
    if not m:
        raise ValueError(f"bad interval {iv!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def go_float(v):
    """Go's `%v` of a float64 number of seconds (300 -> `300`, 0.5 -> `0.5`)."""
    return str(int(v)) if v == int(v) else repr(v)


def expand(sql, variables, frm, to):
    """`sql` with `variables` ({name: interpolated value}) and the macros expanded for the time
    range `frm`..`to` (RFC3339 text, as Grafana formats it)."""
    for name in sorted(variables, key=len, reverse=True):
        sql = sql.replace("${%s}" % name, variables[name]).replace("$" + name, variables[name])

    def macro(m):
        name, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        if name == "timeFilter":
            return f"{args[0]} BETWEEN '{frm}' AND '{to}'"
        if name == "timeFrom":
            return f"'{frm}'"
        if name == "timeTo":
            return f"'{to}'"
        if name in ("timeGroup", "timeGroupAlias"):
            n = go_float(interval_seconds(args[1]))
            group = f"floor(extract(epoch from {args[0]})/{n})*{n}"
            return group + ' AS "time"' if name == "timeGroupAlias" else group
        raise ValueError(f"macro $__{name} is not one toolspan's panels may use")

    return MACRO.sub(macro, sql)


def main():
    jobs = json.load(sys.stdin)
    out = []
    for item in jobs["items"]:
        try:
            out.append({"sql": expand(item["sql"], item.get("variables") or {}, jobs["from"], jobs["to"])})
        except ValueError as e:
            out.append({"error": str(e)})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
