//! Paths of a home reached from its root, never through a link: the one place where a path
//! under a home becomes a directory handle.
//!
//! Every file operation of this module's parent (`commit`, renames, removals, listings, locks,
//! reads) is written once over a [`Place`]: beneath a home's [`Root`], or
//! [`outside`](crate::durable::outside) every home. Beneath a root, the operation does not resolve
//! the path as the kernel would, following any link on the way: it takes the home's root (which may
//! itself be a link the user made, `~/.cortex -> /data/cortex`; opened once and held, see
//! [`Root`]), then the directory holding the last component relative to it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` in one call, and acts on the last
//! component through that handle (`openat`, `renameat`, `unlinkat` with `O_NOFOLLOW`). A
//! kernel without `openat2` gets the same walk one component at a time. A path handed to a
//! [`Root`] that does not lie beneath it (another directory, or one climbing out with `..`)
//! is refused ([`Root::relative`]), never used as given.
//!
//! A link (or a file) where a directory of the home should be is never followed. It is set
//! aside into the home's `quarantine/` with a `.reason` beside it and a warning in the log
//! (what it points to is not touched), and the operation goes on as if the directory were
//! missing: a write makes the real directory, a read finds nothing. So one planted link costs
//! only its own directory, never the daemon's batch. If the link cannot be set aside (the
//! quarantine is itself a link), the operation fails, saying so.
//!
//! Paths outside every home (a user's file named on the command line, a test's temp
//! directory) are used as given, by the explicitly named [`outside`](crate::durable::outside)
//! forms. There is no registry of homes: a caller names the home a path lies in by calling the
//! operation on that home's [`Root`] (which [`Home`](crate::home::Home) holds), so a path is never
//! taken for another home's, nor for no home's, by where it happens to lie.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::durable::DIR_MODE;
use crate::error::{Error, Result};
use crate::sync::MutexExt;

/// A home's root directory: its path, its quarantine, and its handle once reached. Every path
/// beneath the home is reached from it; [`Home`](crate::home::Home) holds it.
#[derive(Debug)]
pub struct Root {
    root: PathBuf,
    quarantine: PathBuf,
    /// The root, held open once reached: every operation would otherwise open it again (one
    /// `openat` and one `close` of the root per file touched, a fifth of a signal's system
    /// calls). It is resolved as the user made it (it may be a link) when first reached; a
    /// root removed since is noticed (no links left) and reached afresh.
    handle: Mutex<Option<Arc<OwnedFd>>>,
}

impl Root {
    /// The root's path, as the user made it (it may be a link).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Where what stands in the way of the home's layout is set aside.
    pub fn quarantine(&self) -> &Path {
        &self.quarantine
    }

    /// Sets `path`, an entry beneath this root that is not what the home keeps there, aside
    /// into the quarantine with `reason`, as [`set_aside`](crate::durable::set_aside) does. A path
    /// not beneath this root is not moved, and the error says so.
    pub fn set_aside(&self, path: &Path, reason: &str) -> Result<()> {
        self.relative(path)?;
        set_aside_entry(self, path, reason)
    }
}

/// Two roots are one home when their paths are.
impl PartialEq for Root {
    fn eq(&self, other: &Self) -> bool {
        self.root == other.root
    }
}

impl Eq for Root {}

impl Root {
    /// The root of the home at `root`, setting aside into `quarantine`; nothing is opened
    /// until a path beneath it is first reached.
    pub fn new(root: &Path, quarantine: &Path) -> Root {
        Root {
            root: root.to_owned(),
            quarantine: quarantine.to_owned(),
            handle: Mutex::new(None),
        }
    }

