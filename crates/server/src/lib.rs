//! # sluice-server: the Postgres-wire server
//!
//! Layout, top down (a module imports only from those below it; `cargo` sees no circle):
//! - [`serve`] (here): the accept loop; one [`session::Connection`] (handlers and state) per
//!   client; a cancel request stops the connection's statement through its `registry::Control`
//!   (waiting, running or forwarded) and through pgwire's connection manager.
//! - [`wire`]: the connection loop: start-up, then each message to pgwire's handlers or, in
//!   upstream mode, to the [`forward::Forwarder`].
//! - [`forward`]: upstream mode's conversation, every message that is not sluice's own
//!   forwarded at the message level, admitted like an engine query: the forwarder's state and
//!   batches (`forward.rs`), routing (`forward/routing.rs`), the bytes sent upstream
//!   (`forward/translate.rs`), the answers relayed (`forward/relay.rs`).
//! - [`session`]: routing of each statement (workload DDL, session settings, conveniences,
//!   engine queries) on `sluice_sql`'s statement model, rows streamed from the engine
//!   (`session.rs`); admission, one piece for both paths — workload choice, classifiers, lanes,
//!   QUERY, memory and CPU schedulers, the statement's stop and notices
//!   (`session/admit.rs`); a connection's start-up after its login (`session/startup.rs`).
//!   [`http`]: `/metrics` and the live page.
//! - [`operator`] (`KILL`/`MOVE QUERY`, signals), [`page`] (the live page's figures),
//!   [`system`] (the `system.*` tables), [`record`] (a statement's query-log row and lane
//!   runs), [`lease`] (CPU slots' leases under `cpu_slot_preemption`), [`demotion`] (the soft
//!   deadline's timer), [`disk_gate`] (where a statement's file IO waits), [`fleet`] (joining
//!   a fleet, following its catalog, keeping this node's shares of the QUERY limits),
//!   [`fleet_views`] (`clusterAllReplicas` over the system tables; this node's tables for
//!   the other nodes' requests, which `serve` answers), [`fleet_demand`] (the demand text a
//!   node publishes, and how `system.nodes` shows it): each reads the shared state.
//! - [`state`]: what connections share: engine, catalog snapshot + trees + schedulers, storage,
//!   the registry of statements in flight; it assembles the parts below.
//! - Below it, knowing nothing of `Shared`: [`registry`] (what is in flight: a statement's
//!   `Process` entry, its `Grant` and `Attachment`s, its `Control`, the `Flag` signal, cancel
//!   keys — the map of them is `Shared`'s), [`upstream`] (its options and pools),
//!   [`params`] (bind parameters), [`lanes`] (the learned lanes' book), [`query_log`],
//!   [`metrics`] (the registry of series), [`admission_log`], [`disks`] (which disk holds a file), [`memory`],
//!   [`settings`] (query and start-up settings as sluice reads them), [`frame`] (the wire's
//!   framing: messages read whole, writes batched per response), [`watch`], [`threads`],
//!   [`auth`], [`encode`] (Arrow results as Postgres rows), [`error`] (the one mapping of
//!   errors to SQLSTATE and message).
//!
//! Invariants:
//! - Shutdown drains: once it begins no statement starts, waiting ones fail with 57P01, and
//!   running ones get `shutdown_grace` before they are stopped.
//! - DDL is applied one statement at a time, persisted before it is published.
//! - A query's permits and its `system.processes` entry are released when its response has
//!   been sent, or when it is cancelled or its client goes away (the connection's watch
//!   drops the statement while it waits or runs; a failed write drops it while it streams).
//! - The server knows engines only through `sluice_engine`'s `Engine` and `Session` traits;
//!   their work runs on the engine's threads, never on the runtime serving sockets.
//!
//! `auth` knows a connection only as the start-up handler it hands a logged-in client to;
//! `metrics` is a registry, served by `http`, not read from `Shared`.
//!
//! Holds no scheduling logic: that is `sluice-sched`'s.

pub mod admission_log;
pub mod admit;
pub mod auth;
pub mod demotion;
pub mod disk_gate;
pub mod disks;
pub mod encode;
pub mod error;
pub mod fleet;
pub mod fleet_demand;
pub mod fleet_views;
pub mod forward;
pub mod frame;
pub mod http;
pub mod lanes;
pub mod lease;
pub mod memory;
pub mod metrics;
pub mod operator;
pub mod page;
pub mod params;
pub mod query_log;
pub mod record;
pub mod registry;
pub mod session;
pub mod settings;
pub mod simulate;
pub mod state;
pub mod system;
pub mod threads;
pub mod upstream;
pub mod watch;
pub mod wire;

use std::future::Future;
use std::sync::Arc;

use pgwire::api::cancel::CancelHandler;
use pgwire::api::{ConnectionManager, PgWireServerHandlers};
use pgwire::messages::cancel::CancelRequest;
use tokio::net::TcpListener;

use auth::Startup;

pub use session::{script_statements, Connection, LocalOutput};
pub use state::{CpuSlotOptions, Phase, ServerOptions, Shared};

/// A connection that is not on the wire, for running scripts in process (`sluice local`).
pub fn local_connection(shared: Arc<Shared>) -> Connection {
    Connection::new(
        shared,
        Arc::new(ConnectionManager::new()),
        watch::ClientWatch::none(),
    )
}

struct Handlers {
    connection: Arc<Connection>,
    startup: Arc<Startup<Connection>>,
    cancel: Arc<Cancels>,
}

