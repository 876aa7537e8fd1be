//! The shares of the fleet's limits in etcd (the `etcd` feature).
//!
//! Keys, under `PREFIX/fleet/`:
//! - `demand/NODE`: what a node has waiting and running, by workload (its text is the
//!   server's), under the node's lease;
//! - `shares/LIMIT/NODE`: what the node holds of `LIMIT` (see [`crate::limit_key`]: one limit of one
//!   workload, such as `slots:W`), under the node's lease, so that a node that dies gives its
//!   shares back when its lease expires;
//! - `guard/LIMIT`: rewritten by every growth of a share of `LIMIT`.
//!
//! The invariant, for every limit `W` of size `L` and at every revision of etcd: the
//! shares of `W` sum to at most `L`. A share only grows by [`ShareBook::grow`]: one
//! transaction that compares `guard/W`'s revision with the one read before the shares were
//! summed (and the catalog's version with the one the limit was read from), and writes the
//! share and the guard. So growths are serialized, and each saw every share that existed when
//! it was stored; everything else — a node lowering its share, a lease expiring — only lowers
//! the sum. A node uses no more than the share etcd stored for it, and only while its lease
//! certainly lives (`LeaseState::until`).
//!
//! "The share etcd stored for it" must be known, not guessed: a write whose answer was lost
//! (a timeout, etcd without quorum) may be stored later. So every write of a node's share
//! compares its key's revision with the one the node last knew, and after any unanswered
//! write the node settles ([`ShareBook::settle`]: reads the share and writes it again
//! unchanged, compared on the revision read) before it raises its use of any share: no
//! earlier write can be stored after that. Keys are never deleted by their node (a share of
//! 0 stays as "0"), so a revision compared is never that of an absent key come back.

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use sluice_sql::Result;

use crate::retry::{etcd_error, retried};
use crate::FleetView;

/// This node's side of the fleet's shares in etcd.
#[derive(Clone)]
pub struct ShareBook {
    client: Client,
    /// `PREFIX/fleet`.
    prefix: String,
    /// `PREFIX/catalog`, whose revision is the catalog's version.
    catalog: String,
    node: String,
    endpoints: Vec<String>,
}

