//! The collector threads: one per device, started, reconfigured and stopped as records come
//! and go, each reporting to the daemon's loop as [`DeviceEvent`]s; the backoff of an
//! unreachable device.

use super::ssh::KEEPALIVE_SECS;
use super::{Collector, Device, SshOptions, list, load};
use crate::clock::Clock;
use crate::durable;
use crate::home::Home;
use crate::ingress::spool::is_candidate;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

/// Backoff of an unreachable device doubles from its interval up to this.
pub(super) const MAX_BACKOFF_MS: u64 = 300_000;

/// The wait after `failures` failed attempts in a row: doubling from the interval (or one
/// second when collection is only on demand), capped at five minutes.
pub fn backoff_ms(interval_ms: u64, failures: u32) -> u64 {
    let base = if interval_ms == 0 { 1_000 } else { interval_ms };
    let factor = 1u64 << failures.saturating_sub(1).min(20);
    base.saturating_mul(factor).min(MAX_BACKOFF_MS.max(base))
}

/// What collectors and the watcher tell the daemon loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceEvent {
    /// A round put these files into the device's mirror.
    Landed { device: String, files: Vec<String> },
    /// A file appeared in a mirror (a watcher hint).
    File { device: String, file: String },
    /// A device record was added, changed or removed (a watcher hint).
    Record(String),
    /// `device poll` asks for a round now (a watcher hint).
    Poll(String),
    /// A round could not reach the device, out of reach since `since` (its last good round, or
    /// when it was added if it never had one).
    Unreachable {
        device: String,
        since: crate::clock::Timestamp,
        error: String,
    },
}

/// Maps a path the watcher saw under `devices/` to what it means, if anything.
pub fn hint_for(path: &Path, devices_dir: &Path) -> Option<DeviceEvent> {
    let rel = path.strip_prefix(devices_dir).ok()?;
    let parts: Vec<&str> = rel.iter().map(|p| p.to_str()).collect::<Option<_>>()?;
    match parts.as_slice() {
        [file] if !durable::is_temp_name(file) => {
            if let Some(name) = file.strip_suffix(".json") {
                Some(DeviceEvent::Record(name.to_owned()))
            } else {
                file.strip_suffix(".poll")
                    .map(|name| DeviceEvent::Poll(name.to_owned()))
            }
        }
        [device, "spool", file] if is_candidate(file) => Some(DeviceEvent::File {
            device: (*device).to_owned(),
            file: (*file).to_owned(),
        }),
        _ => None,
    }
}

pub(super) enum Command {
    Poll,
    Stop,
}

pub(super) struct Running {
    device: Device,
    tx: Sender<Command>,
}

/// The set of collector threads, one per device record, kept in step with `devices/`.
pub struct Fleet {
    home: Home,
    opts: SshOptions,
    default_interval_ms: u64,
    clock: Arc<dyn Clock>,
    notify: Arc<dyn Fn(DeviceEvent) + Send + Sync>,
    running: BTreeMap<String, Running>,
}

impl Fleet {
    /// `notify` forwards collector reports to the daemon loop.
    pub fn new(
        home: Home,
        opts: SshOptions,
        default_interval_ms: u64,
        clock: Arc<dyn Clock>,
        notify: Arc<dyn Fn(DeviceEvent) + Send + Sync>,
    ) -> Self {
        Fleet {
            home,
            opts,
            default_interval_ms,
            clock,
            notify,
            running: BTreeMap::new(),
        }
    }

    /// Replaces the options later-started collectors get.
    pub fn set_options(&mut self, opts: SshOptions) {
        self.opts = opts;
    }

    /// The names of the devices with a running collector.
    pub fn names(&self) -> Vec<String> {
        self.running.keys().cloned().collect()
    }

