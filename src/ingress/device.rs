//! Device spools over SSH: the only module that knows SSH. A job on another machine drops signal
//! files into that machine's own spool; a collector here fetches them over SFTP into a local
//! mirror (`devices/<name>/spool/`), which the daemon then sweeps like `tmp/signals/`, with the
//! identity `device:<name>:<file name>`.
//!
//! Claim protocol, per remote file `<f>.json` (never `*.tmp`, never dot-files):
//!
//! 1. SFTP-rename it to `.<f>.json.claimed-<tag>` (`<tag>`: this machine's host name and a
//!    digest of the home and the device record, [`claim_tag`]), so no other collector, no other
//!    device record of the same spool and no second pass takes it;
//! 2. read it (at most the 64 KB cap plus one byte) and `store::commit` it into the mirror;
//! 3. only then remove the claimed file remotely.
//!
//! Every round starts with the claimed files of our tag, which a crash or a dropped link left
//! behind. A link lost after step 2 re-collects a file the engine may already have recorded;
//! the engine recognises its identity, so it is not counted twice. A refused file is parked by
//! the mirror's [`Spool`] under its `bad/`; the remote copy is already gone after step 3, so it
//! is not fetched forever.
//!
//! libssh2 is not thread-safe across sessions shared between threads, so each device gets one
//! collector thread owning one [`Session`]; the thread reports to the daemon loop through a
//! callback and never calls the engine. Every blocking call is bounded by the session timeout,
//! set before the handshake, and a per-step [`Watchdog`] shuts the socket down under a read
//! that trickles on past it.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use ssh2::{CheckResult, ErrorCode, HashType, HostKeyType, KnownHostFileKind, Session, Sftp};

use crate::clock::{Clock, Timestamp};
use crate::engine::check_name;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ingress::spool::{Spool, is_candidate};
use crate::ingress::{MAX_BODY_BYTES, sftp_long};
use crate::store;

/// Where a device's jobs drop files when `device add` is not told otherwise (the spec's line).
pub const DEFAULT_REMOTE_SPOOL: &str = "~/.cortex/tmp/signals";
/// How long a TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The bound on every blocking libssh2 call (handshake, auth, each SFTP request).
const SESSION_TIMEOUT_MS: u32 = 20_000;
/// The watchdog's bound on one step (connect and authenticate, list, or one file).
const STEP_DEADLINE: Duration = Duration::from_secs(60);
/// Keepalives on an idle session, so a dead link is noticed and NAT entries stay open.
const KEEPALIVE_SECS: u32 = 15;
/// Backoff of an unreachable device doubles from its interval up to this.
const MAX_BACKOFF_MS: u64 = 300_000;
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

/// Values from the process environment the collectors need; the CLI fills them in.
#[derive(Debug, Clone, Default)]
pub struct SshOptions {
    /// `$SSH_AUTH_SOCK`: where the ssh-agent listens.
    pub agent_socket: Option<PathBuf>,
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
    store::read_json(&home.device_file(name))
}

/// The device record `name`, or a usage error naming the way to list devices.
pub fn require(home: &Home, name: &str) -> Result<Device> {
    load(home, name)?.ok_or_else(|| {
        Error::Usage(format!(
            "no device named {name:?}; `waitpoint device list` shows them, `waitpoint device add` adds one"
        ))
    })
}

