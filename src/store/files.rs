//! The embedded store: waitpoints as directories of JSON files under the home, changed under
//! a per-waitpoint lock, with batches committed through the journal.
//!
//! A waitpoint is `waitpoints/<id>/waitpoint.json` (its state) and `signals.jsonl` (its
//! recorded signals, one line each, appended by the batches that record them: see
//! `store/signal_log.rs`). A transaction holds each waitpoint's lock (`flock` on its directory)
//! from its read to its end, so the version it read cannot change under it. A batch is one
//! journal line (every record, state and wake), fdatasynced: that is the commit; its files are
//! written after it, atomically but without their own fsync, and the journal's checkpoint makes
//! them durable. After a crash the lines left are re-applied ([`Files::recover`]) before any
//! state is read. See `ARCHITECTURE.md`, "Commit order".

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::clock::Clock;
use crate::delivery::Inboxes;
use crate::durable::{self, FileLock, Trash, Unsynced};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::journal::{self, Journal};
use crate::names::is_waitpoint_id;
use crate::records::{
    Callback, JOURNAL_FORMAT, JournalChange, JournalEntry, SignalRecord, Timer, Waitpoint,
};
use crate::request::record_key;

use super::signal_log::{self, Mend};
use super::{Change, Doc, DocTxn, Docs, Hint, Store, Txn, Version};

/// A new waitpoint's directory is built under this prefix and renamed into place.
pub(super) const STAGING_PREFIX: &str = ".new-";

/// The home's waitpoints. Cheap to build; one per engine, shared across a settings reload.
pub struct Files {
    pub(super) home: Home,
    /// The home's inboxes, where a batch's wakes are staged.
    inboxes: Inboxes,
    clock: Arc<dyn Clock>,
    /// The journal batches commit through; opened by the first batch (only the daemon, or a
    /// command run while no daemon is, applies batches).
    journal: OnceLock<journal::Shared>,
    /// Where replaced states go when the daemon empties it in the background; without one (a
    /// command), they are freed in place. Shared with the engine, which opens it.
    trash: Arc<OnceLock<Arc<Trash>>>,
}

impl Files {
    pub fn new(home: Home, clock: Arc<dyn Clock>, trash: Arc<OnceLock<Arc<Trash>>>) -> Files {
        Files {
            inboxes: Inboxes::new(home.clone()),
            home,
            clock,
            journal: OnceLock::new(),
            trash,
        }
    }

    fn journal(&self) -> Result<&journal::Shared> {
        if let Some(j) = self.journal.get() {
            return Ok(j);
        }
        let j = Journal::open(Arc::clone(self.home.root_dir()), &self.home.journal_dir())?;
        Ok(self.journal.get_or_init(|| Arc::new(Mutex::new(j))))
    }

    /// Reads one record met while listing many, setting it aside if it does not parse
    /// ([`durable::read_json_or_set_aside`]), so one bad file stops no listing.
    pub(super) fn read_listed(&self, id: &str) -> Result<Option<Waitpoint>> {
        if !is_waitpoint_id(id) {
            return Ok(None);
        }
        durable::read_json_or_set_aside(self.home.root_dir(), &self.home.waitpoint_file(id))
    }

