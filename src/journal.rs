//! The write-ahead journal: how a batch of signals becomes durable with one fsync.
//!
//! The daemon appends one line per batch to the active segment, `journal/<n>.jsonl`, and
//! fdatasyncs it; from then on the batch is committed, and the files it changes (signal
//! records, waitpoint states, inbox wakes) are written with an atomic rename but without their
//! own fsync. A checkpoint makes those files durable with one `syncfs(2)` of the home's
//! filesystem and then deletes the segments it covered, so the journal holds only the last
//! few seconds of work ([`CHECKPOINT_EVERY`]). After a crash, [`Journal::entries`] hands the
//! surviving lines to the engine, which re-applies them; applying an entry is idempotent, so a
//! segment replayed twice (a crash between the `syncfs` and the delete) does no harm.
//!
//! This module knows segments, lines and syncs; it does not know what a line means (the engine
//! does, in `engine/batch.rs`).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::durable::Root;
use crate::error::{Error, Result};
use crate::sync::{CondvarExt, MutexExt};

/// How often the checkpointer makes the applied files durable and drops the covered segments.
/// It bounds how much a replay after a crash has to redo, not how long a signal waits. Five
/// seconds is ext4's own commit interval: a `syncfs` stalls the file creations of batches
/// running meanwhile (measured: a 1,000-signal burst took twice as long with one a second), and
/// a state replaced several times in the interval is flushed once.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

/// A segment is closed early once it holds this many bytes (the next checkpoint deletes it).
const SEGMENT_BYTES: u64 = 8 << 20;

/// The journal of one home, shared by the engine (appends) and the checkpointer thread.
#[derive(Debug)]
pub struct Journal {
    /// The home the journal lies in: every segment is reached beneath it.
    root: Arc<Root>,
    dir: PathBuf,
    /// An open handle on the home's filesystem for `syncfs`. It is opened once so that a
    /// writeback error anywhere on the filesystem after the journal opened is reported by the
    /// next `syncfs` (the kernel samples the error state when a file is opened).
    fs: File,
    active: Option<Segment>,
    /// Segments no longer appended to whose files may not yet be durable.
    closed: Vec<u64>,
    next_number: u64,
    /// Set when the journal may hold an entry whose files are not all written (an append that
    /// could not be rolled back, a failed apply). The engine re-applies every segment before
    /// it decides anything else, and no checkpoint runs meanwhile.
    needs_replay: bool,
}

#[derive(Debug)]
struct Segment {
    number: u64,
    file: File,
    len: u64,
}

/// One line read back from a segment.
#[derive(Debug)]
pub struct Entry {
    pub segment: PathBuf,
    pub line: usize,
    pub bytes: Vec<u8>,
}

fn segment_name(number: u64) -> String {
    format!("{number:020}.jsonl")
}

fn segment_number(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".jsonl")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

impl Journal {
    /// Opens the journal in `dir`, beneath `root` (made when missing); the journaled files live
    /// on the root's filesystem. Segments found there are kept for [`entries`](Self::entries)
    /// and the next checkpoint.
    pub fn open(root: Arc<Root>, dir: &Path) -> Result<Journal> {
        root.create_dir_private(dir)?;
        let home = root.path();
        let fs = File::open(home).map_err(|e| Error::io("cannot open", home, e))?;
        let closed = list_segments(&root, dir)?;
        let next_number = closed.last().map_or(1, |n| n + 1);
        Ok(Journal {
            root,
            dir: dir.to_owned(),
            fs,
            active: None,
            needs_replay: !closed.is_empty(),
            closed,
            next_number,
        })
    }

    /// Whether entries must be re-applied before the next batch is decided.
    pub fn needs_replay(&self) -> bool {
        self.needs_replay
    }

    /// Records that every entry is applied (after a replay), or that one may not be.
    pub fn set_needs_replay(&mut self, value: bool) {
        self.needs_replay = value;
    }

    /// Every entry of every segment, oldest first ([`read_segment`]).
    pub fn entries(&self) -> Result<Vec<Entry>> {
        let mut numbers = self.closed.clone();
        numbers.extend(self.active.as_ref().map(|s| s.number));
        let mut entries = Vec::new();
        for number in numbers {
            let segment = self.dir.join(segment_name(number));
            entries.extend(read_segment(&self.root, &segment)?);
        }
        Ok(entries)
    }

