//! Atomic, durable commits of files under the home; around them, in submodules, the locks that
//! serialise writers (`lock.rs`), reading records safely (`read.rs`), the trash (`trash.rs`) and
//! directories reached without following links (`dir.rs`).
//!
//! A file written on its own goes through [`commit`]: write a temp file beside the target,
//! fsync it, rename it over the target, fsync the directory. A reader therefore sees either the
//! old file or the new one, never a torn one, and once `commit` returns the new file survives a
//! power cut. A batch's files are the exception: its fdatasynced journal line is the commit, and
//! they are written after it, atomically but without their own fsync (`store/files.rs`). Any error aborts the commit (the temp file is removed) and is returned, so callers
//! never report success for a write that did not reach the disk and keep their source.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng;
use serde::Serialize;

use crate::clock::Timestamp;
use crate::error::{Error, Result};

mod beneath;
mod dir;
mod lock;
mod read;
mod trash;

pub use beneath::{confine, set_aside as set_aside_in_home};
pub use dir::{Dir, Entry, Rewrite};
pub use lock::{FileLock, LockHolder};
pub use read::{
    MAX_RECORD_BYTES, NOT_REGULAR, read_capped, read_json, read_json_or_set_aside,
    read_record_bytes, read_tail, set_aside,
};
pub use trash::{Reaper, Trash};

/// Mode of every directory the engine creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file the engine creates.
pub const FILE_MODE: u32 = 0o600;
/// Prefix that marks temp files; every reader skips names starting with it.
pub const TEMP_PREFIX: char = '.';
/// Suffix of temp files, so `ls -a` and the stale-temp sweep recognise them.
pub const TEMP_SUFFIX: &str = ".tmp";

/// `mkdir -p` with mode 0700 for every directory it creates; beneath a home, no link is
/// followed on the way (see `beneath.rs`).
pub fn create_dir_private(path: &Path) -> Result<()> {
    beneath::open_dir(path, true).map(drop)
}

/// `mkdir -p` of a path outside every home, as given.
fn mkdir_all_plain(path: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
        .map_err(|e| Error::io("cannot create directory", path, e))
}

/// fsync a directory so a rename or unlink inside it is durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    let fd = beneath::open_dir(dir, false)?
        .ok_or_else(|| Error::io("cannot fsync directory", dir, not_found()))?;
    rustix::fs::fsync(&fd).map_err(|e| Error::io("cannot fsync directory", dir, e.into()))
}

fn not_found() -> io::Error {
    io::Error::from(io::ErrorKind::NotFound)
}

/// `path`'s directory, reached as `beneath.rs` says, and its last component there.
fn parent_at(path: &Path) -> io::Result<(beneath::At, std::ffi::OsString)> {
    beneath::parent(path, false)
        .map_err(io::Error::other)?
        .ok_or_else(not_found)
}

/// Opens `path` with `flags` (never following a link as its last component), its directory
/// reached as `beneath.rs` says.
fn open_at(path: &Path, flags: rustix::fs::OFlags, mode: u32) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let (at, name) = parent_at(path)?;
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(File::from(rustix::fs::openat(
        &at,
        name.as_os_str(),
        flags,
        Mode::from_raw_mode(mode),
    )?))
}

/// Creates `path` (which must not exist) for writing, mode 0600.
fn create_new(path: &Path) -> io::Result<File> {
    use rustix::fs::OFlags;
    open_at(
        path,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        FILE_MODE,
    )
}

/// Makes the empty file `path` (mode 0600; it must not exist), without fsync.
pub fn create_empty(path: &Path) -> Result<()> {
    create_new(path)
        .map(drop)
        .map_err(|e| Error::io("cannot create", path, e))
}

/// Opens `path` for reading: a link as the last component is refused (`ELOOP`), a FIFO does
/// not block the open.
pub fn open_read(path: &Path) -> io::Result<File> {
    use rustix::fs::OFlags;
    if let Some(opened) = beneath::open_read_fast(path) {
        return opened.map(File::from);
    }
    open_at(path, OFlags::RDONLY | OFlags::NONBLOCK, 0)
}

