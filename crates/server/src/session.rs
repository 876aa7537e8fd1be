//! One client connection: its settings, statement routing, admission, and the pgwire handlers
//! (startup, simple and extended query). Routing, in order:
//! 1. workload DDL (`CREATE|DROP WORKLOAD|RESOURCE`) → the catalog;
//! 2. session settings (`SET|RESET|SHOW workload`, and other `SET`s clients send at connect);
//! 3. conveniences: `SHOW WORKLOADS`, `SHOW RESOURCES`, `SHOW CREATE WORKLOAD|RESOURCE name`;
//! 4. anything else: its `SETTINGS` tail is taken off, it is admitted through every QUERY
//!    resource's scheduler in its workload, then run by the engine.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::{stream, Sink, SinkExt, StreamExt};
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DescribePortalResponse, DescribeStatementResponse, FieldFormat, FieldInfo, QueryResponse,
    Response, Tag,
};
use pgwire::api::stmt::{NoopQueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, Type, METADATA_USER};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use sluice_engine::datafusion::arrow::array::StringArray;
use sluice_engine::datafusion::arrow::datatypes::{DataType, Field, Schema};
use sluice_engine::datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::datafusion::common::ScalarValue;
use sluice_engine::{first_keyword, QueryOutput, Session};
use sluice_sql::{parse_statement, split_settings, Error, ErrorCode, Literal, Result, Statement};

use crate::encode;
use crate::error::{from_engine, to_pg};
use crate::params;
use crate::state::{access_denied, shutting_down, Phase, Shared};

/// Query-level settings sluice honours (the `SETTINGS` tail).
#[derive(Debug, Default)]
struct QuerySettings {
    workload: Option<String>,
    max_threads: Option<usize>,
    max_execution_time: Option<Duration>,
}

const KNOWN_SETTINGS: &[&str] = &[
    "workload",
    "max_threads",
    "reserve_memory",
    "max_memory_usage",
    "max_execution_time",
    "use_concurrency_control",
];

fn query_settings(settings: &[(String, Literal)]) -> Result<QuerySettings> {
    let mut out = QuerySettings::default();
    for (name, value) in settings {
        if !KNOWN_SETTINGS.contains(&name.as_str()) {
            return Err(Error::new(
                ErrorCode::UnknownSetting,
                format!(
                    "Unknown setting '{name}'; sluice honours: {}",
                    KNOWN_SETTINGS.join(", ")
                ),
            ));
        }
        let number = || match value {
            Literal::UInt(v) => Ok(*v as f64),
            Literal::Float(v) if *v >= 0.0 => Ok(*v),
            Literal::String(s) => sluice_catalog::parse_with_size_suffix(s).map(|v| v as f64),
            other => Err(Error::new(
                ErrorCode::BadArguments,
                format!("setting '{name}' takes a number, got {other}"),
            )),
        };
        match name.as_str() {
            "workload" => match value {
                Literal::String(s) => out.workload = Some(s.clone()),
                other => {
                    return Err(Error::new(
                        ErrorCode::BadArguments,
                        format!("setting 'workload' takes a string, got {other}"),
                    ))
                }
            },
            "max_threads" => out.max_threads = Some(number()? as usize),
            "max_execution_time" => {
                let s = number()?;
                out.max_execution_time = (s > 0.0).then(|| Duration::from_secs_f64(s));
            }
            // Accepted and validated; they take effect with the memory and CPU resources.
            _ => {
                number()?;
            }
        }
    }
    Ok(out)
}

