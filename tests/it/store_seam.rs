//! The `Store` seam: a second backend, written here in memory, runs the engine unchanged. It
//! proves the interface is one another store can implement (nothing file-shaped leaks through
//! it), and that the engine reaches waitpoints only through it: with the memory store, the
//! home's `waitpoints/` stays empty while waitpoints are armed, signalled and resolved.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use waitpoint::clock::SystemClock;
use waitpoint::delivery::Inboxes;
use waitpoint::engine::{CreateRequest, Engine, Verdict};
use waitpoint::error::{Error, Result};
use waitpoint::home::Home;
use waitpoint::ingress::{SpoolBody, parse_spool_body};
use waitpoint::records::{SignalRecord, Status, Waitpoint};
use waitpoint::request::{SignalRequest, Source};
use waitpoint::request::{identity_key, identity_of};
use waitpoint::settings::Settings;
use waitpoint::store::{Change, Hint, Store, Txn, Version};

use crate::helpers::*;

/// One waitpoint in memory: its state, its revision and its records by identity key.
#[derive(Clone)]
struct Entry {
    wp: Waitpoint,
    revision: u64,
    records: BTreeMap<String, SignalRecord>,
}

/// A store in memory, shaped like a revisioned key-value store: each write bumps the
/// waitpoint's revision and each commit is checked against the revisions it read.
struct Memory {
    inboxes: Inboxes,
    /// Timers and callbacks stay the home's files here (this test is about waitpoints).
    timers: waitpoint::store::Files,
    entries: Mutex<BTreeMap<String, Entry>>,
    /// One writer at a time, as a leader would be; readers are not blocked by it.
    writer: Mutex<()>,
    commits: Mutex<usize>,
    /// Where this store says its leadership lease is gone (a shared store's refusal).
    lease_lost: Mutex<Option<LeaseLostAt>>,
}

#[derive(Clone, Copy, Debug)]
enum LeaseLostAt {
    Begin,
    Commit,
}

fn lease_lost() -> Error {
    Error::LeaseLost { retry_after_s: 7 }
}

impl Memory {
    fn new(home: &Home) -> Memory {
        Memory {
            inboxes: Inboxes::new(home.clone()),
            timers: waitpoint::store::Files::new(
                home.clone(),
                Arc::new(SystemClock),
                Default::default(),
            ),
            entries: Mutex::new(BTreeMap::new()),
            writer: Mutex::new(()),
            commits: Mutex::new(0),
            lease_lost: Mutex::new(None),
        }
    }
}

struct MemoryTxn<'a> {
    store: &'a Memory,
    _writer: MutexGuard<'a, ()>,
    batch: bool,
}

impl Store for Memory {
    fn inboxes(&self) -> &Inboxes {
        &self.inboxes
    }
    fn begin(&self) -> Result<Box<dyn Txn + '_>> {
        Ok(Box::new(MemoryTxn {
            store: self,
            _writer: self.writer.lock().unwrap(),
            batch: false,
        }))
    }
    fn begin_batch(&self) -> Result<Box<dyn Txn + '_>> {
        if let Some(LeaseLostAt::Begin) = *self.lease_lost.lock().unwrap() {
            return Err(lease_lost());
        }
        Ok(Box::new(MemoryTxn {
            store: self,
            _writer: self.writer.lock().unwrap(),
            batch: true,
        }))
    }
    fn get(&self, id: &str) -> Result<Option<Waitpoint>> {
        Ok(self.entries.lock().unwrap().get(id).map(|e| e.wp.clone()))
    }
    fn create(&self, wp: &Waitpoint) -> Result<()> {
        let entry = Entry {
            wp: wp.clone(),
            revision: 1,
            records: BTreeMap::new(),
        };
        self.entries.lock().unwrap().insert(wp.id.clone(), entry);
        Ok(())
    }
    fn timers(&self) -> &dyn waitpoint::store::Docs<waitpoint::records::Timer> {
        &self.timers
    }
    fn callbacks(&self) -> &dyn waitpoint::store::Docs<waitpoint::records::Callback> {
        &self.timers
    }
    fn put_whole(&self, wp: &Waitpoint, records: &[SignalRecord]) -> Result<bool> {
        let mut entries = self.entries.lock().unwrap();
        if entries.contains_key(&wp.id) {
            return Ok(false);
        }
        let records = records
            .iter()
            .map(|r| (identity_key(&identity_of(&r.source)), r.clone()))
            .collect();
        let entry = Entry {
            wp: wp.clone(),
            revision: 1,
            records,
        };
        entries.insert(wp.id.clone(), entry);
        Ok(true)
    }
    fn identities(&self, id: &str) -> Result<Vec<(u64, String)>> {
        let entries = self.entries.lock().unwrap();
        Ok(entries.get(id).map_or_else(Vec::new, |e| {
            e.records.iter().map(|(k, r)| (r.seq, k.clone())).collect()
        }))
    }
    fn record(&self, id: &str, _seq: u64, key: &str) -> Result<Option<SignalRecord>> {
        let entries = self.entries.lock().unwrap();
        Ok(entries.get(id).and_then(|e| e.records.get(key).cloned()))
    }
    fn for_each(&self, f: &mut dyn FnMut(Waitpoint) -> Result<()>) -> Result<()> {
        let all: Vec<Waitpoint> = self
            .entries
            .lock()
            .unwrap()
            .values()
            .map(|e| e.wp.clone())
            .collect();
        all.into_iter().try_for_each(f)
    }
    fn list_visible(&self, session: &str) -> Result<Vec<Waitpoint>> {
        let mut out = Vec::new();
        self.for_each(&mut |wp| {
            if wp.visible_to(session) {
                out.push(wp);
            }
            Ok(())
        })?;
        Ok(out)
    }
    fn index_is_complete(&self) -> bool {
        true
    }
    fn rebuild_index(&self) -> Result<usize> {
        Ok(0)
    }
    fn watch(&self, _hint: Box<dyn Fn(Hint) + Send>) -> Result<waitpoint::store::Guard> {
        Ok(waitpoint::store::Guard::nothing())
    }
}

