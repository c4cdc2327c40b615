//! Scheduling: the due queue (when each waitpoint, timer or callback next needs the engine),
//! filling it at start and on hints, and running what is due.

use super::{Daemon, MAX_IDLE};
use crate::clock::Timestamp;
use crate::engine;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When each waitpoint next needs the engine: one entry per waitpoint, earliest first. This is
/// what keeps idle cost independent of how many waitpoints are armed: nothing is scanned, the
/// loop sleeps until the first entry.
///
/// Both indexes share one allocation of each id: at a million armed waitpoints (every one has
/// a deadline) the queue is most of the daemon's memory.
#[derive(Debug, Default)]
pub(super) struct DueQueue {
    by_time: BTreeSet<(Timestamp, Arc<str>)>,
    at: HashMap<Arc<str>, Timestamp>,
}

impl DueQueue {
    pub(super) fn set(&mut self, id: &str, when: Option<Timestamp>) {
        let key = match self.at.remove_entry(id) {
            Some((key, old)) => {
                self.by_time.remove(&(old, Arc::clone(&key)));
                key
            }
            None if when.is_some() => Arc::from(id),
            None => return,
        };
        if let Some(t) = when {
            self.by_time.insert((t, Arc::clone(&key)));
            self.at.insert(key, t);
        }
    }

    pub(super) fn first(&self) -> Option<Timestamp> {
        self.by_time.first().map(|(t, _)| *t)
    }

    pub(super) fn pop_due(&mut self, now: Timestamp) -> Option<String> {
        let (t, _) = self.by_time.first()?;
        if *t > now {
            return None;
        }
        let (_, id) = self.by_time.pop_first()?;
        self.at.remove(&*id);
        Some(id.to_string())
    }

    pub(super) fn len(&self) -> usize {
        self.at.len()
    }

    pub(super) fn clear(&mut self) {
        self.by_time.clear();
        self.at.clear();
    }
}

impl Daemon {
    pub(super) fn time_to_next(&self, next_sweep: Option<Instant>) -> Duration {
        if !self.to_park.is_empty() {
            // Refusals are waiting to be parked: look for events, then park some more.
            return Duration::ZERO;
        }
        let now = Instant::now();
        let mut wait = MAX_IDLE;
        if let Some(at) = next_sweep {
            wait = wait.min(at.saturating_duration_since(now));
        }
        if let Some(at) = self.due.first() {
            let ms = at.millis_since(self.engine.now());
            wait = wait.min(Duration::from_millis(ms as u64));
        }
        if let Some((at, _)) = self.deferred.iter().min_by_key(|(at, _)| *at) {
            wait = wait.min(at.saturating_duration_since(now));
        }
        if let Some(at) = self.retry.at() {
            wait = wait.min(at.saturating_duration_since(now));
        }
        wait
    }

    /// Rebuilds the due queue from disk. On start this also finishes whatever a restart
    /// interrupted: each waitpoint is serviced once, so missed deadlines fire once, not once per
    /// missed sweep, and interrupted deliveries complete.
    /// The scan streams (one waitpoint in memory at a time), so memory grows with the due
    /// queue, not with the size of every waitpoint.
    pub(super) fn rescan_waitpoints(&mut self) {
        let started = Instant::now();
        let mut scanned = 0_usize;
        self.due.clear();
        let now = self.engine.now();
        self.silent_devices.clear();
        let due = &mut self.due;
        let silent = &mut self.silent_devices;
        let scan = self.engine.for_each_waitpoint(|wp| {
            scanned += 1;
            super::devices::note_device_watch(silent, &wp);
            let at = engine::next_due(&wp);
            // Finish interrupted deliveries at once; everything else waits its turn in the queue.
            let at = if wp.outbox.is_empty() { at } else { Some(now) };
            due.set(&wp.id, at);
            Ok(())
        });
        match scan {
            Ok(()) => tracing::info!(
                waitpoints = scanned,
                ms = started.elapsed().as_millis() as u64,
                "scanned every waitpoint"
            ),
            Err(e) => tracing::error!(error = %e, "cannot scan waitpoints"),
        }
        match self.engine.all_timers() {
            Ok(timers) => {
                for t in timers {
                    let due = engine::timers::timer_next_due(&t, Timestamp::from_millis(i64::MIN));
                    self.due.set(&t.id, due);
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot scan timers"),
        }
        match self.engine.list_callbacks(None) {
            Ok(cbs) => {
                for cb in cbs
                    .iter()
                    .filter(|c| c.hook_deliveries.iter().any(|h| h.is_pending()))
                {
                    self.due.set(&cb.id, Some(now));
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot scan callbacks"),
        }
    }

    /// Builds the session index when the home has none yet (made before it existed).
    pub(super) fn ensure_index(&self) {
        if self.engine.index_is_complete() {
            return;
        }
        let started = Instant::now();
        match self.engine.rebuild_index() {
            Ok(added) => tracing::info!(
                added,
                ms = started.elapsed().as_millis() as u64,
                "session index rebuilt"
            ),
            Err(e) => tracing::error!(
                error = %e,
                "cannot rebuild the session index (readers scan instead; will retry at the next \
                 sweep)"
            ),
        }
    }

    /// A timer file changed: read that one timer (not the whole directory) and requeue it.
    pub(super) fn reschedule_timer(&mut self, id: &str) {
        match self.engine.load_timer(id) {
            Ok(t) => {
                let due = t.and_then(|t| {
                    engine::timers::timer_next_due(&t, Timestamp::from_millis(i64::MIN))
                });
                self.due.set(id, due);
            }
            Err(e) => tracing::error!(timer = %id, error = %e, "cannot read timer"),
        }
    }

    /// Services every waitpoint whose time has come.
    pub(super) fn run_due(&mut self) {
        let now = self.engine.now();
        // Take everything due first and service each once: an entry that comes back due again
        // waits for the next turn of the loop instead of spinning here.
        let mut ids = Vec::new();
        while let Some(id) = self.due.pop_due(now) {
            ids.push(id);
        }
        // On a shared store everything due is the leader's to service (a new leader scans it
        // all, see `on_leading`), so a deadline fires and a hook runs once, on one host.
        let applies = self.engine.store().applies_signals();
        if applies && !ids.is_empty() {
            // A deadline, a held wake, a hook's retry: each may change the operator's page.
            self.views_changed();
        }
        for id in ids {
            if !applies {
                continue;
            }
            // One queue for every kind of owner.
            let serviced = match crate::request::Owner::of(&id) {
                Some(crate::request::Owner::Timer(t)) => self.engine.service_timer(&t),
                Some(crate::request::Owner::Callback(c)) => self.engine.service_callback(&c),
                _ => self.engine.service(&id),
            };
            match serviced {
                Ok(service) => {
                    self.due.set(&id, service.next_due);
                    for job in service.hooks_due {
                        self.start_hook(job);
                    }
                }
                Err(e) => {
                    tracing::error!(
                        waitpoint = %id,
                        error = %e,
                        "cannot service waitpoint (will retry)",
                    );
                    self.due.set(&id, Some(now.plus_ms(1000)));
                }
            }
        }
    }
}
