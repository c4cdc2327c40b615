//! Device spools over SSH: the only module that knows SSH. This file owns the device records
//! (`devices/<name>.json`, `status.json`, the mirror); `ssh` the session, `claim` the protocol
//! and one collector, `fleet` the collector threads. A job on another machine drops signal
//! files into that machine's own spool; a collector here fetches them over SFTP into a local
//! mirror (`devices/<name>/spool/`), which the daemon then sweeps like `tmp/signals/`, with the
//! identity `device:<name>:<file name>`.
//!
//! Claim protocol, per remote file `<f>.json` (never `*.tmp`, never dot-files):
//!
//! 1. SFTP-rename it to `.<f>.json.claimed-<tag>` (`<tag>`: this machine's host name and a
//!    digest of the home and the device record, [`claim_tag`]), so no other collector, no other
//!    device record of the same spool and no second pass takes it;
//! 2. read it (at most the 64 KB cap plus one byte) and `Root::commit` it into the mirror;
//! 3. only then remove the claimed file remotely.
//!
//! Every round starts with the claimed files of our tag, which a crash or a dropped link left
//! behind. A link lost after step 2 re-collects a file the engine may already have recorded;
//! the engine recognises its identity, so it is not counted twice. A refused file is parked by
//! the mirror's [`Spool`] under its `bad/`; the remote copy is already gone after step 3, so it
//! is not fetched forever.
//!
//! libssh2 is not thread-safe across sessions shared between threads, so each device gets one
//! collector thread owning one [`ssh2::Session`]; the thread reports to the daemon loop through a
//! callback and never calls the engine. Every blocking call is bounded by the session timeout,
//! set before the handshake, and a per-step watchdog (`ssh.rs`) shuts the socket down under a read
//! that trickles on past it.
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ingress::spool::Spool;
use crate::request::check_name;

mod claim;
mod fleet;
// FFI into libssh2 (see the module's docs): the crate's only unsafe code.
#[allow(unsafe_code)]
mod sftp_long;
mod ssh;

pub use claim::{Collector, RemoteEntry};
pub use fleet::{DeviceEvent, Fleet, backoff_ms, hint_for};
pub use ssh::{Connection, SshOptions, connect, probe};

/// Where a device's jobs drop files when `device add` is not told otherwise (the spec's line).
pub const DEFAULT_REMOTE_SPOOL: &str = "~/.cortex/tmp/signals";
/// How long a TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Marker between a claimed file's original name and the collector's tag.
const CLAIM_MARK: &str = ".claimed-";

/// `devices/<name>.json`: a device and how to reach it. Written by `device add`; only read by
/// collectors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    /// Private key file; `None` authenticates through the ssh-agent.
    pub identity: Option<PathBuf>,
    /// The `known_hosts` file the host key is verified against.
    pub known_hosts: PathBuf,
    /// The spool directory on the device; `~/` means the login's home.
    pub spool: String,
    /// Collection interval for this device; `None` uses `waitpointSweepMs`.
    pub sweep_ms: Option<u64>,
    pub added_at: Timestamp,
}

/// `devices/<name>/status.json`: what the collector last saw. Written only by the collector.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceStatus {
    /// `None` until the first attempt.
    pub reachable: Option<bool>,
    pub last_attempt_at: Option<Timestamp>,
    pub last_success_at: Option<Timestamp>,
    pub last_error: Option<String>,
    /// Failed attempts since the last success; the backoff grows with it.
    pub failures: u32,
    /// When the collector tries next (after a failure: the backoff).
    pub next_attempt_at: Option<Timestamp>,
    /// Files the last successful round copied into the mirror.
    pub last_collected: u64,
    /// Files collected since the device was added.
    pub total_collected: u64,
    /// Connect, handshake and authentication of the last session, in milliseconds.
    pub connect_ms: Option<u64>,
    /// Signal files the last successful round saw and left on the device, and why: the
    /// operator's list of what needs a look (or, for a file still being written, a wait).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_on_device: Vec<LeftFile>,
}

/// A remote signal file a round left where it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeftFile {
    pub file: String,
    pub reason: String,
    /// Its size and modification time (seconds) when seen, as the server reported them.
    pub size: Option<u64>,
    pub mtime: Option<u64>,
    /// Does not parse yet and may still be being written: collected (and parked if it
    /// still does not parse) once a later round finds it unchanged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub settling: bool,
}

