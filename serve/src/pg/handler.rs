//! The simple and extended query protocols over the [`QueryService`].
//!
//! Simple: each statement of the text is prepared ([`statement::prepare`]) and planned; a
//! failing statement answers with its envelope and ends the batch, and the connection stays
//! usable. The statements then run one after the other, each only once the rows of the one
//! before have been sent, and every result is sent as it is produced
//! ([`QueryService::query_stream`]): one message never holds more than a batch in flight,
//! and all its statements share one deadline, the query timeout counted from the message's
//! arrival. Extended: `Parse` prepares and plans the statement (so errors and the result
//! columns are known before `Bind`), `Bind` keeps the parameters, `Execute` binds them as
//! literals ([`params::bind`]) and runs the statement through the same gate, its rows sent as
//! they are produced (with a row limit, `max_rows` at a time from the suspended portal).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;
use futures::stream::BoxStream;
use futures::{stream, Sink, SinkExt, StreamExt};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, Type};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;
use pgwire::messages::PgWireBackendMessage;
use pgwire::types::format::FormatOptions;
use toolspan_schema::EnvelopeError;

use super::error::{info, to_pg};
use super::params;
use super::settings::Session;
use super::statement::{self, Command, Prepared};
use toolspan_query::engine::QueryResult;
use toolspan_query::error::{QueryError, QueryErrorKind};
use toolspan_query::service::QueryService;
use toolspan_query::stream::ResultStream;

/// A prepared statement of the extended protocol.
#[derive(Debug, Clone)]
pub enum PgStatement {
    /// A query, planned at `Parse`.
    Query {
        /// SQL for the engine, with `$n` placeholders.
        sql: String,
        /// The result columns.
        schema: SchemaRef,
        /// The parameter types the planner inferred (`UNKNOWN` where it could not).
        params: Vec<Type>,
    },
    /// A session command.
    Command(Command),
}

/// What all connections share: the service and the parser (built once: it tokenizes its
/// rewrite patterns on construction).
#[derive(Debug)]
pub struct Shared {
    /// The query front.
    pub service: Arc<QueryService>,
    parser: PostgresCompatibilityParser,
}

impl Shared {
    /// Shares `service`.
    pub fn new(service: Arc<QueryService>) -> Shared {
        Shared {
            service,
            parser: PostgresCompatibilityParser::new(),
        }
    }
}

/// The query handlers of one connection.
#[derive(Debug)]
pub struct Handler {
    shared: Arc<Shared>,
    session: Mutex<Session>,
    parser: Arc<StatementParser>,
    /// A second handle on the client's socket, to notice while a query runs that the client
    /// has gone (pgwire reads the socket only between messages).
    peer: Option<Arc<std::net::TcpStream>>,
}

/// The longest statement text accepted, as for `POST /api/v1/sql`.
pub const MAX_SQL_BYTES: usize = crate::http::MAX_BODY_BYTES;

/// How often a running query checks whether its client is still connected.
const PEER_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

/// Completes once the client has closed or reset its side of the connection. Peeks without
/// consuming: bytes waiting (a pipelined message) mean the client is still there.
async fn client_gone(peer: &std::net::TcpStream) {
    let mut byte = [0u8; 1];
    loop {
        match peer.peek(&mut byte) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
        tokio::time::sleep(PEER_CHECK).await;
    }
}

/// Refuses statement text longer than [`MAX_SQL_BYTES`].
fn check_size(sql: &str) -> PgWireResult<()> {
    if sql.len() <= MAX_SQL_BYTES {
        return Ok(());
    }
    let e = QueryError::new(
        QueryErrorKind::InvalidQuery {
            message: format!(
                "the statement is {} bytes long and toolspan accepts at most {MAX_SQL_BYTES}; \
                 shorten it",
                sql.len()
            ),
        },
        format_args!("statement of {} bytes", sql.len()),
    );
    Err(to_pg(&e))
}

/// A query started, with its first batch (`None`: the result is empty).
type Started = (ResultStream, Option<RecordBatch>);

/// Starts a query and waits for its first batch (so that errors of planning and of the start
/// of execution come before any row), cancelling it, and freeing its slot, as soon as the
/// client has gone.
async fn start(
    service: &QueryService,
    peer: Option<&std::net::TcpStream>,
    sql: &str,
    until: Option<tokio::time::Instant>,
) -> PgWireResult<Started> {
    let work = async {
        let mut results = service.query_stream_until(sql, until).await?;
        let first = results.next_batch().await.transpose()?;
        Ok::<_, QueryError>((results, first))
    };
    let Some(peer) = peer else {
        return work.await.map_err(|e| to_pg(&e));
    };
    tokio::select! {
        r = work => r.map_err(|e| to_pg(&e)),
        () = client_gone(peer) => {
            tracing::info!("postgres client closed its connection while its query ran: query cancelled");
            Err(PgWireError::IoError(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "client closed the connection",
            )))
        }
    }
}

