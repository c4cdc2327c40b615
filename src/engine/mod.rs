//! The engine: the only code that creates or changes waitpoint state.
//!
//! Every change is a read-modify-write of the waitpoint's state that no other writer can
//! interleave: on the home's files under the waitpoint's lock (an `flock` of the
//! `waitpoints/<id>/` directory), on etcd by a transaction that compares the revisions it read
//! (`store/etcd.rs`), so the daemon and CLI commands such as `cancel` never lose each other's
//! updates. A signal goes: authenticate -> recover -> de-duplicate ->
//! member rules -> decide in memory -> one journal line for its batch (the commit) -> write the
//! record, the state and any wake (`batch.rs`). The spool file is removed by the caller only
//! after the commit; a crash before it leaves the file in place, and one after it is repaired by
//! the journal's replay, so no signal counts twice.

mod batch;
pub mod budget;
pub mod callbacks;
mod create;
mod prejudge;
mod queries;
pub mod rules;
mod service;
mod sessions;
pub mod silence;
pub mod timers;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use crate::clock::{Clock, Timestamp};
use crate::durable::Trash;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::records::{HookDelivery, Outcome, SignalRecord, Status, Waitpoint, Wake, WakeKind};
use crate::request::{SignalRequest, Source};
use crate::secret;
use crate::settings::Settings;
use crate::store::{self, Store, Txn};
use crate::sync::MutexExt;

pub use batch::{MAX_BATCH, MAX_SIGNALS_PER_WAITPOINT, MAX_WAITPOINTS_PER_COMMIT};
pub use create::{
    CreateRequest, Created, MAX_INTENT_CHARS, MAX_LABEL_CHARS, MAX_MAX_SIGNALS, MAX_MEMBERS,
    MIN_TTL_MS, MIN_WINDOW_MS, Quorum,
};
pub use prejudge::{Prejudged, prejudge};
use rules::Refusal;
pub use service::{HookJob, RETAIN_MS, Service, hook_backoff_ms, next_due, retention_ends};
use service::{hooks_due, in_grace_window, next_hook_after};
pub use sessions::SessionDeleted;

/// What the engine did with a well-formed signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Recorded as signal `seq`; `wake` says whether it woke the session.
    Accepted {
        id: String,
        seq: u64,
        wake: Option<WakeKind>,
        status: Status,
        /// When the daemon must next look at this waitpoint (a grace window, a deadline, ...).
        next_due: Option<Timestamp>,
    },
    /// This identity was already recorded for the waitpoint; not counted again. Recovery may
    /// still have changed the state (a replayed record can open a grace window), so the verdict
    /// says when the daemon must look at the waitpoint next, like `Accepted` does.
    Duplicate {
        id: String,
        next_due: Option<Timestamp>,
    },
    /// The waitpoint is no longer armed ("already resolved").
    Closed {
        id: String,
        status: Status,
        next_due: Option<Timestamp>,
    },
    /// Not accepted, with the reason.
    Refused(Refusal),
    /// Kept durably in a store shared by several hosts for its leading daemon to apply: its
    /// id and secret were checked here, the rules are applied there (`docs/etcd.md`).
    Queued { id: String },
}

/// The engine. Cheap to build; the daemon keeps one, CLI commands make one per call.
pub struct Engine {
    home: Home,
    settings: Settings,
    clock: Arc<dyn Clock>,
    /// Where waitpoints live (the home's files unless built [`with_store`](Engine::with_store)).
    store: Arc<dyn Store>,
    // Identity keys of the signals recorded per armed waitpoint. Only the daemon records signals,
    // so once loaded from the store this set stays exact for the process's lifetime.
    seen: Mutex<HashMap<String, HashSet<String>>>,
    /// Where replaced states and consumed spool files go, when the daemon empties it in the
    /// background; without one (a command), they are freed in place. Shared with the file store.
    trash: Arc<OnceLock<Arc<Trash>>>,
    /// How to look a device up for the silence wakes that name it (set by the daemon).
    devices: Mutex<Option<silence::DeviceLookup>>,
    /// While set, no silence wake goes out (the daemon's start, see `silence.rs`).
    silence_held: std::sync::atomic::AtomicBool,
    /// Waitpoints whose silence came due while held: looked at again on release.
    held: Mutex<Vec<String>>,
    /// The wakes each agent's timers and callbacks made in the last hour (`budget.rs`).
    event_budget: budget::EventBudget,
}

