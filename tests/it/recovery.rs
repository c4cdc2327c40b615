//! Crashes and restarts lose nothing and count nothing twice.

use std::fs;
use std::sync::Arc;

use rustix::process::Signal;
use serde_json::Value;

use waitpoint::clock::SystemClock;
use waitpoint::engine::{Engine, Verdict};
use waitpoint::home::Home;
use waitpoint::ingress::parse_signal;
use waitpoint::request::Source;
use waitpoint::settings::Settings;

use crate::helpers::*;
use crate::invariants;

/// Writes the signal record a daemon killed right after recording `name` leaves behind (the
/// state never replaced), stamped now as a real one would be.
fn record_without_state(env: &Env, id: &str, seq: u64, name: &str, member: Option<&str>) {
    let record = serde_json::json!({
        "seq": seq, "source": format!("spool:{name}.json"), "status": "ok", "member": member,
        "message": null, "data": null,
        "received_at": waitpoint::clock::Clock::now(&SystemClock).to_string()
    });
    env.write(
        &format!("waitpoints/{id}/signals/{seq:06}-spool:{name}.json.json"),
        serde_json::to_string_pretty(&record).unwrap().as_bytes(),
    );
}

/// Applies a signal through the library, as a daemon would, without touching the spool.
fn apply_directly(env: &Env, id: &str, secret: &str, name: &str) {
    let text = body(id, secret, "");
    engine(env)
        .apply_signal(
            &parse_signal(text.as_bytes()).unwrap(),
            &Source::Spool(name.into()),
        )
        .unwrap();
}

/// Puts `wake` back in the waitpoint's outbox: the state of a crash before the outbox cleared.
fn put_back_in_outbox(env: &Env, id: &str, wake: serde_json::Value) {
    let mut state = env.state(id);
    state["outbox"] = serde_json::json!([wake]);
    env.write(
        &format!("waitpoints/{id}/waitpoint.json"),
        serde_json::to_string_pretty(&state).unwrap().as_bytes(),
    );
}

fn engine(env: &Env) -> Engine {
    Engine::new(
        Home::new(&env.home),
        Settings::default(),
        Arc::new(SystemClock),
    )
}

#[test]
fn signals_sent_while_the_daemon_is_down_are_collected_when_it_starts() {
    let env = Env::new();
    let reply = env.arm("t", &["--max-signals", "2"]);
    let (id, secret) = id_secret(&reply);
    env.ok(
        "first",
        &env.signal(&["--id", &id, "--secret", &secret, "--message", "one"]),
    );
    env.ok(
        "second",
        &env.signal(&["--id", &id, "--secret", &secret, "--message", "two"]),
    );
    assert_eq!(env.spooled().len(), 2, "they wait in the spool");
    let _d = env.daemon();
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    assert_eq!(env.state(&id)["counters"]["signals"], 2);
    assert_eq!(env.inbox("default", "new").len(), 2);
    assert!(env.spooled().is_empty());
}