    /// `path` relative to this root. A path that does not lie beneath it (another directory,
    /// or one that climbs out with `..`) is refused: it is never used as given.
    pub fn relative<'p>(&self, path: &'p Path) -> Result<&'p Path> {
        let beneath = path.strip_prefix(&self.root).ok().filter(|rel| {
            rel.components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        });
        beneath.ok_or_else(|| {
            Error::io(
                "not a path beneath the home",
                path,
                io::Error::from(io::ErrorKind::InvalidInput),
            )
        })
    }

    /// Where `path`'s last component lives beneath this root and its name there, the
    /// directory made when `make`; `Ok(None)` when it is missing and not made. The root itself
    /// is reached as the user made it.
    pub fn parent(&self, path: &Path, make: bool) -> Result<Option<(At, OsString)>> {
        let rel = self.relative(path)?;
        let (Some(dir), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Ok(Some((At::Cwd, path.as_os_str().to_owned())));
        };
        Ok(walk(self, dir, make)?.map(|fd| (At::Dir(fd), name.to_owned())))
    }

    /// `path`, beneath this root, as a directory handle (made when `make`); `Ok(None)` when it
    /// is missing and not made.
    pub fn open_dir(&self, path: &Path, make: bool) -> Result<Option<OwnedFd>> {
        walk(self, self.relative(path)?, make)
    }

    /// Opens the file `path`, beneath this root, for reading in one `openat2` from the held
    /// root, no link followed on the way or as the file itself: the common case of every read,
    /// which would otherwise open the directory first and the file through it. `None` when that
    /// one call cannot say (a link or a file where a directory should be, no `openat2` here, a
    /// root removed since it was opened, a path not beneath this root): the caller then takes
    /// the path that walks and names the culprit (or refuses the path). `Some(Err)` of kind
    /// `NotFound` when it is missing.
    pub fn open_read_fast(&self, path: &Path) -> Option<io::Result<OwnedFd>> {
        open_read_fast_in(self, self.relative(path).ok()?)
    }
}

/// Where a path-based operation reaches its path: beneath a home's [`Root`] (a path not
/// beneath it refused), or [`outside`](crate::durable::outside) every home, as given. Each
/// operation is written once over a place; the caller says which.
#[derive(Debug, Clone, Copy)]
pub enum Place<'a> {
    Beneath(&'a Root),
    Outside,
}

impl Place<'_> {
    /// [`Root::parent`], or outside every home the current directory and the whole path.
    pub fn parent(self, path: &Path, make: bool) -> Result<Option<(At, OsString)>> {
        match self {
            Place::Beneath(root) => root.parent(path, make),
            Place::Outside => Ok(Some((At::Cwd, path.as_os_str().to_owned()))),
        }
    }

    /// [`Root::open_dir`], or outside every home the path as given.
    pub fn open_dir(self, path: &Path, make: bool) -> Result<Option<OwnedFd>> {
        match self {
            Place::Beneath(root) => root.open_dir(path, make),
            Place::Outside => open_dir_as_given(path, make),
        }
    }

    /// [`Root::open_read_fast`]; outside every home there is no fast path.
    pub fn open_read_fast(self, path: &Path) -> Option<io::Result<OwnedFd>> {
        match self {
            Place::Beneath(root) => root.open_read_fast(path),
            Place::Outside => None,
        }
    }
}

/// `path`, outside every home, as a directory handle, made first when `make` (links followed
/// as the kernel does); `Ok(None)` when it is missing and not made.
fn open_dir_as_given(path: &Path, make: bool) -> Result<Option<OwnedFd>> {
    if make {
        crate::durable::path::mkdir_all_plain(path)?;
    }
    match rustix::fs::openat(CWD, path, OPEN_DIR - OFlags::NOFOLLOW, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(Error::io("cannot open", path, e.into())),
    }
}

/// A directory to act in: a handle reached beneath a home, or the current directory for a
/// path outside every home (the path is then used whole, as given).
#[derive(Debug)]
pub enum At {
    Dir(OwnedFd),
    Cwd,
}

impl AsFd for At {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            At::Dir(fd) => fd.as_fd(),
            At::Cwd => CWD,
        }
    }
}