    /// Every waitpoint, oldest first (a full scan).
    pub(super) fn list(&self) -> Result<Vec<Waitpoint>> {
        let mut out = Vec::new();
        self.for_each(&mut |wp| {
            out.push(wp);
            Ok(())
        })?;
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    fn lock(&self, id: &str) -> Result<Option<FileLock>> {
        // No look before the open: a missing directory is `NotFound` from the open itself.
        if !is_waitpoint_id(id) {
            return Ok(None);
        }
        match FileLock::acquire_dir(self.home.root_dir(), &self.home.waitpoint_dir(id)) {
            Ok(l) => Ok(Some(l)),
            // Missing (never made, or removed by retention): it is unknown.
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the files `changes` describe, atomically but without fsync. A `replay` writes only
    /// what is missing or older on disk: a state whose signal count is below the entry's, a
    /// record or wake that is absent or unreadable. A waitpoint whose directory is gone
    /// (retention, a deleted session) is skipped.
    fn write_changes(&self, changes: &[JournalChange], replay: bool) -> Result<()> {
        let mut files = Unsynced::new();
        for change in changes {
            let id = &change.state.id;
            if replay && !self.home.waitpoint_dir(id).is_dir() {
                continue;
            }
            // The wakes first: a small batch is written in this order, and the wake is what a
            // waiting reader looks for.
            for wake in &change.wakes {
                self.inboxes.stage(wake, replay, &mut files);
            }
            // The records: one append to the waitpoint's log; a replay writes what the log
            // lacks, and the whole log again if it ends in a line a crash cut short.
            let log = self.home.signal_log(id);
            if !replay {
                files.append(&log, signal_log::lines(&change.records));
            } else if !change.records.is_empty() {
                match signal_log::merged(signal_log::read(&self.home, id)?, &change.records) {
                    Mend::Nothing => {}
                    Mend::Append(bytes) => files.append(&log, bytes),
                    Mend::Rewrite(bytes) => files.replace_bytes(&log, bytes),
                }
            }
            let state = self.home.waitpoint_file(id);
            let stale = |disk: Waitpoint| disk.counters.signals < change.state.counters.signals;
            if !replay
                || self
                    .home
                    .root_dir()
                    .read_json::<Waitpoint>(&state)
                    .map_or(true, |d| d.is_none_or(stale))
            {
                files.rewrite_json(&state, &change.state, durable::SPARE_REST);
            }
        }
        files.commit(self.home.root_dir(), self.trash.get().map(|t| t.as_ref()))
    }

    /// Re-applies every entry left in the journal (after a crash, or a batch whose files could
    /// not all be written), then checkpoints it. Returns how many entries there were.
    fn replay_locked(&self, journal: &mut Journal) -> Result<usize> {
        let entries = journal.entries()?;
        for e in &entries {
            let entry: JournalEntry =
                serde_json::from_slice(&e.bytes).map_err(|err| Error::Corrupt {
                    path: e.segment.clone(),
                    message: format!("line {}: {err}", e.line),
                })?;
            if entry.journal != JOURNAL_FORMAT {
                return Err(Error::Corrupt {
                    path: e.segment.clone(),
                    message: format!(
                        "line {}: journal format {} (this build reads {JOURNAL_FORMAT})",
                        e.line, entry.journal
                    ),
                });
            }
            self.write_changes(&entry.changes, true)?;
        }
        if !entries.is_empty() {
            tracing::warn!(
                entries = entries.len(),
                "replayed the journal a crash or a failed write left"
            );
        }
        journal.set_needs_replay(false);
        journal.checkpoint()?;
        Ok(entries.len())
    }
}

impl Store for Files {
    fn inboxes(&self) -> &Inboxes {
        &self.inboxes
    }

    fn begin(&self) -> Result<Box<dyn Txn + '_>> {
        Ok(Box::new(FileTxn {
            files: self,
            journal: None,
            held: HashMap::new(),
            replayed: false,
        }))
    }

    fn begin_batch(&self) -> Result<Box<dyn Txn + '_>> {
        let shared = self.journal()?;
        let mut journal = journal::lock(shared);
        let replayed = journal.needs_replay();
        if replayed {
            self.replay_locked(&mut journal)
                .map_err(|e| Error::Corrupt {
                    path: self.home.journal_dir(),
                    message: format!("cannot replay the journal before applying signals: {e}"),
                })?;
        }
        Ok(Box::new(FileTxn {
            files: self,
            journal: Some(journal),
            held: HashMap::new(),
            replayed,
        }))
    }

    fn get(&self, id: &str) -> Result<Option<Waitpoint>> {
        if !is_waitpoint_id(id) {
            return Ok(None);
        }
        self.home
            .root_dir()
            .read_json(&self.home.waitpoint_file(id))
    }

    /// A new waitpoint with no records (built as `Files::build` builds one).
    fn create(&self, wp: &Waitpoint) -> Result<()> {
        self.build(wp, &[])
    }

    fn timers(&self) -> &dyn Docs<Timer> {
        self
    }

    fn callbacks(&self) -> &dyn Docs<Callback> {
        self
    }

    fn put_whole(&self, wp: &Waitpoint, records: &[SignalRecord]) -> Result<bool> {
        // The id becomes a directory name, and the staging clean-up removes it on failure.
        if !is_waitpoint_id(&wp.id) {
            return Err(Error::invalid(
                "id",
                format!("{:?} is not a waitpoint id", wp.id),
            ));
        }
        if self.home.waitpoint_dir(&wp.id).exists() {
            return Ok(false);
        }
        self.build(wp, records).map(|()| true)
    }

    fn identities(&self, id: &str) -> Result<Vec<(u64, String)>> {
        Ok(signal_log::read(&self.home, id)?
            .records
            .iter()
            .map(|r| (r.seq, record_key(r)))
            .collect())
    }

    fn record(&self, id: &str, seq: u64, key: &str) -> Result<Option<SignalRecord>> {
        Ok(signal_log::read(&self.home, id)?
            .records
            .into_iter()
            .find(|r| r.seq == seq && record_key(r) == key))
    }

    /// One read of the log's end for all of them.
    fn records(&self, id: &str, first_seq: u64) -> Result<Vec<SignalRecord>> {
        signal_log::read_from(&self.home, id, first_seq)
    }

    /// Streams the waitpoints directory, so a scan of a large home holds one waitpoint in
    /// memory, not all of them. A waitpoint removed during the scan is skipped.
    ///
    /// The states are read and parsed on a few threads (a chunk of names each at a time) and
    /// handed to `f` on this one, in no particular order, through a bounded channel: a scan of
    /// a million waitpoints is mostly opening and parsing files, which two cores do in half
    /// the time, while at most a few chunks are in memory.
    fn for_each(&self, f: &mut dyn FnMut(Waitpoint) -> Result<()>) -> Result<()> {
        const CHUNK: usize = 256;
        let mut ids = self
            .home
            .root_dir()
            .list_names(&self.home.waitpoints_dir())?;
        ids.retain(|id| is_waitpoint_id(id));
        let readers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(4);
        if readers < 2 || ids.len() <= CHUNK {
            for id in &ids {
                if let Some(wp) = self.read_listed(id)? {
                    f(wp)?;
                }
            }
            return Ok(());
        }
        let chunks: Vec<&[String]> = ids.chunks(CHUNK).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<Waitpoint>>>(readers * 2);
            for _ in 0..readers {
                let (tx, chunks, next) = (tx.clone(), &chunks, &next);
                scope.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(chunk) = chunks.get(i) else { break };
                        let read: Result<Vec<Waitpoint>> = chunk
                            .iter()
                            .filter_map(|id| self.read_listed(id).transpose())
                            .collect();
                        let failed = read.is_err();
                        // A closed channel: the caller stopped (an error); so do the readers.
                        if tx.send(read).is_err() || failed {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let result = rx
                .iter()
                .try_for_each(|read| read?.into_iter().try_for_each(&mut *f));
            // Stop the readers at once on an error: nothing more is taken from the channel.
            next.store(chunks.len(), std::sync::atomic::Ordering::Relaxed);
            drop(rx);
            result
        })
    }

    fn list_visible(&self, session: &str) -> Result<Vec<Waitpoint>> {
        self.list_visible_files(session)
    }

    fn index_is_complete(&self) -> bool {
        self.home.session_index_complete().exists()
    }

    fn rebuild_index(&self) -> Result<usize> {
        self.rebuild_index_files()
    }

    /// A watcher on the waitpoints directory: a directory renamed (or made) into place is a new
    /// waitpoint (a command made it). Changes the daemon makes itself need no hint, and the
    /// kernel is asked for no event they cause: the daemon opens and closes a waitpoint's
    /// directory for every signal (its lock), which a watch asking for `IN_OPEN` would hear.
    fn watch(&self, hint: Box<dyn Fn(Hint) + Send>) -> Result<super::Guard> {
        use super::dirwatch::{COMPLETE_FILES, DirWatch, Seen};
        let dir = self.home.waitpoints_dir();
        self.home.root_dir().create_dir_private(&dir)?;
        let mask = COMPLETE_FILES | rustix::fs::inotify::WatchFlags::CREATE;
        let watcher = DirWatch::spawn(std::slice::from_ref(&dir), mask, move |seen| match seen {
            Seen::Lost => hint(Hint::Resync),
            Seen::Ready(_, id) if is_waitpoint_id(id) => hint(Hint::Changed(id.to_owned())),
            Seen::Ready(..) => {}
        })
        .map_err(|e| Error::io("cannot watch", &dir, e))?;
        Ok(super::Guard::new(watcher))
    }

    fn needs_recovery(&self) -> bool {
        journal::has_segments(self.home.root_dir(), &self.home.journal_dir())
    }

    fn recover(&self) -> Result<usize> {
        let mut journal = journal::lock(self.journal()?);
        if journal.needs_replay() {
            self.replay_locked(&mut journal)
        } else {
            Ok(0)
        }
    }

    /// Holds the daemon lock while it replays, so no daemon starts and reads or changes a state
    /// the journal is about to overwrite; when a daemon holds it, the daemon replayed at its
    /// start and this does nothing.
    fn recover_unattended(&self) -> Result<usize> {
        if !self.needs_recovery() {
            return Ok(0);
        }
        let lock =
            match FileLock::try_acquire_writing_pid(self.home.root_dir(), &self.home.daemon_lock())
            {
                Ok(l) => l,
                Err(Error::Locked { .. }) => return Ok(0),
                Err(e) => return Err(e),
            };
        let replayed = self.recover()?;
        lock.clear();
        Ok(replayed)
    }

    fn checkpoint(&self) -> Result<()> {
        match self.journal.get() {
            Some(j) => journal::lock(j).checkpoint(),
            None => Ok(()),
        }
    }

    /// The journal's checkpointer, which syncs the files of committed batches and empties it.
    fn background(&self) -> Result<super::Guard> {
        Ok(super::Guard::new(journal::Checkpointer::start(
            self.journal()?.clone(),
        )))
    }
}

/// A transaction on the files: the locks of the waitpoints it read, and for a batch the journal,
/// held until it drops so the checkpointer never runs between an entry and its files.
struct FileTxn<'a> {
    files: &'a Files,
    journal: Option<MutexGuard<'a, Journal>>,
    held: HashMap<String, (FileLock, Version)>,
    replayed: bool,
}

