//! Reading records: JSON files read whole, and records met while listing many, reached beneath
//! the home without following links, bounded in size, and set aside into `quarantine/` with a
//! reason when they are not what they should be.

use super::beneath::{Place, Root};
use super::path::{create_dir_private_in, exists_in, open_read_in, rename_durably_in};
use super::synced::commit_in;
use super::{Dir, Kind};
use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Reads one record of a collection (a waitpoint, timer, callback or wake among many): a file
/// that does not parse is set aside into `root`'s quarantine with its reason and skipped (`None`),
/// so one bad record stops nothing else. If even setting it aside fails, it is skipped all the
/// same, and the log says why.
///
/// The record is reached from `root` one directory at a time, none followed if it is a link,
/// and read only if it is a regular file of at most [`MAX_RECORD_BYTES`]: a record (or the
/// directory holding it) that is a link, a FIFO or huge is set aside the same way, unread, so
/// nothing outside the home is read and nothing blocks or fills memory.
pub fn read_json_or_set_aside<T: DeserializeOwned>(root: &Root, path: &Path) -> Result<Option<T>> {
    let (culprit, message) = match read_record_bytes(root, path)? {
        Ok(None) => return Ok(None),
        Ok(Some(b)) => match serde_json::from_slice(&b) {
            Ok(record) => return Ok(Some(record)),
            Err(e) => (path.to_owned(), format!("does not parse: {e}")),
        },
        Err(refused) => refused,
    };
    match set_aside(root, &culprit, &message) {
        Ok(to) => tracing::warn!(
            file = %culprit.display(),
            quarantined = %to.display(),
            reason = %message,
            "a record that cannot be read was set aside"
        ),
        Err(e) => tracing::error!(
            file = %culprit.display(),
            reason = %message,
            error = %e,
            "a record that cannot be read is skipped, and could not be set aside"
        ),
    }
    Ok(None)
}

/// The largest record [`read_json_or_set_aside`] reads.
pub const MAX_RECORD_BYTES: u64 = 16 << 20;

/// What to set aside instead of reading: the path (the record, or a directory on the way to
/// it that is a link) and why.
type Refused = (PathBuf, String);

/// The bytes of the record at `path` beneath `root` (see [`read_json_or_set_aside`]);
/// `None` when it does not exist.
pub fn read_record_bytes(
    root: &Root,
    path: &Path,
) -> Result<std::result::Result<Option<Vec<u8>>, Refused>> {
    // A path not beneath the root is refused, never read as given.
    let rel = root.relative(path)?;
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return root.read_capped(path, MAX_RECORD_BYTES).map(Ok);
    };
    // The common case in one call: the record opened beneath the root with no link followed
    // anywhere on the way (openat2's RESOLVE_NO_SYMLINKS). A link, a kernel without openat2, or
    // anything unusual takes the slow path below, which walks the directories one by one and
    // names the culprit.
    if let Some(bytes) = read_record_fast(root, rel)? {
        return Ok(bytes);
    }
    let dir = match Dir::open_beneath(root, parent) {
        Err(e) if e.is_not_found() => return Ok(Ok(None)),
        // A directory on the way swapped for a link: the link goes aside, not what it names.
        Err(Error::Insecure { path: p, message })
            if fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) =>
        {
            return Ok(Err((p, message)));
        }
        other => other?,
    };
    let refuse = |message: String| Ok(Err((path.to_owned(), message)));
    match dir.entry(name) {
        Ok(None) => return Ok(Ok(None)),
        Ok(Some(Kind::File { len, .. })) if len > MAX_RECORD_BYTES => {
            return refuse(format!(
                "is {len} bytes, more than a record may be ({MAX_RECORD_BYTES})"
            ));
        }
        Ok(Some(Kind::File { .. })) => {}
        Ok(Some(Kind::Symlink)) => {
            return refuse("is a symbolic link; records must be real files".into());
        }
        Ok(Some(_)) => return refuse("is not a regular file".into()),
        Err(e) => return Err(Error::io("cannot inspect", path, e)),
    }
    let file = match dir
        .open_read(name)
        .and_then(|f| settled(f, || dir.open_read(name)))
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(None)),
        Err(e) => return Err(Error::io("cannot read", path, e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read", path, e))?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return refuse(format!(
            "grew past {MAX_RECORD_BYTES} bytes while being read"
        ));
    }
    Ok(Ok(Some(bytes)))
}