/// What a statement is, by its first words (comments skipped).
#[derive(Debug, PartialEq)]
enum Route {
    WorkloadDdl,
    SetVar {
        name: String,
        value: Option<String>,
    },
    ShowVar(String),
    ShowEntities(&'static str),
    ShowCreate,
    /// `BEGIN`, `COMMIT`, …: sluice runs each statement on its own (as autocommit); drivers
    /// that wrap statements in transactions get the tags they expect.
    Transaction(&'static str),
    Engine,
}

fn words(sql: &str, n: usize) -> Vec<String> {
    let head = first_keyword(sql);
    let start = sql.to_ascii_uppercase().find(&head).unwrap_or(0);
    sql[start..]
        .split(|c: char| c.is_whitespace() || c == ';' || c == '=')
        .filter(|w| !w.is_empty())
        .take(n)
        .map(|w| w.to_string())
        .collect()
}

fn route(sql: &str) -> Route {
    let w = words(sql, 4);
    let up: Vec<String> = w.iter().map(|s| s.to_ascii_uppercase()).collect();
    let is_entity = |s: Option<&String>| s.is_some_and(|s| s == "WORKLOAD" || s == "RESOURCE");
    match up.first().map(String::as_str) {
        Some("CREATE")
            if is_entity(up.get(1))
                || (up.get(1).is_some_and(|s| s == "OR") && is_entity(up.get(3))) =>
        {
            Route::WorkloadDdl
        }
        Some("DROP") if is_entity(up.get(1)) => Route::WorkloadDdl,
        Some("BEGIN") | Some("START") => Route::Transaction("BEGIN"),
        Some("COMMIT") | Some("END") => Route::Transaction("COMMIT"),
        Some("ROLLBACK") | Some("ABORT") => Route::Transaction("ROLLBACK"),
        Some("SHOW") if up.get(1).is_some_and(|s| s == "WORKLOADS") => {
            Route::ShowEntities("workloads")
        }
        Some("SHOW") if up.get(1).is_some_and(|s| s == "RESOURCES") => {
            Route::ShowEntities("resources")
        }
        Some("SHOW") if up.get(1).is_some_and(|s| s == "CREATE") && is_entity(up.get(2)) => {
            Route::ShowCreate
        }
        Some("SHOW")
            if up.get(1).is_some_and(|s| {
                !s.starts_with("DATAFUSION.") && s != "ALL" && s != "TABLES" && s != "COLUMNS"
            }) =>
        {
            Route::ShowVar(w[1].to_ascii_lowercase())
        }
        Some("RESET") if w.len() > 1 => Route::SetVar {
            name: w[1].to_ascii_lowercase(),
            value: None,
        },
        Some("SET") if w.len() > 1 && !up[1].starts_with("DATAFUSION.") => {
            let rest = sql.trim().trim_end_matches(';');
            let after_name = rest
                .split_once(&w[1][..])
                .map_or("", |(_, tail)| tail)
                .trim_start();
            let value = after_name
                .strip_prefix('=')
                .or_else(|| {
                    after_name
                        .strip_prefix("TO ")
                        .or_else(|| after_name.strip_prefix("to "))
                })
                .unwrap_or(after_name)
                .trim();
            let value = value.trim_matches('\'').trim_matches('"').to_string();
            let name = w[1].to_ascii_lowercase();
            Route::SetVar {
                value: (!value.eq_ignore_ascii_case("default")).then_some(value),
                name,
            }
        }
        _ => Route::Engine,
    }
}

/// Where a statement's notices go while it runs: the client, or nowhere.
#[async_trait]
pub trait Notices: Send {
    async fn notice(&mut self, text: String);
}

/// Notices dropped (`sluice local`).
#[derive(Debug)]
pub struct NoNotices;

#[async_trait]
impl Notices for NoNotices {
    async fn notice(&mut self, _text: String) {}
}

/// Notices sent to the client as NoticeResponse messages, at once (before the statement's
/// result), so psql prints them while the statement waits.
struct ClientNotices<'a, C>(&'a mut C);

#[async_trait]
impl<C> Notices for ClientNotices<'_, C>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
{
    async fn notice(&mut self, text: String) {
        let info = ErrorInfo::new("NOTICE".to_owned(), "00000".to_owned(), text);
        // A client gone away is noticed by the statement's own I/O; nothing to do here.
        let _ = self
            .0
            .send(PgWireBackendMessage::NoticeResponse(info.into()))
            .await;
    }
}

/// A connection's handlers and state.
pub struct Connection {
    shared: Arc<Shared>,
    session: Session,
    /// Session variables: `workload`, and whatever else clients `SET`.
    vars: Mutex<HashMap<String, String>>,
    manager: Arc<ConnectionManager>,
    parser: Arc<NoopQueryParser>,
}

impl Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

/// A result on its way to the client: rows (with what must stay held until they are sent) or
/// a command tag.
enum Outcome {
    Rows {
        schema: Arc<Schema>,
        batches: Vec<RecordBatch>,
        hold: Vec<Box<dyn Send + Sync>>,
    },
    Command(Tag),
}

impl Connection {
    pub fn new(shared: Arc<Shared>, manager: Arc<ConnectionManager>) -> Self {
        let session = shared.engine.session();
        Connection {
            shared,
            session,
            vars: Mutex::new(HashMap::new()),
            manager,
            parser: Arc::new(NoopQueryParser::new()),
        }
    }