    /// Appends one entry (`line` without its newline) and makes it durable. On error nothing
    /// is committed: the append is cut off again, or, when even that fails, the segment is
    /// closed and [`needs_replay`](Self::needs_replay) set, so the entry (if it landed after
    /// all) is applied before anything else is decided and no two decisions exist for one
    /// signal.
    pub fn append(&mut self, line: &[u8]) -> Result<()> {
        let dir = self.dir.clone();
        let segment = self.active_segment()?;
        let path = dir.join(segment_name(segment.number));
        let before = segment.len;
        let written = (|| {
            crate::failpoint!(crate::failpoint::JOURNAL_WRITE, "cannot write", &path);
            let mut buf = Vec::with_capacity(line.len() + 1);
            buf.extend_from_slice(line);
            buf.push(b'\n');
            segment
                .file
                .write_all(&buf)
                .map_err(|e| Error::io("cannot write", &path, e))?;
            crate::failpoint!(crate::failpoint::JOURNAL_FSYNC, "cannot fsync", &path);
            segment
                .file
                .sync_data()
                .map_err(|e| Error::io("cannot fsync", &path, e))?;
            Ok(before + buf.len() as u64)
        })();
        match written {
            Ok(len) => {
                segment.len = len;
                if len >= SEGMENT_BYTES {
                    self.rotate();
                }
                Ok(())
            }
            Err(e) => {
                let rolled_back = segment
                    .file
                    .set_len(before)
                    .and_then(|()| segment.file.sync_data());
                if let Err(undo) = rolled_back {
                    tracing::error!(
                        segment = %path.display(),
                        error = %undo,
                        "cannot cut a failed journal append off; closing the segment and \
                         replaying it before the next batch",
                    );
                    self.rotate();
                    self.needs_replay = true;
                }
                Err(e)
            }
        }
    }

    /// The segment appends go to, made (and its name made durable) when there is none.
    fn active_segment(&mut self) -> Result<&mut Segment> {
        if self.active.is_none() {
            let number = self.next_number;
            let path = self.dir.join(segment_name(number));
            let file = self
                .root
                .create_append(&path)
                .map_err(|e| Error::io("cannot create", &path, e))?;
            // The entries' fdatasync makes their bytes durable, not the segment's name.
            self.root.fsync_dir(&self.dir)?;
            self.next_number += 1;
            self.active = Some(Segment {
                number,
                file,
                len: 0,
            });
        }
        Ok(self.active.as_mut().expect("just made"))
    }

    /// Stops appending to the active segment (the next append starts a new one).
    fn rotate(&mut self) {
        if let Some(s) = self.active.take() {
            self.closed.push(s.number);
        }
    }

    /// Makes every file written so far durable and deletes the segments that covered them.
    /// Called with every entry applied (the engine holds the journal across append and
    /// apply, so between two calls every entry is). A failure keeps the segments for the
    /// next checkpoint, or the replay after a restart.
    pub fn checkpoint(&mut self) -> Result<()> {
        let covered = self.begin_checkpoint();
        if covered.is_empty() {
            return Ok(());
        }
        syncfs(&self.fs, &self.dir)?;
        self.finish_checkpoint(&covered)
    }

    /// Closes the active segment and returns what a checkpoint now covers (nothing while a
    /// replay is owed: those entries' files may not be written yet).
    fn begin_checkpoint(&mut self) -> Vec<u64> {
        if self.needs_replay {
            return Vec::new();
        }
        if self.active.as_ref().is_some_and(|s| s.len == 0) {
            // Empty: nothing to cover, and it stays the active segment.
        } else {
            self.rotate();
        }
        self.closed.clone()
    }

    fn finish_checkpoint(&mut self, covered: &[u64]) -> Result<()> {
        crate::failpoint!(
            crate::failpoint::JOURNAL_CHECKPOINT,
            "cannot remove",
            &self.dir
        );
        let paths: Vec<PathBuf> = covered
            .iter()
            .map(|n| self.dir.join(segment_name(*n)))
            .collect();
        // Durably: not needed for safety (a segment that comes back is re-applied harmlessly),
        // but it keeps a replay after a power cut short. On error every covered segment is
        // kept for the next checkpoint; one already gone is not an error then.
        self.root.remove_all_durably(&paths)?;
        self.closed.retain(|n| !covered.contains(n));
        Ok(())
    }
}