/// Every device record, by name.
pub fn list(home: &Home) -> Result<Vec<Device>> {
    let mut out = Vec::new();
    for (file, path) in store::list_dir(&home.devices_dir())? {
        let Some(name) = file.strip_suffix(".json") else {
            continue;
        };
        if store::is_temp_name(&file) || check_device_name(name).is_err() {
            continue;
        }
        if let Some(d) = store::read_json::<Device>(&path)? {
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
    store::create_dir_private(&home.devices_dir())?;
    store::commit_json(&home.device_file(&device.name), device)
}

/// Removes a device record and its collector state. Files still in its mirror are kept: they
/// are signals already taken off the device.
pub fn remove(home: &Home, name: &str) -> Result<()> {
    require(home, name)?;
    store::remove_durably(&home.device_file(name))?;
    store::remove_durably(&home.device_status_file(name))?;
    store::remove_durably(&home.device_poll_file(name))
}

/// The collector state of `name` (default when it never ran).
pub fn load_status(home: &Home, name: &str) -> Result<DeviceStatus> {
    Ok(store::read_json(&home.device_status_file(name))?.unwrap_or_default())
}

fn save_status(home: &Home, name: &str, status: &DeviceStatus) -> Result<()> {
    store::create_dir_private(&home.device_dir(name))?;
    store::commit_json(&home.device_status_file(name), status)
}

/// The local mirror of `name`'s spool, swept like the drop zone.
pub fn mirror(home: &Home, name: &str) -> Spool {
    Spool::for_device(home, name)
}

/// Names of the devices that have a mirror directory, whether or not their record still exists.
pub fn mirrored_devices(home: &Home) -> Vec<String> {
    store::list_dir(&home.devices_dir())
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

fn claimed_name(file: &str, tag: &str) -> String {
    format!(".{file}{CLAIM_MARK}{tag}")
}

/// The original name of a file we claimed (`.<f>.json.claimed-<tag>` → `<f>.json`).
fn unclaimed_name<'a>(name: &'a str, tag: &str) -> Option<&'a str> {
    let inner = name.strip_prefix('.')?.strip_suffix(tag)?;
    let file = inner.strip_suffix(CLAIM_MARK)?;
    is_candidate(file).then_some(file)
}

fn ssh_err<'a>(what: &'static str, device: &'a Device) -> impl Fn(ssh2::Error) -> DeviceError + 'a {
    move |e| DeviceError::Ssh {
        what,
        target: target_of(device),
        message: e.message().to_owned(),
    }
}

/// A base64 (standard alphabet, no padding) as OpenSSH prints `SHA256:` fingerprints.
fn base64_unpadded(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn keyscan_type(kind: HostKeyType) -> &'static str {
    match kind {
        HostKeyType::Rsa => "rsa",
        HostKeyType::Dss => "dsa",
        HostKeyType::Ecdsa256 | HostKeyType::Ecdsa384 | HostKeyType::Ecdsa521 => "ecdsa",
        HostKeyType::Ed25519 => "ed25519",
        HostKeyType::Unknown => "ed25519,ecdsa,rsa",
    }
}

/// Shuts a socket down when a step overruns its deadline, so a read that keeps trickling in
/// under the per-call timeout still ends. One per collector thread.
struct Watchdog {
    state: Arc<(Mutex<WatchState>, Condvar)>,
}

#[derive(Default)]
struct WatchState {
    armed: Option<(Instant, TcpStream)>,
    stop: bool,
    fired: bool,
}

impl Watchdog {
    fn new(name: &str) -> Self {
        let state = Arc::new((Mutex::new(WatchState::default()), Condvar::new()));
        let shared = Arc::clone(&state);
        let label = name.to_owned();
        let _ = thread::Builder::new()
            .name(format!("watchdog-{name}"))
            .spawn(move || {
                let (lock, cv) = &*shared;
                let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
                while !st.stop {
                    let now = Instant::now();
                    match &st.armed {
                        None => st = cv.wait(st).unwrap_or_else(|p| p.into_inner()),
                        Some((at, _)) if *at > now => {
                            let wait = *at - now;
                            st = cv
                                .wait_timeout(st, wait)
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                        Some((_, stream)) => {
                            tracing::warn!(device = %label, "SSH step overran {}s; dropping the connection", STEP_DEADLINE.as_secs());
                            let _ = stream.shutdown(Shutdown::Both);
                            st.armed = None;
                            st.fired = true;
                        }
                    }
                }
            });
        Watchdog { state }
    }

    /// Arms (or re-arms) the watchdog for one step on `stream`.
    fn arm(&self, stream: &TcpStream) {
        let Ok(clone) = stream.try_clone() else {
            return;
        };
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        st.armed = Some((Instant::now() + STEP_DEADLINE, clone));
        cv.notify_all();
    }

    /// Disarms it; true when it fired since the last call.
    fn disarm(&self) -> bool {
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        st.armed = None;
        cv.notify_all();
        std::mem::take(&mut st.fired)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cv) = &*self.state;
        lock.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        cv.notify_all();
    }
}

/// An authenticated session with its SFTP channel.
pub struct Connection {
    session: Session,
    sftp: Sftp,
    stream: TcpStream,
    /// Connect, handshake and authentication, in milliseconds.
    pub connect_ms: u64,
}

/// One remote spool entry worth looking at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteEntry {
    /// `<f>.json`, waiting to be claimed.
    Fresh(String),
    /// A file we claimed earlier and did not finish (the original name).
    Claimed(String),
}

