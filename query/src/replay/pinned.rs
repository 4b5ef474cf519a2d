//! [`Pinned`]: the `spans` table (and the `calls` view) at one table version, for the reads of
//! a replay document or an evals export. Every statement of one request reads the same
//! version, whatever commits land meanwhile, and a version given by the caller is read as it
//! was (time travel): the same version gives the same answer.

use datafusion::arrow::array::RecordBatch;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::SessionContext;
use toolspan_schema::{Code, Envelope, EnvelopeError};

use crate::engine::{shorten_sql, Engine};
use crate::error::QueryError;

/// `spans` and `calls` at one table version.
pub struct Pinned {
    ctx: SessionContext,
    version: u64,
    timeout: std::time::Duration,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned")
            .field("version", &self.version)
            .finish()
    }
}

fn envelope(e: QueryError) -> Envelope {
    EnvelopeError::envelope(&e)
}

impl Pinned {
    /// The table at `version`, or at the latest committed version when `None`. A version
    /// after the latest, or one whose log retention has removed, is `invalid_argument`.
    pub async fn open(engine: &Engine, version: Option<u64>) -> Result<Pinned, Envelope> {
        let store = |e: toolspan_store::StoreError| envelope(QueryError::from_store(&e));
        let source = engine.live_spans().table();
        let mut table = source.latest().await.map_err(store)?;
        let latest = table.version().unwrap_or(0);
        if let Some(v) = version {
            if v > latest {
                let message =
                    format!("table version {v} does not exist: the latest version is {latest}");
                return Err(Envelope::new(
                    Code::InvalidArgument,
                    message.clone(),
                    message,
                ));
            }
            if v < latest {
                table.load_version(v).await.map_err(|e| {
                    Envelope::new(
                        Code::InvalidArgument,
                        format!(
                            "table version {v} can no longer be read (log retention removed it); \
                             read a later version, up to {latest}"
                        ),
                        e,
                    )
                })?;
            }
        }
        let (files, read) =
            crate::provider::build_scan(&table, source.kind().sort_column()).map_err(store)?;
        let ctx = SessionContext::new_with_state(
            SessionStateBuilder::new()
                .with_config(engine.context().copied_config())
                .with_runtime_env(engine.context().runtime_env())
                .with_default_features()
                .build(),
        );
        let internal =
            |e: datafusion::error::DataFusionError| envelope(QueryError::from_datafusion(&e));
        ctx.register_table("spans", files).map_err(internal)?;
        ctx.sql(crate::views::CALLS_SQL.as_str())
            .await
            .map_err(internal)?
            .collect()
            .await
            .map_err(internal)?;
        Ok(Pinned {
            ctx,
            version: read,
            timeout: engine.options().query_timeout,
        })
    }

    /// The version read.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Runs one statement (toolspan's own, never a caller's text) under the query time limit.
    pub async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>, Envelope> {
        let run = async {
            self.ctx
                .sql(sql)
                .await
                .map_err(|e| QueryError::from_datafusion(&e))?
                .collect()
                .await
                .map_err(|e| QueryError::from_datafusion(&e))
        };
        match tokio::time::timeout(self.timeout, run).await {
            Ok(r) => r.map_err(envelope),
            Err(_) => Err(envelope(QueryError::new(
                crate::error::QueryErrorKind::Timeout {
                    seconds: self.timeout.as_secs().max(1),
                },
                format_args!("cancelled after {:?}: {}", self.timeout, shorten_sql(sql)),
            ))),
        }
    }
}