impl FileTxn<'_> {
    /// The version `id` was read at in this transaction, or the conflict of writing one it did
    /// not read.
    fn version_of(&self, id: &str) -> Result<Version> {
        match self.held.get(id) {
            Some((_, v)) => Ok(*v),
            None => Err(Error::Conflict(format!(
                "{id} was not read for update before it was written"
            ))),
        }
    }

    fn set_version(&mut self, wp: &Waitpoint) {
        if let Some((_, v)) = self.held.get_mut(&wp.id) {
            *v = Version(wp.counters.signals);
        }
    }
}

impl Txn for FileTxn<'_> {
    fn read(&mut self, id: &str) -> Result<Option<(Waitpoint, Version)>> {
        if !self.held.contains_key(id) {
            let Some(lock) = self.files.lock(id)? else {
                return Ok(None);
            };
            self.held.insert(id.to_owned(), (lock, Version(0)));
        }
        match self.files.get(id)? {
            Some(wp) => {
                let v = Version(wp.counters.signals);
                self.set_version(&wp);
                Ok(Some((wp, v)))
            }
            None => {
                self.held.remove(id);
                Ok(None)
            }
        }
    }

    fn version(&self, id: &str) -> Option<Version> {
        self.held.get(id).map(|(_, v)| *v)
    }

    fn put(&mut self, wp: &Waitpoint) -> Result<()> {
        self.version_of(&wp.id)?;
        let home = &self.files.home;
        home.root_dir()
            .commit_json(&home.waitpoint_file(&wp.id), wp)?;
        self.set_version(wp);
        Ok(())
    }

    /// Renames the directory away first, so a crash mid-delete never leaves a half-removed
    /// waitpoint that parses; its index markers go last (index.rs).
    fn remove(&mut self, wp: &Waitpoint) -> Result<()> {
        self.version_of(&wp.id)?;
        let home = &self.files.home;
        let id = wp.id.as_str();
        let dir = home.waitpoint_dir(id);
        let parent = home.waitpoints_dir();
        let grave = parent.join(format!(".gone-{id}"));
        let root = home.root_dir();
        root.rename(&dir, &grave)
            .map_err(|e| Error::io("cannot remove", &dir, e))?;
        root.fsync_dir(&parent)?;
        root.remove_tree(&grave)?;
        self.files.index_remove(wp)?;
        self.held.remove(id);
        Ok(())
    }

    fn commit(&mut self, changes: &[Change]) -> Result<()> {
        self.commit_notify(changes, &mut || {})
    }

    fn commit_notify(&mut self, changes: &[Change], durable: &mut dyn FnMut()) -> Result<()> {
        for c in changes {
            let read = self.version_of(&c.change.state.id)?;
            if read != c.expect {
                return Err(Error::Conflict(format!(
                    "{} changed since it was read (version {} then, {} now)",
                    c.change.state.id, c.expect.0, read.0
                )));
            }
        }
        let Some(journal) = self.journal.as_mut() else {
            return Err(Error::Conflict(
                "a batch commits only in a transaction begun for one".into(),
            ));
        };
        if changes.is_empty() {
            return Ok(());
        }
        let entry = JournalEntry {
            journal: JOURNAL_FORMAT,
            committed_at: self.files.clock.now(),
            changes: changes.iter().map(|c| c.change.clone()).collect(),
        };
        journal.append(&serde_json::to_vec(&entry).expect("our records always serialise"))?;
        // The fdatasynced line is the commit: whoever waits for it need not wait for the files.
        durable();
        let written = written_after_journal(self.files, &entry.changes);
        if let Err(e) = written {
            // Committed, but not every file is written: the next batch re-applies the journal
            // before it decides anything, and the signals of this one then count as duplicates.
            journal.set_needs_replay(true);
            return Err(e);
        }
        for c in changes {
            self.set_version(&c.change.state);
        }
        Ok(())
    }

    fn replayed(&self) -> bool {
        self.replayed
    }
}