/// A TCP connection to the device's SSH port: each address it resolves to in turn, each
/// bounded by [`CONNECT_TIMEOUT`].
fn tcp_connect(device: &Device) -> Result<TcpStream, DeviceError> {
    let addrs: Vec<_> = (device.host.as_str(), device.port)
        .to_socket_addrs()
        .map_err(|source| DeviceError::Resolve {
            host: device.host.clone(),
            source,
        })?
        .collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(DeviceError::Connect {
        target: target_of(device),
        source: last,
    })
}

/// Whether the device's SSH port takes a connection (no session, no authentication): what
/// `doctor` asks. The error is the operator's message.
pub fn probe(device: &Device) -> std::result::Result<(), String> {
    tcp_connect(device).map(drop).map_err(|e| e.to_string())
}

/// Connects, verifies the host key against `known_hosts`, and authenticates with the identity
/// file or the agent. Nothing is sent to a host whose key is not known.
pub fn connect(device: &Device, opts: &SshOptions) -> Result<Connection, DeviceError> {
    let started = Instant::now();
    let target = target_of(device);
    let stream = tcp_connect(device)?;
    let mut session = Session::new().map_err(ssh_err("session setup", device))?;
    // Set before the handshake, so a server that accepts TCP and then says nothing cannot hang us.
    session.set_timeout(SESSION_TIMEOUT_MS);
    session.set_tcp_stream(stream.try_clone().map_err(|source| DeviceError::Connect {
        target: target.clone(),
        source,
    })?);
    session.handshake().map_err(ssh_err("handshake", device))?;
    verify_host_key(&session, device)?;
    authenticate(&session, device, opts)?;
    session.set_keepalive(true, KEEPALIVE_SECS);
    let sftp = session.sftp().map_err(ssh_err("SFTP start", device))?;
    Ok(Connection {
        session,
        sftp,
        stream,
        connect_ms: started.elapsed().as_millis() as u64,
    })
}

fn verify_host_key(session: &Session, device: &Device) -> Result<(), DeviceError> {
    let (key, kind) = session.host_key().ok_or_else(|| DeviceError::Ssh {
        what: "host key exchange",
        target: target_of(device),
        message: "the server sent no host key".into(),
    })?;
    let fingerprint = session
        .host_key_hash(HashType::Sha256)
        .map(|h| format!("SHA256:{}", base64_unpadded(h)))
        .unwrap_or_else(|| "SHA256:?".into());
    let mut known = session
        .known_hosts()
        .map_err(ssh_err("known_hosts setup", device))?;
    let kh = &device.known_hosts;
    // A missing file is simply one that knows no hosts.
    if kh.exists() {
        known
            .read_file(kh, KnownHostFileKind::OpenSSH)
            .map_err(|e| {
                DeviceError::HostKey(format!(
                    "cannot read known hosts file {}: {}",
                    kh.display(),
                    e.message()
                ))
            })?;
    }
    let shown = if device.port == 22 {
        device.host.clone()
    } else {
        format!("[{}]:{}", device.host, device.port)
    };
    let port_flag = if device.port == 22 {
        String::new()
    } else {
        format!("-p {} ", device.port)
    };
    let how = format!(
        "if this is the right machine (compare with `ssh-keygen -lf` of its host key), add it with:\n  ssh-keyscan {port_flag}-t {} {} >> {}",
        keyscan_type(kind),
        device.host,
        kh.display()
    );
    match known.check_port(&device.host, device.port, key) {
        CheckResult::Match => Ok(()),
        CheckResult::NotFound => Err(DeviceError::HostKey(format!(
            "device {:?}: unknown host key for {shown} ({fingerprint}); it is not in {}. Refusing to connect; {how}",
            device.name,
            kh.display()
        ))),
        CheckResult::Mismatch => Err(DeviceError::HostKey(format!(
            "device {:?}: the host key of {shown} ({fingerprint}) does NOT match the one in {} — the machine was reinstalled, or someone is in the middle. Refusing to connect. Once you have checked, remove the old line with `ssh-keygen -R '{shown}' -f {}`, then {how}",
            device.name,
            kh.display(),
            kh.display()
        ))),
        CheckResult::Failure => Err(DeviceError::HostKey(format!(
            "device {:?}: cannot check the host key of {shown} against {}",
            device.name,
            kh.display()
        ))),
    }
}

