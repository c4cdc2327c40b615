//! Collection: the drop zone (hinted files, batches, the sweep, the startup drain), signals
//! over HTTP, and what follows a verdict (parking refusals a few at a time, scheduling the
//! wake's owner). A device's mirror is collected in `devices.rs`, what the leader of a shared
//! store applies for other hosts in `leading.rs`.

use super::{BACKLOG_LOG_EVERY, BACKLOG_REPORT_MIN, Daemon, Event, PARK_PER_TURN};
use crate::engine::{self, Engine, Verdict};
use crate::error::Result;
use crate::ingress::http::{Outcome, Submission};
use crate::ingress::spool::{FileOutcome, SETTLE_MS, Spool};
use crate::request::Source;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

/// How long a batch of HTTP signals waits, at most, for signals the shim has received and is
/// still routing ([`crate::ingress::http::Arriving`]). Routing one takes tens of microseconds;
/// missing the batch costs it a whole commit (an `fdatasync`, half a millisecond or more).
const ARRIVING_WAIT: Duration = Duration::from_micros(500);
/// How often the count is looked at again while waiting.
const ARRIVING_SLICE: Duration = Duration::from_micros(50);

/// Collects `names` from `spool` as one commit: reads and parses them, applies their signals
/// ([`Engine::apply_batch`]), then removes or parks each file. This is the one place signals
/// from files are applied; a command that acts as the daemon for one round (`device poll`
/// without one) and the tests call it too. One result per name, in order.
pub fn collect_files(
    spool: &Spool,
    engine: &Engine,
    names: &[String],
) -> Vec<(String, Result<FileOutcome>)> {
    let read = spool.read_batch(engine, names);
    let verdicts = if read.items().is_empty() {
        Vec::new()
    } else {
        engine.apply_batch(read.items())
    };
    spool.settle_batch(engine, read, verdicts)
}

/// [`collect_files`] for one file.
pub fn collect_file(spool: &Spool, engine: &Engine, name: &str) -> Result<FileOutcome> {
    let (_, outcome) = collect_files(spool, engine, &[name.to_owned()])
        .pop()
        .expect("one outcome per name");
    outcome
}