/// Opens (creating when missing) `path` for reading and writing, mode 0600 (a lock file).
pub fn open_or_create(path: &Path) -> io::Result<File> {
    use rustix::fs::OFlags;
    open_at(path, OFlags::RDWR | OFlags::CREATE, FILE_MODE)
}

/// Removes the file `path` (not durably), reached as [`open_read`] reaches it.
pub fn unlink(path: &Path) -> io::Result<()> {
    let (at, name) = parent_at(path)?;
    Ok(rustix::fs::unlinkat(
        &at,
        name.as_os_str(),
        rustix::fs::AtFlags::empty(),
    )?)
}

/// Renames `from` to `to` (not durably), both reached as [`open_read`] reaches them.
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    rename_with(from, to, rustix::fs::RenameFlags::empty())
}

/// Swaps the names `a` and `b` atomically (`renameat2(2)` with `RENAME_EXCHANGE`), both
/// reached as [`open_read`] reaches them; both must exist.
pub fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    rename_with(a, b, rustix::fs::RenameFlags::EXCHANGE)
}

fn rename_with(from: &Path, to: &Path, flags: rustix::fs::RenameFlags) -> io::Result<()> {
    let (from_at, from_name) = parent_at(from)?;
    let (to_at, to_name) = parent_at(to)?;
    Ok(rustix::fs::renameat_with(
        &from_at,
        from_name.as_os_str(),
        &to_at,
        to_name.as_os_str(),
        flags,
    )?)
}

/// Removes the directory `path` and everything in it, every step through a handle of the
/// directory above (no link is followed, at any depth: a link inside is removed as a link).
/// A missing directory is not an error; nothing is made durable.
pub fn remove_tree(path: &Path) -> Result<()> {
    let Some((at, name)) = beneath::parent(path, false)? else {
        return Ok(());
    };
    match remove_tree_at(at.as_fd(), &name, path) {
        Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn remove_tree_at(
    parent: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    path: &Path,
) -> Result<()> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = rustix::fs::openat(parent, name, flags, Mode::empty())
        .map_err(|e| Error::io("cannot remove", path, e.into()))?;
    for child in dir::names_of(&dir, path)? {
        let child_path = path.join(&child);
        let st = match rustix::fs::statat(&dir, &child, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(Error::io("cannot inspect", &child_path, e.into())),
        };
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            remove_tree_at(dir.as_fd(), &child, &child_path)?;
        } else {
            match rustix::fs::unlinkat(&dir, &child, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(Error::io("cannot remove", &child_path, e.into())),
            }
        }
    }
    drop(dir);
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
        .map_err(|e| Error::io("cannot remove", path, e.into()))
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A fresh temp path beside `target`: `.<name>.<random>.tmp`.
fn temp_path_for(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tag: u64 = rand::rng().next_u64();
    parent_of(target).join(format!("{TEMP_PREFIX}{name}.{tag:016x}{TEMP_SUFFIX}"))
}

/// Writes `bytes` to `target` atomically and durably (see the module docs).
pub fn commit(target: &Path, bytes: &[u8]) -> Result<()> {
    let temp = temp_path_for(target);
    let result = write_synced(&temp, bytes)
        .and_then(|()| rename_into_place(&temp, target))
        .and_then(|()| {
            crate::failpoint!(
                crate::failpoint::STORE_DIR_FSYNC,
                "cannot fsync directory",
                parent_of(target)
            );
            fsync_dir(parent_of(target))
        });
    if result.is_err() {
        // The commit is void; do not leave half-made files behind. The rename may already have
        // happened (then the directory fsync failed), in which case the temp name is gone.
        let _ = unlink(&temp);
    }
    result
}

/// Like [`commit`], with the content written by `fill` (for content too large to hold).
pub fn commit_from(target: &Path, fill: impl FnOnce(&mut File) -> io::Result<()>) -> Result<()> {
    let temp = temp_path_for(target);
    let result = create_new(&temp)
        .map_err(|e| Error::io("cannot create", &temp, e))
        .and_then(|mut file| {
            fill(&mut file).map_err(|e| Error::io("cannot write", &temp, e))?;
            file.sync_all()
                .map_err(|e| Error::io("cannot fsync", &temp, e))
        })
        .and_then(|()| rename_into_place(&temp, target))
        .and_then(|()| fsync_dir(parent_of(target)));
    if result.is_err() {
        let _ = unlink(&temp);
    }
    result
}

/// Creates `path` (which must not exist) with `bytes`, fsynced; the caller makes its name durable.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = create_new(path).map_err(|e| Error::io("cannot create", path, e))?;
    crate::failpoint!(crate::failpoint::STORE_WRITE, "cannot write", path);
    file.write_all(bytes)
        .map_err(|e| Error::io("cannot write", path, e))?;
    crate::failpoint!(crate::failpoint::STORE_FSYNC, "cannot fsync", path);
    file.sync_all()
        .map_err(|e| Error::io("cannot fsync", path, e))
}