/// The rows of a started query as they are produced; an error ends them.
fn rows(
    started: Started,
    fields: Arc<Vec<FieldInfo>>,
) -> BoxStream<'static, PgWireResult<DataRow>> {
    let (results, first) = started;
    stream::iter(first.map(Ok))
        .chain(results)
        .flat_map(move |batch| match batch {
            Ok(b) => {
                stream::iter(arrow_pg::datatypes::encode_recordbatch(fields.clone(), b)).boxed()
            }
            Err(e) => stream::once(async move { Err(to_pg(&e)) }).boxed(),
        })
        .boxed()
}

/// The rows of a statement that starts only when its rows are first asked for: the statements
/// of one message run one at a time, in order, each streamed to the client.
fn deferred_rows(
    shared: Arc<Shared>,
    peer: Option<Arc<std::net::TcpStream>>,
    sql: String,
    until: tokio::time::Instant,
    fields: Arc<Vec<FieldInfo>>,
) -> BoxStream<'static, PgWireResult<DataRow>> {
    stream::once(async move { start(&shared.service, peer.as_deref(), &sql, Some(until)).await })
        .flat_map(move |started| match started {
            Ok(s) => rows(s, fields.clone()),
            Err(e) => stream::once(async move { Err(e) }).boxed(),
        })
        .boxed()
}

/// Parses extended-protocol statements (`Parse` messages).
#[derive(Debug)]
pub struct StatementParser {
    shared: Arc<Shared>,
}

impl Handler {
    /// Handlers for a new connection; `peer` (a duplicate of the connection's socket, in
    /// non-blocking mode) lets a running query be cancelled when the client goes away.
    pub fn new(shared: Arc<Shared>, peer: Option<std::net::TcpStream>) -> Handler {
        Handler {
            parser: Arc::new(StatementParser {
                shared: shared.clone(),
            }),
            shared,
            session: Mutex::new(Session::default()),
            peer: peer.map(Arc::new),
        }
    }

    fn session(&self) -> std::sync::MutexGuard<'_, Session> {
        // A poisoned lock only means a panic while holding plain data: still usable.
        match self.session.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        }
    }

    /// Answers a session command.
    fn command(
        &self,
        c: &Command,
        format: &Format,
        options: &Arc<FormatOptions>,
    ) -> PgWireResult<Response> {
        Ok(match c {
            Command::Set { name, value } => {
                self.session().set(name, value);
                Response::Execution(Tag::new(c.tag()))
            }
            Command::Begin => Response::TransactionStart(Tag::new(c.tag())),
            Command::Commit | Command::Rollback => Response::TransactionEnd(Tag::new(c.tag())),
            Command::Discard => Response::Execution(Tag::new(c.tag())),
            Command::Show { name } => {
                let Some(value) = self.session().show(name) else {
                    let e = QueryError::new(
                        QueryErrorKind::InvalidQuery {
                            message: format!(
                                "unrecognized configuration parameter \"{name}\": SHOW ALL lists \
                                 the settings toolspan reports"
                            ),
                        },
                        format_args!("SHOW {name}"),
                    );
                    return Err(to_pg(&e));
                };
                let column = super::settings::canonical(name);
                let result = text_result(&[&column], vec![vec![value]])?;
                Response::Query(encode(result, format, options)?)
            }
            Command::ShowAll => {
                let all = self.session().all();
                let rows = all.into_iter().map(|(n, v, d)| vec![n, v, d]).collect();
                let result = text_result(&["name", "setting", "description"], rows)?;
                Response::Query(encode(result, format, options)?)
            }
        })
    }
}

