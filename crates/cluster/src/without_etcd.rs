//! A build without the etcd client (no `etcd` feature): joining a fleet is refused, saying
//! how to build a sluice that can.

use sluice_sql::{Error, ErrorCode, Result};

use crate::{
    CatalogChange, ClusterOptions, Commit, FleetView, Followed, Handler, LeaseState, Node,
    StoredCatalog,
};

fn without_the_fleet(options: &ClusterOptions) -> Error {
    Error::new(
        ErrorCode::KeeperException,
        format!(
            "[cluster] names etcd ({}), but this sluice was built without the fleet: build it with `cargo build --release --features cluster` (which needs protoc: Debian's protobuf-compiler)",
            options.endpoints.join(", ")
        ),
    )
}

/// Refused: this build has no etcd client.
pub async fn read_catalog(options: &ClusterOptions) -> Result<StoredCatalog> {
    Err(without_the_fleet(options))
}

/// This node's place in a fleet; a build without etcd never has one.
#[derive(Debug)]
pub struct Membership {
    never: std::convert::Infallible,
}

impl Membership {
    /// Refused: this build has no etcd client.
    pub async fn join(options: ClusterOptions, _address: &str) -> Result<Membership> {
        Err(without_the_fleet(&options))
    }

    pub fn catalog(&self) -> CatalogStore {
        match self.never {}
    }

    pub fn nodes(&self) -> Vec<Node> {
        match self.never {}
    }

    pub fn name(&self) -> &str {
        match self.never {}
    }

    pub fn lease(&self) -> i64 {
        match self.never {}
    }

    pub fn is_lost(&self) -> bool {
        match self.never {}
    }

    pub fn alive(&self) -> tokio::sync::watch::Receiver<LeaseState> {
        match self.never {}
    }

    pub fn share_book(&self) -> ShareBook {
        match self.never {}
    }

    pub fn number(&self) -> u64 {
        match self.never {}
    }

    pub fn requests(&self) -> Requests {
        match self.never {}
    }

    pub fn map(&self, _name: &str) -> SharedMap {
        match self.never {}
    }

    pub async fn leave(&self) {
        match self.never {}
    }
}

/// The fleet's catalog in etcd; a build without etcd never has one.
#[derive(Debug, Clone)]
pub struct CatalogStore {
    never: std::convert::Infallible,
}

impl CatalogStore {
    pub async fn load(&self) -> Result<StoredCatalog> {
        match self.never {}
    }

    pub async fn commit(
        &self,
        _change: &CatalogChange,
        _validated_at: i64,
        _by: &str,
    ) -> Result<Commit> {
        match self.never {}
    }

    pub async fn follow(
        &self,
        _revision: i64,
        _changes: tokio::sync::mpsc::Sender<Followed>,
    ) -> Result<()> {
        match self.never {}
    }
}

/// The fleet's shares in etcd; a build without etcd never has them.
#[derive(Debug, Clone)]
pub struct ShareBook {
    never: std::convert::Infallible,
}

impl ShareBook {
    pub async fn publish_demand(&self, _lease: i64, _text: &str) -> Result<()> {
        match self.never {}
    }

    pub async fn lower(
        &self,
        _lease: i64,
        _workload: &str,
        _to: i64,
        _revision: i64,
    ) -> Result<Option<i64>> {
        match self.never {}
    }

    pub async fn settle(&self, _lease: i64, _workload: &str) -> Result<(i64, i64)> {
        match self.never {}
    }

    pub async fn grow(
        &self,
        _lease: i64,
        _workload: &str,
        _want: i64,
        _limit: i64,
        _catalog_version: i64,
        _revision: i64,
    ) -> Result<(i64, i64)> {
        match self.never {}
    }

    pub async fn follow(&self, _view: tokio::sync::watch::Sender<FleetView>) {
        match self.never {}
    }
}

/// Requests between the fleet's nodes; a build without etcd never has them.
#[derive(Debug, Clone)]
pub struct Requests {
    never: std::convert::Infallible,
}

impl Requests {
    pub async fn ask(
        &self,
        _lease: i64,
        _what: &str,
        _body: &[u8],
        _nodes: &[String],
        _wait: std::time::Duration,
    ) -> Result<std::collections::BTreeMap<String, std::result::Result<Vec<u8>, String>>> {
        match self.never {}
    }

    pub async fn answer(&self, _handler: Handler) {
        match self.never {}
    }
}

/// One change of a shared map (see the `etcd` build's `SharedMap`).
pub type MapChange = (String, Option<String>);

/// A map the fleet shares; a build without etcd never has one.
#[derive(Debug, Clone)]
pub struct SharedMap {
    never: std::convert::Infallible,
}

impl SharedMap {
    pub async fn put(&self, _key: &str, _value: &str) -> Result<()> {
        match self.never {}
    }

    pub async fn delete(&self, _key: &str) -> Result<()> {
        match self.never {}
    }

    pub async fn load(&self) -> Result<(Vec<(String, String)>, i64)> {
        match self.never {}
    }

    pub async fn follow(
        &self,
        _from: i64,
        _changes: tokio::sync::mpsc::UnboundedSender<MapChange>,
    ) -> Result<()> {
        match self.never {}
    }
}
