//! A map the fleet's nodes share in etcd (the `etcd` feature): keys under `PREFIX/NAME/`,
//! durable (no lease: they outlive the node that wrote them), written by any node, the last
//! write winning; every node follows it by watch and so ends with the same map. The learned
//! lanes are one (`PREFIX/lanes/FINGERPRINT`).

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use sluice_sql::Result;

use crate::retry::{etcd_error, retried};

/// One change of a shared map: a key and its new value (`None`: deleted).
pub type MapChange = (String, Option<String>);

/// A map the fleet shares in etcd.
#[derive(Clone)]
pub struct SharedMap {
    client: Client,
    /// `PREFIX/NAME/`.
    prefix: String,
    endpoints: Vec<String>,
}

impl std::fmt::Debug for SharedMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMap")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl SharedMap {
    pub(crate) fn new(client: Client, prefix: &str, name: &str, endpoints: Vec<String>) -> Self {
        SharedMap {
            client,
            prefix: format!("{}/{name}/", prefix.trim_end_matches('/')),
            endpoints,
        }
    }

    /// Sets `key` to `value`.
    pub async fn put(&self, key: &str, value: &str) -> Result<()> {
        let full = format!("{}{key}", self.prefix);
        retried!(
            "cannot store a change of the fleet's map",
            &self.endpoints,
            self.client.clone().put(full.as_str(), value, None).await
        );
        Ok(())
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &str) -> Result<()> {
        let full = format!("{}{key}", self.prefix);
        retried!(
            "cannot store a change of the fleet's map",
            &self.endpoints,
            self.client.clone().delete(full.as_str(), None).await
        );
        Ok(())
    }

    /// The whole map, and the revision it was read at.
    pub async fn load(&self) -> Result<(Vec<(String, String)>, i64)> {
        let all = retried!(
            "cannot read the fleet's map",
            &self.endpoints,
            self.client
                .clone()
                .get(self.prefix.as_str(), Some(GetOptions::new().with_prefix()))
                .await
        );
        let revision = all.header().map_or(0, |h| h.revision());
        let entries = all
            .kvs()
            .iter()
            .filter_map(|kv| {
                let key = kv.key_str().ok()?.strip_prefix(self.prefix.as_str())?;
                Some((key.to_string(), kv.value_str().ok()?.to_string()))
            })
            .collect();
        Ok((entries, revision))
    }

    /// Sends every change after revision `from` to `changes`, in order, until it has no
    /// receiver or the watch breaks (an error: the caller loads the map again).
    pub async fn follow(
        &self,
        from: i64,
        changes: tokio::sync::mpsc::UnboundedSender<MapChange>,
    ) -> Result<()> {
        let mut stream = self
            .client
            .clone()
            .watch(
                self.prefix.as_str(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(from + 1),
                ),
            )
            .await
            .map_err(|e| etcd_error("cannot follow the fleet's map", &self.endpoints, e))?;
        loop {
            let message = stream
                .message()
                .await
                .map_err(|e| etcd_error("cannot follow the fleet's map", &self.endpoints, e))?;
            let Some(message) = message else {
                return Err(sluice_sql::Error::new(
                    sluice_sql::ErrorCode::KeeperException,
                    "etcd ended the watch of the fleet's map",
                ));
            };
            for event in message.events() {
                let Some(kv) = event.kv() else { continue };
                let Some(key) = kv
                    .key_str()
                    .ok()
                    .and_then(|k| k.strip_prefix(self.prefix.as_str()))
                else {
                    continue;
                };
                let value = match event.event_type() {
                    EventType::Put => Some(kv.value_str().unwrap_or("").to_string()),
                    EventType::Delete => None,
                };
                if changes.send((key.to_string(), value)).is_err() {
                    return Ok(());
                }
            }
        }
    }
}
