//! What all connections share: the engine, the catalog snapshot with its compiled trees and
//! the running schedulers, storage, and the registry of statements in flight.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::auth::{tls_acceptor, User, Users};
use sluice_catalog::{config_layer, Catalog, DiskStorage};
use sluice_engine::{Embedded, Engine};
use sluice_sched::{
    compile, recompile, Machine, MemoryScheduler, ResourceScheduler, SchedulerTrees, TokioClock,
};
use sluice_sql::{CostUnit, Error, ErrorCode, Result, Statement};

pub use crate::registry::{
    Attachment, CancelKey, Classified, Control, Flag, Grant, Process, ProcessGuard, Registry,
};

/// How the server was asked to run.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub data_dir: std::path::PathBuf,
    pub machine: Machine,
    /// Queries in a workload the catalog does not know fail with RESOURCE_ACCESS_DENIED
    /// (otherwise they run without limits).
    pub throw_on_unknown_workload: bool,
    /// The read-only catalog layer from the config file.
    pub config_statements: String,
    /// `[[users]]`; empty: trust mode (loopback only).
    pub users: Vec<User>,
    /// `[tls]`: certificate and key PEM files.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// After SIGTERM/SIGINT, how long running statements may finish before they are stopped.
    pub shutdown_grace: std::time::Duration,
    /// `[disks]`: the disks `READ DISK`/`WRITE DISK` resources name, by name.
    pub disks: BTreeMap<String, std::path::PathBuf>,
    /// `cpu_slot_*` server settings, for the CPU resource.
    pub cpu_slots: CpuSlotOptions,
    /// Tests only (no config reaches it): gates `sluice_barrier(name)` waits on, so a test
    /// holds a query running exactly as long as it needs.
    pub barriers: Option<sluice_engine::Barriers>,
    /// `server.query_log_size`: rows `system.query_log` keeps.
    pub query_log_size: usize,
    /// `server.strict_clickhouse`: workload DDL using sluice's own settings is refused, so the
    /// catalog stays one ClickHouse 26.9 can load.
    pub strict_clickhouse: bool,
    /// `server.engine_memory_ratio`: the share of `machine.memory` the engine's queries may
    /// hold together ([`DEFAULT_ENGINE_MEMORY_RATIO`] by default).
    pub engine_memory_ratio: f64,
    /// `[upstream]` / `--upstream`: statements that are not sluice's own are forwarded there
    /// (`None`: the embedded engine runs them).
    pub upstream: Option<crate::upstream::UpstreamOptions>,
    /// `server.connection_threads`: threads client connections run on, a runtime each
    /// ([`crate::threads`]); 0 runs them on the runtime `serve` is called on.
    pub connection_threads: usize,
    /// `server.admission_log`: where every QUERY slot granted and given back is logged.
    pub admission_log: Option<std::path::PathBuf>,
    /// `[cluster]`: the fleet on etcd this node joins (`None`: it runs alone).
    pub cluster: Option<sluice_cluster::ClusterOptions>,
}

/// The share of the machine's memory the engine may use when the config says nothing: the
/// rest is the server's own (connections, the catalog, result buffers) and the system's.
pub const DEFAULT_ENGINE_MEMORY_RATIO: f64 = 0.8;

/// ClickHouse's `cpu_slot_preemption`, `cpu_slot_quantum_ns`, `cpu_slot_preemption_timeout_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSlotOptions {
    pub preemption: bool,
    pub quantum_ns: u64,
    pub preemption_timeout_ms: u64,
}

impl Default for CpuSlotOptions {
    fn default() -> Self {
        CpuSlotOptions {
            preemption: false,
            quantum_ns: 10_000_000,
            preemption_timeout_ms: 1000,
        }
    }
}

/// Where the server is in its life. Ordered: each phase follows the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Serving,
    /// Shutting down: no statement starts, waiting ones fail with 57P01, running ones may
    /// finish within the grace period.
    Draining,
    /// The grace period is over: running statements are stopped (57P01).
    Terminating,
}

