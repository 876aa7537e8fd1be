//! The fleet on etcd (the `etcd` feature): [`Membership`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use sluice_sql::{Error, ErrorCode, Result};

use crate::retry::{etcd_error, pause, transient};
use crate::{ClusterOptions, LeaseState, Node};

/// This node's place in the fleet: its lease kept alive, the members followed. Leaves the
/// fleet (its lease revoked) on [`Membership::leave`]; dropped without it, its key goes when
/// the lease expires.
pub struct Membership {
    options: ClusterOptions,
    client: Client,
    /// The lease the node holds now (a new one after a lost one: see [`keep_alive`]).
    lease: Arc<AtomicI64>,
    nodes: Arc<Mutex<BTreeMap<String, Node>>>,
    /// Set once the lease could not be renewed before it expired (until the node joins
    /// again under a new lease).
    lost: Arc<AtomicBool>,
    /// The lease and until when it certainly lives (see [`LeaseState`]).
    alive: tokio::sync::watch::Receiver<LeaseState>,
    /// Its lease's renewals and the members' watch, ended when it leaves or is dropped.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Its number in the fleet (see [`claim_number`]).
    number: Arc<AtomicU64>,
    /// Its requests to the other nodes (one, so that their ids are unique).
    requests: crate::Requests,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("options", &self.options)
            .field("lease", &self.lease.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.stop_tasks();
    }
}

fn node_key(prefix: &str, name: &str) -> String {
    format!("{}/nodes/{name}", prefix.trim_end_matches('/'))
}

/// A node's key's value: its address and when it joined, tab-separated.
fn node_value(address: &str, joined: u64) -> String {
    format!("{address}\t{joined}")
}

fn parse_node(prefix: &str, kv: &etcd_client::KeyValue, this: &str) -> Option<Node> {
    let key = kv.key_str().ok()?;
    let name = key.strip_prefix(&node_key(prefix, ""))?.to_string();
    let (address, joined) = kv.value_str().ok()?.split_once('\t')?;
    Some(Node {
        this: name == this,
        name,
        address: address.to_string(),
        lease: kv.lease(),
        joined: joined.parse().ok()?,
    })
}

impl Membership {
    /// Connects to etcd and joins the fleet as `options.node`, reachable at `address`.
    pub async fn join(options: ClusterOptions, address: &str) -> Result<Membership> {
        let endpoints = options.endpoints.clone();
        let mut client = connect(&options).await?;
        let ttl = i64::try_from(options.lease_ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        // Retried through a leader election or a member away, as every etcd call here.
        let (lease, granted_at) = grant(&client, ttl, &endpoints).await?;
        let key = node_key(&options.prefix, &options.node);
        if !claim(&client, &key, address, lease, &endpoints).await? {
            let _ = client.lease_revoke(lease).await;
            return Err(Error::new(
                ErrorCode::BadArguments,
                format!(
                    "node name '{}' is held by a live node of the fleet (key {key}): give each node its own [cluster] node name, or wait for the old one's lease ({} s) to expire",
                    options.node,
                    options.lease_ttl.as_secs()
                ),
            ));
        }
        let number = claim_number(
            &client,
            &options.prefix,
            &options.node,
            lease,
            0,
            &endpoints,
        )
        .await?;
        let number = Arc::new(AtomicU64::new(number));
        let nodes = Arc::new(Mutex::new(BTreeMap::new()));
        let lost = Arc::new(AtomicBool::new(false));
        let lease_now = Arc::new(AtomicI64::new(lease));
        let (alive_tx, alive) = tokio::sync::watch::channel(LeaseState {
            lease,
            until: Some(fence_of(granted_at, options.lease_ttl)),
        });
        let renewal = Renewal {
            client: client.clone(),
            ttl: options.lease_ttl,
            endpoints: endpoints.clone(),
            key,
            address: address.to_string(),
            lease: lease_now.clone(),
            lost: lost.clone(),
            alive: alive_tx,
            prefix: options.prefix.clone(),
            node: options.node.clone(),
            number: number.clone(),
        };
        let tasks = vec![
            tokio::spawn(keep_alive(renewal)),
            tokio::spawn(follow_members(
                client.clone(),
                options.prefix.clone(),
                options.node.clone(),
                nodes.clone(),
            )),
        ];
        tracing::info!(node = %options.node, lease, "joined the fleet on etcd ({})", endpoints.join(", "));
        let requests =
            crate::Requests::new(client.clone(), &options.prefix, &options.node, endpoints);
        let membership = Membership {
            options,
            client,
            lease: lease_now,
            nodes,
            lost,
            alive,
            tasks: Mutex::new(tasks),
            number,
            requests,
        };
        membership.wait_for_self().await;
        Ok(membership)
    }
}

/// A client of the etcd `options` names (with its user and password, and TLS, if any).
async fn connect(options: &ClusterOptions) -> Result<Client> {
    let mut connect = ConnectOptions::new();
    if let Some((user, password)) = &options.user {
        connect = connect.with_user(user.clone(), password.clone());
    }
    if let Some(tls) = &options.tls {
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read(path).map_err(|e| {
                Error::new(
                    ErrorCode::BadArguments,
                    format!("cluster.{what} {}: {e}", path.display()),
                )
            })
        };
        let mut config = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca, "tls_ca")?));
        if let Some((cert, key)) = &tls.cert_and_key {
            config = config.identity(etcd_client::Identity::from_pem(
                read(cert, "tls_cert")?,
                read(key, "tls_key")?,
            ));
        }
        connect = connect.with_tls(config);
    } else if options.endpoints.iter().any(|e| e.starts_with("https://")) {
        return Err(Error::new(
            ErrorCode::BadArguments,
            format!(
                "cluster.etcd names https:// endpoints ({}): set cluster.tls_ca to the CA that signed etcd's certificate (and tls_cert, tls_key when etcd asks for a client certificate)",
                options.endpoints.join(", ")
            ),
        ));
    }
    Client::connect(&options.endpoints, Some(connect))
        .await
        .map_err(|e| etcd_error("cannot connect", &options.endpoints, e))
}

