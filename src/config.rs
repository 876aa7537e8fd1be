//! `sluice.toml`. Unknown keys are errors, so a typo
//! stops the start with a message naming the key. See docs/config.md.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub catalog: CatalogConfig,
    /// `[disks.NAME] path = "…"`: the disks `READ DISK`/`WRITE DISK` resources name.
    #[serde(default)]
    pub disks: BTreeMap<String, DiskConfig>,
    /// `[http] listen`: the metrics and the live page.
    #[serde(default)]
    pub http: MetricsConfig,
    /// `[metrics] listen`: the same as `[http] listen` (its earlier name).
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub users: Vec<UserConfig>,
    pub tls: Option<TlsConfig>,
    pub upstream: Option<UpstreamConfig>,
    pub cluster: Option<ClusterConfig>,
}

/// `[cluster]`: a fleet of nodes on etcd (a build with the `cluster` feature).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd's client URLs.
    pub etcd: Vec<String>,
    /// The key prefix of the fleet's keys [default: /sluice].
    pub prefix: Option<String>,
    /// This node's name [default: the host's name].
    pub node: Option<String>,
    /// Seconds a node's lease lasts without renewal [default: 10].
    pub lease_ttl: Option<f64>,
    /// etcd's user and password, when etcd has authentication on.
    pub user: Option<String>,
    pub password: Option<String>,
    /// TLS to etcd: the CA that signed etcd's certificate (PEM), and this node's certificate
    /// and key when etcd asks clients for one.
    pub tls_ca: Option<std::path::PathBuf>,
    pub tls_cert: Option<std::path::PathBuf>,
    pub tls_key: Option<std::path::PathBuf>,
    /// Stop running statements when the node's fence passes [default: false].
    pub cancel_at_fence: Option<bool>,
}

/// `[upstream]`: the database sluice fronts (upstream mode).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// `postgres://user[:password]@host[:port]/db[?sslmode=…&connect_timeout=…]`.
    pub url: String,
    /// Connections to the upstream at most [default: 20].
    pub pool_size: Option<usize>,
    /// `'session'` (default) or `'transaction'`.
    pub pool_mode: Option<String>,
    /// `'statement'` (default) or `'transaction'`.
    pub admission: Option<String>,
    /// Seconds to wait for a connection to the upstream [default: the URL's, else 10].
    pub connect_timeout: Option<f64>,
    /// Clients log in as the upstream's roles, with their passwords: `true` (PgBouncer's
    /// query on `pg_shadow`) or the SQL that reads a role's SCRAM verifier (`$1` its name).
    pub auth_query: Option<AuthQueryConfig>,
    /// Seconds an upstream connection may sit idle in a pool before it is closed; 0: never
    /// [default: 600, PgBouncer's].
    pub server_idle_timeout: Option<f64>,
    /// Transaction pooling: statements one upstream connection keeps prepared at most
    /// [default: 200, PgBouncer's].
    pub max_prepared_statements: Option<usize>,
}

/// `auth_query = true` or `auth_query = "SELECT …"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum AuthQueryConfig {
    On(bool),
    Sql(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    pub path: PathBuf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where Prometheus scrapes `/metrics` and browsers find the live page (`/`); unset: no
    /// HTTP endpoint.
    pub listen: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// A SCRAM-SHA-256 verifier from `sluice passwd` (never a plain password).
    pub scram: String,
    #[serde(default)]
    pub admin: bool,
    pub default_workload: Option<String>,
    pub pinned_workload: Option<String>,
    /// This user's default hard limit, in seconds (a query's own setting wins).
    pub max_execution_time: Option<f64>,
    /// How long this user's queries may wait for admission, in milliseconds (0: forever);
    /// the query's and the session's `workload_admission_timeout_ms` win.
    pub workload_admission_timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// The address `sluice serve` listens on; default `127.0.0.1:6543`.
    pub listen: Option<String>,
    /// Queries in a workload the catalog does not know fail with RESOURCE_ACCESS_DENIED
    /// instead of running unlimited; default false.
    pub throw_on_unknown_workload: Option<bool>,
    /// Where the catalog (and later the data) lives; default `./sluice-data`.
    pub data_dir: Option<PathBuf>,
    /// Cores the ratio settings resolve against; default: what the machine has.
    pub cores: Option<u32>,
    /// Memory in bytes the ratio settings resolve against; default: what the machine has.
    pub memory: Option<u64>,
    /// How long running queries may finish after SIGTERM/SIGINT; default 30000.
    pub shutdown_grace_ms: Option<u64>,
    /// CPU slots: whether a running query yields its slot after a quantum (ClickHouse's
    /// `cpu_slot_preemption`); default false. Takes effect with the CPU resource.
    pub cpu_slot_preemption: Option<bool>,
    /// CPU slots: the quantum of CPU time between preemption checks; default 10000000 (10 ms).
    pub cpu_slot_quantum_ns: Option<u64>,
    /// CPU slots: how long a preempted thread waits to get its slot back before it gives up
    /// its place; default 1000.
    pub cpu_slot_preemption_timeout_ms: Option<u64>,
    /// Rows `system.query_log` keeps (newest); default 10000, 0 keeps none.
    pub query_log_size: Option<usize>,
    /// Refuse sluice's own workload settings in DDL (keep a catalog ClickHouse loads).
    pub strict_clickhouse: Option<bool>,
    /// The share of `memory` the engine's queries may hold together; default 0.8.
    pub engine_memory_ratio: Option<f64>,
    /// Threads client connections run on, each a runtime of its own (a connection stays on
    /// one); default: the machine's cores, 1 on two cores or fewer; 0 runs them on one shared
    /// multi-threaded runtime.
    pub connection_threads: Option<usize>,
    /// A file every QUERY slot granted and given back is appended to (off by default).
    pub admission_log: Option<std::path::PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogConfig {
    /// `;`-separated CREATE statements: a read-only layer of entities.
    #[serde(default)]
    pub statements: String,
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}
