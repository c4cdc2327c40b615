//! How `setup` reaches, reads and replaces the files it edits, none of which it owns.
//!
//! A project's files are shared through its repository, so a link there is whatever the
//! checkout says (`.mcp.json -> ../../.claude.json` would copy the user's secrets into a file
//! meant to be committed): below the project directory nothing is followed, and nothing but a
//! regular file is opened (a FIFO would hang setup, a device would feed it for ever). The same
//! holds below the waitpoint home. In the user's own directory a link is the user's (dotfile
//! managers make them): it is followed to its end, said, and used only when it ends at the
//! user's own regular file (or directory). Every read is capped.
//!
//! A file is replaced atomically, with its mode, and only if it still holds what the plan was
//! made from: a harness rewrites its files while it runs, and a merge over an older text would
//! undo its write. The check is made right before the swap, and the swap itself exchanges the
//! two files, so a write that slipped in between is found in what was swapped out and put back.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use rand::Rng;
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::{Place, Unmergeable};

/// The largest file setup reads (Claude Code's `~/.claude.json` keeps every project's history
/// and grows to megabytes; a file past this is not a configuration file).
pub const MAX_FILE_BYTES: u64 = 32 << 20;

/// How a file of the plan may be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Beneath a project: no link followed, regular files only; new files as the umask says.
    Project,
    /// Beneath the user's home directory: a link followed only to the user's own regular file
    /// or directory, and said; new files and directories private.
    User,
    /// Beneath the waitpoint home: as a project, new files and directories private.
    Home,
}

/// A file of the plan as found: its text (`None`: absent) and where to put the new one.
#[derive(Debug)]
pub struct Found {
    pub text: Option<String>,
    /// What the user is told about how the file was reached: the link it is, where it ends.
    pub note: Option<String>,
    access: Access,
    /// The deepest directory that exists, held open, and its path (for messages).
    dir: Option<OwnedFd>,
    dir_path: PathBuf,
    /// The directories to make beneath it, then the file's name.
    missing: Vec<OsString>,
    name: OsString,
    /// The path as the plan names it (for messages).
    path: PathBuf,
    mode: Option<u32>,
    bytes: Option<Vec<u8>>,
}

/// What [`Found::replace`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The new text is in place.
    Done,
    /// The file no longer held what it was read with, so nothing was written: read it again.
    Changed,
}

const READ: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);
const OPEN_DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn kind_name(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of an unknown kind",
    }
}

fn io_err(path: &Path, what: &str, e: impl Into<io::Error>) -> Unmergeable {
    Unmergeable {
        path: path.to_owned(),
        reason: format!("cannot {what}: {}", e.into()),
        fix: "check its permissions, then run setup again".into(),
    }
}

fn refuse(path: &Path, reason: String, fix: impl Into<String>) -> Unmergeable {
    Unmergeable {
        path: path.to_owned(),
        reason,
        fix: fix.into(),
    }
}

