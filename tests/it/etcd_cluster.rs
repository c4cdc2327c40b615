//! A 3-member etcd cluster on 127.0.0.1, started as children of a test (or of the benchmark,
//! which includes this file), with temporary data directories, killed on drop.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long the cluster may take to answer after a start or restart.
const PATIENCE: Duration = Duration::from_secs(120);

pub const ETCD: &str = "/usr/bin/etcd";
pub const ETCDCTL: &str = "/usr/bin/etcdctl";

/// One member of the test cluster.
struct Member {
    name: String,
    client: u16,
    peer: u16,
    data: PathBuf,
    child: Option<Child>,
}

/// A 3-member etcd cluster on loopback, killed with the test.
pub struct Cluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    /// Flags every member gets besides the cluster's own.
    extra: Vec<String>,
    /// What etcdctl needs besides the endpoints: `--user root:pw` once a test turned
    /// authentication on, the client certificate's flags for a cluster with TLS.
    pub ctl_flags: Vec<String>,
    /// `https` when the members serve clients over TLS.
    scheme: &'static str,
}

/// The files of a cluster that serves clients over TLS and asks for their certificates.
pub struct Tls {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// `n` distinct ports nothing listens on: all bound at once (so none is handed out twice),
/// then released for the members to take.
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound address").port())
        .collect()
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_with(&[])
    }

    /// Members that serve clients over TLS only, and only to holders of a certificate the CA
    /// signed.
    pub fn start_tls(tls: &Tls) -> Cluster {
        // Each flag followed by its file.
        let flags = |pairs: &[(&str, &PathBuf)]| -> Vec<String> {
            pairs
                .iter()
                .flat_map(|(flag, file)| [flag.to_string(), file.display().to_string()])
                .collect()
        };
        let mut extra = flags(&[
            ("--cert-file", &tls.server_cert),
            ("--key-file", &tls.server_key),
            ("--trusted-ca-file", &tls.ca),
        ]);
        extra.push("--client-cert-auth".into());
        let ctl = flags(&[
            ("--cacert", &tls.ca),
            ("--cert", &tls.client_cert),
            ("--key", &tls.client_key),
        ]);
        Cluster::launch(&extra, "https", ctl)
    }

    pub fn start_with(extra: &[&str]) -> Cluster {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Cluster::launch(&extra, "http", Vec::new())
    }

    fn launch(extra: &[String], scheme: &'static str, ctl_flags: Vec<String>) -> Cluster {
        assert!(
            Path::new(ETCD).exists() && Path::new(ETCDCTL).exists(),
            "{ETCD} or {ETCDCTL} is missing: the etcd tests need a real cluster (apt-get install \
             etcd-server etcd-client; scripts/test-deps does this)"
        );
        let dir = tempfile::tempdir().unwrap();
        let ports = free_ports(6);
        let members = (1..=3)
            .map(|i| Member {
                name: format!("m{i}"),
                client: ports[2 * i - 2],
                peer: ports[2 * i - 1],
                data: dir.path().join(format!("m{i}")),
                child: None,
            })
            .collect();
        let mut c = Cluster {
            dir,
            members,
            extra: extra.to_vec(),
            ctl_flags,
            scheme,
        };
        for i in 0..3 {
            c.spawn(i, "new");
        }
        c.wait_healthy();
        c
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let m = &self.members[i];
        let log = fs::File::create(self.dir.path().join(format!("{}.log", m.name))).unwrap();
        let client = format!("{}://127.0.0.1:{}", self.scheme, m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let child = Command::new(ETCD)
            .args(["--name", &m.name, "--data-dir"])
            .arg(&m.data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &initial.join(",")])
            .args([
                "--initial-cluster-state",
                state,
                "--initial-cluster-token",
                "wp-test",
            ])
            // Fast elections, so a failover fits in a test.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.members[i].child = Some(child);
    }

    /// `etcd://` (`etcds://` with TLS) with every member.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect();
        let scheme = if self.scheme == "https" {
            "etcds"
        } else {
            "etcd"
        };
        format!("{scheme}://{}/t", hosts.join(","))
    }

    fn endpoints(&self) -> String {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Runs etcdctl against the live members.
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(ETCDCTL)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoints(), "--command-timeout", "5s"])
            .args(&self.ctl_flags)
            .args(args)
            .output()
            .expect("etcdctl")
    }

    fn wait_healthy(&self) {
        let start = Instant::now();
        loop {
            let out = self.ctl(&["put", "t/probe", "1"]);
            if out.status.success() {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the etcd cluster did not come up: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The index of the member that leads the cluster's raft.
    pub fn leader(&self) -> usize {
        let start = Instant::now();
        loop {
            let out = self.ctl(&["endpoint", "status", "-w", "json"]);
            if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) {
                for s in v.as_array().into_iter().flatten() {
                    let id = &s["Status"]["header"]["member_id"];
                    if *id == s["Status"]["leader"] {
                        let ep = s["Endpoint"].as_str().unwrap_or_default();
                        if let Some(i) = self
                            .members
                            .iter()
                            .position(|m| ep.ends_with(&format!(":{}", m.client)))
                        {
                            return i;
                        }
                    }
                }
            }
            assert!(start.elapsed() < PATIENCE, "no etcd leader");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Returns once the members have expired a token issued after this call began, so a token
    /// lifetime has passed since. For a cluster with authentication on, `--auth-token-ttl` and
    /// `--log-level info` among its flags (the members log each expired token, and a simple
    /// token ends in the raft index it was issued at).
    pub fn wait_token_expired(&self) {
        let out = self.ctl(&["endpoint", "status", "-w", "json"]);
        let status: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "endpoint status ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let before = status
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["Status"]["raftIndex"].as_u64())
            .max()
            .expect("a raft index");
        // Authenticates, so a token is issued after `before`.
        let out = self.ctl(&["get", "t/probe"]);
        assert!(
            out.status.success(),
            "etcdctl get: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let start = Instant::now();
        loop {
            let expired = self.members.iter().any(|m| {
                let log = fs::read_to_string(self.dir.path().join(format!("{}.log", m.name)))
                    .unwrap_or_default();
                log.lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .filter(|v| v["msg"] == "deleted a simple token")
                    .filter_map(|v| v["token"].as_str()?.rsplit_once('.')?.1.parse::<u64>().ok())
                    .any(|issued_at| issued_at > before)
            });
            if expired {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "no token issued after raft index {before} expired"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Restarts a killed member on its data.
    pub fn restart(&mut self, i: usize) {
        self.spawn(i, "existing");
        self.wait_healthy();
    }

    /// `etcdctl put KEY` with `value` on stdin (too big for an argument).
    pub fn put_big(&self, key: &str, value: &[u8]) -> std::process::Output {
        use std::io::Write;
        let mut child = Command::new(ETCDCTL)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoints(), "put", key])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(value).unwrap();
        child.wait_with_output().unwrap()
    }

    /// Every event the cluster has seen under `t/`, values included (`etcdctl watch` from
    /// the first revision, cut off after two seconds).
    pub fn history(&self) -> String {
        let out = Command::new("timeout")
            .args(["2", ETCDCTL, "--endpoints", &self.endpoints()])
            .args(&self.ctl_flags)
            .args(["watch", "--prefix", "--rev", "1", "t/"])
            .env("ETCDCTL_API", "3")
            .output()
            .expect("etcdctl watch");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every event the cluster has seen under `t/` as `(revision, key, deleted)`: what
    /// [`history`](Self::history) reads, in `etcdctl`'s `fields` form, which names each
    /// event's type, key and revision (a deletion's is the revision that deleted it).
    pub fn events(&self) -> Vec<(i64, String, bool)> {
        let out = Command::new("timeout")
            .args(["2", ETCDCTL, "--endpoints", &self.endpoints()])
            .args(&self.ctl_flags)
            .args(["watch", "--prefix", "--rev", "1", "t/", "-w", "fields"])
            .env("ETCDCTL_API", "3")
            .output()
            .expect("etcdctl watch");
        let mut events: Vec<(i64, String, bool)> = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((field, value)) = line.split_once(" : ") else {
                continue;
            };
            match field {
                "\"Type\"" => events.push((0, String::new(), value.trim() == "DELETE")),
                "\"Key\"" => {
                    if let Some(e) = events.last_mut() {
                        e.1 = value.trim().trim_matches('"').to_owned();
                    }
                }
                "\"ModRevision\"" => {
                    if let Some(e) = events.last_mut() {
                        e.0 = value.trim().parse().unwrap_or_default();
                    }
                }
                _ => {}
            }
        }
        events
    }

    /// How many keys sit under `t/<rest>` (etcdctl 3.4 has no --count-only).
    pub fn count(&self, rest: &str) -> usize {
        let out = self.ctl(&["get", "--prefix", "--keys-only", &format!("t/{rest}")]);
        assert!(
            out.status.success(),
            "etcdctl get: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// The location an `etcd://` URL names.
pub fn location(url: &str) -> waitpoint::settings::location::EtcdLocation {
    match waitpoint::settings::location::Location::parse(url).unwrap() {
        waitpoint::settings::location::Location::Etcd(loc) => *loc,
        other => panic!("not an etcd URL: {other:?}"),
    }
}

/// The etcd store at `url`, as host `name` with the home at `home` opens it in `role`.
pub fn store_at(
    url: &str,
    name: &str,
    home: &Path,
    role: waitpoint::store::Role,
) -> waitpoint::store::etcd::Etcd {
    let home = waitpoint::home::Home::new(home);
    waitpoint::store::etcd::Etcd::connect(&location(url), name, home, role).unwrap()
}