impl LeftFile {
    fn new(file: &str, reason: impl Into<String>, stat: Option<&ssh2::FileStat>) -> Self {
        LeftFile {
            file: file.to_owned(),
            reason: reason.into(),
            size: stat.and_then(|s| s.size),
            mtime: stat.and_then(|s| s.mtime),
            settling: false,
        }
    }
}

/// What went wrong talking to a device. The messages are meant for operators.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to {target} within {}s: {source}", CONNECT_TIMEOUT.as_secs())]
    Connect {
        target: String,
        #[source]
        source: std::io::Error,
    },
    /// Unknown or changed host key; the message says how to add it.
    #[error("{0}")]
    HostKey(String),
    #[error("cannot authenticate as {user} on {target}: {message}")]
    Auth {
        user: String,
        target: String,
        message: String,
    },
    #[error("SSH {what} on {target} failed: {message}")]
    Ssh {
        what: &'static str,
        target: String,
        message: String,
    },
    #[error(transparent)]
    Local(#[from] Error),
}

/// Checks a device name: it becomes file and directory names under `devices/`.
pub fn check_device_name(name: &str) -> Result<()> {
    check_name("device", name)?;
    if name.starts_with('.') {
        return Err(Error::Usage(format!(
            "device {name:?} must not start with '.'"
        )));
    }
    Ok(())
}

/// The device record `name`, or `None`.
pub fn load(home: &Home, name: &str) -> Result<Option<Device>> {
    check_device_name(name)?;
    home.root_dir().read_json(&home.device_file(name))
}

/// The device record `name`, or a usage error naming the way to list devices.
pub fn require(home: &Home, name: &str) -> Result<Device> {
    load(home, name)?.ok_or_else(|| {
        Error::Usage(format!(
            "no device named {name:?}; `waitpoint device list` shows them, `waitpoint device add` \
             adds one"
        ))
    })
}

