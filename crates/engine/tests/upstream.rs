//! The upstream's wire against a real PostgreSQL (the machine's binaries, started here):
//! SCRAM and MD5 authentication, refusals relayed with the upstream's SQLSTATE, an unreachable
//! upstream named, and answers kept as the bytes that came — rows, errors with every field,
//! notices, transaction status — and a cancel that stops a running statement.

use std::time::{Duration, Instant};

use sluice_engine::upstream::{Frame, UpstreamConnection, UpstreamUrl};
use sluice_sql::ErrorCode;
use sluice_testpg::{Auth, Postgres};

fn url(pg: &Postgres, user: &str, password: Option<&str>, db: &str) -> UpstreamUrl {
    let auth = password.map_or(String::new(), |p| format!(":{p}"));
    UpstreamUrl::parse(&format!(
        "postgres://{user}{auth}@127.0.0.1:{}/{db}?sslmode=disable&connect_timeout=10",
        pg.port
    ))
    .expect("url")
}

fn field(frame: &Frame, code: u8) -> Option<String> {
    frame
        .fields()
        .into_iter()
        .find(|(c, _)| *c == code)
        .map(|(_, v)| v)
}

/// A DataRow body: the field count, then each field as a length and its bytes (-1: NULL).
fn data_row(fields: &[Option<&str>]) -> Vec<u8> {
    let mut out = (fields.len() as i16).to_be_bytes().to_vec();
    for f in fields {
        match f {
            Some(v) => {
                out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                out.extend_from_slice(v.as_bytes());
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    out
}

#[tokio::test]
async fn the_upstream_wire_keeps_what_postgres_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(dir.path(), "owner", Auth::Password("owner-pw".into()));
    pg.psql("SET password_encryption = 'md5'; CREATE ROLE md5user LOGIN PASSWORD 'md5-pw'");
    pg.psql("CREATE DATABASE sales OWNER owner");

    // SCRAM (the superuser's password is stored as SCRAM), then MD5.
    let mut conn = UpstreamConnection::connect(&url(&pg, "owner", Some("owner-pw"), "sales"))
        .await
        .expect("SCRAM");
    assert!(conn
        .parameters
        .iter()
        .any(|(n, v)| n == "server_version" && !v.is_empty()));
    assert!(conn.cancel_token().is_some());
    assert_eq!(conn.transaction, b'I');
    UpstreamConnection::connect(&url(&pg, "md5user", Some("md5-pw"), "postgres"))
        .await
        .expect("MD5")
        .terminate()
        .await;

    // Refusals: the upstream's own SQLSTATE and message; sluice's code for the connection.
    let refused = |e: sluice_sql::Error, state: &str| {
        assert_eq!(e.code, ErrorCode::AllConnectionTriesFailed, "{e}");
        assert!(e.message.contains(state), "{state}: {e}");
    };
    refused(
        UpstreamConnection::connect(&url(&pg, "owner", Some("wrong"), "sales"))
            .await
            .expect_err("a wrong password"),
        "28P01",
    );
    refused(
        UpstreamConnection::connect(&url(&pg, "owner", Some("owner-pw"), "nosuchdb"))
            .await
            .expect_err("an unknown database"),
        "3D000",
    );
    // No password for a role the upstream asks one of: refused as PostgreSQL refuses a
    // wrong one (28P01), saying why.
    let e = UpstreamConnection::connect(&url(&pg, "owner", None, "sales"))
        .await
        .expect_err("no password");
    assert_eq!(e.code, ErrorCode::AuthenticationFailed, "{e}");
    assert!(e.message.contains("asks sluice for a password"), "{e}");
    assert!(
        e.upstream
            .as_ref()
            .is_some_and(|f| f.contains(&(b'C', "28P01".to_string()))),
        "{e:?}"
    );
    let nobody = UpstreamUrl::parse(&format!(
        "postgres://owner@127.0.0.1:{}/x?sslmode=disable",
        sluice_testpg::free_port()
    ))
    .expect("url");
    refused(
        UpstreamConnection::connect(&nobody)
            .await
            .expect_err("nobody listens"),
        &nobody.address(),
    );

    // Rows as they came: the DataRow body is PostgreSQL's own bytes.
    conn.query("SELECT 1 AS one, 'x'::text AS t, NULL::int AS n")
        .await
        .expect("sends");
    let frames = conn.read_response().await.expect("answer");
    let tags: String = frames.iter().map(|f| f.tag as char).collect();
    assert_eq!(tags, "TDCZ");
    assert_eq!(
        &frames[1].body[..],
        &data_row(&[Some("1"), Some("x"), None])[..]
    );
    assert_eq!(&frames[2].body[..], b"SELECT 1\0");

    // The same rows passed in place, as the relay takes them: each message whole as it came,
    // its ReadyForQuery noted; a message larger than a connection keeps between messages
    // leaves no buffer of its size behind (the connection goes back to the pool).
    conn.query("SELECT 1 AS one, 'x'::text AS t, NULL::int AS n; SELECT repeat('y', 3000000)")
        .await
        .expect("sends");
    let mut passed = Vec::new();
    loop {
        match conn.peek_message() {
            Some(message) => {
                let (tag, len) = (message[0], message.len());
                passed.push(message.to_vec());
                conn.pass(len);
                if tag == b'Z' {
                    break;
                }
            }
            None => conn.read_more().await.expect("more"),
        }
    }
    let tags: String = passed.iter().map(|m| m[0] as char).collect();
    assert_eq!(tags, "TDCTDCZ");
    assert_eq!(
        &passed[1][5..],
        &data_row(&[Some("1"), Some("x"), None])[..]
    );
    // Type, length, one column, its length, its 3,000,000 bytes.
    assert_eq!(passed[4].len(), 1 + 4 + 2 + 4 + 3_000_000);
    assert_eq!((conn.awaiting, conn.transaction), (0, b'I'));
    assert!(
        conn.read_buffer_capacity() <= 64 << 10,
        "{} bytes kept",
        conn.read_buffer_capacity()
    );

    // An error with every field it has, then the connection goes on.
    conn.query("SELECT 1/0").await.expect("sends");
    let frames = conn.read_response().await.expect("answer");
    let error = frames.iter().find(|f| f.tag == b'E').expect("an error");
    assert_eq!(field(error, b'C').as_deref(), Some("22012"));
    assert_eq!(field(error, b'M').as_deref(), Some("division by zero"));
    assert_eq!(field(error, b'S').as_deref(), Some("ERROR"));
    assert!(field(error, b'R').is_some(), "the routine field too");
    assert_eq!(conn.transaction, b'I');

    // A notice, and the transaction status as it changes.
    conn.query("BEGIN; DO $$BEGIN RAISE NOTICE 'hello %', 42; END$$")
        .await
        .expect("sends");
    let frames = conn.read_response().await.expect("answer");
    let notice = frames.iter().find(|f| f.tag == b'N').expect("a notice");
    assert_eq!(field(notice, b'M').as_deref(), Some("hello 42"));
    assert_eq!(conn.transaction, b'T');
    conn.query("ROLLBACK").await.expect("sends");
    conn.read_response().await.expect("answer");
    assert_eq!(conn.transaction, b'I');

    // Described without running: parameter types and columns as the upstream infers them,
    // a statement without rows, and an error as it came (the connection idle after each).
    let described = conn
        .describe("SELECT $1::int + 1 AS x, $2::text AS t", &[])
        .await
        .expect("sends")
        .expect("describes");
    assert_eq!(described.parameters, [23, 25]);
    let columns = described.rows.expect("rows").columns();
    assert_eq!(columns, [("x".to_string(), 23), ("t".to_string(), 25)]);
    run_text(&mut conn, "CREATE TEMP TABLE d (a int8)").await;
    let insert = conn
        .describe("INSERT INTO d VALUES ($1)", &[0])
        .await
        .expect("sends")
        .expect("describes");
    assert_eq!(
        (insert.parameters.as_slice(), insert.rows),
        (&[20u32][..], None)
    );
    let unknown = conn
        .describe("SELECT nope FROM d", &[])
        .await
        .expect("sends")
        .expect_err("an unknown column");
    assert_eq!(field(&unknown, b'C').as_deref(), Some("42703"));
    assert_eq!((conn.transaction, conn.awaiting), (b'I', 0));

    // A cancel stops a running statement at once.
    let token = conn.cancel_token().expect("a key");
    conn.query("SELECT pg_sleep(30)").await.expect("sends");
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    token.cancel().await.expect("cancels");
    let frames = tokio::time::timeout(Duration::from_secs(10), conn.read_response())
        .await
        .expect("the statement stops")
        .expect("answer");
    let error = frames.iter().find(|f| f.tag == b'E').expect("cancelled");
    assert_eq!(field(error, b'C').as_deref(), Some("57014"));
    assert!(started.elapsed() < Duration::from_secs(10));

    // The upstream gone: the connection says so, naming it.
    pg.kill();
    let lost = match conn.query("SELECT 1").await {
        Err(e) => e,
        Ok(()) => conn
            .read_response()
            .await
            .expect_err("the upstream is gone"),
    };
    assert_eq!(lost.code, ErrorCode::AllConnectionTriesFailed, "{lost}");
    assert!(
        lost.message.contains(&format!("127.0.0.1:{}", pg.port)),
        "{lost}"
    );
}

/// Runs `sql` and checks it did not fail.
async fn run_text(conn: &mut UpstreamConnection, sql: &str) {
    conn.query(sql).await.expect("sends");
    let frames = conn.read_response().await.expect("answer");
    assert!(frames.iter().all(|f| f.tag != b'E'), "{sql} failed");
}

/// Polls until `cond` holds (bounded: 10 s).
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

/// Runs `sql` on a lent connection and gives its frames.
async fn run(conn: &mut UpstreamConnection, sql: &str) -> Vec<Frame> {
    conn.query(sql).await.expect("sends");
    conn.read_response().await.expect("answer")
}

/// The pool: at most `size` connections, a full pool refused after the timeout, everything a
/// client left behind (a SET, a prepared statement, an open transaction, a statement still
/// running) gone before the next client, and an upstream restart survived: checkouts fail
/// fast while it is down and work again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_lends_resets_and_recovers() {
    use sluice_engine::upstream::UpstreamPool;
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(dir.path(), "pool", Auth::Trust);
    let url = UpstreamUrl::parse(&format!(
        "postgres://pool@127.0.0.1:{}/postgres?sslmode=disable&connect_timeout=1",
        pg.port
    ))
    .expect("url");
    let pool = UpstreamPool::new(url.clone(), 2);
    let mut a = pool.checkout().await.expect("first");
    let b = pool.checkout().await.expect("second");
    let full = pool
        .checkout()
        .await
        .expect_err("a third waits, then is refused");
    assert_eq!(full.code, ErrorCode::ServerOverloaded, "{full}");
    drop(b);

    // What a client leaves behind does not reach the next.
    run(&mut a, "SET application_name = 'leaked'").await;
    run(&mut a, "PREPARE p AS SELECT 1").await;
    run(&mut a, "BEGIN").await;
    assert_eq!(a.transaction, b'T');
    drop(a);
    eventually("both back idle", || pool.idle() == 2).await;
    let mut c = pool.checkout().await.expect("again");
    assert_eq!(c.transaction, b'I');
    let frames = run(&mut c, "SHOW application_name").await;
    assert!(
        !String::from_utf8_lossy(&frames[1].body).contains("leaked"),
        "the SET was reset"
    );
    let frames = run(&mut c, "EXECUTE p").await;
    let e = frames.iter().find(|f| f.tag == b'E').expect("p is gone");
    assert_eq!(field(e, b'C').as_deref(), Some("26000"));

    // A client gone mid-statement: the statement is cancelled and its answer read away.
    c.query("SELECT pg_sleep(30)").await.expect("sends");
    let started = Instant::now();
    drop(c);
    eventually("the cancelled one back idle", || pool.idle() == 2).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    let mut d = pool.checkout().await.expect("clean");
    let frames = run(&mut d, "SELECT 41 + 1").await;
    assert_eq!(&frames[1].body[..], &data_row(&[Some("42")])[..]);
    drop(d);
    eventually("idle", || pool.idle() == 2).await;

    // The upstream restarts: the idle connections are dead, a checkout says so naming the
    // upstream, the next fails fast, and once it is back the pool serves again.
    pg.kill();
    let down = pool.checkout().await.expect_err("the upstream is down");
    assert_eq!(down.code, ErrorCode::AllConnectionTriesFailed, "{down}");
    assert!(down.message.contains(&url.address()), "{down}");
    // Failing fast is failing without a connect: the backoff answers (an ordering, not a
    // time a busy machine could break).
    let fast = pool.checkout().await.expect_err("still down");
    assert!(fast.message.contains("tries again in"), "{fast}");
    pg.restart();
    let mut served = None;
    for _ in 0..100 {
        match pool.checkout().await {
            Ok(conn) => {
                served = Some(conn);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let mut e = served.expect("served again after the restart");
    let frames = run(&mut e, "SELECT 1").await;
    assert_eq!(&frames[1].body[..], &data_row(&[Some("1")])[..]);
}

/// A CA (`NAME-ca.crt`) and a certificate it signed for `localhost` (`NAME.crt`, `NAME.key`)
/// in `dir`: (CA certificate, certificate, key).
fn certificate(
    dir: &std::path::Path,
    name: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let path = |f: &str| dir.join(format!("{name}{f}"));
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .output()
            .expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let (ca, ca_key) = (format!("{name}-ca.crt"), format!("{name}-ca.key"));
    let (cert, key, csr, ext) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.ext"),
    );
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        &ca_key,
        "-out",
        &ca,
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        &key,
        "-out",
        &csr,
    ]);
    std::fs::write(dir.join(&ext), "subjectAltName=DNS:localhost\n").expect("ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &ext,
        "-out",
        &cert,
    ]);
    (path("-ca.crt"), path(".crt"), path(".key"))
}

