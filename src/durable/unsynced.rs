//! The files of a journaled batch ([`Unsynced`]): written atomically (temp file, rename) but
//! not fsynced, since the batch's fdatasynced journal line already made them durable; and the
//! spare kept beside a state rewritten again and again ([`spare_name`], [`SPARE_REST`]), so a
//! rewrite makes and frees no file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::{
    Dir, INLINE_UNSYNCED, Rewrite, Root, TEMP_PREFIX, Trash, each_concurrently, parent_of,
    to_pretty_json,
};
use crate::error::{Error, Result};

/// Files written atomically (temp file, rename) but not fsynced, all at once: durable only
/// once something syncs the filesystem (the journal's checkpoint). A missing directory is
/// made. Only for files a durable
/// journal entry already describes, so a crash that loses them loses nothing the replay cannot
/// write again.
#[derive(Debug, Default)]
pub struct Unsynced {
    files: Vec<UnsyncedFile>,
}

#[derive(Debug)]
struct UnsyncedFile {
    target: PathBuf,
    bytes: Vec<u8>,
    how: How,
}

/// How an [`Unsynced`] file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// A new file: a temp file renamed into place.
    New,
    /// A file that usually exists already: with a trash, its old file goes there.
    Replace,
    /// A file rewritten again and again (a state): its new content goes over its spare in
    /// place ([`Dir::rewrite_in_place`]) once the spare has rested this long; otherwise as
    /// `Replace`, and the old file is kept as the spare if there is none.
    Rewrite(Duration),
    /// Bytes added at the end of the file (made when missing), in one `write`.
    Append,
}

impl Unsynced {
    pub fn new() -> Self {
        Unsynced::default()
    }

    /// Adds `value` as pretty JSON for a new file `target`; nothing is written before
    /// [`commit`](Self::commit).
    pub fn add_json<T: Serialize>(&mut self, target: &Path, value: &T) {
        self.push(target, to_pretty_json(value), How::New);
    }

    /// Adds `value` as pretty JSON for `target`, which it replaces: with a trash, the old file
    /// goes there, so the replacement frees nothing (see [`Trash`]).
    pub fn replace_json<T: Serialize>(&mut self, target: &Path, value: &T) {
        self.push(target, to_pretty_json(value), How::Replace);
    }

    /// Adds `value` as pretty JSON for `target`, a file rewritten often (a waitpoint's state):
    /// written over its spare, [`spare_name`], if that has been out of use for `rest`, and the
    /// two names swapped, so the rewrite makes and frees no file (see
    /// [`Dir::rewrite_in_place`]; [`SPARE_REST`] is the engine's `rest`).
    pub fn rewrite_json<T: Serialize>(&mut self, target: &Path, value: &T, rest: Duration) {
        self.push(target, to_pretty_json(value), How::Rewrite(rest));
    }

    /// Adds `bytes` to put in place of `target`'s content, as [`replace_json`](Self::replace_json).
    pub fn replace_bytes(&mut self, target: &Path, bytes: Vec<u8>) {
        self.push(target, bytes, How::Replace);
    }

    /// Adds `bytes` to append to `target` (made when missing). An append cut short leaves a
    /// partial last line, which the file's readers must leave out (`store/signal_log.rs`).
    pub fn append(&mut self, target: &Path, bytes: Vec<u8>) {
        self.push(target, bytes, How::Append);
    }

    fn push(&mut self, target: &Path, bytes: Vec<u8>, how: How) {
        self.files.push(UnsyncedFile {
            target: target.to_owned(),
            bytes,
            how,
        });
    }

    /// Writes every file, concurrently: creating a file and renaming it are mostly waiting,
    /// and issued together the waits overlap. The order does not matter, the journal entry
    /// covers every file; the first error is returned, with every temp file of a failed write
    /// removed. Replaced files go to `trash` when there is one.
    ///
    /// Each directory is reached once for the whole commit (made when missing: a legacy
    /// waitpoint without `signals/`, a channel's first wake) and every file in it is made,
    /// written and renamed through that one handle. Reaching the directory from the home's
    /// root for each operation instead was about a third of a signal's system calls.
    pub fn commit(self, root: &Root, trash: Option<&Trash>) -> Result<()> {
        let mut dirs: Vec<Dir> = Vec::new();
        let mut index: std::collections::HashMap<&Path, usize> = Default::default();
        let mut work = Vec::with_capacity(self.files.len());
        for f in &self.files {
            let parent = parent_of(&f.target);
            let d = match index.get(parent) {
                Some(d) => *d,
                None => {
                    dirs.push(Dir::reach(root, parent)?);
                    index.insert(parent, dirs.len() - 1);
                    dirs.len() - 1
                }
            };
            let name = f
                .target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            work.push((d, name, f));
        }
        let write = |(d, name, f): &(usize, String, &UnsyncedFile)| {
            let dir = &dirs[*d];
            if f.how == How::Append {
                return dir.append(root, name, &f.bytes);
            }
            // Where the old file is kept when the new one is a new file: as the spare when
            // there is none, else in the trash.
            let spare = match f.how {
                How::Rewrite(rest) => {
                    let spare = spare_name(name);
                    match dir.rewrite_in_place(root, name, &spare, &f.bytes, rest)? {
                        Rewrite::Done => return Ok(()),
                        Rewrite::NoSpare => Some(spare),
                        Rewrite::SpareBusy => None,
                    }
                }
                _ => None,
            };
            let trash = trash.filter(|_| f.how != How::New);
            dir.write_unsynced(name, &f.bytes, |dir, temp| {
                put_in_place(dir, temp, name, spare.as_deref(), trash)
            })
        };
        // One signal's few files go inline and in order (its wake first): threads would cost
        // more than the waits they overlap, and the wake would not be first.
        if work.len() <= INLINE_UNSYNCED {
            return work.iter().try_for_each(write);
        }
        each_concurrently(&work, write)
    }
}

