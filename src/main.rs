//! The `sluice` binary: command line, configuration, and the offline commands.
//!
//! - `sluice check [--dump] [--data-dir DIR | --fleet --config FILE] FILE`: validate a DDL
//!   script against an empty (or a copied, or the fleet's) catalog, print each statement's
//!   outcome and, with `--dump`, the system tables.
//! - `sluice apply --data-dir DIR FILE`: apply a DDL script to a data dir, durably, statement by
//!   statement; stops at the first error.
//! - `sluice serve`: the Postgres-wire server on the embedded engine.
//! - `sluice local FILE`: run any script in process with throw-away state (like
//!   `clickhouse-local`), printing each statement and what it gave.

mod config;
mod dump;
mod machine;
mod simulate;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use sluice_catalog::{config_layer, Catalog, DiskStorage};
use sluice_sched::Machine;
use sluice_sql::parse_script;

use crate::config::Config;

/// mimalloc: many small allocations per query (plans, batches, wire messages) from several
/// threads; glibc's malloc spent ~9% of the server's CPU on `SELECT 1` (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

/// mimalloc, asked as Rust's own `System` allocator asks the C library: an alignment `malloc`
/// gives anyway (at most 16 bytes, and no more than the size) goes to `mi_malloc`. The
/// `mimalloc` crate sends every allocation to `mi_malloc_aligned`, whose own checks came to
/// half the cost of a small allocation (BENCHMARKS.md, issue 38 session 31).
struct Allocator;

/// The alignment `mi_malloc` guarantees (`MI_MAX_ALIGN_SIZE`), as glibc's malloc does.
const MALLOC_ALIGN: usize = 16;

fn malloc_aligned(align: usize, size: usize) -> bool {
    align <= MALLOC_ALIGN && align <= size
}

// SAFETY: each method hands the layout's request to mimalloc, whose blocks satisfy it: through
// the plain functions only when `malloc_aligned` says their guarantee covers the alignment,
// else through the `mimalloc` crate's aligned ones; every block is freed by `mi_free`, which
// takes blocks of either.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if malloc_aligned(layout.align(), layout.size()) {
            mimalloc_options::mi_malloc(layout.size()).cast()
        } else {
            mimalloc::MiMalloc.alloc(layout)
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if malloc_aligned(layout.align(), layout.size()) {
            mimalloc_options::mi_zalloc(layout.size()).cast()
        } else {
            mimalloc::MiMalloc.alloc_zeroed(layout)
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        mimalloc::MiMalloc.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        if malloc_aligned(layout.align(), size) {
            mimalloc_options::mi_realloc(ptr.cast(), size).cast()
        } else {
            mimalloc::MiMalloc.realloc(ptr, layout, size)
        }
    }
}

/// mimalloc (v3, the `mimalloc` crate's default) option `purge_delay`: its index in
/// `mi_option_e` (mimalloc.h), which the crate's bindings do not name.
const MI_OPTION_PURGE_DELAY: i32 = 15;

#[allow(unsafe_code)]
mod mimalloc_options {
    use std::os::raw::c_void;

    extern "C" {
        pub fn mi_option_set(option: i32, value: std::os::raw::c_long);
        pub fn mi_collect(force: bool);
        pub fn mi_malloc(size: usize) -> *mut c_void;
        pub fn mi_zalloc(size: usize) -> *mut c_void;
        pub fn mi_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    }
}

/// Memory given back: mimalloc purges freed memory only after `purge_delay` (1 s), and only
/// when the thread that freed it allocates again — so the engine's worker threads, idle after
/// a big query, kept gigabytes (RSS 5.4 GB after a 7.7 GB peak, for good). Purging at once
/// gives it back as it is freed (87 MB after the same query) at no cost to `SELECT 1`
/// (BENCHMARKS.md, issue 38). `MIMALLOC_PURGE_DELAY` in the environment still decides.
fn give_memory_back() {
    // And after a big statement each engine worker collects: what other threads freed of its
    // memory waits for it otherwise (sluice_engine::give_back).
    sluice_engine::give_back::set_collector(collect_thread);
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options (an integer in its table, read atomically by
        // the allocator); any value is valid for it.
        #[allow(unsafe_code)]
        unsafe {
            mimalloc_options::mi_option_set(MI_OPTION_PURGE_DELAY, 0)
        };
    }
}

