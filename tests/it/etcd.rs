//! The etcd store (feature `etcd`), against a real 3-member etcd cluster on 127.0.0.1 that
//! each test starts as its own children, with two or three daemons on separate homes as the
//! hosts. After each run the cluster is exported into an ordinary home (with every host's
//! inboxes beside it) and held to the file store's invariants (`invariants.rs`).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::Value;

use crate::etcd_cluster::{Cluster, location, store_at};
use crate::helpers::*;
use crate::invariants::{self, Dropped};

/// A host: its own home, sharing the cluster, named `name`.
pub fn host(cluster: &Cluster, name: &str, extra: &str) -> Env {
    Env::with_settings(&format!(
        r#"{{"waitpointSweepMs": 300, "host": "{name}", "store": {{"url": "{}", "leaseTtlS": 2}}{extra}}}"#,
        cluster.url()
    ))
}

/// Every wake file in a host's inboxes.
pub(crate) fn wake_files(env: &Env) -> Vec<PathBuf> {
    env.files()
        .into_iter()
        .filter(|p| {
            p.starts_with(env.home.join("sessions")) && p.extension().is_some_and(|e| e == "json")
        })
        .collect()
}

/// A waitpoint's state as `show --json` reads it from the cluster on `env`'s host.
pub(crate) fn shown(env: &Env, id: &str) -> Value {
    env.waitpoint_json("show", &["show", id, "--json"])
}

/// The log lines of a host's daemon.
pub(crate) fn log(env: &Env) -> String {
    fs::read_to_string(env.home.join("log/daemon.log")).unwrap_or_default()
}

/// Hosts a and b with their daemons running, a leading.
pub(crate) fn two_hosts(cluster: &Cluster) -> (Env, Env, DaemonGuard, DaemonGuard) {
    let a = host(cluster, "a", "");
    let b = host(cluster, "b", "");
    let da = a.daemon();
    wait_leading(&a);
    let db = b.daemon();
    (a, b, da, db)
}

