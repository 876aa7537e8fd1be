//! Requests between the fleet's nodes, through etcd (the `etcd` feature): a node asks, the
//! nodes it names answer. What the fleet sees as one — `clusterAllReplicas(…, system.X)`,
//! `KILL QUERY` / `MOVE QUERY` of a statement on another node — goes this way, so nodes need
//! no channel to each other beyond the etcd they share (no ports, no credentials between them).
//!
//! Keys, under `PREFIX/fleet/`:
//! - `ask/ID`: a request, `ASKER\nLEASE\nNODES\nWHAT\nBODY` (`NODES`: those asked,
//!   comma-separated; the others leave it), under the asker's lease;
//! - `answer/ID/NODE`: a node's answer, under the asker's lease too, so that what an asker
//!   that died leaves behind goes with its lease; the asker deletes both when it has its
//!   answers (or gives up waiting).
//!
//! `ID` is `NODE.LEASE.N`: unique across the fleet (a node's name is while its lease lives).
//! An answer is `0` then the handler's bytes, or `1` then an error's message.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, DeleteOptions, EventType, PutOptions, WatchOptions};
use sluice_sql::Result;

use crate::retry::etcd_error;
use crate::Handler;

/// This node's side of the fleet's requests.
#[derive(Clone)]
pub struct Requests {
    client: Client,
    /// `PREFIX/fleet`.
    prefix: String,
    node: String,
    endpoints: Vec<String>,
    asked: Arc<AtomicU64>,
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests")
            .field("prefix", &self.prefix)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Deletes a request's keys when dropped (in a task: a drop cannot wait).
struct Cleanup {
    client: Client,
    /// The request's key and its answers' prefix.
    keys: [String; 2],
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let mut client = self.client.clone();
        let [ask, answers] = std::mem::take(&mut self.keys);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = client.delete(ask, None).await;
                let _ = client
                    .delete(answers, Some(DeleteOptions::new().with_prefix()))
                    .await;
            });
        }
    }
}