    fn var(&self, name: &str) -> Option<String> {
        self.vars
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    fn set_var(&self, name: &str, value: Option<String>) {
        let mut vars = self.vars.lock().unwrap_or_else(|p| p.into_inner());
        match value {
            Some(v) => vars.insert(name.to_string(), v),
            None => vars.remove(name),
        };
    }

    async fn run(
        &self,
        user: &str,
        sql: &str,
        params: Vec<ScalarValue>,
        notices: &mut dyn Notices,
    ) -> Result<Outcome> {
        let route = route(sql);
        if !params.is_empty() && route != Route::Engine {
            return Err(Error::new(
                ErrorCode::BadArguments,
                "only queries take bind parameters; send this statement without them",
            ));
        }
        match route {
            Route::WorkloadDdl => {
                if !self.shared.users.is_admin(user) {
                    return Err(Error::new(
                        ErrorCode::AccessDenied,
                        format!("{user}: Not enough privileges. To change workloads and resources, the user needs admin = true in [[users]]"),
                    ));
                }
                let stmt = parse_statement(sql)?;
                self.shared.apply_ddl(&stmt).await?;
                let tag = match &stmt {
                    Statement::CreateWorkload(_) => "CREATE WORKLOAD",
                    Statement::CreateResource(_) => "CREATE RESOURCE",
                    Statement::Drop(d) => match d.kind {
                        sluice_sql::EntityKind::Workload => "DROP WORKLOAD",
                        sluice_sql::EntityKind::Resource => "DROP RESOURCE",
                    },
                };
                Ok(Outcome::Command(Tag::new(tag)))
            }
            Route::SetVar { name, value } => {
                if name == "workload" {
                    if let Some(v) = &value {
                        self.check_pinned(user, v)?;
                    }
                }
                self.set_var(&name, value);
                Ok(Outcome::Command(Tag::new(
                    if sql.trim_start().to_ascii_uppercase().starts_with("RESET") {
                        "RESET"
                    } else {
                        "SET"
                    },
                )))
            }
            Route::ShowVar(name) => {
                let value = if name == "workload" {
                    self.workload_of(user, None)?
                } else {
                    self.var(&name).unwrap_or_default()
                };
                Ok(one_column(&name, vec![value]))
            }
            Route::ShowEntities(kind) => {
                let snapshot = self.shared.snapshot();
                let names: Vec<String> = if kind == "workloads" {
                    snapshot
                        .catalog
                        .workloads()
                        .map(|w| w.name.clone())
                        .collect()
                } else {
                    snapshot
                        .catalog
                        .resources()
                        .map(|r| r.name.clone())
                        .collect()
                };
                Ok(one_column("name", names))
            }
            Route::ShowCreate => {
                let w = words(sql, 4);
                let name = w
                    .get(3)
                    .map(|n| n.trim_matches('`').trim_matches('"').to_string())
                    .unwrap_or_default();
                let snapshot = self.shared.snapshot();
                let stored = snapshot
                    .catalog
                    .get(&name)
                    .filter(|s| s.entity.kind().keyword().eq_ignore_ascii_case(&w[2]))
                    .ok_or_else(|| {
                        Error::new(
                            ErrorCode::ResourceNotFound,
                            format!("Workload entity '{name}' doesn't exist"),
                        )
                    })?;
                Ok(one_column(
                    "create_query",
                    vec![stored.entity.create_query()],
                ))
            }
            Route::Transaction(tag) => Ok(Outcome::Command(Tag::new(tag))),
            Route::Engine => self.run_query(user, sql, params, notices).await,
        }
    }

    /// The workload a query runs in: the `SETTINGS` tail's, else the session's, else the
    /// user's default, else `default` — unless the user is pinned to one.
    fn workload_of(&self, user: &str, requested: Option<String>) -> Result<String> {
        let requested = requested.or_else(|| self.var("workload"));
        let config = self.shared.users.get(user);
        if let Some(pinned) = config.and_then(|u| u.pinned_workload.as_ref()) {
            if let Some(r) = &requested {
                self.check_pinned(user, r)?;
            }
            return Ok(pinned.clone());
        }
        Ok(requested
            .or_else(|| config.and_then(|u| u.default_workload.clone()))
            .unwrap_or_else(|| "default".to_string()))
    }

    fn check_pinned(&self, user: &str, workload: &str) -> Result<()> {
        match self.shared.users.get(user).and_then(|u| u.pinned_workload.as_ref()) {
            Some(pinned) if pinned != workload => Err(Error::new(
                ErrorCode::SettingConstraintViolation,
                format!("Setting workload should not be changed: user '{user}' runs in workload '{pinned}' only"),
            )),
            _ => Ok(()),
        }
    }

    async fn run_query(
        &self,
        user: &str,
        sql: &str,
        params: Vec<ScalarValue>,
        notices: &mut dyn Notices,
    ) -> Result<Outcome> {
        let markup = split_settings(sql)?;
        let settings = query_settings(&markup.settings)?;
        let workload = self.workload_of(user, settings.workload.clone())?;
        if self.shared.phase() != Phase::Serving {
            return Err(shutting_down(self.shared.phase()));
        }
        // Declared before the guard so that, however the statement ends (an error, a cancel
        // dropping this future), the guard goes first and the permits after it.
        let mut hold: Vec<Box<dyn Send + Sync>> = Vec::new();
        let guard = self.shared.register(user, &workload, &markup.query);
        let snapshot = self.shared.snapshot();
        for (resource, scheduler) in &snapshot.schedulers {
            if !scheduler.has_workload(&workload) {
                if self.shared.options.throw_on_unknown_workload {
                    return Err(access_denied(resource));
                }
                continue;
            }
            let arrived = std::time::Instant::now();
            let series = self.shared.metrics.series(resource, &workload);
            let mut acquire = scheduler.acquire(&workload, 1).inspect_err(|e| {
                if e.code == ErrorCode::ServerOverloaded {
                    series.rejected();
                }
            })?;
            let counted_waiting = series.waiting();
            if !acquire.is_granted() {
                guard.waiting_for(Some(resource));
                notices
                    .notice(format!(
                        "waiting for resource '{resource}' in workload '{workload}' (queue {}); system.processes shows it as query_id {}",
                        acquire.queue_path(),
                        guard.query_id
                    ))
                    .await;
            }
            let permit = tokio::select! {
                permit = acquire => permit?,
                _ = self.shared.reached(Phase::Draining) => return Err(shutting_down(Phase::Draining)),
            };
            drop(counted_waiting);
            hold.push(Box::new(permit));
            hold.push(Box::new(series.admitted(arrived.elapsed())));
            guard.waiting_for(None);
        }
        guard.running();
        crate::system::refresh_if_mentioned(&self.shared, &markup.query)?;
        let execute = self
            .session
            .execute(&markup.query, settings.max_threads, params);
        let execute = async {
            tokio::select! {
                output = execute => output.map_err(|e| from_engine(&e)),
                _ = self.shared.reached(Phase::Terminating) => Err(shutting_down(Phase::Terminating)),
            }
        };
        let output = match settings.max_execution_time {
            Some(limit) => tokio::time::timeout(limit, execute).await.map_err(|_| {
                Error::new(
                    ErrorCode::TimeoutExceeded,
                    format!(
                        "Timeout exceeded: elapsed {:.3} seconds, maximum: {:.3}",
                        limit.as_secs_f64(),
                        limit.as_secs_f64()
                    ),
                )
            })?,
            None => execute.await,
        }?;
        // First in, so first dropped: the statement leaves system.processes before its
        // permits are released, and is never seen running beside its successor.
        hold.insert(0, Box::new(guard));
        Ok(match output {
            QueryOutput::Rows { schema, batches } => Outcome::Rows {
                schema,
                batches,
                hold,
            },
            QueryOutput::Command { tag, rows } => {
                let tag = Tag::new(&tag);
                Outcome::Command(match rows {
                    Some(n) => tag.with_rows(n),
                    None => tag,
                })
            }
        })
    }

    /// The result columns of a statement, without running it.
    async fn describe(&self, sql: &str) -> Result<Option<Arc<Schema>>> {
        Ok(match route(sql) {
            Route::WorkloadDdl | Route::SetVar { .. } | Route::Transaction(_) => None,
            Route::ShowVar(name) => Some(text_schema(&name)),
            Route::ShowEntities(_) => Some(text_schema("name")),
            Route::ShowCreate => Some(text_schema("create_query")),
            Route::Engine => {
                let markup = split_settings(sql)?;
                crate::system::refresh_if_mentioned(&self.shared, &markup.query)?;
                self.session
                    .describe(&markup.query)
                    .await
                    .map_err(|e| from_engine(&e))?
            }
        })
    }

    /// The Postgres type of each placeholder of a statement: as declared by the client, else
    /// as the planner infers it, else `text`.
    async fn parameter_types(&self, sql: &str, declared: &[Option<Type>]) -> Result<Vec<Type>> {
        let inferred = if route(sql) == Route::Engine {
            let markup = split_settings(sql)?;
            if markup.query.contains('$') {
                self.session
                    .parameter_types(&markup.query)
                    .await
                    .map_err(|e| from_engine(&e))?
            } else {
                Vec::new()
            }
        } else {
            // Not for the engine: announce the placeholders anyway, so the client binds and
            // hears from `run` that this statement takes none.
            vec![None; params::highest_placeholder(sql)]
        };
        Ok(params::resolve_types(declared, &inferred))
    }

    /// The row description of a statement, for Describe messages.
    async fn describe_fields(
        &self,
        sql: &str,
        format: impl Fn(usize) -> FieldFormat,
    ) -> PgWireResult<Vec<FieldInfo>> {
        Ok(match self.describe(sql).await.map_err(|e| to_pg(&e))? {
            Some(schema) => encode::fields(&schema, format),
            None => Vec::new(),
        })
    }

    fn respond(&self, outcome: Outcome, format: &Format) -> PgWireResult<Response> {
        match outcome {
            Outcome::Command(tag) => Ok(Response::Execution(tag)),
            Outcome::Rows {
                schema,
                batches,
                hold,
            } => {
                let fields = Arc::new(encode::fields(&schema, |i| format.format_for(i)));
                let rows = encode::rows(&batches, fields.clone())?;
                // The permits and the process entry live until the last row is sent.
                let stream = stream::iter(rows).map(move |row| {
                    let _held = &hold;
                    Ok(row)
                });
                Ok(Response::Query(QueryResponse::new(fields, stream)))
            }
        }
    }
}

fn text_schema(name: &str) -> Arc<Schema> {
    Arc::new(Schema::new(vec![Field::new(name, DataType::Utf8, true)]))
}

fn one_column(name: &str, values: Vec<String>) -> Outcome {
    let schema = text_schema(name);
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(values))]);
    Outcome::Rows {
        schema,
        batches: batch.into_iter().collect(),
        hold: Vec::new(),
    }
}