/// [`Root::open_read_fast`] of `rel`, a path relative to `home`.
pub fn open_read_fast_in(home: &Root, rel: &Path) -> Option<io::Result<OwnedFd>> {
    if rel.as_os_str().is_empty() {
        return None;
    }
    let root_fd = root_handle(home, false).ok()??;
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(&*root_fd, rel, flags, Mode::empty(), resolve) {
        Ok(fd) => Some(Ok(fd)),
        // Truly missing (`NO_SYMLINKS` says ELOOP for a link), unless the held root itself
        // was removed and made again: the walk opens the root afresh.
        Err(Errno::NOENT) if rustix::fs::fstat(&*root_fd).is_ok_and(|st| st.st_nlink > 0) => {
            Some(Err(io::Error::from(io::ErrorKind::NotFound)))
        }
        Err(_) => None,
    }
}

const OPEN_DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// The directory `rel` beneath `root`, no link followed: one `openat2` when nothing is
/// unusual, else one component at a time, setting aside what stands where a directory should.
fn walk(home: &Root, rel: &Path, make: bool) -> Result<Option<OwnedFd>> {
    let Some(root_fd) = root_handle(home, make)? else {
        return Ok(None);
    };
    let found = walk_from(&root_fd, home, rel, make);
    // A root removed while held (a home deleted and made again) is not where the path leads
    // any more: forget it and walk once more from the root as it is now.
    let gone = || rustix::fs::fstat(&*root_fd).is_ok_and(|st| st.st_nlink == 0);
    if !matches!(found, Ok(Some(_))) && gone() {
        *home.handle.lock_or_recover() = None;
        let Some(root_fd) = root_handle(home, make)? else {
            return Ok(None);
        };
        return walk_from(&root_fd, home, rel, make);
    }
    found
}

/// The held-open handle of `home`'s root, opened when first asked for (and made when
/// `make`); `Ok(None)` when it is missing and not made.
fn root_handle(home: &Root, make: bool) -> Result<Option<Arc<OwnedFd>>> {
    let mut held = home.handle.lock_or_recover();
    if let Some(fd) = held.as_ref() {
        return Ok(Some(Arc::clone(fd)));
    }
    let root = home.root.as_path();
    let fd = match rustix::fs::openat(CWD, root, OPEN_DIR - OFlags::NOFOLLOW, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) if make => {
            super::path::mkdir_all_plain(root)?;
            rustix::fs::openat(CWD, root, OPEN_DIR - OFlags::NOFOLLOW, Mode::empty())
                .map_err(|e| Error::io("cannot open", root, e.into()))?
        }
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(Error::io("cannot open", root, e.into())),
    };
    let fd = Arc::new(fd);
    *held = Some(Arc::clone(&fd));
    Ok(Some(fd))
}

/// [`walk`] from the root's handle.
fn walk_from(root_fd: &OwnedFd, home: &Root, rel: &Path, make: bool) -> Result<Option<OwnedFd>> {
    let root = home.root.as_path();
    if rel.as_os_str().is_empty() {
        return root_fd
            .try_clone()
            .map(Some)
            .map_err(|e| Error::io("cannot open", root, e));
    }
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(root_fd, rel, OPEN_DIR, Mode::empty(), resolve) {
        Ok(fd) => return Ok(Some(fd)),
        Err(Errno::NOENT) if !make => {
            // Missing, or a link on the way made it look so? Only a link would matter, and
            // `NO_SYMLINKS` says ELOOP for one, so this is truly missing.
            return Ok(None);
        }
        // Missing parts to make, a link or a file on the way, or no openat2 here: the walk
        // below does each and says which.
        Err(_) => {}
    }
    let mut dir = root_fd
        .try_clone()
        .map_err(|e| Error::io("cannot open", root, e))?;
    let mut at = root.to_owned();
    for part in rel.components() {
        let name = match part {
            Component::Normal(name) => name,
            Component::CurDir => continue,
            _ => {
                return Err(Error::io(
                    "not a path beneath the home",
                    root.join(rel),
                    io::Error::from(io::ErrorKind::InvalidInput),
                ));
            }
        };
        at.push(name);
        dir = match step(&dir, name, &at, home, make)? {
            Some(fd) => fd,
            None => return Ok(None),
        };
    }
    Ok(Some(dir))
}

