//! The etcd store (feature `etcd`), against a real 3-member etcd cluster on 127.0.0.1 that
//! each test starts as its own children, with two or three daemons on separate homes as the
//! hosts. After each run the cluster is exported into an ordinary home (with every host's
//! inboxes beside it) and held to the file store's invariants (`invariants.rs`).

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::*;
use crate::invariants::{self, Dropped};

const ETCD: &str = "/usr/bin/etcd";
const ETCDCTL: &str = "/usr/bin/etcdctl";

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
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    pub fn start() -> Cluster {
        assert!(
            Path::new(ETCD).exists() && Path::new(ETCDCTL).exists(),
            "{ETCD} or {ETCDCTL} is missing: the etcd tests need a real cluster (apt-get install \
             etcd-server etcd-client; scripts/test-deps does this)"
        );
        let dir = tempfile::tempdir().unwrap();
        let members = (1..=3)
            .map(|i| Member {
                name: format!("m{i}"),
                client: free_port(),
                peer: free_port(),
                data: dir.path().join(format!("m{i}")),
                child: None,
            })
            .collect();
        let mut c = Cluster { dir, members };
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
        let client = format!("http://127.0.0.1:{}", m.client);
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
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.members[i].child = Some(child);
    }

    /// `etcd://` with every member.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect();
        format!("etcd://{}/t", hosts.join(","))
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

    /// How many keys sit under `t/<rest>`.
    pub fn count(&self, rest: &str) -> usize {
        let out = self.ctl(&[
            "get",
            "--prefix",
            "--count-only",
            "-w",
            "json",
            &format!("t/{rest}"),
        ]);
        serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v["count"].as_u64())
            .unwrap_or(0) as usize
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A host: its own home, sharing the cluster, named `name`.
pub fn host(cluster: &Cluster, name: &str, extra: &str) -> Env {
    Env::with_settings(&format!(
        r#"{{"waitpointSweepMs": 300, "host": "{name}", "store": {{"url": "{}", "leaseTtlS": 2}}{extra}}}"#,
        cluster.url()
    ))
}

/// Every wake file in a host's inboxes.
fn wake_files(env: &Env) -> Vec<PathBuf> {
    env.files()
        .into_iter()
        .filter(|p| {
            p.starts_with(env.home.join("sessions")) && p.extension().is_some_and(|e| e == "json")
        })
        .collect()
}

/// A waitpoint's state as `show --json` reads it from the cluster on `env`'s host.
fn shown(env: &Env, id: &str) -> Value {
    let text = env.ok("show", &env.waitpoint(&["show", id, "--json"]));
    serde_json::from_str(&text).unwrap()
}

/// The log lines of a host's daemon.
fn log(env: &Env) -> String {
    fs::read_to_string(env.home.join("log/daemon.log")).unwrap_or_default()
}

/// Waits until `env`'s daemon leads.
fn wait_leading(env: &Env) {
    env.wait_until("the daemon to lead", || {
        log(env).contains("leading: applying signals")
    });
}

/// The cluster exported into a fresh home, with every host's inboxes copied beside it, so the
/// file store's checks read it as one home.
pub fn audit(first: &Env, hosts: &[&Env]) -> Env {
    let audit = Env::new();
    let snapshot = audit.home.join("snapshot");
    first.ok(
        "export",
        &first.waitpoint(&["export", snapshot.to_str().unwrap()]),
    );
    copy_tree(&snapshot.join("waitpoints"), &audit.home.join("waitpoints"));
    copy_tree(&snapshot.join("index"), &audit.home.join("index"));
    for h in hosts {
        copy_tree(&h.home.join("sessions"), &audit.home.join("sessions"));
    }
    fs::remove_dir_all(&snapshot).unwrap();
    audit
}

fn copy_tree(from: &Path, to: &Path) {
    let Ok(rd) = fs::read_dir(from) else { return };
    fs::create_dir_all(to).unwrap();
    for e in rd.flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            fs::copy(e.path(), &target).unwrap();
        }
    }
}

fn drop_on(env: &Env, host: &str, name: &str, id: &str, secret: &str, extra: &str) -> Dropped {
    env.drop_file(name, &body(id, secret, extra));
    Dropped {
        name: format!("{name}.json@{host}"),
        waitpoint: id.to_owned(),
    }
}

#[test]
fn a_waitpoint_armed_on_one_host_is_signalled_on_another_and_wakes_the_first_once() {
    let cluster = Cluster::start();
    let a = host(&cluster, "a", "");
    let b = host(
        &cluster,
        "b",
        r#", "webhook": {"enabled": true, "port": 0}"#,
    );
    let _da = a.daemon();
    wait_leading(&a);
    let _db = b.daemon();
    let armed = a.arm("train", &["--session", "s1"]);
    let (id, secret) = id_secret(&armed);
    // A second waitpoint, signalled over the standby's HTTP shim with a client's key.
    let other = a.arm("eval", &["--session", "s2"]);
    let (id2, secret2) = id_secret(&other);

    // On host b, from a file dropped there.
    let dropped = drop_on(&b, "b", "done", &id, &secret, r#","message":"finished""#);
    a.wait_until("the wake on host a", || !a.inbox("s1", "new").is_empty());
    let wakes = a.inbox("s1", "new");
    assert_eq!(wakes.len(), 1, "{wakes:?}");
    assert_eq!(wakes[0]["waitpoint"]["id"], id.as_str());
    assert!(wakes[0]["text"].as_str().unwrap().contains("finished"));
    assert!(
        wake_files(&b).is_empty(),
        "host b got a wake:\n{}",
        b.tree()
    );

    // Over the HTTP shim of host b, twice under one Idempotency-Key: one signal.
    let port = b.webhook_port();
    let post = |key: &str| {
        b.run(
            "curl",
            &[
                "-sS",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
                "-H",
                "Content-Type: application/json",
                "-H",
                &format!("Idempotency-Key: {key}"),
                "-d",
                &body(&id2, &secret2, ""),
                &format!("http://127.0.0.1:{port}/webhook/signal"),
            ],
        )
    };
    let first = b.ok("post", &post("retry-1"));
    assert!(first.ends_with("202"), "{first}");
    assert!(
        first.contains("\"queued\""),
        "the standby answers queued: {first}"
    );
    a.wait_until("the eval wake", || !a.inbox("s2", "new").is_empty());
    let again = b.ok("post again", &post("retry-1"));
    assert!(again.ends_with("202"), "{again}");
    a.wait_until("nothing handed over left", || cluster.count("in/") == 0);
    assert_eq!(a.inbox("s2", "new").len(), 1);
    let state = shown(&b, &id2);
    assert_eq!(state["counters"]["signals"], 1, "{state}");

    // A wrong secret is refused on the host it reached, and parked there with the reason.
    b.drop_file("wrong", &body(&id, "not-the-secret", ""));
    let reason = b.drop_zone().join("bad/wrong.reason");
    b.wait_until("the refusal parked on b", || reason.exists());
    let why = fs::read_to_string(&reason).unwrap();
    assert!(
        why.contains("unknown waitpoint id or wrong secret"),
        "{why}"
    );

    let audit = audit(&a, &[&a, &b]);
    let findings = invariants::check(&audit, &[dropped]);
    findings.assert_kept("cross-host");
    assert_eq!(findings.recorded, 1, "{findings:?}");
}