/// Reads `place` as its access allows.
pub fn read(place: &Place) -> Result<Found, Unmergeable> {
    let rel = place.path.strip_prefix(&place.root).unwrap_or(&place.path);
    let mut parts: Vec<OsString> = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_owned()),
            Component::CurDir => {}
            _ => {
                return Err(refuse(
                    &place.path,
                    "is not a path beneath its directory".into(),
                    "report this as a bug",
                ));
            }
        }
    }
    let name = parts.pop().expect("a file name");
    let mut found = Found {
        text: None,
        note: None,
        access: place.access,
        dir: None,
        dir_path: place.root.clone(),
        missing: Vec::new(),
        name,
        path: place.path.clone(),
        mode: None,
        bytes: None,
    };
    // The root is the user's to name: it is followed as it is.
    match rustix::fs::openat(CWD, &place.root, OPEN_DIR - OFlags::NOFOLLOW, Mode::empty()) {
        Ok(fd) => found.dir = Some(fd),
        Err(Errno::NOENT) if place.access == Access::Home => {
            found.missing = parts;
            return Ok(found);
        }
        Err(e) => return Err(io_err(&place.root, "open the directory", e)),
    }
    let mut parts = parts.into_iter();
    while let Some(part) = parts.next() {
        let dir = found.dir.as_ref().expect("opened");
        match rustix::fs::openat(dir, part.as_os_str(), OPEN_DIR, Mode::empty()) {
            Ok(fd) => {
                found.dir = Some(fd);
                found.dir_path.push(&part);
            }
            Err(Errno::NOENT) => {
                found.missing.push(part);
                found.missing.extend(parts);
                return Ok(found);
            }
            Err(Errno::LOOP | Errno::NOTDIR) => {
                let at = found.dir_path.join(&part);
                let is_link = matches!(kind_at(dir, &part), Ok(Some(FileType::Symlink)));
                if !is_link {
                    return Err(refuse(
                        &at,
                        "is not a directory".into(),
                        "move it away, then run setup again",
                    ));
                }
                if found.access != Access::User {
                    return Err(link_refused(dir, &part, &at, place.access));
                }
                let end = own_link_end(dir, &part, &at, FileType::Directory)?;
                let fd = rustix::fs::openat(CWD, &end, OPEN_DIR, Mode::empty())
                    .map_err(|e| io_err(&end, "open the directory", e))?;
                found.note = Some(format!(
                    "{} is a link to {}, your own directory: setup edits the files there",
                    at.display(),
                    end.display()
                ));
                found.dir = Some(fd);
                found.dir_path = end;
            }
            Err(e) => return Err(io_err(&found.dir_path.join(&part), "open", e)),
        }
    }
    let dir = found.dir.as_ref().expect("opened");
    match kind_at(dir, &found.name).map_err(|e| io_err(&found.path, "inspect", e))? {
        None => return Ok(found),
        Some(FileType::Symlink) => {
            let at = found.dir_path.join(&found.name);
            if found.access != Access::User {
                return Err(link_refused(dir, &found.name, &at, place.access));
            }
            let end = own_link_end(dir, &found.name, &at, FileType::RegularFile)?;
            let parent = end.parent().expect("a canonical file has a parent");
            let fd = rustix::fs::openat(CWD, parent, OPEN_DIR, Mode::empty())
                .map_err(|e| io_err(parent, "open the directory", e))?;
            found.note = Some(format!(
                "{} is a link to {}, your own regular file: setup edits it there",
                at.display(),
                end.display()
            ));
            found.dir = Some(fd);
            found.dir_path = parent.to_owned();
            found.name = end.file_name().expect("a file name").to_owned();
        }
        Some(_) => {}
    }
    let dir = found.dir.as_ref().expect("opened");
    let at = found.dir_path.join(&found.name);
    let Some((bytes, mode)) = read_regular(dir, &found.name, &at, found.access)? else {
        return Ok(found);
    };
    let text = String::from_utf8(bytes.clone()).map_err(|_| {
        refuse(
            &found.path,
            "is not UTF-8 text".into(),
            "fix or move it, then run setup again",
        )
    })?;
    found.text = Some(text);
    found.bytes = Some(bytes);
    found.mode = Some(mode);
    Ok(found)
}

