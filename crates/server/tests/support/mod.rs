//! What the server's integration tests share: a server on an ephemeral loopback port (real
//! pgwire, real engine), real Postgres clients (tokio-postgres), and helpers that observe
//! waiting through `system.processes` instead of sleeping and hoping.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use sluice_engine::Barriers;
use sluice_sched::Machine;
use sluice_server::{serve, ServerOptions, Shared};
use tokio::net::TcpListener;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

pub struct TestServer {
    pub port: u16,
    pub shared: Arc<Shared>,
    /// The gates `sluice_barrier(name)` waits on in this server's queries.
    pub barriers: Barriers,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// The machine the tests' servers take themselves to run on, whatever this one is: the
/// trees' limits that are ratios of it come out the same everywhere.
pub const TEST_MACHINE: Machine = Machine {
    cores: 4,
    memory: 1 << 34,
};

/// A server's options on [`TEST_MACHINE`], its catalog in `data_dir`.
pub fn test_options(data_dir: &std::path::Path) -> ServerOptions {
    ServerOptions::new(data_dir, TEST_MACHINE)
}

impl TestServer {
    pub async fn start(data_dir: &std::path::Path, throw_on_unknown_workload: bool) -> TestServer {
        TestServer::start_with(ServerOptions {
            throw_on_unknown_workload,
            ..test_options(data_dir)
        })
        .await
    }

    pub async fn start_with(mut options: ServerOptions) -> TestServer {
        let barriers = options
            .barriers
            .get_or_insert_with(Barriers::default)
            .clone();
        let shared = Shared::open(options).expect("server state opens");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            serve(listener, serving, async {
                let _ = stopped.await;
            })
            .await
            .expect("serves");
        });
        TestServer {
            port,
            shared,
            barriers,
            stop: Some(stop),
            task,
        }
    }

    /// Begins shutdown; the returned task completes when the server has drained.
    pub fn begin_stop(mut self) -> tokio::task::JoinHandle<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task
    }

    pub async fn client(&self) -> Client {
        self.client_with(&format!(
            "host=127.0.0.1 port={} user=tester dbname=any",
            self.port
        ))
        .await
    }

    pub async fn client_with(&self, conn: &str) -> Client {
        connect(conn).await.expect("connects")
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// A client connected with `conn` (a libpq-style string), its connection driven in a task.
pub async fn connect(conn: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conn, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Runs `sql` on a connection of its own, in a task of its own.
pub async fn spawn_query(
    server: &TestServer,
    sql: &str,
) -> tokio::task::JoinHandle<Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>> {
    let client = server.client().await;
    let sql = sql.to_string();
    tokio::spawn(async move { client.simple_query(&sql).await })
}

/// The first column of every row of a simple query, as text.
pub async fn column(client: &Client, sql: &str) -> Vec<String> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_string()),
            _ => None,
        })
        .collect()
}

/// What each waiting statement waits for (`system.processes.waiting_for`).
pub async fn waiting_for(client: &Client) -> Vec<String> {
    column(
        client,
        "SELECT waiting_for FROM system.processes WHERE state = 'waiting'",
    )
    .await
}

/// Waits (bounded) until `system.processes` shows `n` statements waiting.
pub async fn until_waiting(client: &Client, n: usize) {
    until_count(
        client,
        "SELECT count(*) FROM system.processes WHERE state = 'waiting'",
        n,
    )
    .await;
}

/// Waits (bounded) until `system.processes` shows `n` statements running besides the probe.
#[allow(dead_code)] // not every test binary uses it
pub async fn until_running(client: &Client, n: usize) {
    let probe = "SELECT count(*) - 1 FROM system.processes WHERE state = 'running'";
    until_count(client, probe, n).await;
}

/// Waits (bounded, 10 s) until `sql` answers `want` (its first column, rows joined by `,`).
pub async fn until(client: &Client, sql: &str, want: &str) {
    let mut last = Vec::new();
    for _ in 0..1000 {
        last = column(client, sql).await;
        if last.join(",") == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{sql}: wanted {want}, last saw {last:?}");
}

/// Waits (bounded, 5 s) until the one-value query `sql` answers `n`.
async fn until_count(client: &Client, sql: &str, n: usize) {
    for _ in 0..500 {
        if column(client, sql).await == [n.to_string()] {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never saw {n} from {sql}");
}

/// A server on a fresh data dir, with `ddl` applied through an admin connection.
pub async fn started_with(
    ddl: &str,
    throw_on_unknown_workload: bool,
) -> (tempfile::TempDir, TestServer, Client) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(dir.path(), throw_on_unknown_workload).await;
    let admin = server.client().await;
    admin.batch_execute(ddl).await.expect("ddl");
    (dir, server, admin)
}

/// No scheduler node holds a request or has one queued.
pub async fn assert_nothing_held(admin: &Client) {
    assert_eq!(
        column(
            admin,
            "SELECT coalesce(sum(inflight_requests), 0) || ' ' || coalesce(sum(queue_length), 0) FROM system.scheduler"
        )
        .await,
        ["0 0"],
        "nothing is left held or queued"
    );
}

/// `e` is a server error with SQLSTATE `state` whose message contains `says`.
#[track_caller]
pub fn assert_refused(e: &tokio_postgres::Error, state: &str, says: &str) {
    assert_eq!(sqlstate(e), state, "{e}");
    assert!(
        message(e).contains(says),
        "wanted {says:?} in: {}",
        message(e)
    );
}

pub fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.code().code().to_string())
        .unwrap_or_default()
}

pub fn message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string())
}

/// `psql -X -A -t -v ON_ERROR_STOP=1 -c sql` at `conn` (a libpq connection string) with `env`
/// (PGTZ, PGDATESTYLE, PGOPTIONS, … unset unless given), run off the test's runtime: the
/// server under test answers on it.
pub async fn psql(conn: &str, env: &[(&str, &str)], sql: &str) -> std::process::Output {
    let mut command = std::process::Command::new("psql");
    command
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .arg(conn)
        .env_remove("PGOPTIONS")
        .env_remove("PGTZ")
        .env_remove("PGDATESTYLE");
    for (name, value) in env {
        command.env(name, value);
    }
    tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("psql's thread")
        .expect("psql runs (the machine's PostgreSQL client)")
}

/// That a statement read apart held no other client of its connection thread: the other
/// client's slowest answer while it was read (`slowest`) is under a quarter of the statement's
/// own time (`took`). Read in line, the other client waits for most of it.
pub fn assert_thread_not_held(slowest: Duration, took: Duration) {
    eprintln!("the big statement took {took:?}; the other client's slowest answer {slowest:?}");
    assert!(
        slowest * 4 < took,
        "the other client waited {slowest:?} for an answer while the big statement ({took:?}) was read"
    );
}
