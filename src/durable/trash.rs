//! The trash: where a running daemon puts what it frees (replaced states; consumed spool files
//! where freeing waits for the device), so the hot path renames instead of unlinking, and the
//! reaper thread that empties it and removes, behind each batch, the consumed spool files freed
//! in place elsewhere.

use super::{Dir, INLINE_UNSYNCED, Root, each_concurrently};
use crate::error::Result;
use crate::sync::{CondvarExt, MutexExt};
use rand::Rng;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// When a file last arrived where the files handed behind are (see
    /// [`note_incoming`](Trash::note_incoming)), in nanoseconds after `epoch`; 0 for never.
    incoming: AtomicU64,
    epoch: Instant,
    /// How long after the last arrival the removals behind wait (see [`INCOMING_QUIET`]).
    quiet: Duration,
}

/// How long the removals handed behind wait after a file arrived in their directory, so they
/// do not contend for its lock with a burst still being written there (see
/// [`Trash::note_incoming`]).
pub const INCOMING_QUIET: Duration = Duration::from_millis(2);

/// The most files handed behind that wait for arrivals to stop (sixteen of the daemon's
/// largest batches); past it the reaper removes them however busy the directory is.
pub const HOLD_MAX: usize = 8_192;

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

/// Files of one directory handed to the reaper to remove where they are.
type Behind = (Dir, Vec<String>);

