//! The fleet's catalog store against a real three-member etcd cluster: a change validated
//! against the current version commits, a racing one validated against the same version is
//! told the catalog moved and stores nothing, followers see every change once and in order,
//! and losing one etcd member changes nothing.

use std::time::Duration;

use sluice_cluster::{CatalogChange, ClusterOptions, Commit, Membership};
use sluice_testetcd::Etcd;

fn options(etcd: &Etcd, node: &str) -> ClusterOptions {
    ClusterOptions {
        endpoints: etcd.endpoints(),
        prefix: "/catalog-test".into(),
        node: node.into(),
        lease_ttl: Duration::from_secs(5),
        user: None,
        tls: None,
        cancel_at_fence: false,
    }
}

fn upsert(name: &str, statement: &str) -> CatalogChange {
    CatalogChange::Upsert {
        kind: "workload".into(),
        name: name.into(),
        statement: statement.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_changes_commit_one_at_a_time_and_every_node_follows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut etcd = Etcd::start(dir.path(), 3);
    let a = Membership::join(options(&etcd, "a"), "127.0.0.1:1")
        .await
        .expect("a");
    let b = Membership::join(options(&etcd, "b"), "127.0.0.1:2")
        .await
        .expect("b");
    let (store_a, store_b) = (a.catalog(), b.catalog());
    let empty = store_a.load().await.expect("load");
    assert!(empty.entities.is_empty());
    assert_eq!(empty.version, 0);

    // b follows from the empty catalog on.
    let (sender, mut followed) = tokio::sync::mpsc::channel(16);
    let follower = {
        let store_b = store_b.clone();
        let from = empty.revision;
        tokio::spawn(async move { store_b.follow(from, sender).await })
    };

    // Both validated against the empty catalog: the first commits, the second is told.
    let first = store_a
        .commit(&upsert("all", "CREATE WORKLOAD all"), empty.version, "a")
        .await
        .expect("commit");
    let Commit::Done { revision } = first else {
        panic!("{first:?}")
    };
    let second = store_b
        .commit(
            &upsert("all", "CREATE WORKLOAD all SETTINGS priority = 1"),
            empty.version,
            "b",
        )
        .await
        .expect("commit");
    assert_eq!(second, Commit::Moved { version: revision });
    let now = store_b.load().await.expect("load");
    assert_eq!(
        now.entities,
        [(
            "workload".into(),
            "all".into(),
            "CREATE WORKLOAD all".into()
        )]
    );
    assert_eq!(now.version, revision);

    // Validated again on the newer catalog: commits.
    let third = store_b
        .commit(
            &upsert("etl", "CREATE WORKLOAD etl IN all"),
            now.version,
            "b",
        )
        .await
        .expect("commit");
    assert!(matches!(third, Commit::Done { .. }), "{third:?}");

    // One etcd member lost: a removal still commits.
    etcd.kill(2);
    let latest = store_a.load().await.expect("load");
    let fourth = store_a
        .commit(
            &CatalogChange::Remove {
                kind: "workload".into(),
                name: "etl".into(),
            },
            latest.version,
            "a",
        )
        .await
        .expect("commit");
    assert!(matches!(fourth, Commit::Done { .. }), "{fourth:?}");

    // The follower saw the three stored changes, once each, in order; never the refused one.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let next = tokio::time::timeout(Duration::from_secs(30), followed.recv())
            .await
            .expect("a change within 30 s")
            .expect("following");
        seen.push(next);
    }
    assert!(seen.windows(2).all(|w| w[0].revision < w[1].revision));
    assert_eq!(
        seen.into_iter().map(|f| f.change).collect::<Vec<_>>(),
        [
            upsert("all", "CREATE WORKLOAD all"),
            upsert("etl", "CREATE WORKLOAD etl IN all"),
            CatalogChange::Remove {
                kind: "workload".into(),
                name: "etl".into()
            },
        ]
    );
    follower.abort();
}
