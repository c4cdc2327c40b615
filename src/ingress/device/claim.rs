//! The claim protocol and one collector: claim a remote file under a name owned by this home
//! and device, look at what was claimed (never follow it), copy it durably into the mirror,
//! only then remove it remotely; and what a round leaves on the device, and why.

use super::ssh::STEP_DEADLINE;
use super::ssh::Watchdog;
use super::ssh::is_about_the_file;
use super::ssh::is_no_such_file;
use super::ssh::ssh_err;
use super::{
    CLAIM_MARK, Connection, Device, DeviceError, DeviceStatus, LeftFile, SshOptions, backoff_ms,
    claim_tag, connect, load_status, mirror, remote_dir, save_status,
};
use crate::clock::Timestamp;
use crate::error::Result;
use crate::home::Home;
use crate::ingress::spool::is_candidate;
use crate::request::MAX_BODY_BYTES;
use std::path::Path;

pub(super) fn claimed_name(file: &str, tag: &str) -> String {
    format!(".{file}{CLAIM_MARK}{tag}")
}

/// The original name of a file we claimed (`.<f>.json.claimed-<tag>` → `<f>.json`).
pub(super) fn unclaimed_name<'a>(name: &'a str, tag: &str) -> Option<&'a str> {
    let inner = name.strip_prefix('.')?.strip_suffix(tag)?;
    let file = inner.strip_suffix(CLAIM_MARK)?;
    is_candidate(file).then_some(file)
}

/// One remote spool entry worth looking at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteEntry {
    /// `<f>.json`, waiting to be claimed.
    Fresh(String),
    /// A file we claimed earlier and did not finish (the original name).
    Claimed(String),
}

/// One device's collector: a connection kept open between rounds, reopened after a failure.
pub struct Collector {
    pub device: Device,
    pub(super) home: Home,
    pub(super) opts: SshOptions,
    pub(super) tag: String,
    pub(super) conn: Option<Connection>,
    pub(super) watchdog: Watchdog,
    /// What the last round left on the device (for the settling rule), and this round's.
    pub(super) left_before: Vec<LeftFile>,
    pub(super) left: Vec<LeftFile>,
}

impl Collector {
    pub fn new(device: Device, home: Home, opts: SshOptions) -> Self {
        let watchdog = Watchdog::new(&device.name);
        let tag = claim_tag(&home, &device.name);
        Collector {
            device,
            home,
            opts,
            tag,
            conn: None,
            watchdog,
            left_before: Vec::new(),
            left: Vec::new(),
        }
    }

    pub(super) fn connection(&mut self) -> Result<&Connection, DeviceError> {
        if let Some(c) = &self.conn
            && c.keepalive().is_err()
        {
            self.conn = None;
        }
        if self.conn.is_none() {
            let c = connect(&self.device, &self.opts)?;
            self.conn = Some(c);
        }
        Ok(self.conn.as_ref().expect("just connected"))
    }

    /// The time the last connect took, if connected.
    pub fn connect_ms(&self) -> Option<u64> {
        self.conn.as_ref().map(|c| c.connect_ms)
    }

    /// Sends a keepalive on an idle open session, dropping it if the link is dead.
    pub fn keepalive(&mut self) {
        if let Some(c) = &self.conn
            && c.keepalive().is_err()
        {
            tracing::info!(
                device = %self.device.name,
                "SSH session lost; will reconnect next round",
            );
            self.conn = None;
        }
    }

    /// One collection round: claims, copies and removes every waiting file. Files landed
    /// before an error are reported through `landed` even when the round then fails.
    pub fn round(&mut self, landed: &mut Vec<String>) -> Result<(), DeviceError> {
        let reused = self.conn.is_some();
        let mut result = self.round_inner(landed);
        let mut fired = self.watchdog.disarm();
        if result.is_err() {
            // Whatever state the session is in, go on with a fresh one.
            self.conn = None;
            if reused && !fired {
                // A kept-open session may have died quietly (the server restarted): one more
                // try on a new connection before calling the device unreachable.
                result = self.round_inner(landed);
                fired = self.watchdog.disarm();
                if result.is_err() {
                    self.conn = None;
                }
            }
        }
        match result {
            Err(DeviceError::Ssh { what, target, .. }) if fired => Err(DeviceError::Ssh {
                what,
                target,
                message: format!(
                    "no progress for {}s; the watchdog dropped the connection",
                    STEP_DEADLINE.as_secs()
                ),
            }),
            other => other,
        }
    }