impl Files {
    /// Builds a waitpoint's directory under a dot-name, its records first, and renames it into
    /// place, so the daemon's watcher sees one complete directory appear and never a half-made
    /// one.
    fn build(&self, wp: &Waitpoint, records: &[SignalRecord]) -> Result<()> {
        let parent = self.home.waitpoints_dir();
        self.home.root_dir().create_dir_private(&parent)?;
        let staging = parent.join(format!("{STAGING_PREFIX}{}", wp.id));
        let _ = self.home.root_dir().remove_tree(&staging);
        self.home.root_dir().create_dir_private(&staging)?;
        // The log exists from the start, so recording a signal only ever appends to it.
        let result = self
            .home
            .root_dir()
            .write_synced(&staging.join("signals.jsonl"), &signal_log::lines(records))
            // The index markers before the state: a waitpoint never exists without them
            // (index.rs).
            .and_then(|()| self.index_add(wp))
            .and_then(|()| {
                self.home
                    .root_dir()
                    .commit_json(&staging.join("waitpoint.json"), wp)
            })
            // Its spare, empty: each state written for a signal goes over it in place and
            // makes no file (`Unsynced::rewrite_json`). Not synced: a spare a crash loses is
            // made again by the next write.
            .and_then(|()| {
                let spare = staging.join(durable::spare_name("waitpoint.json"));
                self.home.root_dir().create_empty(&spare)
            })
            .and_then(|()| self.home.root_dir().fsync_dir(&staging))
            .and_then(|()| {
                self.home
                    .root_dir()
                    .rename(&staging, &self.home.waitpoint_dir(&wp.id))
                    .map_err(|e| Error::io("cannot create waitpoint", &staging, e))
            })
            .and_then(|()| self.home.root_dir().fsync_dir(&parent));
        if result.is_err() {
            let _ = self.home.root_dir().remove_tree(&staging);
        }
        result
    }
}