fn authenticate(session: &Session, device: &Device, opts: &SshOptions) -> Result<(), DeviceError> {
    let auth_err = |message: String| DeviceError::Auth {
        user: device.user.clone(),
        target: format!("{}:{}", device.host, device.port),
        message,
    };
    if let Some(identity) = &device.identity {
        return session
            .userauth_pubkey_file(&device.user, None, identity, None)
            .map_err(|e| {
                auth_err(format!(
                    "key {} was not accepted: {} (a key with a passphrase must be loaded into ssh-agent instead)",
                    identity.display(),
                    e.message()
                ))
            });
    }
    let mut agent = session
        .agent()
        .map_err(|e| auth_err(format!("no ssh-agent: {}", e.message())))?;
    let Some(sock) = &opts.agent_socket else {
        return Err(auth_err(
            "no --identity was given and SSH_AUTH_SOCK is not set, so there is no ssh-agent to ask"
                .into(),
        ));
    };
    agent
        .set_identity_path(sock)
        .map_err(|e| auth_err(e.message().to_owned()))?;
    agent.connect().map_err(|e| {
        auth_err(format!(
            "cannot reach ssh-agent at {}: {}",
            sock.display(),
            e.message()
        ))
    })?;
    agent
        .list_identities()
        .map_err(|e| auth_err(e.message().to_owned()))?;
    let ids = agent
        .identities()
        .map_err(|e| auth_err(e.message().to_owned()))?;
    for id in &ids {
        if agent.userauth(&device.user, id).is_ok() {
            let _ = agent.disconnect();
            return Ok(());
        }
    }
    let _ = agent.disconnect();
    Err(auth_err(format!(
        "none of the ssh-agent's {} key(s) was accepted",
        ids.len()
    )))
}

fn is_no_such_file(e: &ssh2::Error) -> bool {
    matches!(e.code(), ErrorCode::SFTP(2))
}

/// An SFTP status about one file (permission, a name in the way, ...), as opposed to a failure
/// of the session: the round goes on without that file.
fn is_about_the_file(e: &ssh2::Error) -> bool {
    matches!(e.code(), ErrorCode::SFTP(_))
}

impl Connection {
    /// Lists the remote spool: claimed files of `tag` first, then fresh ones, each in name
    /// order. A spool that does not exist yet is empty.
    pub fn list(&self, device: &Device, tag: &str) -> Result<Vec<RemoteEntry>, DeviceError> {
        self.list_and_left(device, tag).map(|(entries, _)| entries)
    }

    /// [`Connection::list`], with the signal files that are left on the device and why: over
    /// the cap (copied, it would be cut short; it could only be refused), or with a second
    /// hard link (its content lives outside the spool too, as the local spool refuses).
    fn list_and_left(
        &self,
        device: &Device,
        tag: &str,
    ) -> Result<(Vec<RemoteEntry>, Vec<LeftFile>), DeviceError> {
        let dir = remote_dir(&device.spool);
        let entries = match sftp_long::list_long(&self.session, &dir) {
            Ok(Some(e)) => e,
            Ok(None) => return Ok((Vec::new(), Vec::new())),
            Err(message) => {
                return Err(DeviceError::Ssh {
                    what: "listing of the spool",
                    target: target_of(device),
                    message,
                });
            }
        };
        let mut claimed = Vec::new();
        let mut fresh = Vec::new();
        let mut left = Vec::new();
        for entry in entries {
            let (name, stat) = (entry.name.as_str(), &entry.stat);
            // Only regular files: a symlink or FIFO in the spool is never followed.
            if !stat.is_file() {
                continue;
            }
            if let Some(orig) = unclaimed_name(name, tag) {
                claimed.push(orig.to_owned());
            } else if is_candidate(name) {
                let reason = match (stat.size, entry.links) {
                    (Some(size), _) if size > MAX_BODY_BYTES as u64 => {
                        format!("larger than {MAX_BODY_BYTES} bytes ({size} bytes)")
                    }
                    (_, Some(links)) if links > 1 => format!(
                        "has {links} hard links; only files written into the spool are read"
                    ),
                    _ => {
                        fresh.push(name.to_owned());
                        continue;
                    }
                };
                tracing::warn!(device = %device.name, file = name, "a remote signal file is left on the device, untouched: {reason}");
                left.push(LeftFile::new(name, reason, Some(stat)));
            }
        }
        claimed.sort();
        fresh.sort();
        let entries = claimed
            .into_iter()
            .map(RemoteEntry::Claimed)
            .chain(fresh.into_iter().map(RemoteEntry::Fresh))
            .collect();
        Ok((entries, left))
    }

