//! Failing disks (`--features failpoints`): EIO and ENOSPC injected at each step of each commit,
//! and EMFILE where the drop zone is opened.
//! The commit is aborted and reported, the spool file stays, the daemon logs it and tries again
//! at its next sweep, and once the fault clears the signal lands exactly once. Nothing reports
//! success for a write that failed: not the daemon's log, not `cortex-signal`, not `create`.

use std::fs;
use std::os::unix::process::ExitStatusExt;

use waitpoint::failpoint;

use crate::crash_points::{Faulty, Scenario, held_wake_scenario, scenario};
use crate::helpers::*;
use crate::invariants::{self, settled};

const ERRNO_TEXT: [(&str, &str); 3] = [
    ("eio", "Input/output error"),
    ("enospc", "No space left on device"),
    ("emfile", "Too many open files"),
];

fn log(env: &Env) -> String {
    fs::read_to_string(env.home.join("log/daemon.log")).unwrap_or_default()
}

/// Lines of the daemon's log that report a failed attempt (at a signal file, or at servicing a
/// waitpoint) with this error.
fn failed_attempts(log: &str, errno_text: &str) -> usize {
    log.lines()
        .filter(|l| {
            (l.contains("kept for retry") || l.contains("will retry")) && l.contains(errno_text)
        })
        .count()
}

/// How many times the failpoints fired (each logs a warning).
fn fired(log: &str) -> usize {
    log.matches("failpoint fired").count()
}

/// The pass of `point` numbered `hit` fails with `errno`, three times in a row, then the fault
/// clears. Returns how many failed attempts the daemon logged, or `None` when the run never got
/// to that pass.
fn fault_then_clear(point: &str, errno: &str, hit: usize, scenario: Scenario) -> Option<usize> {
    const FAULTS: usize = 3;
    let text = ERRNO_TEXT.iter().find(|(e, _)| *e == errno).unwrap().1;
    let env = Env::new();
    let dropped = scenario(&env);
    let spec = format!("{point}={hit}*off->{FAULTS}*return({errno})");
    let mut d = Faulty::start(&env, &spec);
    let outcome = d.wait(&env, || settled(&env));
    assert_eq!(outcome, None, "{spec}: the daemon died\n{}", log(&env));
    drop(d);
    let log = log(&env);
    let failures = failed_attempts(&log, text);
    let f = invariants::check(&env, &dropped);
    f.assert_kept(&format!("{spec}\n{log}"));
    assert_eq!(f.recorded, 3, "{spec}: each signal recorded once\n{log}");
    if failures == 0 {
        assert!(
            !log.contains(text),
            "{spec}: a fault nobody reported as a failed attempt\n{log}"
        );
        return None;
    }
    // A fault inside a group commit fails every file of the batch, so each fault is reported
    // once per file it held back: at least once, and never more often than the batch was big.
    let injected = fired(&log);
    assert!(
        failures >= injected && failures <= injected * 3,
        "{spec}: every injected fault is reported as a failed attempt, then tried again \
({failures} reports for {injected} faults)\n{log}"
    );
    assert!(injected <= FAULTS, "{spec}\n{log}");
    // Per file: success is logged at most once, and never before a failed attempt at recording
    // the same file (which would mean an attempt was called a success and then undone). A
    // failure to remove the spool file afterwards does not undo anything: the signal was
    // durable when it was reported accepted, and the retry finds it recorded.
    for d in &dropped {
        let tag = format!("file={:?}", d.name);
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(&tag)).collect();
        let accepted: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains("signal accepted"))
            .collect();
        assert!(
            accepted.len() <= 1,
            "{spec}: {} accepted twice\n{log}",
            d.name
        );
        if let (Some(&ok), Some(last_failure)) = (
            accepted.first(),
            lines
                .iter()
                .rposition(|l| l.contains("kept for retry") && !l.contains("cannot remove")),
        ) {
            assert!(
                ok > last_failure,
                "{spec}: {} was reported accepted by an attempt that failed\n{log}",
                d.name
            );
        }
    }
    Some(failures)
}

/// Walks every pass of `point` with `errno`, and reports how many faults were survived. The
/// minimums are the passes the scenario's three signals make when collected as one group commit.
fn walk(point: &str, errno: &str, min: usize) {
    walk_of(point, errno, min, scenario);
}

/// [`walk`] on another scenario.
fn walk_of(point: &str, errno: &str, min: usize, scenario: Scenario) {
    let mut faulted = 0;
    for hit in 0.. {
        assert!(hit < 64, "{point}: still failing after 64 passes");
        match fault_then_clear(point, errno, hit, scenario) {
            Some(_) => faulted += 1,
            None => break,
        }
    }
    assert!(
        faulted >= min,
        "{point}: {faulted} passes faulted; expected at least {min}"
    );
    invariants::report(
        &format!("3-fault-{point}-{errno}"),
        &[(
            &format!(
                "{} at `{point}`: passes faulted (up to 3 failed attempts each), all recovered",
                errno.to_uppercase()
            ),
            faulted.to_string(),
        )],
    );
}

