//! The engine: the only code that creates or changes waitpoint state.
//!
//! Every change runs under the waitpoint's lock (an `flock` of the `waitpoints/<id>/` directory)
//! as a read-modify-write of `waitpoint.json`, so the daemon and CLI commands such as `cancel`
//! never lose each other's updates. A signal goes: authenticate -> recover -> de-duplicate ->
//! member rules -> decide in memory -> one journal line for its batch (the commit) -> write the
//! record, the state and any wake (`batch.rs`). The spool file is removed by the caller only
//! after the commit; a crash before it leaves the file in place, and one after it is repaired by
//! the journal's replay, so no signal counts twice.

mod batch;
pub mod callbacks;
pub mod rules;
pub mod timers;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::sync::{Arc, Mutex, OnceLock};

use rand::Rng;

use crate::clock::{Clock, Timestamp};
use crate::delivery;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::model::{
    Counters, HoldReason, HookDelivery, Outcome, Round, SignalRecord, Status, Waitpoint, Wake,
    WakeKind,
};
use crate::request::{Owner, SignalRequest, Source, check_member_name, is_waitpoint_id};
use crate::secret;
use crate::settings::{MAX_TTL_MS, Settings};
use crate::state::{self, Store, Txn};
use crate::store::{self, FileLock, Trash, read_json};

pub use batch::MAX_BATCH;
pub use rules::Refusal;

/// The largest `max_signals` a monitor may ask for.
pub const MAX_MAX_SIGNALS: u32 = 10_000;
/// The most members a barrier may name.
pub const MAX_MEMBERS: usize = 256;
/// The longest label, in characters.
pub const MAX_LABEL_CHARS: usize = 200;
/// The longest intent, in characters.
pub const MAX_INTENT_CHARS: usize = 4_000;
const HOUR_MS: f64 = 3_600_000.0;

/// How many terminal signals resolve a waitpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quorum {
    All,
    Count(u32),
}

/// A validated `wait_create`.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub label: String,
    pub intent: String,
    pub members: Vec<String>,
    pub quorum: Option<Quorum>,
    pub fail_fast: bool,
    pub max_signals: u32,
    pub expires_in_hours: Option<f64>,
    pub device: Option<String>,
    pub session: String,
    pub channel: String,
    /// `recheck_after_ms`: one "recheck" wake if nothing terminal arrived by then.
    pub recheck_after_ms: Option<u64>,
}

impl CreateRequest {
    /// A request with the spec's defaults: no members, quorum by default, fail-fast on, one
    /// wake, the settings' lifetime, no device, the channel named after the session, no recheck.
    /// Set other fields with struct update syntax.
    pub fn new(label: impl Into<String>, intent: impl Into<String>, session: &str) -> Self {
        CreateRequest {
            label: label.into(),
            intent: intent.into(),
            members: Vec::new(),
            quorum: None,
            fail_fast: true,
            max_signals: 1,
            expires_in_hours: None,
            device: None,
            session: session.to_owned(),
            channel: session.to_owned(),
            recheck_after_ms: None,
        }
    }
}

/// A new waitpoint and its secret, which is never stored and exists only in this value.
#[derive(Debug, Clone)]
pub struct Created {
    pub waitpoint: Waitpoint,
    pub secret: String,
}

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
}

pub use crate::request::{identity_key, is_prefixed_id};
pub use crate::state::signal_file_name;

/// The shortest lifetime a waitpoint may be given: one second.
pub const MIN_TTL_MS: i64 = 1_000;
/// [`MIN_TTL_MS`] in hours as messages show it (rounded up, so it is itself accepted).
const MIN_TTL_HOURS_SHOWN: f64 = 0.0003;

/// Checks a session or channel name: it becomes a directory name.
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            what,
            format!("{name:?} must be 1-128 characters of letters, digits, '.', '_', '-' or '@'"),
        ))
    }
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
}