/// What `name` in `dir` is, not following a link; `None` when absent.
fn kind_at(dir: &OwnedFd, name: &OsStr) -> io::Result<Option<FileType>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn link_target(dir: &OwnedFd, name: &OsStr) -> String {
    rustix::fs::readlinkat(dir, name, Vec::new())
        .map(|t| {
            OsStr::from_bytes(t.as_bytes())
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_else(|_| "?".into())
}

fn link_refused(dir: &OwnedFd, name: &OsStr, at: &Path, access: Access) -> Unmergeable {
    let target = link_target(dir, name);
    let (where_, fix) = match access {
        Access::Project => (
            "a project",
            format!(
                "a link in a project is whatever the checkout says; replace it with a regular \
                 file (or directory) of the project's own, or configure by hand: rm {} and run \
                 setup again",
                at.display()
            ),
        ),
        _ => (
            "the waitpoint home",
            format!("rm {} (setup then makes a regular file)", at.display()),
        ),
    };
    refuse(
        at,
        format!("is a symbolic link (to {target}), and setup never follows a link in {where_}"),
        fix,
    )
}

/// Where the link `name` in `dir` (at path `at`) ends, if that is the user's own `want` (a
/// regular file or a directory); refused otherwise, saying where it points.
fn own_link_end(
    dir: &OwnedFd,
    name: &OsStr,
    at: &Path,
    want: FileType,
) -> Result<PathBuf, Unmergeable> {
    let target = link_target(dir, name);
    let what = kind_name(want);
    let fix = format!(
        "point the link at {what} of your own, or replace it with one (cp --remove-destination \
         \"$(readlink -f {0})\" {0}), then run setup again",
        at.display()
    );
    let end = match std::fs::canonicalize(at) {
        Ok(end) => end,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(refuse(
                at,
                format!("is a symbolic link to {target}, which does not exist"),
                fix,
            ));
        }
        Err(e) => return Err(io_err(at, "follow the link", e)),
    };
    let st = rustix::fs::statat(CWD, &end, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| io_err(&end, "inspect", e))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != want || st.st_uid != euid() {
        let whose = if st.st_uid == euid() {
            "yours"
        } else {
            "not yours"
        };
        return Err(refuse(
            at,
            format!(
                "is a symbolic link to {target} ({}: {}, {whose}); setup writes through a link \
                 only to {what} of your own",
                end.display(),
                kind_name(kind),
            ),
            fix,
        ));
    }
    Ok(end)
}

/// The bytes and mode of the regular file `name` in `dir` (`None`: absent), opened without
/// following a link or blocking, read up to [`MAX_FILE_BYTES`]; anything but a regular file (or,
/// in the user's directory, one that is not the user's) is refused without being opened.
fn read_regular(
    dir: &OwnedFd,
    name: &OsStr,
    at: &Path,
    access: Access,
) -> Result<Option<(Vec<u8>, u32)>, Unmergeable> {
    let kind = match kind_at(dir, name).map_err(|e| io_err(at, "inspect", e))? {
        None => return Ok(None),
        Some(k) => k,
    };
    let not_regular = |kind: FileType| {
        refuse(
            at,
            format!(
                "is {}, not a regular file; setup reads and writes regular files only",
                kind_name(kind)
            ),
            format!(
                "move it away (mv {0} {0}.moved), then run setup again",
                at.display()
            ),
        )
    };
    if kind == FileType::Symlink {
        return Err(link_refused(dir, name, at, Access::Project));
    }
    if kind != FileType::RegularFile {
        return Err(not_regular(kind));
    }
    let fd = match rustix::fs::openat(dir, name, READ, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io_err(at, "open", e)),
    };
    // Swapped between the look and the open: what was opened is what counts.
    let st = rustix::fs::fstat(&fd).map_err(|e| io_err(at, "inspect", e))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(not_regular(kind));
    }
    if access == Access::User && st.st_uid != euid() {
        return Err(refuse(
            at,
            format!("is owned by uid {}, not by you (uid {})", st.st_uid, euid()),
            format!("chown $(id -u) {}, then run setup again", at.display()),
        ));
    }
    let mut bytes = Vec::new();
    File::from(fd)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err(at, "read", e))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(refuse(
            at,
            format!(
                "is larger than {} MiB, too large for a configuration file",
                MAX_FILE_BYTES >> 20
            ),
            "move it away, then run setup again",
        ));
    }
    Ok(Some((bytes, st.st_mode & 0o7777)))
}

impl Found {
    /// Replaces the file with `after`, keeping its mode (a new file: private in the user's
    /// directory and the home, as the umask says in a project), if it still holds what it was
    /// read with; [`Written::Changed`] (nothing written) otherwise.
    pub fn replace(&self, after: &str) -> Result<Written, Unmergeable> {
        let dir = self.make_dirs()?;
        let at = self.dir_path.join(self.missing.iter().collect::<PathBuf>());
        let target = at.join(&self.name);
        let tag: u64 = rand::rng().next_u64();
        let mut temp = OsString::from(".");
        temp.push(&self.name);
        temp.push(format!(".waitpoint-{tag:016x}.tmp"));
        let new_mode = match self.access {
            Access::Project => 0o666,
            Access::User | Access::Home => 0o600,
        };
        let fd = rustix::fs::openat(
            &dir,
            temp.as_os_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(self.mode.unwrap_or(new_mode)),
        )
        .map_err(|e| io_err(&at.join(&temp), "create", e))?;
        let temp_at = at.join(&temp);
        let result = self.swap_in(&dir, fd, &temp, &temp_at, &target, after);
        if !matches!(result, Ok(Written::Done)) {
            let _ = rustix::fs::unlinkat(&dir, temp.as_os_str(), AtFlags::empty());
        }
        result
    }

