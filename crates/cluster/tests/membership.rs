//! Membership against a real three-member etcd cluster (the machine's `etcd`, on loopback):
//! nodes that join see each other, a name held by a live node is refused, a node that leaves
//! goes at once and one that dies when its lease expires, and losing one etcd member changes
//! nothing a node shows.

use std::time::Duration;

use sluice_cluster::{ClusterOptions, Membership};
use sluice_sql::ErrorCode;
use sluice_testetcd::Etcd;

fn options(etcd: &Etcd, node: &str) -> ClusterOptions {
    ClusterOptions {
        endpoints: etcd.endpoints(),
        prefix: "/fleet-test".into(),
        node: node.into(),
        lease_ttl: Duration::from_secs(2),
        user: None,
        tls: None,
        cancel_at_fence: false,
    }
}

/// Waits (30 s at most) until `membership` lists exactly `names`.
async fn lists(membership: &Membership, names: &[&str]) {
    let mut seen = Vec::new();
    for _ in 0..3000 {
        seen = membership
            .nodes()
            .into_iter()
            .map(|n| n.name)
            .collect::<Vec<_>>();
        if seen == names {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} lists {seen:?}, not {names:?}", membership.name());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_leave_and_die_as_their_leases_say() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut etcd = Etcd::start(dir.path(), 3);
    let a = Membership::join(options(&etcd, "a"), "127.0.0.1:5001")
        .await
        .expect("a joins");
    let b = Membership::join(options(&etcd, "b"), "127.0.0.1:5002")
        .await
        .expect("b joins");
    let c = Membership::join(options(&etcd, "c"), "127.0.0.1:5003")
        .await
        .expect("c joins");
    for m in [&a, &b, &c] {
        lists(m, &["a", "b", "c"]).await;
    }
    let shown = a.nodes();
    assert_eq!(shown[1].address, "127.0.0.1:5002");
    assert!(shown[0].this && !shown[1].this);
    assert_eq!(shown[0].lease, a.lease());

    // A name a live node holds is refused, and says why.
    let twin = Membership::join(options(&etcd, "b"), "127.0.0.1:5999")
        .await
        .expect_err("b is taken");
    assert_eq!(twin.code, ErrorCode::BadArguments, "{twin}");
    assert!(twin.message.contains("'b'"), "{twin}");

    // Leaving: gone at once (well before the lease could expire).
    b.leave().await;
    lists(&a, &["a", "c"]).await;

    // One etcd member lost: nothing a node shows changes, and a node still joins.
    etcd.kill(0);
    let d = Membership::join(
        ClusterOptions {
            endpoints: etcd.endpoints()[1..].to_vec(),
            ..options(&etcd, "d")
        },
        "127.0.0.1:5004",
    )
    .await
    .expect("d joins with a member down");
    lists(&d, &["a", "c", "d"]).await;

    // Dying without a word (its renewals stop): gone once its lease expires.
    drop(c);
    lists(&a, &["a", "d"]).await;
    assert!(!a.is_lost());
    etcd.restart(0);
    etcd.wait_healthy(0);
    lists(&a, &["a", "d"]).await;
}

/// TLS to etcd: a node with the CA and a client certificate joins an etcd that serves clients
/// over TLS only and asks for a certificate; without the CA it is refused before connecting,
/// saying what to set; with the CA but no certificate etcd refuses it, and the error names etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_an_etcd_that_speaks_tls_with_its_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = Etcd::start_tls(dir.path(), 1);
    let tls = etcd.tls().expect("tls").clone();
    let with = |cert: bool| ClusterOptions {
        tls: Some(sluice_cluster::TlsFiles {
            ca: tls.ca.clone(),
            cert_and_key: cert.then(|| (tls.client_cert.clone(), tls.client_key.clone())),
        }),
        ..options(&etcd, "a")
    };
    let a = Membership::join(with(true), "127.0.0.1:5001")
        .await
        .expect("joins over TLS");
    lists(&a, &["a"]).await;
    let plain = Membership::join(options(&etcd, "b"), "127.0.0.1:5002")
        .await
        .expect_err("https without a CA");
    assert_eq!(plain.code, ErrorCode::BadArguments, "{plain}");
    assert!(plain.message.contains("tls_ca"), "{plain}");
    let anonymous = tokio::time::timeout(
        Duration::from_secs(60),
        Membership::join(
            ClusterOptions {
                node: "c".into(),
                ..with(false)
            },
            "127.0.0.1:5003",
        ),
    )
    .await
    .expect("refused in time")
    .expect_err("no client certificate");
    assert_eq!(anonymous.code, ErrorCode::KeeperException, "{anonymous}");
    assert!(anonymous.message.contains("etcd"), "{anonymous}");
    lists(&a, &["a"]).await;
}
