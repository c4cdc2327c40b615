//! Sessions as a whole: deleting one (its waitpoints cancelled, its capabilities revoked, its
//! inbox removed) and clearing read wakes past their TTL.

use super::Engine;
use crate::delivery;
use crate::error::{Error, Result};
use crate::records::Status;
use crate::request::check_name;

impl Engine {
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
            if t.status != crate::records::TimerStatus::Active {
                continue;
            }
            match self.cancel_timer(&t.id, session) {
                Ok(_) => cancelled_timers.push(t.id),
                Err(Error::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        delivery::remove_inbox(&self.home, session)?;
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
        delivery::remove_read_older_than(&self.home, self.clock.now(), self.settings.ttl_ms as i64)
    }
}

/// What deleting a session ended: its armed waitpoints (cancelled), its active timers
/// (cancelled) and its active callbacks (revoked).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct SessionDeleted {
    pub waitpoints: Vec<String>,
    pub timers: Vec<String>,
    pub callbacks: Vec<String>,
}