#[test]
fn enospc_writing_any_commit_is_retried_until_space_returns() {
    walk(failpoint::STORE_WRITE, "enospc", 4);
}

#[test]
fn eio_on_fsync_of_any_commit_is_retried_until_the_disk_recovers() {
    walk_of(failpoint::STORE_FSYNC, "eio", 3, held_wake_scenario);
}

#[test]
fn eio_on_rename_of_any_commit_is_retried() {
    walk(failpoint::STORE_RENAME, "eio", 4);
}

#[test]
fn eio_on_the_directory_fsync_of_any_commit_is_retried() {
    walk_of(failpoint::STORE_DIR_FSYNC, "eio", 3, held_wake_scenario);
}

#[test]
fn enospc_appending_to_the_journal_is_retried() {
    walk(failpoint::JOURNAL_WRITE, "enospc", 1);
}

#[test]
fn eio_on_the_journal_fsync_is_cut_off_and_retried() {
    walk(failpoint::JOURNAL_FSYNC, "eio", 1);
}

#[test]
fn eio_writing_the_files_of_a_journaled_batch_is_replayed_not_lost() {
    walk(failpoint::ENGINE_AFTER_JOURNAL, "eio", 1);
}

#[test]
fn eio_removing_the_spool_file_keeps_it_for_the_retry() {
    walk(failpoint::SPOOL_BEFORE_REMOVE, "eio", 1);
}

/// Issue 26 (7): out of descriptors when a batch opens the drop zone, the files stay spooled,
/// the failure is reported as such (not as an insecure home), and the retry records each once.
#[test]
fn emfile_opening_the_drop_zone_keeps_every_file_for_the_retry() {
    walk(failpoint::SPOOL_OPEN, "emfile", 1);
}

#[test]
fn a_full_disk_that_stays_full_keeps_every_file_and_the_daemon_up() {
    let env = Env::new();
    let dropped = scenario(&env);
    let before = env.state(&dropped[0].waitpoint);
    let mut d = Faulty::start(&env, &format!("{}=return(enospc)", failpoint::STORE_WRITE));
    env.wait_until("several failed sweeps", || {
        failed_attempts(&log(&env), "No space left on device") >= 6
    });
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon stays up");
    assert_eq!(env.spooled().len(), 3, "every file is kept");
    assert_eq!(
        env.state(&dropped[0].waitpoint),
        before,
        "the state is untouched"
    );
    assert!(!log(&env).contains("signal accepted"));
    drop(d);
    // Space is back (a daemon without the fault): everything lands once.
    let _d = env.daemon();
    env.wait_until("settled", || settled(&env));
    let f = invariants::check(&env, &dropped);
    f.assert_kept("after the disk had room again");
    assert_eq!(f.recorded, 3);
}

#[test]
fn cortex_signal_on_a_full_disk_fails_and_leaves_nothing() {
    let env = Env::new();
    let reply = env.arm("t", &[]);
    let (id, secret) = id_secret(&reply);
    let out = env
        .command(CORTEX_SIGNAL)
        .args(["--id", &id, "--secret", &secret])
        .env(
            "FAILPOINTS",
            format!("{}=return(enospc)", failpoint::STORE_WRITE),
        )
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", env.report(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(env.spooled().is_empty(), "no half-written spool file");
    assert!(invariants::temp_files(&env.drop_zone()).is_empty());
}

#[test]
fn create_on_a_failing_disk_fails_and_arms_nothing() {
    let env = Env::new();
    let out = env
        .command(WAITPOINT)
        .args(["create", "--label", "t", "--intent", "i"])
        .env(
            "FAILPOINTS",
            format!("{}=return(eio)", failpoint::STORE_FSYNC),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", env.report(&out));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("wp_"),
        "no id or secret handed out for a waitpoint that was not stored"
    );
    let left: Vec<_> = fs::read_dir(env.home.join("waitpoints"))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "nothing armed, no staging left: {left:?}");
}

#[test]
fn without_inotify_the_daemon_runs_on_the_sweep_alone_and_doctor_says_so() {
    let no_watcher = format!("{}=return(emfile)", failpoint::WATCHER);
    let env = Env::new();
    let _d = env.daemon_with_env(&[("FAILPOINTS", &no_watcher)]);
    let log = fs::read_to_string(env.home.join("log/daemon.log")).unwrap();
    assert!(
        log.contains("finding signals by the sweep alone") && log.contains("sweep_ms=300"),
        "{log}"
    );
    let reply = env.arm("t", &[]);
    let (id, _) = id_secret(&reply);
    env.ok("job", &env.job_then(true, &line(&reply, "cli"), None));
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    let doctor = env
        .command(WAITPOINT)
        .arg("doctor")
        .env("FAILPOINTS", &no_watcher)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    let inotify = report
        .lines()
        .find(|l| l.contains("inotify"))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        inotify.starts_with("WARN") && inotify.contains("sweep alone"),
        "{report}"
    );

    // With the sweep off as well, nothing would ever be collected: it says so and stops.
    let off = Env::with_settings(r#"{"waitpointSweepMs": 0}"#);
    let out = off
        .command(WAITPOINT)
        .arg("daemon")
        .env("FAILPOINTS", &no_watcher)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", off.report(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing would ever be collected"));
}