/// What one statement of a local script gave.
#[derive(Debug)]
pub enum LocalOutput {
    /// A command that succeeded.
    Ok,
    /// Rows: a header and each row's values as text (NULL as `\N`).
    Rows {
        header: Vec<String>,
        rows: Vec<Vec<String>>,
    },
}

impl Connection {
    /// Runs one statement outside the wire protocol (`sluice local`), with the same routing,
    /// admission and engine as a client connection.
    pub async fn run_local(&self, sql: &str) -> Result<LocalOutput> {
        use sluice_engine::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
        match self.run("local", sql, Vec::new(), &mut NoNotices).await? {
            Outcome::Command(_) => Ok(LocalOutput::Ok),
            Outcome::Rows {
                schema,
                batches,
                hold,
            } => {
                let options = FormatOptions::default().with_null("\\N");
                let header = schema.fields().iter().map(|f| f.name().clone()).collect();
                let mut rows = Vec::new();
                for batch in &batches {
                    let formatters: Vec<ArrayFormatter<'_>> = batch
                        .columns()
                        .iter()
                        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                        .collect::<std::result::Result<_, _>>()
                        .map_err(|e| Error::new(ErrorCode::InternalError, e.to_string()))?;
                    for row in 0..batch.num_rows() {
                        rows.push(
                            formatters
                                .iter()
                                .map(|f| f.value(row).to_string())
                                .collect(),
                        );
                    }
                }
                drop(hold);
                Ok(LocalOutput::Rows { header, rows })
            }
        }
    }
}

