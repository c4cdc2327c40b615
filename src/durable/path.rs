//! Every file operation by path, as the callers build paths from [`Home`](crate::home::Home):
//! opening, creating, listing, renaming and removing, and fsyncing a directory. Each path's
//! directory is reached as `beneath.rs` says (from the home's root, no link followed) and the
//! last component acted on through that handle; `dir.rs` does the same relative to a directory
//! the caller holds open.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::beneath::{Place, Root};
use super::{
    DIR_MODE, Dir, FILE_MODE, INLINE_UNSYNCED, beneath, dir, distinct_parents, each_concurrently,
    not_found, parent_of,
};
use crate::error::{Error, Result};

/// `mkdir -p` of `path` in `place`, mode 0700 for every directory it creates; beneath a home,
/// no link is followed on the way (see `beneath.rs`).
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

/// fsyncs the directory `dir` in `place`, so a rename or unlink inside it is durable.
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

/// Whether anything (a file, a directory, a link: not followed) is named `path` in `place`.
pub(super) fn exists_in(place: Place<'_>, path: &Path) -> bool {
    use rustix::fs::AtFlags;
    parent_in(place, path)
        .is_ok_and(|(at, name)| rustix::fs::statat(&at, &name, AtFlags::SYMLINK_NOFOLLOW).is_ok())
}

/// Opens `path` in `place` with `flags`, never following a link as its last component.
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

/// Creates `path` (which must not exist) in `place` for writing, mode 0600.
pub(super) fn create_new_in(place: Place<'_>, path: &Path) -> io::Result<File> {
    use rustix::fs::OFlags;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
    open_in(place, path, flags, FILE_MODE)
}

/// Opens `path` in `place` for reading: a link as the last component is refused (`ELOOP`), a
/// FIFO does not block the open.
pub(super) fn open_read_in(place: Place<'_>, path: &Path) -> io::Result<File> {
    use rustix::fs::OFlags;
    if let Some(opened) = place.open_read_fast(path) {
        return opened.map(File::from);
    }
    open_in(place, path, OFlags::RDONLY | OFlags::NONBLOCK, 0)
}

