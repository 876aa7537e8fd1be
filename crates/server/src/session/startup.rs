//! A connection's start-up, after its login: the start-up options, the session's parameters
//! as the embedded engine or the upstream takes them, its process id, and the messages that
//! end a start-up, in PostgreSQL's order.

use super::*;

/// Process ids sluice gives clients that have no upstream backend of their own (the embedded
/// engine, transaction pooling): from 2^22 up, above every pid Linux hands out, so that none
/// is also an upstream backend's pid, which session pooling gives its clients.
static SLUICE_PIDS: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1 << 22);

#[async_trait]
impl StartupHandler for Connection {
    /// A trusted client's start-up, or a logged-in one's (`auth::Startup` hands it here):
    /// the start-up options, the session's parameters as the engine or the upstream takes
    /// them, the process id, then AuthenticationOk, ParameterStatus, BackendKeyData and
    /// ReadyForQuery, as PostgreSQL sends them. In session pooling the client's upstream
    /// backend is taken now, and its pid is the client's: BackendKeyData, `pg_backend_pid()`
    /// and a notification's sender all say the same pid, as going direct.
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let PgWireFrontendMessage::Startup(startup) = message else {
            return Ok(());
        };
        protocol_negotiation(client, &startup).await?;
        save_startup_parameters_to_metadata(client, &startup);
        self.apply_startup_options(client.metadata());
        // In upstream mode the client sees the upstream's parameters (its server_version
        // above all: psql and drivers choose their catalog queries by it), with its own
        // start-up parameters in place as the upstream took them.
        let (parameters, warnings, backend) = match &self.shared.upstream {
            Some(upstream) => {
                let keys = client
                    .session_extensions()
                    .get::<sluice_engine::upstream::ScramKeys>();
                let keep = upstream.options.pool_mode == crate::upstream::PoolMode::Session;
                let (parameters, backend) = upstream
                    .start_session(client.metadata(), keys.as_deref(), keep)
                    .await
                    .map_err(|refused| crate::upstream::fatal_from(&refused))?;
                (parameters, Vec::new(), backend)
            }
            None => {
                let (parameters, warnings) = self.embedded_start().await.map_err(|e| {
                    PgWireError::UserError(Box::new(ErrorInfo::new(
                        "FATAL".to_owned(),
                        e.sqlstate().to_owned(),
                        e.to_string(),
                    )))
                })?;
                (parameters, warnings, None)
            }
        };
        let (_, secret) = RandomPidSecretKeyGenerator::default().generate(client);
        let pid = backend
            .as_ref()
            .and_then(|b| b.backend_pid())
            .unwrap_or_else(|| SLUICE_PIDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        client.set_pid_and_secret_key(pid, secret.clone());
        let (handle, guard) = self.manager.register(pid, secret.clone());
        let _ = self.cancel_handle.set(handle.clone());
        client
            .session_extensions()
            .insert::<Arc<ConnectionHandle>>(handle);
        client.session_extensions().insert::<ConnectionGuard>(guard);
        if let Some(backend) = backend {
            client
                .session_extensions()
                .insert(crate::upstream::SessionBackend::new(backend));
        }
        client
            .feed(PgWireBackendMessage::Authentication(Authentication::Ok))
            .await?;
        let mut all = DefaultServerParameterProvider::default()
            .server_parameters(client)
            .unwrap_or_default();
        for (name, value) in parameters {
            all.insert(name, value);
        }
        let mut all: Vec<_> = all.into_iter().collect();
        all.sort();
        for (name, value) in all {
            client
                .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                    name, value,
                )))
                .await?;
        }
        client
            .feed(PgWireBackendMessage::BackendKeyData(BackendKeyData::new(
                pid, secret,
            )))
            .await?;
        for warning in warnings {
            let info = ErrorInfo::new("WARNING".to_owned(), "01000".to_owned(), warning);
            client
                .feed(PgWireBackendMessage::NoticeResponse(info.into()))
                .await?;
        }
        client
            .send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(
                TransactionStatus::Idle,
            )))
            .await?;
        client.set_state(PgWireConnectionState::ReadyForQuery);
        Ok(())
    }
}

impl Connection {
    /// What a client is told of the server at start-up besides pgwire's defaults: the
    /// upstream's parameters, or the embedded engine's version.
    pub(super) fn server_parameters(&self) -> Vec<(String, String)> {
        self.shared
            .upstream
            .as_ref()
            .map(|u| u.parameters())
            .unwrap_or_else(|| {
                vec![(
                    "server_version".to_string(),
                    sluice_engine::pg_catalog::server_version(),
                )]
            })
    }

    /// `options=-c workload=x` (psql: PGOPTIONS, libpq: options=) sets the session's workload.
    pub(super) fn apply_startup_options(&self, metadata: &HashMap<String, String>) {
        if let Some(database) = metadata.get("database") {
            self.admission.set_database(database);
        }
        if let Some(name) = metadata.get("application_name") {
            self.admission
                .set_var("application_name", Some(name.clone()));
        }
        // Run-time parameters given as start-up keys (psql's PGTZ, PGDATESTYLE), then as
        // `-c` options, which PostgreSQL applies after them.
        for (name, value) in metadata {
            if matches!(
                name.to_ascii_lowercase().as_str(),
                "timezone" | "datestyle" | "intervalstyle"
            ) {
                self.admission
                    .set_var(&name.to_ascii_lowercase(), Some(value.clone()));
            }
        }
        if let Some(options) = metadata.get("options") {
            for (name, value) in startup_settings(options) {
                self.admission.set_var(&name, Some(value));
            }
        }
    }
}

/// The styles the embedded engine prints dates and intervals in (PostgreSQL's defaults).
const EMBEDDED_DATE_STYLE: &str = "ISO, MDY";
const EMBEDDED_INTERVAL_STYLE: &str = "postgres";

impl Connection {
    /// The embedded engine's answer to a start-up's run-time parameters: its `TimeZone` is
    /// the session's (an unknown one refuses the start-up with FATAL 22023, as PostgreSQL
    /// does); a `DateStyle` or `IntervalStyle` the engine does not print in is not taken
    /// silently: a WARNING says what the session shows instead. Returns the parameters to
    /// report, and the warnings.
    pub(super) async fn embedded_start(&self) -> Result<(Vec<(String, String)>, Vec<String>)> {
        let mut reported = self.server_parameters();
        let mut warnings = Vec::new();
        if let Some(zone) = self.admission.var("timezone") {
            self.session().set_time_zone(&zone).await?;
            reported.push(("TimeZone".to_string(), zone));
        }
        for (name, var, shown) in [
            ("DateStyle", "datestyle", EMBEDDED_DATE_STYLE),
            ("IntervalStyle", "intervalstyle", EMBEDDED_INTERVAL_STYLE),
        ] {
            if let Some(asked) = self.admission.var(var) {
                if !shown
                    .to_ascii_lowercase()
                    .starts_with(&asked.to_ascii_lowercase())
                {
                    warnings.push(format!(
                        "{name} '{asked}' is not one the embedded engine prints in; this session shows {shown}"
                    ));
                }
                self.admission.set_var(var, Some(shown.to_string()));
            }
            reported.push((name.to_string(), shown.to_string()));
        }
        Ok((reported, warnings))
    }
}
