//! Every file operation by path, as the callers build paths from [`Home`](crate::home::Home):
//! opening, creating, listing, renaming and removing, and fsyncing a directory. Each path's
//! directory is reached as `beneath.rs` says (from the home's root, no link followed) and the
//! last component acted on through that handle; `dir.rs` does the same relative to a directory
//! the caller holds open.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::beneath::{Place, Root};
use super::{
    DIR_MODE, Dir, FILE_MODE, INLINE_UNSYNCED, beneath, dir, distinct_parents, each_concurrently,
    not_found, parent_of,
};
use crate::error::{Error, Result};

/// `mkdir -p` with mode 0700 for every directory it creates; beneath a home, no link is
/// followed on the way (see `beneath.rs`).
pub fn create_dir_private(path: &Path) -> Result<()> {
    beneath::open_dir(path, true).map(drop)
}

/// [`create_dir_private`] of `path` in `place`.
pub(super) fn create_dir_private_in(place: Place<'_>, path: &Path) -> Result<()> {
    place.open_dir(path, true).map(drop)
}

/// `mkdir -p` of a path outside every home, as given.
pub(super) fn mkdir_all_plain(path: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
        .map_err(|e| Error::io("cannot create directory", path, e))
}

/// fsync a directory so a rename or unlink inside it is durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    let home = beneath::registered(dir);
    fsync_dir_in(beneath::place(home.as_deref()), dir)
}

/// [`fsync_dir`] of `dir` in `place`.
pub(super) fn fsync_dir_in(place: Place<'_>, dir: &Path) -> Result<()> {
    let fd = place
        .open_dir(dir, false)?
        .ok_or_else(|| Error::io("cannot fsync directory", dir, not_found()))?;
    rustix::fs::fsync(&fd).map_err(|e| Error::io("cannot fsync directory", dir, e.into()))
}

/// `path`'s directory, reached in `place`, and its last component there.
fn parent_in(place: Place<'_>, path: &Path) -> io::Result<(beneath::At, std::ffi::OsString)> {
    place
        .parent(path, false)
        .map_err(io::Error::other)?
        .ok_or_else(not_found)
}

/// Opens `path` with `flags` (never following a link as its last component), its directory
/// reached as `beneath.rs` says.
fn open_at(path: &Path, flags: rustix::fs::OFlags, mode: u32) -> io::Result<File> {
    let home = beneath::registered(path);
    open_in(beneath::place(home.as_deref()), path, flags, mode)
}

/// [`open_at`] in `place`.
fn open_in(
    place: Place<'_>,
    path: &Path,
    flags: rustix::fs::OFlags,
    mode: u32,
) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let (at, name) = parent_in(place, path)?;
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(File::from(rustix::fs::openat(
        &at,
        name.as_os_str(),
        flags,
        Mode::from_raw_mode(mode),
    )?))
}

/// Creates `path` (which must not exist) for writing, mode 0600.
pub(super) fn create_new(path: &Path) -> io::Result<File> {
    use rustix::fs::OFlags;
    open_at(
        path,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        FILE_MODE,
    )
}

/// [`create_new`] in `place`.
pub(super) fn create_new_in(place: Place<'_>, path: &Path) -> io::Result<File> {
    use rustix::fs::OFlags;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
    open_in(place, path, flags, FILE_MODE)
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
    let home = beneath::registered(path);
    open_read_in(beneath::place(home.as_deref()), path)
}

/// [`open_read`] of `path` in `place`.
pub(super) fn open_read_in(place: Place<'_>, path: &Path) -> io::Result<File> {
    use rustix::fs::OFlags;
    if let Some(opened) = place.open_read_fast(path) {
        return opened.map(File::from);
    }
    open_in(place, path, OFlags::RDONLY | OFlags::NONBLOCK, 0)
}

/// Opens (creating when missing) `path` for reading and writing, mode 0600 (a lock file).
pub fn open_or_create(path: &Path) -> io::Result<File> {
    use rustix::fs::OFlags;
    open_at(path, OFlags::RDWR | OFlags::CREATE, FILE_MODE)
}

/// Removes the file `path` (not durably), reached as [`open_read`] reaches it.
pub fn unlink(path: &Path) -> io::Result<()> {
    let home = beneath::registered(path);
    unlink_in(beneath::place(home.as_deref()), path)
}

