//! Persistence of the catalog, as ClickHouse's `workload_path`: one file per entity,
//! `workload_<name>.sql` or `resource_<name>.sql` (and sluice's `classifier_<name>.sql`), in
//! `<data-dir>/workloads/`.
//!
//! Every write goes to `<file>.tmp`, is fsynced, renamed over the file, and the directory is
//! fsynced; a removal unlinks and fsyncs the directory. A crash at any instant therefore leaves
//! each entity's file with either its old or its new definition (a leftover `.tmp` is deleted at
//! the next load). Since every statement changes at most one entity, the data dir always holds
//! the state after some prefix of the applied statements.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use sluice_sql::{parse_script, EntityKind, Error, ErrorCode, Result, Statement};

use crate::catalog::{Catalog, Change, Entity};

/// Makes any name a safe file name, as ClickHouse's `escapeForFileName`: ASCII letters, digits
/// and `_` stay, every other byte becomes `%XX`.
pub fn escape_file_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn file_name(kind: EntityKind, name: &str) -> String {
    let prefix = match kind {
        EntityKind::Workload => "workload",
        EntityKind::Resource => "resource",
        EntityKind::Classifier => "classifier",
    };
    format!("{prefix}_{}.sql", escape_file_name(name))
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorCode::InternalError,
        format!("cannot {what} {}: {e}", path.display()),
    )
}

/// The entity files of one data dir.
#[derive(Debug, Clone)]
pub struct DiskStorage {
    dir: PathBuf,
    /// A read-only storage never changes the directory: no creation, no clean-up, no writes.
    writable: bool,
}

impl DiskStorage {
    /// Opens (creating if needed) `<data_dir>/workloads` for reading and writing.
    pub fn open(data_dir: &Path) -> Result<Self> {
        let dir = data_dir.join("workloads");
        fs::create_dir_all(&dir).map_err(|e| io_error("create directory", &dir, e))?;
        Ok(DiskStorage {
            dir,
            writable: true,
        })
    }