/// `SELECT ssl FROM pg_stat_ssl` for the connection itself: whether PostgreSQL sees it
/// encrypted.
async fn encrypted(conn: &mut UpstreamConnection) -> bool {
    conn.query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .await
        .expect("query");
    let frames = conn.read_response().await.expect("answer");
    let row = frames.iter().find(|f| f.tag == b'D').expect("a row");
    row.body[..] == data_row(&[Some("t")])[..]
}

#[tokio::test]
async fn tls_to_the_upstream_as_sslmode_asks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(dir.path(), "owner", Auth::Password("owner-pw".into()));
    let with = |mode: &str| {
        UpstreamUrl::parse(&format!(
            "postgres://owner:owner-pw@localhost:{}/postgres?connect_timeout=10&{mode}",
            pg.port
        ))
        .expect("url")
    };
    // No TLS there yet: require refuses, prefer goes in the clear.
    let e = UpstreamConnection::connect(&with("sslmode=require"))
        .await
        .expect_err("no TLS upstream");
    assert_eq!(e.code, ErrorCode::AllConnectionTriesFailed);
    assert!(e.message.contains("does not accept TLS"), "{e}");
    let mut plain = UpstreamConnection::connect(&with("sslmode=prefer"))
        .await
        .expect("prefer");
    assert!(!plain.is_tls());
    assert!(!encrypted(&mut plain).await);

    // TLS on.
    let certs = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = certificate(certs.path(), "server");
    let data = pg.data_dir();
    std::fs::copy(&cert, data.join("server.crt")).expect("cert");
    std::fs::copy(&key, data.join("server.key")).expect("key");
    for file in ["server.crt", "server.key"] {
        let _ = std::process::Command::new("chown")
            .arg("postgres")
            .arg(data.join(file))
            .status();
        let _ = std::process::Command::new("chmod")
            .arg("600")
            .arg(data.join(file))
            .status();
    }
    pg.psql("ALTER SYSTEM SET ssl = on");
    pg.psql("SELECT pg_reload_conf()");
    // The reload is seen, not assumed: a new session reads the postmaster's configuration.
    let mut reloaded = false;
    for _ in 0..200 {
        if pg.psql("SHOW ssl").contains("on") {
            reloaded = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(reloaded, "PostgreSQL took ssl = on");

    for mode in [
        "sslmode=prefer".to_string(),
        "sslmode=require".to_string(),
        format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    ] {
        let mut conn = UpstreamConnection::connect(&with(&mode))
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert!(conn.is_tls(), "{mode}");
        assert!(encrypted(&mut conn).await, "{mode}: PostgreSQL sees TLS");
        assert!(conn.is_usable(), "{mode}: an idle TLS connection is usable");
    }
    // A certificate signed by someone else is refused under verify-full.
    let (other, _, _) = certificate(certs.path(), "other");
    let e = UpstreamConnection::connect(&with(&format!(
        "sslmode=verify-full&sslrootcert={}",
        other.display()
    )))
    .await
    .expect_err("wrong root");
    assert!(e.message.contains("TLS with the upstream"), "{e}");
    assert_eq!(
        UpstreamUrl::parse("postgres://a@b/c?sslmode=verify-full").map(|u| u.sslrootcert.is_none()),
        Ok(true)
    );
}

/// A pooled connection opened on one thread's current-thread runtime and lent on another's
/// (sluice runs connections on a thread each) is moved to the borrower's runtime: it is the
/// same upstream session, registered where it is used, and it keeps working after the
/// runtime that opened it is gone.
#[test]
fn a_connection_lent_on_another_thread_moves_there() {
    use sluice_engine::upstream::UpstreamPool;
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(dir.path(), "pool", Auth::Trust);
    let url = UpstreamUrl::parse(&format!(
        "postgres://pool@127.0.0.1:{}/postgres?sslmode=disable&connect_timeout=5",
        pg.port
    ))
    .expect("url");
    let pool = UpstreamPool::new(url, 2);
    let current_thread = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    };
    let backend_pid = |frames: Vec<Frame>| String::from_utf8_lossy(&frames[1].body).to_string();

    let opener = pool.clone();
    let first_pid = std::thread::spawn(move || {
        let runtime = current_thread();
        let pid = runtime.block_on(async {
            let mut conn = opener.checkout().await.expect("opened");
            assert!(conn.is_home());
            let pid = backend_pid(run(&mut conn, "SELECT pg_backend_pid()").await);
            drop(conn);
            eventually("back idle", || opener.idle() == 1).await;
            pid
        });
        // The runtime that opened the connection ends here, with it.
        drop(runtime);
        pid
    })
    .join()
    .expect("the first thread");

    let borrower = pool.clone();
    std::thread::spawn(move || {
        current_thread().block_on(async {
            let mut conn = borrower.checkout().await.expect("lent");
            assert!(conn.is_home(), "registered with the borrower's runtime");
            let pid = backend_pid(run(&mut conn, "SELECT pg_backend_pid()").await);
            assert_eq!(pid, first_pid, "the same upstream session, not a new one");
            let frames = run(&mut conn, "SELECT 41 + 1").await;
            assert_eq!(&frames[1].body[..], &data_row(&[Some("42")])[..]);
        })
    })
    .join()
    .expect("the second thread");
}

