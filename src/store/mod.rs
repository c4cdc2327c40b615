//! The seam between the engine and where waitpoints live: the [`Store`] and [`Txn`] traits,
//! and the home's files as their embedded implementation ([`Files`]).
//!
//! The engine decides (rules, counting, wakes); a store keeps what it decided. Everything the
//! engine reads or writes about a waitpoint goes through these traits: its state with the
//! version a write must still match, its signal records, the set of waitpoints a session sees,
//! every waitpoint for the scheduler, and hints that something changed. The operations are the
//! ones `docs/scale-out.md` maps onto a distributed store (transactions guarded by key
//! revisions, prefix reads, watches): a second backend implements these two traits and nothing
//! in the engine changes.
//!
//! What the traits promise, whatever the backend:
//! - a waitpoint read through a [`Txn`] is not changed by any other writer until the
//!   transaction ends, and every write of the transaction is checked against the
//!   [`Version`] it was read at ([`Conflict`](crate::error::Error::Conflict) otherwise);
//! - [`Txn::commit`] is all or nothing and durable when it returns: the records, states and
//!   wakes of every change, or none of them;
//! - a recorded identity stays recorded as long as its waitpoint ([`Store::identities`]), which
//!   is what makes a second copy of a signal a duplicate.

mod cluster;
pub(crate) mod dirwatch;
#[cfg(feature = "etcd")]
pub mod etcd;
mod files;
mod finding;
mod forward;
pub mod import;
mod index;
pub mod signal_log;

use crate::settings::location::Location;

use crate::delivery::Inboxes;
use crate::error::Result;
use crate::home::Home;
use crate::records::{Callback, JournalChange, SignalRecord, Timer, Waitpoint, Wake};

pub use cluster::{Cluster, Guard};
pub use files::{Files, signal_file_name};
pub use finding::{Finding, Level};
pub use forward::Forwarded;

/// What [`copy_all`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Copied {
    pub waitpoints: usize,
    pub records: usize,
    pub timers: usize,
    /// Ids the destination had already (left as they were there).
    pub skipped: Vec<String>,
    /// The source's revision everything was read at, when it has revisions.
    pub revision: Option<i64>,
}

/// Copies every waitpoint of `from`, with its records, and every timer into `to` (`waitpoint
/// export` and `import`); an id `to` has already is left alone and reported.
pub fn copy_all(from: &dyn Store, to: &dyn Store) -> Result<Copied> {
    let mut copied = Copied::default();
    copied.revision = from.for_each_whole(&mut |wp, records| {
        if to.put_whole(&wp, &records)? {
            copied.waitpoints += 1;
            copied.records += records.len();
        } else {
            copied.skipped.push(wp.id);
        }
        Ok(())
    })?;
    for t in from.timers().all_docs()? {
        copy_timer(t, to, &mut copied)?;
    }
    Ok(copied)
}

/// Stores timer `t` in `to` unless its id is taken there (then it is listed as skipped).
fn copy_timer(t: Timer, to: &dyn Store, copied: &mut Copied) -> Result<()> {
    let mut txn = to.timers().begin_docs()?;
    if txn.read(&t.id)?.is_some() {
        copied.skipped.push(t.id);
    } else {
        txn.put(&t)?;
        copied.timers += 1;
    }
    Ok(())
}

/// Who writes through a shared store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A command: writes under revision checks only, and hands signals over.
    Command,
    /// A daemon: applies signals while it leads, and every write it makes is fenced.
    Daemon,
}

/// The shared store `location` names, for `home`'s host (`None` for the home's own files).
/// `host` is the name this host goes by there; the system's host name when `None`.
pub fn open_shared(
    location: &Location,
    host: Option<&str>,
    home: &Home,
    role: Role,
) -> Result<Option<std::sync::Arc<dyn Store>>> {
    let loc = match location {
        Location::Files => return Ok(None),
        Location::Etcd(loc) => loc,
    };
    let host = match host {
        Some(h) => h.to_owned(),
        None => rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned(),
    };
    #[cfg(feature = "etcd")]
    {
        let store = etcd::Etcd::connect(loc, &host, home.clone(), role)?;
        Ok(Some(std::sync::Arc::new(store)))
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = (host, home, role);
        Err(crate::error::Error::Usage(format!(
            "store {} needs a build with the etcd store: cargo install --features etcd \
             (see docs/etcd.md)",
            loc.display()
        )))
    }
}