/// The fleet's catalog as stored now, read without joining the fleet (`sluice check
/// --fleet`).
pub async fn read_catalog(options: &ClusterOptions) -> Result<crate::StoredCatalog> {
    let client = connect(options).await?;
    crate::CatalogStore::new(client, &options.prefix, options.endpoints.clone())
        .load()
        .await
}

/// Grants a lease of `ttl` seconds: its id, and when the grant was sent (the lease lives at
/// least `ttl` from then).
async fn grant(
    client: &Client,
    ttl: i64,
    endpoints: &[String],
) -> Result<(i64, tokio::time::Instant)> {
    // Retried through a leader election or a member away, as every etcd call here.
    let (began, mut attempt) = (std::time::Instant::now(), 0);
    loop {
        let sent = tokio::time::Instant::now();
        match client.clone().lease_grant(ttl, None).await {
            Ok(granted) => return Ok((granted.id(), sent)),
            Err(e) if transient(&e) && pause(began, &mut attempt).await => continue,
            Err(e) => return Err(etcd_error("cannot grant the node's lease", endpoints, e)),
        }
    }
}

/// Until when a lease renewed (or granted) by a request sent at `sent` certainly lives, by
/// this node's clock: etcd keeps it `ttl` from when it handled the request, later than
/// `sent`; a tenth of the TTL is kept back for the two clocks' rates (they would have to
/// differ by 10% to matter) and the scheduling delays of the node.
pub fn fence_of(sent: tokio::time::Instant, ttl: Duration) -> tokio::time::Instant {
    sent + ttl.mul_f64(0.9)
}

/// Whether `e` is etcd saying a lease granted moments ago (at `granted`) is not found: the
/// member the write landed on has not applied the grant yet.
fn lease_not_applied_yet(e: &etcd_client::Error, granted: std::time::Instant) -> bool {
    granted.elapsed() < Duration::from_secs(2)
        && e.to_string().contains("requested lease not found")
}

/// The most nodes a fleet numbers (see [`claim_number`]).
const NUMBERS: u64 = 1000;

