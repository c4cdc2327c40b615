//! [`Dir`]: a directory of the home held open, and every file operation done relative to it.
//!
//! A path is resolved anew each time it is used, so a directory swapped for a symbolic link
//! between a check and a use sends the use elsewhere. A handle is resolved once: what is listed,
//! opened, renamed or removed through it stays in the directory that was checked, whatever
//! happens to the path meanwhile. Every step below the home's root is opened without following
//! a link (the root itself may be one the user made, `~/.cortex -> /data/cortex`).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::durable::{DIR_MODE, FILE_MODE, Root, TEMP_PREFIX, TEMP_SUFFIX};
use crate::error::{Error, Result};

/// A directory of the home, held open: opened without following a symlink and checked to be
/// a real directory that this user owns and nobody else can write. Names are then looked up
/// relative to the handle, never by re-resolving the path, so a directory swapped for a
/// symlink afterwards does not send a read, a removal or a rename outside the home.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Every name in the directory held open as `fd` (`path` names it in errors): listed through
/// `/proc/self/fd/N`, which is the open directory itself, not a path resolved again.
pub fn names_of(fd: &impl AsRawFd, path: &Path) -> Result<Vec<OsString>> {
    let via = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let entries = std::fs::read_dir(&via).map_err(|e| Error::io("cannot list", path, e))?;
    entries
        .map(|e| {
            e.map(|e| e.file_name())
                .map_err(|e| Error::io("cannot list", path, e))
        })
        .collect()
}

/// What [`Dir::rewrite_in_place`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// The new content is in place, written over the spare.
    Done,
    /// There is no spare (any more): the old file may become it.
    NoSpare,
    /// The spare is there but could not be used now (resting, or held by a reader).
    SpareBusy,
}

/// What a name in a [`Dir`] is, looked at without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Symlink,
    /// A regular file: its link count, size and modification time.
    File {
        links: u64,
        len: u64,
        modified: SystemTime,
    },
    Dir,
    /// A FIFO, a socket or a device.
    Other,
}

