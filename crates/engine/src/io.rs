//! A statement's file reads and writes, through its [`IoGate`]: the server's IO scheduling
//! (`READ DISK` / `WRITE DISK` resources) decides when each chunk may move.
//!
//! A statement that runs with a gate plans and executes with an object-store registry of its
//! own ([`gated_registry`]) whose `file://` store is the engine's local store behind a
//! [`GatedStore`]. Every read is split into chunks of [`CHUNK`] bytes: each chunk asks the gate
//! first (its cost is its bytes), is read while the gate's guard is held, and then lets the
//! guard go — so a limit on requests or bytes in flight counts reads while they happen, and a
//! rate limit paces them. Writes ask for their whole part before it is written. Listing,
//! metadata and deletes are not IO by ClickHouse's count (they move no data) and pass.
//!
//! Invariants:
//! - Bytes reach DataFusion only after the gate admitted them; a gate error fails the read
//!   (and so the statement) with the gate's error.
//! - Parts of one multipart upload are admitted and handed to the store in the order DataFusion
//!   gave them, so the file's bytes are in order whatever the gate's order of admission.

use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::common::Result as DfResult;
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::object_store::path::Path;
use datafusion::object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};
use futures::stream::{BoxStream, StreamExt};
use futures::FutureExt;
use url::Url;

/// Bytes per read request: large enough that asking the gate costs little next to the read,
/// small enough that a rate limit paces a file smoothly (ClickHouse reads in ~1 MiB buffers).
pub const CHUNK: u64 = 1 << 20;

/// What a statement's file IO waits on. `admit` returns once `bytes` of `path` may be read
/// (`write`: written); the guard it returns is held while they move.
#[async_trait]
pub trait IoGate: Send + Sync + fmt::Debug {
    async fn admit(
        &self,
        path: &FsPath,
        bytes: u64,
        write: bool,
    ) -> sluice_sql::Result<Box<dyn Send>>;
}

/// `registry` with its `file://` store behind `gate`.
pub fn gated_registry(
    registry: Arc<dyn ObjectStoreRegistry>,
    gate: Arc<dyn IoGate>,
) -> Arc<dyn ObjectStoreRegistry> {
    Arc::new(GatedRegistry {
        inner: registry,
        gate,
    })
}

#[derive(Debug)]
struct GatedRegistry {
    inner: Arc<dyn ObjectStoreRegistry>,
    gate: Arc<dyn IoGate>,
}

impl ObjectStoreRegistry for GatedRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        let store = self.inner.get_store(url)?;
        if url.scheme() != "file" {
            return Ok(store);
        }
        Ok(Arc::new(GatedStore {
            inner: store,
            gate: self.gate.clone(),
        }))
    }
}

/// The local file store, each byte admitted by a gate first.
#[derive(Debug)]
pub struct GatedStore {
    inner: Arc<dyn ObjectStore>,
    gate: Arc<dyn IoGate>,
}

impl fmt::Display for GatedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gated({})", self.inner)
    }
}

/// The file `location` names in the local store (rooted at `/`).
fn local_path(location: &Path) -> PathBuf {
    PathBuf::from(format!("/{location}"))
}

fn gate_error(e: sluice_sql::Error) -> datafusion::object_store::Error {
    datafusion::object_store::Error::Generic {
        store: "sluice IO scheduling",
        source: Box::new(e),
    }
}

async fn admit(
    gate: &dyn IoGate,
    path: &FsPath,
    bytes: u64,
    write: bool,
) -> datafusion::object_store::Result<Box<dyn Send>> {
    gate.admit(path, bytes, write).await.map_err(gate_error)
}