/// Makes mimalloc give back what the calling thread's heap holds free (`mi_collect`).
fn collect_thread() {
    // SAFETY: mimalloc's collection of the calling thread's heap; callable from any thread
    // at any time.
    #[allow(unsafe_code)]
    unsafe {
        mimalloc_options::mi_collect(true)
    };
}

#[derive(Debug, Parser)]
#[command(name = "sluice", version, about = "A workload manager for SQL")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server: Postgres wire protocol, embedded DataFusion engine.
    Serve {
        /// A sluice.toml (see docs/config.md).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on [default: 127.0.0.1:6543].
        #[arg(long)]
        listen: Option<String>,
        /// Where the catalog is stored [default: ./sluice-data].
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// CPU cores that `*_ratio_to_cores` and `max_cpu_share` resolve against.
        #[arg(long)]
        cores: Option<u32>,
        /// Memory in bytes that `max_memory_ratio` resolves against.
        #[arg(long)]
        memory: Option<u64>,
        /// A disk for `READ DISK`/`WRITE DISK` resources, as NAME=PATH (repeatable; adds to
        /// the config's `[disks]`).
        #[arg(long = "disk", value_name = "NAME=PATH")]
        disks: Vec<String>,
        /// Front this database (upstream mode): statements that are not sluice's own are
        /// forwarded to it, as postgres://user[:password]@host[:port]/db (overrides
        /// `[upstream] url`).
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
    },
    /// Make a SCRAM-SHA-256 verifier for a `[[users]]` entry from a password read on standard
    /// input (one line). The password itself is never stored.
    Passwd,
    /// Validate a DDL script offline and print each statement's outcome.
    Check {
        /// Also print system.workloads, system.resources and system.scheduler afterwards.
        #[arg(long)]
        dump: bool,
        /// Refuse sluice's own extensions (lane settings) as ClickHouse 26.9 would: a script
        /// that passes runs unchanged on ClickHouse.
        #[arg(long)]
        strict: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Run a script (DDL and queries) in process with a throw-away state, printing each
    /// statement and its result: OK, ERROR <CODE>: message, or the rows as TSV with a header.
    Local {
        /// The script; `-` reads standard input.
        file: PathBuf,
        /// CPU cores that `*_ratio_to_cores` and `max_cpu_share` resolve against.
        #[arg(long)]
        cores: Option<u32>,
        /// Memory in bytes that `max_memory_ratio` resolves against.
        #[arg(long)]
        memory: Option<u64>,
    },
    /// Replay a trace of statements through the scheduler in virtual time against a DDL
    /// script, and print per workload (and per fast/slow class) waits, completion times,
    /// throughput, peak queues and demotions. `--generate reports` prints a synthetic trace.
    Simulate {
        /// The DDL script (workloads and resources) to simulate.
        #[arg(required_unless_present = "generate")]
        ddl: Option<PathBuf>,
        /// The trace: CSV with arrival_s,user,application,workload,statement,service_s, or a
        /// system.query_log export with its header.
        #[arg(required_unless_present = "generate")]
        trace: Option<PathBuf>,
        /// A second DDL script, simulated on the same trace and printed beside the first.
        #[arg(long)]
        compare: Option<PathBuf>,
        /// Print a synthetic trace instead: `reports` (library reports, the Evergreen
        /// consortiums' run times).
        #[arg(long, value_name = "KIND")]
        generate: Option<String>,
        /// With --generate: how many statements.
        #[arg(long, default_value_t = 2000)]
        queries: usize,
        /// With --generate: over how many hours they arrive.
        #[arg(long, default_value_t = 1.0)]
        hours: f64,
        /// With --generate: the random seed (the same seed, the same trace).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// With --generate: multiply every time by this (0.04 compresses 20 s into 0.8 s).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Statements that take at most this many seconds alone are "fast" in the class rows.
        #[arg(long, default_value_t = 20.0)]
        fast_under: f64,
        /// Also print each statement's fate (where it was admitted and ended, its wait).
        #[arg(long)]
        each: bool,
        /// CPU cores that `*_ratio_to_cores` and `max_cpu_share` resolve against.
        #[arg(long)]
        cores: Option<u32>,
        /// Memory in bytes that `max_memory_ratio` resolves against.
        #[arg(long)]
        memory: Option<u64>,
    },
    /// Apply a DDL script to a data dir, persisting each statement; stops at the first error.
    Apply {
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, Args)]
struct Common {
    /// The script; `-` reads standard input.
    file: PathBuf,
    /// `check`: start from a copy of this data dir's catalog (left untouched).
    /// `apply`: the data dir to change (default ./sluice-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A sluice.toml whose `[catalog] statements` form the read-only layer.
    #[arg(long)]
    config: Option<PathBuf>,
    /// CPU cores that `*_ratio_to_cores` and `max_cpu_share` resolve against.
    #[arg(long)]
    cores: Option<u32>,
    /// Memory in bytes that `max_memory_ratio` resolves against.
    #[arg(long)]
    memory: Option<u64>,
    /// `check`: start from the fleet's catalog in etcd (the config's `[cluster]`), read
    /// without joining the fleet, instead of a data dir's.
    #[arg(long)]
    fleet: bool,
}

