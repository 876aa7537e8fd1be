//! The share book against a real three-member etcd: nodes racing to grow their shares of one
//! limit never hold more than the limit between them (the invariant of `shares.rs`), a write
//! compared on a revision the key has left is refused, and settling makes a share certain.

use std::time::Duration;

use sluice_cluster::{ClusterOptions, Membership};
use sluice_testetcd::Etcd;

fn options(etcd: &Etcd, node: &str) -> ClusterOptions {
    ClusterOptions {
        endpoints: etcd.endpoints(),
        prefix: "/shares-test".into(),
        node: node.into(),
        lease_ttl: Duration::from_secs(5),
        user: None,
        tls: None,
        cancel_at_fence: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_growths_never_hold_more_than_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = Etcd::start(dir.path(), 3);
    let mut members = Vec::new();
    for name in ["a", "b", "c"] {
        members.push(
            Membership::join(options(&etcd, name), "127.0.0.1:1")
                .await
                .expect("join"),
        );
    }
    let limit = 8;
    // Three nodes, each wanting more than the limit, growing and lowering at random for 200
    // rounds each, at once; after every write the sum of what etcd holds is checked.
    let mut racers = Vec::new();
    for (i, member) in members.iter().enumerate() {
        let book = member.share_book();
        let lease = member.lease();
        racers.push(tokio::spawn(async move {
            let (mut held, mut revision) = (0i64, 0i64);
            let mut seed = 7 + i as u64;
            for _ in 0..200 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let want = (seed >> 33) as i64 % (limit + 3);
                if want > held {
                    (held, revision) = book
                        .grow(lease, "all", want, limit, 0, revision)
                        .await
                        .expect("grow");
                } else if let Some(r) = book
                    .lower(lease, "all", want, revision)
                    .await
                    .expect("lower")
                {
                    (held, revision) = (want, r);
                }
            }
            held
        }));
    }
    let watcher = members[0].share_book();
    let (view_tx, mut view) = tokio::sync::watch::channel(Default::default());
    let following = tokio::spawn(async move { watcher.follow(view_tx).await });
    let mut most = 0;
    let mut racing = racers;
    while !racing.iter().all(|r| r.is_finished()) {
        tokio::select! {
            _ = view.changed() => {
                let now: i64 = view
                    .borrow_and_update()
                    .shares
                    .get("all")
                    .map_or(0, |by| by.values().sum());
                most = most.max(now);
                assert!(now <= limit, "the shares sum to {now} (limit {limit})");
            }
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    let mut held = 0;
    for racer in racing.drain(..) {
        held += racer.await.expect("racer");
    }
    following.abort();
    assert!(held <= limit, "the nodes believe they hold {held}");
    assert!(
        most >= limit - 1,
        "the racers never filled the limit ({most})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_on_a_stale_revision_is_refused_and_settling_makes_a_share_certain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = Etcd::start(dir.path(), 3);
    let a = Membership::join(options(&etcd, "a"), "127.0.0.1:1")
        .await
        .expect("join");
    let book = a.share_book();
    let lease = a.lease();
    let (held, first) = book.grow(lease, "all", 3, 8, 0, 0).await.expect("grow");
    assert_eq!(held, 3);
    let second = book
        .lower(lease, "all", 2, first)
        .await
        .expect("lower")
        .expect("on the revision it knew");
    // A write based on the first revision (one whose answer was lost, say) is refused now.
    assert_eq!(
        book.lower(lease, "all", 1, first).await.expect("lower"),
        None
    );
    assert!(book.grow(lease, "all", 5, 8, 0, first).await.is_err());
    // Settling reads 2 and rewrites it: what was based on `second` is refused after it.
    let (value, settled) = book.settle(lease, "all").await.expect("settle");
    assert_eq!(value, 2);
    assert!(settled > second);
    assert_eq!(
        book.lower(lease, "all", 0, second).await.expect("lower"),
        None
    );
    assert_eq!(
        book.grow(lease, "all", 5, 8, 0, settled)
            .await
            .expect("grow")
            .0,
        5
    );
}