const OPEN_DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl Dir {
    /// Opens `rel` beneath `root`: the root as the user made it (it may be a link), then each
    /// component of `rel` through the one before it, none followed if it is a link, each
    /// checked: a symlink, a non-directory, or a directory another user owns or others can write
    /// is refused ([`Error::Insecure`]). A directory of the home swapped for a link, at
    /// any depth, is refused rather than followed. Missing components are an `Io` error whose
    /// [`Error::is_not_found`] is true.
    pub fn open_beneath(root: &Root, rel: &Path) -> Result<Dir> {
        let root = root.path();
        // Only the root may be a link: O_NOFOLLOW is left out for it alone.
        let fd = rustix::fs::openat(CWD, root, OPEN_DIR - OFlags::NOFOLLOW, Mode::empty());
        let mut dir = Self::checked(fd, root, || false)?;
        for part in rel.components() {
            match part {
                Component::Normal(name) => dir = dir.child(name)?,
                Component::CurDir => {}
                _ => {
                    return Err(Error::io(
                        "not a path beneath the home",
                        root.join(rel),
                        io::Error::from(io::ErrorKind::InvalidInput),
                    ));
                }
            }
        }
        Ok(dir)
    }

    /// Like [`Dir::open_beneath`], making missing components (mode 0700) on the way.
    pub fn make_beneath(root: &Root, rel: &Path) -> Result<Dir> {
        match Self::open_beneath(root, rel) {
            Err(e) if e.is_not_found() => {
                root.create_dir_private(&root.path().join(rel))?;
                Self::open_beneath(root, rel)
            }
            other => other,
        }
    }

    /// `path` reached as every directory of a home is reached (`beneath.rs`: from the held
    /// `root`, no link followed), made when missing. Unlike [`Dir::open_beneath`] it checks no
    /// owner or mode: it is for the engine's own directories, which the daemon checked as it
    /// started.
    pub fn reach(root: &Root, path: &Path) -> Result<Dir> {
        let fd = root.open_dir(path, true)?.ok_or_else(|| {
            Error::io(
                "cannot open",
                path,
                io::Error::from(io::ErrorKind::NotFound),
            )
        })?;
        Ok(Dir {
            fd,
            path: path.to_owned(),
        })
    }

    /// The directory `name` inside this one, not followed if it is a link, checked.
    pub fn child(&self, name: &OsStr) -> Result<Dir> {
        let path = self.path.join(name);
        let fd = rustix::fs::openat(&self.fd, self.plain(name)?, OPEN_DIR, Mode::empty());
        Self::checked(fd, &path, || {
            matches!(self.entry(name), Ok(Some(Kind::Symlink)))
        })
    }

    /// The directory `name` inside this one, made (mode 0700) when missing.
    pub fn child_or_make(&self, name: &str) -> Result<Dir> {
        let os = OsStr::new(name);
        match rustix::fs::mkdirat(&self.fd, self.plain(os)?, Mode::from_raw_mode(DIR_MODE)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(Error::io(
                    "cannot create directory",
                    self.path.join(name),
                    e.into(),
                ));
            }
        }
        self.child(os)
    }

    fn checked(
        fd: rustix::io::Result<OwnedFd>,
        path: &Path,
        is_link: impl Fn() -> bool,
    ) -> Result<Dir> {
        let insecure = |message: String| Error::Insecure {
            path: path.to_owned(),
            message,
        };
        let fd = fd.map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR if is_link() => insecure(format!(
                "is a symbolic link; the home's directories must be real ones; fix: rm {} \
                 (the daemon makes the directory)",
                path.display()
            )),
            Errno::NOTDIR => insecure("is not a directory".into()),
            e => Error::io("cannot open", path, e.into()),
        })?;
        let dir = Dir {
            fd,
            path: path.to_owned(),
        };
        let meta = dir
            .file()
            .and_then(|f| f.metadata())
            .map_err(|e| Error::io("cannot inspect", path, e))?;
        let euid = rustix::process::geteuid().as_raw();
        if meta.uid() != euid {
            return Err(insecure(format!(
                "owned by uid {}, not by this user (uid {euid}); fix: chown -R {euid} {}",
                meta.uid(),
                path.display()
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(insecure(format!(
                "mode {:04o} lets other users write here; fix: chmod go-w {}",
                meta.mode() & 0o7777,
                path.display()
            )));
        }
        Ok(dir)
    }

    /// A second handle on the same open directory (a `dup`), for work handed to another
    /// thread; the directory is not looked up again.
    pub fn try_clone(&self) -> Result<Dir> {
        let fd = self
            .fd
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::io("cannot duplicate the handle of", &self.path, e))?;
        Ok(Dir {
            fd,
            path: self.path.clone(),
        })
    }

    /// The path this directory was opened at (for messages; never used to reach it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A duplicate of the handle as a `File`. Duplicating takes a descriptor, so it fails with
    /// EMFILE when the process is out of them: an error for the caller, never a panic.
    fn file(&self) -> io::Result<File> {
        self.fd.as_fd().try_clone_to_owned().map(File::from)
    }

    /// `name` if it names an entry of this directory itself: not empty, `.`, `..`, a path or
    /// anything with a NUL.
    fn plain<'a>(&self, name: &'a OsStr) -> Result<&'a OsStr> {
        let b = name.as_bytes();
        if !b.is_empty() && !b.contains(&b'/') && !b.contains(&0) && b != b"." && b != b".." {
            Ok(name)
        } else {
            Err(Error::io(
                "not a plain name in",
                self.path.join(name),
                io::Error::from(io::ErrorKind::InvalidInput),
            ))
        }
    }

    /// The names in the directory that are UTF-8, read through the handle.
    pub fn names(&self) -> Result<Vec<String>> {
        Ok(self
            .raw_names()?
            .into_iter()
            .filter_map(|n| n.into_string().ok())
            .collect())
    }

    /// Every name in the directory, UTF-8 or not, read through the handle.
    pub fn raw_names(&self) -> Result<Vec<OsString>> {
        names_of(&self.fd, &self.path)
    }

    /// What `name` is, without following it; `None` when there is no such name.
    pub fn entry(&self, name: &OsStr) -> io::Result<Option<Kind>> {
        let name = self.plain(name).map_err(|_| invalid())?;
        let st = match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(Some(match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => Kind::Symlink,
            FileType::RegularFile => Kind::File {
                links: st.st_nlink as u64,
                len: st.st_size.max(0) as u64,
                modified: UNIX_EPOCH
                    + Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec as u32),
            },
            FileType::Directory => Kind::Dir,
            _ => Kind::Other,
        }))
    }

    /// Opens `name` for reading: never following a link, never blocking on a FIFO.
    pub fn open_read(&self, name: &OsStr) -> io::Result<File> {
        let name = self.plain(name).map_err(|_| invalid())?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        Ok(File::from(rustix::fs::openat(
            &self.fd,
            name,
            flags,
            Mode::empty(),
        )?))
    }

    /// Removes `name` from this directory (never following anything). Gone already is fine.
    pub fn unlink(&self, name: &str) -> Result<()> {
        self.unlink_raw(OsStr::new(name))
    }

    /// [`Dir::unlink`] for any name, UTF-8 or not.
    pub fn unlink_raw(&self, name: &OsStr) -> Result<()> {
        match rustix::fs::unlinkat(&self.fd, self.plain(name)?, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(Error::io("cannot remove", self.path.join(name), e.into())),
        }
    }

    /// Removes `name` and makes the removal durable.
    pub fn unlink_durably(&self, name: &OsStr) -> Result<()> {
        self.unlink_raw(name)?;
        self.sync()
    }

    /// Moves `name` of this directory to `to_name` in `to`, both through their handles.
    pub fn rename_to(&self, name: &OsStr, to: &Dir, to_name: &str) -> io::Result<()> {
        let from = self.plain(name).map_err(|_| invalid())?;
        let dest = to.plain(OsStr::new(to_name)).map_err(|_| invalid())?;
        Ok(rustix::fs::renameat(&self.fd, from, &to.fd, dest)?)
    }

    /// [`Dir::rename_to`], made durable in both directories.
    pub fn rename_durably(&self, name: &OsStr, to: &Dir, to_name: &str) -> Result<()> {
        self.rename_to(name, to, to_name)
            .map_err(|e| Error::io("cannot move", self.path.join(name), e))?;
        to.sync()?;
        self.sync()
    }

    /// fsyncs the directory, so renames and removals in it are durable.
    pub fn sync(&self) -> Result<()> {
        rustix::fs::fsync(&self.fd)
            .map_err(|e| Error::io("cannot fsync directory", &self.path, e.into()))
    }

    /// A new temp file for `name` made here (never following a link): its name and the file.
    fn create_temp(&self, name: &str) -> Result<(String, File)> {
        let tag: u64 = rand::rng().next_u64();
        let temp = format!("{TEMP_PREFIX}{name}.{tag:016x}{TEMP_SUFFIX}");
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(
            &self.fd,
            self.plain(OsStr::new(&temp))?,
            flags,
            Mode::from_raw_mode(FILE_MODE),
        )
        .map_err(|e| Error::io("cannot create", self.path.join(&temp), e.into()))?;
        Ok((temp, File::from(fd)))
    }

    /// Writes `name` atomically and durably through the handle, its content from `fill`: a
    /// temp file made here (never following a link), fsynced, renamed over `name`, and the
    /// directory fsynced. On any error the temp file is removed and `name` is untouched.
    pub fn commit_with(
        &self,
        name: &str,
        fill: impl FnOnce(&mut File) -> io::Result<()>,
    ) -> Result<()> {
        let (temp, mut file) = self.create_temp(name)?;
        let result = fill(&mut file)
            .map_err(|e| Error::io("cannot write", self.path.join(name), e))
            .and_then(|()| {
                file.sync_all()
                    .map_err(|e| Error::io("cannot fsync", self.path.join(name), e))
            })
            .and_then(|()| {
                self.rename_to(OsStr::new(&temp), self, name)
                    .map_err(|e| Error::io("cannot rename", self.path.join(name), e))
            })
            .and_then(|()| self.sync());
        if result.is_err() {
            let _ = self.unlink(&temp);
        }
        result
    }

    /// Writes `name` atomically but without any fsync: a temp file made here (never following
    /// a link) and filled, then put in place by `place` (given this directory and the temp
    /// file's name). On any error the temp file is removed. For files a journal line made
    /// durable already (`durable::Unsynced`).
    pub fn write_unsynced(
        &self,
        name: &str,
        bytes: &[u8],
        place: impl FnOnce(&Dir, &str) -> Result<()>,
    ) -> Result<()> {
        let (temp, file) = self.create_temp(name)?;
        let result = (|| {
            crate::failpoint!(
                crate::failpoint::STORE_WRITE,
                "cannot write",
                &self.path.join(&temp)
            );
            let mut file = file;
            file.write_all(bytes)
                .map_err(|e| Error::io("cannot write", self.path.join(&temp), e))?;
            place(self, &temp)
        })();
        if result.is_err() {
            let _ = self.unlink(&temp);
        }
        result
    }

    /// Appends `bytes` to `name` (made, mode 0600, when missing; never following a link) in
    /// one `write`, without fsync. Only ever onto a regular file, as [`Dir::open_regular`] opens.
    pub fn append(&self, root: &Root, name: &str, bytes: &[u8]) -> Result<()> {
        let flags = OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE;
        let mut file = self.open_regular(root, name, flags)?;
        let path = self.path.join(name);
        crate::failpoint!(crate::failpoint::STORE_WRITE, "cannot write", &path);
        file.write_all(bytes)
            .map_err(|e| Error::io("cannot append to", path, e))
    }

    /// Opens `name` with `flags` (which may make it, mode 0600), never following a link and
    /// never blocking, and only ever as a regular file: a link, a FIFO or a directory standing
    /// under the name is set aside into `root`'s quarantine ([`Root::set_aside`], with a
    /// reason) and the open tried again, so what was planted there costs only itself.
    pub fn open_regular(&self, root: &Root, name: &str, flags: OFlags) -> Result<File> {
        let path = || self.path.join(name);
        let flags = flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let plain = self.plain(OsStr::new(name))?;
        for _ in 0..3 {
            let opened = rustix::fs::openat(&self.fd, plain, flags, Mode::from_raw_mode(FILE_MODE))
                .map(File::from);
            match opened {
                Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => return Ok(f),
                // A link (`ELOOP`), a directory (`EISDIR`) or a FIFO no one reads (`ENXIO`).
                Ok(_) | Err(Errno::LOOP | Errno::ISDIR | Errno::NXIO) => {
                    root.set_aside(&path(), "is not a regular file where the home keeps one")?;
                }
                Err(e) => return Err(Error::io("cannot open", path(), e.into())),
            }
        }
        Err(Error::io(
            "cannot open",
            path(),
            io::Error::other("it keeps changing while being opened"),
        ))
    }

    /// Rewrites `name` without making or freeing a file: `bytes` go over the file `spare` (in
    /// this directory) in place, under an exclusive `flock`, and then the two names are
    /// exchanged (`RENAME_EXCHANGE`), so the old content becomes the next spare. Nothing is
    /// fsynced (as [`Dir::write_unsynced`]).
    ///
    /// Making a file is most of what writing a small one costs on ext4, and more so right after
    /// files were freed: the allocator steps over every inode freed in the last minute. A state
    /// rewritten for each signal made one and freed one.
    ///
    /// The spare was `name` until the write before, and a reader may still hold it. The
    /// engine's readers take a shared `flock` (`read::settled`) and the writer never writes
    /// over a spare one holds. A reader that does not lock (`jq` in a terminal) is kept safe
    /// by `rest`: a spare is written over only once that long has passed since it stopped
    /// being `name` (its ctime, which the exchange sets), far longer than reading a state
    /// takes.
    ///
    /// Says what it did; when the spare was not used nothing under `name` changed: there is
    /// no spare yet, or it has not rested, or a reader holds it. A spare that is not a plain
    /// file of this user with one link (a link, a FIFO, a hard link to a file elsewhere) is set
    /// aside with a reason first, so nothing outside the home is ever written through it.
    pub fn rewrite_in_place(
        &self,
        root: &Root,
        name: &str,
        spare: &str,
        bytes: &[u8],
        rest: Duration,
    ) -> Result<Rewrite> {
        use rustix::fs::FlockOperation;
        use std::os::unix::fs::FileExt;
        let spare_path = || self.path.join(spare);
        let plain = self.plain(OsStr::new(spare))?;
        let rested = |ctime: i64, nsec: i64| {
            let out_of_use = UNIX_EPOCH + Duration::new(ctime as u64, nsec as u32);
            SystemTime::now()
                .duration_since(out_of_use)
                .is_ok_and(|r| r >= rest)
        };
        // A look first, which costs no open: a waitpoint rewritten batch after batch finds
        // its spare resting every time.
        match rustix::fs::statat(&self.fd, plain, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => return Ok(Rewrite::NoSpare),
            Ok(st)
                if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                    && !rested(st.st_ctime, st.st_ctime_nsec as i64) =>
            {
                return Ok(Rewrite::SpareBusy);
            }
            _ => {}
        }
        let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let file = match rustix::fs::openat(&self.fd, plain, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::NOENT) => return Ok(Rewrite::NoSpare),
            Err(Errno::LOOP | Errno::ISDIR | Errno::NXIO) => {
                root.set_aside(&spare_path(), "is not a regular file")?;
                return Ok(Rewrite::NoSpare);
            }
            Err(e) => return Err(Error::io("cannot open", spare_path(), e.into())),
        };
        // What was opened decides, not what was looked at before.
        let meta = file
            .metadata()
            .map_err(|e| Error::io("cannot inspect", spare_path(), e))?;
        let euid = rustix::process::geteuid().as_raw();
        if !meta.is_file() || meta.nlink() != 1 || meta.uid() != euid {
            drop(file);
            root.set_aside(
                &spare_path(),
                "is not a regular file of this user with one link, as a spare must be",
            )?;
            return Ok(Rewrite::NoSpare);
        }
        if !rested(meta.ctime(), meta.ctime_nsec()) {
            return Ok(Rewrite::SpareBusy);
        }
        if rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            return Ok(Rewrite::SpareBusy);
        }
        crate::failpoint!(crate::failpoint::STORE_WRITE, "cannot write", &spare_path());
        // Written over, then cut to length: never cut to nothing first, which would free the
        // file's block (a wait for the device under `discard`) only to take one again.
        file.write_all_at(bytes, 0)
            .and_then(|()| file.set_len(bytes.len() as u64))
            .map_err(|e| Error::io("cannot write", spare_path(), e))?;
        // Complete: the lock has done its work (a reader that locks it from now on reads the
        // new content whole), so it ends before the exchange makes the file visible.
        drop(file);
        crate::failpoint!(
            crate::failpoint::STORE_RENAME,
            "cannot rename",
            &self.path.join(name)
        );
        match self.rename_within(spare, name, true) {
            Ok(()) => Ok(Rewrite::Done),
            // No file under `name` (the first write, or one removed): the spare becomes it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => self
                .rename_within(spare, name, false)
                .map(|()| Rewrite::Done)
                .map_err(|e| Error::io("cannot rename", self.path.join(name), e)),
            // A filesystem that cannot exchange names: the caller writes a new file instead.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => Ok(Rewrite::SpareBusy),
            Err(e) => Err(Error::io("cannot rename", self.path.join(name), e)),
        }
    }

    /// Moves `temp` (in this directory) to `spare`'s name if no file has it yet; `false` when
    /// one has (the caller disposes of `temp` otherwise).
    pub fn keep_as_spare(&self, temp: &str, spare: &str) -> io::Result<bool> {
        match self.rename_flags(temp, spare, rustix::fs::RenameFlags::NOREPLACE) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Renames `from` to `to` within this directory; `exchange` swaps the two names
    /// atomically instead (`RENAME_EXCHANGE`: both must exist).
    pub fn rename_within(&self, from: &str, to: &str, exchange: bool) -> io::Result<()> {
        let flags = match exchange {
            true => rustix::fs::RenameFlags::EXCHANGE,
            false => rustix::fs::RenameFlags::empty(),
        };
        self.rename_flags(from, to, flags)
    }

    fn rename_flags(&self, from: &str, to: &str, flags: rustix::fs::RenameFlags) -> io::Result<()> {
        let from = self.plain(OsStr::new(from)).map_err(|_| invalid())?;
        let to = self.plain(OsStr::new(to)).map_err(|_| invalid())?;
        Ok(rustix::fs::renameat_with(
            &self.fd, from, &self.fd, to, flags,
        )?)
    }

    /// [`Dir::commit_with`] for bytes in hand.
    pub fn commit(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.commit_with(name, |f| f.write_all(bytes))
    }
}

fn invalid() -> io::Error {
    io::Error::from(io::ErrorKind::InvalidInput)
}