#[test]
fn wait_and_next_past_the_inotify_limit_look_again_instead_of_failing() {
    let no_watcher = format!("{}=return(emfile)", failpoint::WATCHER);
    let env = Env::new();
    let reply = env.arm("t", &[]);
    let (id, _) = id_secret(&reply);
    let spawn = |args: &[&str]| {
        env.command(WAITPOINT)
            .args(args)
            .env("FAILPOINTS", &no_watcher)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Both start watching before the signal exists: they must see it by looking again.
    let wait = spawn(&["wait", &id, "--timeout", "120"]);
    let next = spawn(&["next", "--timeout", "120", "--json"]);
    let _d = env.daemon();
    env.ok("job", &env.job_then(true, &line(&reply, "cli"), None));
    let wait = wait.wait_with_output().unwrap();
    assert_eq!(wait.status.code(), Some(0), "{}", env.report(&wait));
    let next = next.wait_with_output().unwrap();
    assert_eq!(next.status.code(), Some(0), "{}", env.report(&next));
    assert!(
        String::from_utf8_lossy(&next.stdout).contains(&id),
        "{}",
        env.report(&next)
    );
}

#[test]
fn a_signal_whose_journal_line_is_durable_gets_its_202_even_when_its_files_fail_and_a_retry_counts_once()
 {
    use crate::http::{raw, request};
    let env = Env::new();
    // The first batch's files fail after its journal line is durable.
    let fault = format!("{}=1*return(enospc)", failpoint::ENGINE_AFTER_JOURNAL);
    let _d = env.daemon_with(&["--http", "--port", "0"], &[("FAILPOINTS", &fault)]);
    let port = env.webhook_port();
    let reply = env.arm("t", &["--max-signals", "10"]);
    let (id, secret) = id_secret(&reply);
    let body = format!(r#"{{"id":"{id}","secret":"{secret}","status":"progress"}}"#);
    let post = || {
        raw(
            port,
            &request(
                port,
                "POST",
                "/webhook/signal",
                &["Idempotency-Key: retry-1"],
                &body,
            ),
        )
    };
    // The answer waits for the journal line alone: durable there, the signal is accepted,
    // whatever became of the files written after it (the store replays them).
    let (code, text) = post();
    assert_eq!(code, 202, "{text}");
    assert!(!text.contains("duplicate"), "{text}");
    // The retry under the same key is a duplicate, and it counts once.
    let (code, text) = post();
    assert_eq!(code, 202, "{text}");
    assert!(
        text.contains("duplicate"),
        "the first attempt was recorded after all: {text}"
    );
    assert_eq!(env.state(&id)["counters"]["signals"], 1);
}

/// The session's callbacks as `callback list --json` shows them: (id, status, default).
fn callbacks_of(env: &Env, session: &str) -> Vec<(String, String, bool)> {
    let list = env.ok(
        "callback list",
        &env.waitpoint(&["callback", "list", "--session", session, "--json"]),
    );
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    let items = v
        .as_array()
        .cloned()
        .or_else(|| v["callbacks"].as_array().cloned())
        .unwrap_or_default();
    items
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap_or_default().to_owned(),
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["default"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

#[test]
fn a_callback_reset_killed_after_its_commit_leaves_exactly_one_active_default() {
    let env = Env::new();
    let reset = ["callback", "reset", "--session", "s", "--json"];
    env.ok("first reset", &env.waitpoint(&reset));
    let before = callbacks_of(&env, "s");
    assert_eq!(before.len(), 1, "{before:?}");

    // Killed with the revocation and the replacement committed as one intent, neither file
    // written: readers see both, and the next transaction writes them out.
    let out = env
        .command(WAITPOINT)
        .args(reset)
        .env(
            "FAILPOINTS",
            format!("{}=return(crash)", failpoint::DOCS_AFTER_INTENT),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", env.report(&out));
    let after = callbacks_of(&env, "s");
    let active: Vec<_> = after.iter().filter(|c| c.1 == "active" && c.2).collect();
    assert_eq!(active.len(), 1, "{after:?}\n{}", env.tree());
    assert_ne!(
        active[0].0, before[0].0,
        "the replacement is the active one"
    );

    env.ok("reset again", &env.waitpoint(&reset));
    let last = callbacks_of(&env, "s");
    assert_eq!(
        last.iter().filter(|c| c.1 == "active" && c.2).count(),
        1,
        "{last:?}"
    );
    assert!(
        !env.home.join("callbacks/.intent.json").exists(),
        "{}",
        env.tree()
    );
    invariants::report(
        "callback-reset-crash",
        &[(
            "crash after a callback reset's one commit: active default callbacks after the kill",
            active.len().to_string(),
        )],
    );
}