impl ServerOptions {
    /// Defaults for everything but where the data lives and what the machine is.
    pub fn new(data_dir: impl Into<std::path::PathBuf>, machine: Machine) -> ServerOptions {
        ServerOptions {
            data_dir: data_dir.into(),
            machine,
            throw_on_unknown_workload: false,
            config_statements: String::new(),
            users: Vec::new(),
            tls: None,
            shutdown_grace: std::time::Duration::from_secs(30),
            disks: BTreeMap::new(),
            cpu_slots: CpuSlotOptions::default(),
            barriers: None,
            query_log_size: crate::query_log::DEFAULT_SIZE,
            strict_clickhouse: false,
            engine_memory_ratio: DEFAULT_ENGINE_MEMORY_RATIO,
            upstream: None,
            connection_threads: 0,
            admission_log: None,
            cluster: None,
        }
    }

    /// Bytes the engine's queries may hold together.
    pub fn engine_memory(&self) -> usize {
        (self.machine.memory as f64 * self.engine_memory_ratio.clamp(0.0, 1.0)) as usize
    }
}

/// One catalog version and everything derived from it. Immutable; a change publishes a new one.
#[derive(Debug)]
pub struct Snapshot {
    pub catalog: Catalog,
    pub trees: SchedulerTrees,
    /// A running scheduler per QUERY, CPU and IO resource.
    pub schedulers: BTreeMap<String, ResourceScheduler>,
    /// Which resource plays which part in a statement's admission, read once per catalog.
    pub roles: Roles,
    /// The schedulers of `roles`' query, master and worker resources, looked up once here
    /// (every statement asks for them).
    parts: Parts,
    /// A running scheduler per MEMORY RESERVATION resource (at most one, the catalog's rule).
    pub memory: BTreeMap<String, MemoryScheduler>,
    /// In a fleet: the version of the fleet's catalog (etcd's revision of its last change)
    /// this snapshot reflects, which a DDL validated against it compares; 0 alone.
    pub fleet_version: i64,
}

/// The resources covering `QUERY`, `MASTER THREAD` and `WORKER THREAD` (at most one each, the
/// catalog's rule; master and worker may be one resource), and whether any covers a disk.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Roles {
    pub query: Option<Arc<str>>,
    pub master: Option<Arc<str>>,
    pub worker: Option<Arc<str>>,
    pub disk_io: bool,
}

/// A resource that plays a part in admission, with its scheduler.
type Part = Option<(Arc<str>, ResourceScheduler)>;

/// The schedulers of [`Roles`]' resources.
#[derive(Debug)]
struct Parts {
    query: Part,
    master: Part,
    worker: Part,
}

impl Roles {
    fn of(catalog: &Catalog) -> Roles {
        use sluice_sql::ResourceOperation as Op;
        let mut out = Roles::default();
        for resource in catalog.resources() {
            for op in &resource.operations {
                let name = Some(Arc::from(resource.name.as_str()));
                match op {
                    Op::Query => out.query = name,
                    Op::MasterThread => out.master = name,
                    Op::WorkerThread => out.worker = name,
                    Op::Read(_) | Op::Write(_) => out.disk_io = true,
                    Op::MemoryReservation => {}
                }
            }
        }
        out
    }
}

impl Snapshot {
    fn new(
        catalog: Catalog,
        trees: SchedulerTrees,
        previous: Option<&Snapshot>,
        fleet: Option<&Arc<sluice_sched::Fence>>,
    ) -> Snapshot {
        let schedulers = schedulers(&trees, previous, fleet);
        let memory = memory_schedulers(&trees, previous);
        let roles = Roles::of(&catalog);
        let part = |role: &Option<Arc<str>>| {
            let name = role.as_ref()?;
            Some((name.clone(), schedulers.get(&**name)?.clone()))
        };
        let parts = Parts {
            query: part(&roles.query),
            master: part(&roles.master),
            worker: part(&roles.worker),
        };
        Snapshot {
            catalog,
            trees,
            schedulers,
            roles,
            parts,
            memory,
            fleet_version: previous.map_or(0, |p| p.fleet_version),
        }
    }

    fn part(part: &Part) -> Option<(&Arc<str>, &ResourceScheduler)> {
        part.as_ref().map(|(name, scheduler)| (name, scheduler))
    }