impl<T: Doc> Docs<T> for Files {
    /// `<kind dir>/<id>.json`.
    fn get_doc(&self, id: &str) -> Result<Option<T>> {
        if !T::KIND.is_id(id) {
            return Ok(None);
        }
        if let Some(d) = pending_docs::<T>(self)?.into_iter().find(|d| d.id() == id) {
            return Ok(Some(d));
        }
        self.home
            .root_dir()
            .read_json(&T::KIND.dir(&self.home).join(format!("{id}.json")))
    }

    /// Every one of a kind; one that does not parse is set aside (`quarantine/`).
    fn all_docs(&self) -> Result<Vec<T>> {
        let pending = pending_docs::<T>(self)?;
        let mut out: Vec<T> = pending.clone();
        for (name, path) in self.home.root_dir().list_dir(&T::KIND.dir(&self.home))? {
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if T::KIND.is_id(id)
                && !pending.iter().any(|p| p.id() == id)
                && let Some(d) = durable::read_json_or_set_aside(self.home.root_dir(), &path)?
            {
                out.push(d);
            }
        }
        Ok(out)
    }

    fn begin_docs(&self) -> Result<Box<dyn DocTxn<T> + '_>> {
        Ok(Box::new(FileDocs::begin(self)?))
    }
}

/// One kind of record under its directory's lock (`timers/.lock`, `callbacks/.lock`), held
/// until the transaction ends.
struct FileDocs<'a, T> {
    files: &'a Files,
    _lock: FileLock,
    kind: std::marker::PhantomData<T>,
}

