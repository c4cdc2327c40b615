//! The crash-point matrix (`--features failpoints`): for every failpoint on a signal's way
//! through the engine, crash the daemon there on its first, second, third... pass, restart it,
//! and check every promise in `invariants`. A point is walked until the daemon gets through a
//! whole run without reaching it again, so every commit of every signal is cut once.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Stdio};
use std::time::Instant;

use rustix::process::{Pid, Signal, kill_process};
use waitpoint::failpoint;

use crate::helpers::*;
use crate::invariants::{self, Dropped, settled};

/// A daemon started with `FAILPOINTS` set, not waited on: it may die during its first drain.
pub struct Faulty {
    pub child: Child,
}

impl Faulty {
    pub fn start(env: &Env, failpoints: &str) -> Faulty {
        let child = env
            .command(WAITPOINT)
            .arg("daemon")
            .env("FAILPOINTS", failpoints)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn daemon");
        Faulty { child }
    }

    /// Waits until the daemon dies or `done` holds while it still runs. `Some(signal)` when it
    /// died (the signal that killed it, if one did).
    pub fn wait(&mut self, env: &Env, mut done: impl FnMut() -> bool) -> Option<Option<i32>> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status.signal());
            }
            if done() {
                // Done while running, unless it died in between.
                return self.child.try_wait().unwrap().map(|s| s.signal());
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the daemon neither crashed nor finished\n{}",
                env.tree()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Faulty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A monitor for two reports, and three signals for it: a heartbeat (record and state), a
/// report (record, state with the wake in the outbox, inbox, state with the outbox cleared), and
/// the resolving one (the same again). Returns the dropped files.
pub fn scenario(env: &Env) -> Vec<Dropped> {
    let reply = env.arm("crash", &["--max-signals", "2"]);
    let (id, secret) = id_secret(&reply);
    let mut dropped = Vec::new();
    for (n, status) in ["progress", "ok", "fail"].iter().enumerate() {
        let name = format!("{n:03}-{status}");
        env.drop_file(
            &name,
            &body(
                &id,
                &secret,
                &format!(r#","status":"{status}","message":"m{n}""#),
            ),
        );
        dropped.push(Dropped {
            name: format!("{name}.json"),
            waitpoint: id.clone(),
        });
    }
    dropped
}

/// A barrier of three members with a quorum of two, and one signal from each: a and b resolve
/// it, c's report lands in the grace window, and the held wake goes out 3 s later through the
/// durable commits (state with the wake in its outbox, inbox file, state with the outbox
/// cleared) rather than the journal. Returns the dropped files.
pub fn held_wake_scenario(env: &Env) -> Vec<Dropped> {
    let reply = env.arm(
        "grace",
        &[
            "--member", "a", "--member", "b", "--member", "c", "--quorum", "2",
        ],
    );
    let (id, secret) = id_secret(&reply);
    let mut dropped = Vec::new();
    for (n, m) in ["a", "b", "c"].iter().enumerate() {
        let name = format!("{n:03}-{m}");
        env.drop_file(&name, &body(&id, &secret, &format!(r#","member":"{m}""#)));
        dropped.push(Dropped {
            name: format!("{name}.json"),
            waitpoint: id.clone(),
        });
    }
    dropped
}

/// Sets up a home and returns the files its daemon must account for.
pub type Scenario = fn(&Env) -> Vec<Dropped>;

/// Crashes at `point` on each of its passes in turn; returns how many crashes there were.
fn walk(point: &str, scenario: Scenario) -> usize {
    let mut crashes = 0;
    for hit in 0.. {
        assert!(hit < 64, "{point}: still crashing after 64 passes");
        let env = Env::new();
        let dropped = scenario(&env);
        let spec = format!("{point}={hit}*off->return(crash)");
        let mut d = Faulty::start(&env, &spec);
        match d.wait(&env, || settled(&env)) {
            None => {
                // This pass was never reached: the daemon finished the whole run.
                drop(d);
                let f = invariants::check(&env, &dropped);
                f.assert_kept(&format!("{spec}: the run without a crash"));
                return crashes;
            }
            Some(signal) => {
                assert_eq!(
                    signal,
                    Some(Signal::KILL.as_raw()),
                    "{spec}: the daemon died, but not by the failpoint\n{}",
                    env.tree()
                );
                crashes += 1;
            }
        }
        restart_and_check(&env, &dropped, &spec);
    }
    unreachable!()
}

/// After a crash under `spec`: a daemon started and stopped cleanly must have kept every
/// promise, with the scenario's three signals each recorded once.
fn restart_and_check(env: &Env, dropped: &[Dropped], spec: &str) {
    let mut after = env.daemon();
    env.wait_until("the restarted daemon to settle", || settled(env));
    after.send(Signal::TERM);
    let (code, stderr) = after.wait_exit();
    assert_eq!(code, Some(0), "{spec}: {stderr}");
    let f = invariants::check(env, dropped);
    f.assert_kept(&format!("crash at {spec}, then a restart"));
    assert_eq!(f.recorded, 3, "{spec}: all three signals recorded once");
}

/// Walks one point, checks it was crossed at least `min` times, and adds its row to the report.
/// The minimums are what the scenario's three signals cross when the daemon collects them as
/// one group commit (a phase's files share the store points, and each engine point is crossed
/// once per batch), so a point the daemon stopped crossing fails the row.
fn matrix_row(point: &str, min: usize) {
    matrix_row_of(point, min, scenario);
}

fn matrix_row_of(point: &str, min: usize, scenario: Scenario) {
    let crashes = walk(point, scenario);
    assert!(
        crashes >= min,
        "{point}: crashed {crashes} times; every signal that passes it should have crashed there"
    );
    invariants::report(
        &format!("2-crash-{point}"),
        &[(
            &format!("crash point `{point}`: crashes, restarts with every promise kept"),
            crashes.to_string(),
        )],
    );
}

/// A crash in the checkpoint, after the `syncfs` and before the covered segments are deleted
/// (here the last checkpoint of a clean stop): the restart replays segments whose files are all
/// on disk already, which must change nothing and count nothing twice.
#[test]
fn crash_in_the_checkpoint_before_the_segments_are_deleted() {
    let env = Env::new();
    let dropped = scenario(&env);
    let spec = format!("{}=return(crash)", failpoint::JOURNAL_CHECKPOINT);
    let mut d = Faulty::start(&env, &spec);
    assert_eq!(
        d.wait(&env, || settled(&env)),
        None,
        "{spec}: settled first"
    );
    let before = invariants::check(&env, &dropped);
    before.assert_kept(&format!("{spec}: before the stop"));
    // kill(2) cannot fail on our own child before it is reaped (a zombie included): unchecked.
    let _ = kill_process(Pid::from_child(&d.child), Signal::TERM);
    assert_eq!(
        d.wait(&env, || false),
        Some(Some(Signal::KILL.as_raw())),
        "{spec}: the stop's checkpoint crashed"
    );
    assert!(
        env.files()
            .iter()
            .any(|p| p.starts_with(env.home.join("journal"))),
        "the covered segment survived the crash"
    );
    restart_and_check(&env, &dropped, &spec);
    assert!(
        env.files()
            .iter()
            .all(|p| !p.starts_with(env.home.join("journal"))),
        "the restart replayed and the clean stop emptied the journal"
    );
    invariants::report(
        &format!("2-crash-{}", failpoint::JOURNAL_CHECKPOINT),
        &[(
            &format!(
                "crash point `{}`: crashes, restarts with every promise kept",
                failpoint::JOURNAL_CHECKPOINT
            ),
            "1".into(),
        )],
    );
}

// One test per point, so they run in parallel. The three signals of `scenario` are one batch:
// one journal line, then its files (two records and the state, then the third record, the state
// and the wake: each file passes `store-write` and `store-rename`). The durable `Root::commit`
// points are walked on the held wake, which goes out through three durable commits.
#[test]
fn crash_after_write_before_fsync() {
    matrix_row_of(failpoint::STORE_FSYNC, 3, held_wake_scenario);
}

#[test]
fn crash_before_writing_the_temp_file() {
    matrix_row(failpoint::STORE_WRITE, 4);
}

#[test]
fn crash_after_fsync_before_rename() {
    // Records are appended to their waitpoint's log: they cross `store-write`, not this one.
    matrix_row(failpoint::STORE_RENAME, 3);
}

#[test]
fn crash_after_rename_before_the_directory_fsync() {
    matrix_row_of(failpoint::STORE_DIR_FSYNC, 3, held_wake_scenario);
}

#[test]
fn crash_before_the_journal_line_is_written() {
    matrix_row(failpoint::JOURNAL_WRITE, 1);
}

#[test]
fn crash_after_the_journal_line_is_written_before_its_fsync() {
    matrix_row(failpoint::JOURNAL_FSYNC, 1);
}

#[test]
fn crash_after_the_journal_commit_before_any_file_is_written() {
    matrix_row(failpoint::ENGINE_AFTER_JOURNAL, 1);
}

#[test]
fn crash_between_inbox_delivery_and_clearing_the_outbox() {
    matrix_row_of(failpoint::ENGINE_AFTER_DELIVERY, 1, held_wake_scenario);
}

#[test]
fn crash_between_the_state_replace_and_the_spool_removal() {
    matrix_row(failpoint::SPOOL_BEFORE_REMOVE, 1);
}

/// A report that lands inside a barrier's grace window (after the quorum resolved it), and a
/// crash once the batch carrying it is in the journal but none of its files is written: the
/// restart's replay must still count it, and the held wake, released later, carry it.
#[test]
fn crash_recording_a_report_inside_the_grace_window() {
    let env = Env::new();
    let dropped = held_wake_scenario(&env);
    let id = dropped[0].waitpoint.clone();
    // The three files are collected as one group commit: the crash comes once the batch is
    // durable in the journal and none of its files is written, so the restart has to replay
    // c's report into a waitpoint that a and b resolved (the grace window).
    let spec = format!("{}=return(crash)", failpoint::ENGINE_AFTER_JOURNAL);
    let mut d = Faulty::start(&env, &spec);
    assert_eq!(
        d.wait(&env, || settled(&env)),
        Some(Some(Signal::KILL.as_raw())),
        "{spec}: crashed after the journal commit"
    );
    // Nothing but the journal line is on disk: the restart has to replay it, c's report
    // inside the grace window a and b opened.
    assert_eq!(env.state(&id)["status"], "armed");
    assert_eq!(env.state(&id)["counters"]["signals"], 0);
    let _after = env.daemon();
    env.wait_until("the held wake to go out", || settled(&env));
    let f = invariants::check(&env, &dropped);
    f.assert_kept(&spec);
    assert_eq!(
        f.recorded, 3,
        "c's report, recorded in the grace window, counts"
    );
    let wake = env.inbox("default", "new").remove(0);
    assert_eq!(wake["reports"].as_array().unwrap().len(), 3, "{wake}");
    invariants::report(
        "2-crash-grace",
        &[(
            "crash after recording a report inside a grace window: counted, carried by the wake",
            "1 of 1".into(),
        )],
    );
}
