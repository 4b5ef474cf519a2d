//! What every listener (the HTTP ones of [`crate::http::serve`] and the Postgres one of
//! [`crate::pg::serve`]) shares: how long a client may keep a connection without using it,
//! and how many connections it may hold at once.
//!
//! A connection beyond [`Limits::max_connections`] is answered at once (HTTP: 503 with the
//! `overloaded` envelope and `Retry-After`; Postgres: an `ErrorResponse` with SQLSTATE 53300)
//! and closed, so a flood of idle connections cannot take every file descriptor of the
//! process and a client beyond the cap learns it promptly instead of hanging.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The limits a listener applies to its clients.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time a client has to send a request's head (HTTP), or to log in (Postgres).
    pub header_timeout: Duration,
    /// Time a client has to send a request's whole body (HTTP).
    pub body_timeout: Duration,
    /// A connection with no request in flight for this long is closed (HTTP).
    pub idle_timeout: Duration,
    /// Connections served at once; more are refused.
    pub max_connections: usize,
    /// Host names (besides `localhost`, `127.0.0.1`, `[::1]` and the bound address) the
    /// query API answers when it is bound to loopback (HTTP; see [`crate::http::host`]).
    pub allowed_hosts: Vec<String>,
}

/// Default [`Limits::header_timeout`].
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`Limits::body_timeout`].
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`Limits::idle_timeout`].
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`Limits::max_connections`].
pub const MAX_CONNECTIONS: usize = 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            allowed_hosts: Vec::new(),
        }
    }
}

/// Refusals answered at once; past this, a connection beyond the cap is closed unanswered.
const REFUSALS_IN_FLIGHT: usize = 64;

/// How long a refused connection is given to take its answer before it is closed.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// The connection slots of one listener.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    open: Arc<Semaphore>,
    max: usize,
    refusing: Arc<Semaphore>,
}

impl Slots {
    /// `max` slots (at least one).
    pub(crate) fn new(max: usize) -> Slots {
        let max = max.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        Slots {
            open: Arc::new(Semaphore::new(max)),
            max,
            refusing: Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT)),
        }
    }

    /// The cap.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A slot for a new connection, held while it is open; `None` at the cap.
    pub(crate) fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.open.clone().try_acquire_owned().ok()
    }

    /// Sends `answer` on `stream` (a connection beyond the cap) and closes it, in the
    /// background; under a flood of them, closes it unanswered.
    pub(crate) fn refuse(&self, mut stream: TcpStream, answer: Vec<u8>) {
        let Ok(permit) = self.refusing.clone().try_acquire_owned() else {
            return;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(REFUSAL_LINGER, async {
                stream.write_all(&answer).await?;
                stream.shutdown().await?;
                // Read what the client sent before closing: closing with unread bytes would
                // reset the connection and could discard the answer on the client's side.
                let mut sink = [0u8; 4096];
                let mut read = 0usize;
                while read < 64 << 10 {
                    match stream.read(&mut sink).await? {
                        0 => break,
                        n => read += n,
                    }
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
        });
    }

    /// Waits until every connection has closed, at most `within`; false when some are still
    /// open then.
    pub(crate) async fn drain(&self, within: Duration) -> bool {
        let all = u32::try_from(self.max).unwrap_or(u32::MAX);
        tokio::time::timeout(within, self.open.acquire_many(all))
            .await
            .is_ok()
    }
}
