//! The limits every listener of a command applies to its clients (`serve`, `demo`, `query`,
//! `ingest`, `metrics`), and the range checks of every time value a flag, a `TOOLSPAN_*`
//! variable or the configuration file sets: an out-of-range value stops the command with
//! `invalid_argument` naming the flag and the range, instead of overflowing a timer later.

use std::time::Duration;

use clap::builder::{RangedU64ValueParser, TypedValueParser};

/// The longest a client timeout may be: one day.
const DAY_SECS: u64 = 86_400;

/// Whole seconds in `lo..=hi`.
pub fn secs(lo: u64, hi: u64) -> RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(lo..=hi)
}

/// Milliseconds in `lo..=hi`.
pub fn millis(lo: u64, hi: u64) -> RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(lo..=hi)
}

/// Seconds as a decimal number in `0..=hi`.
pub fn secs_f64(hi: f64) -> impl TypedValueParser<Value = f64> {
    clap::builder::StringValueParser::new().try_map(move |s: String| {
        match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && (0.0..=hi).contains(&v) => Ok(v),
            _ => Err(format!("{s} is not a number of seconds in 0..={hi}")),
        }
    })
}

/// Limits on the clients of every listener the command runs.
#[derive(clap::Args, Debug, Clone)]
pub struct ListenerArgs {
    /// Seconds a client has to send a request's head (HTTP; on a kept-alive connection, from
    /// the end of the previous answer) or to log in (Postgres).
    #[arg(long, env = "TOOLSPAN_HTTP_HEADER_TIMEOUT_SECS", default_value_t = 10, value_parser = secs(1, DAY_SECS))]
    pub header_timeout_secs: u64,
    /// Seconds a client has to send a request's whole body (HTTP).
    #[arg(long, env = "TOOLSPAN_HTTP_BODY_TIMEOUT_SECS", default_value_t = 60, value_parser = secs(1, DAY_SECS))]
    pub body_timeout_secs: u64,
    /// Seconds an HTTP connection may stay open with no request in flight (whether it ever
    /// sent a byte or not, HTTP/1.1 or HTTP/2).
    #[arg(long, env = "TOOLSPAN_HTTP_IDLE_TIMEOUT_SECS", default_value_t = 10, value_parser = secs(1, DAY_SECS))]
    pub idle_timeout_secs: u64,
    /// Connections each listener serves at once; one more is answered 503 (HTTP) or
    /// SQLSTATE 53300 (Postgres) and closed.
    #[arg(long, env = "TOOLSPAN_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
}

impl ListenerArgs {
    /// The limits, with `allowed_hosts` for the query API's `Host` check.
    pub fn limits(&self, allowed_hosts: &[String]) -> toolspan_serve::listener::Limits {
        toolspan_serve::listener::Limits {
            header_timeout: Duration::from_secs(self.header_timeout_secs),
            body_timeout: Duration::from_secs(self.body_timeout_secs),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            allowed_hosts: allowed_hosts.to_vec(),
        }
    }
}

/// What the query API (of `query`, or `serve --http-addr`) adds for browsers.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BrowserArgs {
    /// A host name (with or without a port) the query API also answers when it is bound to
    /// loopback, where it otherwise answers only `localhost`, `127.0.0.1`, `[::1]` and its own
    /// address (a defence against DNS rebinding); repeatable. Given on another address, the
    /// API answers only these names and its own address.
    #[arg(
        long = "allowed-host",
        value_name = "NAME",
        env = "TOOLSPAN_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// Mark the token cookie `Secure`, so browsers send it over HTTPS only: for a server
    /// behind a TLS proxy.
    #[arg(long)]
    pub cookie_secure: bool,
}
