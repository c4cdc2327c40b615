//! A device's SSH session: TCP connect, host-key verification against `known_hosts`,
//! authentication (identity file or agent), the per-step watchdog, and the SFTP calls a round
//! makes (the listing, the capped read). Transport only: what a file means is the claim's.

use super::claim::unclaimed_name;
use super::{
    CONNECT_TIMEOUT, Device, DeviceError, LeftFile, RemoteEntry, remote_dir, sftp_long, target_of,
};
use crate::error::Result;
use crate::ingress::spool::is_candidate;
use crate::request::MAX_BODY_BYTES;
use crate::sync::{CondvarExt, MutexExt};
use ssh2::{CheckResult, ErrorCode, HashType, HostKeyType, KnownHostFileKind, Session, Sftp};
use std::io::Read;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The bound on every blocking libssh2 call (handshake, auth, each SFTP request).
pub(super) const SESSION_TIMEOUT_MS: u32 = 20_000;

/// The watchdog's bound on one step (connect and authenticate, list, or one file).
pub(super) const STEP_DEADLINE: Duration = Duration::from_secs(60);

/// Keepalives on an idle session, so a dead link is noticed and NAT entries stay open.
pub(super) const KEEPALIVE_SECS: u32 = 15;

/// Values from the process environment the collectors need; the CLI fills them in.
#[derive(Debug, Clone, Default)]
pub struct SshOptions {
    /// `$SSH_AUTH_SOCK`: where the ssh-agent listens.
    pub agent_socket: Option<PathBuf>,
}

pub(super) fn ssh_err<'a>(
    what: &'static str,
    device: &'a Device,
) -> impl Fn(ssh2::Error) -> DeviceError + 'a {
    move |e| DeviceError::Ssh {
        what,
        target: target_of(device),
        message: e.message().to_owned(),
    }
}

/// A base64 (standard alphabet, no padding) as OpenSSH prints `SHA256:` fingerprints.
pub(super) fn base64_unpadded(bytes: &[u8]) -> String {
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

pub(super) fn keyscan_type(kind: HostKeyType) -> &'static str {
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
pub(super) struct Watchdog {
    state: Arc<(Mutex<WatchState>, Condvar)>,
}

#[derive(Default)]
pub(super) struct WatchState {
    armed: Option<(Instant, TcpStream)>,
    stop: bool,
    fired: bool,
}

impl Watchdog {
    pub(super) fn new(name: &str) -> Self {
        let state = Arc::new((Mutex::new(WatchState::default()), Condvar::new()));
        let shared = Arc::clone(&state);
        let label = name.to_owned();
        let _ = thread::Builder::new()
            .name(format!("watchdog-{name}"))
            .spawn(move || {
                let (lock, cv) = &*shared;
                let mut st = lock.lock_or_recover();
                while !st.stop {
                    let now = Instant::now();
                    match &st.armed {
                        None => st = cv.wait_or_recover(st),
                        Some((at, _)) if *at > now => {
                            let wait = *at - now;
                            st = cv.wait_timeout_or_recover(st, wait).0;
                        }
                        Some((_, stream)) => {
                            tracing::warn!(
                                device = %label,
                                "SSH step overran {}s; dropping the connection",
                                STEP_DEADLINE.as_secs(),
                            );
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
    pub(super) fn arm(&self, stream: &TcpStream) {
        let Ok(clone) = stream.try_clone() else {
            return;
        };
        let (lock, cv) = &*self.state;
        let mut st = lock.lock_or_recover();
        st.armed = Some((Instant::now() + STEP_DEADLINE, clone));
        cv.notify_all();
    }

    /// Disarms it; true when it fired since the last call.
    pub(super) fn disarm(&self) -> bool {
        let (lock, cv) = &*self.state;
        let mut st = lock.lock_or_recover();
        st.armed = None;
        cv.notify_all();
        std::mem::take(&mut st.fired)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cv) = &*self.state;
        lock.lock_or_recover().stop = true;
        cv.notify_all();
    }
}

/// An authenticated session with its SFTP channel.
pub struct Connection {
    pub(super) session: Session,
    pub(super) sftp: Sftp,
    pub(super) stream: TcpStream,
    /// Connect, handshake and authentication, in milliseconds.
    pub connect_ms: u64,
}

/// A TCP connection to the device's SSH port: each address it resolves to in turn, each
/// bounded by [`CONNECT_TIMEOUT`].
pub(super) fn tcp_connect(device: &Device) -> Result<TcpStream, DeviceError> {
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

pub(super) fn verify_host_key(session: &Session, device: &Device) -> Result<(), DeviceError> {
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
        "if this is the right machine (compare with `ssh-keygen -lf` of its host key), add it \
         with:\n  ssh-keyscan {port_flag}-t {} {} >> {}",
        keyscan_type(kind),
        device.host,
        kh.display()
    );
    match known.check_port(&device.host, device.port, key) {
        CheckResult::Match => Ok(()),
        CheckResult::NotFound => Err(DeviceError::HostKey(format!(
            "device {:?}: unknown host key for {shown} ({fingerprint}); it is not in {}. Refusing \
             to connect; {how}",
            device.name,
            kh.display()
        ))),
        CheckResult::Mismatch => Err(DeviceError::HostKey(format!(
            "device {:?}: the host key of {shown} ({fingerprint}) does NOT match the one in {} — \
                the machine was reinstalled, or someone is in the middle. Refusing to connect. \
                Once you have checked, remove the old line with `ssh-keygen -R '{shown}' -f {}`, \
                then {how}",
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

pub(super) fn authenticate(
    session: &Session,
    device: &Device,
    opts: &SshOptions,
) -> Result<(), DeviceError> {
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
                    "key {} was not accepted: {} (a key with a passphrase must be loaded into \
                     ssh-agent instead)",
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

pub(super) fn is_no_such_file(e: &ssh2::Error) -> bool {
    matches!(e.code(), ErrorCode::SFTP(2))
}

/// An SFTP status about one file (permission, a name in the way, ...), as opposed to a failure
/// of the session: the round goes on without that file.
pub(super) fn is_about_the_file(e: &ssh2::Error) -> bool {
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
    pub(super) fn list_and_left(
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
                tracing::warn!(
                    device = %device.name,
                    file = name,
                    reason = %reason,
                    "a remote signal file is left on the device, untouched",
                );
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
    pub(super) fn keepalive(&self) -> Result<(), ssh2::Error> {
        self.session.keepalive_send().map(|_| ())
    }

    /// Reads at most the cap plus one byte of a remote file, so an oversized file is recognised
    /// (and refused by the mirror's spool) without reading all of it.
    /// `Ok(None)` when the file is gone.
    pub(super) fn read_capped(&self, path: &Path) -> Result<Option<Vec<u8>>, String> {
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
