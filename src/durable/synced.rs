//! The synced commit: a file written on its own goes through [`Root::commit`] (or a group of them
//! through [`Batch`]): write a temp file beside the target, fsync it, rename it over the
//! target, fsync the directory. A reader therefore sees either the old file or the new one,
//! never a torn one, and once `commit` returns the new file survives a power cut. Any error
//! aborts the commit (the temp file is removed) and is returned, so callers never report
//! success for a write that did not reach the disk and keep their source.
//!
//! A batch of signals is the exception: its fdatasynced journal line is the commit, and its
//! files are written after it without their own fsync (`unsynced.rs`, `store/files.rs`).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::beneath::{Place, Root};
use super::path::{create_new_in, fsync_dir_in, rename_in, unlink_in};
use super::temp::temp_path_for;
use super::{distinct_parents, each_concurrently, parent_of, to_pretty_json};
use crate::error::{Error, Result};

/// Writes `bytes` to `target` in `place` atomically and durably (see the module docs).
pub(super) fn commit_in(place: Place<'_>, target: &Path, bytes: &[u8]) -> Result<()> {
    let temp = temp_path_for(target);
    let result = write_synced_in(place, &temp, bytes)
        .and_then(|()| rename_into_place(place, &temp, target))
        .and_then(|()| {
            crate::failpoint!(
                crate::failpoint::STORE_DIR_FSYNC,
                "cannot fsync directory",
                parent_of(target)
            );
            fsync_dir_in(place, parent_of(target))
        });
    if result.is_err() {
        // The commit is void; do not leave half-made files behind. The rename may already have
        // happened (then the directory fsync failed), in which case the temp name is gone.
        let _ = unlink_in(place, &temp);
    }
    result
}

/// Creates `path` in `place` (it must not exist) with `bytes`, fsynced; the caller makes its
/// name durable.
fn write_synced_in(place: Place<'_>, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = create_new_in(place, path).map_err(|e| Error::io("cannot create", path, e))?;
    crate::failpoint!(crate::failpoint::STORE_WRITE, "cannot write", path);
    file.write_all(bytes)
        .map_err(|e| Error::io("cannot write", path, e))?;
    crate::failpoint!(crate::failpoint::STORE_FSYNC, "cannot fsync", path);
    file.sync_all()
        .map_err(|e| Error::io("cannot fsync", path, e))
}

fn rename_into_place(place: Place<'_>, temp: &Path, target: &Path) -> Result<()> {
    crate::failpoint!(crate::failpoint::STORE_RENAME, "cannot rename", target);
    let flags = rustix::fs::RenameFlags::empty();
    rename_in((place, temp), (place, target), flags)
        .map_err(|e| Error::io("cannot rename", target, e))
}

/// Files written together and made durable together (group commit).
///
/// [`stage`](Batch::stage) writes each file's temp file; [`commit`](Batch::commit) fsyncs every
/// temp file, renames each over its target, then fsyncs each distinct directory once. Every file
/// is still fsynced before its rename and every rename is durable before `commit` returns, as
/// with [`Root::commit`]; what is shared is the waiting: the fsyncs of a phase are issued
/// concurrently (the device merges their cache flushes) and a directory holding many of the
/// batch's files is fsynced once. A failure anywhere voids the whole batch: temp files not yet
/// renamed are removed and the error is returned, so callers keep every source.
#[derive(Debug)]
pub struct Batch<'r> {
    /// The home every staged file lies beneath.
    root: &'r Root,
    staged: Vec<Staged>,
}

#[derive(Debug)]
struct Staged {
    temp: PathBuf,
    target: PathBuf,
    file: Option<File>,
}

impl<'r> Batch<'r> {
    /// An empty batch of files beneath `root`.
    pub fn new(root: &'r Root) -> Self {
        Batch {
            root,
            staged: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.staged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }

    /// Writes `bytes` to a temp file beside `target` (not yet synced or renamed).
    pub fn stage(&mut self, target: &Path, bytes: &[u8]) -> Result<()> {
        let temp = temp_path_for(target);
        let place = Place::Beneath(self.root);
        let mut file =
            create_new_in(place, &temp).map_err(|e| Error::io("cannot create", &temp, e))?;
        // Registered before writing, so a failed write still has its temp file removed.
        self.staged.push(Staged {
            temp: temp.clone(),
            target: target.to_owned(),
            file: None,
        });
        crate::failpoint!(crate::failpoint::STORE_WRITE, "cannot write", &temp);
        file.write_all(bytes)
            .map_err(|e| Error::io("cannot write", &temp, e))?;
        self.staged.last_mut().expect("just pushed").file = Some(file);
        Ok(())
    }

    /// Stages `value` as pretty JSON.
    pub fn stage_json<T: Serialize>(&mut self, target: &Path, value: &T) -> Result<()> {
        self.stage(target, &to_pretty_json(value))
    }

    /// Makes every staged file durable under its target name (see the type's docs).
    pub fn commit(mut self) -> Result<()> {
        let files: Vec<(&File, &Path)> = self
            .staged
            .iter()
            .filter_map(|s| s.file.as_ref().map(|f| (f, s.temp.as_path())))
            .collect();
        each_concurrently(&files, |(f, path)| {
            crate::failpoint!(crate::failpoint::STORE_FSYNC, "cannot fsync", path);
            f.sync_all().map_err(|e| Error::io("cannot fsync", path, e))
        })?;
        self.rename_all()?;
        let dirs = distinct_parents(self.staged.iter().map(|s| s.target.as_path()));
        each_concurrently(&dirs, |d| {
            crate::failpoint!(
                crate::failpoint::STORE_DIR_FSYNC,
                "cannot fsync directory",
                d
            );
            self.root.fsync_dir(d)
        })
    }
}

impl Batch<'_> {
    fn rename_all(&mut self) -> Result<()> {
        for s in &mut self.staged {
            s.file = None;
            rename_into_place(Place::Beneath(self.root), &s.temp, &s.target)?;
            // Renamed: nothing left to clean up for this one.
            s.temp = PathBuf::new();
        }
        Ok(())
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        for s in &self.staged {
            if !s.temp.as_os_str().is_empty() {
                let _ = self.root.unlink(&s.temp);
            }
        }
    }
}

