//! Sessions as a whole: deleting one (its waitpoints cancelled, its capabilities revoked, its
//! inbox removed, a record of the deletion left for the session lists) and clearing read wakes
//! past their TTL.

use super::Engine;
use crate::clock::Timestamp;
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
        self.store.inboxes().remove(session)?;
        // The cancelled waitpoints are kept for three days and name the session: the record
        // keeps it out of the session lists meanwhile (until it is used again).
        self.home
            .root_dir()
            .create_dir_private(&self.home.deleted_sessions_dir())?;
        self.home.root_dir().commit_json(
            &self.deleted_record(session),
            &DeletedSession {
                session: session.to_owned(),
                deleted_at: self.clock.now(),
            },
        )?;
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

    fn deleted_record(&self, session: &str) -> std::path::PathBuf {
        self.home
            .deleted_sessions_dir()
            .join(format!("{session}.json"))
    }

    /// When `session` was last deleted, if it was (and the record is still kept).
    pub fn session_deleted_at(&self, session: &str) -> Result<Option<Timestamp>> {
        check_name("session", session)?;
        let found: Option<DeletedSession> = crate::durable::read_json_or_set_aside(
            self.home.root_dir(),
            &self.deleted_record(session),
        )?;
        Ok(found.filter(|d| d.session == session).map(|d| d.deleted_at))
    }

    /// Whether a session list leaves `session` out: it was deleted, and no waitpoint naming it
    /// (`created`, the creation times of those a list found) was armed since.
    pub fn listed_as_deleted(
        &self,
        session: &str,
        created: impl IntoIterator<Item = Timestamp>,
    ) -> Result<bool> {
        let Some(at) = self.session_deleted_at(session)? else {
            return Ok(false);
        };
        Ok(created.into_iter().all(|c| c <= at))
    }

    /// Removes the records of sessions deleted longer ago than the waitpoints they cancelled
    /// are kept (and a day more): nothing names those sessions any more.
    pub fn gc_deleted_sessions(&self) -> Result<usize> {
        let now = self.clock.now();
        let mut removed = 0;
        for (name, path) in self
            .home
            .root_dir()
            .list_dir(&self.home.deleted_sessions_dir())?
        {
            let Some(session) = name.strip_suffix(".json") else {
                continue;
            };
            let old = match self.session_deleted_at(session) {
                Ok(Some(at)) => at.plus_ms(super::RETAIN_MS + 86_400_000) < now,
                Ok(None) | Err(_) => false,
            };
            if old {
                self.home.root_dir().remove_durably(&path)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes delivered wakes older than the TTL from every session's `cur/`.
    pub fn gc_read_wakes(&self) -> Result<usize> {
        self.store
            .inboxes()
            .remove_read_older_than(self.clock.now(), self.settings.ttl_ms as i64)
    }
}

/// `index/deleted/<session>.json`: a session deleted at `deleted_at`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct DeletedSession {
    session: String,
    deleted_at: Timestamp,
}

/// What deleting a session ended: its armed waitpoints (cancelled), its active timers
/// (cancelled) and its active callbacks (revoked).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct SessionDeleted {
    pub waitpoints: Vec<String>,
    pub timers: Vec<String>,
    pub callbacks: Vec<String>,
}