/// `range` of `file`, chunk by chunk, each admitted before it is read.
fn gated_chunks(
    file: std::fs::File,
    path: PathBuf,
    range: Range<u64>,
    gate: Arc<dyn IoGate>,
) -> BoxStream<'static, datafusion::object_store::Result<Bytes>> {
    let state = (Some(file), range.start);
    futures::stream::try_unfold(state, move |(file, at)| {
        let (gate, path, end) = (gate.clone(), path.clone(), range.end);
        async move {
            let Some(mut file) = file else {
                return Ok(None);
            };
            if at >= end {
                return Ok(None);
            }
            let len = CHUNK.min(end - at);
            let guard = admit(gate.as_ref(), &path, len, false).await?;
            let read_path = path.clone();
            let (file, bytes) = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0; len as usize];
                file.seek(SeekFrom::Start(at))?;
                file.read_exact(&mut buf)?;
                Ok::<_, std::io::Error>((file, Bytes::from(buf)))
            })
            .await
            .map_err(|e| datafusion::object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            })?
            .map_err(|e| datafusion::object_store::Error::Generic {
                store: "LocalFileSystem",
                source: format!("reading {}: {e}", read_path.display()).into(),
            })?;
            drop(guard);
            Ok(Some((bytes, (Some(file), at + len))))
        }
    })
    .boxed()
}

#[async_trait]
impl ObjectStore for GatedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> datafusion::object_store::Result<PutResult> {
        let bytes = payload.content_length() as u64;
        let _guard = admit(self.gate.as_ref(), &local_path(location), bytes, true).await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> datafusion::object_store::Result<Box<dyn MultipartUpload>> {
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(GatedUpload {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            gate: self.gate.clone(),
            path: local_path(location),
            previous: None,
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> datafusion::object_store::Result<GetResult> {
        let head = options.head;
        let result = self.inner.get_opts(location, options).await?;
        if head {
            return Ok(result);
        }
        let GetResult {
            payload,
            meta,
            range,
            attributes,
        } = result;
        let payload = match payload {
            GetResultPayload::File(file, path) => {
                GetResultPayload::Stream(gated_chunks(file, path, range.clone(), self.gate.clone()))
            }
            other => other,
        };
        Ok(GetResult {
            payload,
            meta,
            range,
            attributes,
        })
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> datafusion::object_store::Result<Vec<Bytes>> {
        let path = local_path(location);
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            // One request per chunk of each range, like a streamed read.
            let mut at = range.start;
            let mut parts = Vec::new();
            while at < range.end {
                let len = CHUNK.min(range.end - at);
                let _guard = admit(self.gate.as_ref(), &path, len, false).await?;
                let chunk = at..at + len;
                let read = self
                    .inner
                    .get_ranges(location, std::slice::from_ref(&chunk));
                parts.extend(read.await?);
                at += len;
            }
            out.push(match parts.len() {
                1 => parts.remove(0),
                _ => Bytes::from(parts.concat()),
            });
        }
        Ok(out)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, datafusion::object_store::Result<Path>>,
    ) -> BoxStream<'static, datafusion::object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> BoxStream<'static, datafusion::object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, datafusion::object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&Path>,
    ) -> datafusion::object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> datafusion::object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> datafusion::object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

/// A multipart upload whose parts are admitted before they are written, in the order given.
struct GatedUpload {
    inner: Arc<tokio::sync::Mutex<Box<dyn MultipartUpload>>>,
    gate: Arc<dyn IoGate>,
    path: PathBuf,
    /// Resolves once the previous part has been handed to the store.
    previous: Option<futures::future::Shared<tokio::sync::oneshot::Receiver<()>>>,
}

impl fmt::Debug for GatedUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedUpload")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl MultipartUpload for GatedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let (handed, next) = tokio::sync::oneshot::channel();
        let previous = self.previous.replace(next.shared());
        let (inner, gate, path) = (self.inner.clone(), self.gate.clone(), self.path.clone());
        async move {
            if let Some(previous) = previous {
                // A part whose predecessor failed still goes in order (its error is its own).
                let _ = previous.await;
            }
            let admitted = admit(gate.as_ref(), &path, data.content_length() as u64, true).await;
            let written = match admitted {
                Ok(guard) => Ok((guard, inner.lock().await.put_part(data))),
                Err(e) => Err(e),
            };
            let _ = handed.send(());
            let (_guard, part) = written?;
            part.await
        }
        .boxed()
    }

    async fn complete(&mut self) -> datafusion::object_store::Result<PutResult> {
        if let Some(previous) = self.previous.take() {
            let _ = previous.await;
        }
        self.inner.lock().await.complete().await
    }

    async fn abort(&mut self) -> datafusion::object_store::Result<()> {
        self.inner.lock().await.abort().await
    }
}
