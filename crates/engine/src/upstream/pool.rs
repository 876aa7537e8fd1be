//! The upstream's connections, pooled: at most `size` open at once, lent one client at a time
//! and reset when given back, so nothing one client set (a `SET`, a prepared statement, a
//! temporary table, an open transaction) reaches the next.
//!
//! Invariants:
//! - A lent connection is idle when lent: no transaction open, nothing unread, not closed by
//!   the upstream (checked without a round trip when it is taken from the idle list).
//! - A connection given back idle and clean (its client changed nothing beyond the
//!   transaction: [`UpstreamConnection::dirty`] unset) is lent again as it is; any other is
//!   reset first.
//! - A connection given back inside a transaction (status `T` or `E`: its client went away
//!   mid-transaction) is rolled back before it is reset; one whose reset fails, or that was
//!   lost, is closed and its place freed — never lent again.
//! - A connection is lent registered with the borrower's runtime when that is a current-thread
//!   one (sluice runs connections on a thread each): an idle connection of the borrower's
//!   thread is lent first, another is moved there (unencrypted ones; an encrypted one stays
//!   registered where it was opened, which works, a wake-up slower).
//! - The pools that share slots ([`UpstreamPool::sharing`]) hold at most `size` connections
//!   open between them, lent or idle: a pool that must open one more while that many are open
//!   first closes the idle connection unused longest, whichever pool it is in.
//!   [`UpstreamPool::close_idle`] closes those idle longer than a timeout.
//! - While the upstream cannot be reached, a checkout fails at once with
//!   ALL_CONNECTION_TRIES_FAILED (08006) naming the upstream, instead of every client waiting
//!   out the connect timeout: after a failed connect the pool waits (backoff doubling from
//!   100 ms to 5 s) before it tries again, and fails fast meanwhile.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sluice_sql::{Error, ErrorCode, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::{UpstreamConnection, UpstreamUrl};

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What the pool resets a connection with when it is given back: PostgreSQL's `DISCARD ALL`
/// (drops prepared statements, temporary tables, `SET`s, advisory locks, listeners).
const RESET: &str = "DISCARD ALL";

#[derive(Debug)]
struct Health {
    /// No connect is tried before this (a failure's backoff).
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Why the last connect failed.
    last_error: Option<Error>,
}

/// What the pools sharing slots share: the slots, and the count of their open connections.
#[derive(Debug)]
struct Budget {
    /// One permit per connection the pools may lend at once.
    slots: Arc<Semaphore>,
    /// How many: `slots`' permits when none is taken; also the most connections the pools
    /// keep open between them, lent or idle.
    size: usize,
    /// Connections open now, lent or idle (each counted by its [`Counted`]), and those being
    /// opened.
    open: AtomicUsize,
    /// The pools that share it, for closing another pool's idle connection.
    members: Mutex<Vec<Weak<Inner>>>,
}

impl Budget {
    fn new(size: usize) -> Arc<Budget> {
        Arc::new(Budget {
            slots: Arc::new(Semaphore::new(size)),
            size,
            open: AtomicUsize::new(0),
            members: Mutex::default(),
        })
    }

    fn join(&self, pool: &Arc<Inner>) {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        members.retain(|m| m.strong_count() > 0);
        members.push(Arc::downgrade(pool));
    }

    fn pools(&self) -> Vec<Arc<Inner>> {
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        members.iter().filter_map(Weak::upgrade).collect()
    }

    /// Closes the idle connection unused longest, in any pool; whether there was one.
    fn close_longest_idle(&self) -> bool {
        let mut oldest: Option<(Arc<Inner>, Instant)> = None;
        for pool in self.pools() {
            let idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(first) = idle.first() {
                if oldest
                    .as_ref()
                    .is_none_or(|(_, since)| first.since < *since)
                {
                    oldest = Some((pool.clone(), first.since));
                }
            }
        }
        let Some((pool, since)) = oldest else {
            return false;
        };
        let mut idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        match idle.iter().position(|c| c.since == since) {
            Some(at) => {
                drop(idle.remove(at));
                true
            }
            None => false,
        }
    }
}

/// One open connection counted in its budget; uncounted when dropped (with the connection).
#[derive(Debug)]
struct Counted(Arc<Budget>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection idle in a pool, and since when.
#[derive(Debug)]
struct Idle {
    conn: Box<UpstreamConnection>,
    since: Instant,
    _counted: Counted,
}

#[derive(Debug)]
struct Inner {
    url: UpstreamUrl,
    budget: Arc<Budget>,
    /// Oldest first: given back connections are pushed at the end.
    idle: Mutex<Vec<Idle>>,
    health: Mutex<Health>,
}

impl Inner {
    fn give_back(&self, conn: Box<UpstreamConnection>, counted: Counted) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Idle {
                conn,
                since: Instant::now(),
                _counted: counted,
            });
    }
}

/// A pool of connections to one upstream. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct UpstreamPool {
    inner: Arc<Inner>,
}

