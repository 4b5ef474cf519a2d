//! `toolspan query` over a table written by `toolspan demo`, driven the way people and
//! Grafana drive it; one module per client or endpoint, all against one demo table and one
//! server ([`demo`]):
//! - [`psql`]: the real `psql` client: ping, versions, session settings, data, passwords;
//! - [`psycopg`]: Python psycopg in four protocol modes, parameters, types, transactions;
//! - [`grafana`]: Grafana's own metadata queries and every SQL panel of the provisioned
//!   dashboards, variables and macros expanded as Grafana does (`tests/grafana/macros.py`);
//! - [`corpus`]: the SQL corpus (`query/tests/sql`) through psql and psycopg;
//! - [`http`]: the HTTP trace and reference lookups;
//! - [`metrics`]: the service's own `/metrics` after statements over HTTP and Postgres;
//! - [`memory`]: resident memory under results far larger than the memory limit (its own
//!   server, with a 64 MB limit).

mod corpus;
mod grafana;
mod http;
mod memory;
mod metrics;
mod object_store;
mod psql;
mod psycopg;
// The corpus loader, shared with the query crate's tests (another crate, hence the path).
#[path = "../query/tests/main/sql_corpus.rs"]
mod sql_corpus;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Mutex, OnceLock};

use crate::support::{reaper, repo_root, start_query};

/// The Postgres user the server is started with.
const USER: &str = "grafana";
/// Its password.
const PASSWORD: &str = "query-service-test-pw";

/// A demo table and a `toolspan query` serving it, shared by every test of this module.
struct Demo {
    /// The demo table's data directory.
    dir: PathBuf,
    server: QueryServer,
    /// Its stdin is held open for the life of the test binary: see [`reaper`].
    _reaper: Mutex<Child>,
}

static DEMO: OnceLock<Demo> = OnceLock::new();

/// The shared demo table and server, made by the first test that asks (the others wait).
fn demo() -> &'static Demo {
    DEMO.get_or_init(|| {
        // A static is never dropped: the table's directory is kept, and a reaper removes it
        // and stops the server once the test binary is gone.
        let dir = tempfile::tempdir().expect("temp dir").keep();
        run_demo(&dir);
        let server = QueryServer::start(&dir);
        let reaper = reaper(server.pid(), &dir);
        Demo {
            dir,
            server,
            _reaper: Mutex::new(reaper),
        }
    })
}

/// A running `toolspan query`.
struct QueryServer {
    child: Mutex<Child>,
    http: u16,
    pg: u16,
}

impl QueryServer {
    fn start(data_dir: &Path) -> QueryServer {
        let (child, http, pg) = start_query(data_dir, USER, PASSWORD, &[]);
        QueryServer {
            child: Mutex::new(child),
            http,
            pg,
        }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    fn pid(&self) -> u32 {
        self.child.lock().unwrap_or_else(|e| e.into_inner()).id()
    }
}

fn run_demo(dir: &Path) {
    crate::support::run_demo(dir, 10, 60);
}

/// The SQL corpus, `query/tests/sql` (the query crate's tests read it as `tests/sql`).
fn corpus_dir() -> PathBuf {
    repo_root().join("query/tests/sql")
}