impl Engine {
    /// Takes one wake of `session`'s timer and callback budget now, or says when it frees.
    fn take_event_wake(&self, session: &str) -> std::result::Result<(), Timestamp> {
        let cap = self
            .settings
            .max_wakes_per_hour
            .saturating_mul(budget::EVENT_CAP_FACTOR);
        self.event_budget.take(session, self.clock.now(), cap)
    }

    /// An engine on the home's files, the embedded store ([`store::Files`]).
    pub fn new(home: Home, settings: Settings, clock: Arc<dyn Clock>) -> Self {
        let trash = Arc::new(OnceLock::new());
        let files = store::Files::new(home.clone(), Arc::clone(&clock), Arc::clone(&trash));
        Engine {
            home,
            settings,
            clock,
            store: Arc::new(files),
            seen: Mutex::new(HashMap::new()),
            trash,
            devices: Mutex::new(None),
            silence_held: std::sync::atomic::AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
            event_budget: budget::EventBudget::default(),
        }
    }

    /// An engine on the store `settings` name: the home's files, or a store shared by several
    /// hosts ([`store::open_shared`]), written to as `role`.
    pub fn open(
        home: Home,
        settings: Settings,
        clock: Arc<dyn Clock>,
        role: store::Role,
    ) -> Result<Self> {
        match store::open_shared(&settings.store, settings.host.as_deref(), &home, role)? {
            Some(store) => Ok(Engine::with_store(home, settings, clock, store)),
            None => Ok(Engine::new(home, settings, clock)),
        }
    }

    /// An engine whose waitpoints live in `store` (timers, callbacks and inboxes stay in the
    /// home).
    pub fn with_store(
        home: Home,
        settings: Settings,
        clock: Arc<dyn Clock>,
        store: Arc<dyn Store>,
    ) -> Self {
        Engine {
            store,
            ..Engine::new(home, settings, clock)
        }
    }