/// The one-statement schema of a `SHOW`.
fn show_schema(c: &Command) -> Option<SchemaRef> {
    let names: Vec<String> = match c {
        Command::Show { name } => vec![super::settings::canonical(name)],
        Command::ShowAll => vec!["name".into(), "setting".into(), "description".into()],
        _ => return None,
    };
    Some(Arc::new(Schema::new(
        names
            .into_iter()
            .map(|n| Field::new(n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    )))
}

fn text_result(columns: &[&str], rows: Vec<Vec<String>>) -> PgWireResult<QueryResult> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(*c, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let arrays = (0..columns.len())
        .map(|i| {
            Arc::new(StringArray::from(
                rows.iter().map(|r| r[i].clone()).collect::<Vec<_>>(),
            )) as datafusion::arrow::array::ArrayRef
        })
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| to_pg(&QueryError::new(QueryErrorKind::Internal, e)))?;
    Ok(QueryResult::new(schema, vec![batch]))
}

/// Column descriptions for a result schema: a real Postgres type OID for each column.
fn fields(
    schema: &Schema,
    format: &Format,
    options: Option<Arc<FormatOptions>>,
) -> PgWireResult<Vec<FieldInfo>> {
    arrow_pg::datatypes::arrow_schema_to_pg_fields(schema, format, options).map_err(|e| {
        let unsupported: Vec<String> = schema
            .fields()
            .iter()
            .filter(|f| arrow_pg::datatypes::into_pg_type(f.data_type()).is_err())
            .map(|f| f.name().clone())
            .collect();
        let q = QueryError::new(
            QueryErrorKind::InvalidQuery {
                message: format!(
                    "the Postgres protocol cannot carry the type of column(s) {}: CAST them to \
                     text or a number",
                    unsupported.join(", ")
                ),
            },
            e,
        );
        to_pg(&q)
    })
}

fn encode(
    result: QueryResult,
    format: &Format,
    options: &Arc<FormatOptions>,
) -> PgWireResult<QueryResponse> {
    let fields = Arc::new(fields(&result.schema, format, Some(options.clone()))?);
    let rows_fields = fields.clone();
    let rows = stream::iter(
        result
            .batches
            .into_iter()
            .flat_map(move |b| arrow_pg::datatypes::encode_recordbatch(rows_fields.clone(), b)),
    );
    Ok(QueryResponse::new(fields, rows))
}

/// A query's answer from its started result.
fn streamed(
    started: Started,
    format: &Format,
    options: &Arc<FormatOptions>,
) -> PgWireResult<QueryResponse> {
    let fields = Arc::new(fields(started.0.schema(), format, Some(options.clone()))?);
    Ok(QueryResponse::new(fields.clone(), rows(started, fields)))
}

fn format_options<C: ClientInfo>(client: &C) -> Arc<FormatOptions> {
    Arc::new(FormatOptions::from_client_metadata(client.metadata()))
}

#[async_trait]
impl SimpleQueryHandler for Handler {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: std::fmt::Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        check_size(query)?;
        let prepared = statement::prepare(&self.shared.parser, query).map_err(|e| to_pg(&e))?;
        if prepared.is_empty() {
            return Ok(vec![Response::EmptyQuery]);
        }
        let options = format_options(client);
        // One deadline for every statement of the message.
        let until =
            tokio::time::Instant::now() + self.shared.service.engine().options().query_timeout;
        let mut responses = Vec::with_capacity(prepared.len());
        for p in prepared {
            let answer =
                match p {
                    // The first statement starts here, so that its errors come before any row.
                    Prepared::Query(sql) if responses.is_empty() => {
                        match start(
                            &self.shared.service,
                            self.peer.as_deref(),
                            &sql,
                            Some(until),
                        )
                        .await
                        {
                            Ok(started) => streamed(started, &Format::UnifiedText, &options)
                                .map(Response::Query),
                            Err(e @ PgWireError::IoError(_)) => return Err(e),
                            Err(e) => Err(e),
                        }
                    }
                    // The others are planned now (their columns are sent before their rows) and
                    // run when their turn comes.
                    Prepared::Query(sql) => match self.shared.service.schema_of(&sql).await {
                        Ok(schema) => fields(&schema, &Format::UnifiedText, Some(options.clone()))
                            .map(|f| {
                                let f = Arc::new(f);
                                Response::Query(QueryResponse::new(
                                    f.clone(),
                                    deferred_rows(
                                        self.shared.clone(),
                                        self.peer.clone(),
                                        sql,
                                        until,
                                        f,
                                    ),
                                ))
                            }),
                        Err(e) => Err(to_pg(&e)),
                    },
                    Prepared::Command(c) => self.command(&c, &Format::UnifiedText, &options),
                    Prepared::Refused(e) => Err(to_pg(&e)),
                };
            match answer {
                Ok(r) => responses.push(r),
                Err(e) => {
                    // Postgres stops a batch at its first error; earlier results stand.
                    if responses.is_empty() {
                        return Err(e);
                    }
                    responses.push(Response::Error(Box::new(error_info(e))));
                    break;
                }
            }
        }
        Ok(responses)
    }
}