/// [`read_record_bytes`]'s one-call path: `None` when the slow path must decide.
#[allow(clippy::type_complexity)]
pub(super) fn read_record_fast(
    root: &Root,
    rel: &Path,
) -> Result<Option<std::result::Result<Option<Vec<u8>>, Refused>>> {
    // From the home's held root (no root opened, nor looked up, per record).
    // `Err(true)`: missing; `Err(false)`: the slow path must say why.
    let open = || match super::beneath::open_read_fast_in(root, rel) {
        Some(Ok(fd)) => Ok(File::from(fd)),
        Some(Err(e)) => Err(e.kind() == io::ErrorKind::NotFound),
        None => open_beneath_root(root.path(), rel).map(File::from),
    };
    let reopen = || open().map_err(|_| io::Error::from(io::ErrorKind::NotFound));
    let file = match open() {
        Ok(file) => file,
        Err(missing) => return Ok(missing.then_some(Ok(None))),
    };
    let Ok(file) = settled(file, reopen) else {
        return Ok(None);
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(_) => return Ok(None),
    };
    if !meta.is_file() || meta.len() > MAX_RECORD_BYTES {
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read", root.path().join(rel), e))?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Ok(None);
    }
    Ok(Some(Ok(Some(bytes))))
}

/// `rel` opened for reading beneath `root` (opened here afresh: the held one was removed since,
/// or cannot say in one call), no link
/// followed; `Err(true)` when it is missing, `Err(false)` when the slow path must say why.
fn open_beneath_root(root: &Path, rel: &Path) -> std::result::Result<std::os::fd::OwnedFd, bool> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let Ok(root_fd) = rustix::fs::openat(
        rustix::fs::CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Err(false);
    };
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH;
    match rustix::fs::openat2(&root_fd, rel, flags, Mode::empty(), resolve) {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::NOENT) => Err(true),
        // A link somewhere, no openat2, or something else: the slow path says which.
        Err(_) => Err(false),
    }
}

/// How many times a read opens a file again while the one it opened is being rewritten.
const SETTLE_TRIES: usize = 4;

/// `file`, just opened for reading, with a shared `flock` on it, so that a writer recycling it
/// as a spare (`Dir::rewrite_in_place`, which locks it exclusively and never waits) cannot
/// rewrite it under the read: the read sees one whole version. A file a writer holds is no
/// longer the one under its name (it was exchanged out and is being written over), so the name
/// is opened again with `reopen`; the file then under it is whole. A lock that stays held
/// (something other than a writer of ours), or a filesystem without `flock`, leaves the file
/// read as it is. The lock goes with the file.
fn settled(mut file: File, reopen: impl Fn() -> io::Result<File>) -> io::Result<File> {
    use rustix::fs::FlockOperation;
    for _ in 0..SETTLE_TRIES {
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockShared) {
            Err(rustix::io::Errno::WOULDBLOCK) => file = reopen()?,
            _ => return Ok(file),
        }
    }
    Ok(file)
}

/// What [`Root::read_capped`] says of a file that is not a regular one (a FIFO, a directory).
pub const NOT_REGULAR: &str = "is not a regular file";