struct Setup {
    script: String,
    catalog: Catalog,
    storage: Option<DiskStorage>,
    machine: Machine,
}

impl Common {
    /// Reads the config, the script and the catalog. `writable`: open the data dir for writing
    /// (`apply`); otherwise it is only read and left exactly as it was (`check`).
    fn setup(&self, default_data_dir: Option<&Path>, writable: bool) -> anyhow::Result<Setup> {
        let config = match &self.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        let mut script = String::new();
        if self.file.as_os_str() == "-" {
            std::io::stdin()
                .read_to_string(&mut script)
                .context("cannot read standard input")?;
        } else {
            script = std::fs::read_to_string(&self.file)
                .with_context(|| format!("cannot read {}", self.file.display()))?;
        }
        let base = config_layer(&config.catalog.statements).map_err(|e| anyhow::anyhow!("{e}"))?;
        let data_dir = self
            .data_dir
            .clone()
            .or(config.server.data_dir.clone())
            .or(default_data_dir.map(Path::to_path_buf));
        if self.fleet {
            let cluster = config
                .cluster
                .as_ref()
                .context("--fleet reads the fleet's catalog from the config's [cluster]: pass --config with one")?;
            let options = cluster_options(cluster)?;
            let stored = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(sluice_cluster::read_catalog(&options))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let catalog = sluice_server::state::fleet_catalog(base, &stored)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            return Ok(Setup {
                script,
                catalog,
                storage: None,
                machine: self.machine(&config),
            });
        }
        let (catalog, storage) = match data_dir {
            Some(dir) => {
                let storage = if writable {
                    DiskStorage::open(&dir)
                } else {
                    DiskStorage::open_read_only(&dir)
                }
                .map_err(|e| anyhow::anyhow!("{e}"))?;
                let catalog = storage.load(base).map_err(|e| anyhow::anyhow!("{e}"))?;
                (catalog, Some(storage))
            }
            None => (base, None),
        };
        Ok(Setup {
            script,
            catalog,
            storage,
            machine: self.machine(&config),
        })
    }

    /// The machine ratios resolve against: the flags', the config's, or this one's.
    fn machine(&self, config: &Config) -> Machine {
        let detected = machine::detect();
        Machine {
            cores: self.cores.or(config.server.cores).unwrap_or(detected.cores),
            memory: self
                .memory
                .or(config.server.memory)
                .unwrap_or(detected.memory),
        }
    }
}