/// Waits until `env`'s daemon leads.
pub(crate) fn wait_leading(env: &Env) {
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

pub(crate) fn copy_tree(from: &Path, to: &Path) {
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

pub(crate) fn drop_on(
    env: &Env,
    host: &str,
    name: &str,
    id: &str,
    secret: &str,
    extra: &str,
) -> Dropped {
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

    // A daemon starting on a cluster reads everything once: its watch asks for no rescan.
    for h in [&a, &b] {
        assert!(!log(h).contains("asked for a rescan"), "{}", log(h));
    }
    // The session's list, read on the other host from the cluster's index.
    let listed = b.ok("check on b", &b.waitpoint(&["check", "--session", "s1"]));
    assert!(listed.contains("train"), "{listed}");
    // Someone on host b waits for it (the store's watch tells it, not a poll).
    let waiting = b
        .command(WAITPOINT)
        .args(["wait", &id, "--timeout", "30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
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
    let waited = waiting.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&waited.stdout);
    assert_eq!(waited.status.code(), Some(0), "wait: {said}");
    assert!(said.contains("resolved ok"), "{said}");

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
    // An unknown id, in the same burst, is refused there too.
    b.drop_file("unknown", &body("wp_000000000000", &secret, ""));
    b.drop_file("wrong", &body(&id, "not-the-secret", ""));
    let reason = b.drop_zone().join("bad/wrong.reason");
    b.wait_until("the refusal parked on b", || reason.exists());
    let why = fs::read_to_string(&reason).unwrap();
    assert!(
        why.contains("unknown waitpoint id or wrong secret"),
        "{why}"
    );
    let unknown = b.drop_zone().join("bad/unknown.reason");
    b.wait_until("the unknown id parked on b", || unknown.exists());

    // The same file name on two hosts is two signals; the same name again on one is one.
    let (id3, secret3) = id_secret(&a.arm("pair", &["--session", "s1", "--max-signals", "5"]));
    let progress = r#","status":"progress""#;
    let mut all = vec![dropped];
    all.push(drop_on(&a, "a", "same", &id3, &secret3, progress));
    all.push(drop_on(&b, "b", "same", &id3, &secret3, progress));
    a.wait_until("both counted", || {
        shown(&a, &id3)["counters"]["signals"] == 2
    });
    b.wait_until("b's copy collected", || b.spooled().is_empty());
    b.drop_file("same", &body(&id3, &secret3, progress));
    b.wait_until("b's second copy collected", || b.spooled().is_empty());
    a.wait_until("nothing left handed over", || cluster.count("in/") == 0);
    assert_eq!(shown(&a, &id3)["counters"]["signals"], 2);

    // No secret in any value the cluster ever held (its whole history, handed-over signals
    // included) nor in any log line.
    let history = cluster.history();
    assert!(
        history.contains("t/in/"),
        "signals were handed over:\n{history}"
    );
    for s in [&secret, &secret2, &secret3] {
        assert!(
            !history.contains(s.as_str()),
            "a secret in etcd:\n{history}"
        );
        assert!(!log(&a).contains(s.as_str()) && !log(&b).contains(s.as_str()));
    }

    let audit = audit(&a, &[&a, &b]);
    let findings = invariants::check(&audit, &all);
    findings.assert_kept("cross-host");
    assert_eq!(findings.recorded, all.len(), "{findings:?}");
}

/// What a storm does halfway through.
#[derive(Clone, Copy, Debug)]
enum Blow {
    /// SIGKILL the etcd member that leads the raft, restart it a moment later.
    EtcdLeader,
    /// SIGKILL the leading daemon (mid-batch: files are arriving), restart it later.
    LeadingDaemon,
}

/// Signals from every host at once, with resends, while `blow` strikes; afterwards every
/// signal is recorded once, every state is a replay of its records, every wake is in its
/// inbox once, and nothing is left handed over or spooled.
fn storm(blow: Blow) {
    const WAITPOINTS: usize = 4;
    const FILES: usize = 90;
    let mut cluster = Cluster::start();
    let names = ["a", "b", "c"];
    let hosts: Vec<Env> = names.iter().map(|n| host(&cluster, n, "")).collect();
    let mut daemons: Vec<Option<DaemonGuard>> = Vec::new();
    daemons.push(Some(hosts[0].daemon()));
    wait_leading(&hosts[0]);
    daemons.push(Some(hosts[1].daemon()));
    daemons.push(Some(hosts[2].daemon()));
    let armed: Vec<(String, String)> = (0..WAITPOINTS)
        .map(|i| {
            id_secret(&hosts[0].arm(
                &format!("job{i}"),
                &["--session", "s1", "--max-signals", "10000"],
            ))
        })
        .collect();
    let mut dropped = Vec::new();
    for i in 0..FILES {
        let h = i % names.len();
        let (id, secret) = &armed[i % WAITPOINTS];
        let name = format!("{i:04}");
        dropped.push(drop_on(
            &hosts[h],
            names[h],
            &name,
            id,
            secret,
            r#","status":"progress""#,
        ));
        // Every seventh file comes again once its first copy is gone: a re-collected file
        // (where a daemon is there to collect the first).
        if i % 7 == 3 && daemons[h].is_some() {
            let zone = hosts[h].drop_zone().join(format!("{name}.json"));
            hosts[h].wait_until("the first copy collected", || !zone.exists());
            hosts[h].drop_file(&name, &body(id, secret, r#","status":"progress""#));
        }
        if i == FILES / 3 {
            match blow {
                Blow::EtcdLeader => {
                    let l = cluster.leader();
                    cluster.kill(l);
                    // Down until the two others have elected a leader of their own.
                    let next = cluster.leader();
                    assert_ne!(next, l, "the killed member still leads");
                    cluster.restart(l);
                }
                Blow::LeadingDaemon => {
                    daemons[0].take().unwrap().kill();
                }
            }
        }
        if i == 2 * FILES / 3 && daemons[0].is_none() {
            daemons[0] = Some(hosts[0].daemon());
        }
    }
    // Each job ends with an ok from host b: one resolved wake each, on host a.
    for (id, secret) in &armed {
        let name = format!("end-{id}");
        dropped.push(drop_on(&hosts[1], "b", &name, id, secret, ""));
    }
    for h in &hosts {
        h.wait_until("every drop zone empty", || h.spooled().is_empty());
    }
    hosts[0].wait_until("nothing left handed over", || cluster.count("in/") == 0);
    hosts[0].wait_until("every resolved wake on host a", || {
        hosts[0].inbox("s1", "new").len() == WAITPOINTS
    });
    assert_eq!(cluster.count("wake/"), 0, "wakes left undelivered");
    for h in &hosts[1..] {
        assert!(wake_files(h).is_empty(), "{}", h.tree());
    }
    let refs: Vec<&Env> = hosts.iter().collect();
    let audit = audit(&hosts[0], &refs);
    let findings = invariants::check(&audit, &dropped);
    findings.assert_kept(&format!("storm with {blow:?}"));
    assert_eq!(findings.recorded, dropped.len(), "{findings:?}");
    assert_eq!(findings.wakes, WAITPOINTS, "{findings:?}");
    if let Blow::LeadingDaemon = blow {
        assert!(
            hosts[1..]
                .iter()
                .any(|h| log(h).contains("leading: applying")),
            "no standby took over"
        );
    }
}

#[test]
fn a_storm_from_every_host_with_resends_survives_the_etcd_leader_killed_and_restarted() {
    storm(Blow::EtcdLeader);
}

#[test]
fn a_storm_survives_the_leading_daemon_killed_mid_batch() {
    storm(Blow::LeadingDaemon);
}

/// The election key of the leading daemon and its creation revision (the fence).
fn leader_key(cluster: &Cluster) -> (Vec<u8>, i64) {
    let out = cluster.ctl(&["get", "--prefix", "t/leader", "-w", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kv = &v["kvs"][0];
    let key = base64_decode(kv["key"].as_str().expect("a leader key"));
    (key, kv["create_revision"].as_i64().unwrap())
}

fn base64_decode(text: &str) -> Vec<u8> {
    let out = Command::new("base64")
        .arg("-d")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(text.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    out.stdout
}

#[test]
fn a_daemon_that_believes_it_still_leads_after_its_lease_lapsed_cannot_commit() {
    use waitpoint::error::{Error, ErrorKind};
    use waitpoint::store::{Cluster as _, Role, Store};
    let cluster = Cluster::start();
    let a = host(&cluster, "a", "");
    let b = host(&cluster, "b", "");
    let armed = a.arm("train", &["--session", "s1"]);
    let (id, _) = id_secret(&armed);
    let da = a.daemon();
    wait_leading(&a);
    // What a's daemon holds while it leads; then it stops (a pause past its lease looks the
    // same to the cluster) and b takes over.
    let (key, rev) = leader_key(&cluster);
    drop(da);
    let _db = b.daemon();
    wait_leading(&b);
    assert_ne!(leader_key(&cluster).1, rev);

    let stale = store_at(&cluster.url(), "a", &a.home, Role::Daemon);
    stale.believe_leading(key, rev);
    assert!(stale.applies_signals(), "it believes it leads");
    let mut txn = stale.begin().unwrap();
    let (mut wp, _) = txn.read(&id).unwrap().unwrap();
    wp.label = "written by a stale leader".into();
    // A lost lease, told apart from a stale read: retry after the lease's time, when another
    // daemon leads (the shim answers it 503 with that Retry-After).
    let ttl = location(&cluster.url()).lease_ttl_s;
    let err = txn.put(&wp).unwrap_err();
    assert!(
        matches!(err, Error::LeaseLost { retry_after_s } if retry_after_s == ttl),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.to_string().contains("no longer leads"), "{err}");
    assert!(!stale.applies_signals(), "a refused write ends the belief");
    assert_eq!(shown(&b, &id)["label"], "train");

    // Without the belief (a standby), it writes nothing either, and says why the same way.
    let mut txn = stale.begin().unwrap();
    let (wp, _) = txn.read(&id).unwrap().unwrap();
    let err = txn.put(&wp).unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
}

#[test]
fn a_leading_daemon_paused_past_its_lease_gives_way_and_loses_nothing() {
    let cluster = Cluster::start();
    let (a, b, da, _db) = two_hosts(&cluster);
    let (id, secret) = id_secret(&a.arm("train", &["--session", "s1", "--max-signals", "100"]));
    da.send(Signal::STOP);
    let mut dropped = vec![drop_on(
        &b,
        "b",
        "on-b",
        &id,
        &secret,
        r#","status":"progress""#,
    )];
    b.wait_until("b to take over", || log(&b).contains("leading: applying"));
    b.wait_until("b to apply the signal", || {
        shown(&b, &id)["counters"]["signals"] == 1
    });
    // Files for the paused host wait in its drop zone until it runs again.
    for i in 0..5 {
        dropped.push(drop_on(
            &a,
            "a",
            &format!("on-a-{i}"),
            &id,
            &secret,
            r#","status":"progress""#,
        ));
    }
    da.send(Signal::CONT);
    a.wait_until("a's drop zone empty", || a.spooled().is_empty());
    a.wait_until("nothing left handed over", || cluster.count("in/") == 0);
    a.wait_until("a to give way", || log(&a).contains("no longer leading"));
    assert_eq!(shown(&b, &id)["counters"]["signals"], 6);
    let audit = audit(&a, &[&a, &b]);
    let findings = invariants::check(&audit, &dropped);
    findings.assert_kept("paused leader");
    assert_eq!(findings.recorded, dropped.len(), "{findings:?}");
}

#[test]
fn deadlines_fire_once_however_the_leadership_moved() {
    const JOBS: usize = 3;
    let cluster = Cluster::start();
    // Waitpoints armed on a live three seconds.
    let a = host(&cluster, "a", r#", "waitpointTtlMs": 3000"#);
    let b = host(&cluster, "b", "");
    let da = a.daemon();
    wait_leading(&a);
    let _db = b.daemon();
    let ids: Vec<String> = (0..JOBS)
        .map(|i| id_secret(&a.arm(&format!("job{i}"), &["--session", "s1"])).0)
        .collect();
    // A timer set on host a, due with the deadlines.
    let timer = [
        "timer",
        "create",
        "--after-ms",
        "3000",
        "--summary",
        "tick",
        "--session",
        "s1",
    ];
    a.ok("timer create", &a.waitpoint(&timer));
    // The leader dies before the deadlines; b fires them, for a's inbox.
    da.kill();
    b.wait_until("b to take over", || log(&b).contains("leading: applying"));
    for id in &ids {
        b.wait_until("the deadline", || shown(&b, id)["status"] == "expired");
    }
    let listed = |env: &Env| -> Value {
        let list = ["timer", "list", "--session", "s1", "--json"];
        serde_json::from_str(&env.ok("timer list", &env.waitpoint(&list))).unwrap()
    };
    let fired = |v: &Value| v.to_string().contains("\"fire_count\":1");
    b.wait_until("the timer fired, seen from b", || fired(&listed(&b)));
    b.wait_until("the wakes waiting for host a", || {
        cluster.count("wake/a/") == JOBS + 1
    });
    let _da = a.daemon();
    a.wait_until("a's wakes delivered", || {
        a.inbox("s1", "new").len() == JOBS + 1
    });
    a.wait_until("the wake keys gone", || cluster.count("wake/") == 0);
    let ticks = a
        .inbox("s1", "new")
        .into_iter()
        .filter(|w| w["kind"] == "timer")
        .count();
    assert_eq!(ticks, 1, "one timer wake");
    assert!(fired(&listed(&a)), "{}", listed(&a));
    let local = fs::read_dir(a.home.join("timers")).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("tm_"))
            .count()
    });
    assert_eq!(local, 0, "the timer lives in the cluster, not in a's home");
    let wakes = a.inbox("s1", "new");
    for id in &ids {
        let of: Vec<&Value> = wakes
            .iter()
            .filter(|w| w["waitpoint"]["id"] == id.as_str())
            .collect();
        assert_eq!(of.len(), 1, "{id}: {of:?}");
        assert_eq!(of[0]["kind"], "deadline", "{:?}", of[0]);
    }
    for id in &ids {
        let state = shown(&a, id);
        assert_eq!(state["counters"]["wakes"], 1, "{state}");
        assert!(state["outbox"].as_array().unwrap().is_empty(), "{state}");
    }
}

/// A waitpoint's files as text, with every timestamp and the daemon-made ids of the moment
/// replaced, so two stores fed the same input compare equal.
fn normalized_tree(waitpoints: &Path) -> std::collections::BTreeMap<String, Value> {
    fn scrub(v: &mut Value) {
        match v {
            Value::String(s) if s.len() >= 20 && s.as_bytes()[4] == b'-' && s.contains('T') => {
                *s = "<time>".into();
            }
            Value::Array(a) => a.iter_mut().for_each(scrub),
            Value::Object(o) => o.values_mut().for_each(scrub),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeMap::new();
    for path in files_under(waitpoints) {
        let rel = path
            .strip_prefix(waitpoints)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // A state's spare is not a record (the previous state, or empty).
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        if rel.ends_with(".jsonl") {
            // The record log: each line is one record, compared on its own.
            let text = fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let mut v: Value = serde_json::from_str(line).unwrap();
                scrub(&mut v);
                out.insert(format!("{rel} line {}", n + 1), v);
            }
            continue;
        }
        let mut v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        scrub(&mut v);
        out.insert(rel, v);
    }
    out
}

#[test]
fn an_export_of_the_cluster_equals_the_file_store_home_fed_the_same_signals() {
    let files = Env::new();
    let _df = files.daemon();
    let arms: [&[&str]; 3] = [
        &["--session", "s1"],
        &["--session", "s1", "--member", "x", "--member", "y"],
        &["--session", "s2", "--max-signals", "3"],
    ];
    let armed: Vec<(String, String)> = arms
        .iter()
        .enumerate()
        .map(|(i, extra)| id_secret(&files.arm(&format!("job{i}"), extra)))
        .collect();
    let cluster = Cluster::start();
    let a = host(&cluster, "a", "");
    let out = a.waitpoint(&["import", files.home.to_str().unwrap()]);
    let said = a.ok("import", &out);
    assert!(said.contains("imported 3 waitpoints"), "{said}");
    let _da = a.daemon();
    wait_leading(&a);
    let signals = [
        (0, r#","status":"progress","message":"half""#),
        (1, r#","member":"x""#),
        (2, r#","status":"progress""#),
        (0, r#","message":"done""#),
        (2, r#","status":"fail","message":"boom""#),
        (1, r#","member":"y","status":"fail""#),
        (2, r#","status":"ok""#),
    ];
    for (n, (i, extra)) in signals.iter().enumerate() {
        let (id, secret) = &armed[*i];
        // A name cortex-signal would mint: the same identity on both stores.
        let name = format!("cs-{n:032x}");
        for env in [&files, &a] {
            env.drop_file(&name, &body(id, secret, extra));
            env.wait_until("the file collected", || env.spooled().is_empty());
        }
    }
    a.wait_until("nothing left handed over", || cluster.count("in/") == 0);
    let snapshot = a.home.join("../snapshot");
    a.ok(
        "export",
        &a.waitpoint(&["export", snapshot.to_str().unwrap()]),
    );
    let want = normalized_tree(&files.home.join("waitpoints"));
    let got = normalized_tree(&snapshot.join("waitpoints"));
    assert_eq!(
        want.len(),
        3 + signals.len(),
        "three states, every record: {want:?}"
    );
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "the same files"
    );
    for (path, w) in &want {
        assert_eq!(&got[path], w, "{path} differs");
    }
    // And the export is a home the ordinary commands read.
    let listed = a.ok(
        "show on the export",
        &a.waitpoint(&["--home", snapshot.to_str().unwrap(), "show", &armed[2].0]),
    );
    assert!(listed.contains("job2"), "{listed}");
}

#[test]
fn at_the_quota_signals_stay_where_they_arrived_and_doctor_says_how_to_fix_it() {
    // A quota of 2 MiB, filled with a few big values.
    let cluster = Cluster::start_with(&["--quota-backend-bytes", "2097152"]);
    let a = host(&cluster, "a", "");
    let (id, secret) = id_secret(&a.arm("train", &["--session", "s1"]));
    let _da = a.daemon();
    wait_leading(&a);
    let filler = vec![b'x'; 1 << 20];
    let mut full = false;
    for i in 0..16 {
        let out = cluster.put_big(&format!("t/filler/{i}"), &filler);
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(said.contains("space exceeded"), "{said}");
            full = true;
            break;
        }
    }
    assert!(full, "the quota was never reached");
    a.drop_file("done", &body(&id, &secret, ""));
    a.wait_until("the refused commit in the log", || {
        log(&a).contains("space exceeded")
    });
    assert_eq!(
        a.spooled(),
        ["done.json"],
        "the signal stays where it arrived"
    );
    assert_eq!(shown(&a, &id)["counters"]["signals"], 0);
    let out = a.waitpoint(&["doctor"]);
    let report = a.expect_code("doctor", &out, 1);
    let line = report
        .lines()
        .find(|l| l.contains("space"))
        .unwrap_or_default();
    assert!(
        line.starts_with("FAIL") && line.contains("alarm disarm"),
        "{report}"
    );

    // The operator's fix: drop the filler, compact, defragment, disarm. Nothing was lost.
    let ok = |args: &[&str]| {
        let out = cluster.ctl(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(&["del", "--prefix", "t/filler/"]);
    let status = ok(&["endpoint", "status", "-w", "json"]);
    let v: Value = serde_json::from_str(&status).unwrap();
    let rev = v[0]["Status"]["header"]["revision"]
        .as_i64()
        .unwrap()
        .to_string();
    ok(&["compact", &rev]);
    ok(&["defrag"]);
    ok(&["alarm", "disarm"]);
    a.wait_until("the signal applied after the fix", || {
        a.spooled().is_empty() && shown(&a, &id)["status"] == "resolved"
    });
    assert_eq!(a.inbox("s1", "new").len(), 1);
}

#[test]
fn a_store_dropped_inside_another_runtime_shuts_down_without_a_panic() {
    // The MCP front end runs on tokio and drops its engine, and so the store, on that runtime.
    use waitpoint::store::{Role, Store};
    let cluster = Cluster::start();
    let a = host(&cluster, "a", "");
    let store = store_at(&cluster.url(), "a", &a.home, Role::Command);
    let watching = store.watch(Box::new(|_| {})).unwrap();
    let outer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    outer.block_on(async move {
        drop(watching);
        drop(store);
    });
}

#[test]
fn a_watch_reports_a_change_made_the_moment_it_was_started() {
    // `waitpoint wait` starts the store's watch, then reads: a change between that read and
    // the watch reaching its member must still wake it (a watch "from now" missed it, and the
    // wait sat out its whole timeout beside a resolved waitpoint).
    use std::sync::mpsc;
    use waitpoint::store::{Hint, Role, Store};
    let cluster = Cluster::start();
    let a = host(&cluster, "a", "");
    let (id, _) = id_secret(&a.arm("train", &["--session", "s1"]));
    let open = |name: &str| store_at(&cluster.url(), name, &a.home, Role::Command);
    let (watcher, writer) = (open("a"), open("b"));
    for round in 0..50 {
        // Read for update first, so the write follows the watch's start by one request.
        let mut txn = writer.begin().unwrap();
        let (mut wp, _) = txn.read(&id).unwrap().unwrap();
        wp.label = format!("train, round {round}");
        let (tx, rx) = mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let _watching = watcher
            .watch(Box::new(move |hint| {
                let _ = tx.lock().unwrap().send(hint);
            }))
            .unwrap();
        txn.put(&wp).unwrap();
        let heard = rx.recv_timeout(Duration::from_secs(10));
        assert_eq!(heard, Ok(Hint::Changed(id.clone())), "round {round}");
    }
}

#[test]
fn a_callback_made_on_one_host_is_triggered_on_another_and_wakes_the_first_once() {
    let cluster = Cluster::start();
    let (a, b, _da, _db) = two_hosts(&cluster);
    let made = a.ok(
        "callback create",
        &a.waitpoint(&[
            "callback",
            "create",
            "--mode",
            "wake",
            "--label",
            "ci",
            "--session",
            "s1",
            "--json",
        ]),
    );
    let made: Value = serde_json::from_str(&made).unwrap();
    let token = made["trigger_url"]
        .as_str()
        .and_then(|u| u.rsplit('/').next())
        .expect("a trigger URL")
        .to_owned();
    let trigger = format!(r#"{{"callback": "{token}", "mode": "wake"}}"#);
    // Dropped on host b (a standby), then the same file again: one trigger.
    b.drop_file("ci-done", &trigger);
    a.wait_until("the callback's wake on host a", || {
        a.inbox("s1", "new").len() == 1
    });
    b.wait_until("b's file collected", || b.spooled().is_empty());
    b.drop_file("ci-done", &trigger);
    b.wait_until("b's second copy collected", || b.spooled().is_empty());
    let listed = b.ok(
        "callback list on b",
        &b.waitpoint(&["callback", "list", "--session", "s1", "--json"]),
    );
    assert!(listed.contains("\"trigger_count\": 1"), "{listed}");
    assert_eq!(a.inbox("s1", "new").len(), 1);
    assert_eq!(a.inbox("s1", "new")[0]["kind"], "wake_hint");
    assert!(wake_files(&b).is_empty(), "{}", b.tree());
    assert_eq!(cluster.count("cb/"), 1, "the callback lives in the cluster");
    let history = cluster.history();
    assert!(
        history.contains("t/cb/"),
        "the history holds the callback:\n{history}"
    );
    assert!(!history.contains(&token), "no token in etcd");
}

#[test]
fn a_file_from_a_device_of_one_host_wakes_a_session_of_another() {
    let sshd = crate::sshd::Sshd::start();
    let cluster = Cluster::start();
    let (a, b, _da, _db) = two_hosts(&cluster);
    crate::devices::add_device(&b, &sshd, "gpu", &[]);
    let (id, secret) = id_secret(&a.arm("train", &["--session", "s1"]));
    // The job runs on b's device, where nothing of the cluster is known.
    sshd.drop_remote(
        "done",
        &body(&id, &secret, r#","message":"from the device""#),
    );
    a.wait_until("the wake on host a", || a.inbox("s1", "new").len() == 1);
    let state = shown(&b, &id);
    let source = state.to_string();
    assert_eq!(state["status"], "resolved", "{state}");
    b.wait_until("the device's spool emptied", || {
        sshd.remote_names().is_empty()
    });
    // The record names the device, as on one machine.
    let snapshot = a.home.join("../snapshot");
    a.ok(
        "export",
        &a.waitpoint(&["export", snapshot.to_str().unwrap()]),
    );
    let records = invariants::records_of(&snapshot, &id);
    assert_eq!(records.len(), 1, "{source}");
    assert!(
        records[0]["source"]
            .as_str()
            .unwrap()
            .starts_with("device:gpu:"),
        "{records:?}"
    );
    // Any command reaches the cluster with --store, or CORTEX_STORE, without settings.
    let plain = Env::with_settings("{}");
    let by_flag = plain.waitpoint(&["--store", &cluster.url(), "show", &id]);
    assert!(plain.ok("show --store", &by_flag).contains("train"));
    let by_env = plain
        .command(WAITPOINT)
        .env("CORTEX_STORE", cluster.url())
        .args(["show", &id])
        .output()
        .unwrap();
    assert!(
        plain
            .ok("show with CORTEX_STORE", &by_env)
            .contains("train")
    );
}

/// One member of three SIGKILLed mid-storm and left down: the two others keep the quorum, and
/// the daemons and commands go on with them (issue 26, item 9: every request failed `tcp
/// connect error` while one endpoint was down). Then a second member down, the quorum lost:
/// signals stay spooled where they arrived and `doctor` says why; with the members back,
/// everything is applied, once.
#[test]
fn a_member_killed_and_left_down_mid_storm_costs_nothing_and_a_lost_quorum_keeps_signals_spooled() {
    const FILES: usize = 200;
    const LATER: usize = 10;
    let progress = r#","status":"progress""#;
    let mut cluster = Cluster::start();
    let (a, b, _da, _db) = two_hosts(&cluster);
    let (id, secret) = id_secret(&a.arm("storm", &["--session", "s1", "--max-signals", "10000"]));
    let hosts = [(&a, "a"), (&b, "b")];
    let signals = |env: &Env| shown(env, &id)["counters"]["signals"].as_u64().unwrap_or(0);
    // Signal `i` of a storm, named `name`, dropped on a and b in turn.
    let spread = |i: usize, name: &str| {
        let (env, host) = hosts[i % 2];
        drop_on(env, host, name, &id, &secret, progress)
    };
    let mut dropped = Vec::new();
    let mut killed_at = None;
    for i in 0..FILES {
        dropped.push(spread(i, &format!("{i:04}")));
        if i == FILES / 3 {
            // The raft leader, left down for the rest of the storm.
            let first = cluster.leader();
            cluster.kill(first);
            killed_at = Some((first, Instant::now()));
        }
    }
    let (first, since) = killed_at.unwrap();
    let last_drop = Instant::now();
    for env in [&a, &b] {
        env.wait_until_within(
            "the drop zone empty with a member down",
            Duration::from_secs(60),
            || env.spooled().is_empty(),
        );
    }
    a.wait_until("nothing left handed over", || cluster.count("in/") == 0);
    // Read on b, through the CLI, with the member still down.
    assert_eq!(signals(&b), FILES as u64, "{}", log(&a));
    eprintln!(
        "200 signals applied with a member down: {} ms after the kill, {} ms after the last drop",
        since.elapsed().as_millis(),
        last_drop.elapsed().as_millis()
    );

    // A second member down: no quorum. New signals stay where they arrived.
    let second = (0..3).find(|i| *i != first).unwrap();
    let refusals = |env: &Env| log(env).matches("kept for retry").count();
    let before = [refusals(&a), refusals(&b)];
    cluster.kill(second);
    for i in 0..LATER {
        dropped.push(spread(i, &format!("later-{i}")));
    }
    for (env, before) in [&a, &b].into_iter().zip(before) {
        env.wait_until("a refused commit in the log", || refusals(env) > before);
    }
    // Every later file tried on its host and kept for retry: without a quorum, nothing more
    // happens to them.
    for i in 0..LATER {
        let (env, host) = hosts[i % 2];
        let file = format!("file=\"later-{i}.json\"");
        env.wait_until(&format!("later-{i} kept for retry on {host}"), || {
            log(env)
                .lines()
                .any(|l| l.contains("kept for retry") && l.contains(&file))
        });
    }
    assert_eq!(
        a.spooled().len() + b.spooled().len(),
        LATER,
        "all stay spooled"
    );
    let out = a.waitpoint(&["doctor"]);
    let report = a.expect_code("doctor without a quorum", &out, 1);
    let line = report
        .lines()
        .find(|l| l.contains("quorum lost"))
        .unwrap_or_else(|| panic!("doctor does not say the quorum is lost:\n{report}"));
    assert!(
        line.starts_with("FAIL") && line.contains("1 of 3"),
        "{report}"
    );

    // The members back: everything is applied, nothing lost or counted twice.
    let back = Instant::now();
    cluster.restart(first);
    cluster.restart(second);
    for env in [&a, &b] {
        env.wait_until("the spooled signals applied", || env.spooled().is_empty());
    }
    a.wait_until("nothing left handed over", || cluster.count("in/") == 0);
    eprintln!(
        "{LATER} spooled signals applied {} ms after the members were restarted",
        back.elapsed().as_millis()
    );
    dropped.push(drop_on(&b, "b", "end", &id, &secret, ""));
    a.wait_until("the resolved wake on host a", || {
        a.inbox("s1", "new").len() == 1
    });
    assert_eq!(signals(&a), (FILES + LATER + 1) as u64);
    let audit = audit(&a, &[&a, &b]);
    let findings = invariants::check(&audit, &dropped);
    findings.assert_kept("a member down, then the quorum lost");
    assert_eq!(findings.recorded, dropped.len(), "{findings:?}");
    assert_eq!(findings.wakes, 1, "{findings:?}");
}

/// `per` progress signals with the fields `extra` to each of `n` waitpoints armed on leader
/// `a`, dropped on standby `b` before its daemon starts (so its first sweep finds them all at
/// once). Returns, once every one is applied and nothing is left handed over, the cluster's
/// history (`Cluster::events`).
fn standby_burst(n: usize, per: usize, extra: &str) -> Vec<(i64, String, bool)> {
    let cluster = Cluster::start();
    let a = host(&cluster, "a", "");
    let b = host(&cluster, "b", "");
    let _da = a.daemon();
    wait_leading(&a);
    let armed: Vec<(String, String)> = (0..n)
        .map(|i| {
            let flags = ["--session", "s", "--max-signals", "1000"];
            id_secret(&a.arm(&format!("job{i}"), &flags))
        })
        .collect();
    let fields = format!(r#","status":"progress"{extra}"#);
    for k in 0..per {
        for (i, (id, secret)) in armed.iter().enumerate() {
            b.drop_file(&format!("p{k:02}-{i:02}"), &body(id, secret, &fields));
        }
    }
    let _db = b.daemon();
    a.wait_until("every signal applied and nothing left handed over", || {
        b.spooled().is_empty() && cluster.count("rec/") == n * per && cluster.count("in/") == 0
    });
    cluster.events()
}

/// The revisions at which keys under `prefix` were put (`deleted` false) or deleted.
fn revisions(events: &[(i64, String, bool)], prefix: &str, deleted: bool) -> BTreeSet<i64> {
    events
        .iter()
        .filter(|(_, k, d)| k.starts_with(prefix) && *d == deleted)
        .map(|(r, _, _)| *r)
        .collect()
}

#[test]
fn a_burst_a_standby_hands_over_takes_one_transaction_and_is_forgotten_as_it_is_applied() {
    // More signals than one application takes (30).
    let events = standby_burst(40, 1, "");
    let (handed, forgotten, recorded) = (
        revisions(&events, "t/in/", false),
        revisions(&events, "t/in/", true),
        revisions(&events, "t/rec/", false),
    );
    assert_eq!(
        handed.len(),
        1,
        "one transaction hands the burst over (handed over at {handed:?})"
    );
    assert!(
        !forgotten.is_empty() && forgotten.is_subset(&recorded),
        "each handed-over key is deleted by the transaction that records its signal \
         (forgotten at {forgotten:?}, recorded at {recorded:?})"
    );
    assert_eq!(
        events
            .iter()
            .filter(|(_, k, d)| k.starts_with("t/in/") && *d)
            .count(),
        40,
        "every key handed over is forgotten once"
    );
}

#[test]
fn a_burst_bigger_than_one_etcd_request_is_handed_over_in_several() {
    // 110 signals of 15 KB (a signal's data may be 16,000 characters), 1.7 MB in all: more
    // than etcd takes in one request (1.5 MiB), while each application of 30 stays under it.
    let blob = "x".repeat(15_000);
    let events = standby_burst(11, 10, &format!(r#","data":{{"blob":"{blob}"}}"#));
    let handed = revisions(&events, "t/in/", false);
    assert!(
        handed.len() >= 2,
        "the burst is cut into transactions etcd takes (handed over at {handed:?})"
    );
}