/// The version of a waitpoint's state a transaction read, which each of its writes must still
/// match. On files it is the state's signal count under the waitpoint's lock; on a store with
/// revisions it is the key's revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version(pub u64);

/// One waitpoint's part of a commit: the state it was read at, its new state, and the records
/// and wakes the commit adds (the journal's change, with its precondition).
#[derive(Clone, Debug)]
pub struct Change {
    pub expect: Version,
    pub change: JournalChange,
}

/// Something about the waitpoints changed; a hint, never the truth (the reader reads again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hint {
    /// This waitpoint appeared or changed.
    Changed(String),
    /// Hints were lost (an overflow, a compaction): read everything again.
    Resync,
    /// A host handed signals over for the leader to apply (a shared store).
    Forwarded,
    /// This timer appeared or changed (a shared store; on files the daemon watches `timers/`).
    Timer(String),
    /// This callback changed, e.g. triggered on another host (a shared store).
    Callback(String),
    /// Wakes for this host's inboxes wait in the store (a shared store).
    Wakes,
}

/// Where waitpoints live. See the module docs for what every implementation promises.
pub trait Store: Send + Sync {
    /// Starts a transaction for reading waitpoints for update and writing them one by one.
    fn begin(&self) -> Result<Box<dyn Txn + '_>>;
    /// Starts a transaction that may also [`commit`](Txn::commit) a batch. Whatever an
    /// interrupted commit left unfinished is finished first ([`Txn::replayed`] says so).
    fn begin_batch(&self) -> Result<Box<dyn Txn + '_>>;
    /// A waitpoint as it is now, for a reader; `None` when there is no such id.
    fn get(&self, id: &str) -> Result<Option<Waitpoint>>;
    /// Several waitpoints as they are now, one answer per id, in order; a store across a
    /// network reads them in one round trip.
    fn get_many(&self, ids: &[&str]) -> Result<Vec<Option<Waitpoint>>> {
        ids.iter().map(|id| self.get(id)).collect()
    }
    /// Stores a new waitpoint; it is visible to readers, whole, once this returns.
    fn create(&self, wp: &Waitpoint) -> Result<()>;
    /// `(seq, identity key)` of every signal recorded for a waitpoint, in no order.
    fn identities(&self, id: &str) -> Result<Vec<(u64, String)>>;
    /// One recorded signal; `None` when it is not there.
    fn record(&self, id: &str, seq: u64, key: &str) -> Result<Option<SignalRecord>>;
    /// The recorded signals of `id` from `first_seq` on, in order.
    fn records(&self, id: &str, first_seq: u64) -> Result<Vec<SignalRecord>> {
        let mut keys: Vec<(u64, String)> = self
            .identities(id)?
            .into_iter()
            .filter(|(seq, _)| *seq >= first_seq)
            .collect();
        keys.sort();
        let mut out = Vec::with_capacity(keys.len());
        for (seq, key) in keys {
            if let Some(r) = self.record(id, seq, &key)? {
                out.push(r);
            }
        }
        Ok(out)
    }
    /// Calls `f` with every waitpoint, one at a time (the scheduler's scan at start).
    fn for_each(&self, f: &mut dyn FnMut(Waitpoint) -> Result<()>) -> Result<()>;
    /// The waitpoints `session` may see ([`Waitpoint::visible_to`]), oldest first.
    fn list_visible(&self, session: &str) -> Result<Vec<Waitpoint>>;
    /// Whether [`list_visible`](Self::list_visible) is answered without a full scan.
    fn index_is_complete(&self) -> bool;
    /// Brings whatever makes `list_visible` cheap in line with the waitpoints; returns how many
    /// entries it added.
    fn rebuild_index(&self) -> Result<usize>;
    /// Calls `hint` whenever a waitpoint appears or changes, until the returned guard drops.
    fn watch(&self, hint: Box<dyn Fn(Hint) + Send>) -> Result<Guard>;
    /// Whether interrupted commits may have left something to finish (cheap; a command asks
    /// before it takes the daemon's lock to [`recover`](Self::recover)). The default is a
    /// store whose transactions are whole or absent: never.
    fn needs_recovery(&self) -> bool {
        false
    }
    /// Finishes what interrupted commits left (after a crash); returns how many there were.
    fn recover(&self) -> Result<usize> {
        Ok(0)
    }
    /// For a command run while no daemon is: [`recover`](Self::recover), unless a daemon runs
    /// (it recovered at its start and owns what is left). A store whose recovery could race a
    /// daemon's writes keeps the daemon out meanwhile.
    fn recover_unattended(&self) -> Result<usize> {
        if self.needs_recovery() {
            self.recover()
        } else {
            Ok(0)
        }
    }
    /// Makes every commit so far durable in its final form, so nothing is left to recover. The
    /// default: every commit already is.
    fn checkpoint(&self) -> Result<()> {
        Ok(())
    }
    /// Starts the store's own background work for a long-running owner (the daemon); it runs
    /// until the returned guard drops. The default: there is none.
    fn background(&self) -> Result<Guard> {
        Ok(Guard::nothing())
    }