impl std::fmt::Debug for ShareBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShareBook")
            .field("prefix", &self.prefix)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl ShareBook {
    pub(crate) fn new(client: Client, prefix: &str, node: &str, endpoints: Vec<String>) -> Self {
        let prefix = prefix.trim_end_matches('/');
        ShareBook {
            client,
            prefix: format!("{prefix}/fleet"),
            catalog: format!("{prefix}/catalog"),
            node: node.to_string(),
            endpoints,
        }
    }

    fn share_key(&self, workload: &str, node: &str) -> String {
        format!("{}/shares/{workload}/{node}", self.prefix)
    }

    fn guard_key(&self, workload: &str) -> String {
        format!("{}/guard/{workload}", self.prefix)
    }

    /// Publishes this node's demand (under its lease: it goes when the node does).
    pub async fn publish_demand(&self, lease: i64, text: &str) -> Result<()> {
        let key = format!("{}/demand/{}", self.prefix, self.node);
        retried!(
            "cannot publish the node's demand",
            &self.endpoints,
            self.client
                .clone()
                .put(
                    key.as_str(),
                    text,
                    Some(PutOptions::new().with_lease(lease))
                )
                .await
        );
        Ok(())
    }

    /// Lowers this node's share of `workload` to `to`, if its key is still at `revision` (the
    /// revision of the write the node last knew of). The key's new revision; `None` when it
    /// had moved (a write whose answer was lost was stored after all): the caller settles.
    ///
    /// Every write of a node's share compares the revision it was based on, so that a write
    /// whose answer was lost cannot be stored after a later one (see [`ShareBook::settle`]).
    pub async fn lower(
        &self,
        lease: i64,
        workload: &str,
        to: i64,
        revision: i64,
    ) -> Result<Option<i64>> {
        let key = self.share_key(workload, &self.node);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::put(
                key.as_str(),
                to.max(0).to_string(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        // Not retried: an unanswered try may be stored later; the caller settles instead.
        let done = self
            .client
            .clone()
            .txn(txn)
            .await
            .map_err(|e| etcd_error("cannot lower a share", &self.endpoints, e))?;
        Ok(done
            .succeeded()
            .then(|| done.header().map_or(0, |h| h.revision())))
    }

    /// This node's share of `workload` as stored, made certain: read, then written again
    /// unchanged compared on the revision read, so that no earlier write whose answer was
    /// lost can be stored after it. The share and its key's revision.
    pub async fn settle(&self, lease: i64, workload: &str) -> Result<(i64, i64)> {
        let key = self.share_key(workload, &self.node);
        for _ in 0..8 {
            let read = retried!(
                "cannot read a share",
                &self.endpoints,
                self.client.clone().get(key.as_str(), None).await
            );
            let (value, revision) = read.kvs().first().map_or((0, 0), |kv| {
                let value = kv.value_str().ok().and_then(|v| v.parse().ok());
                (value.unwrap_or(0), kv.mod_revision())
            });
            if let Some(revision) = self.lower(lease, workload, value, revision).await? {
                return Ok((value, revision));
            }
        }
        Err(sluice_sql::Error::new(
            sluice_sql::ErrorCode::KeeperException,
            format!("etcd: this node's share of '{workload}' kept changing under it"),
        ))
    }

    /// Grows this node's share of `workload` toward `want`, within `limit` less the other
    /// nodes' shares, if the catalog is still at `catalog_version` (the version `limit` was
    /// read from), and if this node's key is still at `revision` (see [`ShareBook::lower`]).
    /// Returns the share stored for this node now and its key's revision: grown, or as it was
    /// when it could not grow (the others hold the rest, the catalog moved: the caller tries
    /// again when the view changes). An error leaves what was stored unknown: settle.
    pub async fn grow(
        &self,
        lease: i64,
        workload: &str,
        want: i64,
        limit: i64,
        catalog_version: i64,
        revision: i64,
    ) -> Result<(i64, i64)> {
        let guard = self.guard_key(workload);
        let shares = self.share_key(workload, "");
        let mine_key = self.share_key(workload, &self.node);
        let mut mine = (0, revision);
        for _ in 0..8 {
            let mut client = self.client.clone();
            // The guard first: a growth stored after this read fails the comparison below.
            let seen = retried!(
                "cannot read a share's guard",
                &self.endpoints,
                client.get(guard.as_str(), None).await
            );
            let seen = seen.kvs().first().map_or(0, |kv| kv.mod_revision());
            let all = retried!(
                "cannot read the shares",
                &self.endpoints,
                client
                    .get(shares.as_str(), Some(GetOptions::new().with_prefix()))
                    .await
            );
            let mut others = 0;
            let mut seen_mine = 0;
            for kv in all.kvs() {
                let value: i64 = kv
                    .value_str()
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                if kv.key_str().ok() == Some(mine_key.as_str()) {
                    seen_mine = kv.mod_revision();
                    mine.0 = value;
                } else {
                    others += value;
                }
            }
            if seen_mine != revision {
                // A write the caller does not know of (one whose answer was lost): it must
                // settle before it grows.
                return Err(sluice_sql::Error::new(
                    sluice_sql::ErrorCode::KeeperException,
                    format!(
                        "etcd: this node's share of '{workload}' changed under it; settling it"
                    ),
                ));
            }
            let to = want.min(limit - others);
            if to <= mine.0 {
                return Ok(mine);
            }
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(guard.as_str(), CompareOp::Equal, seen),
                    Compare::mod_revision(self.catalog.as_str(), CompareOp::Equal, catalog_version),
                    Compare::mod_revision(mine_key.as_str(), CompareOp::Equal, revision),
                ])
                .and_then([
                    TxnOp::put(
                        mine_key.as_str(),
                        to.to_string(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    TxnOp::put(guard.as_str(), self.node.as_str(), None),
                ]);
            // Not retried: an unanswered try may be stored later; the caller settles instead.
            match client.txn(txn).await {
                Ok(done) if done.succeeded() => {
                    return Ok((to, done.header().map_or(0, |h| h.revision())))
                }
                Ok(_) => continue,
                Err(e) => return Err(etcd_error("cannot grow a share", &self.endpoints, e)),
            }
        }
        Ok(mine)
    }

    /// Keeps `view` equal to the fleet's demand and shares: a read of them all, then their
    /// changes by watch; read again whenever the watch breaks. Runs until `view` has no
    /// receiver.
    pub async fn follow(&self, view: tokio::sync::watch::Sender<FleetView>) {
        while !view.is_closed() {
            if let Err(e) = self.follow_once(&view).await {
                tracing::warn!("following the fleet's shares: {e}; reading them again");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }

    async fn follow_once(
        &self,
        view: &tokio::sync::watch::Sender<FleetView>,
    ) -> std::result::Result<(), etcd_client::Error> {
        let mut client = self.client.clone();
        let root = format!("{}/", self.prefix);
        let all = client
            .get(root.as_str(), Some(GetOptions::new().with_prefix()))
            .await?;
        let mut now = FleetView {
            revision: all.header().map_or(0, |h| h.revision()),
            ..FleetView::default()
        };
        for kv in all.kvs() {
            self.apply(
                &mut now,
                kv.key_str().unwrap_or(""),
                Some(kv.value_str().unwrap_or("")),
            );
        }
        view.send_replace(now.clone());
        let mut changes = client
            .watch(
                root.as_str(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(now.revision + 1),
                ),
            )
            .await?;
        while let Some(change) = changes.message().await? {
            for event in change.events() {
                let Some(kv) = event.kv() else { continue };
                let value = match event.event_type() {
                    EventType::Put => Some(kv.value_str().unwrap_or("")),
                    EventType::Delete => None,
                };
                self.apply(&mut now, kv.key_str().unwrap_or(""), value);
            }
            if let Some(header) = change.header() {
                now.revision = header.revision();
            }
            if view.send(now.clone()).is_err() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// One key's value (`None`: deleted) into `view`.
    fn apply(&self, view: &mut FleetView, key: &str, value: Option<&str>) {
        let Some(rest) = key
            .strip_prefix(&self.prefix)
            .and_then(|k| k.strip_prefix('/'))
        else {
            return;
        };
        if let Some(node) = rest.strip_prefix("demand/") {
            match value {
                Some(v) => view.demand.insert(node.to_string(), v.to_string()),
                None => view.demand.remove(node),
            };
        } else if let Some(share) = rest.strip_prefix("shares/") {
            // Neither a limit's key nor a node's name holds '/'.
            let Some((workload, node)) = share.rsplit_once('/') else {
                return;
            };
            let shares = view.shares.entry(workload.to_string()).or_default();
            match value.and_then(|v| v.parse::<i64>().ok()) {
                Some(v) => shares.insert(node.to_string(), v),
                None => shares.remove(node),
            };
            if shares.is_empty() {
                view.shares.remove(workload);
            }
        }
    }
}
