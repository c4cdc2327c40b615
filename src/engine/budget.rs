//! The hourly wake budget of an agent's timers and callbacks: the waitpoints' wake cap
//! (`waitpointMaxWakesPerHour`, per waitpoint) has this equivalent for the wakes an agent's
//! timers and callbacks make, counted together per agent in a sliding hour.
//!
//! The budget is five times the waitpoints' cap (60 an hour by default: one a minute on
//! average), so a timer repeating every minute is never held. Over it, nothing is lost: a
//! timer's fire waits until the hour has room (its `next_fire_at` says when), and a callback
//! trigger is refused with the time to try again (HTTP 429 with `Retry-After`; a spool file
//! stays in the spool for a later pass). The window lives in the daemon's memory, the one
//! process that fires timers and triggers callbacks; a restart starts it afresh.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::clock::Timestamp;
use crate::sync::MutexExt;

/// A sliding hour.
const HOUR_MS: i64 = 60 * 60 * 1000;

/// How many times the waitpoints' hourly cap an agent's timers and callbacks may wake it.
pub const EVENT_CAP_FACTOR: u32 = 5;

/// The wakes each agent's timers and callbacks made in the last hour.
#[derive(Debug, Default)]
pub struct EventBudget {
    recent: Mutex<HashMap<String, VecDeque<Timestamp>>>,
}

impl EventBudget {
    /// Takes one wake for `session` at `now` when its last hour holds fewer than `cap`;
    /// otherwise says when the hour has room again.
    pub fn take(&self, session: &str, now: Timestamp, cap: u32) -> Result<(), Timestamp> {
        let mut recent = self.recent.lock_or_recover();
        let times = recent.entry(session.to_owned()).or_default();
        while times
            .front()
            .is_some_and(|t| now.as_millis().saturating_sub(t.as_millis()) >= HOUR_MS)
        {
            times.pop_front();
        }
        let cap = cap.max(1) as usize;
        if times.len() >= cap {
            let oldest_counted = times[times.len() - cap];
            return Err(oldest_counted.plus_ms(HOUR_MS));
        }
        times.push_back(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_gets_cap_wakes_an_hour_and_then_the_time_the_oldest_leaves_the_window() {
        let b = EventBudget::default();
        let t0 = Timestamp::from_millis(1_000_000);
        for i in 0..3 {
            assert_eq!(b.take("a", t0.plus_ms(i), 3), Ok(()));
        }
        assert_eq!(b.take("a", t0.plus_ms(10), 3), Err(t0.plus_ms(HOUR_MS)));
        // Another agent has its own budget.
        assert_eq!(b.take("b", t0.plus_ms(10), 3), Ok(()));
        // An hour after the first, there is room again.
        assert_eq!(b.take("a", t0.plus_ms(HOUR_MS), 3), Ok(()));
    }
}