/// `<kind dir>/.intent.json`: the documents of a [`DocTxn::put_all`] in flight, committed as
/// one file before any of them is written. Its commit is the transaction's: once it exists,
/// readers see its documents, and the next transaction writes whatever it holds that a crash
/// left unwritten, then removes it.
const INTENT: &str = ".intent.json";

/// The documents of an intent a crash or a writer in progress left (see [`INTENT`]).
fn pending_docs<T: Doc>(files: &Files) -> Result<Vec<T>> {
    let path = T::KIND.dir(&files.home).join(INTENT);
    Ok(
        durable::read_json_or_set_aside::<Vec<T>>(files.home.root_dir(), &path)?
            .unwrap_or_default(),
    )
}

impl<'a, T: Doc> FileDocs<'a, T> {
    fn begin(files: &'a Files) -> Result<Self> {
        let dir = T::KIND.dir(&files.home);
        let root = files.home.root_dir();
        root.create_dir_private(&dir)?;
        let txn = FileDocs {
            files,
            _lock: FileLock::acquire(root, &dir.join(".lock"))?,
            kind: std::marker::PhantomData,
        };
        let pending = pending_docs::<T>(files)?;
        if !pending.is_empty() {
            txn.write_out(&pending)?;
            tracing::info!(
                documents = pending.len(),
                "finished a commit of several documents an interruption left"
            );
        }
        Ok(txn)
    }

    /// Writes each document to its own file, then removes the intent.
    fn write_out(&self, docs: &[T]) -> Result<()> {
        let dir = T::KIND.dir(&self.files.home);
        let root = self.files.home.root_dir();
        for doc in docs {
            root.commit_json(&dir.join(format!("{}.json", doc.id())), doc)?;
        }
        root.remove_durably(&dir.join(INTENT))
    }
}