/// How long a state's spare rests, after the exchange that took it out of use, before it is
/// written over ([`Unsynced::rewrite_json`]): a reader that opened the state just before and
/// takes no lock (`jq`) has long finished. A state rewritten sooner is written as a new file.
pub const SPARE_REST: Duration = Duration::from_secs(1);

/// The name of the spare kept beside `name` for [`Unsynced::rewrite_json`]: hidden, and a temp
/// name to every listing ([`is_temp_name`](super::is_temp_name)), since what it holds is never
/// read.
pub fn spare_name(name: &str) -> String {
    format!("{TEMP_PREFIX}{name}.spare")
}

/// Puts `temp` in place of `name` (both in `dir`) without freeing the old file when there is
/// somewhere to keep it: one atomic exchange of the two names (readers see the old file or the
/// new one), then the old file, now under the temp name, kept as the `spare` if there is none
/// yet, else moved to the `trash`. Freeing a file waits for the device under `discard` (see
/// [`Trash`]). The exchange also skips what a rename over an existing file costs on ext4
/// (`auto_da_alloc` starts writing the new file back at once; the checkpoint's `syncfs` does
/// that later, once for every change in between). Without an old file, a place to keep it, or
/// a filesystem that can exchange, it is a plain rename.
fn put_in_place(
    dir: &Dir,
    temp: &str,
    name: &str,
    spare: Option<&str>,
    trash: Option<&Trash>,
) -> Result<()> {
    crate::failpoint!(
        crate::failpoint::STORE_RENAME,
        "cannot rename",
        &dir.path().join(name)
    );
    if (spare.is_some() || trash.is_some()) && dir.rename_within(temp, name, true).is_ok() {
        // The new file is in place. What is left, the old one under the temp name, is never
        // an error: if it can be neither kept nor moved, the stale-temp walk removes it.
        let kept = spare.is_some_and(|s| dir.keep_as_spare(temp, s).unwrap_or(false));
        if !kept {
            let gone = match trash {
                Some(trash) => trash.take_all_from(dir, &[temp]),
                None => dir.unlink(temp),
            };
            if let Err(e) = gone {
                tracing::warn!(error = %e, "cannot dispose of a replaced file");
            }
        }
        return Ok(());
    }
    dir.rename_within(temp, name, false)
        .map_err(|e| Error::io("cannot rename", dir.path().join(name), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{self, File};
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_rewrite_never_writes_over_a_spare_a_reader_holds() {
        use rustix::fs::{FlockOperation, flock};
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let root = crate::durable::test_root(dir.path());
        let target = dir.path().join("waitpoint.json");
        let spare = dir.path().join(spare_name("waitpoint.json"));
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        root.commit(&target, b"\"first\"\n").unwrap();
        root.create_empty(&spare).unwrap();
        let (first, spare0) = (ino(&target), ino(&spare));
        // A reader opened the state and holds it, as every read does while it reads.
        let reader = File::open(&target).unwrap();
        flock(&reader, FlockOperation::NonBlockingLockShared).unwrap();
        let rewrite = |v: &str| {
            let mut files = Unsynced::new();
            files.rewrite_json(&target, &v, Duration::ZERO);
            files.commit(&root, None).unwrap();
        };
        // Over the spare, which no one holds: the names swap and the held file is the spare.
        rewrite("second");
        assert_eq!((ino(&target), ino(&spare)), (spare0, first));
        // The spare is the file the reader holds: the next state is a new file, and what the
        // reader reads is still whole.
        rewrite("third");
        let third = ino(&target);
        assert!(third != first && third != spare0);
        assert_eq!(ino(&spare), first, "the held spare stays the spare");
        let mut held = vec![0; 64];
        let n = reader.read_at(&mut held, 0).unwrap();
        assert_eq!(
            &held[..n],
            b"\"first\"\n",
            "the reader's file was not written over"
        );
        assert_eq!(root.read_json::<String>(&target).unwrap().unwrap(), "third");
        // Once the reader is done, the spare is used again.
        drop(reader);
        rewrite("fourth");
        assert_eq!((ino(&target), ino(&spare)), (first, third));
        assert_eq!(
            root.read_json::<String>(&target).unwrap().unwrap(),
            "fourth"
        );
    }

    #[test]
    fn unsynced_files_make_a_missing_directory_and_leave_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::durable::test_root(dir.path());
        let target = dir.path().join("new/sub/w.json");
        let mut files = Unsynced::new();
        files.add_json(&target, &serde_json::json!({"n": 1}));
        files.commit(&root, None).unwrap();
        let back: serde_json::Value = root.read_json(&target).unwrap().unwrap();
        assert_eq!(back["n"], 1);
        assert_eq!(root.list_dir(target.parent().unwrap()).unwrap().len(), 1);
    }
}