/// One component of [`walk`]: the directory `name` in `dir`.
fn step(
    dir: &OwnedFd,
    name: &OsStr,
    at: &Path,
    home: &Root,
    make: bool,
) -> Result<Option<OwnedFd>> {
    for _ in 0..3 {
        match rustix::fs::openat(dir, name, OPEN_DIR, Mode::empty()) {
            Ok(fd) => return Ok(Some(fd)),
            Err(Errno::NOENT) if make => {
                match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(DIR_MODE)) {
                    Ok(()) | Err(Errno::EXIST) => continue,
                    Err(e) => return Err(Error::io("cannot create directory", at, e.into())),
                }
            }
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP | Errno::NOTDIR) => {
                let what = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                        "is a symbolic link where the home has a directory"
                    }
                    Ok(_) => "is not a directory where the home has one",
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(Error::io("cannot inspect", at, e.into())),
                };
                set_aside_entry(home, at, what)?;
                if !make {
                    return Ok(None);
                }
            }
            Err(e) => return Err(Error::io("cannot open", at, e.into())),
        }
    }
    Err(Error::io(
        "cannot open",
        at,
        io::Error::other("it keeps changing while being opened"),
    ))
}

/// Moves `at` (a link or a file standing where a directory should) into the quarantine as
/// [`set_aside`](crate::durable::set_aside) does for any record: the link itself is renamed,
/// what it points to is not touched. Reaching the quarantine walks here again; if the
/// quarantine is itself what stands in the way, nothing moves and the caller is refused.
fn set_aside_entry(home: &Root, at: &Path, reason: &str) -> Result<()> {
    if home.quarantine.starts_with(at) {
        // Not `Insecure`, whose text speaks of other users: this is the home's own layout
        // broken, for an operator to look at.
        return Err(Error::io(
            "cannot set aside",
            at,
            io::Error::other(format!(
                "{reason}, and the quarantine cannot hold itself; remove it (the directories \
                 are made again)"
            )),
        ));
    }
    let to = crate::durable::set_aside(home, at, &format!("{reason}; set aside, not followed"))?;
    tracing::warn!(
        path = %at.display(),
        quarantined = %to.display(),
        reason = %reason,
        "set aside, not followed"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn home() -> (tempfile::TempDir, PathBuf, PathBuf, Root) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        std::fs::create_dir_all(&root).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let home = Root::new(&root, &root.join("quarantine"));
        (dir, root, outside, home)
    }

    #[test]
    fn a_home_removed_and_made_again_is_written_to_and_read_where_it_is_now() {
        let (_d, root, _, home) = home();
        home.create_dir_private(&root.join("a")).unwrap();
        home.commit(&root.join("a/file.json"), b"1").unwrap();
        // The root is held open now; the home goes and a new one stands at its path.
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        home.create_dir_private(&root.join("a")).unwrap();
        home.commit(&root.join("a/file.json"), b"2").unwrap();
        assert_eq!(std::fs::read(root.join("a/file.json")).unwrap(), b"2");
        std::fs::write(root.join("a/other.json"), b"3").unwrap();
        let listed = home.list_dir(&root.join("a")).unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
    }

    #[test]
    fn a_link_on_the_way_is_set_aside_with_a_reason_and_a_real_directory_made() {
        let (_d, root, outside, home) = home();
        std::fs::create_dir_all(root.join("a")).unwrap();
        symlink(&outside, root.join("a/b")).unwrap();
        home.create_dir_private(&root.join("a/b/c")).unwrap();
        home.commit(&root.join("a/b/c/file.json"), b"{}").unwrap();
        assert!(root.join("a/b/c/file.json").is_file());
        assert!(
            std::fs::symlink_metadata(root.join("a/b"))
                .unwrap()
                .is_dir()
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        let reason = std::fs::read_to_string(root.join("quarantine/a%b.reason")).unwrap();
        assert!(reason.contains("symbolic link"), "{reason}");
        assert!(
            std::fs::symlink_metadata(root.join("quarantine/a%b"))
                .unwrap()
                .file_type()
                .is_symlink(),
            "the link itself is kept, not what it points to"
        );
    }

    #[test]
    fn a_linked_quarantine_refuses_instead_of_following() {
        let (_d, root, outside, home) = home();
        symlink(&outside, root.join("quarantine")).unwrap();
        symlink(&outside, root.join("x")).unwrap();
        let err = home.commit(&root.join("x/file.json"), b"{}").unwrap_err();
        assert!(err.to_string().contains("cannot set aside"), "{err}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn a_read_through_a_link_finds_nothing_and_only_paths_named_outside_are_used_as_given() {
        let (_d, root, outside, home) = home();
        std::fs::write(outside.join("secret.json"), b"{}").unwrap();
        symlink(&outside, root.join("d")).unwrap();
        let read: Option<serde_json::Value> = home.read_json(&root.join("d/secret.json")).unwrap();
        assert!(read.is_none());
        // Outside every home: as given, when named so.
        let v: Option<serde_json::Value> =
            crate::durable::read::read_json_in(Place::Outside, &outside.join("secret.json"))
                .unwrap();
        assert!(v.is_some());
        // The same path handed to the home is refused, never read as given.
        let err = home
            .read_json::<serde_json::Value>(&outside.join("secret.json"))
            .unwrap_err();
        assert!(
            err.to_string().contains("not a path beneath the home"),
            "{err}"
        );
        // And so it is by the record reader, which once read such a path as given.
        let err =
            crate::durable::read_record_bytes(&home, &outside.join("secret.json")).unwrap_err();
        assert!(
            err.to_string().contains("not a path beneath the home"),
            "{err}"
        );
    }

    #[test]
    fn a_root_refuses_every_path_not_beneath_it_instead_of_using_it_as_given() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(
            &dir.path().join("home"),
            &dir.path().join("home/quarantine"),
        );
        let outside = dir.path().join("outside");
        let climbing = dir.path().join("home/a/../../outside");
        for path in [
            outside.join("f"),
            climbing.join("f"),
            PathBuf::from("relative/f"),
        ] {
            let err = root.parent(&path, true).unwrap_err();
            assert!(
                err.to_string().contains("not a path beneath the home"),
                "{err}"
            );
            let err = root.open_dir(&path, true).unwrap_err();
            assert!(
                err.to_string().contains("not a path beneath the home"),
                "{err}"
            );
            assert!(root.open_read_fast(&path).is_none());
            assert!(root.set_aside(&path, "test").is_err());
        }
        assert!(!outside.exists(), "nothing was made outside the home");
    }

    #[test]
    fn two_homes_one_inside_the_other_each_confine_their_own_paths() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("a/b"));
        let outer = Root::new(&a, &a.join("quarantine"));
        let inner = Root::new(&b, &b.join("quarantine"));
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        symlink(&outside, a.join("x")).unwrap();
        symlink(&outside, b.join("y")).unwrap();
        // Each walks beneath itself and sets a link aside into its own quarantine.
        assert!(inner.open_dir(&b.join("y/z"), false).unwrap().is_none());
        assert!(outer.open_dir(&a.join("x/z"), false).unwrap().is_none());
        assert!(b.join("quarantine/y.reason").is_file());
        assert!(a.join("quarantine/x.reason").is_file());
        assert!(inner.parent(&b.join("y/f"), true).unwrap().is_some());
        assert!(std::fs::symlink_metadata(b.join("y")).unwrap().is_dir());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // The inner home is beneath the outer one, not the other way round.
        assert!(outer.relative(&b.join("y")).is_ok());
        assert!(inner.relative(&a.join("x")).is_err());
    }

    #[test]
    fn a_root_sets_aside_through_its_own_walk_never_through_a_linked_quarantine() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let root = Root::new(&home, &home.join("q/quarantine"));
        symlink(&outside, home.join("q")).unwrap();
        symlink(&outside, home.join("x")).unwrap();
        let err = root.open_dir(&home.join("x/y"), false).unwrap_err();
        assert!(err.to_string().contains("cannot set aside"), "{err}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }
}