fn rename_into_place(temp: &Path, target: &Path) -> Result<()> {
    crate::failpoint!(crate::failpoint::STORE_RENAME, "cannot rename", target);
    rename(temp, target).map_err(|e| Error::io("cannot rename", target, e))
}

/// Files written together and made durable together (group commit).
///
/// [`stage`](Batch::stage) writes each file's temp file; [`commit`](Batch::commit) fsyncs every
/// temp file, renames each over its target, then fsyncs each distinct directory once. Every file
/// is still fsynced before its rename and every rename is durable before `commit` returns, as
/// with [`commit`]; what is shared is the waiting: the fsyncs of a phase are issued
/// concurrently (the device merges their cache flushes) and a directory holding many of the
/// batch's files is fsynced once. A failure anywhere voids the whole batch: temp files not yet
/// renamed are removed and the error is returned, so callers keep every source.
#[derive(Debug, Default)]
pub struct Batch {
    staged: Vec<Staged>,
}

#[derive(Debug)]
struct Staged {
    temp: PathBuf,
    target: PathBuf,
    file: Option<File>,
}

/// The most fsyncs a batch issues at once.
const SYNC_THREADS: usize = 8;

/// An [`Unsynced`] commit of at most this many files is written inline.
const INLINE_UNSYNCED: usize = 4;

impl Batch {
    pub fn new() -> Self {
        Batch::default()
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
        let mut file = create_new(&temp).map_err(|e| Error::io("cannot create", &temp, e))?;
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
            fsync_dir(d)
        })
    }
}

impl Batch {
    fn rename_all(&mut self) -> Result<()> {
        for s in &mut self.staged {
            s.file = None;
            rename_into_place(&s.temp, &s.target)?;
            // Renamed: nothing left to clean up for this one.
            s.temp = PathBuf::new();
        }
        Ok(())
    }
}

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
    pub fn commit(self, trash: Option<&Trash>) -> Result<()> {
        let mut dirs: Vec<Dir> = Vec::new();
        let mut index: std::collections::HashMap<&Path, usize> = Default::default();
        let mut work = Vec::with_capacity(self.files.len());
        for f in &self.files {
            let parent = parent_of(&f.target);
            let d = match index.get(parent) {
                Some(d) => *d,
                None => {
                    dirs.push(Dir::reach(parent)?);
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
                return dir.append(name, &f.bytes);
            }
            // Where the old file is kept when the new one is a new file: as the spare when
            // there is none, else in the trash.
            let spare = match f.how {
                How::Rewrite(rest) => {
                    let spare = spare_name(name);
                    match dir.rewrite_in_place(name, &spare, &f.bytes, rest)? {
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
/// name to every listing ([`is_temp_name`]), since what it holds is never read.
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
                tracing::warn!("cannot dispose of a replaced file: {e}");
            }
        }
        return Ok(());
    }
    dir.rename_within(temp, name, false)
        .map_err(|e| Error::io("cannot rename", dir.path().join(name), e))
}

impl Drop for Batch {
    fn drop(&mut self) {
        for s in &self.staged {
            if !s.temp.as_os_str().is_empty() {
                let _ = unlink(&s.temp);
            }
        }
    }
}

/// Removes files (concurrently) without making the removals durable; files already gone are
/// not an error. For files whose content is already durable elsewhere, so that one coming back
/// after a crash changes nothing: a consumed spool file is then a duplicate. On error, some
/// files may be removed and others not.
pub fn remove_all(paths: &[PathBuf]) -> Result<()> {
    // Concurrently: each removal frees the file's blocks, which on a filesystem mounted with
    // `discard` waits for the device; issued together, the waits overlap.
    let remove = |path: &PathBuf| match unlink(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("cannot remove", path, e)),
    };
    if paths.len() <= INLINE_UNSYNCED {
        return paths.iter().try_for_each(remove);
    }
    each_concurrently(paths, remove)
}

/// [`remove_all`] for names in a directory held open: each removed through the handle.
pub fn unlink_all(dir: &Dir, names: &[&str]) -> Result<()> {
    if names.len() <= INLINE_UNSYNCED {
        return names.iter().try_for_each(|n| dir.unlink(n));
    }
    each_concurrently(names, |n| dir.unlink(n))
}

/// [`remove_all`], then each directory fsynced once, so the removals are durable.
pub fn remove_all_durably(paths: &[PathBuf]) -> Result<()> {
    remove_all(paths)?;
    let dirs = distinct_parents(paths.iter().map(PathBuf::as_path));
    each_concurrently(&dirs, |d| fsync_dir(d))
}

fn distinct_parents<'a>(paths: impl Iterator<Item = &'a Path>) -> Vec<&'a Path> {
    let mut dirs: Vec<&Path> = paths.map(parent_of).collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Runs `f` on every item, up to [`SYNC_THREADS`] at a time, and returns the first error.
