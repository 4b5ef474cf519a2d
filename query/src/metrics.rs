//! The query service's own metrics (`dashboards/METRICS.md`, "Query service self-metrics"),
//! served on `GET /metrics` of the HTTP API: statements by outcome and how long they took,
//! rows returned, slots in use, HTTP requests by route and status, Postgres protocol
//! connections (accepted, open, logins refused), the table version the engine reads and what
//! the data cache of a table on object storage served.
//!
//! Every statement counts once, whichever front end ran it (HTTP API, viewer pages, Tempo
//! API, Postgres protocol): they all go through [`crate::QueryService::query`]. Labels carry
//! bounded values only: the outcome is `ok` or one of toolspan's stable error codes, the route
//! is the router's path template (`/api/v1/traces/{trace_id}`, never a trace id), `unmatched`
//! for a path no route serves.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use toolspan_schema::Code;

use crate::data_cache::CacheStats;
use crate::error::QueryError;

type Labels = Vec<(&'static str, String)>;

/// Statement and HTTP request latency buckets, seconds.
pub const SECONDS_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The stable codes a statement can fail with (their series exist from startup, at zero).
pub const STATEMENT_CODES: [Code; 10] = [
    Code::SqlSyntax,
    Code::UnknownColumn,
    Code::UnknownTable,
    Code::ForbiddenStatement,
    Code::InvalidQuery,
    Code::QueryTimeout,
    Code::ResourcesExhausted,
    Code::StoreUnavailable,
    Code::Overloaded,
    Code::Internal,
];

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BUCKETS)
}

/// What scrape-time gauges and counters read (see [`QueryMetrics::encode`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    /// Statements running now.
    pub running: usize,
    /// Statements allowed to run at once.
    pub slots: usize,
    /// Version of the `spans` table the engine reads.
    pub table_version: u64,
}

/// The query service's metrics.
pub struct QueryMetrics {
    registry: Registry,
    statements: Family<Labels, Counter>,
    statement_seconds: Histogram,
    rows: Counter,
    http_requests: Family<Labels, Counter>,
    http_seconds: HistogramFamily,
    running: Gauge,
    slots: Gauge,
    table_version: Gauge,
    cache_requests: Counter,
    cache_hit_blocks: Counter,
    cache_fetched_blocks: Counter,
    pg_connections: Counter,
    pg_open: Gauge,
    pg_auth_failures: Counter,
    /// The data cache's counters as last read (requests, hit blocks, fetched blocks).
    cache_seen: Mutex<(u64, u64, u64)>,
}

impl std::fmt::Debug for QueryMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryMetrics").finish_non_exhaustive()
    }
}

impl Default for QueryMetrics {
    fn default() -> Self {
        QueryMetrics::new()
    }
}