/// Splits a script into statements at top-level `;` (quotes and `--` comments respected).
pub fn script_statements(script: &str) -> Vec<String> {
    split_statements(script)
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn user_of<C: ClientInfo>(client: &C) -> String {
    client
        .metadata()
        .get(METADATA_USER)
        .cloned()
        .unwrap_or_default()
}

#[async_trait]
impl NoopStartupHandler for Connection {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.manager.clone())
    }

    async fn post_startup<C>(
        &self,
        client: &mut C,
        _message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.apply_startup_options(client.metadata());
        Ok(())
    }
}

impl Connection {
    /// `options=-c workload=x` (psql: PGOPTIONS, libpq: options=) sets the session's workload.
    pub fn apply_startup_options(&self, metadata: &HashMap<String, String>) {
        if let Some(options) = metadata.get("options").cloned() {
            let mut parts = options.split_whitespace();
            while let Some(part) = parts.next() {
                let assignment = if part == "-c" {
                    parts.next().unwrap_or("")
                } else {
                    part.trim_start_matches("--").trim_start_matches("-c")
                };
                if let Some((k, v)) = assignment.split_once('=') {
                    self.set_var(&k.to_ascii_lowercase(), Some(v.to_string()));
                }
            }
        }
    }
}

#[async_trait]
impl SimpleQueryHandler for Connection {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let user = user_of(client);
        let mut responses = Vec::new();
        // A simple query may hold several statements; each runs in turn, the first error stops.
        for statement in split_statements(query) {
            let outcome = self
                .run(&user, &statement, Vec::new(), &mut ClientNotices(client))
                .await
                .map_err(|e| to_pg(&e))?;
            responses.push(self.respond(outcome, &Format::UnifiedText)?);
        }
        Ok(responses)
    }
}