    pub(super) fn round_inner(&mut self, landed: &mut Vec<String>) -> Result<(), DeviceError> {
        let mirror = mirror(&self.home, &self.device.name);
        // Held open: what lands is written through it, never through a path a link could
        // redirect.
        let local = mirror.open_or_make()?;
        self.connection()?;
        let (device, tag) = (&self.device, &self.tag);
        let conn = self.conn.as_ref().expect("connected above");
        let watchdog = &self.watchdog;
        watchdog.arm(&conn.stream);
        let (entries, left) = conn.list_and_left(device, tag)?;
        tracing::debug!(
            device = %device.name,
            files = entries.len(),
            left = left.len(),
            "listed the remote spool",
        );
        #[cfg(feature = "failpoints")]
        fail::fail_point!(crate::failpoint::DEVICE_AFTER_LIST);
        self.left = left;
        let leave = |left: &mut Vec<LeftFile>, file: &str, claimed: &Path, why: LeftFile| {
            tracing::warn!(
                device = %device.name,
                file,
                reason = %why.reason,
                "a remote signal file is left on the device",
            );
            if let Err(e) = conn
                .sftp
                .rename(claimed, &remote_dir(&device.spool).join(file), None)
            {
                tracing::error!(
                    device = %device.name,
                    file,
                    error = %e,
                    "cannot give the file its name back",
                );
            }
            left.push(why);
        };
        let dir = remote_dir(&device.spool);
        for entry in entries {
            watchdog.arm(&conn.stream);
            let (file, was_claimed) = match entry {
                RemoteEntry::Claimed(f) => (f, true),
                RemoteEntry::Fresh(f) => (f, false),
            };
            let claimed = dir.join(claimed_name(&file, tag));
            if !was_claimed {
                match conn.sftp.rename(
                    &dir.join(&file),
                    &claimed,
                    Some(ssh2::RenameFlags::ATOMIC | ssh2::RenameFlags::NATIVE),
                ) {
                    Ok(()) => {}
                    // Taken by someone else between the listing and now.
                    Err(e) if is_no_such_file(&e) => continue,
                    // This file cannot be claimed; the others can, and the device is reachable.
                    Err(e) if is_about_the_file(&e) => {
                        tracing::warn!(
                            device = %device.name,
                            file = %file,
                            error = %e.message(),
                            "cannot claim a remote signal file (left there; the others go on)",
                        );
                        continue;
                    }
                    Err(e) => return Err(ssh_err("claim (rename)", device)(e)),
                }
            }
            // What was claimed is looked at, not followed: the name listed may have been
            // swapped for a link (or a FIFO) between the listing and the claim.
            let stat = match conn.sftp.lstat(&claimed) {
                Ok(st) => st,
                Err(e) if is_no_such_file(&e) => continue,
                Err(e) => return Err(ssh_err("look at a claimed file", device)(e)),
            };
            if !stat.is_file() {
                let why = LeftFile::new(
                    &file,
                    "was swapped for a symbolic link or a non-file after the listing; not followed",
                    Some(&stat),
                );
                leave(&mut self.left, &file, &claimed, why);
                continue;
            }
            let bytes = match conn.read_capped(&claimed) {
                // Grown past the cap since the listing: given back its name, left whole.
                Ok(Some(b)) if b.len() > MAX_BODY_BYTES => {
                    let why = LeftFile::new(
                        &file,
                        format!("grew past {MAX_BODY_BYTES} bytes after the listing"),
                        Some(&stat),
                    );
                    leave(&mut self.left, &file, &claimed, why);
                    continue;
                }
                Ok(Some(b)) => b,
                Ok(None) => continue,
                // This file cannot be read (a dead session fails the next step as well, and
                // the round with it).
                Err(message) => {
                    let why =
                        LeftFile::new(&file, format!("cannot be read: {message}"), Some(&stat));
                    leave(&mut self.left, &file, &claimed, why);
                    continue;
                }
            };
            // A file that does not parse may be one still being written in place; as the
            // drop zone gives a writer time, it is collected (and parked if it still does not
            // parse) only once a later round finds it unchanged.
            if !was_claimed && crate::ingress::parse_spool_body(&bytes).is_err() {
                let mut why = LeftFile::new(
                    &file,
                    "does not parse yet; collected once a later round finds it unchanged",
                    Some(&stat),
                );
                why.settling = true;
                let unchanged = self.left_before.iter().any(|b| {
                    b.settling && b.file == why.file && b.size == why.size && b.mtime == why.mtime
                });
                if !unchanged {
                    leave(&mut self.left, &file, &claimed, why);
                    continue;
                }
            }
            local.commit(&file, &bytes)?;
            landed.push(file);
            match conn.sftp.unlink(&claimed) {
                Ok(()) => {}
                Err(e) if is_no_such_file(&e) => {}
                Err(e) => return Err(ssh_err("remove", device)(e)),
            }
        }
        Ok(())
    }

    /// Runs a round and records its outcome in `status.json`. Returns the files landed and the
    /// error, if the round failed.
    pub fn round_recorded(
        &mut self,
        now: Timestamp,
        interval_ms: u64,
    ) -> (Vec<String>, Option<DeviceError>, DeviceStatus) {
        let mut landed = Vec::new();
        let mut status = load_status(&self.home, &self.device.name).unwrap_or_default();
        self.left_before = std::mem::take(&mut status.left_on_device);
        let result = self.round(&mut landed);
        status.last_attempt_at = Some(now);
        status.total_collected += landed.len() as u64;
        let error = match result {
            Ok(()) => {
                status.reachable = Some(true);
                status.last_success_at = Some(now);
                status.last_error = None;
                status.failures = 0;
                status.last_collected = landed.len() as u64;
                status.left_on_device = std::mem::take(&mut self.left);
                status.connect_ms = self.connect_ms();
                status.next_attempt_at = (interval_ms > 0).then(|| now.plus_ms(interval_ms as i64));
                None
            }
            Err(e) => {
                status.reachable = Some(false);
                status.last_error = Some(e.to_string());
                status.left_on_device = std::mem::take(&mut self.left_before);
                status.failures = status.failures.saturating_add(1);
                status.next_attempt_at =
                    Some(now.plus_ms(backoff_ms(interval_ms, status.failures) as i64));
                Some(e)
            }
        };
        if let Err(e) = save_status(&self.home, &self.device.name, &status) {
            tracing::error!(
                device = %self.device.name,
                error = %e,
                "cannot record collector state",
            );
        }
        (landed, error, status)
    }
}
