//! The write-ahead journal: what a batch's line holds, and the replay that rebuilds the files a
//! power cut lost. The engine is driven in-process without a checkpointer, so the journal is
//! left on disk as a crash would leave it; the losses of a power cut (files written without
//! fsync) are made by hand.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::process::Signal;
use serde_json::Value;
use waitpoint::clock::SystemClock;
use waitpoint::engine::{Engine, Verdict};
use waitpoint::home::Home;
use waitpoint::ingress::{SpoolBody, parse_spool_body};
use waitpoint::request::{SignalRequest, Source};
use waitpoint::settings::Settings;

use crate::helpers::*;
use crate::layouts::Schemas;

fn engine(home: &Home) -> Engine {
    Engine::new(home.clone(), Settings::default(), Arc::new(SystemClock))
}

/// An `ok` signal for `id` as the drop zone would hand it over, from a file named `file`.
fn item(id: &str, secret: &str, file: &str) -> (SignalRequest, Source) {
    let SpoolBody::Signal(req) = parse_spool_body(body(id, secret, "").as_bytes()).unwrap() else {
        panic!("a signal body");
    };
    (req, Source::Spool(file.into()))
}

/// Applies one `ok` signal named `file` (a batch of one) and checks it was accepted.
fn signal(e: &Engine, id: &str, secret: &str, file: &str) {
    let (req, source) = item(id, secret, file);
    let verdict = e.apply_signal(&req, &source).unwrap();
    assert!(matches!(verdict, Verdict::Accepted { .. }), "{verdict:?}");
}

fn segments(home: &Home) -> Vec<PathBuf> {
    let mut s: Vec<PathBuf> = fs::read_dir(home.journal_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    s.sort();
    s
}

fn lines(home: &Home) -> Vec<Value> {
    segments(home)
        .iter()
        .flat_map(|p| {
            fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<Value>>()
        })
        .collect()
}

fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

/// A home (in `dir`) with a monitor for five reports; returns the home, an engine without a
/// checkpointer, the id and the secret.
fn monitor(dir: &Path) -> (Home, Engine, String, String) {
    let home = Home::new(dir);
    home.ensure().unwrap();
    let e = engine(&home);
    let (id, secret) = Arming::new("journal").max_signals(5).no_fail_fast().on(&e);
    (home, e, id, secret)
}

#[test]
fn a_batch_is_one_journal_line_that_matches_its_layout_and_holds_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (home, e, id, secret) = monitor(dir.path());
    signal(&e, &id, &secret, "a.json");
    let batch = [item(&id, &secret, "b.json"), item(&id, &secret, "c.json")];
    for verdict in e.apply_batch(&batch) {
        assert!(
            matches!(verdict, Ok(Verdict::Accepted { .. })),
            "{verdict:?}"
        );
    }
    let entries = lines(&home);
    assert_eq!(entries.len(), 2, "one line per batch, not per signal");
    let first = &entries[0]["changes"][0];
    assert_eq!(
        first["wakes"].as_array().unwrap().len(),
        1,
        "a monitor wakes per report"
    );
    let change = &entries[1]["changes"][0];
    assert_eq!(change["state"]["counters"]["signals"], 3);
    let sources: Vec<&Value> = change["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["source"])
        .collect();
    assert_eq!(sources, ["spool:b.json", "spool:c.json"]);
    let schemas = Schemas::load();
    for (i, entry) in entries.iter().enumerate() {
        let path = dir.path().join(format!("entry-{i}.json"));
        fs::write(&path, entry.to_string()).unwrap();
        schemas.check("journal-entry", &path);
    }
    for segment in segments(&home) {
        let text = fs::read_to_string(&segment).unwrap();
        assert!(
            !text.contains(&secret),
            "the plaintext secret is in {segment:?}"
        );
    }
}

#[test]
fn replay_rewrites_what_a_power_cut_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (home, e, id, secret) = monitor(dir.path());
    let state_before = fs::read(home.waitpoint_file(&id)).unwrap();
    signal(&e, &id, &secret, "a.json");
    let state_after: Value =
        serde_json::from_slice(&fs::read(home.waitpoint_file(&id)).unwrap()).unwrap();
    let log = home.signal_log(&id);
    let logged = fs::read(&log).unwrap();
    assert_eq!(
        logged.iter().filter(|b| **b == b'\n').count(),
        1,
        "one record line"
    );
    let wake = only_file(&home.inbox_new("default"));
    let wake_bytes = fs::read(&wake).unwrap();
    drop(e);
    // None of the three files was fsynced: a power cut may lose the record's line, leave the
    // wake empty (its name made it, its data did not) and keep the state from before.
    fs::write(&log, b"").unwrap();
    fs::write(&wake, b"").unwrap();
    fs::write(home.waitpoint_file(&id), &state_before).unwrap();

    let replayed = engine(&home).recover_store().unwrap();
    assert_eq!(replayed, 1);
    assert_eq!(
        fs::read(&log).unwrap(),
        logged,
        "the record is written again"
    );
    assert_eq!(
        fs::read(&wake).unwrap(),
        wake_bytes,
        "the wake is written again"
    );
    let state: Value =
        serde_json::from_slice(&fs::read(home.waitpoint_file(&id)).unwrap()).unwrap();
    assert_eq!(state, state_after, "the state is the batch's");
    assert!(
        segments(&home).is_empty(),
        "a replay ends with a checkpoint"
    );
}