/// Splits a simple-protocol query at top-level `;` (quotes and comments respected).
fn split_statements(query: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = query.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        current.push(c);
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '\'' | '"' | '`' => quote = Some(c),
                '-' if chars.peek() == Some(&'-') => {
                    for c in chars.by_ref() {
                        current.push(c);
                        if c == '\n' {
                            break;
                        }
                    }
                }
                ';' => {
                    current.pop();
                    if !current.trim().is_empty() {
                        out.push(std::mem::take(&mut current));
                    }
                    current.clear();
                }
                _ => {}
            },
        }
    }
    if !current.trim().is_empty() {
        out.push(current);
    }
    out
}

#[async_trait]
impl ExtendedQueryHandler for Connection {
    type Statement = String;
    type QueryParser = NoopQueryParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let sql = &portal.statement.statement;
        let values = if portal.parameter_len() > 0 {
            let types = self
                .parameter_types(sql, &portal.statement.parameter_types)
                .await
                .map_err(|e| to_pg(&e))?;
            params::values(portal, &types)?
        } else {
            Vec::new()
        };
        let user = user_of(client);
        let outcome = self
            .run(&user, sql, values, &mut ClientNotices(client))
            .await
            .map_err(|e| to_pg(&e))?;
        self.respond(outcome, &portal.result_column_format)
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        stmt: &StoredStatement<Self::Statement>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
    {
        let params = self
            .parameter_types(&stmt.statement, &stmt.parameter_types)
            .await
            .map_err(|e| to_pg(&e))?;
        let fields = self
            .describe_fields(&stmt.statement, |_| FieldFormat::Text)
            .await?;
        Ok(DescribeStatementResponse::new(params, fields))
    }

    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        portal: &Portal<Self::Statement>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
    {
        let fields = self
            .describe_fields(&portal.statement.statement, |i| {
                portal.result_column_format.format_for(i)
            })
            .await?;
        Ok(DescribePortalResponse::new(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("create or replace workload x"), Route::WorkloadDdl);
        assert_eq!(route("  DROP RESOURCE r;"), Route::WorkloadDdl);
        assert_eq!(route("CREATE TABLE t (x int)"), Route::Engine);
        assert_eq!(
            route("SET workload = 'prod'"),
            Route::SetVar {
                name: "workload".into(),
                value: Some("prod".into())
            }
        );
        assert_eq!(
            route("set workload to dev"),
            Route::SetVar {
                name: "workload".into(),
                value: Some("dev".into())
            }
        );
        assert_eq!(
            route("RESET workload"),
            Route::SetVar {
                name: "workload".into(),
                value: None
            }
        );
        assert_eq!(route("SHOW workload"), Route::ShowVar("workload".into()));
        assert_eq!(route("SHOW WORKLOADS"), Route::ShowEntities("workloads"));
        assert_eq!(route("show create workload all"), Route::ShowCreate);
        assert_eq!(
            route("SET datafusion.execution.batch_size = 10"),
            Route::Engine
        );
        assert_eq!(route("SELECT 1 SETTINGS workload = 'x'"), Route::Engine);
        assert_eq!(route("begin"), Route::Transaction("BEGIN"));
        assert_eq!(route("START TRANSACTION"), Route::Transaction("BEGIN"));
        assert_eq!(route("COMMIT;"), Route::Transaction("COMMIT"));
    }

    #[test]
    fn statements_split_outside_quotes() {
        assert_eq!(
            split_statements("select 1; select ';'; -- x;\n select 2"),
            ["select 1", " select ';'", " -- x;\n select 2"]
        );
    }
}