    /// The QUERY resource a statement takes a slot of before it starts (then its memory
    /// reservation, then its master thread: see `Session::admit_and_run`).
    pub fn query_slot(&self) -> Option<(&Arc<str>, &ResourceScheduler)> {
        Self::part(&self.parts.query)
    }

    /// The master-thread resource and its scheduler.
    pub fn master(&self) -> Option<(&Arc<str>, &ResourceScheduler)> {
        Self::part(&self.parts.master)
    }

    /// The resource that grants worker threads, and its scheduler.
    pub fn workers(&self) -> Option<(&Arc<str>, &ResourceScheduler)> {
        Self::part(&self.parts.worker)
    }
}

pub struct Shared {
    pub engine: Arc<dyn Engine>,
    pub options: ServerOptions,
    pub users: Arc<Users>,
    /// How clients log in: `users`, and the upstream's roles with `auth_query`.
    pub logins: Arc<crate::auth::Logins>,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The `[tls]` certificate (PEM), for SCRAM channel binding (`tls-server-end-point`).
    pub tls_cert_pem: Option<Arc<Vec<u8>>>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Learned lanes, by statement fingerprint.
    pub lanes: crate::lanes::LaneBook,
    pub query_log: crate::query_log::QueryLog,
    /// `[disks]`, resolved: where IO resources schedule file reads and writes.
    pub disks: crate::disks::Disks,
    /// Upstream mode's database, its pool and parameters.
    pub upstream: Option<Arc<crate::upstream::Upstream>>,
    /// This node's place in its fleet, once `serve` has joined it (`[cluster]`).
    pub fleet: std::sync::OnceLock<sluice_cluster::Membership>,
    /// In a fleet: the catalog in etcd, and the revision of the last change applied here.
    pub fleet_catalog: std::sync::OnceLock<FleetCatalog>,
    /// In a fleet: until when this node may use its shares of the QUERY resource's limits
    /// (every QUERY scheduler is in the fleet behind it: see `crate::fleet`).
    pub fleet_fence: std::sync::OnceLock<Arc<sluice_sched::Fence>>,
    /// In a fleet: the demand and shares every node published, as the watch last showed them.
    pub fleet_view: std::sync::OnceLock<tokio::sync::watch::Receiver<sluice_cluster::FleetView>>,
    /// `server.admission_log`, open.
    pub admission_log: Option<Arc<crate::admission_log::AdmissionLog>>,
    storage: DiskStorage,
    current: RwLock<Arc<Snapshot>>,
    /// DDL is applied one statement at a time.
    ddl: tokio::sync::Mutex<()>,
    /// The statements in flight and the connections cancel requests may reach.
    pub registry: Arc<Registry>,
    phase: tokio::sync::watch::Sender<Phase>,
}