/// fsyncs issued together wait for the device together, which is the point of a batch; one or
/// two items are done inline, since a thread would cost more than it saves.
fn each_concurrently<T: Sync>(items: &[T], f: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
    if items.len() <= 2 {
        return items.iter().try_for_each(&f);
    }
    let threads = items.len().min(SYNC_THREADS);
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                scope.spawn(move || items.iter().skip(t).step_by(threads).try_for_each(f))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an fsync thread panicked"))
            .collect()
    });
    results.into_iter().collect()
}

/// Pretty JSON with a trailing newline: stable key order (struct order), pleasant for `jq`/`diff`.
pub fn to_pretty_json<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(value).expect("our records always serialise");
    out.push(b'\n');
    out
}

/// Commits `value` as pretty JSON to `target`.
pub fn commit_json<T: Serialize>(target: &Path, value: &T) -> Result<()> {
    commit(target, &to_pretty_json(value))
}

/// Removes a file and makes the removal durable. A file already gone is not an error.
pub fn remove_durably(path: &Path) -> Result<()> {
    match unlink(path) {
        Ok(()) => fsync_dir(parent_of(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("cannot remove", path, e)),
    }
}

/// Renames durably: both directories are fsynced.
pub fn rename_durably(from: &Path, to: &Path) -> Result<()> {
    rename(from, to).map_err(|e| Error::io("cannot move", from, e))?;
    fsync_dir(parent_of(to))?;
    if parent_of(from) != parent_of(to) {
        fsync_dir(parent_of(from))?;
    }
    Ok(())
}

/// The UTF-8 names in a directory (reached as `beneath.rs` says); a missing directory is
/// empty. Names only: for a directory of a million entries this is a tenth of what
/// [`list_dir`] holds.
pub fn list_names(dir: &Path) -> Result<Vec<String>> {
    let Some(fd) = beneath::open_dir(dir, false)? else {
        return Ok(Vec::new());
    };
    Ok(dir::names_of(&fd, dir)?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .collect())
}

/// The entries of a directory as `(name, path)`; a missing directory is empty. Names that are
/// not UTF-8 are returned lossily converted (callers that must handle them list the directory
/// themselves).
pub fn list_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let Some(fd) = beneath::open_dir(dir, false)? else {
        return Ok(Vec::new());
    };
    Ok(dir::names_of(&fd, dir)?
        .into_iter()
        .map(|name| (name.to_string_lossy().into_owned(), dir.join(name)))
        .collect())
}