fn main() -> ExitCode {
    give_memory_back();
    let cli = Cli::parse();
    if let Command::Serve {
        config,
        listen,
        data_dir,
        cores,
        memory,
        disks,
        upstream,
    } = cli.command
    {
        return match serve(config, listen, data_dir, cores, memory, disks, upstream) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluice: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn serve(
    config: Option<PathBuf>,
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    cores: Option<u32>,
    memory: Option<u64>,
    disk_flags: Vec<String>,
    upstream_flag: Option<String>,
) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match &config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let listen = listen
        .or(config.server.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:6543".to_string());
    let addr: std::net::SocketAddr = listen.parse().with_context(|| {
        format!("server.listen: '{listen}' is not an address like 127.0.0.1:6543")
    })?;
    let mut disks: std::collections::BTreeMap<String, PathBuf> = config
        .disks
        .iter()
        .map(|(name, d)| (name.clone(), d.path.clone()))
        .collect();
    for flag in &disk_flags {
        let (name, path) = flag
            .split_once('=')
            .filter(|(n, p)| !n.is_empty() && !p.is_empty())
            .with_context(|| format!("--disk '{flag}': expected NAME=PATH"))?;
        disks.insert(name.to_string(), PathBuf::from(path));
    }
    for (name, path) in &disks {
        if !path.is_dir() {
            anyhow::bail!(
                "disks.{name}.path: '{}' is not a directory (create it, or fix the path)",
                path.display()
            );
        }
    }
    let detected = machine::detect();
    let users = config
        .users
        .iter()
        .map(|u| {
            let max_execution_time = match u.max_execution_time {
                None => None,
                Some(s) if s.is_finite() && s > 0.0 => Some(std::time::Duration::from_secs_f64(s)),
                Some(s) => anyhow::bail!(
                    "[[users]] '{}': max_execution_time must be a positive number of seconds, got {s}",
                    u.name
                ),
            };
            Ok(sluice_server::auth::User {
                name: u.name.clone(),
                scram: u.scram.clone(),
                admin: u.admin,
                default_workload: u.default_workload.clone(),
                pinned_workload: u.pinned_workload.clone(),
                max_execution_time,
                admission_timeout: u
                    .workload_admission_timeout_ms
                    .filter(|ms| *ms > 0)
                    .map(std::time::Duration::from_millis),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if config.http.listen.is_some() && config.metrics.listen.is_some() {
        anyhow::bail!("set [http] listen or its earlier name [metrics] listen, not both");
    }
    let metrics_addr: Option<std::net::SocketAddr> = match config
        .http
        .listen
        .as_ref()
        .or(config.metrics.listen.as_ref())
    {
        Some(m) => Some(m.parse().with_context(|| {
            format!("http.listen: '{m}' is not an address like 127.0.0.1:9187")
        })?),
        None => None,
    };
    let grace = std::time::Duration::from_millis(config.server.shutdown_grace_ms.unwrap_or(30_000));
    if config.server.cpu_slot_quantum_ns == Some(0) {
        anyhow::bail!("server.cpu_slot_quantum_ns: must be greater than 0");
    }
    let engine_memory_ratio = config
        .server
        .engine_memory_ratio
        .unwrap_or(sluice_server::state::DEFAULT_ENGINE_MEMORY_RATIO);
    if !(engine_memory_ratio > 0.0 && engine_memory_ratio <= 1.0) {
        anyhow::bail!(
            "server.engine_memory_ratio: must be greater than 0 and at most 1, got {engine_memory_ratio}"
        );
    }
    let upstream = upstream_options(config.upstream.as_ref(), upstream_flag)?;
    let cluster = config.cluster.as_ref().map(cluster_options).transpose()?;
    let connection_threads = config.server.connection_threads.unwrap_or_else(|| {
        sluice_server::threads::default_count(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        )
    });
    let options = sluice_server::ServerOptions {
        upstream,
        cluster,
        engine_memory_ratio,
        connection_threads,
        throw_on_unknown_workload: config.server.throw_on_unknown_workload.unwrap_or(false),
        config_statements: config.catalog.statements.clone(),
        users,
        tls: config.tls.as_ref().map(|t| (t.cert.clone(), t.key.clone())),
        shutdown_grace: grace,
        disks,
        query_log_size: config
            .server
            .query_log_size
            .unwrap_or(sluice_server::query_log::DEFAULT_SIZE),
        strict_clickhouse: config.server.strict_clickhouse.unwrap_or(false),
        admission_log: config.server.admission_log.clone(),
        cpu_slots: sluice_server::CpuSlotOptions {
            preemption: config.server.cpu_slot_preemption.unwrap_or(false),
            quantum_ns: config.server.cpu_slot_quantum_ns.unwrap_or(10_000_000),
            preemption_timeout_ms: config.server.cpu_slot_preemption_timeout_ms.unwrap_or(1000),
        },
        ..sluice_server::ServerOptions::new(
            data_dir
                .or(config.server.data_dir.clone())
                .unwrap_or_else(|| PathBuf::from("sluice-data")),
            Machine {
                cores: cores.or(config.server.cores).unwrap_or(detected.cores),
                memory: memory.or(config.server.memory).unwrap_or(detected.memory),
            },
        )
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let shared =
            sluice_server::Shared::open(options.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
        sluice_server::auth::check_listen(&addr, &shared.logins)
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        // Into the fleet first (`[cluster]`): a node that cannot join does not announce itself.
        let bound = listener.local_addr().unwrap_or(addr);
        sluice_server::join_fleet(&shared, &bound.to_string())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!(
            "sluice listening on {addr} (data dir {}, {} cores, {} bytes of memory, {} connection thread{})",
            options.data_dir.display(),
            options.machine.cores,
            options.machine.memory,
            options.connection_threads,
            if options.connection_threads == 1 { "" } else { "s" }
        );
        // What a newcomer types next.
        tracing::info!(
            "connect with: psql -h {} -p {} -U <user> sluice",
            bound.ip(),
            bound.port()
        );
        if let Some(metrics_addr) = metrics_addr {
            let metrics = tokio::net::TcpListener::bind(metrics_addr)
                .await
                .with_context(|| format!("http.listen: cannot listen on {metrics_addr}"))?;
            tracing::info!(
                "live page at http://{metrics_addr}/ , metrics at http://{metrics_addr}/metrics"
            );
            // Ends with the runtime, after the server has drained.
            tokio::spawn(sluice_server::http::serve_http(
                metrics,
                shared.clone(),
                std::future::pending(),
            ));
        }
        let shutdown = async {
            #[cfg(unix)]
            {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("a SIGTERM handler");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutting down");
        };
        sluice_server::serve(listener, shared, shutdown).await?;
        Ok(())
    })
}

/// `[cluster]`, checked.
fn cluster_options(c: &config::ClusterConfig) -> anyhow::Result<sluice_cluster::ClusterOptions> {
    if c.etcd.is_empty() {
        anyhow::bail!("cluster.etcd: name etcd's client URLs, e.g. [\"http://127.0.0.1:2379\"]");
    }
    let lease_ttl = match c.lease_ttl {
        None => sluice_cluster::DEFAULT_LEASE_TTL,
        Some(s) if s.is_finite() && s >= 1.0 => std::time::Duration::from_secs_f64(s),
        Some(s) => anyhow::bail!("cluster.lease_ttl: must be at least 1 second, got {s}"),
    };
    let node = match &c.node {
        Some(n) if !n.is_empty() && !n.contains('/') => n.clone(),
        Some(n) => anyhow::bail!("cluster.node: a name without '/', got '{n}'"),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .context("cluster.node: the host's name cannot be read; name the node")?,
    };
    let user = match (&c.user, &c.password) {
        (Some(u), Some(p)) => Some((u.clone(), p.clone())),
        (None, None) => None,
        _ => anyhow::bail!("cluster.user and cluster.password go together"),
    };
    let cert_and_key = match (&c.tls_cert, &c.tls_key) {
        (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
        (None, None) => None,
        _ => anyhow::bail!("cluster.tls_cert and cluster.tls_key go together"),
    };
    let tls = match (&c.tls_ca, cert_and_key) {
        (Some(ca), cert_and_key) => Some(sluice_cluster::TlsFiles {
            ca: ca.clone(),
            cert_and_key,
        }),
        (None, None) => None,
        (None, Some(_)) => anyhow::bail!(
            "cluster.tls_cert and tls_key need cluster.tls_ca (the CA that signed etcd's certificate)"
        ),
    };
    Ok(sluice_cluster::ClusterOptions {
        endpoints: c.etcd.clone(),
        prefix: c
            .prefix
            .clone()
            .unwrap_or_else(|| sluice_cluster::DEFAULT_PREFIX.to_string()),
        node,
        lease_ttl,
        user,
        tls,
        cancel_at_fence: c.cancel_at_fence.unwrap_or(false),
    })
}

/// `[upstream]` and `--upstream`, checked.
fn upstream_options(
    config: Option<&config::UpstreamConfig>,
    flag: Option<String>,
) -> anyhow::Result<Option<sluice_server::upstream::UpstreamOptions>> {
    let Some(url) = flag.or(config.map(|c| c.url.clone())) else {
        return Ok(None);
    };
    let mut url = sluice_server::upstream::UpstreamUrl::parse(&url)
        .map_err(|e| anyhow::anyhow!("upstream.url: {}", e.message))?;
    let default = sluice_server::upstream::UpstreamOptions::new(url.clone());
    let Some(c) = config else {
        return Ok(Some(default));
    };
    if let Some(s) = c.connect_timeout {
        if !(s.is_finite() && s > 0.0) {
            anyhow::bail!(
                "upstream.connect_timeout: must be a positive number of seconds, got {s}"
            );
        }
        url.connect_timeout = std::time::Duration::from_secs_f64(s);
    }
    let pool_size = c.pool_size.unwrap_or(default.pool_size);
    if pool_size == 0 {
        anyhow::bail!("upstream.pool_size: must be at least 1");
    }
    let max_prepared_statements = c
        .max_prepared_statements
        .unwrap_or(default.max_prepared_statements);
    if max_prepared_statements == 0 {
        anyhow::bail!("upstream.max_prepared_statements: must be at least 1");
    }
    let server_idle_timeout = match c.server_idle_timeout {
        None => default.server_idle_timeout,
        Some(0.0) => None,
        Some(s) if s.is_finite() && s > 0.0 => Some(std::time::Duration::from_secs_f64(s)),
        Some(s) => anyhow::bail!(
            "upstream.server_idle_timeout: must be a number of seconds, 0 for never, got {s}"
        ),
    };
    Ok(Some(sluice_server::upstream::UpstreamOptions {
        url,
        pool_size,
        server_idle_timeout,
        max_prepared_statements,
        pool_mode: match &c.pool_mode {
            Some(m) => m.parse().map_err(|e| anyhow::anyhow!("upstream.{e}"))?,
            None => default.pool_mode,
        },
        admission: match &c.admission {
            Some(m) => m.parse().map_err(|e| anyhow::anyhow!("upstream.{e}"))?,
            None => default.admission,
        },
        auth_query: match &c.auth_query {
            None | Some(config::AuthQueryConfig::On(false)) => None,
            Some(config::AuthQueryConfig::On(true)) => {
                Some(sluice_server::upstream::DEFAULT_AUTH_QUERY.to_string())
            }
            Some(config::AuthQueryConfig::Sql(sql)) => {
                if !sql.contains("$1") {
                    anyhow::bail!(
                        "upstream.auth_query: the query must name the role as $1, got {sql:?}"
                    );
                }
                Some(sql.clone())
            }
        },
    }))
}

fn local(file: &Path, cores: Option<u32>, memory: Option<u64>) -> anyhow::Result<ExitCode> {
    let script = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read standard input")?;
        s
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?
    };
    let state = tempfile::tempdir().context("cannot create a temporary data dir")?;
    let detected = machine::detect();
    let options = sluice_server::ServerOptions::new(
        state.path(),
        Machine {
            cores: cores.unwrap_or(detected.cores),
            memory: memory.unwrap_or(detected.memory),
        },
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let shared = sluice_server::Shared::open(options).map_err(|e| anyhow::anyhow!("{e}"))?;
        let connection = sluice_server::local_connection(shared);
        let mut all_ok = true;
        let mut out = std::io::stdout().lock();
        for statement in sluice_server::script_statements(&script) {
            writeln!(out, ">> {}", sluice_sql::collapse_whitespace(&statement))?;
            match connection.run_local(&statement).await {
                Ok(sluice_server::LocalOutput::Ok) => writeln!(out, "OK")?,
                Ok(sluice_server::LocalOutput::Rows { header, rows }) => {
                    writeln!(out, "{}", header.join("\t"))?;
                    for row in rows {
                        writeln!(out, "{}", row.join("\t"))?;
                    }
                }
                Err(e) => {
                    all_ok = false;
                    writeln!(out, "ERROR {}: {e}", e.code.name())?;
                }
            }
        }
        Ok(if all_ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    })
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { .. } => unreachable!("handled in main"),
        Command::Passwd => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("cannot read the password from standard input")?;
            let password = line.trim_end_matches(['\r', '\n']);
            if password.is_empty() {
                anyhow::bail!(
                    "empty password: type it on standard input, e.g. `sluice passwd <<< 'secret'`"
                );
            }
            let verifier =
                sluice_server::auth::make_verifier(password).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{verifier}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Local {
            file,
            cores,
            memory,
        } => local(&file, cores, memory),
        Command::Simulate {
            ddl,
            trace,
            compare,
            generate,
            queries,
            hours,
            seed,
            scale,
            fast_under,
            each,
            cores,
            memory,
        } => {
            if let Some(kind) = generate {
                if kind != "reports" {
                    anyhow::bail!("--generate {kind}: the kinds are: reports");
                }
                if !(hours > 0.0 && scale > 0.0 && hours.is_finite() && scale.is_finite()) {
                    anyhow::bail!("--hours and --scale must be positive numbers");
                }
                print!(
                    "{}",
                    simulate::generate_reports(simulate::ReportsTrace {
                        queries,
                        hours,
                        seed,
                        scale,
                    })
                );
                return Ok(ExitCode::SUCCESS);
            }
            let (Some(ddl), Some(trace_path)) = (ddl, trace) else {
                anyhow::bail!("simulate needs a DDL script and a trace (or --generate)");
            };
            if !(fast_under.is_finite() && fast_under >= 0.0) {
                anyhow::bail!("--fast-under must be a number of seconds");
            }
            let detected = machine::detect();
            let machine = Machine {
                cores: cores.unwrap_or(detected.cores),
                memory: memory.unwrap_or(detected.memory),
            };
            let trace = simulate::read_trace(&trace_path)?;
            let mut results = Vec::new();
            for script in std::iter::once(&ddl).chain(compare.as_ref()) {
                let text = std::fs::read_to_string(script)
                    .with_context(|| format!("cannot read {}", script.display()))?;
                let mut catalog = Catalog::new();
                for item in parse_script(&text) {
                    item.result
                        .and_then(|stmt| catalog.apply_mut(&stmt))
                        .map_err(|e| anyhow::anyhow!("{}: {}: {e}", script.display(), item.text))?;
                }
                let (figures, fates) = simulate::report(
                    &catalog,
                    machine,
                    &trace,
                    std::time::Duration::from_secs_f64(fast_under),
                )?;
                results.push((script.display().to_string(), figures, fates));
            }
            println!(
                "sluice simulate: {} statements of {}; admission only (each holds its QUERY slots for its service time alone), in virtual time",
                trace.len(),
                trace_path.display()
            );
            if each {
                for (script, _, fates) in &results {
                    println!("\n{script}:");
                    print!("{}", simulate::each(fates, &trace));
                }
                println!();
            }
            let tables: Vec<_> = results.into_iter().map(|(s, f, _)| (s, f)).collect();
            print!("{}", simulate::table(&tables));
            Ok(ExitCode::SUCCESS)
        }
        Command::Check {
            dump,
            strict,
            common,
        } => {
            let setup = common.setup(None, false)?;
            let mut catalog = setup.catalog;
            let mut all_ok = true;
            let mut out = String::new();
            for item in parse_script(&setup.script) {
                out.push_str(&format!(">> {}\n", item.text));
                let strict_ok = |stmt: sluice_sql::Statement| {
                    if strict {
                        sluice_catalog::strict::refuse_extensions(&stmt)?;
                    }
                    Ok(stmt)
                };
                match item
                    .result
                    .and_then(strict_ok)
                    .and_then(|stmt| catalog.apply_mut(&stmt))
                {
                    Ok(_) => out.push_str("OK\n"),
                    Err(e) => {
                        all_ok = false;
                        out.push_str(&format!("ERROR {}: {e}\n", e.code.name()));
                    }
                }
            }
            if dump {
                out.push_str(
                    &dump::dump(&catalog, setup.machine).map_err(|e| anyhow::anyhow!("{e}"))?,
                );
            }
            print!("{out}");
            Ok(if all_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Apply { common } => {
            let setup = common.setup(Some(Path::new("sluice-data")), true)?;
            let storage = setup.storage.context("apply needs a data dir")?;
            let mut catalog = setup.catalog;
            for item in parse_script(&setup.script) {
                println!(">> {}", item.text);
                let applied =
                    item.result
                        .and_then(|stmt| catalog.apply(&stmt))
                        .and_then(|(next, change)| {
                            if let Some(change) = &change {
                                storage.persist(change)?;
                            }
                            Ok(next)
                        });
                match applied {
                    Ok(next) => {
                        catalog = next;
                        println!("OK");
                    }
                    Err(e) => {
                        println!("ERROR {}: {e}", e.code.name());
                        return Ok(ExitCode::from(1));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod allocator_tests {
    use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};

    /// Every block the global allocator hands out has its layout's alignment, through either
    /// of its paths (`mi_malloc` where that guarantees it, the aligned one otherwise), and
    /// keeps its bytes when it grows or shrinks across the line between them.
    #[test]
    #[allow(unsafe_code)]
    fn every_block_has_its_alignment() {
        for align in [1usize, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1usize, 3, 8, 12, 16, 24, 40, 48, 100, 1000, 70_000] {
                let layout = Layout::from_size_align(size, align).expect("layout");
                // Several at once, so that blocks at other offsets of a page are seen too.
                let blocks: Vec<*mut u8> = (0..16)
                    .map(|i| {
                        // SAFETY: `layout` has a non-zero size; each block is freed below.
                        let p = unsafe {
                            if i % 2 == 0 {
                                alloc(layout)
                            } else {
                                alloc_zeroed(layout)
                            }
                        };
                        assert!(!p.is_null());
                        assert_eq!(p as usize % align, 0, "size {size} align {align}");
                        if i % 2 == 1 {
                            // SAFETY: `p` holds `size` bytes, zeroed.
                            let bytes = unsafe { std::slice::from_raw_parts(p, size) };
                            assert!(bytes.iter().all(|&b| b == 0));
                        }
                        p
                    })
                    .collect();
                for p in blocks {
                    // SAFETY: written within the block, then grown, shrunk and freed with the
                    // layouts it has at each step.
                    unsafe {
                        p.write(0xA5);
                        let grown = realloc(p, layout, size * 3 + 17);
                        assert_eq!(grown as usize % align, 0, "grown {size} align {align}");
                        assert_eq!(grown.read(), 0xA5);
                        let big = Layout::from_size_align(size * 3 + 17, align).expect("layout");
                        let shrunk = realloc(grown, big, 1);
                        assert_eq!(shrunk as usize % align, 0, "shrunk {size} align {align}");
                        assert_eq!(shrunk.read(), 0xA5);
                        dealloc(shrunk, Layout::from_size_align(1, align).expect("layout"));
                    }
                }
            }
        }
    }
}