impl Engine {
    /// An engine on the home's files, the embedded store ([`state::Files`]).
    pub fn new(home: Home, settings: Settings, clock: Arc<dyn Clock>) -> Self {
        let trash = Arc::new(OnceLock::new());
        let files = state::Files::new(home.clone(), Arc::clone(&clock), Arc::clone(&trash));
        Engine {
            home,
            settings,
            clock,
            store: Arc::new(files),
            seen: Mutex::new(HashMap::new()),
            trash,
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

    /// Arms a new waitpoint (`wait_create`).
    pub fn create(&self, req: CreateRequest) -> Result<Created> {
        let invalid = |field, m: String| Err(Error::invalid(field, m));
        let label = req.label.trim().to_owned();
        if label.is_empty() || label.chars().count() > MAX_LABEL_CHARS {
            return invalid("label", format!("must be 1-{MAX_LABEL_CHARS} characters"));
        }
        let intent = req.intent.trim().to_owned();
        if intent.is_empty() || intent.chars().count() > MAX_INTENT_CHARS {
            return invalid("intent", format!("must be 1-{MAX_INTENT_CHARS} characters"));
        }
        check_name("session", &req.session)?;
        check_name("channel", &req.channel)?;
        if let Some(d) = &req.device {
            check_name("device", d)?;
        }
        if req.members.len() > MAX_MEMBERS {
            return invalid("members", format!("may name at most {MAX_MEMBERS} jobs"));
        }
        for (i, m) in req.members.iter().enumerate() {
            check_member_name(m).map_err(|e| Error::invalid("members", format!("{m:?}: {e}")))?;
            if req.members[..i].contains(m) {
                return invalid("members", format!("name {m:?} twice"));
            }
        }
        let quorum = match (req.quorum, req.members.len()) {
            (None | Some(Quorum::All), 0) => 1,
            (None | Some(Quorum::All), n) => n as u32,
            (Some(Quorum::Count(q)), n) => {
                if q == 0 || (n > 0 && q as usize > n) {
                    return invalid(
                        "quorum",
                        format!(
                            "{q} must be at least 1{}",
                            if n > 0 {
                                format!(" and at most the {n} members")
                            } else {
                                String::new()
                            }
                        ),
                    );
                }
                q
            }
        };
        if req.max_signals == 0 || req.max_signals > MAX_MAX_SIGNALS {
            return invalid("max_signals", format!("must be 1-{MAX_MAX_SIGNALS}"));
        }
        let lifetime_ms = match req.expires_in_hours {
            None => self.settings.ttl_ms as i64,
            Some(h) => {
                let max_h = MAX_TTL_MS as f64 / HOUR_MS;
                // Below a second a deadline is gone before anyone could signal (1e-300 was
                // accepted and expired at once).
                let min_h = MIN_TTL_MS as f64 / HOUR_MS;
                if !h.is_finite() || h < min_h || h > max_h {
                    return invalid(
                        "expires_in_hours",
                        format!(
                            "must be at least {MIN_TTL_HOURS_SHOWN} (one second) and at most {max_h}, not {h:?}"
                        ),
                    );
                }
                (h * HOUR_MS).round() as i64
            }
        };
        match req.recheck_after_ms {
            Some(0) => {
                return invalid(
                    "recheck_after_ms",
                    "must be a positive number of milliseconds".into(),
                );
            }
            // A recheck after the deadline could never come; one past the clock's range wrapped.
            Some(ms) if ms >= lifetime_ms as u64 => {
                return invalid(
                    "recheck_after_ms",
                    format!(
                        "must be less than the waitpoint's lifetime ({lifetime_ms} ms), not {ms}"
                    ),
                );
            }
            _ => {}
        }
        let now = self.clock.now();
        let secret = secret::generate();
        let waitpoint = Waitpoint {
            id: self.fresh_id(),
            label,
            intent,
            session: req.session,
            channel: req.channel,
            members: req.members,
            quorum,
            fail_fast: req.fail_fast,
            max_signals: req.max_signals,
            device: req.device,
            status: Status::Armed,
            outcome: None,
            created_at: now,
            expires_at: now.plus_ms(lifetime_ms),
            resolved_at: None,
            secret_sha256: secret::hash(&secret),
            counters: Counters::default(),
            round: Round {
                start_seq: 1,
                ..Round::default()
            },
            pending_wake: None,
            recent_wakes: Vec::new(),
            outbox: Vec::new(),
            hook_deliveries: Vec::new(),
            recheck_at: req.recheck_after_ms.map(|ms| now.plus_ms(ms as i64)),
            recheck_sent: false,
        };
        self.store.create(&waitpoint)?;
        Ok(Created { waitpoint, secret })
    }

    fn fresh_id(&self) -> String {
        self.fresh_prefixed_id("wp_", |id| self.home.waitpoint_dir(id).exists())
    }

    /// A fresh `<prefix><12 hex>` id that `taken` does not know.
    fn fresh_prefixed_id(&self, prefix: &str, taken: impl Fn(&str) -> bool) -> String {
        loop {
            let mut b = [0u8; 6];
            rand::rng().fill_bytes(&mut b);
            let id = format!("{prefix}{}", hex::encode(b));
            if !taken(&id) {
                return id;
            }
        }
    }

    /// Reads a waitpoint; `None` when there is no such id.
    pub fn load(&self, id: &str) -> Result<Option<Waitpoint>> {
        self.store.get(id)
    }

    /// Reads one record of a collection, setting it aside if it does not parse
    /// ([`store::read_json_or_set_aside`]).
    pub(crate) fn read_record<T: serde::de::DeserializeOwned>(
        &self,
        path: &std::path::Path,
    ) -> Result<Option<T>> {
        store::read_json_or_set_aside(&self.home.quarantine_dir(), self.home.root(), path)
    }

    /// Reads a waitpoint that `session` may see (or any, with `None`).
    pub fn load_visible(&self, id: &str, session: Option<&str>) -> Result<Waitpoint> {
        match self.load(id)? {
            Some(wp) if session.is_none_or(|s| wp.visible_to(s)) => Ok(wp),
            _ if session.is_some() => Err(Error::not_found_for_session(id)),
            _ => Err(Error::not_found(id)),
        }
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
        self
    }

    /// Opens the home's trash and puts what this engine frees there from now on; the caller
    /// (the daemon) has it emptied in the background.
    pub fn open_trash(&self) -> Result<Arc<Trash>> {
        if let Some(t) = self.trash.get() {
            return Ok(t.clone());
        }
        let t = Arc::new(Trash::open(&self.home.trash_dir())?);
        Ok(self.trash.get_or_init(|| t).clone())
    }

    /// The trash, when a daemon empties one.
    pub fn trash(&self) -> Option<&Trash> {
        self.trash.get().map(|t| t.as_ref())
    }

    /// For a command run while no daemon is: re-applies the journal a daemon that died left
    /// (a power cut may have lost the files of its last batches), holding the daemon lock
    /// meanwhile, so nothing reads or changes a state the journal is about to overwrite. A
    /// running daemon replayed it at its start; then this does nothing. Returns how many lines
    /// were re-applied.
    pub fn replay_left_journal(&self) -> Result<usize> {
        if !self.store.needs_recovery() {
            return Ok(0);
        }
        let lock = match FileLock::try_acquire_writing_pid(&self.home.daemon_lock()) {
            Ok(l) => l,
            Err(Error::Locked { .. }) => return Ok(0),
            Err(e) => return Err(e),
        };
        let replayed = self.store.recover()?;
        self.forget_all();
        lock.clear();
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
    /// wake the signal completed, if any.
    fn step(&self, wp: &mut Waitpoint, record: &SignalRecord) -> Result<Option<WakeKind>> {
        self.step_with(wp, record, &[])
    }

    /// [`step`](Self::step) where `fresh` holds records decided but not yet on disk (a batch).
    fn step_with(
        &self,
        wp: &mut Waitpoint,
        record: &SignalRecord,
        fresh: &[SignalRecord],
    ) -> Result<Option<WakeKind>> {
        let Some(done) = rules::apply_signal(wp, record) else {
            return Ok(None);
        };
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

    /// The recorded signals from `first_seq` on, with `fresh` (not yet on disk) appended.
    fn signals_with(
        &self,
        id: &str,
        first_seq: u64,
        fresh: &[SignalRecord],
    ) -> Result<Vec<SignalRecord>> {
        let mut signals = self.read_signals(id, first_seq)?;
        let on_disk = signals.last().map_or(0, |s| s.seq);
        signals.extend(
            fresh
                .iter()
                .filter(|r| r.seq >= first_seq && r.seq > on_disk)
                .cloned(),
        );
        Ok(signals)
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
        let signals = self.signals_with(&wp.id, first_seq, fresh)?;
        let now = self.clock.now();
        let wake = rules::compose_wake(wp, kind, Some(outcome), &signals, None, rounds, now);
        wp.outbox.push(wake);
        Ok(())
    }

    /// Brings the state up to date with the signal files after a crash between recording a
    /// signal and replacing the state: replays every recorded signal newer than the state.
    fn recover(&self, txn: &mut dyn Txn, wp: &mut Waitpoint) -> Result<()> {
        if self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&wp.id)
        {
            return Ok(());
        }
        let listing = self.list_signal_files(&wp.id)?;
        let newest = listing.iter().map(|(seq, _)| *seq).max().unwrap_or(0);
        // A record can be newer than the state whatever the status: one that landed in a
        // resolved waitpoint's grace window counts too (the rules only count it then).
        if newest > wp.counters.signals {
            let pending = self.read_signals(&wp.id, wp.counters.signals + 1)?;
            for record in &pending {
                tracing::warn!(waitpoint = %wp.id, seq = record.seq, "replaying a signal recorded before a crash");
                self.step(wp, record)?;
            }
            txn.put(wp)?;
        }
        let keys = listing.into_iter().map(|(_, k)| k).collect();
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(wp.id.clone(), keys);
        Ok(())
    }

    fn seen_contains(&self, id: &str, key: &str) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(id).is_some_and(|s| s.contains(key))
    }

    fn seen_insert(&self, id: &str, key: String) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.entry(id.to_owned()).or_default().insert(key);
    }

    /// Drops everything remembered about recorded identities (the store finished an
    /// interrupted commit, so the records may be newer than what was remembered).
    fn forget_all(&self) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn forget(&self, id: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    /// Delivers every wake in the outbox, then records that they left it.
    fn flush_outbox(&self, txn: &mut dyn Txn, wp: &mut Waitpoint) -> Result<()> {
        if wp.outbox.is_empty() {
            return Ok(());
        }
        for wake in &wp.outbox {
            delivery::deliver(&self.home, wake)?;
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
            tracing::info!(waitpoint = %wp.id, wake = %wake.wake_id, channel = %wake.channel, "{}", wake.summary);
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

    /// `(seq, identity key)` of every recorded signal of a waitpoint.
    fn list_signal_files(&self, id: &str) -> Result<Vec<(u64, String)>> {
        self.store.identities(id)
    }

    /// The recorded signals of a waitpoint from `first_seq` on, in order.
    pub fn read_signals(&self, id: &str, first_seq: u64) -> Result<Vec<SignalRecord>> {
        let mut files: Vec<(u64, String)> = self
            .list_signal_files(id)?
            .into_iter()
            .filter(|(seq, _)| *seq >= first_seq)
            .collect();
        files.sort();
        let mut out = Vec::with_capacity(files.len());
        for (seq, key) in files {
            if let Some(r) = self.store.record(id, seq, &key)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// The newest recorded signal of a waitpoint that `pick` accepts, read newest first so a
    /// long-lived monitor costs one read when its latest report matches.
    pub fn latest_signal(
        &self,
        id: &str,
        pick: impl Fn(&SignalRecord) -> bool,
    ) -> Result<Option<SignalRecord>> {
        let mut files = self.list_signal_files(id)?;
        files.sort_unstable_by(|a, b| b.cmp(a));
        for (seq, key) in files {
            if let Some(r) = self.store.record(id, seq, &key)?
                && pick(&r)
            {
                return Ok(Some(r));
            }
        }
        Ok(None)
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
        tracing::info!(waitpoint = %id, session, "secret reset; the old one is refused from now on");
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

    /// Does whatever is due for one waitpoint at the engine's `now`: finishes an interrupted
    /// delivery, sends a pending wake whose time has come, expires it at its deadline (once,
    /// however late), and removes it when its retention has passed. Reports the hook deliveries
    /// that are due and when to look again.
    pub fn service(&self, id: &str) -> Result<Service> {
        let mut txn = self.store.begin()?;
        let Some((mut wp, _)) = txn.read(id)? else {
            return Ok(Service::default());
        };
        let txn = txn.as_mut();
        self.recover(txn, &mut wp)?;
        self.flush_outbox(txn, &mut wp)?;
        let now = self.clock.now();
        let cap = self.settings.max_wakes_per_hour;
        let before = wp.clone();
        if let Some(p) = rules::release_pending(&mut wp, now, cap) {
            self.emit(&mut wp, p.kind, p.outcome, p.first_seq, p.rounds)?;
        }
        if wp.status == Status::Armed
            && !wp.recheck_sent
            && wp
                .recheck_at
                .is_some_and(|at| now >= at && at < wp.expires_at)
        {
            wp.recheck_sent = true;
            if wp.counters.ok + wp.counters.fail == 0 {
                let pending = self.read_signals(&wp.id, wp.round.start_seq.max(1))?;
                let wake =
                    rules::compose_wake(&mut wp, WakeKind::Recheck, None, &pending, None, 1, now);
                tracing::info!(waitpoint = %wp.id, "recheck time reached with nothing terminal; recheck wake sent");
                wp.outbox.push(wake);
            }
        }
        if wp.status == Status::Armed && now >= wp.expires_at {
            let first = wp
                .pending_wake
                .as_ref()
                .map_or(wp.round.start_seq, |p| p.first_seq)
                .max(1);
            let pending = self.read_signals(&wp.id, first)?;
            let notice = rules::expire(&mut wp, &pending, now);
            let wake = rules::compose_wake(
                &mut wp,
                WakeKind::Deadline,
                None,
                &pending,
                Some(notice),
                1,
                now,
            );
            tracing::info!(waitpoint = %wp.id, "deadline passed; notice sent");
            wp.outbox.push(wake);
        }
        if wp != before {
            txn.put(&wp)?;
            self.flush_outbox(txn, &mut wp)?;
        }
        if let Some(at) = retention_ends(&wp)
            && now >= at
        {
            txn.remove(&wp)?;
            self.forget(id);
            tracing::info!(waitpoint = %id, "retention over; removed");
            return Ok(Service::default());
        }
        if wp.status != Status::Armed && wp.pending_wake.is_none() {
            self.forget(id);
        }
        let hooks_due = hooks_due(&wp.id, &wp.channel, &wp.hook_deliveries, now);
        // Attempts handed out now are rescheduled when they report back, so they do not count
        // toward the next look (that would make the daemon spin while a hook runs).
        let next = next_due_after(&wp, now);
        Ok(Service {
            next_due: next,
            hooks_due,
        })
    }

    /// Records the outcome of one `onWake` attempt for the wake's owner (a waitpoint, timer or
    /// callback): done on success; on failure the attempt count, the error and the next try
    /// (capped exponential backoff) are kept on the owner's record, so retries survive restarts.
    /// Returns when to look at the owner again.
    pub fn record_hook_attempt(
        &self,
        owner: &str,
        wake_id: &str,
        result: std::result::Result<(), String>,
    ) -> Result<Option<Timestamp>> {
        match Owner::of(owner) {
            Some(Owner::Timer(id)) => return self.record_timer_hook(&id, wake_id, result),
            Some(Owner::Callback(id)) => return self.record_callback_hook(&id, wake_id, result),
            Some(Owner::Waitpoint(_)) => {}
            None => return Ok(None),
        }
        let mut txn = self.store.begin()?;
        let Some((mut wp, _)) = txn.read(owner)? else {
            return Ok(None);
        };
        if note_hook_attempt(
            &mut wp.hook_deliveries,
            owner,
            wake_id,
            result,
            self.clock.now(),
        ) {
            txn.put(&wp)?;
        }
        Ok(next_due(&wp))
    }

    /// Delivers a wake that no waitpoint owns (a timer's or a callback's) to its inbox, and
    /// queues its `onWake` delivery on the owner's record.
    fn deliver_owned(&self, wake: &Wake, hooks: &mut Vec<HookDelivery>) -> Result<()> {
        delivery::deliver(&self.home, wake)?;
        if self.settings.on_wake.is_some() {
            hooks.push(HookDelivery {
                wake_id: wake.wake_id.clone(),
                attempts: 0,
                last_error: None,
                last_attempt_at: None,
                next_attempt_at: self.clock.now(),
                delivered_at: None,
            });
        }
        Ok(())
    }

    /// Deletes a session: cancels every armed waitpoint it may see (so a late signal cannot bring
    /// it back) and removes its inbox. Returns the ids it cancelled.
    pub fn delete_session(&self, session: &str) -> Result<SessionDeleted> {
        check_name("session", session)?;
        let mut cancelled = Vec::new();
        for wp in self.list_visible(session)? {
            if wp.status == Status::Armed {
                match self.cancel(&wp.id, session) {
                    Ok(_) => cancelled.push(wp.id),
                    Err(Error::NotFound { .. } | Error::Conflict(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        // Its capabilities die with it: a deleted session's callback tokens are rejected and
        // its timers never fire.
        let revoked_callbacks = self.revoke_session_callbacks(session)?;
        let mut cancelled_timers = Vec::new();
        for t in self.list_timers(session, usize::MAX)? {
            if t.status != crate::model::TimerStatus::Active {
                continue;
            }
            match self.cancel_timer(&t.id, session) {
                Ok(_) => cancelled_timers.push(t.id),
                Err(Error::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let dir = self.home.sessions_dir().join(session);
        match fs::remove_dir_all(&dir) {
            Ok(()) => store::fsync_dir(&self.home.sessions_dir())?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("cannot remove", &dir, e)),
        }
        tracing::info!(
            session,
            cancelled = cancelled.len(),
            timers = cancelled_timers.len(),
            callbacks = revoked_callbacks.len(),
            "session deleted"
        );
        Ok(SessionDeleted {
            waitpoints: cancelled,
            timers: cancelled_timers,
            callbacks: revoked_callbacks,
        })
    }

    /// Removes delivered wakes older than the TTL from every session's `cur/`.
    pub fn gc_read_wakes(&self) -> Result<usize> {
        let now = self.clock.now();
        let ttl = self.settings.ttl_ms as i64;
        let mut removed = 0;
        for (channel, _) in store::list_dir(&self.home.sessions_dir())? {
            let cur = self.home.inbox_cur(&channel);
            for (name, path) in store::list_dir(&cur)? {
                if store::is_temp_name(&name) || !name.ends_with(".json") {
                    continue;
                }
                let old = match read_json::<Wake>(&path) {
                    Ok(Some(w)) => now.millis_since(w.created_at) > ttl,
                    Ok(None) => false,
                    // An unreadable file in cur/ is the reader's; leave it alone.
                    Err(_) => false,
                };
                if old {
                    store::remove_durably(&path)?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Every waitpoint in the home, oldest first (a full scan).
    pub fn list(&self) -> Result<Vec<Waitpoint>> {
        let mut out = Vec::new();
        self.for_each_waitpoint(|wp| {
            out.push(wp);
            Ok(())
        })?;
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    /// Calls `f` with every waitpoint, one at a time, so a scan of a large home holds one
    /// waitpoint in memory, not all of them.
    pub fn for_each_waitpoint(&self, mut f: impl FnMut(Waitpoint) -> Result<()>) -> Result<()> {
        self.store.for_each(&mut f)
    }

    /// The waitpoints `session` may see, oldest first; cost grows with the session's
    /// waitpoints, not with the home's, once the index is complete.
    pub fn list_visible(&self, session: &str) -> Result<Vec<Waitpoint>> {
        self.store.list_visible(session)
    }

    /// Whether [`list_visible`](Self::list_visible) is answered without a full scan.
    pub fn index_is_complete(&self) -> bool {
        self.store.index_is_complete()
    }

    /// Brings the session index in line with the waitpoints (the daemon, at start).
    pub fn rebuild_index(&self) -> Result<usize> {
        self.store.rebuild_index()
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
    }
}

/// How long a closed waitpoint is kept, so a late signal is told "already resolved".
pub const RETAIN_MS: i64 = 3 * 86_400_000;

/// What [`Engine::service`] found for one waitpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Service {
    /// When to look at it again (`None`: nothing left to do, or it is gone).
    pub next_due: Option<Timestamp>,
    /// `onWake` deliveries to attempt now.
    pub hooks_due: Vec<HookJob>,
}

/// One `onWake` attempt for the daemon's hook runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookJob {
    /// The wake's owner: a waitpoint, timer or callback id.
    pub owner: String,
    pub channel: String,
    pub wake_id: String,
    pub attempt: u32,
}

/// Applies one hook attempt's result to the matching pending delivery; false when there is none.
impl Engine {
    /// The hook bookkeeping of a record that owns wakes besides a waitpoint (a timer, a
    /// callback), the same for each: note the attempt on `record` (its owner's lock held by the
    /// caller), save it when that changed it, and say when to look at it again. `None` record:
    /// gone meanwhile, nothing to do.
    pub(super) fn note_owned_hook<T>(
        &self,
        record: Option<T>,
        deliveries: impl Fn(&mut T) -> &mut Vec<HookDelivery>,
        save: impl Fn(&T) -> Result<()>,
        next_due: impl Fn(&T) -> Option<Timestamp>,
        (id, wake_id, result): (&str, &str, std::result::Result<(), String>),
    ) -> Result<Option<Timestamp>> {
        let Some(mut record) = record else {
            return Ok(None);
        };
        if note_hook_attempt(
            deliveries(&mut record),
            id,
            wake_id,
            result,
            self.clock.now(),
        ) {
            save(&record)?;
        }
        Ok(next_due(&record))
    }
}

fn note_hook_attempt(
    list: &mut [HookDelivery],
    owner: &str,
    wake_id: &str,
    result: std::result::Result<(), String>,
    now: Timestamp,
) -> bool {
    let Some(h) = list
        .iter_mut()
        .find(|h| h.wake_id == wake_id && h.is_pending())
    else {
        return false;
    };
    h.attempts += 1;
    h.last_attempt_at = Some(now);
    match result {
        Ok(()) => {
            h.delivered_at = Some(now);
            // Delivered: an error from an earlier attempt no longer describes it.
            h.last_error = None;
            tracing::info!(owner, wake = %wake_id, attempts = h.attempts, "onWake hook delivered");
        }
        Err(error) => {
            h.next_attempt_at = now.plus_ms(hook_backoff_ms(h.attempts));
            tracing::warn!(owner, wake = %wake_id, attempts = h.attempts, "onWake hook failed, will retry: {error}");
            h.last_error = Some(error);
        }
    }
    true
}

/// The hook attempts due at `now` for an owner's deliveries.
fn hooks_due(owner: &str, channel: &str, list: &[HookDelivery], now: Timestamp) -> Vec<HookJob> {
    list.iter()
        .filter(|h| h.is_pending() && h.next_attempt_at <= now)
        .map(|h| HookJob {
            owner: owner.to_owned(),
            channel: channel.to_owned(),
            wake_id: h.wake_id.clone(),
            attempt: h.attempts + 1,
        })
        .collect()
}

/// The earliest pending hook attempt after `handed_out` (those at or before it are in flight).
fn next_hook_after(list: &[HookDelivery], handed_out: Timestamp) -> Option<Timestamp> {
    list.iter()
        .filter(|h| h.is_pending() && h.next_attempt_at > handed_out)
        .map(|h| h.next_attempt_at)
        .min()
}

/// Capped exponential backoff between hook attempts: 1 s, 2 s, 4 s, ... up to 5 minutes.
pub fn hook_backoff_ms(attempts: u32) -> i64 {
    let exp = attempts.saturating_sub(1).min(20);
    (1_000i64 << exp).min(300_000)
}

/// Whether a resolved waitpoint is still inside its grace window (late reports still land in
/// the pending wake).
/// What deleting a session ended: its armed waitpoints (cancelled), its active timers
/// (cancelled) and its active callbacks (revoked).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct SessionDeleted {
    pub waitpoints: Vec<String>,
    pub timers: Vec<String>,
    pub callbacks: Vec<String>,
}

/// What a sender on the daemon's machine can know of its signal before sending it, from the
/// home alone (see [`prejudge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prejudged {
    /// It would be refused, with the same refusal the daemon would give.
    Refused(Refusal),
    /// The waitpoint is closed (and past its grace window): answered "already ...".
    Closed(Status),
    /// Nothing here refuses it: send it, and let the daemon decide.
    Open,
    /// This home holds no waitpoints (a device's, or one with no daemon yet): nothing to judge.
    Unknowable,
}

/// Judges `req` against the waitpoint state in `home` without changing anything, as the daemon
/// would (wrong secret, unknown id, missing or unlisted member, closed), so a sender on the
/// daemon's machine hears "refused" at once instead of having its signal parked later. Only
/// what this cannot see (a home without waitpoints, a state changing meanwhile) is left to the
/// daemon, which decides again in any case.
pub fn prejudge(home: &Home, now: Timestamp, req: &SignalRequest) -> Result<Prejudged> {
    if !home.waitpoints_dir().is_dir() {
        return Ok(Prejudged::Unknowable);
    }
    let wp = if is_waitpoint_id(&req.id) {
        read_json::<Waitpoint>(&home.waitpoint_file(&req.id))?
    } else {
        None
    };
    let Some(wp) = wp else {
        return Ok(Prejudged::Refused(Refusal::UnknownId));
    };
    if !req.secret.verify(&wp.secret_sha256) {
        return Ok(Prejudged::Refused(Refusal::Unauthorized));
    }
    if wp.status != Status::Armed && !in_grace_window(&wp, now) {
        return Ok(Prejudged::Closed(wp.status));
    }
    if let Err(r) = rules::check_member(&wp, req.member.as_deref()) {
        return Ok(Prejudged::Refused(r));
    }
    Ok(Prejudged::Open)
}

fn in_grace_window(wp: &Waitpoint, now: Timestamp) -> bool {
    wp.status == Status::Resolved
        && wp
            .pending_wake
            .as_ref()
            .is_some_and(|p| p.reason == HoldReason::Grace && now < p.due_at)
}

/// When a closed waitpoint may be removed: three days after it closed, once nothing is left
/// to deliver.
pub fn retention_ends(wp: &Waitpoint) -> Option<Timestamp> {
    let settled =
        wp.pending_wake.is_none() && wp.outbox.is_empty() && wp.hook_deliveries.is_empty();
    match (wp.status, wp.resolved_at) {
        (Status::Armed, _) | (_, None) => None,
        (_, Some(at)) if settled => Some(at.plus_ms(RETAIN_MS)),
        _ => None,
    }
}

/// The next time anything is due for a waitpoint.
pub fn next_due(wp: &Waitpoint) -> Option<Timestamp> {
    next_due_after(wp, Timestamp::from_millis(i64::MIN))
}

/// Like [`next_due`], leaving out hook attempts due at or before `handed_out` (in flight).
fn next_due_after(wp: &Waitpoint, handed_out: Timestamp) -> Option<Timestamp> {
    let mut due: Vec<Timestamp> = Vec::new();
    if let Some(p) = &wp.pending_wake {
        due.push(p.due_at);
    }
    if wp.status == Status::Armed {
        due.push(wp.expires_at);
        if !wp.recheck_sent {
            due.extend(wp.recheck_at);
        }
    }
    due.extend(next_hook_after(&wp.hook_deliveries, handed_out));
    due.extend(retention_ends(wp));
    due.into_iter().min()
}

/// A waitpoint's wakes that are still on their way to the session: pending, in the outbox,
/// awaiting the hook, or unread in the inbox.
pub fn has_undelivered_wake(home: &Home, wp: &Waitpoint) -> bool {
    !wp.outbox.is_empty()
        || wp.pending_wake.is_some()
        || wp.hook_deliveries.iter().any(HookDelivery::is_pending)
        || (wp.counters.wakes > 0
            && delivery::is_unread(home, &wp.channel, &wp.wake_id(wp.counters.wakes)))
}

/// The wake most recently produced for a waitpoint, wherever it is now.
pub fn latest_wake(home: &Home, wp: &Waitpoint) -> Result<Option<Wake>> {
    if let Some(w) = wp.outbox.last() {
        return Ok(Some(w.clone()));
    }
    if wp.counters.wakes == 0 {
        return Ok(None);
    }
    let id = wp.wake_id(wp.counters.wakes);
    for dir in [home.inbox_new(&wp.channel), home.inbox_cur(&wp.channel)] {
        if let Some(w) = read_json::<Wake>(&dir.join(format!("{id}.json")))? {
            return Ok(Some(w));
        }
    }
    Ok(None)
}

/// Reads a waitpoint for update that `session` may see.
fn read_visible(txn: &mut dyn Txn, id: &str, session: &str) -> Result<Waitpoint> {
    match txn.read(id)? {
        Some((wp, _)) if wp.visible_to(session) => Ok(wp),
        _ => Err(Error::not_found_for_session(id)),
    }
}
