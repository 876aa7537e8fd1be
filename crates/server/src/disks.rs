//! Disk IO scheduling (reference §4.9): the disks the config names and which of them holds a
//! file; the gate a statement's file reads and writes wait at is [`crate::disk_gate`]'s.
//!
//! A file is on disk `d` when its path is under `d`'s directory (both canonical, so a symlink
//! or `..` does not leave a disk). A read of a file on `d` is a request to every resource
//! covering `READ DISK d` or `READ ANY DISK` (a write: `WRITE …`), in name order, in the
//! statement's current workload (a moved or demoted statement reads in its new one); its cost
//! is its bytes, and it is held while the bytes move. Files on no disk are not scheduled.

use std::path::{Path, PathBuf};

use sluice_sql::{DiskRef, ResourceOperation};

/// The configured disks, directories made canonical once (a disk that cannot be resolved keeps
/// its path as written).
#[derive(Debug, Default, Clone)]
pub struct Disks(Vec<(String, PathBuf)>);

impl Disks {
    pub fn new(disks: &std::collections::BTreeMap<String, PathBuf>) -> Disks {
        Disks(
            disks
                .iter()
                .map(|(name, path)| {
                    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                    (name.clone(), path)
                })
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The disk file `path` is on: the one with the longest directory that holds it.
    pub fn disk_of(&self, path: &Path) -> Option<&str> {
        let path = canonical(path);
        self.0
            .iter()
            .filter(|(_, dir)| path.starts_with(dir))
            .max_by_key(|(_, dir)| dir.as_os_str().len())
            .map(|(name, _)| name.as_str())
    }
}

/// `path` made canonical; for a file not written yet, its directory made canonical.
fn canonical(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => canonical(dir).join(name),
        _ => path.to_path_buf(),
    }
}

/// Whether operation `op` of a resource covers a read (or `write`) on disk `disk`.
pub(crate) fn covers(op: &ResourceOperation, disk: &str, write: bool) -> bool {
    let on = |d: &DiskRef| match d {
        DiskRef::Any => true,
        DiskRef::Named(n) => n == disk,
    };
    match op {
        ResourceOperation::Read(d) => !write && on(d),
        ResourceOperation::Write(d) => write && on(d),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_on_the_disk_whose_directory_holds_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let data = root.path().join("data");
        let nested = data.join("cold");
        std::fs::create_dir_all(&nested).expect("dirs");
        let disks = Disks::new(
            &[
                ("data".to_string(), data.clone()),
                ("cold".to_string(), nested.clone()),
            ]
            .into_iter()
            .collect(),
        );
        assert_eq!(disks.disk_of(&data.join("a.csv")), Some("data"));
        assert_eq!(disks.disk_of(&nested.join("b.csv")), Some("cold"));
        assert_eq!(disks.disk_of(&nested.join("../c.csv")), Some("data"));
        assert_eq!(disks.disk_of(&data.join("../elsewhere.csv")), None);
        assert_eq!(disks.disk_of(Path::new("/etc/hosts")), None);
        assert!(covers(
            &ResourceOperation::Read(DiskRef::Any),
            "data",
            false
        ));
        assert!(!covers(
            &ResourceOperation::Read(DiskRef::Any),
            "data",
            true
        ));
        assert!(covers(
            &ResourceOperation::Write(DiskRef::Named("data".into())),
            "data",
            true
        ));
        assert!(!covers(
            &ResourceOperation::Read(DiskRef::Named("cold".into())),
            "data",
            false
        ));
    }
}