impl QueryMetrics {
    /// Every family registered; statement outcomes start at zero.
    pub fn new() -> QueryMetrics {
        let mut registry = Registry::default();
        let statements = Family::<Labels, Counter>::default();
        registry.register(
            "toolspan_query_statements",
            "Statements run, by outcome (ok or the stable error code of the answer)",
            statements.clone(),
        );
        drop(statements.get_or_create(&outcome(None)));
        for code in STATEMENT_CODES {
            drop(statements.get_or_create(&outcome(Some(code))));
        }
        let statement_seconds = seconds_histogram();
        registry.register(
            "toolspan_query_statement_seconds",
            "One statement: from asking for a slot to its answer (rows or error), waiting included",
            statement_seconds.clone(),
        );
        let rows = Counter::default();
        registry.register(
            "toolspan_query_rows",
            "Rows returned by statements that succeeded",
            rows.clone(),
        );
        let http_requests = Family::<Labels, Counter>::default();
        registry.register(
            "toolspan_query_http_requests",
            "HTTP requests answered, by route template and status code",
            http_requests.clone(),
        );
        let http_seconds: HistogramFamily = Family::new_with_constructor(seconds_histogram);
        registry.register(
            "toolspan_query_http_request_seconds",
            "One HTTP request: from routing to the response head, by route template",
            http_seconds.clone(),
        );
        let running = Gauge::default();
        registry.register(
            "toolspan_query_running",
            "Statements holding a slot now",
            running.clone(),
        );
        let slots = Gauge::default();
        registry.register(
            "toolspan_query_slots",
            "Statements allowed to run at once (--max-concurrent-queries)",
            slots.clone(),
        );
        let table_version = Gauge::default();
        registry.register(
            "toolspan_query_table_version",
            "Version of the spans table the engine reads (it follows the table's commits)",
            table_version.clone(),
        );
        let cache_requests = Counter::default();
        registry.register(
            "toolspan_query_cache_store_requests",
            "Range requests the data cache made to the object store",
            cache_requests.clone(),
        );
        let cache_hit_blocks = Counter::default();
        registry.register(
            "toolspan_query_cache_hit_blocks",
            "Blocks of 256 KiB the data cache served from memory",
            cache_hit_blocks.clone(),
        );
        let cache_fetched_blocks = Counter::default();
        registry.register(
            "toolspan_query_cache_fetched_blocks",
            "Blocks of 256 KiB the data cache read from the object store",
            cache_fetched_blocks.clone(),
        );
        let pg_connections = Counter::default();
        registry.register(
            "toolspan_query_pg_connections",
            "Postgres protocol connections accepted",
            pg_connections.clone(),
        );
        let pg_open = Gauge::default();
        registry.register(
            "toolspan_query_pg_connections_open",
            "Postgres protocol connections open now",
            pg_open.clone(),
        );
        let pg_auth_failures = Counter::default();
        registry.register(
            "toolspan_query_pg_auth_failures",
            "Postgres protocol logins refused (wrong password or unknown user)",
            pg_auth_failures.clone(),
        );
        QueryMetrics {
            registry,
            statements,
            statement_seconds,
            rows,
            http_requests,
            http_seconds,
            running,
            slots,
            table_version,
            cache_requests,
            cache_hit_blocks,
            cache_fetched_blocks,
            pg_connections,
            pg_open,
            pg_auth_failures,
            cache_seen: Mutex::new((0, 0, 0)),
        }
    }

    /// Counts one statement's answer.
    pub fn statement(&self, took: Duration, result: Result<usize, &QueryError>) {
        self.statement_seconds.observe(took.as_secs_f64());
        match result {
            Ok(rows) => {
                self.statements.get_or_create(&outcome(None)).inc();
                self.rows.inc_by(rows as u64);
            }
            Err(e) => {
                self.statements
                    .get_or_create(&outcome(Some(e.code())))
                    .inc();
            }
        }
    }

    /// Counts one HTTP request: `route` is the matched path template (or `unmatched`).
    pub fn http_request(&self, route: &str, status: u16, took: Duration) {
        let labels = vec![("route", route.to_string()), ("status", status.to_string())];
        self.http_requests.get_or_create(&labels).inc();
        self.http_seconds
            .get_or_create(&vec![("route", route.to_string())])
            .observe(took.as_secs_f64());
    }

    /// Counts a Postgres connection accepted; it counts as open until the guard is dropped.
    pub fn pg_connection(&self) -> OpenConnection {
        self.pg_connections.inc();
        self.pg_open.inc();
        OpenConnection(self.pg_open.clone())
    }

    /// The counter of refused Postgres logins, for the startup handler.
    pub fn pg_auth_failures(&self) -> Counter {
        self.pg_auth_failures.clone()
    }

    /// The exposition (Prometheus text format), with the scrape-time values of `now` and of
    /// the data cache's counters.
    pub fn encode(&self, now: Snapshot, cache: Option<&CacheStats>) -> String {
        self.running.set(now.running as i64);
        self.slots.set(now.slots as i64);
        self.table_version
            .set(i64::try_from(now.table_version).unwrap_or(i64::MAX));
        if let Some(c) = cache {
            let mut seen = self.cache_seen.lock().unwrap_or_else(|e| e.into_inner());
            let (requests, hits, fetched) = (c.requests(), c.hit_blocks(), c.fetched_blocks());
            self.cache_requests.inc_by(requests.saturating_sub(seen.0));
            self.cache_hit_blocks.inc_by(hits.saturating_sub(seen.1));
            self.cache_fetched_blocks
                .inc_by(fetched.saturating_sub(seen.2));
            *seen = (requests.max(seen.0), hits.max(seen.1), fetched.max(seen.2));
        }
        let mut out = String::new();
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }
}