/// The regular file at `path` in `place` opened for reading (reached as `beneath.rs` says,
/// settled against a writer) with its length; `None` when it does not exist, and
/// `Error::Corrupt` ([`NOT_REGULAR`]) when it is not a regular file.
fn open_regular_in(place: Place<'_>, path: &Path) -> Result<Option<(File, u64)>> {
    let open = || open_read_in(place, path);
    let file = match open().and_then(|f| settled(f, open)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("cannot read", path, e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| Error::io("cannot read", path, e))?;
    if !meta.is_file() {
        return Err(Error::Corrupt {
            path: path.to_owned(),
            message: NOT_REGULAR.into(),
        });
    }
    Ok(Some((file, meta.len())))
}

/// The last `cap` bytes at most of the regular file at `path` in `place`, and whether bytes
/// before them were left unread; `None` when it does not exist. A file that is not regular is
/// `Error::Corrupt` ([`NOT_REGULAR`]).
pub(super) fn read_tail_in(
    place: Place<'_>,
    path: &Path,
    cap: u64,
) -> Result<Option<(Vec<u8>, bool)>> {
    let Some((mut file, len)) = open_regular_in(place, path)? else {
        return Ok(None);
    };
    let skip = len.saturating_sub(cap);
    if skip > 0 {
        io::Seek::seek(&mut file, io::SeekFrom::Start(skip))
            .map_err(|e| Error::io("cannot read", path, e))?;
    }
    let mut bytes = Vec::with_capacity(len.min(cap) as usize);
    // A file that grew since the look above is read to the cap alone.
    file.take(cap)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read", path, e))?;
    Ok(Some((bytes, skip > 0)))
}

/// The bytes of the regular file at `path` in `place`, at most `cap` of them: a bigger one, or
/// one that is not a regular file ([`NOT_REGULAR`]), is `Error::Corrupt`; `None` when it does
/// not exist.
pub(super) fn read_capped_in(place: Place<'_>, path: &Path, cap: u64) -> Result<Option<Vec<u8>>> {
    let Some((file, len)) = open_regular_in(place, path)? else {
        return Ok(None);
    };
    let mut bytes = Vec::with_capacity(len.min(cap) as usize);
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read", path, e))?;
    if bytes.len() as u64 > cap {
        return Err(Error::Corrupt {
            path: path.to_owned(),
            message: format!("is more than {cap} bytes"),
        });
    }
    Ok(Some(bytes))
}

/// Reads and parses the JSON file at `path` in `place` (at most [`MAX_RECORD_BYTES`]);
/// `Ok(None)` when it does not exist.
pub(super) fn read_json_in<T: DeserializeOwned>(
    place: Place<'_>,
    path: &Path,
) -> Result<Option<T>> {
    let Some(bytes) = read_capped_in(place, path, MAX_RECORD_BYTES)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Corrupt {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

/// The reads of a file beneath the home, reached from its root without following a link.
impl Root {
    /// Reads and parses the JSON file at `path` (at most [`MAX_RECORD_BYTES`]); `Ok(None)`
    /// when it does not exist.
    pub fn read_json<T: DeserializeOwned>(&self, path: &Path) -> Result<Option<T>> {
        read_json_in(Place::Beneath(self), path)
    }

    /// The bytes of the regular file at `path`, at most `cap` of them: a bigger one, or one
    /// that is not a regular file ([`NOT_REGULAR`]), is `Error::Corrupt`; `None` when it does
    /// not exist.
    pub fn read_capped(&self, path: &Path, cap: u64) -> Result<Option<Vec<u8>>> {
        read_capped_in(Place::Beneath(self), path, cap)
    }

    /// The last `cap` bytes at most of the regular file at `path`, and whether bytes before
    /// them were left unread; `None` when it does not exist. A file that is not regular is
    /// `Error::Corrupt` ([`NOT_REGULAR`]).
    pub fn read_tail(&self, path: &Path, cap: u64) -> Result<Option<(Vec<u8>, bool)>> {
        read_tail_in(Place::Beneath(self), path, cap)
    }
}

/// The name a file set aside goes by in the quarantine: its place under the root, `/` (and
/// any control character) as `%`.
fn aside_name(rel: &Path) -> String {
    rel.to_string_lossy()
        .chars()
        .map(|c| if c == '/' || c.is_control() { '%' } else { c })
        .collect()
}

/// Moves `path`, beneath `root`, into the home's quarantine (named after its place under the
/// root, `/` as `%`) with a `.reason` file beside it, both durable, every step reached beneath
/// the root. Returns where it went.
pub fn set_aside(root: &Root, path: &Path, reason: &str) -> Result<PathBuf> {
    let place = Place::Beneath(root);
    let quarantine = root.quarantine();
    create_dir_private_in(place, quarantine)?;
    let rel = root.relative(path)?;
    let stem = aside_name(rel);
    let mut target = quarantine.join(&stem);
    let mut n = 1;
    while exists_in(place, &target) {
        target = quarantine.join(format!("{stem}.{n}"));
        n += 1;
    }
    let note = format!("{}: {reason}\n", rel.display());
    commit_in(
        place,
        &target.with_file_name(format!(
            "{}.reason",
            target.file_name().unwrap_or_default().to_string_lossy()
        )),
        note.as_bytes(),
    )?;
    rename_durably_in(place, path, &target)?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{FlockOperation, flock};

    #[test]
    fn a_read_of_a_file_a_writer_holds_reads_the_one_now_under_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let (old, now) = (dir.path().join("old"), dir.path().join("now"));
        fs::write(&old, "being written over").unwrap();
        fs::write(&now, "whole").unwrap();
        // A writer holds `old`, the file the reader opened before it became a spare.
        let writer = File::options().write(true).open(&old).unwrap();
        flock(&writer, FlockOperation::NonBlockingLockExclusive).unwrap();
        // What a read that opened `old` first reads, `reopen` naming what is there now.
        let read_opening_old = |reopen: &Path| {
            let mut read = String::new();
            settled(File::open(&old).unwrap(), || File::open(reopen))
                .unwrap()
                .read_to_string(&mut read)
                .unwrap();
            read
        };
        assert_eq!(read_opening_old(&now), "whole");
        // Held by something that never lets go: read as it is, not waited for.
        assert_eq!(read_opening_old(&old), "being written over");
    }
}
