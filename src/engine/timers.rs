//! Durable timers: an alarm clock that survives a reboot (the events-and-timers contract).
//!
//! A timer is `timers/<id>.json`, owned by a session. When it is due the daemon calls
//! [`Engine::service_timer`], which delivers a `timer` wake through the same inbox (and `onWake`
//! hook) as waitpoints, then advances the record. Wake ids are stable (`wk_<hex>_<n>` for the
//! n-th firing), so a crash between the delivery and the record update re-delivers the same
//! wake rather than a second one. Firings missed while the daemon was down fire once.

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::records::{
    EXTERNAL_NOTICE, ExternalPayload, Timer, TimerRef, TimerStatus, Wake, WakeKind,
};

use super::{Engine, Service, hooks_due, next_hook_after};
use crate::request::check_name;

/// Timer ids are `tm_` and 12 hex digits.
pub const ID_PREFIX: &str = "tm_";
/// The longest summary, in characters.
pub const MAX_SUMMARY_CHARS: usize = 2_000;

/// A validated `timer create`.
#[derive(Debug, Clone)]
pub struct TimerRequest {
    pub duration_ms: u64,
    pub interval_ms: Option<u64>,
    pub summary: Option<String>,
    pub session: String,
    /// A control caller's `authority_class`, kept on the timer as metadata only.
    pub authority_class: Option<String>,
}

/// The longest delay or interval a timer may have: ten years, far inside the clock's range.
pub const MAX_TIMER_MS: u64 = 10 * 365 * 86_400_000;
/// The shortest interval of a repeating timer: any positive one, as the spec says. A short
/// interval cannot fill the inbox: fires beyond the agent's hourly budget wait for room
/// (`budget.rs`), and fires missed meanwhile are skipped, not queued.
pub const MIN_INTERVAL_MS: u64 = 1;

impl Engine {
    /// Reads one timer; `None` when there is no such id.
    pub fn load_timer(&self, id: &str) -> Result<Option<Timer>> {
        self.store.timers().get_doc(id)
    }

    /// Creates a timer. Durations and intervals are positive milliseconds.
    pub fn create_timer(&self, req: TimerRequest) -> Result<Timer> {
        check_name("agent_id", &req.session)?;
        if req.duration_ms == 0 {
            return Err(Error::invalid(
                "duration_ms",
                "must be a positive number of milliseconds",
            ));
        }
        if req.duration_ms > MAX_TIMER_MS {
            return Err(Error::invalid(
                "duration_ms",
                format!("must be at most {MAX_TIMER_MS} (ten years)"),
            ));
        }
        match req.interval_ms {
            Some(0) => {
                return Err(Error::invalid(
                    "interval_ms",
                    "must be a positive number of milliseconds",
                ));
            }
            Some(i) if i > MAX_TIMER_MS => {
                return Err(Error::invalid(
                    "interval_ms",
                    format!("must be at most {MAX_TIMER_MS} (ten years)"),
                ));
            }
            _ => {}
        }
        if let Some(s) = &req.summary
            && s.chars().count() > MAX_SUMMARY_CHARS
        {
            return Err(Error::invalid(
                "summary",
                format!("must be at most {MAX_SUMMARY_CHARS} characters"),
            ));
        }
        let now = self.clock.now();
        let id = self.fresh_prefixed_id(ID_PREFIX, |id| {
            // An id the store cannot answer for is not taken for granted as free.
            !matches!(self.store.timers().get_doc(id), Ok(None))
        });
        let timer = Timer {
            id,
            session: req.session,
            created_at: now,
            duration_ms: req.duration_ms,
            interval_ms: req.interval_ms,
            repeat: req.interval_ms.is_some(),
            status: TimerStatus::Active,
            summary: req.summary,
            next_fire_at: Some(now.plus_ms(req.duration_ms as i64)),
            last_fired_at: None,
            fire_count: 0,
            hook_deliveries: Vec::new(),
            authority_class: req.authority_class,
        };
        self.store.timers().begin_docs()?.put(&timer)?;
        tracing::info!(timer = %timer.id, session = %timer.session, "timer created");
        Ok(timer)
    }

    /// A timer the session owns; another session's id reads as not found.
    ///
    /// Read inside a transaction of timers, i.e. after any firing in progress has committed:
    /// a firing delivers its wake before it records itself (so a crash re-delivers the same
    /// wake), and an agent that took the wake and asked at once would otherwise read the timer
    /// as not yet fired.
    pub fn timer_for(&self, id: &str, session: &str) -> Result<Timer> {
        let settled = self.store.timers().begin_docs()?.read(id)?;
        match settled {
            Some(t) if t.session == session => Ok(t),
            _ => Err(Error::not_found_for_session("timer", id)),
        }
    }

    /// The session's timers, most recent first, at most `limit`.
    pub fn list_timers(&self, session: &str, limit: usize) -> Result<Vec<Timer>> {
        check_name("agent_id", session)?;
        let mut out: Vec<Timer> = self
            .all_timers()?
            .into_iter()
            .filter(|t| t.session == session)
            .collect();
        out.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        out.truncate(limit);
        Ok(out)
    }

    /// Every timer in the store.
    pub fn all_timers(&self) -> Result<Vec<Timer>> {
        self.store.timers().all_docs()
    }