impl Shared {
    /// Loads the catalog (config layer, then the data dir) and compiles it.
    pub fn open(options: ServerOptions) -> Result<Arc<Shared>> {
        let base = config_layer(&options.config_statements)?;
        let storage = DiskStorage::open(&options.data_dir)?;
        let catalog = storage.load(base)?;
        let trees = compile(&catalog, options.machine)?;
        let users = Arc::new(Users::new(options.users.clone())?);
        let (tls, tls_cert_pem) = match &options.tls {
            Some((cert, key)) => (
                Some(tls_acceptor(cert, key)?),
                crate::auth::channel_binding_cert(cert),
            ),
            None => (None, None),
        };
        let mut engine = Embedded::new(options.engine_memory()).map_err(|e| {
            Error::new(
                ErrorCode::InternalError,
                format!("cannot start the engine's threads: {e}"),
            )
        })?;
        if let Some(barriers) = &options.barriers {
            engine = engine.with_barriers(barriers.clone());
        }
        let lanes = crate::lanes::LaneBook::open(&options.data_dir)?;
        let query_log = crate::query_log::QueryLog::new(options.query_log_size);
        let upstream = options
            .upstream
            .clone()
            .map(|u| Arc::new(crate::upstream::Upstream::new(u)));
        let logins = Arc::new(crate::auth::Logins {
            users: users.clone(),
            upstream: upstream
                .clone()
                .filter(|u| u.options.auth_query.is_some())
                .map(|u| u as Arc<dyn crate::auth::VerifierLookup>),
        });
        let admission_log = match &options.admission_log {
            Some(path) => {
                let node = options
                    .cluster
                    .as_ref()
                    .map_or("local", |c| c.node.as_str());
                Some(
                    crate::admission_log::AdmissionLog::open(path, node).map_err(|e| {
                        Error::new(
                            ErrorCode::BadArguments,
                            format!("server.admission_log {}: {e}", path.display()),
                        )
                    })?,
                )
            }
            None => None,
        };
        Ok(Arc::new(Shared {
            admission_log,
            engine: Arc::new(engine),
            lanes,
            query_log,
            disks: crate::disks::Disks::new(&options.disks),
            upstream,
            fleet: std::sync::OnceLock::new(),
            fleet_catalog: std::sync::OnceLock::new(),
            fleet_fence: std::sync::OnceLock::new(),
            fleet_view: std::sync::OnceLock::new(),
            users,
            logins,
            tls,
            tls_cert_pem,
            metrics: Arc::default(),
            options,
            storage,
            current: RwLock::new(Arc::new(Snapshot::new(catalog, trees, None, None))),
            ddl: tokio::sync::Mutex::new(()),
            registry: Arc::default(),
            phase: tokio::sync::watch::Sender::new(Phase::Serving),
        }))
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Validates, persists and publishes one workload DDL statement. In a fleet the change is
    /// stored in etcd instead (compared on the version it was validated against), and this
    /// node publishes it when its follower applies it, as every node does; the statement
    /// returns once it has.
    pub async fn apply_ddl(&self, stmt: &Statement) -> Result<()> {
        if self.options.strict_clickhouse {
            sluice_catalog::strict::refuse_extensions(stmt)?;
        }
        if let Some(fleet) = self.fleet_catalog.get() {
            let applied = self.apply_fleet_ddl(fleet, stmt).await;
            if applied
                .as_ref()
                .is_err_and(|e| e.code == ErrorCode::KeeperException)
            {
                self.metrics
                    .fleet
                    .ddl_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            return applied;
        }
        let _serial = self.ddl.lock().await;
        let current = self.snapshot();
        let (catalog, change) = current.catalog.apply(stmt)?;
        let Some(change) = change else { return Ok(()) };
        // Durable before visible: a crash after this leaves the new state on disk.
        self.storage.persist(&change)?;
        self.publish(&current, catalog, &change, current.fleet_version)?;
        tracing::info!("catalog changed: {stmt}");
        Ok(())
    }

    /// Publishes `catalog`, `current` with `change` applied: its trees recompiled, the
    /// waiting statements a changed classifier placed judged again.
    fn publish(
        &self,
        current: &Snapshot,
        catalog: Catalog,
        change: &sluice_catalog::Change,
        fleet_version: i64,
    ) -> Result<()> {
        let trees = recompile(
            &current.trees,
            &current.catalog,
            &catalog,
            change,
            self.options.machine,
        )?;
        let mut next = Snapshot::new(catalog, trees, Some(current), self.fleet_fence.get());
        next.fleet_version = fleet_version;
        let next = Arc::new(next);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = next.clone();
        let change = change.clone();
        if let sluice_catalog::Change::Upsert(sluice_catalog::Entity::Classifier(c)) = &change {
            self.reclassify_waiting(&c.name, &next.catalog);
        } else if let sluice_catalog::Change::Remove {
            kind: sluice_sql::EntityKind::Classifier,
            name,
        } = &change
        {
            self.reclassify_waiting(name, &next.catalog);
        }
        Ok(())
    }

    /// A DDL statement in a fleet: validated against this node's catalog, stored in etcd if
    /// the fleet's catalog is still the version validated against; if it moved meanwhile
    /// (another node's change), validated again once this node has it. Returns once this
    /// node has applied the change (so the client sees it here at once).
    async fn apply_fleet_ddl(&self, fleet: &FleetCatalog, stmt: &Statement) -> Result<()> {
        for _ in 0..FLEET_DDL_TRIES {
            let (change, version) = {
                let _serial = self.ddl.lock().await;
                let current = self.snapshot();
                let (_, change) = current.catalog.apply(stmt)?;
                let Some(change) = change else { return Ok(()) };
                (change, current.fleet_version)
            };
            let node = self.fleet.get().map_or("", |f| f.name());
            match fleet
                .store
                .commit(&fleet_change(&change), version, node)
                .await?
            {
                sluice_cluster::Commit::Done { revision } => {
                    fleet.applied_at_least(revision).await?;
                    tracing::info!(revision, "fleet catalog changed: {stmt}");
                    return Ok(());
                }
                sluice_cluster::Commit::Moved { version } => {
                    tracing::info!(
                        version,
                        "the fleet's catalog moved under a DDL; validating it again"
                    );
                    fleet.applied_at_least(version).await?;
                }
            }
        }
        Err(Error::new(
            ErrorCode::KeeperException,
            format!("the fleet's catalog changed under this statement {FLEET_DDL_TRIES} times (other nodes' DDL); run it again"),
        ))
    }

    /// Makes the fleet's catalog `stored` this node's: the config layer, then the stored
    /// entities, compiled whole and published (the node's own data dir is not read in a
    /// fleet). At start-up, and again whenever following the changes broke.
    pub async fn adopt_fleet_catalog(&self, stored: &sluice_cluster::StoredCatalog) -> Result<()> {
        let base = config_layer(&self.options.config_statements)?;
        let catalog = fleet_catalog(base, stored)?;
        let trees = compile(&catalog, self.options.machine)?;
        let _serial = self.ddl.lock().await;
        let current = self.snapshot();
        let mut next = Snapshot::new(catalog, trees, Some(&current), self.fleet_fence.get());
        next.fleet_version = stored.version;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        tracing::info!(
            entities = stored.entities.len(),
            version = stored.version,
            "the fleet's catalog adopted"
        );
        Ok(())
    }

    /// Applies a change another node (or this one) stored in the fleet's catalog.
    pub async fn apply_followed(&self, followed: &sluice_cluster::Followed) -> Result<()> {
        let stmt = match &followed.change {
            sluice_cluster::CatalogChange::Upsert { statement, .. } => {
                let mut stmt = sluice_sql::parse_statement(statement)?;
                // It may replace what this node has (the text is canonical, without OR REPLACE).
                match &mut stmt {
                    Statement::CreateWorkload(w) => w.options.or_replace = true,
                    Statement::CreateResource(r) => r.options.or_replace = true,
                    Statement::CreateClassifier(c) => c.options.or_replace = true,
                    Statement::Drop(_) => {}
                }
                stmt
            }
            sluice_cluster::CatalogChange::Remove { kind, name } => {
                Statement::Drop(sluice_sql::DropEntity {
                    kind: entity_kind(kind)?,
                    if_exists: true,
                    name: name.clone(),
                    on_cluster: None,
                })
            }
        };
        let _serial = self.ddl.lock().await;
        let current = self.snapshot();
        let (catalog, change) = current.catalog.apply(&stmt)?;
        match change {
            Some(change) => self.publish(&current, catalog, &change, followed.revision)?,
            None => {
                let mut same = Snapshot::new(
                    current.catalog.clone(),
                    current.trees.clone(),
                    Some(&current),
                    self.fleet_fence.get(),
                );
                same.fleet_version = followed.revision;
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(same);
            }
        }
        if let Some(fleet) = self.fleet_catalog.get() {
            fleet.applied.send_replace(followed.revision);
        }
        tracing::info!(
            revision = followed.revision,
            "fleet catalog change applied: {stmt}"
        );
        Ok(())
    }

    /// Classifier `changed` was replaced or dropped: every waiting statement it placed is
    /// judged again by the rules of `catalog` (counting nothing) and, when they send it
    /// elsewhere, moved there while it keeps waiting — in its arrival order, so the queues
    /// it joins serve it as if it had arrived there (`Acquire::move_to`). A statement already
    /// admitted stays where it runs.
    pub fn reclassify_waiting(&self, changed: &str, catalog: &Catalog) {
        // In arrival order, so the queues they join serve them as they arrived.
        let moves = self.registry.judge_again(changed, catalog);
        for (query_id, from, to) in moves {
            tracing::info!(query_id, from = %from, to = %to, classifier = changed, "waiting query classified again");
            if let Err(e) = self.move_any(query_id, &to) {
                tracing::warn!(query_id, "could not move a query classified again: {e}");
            }
        }
    }

    /// This node's name: `[cluster] node` in a fleet, `local` alone (as the admission log
    /// and `system.processes.node` show it).
    pub fn node_name(&self) -> &str {
        self.options
            .cluster
            .as_ref()
            .map_or("local", |c| c.node.as_str())
    }

    /// `MOVE QUERY`: a running statement moves with what it holds ([`Shared::move_query`]); a
    /// waiting one leaves its queue and queues again in `workload`.
    pub fn move_any(&self, query_id: u64, workload: &str) -> Result<()> {
        let (running, control) = self
            .registry
            .process(query_id, |p| Some((p.grant.is_some(), p.control.clone())))
            .ok_or_else(|| {
                Error::bad_arguments(format!("no statement with query_id {query_id}"))
            })?;
        if running {
            return self.move_query(query_id, workload);
        }
        *control.move_to.lock().unwrap_or_else(|p| p.into_inner()) = Some(workload.to_string());
        control.moved.notify_one();
        Ok(())
    }

    /// Moves admitted query `query_id` to leaf `workload`, with everything it holds and
    /// without releasing it: on every resource it passed, it leaves its old workload's limits
    /// and counts in the new one's (see `Permit::move_to`). `system.processes` shows the new
    /// workload at once.
    pub fn move_query(&self, query_id: u64, workload: &str) -> Result<()> {
        let grant = self
            .registry
            .process(query_id, |p| p.grant.clone())
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::BadArguments,
                    format!("no admitted query with query_id {query_id}"),
                )
            })?;
        let snapshot = self.snapshot();
        let mut grant = grant.lock().unwrap_or_else(|p| p.into_inner());
        // Checked on every resource first, so a refused move changes nothing.
        for attachment in &grant.attachments {
            if let Some(scheduler) = snapshot.schedulers.get(&*attachment.resource) {
                if scheduler.is_inner_workload(workload) {
                    return Err(Error::new(
                        ErrorCode::InvalidSchedulerNode,
                        format!("Unable to link to workload '{workload}' that has children"),
                    ));
                }
            }
        }
        if snapshot
            .memory
            .values()
            .any(|m| m.is_inner_workload(workload))
        {
            return Err(Error::new(
                ErrorCode::InvalidSchedulerNode,
                format!("Unable to link to workload '{workload}' that has children"),
            ));
        }
        if let Some(memory) = &grant.memory {
            memory.move_to(workload)?;
        }
        for attachment in &mut grant.attachments {
            if let Some(scheduler) = snapshot.schedulers.get(&*attachment.resource) {
                attachment.permit.move_to(scheduler, workload)?;
            }
            attachment.in_flight = self.metrics.series(&attachment.resource, workload).held();
        }
        let moved_to: Arc<str> = Arc::from(workload);
        grant.workload = moved_to.clone();
        drop(grant);
        self.registry.update(query_id, |p| p.workload = moved_to);
        tracing::info!(query_id, workload, "query moved");
        Ok(())
    }

    /// Demotes running query `query_id` to `to` ([`Shared::move_query`]), noting where it came
    /// from and when for `system.processes` and the query log.
    pub fn demote(&self, query_id: u64, to: &str) -> Result<()> {
        let found = self
            .registry
            .process(query_id, |p| Some((p.grant.clone()?, p.query.clone())));
        let Some((grant, query)) = found else {
            return Ok(());
        }; // it ended meanwhile
        let from = grant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .workload
            .clone();
        self.move_query(query_id, to)?;
        let mut held = grant.lock().unwrap_or_else(|p| p.into_inner());
        held.demoted = Some((from.to_string(), std::time::SystemTime::now()));
        // Once per resource (a query holds several CPU slots of one).
        let mut resources: Vec<&str> = held.attachments.iter().map(|a| &*a.resource).collect();
        resources.dedup();
        for resource in resources {
            self.metrics.series(resource, &from).demoted();
        }
        drop(held);
        tracing::info!(query_id, from = %from, to, "query demoted: it overran demote_after");
        self.lanes
            .demoted(&sluice_sql::fingerprint(&query), &query, to)?;
        Ok(())
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Moves the server to `phase`. From [`Phase::Terminating`] on, every statement still
    /// registered is stopped (and so is any registered later: [`Registry::stop_all`]).
    pub fn set_phase(&self, phase: Phase) {
        tracing::info!(?phase, "server phase");
        self.phase.send_replace(phase);
        if phase >= Phase::Terminating {
            self.registry.stop_all(shutting_down(Phase::Terminating));
        }
    }

    /// Completes once the server has reached `phase`.
    pub async fn reached(&self, phase: Phase) {
        let mut rx = self.phase.subscribe();
        let _ = rx.wait_for(|p| *p >= phase).await;
    }

    /// Completes once no statement is waiting or running.
    pub async fn idle(&self) {
        while !self.registry.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// How many times a fleet DDL is validated again when other nodes' changes keep landing first.
const FLEET_DDL_TRIES: usize = 5;

/// How long a node waits for its own follower to apply a change it stored (or one that moved
/// the catalog under it) before the statement fails.
const FLEET_APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The fleet's catalog, as a node holds it.
#[derive(Debug)]
pub struct FleetCatalog {
    pub store: sluice_cluster::CatalogStore,
    /// The etcd revision of the last change this node applied.
    pub applied: tokio::sync::watch::Sender<i64>,
}

impl FleetCatalog {
    pub fn new(store: sluice_cluster::CatalogStore, revision: i64) -> FleetCatalog {
        FleetCatalog {
            store,
            applied: tokio::sync::watch::Sender::new(revision),
        }
    }

    /// Until this node has applied the change stored at `revision`.
    async fn applied_at_least(&self, revision: i64) -> Result<()> {
        let mut applied = self.applied.subscribe();
        tokio::time::timeout(FLEET_APPLY_WAIT, applied.wait_for(|r| *r >= revision))
            .await
            .map_err(|_| {
                Error::new(
                    ErrorCode::KeeperException,
                    format!("the fleet's catalog change at revision {revision} did not reach this node within {} s (is etcd reachable?)", FLEET_APPLY_WAIT.as_secs()),
                )
            })?
            .map_err(|_| Error::new(ErrorCode::KeeperException, "the fleet's catalog is no longer followed"))?;
        Ok(())
    }
}

/// A catalog change as the fleet's catalog stores it.
fn fleet_change(change: &sluice_catalog::Change) -> sluice_cluster::CatalogChange {
    match change {
        sluice_catalog::Change::Upsert(entity) => sluice_cluster::CatalogChange::Upsert {
            kind: entity.kind().keyword().to_ascii_lowercase(),
            name: entity.name().to_string(),
            statement: entity.create_query(),
        },
        sluice_catalog::Change::Remove { kind, name } => sluice_cluster::CatalogChange::Remove {
            kind: kind.keyword().to_ascii_lowercase(),
            name: name.clone(),
        },
    }
}

fn entity_kind(kind: &str) -> Result<sluice_sql::EntityKind> {
    match kind {
        "workload" => Ok(sluice_sql::EntityKind::Workload),
        "resource" => Ok(sluice_sql::EntityKind::Resource),
        "classifier" => Ok(sluice_sql::EntityKind::Classifier),
        other => Err(Error::new(
            ErrorCode::InternalError,
            format!("the fleet's catalog holds an entity of unknown kind '{other}'"),
        )),
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("options", &self.options)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// A scheduler per QUERY, CPU and IO resource (memory is not scheduled yet); in a fleet
/// (`fleet`: its fence), the QUERY ones admit within this node's shares. A tree that did not change keeps its scheduler (and with it
/// the queries waiting and running in it); a changed tree gets a new scheduler that takes over
/// the old one's waiting queries and in-flight counts ([`ResourceScheduler::succeed`]); the
/// scheduler of a resource that is gone fails its waiting queries.
fn schedulers(
    trees: &SchedulerTrees,
    previous: Option<&Snapshot>,
    fleet: Option<&Arc<sluice_sched::Fence>>,
) -> BTreeMap<String, ResourceScheduler> {
    let mut out = BTreeMap::new();
    let held = |t: &&sluice_sched::ResourceTree| {
        matches!(
            t.unit,
            CostUnit::QuerySlot | CostUnit::CpuNanosecond | CostUnit::IoByte
        )
    };
    for tree in trees.trees.iter().filter(held) {
        let old = previous.and_then(|p| {
            Some((
                p.trees.tree(&tree.resource)?,
                p.schedulers.get(&tree.resource)?,
            ))
        });
        let scheduler = match old {
            Some((old_tree, scheduler)) => {
                if same_root(old_tree, tree) {
                    scheduler.clone()
                } else {
                    scheduler.succeed(tree)
                }
            }
            None => {
                let scheduler = ResourceScheduler::new(tree, Arc::new(TokioClock));
                // In a fleet a new QUERY tree's limits hold no share until the fleet grants
                // one (a successor inherits its predecessor's shares).
                if let (Some(fence), CostUnit::QuerySlot) = (fleet, tree.unit) {
                    scheduler.join_fleet(fence.clone());
                }
                scheduler
            }
        };
        out.insert(tree.resource.clone(), scheduler);
    }
    if let Some(previous) = previous {
        for (resource, scheduler) in &previous.schedulers {
            if !out.contains_key(resource) {
                scheduler.retire();
            }
        }
    }
    out
}

/// A scheduler per MEMORY RESERVATION resource: kept while its tree is unchanged, else
/// succeeded by the new tree's, which takes over every allocation.
fn memory_schedulers(
    trees: &SchedulerTrees,
    previous: Option<&Snapshot>,
) -> BTreeMap<String, MemoryScheduler> {
    let mut out = BTreeMap::new();
    for tree in trees
        .trees
        .iter()
        .filter(|t| t.unit == CostUnit::MemoryByte)
    {
        let old = previous
            .and_then(|p| Some((p.trees.tree(&tree.resource)?, p.memory.get(&tree.resource)?)));
        let scheduler = match old {
            Some((old_tree, scheduler)) if same_root(old_tree, tree) => scheduler.clone(),
            Some((_, scheduler)) => scheduler.succeed(tree),
            None => MemoryScheduler::new(tree),
        };
        out.insert(tree.resource.clone(), scheduler);
    }
    out
}

/// Whether two versions of a tree are the same compiled nodes (a change recompiles what it
/// touched, so an untouched tree is shared whole).
fn same_root(a: &sluice_sched::ResourceTree, b: &sluice_sched::ResourceTree) -> bool {
    match (&a.root, &b.root) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// The catalog a fleet's stored one makes on top of `base` (a node's config layer).
pub fn fleet_catalog(base: Catalog, stored: &sluice_cluster::StoredCatalog) -> Result<Catalog> {
    let mut items = Vec::with_capacity(stored.entities.len());
    for (kind, name, text) in &stored.entities {
        let stmt = sluice_sql::parse_statement(text).map_err(|e| Error {
            message: format!("the fleet's catalog holds {kind} '{name}' that does not parse: {e}"),
            ..e
        })?;
        items.push((format!("{kind} '{name}' of the fleet's catalog"), stmt));
    }
    sluice_catalog::load_statements(base, items)
}

/// The error of a statement refused or stopped by shutdown.
pub fn shutting_down(phase: Phase) -> Error {
    Error::new(
        ErrorCode::Aborted,
        match phase {
            Phase::Terminating => "terminating the statement: sluice is shutting down and the grace period (server.shutdown_grace_ms) is over",
            _ => "sluice is shutting down; the statement did not start. Retry once the server is back",
        },
    )
}

/// An error for a workload that does not exist when `throw_on_unknown_workload` is on.
pub fn access_denied(resource: &str) -> Error {
    Error::new(
        ErrorCode::ResourceAccessDenied,
        format!("Could not access resource '{resource}'. Please check `throw_on_unknown_workload` setting"),
    )
}
