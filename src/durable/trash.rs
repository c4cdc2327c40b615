//! The trash: where a running daemon puts what it frees (replaced states; consumed spool files
//! where freeing waits for the device), so the hot path renames instead of unlinking, and the
//! reaper thread that empties it.

use super::{Dir, INLINE_UNSYNCED, Root, each_concurrently};
use crate::error::Result;
use crate::sync::{CondvarExt, MutexExt};
use rand::Rng;
use std::io;
use std::path::Path;
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
/// [`Unsynced::rewrite_json`](super::Unsynced::rewrite_json)), and a consumed spool file
/// ([`dispose`](Trash::dispose)) where freeing waits for the device
/// ([`frees_wait_for_device`]); elsewhere that one is unlinked in place, since without
/// `discard` the move costs more than the unlink it defers.
/// Everything here is garbage the moment it arrives: nothing reads it, and what a daemon that
/// died left here is removed as soon as the next one starts. The reaper removes files as they
/// come rather than in rounds.
#[derive(Debug)]
pub struct Trash {
    /// Held open: what arrives and what is removed is named relative to it, never by path.
    dir: Dir,
    /// Whether freeing a file's blocks on the trash's filesystem waits for the device.
    frees_wait: bool,
    /// Names are a counter from a random start, so two processes (or a leftover) rarely meet;
    /// when they do, the rename replaces garbage, which is harmless.
    next: AtomicU64,
    state: Mutex<TrashState>,
    arrived: Condvar,
}

/// Whether freeing a file's blocks on the filesystem holding `path` waits for the device: its
/// mount has online discard (`discard`), as `/proc/self/mountinfo` says. False when that
/// cannot be told.
pub fn frees_wait_for_device(path: &Path) -> bool {
    let (Ok(path), Ok(mounts)) = (
        std::fs::canonicalize(path),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return false;
    };
    mount_discards(&mounts, &path)
}

/// Whether the mount `path` is on, of those `mountinfo` lists (the deepest mount point holding
/// it; of two on one point, the later), has `discard` among its mount or superblock options.
fn mount_discards(mountinfo: &str, path: &Path) -> bool {
    let mut found: Option<(usize, bool)> = None;
    for line in mountinfo.lines() {
        // `ID PARENT MAJ:MIN ROOT POINT OPTIONS [TAGS...] - TYPE SOURCE SUPER_OPTIONS`
        let (mount, fs) = line.split_once(" - ").unwrap_or((line, ""));
        let fields: Vec<&str> = mount.split(' ').collect();
        let (Some(point), Some(options)) = (fields.get(4), fields.get(5)) else {
            continue;
        };
        let point = unescape_octal(point);
        if !path.starts_with(&point) {
            continue;
        }
        let super_options = fs.split(' ').nth(2).unwrap_or("");
        let discard = options
            .split(',')
            .chain(super_options.split(','))
            .any(|o| o == "discard");
        let depth = Path::new(&point).components().count();
        if found.is_none_or(|(deepest, _)| depth >= deepest) {
            found = Some((depth, discard));
        }
    }
    found.is_some_and(|(_, discard)| discard)
}

/// A mount point as `mountinfo` writes it, its space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(b) => {
                out.push(char::from(b));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
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
    pub fn open(root: &Root, dir: &Path) -> Result<Trash> {
        let dir = Dir::make_beneath(root, root.relative(dir)?)?;
        Ok(Trash {
            dir,
            frees_wait: frees_wait_for_device(root.path()),
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

    /// Frees each of `names` of the directory `from` without waiting for the device and without
    /// making it durable (the files' contents must be durable elsewhere): where freeing waits
    /// for the device ([`frees_wait_for_device`]) each is moved here for the reaper, through both
    /// handles; elsewhere it is unlinked where it is, which costs less than the move across two
    /// directories and the reaper's wake. Files already gone are not an error.
    pub fn dispose(&self, from: &Dir, names: &[&str]) -> Result<()> {
        if !self.frees_wait {
            return super::unlink_all(from, names);
        }
        self.take_all_from(from, names)
    }

    /// Moves each of `names` of the directory `from` here for the reaper, through both handles,
    /// whatever the filesystem: a replaced state's old file, whose removal the reaper's own
    /// thread then takes off the commit. A file that cannot be moved is removed instead; files
    /// already gone are not an error.
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

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard,errors=remount-ro
30 22 0:26 / /tmp rw,nosuid shared:2 - tmpfs tmpfs rw,size=100k
31 22 7:0 / /mnt/j rw,relatime shared:3 - ext4 /dev/loop0 rw
32 31 7:1 / /mnt/j/deep rw,relatime,discard shared:4 - ext4 /dev/loop1 rw
33 22 7:2 / /mnt/with\\040space rw - ext4 /dev/loop2 rw,discard
34 22 7:3 / /mnt/over rw - ext4 /dev/loop3 rw,discard
35 34 7:4 / /mnt/over rw - ext4 /dev/loop4 rw";

    #[test]
    fn the_deepest_mount_holding_a_path_says_whether_its_frees_wait_for_the_device() {
        let discards = |p: &str| mount_discards(MOUNTINFO, Path::new(p));
        assert!(discards("/home/u/.cortex"), "the root's superblock option");
        assert!(!discards("/tmp/home"), "tmpfs, no discard");
        assert!(
            !discards("/mnt/j/home"),
            "a journaled image without discard"
        );
        assert!(
            discards("/mnt/j/deep/home"),
            "a mount option of a deeper mount"
        );
        assert!(
            discards("/mnt/jj/home"),
            "whole components: /mnt/jj is on the root"
        );
        assert!(discards("/mnt/with space/home"), "an escaped mount point");
        assert!(
            !discards("/mnt/over/home"),
            "the later of two mounts on one point"
        );
        assert!(!mount_discards("", Path::new("/")), "nothing known: no");
    }
}