#[test]
fn crash_between_recording_and_removing_the_spool_file_counts_once() {
    let env = Env::new();
    let reply = env.arm("t", &[]);
    let (id, secret) = id_secret(&reply);
    let text = body(&id, &secret, r#","message":"done""#);
    env.drop_file("once", &text);
    // What a daemon killed right after the commit leaves behind: the signal and the new state
    // are durable, the spool file is still there.
    let verdict = engine(&env)
        .apply_signal(
            &parse_signal(text.as_bytes()).unwrap(),
            &Source::Spool("once.json".into()),
        )
        .unwrap();
    assert!(
        matches!(verdict, Verdict::Accepted { seq: 1, .. }),
        "{verdict:?}"
    );
    assert_eq!(env.spooled(), ["once.json"]);

    let _d = env.daemon();
    env.wait_drained();
    let state = env.state(&id);
    assert_eq!(state["counters"]["signals"], 1);
    assert_eq!(state["status"], "resolved");
    let all = [env.inbox("default", "new"), env.inbox("default", "cur")].concat();
    assert_eq!(all.len(), 1, "exactly one wake");
}

#[test]
fn crash_between_the_signal_record_and_the_state_replace_is_replayed_once() {
    let env = Env::new();
    let reply = env.arm("t", &[]);
    let (id, secret) = id_secret(&reply);
    env.drop_file("half", &body(&id, &secret, ""));
    // Fabricate the crash: the signal file is recorded, the state never replaced.
    record_without_state(&env, &id, 1, "half", None);
    assert_eq!(env.state(&id)["counters"]["signals"], 0);

    let _d = env.daemon();
    env.wait_drained();
    let state = env.state(&id);
    assert_eq!(
        state["counters"]["signals"], 1,
        "replayed, and the file not counted again"
    );
    assert_eq!(state["status"], "resolved");
    assert_eq!(env.inbox("default", "new").len(), 1);
    assert_eq!(crate::invariants::records_of(&env.home, &id).len(), 1);
}

#[test]
fn a_wake_committed_but_not_delivered_is_delivered_on_start() {
    let env = Env::new();
    let reply = env.arm("t", &[]);
    let (id, secret) = id_secret(&reply);
    apply_directly(&env, &id, &secret, "x.json");
    // Fabricate the crash after the state commit and before the inbox write: put the wake back
    // in the outbox and remove it from the inbox.
    let wake_path = env
        .home
        .join("sessions/default/wakes/new")
        .join(format!("wk_{}_0001.json", &id[3..]));
    let wake: serde_json::Value = serde_json::from_slice(&fs::read(&wake_path).unwrap()).unwrap();
    fs::remove_file(&wake_path).unwrap();
    put_back_in_outbox(&env, &id, wake);

    let _d = env.daemon();
    env.wait_until("re-delivered", || wake_path.exists());
    env.wait_until("outbox cleared", || {
        env.state(&id)["outbox"].as_array().unwrap().is_empty()
    });
    assert_eq!(env.inbox("default", "new").len(), 1);
}

#[test]
fn a_wake_already_read_is_not_delivered_again() {
    let env = Env::new();
    let reply = env.arm("t", &[]);
    let (id, secret) = id_secret(&reply);
    apply_directly(&env, &id, &secret, "x.json");
    env.ok("read it", &env.waitpoint(&["next", "--timeout", "1"]));
    // Crash state: the wake is still in the outbox although the reader already took it.
    let wake = env.inbox("default", "cur").remove(0);
    put_back_in_outbox(&env, &id, wake);
    let _d = env.daemon();
    env.wait_until("outbox cleared", || {
        env.state(&id)["outbox"].as_array().unwrap().is_empty()
    });
    assert!(
        env.inbox("default", "new").is_empty(),
        "not re-delivered into new/"
    );
}

#[test]
fn sigkill_while_signals_flow_loses_and_doubles_nothing() {
    let env = Env::new();
    let reply = env.arm("t", &["--max-signals", "1000"]);
    let (id, secret) = id_secret(&reply);
    let total = 120;
    let mut sent = 0;
    for round in 0..4 {
        let d = env.daemon();
        for _ in 0..total / 4 {
            env.drop_file(
                &format!("s{sent:04}"),
                &body(&id, &secret, r#","status":"progress""#),
            );
            sent += 1;
        }
        if round % 2 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        d.kill();
    }
    let _d = env.daemon();
    env.wait_drained();
    let state = env.state(&id);
    assert_eq!(
        state["counters"]["signals"], total,
        "each file counted exactly once"
    );
    assert_eq!(state["counters"]["progress"], total);
    let recorded = crate::invariants::records_of(&env.home, &id).len();
    assert_eq!(recorded, total as usize);
}

#[test]
fn records_replayed_through_duplicate_files_still_send_the_grace_wake() {
    // Regression: replaying a crash's records from a duplicate file opens the barrier's grace
    // window, and the daemon must schedule its wake then, not only after an accepted signal.
    let env = Env::new();
    let reply = env.arm("ladder", &["--member", "a", "--member", "b"]);
    let (id, secret) = id_secret(&reply);
    for (seq, m) in [(1, "a"), (2, "b")] {
        env.drop_file(m, &body(&id, &secret, &format!(r#","member":"{m}""#)));
        record_without_state(&env, &id, seq, m, Some(m));
    }
    let _d = env.daemon();
    env.wait_drained();
    env.wait_until("the grace wake", || env.inbox("default", "new").len() == 1);
    let wake = &env.inbox("default", "new")[0];
    assert_eq!(wake["kind"], "resolved");
    assert_eq!(wake["reports"].as_array().unwrap().len(), 2);
    assert_eq!(env.state(&id)["counters"]["signals"], 2);
}

/// A day-old temp file under a waitpoint, as a commit killed mid-way leaves it.
fn plant_stale_temp(env: &Env, id: &str) -> std::path::PathBuf {
    let temp = env
        .home
        .join("waitpoints")
        .join(id)
        .join(".waitpoint.json.0123456789abcdef.tmp");
    fs::write(&temp, b"{").unwrap();
    let two_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400);
    fs::File::options()
        .write(true)
        .open(&temp)
        .unwrap()
        .set_modified(two_days_ago)
        .unwrap();
    temp
}

#[test]
fn stale_temps_under_waitpoints_are_swept_at_a_start_after_a_death_not_after_a_clean_stop() {
    let env = Env::new();
    let (id, _) = id_secret(&env.arm("t", &[]));
    let temp = plant_stale_temp(&env, &id);
    // After a clean stop (an empty daemon.lock) the start does not walk every waitpoint.
    let mut d = env.daemon();
    assert!(
        temp.exists(),
        "a clean start leaves the walk to the daily clean-up"
    );
    d.send(Signal::TERM);
    assert_eq!(d.wait_exit().0, Some(0));
    // A pid left in the lock says the last daemon died: the walk runs before it is ready.
    fs::write(env.home.join("daemon.lock"), "4242\n").unwrap();
    let _d = env.daemon();
    assert!(
        !temp.exists(),
        "the start after a death removes what it left"
    );
}

/// The ids `check --json` lists as waiting.
fn waiting_ids(env: &Env) -> Vec<String> {
    let check: Value =
        serde_json::from_str(&env.ok("check", &env.waitpoint(&["check", "--json"]))).unwrap();
    check["waiting"]
        .as_array()
        .unwrap_or_else(|| panic!("{check}"))
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_record_that_is_a_link_a_fifo_or_huge_is_set_aside_unread() {
    let env = Env::new();
    let good = env.arm("good", &[]);
    let linked = env.arm("linked", &[]);
    let (good_id, _) = id_secret(&good);
    let (linked_id, _) = id_secret(&linked);
    // The linked waitpoint's directory now lives outside the home, reached through a link.
    let outside = env.home.join("../outside");
    fs::create_dir_all(&outside).unwrap();
    let dir = env.home.join("waitpoints").join(&linked_id);
    fs::rename(&dir, outside.join(&linked_id)).unwrap();
    std::os::unix::fs::symlink(outside.join(&linked_id), &dir).unwrap();
    let outside_files = invariants::all_files(&outside);
    // A FIFO where a timer should be (reading it would block for ever), and a huge timer.
    let fifo = env.home.join("timers/tm_0123456789ab.json");
    fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let huge = fs::File::create(env.home.join("timers/tm_0123456789ac.json")).unwrap();
    huge.set_len(waitpoint::durable::MAX_RECORD_BYTES + 1)
        .unwrap();
    assert_eq!(waiting_ids(&env), std::slice::from_ref(&good_id));
    let list = env.ok("timer list", &env.waitpoint(&["timer", "list", "--json"]));
    assert_eq!(list.trim(), "[]");
    let quarantine = env.home.join("quarantine");
    let reason = |name: &str| {
        fs::read_to_string(quarantine.join(format!("{name}.reason")))
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", env.tree()))
    };
    let expected = [
        (format!("waitpoints%{linked_id}"), "is a symbolic link"),
        (
            "timers%tm_0123456789ab.json".to_owned(),
            "not a regular file",
        ),
        (
            "timers%tm_0123456789ac.json".to_owned(),
            "more than a record may be",
        ),
    ];
    let set_aside = expected
        .iter()
        .filter(|(name, why)| reason(name).contains(why))
        .count();
    assert_eq!(set_aside, expected.len(), "{}", env.tree());
    // The link itself went aside; what it pointed at is untouched.
    assert!(
        fs::symlink_metadata(quarantine.join(format!("waitpoints%{linked_id}")))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(invariants::all_files(&outside), outside_files);
    invariants::report(
        "8-trust-records",
        &[(
            "trust: records that are a link out of the home, a FIFO, or over 16 MB: set aside \
             unread, the rest listed",
            format!("{set_aside} of {}", expected.len()),
        )],
    );
}

#[test]
fn one_record_that_does_not_parse_is_set_aside_and_stops_nothing_else() {
    let env = Env::new();
    let bad = env.arm("bad", &[]);
    let good = env.arm("good", &["--expires-in-hours", "0.001"]);
    let (bad_id, _) = id_secret(&bad);
    let (good_id, _) = id_secret(&good);
    env.write(
        &format!("waitpoints/{bad_id}/waitpoint.json"),
        b"{\"id\": \"wp_",
    );
    env.write("timers/tm_0123456789ab.json", b"not json at all");
    env.write(
        "sessions/default/wakes/new/wk_0123456789ab_0001.json",
        b"[1, 2",
    );
    env.ok(
        "timer",
        &env.waitpoint(&[
            "timer",
            "create",
            "--after-ms",
            "300",
            "--summary",
            "still fires",
        ]),
    );
    // Listing goes on without the bad waitpoint, and sets it aside.
    assert_eq!(waiting_ids(&env), std::slice::from_ref(&good_id));
    let list = env.ok("timer list", &env.waitpoint(&["timer", "list", "--json"]));
    assert_eq!(
        serde_json::from_str::<Value>(&list)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let quarantine = env.home.join("quarantine");
    let reason =
        fs::read_to_string(quarantine.join(format!("waitpoints%{bad_id}%waitpoint.json.reason")))
            .unwrap_or_else(|e| panic!("{e}\n{}", env.tree()));
    assert!(reason.contains("does not parse"), "{reason}");
    assert!(
        quarantine.join("timers%tm_0123456789ab.json").exists(),
        "{}",
        env.tree()
    );
    // The daemon's start-up scan goes on: the good deadline and the timer fire.
    let _d = env.daemon();
    env.expect_code(
        "the good deadline",
        &env.waitpoint(&["wait", &good_id, "--timeout", "120"]),
        5,
    );
    let mut kinds = Vec::new();
    for _ in 0..2 {
        let next = env.waitpoint(&["next", "--timeout", "120", "--json"]);
        let wake: Value = serde_json::from_str(&env.ok("next", &next)).unwrap();
        kinds.push(wake["kind"].as_str().unwrap().to_owned());
    }
    kinds.sort();
    assert_eq!(kinds, ["deadline", "timer"]);
    assert!(
        quarantine
            .join("sessions%default%wakes%new%wk_0123456789ab_0001.json")
            .exists(),
        "{}",
        env.tree()
    );
    let doctor = String::from_utf8_lossy(&env.waitpoint(&["doctor"]).stdout).into_owned();
    let line = doctor
        .lines()
        .find(|l| l.contains("records"))
        .unwrap_or_else(|| panic!("{doctor}"));
    assert!(
        line.starts_with("WARN") && line.contains("3 record(s)"),
        "{doctor}"
    );
}