/// Whether `dir` holds any segment (a cheap look, for commands deciding whether to replay).
pub fn has_segments(root: &Root, dir: &Path) -> bool {
    list_segments(root, dir).is_ok_and(|s| !s.is_empty())
}

/// The entries of one segment (none when it is gone).
///
/// Only a last line without its newline is torn: an append a crash cut short, never fsynced,
/// so none of its files were written; it is skipped with a warning. Any other line that does
/// not parse may be a batch already answered as committed, so it is an error naming the
/// segment and the line: nothing is decided until the operator has looked at it and set the
/// segment aside (`waitpoint doctor` says how).
pub fn read_segment(root: &Root, path: &Path) -> Result<Vec<Entry>> {
    let file = match root.open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("cannot open", path, e)),
    };
    let mut reader = BufReader::new(file);
    let mut entries = Vec::new();
    for line in 1.. {
        let mut bytes = Vec::new();
        let n = reader
            .read_until(b'\n', &mut bytes)
            .map_err(|e| Error::io("cannot read", path, e))?;
        if n == 0 {
            break;
        }
        let Some(complete) = bytes.strip_suffix(b"\n") else {
            tracing::warn!(
                segment = %path.display(),
                line,
                "skipping a torn journal line (an append a crash cut short)",
            );
            break;
        };
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(complete) {
            return Err(Error::Corrupt {
                path: path.to_owned(),
                message: format!(
                    "line {line} is damaged ({e}); it may hold a committed batch, so nothing \
is decided until the segment is set aside (see `waitpoint doctor`)"
                ),
            });
        }
        bytes.pop();
        entries.push(Entry {
            segment: path.to_owned(),
            line,
            bytes,
        });
    }
    Ok(entries)
}

/// The paths of segments `numbers` in `dir`.
pub fn list_segment_paths(dir: &Path, numbers: &[u64]) -> Vec<PathBuf> {
    numbers.iter().map(|n| dir.join(segment_name(*n))).collect()
}

/// The numbers of the segments in `dir`, beneath `root`, in order; a missing directory has none.
pub fn list_segments(root: &Root, dir: &Path) -> Result<Vec<u64>> {
    let mut numbers: Vec<u64> = root
        .list_dir(dir)?
        .iter()
        .filter_map(|(name, _)| segment_number(name))
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// `syncfs(2)`: every dirty file and directory of the filesystem `fs` is on, written and
/// flushed; fails when any writeback on it failed since `fs` was opened or last synced.
fn syncfs(fs: &File, what: &Path) -> Result<()> {
    rustix::fs::syncfs(fs).map_err(|e| Error::io("cannot sync the filesystem of", what, e.into()))
}

/// The journal shared between the engine and the checkpointer thread.
pub type Shared = Arc<Mutex<Journal>>;

/// Locks the journal; a panic elsewhere cannot leave it half-changed in a way that matters
/// (every field is updated after the I/O it describes), so a poisoned lock is taken as is.
pub fn lock(journal: &Shared) -> MutexGuard<'_, Journal> {
    journal.lock_or_recover()
}

/// The background thread that checkpoints every [`CHECKPOINT_EVERY`]; on drop it stops and
/// runs a last checkpoint, so a clean stop leaves an empty journal.
#[derive(Debug)]
pub struct Checkpointer {
    journal: Shared,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub fn start(journal: Shared) -> Checkpointer {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread = {
            let journal = journal.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("checkpoint".into())
                .spawn(move || {
                    let (flag, cv) = &*stop;
                    let mut stopped = flag.lock_or_recover();
                    while !*stopped {
                        stopped = cv.wait_timeout_or_recover(stopped, CHECKPOINT_EVERY).0;
                        if !*stopped {
                            checkpoint_in_background(&journal);
                        }
                    }
                })
                .expect("spawn the checkpoint thread")
        };
        Checkpointer {
            journal,
            stop,
            thread: Some(thread),
        }
    }
}