    /// Cancels a timer: idempotent for a cancelled one; a completed one cannot be cancelled.
    pub fn cancel_timer(&self, id: &str, session: &str) -> Result<Timer> {
        let mut txn = self.store.timers().begin_docs()?;
        let mut t = match txn.read(id)? {
            Some(t) if t.session == session => t,
            _ => return Err(Error::not_found_for_session("timer", id)),
        };
        match t.status {
            TimerStatus::Cancelled => return Ok(t),
            TimerStatus::Completed => {
                return Err(Error::Conflict(format!(
                    "timer {id} already completed; a completed timer cannot be cancelled"
                )));
            }
            TimerStatus::Active => {}
        }
        t.status = TimerStatus::Cancelled;
        t.next_fire_at = None;
        txn.put(&t)?;
        tracing::info!(timer = %id, session, "timer cancelled");
        Ok(t)
    }

    /// Fires the timer if it is due, once however late, and says when to look again.
    pub fn service_timer(&self, id: &str) -> Result<Service> {
        let mut txn = self.store.timers().begin_docs()?;
        let Some(mut t) = txn.read(id)? else {
            return Ok(Service::default());
        };
        let now = self.clock.now();
        let mut changed = false;
        if let (TimerStatus::Active, Some(due)) = (t.status, t.next_fire_at)
            && due <= now
            && let Err(frees_at) = self.take_event_wake(&t.session)
        {
            // Held, not skipped: the fire goes out once the agent's hour has room.
            t.next_fire_at = Some(frees_at);
            txn.put(&t)?;
            tracing::info!(
                timer = %t.id,
                session = %t.session,
                until = %frees_at,
                "timer held at the agent's hourly wake limit"
            );
        } else if let (TimerStatus::Active, Some(due)) = (t.status, t.next_fire_at)
            && due <= now
        {
            let wake = timer_wake(&t, due, now);
            self.deliver_owned(&wake, &mut t.hook_deliveries)?;
            t.fire_count += 1;
            t.last_fired_at = Some(now);
            // Whole intervals from the schedule, skipping the ones missed while down.
            t.next_fire_at = t.interval_ms.map(|every| next_after(due, every, now));
            if t.next_fire_at.is_none() {
                t.status = TimerStatus::Completed;
            }
            tracing::info!(timer = %t.id, fire_count = t.fire_count, "timer fired");
            changed = true;
        }
        if changed {
            txn.put(&t)?;
        }
        Ok(Service {
            next_due: timer_next_due(&t, now),
            hooks_due: hooks_due(&t.id, &t.session, &t.hook_deliveries, now),
        })
    }

    pub(super) fn record_timer_hook(
        &self,
        id: &str,
        wake_id: &str,
        result: std::result::Result<(), String>,
    ) -> Result<Option<Timestamp>> {
        let txn = std::cell::RefCell::new(self.store.timers().begin_docs()?);
        let read = txn.borrow_mut().read(id)?;
        self.note_owned_hook(
            read,
            |t| &mut t.hook_deliveries,
            |t| txn.borrow_mut().put(t),
            |t| timer_next_due(t, Timestamp::from_millis(i64::MIN)),
            (id, wake_id, result),
        )
    }
}

/// When the daemon must look at a timer again (hook attempts at or before `handed_out` are in
/// flight and report back by themselves).
pub fn timer_next_due(t: &Timer, handed_out: Timestamp) -> Option<Timestamp> {
    let fire = match t.status {
        TimerStatus::Active => t.next_fire_at,
        _ => None,
    };
    [fire, next_hook_after(&t.hook_deliveries, handed_out)]
        .into_iter()
        .flatten()
        .min()
}

/// The first schedule point `due + k*every` (k >= 1) strictly after `now`.
fn next_after(due: Timestamp, every: u64, now: Timestamp) -> Timestamp {
    let every = every.max(1) as i64;
    let behind = now.millis_since(due);
    due.plus_ms((behind / every + 1) * every)
}

fn timer_wake(t: &Timer, due: Timestamp, now: Timestamp) -> Wake {
    let n = t.fire_count + 1;
    let late = now.millis_since(due);
    let what = t
        .summary
        .as_deref()
        .map_or("(no summary)".into(), crate::escape::line);
    let summary = format!("timer {}: {what}", t.id);
    let mut text = format!(
        "Timer {} fired{}: {what}\n",
        t.id,
        if t.repeat {
            format!(" (firing {n}, every {} ms)", t.interval_ms.unwrap_or(0))
        } else {
            String::new()
        }
    );
    if late > 1000 {
        text.push_str(&format!(
            "It was due at {due}; the daemon was not running then, so it fires once now.\n"
        ));
    }
    Wake {
        wake_id: format!("wk_{}_{n:04}", t.id.trim_start_matches(ID_PREFIX)),
        kind: WakeKind::Timer,
        created_at: now,
        session: t.session.clone(),
        channel: t.session.clone(),
        waitpoint: None,
        timer: Some(TimerRef {
            id: t.id.clone(),
            summary: t.summary.clone(),
            fire_count: n,
            repeat: t.repeat,
        }),
        callback: None,
        waited_ms: now.millis_since(t.created_at),
        summary,
        reports: Vec::new(),
        deadline: None,
        external_payload: ExternalPayload {
            notice: EXTERNAL_NOTICE.to_owned(),
            reports: Vec::new(),
        },
        digest: None,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missed_intervals_are_skipped_to_the_next_whole_one() {
        let due = Timestamp::from_millis(1_000);
        assert_eq!(
            next_after(due, 100, Timestamp::from_millis(1_000)).as_millis(),
            1_100
        );
        assert_eq!(
            next_after(due, 100, Timestamp::from_millis(1_550)).as_millis(),
            1_600
        );
        assert_eq!(
            next_after(due, 100, Timestamp::from_millis(1_600)).as_millis(),
            1_700
        );
    }
}