impl<T: Doc> DocTxn<T> for FileDocs<'_, T> {
    fn read(&mut self, id: &str) -> Result<Option<T>> {
        Docs::<T>::get_doc(self.files, id)
    }

    fn put(&mut self, doc: &T) -> Result<()> {
        let dir = T::KIND.dir(&self.files.home);
        let root = self.files.home.root_dir();
        root.commit_json(&dir.join(format!("{}.json", doc.id())), doc)
    }

    fn put_all(&mut self, docs: &[T]) -> Result<()> {
        if let [one] = docs {
            return self.put(one);
        }
        let home = &self.files.home;
        home.root_dir()
            .commit_json(&T::KIND.dir(home).join(INTENT), &docs)?;
        crate::failpoint!(
            crate::failpoint::DOCS_AFTER_INTENT,
            "cannot write the documents of",
            &T::KIND.dir(&self.files.home)
        );
        self.write_out(docs)
    }
}

/// Writes a just-committed entry's files.
fn written_after_journal(files: &Files, changes: &[JournalChange]) -> Result<()> {
    crate::failpoint!(
        crate::failpoint::ENGINE_AFTER_JOURNAL,
        "cannot write the files of",
        &files.home.journal_dir()
    );
    files.write_changes(changes, false)
}

/// `<seq>-<identity key>.json`, the seq zero-padded so `ls` sorts in arrival order.
pub fn signal_file_name(seq: u64, key: &str) -> String {
    format!("{seq:06}-{key}.json")
}

pub(crate) fn parse_signal_file_name(name: &str) -> Option<(u64, String)> {
    if durable::is_temp_name(name) {
        return None;
    }
    let stem = name.strip_suffix(".json")?;
    let (seq, key) = stem.split_once('-')?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((seq.parse().ok()?, key.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::identity_key;

    #[test]
    fn signal_file_names_round_trip_their_identity_key() {
        let key = identity_key("spool:1733-42-7.json");
        assert_eq!(key, "spool:1733-42-7.json");
        let name = signal_file_name(7, &key);
        assert_eq!(name, "000007-spool:1733-42-7.json.json");
        assert_eq!(parse_signal_file_name(&name), Some((7, key)));
    }

    #[test]
    fn odd_identities_are_encoded_and_long_ones_hashed() {
        assert_eq!(identity_key("spool:a b/\n"), "spool:a%20b%2F%0A");
        let long = format!("spool:{}", "x".repeat(400));
        let k = identity_key(&long);
        assert!(k.len() < 200);
        assert_ne!(k, identity_key(&format!("spool:{}y", "x".repeat(399))));
    }

    /// The waitpoints' watch hints at a waitpoint renamed or made into place, and not at the
    /// daemon's own opens of a waitpoint's directory (the lock of every signal): the open comes
    /// first in the kernel's queue, so had it been heard its hint would be the first.
    #[test]
    fn the_waitpoints_watch_hints_at_new_waitpoints_and_not_at_opens_of_their_directories() {
        use crate::store::Store;
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::new(tmp.path());
        let files = Files::new(
            home.clone(),
            Arc::new(crate::clock::SystemClock),
            Arc::default(),
        );
        let (old, renamed, made) = ("wp_00000000000a", "wp_00000000000b", "wp_00000000000c");
        std::fs::create_dir_all(home.waitpoint_dir(old)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let _watch = files
            .watch(Box::new(move |hint| {
                let _ = tx.send(hint);
            }))
            .unwrap();
        drop(std::fs::File::open(home.waitpoint_dir(old)).unwrap());
        let staging = home
            .waitpoints_dir()
            .join(format!("{STAGING_PREFIX}{renamed}"));
        std::fs::create_dir(&staging).unwrap();
        std::fs::rename(&staging, home.waitpoint_dir(renamed)).unwrap();
        std::fs::create_dir(home.waitpoint_dir(made)).unwrap();
        assert_eq!(rx.recv().unwrap(), Hint::Changed(renamed.to_owned()));
        assert_eq!(rx.recv().unwrap(), Hint::Changed(made.to_owned()));
    }
}