/// One checkpoint that holds the journal only to rotate and to delete, not across the
/// `syncfs`, so batches keep committing while the filesystem is flushed.
fn checkpoint_in_background(journal: &Shared) {
    let (covered, fs, dir) = {
        let mut j = lock(journal);
        let covered = j.begin_checkpoint();
        if covered.is_empty() {
            return;
        }
        match j.fs.try_clone() {
            Ok(fs) => (covered, fs, j.dir.clone()),
            Err(e) => {
                tracing::error!(
                    error = %e,
                    "cannot checkpoint the journal (kept for the next try)",
                );
                return;
            }
        }
    };
    let done = syncfs(&fs, &dir).and_then(|()| lock(journal).finish_checkpoint(&covered));
    if let Err(e) = done {
        tracing::error!(error = %e, "cannot checkpoint the journal (kept for the next try)");
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        {
            let (flag, cv) = &*self.stop;
            *flag.lock_or_recover() = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Err(e) = lock(&self.journal).checkpoint() {
            tracing::error!(
                error = %e,
                "cannot checkpoint the journal at stop (a restart replays it)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> Journal {
        let root = Arc::new(crate::durable::test_root(dir));
        Journal::open(root, &dir.join("journal")).unwrap()
    }

    #[test]
    fn appended_entries_read_back_in_order_and_a_torn_tail_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let mut j = open(tmp.path());
        j.append(br#"{"n":1}"#).unwrap();
        j.append(br#"{"n":2}"#).unwrap();
        let path = j.dir.join(segment_name(1));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(br#"{"n":3, "cut"#).unwrap();
        drop(j);
        let j = open(tmp.path());
        assert!(j.needs_replay(), "segments left behind must be replayed");
        let lines: Vec<Vec<u8>> = j.entries().unwrap().into_iter().map(|e| e.bytes).collect();
        assert_eq!(lines, vec![br#"{"n":1}"#.to_vec(), br#"{"n":2}"#.to_vec()]);
    }

    #[test]
    fn a_damaged_line_that_is_not_the_torn_tail_stops_the_replay_naming_segment_and_line() {
        let tmp = tempfile::tempdir().unwrap();
        let mut j = open(tmp.path());
        j.append(br#"{"n":1}"#).unwrap();
        let path = j.dir.join(segment_name(1));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"n\":2, \"cu\x00\x00t\n").unwrap();
        drop(f);
        j.append(br#"{"n":3}"#).unwrap();
        drop(j);
        let e = open(tmp.path()).entries().unwrap_err().to_string();
        assert!(
            e.contains(&segment_name(1)) && e.contains("line 2 is damaged"),
            "{e}"
        );
    }

    #[test]
    fn a_checkpoint_deletes_the_covered_segments_and_appends_go_on_in_a_new_one() {
        let tmp = tempfile::tempdir().unwrap();
        let mut j = open(tmp.path());
        j.append(br#"{"n":1}"#).unwrap();
        assert_eq!(list_segments(&j.root, &j.dir).unwrap(), vec![1]);
        j.checkpoint().unwrap();
        assert_eq!(list_segments(&j.root, &j.dir).unwrap(), Vec::<u64>::new());
        j.append(br#"{"n":2}"#).unwrap();
        assert_eq!(list_segments(&j.root, &j.dir).unwrap(), vec![2]);
        let lines: Vec<Vec<u8>> = j.entries().unwrap().into_iter().map(|e| e.bytes).collect();
        assert_eq!(lines, vec![br#"{"n":2}"#.to_vec()]);
    }

    #[test]
    fn no_checkpoint_runs_while_a_replay_is_owed() {
        let tmp = tempfile::tempdir().unwrap();
        let mut j = open(tmp.path());
        j.append(br#"{"n":1}"#).unwrap();
        j.set_needs_replay(true);
        j.checkpoint().unwrap();
        assert_eq!(list_segments(&j.root, &j.dir).unwrap(), vec![1]);
        j.set_needs_replay(false);
        j.checkpoint().unwrap();
        assert_eq!(list_segments(&j.root, &j.dir).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn the_checkpointer_empties_the_journal_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let shared: Shared = Arc::new(Mutex::new(open(tmp.path())));
        let c = Checkpointer::start(shared.clone());
        lock(&shared).append(br#"{"n":1}"#).unwrap();
        drop(c);
        assert_eq!(
            list_segments(&lock(&shared).root, &tmp.path().join("journal")).unwrap(),
            Vec::<u64>::new()
        );
    }
}