impl Txn for MemoryTxn<'_> {
    fn read(&mut self, id: &str) -> Result<Option<(Waitpoint, Version)>> {
        Ok(self
            .store
            .entries
            .lock()
            .unwrap()
            .get(id)
            .map(|e| (e.wp.clone(), Version(e.revision))))
    }
    fn version(&self, id: &str) -> Option<Version> {
        let entries = self.store.entries.lock().unwrap();
        entries.get(id).map(|e| Version(e.revision))
    }
    fn put(&mut self, wp: &Waitpoint) -> Result<()> {
        let mut entries = self.store.entries.lock().unwrap();
        let e = entries
            .get_mut(&wp.id)
            .ok_or_else(|| Error::not_found("waitpoint", &wp.id))?;
        e.wp = wp.clone();
        e.revision += 1;
        Ok(())
    }
    fn remove(&mut self, wp: &Waitpoint) -> Result<()> {
        self.store.entries.lock().unwrap().remove(&wp.id);
        Ok(())
    }
    fn commit(&mut self, changes: &[Change]) -> Result<()> {
        assert!(self.batch, "only a batch transaction commits");
        if let Some(LeaseLostAt::Commit) = *self.store.lease_lost.lock().unwrap() {
            return Err(lease_lost());
        }
        let mut entries = self.store.entries.lock().unwrap();
        // All or nothing: every guard is checked before anything is written.
        for c in changes {
            let e = entries.get(&c.change.state.id);
            if e.map(|e| Version(e.revision)) != Some(c.expect) {
                return Err(Error::Conflict(format!("{} moved", c.change.state.id)));
            }
            for r in &c.change.records {
                let key = identity_key(&identity_of(&r.source));
                if e.is_some_and(|e| e.records.contains_key(&key)) {
                    return Err(Error::Conflict(format!("{key} is already recorded")));
                }
            }
        }
        for c in changes {
            for wake in &c.change.wakes {
                self.store.inboxes.deliver(wake)?;
            }
            let e = entries.get_mut(&c.change.state.id).unwrap();
            for r in &c.change.records {
                e.records
                    .insert(identity_key(&identity_of(&r.source)), r.clone());
            }
            e.wp = c.change.state.clone();
            e.revision += 1;
        }
        *self.store.commits.lock().unwrap() += 1;
        Ok(())
    }
    fn replayed(&self) -> bool {
        false
    }
}

/// A memory store for `home` and an engine on it.
fn on_memory(home: &Home) -> (Arc<Memory>, Engine) {
    let memory = Arc::new(Memory::new(home));
    let engine = Engine::with_store(
        home.clone(),
        Settings::default(),
        Arc::new(SystemClock),
        memory.clone(),
    );
    (memory, engine)
}

fn item(id: &str, secret: &str, file: &str) -> (SignalRequest, Source) {
    let SpoolBody::Signal(req) = parse_spool_body(body(id, secret, "").as_bytes()).unwrap() else {
        panic!("a signal body");
    };
    (req, Source::Spool(file.into()))
}

/// What one scenario left: each verdict's kind, the final status, the count, the records and
/// the wakes in the inbox.
#[derive(Debug, PartialEq)]
struct Outcome {
    verdicts: Vec<&'static str>,
    status: Status,
    signals: u64,
    records: usize,
    wakes: usize,
}

