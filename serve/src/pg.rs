//! The Postgres wire protocol (port 5433 by default), built on `pgwire`, so that psql,
//! psycopg and Grafana's built-in PostgreSQL data source query toolspan without a plugin.
//!
//! - [`auth`]: MD5 password authentication for one role;
//! - [`handler`]: the simple and extended query protocols, through the same read-only gate,
//!   admission slots, time and memory limits as the HTTP API;
//! - [`statement`]: sorting client text into queries, harmless session commands and refusals;
//! - [`settings`]: what `SET`, `SHOW` and `current_setting()` see;
//! - [`catalog`]: `information_schema`, `pg_catalog` and the functions clients' metadata
//!   queries call;
//! - [`params`]: binding `$n` parameters as literals;
//! - [`error`]: envelopes as Postgres errors (SQLSTATE from [`toolspan_schema::Code::sqlstate`]).
//!
//! Why not `datafusion-postgres`' own handlers: they run any statement DataFusion accepts
//! (DML included) and return DataFusion's error text; toolspan needs its gate and envelopes
//! on every statement. Its companion crates (`arrow-pg` for types and encoding,
//! `datafusion-pg-catalog` for the catalogs and the client-SQL rewrites) are used as they are.

pub mod auth;
pub mod catalog;
pub mod error;
pub mod handler;
pub mod params;
pub mod settings;
pub mod statement;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::PgWireServerHandlers;

use crate::listener::{Limits, Slots};
pub use auth::Credentials;
use handler::{Handler, Shared};
use toolspan_query::metrics::OpenConnection;
use toolspan_query::service::QueryService;

/// The handlers of one connection.
struct Connection {
    handler: Arc<Handler>,
    credentials: Arc<Credentials>,
    manager: Arc<pgwire::api::ConnectionManager>,
    /// Refused logins, counted in the service's metrics.
    auth_failures: prometheus_client::metrics::counter::Counter,
    /// Set once the client has logged in.
    logged_in: Arc<AtomicBool>,
    /// Counts the connection open in the service's metrics while it lives.
    _open: OpenConnection,
}

impl PgWireServerHandlers for Connection {
    fn simple_query_handler(&self) -> Arc<impl pgwire::api::query::SimpleQueryHandler> {
        self.handler.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl pgwire::api::query::ExtendedQueryHandler> {
        self.handler.clone()
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        Arc::new(auth::Counted::new(
            auth::startup_handler(self.credentials.clone(), self.manager.clone()),
            self.auth_failures.clone(),
            self.logged_in.clone(),
        ))
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.manager.clone()))
    }
}

/// A second handle on `socket` for noticing a vanished client (see [`Handler::new`]); `None`
/// when the descriptor cannot be duplicated (the query then runs to its end or its timeout).
fn peer_handle(socket: &tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = socket.as_fd().try_clone_to_owned().ok()?;
    let peer = std::net::TcpStream::from(fd);
    // The duplicate shares the socket's open file description, which tokio already made
    // non-blocking; saying so again keeps a peek from ever blocking a runtime thread.
    peer.set_nonblocking(true).ok()?;
    Some(peer)
}

/// Serves the Postgres protocol on `listener` with `limits` until `shutdown` completes: a
/// client must log in within the header timeout, and connections beyond the cap are
/// answered SQLSTATE 53300 and closed. The engine must have its catalogs installed
/// ([`catalog::install`]) for clients' metadata queries.
///
/// A session that has logged in stays open while idle, as in Postgres: clients such as
/// Grafana keep a pool of them; the cap bounds how many.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Arc<QueryService>,
    credentials: Credentials,
    limits: &Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let shared = Arc::new(Shared::new(service));
    let credentials = Arc::new(credentials);
    let manager = Arc::new(pgwire::api::ConnectionManager::new());
    let slots = Slots::new(limits.max_connections);
    let login_timeout = limits.header_timeout;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            a = listener.accept() => a,
        };
        match accepted {
            Ok((socket, peer)) => {
                let Some(slot) = slots.take() else {
                    slots.refuse(socket, too_many(slots.max()));
                    continue;
                };
                let _ = socket.set_nodelay(true);
                let metrics = shared.service.metrics();
                let logged_in = Arc::new(AtomicBool::new(false));
                let connection = Arc::new(Connection {
                    handler: Arc::new(Handler::new(shared.clone(), peer_handle(&socket))),
                    credentials: credentials.clone(),
                    manager: manager.clone(),
                    auth_failures: metrics.pg_auth_failures(),
                    logged_in: logged_in.clone(),
                    _open: metrics.pg_connection(),
                });
                tokio::spawn(async move {
                    let _slot = slot;
                    let session = pgwire::tokio::process_socket(socket, None, connection);
                    let login = async {
                        tokio::time::sleep(login_timeout).await;
                        if logged_in.load(Ordering::Relaxed) {
                            std::future::pending::<()>().await;
                        }
                    };
                    tokio::select! {
                        r = session => {
                            if let Err(e) = r {
                                tracing::debug!(%peer, error = %e, "postgres connection ended with an error");
                            }
                        }
                        () = login => {
                            tracing::debug!(%peer, "closing a postgres connection that did not log in in time");
                        }
                    }
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accepting a postgres connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// The answer to a connection beyond the cap: a Postgres `ErrorResponse`, SQLSTATE 53300
/// (`too_many_connections`), as Postgres sends it before the startup message is read.
fn too_many(max: usize) -> Vec<u8> {
    let message = format!(
        "this server serves at most {max} connections at once and all are taken; retry \
         shortly (the cap is --max-connections)"
    );
    let mut fields = Vec::new();
    for (tag, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "53300"),
        (b'M', message.as_str()),
    ] {
        fields.push(tag);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut out = vec![b'E'];
    let len = u32::try_from(fields.len() + 4).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&fields);
    out
}