    fn swap_in(
        &self,
        dir: &OwnedFd,
        fd: OwnedFd,
        temp: &OsStr,
        temp_at: &Path,
        target: &Path,
        after: &str,
    ) -> Result<Written, Unmergeable> {
        if let Some(mode) = self.mode {
            // The umask narrowed the mode the file was made with: the old file's is kept.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
                .map_err(|e| io_err(temp_at, "set the mode of", e))?;
        }
        let ours = rustix::fs::fstat(&fd)
            .map_err(|e| io_err(temp_at, "inspect", e))?
            .st_ino;
        let mut file = File::from(fd);
        file.write_all(after.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| io_err(temp_at, "write", e))?;
        drop(file);
        let now = read_regular(dir, &self.name, target, Access::Project)?.map(|(b, _)| b);
        if now != self.bytes {
            return Ok(Written::Changed);
        }
        let name = self.name.as_os_str();
        if self.bytes.is_none() {
            match rustix::fs::renameat_with(dir, temp, dir, name, RenameFlags::NOREPLACE) {
                Ok(()) => {}
                Err(Errno::EXIST) => return Ok(Written::Changed),
                Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                    rustix::fs::renameat(dir, temp, dir, name)
                        .map_err(|e| io_err(target, "rename into", e))?;
                }
                Err(e) => return Err(io_err(target, "rename into", e)),
            }
        } else {
            match rustix::fs::renameat_with(dir, temp, dir, name, RenameFlags::EXCHANGE) {
                Ok(()) => {
                    // What was swapped out must be what the plan was made from; if a write
                    // slipped in since the check, it is put back and the merge made again.
                    let out = read_regular(dir, temp, temp_at, Access::Project)?.map(|(b, _)| b);
                    if out != self.bytes {
                        let still_ours = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                            .is_ok_and(|st| st.st_ino == ours);
                        if still_ours {
                            rustix::fs::renameat_with(dir, temp, dir, name, RenameFlags::EXCHANGE)
                                .map_err(|e| io_err(target, "put back", e))?;
                        }
                        return Ok(Written::Changed);
                    }
                    rustix::fs::unlinkat(dir, temp, AtFlags::empty())
                        .map_err(|e| io_err(temp_at, "remove", e))?;
                }
                Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                    rustix::fs::renameat(dir, temp, dir, name)
                        .map_err(|e| io_err(target, "rename into", e))?;
                }
                Err(e) => return Err(io_err(target, "rename into", e)),
            }
        }
        rustix::fs::fsync(dir).map_err(|e| io_err(&self.dir_path, "fsync", e))?;
        Ok(Written::Done)
    }

    /// The file's directory, made (and each directory on the way checked not to be a link)
    /// when missing.
    fn make_dirs(&self) -> Result<OwnedFd, Unmergeable> {
        let mode = match self.access {
            Access::Project => 0o777,
            Access::User | Access::Home => 0o700,
        };
        let mut dir = match &self.dir {
            Some(d) => d
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| io_err(&self.dir_path, "open", e))?,
            None => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&self.dir_path)
                    .map_err(|e| io_err(&self.dir_path, "create", e))?;
                rustix::fs::openat(
                    CWD,
                    &self.dir_path,
                    OPEN_DIR - OFlags::NOFOLLOW,
                    Mode::empty(),
                )
                .map_err(|e| io_err(&self.dir_path, "open", e))?
            }
        };
        let mut at = self.dir_path.clone();
        for part in &self.missing {
            at.push(part);
            match rustix::fs::mkdirat(&dir, part.as_os_str(), Mode::from_raw_mode(mode)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(io_err(&at, "create", e)),
            }
            dir = match rustix::fs::openat(&dir, part.as_os_str(), OPEN_DIR, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::LOOP | Errno::NOTDIR) => {
                    return Err(refuse(
                        &at,
                        "appeared as something other than a directory while setup ran".into(),
                        "run setup again",
                    ));
                }
                Err(e) => return Err(io_err(&at, "open", e)),
            };
        }
        Ok(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(root: &Path, rel: &str, access: Access) -> Place {
        Place {
            path: root.join(rel),
            root: root.to_owned(),
            access,
        }
    }

    #[test]
    fn a_file_changed_since_it_was_read_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let p = place(dir.path(), "sub/config.json", Access::Project);
        std::fs::create_dir_all(dir.path().join("sub")).unwrap();
        std::fs::write(&p.path, "{\"a\": 1}").unwrap();
        let found = read(&p).unwrap();
        assert_eq!(found.text.as_deref(), Some("{\"a\": 1}"));
        // Another writer gets in between the read and the write.
        std::fs::write(&p.path, "{\"a\": 2}").unwrap();
        assert_eq!(found.replace("{\"ours\": 1}").unwrap(), Written::Changed);
        assert_eq!(std::fs::read_to_string(&p.path).unwrap(), "{\"a\": 2}");
        // Made meanwhile where there was nothing: not replaced either.
        let q = place(dir.path(), "sub/new.json", Access::Project);
        let absent = read(&q).unwrap();
        std::fs::write(&q.path, "{}").unwrap();
        assert_eq!(absent.replace("{\"ours\": 1}").unwrap(), Written::Changed);
        assert_eq!(std::fs::read_to_string(&q.path).unwrap(), "{}");
        // Unchanged: replaced, and no temp file is left.
        let found = read(&p).unwrap();
        assert_eq!(found.replace("{\"ours\": 1}").unwrap(), Written::Done);
        assert_eq!(std::fs::read_to_string(&p.path).unwrap(), "{\"ours\": 1}");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
