//! Advisory file locks (`flock`): the daemon's lock on the home and the per-waitpoint locks that
//! serialise writers, with who holds one and whether it is stale.

use super::{Root, not_found};
use crate::error::{Error, Result};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

/// The most of a lock file read for its holder's pid: a holder writes a pid and a newline, so
/// whatever else a file under the lock's name holds is neither read nor shown.
const PID_BYTES: u64 = 64;

/// An exclusive advisory lock on a file, released on drop.
#[derive(Debug)]
pub struct FileLock {
    file: File,
    /// What the lock file held when [`FileLock::try_acquire_writing_pid`] took it: the pid of
    /// a holder that died without clearing it, if any.
    previous: Option<String>,
}

impl FileLock {
    /// The lock file at `path`, made when missing; whatever else stands under its name (a link,
    /// a FIFO) is set aside first, so it is neither followed nor waited on.
    fn open(root: &Root, path: &Path) -> Result<File> {
        root.open_or_create(path)
    }

    /// Blocks until the lock on the directory `dir` itself is ours: a lock that needs no file
    /// of its own, so taking it for the first time creates nothing (a waitpoint's lock is
    /// taken by every signal's commit).
    pub fn acquire_dir(root: &Root, dir: &Path) -> Result<Self> {
        let file = File::from(
            root.open_dir(dir, false)?
                .ok_or_else(|| Error::io("cannot open lock", dir, not_found()))?,
        );
        file.lock().map_err(|e| Error::io("cannot lock", dir, e))?;
        Ok(FileLock {
            file,
            previous: None,
        })
    }

    /// Blocks until the lock is ours. Used for short read-modify-write sections.
    pub fn acquire(root: &Root, path: &Path) -> Result<Self> {
        let file = Self::open(root, path)?;
        file.lock().map_err(|e| Error::io("cannot lock", path, e))?;
        Ok(FileLock {
            file,
            previous: None,
        })
    }

    /// Takes the lock or reports who holds it (the pid written in the file).
    pub fn try_acquire_writing_pid(root: &Root, path: &Path) -> Result<Self> {
        let mut file = Self::open(root, path)?;
        // Read at an offset, leaving the file's position where the pid is written below.
        let mut held = [0; PID_BYTES as usize];
        let n = std::os::unix::fs::FileExt::read_at(&file, &mut held, 0).unwrap_or(0);
        let pid = String::from_utf8_lossy(&held[..n]).trim().to_owned();
        if file.try_lock().is_err() {
            return Err(Error::Locked {
                path: path.to_owned(),
                pid,
            });
        }
        let previous = (!pid.is_empty()).then_some(pid);
        file.set_len(0)
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io("cannot write lock", path, e))?;
        Ok(FileLock { file, previous })
    }

    /// The pid a holder that died without clearing the lock left in it, as this lock was
    /// taken ([`FileLock::try_acquire_writing_pid`] only).
    pub fn previous_pid(&self) -> Option<&str> {
        self.previous.as_deref()
    }

    /// Empties the lock file while still holding it (the daemon's clean stop), so a pid found
    /// in an unheld lock later means its holder died without stopping. Best effort: a failure
    /// only makes a clean stop look like a crash to `doctor`.
    pub fn clear(&self) {
        let _ = self.file.set_len(0).and_then(|()| self.file.sync_all());
    }

    /// True when some process holds the lock at `path` right now.
    pub fn is_held(root: &Root, path: &Path) -> bool {
        match Self::open_existing(root, path) {
            Some(f) => match f.try_lock() {
                Ok(()) => {
                    let _ = f.unlock();
                    false
                }
                Err(_) => true,
            },
            None => false,
        }
    }

    /// The lock file at `path` opened to be looked at, if it is one: reached as every file of
    /// the home is (`beneath.rs`) and opened without blocking, so a link is not followed out of
    /// the home and a FIFO planted under the lock's name holds no reader; only a regular file
    /// counts, as only a regular file can be the lock a daemon takes.
    fn open_existing(root: &Root, path: &Path) -> Option<File> {
        root.open_read(path)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
    }

    /// The pid the holder wrote at `path` (at most [`PID_BYTES`] read), or empty.
    fn written_pid(root: &Root, path: &Path) -> String {
        let mut pid = String::new();
        if let Some(f) = Self::open_existing(root, path) {
            let _ = f.take(PID_BYTES).read_to_string(&mut pid);
        }
        pid.trim().to_owned()
    }

    /// Who holds the lock at `path`, by the one test that counts (the lock itself) and the pid
    /// its holder wrote there. `doctor` and `cortex-signal` both say it this way, so they never
    /// disagree about a daemon that died.
    pub fn holder(root: &Root, path: &Path) -> LockHolder {
        let pid = Self::written_pid(root, path);
        if Self::is_held(root, path) {
            return LockHolder::Held { pid };
        }
        if pid.is_empty() {
            return LockHolder::Free;
        }
        let reused = pid
            .parse::<rustix::process::RawPid>()
            .ok()
            .filter(|p| *p > 0)
            .is_some_and(crate::process::process_exists);
        LockHolder::Stale { pid, reused }
    }
}

/// What [`FileLock::holder`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockHolder {
    /// Held, by the process that wrote `pid`.
    Held { pid: String },
    /// Not held, though a holder wrote `pid` there and never cleared it (it died); `reused`
    /// when some other process has that pid now.
    Stale { pid: String, reused: bool },
    /// Not held and never taken, or released cleanly.
    Free,
}

impl LockHolder {
    /// `names pid N, which is not running` (or `... which is running but does not hold the
    /// lock (its pid was reused)`), for a stale lock.
    pub fn stale_text(&self, lock: &Path) -> Option<String> {
        let LockHolder::Stale { pid, reused } = self else {
            return None;
        };
        let why = if *reused {
            "is running but does not hold the lock (its pid was reused)"
        } else {
            "is not running"
        };
        Some(format!("{} names pid {pid}, which {why}", lock.display()))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}
