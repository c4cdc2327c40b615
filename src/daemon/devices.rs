//! Devices as the daemon's loop sees them: files landed in a device's mirror are collected, a
//! device out of reach is told to the waitpoints that watch its heartbeat (once per outage),
//! and which armed waitpoints watch which device is kept here.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::Daemon;
use super::collect::collect_file;
use crate::clock::Timestamp;
use crate::ingress::device::{self, DeviceEvent};
use crate::ingress::spool::FileOutcome;

impl Daemon {
    pub(super) fn on_device(&mut self, event: DeviceEvent) {
        match event {
            DeviceEvent::Landed { device, files } => {
                for file in files {
                    self.collect_mirrored(&device, &file);
                }
            }
            DeviceEvent::File { device, file } => self.collect_mirrored(&device, &file),
            DeviceEvent::Record(_) => self.devices.reconcile(),
            DeviceEvent::Poll(name) => self.devices.poll(&name),
            DeviceEvent::Unreachable {
                device,
                since,
                error,
            } => self.device_outage(&device, since, &error),
        }
    }

    /// Applies one file from a device's mirror; on error it stays there for the next sweep.
    pub(super) fn collect_mirrored(&mut self, device: &str, file: &str) {
        let spool = device::mirror(self.engine.home(), device);
        match collect_file(&spool, &self.engine, file) {
            Ok(FileOutcome::Consumed(verdict)) => self.after_verdict(&verdict),
            Ok(FileOutcome::Triggered(callback)) => self.after_trigger(&callback),
            Ok(_) => {}
            Err(e) => {
                tracing::error!(
                    device,
                    file,
                    error = %e,
                    "cannot collect mirrored signal file (kept for retry)"
                );
                self.retry.failed(Instant::now());
            }
        }
    }

    /// Collects every file waiting in any device mirror (also of devices since removed: those
    /// files were already taken off the device). Returns how many there were.
    pub(super) fn sweep_devices(&mut self) -> usize {
        let home = self.engine.home().clone();
        let mut n = 0;
        for name in device::mirrored_devices(&home) {
            let names = match device::mirror(&home, &name).pending() {
                Ok(names) => names,
                Err(e) => {
                    tracing::error!(device = %name, error = %e, "cannot list the device mirror");
                    continue;
                }
            };
            n += names.len();
            for file in names {
                self.collect_mirrored(&name, &file);
            }
        }
        n
    }

    /// A device is out of reach: each armed waitpoint bound to it with a heartbeat window is
    /// told, once per outage, when the outage has outlasted its window (checked at each failed
    /// round, so at most one backoff late).
    pub(super) fn device_outage(&mut self, device: &str, since: Timestamp, error: &str) {
        // On a shared store the leader changes waitpoints; a standby's write would be refused.
        if !self.engine.store().applies_signals() {
            return;
        }
        let Some(ids) = self.silent_devices.get(device).cloned() else {
            return;
        };
        for id in ids {
            match self.engine.notice_device_outage(&id, since, error) {
                Ok(next) => self.due.set(&id, next),
                Err(e) => {
                    tracing::error!(
                        waitpoint = %id,
                        error = %e,
                        "cannot tell of the device outage (next round retries)",
                    )
                }
            }
        }
    }

    /// Remembers which armed waitpoints watch their device's reachability.
    pub(super) fn note_device_watch(&mut self, wp: &crate::records::Waitpoint) {
        note_device_watch(&mut self.silent_devices, wp);
    }
}

/// Adds `wp` to `silent` under its device when it is armed with a heartbeat window: who hears
/// of that device's outage.
pub(super) fn note_device_watch(
    silent: &mut HashMap<String, HashSet<String>>,
    wp: &crate::records::Waitpoint,
) {
    if let Some(d) = &wp.device
        && wp.silence.heartbeat_within_ms.is_some()
        && wp.status == crate::records::Status::Armed
    {
        silent.entry(d.clone()).or_default().insert(wp.id.clone());
    }
}