/// Pools sharing slots keep at most `size` connections open between them, lent or idle: one
/// that must open a connection while that many are open closes another pool's idle one first
/// (the one idle longest). `close_idle` closes those idle past a timeout, in every pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_sharing_slots_keep_at_most_size_connections_open() {
    use sluice_engine::upstream::UpstreamPool;
    let dir = tempfile::tempdir().expect("tempdir");
    let pg = Postgres::start(dir.path(), "pool", Auth::Trust);
    let backends = || {
        pg.psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'pool' AND backend_type = 'client backend' AND pid <> pg_backend_pid()")
            .trim()
            .parse::<usize>()
            .expect("a count")
    };
    let pg = &pg;
    let backends_become = |n: usize| async move {
        for _ in 0..100 {
            if backends() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let rows = pg.psql("SELECT pid, state, backend_type, query, application_name FROM pg_stat_activity WHERE usename = 'pool'");
        assert_eq!(backends(), n, "backends of the pools' role: {rows}");
    };
    let url = UpstreamUrl::parse(&format!(
        "postgres://pool@127.0.0.1:{}/postgres?sslmode=disable&connect_timeout=5",
        pg.port
    ))
    .expect("url");
    let first = UpstreamPool::new(url.clone(), 2);
    let second = UpstreamPool::sharing(
        UpstreamUrl {
            parameters: vec![("search_path".into(), "other".into())],
            ..url
        },
        &first,
    );
    let a = first.checkout().await.expect("a");
    let b = first.checkout().await.expect("b");
    drop(a);
    drop(b);
    eventually("both idle in the first pool", || first.idle() == 2).await;
    assert_eq!(first.open(), 2);
    // The second pool needs one: the first's idle one goes, so two stay open, not three.
    let c = second.checkout().await.expect("c");
    assert_eq!(first.idle(), 1);
    assert_eq!(second.open(), 2);
    // PostgreSQL sees the closed one go once its backend notices.
    backends_become(2).await;
    drop(c);
    eventually("back idle in the second pool", || second.idle() == 1).await;
    // Not idle long enough: kept.
    assert_eq!(first.close_idle(Duration::from_secs(3600)), 0);
    assert_eq!(first.open(), 2);
    // Idle past the timeout: closed, in both pools, and PostgreSQL sees them go.
    assert_eq!(first.close_idle(Duration::ZERO), 2);
    assert_eq!((first.idle(), second.idle(), first.open()), (0, 0, 0));
    backends_become(0).await;
    // A pool with room opens anew.
    let d = second.checkout().await.expect("d");
    assert_eq!(first.open(), 1);
    drop(d);
}
