//! The live page in a real browser: `sluice serve` (the binary, as a process) with a workload
//! tree, one query running and one waiting; headless Chromium (driven by
//! `tests/browser/live_page.js` through playwright-core) finds the tree's nodes and the waiting
//! query in the DOM, then sees the figures change by themselves as the queries finish.
//! `.ci/run` installs Chromium and playwright-core and sets `SLUICE_NODE_MODULES`; without it
//! the test fails, saying how to get it. `SLUICE_PAGE_SCREENSHOT=path`
//! saves what the browser showed (docs/live-page.png was made so).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, required_env, start};

fn psql(port: u16, sql: &str) -> Child {
    Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["-U", "dba", "-d", "sluice", "-c", sql])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("psql runs")
}

/// `GET path` on the HTTP port: the status line and the body.
fn get(port: u16, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("http connect");
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

#[test]
fn the_live_page_shows_the_tree_and_the_queue_and_follows_them() {
    let modules = required_env("SLUICE_NODE_MODULES", "a node_modules with playwright-core");
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, http) = (free_port(), free_port());
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, format!("[http]\nlisten = \"127.0.0.1:{http}\"\n")).expect("config");
    let _server = start(
        dir.path(),
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "--listen",
            &format!("127.0.0.1:{port}"),
        ],
    );
    let made = psql(
        port,
        "CREATE RESOURCE slots (QUERY); \
         CREATE WORKLOAD all SETTINGS max_concurrent_queries = 1; \
         CREATE WORKLOAD prod IN all SETTINGS weight = 3; \
         CREATE WORKLOAD dev IN all",
    )
    .wait_with_output()
    .expect("psql");
    assert!(made.status.success(), "the tree");
    // The page and its figures are served.
    let (status, page) = get(http, "/");
    assert!(status.contains("200"), "{status}");
    assert!(
        page.contains("new EventSource(\"events\")"),
        "the page follows /events"
    );
    // One query holds the only slot; the next waits for it.
    // It runs until the browser has seen the queue; then its client goes away, which ends it.
    let mut running = psql(port, "SELECT pg_sleep(120) SETTINGS workload = 'prod'");
    let started = Instant::now();
    while !get(http, "/state").1.contains("\"state\":\"running\"") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the first query never ran"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut waiting = psql(port, "SELECT 42 SETTINGS workload = 'dev'");
    while !get(http, "/state").1.contains("\"state\":\"waiting\"") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the second query never waited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/live_page.js");
    let mut node = Command::new("node");
    node.arg(&script)
        .arg(format!("http://127.0.0.1:{http}/"))
        .env("NODE_PATH", &modules);
    if let Some(shot) = std::env::var_os("SLUICE_PAGE_SCREENSHOT") {
        node.arg(shot);
    }
    let mut browser = node
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs (install nodejs)");
    let mut said = String::new();
    for line in BufReader::new(browser.stdout.take().expect("stdout")).lines() {
        let line = line.expect("node's output");
        if line.starts_with("dev queued 1") {
            let _ = running.kill();
        }
        said.push_str(&line);
        said.push('\n');
    }
    let _ = running.kill();
    let mut errors = String::new();
    let _ = browser
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut errors);
    let status = browser.wait().expect("node");
    assert!(
        status.success(),
        "the browser check failed:\n{said}{errors}"
    );
    for line in [
        "tree: ",
        "shares: all 100%",
        "waiting: SELECT 42",
        "dev queued 1",
        "after: nothing runs",
    ] {
        assert!(said.contains(line), "{line} not checked:\n{said}");
    }
    let _ = running.wait();
    assert!(waiting.wait().expect("psql").success());
}