/// Arms a waitpoint for three reports and sends a retried file in a batch, the retry again,
/// then the last report; services it at the end.
fn scenario(engine: &Engine, home: &Home) -> Outcome {
    let created = engine
        .create(CreateRequest {
            fail_fast: false,
            max_signals: 3,
            ..CreateRequest::new("seam", "i", "default")
        })
        .unwrap();
    let (id, secret) = (created.waitpoint.id.clone(), created.secret.clone());
    let batch = [
        item(&id, &secret, "a.json"),
        item(&id, &secret, "a.json"),
        item(&id, &secret, "b.json"),
    ];
    let mut verdicts: Vec<Verdict> = engine
        .apply_batch(&batch)
        .into_iter()
        .map(|v| v.unwrap())
        .collect();
    for file in ["a.json", "c.json"] {
        let (req, source) = item(&id, &secret, file);
        verdicts.push(engine.apply_signal(&req, &source).unwrap());
    }
    engine.service(&id).unwrap();
    assert_eq!(engine.list_visible("default").unwrap().len(), 1);
    let wp = engine.load(&id).unwrap().unwrap();
    Outcome {
        verdicts: verdicts
            .iter()
            .map(|v| match v {
                Verdict::Accepted { .. } => "accepted",
                Verdict::Duplicate { .. } => "duplicate",
                _ => "other",
            })
            .collect(),
        status: wp.status,
        signals: wp.counters.signals,
        records: engine.read_signals(&id, 1).unwrap().len(),
        wakes: std::fs::read_dir(home.inbox_new("default"))
            .unwrap()
            .count(),
    }
}

#[test]
fn a_second_store_behind_the_seam_counts_each_identity_once_and_the_home_holds_no_waitpoint() {
    let (files_env, memory_env) = (Env::new(), Env::new());
    let files_home = Home::new(files_env.home.clone());
    let files = Engine::new(
        files_home.clone(),
        Settings::default(),
        Arc::new(SystemClock),
    );
    let expected = scenario(&files, &files_home);
    assert_eq!(
        expected.verdicts,
        ["accepted", "duplicate", "accepted", "duplicate", "accepted"]
    );
    assert_eq!((expected.signals, expected.records), (3, 3));

    let home = Home::new(memory_env.home.clone());
    let (memory, engine) = on_memory(&home);
    assert_eq!(scenario(&engine, &home), expected);
    assert_eq!(*memory.commits.lock().unwrap(), 2, "one commit per batch");
    let on_disk = std::fs::read_dir(home.waitpoints_dir()).map_or(0, |d| d.count());
    assert_eq!(on_disk, 0, "the engine wrote a waitpoint outside its store");
}

#[test]
fn a_commit_against_a_version_it_did_not_read_is_refused_by_the_file_store() {
    let env = Env::new();
    let home = Home::new(env.home.clone());
    let engine = Engine::new(home.clone(), Settings::default(), Arc::new(SystemClock));
    let created = engine
        .create(CreateRequest::new("seam", "i", "default"))
        .unwrap();
    let id = created.waitpoint.id;
    let store = engine.store();
    let mut txn = store.begin_batch().unwrap();
    let (wp, version) = txn.read(&id).unwrap().unwrap();
    let stale = Change {
        expect: Version(version.0 + 1),
        change: waitpoint::records::JournalChange {
            state: wp.clone(),
            records: Vec::new(),
            wakes: Vec::new(),
        },
    };
    let err = txn.commit(&[stale]).unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err}");
    // A waitpoint this transaction never read cannot be written through it either.
    drop(txn);
    let mut other = store.begin().unwrap();
    let err = other.put(&wp).unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err}");
}

#[test]
fn a_lost_lease_stays_a_lost_lease_for_every_signal_of_the_batch() {
    use waitpoint::error::ErrorKind;
    let env = Env::new();
    let home = Home::new(env.home.clone());
    let (memory, engine) = on_memory(&home);
    let created = engine
        .create(CreateRequest {
            max_signals: 10,
            ..CreateRequest::new("lease", "i", "default")
        })
        .unwrap();
    let (id, secret) = (created.waitpoint.id, created.secret);
    for (at, files) in [
        (LeaseLostAt::Begin, ["a.json", "b.json"]),
        (LeaseLostAt::Commit, ["c.json", "d.json"]),
    ] {
        *memory.lease_lost.lock().unwrap() = Some(at);
        let batch: Vec<_> = files.iter().map(|f| item(&id, &secret, f)).collect();
        for verdict in engine.apply_batch(&batch) {
            let e = verdict.expect_err("nothing commits without the lease");
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{at:?}: {e}");
            assert_eq!(e.retry_after_s(), Some(7), "{at:?}: {e}");
        }
    }
    *memory.lease_lost.lock().unwrap() = None;
    let (req, source) = item(&id, &secret, "c.json");
    assert!(matches!(
        engine.apply_signal(&req, &source).unwrap(),
        Verdict::Accepted { seq: 1, .. }
    ));
}
