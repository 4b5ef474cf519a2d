//! Password authentication (MD5, which psql, psycopg and Grafana all speak) for the one
//! configured role. A wrong user fails exactly like a wrong password.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::md5pass::{hash_md5_password, Md5PasswordAuthStartupHandler};
use pgwire::api::auth::{
    AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler,
};
use pgwire::api::{ClientInfo, PgWireConnectionState};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use prometheus_client::metrics::counter::Counter;

use super::settings;

/// The role clients log in as.
#[derive(Clone)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"…")
            .finish()
    }
}

#[async_trait]
impl AuthSource for Credentials {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let salt = uuid::Uuid::new_v4().as_bytes()[..4].to_vec();
        let user = login.user().unwrap_or_default();
        let hash = if user == self.user {
            hash_md5_password(user, &self.password, &salt)
        } else {
            tracing::info!(user, "postgres login with an unknown user");
            // A hash no client can produce, so the failure looks like a wrong password.
            hash_md5_password(user, &uuid::Uuid::new_v4().to_string(), &salt)
        };
        Ok(Password::new(Some(salt), hash.into_bytes()))
    }
}

/// The parameters sent after login: the Postgres version toolspan presents, UTF8, UTC, ISO
/// dates, read-only.
pub fn server_parameters() -> DefaultServerParameterProvider {
    let mut p = DefaultServerParameterProvider::default();
    p.server_version = settings::SERVER_VERSION.into();
    p.is_superuser = false;
    p.default_transaction_read_only = true;
    p.time_zone = "UTC".into();
    p.date_style = "ISO, MDY".into();
    p
}

/// The startup handler of one connection (it keeps the salted hash between the startup and
/// the password message, so each connection needs its own).
pub fn startup_handler(
    credentials: Arc<Credentials>,
    manager: Arc<pgwire::api::ConnectionManager>,
) -> Md5PasswordAuthStartupHandler<Credentials, DefaultServerParameterProvider> {
    Md5PasswordAuthStartupHandler::new(credentials, Arc::new(server_parameters()))
        .with_connection_manager(manager)
}

/// A startup handler that counts refused logins (`toolspan_query_pg_auth_failures_total`)
/// and says when the connection has logged in (its login timeout then stops).
pub struct Counted<H> {
    inner: H,
    failures: Counter,
    logged_in: Arc<AtomicBool>,
}

impl<H> Counted<H> {
    /// `inner`, counting its refusals in `failures` and setting `logged_in` on success.
    pub fn new(inner: H, failures: Counter, logged_in: Arc<AtomicBool>) -> Counted<H> {
        Counted {
            inner,
            failures,
            logged_in,
        }
    }
}

#[async_trait]
impl<H: StartupHandler> StartupHandler for Counted<H> {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: std::fmt::Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let result = self.inner.on_startup(client, message).await;
        if let Err(PgWireError::InvalidPassword(_)) = &result {
            self.failures.inc();
        }
        if result.is_ok() && matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            self.logged_in.store(true, Ordering::Relaxed);
        }
        result
    }
}