#[derive(Debug)]
pub(super) struct TrashState {
    /// Whether anything may have arrived since the last emptying (true at first: a daemon
    /// that died may have left files).
    pending: bool,
    stopped: bool,
    /// Whether a [`Reaper`] runs: without one, [`Trash::dispose_behind`] removes at once.
    reaping: bool,
    /// Files of other directories for the reaper to remove where they are
    /// ([`Trash::dispose_behind`]), oldest first.
    behind: Vec<Behind>,
    /// Whether the reaper is removing files it took from `behind`.
    removing: bool,
    /// Callers of [`Trash::wait_behind`]: while one waits, nothing handed behind is held.
    waiting: usize,
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
                reaping: false,
                behind: Vec::new(),
                removing: false,
                waiting: 0,
            }),
            arrived: Condvar::new(),
            incoming: AtomicU64::new(0),
            epoch: Instant::now(),
            quiet: INCOMING_QUIET,
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

    /// [`dispose`](Self::dispose) behind the caller: where freeing a file does not wait for the
    /// device, the reaper removes `names` of `from` where they are, moments later, so the
    /// caller goes on at once (the daemon's next batch, while the removals of the last one
    /// wait their turn at the spool's lock behind the files arriving there). A removal that
    /// fails is logged; the files must be harmless to meet again (a consumed spool file is a
    /// duplicate). Without a running reaper, or where freeing waits for the device, this is
    /// [`dispose`](Self::dispose). [`wait_behind`](Self::wait_behind) waits for the removals.
    pub fn dispose_behind(&self, from: Dir, names: Vec<String>) -> Result<()> {
        let mut s = self.lock_state();
        if s.reaping && !self.frees_wait {
            s.behind.push((from, names));
            self.arrived.notify_all();
            return Ok(());
        }
        drop(s);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        self.dispose(&from, &refs)
    }

    /// Waits until the reaper has removed what [`dispose_behind`](Self::dispose_behind) handed
    /// it (at once when no reaper runs): a caller about to list a directory it handed files of
    /// does not find them again.
    pub fn wait_behind(&self) {
        let mut s = self.lock_state();
        s.waiting += 1;
        self.arrived.notify_all();
        while s.reaping && (s.removing || !s.behind.is_empty()) {
            s = self.arrived.wait_or_recover(s);
        }
        s.waiting -= 1;
    }

    /// Notes that a file just arrived in the directory whose consumed files are handed behind
    /// (the daemon's drop zone, told by its watch). While files keep arriving there, the reaper
    /// holds its removals until [`INCOMING_QUIET`] has passed without one: each removal takes
    /// the directory's lock, which each arriving rename takes too, and on two cores the two
    /// spin against each other and take CPU from the batches being read. Held at most until
    /// [`HOLD_MAX`] files wait, someone waits for them, or the reaper stops.
    pub fn note_incoming(&self) {
        let at = self.epoch.elapsed().as_nanos().max(1);
        self.incoming
            .store(u64::try_from(at).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How much longer the files handed behind are held (see
    /// [`note_incoming`](Self::note_incoming)); `None` when they are to go now.
    fn holding(&self, s: &TrashState) -> Option<Duration> {
        if s.behind.is_empty()
            || s.waiting > 0
            || s.behind.iter().map(|(_, names)| names.len()).sum::<usize>() >= HOLD_MAX
        {
            return None;
        }
        let last = self.incoming.load(Ordering::Relaxed);
        if last == 0 {
            return None;
        }
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let since = Duration::from_nanos(now.saturating_sub(last));
        self.quiet.checked_sub(since).filter(|left| !left.is_zero())
    }

    /// Whether everything handed over by [`dispose_behind`](Self::dispose_behind) is removed
    /// (a look, never a wait).
    pub fn behind_done(&self) -> bool {
        let s = self.lock_state();
        !s.removing && s.behind.is_empty()
    }

    /// Removes files handed over by [`dispose_behind`](Self::dispose_behind), one after the
    /// other (they share a directory, whose lock they take in turn anyway).
    fn remove_behind(batches: Vec<Behind>) {
        for (dir, names) in batches {
            let failed = names.iter().filter_map(|n| dir.unlink(n).err()).count();
            if failed > 0 {
                tracing::error!(
                    dir = %dir.path().display(),
                    failed,
                    "cannot remove consumed files (each is recorded: a later sweep finds it a \
                     duplicate and removes it)",
                );
            }
        }
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

    /// The reaper thread's loop: removes what was handed over behind a caller, and empties
    /// the trash whenever something arrived, until stopped.
    fn reap_until_stopped(&self) {
        while let Some((behind, arrived)) = self.wait_for_arrival() {
            if !behind.is_empty() {
                Self::remove_behind(behind);
                self.lock_state().removing = false;
                self.arrived.notify_all();
            }
            if !arrived {
                continue;
            }
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

    /// Waits until something arrived or was handed over, taking both (the files to remove
    /// behind, unless they are held, and whether the trash is to be emptied); `None` once the
    /// reaper is stopped. Held files wait while the trash is emptied.
    fn wait_for_arrival(&self) -> Option<(Vec<Behind>, bool)> {
        let mut s = self.lock_state();
        loop {
            if s.stopped {
                return None;
            }
            let held = self.holding(&s);
            if held.is_none() && !s.behind.is_empty() {
                let behind = std::mem::take(&mut s.behind);
                s.removing = true;
                return Some((behind, std::mem::replace(&mut s.pending, false)));
            }
            if s.pending {
                s.pending = false;
                return Some((Vec::new(), true));
            }
            s = match held {
                Some(left) => self.arrived.wait_timeout_or_recover(s, left).0,
                None => self.arrived.wait_or_recover(s),
            };
        }
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
        trash.lock_state().reaping = true;
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
        let behind = {
            let mut s = self.trash.lock_state();
            s.reaping = false;
            std::mem::take(&mut s.behind)
        };
        Trash::remove_behind(behind);
        self.trash.arrived.notify_all();
        if let Err(e) = self.trash.empty() {
            tracing::error!(error = %e, "cannot empty the trash at stop (the next start does)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trash (never on a discard mount here: the test decides) and a directory beside it
    /// holding `n` files, with their names.
    fn trash_and_files(n: usize) -> (tempfile::TempDir, Arc<Trash>, Dir, Vec<String>) {
        trash_and_files_quiet_for(n, INCOMING_QUIET)
    }

    /// [`trash_and_files`] with removals behind held for `quiet` after an arrival.
    fn trash_and_files_quiet_for(
        n: usize,
        quiet: Duration,
    ) -> (tempfile::TempDir, Arc<Trash>, Dir, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::durable::test_root(dir.path());
        let mut trash = Trash::open(&root, &dir.path().join("trash")).unwrap();
        trash.frees_wait = false;
        trash.quiet = quiet;
        let spool = Dir::make_beneath(&root, Path::new("spool")).unwrap();
        let names: Vec<String> = (0..n).map(|i| format!("{i:05}.json")).collect();
        for name in &names {
            std::fs::write(dir.path().join("spool").join(name), b"{}").unwrap();
        }
        (dir, Arc::new(trash), spool, names)
    }

    fn left(dir: &tempfile::TempDir) -> usize {
        std::fs::read_dir(dir.path().join("spool")).unwrap().count()
    }

    #[test]
    fn files_handed_behind_are_removed_by_the_reaper_and_waited_for_before_a_listing() {
        let (dir, trash, spool, names) = trash_and_files(3_000);
        let reaper = Reaper::start(trash.clone());
        trash
            .dispose_behind(spool.try_clone().unwrap(), names)
            .unwrap();
        // The caller went on at once; whoever lists the directory next waits for the removals
        // (thousands of them, which the reaper is still working through were it not waited
        // for).
        trash.wait_behind();
        assert_eq!(left(&dir), 0, "every file handed behind is gone");
        drop(reaper);
    }

    #[test]
    fn without_a_reaper_files_handed_behind_are_removed_at_once() {
        let (dir, trash, spool, names) = trash_and_files(10);
        trash.dispose_behind(spool, names).unwrap();
        assert_eq!(left(&dir), 0);
    }

    #[test]
    fn files_handed_behind_wait_while_files_arrive_and_go_once_someone_waits_for_them() {
        let (dir, trash, spool, names) = trash_and_files_quiet_for(200, Duration::from_secs(3600));
        let reaper = Reaper::start(trash.clone());
        trash.note_incoming();
        trash
            .dispose_behind(spool.try_clone().unwrap(), names)
            .unwrap();
        // The reaper works meanwhile: a file moved into the trash is removed...
        std::fs::write(dir.path().join("replaced"), b"{}").unwrap();
        let parent = Dir::make_beneath(&crate::durable::test_root(dir.path()), Path::new("."));
        trash
            .take_all_from(&parent.unwrap(), &["replaced"])
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::read_dir(dir.path().join("trash")).unwrap().count() > 0 {
            assert!(Instant::now() < deadline, "the trash was never emptied");
            std::thread::sleep(Duration::from_millis(1));
        }
        // ...but the files handed behind it first are held while files arrive beside them.
        assert_eq!(left(&dir), 200, "held while files arrive");
        assert!(!trash.behind_done());
        // Someone about to list the directory does not wait for the quiet.
        trash.wait_behind();
        assert_eq!(left(&dir), 0, "removed for the one waiting");
        drop(reaper);
    }

    #[test]
    fn held_files_go_once_nothing_has_arrived_for_the_quiet_time() {
        let (dir, trash, spool, names) = trash_and_files_quiet_for(50, Duration::from_millis(20));
        let reaper = Reaper::start(trash.clone());
        trash.note_incoming();
        trash.dispose_behind(spool, names).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while left(&dir) > 0 {
            assert!(Instant::now() < deadline, "held files never went");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(trash.behind_done());
        drop(reaper);
    }

    #[test]
    fn a_stopping_reaper_first_removes_what_it_was_handed() {
        let (dir, trash, spool, names) =
            trash_and_files_quiet_for(3_000, Duration::from_secs(3600));
        let reaper = Reaper::start(trash.clone());
        // Files still arriving hold nothing back at a stop.
        trash.note_incoming();
        // Handed while the reaper stops: nothing is left to a next start's sweep.
        trash.lock_state().stopped = true;
        trash.dispose_behind(spool, names).unwrap();
        drop(reaper);
        assert_eq!(left(&dir), 0);
    }

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
