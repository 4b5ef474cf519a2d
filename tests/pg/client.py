"""Drives `toolspan query`'s Postgres protocol with psycopg 3, the way applications and
Grafana do, and prints what came back as JSON for tests/query_service/ to assert on.

    client.py HOST PORT USER PASSWORD JOBS.json

JOBS.json, every key optional:
  {"queries": [{"name": ..., "sql": ..., "params": [...]?}],
   "statements": [sql, ...],      the SQL corpus (query/tests/sql), whatever each outcome
   "transaction": true}

Every query runs in four ways:
  extended  the default cursor: Parse/Bind/Execute with an unnamed statement, text results
  prepared  prepare=True, twice: a named prepared statement reused, as pgx (Grafana) does
  binary    binary=True: binary result format, as pgx asks for known types
  simple    ClientCursor: the simple query protocol, parameters bound client-side
Statements run on one autocommit connection, each followed by SELECT 1 on the same
connection; the transaction job checks that a transaction (BEGIN implied by psycopg)
survives a refused statement after a rollback.
"""

import json
import sys

import psycopg


def describe(cur):
    return [{"name": d.name, "oid": d.type_code} for d in (cur.description or [])]


def run(conn, job, mode):
    out = {"name": job["name"], "mode": mode}
    params = job.get("params")
    try:
        if mode == "simple":
            cur = psycopg.ClientCursor(conn)
            cur.execute(job["sql"], params)
        elif mode == "binary":
            cur = conn.cursor(binary=True)
            cur.execute(job["sql"], params)
        elif mode == "prepared":
            cur = conn.cursor()
            cur.execute(job["sql"], params, prepare=True)
            if cur.description:
                cur.fetchall()
            cur.execute(job["sql"], params, prepare=True)
        else:
            cur = conn.cursor()
            cur.execute(job["sql"], params)
        rows = cur.fetchall() if cur.description else []
        out.update(ok=True, columns=describe(cur), rows=len(rows),
                   first=[repr(v) for v in rows[0]] if rows else None,
                   types=[type(v).__name__ for v in rows[0]] if rows else None)
    except psycopg.Error as e:
        out.update(ok=False, sqlstate=e.sqlstate, message=e.diag.message_primary,
                   detail=e.diag.message_detail)
    return out


def main():
    host, port, user, password, jobs_path = sys.argv[1:6]
    with open(jobs_path) as f:
        jobs = json.load(f)
    dsn = f"host={host} port={port} user={user} password={password} dbname=toolspan"
    results = {"server_version": None, "queries": [], "statements": [], "transaction": None}
    with psycopg.connect(dsn, autocommit=True) as conn:
        results["server_version"] = conn.info.server_version
        for job in jobs.get("queries", []):
            for mode in ("extended", "prepared", "binary", "simple"):
                results["queries"].append(run(conn, job, mode))
        for sql in jobs.get("statements", []):
            entry = {"sql": sql}
            try:
                conn.execute(sql)
                entry["ok"] = True
            except psycopg.Error as e:
                entry.update(ok=False, sqlstate=e.sqlstate, message=e.diag.message_primary,
                             detail=e.diag.message_detail)
            entry["after"] = conn.execute("SELECT 1 AS one").fetchone()[0]
            results["statements"].append(entry)
    if jobs.get("transaction"):
        # Without autocommit psycopg opens a transaction (BEGIN) before the first statement.
        with psycopg.connect(dsn) as conn:
            first = conn.execute("SELECT count(*) FROM calls").fetchone()[0]
            try:
                conn.execute("DELETE FROM spans")
                refused = False
            except psycopg.Error as e:
                refused = e.sqlstate
            conn.rollback()
            again = conn.execute("SELECT count(*) FROM calls").fetchone()[0]
            conn.commit()
            results["transaction"] = {"first": first, "refused": refused, "again": again}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