/// An open Postgres connection ([`QueryMetrics::pg_connection`]); dropping it counts the
/// connection closed.
#[derive(Debug)]
pub struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn outcome(code: Option<Code>) -> Labels {
    vec![("outcome", code.map_or("ok", Code::as_str).to_string())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::QueryErrorKind;

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{series} not in:\n{text}"))
    }

    #[test]
    fn statements_count_by_outcome_with_every_code_from_zero() {
        let m = QueryMetrics::new();
        let text = m.encode(Snapshot::default(), None);
        assert_eq!(
            value(&text, "toolspan_query_statements_total{outcome=\"ok\"}"),
            0.0
        );
        for code in STATEMENT_CODES {
            let series = format!(
                "toolspan_query_statements_total{{outcome=\"{}\"}}",
                code.as_str()
            );
            assert_eq!(value(&text, &series), 0.0);
        }
        m.statement(Duration::from_millis(20), Ok(7));
        m.statement(Duration::from_millis(3), Ok(5));
        let bad = QueryError::new(
            QueryErrorKind::Overloaded {
                limit: 1,
                waited_seconds: 1,
            },
            "full",
        );
        m.statement(Duration::from_secs(2), Err(&bad));
        let text = m.encode(
            Snapshot {
                running: 2,
                slots: 8,
                table_version: 41,
            },
            None,
        );
        assert_eq!(
            value(&text, "toolspan_query_statements_total{outcome=\"ok\"}"),
            2.0
        );
        assert_eq!(
            value(
                &text,
                "toolspan_query_statements_total{outcome=\"overloaded\"}"
            ),
            1.0
        );
        assert_eq!(value(&text, "toolspan_query_rows_total"), 12.0);
        assert_eq!(value(&text, "toolspan_query_statement_seconds_count"), 3.0);
        assert_eq!(
            value(
                &text,
                "toolspan_query_statement_seconds_bucket{le=\"0.025\"}"
            ),
            2.0
        );
        assert_eq!(value(&text, "toolspan_query_running"), 2.0);
        assert_eq!(value(&text, "toolspan_query_slots"), 8.0);
        assert_eq!(value(&text, "toolspan_query_table_version"), 41.0);
    }

    #[test]
    fn http_requests_are_labelled_by_route_template_and_status() {
        let m = QueryMetrics::new();
        m.http_request("/api/v1/traces/{trace_id}", 200, Duration::from_millis(4));
        m.http_request("/api/v1/traces/{trace_id}", 404, Duration::from_millis(1));
        let text = m.encode(Snapshot::default(), None);
        assert_eq!(
            value(
                &text,
                "toolspan_query_http_requests_total{route=\"/api/v1/traces/{trace_id}\",status=\"404\"}"
            ),
            1.0
        );
        assert_eq!(
            value(
                &text,
                "toolspan_query_http_request_seconds_count{route=\"/api/v1/traces/{trace_id}\"}"
            ),
            2.0
        );
    }

    #[test]
    fn postgres_connections_count_while_open_and_refused_logins() {
        let m = QueryMetrics::new();
        let a = m.pg_connection();
        let b = m.pg_connection();
        m.pg_auth_failures().inc();
        let text = m.encode(Snapshot::default(), None);
        assert_eq!(value(&text, "toolspan_query_pg_connections_total"), 2.0);
        assert_eq!(value(&text, "toolspan_query_pg_connections_open"), 2.0);
        assert_eq!(value(&text, "toolspan_query_pg_auth_failures_total"), 1.0);
        drop(a);
        drop(b);
        let text = m.encode(Snapshot::default(), None);
        assert_eq!(value(&text, "toolspan_query_pg_connections_total"), 2.0);
        assert_eq!(value(&text, "toolspan_query_pg_connections_open"), 0.0);
    }
}
