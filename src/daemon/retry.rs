//! The prompt retry of what a failed commit kept back: a signal file left in the drop zone or a
//! device mirror, a handed-over signal left in the shared store, a wake not yet delivered. The
//! periodic sweep would find them too, but only after `waitpointSweepMs` (30 s by default);
//! a store that failed for a moment (an etcd member killed, an election) answers again sooner.
//! So a failure schedules a retry pass on the loop's own clock, 250 ms after it, doubling with
//! each pass that fails again up to 4 s, back to 250 ms once a pass keeps nothing back. The
//! loop sleeps until then like for any other due time: no thread, no busy loop.

use std::time::{Duration, Instant};

/// The wait before the first retry after a success.
pub(super) const FIRST: Duration = Duration::from_millis(250);
/// The longest wait between two retries while failures go on: how late, at most, what was
/// kept back is applied once the store answers again.
pub(super) const LONGEST: Duration = Duration::from_secs(4);

/// When the next retry pass is due, and the wait before the one after.
#[derive(Debug)]
pub(super) struct Backoff {
    delay: Duration,
    at: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            delay: FIRST,
            at: None,
        }
    }
}

impl Backoff {
    /// Something was kept back at `now`: a retry pass is due after the current wait, and the
    /// wait doubles. A pass already scheduled stays as it is (failures in a burst share it).
    pub(super) fn failed(&mut self, now: Instant) {
        if self.at.is_none() {
            self.at = Some(now + self.delay);
            self.delay = (self.delay * 2).min(LONGEST);
        }
    }

    /// When the next pass is due, if one is.
    pub(super) fn at(&self) -> Option<Instant> {
        self.at
    }

    /// Whether a pass is due at `now`; if so it is taken (unscheduled), and a failure during
    /// the pass schedules the next one.
    pub(super) fn take_due(&mut self, now: Instant) -> bool {
        match self.at {
            Some(at) if at <= now => {
                self.at = None;
                true
            }
            _ => false,
        }
    }

    /// A pass ended: if it kept nothing back, the next failure is retried quickly again.
    pub(super) fn pass_done(&mut self) {
        if self.at.is_none() {
            self.delay = FIRST;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_passes_wait_longer_each_time_up_to_the_longest_and_a_clean_one_resets() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert!(!b.take_due(t0));
        b.failed(t0);
        // Failures in a burst share the pass scheduled by the first.
        b.failed(t0 + Duration::from_millis(100));
        assert_eq!(b.at(), Some(t0 + FIRST));
        assert!(!b.take_due(t0 + Duration::from_millis(200)));
        let mut now = t0 + FIRST;
        let mut waits = Vec::new();
        for _ in 0..6 {
            assert!(b.take_due(now));
            assert_eq!(b.at(), None);
            b.failed(now);
            b.pass_done();
            let at = b.at().unwrap();
            waits.push((at - now).as_millis());
            now = at;
        }
        assert_eq!(waits, [500, 1000, 2000, 4000, 4000, 4000]);
        assert!(b.take_due(now));
        b.pass_done();
        assert_eq!(b.at(), None);
        b.failed(now);
        assert_eq!(b.at(), Some(now + FIRST));
    }
}
