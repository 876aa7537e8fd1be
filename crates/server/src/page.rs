//! The live page: the workload tree per resource with its figures, and the running and
//! waiting queries, in a browser, updating by itself. Served from the metrics endpoint's
//! server (one port): `GET /` is the page (plain HTML, CSS and JavaScript compiled into the
//! binary, nothing fetched from elsewhere), `GET /state` the figures as JSON, `GET /events` the
//! same figures as server-sent events, one event a second.
//!
//! Invariants:
//! - The figures are the system tables' own rows (`system.resources`, `system.workloads`,
//!   `system.scheduler`, `system.processes`), built by [`crate::system::tables`]: the page
//!   shows what SQL shows, never a second account of it.
//! - In a fleet, `system.scheduler` and `system.processes` are every live node's rows (as
//!   `clusterAllReplicas` reads them, each with its `node`): the page of any node shows the
//!   whole fleet.
//! - Read-only: nothing here changes the server.
//! - At most [`MAX_STREAMS`] event streams at once; each ends when its browser goes away or
//!   stops reading (a write that cannot finish in [`WRITE_TIMEOUT`]), so stalled readers cannot
//!   keep the places from live pages.
//! - The figures are built once per tick for all open streams ([`Ticks`]), however many there
//!   are.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use sluice_engine::datafusion::arrow::array::{Array, AsArray};
use sluice_engine::datafusion::arrow::datatypes::DataType;
use sluice_engine::datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::state::Shared;

/// The page itself.
pub const INDEX_HTML: &str = include_str!("page/index.html");

/// Event streams served at once; more get 503.
pub const MAX_STREAMS: usize = 64;

/// How long one write to a page's connection may take before the connection is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often an event stream sends the figures.
pub const TICK: Duration = Duration::from_secs(1);

/// The tables the page shows.
const TABLES: [&str; 5] = [
    "resources",
    "workloads",
    "scheduler",
    "processes",
    "workload_shares",
];

/// The tables that show every node of a fleet.
const FLEET_TABLES: [&str; 2] = ["scheduler", "processes"];

/// The page's figures as of now: `{"at": <unix ms>, "node": <this node>, "<table>": [{column:
/// value, …}, …], …}`.
pub async fn state_json(shared: &Shared) -> String {
    let mut out = String::from("{");
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let _ = write!(out, "\"at\":{at},\"node\":");
    string(shared.node_name(), &mut out);
    let in_fleet = shared.fleet.get().is_some();
    let mut errors = Vec::new();
    // In a fleet, this node's rows of the fleet's tables, to which the others' are added.
    let mut local = Vec::new();
    let result = crate::system::tables(shared, &mut |name, batch| {
        if in_fleet && FLEET_TABLES.contains(&name) {
            local.push((name.to_string(), batch));
        } else if TABLES.contains(&name) {
            let _ = write!(out, ",\"{name}\":");
            rows_json(&batch, &mut out);
        }
        Ok(())
    });
    if let Err(e) = result {
        errors.push(e.message);
    }
    for (name, batch) in local {
        match crate::fleet_views::gather(shared, &name, batch).await {
            Ok(batch) => {
                let _ = write!(out, ",\"{name}\":");
                rows_json(&batch, &mut out);
            }
            Err(e) => errors.push(e.message),
        }
    }
    if !errors.is_empty() {
        let _ = write!(out, ",\"error\":");
        string(&errors.join("; "), &mut out);
    }
    out.push('}');
    out
}

/// The figures the event streams send, shared between them: a stream asking within half a
/// tick of the last build gets that build, so N open pages cost one build a tick, not N.
#[derive(Debug, Default)]
pub struct Ticks {
    /// Held while a build runs (it may ask the fleet), so the others wait for it.
    last: tokio::sync::Mutex<Option<(Instant, Arc<str>)>>,
}

