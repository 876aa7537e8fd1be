//! Disk IO over the wire (`READ DISK` / `WRITE DISK`, reference §4.9): a file on a configured
//! disk is read through its workload's IO resource, a chunk at a time, each chunk's bytes its
//! cost, so `max_bytes_per_second` paces a scan while an unthrottled workload reads the same
//! file at full speed beside it.

mod support;

use std::io::Write;
use std::time::{Duration, Instant};

use sluice_server::ServerOptions;
use support::*;

const MIB: u64 = 1 << 20;

/// A CSV file of at least `bytes` bytes (a header and numbered rows); its row count.
fn write_csv(path: &std::path::Path, bytes: u64) -> u64 {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    writeln!(file, "a,b").expect("write");
    let mut rows = 0;
    let mut written = 4;
    while written < bytes {
        let line = format!("{rows},row number {rows} of the throttled file\n");
        file.write_all(line.as_bytes()).expect("write");
        written += line.len() as u64;
        rows += 1;
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_workload_reads_at_its_rate_beside_a_full_speed_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = tempfile::tempdir().expect("disk dir");
    let csv = disk.path().join("events.csv");
    let size = 12 * MIB;
    let rows = write_csv(&csv, size);
    let server = TestServer::start_with(ServerOptions {
        disks: [("data".to_string(), disk.path().to_path_buf())]
            .into_iter()
            .collect(),
        ..test_options(dir.path())
    })
    .await;
    let admin = server.client().await;
    admin
        .batch_execute(&format!(
            "CREATE RESOURCE disk_io (READ DISK data, WRITE DISK data);
             CREATE WORKLOAD all;
             CREATE WORKLOAD slow IN all SETTINGS max_bytes_per_second = '2Mi';
             CREATE WORKLOAD fast IN all;
             CREATE EXTERNAL TABLE events (a BIGINT, b VARCHAR) STORED AS CSV
                 LOCATION '{}' OPTIONS ('format.has_header' 'true')",
            csv.display()
        ))
        .await
        .expect("ddl");

    let count = |workload: &'static str| {
        let port = server.port;
        tokio::spawn(async move {
            let client = connect(&format!("host=127.0.0.1 port={port} user=tester dbname=x"))
                .await
                .expect("connects");
            let start = Instant::now();
            let n = column(
                &client,
                &format!("SELECT count(*) FROM events SETTINGS workload = '{workload}'"),
            )
            .await;
            (n, start.elapsed())
        })
    };
    let slow = count("slow");
    // The fast one starts while the slow one is being paced.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fast = count("fast");
    let (fast_rows, fast_took) = fast.await.expect("task");
    let (slow_rows, slow_took) = slow.await.expect("task");
    assert_eq!(fast_rows, [rows.to_string()]);
    assert_eq!(slow_rows, [rows.to_string()]);
    // The throttler's guarantee: at most burst (one second, 2 MiB) + rate × T + one chunk
    // (1 MiB) in any window T, so 12 MiB cannot take less than 4.5 s.
    assert!(
        slow_took >= Duration::from_millis(4500),
        "paced at 2 MiB/s: {slow_took:?}"
    );
    assert!(slow_took < Duration::from_secs(30), "{slow_took:?}");
    assert!(
        fast_took * 2 < slow_took,
        "the unthrottled read is not held back: fast {fast_took:?}, slow {slow_took:?}"
    );
    eprintln!("12 MiB: slow (2 MiB/s) {slow_took:?}, fast {fast_took:?}");

    // The tree saw every byte: the slow throttler dequeued the file and was throttled.
    let seen = column(
        &admin,
        "SELECT dequeued_cost || ' ' || (throttling_us > 0) FROM system.scheduler \
         WHERE resource = 'disk_io' AND path LIKE '%/slow/throttler'",
    )
    .await;
    let (cost, throttled) = seen[0].split_once(' ').expect("two values");
    assert!(cost.parse::<u64>().expect("number") >= size, "{seen:?}");
    assert_eq!(throttled, "true", "{seen:?}");
    assert_nothing_held(&admin).await;

    // Writes are paced too: COPY … TO a file on the disk waits at the same throttler.
    let slow_bytes = || async {
        column(
            &admin,
            "SELECT dequeued_cost FROM system.scheduler \
             WHERE resource = 'disk_io' AND path LIKE '%/slow/throttler'",
        )
        .await[0]
            .parse::<u64>()
            .expect("number")
    };
    let before = slow_bytes().await;
    let out = disk.path().join("copy.csv");
    let client = server.client().await;
    client
        .batch_execute(&format!(
            "COPY (SELECT a FROM events WHERE a < 1000) TO '{}' STORED AS CSV SETTINGS workload = 'slow'",
            out.display()
        ))
        .await
        .expect("copies");
    let after = slow_bytes().await;
    let copied = std::fs::metadata(&out).expect("written").len();
    assert!(
        after - before >= size + copied,
        "the read and the write both counted: {} of {}",
        after - before,
        size + copied
    );
    assert_nothing_held(&admin).await;
    server.stop().await;
}