/// Claims a number for the node, unique among the live nodes (`PREFIX/numbers/K`, under its
/// lease): `preferred` if it is free (the one it had before a lost lease), else the
/// smallest free one. Statement ids are made unique across the fleet with it.
async fn claim_number(
    client: &Client,
    prefix: &str,
    node: &str,
    lease: i64,
    preferred: u64,
    endpoints: &[String],
) -> Result<u64> {
    let mut client = client.clone();
    let numbers = format!("{}/numbers/", prefix.trim_end_matches('/'));
    let (began, mut attempt) = (std::time::Instant::now(), 0);
    loop {
        let held = match client
            .get(numbers.as_str(), Some(GetOptions::new().with_prefix()))
            .await
        {
            Ok(held) => held,
            Err(e) if transient(&e) && pause(began, &mut attempt).await => continue,
            Err(e) => return Err(etcd_error("cannot number the node", endpoints, e)),
        };
        let taken: std::collections::BTreeSet<u64> = held
            .kvs()
            .iter()
            .filter_map(|kv| {
                kv.key_str()
                    .ok()?
                    .strip_prefix(numbers.as_str())?
                    .parse()
                    .ok()
            })
            .collect();
        let Some(number) = std::iter::once(preferred)
            .chain(1..NUMBERS)
            .find(|n| *n > 0 && !taken.contains(n))
        else {
            return Err(Error::new(
                ErrorCode::KeeperException,
                format!(
                    "a fleet numbers at most {} nodes, and as many are live",
                    NUMBERS - 1
                ),
            ));
        };
        let key = format!("{numbers}{number}");
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                node,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        match client.txn(txn).await {
            Ok(done) if done.succeeded() => return Ok(number),
            Ok(done) => {
                // A retried try of ours that was stored finds its own key.
                let ours = done.op_responses().into_iter().any(|r| match r {
                    etcd_client::TxnOpResponse::Get(get) => {
                        get.kvs().first().is_some_and(|kv| kv.lease() == lease)
                    }
                    _ => false,
                });
                if ours {
                    return Ok(number);
                }
            }
            Err(e) if transient(&e) && pause(began, &mut attempt).await => {}
            Err(e) if lease_not_applied_yet(&e, began) && pause(began, &mut attempt).await => {}
            Err(e) => return Err(etcd_error("cannot number the node", endpoints, e)),
        }
    }
}

/// Writes the node's key under `lease` if no live node holds the name: whether it is ours.
async fn claim(
    client: &Client,
    key: &str,
    address: &str,
    lease: i64,
    endpoints: &[String],
) -> Result<bool> {
    let mut client = client.clone();
    let joined = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let key = key.to_string();
    let claim = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.clone(),
            node_value(address, joined),
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key.clone(), None)]);
    let (began, mut attempt) = (std::time::Instant::now(), 0);
    let claimed = loop {
        match client.txn(claim.clone()).await {
            Ok(claimed) => break claimed,
            Err(e) if transient(&e) && pause(began, &mut attempt).await => continue,
            // A member that has not applied the lease's grant yet refuses a write under it
            // (etcd checks the lease where the request lands): it will have, shortly.
            Err(e) if lease_not_applied_yet(&e, began) && pause(began, &mut attempt).await => {
                continue
            }
            Err(e) => return Err(etcd_error("cannot register the node", endpoints, e)),
        }
    };
    // A retried claim whose first try was stored finds its own key: the same lease.
    let ours = claimed.op_responses().into_iter().any(|r| match r {
        etcd_client::TxnOpResponse::Get(get) => {
            get.kvs().first().is_some_and(|kv| kv.lease() == lease)
        }
        _ => false,
    });
    Ok(claimed.succeeded() || ours)
}