    /// Sends a keepalive; an error means the session is dead.
    fn keepalive(&self) -> Result<(), ssh2::Error> {
        self.session.keepalive_send().map(|_| ())
    }

    /// Reads at most the cap plus one byte of a remote file, so an oversized file is recognised
    /// (and refused by the mirror's spool) without reading all of it.
    /// `Ok(None)` when the file is gone.
    fn read_capped(&self, path: &Path) -> Result<Option<Vec<u8>>, String> {
        let mut file = match self.sftp.open(path) {
            Ok(f) => f,
            Err(e) if is_no_such_file(&e) => return Ok(None),
            Err(e) => return Err(e.message().to_owned()),
        };
        // What was opened, checked through the handle: a name swapped between the look and
        // the open could have led elsewhere.
        match file.stat() {
            Ok(st) if st.is_file() => {}
            Ok(_) => return Err("is not a regular file once opened".into()),
            Err(e) => return Err(e.message().to_owned()),
        }
        let mut bytes = Vec::new();
        file.take(MAX_BODY_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?;
        Ok(Some(bytes))
    }
}

/// One device's collector: a connection kept open between rounds, reopened after a failure.
pub struct Collector {
    pub device: Device,
    home: Home,
    opts: SshOptions,
    tag: String,
    conn: Option<Connection>,
    watchdog: Watchdog,
    /// What the last round left on the device (for the settling rule), and this round's.
    left_before: Vec<LeftFile>,
    left: Vec<LeftFile>,
}

/// What one round did.
#[derive(Debug, Default)]
pub struct Round {
    /// Files now in the mirror (including ones a previous round claimed).
    pub landed: Vec<String>,
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

    fn connection(&mut self) -> Result<&Connection, DeviceError> {
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
            tracing::info!(device = %self.device.name, "SSH session lost; will reconnect next round");
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

    fn round_inner(&mut self, landed: &mut Vec<String>) -> Result<(), DeviceError> {
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
        tracing::debug!(device = %device.name, files = entries.len(), left = left.len(), "listed the remote spool");
        #[cfg(feature = "failpoints")]
        fail::fail_point!(crate::failpoint::DEVICE_AFTER_LIST);
        self.left = left;
        let leave = |left: &mut Vec<LeftFile>, file: &str, claimed: &Path, why: LeftFile| {
            tracing::warn!(device = %device.name, file, "a remote signal file is left on the device: {}", why.reason);
            if let Err(e) = conn
                .sftp
                .rename(claimed, &remote_dir(&device.spool).join(file), None)
            {
                tracing::error!(device = %device.name, file, "cannot give the file its name back: {e}");
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
                            "cannot claim a remote signal file (left there; the others go on): {}",
                            e.message()
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
            tracing::error!(device = %self.device.name, "cannot record collector state: {e}");
        }
        (landed, error, status)
    }
}

/// The wait after `failures` failed attempts in a row: doubling from the interval (or one
/// second when collection is only on demand), capped at [`MAX_BACKOFF_MS`].
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
}

/// Maps a path the watcher saw under `devices/` to what it means, if anything.
pub fn hint_for(path: &Path, devices_dir: &Path) -> Option<DeviceEvent> {
    let rel = path.strip_prefix(devices_dir).ok()?;
    let parts: Vec<&str> = rel.iter().map(|p| p.to_str()).collect::<Option<_>>()?;
    match parts.as_slice() {
        [file] if !store::is_temp_name(file) => {
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

enum Command {
    Poll,
    Stop,
}

struct Running {
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
                tracing::error!("cannot list devices: {e}");
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

    fn start(&mut self, device: Device) {
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
                tracing::info!(device = %name, host = %device.host, interval_ms = interval, "device collector started");
                self.running.insert(name, Running { device, tx });
            }
            Err(e) => tracing::error!(device = %name, "cannot start collector thread: {e}"),
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

fn collector_thread(
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
                tracing::warn!(device = %name, failures = status.failures, "device unreachable (files wait there): {e}")
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
            let _ = store::remove_durably(&home.device_poll_file(&name));
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

#[cfg(test)]
mod tests {
    use super::*;

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