impl Requests {
    pub(crate) fn new(client: Client, prefix: &str, node: &str, endpoints: Vec<String>) -> Self {
        Requests {
            client,
            prefix: format!("{}/fleet", prefix.trim_end_matches('/')),
            node: node.to_string(),
            endpoints,
            asked: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Asks each node of `nodes` (not this one) `what` with `body`, under `lease` (this
    /// node's), and waits at most `wait` for their answers: each node's answer, or its error
    /// (the handler's, or that it did not answer in time).
    pub async fn ask(
        &self,
        lease: i64,
        what: &str,
        body: &[u8],
        nodes: &[String],
        wait: Duration,
    ) -> Result<BTreeMap<String, std::result::Result<Vec<u8>, String>>> {
        let mut out = BTreeMap::new();
        let nodes: Vec<&String> = nodes.iter().filter(|n| **n != self.node).collect();
        if nodes.is_empty() {
            return Ok(out);
        }
        let n = self.asked.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}.{lease}.{n}", self.node);
        let ask_key = format!("{}/ask/{id}", self.prefix);
        let answers = format!("{}/answer/{id}/", self.prefix);
        let asked: Vec<&str> = nodes.iter().map(|n| n.as_str()).collect();
        let mut value =
            format!("{}\n{lease}\n{}\n{what}\n", self.node, asked.join(",")).into_bytes();
        value.extend_from_slice(body);
        let mut client = self.client.clone();
        let asked = client
            .put(
                ask_key.as_str(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(|e| etcd_error("cannot ask the fleet's nodes", &self.endpoints, e))?;
        let from = asked.header().map_or(0, |h| h.revision());
        // Deleted however this ends, the asker's statement dropped midway (its client gone)
        // included: the keys live under this node's lease, which outlives the question.
        let _cleanup = Cleanup {
            client: client.clone(),
            keys: [ask_key.clone(), answers.clone()],
        };
        let deadline = tokio::time::Instant::now() + wait;
        let collected = async {
            let mut stream = client
                .watch(
                    answers.as_str(),
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(from + 1),
                    ),
                )
                .await?;
            while out.len() < nodes.len() {
                let Some(change) = stream.message().await? else {
                    break;
                };
                for event in change.events() {
                    if event.event_type() != EventType::Put {
                        continue;
                    }
                    let Some(kv) = event.kv() else { continue };
                    let Some(node) = kv
                        .key_str()
                        .ok()
                        .and_then(|k| k.strip_prefix(answers.as_str()))
                        .filter(|n| nodes.iter().any(|asked| asked == n))
                    else {
                        continue;
                    };
                    let answer = match kv.value().split_first() {
                        Some((0, bytes)) => Ok(bytes.to_vec()),
                        Some((_, message)) => Err(String::from_utf8_lossy(message).into_owned()),
                        None => Err("an empty answer".to_string()),
                    };
                    out.insert(node.to_string(), answer);
                }
            }
            Ok::<_, etcd_client::Error>(())
        };
        let ended = tokio::time::timeout_at(deadline, collected).await;
        if let Ok(Err(e)) = ended {
            return Err(etcd_error(
                "cannot read the fleet's answers",
                &self.endpoints,
                e,
            ));
        }
        let mut out: BTreeMap<String, std::result::Result<Vec<u8>, String>> = out;
        for node in nodes {
            out.entry(node.clone())
                .or_insert_with(|| Err(format!("no answer within {:.1} s", wait.as_secs_f64())));
        }
        Ok(out)
    }

    /// Answers the requests other nodes ask (each with `handler`, at once and side by side),
    /// for as long as the server runs; the watch is taken up again when it breaks.
    pub async fn answer(&self, handler: Handler) {
        loop {
            if let Err(e) = self.answer_once(&handler).await {
                tracing::warn!("answering the fleet's requests: {e}; watching again");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn answer_once(&self, handler: &Handler) -> std::result::Result<(), etcd_client::Error> {
        let mut client = self.client.clone();
        let asks = format!("{}/ask/", self.prefix);
        let mut stream = client
            .watch(asks.as_str(), Some(WatchOptions::new().with_prefix()))
            .await?;
        while let Some(change) = stream.message().await? {
            for event in change.events() {
                if event.event_type() != EventType::Put {
                    continue;
                }
                let Some(kv) = event.kv() else { continue };
                let Some(id) = kv
                    .key_str()
                    .ok()
                    .and_then(|k| k.strip_prefix(asks.as_str()))
                else {
                    continue;
                };
                let mut parts = kv.value().splitn(5, |b| *b == b'\n');
                let (Some(asker), Some(lease), Some(asked), Some(what), body) = (
                    parts.next(),
                    parts.next(),
                    parts.next(),
                    parts.next(),
                    parts.next(),
                ) else {
                    continue;
                };
                let asker = String::from_utf8_lossy(asker).into_owned();
                let asked = String::from_utf8_lossy(asked);
                if asker == self.node || !asked.split(',').any(|n| n == self.node) {
                    continue;
                }
                let Some(lease) = std::str::from_utf8(lease)
                    .ok()
                    .and_then(|l| l.parse::<i64>().ok())
                else {
                    continue;
                };
                let what = String::from_utf8_lossy(what).into_owned();
                let body = body.unwrap_or_default().to_vec();
                let key = format!("{}/answer/{id}/{}", self.prefix, self.node);
                let (handler, mut client) = (handler.clone(), client.clone());
                tokio::spawn(async move {
                    let mut value = match handler(what, body).await {
                        Ok(bytes) => {
                            let mut v = vec![0];
                            v.extend(bytes);
                            v
                        }
                        Err(message) => {
                            let mut v = vec![1];
                            v.extend(message.into_bytes());
                            v
                        }
                    };
                    // etcd refuses a request above its limit (1.5 MiB by default): say so.
                    if value.len() > 1 << 20 {
                        value = format!(
                            "\u{1}the answer ({} bytes) is larger than a request to etcd may be",
                            value.len()
                        )
                        .into_bytes();
                    }
                    let options = PutOptions::new().with_lease(lease);
                    if let Err(e) = client.put(key.as_str(), value, Some(options)).await {
                        // The asker's lease is gone (it gave up, or died): nobody waits.
                        tracing::debug!("answering a fleet request: {e}");
                    }
                });
            }
        }
        Ok(())
    }
}
