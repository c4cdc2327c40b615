//! The filesystem watch: which paths are watched, and how a notification becomes an [`Event`]
//! (a hint; the periodic sweep stays the source of truth).

use crate::store::Hint;

use super::{Daemon, Event};
use crate::error::{Error, Result};
use crate::ingress::device::{self};
use crate::ingress::spool::is_candidate;
use crate::sync::MutexExt;
use notify::{RecursiveMode, Watcher};
use std::path::Path;
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
    pub(super) fn watch(&self) -> Result<(notify::RecommendedWatcher, crate::store::Guard)> {
        let tx = self.tx.clone();
        let drop_zone = self.spool.dir.clone();
        crate::failpoint!(
            crate::failpoint::WATCHER,
            "cannot start the file watcher on",
            &drop_zone
        );
        let devices = self.engine.home().devices_dir();
        let timers = self.engine.home().timers_dir();
        let (dz, dd, td) = (drop_zone.clone(), devices.clone(), timers.clone());
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
                let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                let parent = path.parent().unwrap_or(Path::new(""));
                if parent == dz && is_candidate(name) {
                    let _ = tx.send(Event::SpoolFile(name.to_owned()));
                } else if parent == td
                    && let Some(id) = name.strip_suffix(".json")
                    && crate::names::is_timer_id(id)
                {
                    let _ = tx.send(Event::TimerChanged(id.to_owned()));
                } else if let Some(hint) = device::hint_for(path, &dd) {
                    let _ = tx.send(Event::Device(hint));
                }
            }
        })
        .map_err(|e| Error::io("cannot start the file watcher on", &drop_zone, to_io(e)))?;
        crate::durable::create_dir_private(&timers)?;
        for dir in [&drop_zone, &timers] {
            watcher
                .watch(dir, RecursiveMode::NonRecursive)
                .map_err(|e| Error::io("cannot watch", dir, to_io(e)))?;
        }
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
        Ok((watcher, state))
    }
}