    /// Starts collectors for new records, restarts changed ones, stops removed ones, and passes
    /// on poll requests whose hint was lost. The directory is the source of truth.
    pub fn reconcile(&mut self) {
        let devices = match list(&self.home) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "cannot list devices");
                return;
            }
        };
        let wanted: BTreeMap<String, Device> =
            devices.into_iter().map(|d| (d.name.clone(), d)).collect();
        self.running.retain(|name, r| {
            let keep = wanted.get(name) == Some(&r.device);
            if !keep {
                let _ = r.tx.send(Command::Stop);
                tracing::info!(device = %name, "device collector stopped");
            }
            keep
        });
        for (name, device) in wanted {
            if !self.running.contains_key(&name) {
                self.start(device);
            }
            if self.home.device_poll_file(&name).exists() {
                self.poll(&name);
            }
        }
    }

    pub(super) fn start(&mut self, device: Device) {
        let (tx, rx) = mpsc::channel();
        let interval = device.sweep_ms.unwrap_or(self.default_interval_ms);
        let collector = Collector::new(device.clone(), self.home.clone(), self.opts.clone());
        let clock = Arc::clone(&self.clock);
        let notify = Arc::clone(&self.notify);
        let name = device.name.clone();
        let spawned = thread::Builder::new()
            .name(format!("device-{name}"))
            .spawn(move || collector_thread(collector, rx, interval, clock, notify));
        match spawned {
            Ok(_) => {
                tracing::info!(
                    device = %name,
                    host = %device.host,
                    interval_ms = interval,
                    "device collector started",
                );
                self.running.insert(name, Running { device, tx });
            }
            Err(e) => tracing::error!(device = %name, error = %e, "cannot start collector thread"),
        }
    }

    /// Asks `name`'s collector for a round now. A device not running yet is started, and its
    /// first round runs at once anyway.
    pub fn poll(&mut self, name: &str) {
        match self.running.get(name) {
            Some(r) => {
                let _ = r.tx.send(Command::Poll);
            }
            None => {
                if let Ok(Some(device)) = load(&self.home, name) {
                    self.start(device);
                }
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for r in self.running.values() {
            let _ = r.tx.send(Command::Stop);
        }
    }
}

pub(super) fn collector_thread(
    mut collector: Collector,
    rx: Receiver<Command>,
    interval_ms: u64,
    clock: Arc<dyn Clock>,
    notify: Arc<dyn Fn(DeviceEvent) + Send + Sync>,
) {
    let name = collector.device.name.clone();
    let home = collector.home.clone();
    let keepalive = Duration::from_secs(u64::from(KEEPALIVE_SECS));
    // The first round runs at once: it also picks up files a crash left claimed.
    let mut next = Some(Instant::now());
    loop {
        let wait = next
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(keepalive)
            .min(keepalive);
        match rx.recv_timeout(wait) {
            Ok(Command::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            // The watcher and the sweep may both pass on one request; once a round answered
            // it (and removed the request file), a repeat is stale.
            Ok(Command::Poll) if !home.device_poll_file(&name).exists() => continue,
            Ok(Command::Poll) => {}
            Err(RecvTimeoutError::Timeout) => {
                if next.is_none_or(|at| Instant::now() < at) {
                    collector.keepalive();
                    continue;
                }
            }
        }
        // Several poll requests queued up are answered by one round.
        while let Ok(cmd) = rx.try_recv() {
            if let Command::Stop = cmd {
                return;
            }
        }
        // Only a round that started after the request answers it: files dropped before
        // `device poll` was asked must be in its listing.
        let answering = home.device_poll_file(&name).exists();
        let (landed, error, status) = collector.round_recorded(clock.now(), interval_ms);
        match &error {
            None => tracing::debug!(device = %name, files = landed.len(), "device round done"),
            Some(e) => {
                tracing::warn!(
                    device = %name,
                    failures = status.failures,
                    error = %e,
                    "device unreachable (files wait there)",
                );
                notify(DeviceEvent::Unreachable {
                    device: name.clone(),
                    since: status.last_success_at.unwrap_or(collector.device.added_at),
                    error: e.to_string(),
                });
            }
        }
        if !landed.is_empty() {
            notify(DeviceEvent::Landed {
                device: name.clone(),
                files: landed,
            });
        }
        // The poll request is answered once the outcome is in status.json.
        if answering {
            let _ = home
                .root_dir()
                .remove_durably(&home.device_poll_file(&name));
        }
        next = match error {
            None if interval_ms == 0 => None,
            None => Some(Instant::now() + Duration::from_millis(interval_ms)),
            Some(_) => Some(
                Instant::now() + Duration::from_millis(backoff_ms(interval_ms, status.failures)),
            ),
        };
    }
}