    /// Opens an existing data dir without changing anything in it (`sluice check --data-dir`).
    /// A data dir without a `workloads` directory holds an empty catalog.
    pub fn open_read_only(data_dir: &Path) -> Result<Self> {
        if !data_dir.is_dir() {
            return Err(Error::new(
                ErrorCode::InternalError,
                format!("data dir {} does not exist", data_dir.display()),
            ));
        }
        Ok(DiskStorage {
            dir: data_dir.join("workloads"),
            writable: false,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Loads every stored entity on top of `base` (the configuration layer, or an empty
    /// catalog): resources first, then workloads parents-first. A file that does not parse or
    /// validate stops the load with an error naming it.
    pub fn load(&self, base: Catalog) -> Result<Catalog> {
        if !self.writable && !self.dir.exists() {
            return Ok(base);
        }
        let entries =
            fs::read_dir(&self.dir).map_err(|e| io_error("read directory", &self.dir, e))?;
        let mut files: Vec<PathBuf> = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(|e| io_error("read directory", &self.dir, e))?
                .path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.ends_with(".tmp") {
                // An interrupted write: the rename never happened, so the old file (if any) holds.
                if self.writable {
                    fs::remove_file(&path).map_err(|e| io_error("remove", &path, e))?;
                }
            } else if name.ends_with(".sql") {
                files.push(path);
            }
        }
        files.sort();
        let mut items = Vec::new();
        for path in files {
            let text = fs::read_to_string(&path).map_err(|e| io_error("read", &path, e))?;
            let in_file = |e: Error| Error {
                message: format!("cannot load {}: {}", path.display(), e),
                ..e
            };
            let mut parsed = parse_script(&text);
            if parsed.len() != 1 {
                return Err(in_file(Error::new(
                    ErrorCode::InternalError,
                    format!("expected one CREATE statement, found {}", parsed.len()),
                )));
            }
            let stmt = parsed.remove(0).result.map_err(in_file)?;
            let (kind, name) = match &stmt {
                Statement::CreateWorkload(w) => (EntityKind::Workload, w.name.clone()),
                Statement::CreateResource(r) => (EntityKind::Resource, r.name.clone()),
                Statement::CreateClassifier(c) => (EntityKind::Classifier, c.name.clone()),
                Statement::Drop(_) => (EntityKind::Workload, String::new()),
            };
            let expected = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.is_empty() || file_name(kind, &name) != expected {
                return Err(in_file(Error::new(
                    ErrorCode::InternalError,
                    "the file's statement does not define the entity its name says",
                )));
            }
            items.push((path.display().to_string(), stmt));
        }
        load_statements(base, items).map_err(|e| Error {
            message: e
                .message
                .replace(LOADED_WHOLE, &self.dir.display().to_string()),
            ..e
        })
    }

    /// Makes a change durable. Call it after [`Catalog::apply`] accepted the change and before
    /// publishing the new snapshot.
    pub fn persist(&self, change: &Change) -> Result<()> {
        if !self.writable {
            return Err(Error::new(
                ErrorCode::InternalError,
                format!("{} is opened read-only", self.dir.display()),
            ));
        }
        match change {
            Change::Upsert(entity) => {
                let path = self.dir.join(file_name(entity.kind(), entity.name()));
                let text = format!("{}\n", entity.create_query());
                self.write_atomically(&path, text.as_bytes())
            }
            Change::Remove { kind, name } => {
                let path = self.dir.join(file_name(*kind, name));
                match fs::remove_file(&path) {
                    Ok(()) => self.sync_dir(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(io_error("remove", &path, e)),
                }
            }
        }
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        write_atomically(path, bytes)
    }

    fn sync_dir(&self) -> Result<()> {
        sync_dir(&self.dir)
    }
}

/// Replaces `path` with `bytes` so that a crash at any instant leaves the old file or the new
/// one, never a mix: written to `<path>.tmp`, fsynced, renamed over `path`, directory fsynced.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = File::create(&tmp).map_err(|e| io_error("create", &tmp, e))?;
    file.write_all(bytes)
        .map_err(|e| io_error("write", &tmp, e))?;
    file.sync_all().map_err(|e| io_error("fsync", &tmp, e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| io_error("rename into", path, e))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("fsync directory", dir, e))
}

/// Builds the read-only configuration layer from `;`-separated statements (the config file's
/// `catalog.statements`). ClickHouse's config also accepts `WORKLOAD …` / `RESOURCE …` without
/// `CREATE`; so does sluice.
pub fn config_layer(statements: &str) -> Result<Catalog> {
    let mut catalog = Catalog::new();
    for item in parse_script(&with_create_keywords(statements)) {
        let stmt = item.result.map_err(|e| Error {
            message: format!("catalog.statements: {}: {}", item.text, e.message),
            ..e
        })?;
        if let Statement::Drop(_) = stmt {
            return Err(Error::bad_arguments(format!(
                "catalog.statements: only CREATE statements are allowed, got: {}",
                item.text
            )));
        }
        catalog.apply_config(&stmt).map_err(|e| Error {
            message: format!("catalog.statements: {}: {}", item.text, e.message),
            ..e
        })?;
    }
    Ok(catalog)
}

/// Prefixes `CREATE` to statements that start with `WORKLOAD`, `RESOURCE` or `CLASSIFIER`.
fn with_create_keywords(text: &str) -> String {
    text.split_inclusive(';')
        .map(|part| {
            let trimmed = part.trim_start();
            let head: String = trimmed
                .chars()
                .take(10)
                .collect::<String>()
                .to_ascii_uppercase();
            if ["WORKLOAD", "RESOURCE", "CLASSIFIER"]
                .iter()
                .any(|k| head.starts_with(k))
            {
                format!("{}CREATE {trimmed}", &part[..part.len() - trimmed.len()])
            } else {
                part.to_string()
            }
        })
        .collect()
}

impl Entity {
    /// The file this entity is stored in, relative to the storage directory.
    pub fn file_name(&self) -> String {
        file_name(self.kind(), self.name())
    }
}

/// Where an error of the whole loaded catalog (the lane rules) says it comes from.
const LOADED_WHOLE: &str = "the stored catalog";

/// A catalog built from `base` and the statements of stored entities, given in any order
/// (each with where it came from, for errors): resources first, then workloads parents
/// before children, then classifiers, then the lane rules over the whole. The data dir and
/// the fleet's catalog in etcd load through it.
pub fn load_statements(base: Catalog, items: Vec<(String, Statement)>) -> Result<Catalog> {
    let mut resources = Vec::new();
    let mut workloads = Vec::new();
    let mut classifiers = Vec::new();
    for (source, stmt) in items {
        match &stmt {
            Statement::CreateResource(_) => resources.push((source, stmt)),
            Statement::CreateClassifier(_) => classifiers.push((source, stmt)),
            _ => workloads.push((source, stmt)),
        }
    }
    let mut catalog = base;
    let apply = |catalog: &mut Catalog, source: &str, stmt: &Statement| {
        catalog.apply_loading(stmt).map(|_| ()).map_err(|e| Error {
            message: format!("cannot load {source}: {e}"),
            ..e
        })
    };
    for (source, stmt) in &resources {
        apply(&mut catalog, source, stmt)?;
    }
    // Parents before children: repeatedly apply what has its parent in place.
    let mut pending = workloads;
    while !pending.is_empty() {
        let before = pending.len();
        let mut rest = Vec::new();
        for (source, stmt) in pending {
            let ready = match &stmt {
                Statement::CreateWorkload(w) => {
                    w.parent.as_deref().is_none_or(|p| catalog.get(p).is_some())
                }
                _ => true,
            };
            if ready {
                apply(&mut catalog, &source, &stmt)?;
            } else {
                rest.push((source, stmt));
            }
        }
        if rest.len() == before {
            let (source, stmt) = &rest[0];
            // Applying it reports the missing parent (or the cycle) in ClickHouse's words.
            apply(&mut catalog, source, stmt)?;
            return Err(Error::new(
                ErrorCode::InternalError,
                format!("cannot load {source}: its parent is never defined"),
            ));
        }
        pending = rest;
    }
    // Classifiers last: each names a workload loaded above.
    for (source, stmt) in &classifiers {
        apply(&mut catalog, source, stmt)?;
    }
    catalog.check_lanes().map_err(|e| Error {
        message: format!("cannot load {LOADED_WHOLE}: {e}"),
        ..e
    })?;
    Ok(catalog)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sql::parse_statement;

    fn apply_and_persist(storage: &DiskStorage, c: Catalog, sql: &str) -> Catalog {
        let stmt = parse_statement(sql).expect("parses");
        let (next, change) = c.apply(&stmt).expect("applies");
        if let Some(change) = change {
            storage.persist(&change).expect("persists");
        }
        next
    }

    #[test]
    fn escapes_names_like_clickhouse() {
        assert_eq!(escape_file_name("all"), "all");
        assert_eq!(escape_file_name("a b/.."), "a%20b%2F%2E%2E");
    }

    #[test]
    fn round_trips_through_disk_in_dependency_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = DiskStorage::open(dir.path()).expect("open");
        let mut c = Catalog::new();
        for sql in [
            "CREATE RESOURCE io (READ DISK d)",
            "CREATE WORKLOAD zz_root SETTINGS max_io_requests = 1 FOR io",
            "CREATE WORKLOAD b IN zz_root",
            "CREATE WORKLOAD a IN b",
            "CREATE WORKLOAD `we/ird name` IN a",
            "DROP WORKLOAD `we/ird name`",
            "CREATE OR REPLACE WORKLOAD a IN zz_root SETTINGS weight = 2",
            // Classifiers load after the workloads they name (file order would put them first).
            "CREATE CLASSIFIER a_rule WORKLOAD a WHEN user = 'x' RANK 3",
            "CREATE CLASSIFIER `b/rule` WORKLOAD a WHEN tag('k') = 'v'",
            "CREATE OR REPLACE CLASSIFIER a_rule WORKLOAD a WHEN user = 'y'",
            "DROP CLASSIFIER `b/rule`",
        ] {
            c = apply_and_persist(&storage, c, sql);
        }
        fs::write(storage.dir().join("workload_x.sql.tmp"), "garbage").expect("write");
        let loaded = storage.load(Catalog::new()).expect("loads");
        let dump = |c: &Catalog| {
            c.entities()
                .chain(c.classifiers())
                .map(|s| s.entity.create_query())
                .collect::<Vec<_>>()
        };
        assert!(dump(&loaded)
            .contains(&"CREATE CLASSIFIER a_rule WORKLOAD a WHEN user = 'y'".to_string()));
        assert_eq!(loaded.rules().iter().count(), 1);
        assert_eq!(dump(&loaded), dump(&c));
        assert!(!storage.dir().join("workload_x.sql.tmp").exists());
    }

    #[test]
    fn read_only_storage_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = DiskStorage::open_read_only(&dir.path().join("nope"));
        assert!(missing.is_err());
        let empty = DiskStorage::open_read_only(dir.path()).expect("open");
        assert_eq!(
            empty
                .load(Catalog::new())
                .expect("loads")
                .entities()
                .count(),
            0
        );
        assert!(!dir.path().join("workloads").exists(), "nothing is created");
        let storage = DiskStorage::open(dir.path()).expect("open");
        apply_and_persist(&storage, Catalog::new(), "CREATE WORKLOAD all");
        let tmp = storage.dir().join("workload_x.sql.tmp");
        fs::write(&tmp, "half a write").expect("write");
        let ro = DiskStorage::open_read_only(dir.path()).expect("open");
        assert_eq!(
            ro.load(Catalog::new()).expect("loads").entities().count(),
            1
        );
        assert!(
            tmp.exists(),
            "a read-only load leaves even stale files alone"
        );
        let (_, change) = Catalog::new()
            .apply(&parse_statement("CREATE WORKLOAD b").expect("parses"))
            .expect("applies");
        assert!(ro.persist(&change.expect("a change")).is_err());
    }

    #[test]
    fn a_bad_file_names_itself() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = DiskStorage::open(dir.path()).expect("open");
        fs::write(
            storage.dir().join("workload_w.sql"),
            "CREATE WORKLOAD w IN nowhere\n",
        )
        .expect("write");
        let e = storage.load(Catalog::new()).expect_err("must fail");
        assert!(e.message.contains("workload_w.sql"), "{e}");
        fs::write(storage.dir().join("workload_w.sql"), "CREATE WORKLOAD v\n").expect("write");
        let e = storage.load(Catalog::new()).expect_err("must fail");
        assert!(e.message.contains("does not define"), "{e}");
    }

