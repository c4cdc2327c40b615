//! The trash: where a running daemon puts what it frees (consumed spool files, replaced states)
//! so the hot path renames instead of unlinking, and the reaper thread that empties it.

use super::{Dir, INLINE_UNSYNCED, Root, each_concurrently};
use crate::error::Result;
use crate::sync::{CondvarExt, MutexExt};
use rand::Rng;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Where files go whose blocks a hot path should not wait to free, until the [`Reaper`]
/// thread removes them, moments later.
///
/// Freeing a file's blocks (removing it, or renaming another file over it) waits for the
/// device on a filesystem mounted with `discard`: about 150 us a file on the VM the README's
/// figures come from, two thirds of what a signal cost. The daemon therefore moves a replaced
/// file's old one here ([`take_all_from`](Trash::take_all_from): a rename frees nothing),
/// exchanged for the new one when it cannot be kept as a spare (see
/// [`Unsynced::replace_json`](super::Unsynced::replace_json),
/// [`Unsynced::rewrite_json`](super::Unsynced::rewrite_json)). (A consumed spool file is
/// unlinked where it is consumed: on the journaled disks users have, a move here cost more
/// than the unlink it deferred.)
/// Everything here is garbage the moment it arrives: nothing reads it, and what a daemon that
/// died left here is removed as soon as the next one starts. The reaper removes files as they
/// come rather than in rounds.
#[derive(Debug)]
pub struct Trash {
    /// The home the trash and everything moved into it lie beneath.
    root: Arc<Root>,
    /// Held open: what arrives and what is removed is named relative to it, never by path.
    dir: Dir,
    /// Names are a counter from a random start, so two processes (or a leftover) rarely meet;
    /// when they do, the rename replaces garbage, which is harmless.
    next: AtomicU64,
    state: Mutex<TrashState>,
    arrived: Condvar,
}

#[derive(Debug)]
pub(super) struct TrashState {
    /// Whether anything may have arrived since the last emptying (true at first: a daemon
    /// that died may have left files).
    pending: bool,
    stopped: bool,
}

impl Trash {
    /// The trash in `dir`, a directory beneath `root`, made if missing; refused when it is a
    /// link, not a directory, or not ours alone (as [`Dir::open_beneath`] refuses).
    pub fn open(root: Arc<Root>, dir: &Path) -> Result<Trash> {
        let dir = Dir::make_beneath(&root, root.relative(dir)?)?;
        Ok(Trash {
            root,
            dir,
            next: AtomicU64::new(rand::rng().next_u64() >> 1),
            state: Mutex::new(TrashState {
                pending: true,
                stopped: false,
            }),
            arrived: Condvar::new(),
        })
    }

    fn fresh_name(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{n:016x}")
    }

    fn lock_state(&self) -> MutexGuard<'_, TrashState> {
        self.state.lock_or_recover()
    }

    fn note_arrival(&self) {
        let mut s = self.lock_state();
        if !s.pending {
            s.pending = true;
            self.arrived.notify_one();
        }
    }

    /// Moves each of `paths` here, concurrently, without making the moves durable (the
    /// files' contents must be durable elsewhere, as with [`Root::remove_all`]). A file that cannot
    /// be moved here is removed instead; files already gone are not an error.
    pub fn take_all(&self, paths: &[PathBuf]) -> Result<()> {
        let take = |path: &PathBuf| match self.dir.rename_into(&self.root, path, &self.fresh_name())
        {
            Ok(()) => {
                self.note_arrival();
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(_) => self.root.remove_all(std::slice::from_ref(path)),
        };
        if paths.len() <= INLINE_UNSYNCED {
            return paths.iter().try_for_each(take);
        }
        each_concurrently(paths, take)
    }

    /// Moves each of `names` from the directory `from` here, through both handles, as
    /// [`Trash::take_all`] does for paths.
    pub fn take_all_from(&self, from: &Dir, names: &[&str]) -> Result<()> {
        let take = |name: &&str| match from.rename_to(
            std::ffi::OsStr::new(name),
            &self.dir,
            &self.fresh_name(),
        ) {
            Ok(()) => {
                self.note_arrival();
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(_) => from.unlink(name),
        };
        if names.len() <= INLINE_UNSYNCED {
            return names.iter().try_for_each(take);
        }
        each_concurrently(names, take)
    }

    /// The reaper thread's loop: empties the trash whenever something arrived, until stopped.
    fn reap_until_stopped(&self) {
        while self.wait_for_arrival() {
            match self.empty() {
                Ok(0) => {}
                Ok(files) => tracing::debug!(files, "emptied the trash"),
                Err(e) => {
                    tracing::error!(error = %e, "cannot empty the trash (trying again)");
                    let mut s = self.lock_state();
                    s.pending = true;
                    let _ = self.arrived.wait_timeout(s, REAPER_RETRY);
                }
            }
        }
    }

    /// Waits until something arrived (taking the news: `true`) or the reaper is stopped.
    fn wait_for_arrival(&self) -> bool {
        let mut s = self.lock_state();
        while !s.pending && !s.stopped {
            s = self.arrived.wait_or_recover(s);
        }
        let arrived = !s.stopped;
        s.pending = false;
        arrived
    }

    /// Removes every file here. Returns how many.
    fn empty(&self) -> Result<usize> {
        let names = self.dir.names()?;
        // One after the other, on this thread: the removals wait for the directory's lock in
        // turn anyway, and the reaper is off the commit path, so threads started for each
        // emptying (a few files, many times a second while signals stream in) only cost CPU.
        names.iter().try_for_each(|name| self.dir.unlink(name))?;
        Ok(names.len())
    }
}

/// The thread that empties a [`Trash`] whenever something arrives; on drop it stops and
/// empties it a last time, so a clean stop leaves the trash empty.
#[derive(Debug)]
pub struct Reaper {
    trash: Arc<Trash>,
    thread: Option<JoinHandle<()>>,
}

/// How long the reaper waits before it tries again after failing to empty the trash.
pub(super) const REAPER_RETRY: Duration = Duration::from_secs(1);

impl Reaper {
    pub fn start(trash: Arc<Trash>) -> Reaper {
        let t = trash.clone();
        let thread = std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || t.reap_until_stopped())
            .expect("spawn the reaper thread");
        Reaper {
            trash,
            thread: Some(thread),
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        {
            let mut s = self.trash.lock_state();
            s.stopped = true;
            self.trash.arrived.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Err(e) = self.trash.empty() {
            tracing::error!(error = %e, "cannot empty the trash at stop (the next start does)");
        }
    }
}
