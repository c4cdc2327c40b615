//! The filesystem watch: which paths are watched, and how a notification becomes an [`Event`]
//! (a hint; the periodic sweep stays the source of truth).

use crate::store::{Hint, dirwatch};

use super::{Daemon, Event};
use crate::error::{Error, Result};
use crate::ingress::device::{self};
use crate::ingress::spool::is_candidate;
use crate::sync::MutexExt;
use notify::{RecursiveMode, Watcher};
use std::sync::Mutex;

pub(super) fn to_io(e: notify::Error) -> std::io::Error {
    match e.kind {
        notify::ErrorKind::Io(io) => io,
        other => std::io::Error::other(format!("{other:?}")),
    }
}

impl Daemon {
    /// Sets up the watcher on the drop zone, the timers and the device mirrors, and the
    /// store's watch on the waitpoints. Their callbacks only forward hints; all work happens
    /// on the loop. Both stop when the returned guards drop.
    pub(super) fn watch(
        &self,
    ) -> Result<(
        dirwatch::DirWatch,
        notify::RecommendedWatcher,
        crate::store::Guard,
    )> {
        let tx = self.tx.clone();
        let drop_zone = self.spool.dir.clone();
        crate::failpoint!(
            crate::failpoint::WATCHER,
            "cannot start the file watcher on",
            &drop_zone
        );
        let devices = self.engine.home().devices_dir();
        let timers = self.engine.home().timers_dir();
        self.engine.home().root_dir().create_dir_private(&timers)?;
        // The drop zone and the timers through the daemon's own watch (`src/store/dirwatch.rs`
        // says why): the kernel wakes it only for complete files, not for the daemon's own opens.
        let dir_tx = Mutex::new(self.tx.clone());
        // Files arriving in the drop zone hold back the removals of consumed ones there, which
        // would contend with them for the directory (see `Trash::note_incoming`).
        let trash = self.engine.open_trash()?;
        let watched = [drop_zone.clone(), timers.clone()];
        let dirs = dirwatch::DirWatch::spawn(&watched, dirwatch::COMPLETE_FILES, move |seen| {
            let event = match seen {
                dirwatch::Seen::Lost => Event::Rescan,
                dirwatch::Seen::Ready(0, name) if is_candidate(name) => {
                    trash.note_incoming();
                    Event::SpoolFile(name.to_owned())
                }
                dirwatch::Seen::Ready(1, name) => match name.strip_suffix(".json") {
                    Some(id) if crate::names::is_timer_id(id) => Event::TimerChanged(id.to_owned()),
                    _ => return,
                },
                dirwatch::Seen::Ready(..) => return,
            };
            let _ = dir_tx.lock_or_recover().send(event);
        })
        .map_err(|e| Error::io("cannot watch", &drop_zone, e))?;
        let dd = devices.clone();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let event = match res {
                Ok(e) => e,
                Err(_) => {
                    let _ = tx.send(Event::Rescan);
                    return;
                }
            };
            if event.need_rescan() {
                let _ = tx.send(Event::Rescan);
                return;
            }
            if !crate::durable::is_ready_kind(&event.kind) {
                return;
            }
            for path in &event.paths {
                if let Some(hint) = device::hint_for(path, &dd) {
                    let _ = tx.send(Event::Device(hint));
                }
            }
        })
        .map_err(|e| Error::io("cannot start the file watcher on", &drop_zone, to_io(e)))?;
        // Recursive, so each device's mirror is watched from the moment its directory appears.
        watcher
            .watch(&devices, RecursiveMode::Recursive)
            .map_err(|e| Error::io("cannot watch", &devices, to_io(e)))?;
        let tx = Mutex::new(self.tx.clone());
        let state = self.engine.store().watch(Box::new(move |hint| {
            let event = match hint {
                Hint::Changed(id) => Event::WaitpointAppeared(id),
                Hint::Resync => Event::Rescan,
                Hint::Forwarded => Event::Forwarded,
                Hint::Timer(id) => Event::TimerChanged(id),
                Hint::Callback(id) => Event::CallbackChanged(id),
                Hint::Wakes => Event::Wakes,
            };
            let _ = tx.lock_or_recover().send(event);
        }))?;
        Ok((dirs, watcher, state))
    }
}