impl Membership {
    /// Until this node's own key has come back by watch (so it lists itself from the start);
    /// a few seconds at most.
    async fn wait_for_self(&self) {
        for _ in 0..200 {
            if self.nodes().iter().any(|n| n.this) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn stop_tasks(&self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }

    /// The fleet's members, by name, as of the last watch event.
    pub fn nodes(&self) -> Vec<Node> {
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The fleet's catalog in etcd, on this node's connection.
    pub fn catalog(&self) -> crate::CatalogStore {
        crate::CatalogStore::new(
            self.client.clone(),
            &self.options.prefix,
            self.options.endpoints.clone(),
        )
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.options.node
    }

    /// This node's lease in etcd.
    pub fn lease(&self) -> i64 {
        self.lease.load(Ordering::Relaxed)
    }

    /// The lease and until when it certainly lives, as renewals update it.
    pub fn alive(&self) -> tokio::sync::watch::Receiver<LeaseState> {
        self.alive.clone()
    }

    /// This node's number in the fleet: unique among the live nodes, from 1.
    pub fn number(&self) -> u64 {
        self.number.load(Ordering::Relaxed)
    }

    /// The fleet's shared map `name` (`PREFIX/NAME/`), on this node's connection.
    pub fn map(&self, name: &str) -> crate::SharedMap {
        crate::SharedMap::new(
            self.client.clone(),
            &self.options.prefix,
            name,
            self.options.endpoints.clone(),
        )
    }

    /// Requests between the fleet's nodes, on this node's connection.
    pub fn requests(&self) -> crate::Requests {
        self.requests.clone()
    }

    /// The fleet's shares of cluster-wide limits in etcd, on this node's connection.
    pub fn share_book(&self) -> crate::ShareBook {
        crate::ShareBook::new(
            self.client.clone(),
            &self.options.prefix,
            &self.options.node,
            self.options.endpoints.clone(),
        )
    }

    /// Whether the lease expired before it could be renewed (the node is out of the fleet).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Leaves the fleet at once: the lease is revoked, so the node's key goes now.
    pub async fn leave(&self) {
        self.stop_tasks();
        if let Err(e) = self.client.clone().lease_revoke(self.lease()).await {
            tracing::warn!("leaving the fleet: {e}; the node's key goes when its lease expires");
        }
    }
}

/// What renews the node's lease.
struct Renewal {
    client: Client,
    ttl: Duration,
    endpoints: Vec<String>,
    /// The node's key and its value's address, written again under a new lease.
    key: String,
    address: String,
    lease: Arc<AtomicI64>,
    lost: Arc<AtomicBool>,
    alive: tokio::sync::watch::Sender<LeaseState>,
    prefix: String,
    node: String,
    number: Arc<AtomicU64>,
}

/// Renews the lease every third of its TTL for as long as the node runs (a failed renewal is
/// tried again after half a second), moving the fence on with each one etcd confirms. A
/// lease found expired marks the node `lost` (its fence is lifted at once) and the node joins
/// again under a new lease, as soon as etcd grants one and no other live node took its name.
async fn keep_alive(r: Renewal) {
    let every = (r.ttl / 3).max(Duration::from_millis(100));
    let mut failing = false;
    loop {
        let lease = r.lease.load(Ordering::Relaxed);
        let sent = tokio::time::Instant::now();
        // Bounded: a call on a connection that died under a pause would wait forever.
        let renewed = tokio::time::timeout(every, renew(&r.client, lease))
            .await
            .unwrap_or_else(|_| Err(etcd_client::Error::InvalidArgs("renewal timed out".into())));
        match renewed {
            Ok(0) => {
                tracing::error!(
                    lease,
                    "the node's etcd lease expired: it is out of the fleet until it joins again"
                );
                r.lost.store(true, Ordering::Relaxed);
                r.alive.send_replace(LeaseState { lease, until: None });
                rejoin(&r).await;
                failing = false;
                continue;
            }
            Ok(_) => {
                r.alive.send_replace(LeaseState {
                    lease,
                    until: Some(fence_of(sent, r.ttl)),
                });
                if failing {
                    tracing::info!(lease, "the node's etcd lease renewed again");
                    failing = false;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(
                        lease,
                        "cannot renew the node's etcd lease ({}): {e}",
                        r.endpoints.join(", ")
                    );
                    failing = true;
                }
                tokio::time::sleep(every.min(Duration::from_millis(500))).await;
                continue;
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// A new lease and the node's key under it, tried until both are had.
async fn rejoin(r: &Renewal) {
    let ttl = i64::try_from(r.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
    loop {
        let granted = tokio::time::timeout(r.ttl, grant(&r.client, ttl, &r.endpoints)).await;
        match granted.unwrap_or_else(|_| {
            Err(Error::new(
                ErrorCode::KeeperException,
                "granting a lease timed out",
            ))
        }) {
            Ok((lease, sent)) => {
                match claim(&r.client, &r.key, &r.address, lease, &r.endpoints).await {
                    Ok(true) => {
                        let before = r.number.load(Ordering::Relaxed);
                        match claim_number(
                            &r.client,
                            &r.prefix,
                            &r.node,
                            lease,
                            before,
                            &r.endpoints,
                        )
                        .await
                        {
                            Ok(number) => r.number.store(number, Ordering::Relaxed),
                            Err(e) => {
                                tracing::warn!("joining the fleet again: {e}");
                                let _ = r.client.clone().lease_revoke(lease).await;
                                tokio::time::sleep(Duration::from_secs(1)).await;
                                continue;
                            }
                        }
                        r.lease.store(lease, Ordering::Relaxed);
                        r.lost.store(false, Ordering::Relaxed);
                        r.alive.send_replace(LeaseState {
                            lease,
                            until: Some(fence_of(sent, r.ttl)),
                        });
                        tracing::info!(lease, "the node joined the fleet again");
                        return;
                    }
                    Ok(false) => {
                        let _ = r.client.clone().lease_revoke(lease).await;
                        tracing::error!(key = %r.key, "cannot join the fleet again: a live node holds this node's name");
                    }
                    Err(e) => tracing::warn!("joining the fleet again: {e}"),
                }
            }
            Err(e) => tracing::warn!("joining the fleet again: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One renewal of `lease`: the TTL etcd gives it now (0: it had expired).
async fn renew(client: &Client, lease: i64) -> std::result::Result<i64, etcd_client::Error> {
    // The client renews once itself when it opens the stream, and says an expired lease is
    // "not found" (etcd answers with a TTL of 0): that is the answer 0, not a failure to retry.
    let (mut keeper, mut answers) = match client.clone().lease_keep_alive(lease).await {
        Ok(stream) => stream,
        Err(etcd_client::Error::LeaseKeepAliveError(e)) if e == "lease not found" => return Ok(0),
        Err(e) => return Err(e),
    };
    keeper.keep_alive().await?;
    Ok(answers.message().await?.map_or(0, |a| a.ttl()))
}

/// Keeps `nodes` equal to the fleet's node keys: a read of them all, then their changes by
/// watch from the revision read; read again whenever the watch breaks.
async fn follow_members(
    client: Client,
    prefix: String,
    this: String,
    nodes: Arc<Mutex<BTreeMap<String, Node>>>,
) {
    let keys = node_key(&prefix, "");
    loop {
        match follow_once(&client, &prefix, &keys, &this, &nodes).await {
            Ok(()) => tracing::debug!("the fleet's member watch ended; following again"),
            Err(e) => {
                tracing::warn!("following the fleet's members: {e}; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

async fn follow_once(
    client: &Client,
    prefix: &str,
    keys: &str,
    this: &str,
    nodes: &Mutex<BTreeMap<String, Node>>,
) -> std::result::Result<(), etcd_client::Error> {
    let mut client = client.clone();
    let all = client
        .get(keys, Some(GetOptions::new().with_prefix()))
        .await?;
    let revision = all.header().map_or(0, |h| h.revision());
    {
        let mut nodes = nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.clear();
        for node in all
            .kvs()
            .iter()
            .filter_map(|kv| parse_node(prefix, kv, this))
        {
            nodes.insert(node.name.clone(), node);
        }
    }
    let mut changes = client
        .watch(
            keys,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1),
            ),
        )
        .await?;
    while let Some(change) = changes.message().await? {
        let mut nodes = nodes.lock().unwrap_or_else(|p| p.into_inner());
        for event in change.events() {
            let Some(kv) = event.kv() else { continue };
            match event.event_type() {
                EventType::Put => {
                    if let Some(node) = parse_node(prefix, kv, this) {
                        nodes.insert(node.name.clone(), node);
                    }
                }
                EventType::Delete => {
                    if let Ok(key) = kv.key_str() {
                        if let Some(name) = key.strip_prefix(keys) {
                            nodes.remove(name);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
