//! Clean-up: read wakes past their TTL, records of sessions deleted long ago, retention of closed
//! waitpoints, stale temp files.

use super::{Daemon, GC_EVERY_MS, STALE_TEMP_MS, TEMP_WALK_EVERY_MS};

impl Daemon {
    pub(super) fn gc_read_wakes(&mut self) {
        match self.engine.gc_read_wakes() {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "removed read wakes older than the TTL"),
            Err(e) => tracing::error!(error = %e, "cannot clean read wakes"),
        }
        match self.engine.gc_deleted_sessions() {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "forgot sessions deleted long ago"),
            Err(e) => tracing::error!(error = %e, "cannot clean the records of deleted sessions"),
        }
        self.next_gc = self.engine.now().plus_ms(GC_EVERY_MS);
    }

    /// The drop zone's abandoned temp files, at every sweep (the sweep lists it anyway).
    pub(super) fn gc(&mut self) {
        if let Err(e) = self
            .spool
            .remove_stale_temps(self.engine.now(), STALE_TEMP_MS)
        {
            tracing::error!(error = %e, "cannot clean stale temp files");
        }
    }

    /// A commit killed mid-way leaves its temp file beside the target; nothing else ever
    /// writes one, so a day-old temp under the engine's directories is such a leftover. Walking
    /// them costs in proportion to every file of every waitpoint (seconds of CPU at 100,000
    /// armed), so it runs at start only after a daemon died, and otherwise once a day.
    pub(super) fn gc_engine_temps(&mut self) {
        let home = self.engine.home();
        for dir in [home.waitpoints_dir(), home.sessions_dir()] {
            if let Err(e) =
                home.root_dir()
                    .remove_stale_temps(&dir, self.engine.now(), STALE_TEMP_MS)
            {
                tracing::error!(error = %e, "cannot clean stale temp files");
            }
        }
        self.next_temp_walk = self.engine.now().plus_ms(TEMP_WALK_EVERY_MS);
    }
}