    /// Calls `f` with every waitpoint and its records, all as of one moment where the store
    /// has revisions (an export reads so). Returns that revision, if the store has one.
    fn for_each_whole(
        &self,
        f: &mut dyn FnMut(Waitpoint, Vec<SignalRecord>) -> Result<()>,
    ) -> Result<Option<i64>> {
        self.for_each(&mut |wp| {
            let records = self.records(&wp.id, 1)?;
            f(wp, records)
        })?;
        Ok(None)
    }
    /// Stores a waitpoint with its records as they are (an import, an export), unless its id
    /// is taken: `false` then, and nothing is written.
    fn put_whole(&self, wp: &Waitpoint, records: &[SignalRecord]) -> Result<bool>;

    /// The timers.
    fn timers(&self) -> &dyn Docs<Timer>;
    /// The callbacks.
    fn callbacks(&self) -> &dyn Docs<Callback>;

    /// What the store adds as one shared by several hosts; `None` for one home's files.
    fn cluster(&self) -> Option<&dyn Cluster> {
        None
    }
    /// This host's inboxes: where the wakes for the sessions it serves land.
    fn inboxes(&self) -> &Inboxes;
    /// Delivers a wake made outside a batch commit (an outbox flush) to its session's inbox,
    /// durably when this returns: into this host's [`inboxes`](Store::inboxes) here; on a
    /// shared store, to the session's host.
    fn deliver(&self, wake: &Wake) -> Result<()> {
        self.inboxes().deliver(wake)
    }
}

/// A record kept whole, one file (or key) each, changed under its kind's lock on files and
/// under a revision check on a shared store: a timer or a callback.
pub trait Doc: Clone + serde::Serialize + serde::de::DeserializeOwned + 'static {
    const KIND: DocKind;
    fn id(&self) -> &str;
    /// Whose it is: its wakes go to this session's inbox (on a shared store, to its host).
    fn session(&self) -> &str;
}

/// The kinds of [`Doc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocKind {
    Timer,
    Callback,
}