#[test]
fn replay_never_rolls_back_a_change_made_after_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (home, e, id, secret) = monitor(dir.path());
    signal(&e, &id, &secret, "a.json");
    // Cancelled (a durable commit of its own) while the batch's line is still in the journal.
    e.cancel(&id, "default").unwrap();
    let cancelled = fs::read(home.waitpoint_file(&id)).unwrap();
    // A reader took the batch's wake (and the cancel's) meanwhile.
    let cur = home.inbox_cur("default");
    fs::create_dir_all(&cur).unwrap();
    for wake in fs::read_dir(home.inbox_new("default")).unwrap().flatten() {
        fs::rename(wake.path(), cur.join(wake.file_name())).unwrap();
    }
    drop(e);
    let replayed = engine(&home).recover_store().unwrap();
    assert_eq!(replayed, 1, "the batch's line was still there to replay");
    assert_eq!(
        fs::read(home.waitpoint_file(&id)).unwrap(),
        cancelled,
        "the cancel stands"
    );
    assert_eq!(
        fs::read_dir(home.inbox_new("default")).unwrap().count(),
        0,
        "a wake a reader took does not come back"
    );
}

#[test]
fn the_daemon_replays_the_journal_at_start_and_a_clean_stop_leaves_it_empty() {
    let env = Env::new();
    let (home, e, id, secret) = monitor(&env.home);
    let state_before = fs::read(home.waitpoint_file(&id)).unwrap();
    signal(&e, &id, &secret, "a.json");
    drop(e);
    // The power cut lost every file of the batch; only its journal line survived.
    fs::write(home.signal_log(&id), b"").unwrap();
    fs::remove_file(only_file(&home.inbox_new("default"))).unwrap();
    fs::write(home.waitpoint_file(&id), &state_before).unwrap();
    let mut d = env.daemon();
    env.wait_until("the replayed wake", || {
        env.inbox("default", "new").len() == 1
    });
    assert_eq!(env.state(&id)["counters"]["signals"], 1);
    d.send(Signal::TERM);
    let (code, stderr) = d.wait_exit();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        segments(&home).is_empty(),
        "a clean stop leaves the journal empty"
    );
    let log = fs::read_to_string(home.signal_log(&id)).unwrap();
    assert_eq!(log.lines().count(), 1, "{log}");
}

#[test]
fn replay_writes_a_log_an_append_cut_short_again_without_the_cut_line() {
    let dir = tempfile::tempdir().unwrap();
    let (home, e, id, secret) = monitor(dir.path());
    signal(&e, &id, &secret, "a.json");
    let log = home.signal_log(&id);
    let logged = fs::read(&log).unwrap();
    drop(e);
    // A crash in the middle of the append: half of the record's line made it to the disk.
    fs::write(&log, &logged[..logged.len() / 2]).unwrap();
    // A reader meanwhile sees no record rather than a damaged one.
    assert!(engine(&home).read_signals(&id, 1).unwrap().is_empty());

    assert_eq!(engine(&home).recover_store().unwrap(), 1);
    assert_eq!(
        fs::read(&log).unwrap(),
        logged,
        "the log is whole again, with the record once"
    );
    let records = engine(&home).read_signals(&id, 1).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].seq, 1);
}

#[test]
fn a_command_after_a_daemon_died_replays_the_journal_first_so_neither_change_is_lost() {
    let env = Env::new();
    let (home, e, id, secret) = monitor(&env.home);
    let state_before = fs::read(home.waitpoint_file(&id)).unwrap();
    signal(&e, &id, &secret, "a.json");
    drop(e);
    // The power cut kept the state from before the batch; only the journal line knows better.
    fs::write(home.waitpoint_file(&id), &state_before).unwrap();
    // Without the replay first, the cancel would be made on the stale state, and the replay
    // at the next start would then bring the waitpoint back (it counts more signals).
    env.ok("cancel", &env.waitpoint(&["cancel", &id]));
    let state = env.state(&id);
    assert_eq!(state["status"], "cancelled");
    assert_eq!(state["counters"]["signals"], 1, "the report still counts");
    assert!(
        segments(&home).is_empty(),
        "the command replayed and checkpointed"
    );
}

#[test]
fn a_damaged_line_inside_a_segment_stops_the_daemon_until_the_segment_is_set_aside() {
    let env = Env::new();
    let (home, e, id, secret) = monitor(&env.home);
    signal(&e, &id, &secret, "a.json");
    signal(&e, &id, &secret, "b.json");
    drop(e);
    // The first of the two committed lines damaged in place (a bad sector, a stray write):
    // not a torn tail, and it may be a batch already answered as committed.
    let seg = segments(&home).pop().unwrap();
    let mut bytes = fs::read(&seg).unwrap();
    bytes[10] = 0;
    fs::write(&seg, &bytes).unwrap();
    let name = seg.file_name().unwrap().to_string_lossy().into_owned();

    // Bounded: a daemon that started despite the damage would otherwise run on.
    let out = env.run("timeout", &["30", WAITPOINT, "daemon"]);
    let said = stderr_of(&out);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&name) && said.contains("line 1 is damaged"),
        "{said}"
    );
    let out = env.waitpoint(&["doctor"]);
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        report.contains("FAIL journal") && report.contains("line 1 is damaged"),
        "{report}"
    );
    assert_ne!(out.status.code(), Some(0));

    // Set aside as doctor says, the daemon starts and the waitpoint answers from its files.
    fs::create_dir_all(home.quarantine_dir()).unwrap();
    fs::rename(&seg, home.quarantine_dir().join(&name)).unwrap();
    let _d = env.daemon();
    env.ok("show", &env.waitpoint(&["show", &id]));
}