/// A connection lent by the pool; given back (reset) when dropped, unless
/// [`Lent::discard`]ed. Deref to use it.
#[derive(Debug)]
pub struct Lent {
    /// Boxed: a connection (its socket, buffers, TLS state) is large, and it moves at every
    /// lending and giving back (in transaction pooling, every transaction).
    conn: Option<Box<UpstreamConnection>>,
    counted: Option<Counted>,
    pool: Arc<Inner>,
    _slot: OwnedSemaphorePermit,
}

impl UpstreamPool {
    /// A pool of at most `size` connections (at least one) to `url`. Connects lazily.
    pub fn new(url: UpstreamUrl, size: usize) -> UpstreamPool {
        UpstreamPool::in_budget(url, Budget::new(size.max(1)))
    }

    fn in_budget(url: UpstreamUrl, budget: Arc<Budget>) -> UpstreamPool {
        let inner = Arc::new(Inner {
            url,
            budget: budget.clone(),
            idle: Mutex::new(Vec::new()),
            health: Mutex::new(Health {
                retry_at: None,
                backoff: FIRST_BACKOFF,
                last_error: None,
            }),
        });
        budget.join(&inner);
        UpstreamPool { inner }
    }

    /// A pool for `url` whose connections count against `other`'s: the two share its slots,
    /// so the pools of one upstream (one per database and start-up parameters) lend at most
    /// `other`'s size of connections at once between them, and keep no more open.
    pub fn sharing(url: UpstreamUrl, other: &UpstreamPool) -> UpstreamPool {
        UpstreamPool::in_budget(url, other.inner.budget.clone())
    }

    pub fn url(&self) -> &UpstreamUrl {
        &self.inner.url
    }

    /// Whether a checkout now would not wait: a connection is idle, or one more may open.
    pub fn has_room(&self) -> bool {
        self.inner.budget.slots.available_permits() > 0
    }

    /// Whether this handle is the pool's only one: no client holds the pool and none of its
    /// connections is lent (a lent connection holds it). Dropped then, the pool closes its
    /// idle connections.
    pub fn is_held_only_here(&self) -> bool {
        Arc::strong_count(&self.inner) == 1
    }

    /// Connections open now, idle in the pool.
    pub fn idle(&self) -> usize {
        self.inner
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Connections open now, lent or idle, in this pool and every pool sharing its slots.
    pub fn open(&self) -> usize {
        self.inner.budget.open.load(Ordering::Relaxed)
    }

    /// Closes the connections idle longer than `idle_for` in this pool and every pool sharing
    /// its slots (PgBouncer's `server_idle_timeout`); how many it closed.
    pub fn close_idle(&self, idle_for: Duration) -> usize {
        let now = Instant::now();
        let mut closed = 0;
        for pool in self.inner.budget.pools() {
            let stale: Vec<Idle> = {
                let mut idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
                let keep = idle.partition_point(|c| now.duration_since(c.since) >= idle_for);
                idle.drain(..keep).collect()
            };
            closed += stale.len();
        }
        closed
    }

    /// Lends a connection: an idle one, or a new one when fewer than `size` are open; waits
    /// (up to the URL's `connect_timeout`) while all are lent.
    pub async fn checkout(&self) -> Result<Lent> {
        let inner = &self.inner;
        let timeout = inner.url.connect_timeout;
        let closed = || Error::new(ErrorCode::Aborted, "The upstream pool is closed");
        // A free slot is taken at once, without arming the timeout's timer (most checkouts).
        let slot = match inner.budget.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(closed()),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                tokio::time::timeout(timeout, inner.budget.slots.clone().acquire_owned())
                    .await
                    .map_err(|_| {
                        Error::new(
                            ErrorCode::ServerOverloaded,
                            format!(
                                "All connections to the upstream {} are in use, and none came free within {timeout:?}; raise [upstream] pool_size or shorten what runs there",
                                inner.url.address()
                            ),
                        )
                    })?
                    .map_err(|_| closed())?
            }
        };
        // The most recently used idle connection that is still alive (an upstream restart
        // leaves closed ones behind: they are dropped here), one of this thread's first,
        // else a new one.
        let here = super::current_home();
        let idle = loop {
            let next = {
                let mut idle = inner.idle.lock().unwrap_or_else(|p| p.into_inner());
                match idle.iter().rposition(|c| c.conn.is_home_at(here)) {
                    Some(i) => Some(idle.remove(i)),
                    None => idle.pop(),
                }
            };
            match next {
                Some(Idle {
                    mut conn,
                    _counted: counted,
                    ..
                }) => {
                    if conn.is_usable() {
                        let homed = if conn.is_home_at(here) {
                            Ok(conn)
                        } else {
                            conn.at_home().map(Box::new)
                        };
                        match homed {
                            Ok(conn) => break Some((conn, counted)),
                            Err(e) => tracing::debug!("upstream connection dropped: {e}"),
                        }
                    }
                }
                None => break None,
            }
        };
        let (mut conn, counted) = match idle {
            Some(idle) => idle,
            None => {
                // Counted before it is opened, so two checkouts at once see each other.
                let counted = Counted(inner.budget.clone());
                if inner.budget.open.fetch_add(1, Ordering::Relaxed) >= inner.budget.size {
                    // As many open as may be: another pool's idle one makes room.
                    inner.budget.close_longest_idle();
                }
                (Box::new(self.connect().await?), counted)
            }
        };
        // Until the borrower says otherwise, it may change anything.
        conn.dirty = true;
        Ok(Lent {
            conn: Some(conn),
            counted: Some(counted),
            pool: inner.clone(),
            _slot: slot,
        })
    }

    /// A new connection, unless the upstream failed recently (then the failure, at once).
    async fn connect(&self) -> Result<UpstreamConnection> {
        let inner = &self.inner;
        {
            let health = inner.health.lock().unwrap_or_else(|p| p.into_inner());
            if let (Some(at), Some(e)) = (health.retry_at, &health.last_error) {
                if Instant::now() < at {
                    return Err(Error::new(
                        e.code,
                        format!(
                            "{} (sluice tries again in {} ms)",
                            e.message,
                            (at - Instant::now()).as_millis()
                        ),
                    ));
                }
            }
        }
        let result = UpstreamConnection::connect(&inner.url).await;
        let mut health = inner.health.lock().unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(_) => {
                if health.last_error.is_some() {
                    tracing::info!("upstream {} reachable again", inner.url.address());
                }
                health.retry_at = None;
                health.backoff = FIRST_BACKOFF;
                health.last_error = None;
            }
            // Refused (a database that does not exist, a bad start-up parameter): the
            // upstream is there, and other clients' connections are not held back.
            Err(e) if e.code == ErrorCode::AllConnectionTriesFailed && e.upstream.is_none() => {
                if health.last_error.is_none() {
                    tracing::warn!("{}; forwarded statements fail until it is back", e.message);
                }
                health.retry_at = Some(Instant::now() + health.backoff);
                health.backoff = (health.backoff * 2).min(MAX_BACKOFF);
                health.last_error = Some(e.clone());
            }
            Err(_) => {}
        }
        result
    }
}