/// Cancel requests: pgwire's (which stops a statement until its response starts) and the
/// server's own signal, which stops a statement whose rows are streaming.
#[derive(Debug)]
struct Cancels {
    manager: Arc<ConnectionManager>,
    shared: Arc<Shared>,
}

#[async_trait::async_trait]
impl CancelHandler for Cancels {
    async fn on_cancel_request(&self, request: CancelRequest) {
        self.shared
            .registry
            .cancel(&(request.pid, request.secret_key.to_bytes().to_vec()));
        self.manager.cancel(request.pid, &request.secret_key).await;
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl pgwire::api::query::SimpleQueryHandler> {
        self.connection.clone()
    }
    fn extended_query_handler(&self) -> Arc<impl pgwire::api::query::ExtendedQueryHandler> {
        self.connection.clone()
    }
    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        self.startup.clone()
    }
    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        self.cancel.clone()
    }
}

/// Shuts down in order: no new statements (waiting ones fail with 57P01), running ones get
/// the grace period, then what still runs is stopped (57P01) and given a moment to answer.
async fn drain(shared: &Shared) {
    shared.set_phase(Phase::Draining);
    let grace = shared.options.shutdown_grace;
    if tokio::time::timeout(grace, shared.idle()).await.is_err() {
        tracing::warn!(
            "grace period of {} ms over; stopping the statements still running",
            grace.as_millis()
        );
        shared.set_phase(Phase::Terminating);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), shared.idle()).await;
    }
}

pub use fleet::join_fleet;

/// What this node answers the other nodes of its fleet with (`sluice_cluster::Requests`):
/// `table` (one of its system tables: `fleet_views`), `kill` and `move` (its statements:
/// `operator`).
fn fleet_answers(shared: std::sync::Weak<Shared>) -> sluice_cluster::Handler {
    Arc::new(move |what: String, body: Vec<u8>| {
        let shared = shared.clone();
        Box::pin(async move {
            let shared = shared.upgrade().ok_or("the node is shutting down")?;
            let body = String::from_utf8_lossy(&body).into_owned();
            match what.as_str() {
                "table" => fleet_views::table_bytes(&shared, &body).map_err(|e| e.message),
                "kill" | "move" => operator::answer(&shared, &what, &body)
                    .await
                    .map(String::into_bytes)
                    .map_err(|e| e.message),
                other => Err(format!(
                    "unknown request '{other}' (a node of another version?)"
                )),
            }
        }) as FleetAnswer
    })
}

/// One answer of [`fleet_answers`], on its way.
type FleetAnswer =
    std::pin::Pin<Box<dyn Future<Output = std::result::Result<Vec<u8>, String>> + Send>>;

/// Serves clients from `listener` until `shutdown` completes, then drains (see [`drain`]).
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let manager = Arc::new(ConnectionManager::new());
    let cancel = Arc::new(Cancels {
        manager: manager.clone(),
        shared: shared.clone(),
    });
    let threads = threads::ConnectionThreads::start(shared.options.connection_threads)?;
    tokio::pin!(shutdown);
    // The system tables exist from the start, so a client listing the catalog (psql's
    // `\dt system.*`) finds them before anything has read one.
    if let Err(e) = system::refresh(&shared) {
        tracing::warn!("system tables not published: {e}");
    }
    if shared.fleet.get().is_none() {
        let address = listener.local_addr()?.to_string();
        join_fleet(&shared, &address)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    if let Some(fleet) = shared.fleet.get() {
        let requests = fleet.requests();
        let answers = fleet_answers(Arc::downgrade(&shared));
        tokio::spawn(async move { requests.answer(answers).await });
    }
    if let Some(upstream) = &shared.upstream {
        upstream.probe().await;
        if let Some(idle_for) = upstream.options.server_idle_timeout {
            tokio::spawn(upstream::close_idle_connections(upstream.clone(), idle_for));
        }
    }
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                drain(&shared).await;
                if let Some(fleet) = shared.fleet.get() {
                    fleet.leave().await;
                }
                return Ok(());
            }
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        continue;
                    }
                };
                // Handed to its thread unregistered; registered with that thread's runtime.
                let socket = match socket.into_std() {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("connection from {peer} not served: {e}");
                        continue;
                    }
                };
                let (shared, manager, cancel) = (shared.clone(), manager.clone(), cancel.clone());
                threads.spawn(async move {
                    let socket = match tokio::net::TcpStream::from_std(socket) {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!("connection from {peer} not served: {e}");
                            return;
                        }
                    };
                    let watch = watch::ClientWatch::new(&socket);
                    let connection = Arc::new(
                        Connection::new(shared.clone(), manager.clone(), watch).with_peer(peer),
                    );
                    let terminate = connection.admission.terminate.clone();
                    // Upstream mode: the connection's loop forwards what is not sluice's own.
                    let forwarding = shared.upstream.as_ref().map(|u| {
                        (forward::Forwarder::new(u.clone()), connection.clone())
                    });
                    let handlers = Arc::new(Handlers {
                        startup: Arc::new(Startup::new(
                            &shared.logins,
                            shared.tls_cert_pem.clone(),
                            connection.clone(),
                        )),
                        connection,
                        cancel,
                    });
                    let tls = shared.tls.clone();
                    tracing::debug!("connection from {peer}");
                    if let Err(e) = wire::process_connection(socket, tls, handlers, terminate, forwarding).await {
                        tracing::debug!("connection from {peer} ended: {e}");
                    }
                });
            }
        }
    }
}
