//! # sluice-cluster: several sluice nodes as one fleet, coordinated through etcd
//!
//! Owns the etcd client, the fleet's catalog store (`catalog.rs`: one key per entity, a change
//! as one transaction compared on the version it was validated against, followed by watch)
//! and the fleet's membership: a node joins under a lease of `lease_ttl`
//! (its key `PREFIX/nodes/NAME` lives exactly as long as the lease), keeps the lease alive,
//! and follows the fleet's members by watch, so the list it shows costs no round trip; the
//! lease's renewals say until when it certainly lives ([`LeaseState`]), and a lease lost is
//! replaced by a new one. The shares of the fleet's limits (`shares.rs`: each node's share
//! of a limit under its lease, grown only by a transaction that keeps their sum within the
//! limit; rates and waiting limits alike, by their limit's key) and the demand each node
//! publishes; a node's number (`PREFIX/numbers/K`, unique among live nodes: statement ids);
//! requests between nodes (`requests.rs`: one node asks, the named nodes answer, all through
//! etcd); maps the fleet shares durably (`map.rs`: the learned lanes).
//!
//! Invariants:
//! - A node's key exists only while its lease does: a node that dies leaves the fleet within
//!   `lease_ttl`, and one that leaves cleanly ([`Membership::leave`]) at once.
//! - Two live nodes never hold one name: a join under a name whose key exists is refused (one
//!   etcd transaction compares the key's creation and writes it).
//! - What [`Membership::nodes`] shows is etcd's members as of the last watch event.
//! - A limit's shares in etcd never sum above the limit (see `shares.rs`).
//! - Two live nodes never hold one number (claimed by a transaction comparing its key's
//!   creation, under the node's lease).
//!
//! Must not: schedule anything or know SQL beyond the error type; `sluice-server` wires it.
//!
//! The etcd client is the `etcd` feature (the root package's `cluster`): its build generates
//! gRPC code with `protoc`, which a machine with only the Rust toolchain lacks, so the default
//! build has the types and refuses to join a fleet, saying how to build one that can.

use std::time::Duration;

#[cfg(feature = "etcd")]
mod catalog;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod map;
#[cfg(feature = "etcd")]
mod requests;
#[cfg(feature = "etcd")]
mod retry;
#[cfg(feature = "etcd")]
mod shares;
#[cfg(feature = "etcd")]
pub use catalog::CatalogStore;
#[cfg(feature = "etcd")]
pub use etcd::{read_catalog, Membership};
#[cfg(feature = "etcd")]
pub use map::{MapChange, SharedMap};
#[cfg(feature = "etcd")]
pub use requests::Requests;
#[cfg(feature = "etcd")]
pub use shares::ShareBook;

#[cfg(not(feature = "etcd"))]
mod without_etcd;
#[cfg(not(feature = "etcd"))]
pub use without_etcd::{
    read_catalog, CatalogStore, MapChange, Membership, Requests, ShareBook, SharedMap,
};

/// `[cluster]`: where etcd is and who this node is.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterOptions {
    /// etcd's client URLs (`http://127.0.0.1:2379`, …).
    pub endpoints: Vec<String>,
    /// The key prefix the fleet's keys live under (several fleets may share one etcd).
    pub prefix: String,
    /// This node's name in the fleet (default: the host's name).
    pub node: String,
    /// How long a node's lease lasts without renewal: a dead node leaves the fleet after it.
    pub lease_ttl: Duration,
    /// etcd's user and password, when etcd has authentication on.
    pub user: Option<(String, String)>,
    /// TLS to etcd (`https://` endpoints): the CA that signed etcd's certificate, and this
    /// node's certificate and key when etcd asks clients for one (`--client-cert-auth`).
    pub tls: Option<TlsFiles>,
    /// Stop the statements holding QUERY slots the moment this node's fence passes (its lease
    /// in doubt), instead of letting them finish: the fleet's limits then hold strictly.
    pub cancel_at_fence: bool,
}

/// The files of [`ClusterOptions::tls`], PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: std::path::PathBuf,
    pub cert_and_key: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// [`ClusterOptions::lease_ttl`] when the config says nothing.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// The key prefix when the config says nothing.
pub const DEFAULT_PREFIX: &str = "/sluice";

/// A member of the fleet, as its key in etcd says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    /// Where clients reach it (its Postgres-wire listen address).
    pub address: String,
    /// Its lease in etcd.
    pub lease: i64,
    /// When it joined (seconds since the Unix epoch).
    pub joined: u64,
    /// Whether it is the node asking.
    pub this: bool,
}

/// The node's lease, and until when it certainly lives by this node's clock (`None`: it
/// was lost; the node is joining again). Shares of the fleet's limits are usable only
/// before `until`: etcd cannot have given them to another node by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseState {
    pub lease: i64,
    pub until: Option<tokio::time::Instant>,
}

/// The name of one limit of one workload in the fleet's keys: `KIND:WORKLOAD` with `%` and
/// `/` escaped (workload names may hold `/`; a limit's name must not, so that the prefix
/// `shares/LIMIT/` holds its shares and no other's).
pub fn limit_key(kind: &str, workload: &str) -> String {
    format!(
        "{kind}:{}",
        workload.replace('%', "%25").replace('/', "%2F")
    )
}

/// The kind and workload of a [`limit_key`].
pub fn parse_limit_key(key: &str) -> Option<(&str, String)> {
    let (kind, workload) = key.split_once(':')?;
    Some((kind, workload.replace("%2F", "/").replace("%25", "%")))
}

/// What a node does with a request: `(what, body)` to its answer, or an error for the asker.
pub type Handler = std::sync::Arc<
    dyn Fn(
            String,
            Vec<u8>,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = std::result::Result<Vec<u8>, String>> + Send>,
        > + Send
        + Sync,
>;

/// What the fleet has published of demand and shares, as of a watch event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetView {
    /// Each node's demand, as it published it (text; the server reads it).
    pub demand: std::collections::BTreeMap<String, String>,
    /// Each limited workload's shares, by node.
    pub shares: std::collections::BTreeMap<String, std::collections::BTreeMap<String, i64>>,
    /// etcd's revision of the view.
    pub revision: i64,
}

/// One change of the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogChange {
    /// Creates or replaces entity `kind`/`name` with its canonical statement.
    Upsert {
        kind: String,
        name: String,
        statement: String,
    },
    Remove {
        kind: String,
        name: String,
    },
}

/// The catalog as stored at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCatalog {
    /// Every entity: kind, name, canonical statement (in key order).
    pub entities: Vec<(String, String, String)>,
    /// The version key's revision: what a change validated against this state compares.
    pub version: i64,
    /// etcd's revision when it was read: changes after it are followed from `revision + 1`.
    pub revision: i64,
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Commit {
    /// Stored, at this revision (the catalog's new version).
    Done { revision: i64 },
    /// The catalog changed since the version the change was validated against (it is now at
    /// `version`): nothing was stored.
    Moved { version: i64 },
}

/// A change as a follower sees it, with the revision it was stored at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Followed {
    pub revision: i64,
    pub change: CatalogChange,
}
