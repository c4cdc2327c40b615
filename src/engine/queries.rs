//! Reading waitpoints without changing them: one by id (with the session's visibility), all,
//! a session's visible ones, the signals recorded for one, and the session index behind the
//! listing.

use super::Engine;
use crate::error::{Error, Result};
use crate::records::Waitpoint;
use crate::records::{SignalRecord, SignalStatus};

impl Engine {
    /// Reads a waitpoint; `None` when there is no such id.
    pub fn load(&self, id: &str) -> Result<Option<Waitpoint>> {
        self.store.get(id)
    }

    /// Reads a waitpoint that `session` may see (or any, with `None`).
    pub fn load_visible(&self, id: &str, session: Option<&str>) -> Result<Waitpoint> {
        match self.load(id)? {
            Some(wp) if session.is_none_or(|s| wp.visible_to(s)) => Ok(wp),
            _ if session.is_some() => Err(Error::not_found_for_session("waitpoint", id)),
            _ => Err(Error::not_found("waitpoint", id)),
        }
    }

    /// `(seq, identity key)` of every recorded signal of a waitpoint.
    pub(super) fn list_signal_files(&self, id: &str) -> Result<Vec<(u64, String)>> {
        self.store.identities(id)
    }

    /// The recorded signals of a waitpoint from `first_seq` on, in order.
    pub fn read_signals(&self, id: &str, first_seq: u64) -> Result<Vec<SignalRecord>> {
        self.store.records(id, first_seq)
    }

    /// Every signal of `wp` at hand, in order: those its log kept whole and the newest folded
    /// ones its state holds (without their data).
    pub fn known_signals(&self, wp: &Waitpoint) -> Result<Vec<SignalRecord>> {
        Ok(self.carried(wp, 1, &[])?.records)
    }

    /// The newest heartbeat of `wp`, without its data: from its state, or, for a state
    /// written before the state kept it, from the log.
    pub fn latest_heartbeat(&self, wp: &Waitpoint) -> Result<Option<SignalRecord>> {
        if wp.counters.progress == 0 {
            return Ok(None);
        }
        if let Some(h) = &wp.log.last_heartbeat {
            return Ok(Some(h.clone()));
        }
        Ok(self
            .read_signals(&wp.id, 1)?
            .into_iter()
            .rev()
            .find(|r| r.status == SignalStatus::Progress))
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
