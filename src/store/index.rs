//! The session index: which waitpoints a session or channel may see, without reading them all.
//!
//! `index/sessions/<name>/<id>` is an empty marker for each waitpoint whose session or channel
//! is `name` (the two halves of [`Waitpoint::visible_to`]). The waitpoint files stay the source
//! of truth and the index only ever over-approximates them:
//!
//! - a new waitpoint's markers are durable before its directory is renamed into place, so a
//!   waitpoint never exists without them;
//! - a removed waitpoint's markers go after its directory, so a crash between leaves a marker
//!   without a waitpoint, which readers skip and the next rebuild prunes;
//! - session and channel never change, so nothing else touches the index.
//!
//! A home made before the index existed has waitpoints without markers. Readers trust the index
//! only once `index/sessions.complete` exists, which
//! [`Files::rebuild_index`](super::Store::rebuild_index) writes after a full scan (the daemon runs
//! it at start when the file is missing); until then they scan.

use std::fs;

use crate::durable::{self, Batch};
use crate::error::Result;
use crate::records::Waitpoint;

use super::Store;
use super::files::{Files, STAGING_PREFIX};

/// Markers staged per commit while rebuilding, bounding the temp files held open at once.
const MARKERS_PER_COMMIT: usize = 128;

impl Files {
    /// The names a waitpoint is indexed under: its session, and its channel when different.
    fn index_names(wp: &Waitpoint) -> Vec<&str> {
        let mut names = vec![wp.session.as_str()];
        if wp.channel != wp.session {
            names.push(wp.channel.as_str());
        }
        names
    }

    /// Makes `wp`'s markers durable (before the waitpoint itself appears).
    pub(super) fn index_add(&self, wp: &Waitpoint) -> Result<()> {
        let mut batch = Batch::new(self.home.root_dir());
        for name in Self::index_names(wp) {
            let dir = self.home.session_index(name);
            self.home.root_dir().create_dir_private(&dir)?;
            batch.stage(&dir.join(&wp.id), b"")?;
        }
        batch.commit()
    }

    /// Removes `wp`'s markers (after the waitpoint itself is gone).
    pub(super) fn index_remove(&self, wp: &Waitpoint) -> Result<()> {
        let paths: Vec<_> = Self::index_names(wp)
            .into_iter()
            .map(|name| self.home.session_index(name).join(&wp.id))
            .collect();
        self.home.root_dir().remove_all_durably(&paths)
    }

    /// Brings the index in line with the waitpoints: adds missing markers, prunes markers of
    /// waitpoints that no longer exist, then marks the index complete. Returns how many markers
    /// it added. Safe to run while CLI commands create waitpoints (they add their own markers).
    pub(super) fn rebuild_index_files(&self) -> Result<usize> {
        self.home
            .root_dir()
            .create_dir_private(&self.home.session_index_root())?;
        let mut added = 0;
        let mut batch = Batch::new(self.home.root_dir());
        let mut expected = std::collections::HashSet::new();
        self.for_each(&mut |wp| {
            for name in Self::index_names(&wp) {
                let dir = self.home.session_index(name);
                let marker = dir.join(&wp.id);
                expected.insert(marker.clone());
                if fs::symlink_metadata(&marker).is_err() {
                    self.home.root_dir().create_dir_private(&dir)?;
                    batch.stage(&marker, b"")?;
                    added += 1;
                }
            }
            if batch.len() >= MARKERS_PER_COMMIT {
                std::mem::replace(&mut batch, Batch::new(self.home.root_dir())).commit()?;
            }
            Ok(())
        })?;
        batch.commit()?;
        let mut dangling = Vec::new();
        for (name, dir) in self
            .home
            .root_dir()
            .list_dir(&self.home.session_index_root())?
        {
            if durable::is_temp_name(&name) {
                continue;
            }
            for (id, marker) in self.home.root_dir().list_dir(&dir)? {
                if !durable::is_temp_name(&id)
                    && !expected.contains(&marker)
                    && !self.being_created(&id)
                    && !self.home.waitpoint_dir(&id).is_dir()
                {
                    dangling.push(marker);
                }
            }
        }
        self.home.root_dir().remove_all_durably(&dangling)?;
        self.home
            .root_dir()
            .commit(&self.home.session_index_complete(), b"")?;
        Ok(added)
    }

    /// Whether `create` is building this waitpoint right now (its markers exist, its directory
    /// is not in place yet). Asked before looking for the directory: the staging directory is
    /// renamed into place, so one of the two is seen whichever moment the rename happens.
    fn being_created(&self, id: &str) -> bool {
        self.home
            .waitpoints_dir()
            .join(format!("{STAGING_PREFIX}{id}"))
            .exists()
    }

    /// The waitpoints `session` may see, oldest first: through the index when it is complete,
    /// by a full scan otherwise. Cost grows with the session's waitpoints, not with the home's.
    pub(super) fn list_visible_files(&self, session: &str) -> Result<Vec<Waitpoint>> {
        if !self.index_is_complete() {
            let mut all = self.list()?;
            all.retain(|wp| wp.visible_to(session));
            return Ok(all);
        }
        let mut out = Vec::new();
        for (id, _) in self
            .home
            .root_dir()
            .list_dir(&self.home.session_index(session))?
        {
            if durable::is_temp_name(&id) {
                continue;
            }
            // A marker may outlive its waitpoint (see the module docs); skip it.
            if let Some(wp) = self.read_listed(&id)?
                && wp.visible_to(session)
            {
                out.push(wp);
            }
        }
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }
}
