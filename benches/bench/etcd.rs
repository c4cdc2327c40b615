//! Row 8: the etcd store beside the files, in the same run: ingest and drop-to-wake latency
//! across two hosts, the time from the leading daemon's death to the first signal applied, and
//! what happens at the space quota. A 3-member cluster on 127.0.0.1 is started for each part
//! (`tests/it/etcd_cluster.rs`, included), and the hosts are homes with daemons of their own.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use waitpoint::home::Home;

use crate::etcd_cluster::Cluster;
use crate::ours::{self, Armed, Bins, Daemon, body, new_home, pending_json, wait_until};

/// A host's home on `cluster`, named `name`, with the leadership lease `lease_s`.
fn host(dir: &Path, cluster: &Cluster, name: &str, lease_s: u64) -> Home {
    new_home(
        dir,
        &format!(
            r#"{{"waitpointSweepMs": 30000, "host": "{name}", "store": {{"url": "{}", "leaseTtlS": {lease_s}}}}}"#,
            cluster.url()
        ),
    )
}

fn log_has(home: &Home, text: &str) -> bool {
    fs::read_to_string(home.log_file()).is_ok_and(|l| l.contains(text))
}

/// Starts a host's daemon; with `lead`, waits until it leads.
fn start(bins: &Bins, home: &Home, lead: bool) -> Daemon {
    let d = Daemon::start(bins, home);
    d.wait_ready();
    if lead {
        wait_until("the daemon to lead", || log_has(home, "leading: applying"));
    }
    d
}

/// A cluster with two hosts: `a` leads, `b` stands by (both daemons run until it drops).
struct Pair {
    cluster: Cluster,
    a: Home,
    b: Home,
    _daemons: [Daemon; 2],
}

impl Pair {
    fn start(bins: &Bins, dir: &Path) -> Pair {
        let cluster = Cluster::start();
        let a = host(&dir.join("a"), &cluster, "a", 5);
        let b = host(&dir.join("b"), &cluster, "b", 5);
        let da = start(bins, &a, true);
        let db = start(bins, &b, false);
        Pair {
            cluster,
            a,
            b,
            _daemons: [da, db],
        }
    }
}

/// Signals per second from the drop zone of `into` to applied in the cluster: until the
/// waitpoints' counts, read through `count`, reach `total`. The same end for either host (a
/// signal dropped on a standby is applied by the leader), read in-process every 5 ms: an
/// `etcdctl` started per look would compete with the daemons for these two cores.
fn ingest_into(
    into: &Home,
    armed: &[Armed],
    per: usize,
    count: &dyn Fn() -> u64,
    total: u64,
) -> f64 {
    let stage = into.root().join("tmp/stage");
    let names = ours::stage_signals(&stage, armed, per, "progress");
    let zone = into.drop_zone();
    let t = Instant::now();
    for name in &names {
        fs::rename(stage.join(name), zone.join(name)).unwrap();
    }
    while count() < total {
        assert!(t.elapsed() < Duration::from_secs(600), "timed out applying");
        std::thread::sleep(Duration::from_millis(5));
    }
    names.len() as f64 / t.elapsed().as_secs_f64()
}

/// Ingest through the cluster: `(dropped on the leading host, dropped on a standby)`, in
/// signals/s, `per` progress signals to each of `n_wp` waitpoints.
pub fn ingest(bins: &Bins, dir: &Path, n_wp: usize, per: usize) -> (f64, f64) {
    // Bound whole: its daemons run until it drops.
    let pair = Pair::start(bins, dir);
    let (a, b) = (&pair.a, &pair.b);
    let armed = ours::arm(a, n_wp, "bench", 10_000);
    let engine = ours::engine(a);
    let count = || -> u64 {
        engine
            .list()
            .unwrap()
            .iter()
            .map(|w| w.counters.signals)
            .sum()
    };
    let n = (n_wp * per) as u64;
    let local = ingest_into(a, &armed, per, &count, n);
    let remote = ingest_into(b, &armed, per, &count, 2 * n);
    assert_eq!(pair.cluster.count("in/"), 0, "nothing handed over is left");
    (local, remote)
}