fn error_info(e: PgWireError) -> pgwire::error::ErrorInfo {
    match e {
        PgWireError::UserError(info) => *info,
        other => info(&EnvelopeError::envelope(&QueryError::new(
            QueryErrorKind::Internal,
            other,
        ))),
    }
}

#[async_trait]
impl QueryParser for StatementParser {
    type Statement = PgStatement;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<PgStatement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        check_size(sql)?;
        let mut prepared = statement::prepare(&self.shared.parser, sql).map_err(|e| to_pg(&e))?;
        if prepared.len() > 1 {
            let e = QueryError::new(
                QueryErrorKind::InvalidQuery {
                    message: "a prepared statement holds one statement: send them one at a time"
                        .into(),
                },
                "several statements in one Parse",
            );
            return Err(to_pg(&e));
        }
        let Some(p) = prepared.pop() else {
            return Ok(None);
        };
        match p {
            Prepared::Query(sql) => {
                let plan = self
                    .shared
                    .service
                    .plan(&sql)
                    .await
                    .map_err(|e| to_pg(&e))?;
                let schema: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
                let inferred = plan.get_parameter_types().unwrap_or_default();
                let count = inferred
                    .keys()
                    .filter_map(|k| k.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()))
                    .max()
                    .unwrap_or(0);
                let params = (1..=count)
                    .map(|n| {
                        inferred
                            .get(&format!("${n}"))
                            .cloned()
                            .flatten()
                            .and_then(|t| arrow_pg::datatypes::into_pg_type(&t).ok())
                            .unwrap_or(Type::UNKNOWN)
                    })
                    .collect();
                Ok(Some(PgStatement::Query {
                    sql,
                    schema,
                    params,
                }))
            }
            Prepared::Command(c) => Ok(Some(PgStatement::Command(c))),
            Prepared::Refused(e) => Err(to_pg(&e)),
        }
    }

    fn get_parameter_types(&self, stmt: &PgStatement) -> PgWireResult<Vec<Type>> {
        Ok(match stmt {
            PgStatement::Query { params, .. } => params.clone(),
            PgStatement::Command(_) => Vec::new(),
        })
    }

    fn get_result_schema(
        &self,
        stmt: &PgStatement,
        column_format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let format = column_format.cloned().unwrap_or_default();
        match stmt {
            PgStatement::Query { schema, .. } => fields(schema, &format, None),
            PgStatement::Command(c) => match show_schema(c) {
                Some(schema) => fields(&schema, &format, None),
                None => Ok(Vec::new()),
            },
        }
    }
}

#[async_trait]
impl ExtendedQueryHandler for Handler {
    type Statement = PgStatement;
    type QueryParser = StatementParser;

    fn query_parser(&self) -> Arc<StatementParser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<PgStatement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = PgStatement>,
        C::Error: std::fmt::Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let options = format_options(client);
        match &portal.statement.statement {
            PgStatement::Query {
                sql,
                params: inferred,
                ..
            } => {
                // The client's declared types win over the inferred ones.
                let declared = &portal.statement.parameter_types;
                let types: Vec<Type> = (0..declared.len().max(inferred.len()))
                    .map(|i| {
                        declared
                            .get(i)
                            .cloned()
                            .flatten()
                            .or_else(|| inferred.get(i).cloned())
                            .unwrap_or(Type::UNKNOWN)
                    })
                    .collect();
                let bound = params::bind(sql, portal, &types).map_err(|e| to_pg(&e))?;
                let started =
                    start(&self.shared.service, self.peer.as_deref(), &bound, None).await?;
                let response = streamed(started, &portal.result_column_format, &options)?;
                if max_rows > 0 {
                    // The portal sends `max_rows` at a time and keeps the rest suspended.
                    return Ok(Response::Query(response));
                }
                // Without a row limit pgwire's portal would collect every row before sending
                // one: send them here as they come, and let the portal send the tag.
                let mut data_rows = response.data_rows;
                let mut n = 0usize;
                while let Some(row) = data_rows.next().await {
                    client.feed(PgWireBackendMessage::DataRow(row?)).await?;
                    n += 1;
                }
                Ok(Response::Execution(Tag::new("SELECT").with_rows(n)))
            }
            PgStatement::Command(c) => self.command(c, &portal.result_column_format, &options),
        }
    }
}