    #[test]
    fn config_layer_is_read_only() {
        let base = config_layer("RESOURCE q (QUERY); WORKLOAD all; CREATE WORKLOAD prod IN all")
            .expect("config");
        let run = |sql: &str| {
            base.apply(&parse_statement(sql).expect("parses"))
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(run("CREATE WORKLOAD dev IN prod").is_ok());
        assert!(run("CREATE WORKLOAD all").is_err_and(|e| e.contains("already exists")));
        assert!(
            run("DROP WORKLOAD prod").is_err_and(|e| e.contains("read-only configuration storage"))
        );
        assert!(
            run("CREATE OR REPLACE WORKLOAD prod IN all").is_err_and(|e| e.contains("read-only"))
        );
        // Classifiers in the configuration are read-only too.
        let base = config_layer(
            "RESOURCE q (QUERY); WORKLOAD all; WORKLOAD prod IN all; CLASSIFIER apps WORKLOAD prod WHEN user = 'app'",
        )
        .expect("config");
        assert_eq!(base.rules().iter().count(), 1);
        let run = |sql: &str| {
            base.apply(&parse_statement(sql).expect("parses"))
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(run("DROP CLASSIFIER apps")
            .is_err_and(|e| e.contains("read-only configuration storage")));
        assert!(
            run("CREATE OR REPLACE CLASSIFIER apps WORKLOAD prod WHEN user = 'x'")
                .is_err_and(|e| e.contains("read-only"))
        );
        assert!(run("CREATE CLASSIFIER IF NOT EXISTS apps WORKLOAD prod WHEN user = 'x'").is_ok());
    }
}