/// ms from a file renamed into host b's drop zone to the wake in host a's inbox (armed on a,
/// applied by a, which leads), one signal at a time.
/// Also the ms of each of `n` `etcdctl put`s into the same cluster, after: what one write
/// costs a client of this cluster, process start included, as a user's script would pay it.
pub fn latency(bins: &Bins, dir: &Path, n: usize) -> (Vec<f64>, Vec<f64>) {
    let pair = Pair::start(bins, dir);
    let armed = ours::arm(&pair.a, n, "lat", 1);
    let wakes = ours::drop_to_wake(&pair.b.drop_zone(), &pair.a, &armed);
    let puts = (0..n)
        .map(|i| {
            let t = Instant::now();
            let out = pair.cluster.ctl(&["put", &format!("bench/put/{i}"), "x"]);
            assert!(out.status.success(), "etcdctl put");
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    (wakes, puts)
}

/// Seconds from SIGKILL of the leading daemon to the wake of a signal dropped on the standby
/// at that moment, `rounds` times (the killed daemon comes back as the next standby).
pub fn failover(bins: &Bins, dir: &Path, lease_s: u64, rounds: usize) -> Vec<f64> {
    let cluster = Cluster::start();
    let homes = [
        host(&dir.join("a"), &cluster, "a", lease_s),
        host(&dir.join("b"), &cluster, "b", lease_s),
    ];
    let mut daemons = [
        Some(start(bins, &homes[0], true)),
        Some(start(bins, &homes[1], false)),
    ];
    let mut leader = 0;
    let mut out = Vec::new();
    for round in 0..rounds {
        let standby = 1 - leader;
        let armed = ours::arm(&homes[standby], 1, "lat", 1).pop().unwrap();
        let wake = homes[standby]
            .inbox_new("lat")
            .join(format!("{}.json", armed.wp.wake_id(1)));
        let name = homes[standby].drop_zone().join(format!("fo-{round}.json"));
        let mut d = daemons[leader].take().unwrap();
        let t = Instant::now();
        let _ = d.child.kill();
        let _ = d.child.wait();
        fs::write(&name, body(&armed, "ok")).unwrap();
        wait_until("the wake after the failover", || wake.exists());
        out.push(t.elapsed().as_secs_f64());
        daemons[leader] = Some(start(bins, &homes[leader], false));
        leader = standby;
    }
    out
}

/// At the quota: `n` signals dropped on the leading host while the cluster refuses writes.
pub struct Quota {
    pub kept: usize,
    pub applied_before_fix: u64,
    pub error: String,
    /// Seconds from the alarm's disarm to every signal applied.
    pub catch_up_s: f64,
}

pub fn quota(bins: &Bins, dir: &Path, n: usize) -> Quota {
    let cluster = Cluster::start_with(&["--quota-backend-bytes", "2097152"]);
    let a = host(&dir.join("a"), &cluster, "a", 5);
    let _d = start(bins, &a, true);
    let armed = ours::arm(&a, n, "bench", 10);
    let filler = vec![b'x'; 1 << 20];
    for i in 0..16 {
        if !cluster
            .put_big(&format!("t/filler/{i}"), &filler)
            .status
            .success()
        {
            break;
        }
    }
    for (i, w) in armed.iter().enumerate() {
        fs::write(a.drop_zone().join(format!("q-{i:04}.json")), body(w, "ok")).unwrap();
    }
    wait_until("the refusal in the log", || log_has(&a, "space exceeded"));
    // Long enough for the retries to have met the full cluster again, several times.
    std::thread::sleep(Duration::from_secs(3));
    let log = fs::read_to_string(a.log_file()).unwrap_or_default();
    let error = log
        .lines()
        .find(|l| l.contains("space exceeded"))
        .and_then(|l| {
            let from = &l[l.find("etcdserver")?..];
            Some(from.split('"').next().unwrap_or(from).trim().to_owned())
        })
        .unwrap_or_default();
    let kept = pending_json(&a.drop_zone());
    let count = || -> u64 {
        ours::engine(&a)
            .list()
            .unwrap()
            .iter()
            .map(|w| w.counters.signals)
            .sum()
    };
    let applied_before_fix = count();
    let ctl = |args: &[&str]| assert!(cluster.ctl(args).status.success(), "etcdctl {args:?}");
    ctl(&["del", "--prefix", "t/filler/"]);
    let status = cluster.ctl(&["endpoint", "status", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let rev = v[0]["Status"]["header"]["revision"].as_i64().unwrap();
    ctl(&["compact", &rev.to_string()]);
    ctl(&["defrag"]);
    ctl(&["alarm", "disarm"]);
    // The daemon retries the files it kept on its own (a deferred retry, then every sweep).
    let t = Instant::now();
    wait_until("every signal applied", || count() == n as u64);
    Quota {
        kept,
        applied_before_fix,
        error,
        catch_up_s: t.elapsed().as_secs_f64(),
    }
}
