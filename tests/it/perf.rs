//! What the performance work must not break: a group commit decides exactly what one-by-one
//! collection decides and loses or double-counts nothing when a phase fails; the session index
//! stays consistent with the waitpoint files across creates, removals, crashes and rebuilds.

use std::fs;
use std::sync::Arc;

use serde_json::Value;
use waitpoint::engine::{Engine, Verdict};
use waitpoint::home::Home;
use waitpoint::ingress::parse_signal;
use waitpoint::ingress::spool::{FileOutcome, Spool};
use waitpoint::request::Source;
use waitpoint::settings::Settings;

use crate::helpers::*;

/// The same mix of signals for a home: one-shots hit twice (the second is "already
/// resolved"), a monitor hit several times, a barrier with a missing and an unknown member,
/// a wrong secret, an unknown id, and a file name repeated (a duplicate).
fn mixed_batch(e: &Engine) -> Vec<(String, String)> {
    let one = Arming::new("one").session("s").no_fail_fast().on(e);
    let two = Arming::new("two").session("s").no_fail_fast().on(e);
    let monitor = Arming::new("monitor")
        .session("s")
        .max_signals(50)
        .no_fail_fast()
        .on(e);
    let barrier = Arming::new("barrier")
        .session("s")
        .members(&["a", "b"])
        .no_fail_fast()
        .on(e);
    let sig = |(id, secret): &(String, String), extra: &str| body(id, secret, extra);
    let ok = r#","status":"ok""#;
    vec![
        ("01-one".into(), sig(&one, ok)),
        ("02-mon".into(), sig(&monitor, ok)),
        ("03-one-again".into(), sig(&one, ok)),
        (
            "04-bar-a".into(),
            sig(&barrier, r#","status":"ok","member":"a""#),
        ),
        ("05-bar-none".into(), sig(&barrier, ok)),
        (
            "06-bar-zed".into(),
            sig(&barrier, r#","status":"ok","member":"zed""#),
        ),
        ("07-mon".into(), sig(&monitor, r#","status":"progress""#)),
        (
            "08-bad-secret".into(),
            sig(&(two.0.clone(), "0".repeat(64)), ok),
        ),
        (
            "09-unknown".into(),
            sig(&("wp_000000000000".into(), "x".into()), ok),
        ),
        ("10-mon".into(), sig(&monitor, r#","status":"fail""#)),
        ("11-two".into(), sig(&two, ok)),
        (
            "12-bar-b".into(),
            sig(&barrier, r#","status":"ok","member":"b""#),
        ),
        ("13-mon".into(), sig(&monitor, ok)),
    ]
}

/// A verdict with the random ids taken out, so two homes can be compared.
fn shape(v: &Verdict) -> String {
    match v {
        Verdict::Accepted {
            seq, wake, status, ..
        } => format!("accepted seq={seq} wake={wake:?} status={status:?}"),
        Verdict::Duplicate { .. } => "duplicate".into(),
        Verdict::Closed { status, .. } => format!("closed {status:?}"),
        Verdict::Refused(r) => format!("refused {}", r.reason()),
        Verdict::Queued { .. } => "queued".into(),
    }
}

fn outcome_shape(o: &FileOutcome) -> String {
    match o {
        FileOutcome::Consumed(v) => shape(v),
        other => format!("{other:?}"),
    }
}

/// Counters, status and wake count of every waitpoint, by label.
fn summary(e: &Engine) -> Vec<String> {
    let mut all: Vec<String> = e
        .list()
        .unwrap()
        .iter()
        .map(|w| {
            format!(
                "{} {:?} signals={} rounds={} wakes={} outbox={}",
                w.label,
                w.status,
                w.counters.signals,
                w.counters.rounds,
                w.counters.wakes,
                w.outbox.len()
            )
        })
        .collect();
    all.sort();
    all
}

#[test]
fn a_group_commit_decides_what_one_by_one_collection_decides() {
    let (single, batched) = (Env::new(), Env::new());
    let (es, eb) = (single.engine(), batched.engine());
    let files_s = mixed_batch(&es);
    let files_b = mixed_batch(&eb);
    for ((name_s, text_s), (name_b, text_b)) in files_s.iter().zip(&files_b) {
        single.drop_file(name_s, text_s);
        batched.drop_file(name_b, text_b);
    }
    let spool_s = Spool::new(&waitpoint::home::Home::new(&single.home));
    let one_by_one: Vec<String> = spool_s
        .pending()
        .unwrap()
        .iter()
        .map(|n| outcome_shape(&waitpoint::daemon::collect_file(&spool_s, &es, n).unwrap()))
        .collect();
    let spool_b = Spool::new(&waitpoint::home::Home::new(&batched.home));
    let names = spool_b.pending().unwrap();
    let together: Vec<String> = waitpoint::daemon::collect_files(&spool_b, &eb, &names)
        .iter()
        .map(|(_, o)| outcome_shape(o.as_ref().unwrap()))
        .collect();
    assert_eq!(together, one_by_one);
    assert_eq!(summary(&eb), summary(&es));
    assert!(
        together.iter().any(|v| v.starts_with("closed")),
        "{together:#?}"
    );
    assert!(
        together.iter().any(|v| v.starts_with("Parked")),
        "{together:#?}"
    );
    assert_eq!(
        batched.spooled(),
        Vec::<String>::new(),
        "all consumed or parked"
    );
    let wakes = |env: &Env| env.inbox("s", "new").len();
    assert_eq!(wakes(&batched), wakes(&single));
    assert!(
        wakes(&batched) >= 4,
        "one-shots, monitor rounds and the barrier woke"
    );
    // Re-collecting the same names (a crash before the removals) counts nothing twice.
    for (name, text) in &files_b {
        batched.drop_file(name, text);
    }
    let again = waitpoint::daemon::collect_files(&spool_b, &eb, &spool_b.pending().unwrap());
    for (name, o) in &again {
        let o = outcome_shape(o.as_ref().unwrap());
        assert!(
            !o.starts_with("accepted"),
            "{name} counted twice after a replay: {o}"
        );
    }
    assert_eq!(summary(&eb), summary(&es));
}

#[test]
fn a_failed_batch_phase_keeps_every_file_and_the_retry_counts_each_once() {
    let env = Env::new();
    let e = env.engine();
    let ids: Vec<(String, String)> = (0..5)
        .map(|_| Arming::new("t").session("s").no_fail_fast().on(&e))
        .collect();
    for (i, (id, secret)) in ids.iter().enumerate() {
        env.drop_file(&format!("f{i}"), &body(id, secret, r#","status":"ok""#));
    }
    // The inbox cannot be written (its `new` is a file, which cannot be set aside because
    // the quarantine is a link): records and states become durable, delivery fails, so the
    // whole batch must fail and keep its files.
    let wakes = env.home.join("sessions/s/wakes");
    fs::create_dir_all(&wakes).unwrap();
    fs::write(wakes.join("new"), b"in the way").unwrap();
    std::os::unix::fs::symlink("/nonexistent", env.home.join("quarantine")).unwrap();
    let spool = Spool::new(&waitpoint::home::Home::new(&env.home));
    let names = spool.pending().unwrap();
    let first = waitpoint::daemon::collect_files(&spool, &e, &names);
    assert!(first.iter().all(|(_, o)| o.is_err()), "{first:?}");
    assert_eq!(env.spooled().len(), 5, "every file kept");

    fs::remove_file(wakes.join("new")).unwrap();
    fs::remove_file(env.home.join("quarantine")).unwrap();
    // A new engine, as after a restart, and the same engine (the daemon retrying) must both
    // finish the job with each signal counted once and every wake delivered.
    let retry = waitpoint::daemon::collect_files(&spool, &e, &spool.pending().unwrap());
    assert!(retry.iter().all(|(_, o)| o.is_ok()), "{retry:?}");
    assert!(env.spooled().is_empty());
    for (id, _) in &ids {
        let state = env.state(id);
        assert_eq!(state["counters"]["signals"], 1, "{id}");
        assert_eq!(state["status"], "resolved", "{id}");
        assert_eq!(state["outbox"], Value::Array(vec![]), "{id}");
    }
    assert_eq!(env.inbox("s", "new").len(), 5);
}

#[test]
fn a_burst_of_files_through_the_daemon_is_recorded_exactly_once() {
    let env = Env::new();
    let e = env.engine();
    let ids: Vec<(String, String)> = (0..40)
        .map(|_| {
            Arming::new("t")
                .session("s")
                .max_signals(1000)
                .no_fail_fast()
                .on(&e)
        })
        .collect();
    let _d = env.daemon();
    let mut n = 0;
    for round in 0..5 {
        for (i, (id, secret)) in ids.iter().enumerate() {
            env.drop_file(
                &format!("r{round}-{i:03}"),
                &body(id, secret, r#","status":"ok""#),
            );
            n += 1;
        }
    }
    env.wait_until("the burst to be collected", || {
        env.spooled().is_empty()
            && ids
                .iter()
                .map(|(id, _)| env.state(id)["counters"]["signals"].as_u64().unwrap())
                .sum::<u64>()
                == n
    });
    for (id, _) in &ids {
        let state = env.state(id);
        assert_eq!(state["counters"]["signals"], 5, "{id}");
        let records = crate::invariants::records_of(&env.home, id).len();
        assert_eq!(records, 5, "{id}: one record per signal");
    }
}

fn check_ids(env: &Env, session: &str) -> Vec<String> {
    let out = env.waitpoint(&["check", "--session", session, "--json"]);
    let reply: Value = serde_json::from_str(&env.ok("check", &out)).unwrap();
    let mut ids: Vec<String> = reply["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn markers(env: &Env, name: &str) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(env.home.join("index/sessions").join(name))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn the_session_index_follows_creates_and_check_uses_it() {
    let env = Env::new();
    let mine = id_secret(&env.arm("a", &["--session", "me"])).0;
    let routed = id_secret(&env.arm("b", &["--session", "other", "--channel", "me"])).0;
    let theirs = id_secret(&env.arm("c", &["--session", "x"])).0;
    assert_eq!(markers(&env, "me"), {
        let mut v = vec![mine.clone(), routed.clone()];
        v.sort();
        v
    });
    assert_eq!(markers(&env, "other"), vec![routed.clone()]);
    assert_eq!(markers(&env, "x"), vec![theirs.clone()]);

    // Before any daemon ran the index is not known to be complete: check scans.
    assert!(!env.home.join("index/sessions.complete").exists());
    let scanned = check_ids(&env, "me");
    {
        let _d = env.daemon();
        env.wait_until("the index to be marked complete", || {
            env.home.join("index/sessions.complete").exists()
        });
    }
    let indexed = check_ids(&env, "me");
    assert_eq!(indexed, scanned);
    assert_eq!(indexed.len(), 2);

    // Proof that check reads the index once complete: a waitpoint whose markers are gone
    // (something only a bug could do) is invisible to it.
    fs::remove_file(env.home.join("index/sessions/x").join(&theirs)).unwrap();
    assert!(check_ids(&env, "x").is_empty());
}

#[test]
fn the_daemon_rebuilds_a_missing_or_damaged_index_from_the_files() {
    let env = Env::new();
    let e = env.engine();
    let a = Arming::new("t").session("s1").no_fail_fast().on(&e).0;
    let b = Arming::new("t").session("s2").no_fail_fast().on(&e).0;
    // A home from before the index (or a damaged one): markers missing, one dangling marker
    // left by a crash between a removal and its marker's removal.
    fs::remove_dir_all(env.home.join("index")).unwrap();
    fs::create_dir_all(env.home.join("index/sessions/s1")).unwrap();
    fs::write(env.home.join("index/sessions/s1/wp_0123456789ab"), b"").unwrap();
    assert_eq!(
        check_ids(&env, "s1"),
        vec![a.clone()],
        "scan while incomplete"
    );
    {
        let _d = env.daemon();
        env.wait_until("the rebuild", || {
            env.home.join("index/sessions.complete").exists()
        });
    }
    assert_eq!(
        markers(&env, "s1"),
        vec![a.clone()],
        "missing added, dangling pruned"
    );
    assert_eq!(markers(&env, "s2"), vec![b.clone()]);
    assert_eq!(check_ids(&env, "s2"), [b]);
    // Rebuilding again changes nothing.
    assert_eq!(e.rebuild_index().unwrap(), 0);
}

#[test]
fn a_removed_waitpoint_leaves_the_index_and_session_delete_uses_it() {
    let env = Env::new();
    let e = env.engine();
    e.rebuild_index().unwrap();
    let (id, secret) = Arming::new("t").session("gone").no_fail_fast().on(&e);
    let keep = Arming::new("t").session("gone").no_fail_fast().on(&e).0;
    let verdict = e
        .apply_signal(
            &parse_signal(body(&id, &secret, r#","status":"ok""#).as_bytes()).unwrap(),
            &Source::Spool("x.json".into()),
        )
        .unwrap();
    assert!(matches!(verdict, Verdict::Accepted { .. }), "{verdict:?}");
    // Past retention (three days after it resolved), servicing removes it and its marker.
    let later = Engine::new(
        Home::new(&env.home),
        Settings::default(),
        Arc::new(waitpoint::clock::ManualClock::new(
            e.now().plus_ms(waitpoint::engine::RETAIN_MS + 60_000),
        )),
    );
    later.service(&id).unwrap();
    assert!(!env.home.join("waitpoints").join(&id).exists());
    assert_eq!(markers(&env, "gone"), vec![keep.clone()]);
    assert_eq!(e.delete_session("gone").unwrap().waitpoints, [keep]);
}

/// Regression: the daemon of a home scanned every waitpoint twice at start, once itself and
/// once more for the "leading" its store reports at once (seconds at a million armed). The
/// leadership event is queued before "ready" and handled before a signal dropped after it, so
/// once that signal is accepted the count of scans is final.
#[test]
fn a_daemon_scans_every_waitpoint_once_at_start() {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("a", &[]));
    env.arm("b", &[]);
    let _d = env.daemon();
    env.drop_file("after-ready", &body(&id, &secret, ""));
    env.wait_until("the signal applied", || {
        env.state(&id)["status"] == "resolved"
    });
    let log = fs::read_to_string(env.home.join("log/daemon.log")).unwrap();
    let scans = log.matches("scanned every waitpoint").count();
    assert_eq!(scans, 1, "{log}");
    assert!(log.contains("waitpoints=2"), "{log}");
}

/// The inode numbers of a waitpoint's state and of its spare.
fn state_and_spare(env: &Env, id: &str) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let dir = env.home.join("waitpoints").join(id);
    let ino = |name: &str| {
        fs::symlink_metadata(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", env.tree()))
            .ino()
    };
    (
        ino("waitpoint.json"),
        ino(&waitpoint::durable::spare_name("waitpoint.json")),
    )
}

#[test]
fn a_signal_rewrites_the_state_over_its_rested_spare_and_makes_no_file() {
    use waitpoint::durable::SPARE_REST;
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("job", &["--session", "s", "--max-signals", "3"]));
    let (state0, spare0) = state_and_spare(&env, &id);
    let _d = env.daemon();
    let signal = |n: u64| {
        env.drop_file(
            &format!("n{n}"),
            &body(&id, &secret, r#","status":"progress""#),
        );
        env.wait_until("the signal counted", || {
            env.state(&id)["counters"]["signals"] == n
        });
    };
    // A spare at rest is written over and the names swapped: the state is the old spare's
    // file and the spare the old state's, no file made.
    std::thread::sleep(SPARE_REST);
    signal(1);
    assert_eq!(
        state_and_spare(&env, &id),
        (spare0, state0),
        "{}",
        env.tree()
    );
    // At once again: the spare was the state a moment ago and a reader that takes no lock
    // may still hold it, so the new state is a new file and the spare stays as it is.
    signal(2);
    let (state2, spare2) = state_and_spare(&env, &id);
    assert!(
        state2 != state0 && state2 != spare0 && spare2 == state0,
        "a new file for the state, the rested spare kept: {:?}\n{}",
        (state2, spare2),
        env.tree()
    );
    std::thread::sleep(SPARE_REST);
    signal(3);
    assert_eq!(
        state_and_spare(&env, &id),
        (state0, state2),
        "{}",
        env.tree()
    );
}

#[test]
fn the_record_of_a_deleted_session_is_forgotten_once_its_waitpoints_are_gone() {
    use waitpoint::clock::ManualClock;
    let env = Env::new();
    let at = |ms: i64| {
        Engine::new(
            Home::new(&env.home),
            Settings::default(),
            Arc::new(ManualClock::new(T0.plus_ms(ms))),
        )
    };
    let e = at(0);
    Arming::new("t").session("gone").on(&e);
    e.delete_session("gone").unwrap();
    let record = env.home.join("index/deleted/gone.json");
    assert!(record.exists());
    assert_eq!(e.session_deleted_at("gone").unwrap(), Some(T0));
    // Kept while the cancelled waitpoint may still be (three days), and a day more.
    assert_eq!(
        at(waitpoint::engine::RETAIN_MS)
            .gc_deleted_sessions()
            .unwrap(),
        0
    );
    assert!(record.exists());
    let later = at(waitpoint::engine::RETAIN_MS + 86_400_000 + 1);
    assert_eq!(later.gc_deleted_sessions().unwrap(), 1);
    assert!(!record.exists());
    assert_eq!(later.session_deleted_at("gone").unwrap(), None);
}