/// Removes the file `path` in `place` (not durably).
pub(super) fn unlink_in(place: Place<'_>, path: &Path) -> io::Result<()> {
    let (at, name) = parent_in(place, path)?;
    Ok(rustix::fs::unlinkat(
        &at,
        name.as_os_str(),
        rustix::fs::AtFlags::empty(),
    )?)
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

/// Removes the directory `path` in `place` and everything in it, every step through a handle
/// of the directory above (no link is followed, at any depth: a link inside is removed as a
/// link). A missing directory is not an error; nothing is made durable.
fn remove_tree_in(place: Place<'_>, path: &Path) -> Result<()> {
    let Some((at, name)) = place.parent(path, false)? else {
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

/// Removes files in `place` (concurrently) without making the removals durable; files already
/// gone are not an error. For files whose content is already durable elsewhere, so that one
/// coming back after a crash changes nothing: a consumed spool file is then a duplicate. On
/// error, some files may be removed and others not.
pub(super) fn remove_all_in(place: Place<'_>, paths: &[PathBuf]) -> Result<()> {
    // Concurrently: each removal frees the file's blocks, which on a filesystem mounted with
    // `discard` waits for the device; issued together, the waits overlap.
    let remove = |path: &PathBuf| match unlink_in(place, path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("cannot remove", path, e)),
    };
    if paths.len() <= INLINE_UNSYNCED {
        return paths.iter().try_for_each(remove);
    }
    each_concurrently(paths, remove)
}

/// [`Root::remove_all`] for names in a directory held open: each removed through the handle.
pub fn unlink_all(dir: &Dir, names: &[&str]) -> Result<()> {
    if names.len() <= INLINE_UNSYNCED {
        return names.iter().try_for_each(|n| dir.unlink(n));
    }
    each_concurrently(names, |n| dir.unlink(n))
}

/// Removes a file in `place` and makes the removal durable. A file already gone is not an
/// error.
fn remove_durably_in(place: Place<'_>, path: &Path) -> Result<()> {
    match unlink_in(place, path) {
        Ok(()) => fsync_dir_in(place, parent_of(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("cannot remove", path, e)),
    }
}

/// Renames `from` to `to`, both in `place`, durably: both directories are fsynced.
pub(super) fn rename_durably_in(place: Place<'_>, from: &Path, to: &Path) -> Result<()> {
    let flags = rustix::fs::RenameFlags::empty();
    rename_in((place, from), (place, to), flags).map_err(|e| Error::io("cannot move", from, e))?;
    fsync_dir_in(place, parent_of(to))?;
    if parent_of(from) != parent_of(to) {
        fsync_dir_in(place, parent_of(from))?;
    }
    Ok(())
}

/// The UTF-8 names in the directory `dir` in `place`; a missing directory is empty. Names
/// only: for a directory of a million entries this is a tenth of what [`list_dir_in`] holds.
fn list_names_in(place: Place<'_>, dir: &Path) -> Result<Vec<String>> {
    let Some(fd) = place.open_dir(dir, false)? else {
        return Ok(Vec::new());
    };
    Ok(dir::names_of(&fd, dir)?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .collect())
}

/// The entries of the directory `dir` in `place` as `(name, path)`; a missing directory is
/// empty. Names that are not UTF-8 are returned lossily converted (callers that must handle
/// them list the directory themselves).
pub(super) fn list_dir_in(place: Place<'_>, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let Some(fd) = place.open_dir(dir, false)? else {
        return Ok(Vec::new());
    };
    Ok(dir::names_of(&fd, dir)?
        .into_iter()
        .map(|name| (name.to_string_lossy().into_owned(), dir.join(name)))
        .collect())
}

/// Every operation by path beneath the home, each path reached from its root without
/// following a link: a path not beneath it is refused (see `beneath.rs`).
impl Root {
    /// `mkdir -p` of `path`, mode 0700 for every directory it creates.
    pub fn create_dir_private(&self, path: &Path) -> Result<()> {
        create_dir_private_in(Place::Beneath(self), path)
    }

    /// Whether anything (a file, a directory, a link: not followed) is named `path`.
    pub fn exists(&self, path: &Path) -> bool {
        exists_in(Place::Beneath(self), path)
    }

    /// fsyncs the directory `dir`, so a rename or unlink inside it is durable.
    pub fn fsync_dir(&self, dir: &Path) -> Result<()> {
        fsync_dir_in(Place::Beneath(self), dir)
    }

    /// Makes the empty file `path` (mode 0600; it must not exist), without fsync.
    pub fn create_empty(&self, path: &Path) -> Result<()> {
        create_new_in(Place::Beneath(self), path)
            .map(drop)
            .map_err(|e| Error::io("cannot create", path, e))
    }

    /// Opens `path` for reading: a link as the last component is refused (`ELOOP`), a FIFO
    /// does not block the open.
    pub fn open_read(&self, path: &Path) -> io::Result<File> {
        open_read_in(Place::Beneath(self), path)
    }

    /// Opens (creating when missing) `path` for reading and writing, mode 0600 (a lock file),
    /// without blocking: only ever a regular file ([`Dir::open_regular`]).
    pub fn open_or_create(&self, path: &Path) -> Result<File> {
        use rustix::fs::OFlags;
        self.open_regular(path, OFlags::RDWR | OFlags::CREATE)
    }

    /// Creates `path` (which must not exist) for appending, mode 0600.
    pub fn create_append(&self, path: &Path) -> io::Result<File> {
        use rustix::fs::OFlags;
        let flags = OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::EXCL;
        open_in(Place::Beneath(self), path, flags, FILE_MODE)
    }

    /// Opens `path` for appending (made, mode 0600, when missing) without blocking: only ever a
    /// regular file ([`Dir::open_regular`]), so nothing outside the home is written through a
    /// link planted under its name.
    pub fn open_append(&self, path: &Path) -> Result<File> {
        use rustix::fs::OFlags;
        self.open_regular(path, OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE)
    }

    /// `path` opened with `flags`, only ever as a regular file ([`Dir::open_regular`]).
    fn open_regular(&self, path: &Path, flags: rustix::fs::OFlags) -> Result<File> {
        let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            Error::io(
                "cannot open",
                path,
                io::Error::from(io::ErrorKind::InvalidInput),
            )
        })?;
        Dir::reach(self, parent_of(path))?.open_regular(self, name, flags)
    }

    /// Removes the file `path` (not durably).
    pub fn unlink(&self, path: &Path) -> io::Result<()> {
        unlink_in(Place::Beneath(self), path)
    }

    /// Renames `from` to `to` (not durably).
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let place = Place::Beneath(self);
        rename_in((place, from), (place, to), rustix::fs::RenameFlags::empty())
    }

    /// Swaps the names `a` and `b` atomically (`renameat2(2)` with `RENAME_EXCHANGE`); both
    /// must exist.
    pub fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        let place = Place::Beneath(self);
        rename_in((place, a), (place, b), rustix::fs::RenameFlags::EXCHANGE)
    }

    /// Removes the directory `path` and everything in it, no link followed at any depth (a
    /// link inside is removed as a link). A missing directory is not an error; nothing is
    /// made durable.
    pub fn remove_tree(&self, path: &Path) -> Result<()> {
        remove_tree_in(Place::Beneath(self), path)
    }

    /// Removes files (concurrently) without making the removals durable; files already gone
    /// are not an error. For files whose content is already durable elsewhere, so that one
    /// coming back after a crash changes nothing (a consumed spool file is then a duplicate).
    /// On error, some files may be removed and others not.
    pub fn remove_all(&self, paths: &[PathBuf]) -> Result<()> {
        remove_all_in(Place::Beneath(self), paths)
    }

    /// [`Root::remove_all`], then each directory fsynced once, so the removals are durable.
    pub fn remove_all_durably(&self, paths: &[PathBuf]) -> Result<()> {
        self.remove_all(paths)?;
        let dirs = distinct_parents(paths.iter().map(PathBuf::as_path));
        each_concurrently(&dirs, |d| self.fsync_dir(d))
    }

    /// Removes a file and makes the removal durable. A file already gone is not an error.
    pub fn remove_durably(&self, path: &Path) -> Result<()> {
        remove_durably_in(Place::Beneath(self), path)
    }

    /// Renames durably: both directories are fsynced.
    pub fn rename_durably(&self, from: &Path, to: &Path) -> Result<()> {
        rename_durably_in(Place::Beneath(self), from, to)
    }

    /// The UTF-8 names in the directory `dir`; a missing directory is empty. Names only: for
    /// a directory of a million entries this is a tenth of what [`Root::list_dir`] holds.
    pub fn list_names(&self, dir: &Path) -> Result<Vec<String>> {
        list_names_in(Place::Beneath(self), dir)
    }

    /// The entries of the directory `dir` as `(name, path)`; a missing directory is empty.
    /// Names that are not UTF-8 are returned lossily converted (callers that must handle them
    /// list the directory themselves).
    pub fn list_dir(&self, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
        list_dir_in(Place::Beneath(self), dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_all_durably_removes_and_tolerates_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path(), &dir.path().join("quarantine"));
        let paths: Vec<PathBuf> = (0..5).map(|i| dir.path().join(format!("{i}"))).collect();
        for p in &paths[..4] {
            root.commit(p, b"x").unwrap();
        }
        root.remove_all_durably(&paths).unwrap();
        assert!(root.list_dir(dir.path()).unwrap().is_empty());
    }
}