impl Ticks {
    /// The latest figures, built by `build` when there are none from the last half tick.
    pub async fn state<F: std::future::Future<Output = String>>(
        &self,
        build: impl FnOnce() -> F,
    ) -> Arc<str> {
        let mut last = self.last.lock().await;
        if let Some((at, state)) = last.as_ref() {
            if at.elapsed() < TICK / 2 {
                return state.clone();
            }
        }
        let state: Arc<str> = build().await.into();
        *last = Some((Instant::now(), state.clone()));
        state
    }
}

/// `bytes` written to `out` within [`WRITE_TIMEOUT`]; an error when the write fails or the
/// reader does not take them in time.
pub async fn write_timed<W: AsyncWrite + Unpin>(out: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    match tokio::time::timeout(WRITE_TIMEOUT, out.write_all(bytes)).await {
        Ok(written) => written,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the page's reader took no bytes in time",
        )),
    }
}

/// Sends `next()` as a server-sent event every [`TICK`] until a write fails or times out
/// (the reader went away or stopped reading); returns why.
pub async fn stream_events<W: AsyncWrite + Unpin, F: std::future::Future<Output = Arc<str>>>(
    out: &mut W,
    mut next: impl FnMut() -> F,
) -> std::io::Error {
    let mut tick = tokio::time::interval(TICK);
    loop {
        tick.tick().await;
        let event = format!("data: {}\n\n", next().await);
        if let Err(e) = write_timed(out, event.as_bytes()).await {
            return e;
        }
    }
}

/// A batch as a JSON array of objects, one per row: numbers and booleans as themselves, NULL
/// as null, everything else as its text.
fn rows_json(batch: &RecordBatch, out: &mut String) {
    let options = FormatOptions::default();
    let formatters: Vec<Option<ArrayFormatter<'_>>> = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).ok())
        .collect();
    out.push('[');
    for row in 0..batch.num_rows() {
        if row > 0 {
            out.push(',');
        }
        out.push('{');
        for (i, field) in batch.schema().fields().iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            string(field.name(), out);
            out.push(':');
            let column = batch.column(i);
            if column.is_null(row) {
                out.push_str("null");
                continue;
            }
            let text = formatters[i]
                .as_ref()
                .map(|f| f.value(row).to_string())
                .unwrap_or_default();
            match column.data_type() {
                DataType::Boolean => out.push_str(if column.as_boolean().value(row) {
                    "true"
                } else {
                    "false"
                }),
                t if t.is_numeric() && text.parse::<f64>().is_ok_and(f64::is_finite) => {
                    out.push_str(&text)
                }
                _ => string(&text, out),
            }
        }
        out.push('}');
    }
    out.push(']');
}

/// `s` as a JSON string.
fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // `<` too, so that no text can close a script element it is put in.
            c if (c as u32) < 0x20 || c == '<' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_reading_loses_its_stream() {
        // The far end takes nothing: once the pipe's 1 KiB is full, a write cannot finish.
        let (mut near, _far) = tokio::io::duplex(1024);
        let ended = tokio::time::timeout(
            Duration::from_secs(3600),
            stream_events(&mut near, || async { Arc::from("x".repeat(300)) }),
        )
        .await
        .expect("the stream ends, releasing its place");
        assert_eq!(ended.kind(), std::io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn open_pages_share_one_build_a_tick() {
        let ticks = Ticks::default();
        let mut builds = 0;
        for _ in 0..64 {
            ticks
                .state(|| {
                    builds += 1;
                    async { "{}".to_string() }
                })
                .await;
        }
        assert_eq!(builds, 1);
        tokio::time::advance(TICK).await;
        let state = ticks
            .state(|| {
                builds += 1;
                async { "{\"at\":1}".to_string() }
            })
            .await;
        assert_eq!((builds, &*state), (2, "{\"at\":1}"));
    }

    #[test]
    fn json_strings_escape_what_json_and_html_need() {
        let mut out = String::new();
        string("a\"b\\c\nd</script>\u{1}", &mut out);
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\u003c/script>\\u0001\"");
    }
}