/// Removes `*.tmp` files older than `max_age_ms` anywhere under `dir` (commits a crash cut
/// short). Symlinks are never followed. Returns how many were removed.
pub fn remove_stale_temps(dir: &Path, now: Timestamp, max_age_ms: i64) -> Result<usize> {
    let mut removed = 0;
    for (name, path) in list_dir(dir)? {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            removed += remove_stale_temps(&path, now, max_age_ms)?;
        } else if meta.is_file() && name.ends_with(TEMP_SUFFIX) {
            let mtime = Timestamp::from_millis(meta.mtime() * 1000);
            if now.millis_since(mtime) > max_age_ms {
                remove_durably(&path)?;
                tracing::info!(file = %path.display(), "removed a stale temp file");
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// True for names the engine treats as in-flight temp files.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX) || name.ends_with(TEMP_SUFFIX)
}

/// Sets a path's mode (used on the home root, which may pre-exist).
pub fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("cannot chmod", path, e))
}

/// Filesystem events after which a drop-zone file is complete: renamed in, or closed after
/// writing. A bare create is not one (the writer may still be writing).
pub fn is_ready_kind(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
    matches!(
        kind,
        notify::EventKind::Modify(ModifyKind::Name(
            RenameMode::To | RenameMode::Both | RenameMode::Any
        )) | notify::EventKind::Access(AccessKind::Close(AccessMode::Write))
            | notify::EventKind::Create(notify::event::CreateKind::Folder)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn commit_replaces_atomically_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x.json");
        commit(&target, b"one").unwrap();
        commit(&target, b"two").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "only the target remains");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o777, FILE_MODE);
    }

    #[test]
    fn batch_commits_every_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        create_dir_private(&a).unwrap();
        create_dir_private(&b).unwrap();
        commit(&a.join("0.json"), b"old").unwrap();
        let mut batch = Batch::new();
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
            let names = list_dir(d).unwrap();
            assert_eq!(names.len(), 10, "only targets remain in {}", d.display());
            assert!(names.iter().all(|(n, _)| !is_temp_name(n)));
        }
    }

    #[test]
    fn a_rewrite_never_writes_over_a_spare_a_reader_holds() {
        use rustix::fs::{FlockOperation, flock};
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("waitpoint.json");
        let spare = dir.path().join(spare_name("waitpoint.json"));
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        commit(&target, b"\"first\"\n").unwrap();
        create_empty(&spare).unwrap();
        let (first, spare0) = (ino(&target), ino(&spare));
        // A reader opened the state and holds it, as every read does while it reads.
        let reader = File::open(&target).unwrap();
        flock(&reader, FlockOperation::NonBlockingLockShared).unwrap();
        let rewrite = |v: &str| {
            let mut files = Unsynced::new();
            files.rewrite_json(&target, &v, Duration::ZERO);
            files.commit(None).unwrap();
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
        assert_eq!(read_json::<String>(&target).unwrap().unwrap(), "third");
        // Once the reader is done, the spare is used again.
        drop(reader);
        rewrite("fourth");
        assert_eq!((ino(&target), ino(&spare)), (first, third));
        assert_eq!(read_json::<String>(&target).unwrap().unwrap(), "fourth");
    }

    #[test]
    fn a_failed_batch_renames_nothing_and_removes_its_temps() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok");
        create_dir_private(&ok).unwrap();
        let mut batch = Batch::new();
        batch.stage(&ok.join("1.json"), b"1").unwrap();
        // Staging into a missing directory fails; the batch is dropped without a commit.
        assert!(batch.stage(&dir.path().join("gone/2.json"), b"2").is_err());
        drop(batch);
        assert!(list_dir(&ok).unwrap().is_empty(), "no temp, no target");
    }

    #[test]
    fn remove_all_durably_removes_and_tolerates_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (0..5).map(|i| dir.path().join(format!("{i}"))).collect();
        for p in &paths[..4] {
            commit(p, b"x").unwrap();
        }
        remove_all_durably(&paths).unwrap();
        assert!(list_dir(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn unsynced_files_make_a_missing_directory_and_leave_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("new/sub/w.json");
        let mut files = Unsynced::new();
        files.add_json(&target, &serde_json::json!({"n": 1}));
        files.commit(None).unwrap();
        let back: serde_json::Value = read_json(&target).unwrap().unwrap();
        assert_eq!(back["n"], 1);
        assert_eq!(list_dir(target.parent().unwrap()).unwrap().len(), 1);
    }

    #[test]
    fn commit_into_missing_directory_fails_and_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = commit(&dir.path().join("nope/x.json"), b"x").unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
    }
}
