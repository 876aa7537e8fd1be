//! The HTTP endpoint (`[http] listen`): `GET /metrics` (the Prometheus text of
//! [`crate::metrics`]) and the live page (`GET /`, `/state`, `/events`; [`crate::page`]).
//! It sits at the top: it reads the server's shared state and nothing below imports it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::state::Shared;

/// Serves `GET /metrics`, and the live page (`GET /`, `/state`, `/events`; see
/// [`crate::page`]), on `listener` until `shutdown` completes. One request per connection
/// (an event stream lasts as long as its browser stays); anything else gets 404, oversized
/// requests 431. When users are configured, the page asks for one of them (HTTP Basic, checked
/// against the same SCRAM verifiers as the SQL port); `/metrics` stays open to scrapers.
pub async fn serve_http(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let streams = Arc::new(tokio::sync::Semaphore::new(crate::page::MAX_STREAMS));
    let ticks = Arc::new(crate::page::Ticks::default());
    loop {
        let (mut socket, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("http: accept failed: {e}");
                    continue;
                }
            },
        };
        let shared = shared.clone();
        let streams = streams.clone();
        let ticks = ticks.clone();
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() <= 8192 {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let text = String::from_utf8_lossy(&request);
            let line = text.lines().next().unwrap_or_default();
            let path = line
                .strip_prefix("GET ")
                .and_then(|rest| rest.split(' ').next())
                .map(|p| p.split('?').next().unwrap_or(p));
            let authorized = !shared.logins.required()
                || text
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(name, _)| name.eq_ignore_ascii_case("authorization"))
                    .and_then(|(_, value)| shared.users.check_basic(value))
                    .is_some();
            let respond = |status: &str, kind: &str, extra: &str, body: String| {
                format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
                    body.len()
                )
            };
            let response = if request.len() > 8192 {
                respond(
                    "431 Request Header Fields Too Large",
                    "text/plain",
                    "",
                    String::new(),
                )
            } else {
                match path {
                    Some("/metrics") => respond(
                        "200 OK",
                        "text/plain; version=0.0.4",
                        "",
                        shared.metrics.render(),
                    ),
                    Some("/" | "/index.html" | "/state" | "/events") if !authorized => respond(
                        "401 Unauthorized",
                        "text/plain",
                        "WWW-Authenticate: Basic realm=\"sluice\", charset=\"UTF-8\"\r\n",
                        "sluice's page asks for one of its users (the SQL port's name and password)\n".into(),
                    ),
                    Some("/" | "/index.html") => respond(
                        "200 OK",
                        "text/html; charset=utf-8",
                        "Cache-Control: no-cache\r\n",
                        crate::page::INDEX_HTML.to_string(),
                    ),
                    Some("/state") => respond(
                        "200 OK",
                        "application/json",
                        "Cache-Control: no-cache\r\n",
                        crate::page::state_json(&shared).await,
                    ),
                    Some("/events") => {
                        let Ok(_stream) = streams.try_acquire() else {
                            let busy = respond(
                                "503 Service Unavailable",
                                "text/plain",
                                "",
                                format!("at most {} live pages at once\n", crate::page::MAX_STREAMS),
                            );
                            let _ = crate::page::write_timed(&mut socket, busy.as_bytes()).await;
                            return;
                        };
                        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: keep-alive\r\n\r\nretry: 1000\n\n";
                        if crate::page::write_timed(&mut socket, head.as_bytes()).await.is_err() {
                            return;
                        }
                        let ended = crate::page::stream_events(&mut socket, || {
                            ticks.state(|| crate::page::state_json(&shared))
                        })
                        .await;
                        tracing::debug!("http: a live page's event stream ended: {ended}");
                        return;
                    }
                    _ => respond(
                        "404 Not Found",
                        "text/plain",
                        "",
                        "sluice serves GET /metrics, and its live page at GET /\n".into(),
                    ),
                }
            };
            let _ = crate::page::write_timed(&mut socket, response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}