/// Every device record, by name.
pub fn list(home: &Home) -> Result<Vec<Device>> {
    let mut out = Vec::new();
    for (file, path) in home.root_dir().list_dir(&home.devices_dir())? {
        let Some(name) = file.strip_suffix(".json") else {
            continue;
        };
        if durable::is_temp_name(&file) || check_device_name(name).is_err() {
            continue;
        }
        if let Some(d) = home.root_dir().read_json::<Device>(&path)? {
            out.push(d);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Adds a device record; a name already taken is a conflict.
pub fn add(home: &Home, device: &Device) -> Result<()> {
    check_device_name(&device.name)?;
    if device.host.is_empty() || device.host.starts_with('-') || device.host.contains(' ') {
        return Err(Error::Usage(format!(
            "--host {:?} is not a host name or address",
            device.host
        )));
    }
    if device.user.is_empty() {
        return Err(Error::Usage("--user must not be empty".into()));
    }
    if device.spool.is_empty() {
        return Err(Error::Usage("--spool must not be empty".into()));
    }
    if load(home, &device.name)?.is_some() {
        return Err(Error::Conflict(format!(
            "device {:?} exists; `waitpoint device remove {}` first to change it",
            device.name, device.name
        )));
    }
    home.root_dir().create_dir_private(&home.devices_dir())?;
    home.root_dir()
        .commit_json(&home.device_file(&device.name), device)
}

/// Removes a device record and its collector state. Files still in its mirror are kept: they
/// are signals already taken off the device.
pub fn remove(home: &Home, name: &str) -> Result<()> {
    require(home, name)?;
    home.root_dir().remove_durably(&home.device_file(name))?;
    home.root_dir()
        .remove_durably(&home.device_status_file(name))?;
    home.root_dir().remove_durably(&home.device_poll_file(name))
}

/// The collector state of `name` (default when it never ran).
pub fn load_status(home: &Home, name: &str) -> Result<DeviceStatus> {
    Ok(home
        .root_dir()
        .read_json(&home.device_status_file(name))?
        .unwrap_or_default())
}

fn save_status(home: &Home, name: &str, status: &DeviceStatus) -> Result<()> {
    home.root_dir().create_dir_private(&home.device_dir(name))?;
    home.root_dir()
        .commit_json(&home.device_status_file(name), status)
}

/// The local mirror of `name`'s spool, swept like the drop zone.
pub fn mirror(home: &Home, name: &str) -> Spool {
    Spool::for_device(home, name)
}

/// Names of the devices that have a mirror directory, whether or not their record still exists.
pub fn mirrored_devices(home: &Home) -> Vec<String> {
    home.root_dir()
        .list_dir(&home.devices_dir())
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, path)| check_device_name(name).is_ok() && path.join("spool").is_dir())
        .map(|(name, _)| name)
        .collect()
}

/// `host:port` as the operator typed it; `[host]:port` is known_hosts' form.
fn target_of(device: &Device) -> String {
    format!("{}@{}:{}", device.user, device.host, device.port)
}

/// The spool path as SFTP wants it: `~/x` becomes `x`, which SFTP resolves in the login's home.
fn remote_dir(spool: &str) -> PathBuf {
    match spool {
        "~" => PathBuf::from("."),
        s => PathBuf::from(s.strip_prefix("~/").unwrap_or(s)),
    }
}

/// The tag of this home's collector for `device`: this machine's name and a digest of the
/// home and the device, so that two device records naming the same host and spool (in one home
/// or in two) never finish each other's claims.
pub fn claim_tag(home: &Home, device: &str) -> String {
    let owner = format!("{}\0{device}", home.root().display());
    format!("{}-{}", host_tag(), &crate::secret::hash(&owner)[..12])
}

/// This machine's name, made safe for a file name.
fn host_tag() -> String {
    let raw = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let tag: String = raw
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(40)
        .collect();
    if tag.is_empty() {
        "local".to_owned()
    } else {
        tag
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::device::claim::claimed_name;
    use crate::ingress::device::claim::unclaimed_name;
    use crate::ingress::device::fleet::MAX_BACKOFF_MS;
    use crate::ingress::device::ssh::base64_unpadded;
    use crate::ingress::spool::is_candidate;
    use std::path::Path;

    #[test]
    fn claimed_names_round_trip_only_for_our_tag() {
        let c = claimed_name("123-a.json", "box1");
        assert_eq!(c, ".123-a.json.claimed-box1");
        assert_eq!(unclaimed_name(&c, "box1"), Some("123-a.json"));
        assert_eq!(unclaimed_name(&c, "box2"), None);
        assert!(
            !is_candidate(&c),
            "a claimed file is never collected as fresh"
        );
    }

    #[test]
    fn remote_dir_resolves_tilde_against_the_login_home() {
        assert_eq!(
            remote_dir("~/.cortex/tmp/signals"),
            PathBuf::from(".cortex/tmp/signals")
        );
        assert_eq!(remote_dir("/data/spool"), PathBuf::from("/data/spool"));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff_ms(30_000, 1), 30_000);
        assert_eq!(backoff_ms(30_000, 2), 60_000);
        assert_eq!(backoff_ms(30_000, 30), MAX_BACKOFF_MS);
        assert_eq!(backoff_ms(0, 1), 1_000);
    }

    #[test]
    fn base64_matches_openssh_fingerprint_alphabet() {
        assert_eq!(base64_unpadded(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_unpadded(b"fo"), "Zm8");
        assert_eq!(base64_unpadded(b"f"), "Zg");
    }

    #[test]
    fn hints_under_devices_dir() {
        let d = Path::new("/h/devices");
        assert_eq!(
            hint_for(&d.join("gpu.json"), d),
            Some(DeviceEvent::Record("gpu".into()))
        );
        assert_eq!(
            hint_for(&d.join("gpu.poll"), d),
            Some(DeviceEvent::Poll("gpu".into()))
        );
        assert_eq!(
            hint_for(&d.join("gpu/spool/1.json"), d),
            Some(DeviceEvent::File {
                device: "gpu".into(),
                file: "1.json".into()
            })
        );
        assert_eq!(hint_for(&d.join("gpu/status.json"), d), None);
        assert_eq!(hint_for(&d.join("gpu/spool/bad/1.json"), d), None);
        assert_eq!(hint_for(&d.join(".gpu.json.1234.tmp"), d), None);
    }
}
