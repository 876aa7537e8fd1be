//! The fleet's catalog in etcd (the `etcd` feature): one key per SQL-defined entity,
//! `PREFIX/catalog/KIND/NAME`, holding its canonical `CREATE …` text, and the catalog's version
//! key `PREFIX/catalog`, rewritten by every change. A change is one transaction that compares
//! the version key's revision with the one the change was validated against: of two nodes
//! racing, one commits and the other is told the catalog moved ([`Commit::Moved`]) — it
//! validates again on the newer catalog, never half-applies. Every node follows the changes
//! in revision order ([`CatalogStore::follow`]).
//!
//! Invariant: the entities under the prefix are always the result of whole changes, each
//! validated against the catalog as it stood just before it.

use std::time::Instant;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use sluice_sql::Result;

use crate::retry::{etcd_error, pause, transient};
use crate::{CatalogChange, Commit, Followed, StoredCatalog};

/// The fleet's catalog in etcd.
#[derive(Clone)]
pub struct CatalogStore {
    client: Client,
    prefix: String,
    endpoints: Vec<String>,
}

impl std::fmt::Debug for CatalogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A token for one commit, written as the version key's value: a commit retried after a
/// failure that left it unknown whether it was stored finds out by it.
fn commit_token(by: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{by} {nanos} {}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The largest change (key and statement) the catalog stores: etcd's default request limit
/// (1.5 MiB) less room for the rest of the transaction.
pub const MAX_CHANGE_BYTES: usize = 1024 * 1024 + 256 * 1024;

impl CatalogStore {
    pub(crate) fn new(client: Client, prefix: &str, endpoints: Vec<String>) -> CatalogStore {
        CatalogStore {
            client,
            prefix: format!("{}/catalog", prefix.trim_end_matches('/')),
            endpoints,
        }
    }

    fn entity_key(&self, kind: &str, name: &str) -> String {
        format!("{}/{kind}/{name}", self.prefix)
    }

    /// Kind and name of an entity key (`None` for the version key or another key).
    fn entity_of(&self, key: &str) -> Option<(String, String)> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('/')?;
        let (kind, name) = rest.split_once('/')?;
        Some((kind.to_string(), name.to_string()))
    }

    /// The whole catalog, as of now.
    pub async fn load(&self) -> Result<StoredCatalog> {
        let (began, mut attempt) = (Instant::now(), 0);
        let read = loop {
            match self
                .client
                .clone()
                .get(self.prefix.as_str(), Some(GetOptions::new().with_prefix()))
                .await
            {
                Ok(read) => break read,
                Err(e) if transient(&e) && pause(began, &mut attempt).await => continue,
                Err(e) => return Err(etcd_error("cannot read the catalog", &self.endpoints, e)),
            }
        };
        let mut stored = StoredCatalog {
            entities: Vec::new(),
            version: 0,
            revision: read.header().map_or(0, |h| h.revision()),
        };
        for kv in read.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            if key == self.prefix {
                stored.version = kv.mod_revision();
            } else if let Some((kind, name)) = self.entity_of(key) {
                let statement = kv.value_str().unwrap_or_default().to_string();
                stored.entities.push((kind, name, statement));
            }
        }
        Ok(stored)
    }

    /// Stores `change` if the catalog is still at `validated_at` (the version it was
    /// validated against), in one transaction with the new version (`by`: who changed it).
    /// Retried while etcd elects a leader; a try whose outcome was lost is recognised by the
    /// token it wrote.
    pub async fn commit(
        &self,
        change: &CatalogChange,
        validated_at: i64,
        by: &str,
    ) -> Result<Commit> {
        // etcd takes at most 1.5 MiB in one request by default (`--max-request-bytes`), and its
        // gRPC at most 2 MiB: a bigger change is refused here, whole and clearly (etcd's own
        // refusal names neither the statement nor the way out).
        let size = match change {
            CatalogChange::Upsert {
                kind,
                name,
                statement,
            } => self.entity_key(kind, name).len() + statement.len(),
            CatalogChange::Remove { kind, name } => self.entity_key(kind, name).len(),
        };
        if size > MAX_CHANGE_BYTES {
            return Err(sluice_sql::Error::new(
                sluice_sql::ErrorCode::BadArguments,
                format!(
                    "the statement is too large for the fleet's catalog: etcd stores it in one request of at most {} KiB (its --max-request-bytes is 1.5 MiB by default), and this change needs {} KiB; make it smaller (shorter names, fewer values)",
                    MAX_CHANGE_BYTES / 1024,
                    size.div_ceil(1024)
                ),
            ));
        }
        let write = match change {
            CatalogChange::Upsert {
                kind,
                name,
                statement,
            } => TxnOp::put(self.entity_key(kind, name), statement.as_str(), None),
            CatalogChange::Remove { kind, name } => {
                TxnOp::delete(self.entity_key(kind, name), None)
            }
        };
        let token = commit_token(by);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                self.prefix.as_str(),
                CompareOp::Equal,
                validated_at,
            )])
            .and_then([
                write,
                TxnOp::put(self.prefix.as_str(), token.as_str(), None),
            ])
            .or_else([TxnOp::get(self.prefix.as_str(), None)]);
        let (began, mut attempt) = (Instant::now(), 0);
        let answer = loop {
            match self.client.clone().txn(txn.clone()).await {
                Ok(answer) => break answer,
                Err(e) if transient(&e) && pause(began, &mut attempt).await => continue,
                Err(e) => {
                    // A try that went unanswered may still be stored once etcd has a majority
                    // again (then every node applies it, as any change): say so.
                    let what = if attempt > 0 || transient(&e) {
                        "cannot store the catalog change, and whether it was stored is unknown: etcd may still apply it when it has a majority again (every node then applies it); look at system.workloads / system.resources before running it again"
                    } else {
                        "cannot store the catalog change"
                    };
                    return Err(etcd_error(what, &self.endpoints, e));
                }
            }
        };
        if answer.succeeded() {
            let revision = answer.header().map_or(0, |h| h.revision());
            return Ok(Commit::Done { revision });
        }
        let version = answer.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .map(|kv| (kv.mod_revision(), kv.value_str().is_ok_and(|v| v == token))),
            _ => None,
        });
        Ok(match version {
            // An earlier try of this very commit was stored (its answer was lost).
            Some((revision, true)) => Commit::Done { revision },
            Some((version, false)) => Commit::Moved { version },
            None => Commit::Moved { version: 0 },
        })
    }

    /// The changes stored after `revision`, in order, sent to `changes` until it is closed;
    /// a watch broken by what passes by itself (a member away, a leader elected) is opened
    /// again from the last change sent. Other failures are returned: the follower loads the
    /// catalog again and follows anew.
    pub async fn follow(
        &self,
        revision: i64,
        changes: tokio::sync::mpsc::Sender<Followed>,
    ) -> Result<()> {
        let mut sent = revision;
        let (mut began, mut attempt) = (Instant::now(), 0);
        loop {
            let before = sent;
            let e = match self.follow_from(&mut sent, &changes).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if sent > before {
                // It made progress: the retry budget starts again.
                (began, attempt) = (Instant::now(), 0);
            }
            let again = transient(&e) || matches!(e, etcd_client::Error::WatchError(_));
            if !(again && pause(began, &mut attempt).await) {
                return Err(etcd_error("following the catalog", &self.endpoints, e));
            }
        }
    }

    /// One watch from after `sent`, advancing it as changes are sent.
    async fn follow_from(
        &self,
        sent: &mut i64,
        changes: &tokio::sync::mpsc::Sender<Followed>,
    ) -> std::result::Result<(), etcd_client::Error> {
        let mut stream = self
            .client
            .clone()
            .watch(
                self.prefix.as_str(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(*sent + 1),
                ),
            )
            .await?;
        while let Some(answer) = stream.message().await? {
            for event in answer.events() {
                let Some(kv) = event.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                let Some((kind, name)) = self.entity_of(key) else {
                    continue;
                };
                let change = match event.event_type() {
                    EventType::Put => CatalogChange::Upsert {
                        kind,
                        name,
                        statement: kv.value_str().unwrap_or_default().to_string(),
                    },
                    EventType::Delete => CatalogChange::Remove { kind, name },
                };
                let followed = Followed {
                    revision: kv.mod_revision(),
                    change,
                };
                if changes.send(followed).await.is_err() {
                    return Ok(());
                }
                *sent = kv.mod_revision();
            }
        }
        // The watch ended without an error (etcd closed it): opened again.
        Err(etcd_client::Error::WatchError("the watch ended".into()))
    }
}
