//! etcd's failures (the `etcd` feature): the one error they become, and the retries of
//! what passes by itself (a leader election, a member away).

use std::time::{Duration, Instant};

use sluice_sql::{Error, ErrorCode};

/// How long an operation is retried while etcd is electing a leader or a member is away.
const RETRY_FOR: Duration = Duration::from_secs(10);

/// Whether an etcd failure passes by itself (a leader election, a member away): retried.
pub(crate) fn transient(e: &etcd_client::Error) -> bool {
    match e {
        // gRPC's UNAVAILABLE (14): "leader changed", "no leader", a member not reachable.
        // UNKNOWN (2): a connection broken under the call; DEADLINE_EXCEEDED (4): "request
        // timed out" while a leader is elected. CANCELLED (1): tonic's word for a connection
        // closed under the call (hyper's `Canceled`, "connection closed": the member it went
        // to was killed); sluice never cancels a call itself (it drops the future, which
        // returns nothing).
        etcd_client::Error::GRpcStatus(status) => matches!(status.code() as i32, 1 | 2 | 4 | 14),
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// Waits before the next try of an operation begun at `began`; `false` once it has been
/// retried for [`RETRY_FOR`].
pub(crate) async fn pause(began: Instant, attempt: &mut u32) -> bool {
    if began.elapsed() >= RETRY_FOR {
        return false;
    }
    let wait = Duration::from_millis(25u64 << (*attempt).min(5));
    *attempt += 1;
    tokio::time::sleep(wait).await;
    true
}

/// An etcd failure, named as ClickHouse names a coordination failure (KEEPER_EXCEPTION).
pub(crate) fn etcd_error(what: &str, endpoints: &[String], e: etcd_client::Error) -> Error {
    // A failure that passes by itself but did not (within the retries) is most often etcd
    // without a majority of its members.
    let hint = if transient(&e) {
        " (etcd unavailable: is a majority of its members up and reachable from this node?)"
    } else {
        ""
    };
    Error::new(
        ErrorCode::KeeperException,
        format!("etcd ({}): {what}: {e}{hint}", endpoints.join(", ")),
    )
}

/// Retries `call` while etcd elects a leader or a member is away (see [`transient`]).
macro_rules! retried {
    ($what:expr, $endpoints:expr, $call:expr) => {{
        let (began, mut attempt) = (std::time::Instant::now(), 0);
        loop {
            match $call {
                Ok(answer) => break answer,
                Err(e)
                    if $crate::retry::transient(&e)
                        && $crate::retry::pause(began, &mut attempt).await =>
                {
                    continue
                }
                Err(e) => return Err($crate::retry::etcd_error($what, $endpoints, e)),
            }
        }
    }};
}

pub(crate) use retried;
