//! Leadership of a shared store, and what only its leader does: applying what other hosts
//! handed over, delivering the wakes the store holds for this host, and starting to lead (its
//! cached beliefs forgotten, every deadline scheduled afresh).

use std::time::Instant;

use super::Daemon;
use crate::engine::{self, Verdict};
use crate::request::Source;

/// The log line of a handed-over signal's verdict.
fn log_forwarded(req: &crate::request::SignalRequest, source: &Source, v: &Verdict) {
    let origin = source.origin();
    match v {
        Verdict::Accepted { id, seq, wake, .. } => {
            tracing::info!(
                waitpoint = %id,
                seq,
                source = %origin,
                woke = wake.is_some(),
                "handed-over signal accepted",
            )
        }
        Verdict::Duplicate { id, .. } => {
            tracing::info!(waitpoint = %id, source = %origin, "handed-over signal is a duplicate")
        }
        Verdict::Closed { id, status, .. } => {
            tracing::info!(
                waitpoint = %id,
                source = %origin,
                status = status.as_str(),
                "late handed-over signal: the waitpoint is closed",
            )
        }
        Verdict::Refused(r) => {
            tracing::warn!(
                waitpoint = %req.id,
                source = %origin,
                reason = %r.reason(),
                "handed-over signal refused",
            )
        }
        Verdict::Queued { .. } => {}
    }
}

impl Daemon {
    /// The leading daemon of a shared store applies what other hosts handed over, a batch at
    /// a time, and forgets each once its verdict is durable. One that failed stays for the
    /// next round (this daemon's or the next leader's): its identity makes a second
    /// application a duplicate.
    pub(super) fn apply_forwarded(&mut self) {
        while self.engine.store().applies_signals() && !self.stopping() {
            // Only a shared store has signals handed over.
            let Some(cluster) = self.engine.store().cluster() else {
                return;
            };
            let batch = match cluster.forwarded(engine::MAX_BATCH) {
                Ok(b) if b.is_empty() => return,
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read handed-over signals (will retry)");
                    self.retry.failed(Instant::now());
                    return;
                }
            };
            let mut items = Vec::new();
            let mut keys = Vec::new();
            let mut settled = Vec::new();
            for f in &batch {
                match f.request() {
                    Some(item) => {
                        items.push(item);
                        keys.push(f.key.clone());
                    }
                    None => {
                        tracing::warn!(
                            key = %f.key,
                            source = %f.source,
                            "dropping a handed-over signal whose source does not parse",
                        );
                        settled.push(f.key.clone());
                    }
                }
            }
            let verdicts = self.engine.apply_forwarded(&items);
            let mut failed = false;
            for ((key, (req, source)), verdict) in keys.into_iter().zip(&items).zip(verdicts) {
                match verdict {
                    Ok(v) => {
                        log_forwarded(req, source, &v);
                        self.after_verdict(&v);
                        settled.push(key);
                    }
                    Err(e) => {
                        failed = true;
                        tracing::warn!(
                            waitpoint = %req.id,
                            source = %source.origin(),
                            error = %e,
                            "cannot apply a handed-over signal (kept for another try)",
                        );
                    }
                }
            }
            let settle = match self.engine.store().cluster() {
                Some(cluster) => cluster.settle_forwarded(&settled),
                None => Ok(()),
            };
            if let Err(e) = settle {
                // Applied but not forgotten: the next round finds them recorded (duplicates).
                tracing::warn!(error = %e, "cannot forget applied handed-over signals");
                self.retry.failed(Instant::now());
                return;
            }
            if failed {
                self.retry.failed(Instant::now());
                return;
            }
        }
    }

    /// Delivers the wakes a shared store holds for this host's inboxes.
    pub(super) fn deliver_wakes(&mut self) {
        let Some(cluster) = self.engine.store().cluster() else {
            return;
        };
        match cluster.deliver_pending() {
            Ok(0) => {}
            Ok(n) => tracing::info!(wakes = n, "delivered wakes from the shared store"),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot deliver wakes from the shared store (will retry)",
                );
                self.retry.failed(Instant::now());
            }
        }
    }

    /// Leadership of a shared store moved. A new leader forgets what it believed about any
    /// waitpoint (another daemon applied signals meanwhile), schedules every waitpoint's
    /// deadline afresh and applies what was handed over while nobody led.
    pub(super) fn on_leading(&mut self, on: bool, change: u64) {
        if on {
            tracing::info!("leading: applying signals and running deadlines for every host");
            if change > self.scanned_after {
                self.engine.forget_all();
                self.rescan_waitpoints();
            }
            self.apply_forwarded();
            self.sweep_spool();
        } else {
            tracing::warn!("no longer leading: handing signals over to the leader");
        }
    }
}
