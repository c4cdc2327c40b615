//! What is due for a waitpoint and doing it: pending wakes, the recheck, the deadline (once,
//! however late), retention, and the `onWake` hook bookkeeping every owner of wakes shares.

use super::{Engine, rules, silence};
use crate::clock::Timestamp;
use crate::error::Result;
use crate::records::{HoldReason, HookDelivery, Status, Waitpoint, Wake, WakeKind};
use crate::request::Owner;

impl Engine {
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
                let pending = self.carried(&wp, wp.round.start_seq.max(1), &[])?;
                let wake =
                    rules::compose_wake(&mut wp, WakeKind::Recheck, None, &pending, None, 1, now);
                tracing::info!(
                    waitpoint = %wp.id,
                    "recheck time reached with nothing terminal; recheck wake sent",
                );
                wp.outbox.push(wake);
            }
        }
        self.queue_due_silence(&mut wp, now)?;
        if wp.status == Status::Armed && now >= wp.expires_at {
            let first = wp
                .pending_wake
                .as_ref()
                .map_or(wp.round.start_seq, |p| p.first_seq)
                .max(1);
            let pending = self.carried(&wp, first, &[])?;
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
        let next = if self.silence_is_held() {
            // Held (the start-up drain): looked at again once, when the hold is released, not
            // at every turn of the drain.
            if silence::silence_due(&wp).is_some_and(|t| t <= now) {
                self.note_held(&wp.id);
            }
            next_due_parts(&wp, now, false)
        } else {
            next_due_after(&wp, now)
        };
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
    pub(super) fn deliver_owned(&self, wake: &Wake, hooks: &mut Vec<HookDelivery>) -> Result<()> {
        // Through the store: on one shared by several hosts, to the session's host.
        self.store.deliver(wake)?;
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

pub(super) fn note_hook_attempt(
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
            tracing::warn!(
                owner,
                wake = %wake_id,
                attempts = h.attempts,
                error = %error,
                "onWake hook failed, will retry",
            );
            h.last_error = Some(error);
        }
    }
    true
}

/// The hook attempts due at `now` for an owner's deliveries.
pub(super) fn hooks_due(
    owner: &str,
    channel: &str,
    list: &[HookDelivery],
    now: Timestamp,
) -> Vec<HookJob> {
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
pub(super) fn next_hook_after(list: &[HookDelivery], handed_out: Timestamp) -> Option<Timestamp> {
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
pub(super) fn in_grace_window(wp: &Waitpoint, now: Timestamp) -> bool {
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
pub(super) fn next_due_after(wp: &Waitpoint, handed_out: Timestamp) -> Option<Timestamp> {
    next_due_parts(wp, handed_out, true)
}

/// [`next_due_after`], the silence watches left out unless `silence`.
fn next_due_parts(wp: &Waitpoint, handed_out: Timestamp, silence: bool) -> Option<Timestamp> {
    let mut due: Vec<Timestamp> = Vec::new();
    // Wakes in the outbox are a delivery that was interrupted (its flush failed): due at once,
    // whoever asks. A daemon that re-read such a waitpoint on a hint once scheduled nothing
    // for it (an expired one has no other due time), and its wake stayed in the outbox
    // (issue 40's nemesis, after a split healed).
    if !wp.outbox.is_empty() {
        due.push(Timestamp::from_millis(i64::MIN));
    }
    if let Some(p) = &wp.pending_wake {
        due.push(p.due_at);
    }
    if wp.status == Status::Armed {
        due.push(wp.expires_at);
        if !wp.recheck_sent {
            due.extend(wp.recheck_at);
        }
        if silence {
            due.extend(silence::silence_due(wp));
        }
    }
    due.extend(next_hook_after(&wp.hook_deliveries, handed_out));
    due.extend(retention_ends(wp));
    due.into_iter().min()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An expired waitpoint whose deadline wake is still in its outbox (the flush failed) is
    /// due at once, so whoever schedules it from a read finishes the delivery; with the outbox
    /// empty it has nothing due before its retention ends.
    #[test]
    fn a_waitpoint_with_wakes_in_its_outbox_is_due_at_once() {
        let mut wp: Waitpoint =
            serde_json::from_str(include_str!("../../layouts/waitpoint.example.json")).unwrap();
        wp.status = Status::Expired;
        wp.pending_wake = None;
        wp.hook_deliveries.clear();
        wp.outbox.clear();
        let idle = next_due(&wp);
        assert!(
            idle.is_none_or(|t| t > Timestamp::from_millis(0)),
            "{idle:?}"
        );
        wp.outbox
            .push(serde_json::from_str(include_str!("../../layouts/wake.example.json")).unwrap());
        assert_eq!(next_due(&wp), Some(Timestamp::from_millis(i64::MIN)));
    }
}