/// The synced commits of a file beneath the home, reached from its root.
impl Root {
    /// Writes `bytes` to `target` atomically and durably (see the module docs).
    pub fn commit(&self, target: &Path, bytes: &[u8]) -> Result<()> {
        commit_in(Place::Beneath(self), target, bytes)
    }

    /// Commits `value` as pretty JSON to `target`.
    pub fn commit_json<T: Serialize>(&self, target: &Path, value: &T) -> Result<()> {
        self.commit(target, &to_pretty_json(value))
    }

    /// Like [`Root::commit`], with the content written by `fill` (for content too large to
    /// hold).
    pub fn commit_from(
        &self,
        target: &Path,
        fill: impl FnOnce(&mut File) -> io::Result<()>,
    ) -> Result<()> {
        let place = Place::Beneath(self);
        let temp = temp_path_for(target);
        let result = create_new_in(place, &temp)
            .map_err(|e| Error::io("cannot create", &temp, e))
            .and_then(|mut file| {
                fill(&mut file).map_err(|e| Error::io("cannot write", &temp, e))?;
                file.sync_all()
                    .map_err(|e| Error::io("cannot fsync", &temp, e))
            })
            .and_then(|()| rename_into_place(place, &temp, target))
            .and_then(|()| fsync_dir_in(place, parent_of(target)));
        if result.is_err() {
            let _ = unlink_in(place, &temp);
        }
        result
    }

    /// Creates `path` (which must not exist) with `bytes`, fsynced; the caller makes its name
    /// durable.
    pub fn write_synced(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        write_synced_in(Place::Beneath(self), path, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::{FILE_MODE, is_temp_name};
    use crate::error::Error;
    use std::fs;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn commit_replaces_atomically_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::durable::test_root(dir.path());
        let target = dir.path().join("x.json");
        root.commit(&target, b"one").unwrap();
        root.commit(&target, b"two").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "only the target remains");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o777, FILE_MODE);
    }

    #[test]
    fn batch_commits_every_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::durable::test_root(dir.path());
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        root.create_dir_private(&a).unwrap();
        root.create_dir_private(&b).unwrap();
        root.commit(&a.join("0.json"), b"old").unwrap();
        let mut batch = Batch::new(&root);
        for i in 0..20 {
            let d = if i % 2 == 0 { &a } else { &b };
            batch
                .stage(&d.join(format!("{i}.json")), format!("{i}").as_bytes())
                .unwrap();
        }
        assert_eq!(batch.len(), 20);
        batch.commit().unwrap();
        for i in 0..20 {
            let d = if i % 2 == 0 { &a } else { &b };
            assert_eq!(
                fs::read(d.join(format!("{i}.json"))).unwrap(),
                format!("{i}").as_bytes()
            );
        }
        for d in [&a, &b] {
            let names = root.list_dir(d).unwrap();
            assert_eq!(names.len(), 10, "only targets remain in {}", d.display());
            assert!(names.iter().all(|(n, _)| !is_temp_name(n)));
        }
    }

    #[test]
    fn a_failed_batch_renames_nothing_and_removes_its_temps() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::durable::test_root(dir.path());
        let ok = dir.path().join("ok");
        root.create_dir_private(&ok).unwrap();
        let mut batch = Batch::new(&root);
        batch.stage(&ok.join("1.json"), b"1").unwrap();
        // Staging into a missing directory fails; the batch is dropped without a commit.
        assert!(batch.stage(&dir.path().join("gone/2.json"), b"2").is_err());
        drop(batch);
        assert!(root.list_dir(&ok).unwrap().is_empty(), "no temp, no target");
    }

    #[test]
    fn commit_into_missing_directory_fails_and_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::durable::test_root(dir.path());
        let err = root
            .commit(&dir.path().join("nope/x.json"), b"x")
            .unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
    }
}