/// Takes the events already waiting on `rx`, offering each to `take`, which keeps it (returns
/// `None`, setting the count it now holds) or hands it back; at an empty channel, while
/// `coming` says more is on its way, waits for it, at most `wait` in all. Stops at an empty
/// channel with nothing coming, a shutdown (its flag is already set) or a full batch; the
/// events handed back go back on the channel (`tx`) in their order.
fn gather_from(
    rx: &Receiver<Event>,
    tx: &Sender<Event>,
    mut take: impl FnMut(Event, &mut usize) -> Option<Event>,
    mut coming: impl FnMut() -> bool,
    wait: Duration,
) {
    let mut held = 1;
    let mut others = Vec::new();
    let until = Instant::now() + wait;
    while held < engine::MAX_BATCH {
        let next = match rx.try_recv() {
            Err(TryRecvError::Empty) if coming() => {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                // In slices: a signal counted as coming may be refused by its route and never
                // come, which only the count says.
                match rx.recv_timeout(left.min(ARRIVING_SLICE)) {
                    Ok(event) => event,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            Ok(event) => event,
            Err(_) => break,
        };
        match next {
            Event::Shutdown => break,
            event => others.extend(take(event, &mut held)),
        }
    }
    for event in others {
        let _ = tx.send(event);
    }
}

impl Daemon {
    /// Tries again, before the next sweep, what failed commits kept back (see `retry`): the
    /// drop zone, the device mirrors, what other hosts handed over, this host's wakes.
    pub(super) fn retry_kept_back(&mut self) {
        tracing::debug!("retrying what a failed commit kept back");
        self.sweep_spool();
        self.sweep_devices();
        self.apply_forwarded();
        self.deliver_wakes();
        self.retry.pass_done();
    }

    /// The first sweep at start: like any sweep, plus progress and summary lines when the
    /// backlog is large. Returns how many files were handled.
    pub(super) fn drain_backlog(&mut self) -> usize {
        let names = self.pending_names();
        let total = names.len();
        if total < BACKLOG_REPORT_MIN {
            return self.collect_all(&names);
        }
        tracing::info!(total, "draining a backlog of {total} signal files");
        let started = Instant::now();
        let mut progress = self.progress.take();
        if let Some(p) = progress.as_mut() {
            p.start(total);
        }
        let mut done = 0;
        for chunk in names.chunks(engine::MAX_BATCH) {
            if self.stopping() {
                break;
            }
            let before = done;
            self.collect_batch(chunk);
            done += chunk.len();
            if let Some(p) = progress.as_mut() {
                p.advance(done);
            }
            if done / BACKLOG_LOG_EVERY > before / BACKLOG_LOG_EVERY && done < total {
                tracing::info!(done, total, "drained {done} of {total} backlog files");
            }
        }
        if let Some(p) = progress.as_mut() {
            p.finish();
        }
        self.progress = progress;
        let ms = started.elapsed().as_millis() as u64;
        if done < total {
            tracing::info!(
                done,
                total,
                ms,
                "stopping: drained {done} of {total} backlog files; the rest stay spooled"
            );
        } else {
            tracing::info!(done, total, ms, "backlog drained: {total} files in {ms} ms");
        }
        done
    }

    pub(super) fn collect(&mut self, name: &str) {
        self.collect_batch(&[name.to_owned()]);
    }

    /// Collects the hinted file together with every other file already hinted (up to a
    /// batch), so a burst of signals shares its fsyncs. Other events met on the way go back on
    /// the channel in their order; a shutdown needs nothing, its flag is already set.
    pub(super) fn collect_hinted(&mut self, first: String) {
        // A set beside the list: a batch holds hundreds of names, and a look through the list
        // for each would cost the square of that.
        let mut seen = std::collections::HashSet::from([first.clone()]);
        let mut names = vec![first];
        self.gather(|event, n| match event {
            Event::SpoolFile(name) => {
                if seen.insert(name.clone()) {
                    names.push(name);
                }
                *n = names.len();
                None
            }
            other => Some(other),
        });
        self.collect_batch(&names);
    }

    /// Takes the events already waiting on the channel, offering each to `take`, which keeps
    /// it (returns `None`, setting the count it now holds) or hands it back. Stops at an empty
    /// channel, a shutdown (its flag is already set) or a full batch; the events handed back
    /// go back on the channel in their order.
    pub(super) fn gather(&mut self, take: impl FnMut(Event, &mut usize) -> Option<Event>) {
        gather_from(&self.rx, &self.tx, take, || false, Duration::ZERO);
    }

    /// Reads a waitpoint that appeared or changed elsewhere (another process, another host's
    /// commit) together with every other one already waiting on the channel, in one read of
    /// the store: a shared store's leader commits up to a batch of waitpoints at a time, and
    /// a standby reading each on its own, one round trip after another, held up its own
    /// hand-overs behind them.
    pub(super) fn load_appeared(&mut self, id: String) {
        let mut ids = vec![id];
        self.gather(|event, n| match event {
            Event::WaitpointAppeared(id) => {
                if !ids.contains(&id) {
                    ids.push(id);
                }
                *n = ids.len();
                None
            }
            other => Some(other),
        });
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        match self.engine.store().get_many(&refs) {
            Ok(read) => {
                for wp in read.into_iter().flatten() {
                    self.note_device_watch(&wp);
                    self.due.set(&wp.id, engine::next_due(&wp));
                }
            }
            Err(e) => {
                tracing::error!(
                    waitpoints = ids.len(),
                    error = %e,
                    "cannot read changed waitpoints"
                )
            }
        }
    }

    /// Applies an HTTP signal together with every other one already waiting on the channel
    /// (up to a batch), so concurrent clients share one journal commit; each answer is sent
    /// the moment the batch is durable (its journal line fdatasynced), not after its files are
    /// written. Other events go back on the channel in their order.
    pub(super) fn apply_http(
        &mut self,
        request: crate::request::SignalRequest,
        key: String,
        reply: Outcome<Result<Verdict>>,
    ) {
        let mut items = vec![(request, Source::Http(key))];
        let mut replies = vec![Some(reply)];
        let arriving = self.arriving.clone();
        let coming = move || arriving.as_ref().is_some_and(|a| a.count() > 0);
        gather_from(
            &self.rx,
            &self.tx,
            |event, n| match event {
                Event::Http(Submission::Signal {
                    request,
                    key,
                    reply,
                }) => {
                    items.push((request, Source::Http(key)));
                    replies.push(Some(reply));
                    *n = items.len();
                    None
                }
                other => Some(other),
            },
            coming,
            ARRIVING_WAIT,
        );
        let verdicts = self.engine.apply_batch_notify(&items, &mut |i, v| {
            if let Some(reply) = replies[i].take() {
                reply.send(Ok(v.clone()));
            }
        });
        for (verdict, reply) in verdicts.into_iter().zip(replies) {
            if let Ok(v) = &verdict {
                self.after_verdict(v);
            }
            if let Some(reply) = reply {
                reply.send(verdict);
            }
        }
    }

    /// Collects `names` (at most a batch) as one group commit.
    pub(super) fn collect_batch(&mut self, names: &[String]) {
        let names: Vec<String> = names
            .iter()
            .filter(|n| !self.parking.contains(*n))
            .cloned()
            .collect();
        for (name, outcome) in collect_files(&self.spool, &self.engine, &names) {
            self.after_collect(&name, outcome);
        }
        for q in self.spool.take_queued() {
            if self.parking.insert(q.name.clone()) {
                self.to_park.push_back(q);
            }
        }
    }

    /// Parks a few queued refusals: each costs several fsyncs, and done on the spot a flood of
    /// them made accepted signals wait behind it. The loop calls this only when no event is
    /// waiting, a few at a time, so a signal that arrives meanwhile goes ahead of the flood.
    pub(super) fn park_some(&mut self) {
        let n = self.to_park.len().min(PARK_PER_TURN);
        let turn: Vec<_> = self.to_park.drain(..n).collect();
        for (q, parked) in turn.iter().zip(self.spool.park_queued(&turn)) {
            if let Err(e) = parked {
                tracing::error!(
                    file = ?q.name,
                    error = %e,
                    "cannot park refused signal file (kept for the next sweep)",
                );
            }
            self.parking.remove(&q.name);
        }
    }

    pub(super) fn after_collect(&mut self, name: &str, outcome: Result<FileOutcome>) {
        match outcome {
            Ok(FileOutcome::Consumed(verdict)) => self.after_verdict(&verdict),
            Ok(FileOutcome::Triggered(callback)) => self.after_trigger(&callback),
            Ok(FileOutcome::Deferred) => {
                let at = Instant::now() + Duration::from_millis(SETTLE_MS as u64 + 100);
                if !self.deferred.iter().any(|(_, n)| n == name) {
                    self.deferred.push((at, name.to_owned()));
                }
            }
            Ok(_) => {}
            // The file stays in the spool; a retry pass soon (or the next sweep) tries again.
            Err(e) => {
                tracing::error!(
                    file = ?name,
                    error = %e,
                    "cannot collect signal file (kept for retry)",
                );
                self.retry.failed(Instant::now());
            }
        }
    }

    pub(super) fn retry_deferred(&mut self) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) =
            self.deferred.drain(..).partition(|(at, _)| *at <= now);
        self.deferred = later;
        for (_, name) in due {
            self.collect(&name);
        }
    }

    /// Collects every pending file in the drop zone; returns how many were handled.
    pub(super) fn sweep_spool(&mut self) -> usize {
        let names = self.pending_names();
        self.collect_all(&names)
    }

    pub(super) fn pending_names(&self) -> Vec<String> {
        self.spool.pending().unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot list the drop zone");
            Vec::new()
        })
    }

    /// Collects `names` in order, a batch at a time, stopping early (between batches) on
    /// shutdown.
    pub(super) fn collect_all(&mut self, names: &[String]) -> usize {
        let mut done = 0;
        for chunk in names.chunks(engine::MAX_BATCH) {
            if self.stopping() {
                break;
            }
            self.collect_batch(chunk);
            done += chunk.len();
            // A long sweep (a backlog, a flood of junk) lets what arrived meanwhile go first.
            self.serve_waiting_events();
        }
        done
    }

    /// Handles the signals that arrived while a sweep was going (hinted files, HTTP requests),
    /// at most a batch of events; anything that would start a sweep of its own, or stop or
    /// reconfigure the loop, goes back on the channel for the loop.
    pub(super) fn serve_waiting_events(&mut self) {
        let mut later = Vec::new();
        for _ in 0..engine::MAX_BATCH {
            match self.rx.try_recv() {
                Ok(e @ (Event::SpoolFile(_) | Event::Http(_))) => self.handle(e),
                Ok(Event::Shutdown) => {
                    later.push(Event::Shutdown);
                    break;
                }
                Ok(other) => later.push(other),
                Err(_) => break,
            }
        }
        for event in later {
            let _ = self.tx.send(event);
        }
    }

    /// Every route's accepted signal ends here: its waitpoint's next due time joins the queue
    /// (a grace window, a hook delivery), so no ingress path can skip the wake rules.
    pub(super) fn after_verdict(&mut self, verdict: &Verdict) {
        // A duplicate or late file can still have changed the state (the engine replays
        // records a crash left unapplied before it answers), so every verdict that names a
        // waitpoint carries its next due time.
        let (id, next_due) = match verdict {
            Verdict::Accepted { id, next_due, .. }
            | Verdict::Duplicate { id, next_due }
            | Verdict::Closed { id, next_due, .. } => (id, *next_due),
            Verdict::Refused(_) | Verdict::Queued { .. } => return,
        };
        self.due.set(id, next_due);
        // Anything due right now (a wake for the hook) is handled on this same turn.
        if next_due.is_some_and(|t| t <= self.engine.now()) {
            self.run_due();
        }
    }

    /// A triggered callback's wake may have an `onWake` delivery to start.
    pub(super) fn after_trigger(&mut self, callback: &str) {
        if self.hooks.is_some() {
            self.due.set(callback, Some(self.engine.now()));
            self.run_due();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    /// A batch that finds the channel empty while a signal is still counted as coming waits for
    /// it and takes it: the signal is sent only once the batch has looked and found nothing, so
    /// a batch that did not wait would go without it.
    #[test]
    fn a_batch_waits_for_a_signal_counted_as_coming_and_takes_it() {
        let (tx, rx) = mpsc::channel();
        let (go, on_go) = mpsc::channel::<()>();
        let coming = Arc::new(AtomicUsize::new(1));
        let route = {
            let (tx, coming) = (tx.clone(), Arc::clone(&coming));
            std::thread::spawn(move || {
                if on_go.recv().is_ok() {
                    tx.send(Event::SpoolFile("late".into())).unwrap();
                }
                coming.fetch_sub(1, Ordering::SeqCst);
            })
        };
        let mut taken = Vec::new();
        let mut looked = false;
        gather_from(
            &rx,
            &tx,
            |event, n| match event {
                Event::SpoolFile(name) => {
                    taken.push(name);
                    *n = taken.len() + 1;
                    None
                }
                other => Some(other),
            },
            || {
                if !looked {
                    looked = true;
                    go.send(()).unwrap();
                }
                coming.load(Ordering::SeqCst) > 0
            },
            Duration::from_secs(3600),
        );
        drop(go);
        route.join().unwrap();
        assert_eq!(taken, ["late"]);
    }
}