impl Lent {
    /// Closes the connection instead of giving it back (it is in a state sluice cannot vouch
    /// for: a protocol error, a cancelled COPY).
    pub fn discard(mut self) {
        self.conn = None;
        self.counted = None;
    }
}

impl std::ops::Deref for Lent {
    type Target = UpstreamConnection;
    fn deref(&self) -> &UpstreamConnection {
        self.conn.as_ref().expect("lent until dropped")
    }
}

impl std::ops::DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut UpstreamConnection {
        self.conn.as_mut().expect("lent until dropped")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let (Some(conn), Some(counted)) = (self.conn.take(), self.counted.take()) else {
            return;
        };
        // The reset talks to the upstream, so it runs in a task of its own; the slot is held
        // until it is done (a reset connection goes back idle, a failed one is closed).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.pool.clone();
        if !conn.dirty && conn.awaiting == 0 && conn.transaction == b'I' {
            // Nothing of its client's outlives the transaction: lent again as it is.
            pool.give_back(conn, counted);
            return;
        }
        let slot = std::mem::replace(&mut self._slot, placeholder_permit());
        runtime.spawn(async move {
            if let Some(conn) = reset(conn).await {
                pool.give_back(conn, counted);
            }
            drop(slot);
        });
    }
}

/// A permit of a semaphore of its own, to stand in a `Lent` being dropped.
fn placeholder_permit() -> OwnedSemaphorePermit {
    Arc::new(Semaphore::new(1))
        .try_acquire_owned()
        .expect("a fresh semaphore has a permit")
}

/// `conn` made clean for the next client: a response still coming cancelled and read to its
/// end, any transaction rolled back, then `DISCARD ALL`; `None` if any of that fails (the
/// connection is then closed).
async fn reset(mut conn: Box<UpstreamConnection>) -> Option<Box<UpstreamConnection>> {
    let deadline = Duration::from_secs(10);
    if conn.awaiting > 0 {
        // Its client went away mid-statement.
        if let Some(token) = conn.cancel_token() {
            let _ = token.cancel().await;
        }
        while conn.awaiting > 0 {
            tokio::time::timeout(deadline, conn.read_frame())
                .await
                .ok()?
                .ok()?;
        }
    }
    if conn.transaction != b'I' {
        run(&mut conn, "ROLLBACK", deadline).await?;
    }
    run(&mut conn, RESET, deadline).await?;
    conn.prepared.clear();
    conn.applied.clear();
    conn.session = conn.startup_session.clone();
    conn.dirty = false;
    (conn.transaction == b'I').then_some(conn)
}

/// Runs `sql`; `None` unless it answered without an error.
async fn run(conn: &mut UpstreamConnection, sql: &str, deadline: Duration) -> Option<()> {
    conn.query(sql).await.ok()?;
    let frames = tokio::time::timeout(deadline, conn.read_response())
        .await
        .ok()?
        .ok()?;
    (!frames.iter().any(|f| f.tag == b'E')).then_some(())
}