/// [`unlink`] in `place`.
pub(super) fn unlink_in(place: Place<'_>, path: &Path) -> io::Result<()> {
    let (at, name) = parent_in(place, path)?;
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
    let (from_home, to_home) = (beneath::registered(from), beneath::registered(to));
    let from = (beneath::place(from_home.as_deref()), from);
    rename_in(from, (beneath::place(to_home.as_deref()), to), flags)
}

/// Renames `from` to `to`, each reached in its place.
pub(super) fn rename_in(
    (from_place, from): (Place<'_>, &Path),
    (to_place, to): (Place<'_>, &Path),
    flags: rustix::fs::RenameFlags,
) -> io::Result<()> {
    let (from_at, from_name) = parent_in(from_place, from)?;
    let (to_at, to_name) = parent_in(to_place, to)?;
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

/// Removes a file and makes the removal durable. A file already gone is not an error.
pub fn remove_durably(path: &Path) -> Result<()> {
    let home = beneath::registered(path);
    remove_durably_in(beneath::place(home.as_deref()), path)
}

/// [`remove_durably`] of `path` in `place`.
fn remove_durably_in(place: Place<'_>, path: &Path) -> Result<()> {
    match unlink_in(place, path) {
        Ok(()) => fsync_dir_in(place, parent_of(path)),
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

/// [`rename_durably`] of `from` to `to`, both in `place`.
pub(super) fn rename_durably_in(place: Place<'_>, from: &Path, to: &Path) -> Result<()> {
    let flags = rustix::fs::RenameFlags::empty();
    rename_in((place, from), (place, to), flags).map_err(|e| Error::io("cannot move", from, e))?;
    fsync_dir_in(place, parent_of(to))?;
    if parent_of(from) != parent_of(to) {
        fsync_dir_in(place, parent_of(from))?;
    }
    Ok(())
}

/// The UTF-8 names in a directory (reached as `beneath.rs` says); a missing directory is
/// empty. Names only: for a directory of a million entries this is a tenth of what
/// [`list_dir`] holds.
pub fn list_names(dir: &Path) -> Result<Vec<String>> {
    let home = beneath::registered(dir);
    list_names_in(beneath::place(home.as_deref()), dir)
}

/// [`list_names`] of `dir` in `place`.
fn list_names_in(place: Place<'_>, dir: &Path) -> Result<Vec<String>> {
    let Some(fd) = place.open_dir(dir, false)? else {
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
    let home = beneath::registered(dir);
    list_dir_in(beneath::place(home.as_deref()), dir)
}

/// [`list_dir`] of `dir` in `place`.
fn list_dir_in(place: Place<'_>, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let Some(fd) = place.open_dir(dir, false)? else {
        return Ok(Vec::new());
    };
    Ok(dir::names_of(&fd, dir)?
        .into_iter()
        .map(|name| (name.to_string_lossy().into_owned(), dir.join(name)))
        .collect())
}

/// The operations by path beneath the home, each reached from its root: a path not beneath it
/// is refused (see `beneath.rs`).
impl Root {
    /// [`create_dir_private`] of `path`, beneath this root.
    pub fn create_dir_private(&self, path: &Path) -> Result<()> {
        create_dir_private_in(Place::Beneath(self), path)
    }

    /// [`open_or_create`] of `path`, beneath this root.
    pub fn open_or_create(&self, path: &Path) -> io::Result<File> {
        use rustix::fs::OFlags;
        open_in(
            Place::Beneath(self),
            path,
            OFlags::RDWR | OFlags::CREATE,
            FILE_MODE,
        )
    }

    /// [`unlink`] of `path`, beneath this root.
    pub fn unlink(&self, path: &Path) -> io::Result<()> {
        unlink_in(Place::Beneath(self), path)
    }

    /// [`remove_durably`] of `path`, beneath this root.
    pub fn remove_durably(&self, path: &Path) -> Result<()> {
        remove_durably_in(Place::Beneath(self), path)
    }

    /// [`list_dir`] of `dir`, beneath this root.
    pub fn list_dir(&self, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
        list_dir_in(Place::Beneath(self), dir)
    }

    /// [`list_names`] of `dir`, beneath this root.
    pub fn list_names(&self, dir: &Path) -> Result<Vec<String>> {
        list_names_in(Place::Beneath(self), dir)
    }
}

/// Sets a path's mode (used on the home root, which may pre-exist).
pub fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("cannot chmod", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::commit;

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
}
