//! A throwaway OpenSSH server on 127.0.0.1 for the device tests: its own host key, an
//! authorized user key and a remote spool, all in a temp dir, reached as the current user.
//!
//! When sshd cannot be started the test fails, loudly, with the reason: `scripts/test-deps` (run
//! by `scripts/test`) installs `openssh-server`, so a missing sshd is a broken machine, not a
//! reason to pass. There is no switch that turns these tests into no-ops.

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::helpers::{PATIENCE, free_port};

pub const SSHD: &str = "/usr/sbin/sshd";

pub struct Sshd {
    dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
    /// The user's private key, authorized by this server.
    pub identity: PathBuf,
    /// A known_hosts file holding this server's host key as `[127.0.0.1]:port`.
    pub known_hosts: PathBuf,
    /// The remote spool directory (on this same machine).
    pub spool: PathBuf,
}

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "waitpoint-test",
            "-f",
        ])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ssh-keygen (install openssh-client): {e}"));
    assert!(
        out.status.success(),
        "ssh-keygen failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Sshd {
    /// Starts a server, or fails the test saying why.
    pub fn start() -> Sshd {
        if !Path::new(SSHD).exists() {
            panic!(
                "{SSHD} is missing: the SSH device tests need a real sshd (apt-get install \
                 openssh-server; scripts/test-deps does this)"
            );
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let host_key = dir.path().join("host_key");
        let identity = dir.path().join("id_ed25519");
        keygen(&host_key);
        keygen(&identity);
        fs::copy(
            identity.with_extension("pub"),
            dir.path().join("authorized_keys"),
        )
        .unwrap();
        let spool = dir.path().join("remote-spool");
        fs::create_dir_all(&spool).unwrap();
        // sshd refuses to start as root without its privilege-separation directory.
        let _ = fs::create_dir_all("/run/sshd");
        let mut sshd = Sshd {
            port: 0,
            child: None,
            identity,
            known_hosts: dir.path().join("known_hosts"),
            spool,
            dir,
        };
        let host_pub = fs::read_to_string(host_key.with_extension("pub")).unwrap();
        let mut last_err = String::new();
        for _ in 0..5 {
            sshd.port = free_port();
            let key: Vec<&str> = host_pub.split_whitespace().take(2).collect();
            fs::write(
                &sshd.known_hosts,
                format!("[127.0.0.1]:{} {}\n", sshd.port, key.join(" ")),
            )
            .unwrap();
            match sshd.spawn() {
                Ok(()) => return sshd,
                Err(e) => last_err = e,
            }
        }
        panic!("cannot start {SSHD} for the SSH device tests: {last_err}");
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("sshd_config")
    }

    fn spawn(&mut self) -> Result<(), String> {
        let d = self.dir.path();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile \
             {d}/authorized_keys\n\
PidFile {d}/sshd.pid\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\nMaxStartups 50\n\
MaxSessions 50\nLogLevel ERROR\n",
            port = self.port,
            d = d.display()
        );
        fs::write(self.config_path(), config).unwrap();
        let log = fs::File::create(d.join("sshd.log")).unwrap();
        let mut child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(self.config_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot spawn {SSHD}: {e}"))?;
        let start = Instant::now();
        while start.elapsed() < PATIENCE {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "sshd exited with {status}: {}",
                    fs::read_to_string(d.join("sshd.log")).unwrap_or_default()
                ));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                self.child = Some(child);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        Err("sshd did not start listening in time".into())
    }

    /// Starts the server again on the same port with the same keys.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "kill it first");
        self.spawn()
            .unwrap_or_else(|e| panic!("cannot restart sshd: {e}"));
    }

    /// Kills the server and every session process it forked (SIGKILL, as a crash or a pulled
    /// cable would end them). The tree is frozen with SIGSTOP first so nothing forks past us.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let root = child.id() as i32;
        let mut stopped = vec![root];
        // Pids we found as our own descendants; one that already exited is no failure.
        let signal = |p: i32, s: Signal| {
            let _ = kill_process(Pid::from_raw(p).expect("a pid from /proc"), s);
        };
        signal(root, Signal::STOP);
        loop {
            let tree = descendants(root);
            let new: Vec<i32> = tree.into_iter().filter(|p| !stopped.contains(p)).collect();
            if new.is_empty() {
                break;
            }
            for p in new {
                signal(p, Signal::STOP);
                stopped.push(p);
            }
        }
        for p in &stopped {
            signal(*p, Signal::KILL);
        }
        let _ = child.wait();
    }

    /// Names in the remote spool (everything, dot-files included), sorted.
    pub fn remote_names(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.spool)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Drops a file into the remote spool the way the spec's shell line does.
    pub fn drop_remote(&self, name: &str, body: &str) {
        let tmp = self.spool.join(format!("{name}.tmp"));
        fs::write(&tmp, body).unwrap();
        fs::rename(&tmp, self.spool.join(format!("{name}.json"))).unwrap();
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every live descendant of `root`, from /proc.
fn descendants(root: i32) -> Vec<i32> {
    let mut parent_of = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // The command name is in parentheses and may contain spaces; ppid follows the state.
        let Some(after) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        if let Some(ppid) = fields.get(1).and_then(|p| p.parse::<i32>().ok()) {
            parent_of.push((pid, ppid));
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (pid, ppid) in &parent_of {
            if *ppid == p && !out.contains(pid) {
                out.push(*pid);
                frontier.push(*pid);
            }
        }
    }
    out
}