    /// Where this engine's waitpoints live.
    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    pub fn home(&self) -> &Home {
        &self.home
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Applies one well-formed signal. Returns the verdict; an `Err` means nothing was decided
    /// (an I/O failure) and the source must be kept for another attempt. One signal is a batch
    /// of one: the same decisions and the same journal commit.
    pub fn apply_signal(&self, req: &SignalRequest, source: &Source) -> Result<Verdict> {
        let item = [(req.clone(), source.clone())];
        self.apply_batch(&item).pop().expect("one verdict per item")
    }

    /// This engine, committing through `previous`'s store and trash (a settings reload builds
    /// a new engine; one home has one journal).
    pub fn with_store_of(mut self, previous: &Engine) -> Engine {
        self.store = Arc::clone(&previous.store);
        self.trash = Arc::clone(&previous.trash);
        let lookup = previous.devices.lock_or_recover().clone();
        *self.devices.lock_or_recover() = lookup;
        let held = previous
            .silence_held
            .load(std::sync::atomic::Ordering::SeqCst);
        self.silence_held
            .store(held, std::sync::atomic::Ordering::SeqCst);
        self
    }

    /// Opens the home's trash and puts what this engine frees there from now on; the caller
    /// (the daemon) has it emptied in the background.
    pub fn open_trash(&self) -> Result<Arc<Trash>> {
        if let Some(t) = self.trash.get() {
            return Ok(t.clone());
        }
        let t = Arc::new(Trash::open(self.home.root_dir(), &self.home.trash_dir())?);
        Ok(self.trash.get_or_init(|| t).clone())
    }

    /// The trash, when a daemon empties one.
    pub fn trash(&self) -> Option<&Trash> {
        self.trash.get().map(|t| t.as_ref())
    }

    /// For a command run while no daemon is: finishes what a daemon that died left in the store
    /// (a power cut may have lost the files of its last batches), so the command reads what the
    /// daemon had committed. Returns how many interrupted commits were finished.
    pub fn replay_left_journal(&self) -> Result<usize> {
        let replayed = self.store.recover_unattended()?;
        if replayed > 0 {
            self.forget_all();
        }
        Ok(replayed)
    }

    /// Makes the store's commits final if this engine committed through it (a command that
    /// applied signals without a daemon: `device poll`), so it leaves the journal empty.
    pub fn checkpoint_journal(&self) -> Result<()> {
        self.store.checkpoint()
    }

    /// Finishes whatever a crash left in the store; the daemon calls this at start, before it
    /// reads any state, then keeps the store's background work running.
    pub fn recover_store(&self) -> Result<usize> {
        let replayed = self.store.recover()?;
        self.forget_all();
        Ok(replayed)
    }

    /// Applies a recorded signal to the in-memory state. A completed round's wake goes into the
    /// outbox now, or waits as the pending wake (grace window, hourly cap). Returns the kind of
    /// wake the signal completed, if any. The record is one the log holds already (recovery).
    fn step(&self, wp: &mut Waitpoint, record: &SignalRecord) -> Result<Option<WakeKind>> {
        let done = rules::apply_signal(wp, record);
        // Recovery replays records the log kept, so they count as kept whatever the bounds.
        rules::note_kept(wp, record, line_bytes(record));
        match done {
            Some(done) => self.schedule(wp, done, &[]),
            None => Ok(None),
        }
    }

    /// [`step`](Self::step) for a record decided now, not yet on disk: decides how the log
    /// keeps it ([`rules::keep_whole`]; `key` is its identity key) and leaves `kept` (the
    /// batch's records for the log, this one pushed last) as the log will have it. Returns the
    /// wake's kind.
    fn step_with(
        &self,
        wp: &mut Waitpoint,
        key: &str,
        kept: &mut Vec<SignalRecord>,
    ) -> Result<Option<WakeKind>> {
        let record = kept.last().expect("the record being decided").clone();
        let before = rules::Before::of(wp);
        let done = rules::apply_signal(wp, &record);
        let slim = || line_bytes(&rules::without_data(&record));
        match rules::keep_whole(wp, before, &record, (line_bytes(&record), slim), key) {
            rules::Keep::Whole => {}
            rules::Keep::WithoutData => {
                *kept.last_mut().expect("the record being decided") = rules::without_data(&record)
            }
            // A folded record reaches a wake through the state's recent ones, not the log.
            rules::Keep::Folded => {
                kept.pop();
            }
        }
        match done {
            Some(done) => self.schedule(wp, done, kept),
            None => Ok(None),
        }
    }

    /// Sends or holds the wake of a completed round.
    fn schedule(
        &self,
        wp: &mut Waitpoint,
        done: rules::CompletedRound,
        fresh: &[SignalRecord],
    ) -> Result<Option<WakeKind>> {
        let cap = self.settings.max_wakes_per_hour;
        if let Some(now_round) = rules::schedule_wake(wp, done, self.clock.now(), cap) {
            self.emit_with(
                wp,
                (now_round.kind, now_round.outcome),
                now_round.first_seq,
                1,
                fresh,
            )?;
        }
        Ok(Some(done.kind))
    }

    /// What a wake about `wp`'s signals from `first_seq` on carries: the log's records, then
    /// `fresh` (kept, not yet on disk), then the folded ones the state holds.
    fn carried(
        &self,
        wp: &Waitpoint,
        first_seq: u64,
        fresh: &[SignalRecord],
    ) -> Result<rules::Carried> {
        // A batch's records are in `seq` order from the first one it decided: when that one is
        // at or before `first_seq`, every kept signal wanted is in hand and none is read from
        // disk.
        let mut records = if fresh.first().is_some_and(|r| r.seq <= first_seq) {
            fresh
                .iter()
                .filter(|r| r.seq >= first_seq)
                .cloned()
                .collect()
        } else {
            let mut signals = self.read_signals(&wp.id, first_seq)?;
            let on_disk = signals.last().map_or(0, |s| s.seq);
            signals.extend(
                fresh
                    .iter()
                    .filter(|r| r.seq >= first_seq && r.seq > on_disk)
                    .cloned(),
            );
            signals
        };
        records.extend(wp.log.recent.iter().filter(|r| r.seq >= first_seq).cloned());
        records.sort_by_key(|r| r.seq);
        records.dedup_by_key(|r| r.seq);
        Ok(rules::Carried { first_seq, records })
    }

    /// Composes a wake carrying every signal from `first_seq` on and puts it in the outbox.
    fn emit(
        &self,
        wp: &mut Waitpoint,
        kind: WakeKind,
        outcome: Outcome,
        first_seq: u64,
        rounds: u64,
    ) -> Result<()> {
        self.emit_with(wp, (kind, outcome), first_seq, rounds, &[])
    }

    /// [`emit`](Self::emit) where `fresh` holds records decided but not yet on disk (a batch).
    fn emit_with(
        &self,
        wp: &mut Waitpoint,
        (kind, outcome): (WakeKind, Outcome),
        first_seq: u64,
        rounds: u64,
        fresh: &[SignalRecord],
    ) -> Result<()> {
        let carried = self.carried(wp, first_seq, fresh)?;
        let now = self.clock.now();
        let wake = rules::compose_wake(wp, kind, Some(outcome), &carried, None, rounds, now);
        wp.outbox.push(wake);
        Ok(())
    }

    /// Brings the state up to date with the signal files after a crash between recording a
    /// signal and replacing the state: replays every recorded signal newer than the state.
    fn recover(&self, txn: &mut dyn Txn, wp: &mut Waitpoint) -> Result<()> {
        if self.seen.lock_or_recover().contains_key(&wp.id) {
            return Ok(());
        }
        let listing = self.list_signal_files(&wp.id)?;
        let newest = listing.iter().map(|(seq, _)| *seq).max().unwrap_or(0);
        // A record can be newer than the state whatever the status: one that landed in a
        // resolved waitpoint's grace window counts too (the rules only count it then).
        if newest > wp.counters.signals {
            let pending = self.read_signals(&wp.id, wp.counters.signals + 1)?;
            for record in &pending {
                tracing::warn!(
                    waitpoint = %wp.id,
                    seq = record.seq,
                    "replaying a signal recorded before a crash",
                );
                self.step(wp, record)?;
            }
            txn.put(wp)?;
        }
        let keys = listing.into_iter().map(|(_, k)| k).collect();
        self.seen.lock_or_recover().insert(wp.id.clone(), keys);
        Ok(())
    }

    fn seen_contains(&self, id: &str, key: &str) -> bool {
        let seen = self.seen.lock_or_recover();
        seen.get(id).is_some_and(|s| s.contains(key))
    }

    fn seen_insert(&self, id: &str, key: String) {
        let mut seen = self.seen.lock_or_recover();
        seen.entry(id.to_owned()).or_default().insert(key);
    }

    /// Drops everything remembered about recorded identities (the store finished an
    /// interrupted commit, so the records may be newer than what was remembered).
    pub(crate) fn forget_all(&self) {
        self.seen.lock_or_recover().clear();
    }

    fn forget(&self, id: &str) {
        self.seen.lock_or_recover().remove(id);
    }

    /// Delivers every wake in the outbox, then records that they left it.
    fn flush_outbox(&self, txn: &mut dyn Txn, wp: &mut Waitpoint) -> Result<()> {
        if wp.outbox.is_empty() {
            return Ok(());
        }
        for wake in &wp.outbox {
            self.store.deliver(wake)?;
        }
        crate::failpoint!(
            crate::failpoint::ENGINE_AFTER_DELIVERY,
            "cannot replace",
            &self.home.waitpoint_file(&wp.id)
        );
        self.mark_delivered(wp);
        txn.put(wp)
    }

    /// After the outbox's wakes are durable in the inbox: logs them, empties the outbox and
    /// queues the `onWake` hook for each. The caller saves the state.
    fn mark_delivered(&self, wp: &mut Waitpoint) {
        let now = self.clock.now();
        for wake in &wp.outbox {
            tracing::info!(
                waitpoint = %wp.id,
                wake = %wake.wake_id,
                channel = %wake.channel,
                "{}",
                wake.summary,
            );
        }
        let delivered: Vec<Wake> = std::mem::take(&mut wp.outbox);
        if self.settings.on_wake.is_some() {
            // The inbox file is durable first; the hook only ever adds a second way to hear it.
            wp.hook_deliveries
                .extend(delivered.iter().map(|w| HookDelivery {
                    wake_id: w.wake_id.clone(),
                    attempts: 0,
                    last_error: None,
                    last_attempt_at: None,
                    next_attempt_at: now,
                    delivered_at: None,
                }));
        }
    }

    /// Re-delivers a waitpoint's outbox (used by the daemon at start for interrupted deliveries).
    pub fn redeliver(&self, id: &str) -> Result<()> {
        let mut txn = self.store.begin()?;
        if let Some((mut wp, _)) = txn.read(id)? {
            self.recover(txn.as_mut(), &mut wp)?;
            self.flush_outbox(txn.as_mut(), &mut wp)?;
        }
        Ok(())
    }

    /// Replaces a waitpoint's secret: the old one is refused from now on (exactly like a wrong
    /// secret) and the new one is returned, once.
    pub fn reset_secret(&self, id: &str, session: &str) -> Result<Created> {
        let mut txn = self.store.begin()?;
        let mut wp = read_visible(txn.as_mut(), id, session)?;
        if wp.status != Status::Armed {
            return Err(Error::Conflict(format!(
                "{id} is already {}; its secret no longer opens anything",
                wp.status.as_str()
            )));
        }
        let secret = secret::generate();
        wp.secret_sha256 = secret::hash(&secret);
        txn.put(&wp)?;
        tracing::info!(
            waitpoint = %id,
            session,
            "secret reset; the old one is refused from now on",
        );
        Ok(Created {
            waitpoint: wp,
            secret,
        })
    }

    /// Disarms a waitpoint on behalf of `session`. Cancelling a cancelled one is a no-op;
    /// cancelling one that already resolved or expired is a conflict.
    pub fn cancel(&self, id: &str, session: &str) -> Result<Waitpoint> {
        let mut txn = self.store.begin()?;
        let mut wp = read_visible(txn.as_mut(), id, session)?;
        match wp.status {
            Status::Cancelled => return Ok(wp),
            Status::Resolved | Status::Expired => {
                return Err(Error::Conflict(format!(
                    "{id} is already {}; there is nothing to cancel",
                    wp.status.as_str()
                )));
            }
            Status::Armed => {}
        }
        wp.status = Status::Cancelled;
        wp.resolved_at = Some(self.clock.now());
        wp.pending_wake = None;
        txn.put(&wp)?;
        self.forget(id);
        tracing::info!(waitpoint = %id, session, "cancelled");
        Ok(wp)
    }
}

/// The record a well-formed, accepted signal becomes: the waitpoint's next seq.
fn next_record(
    wp: &Waitpoint,
    req: &SignalRequest,
    origin: String,
    now: Timestamp,
) -> SignalRecord {
    SignalRecord {
        seq: wp.counters.signals + 1,
        source: origin,
        status: req.status,
        member: req.member.clone(),
        message: req.message.clone(),
        data: req.data.clone(),
        received_at: now,
        data_dropped: false,
    }
}

/// The size of `record`'s line in the log, counted without building it.
fn line_bytes(record: &SignalRecord) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(1);
    serde_json::to_writer(&mut n, record).expect("our records always serialise");
    n.0
}

/// Reads a waitpoint for update that `session` may see.
fn read_visible(txn: &mut dyn Txn, id: &str, session: &str) -> Result<Waitpoint> {
    match txn.read(id)? {
        Some((wp, _)) if wp.visible_to(session) => Ok(wp),
        _ => Err(Error::not_found_for_session("waitpoint", id)),
    }
}