impl DocKind {
    /// Its directory under the home, and its key prefix in a shared store.
    pub fn dir(self, home: &Home) -> std::path::PathBuf {
        match self {
            DocKind::Timer => home.timers_dir(),
            DocKind::Callback => home.callbacks_dir(),
        }
    }
    pub fn prefix(self) -> &'static str {
        match self {
            DocKind::Timer => "tm/",
            DocKind::Callback => "cb/",
        }
    }
    pub fn is_id(self, id: &str) -> bool {
        match self {
            DocKind::Timer => crate::names::is_timer_id(id),
            DocKind::Callback => crate::names::is_callback_id(id),
        }
    }
    /// Whether a daemon writes it only while it leads. A timer fires on the leader; a
    /// callback is triggered wherever its request arrives (each write still compares the
    /// revision it read), and its hooks run on the leader.
    pub fn fenced(self) -> bool {
        self == DocKind::Timer
    }
}

/// `impl Doc` for a record type with `id` and `session` fields.
macro_rules! doc {
    ($t:ty, $kind:expr) => {
        impl Doc for $t {
            const KIND: DocKind = $kind;
            fn id(&self) -> &str {
                &self.id
            }
            fn session(&self) -> &str {
                &self.session
            }
        }
    };
}
doc!(Timer, DocKind::Timer);
doc!(Callback, DocKind::Callback);

/// The records of one kind of [`Doc`] in a store.
pub trait Docs<T> {
    /// One as it is now; `None` when there is no such id.
    fn get_doc(&self, id: &str) -> Result<Option<T>>;
    /// Every one, in no order.
    fn all_docs(&self) -> Result<Vec<T>>;
    /// Starts a transaction over them: what it reads is not changed by another writer before
    /// it writes it back (a lock on files, a revision check on a shared store).
    fn begin_docs(&self) -> Result<Box<dyn DocTxn<T> + '_>>;
}

/// A unit of work on one kind of [`Doc`] ([`Docs::begin_docs`]).
pub trait DocTxn<T> {
    /// Reads one for update; `None` when there is no such id.
    fn read(&mut self, id: &str) -> Result<Option<T>>;
    /// Writes one durably: one read in this transaction (unchanged since), or a new one.
    fn put(&mut self, doc: &T) -> Result<()>;
    /// Writes several as one commit: after a crash, readers see all of them or none (a reset
    /// that revokes one callback and issues its replacement).
    fn put_all(&mut self, docs: &[T]) -> Result<()>;
}

/// A unit of work on a [`Store`]: what it reads for update stays unchanged by others until it
/// ends (drops).
pub trait Txn {
    /// Says which waitpoints this transaction is about to [`read`](Self::read), so a store
    /// across a network fetches them in one round trip. Nothing on files.
    fn prefetch(&mut self, ids: &[&str]) -> Result<()> {
        let _ = ids;
        Ok(())
    }
    /// Reads a waitpoint for update; `None` when there is no such id.
    fn read(&mut self, id: &str) -> Result<Option<(Waitpoint, Version)>>;
    /// The version a write of `id` must match now: the one it was read at, moved on by this
    /// transaction's own writes. `None` when this transaction has not read it.
    fn version(&self, id: &str) -> Option<Version>;
    /// Replaces the state of a waitpoint read in this transaction, durably, now.
    fn put(&mut self, wp: &Waitpoint) -> Result<()>;
    /// Removes a waitpoint read in this transaction, with its records: its id is unknown from
    /// then on.
    fn remove(&mut self, wp: &Waitpoint) -> Result<()>;
    /// Commits every change, all or nothing, durable when it returns. Only a transaction from
    /// [`Store::begin_batch`] commits.
    fn commit(&mut self, changes: &[Change]) -> Result<()>;
    /// [`Txn::commit`], calling `durable` the moment the changes are durable, which may be
    /// before the commit returns: on the home's files, once the journal line is fdatasynced and
    /// before the files it describes are written. An error after `durable` ran means the
    /// changes are durable but not all written out yet, which the store repairs itself.
    fn commit_notify(&mut self, changes: &[Change], durable: &mut dyn FnMut()) -> Result<()> {
        self.commit(changes)?;
        durable();
        Ok(())
    }
    /// Whether starting this transaction finished an interrupted commit, so what the caller
    /// remembers about any waitpoint may be older than the store.
    fn replayed(&self) -> bool;
}
