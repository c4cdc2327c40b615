//! The wake rules over time, on a manual clock: the grace window, the hourly cap, deadline
//! notices, retention, the onWake hook's retries, session deletion, and the operator's view.

use std::fs;

use serde_json::Value;
use waitpoint::engine::Quorum;

use crate::helpers::*;

const HOUR: i64 = 3_600_000;

fn wakes(env: &Env) -> Vec<Value> {
    env.inbox("default", "new")
}

fn ok(id: &str, secret: &str, member: &str) -> String {
    body(
        id,
        secret,
        &format!(r#","status":"ok","member":"{member}""#),
    )
}

#[test]
fn grace_window_carries_a_late_members_report_in_the_same_wake() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("ladder")
        .members(&["a", "b", "c"])
        .quorum(Quorum::Count(2))
        .on(&live.engine);
    env.drop_file("a", &ok(&id, &secret, "a"));
    env.drop_file("b", &ok(&id, &secret, "b"));
    env.wait_until("quorum met", || env.state(&id)["status"] == "resolved");
    assert!(
        wakes(&env).is_empty(),
        "the wake waits out the grace window"
    );
    assert_eq!(env.state(&id)["pending_wake"]["reason"], "grace");
    // Inside the window a late member still lands.
    live.advance_ms(2_000);
    env.drop_file("c", &ok(&id, &secret, "c"));
    env.wait_until("c recorded", || env.state(&id)["counters"]["signals"] == 3);
    live.advance_ms(1_000);
    env.wait_until("the wake", || wakes(&env).len() == 1);
    let members: Vec<String> = wakes(&env)[0]["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["member"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(members, ["a", "b", "c"]);
    // After the window: "already resolved", not counted.
    env.drop_file("late", &ok(&id, &secret, "c"));
    env.wait_drained();
    assert_eq!(env.state(&id)["counters"]["signals"], 3);
    assert_eq!(wakes(&env).len(), 1);
}

#[test]
fn max_signals_counts_wakes_so_rounds_folded_in_the_grace_window_do_not_close_a_monitor() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    // A monitor of two members that may wake you twice.
    let (id, secret) = Arming::new("pair")
        .members(&["a", "b"])
        .max_signals(2)
        .on(&live.engine);
    // Two rounds complete inside one grace window: one wake, and the monitor stays open.
    for (n, m) in [(1, "a"), (2, "b"), (3, "a"), (4, "b")] {
        env.drop_file(&format!("{n}-{m}"), &ok(&id, &secret, m));
        env.wait_until("recorded", || env.state(&id)["counters"]["signals"] == n);
    }
    assert_eq!(env.state(&id)["counters"]["rounds"], 2);
    live.advance_ms(3_000);
    env.wait_until("the first wake", || wakes(&env).len() == 1);
    let state = env.state(&id);
    assert_eq!(state["status"], "armed", "two rounds, one wake: {state}");
    assert_eq!(wakes(&env)[0]["kind"], "report");
    assert_eq!(wakes(&env)[0]["reports"].as_array().unwrap().len(), 4);
    // A third round starts the second wake: that one resolves it.
    live.advance_ms(10_000);
    env.drop_file("5-a", &ok(&id, &secret, "a"));
    env.drop_file("6-b", &ok(&id, &secret, "b"));
    env.wait_until("resolved", || env.state(&id)["status"] == "resolved");
    live.advance_ms(3_000);
    env.wait_until("the second wake", || wakes(&env).len() == 2);
    assert_eq!(wakes(&env)[1]["kind"], "resolved");
}

#[test]
fn a_single_signal_waitpoint_wakes_at_once() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("one").on(&live.engine);
    env.drop_file("x", &body(&id, &secret, ""));
    env.wait_until("the wake", || wakes(&env).len() == 1);
}

#[test]
fn hourly_cap_folds_reports_into_one_late_wake() {
    let env = Env::with_settings(r#"{"waitpointSweepMs": 300, "waitpointMaxWakesPerHour": 2}"#);
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("chatty monitor")
        .max_signals(50)
        .expires_in_hours(48.0)
        .on(&live.engine);
    for n in 1..=2 {
        env.drop_file(
            &format!("r{n}"),
            &body(&id, &secret, &format!(r#","message":"report {n}""#)),
        );
        env.wait_until("a wake per report", || wakes(&env).len() == n);
        live.advance_ms(60_000);
    }
    for n in 3..=5 {
        env.drop_file(
            &format!("r{n}"),
            &body(&id, &secret, &format!(r#","message":"report {n}""#)),
        );
    }
    env.wait_until("held reports recorded", || {
        env.state(&id)["counters"]["signals"] == 5
    });
    assert_eq!(wakes(&env).len(), 2, "the cap holds the third wake back");
    let check: Value =
        serde_json::from_str(&env.ok("check", &env.waitpoint(&["check", "--json"]))).unwrap();
    let badges: Vec<&str> = check["waiting"][0]["badges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["text"].as_str().unwrap())
        .collect();
    assert!(
        badges.contains(&"wake limit reached (2/h) — the next wake waits until the hour clears"),
        "{badges:?}"
    );
    // The hour clears one hour after the first wake.
    live.advance_ms(HOUR - 2 * 60_000 + 1);
    env.wait_until("the folded wake", || wakes(&env).len() == 3);
    let folded = &wakes(&env)[2];
    let seqs: Vec<u64> = folded["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [3, 4, 5], "everything that arrived meanwhile");
    assert!(
        folded["summary"]
            .as_str()
            .unwrap()
            .contains("folded 3 reports")
    );
    assert_eq!(env.state(&id)["counters"]["rounds"], 5);
}

#[test]
fn wakes_this_hour_badge_shows_from_two_below_the_cap() {
    let env = Env::with_settings(r#"{"waitpointSweepMs": 300, "waitpointMaxWakesPerHour": 4}"#);
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("m").max_signals(50).on(&live.engine);
    // Rendered on the daemon's own (manual) clock: the badge counts the trailing hour.
    let badge = || -> Option<String> {
        use waitpoint::clock::Clock;
        let wp = live.engine.load(&id).unwrap().unwrap();
        let home = waitpoint::home::Home::new(&env.home);
        waitpoint::operator_view::badges(&home, &wp, 4, live.clock.now())
            .into_iter()
            .find(|b| b.kind == "wakes_this_hour")
            .map(|b| b.text)
    };
    env.drop_file("r1", &body(&id, &secret, ""));
    env.wait_until("1 wake", || wakes(&env).len() == 1);
    assert_eq!(badge(), None);
    env.drop_file("r2", &body(&id, &secret, ""));
    env.wait_until("2 wakes", || wakes(&env).len() == 2);
    assert_eq!(badge().as_deref(), Some("2/4 wakes this hour"));
    // An hour later the window is empty again.
    live.clock.advance_ms(HOUR);
    assert_eq!(badge(), None);
}

fn deadline_wake(env: &Env) -> Value {
    env.wait_until("a deadline wake", || {
        wakes(env).iter().any(|w| w["kind"] == "deadline")
    });
    wakes(env)
        .into_iter()
        .find(|w| w["kind"] == "deadline")
        .unwrap()
}

#[test]
fn deadline_notice_says_nobody_reported() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, _) = Arming::new("silent").expires_in_hours(1.0).on(&live.engine);
    live.advance_ms(HOUR);
    let w = deadline_wake(&env);
    assert_eq!(w["deadline"]["case"], "nobody_reported");
    assert!(w["text"].as_str().unwrap().contains("nobody reported"));
    assert_eq!(env.state(&id)["status"], "expired");
}

#[test]
fn deadline_notice_names_who_reported_and_who_did_not() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("ladder")
        .members(&["arm2", "arm6", "arm8"])
        .expires_in_hours(1.0)
        .on(&live.engine);
    env.drop_file("a", &ok(&id, &secret, "arm6"));
    env.wait_until("recorded", || env.state(&id)["counters"]["signals"] == 1);
    live.advance_ms(HOUR);
    let w = deadline_wake(&env);
    assert_eq!(w["deadline"]["case"], "some_members");
    assert_eq!(w["deadline"]["reported"], serde_json::json!(["arm6"]));
    assert_eq!(
        w["deadline"]["missing"],
        serde_json::json!(["arm2", "arm8"])
    );
    assert!(w["text"].as_str().unwrap().contains("missing: arm2, arm8"));
}

#[test]
fn deadline_notice_says_only_heartbeats_arrived_with_the_last_one() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("hb").expires_in_hours(1.0).on(&live.engine);
    for n in 1..=3 {
        env.drop_file(
            &format!("hb{n}"),
            &body(
                &id,
                &secret,
                &format!(r#","status":"progress","message":"step {n}000""#),
            ),
        );
        env.wait_until("hb", || env.state(&id)["counters"]["progress"] == n);
    }
    live.advance_ms(HOUR);
    let w = deadline_wake(&env);
    assert_eq!(w["deadline"]["case"], "only_heartbeats");
    assert_eq!(w["deadline"]["last_heartbeat"]["seq"], 3);
    assert_eq!(w["external_payload"]["reports"][2]["message"], "step 3000");
}

#[test]
fn a_monitor_at_its_deadline_says_how_often_it_woke_and_carries_the_held_report() {
    let env = Env::with_settings(r#"{"waitpointSweepMs": 300, "waitpointMaxWakesPerHour": 1}"#);
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("monitor")
        .max_signals(10)
        .expires_in_hours(0.5)
        .on(&live.engine);
    env.drop_file("r1", &body(&id, &secret, r#","message":"first""#));
    env.wait_until("first wake", || wakes(&env).len() == 1);
    env.drop_file("r2", &body(&id, &secret, r#","message":"held by the cap""#));
    env.wait_until("held", || {
        env.state(&id)["pending_wake"]["reason"] == "wake_limit"
    });
    live.advance_ms(HOUR / 2);
    let w = deadline_wake(&env);
    assert_eq!(w["deadline"]["case"], "monitor_ended");
    assert_eq!(w["deadline"]["wakes_sent"], 1);
    assert_eq!(
        w["external_payload"]["reports"][0]["message"],
        "held by the cap"
    );
    assert!(w["text"].as_str().unwrap().contains("woke you 1 time(s)"));
}

#[test]
fn missed_deadlines_fire_once_on_start_not_once_per_missed_sweep() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (a, _) = Arming::new("a").expires_in_hours(1.0).on(&live.engine);
    let (b, _) = Arming::new("b").expires_in_hours(2.0).on(&live.engine);
    live.stop();
    // The daemon was down for a day.
    let live = Live::start(&env, T0.plus_ms(24 * HOUR));
    env.wait_until("both expired", || {
        env.state(&a)["status"] == "expired" && env.state(&b)["status"] == "expired"
    });
    live.advance_ms(HOUR);
    live.stop();
    let live = Live::start(&env, T0.plus_ms(26 * HOUR));
    live.settle();
    let deadline_wakes = wakes(&env)
        .iter()
        .filter(|w| w["kind"] == "deadline")
        .count();
    assert_eq!(deadline_wakes, 2, "one notice each");
}

#[test]
fn closed_waitpoints_are_kept_three_days_then_forgotten_and_old_read_wakes_cleaned() {
    let env = Env::with_settings(r#"{"waitpointSweepMs": 300, "waitpointTtlMs": 86400000}"#);
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("kept").on(&live.engine);
    env.drop_file("done", &body(&id, &secret, ""));
    env.wait_until("resolved", || env.state(&id)["status"] == "resolved");
    env.ok("read it", &env.waitpoint(&["next", "--timeout", "5"]));
    let dir = env.home.join("waitpoints").join(&id);
    live.advance_ms(3 * 24 * HOUR - 1000);
    env.drop_file("late", &body(&id, &secret, ""));
    env.wait_drained();
    assert!(
        dir.exists(),
        "kept for three days, so a late signal is told 'already resolved'"
    );
    assert!(!env.drop_zone().join("bad/late.json").exists());
    live.advance_ms(2000);
    env.wait_until("removed after three days", || !dir.exists());
    env.drop_file("later", &body(&id, &secret, ""));
    env.wait_until("now unknown: parked", || {
        env.drop_zone().join("bad/later.reason").exists()
    });
    // The read wake is older than the one-day TTL and the hourly clean-up has run.
    env.wait_until("old read wake removed", || {
        env.inbox("default", "cur").is_empty()
    });
}

/// A home whose `onWake` runs `script` (with `$0` in a scratch directory it can write to).
fn hook_env(script: &str) -> (Env, std::path::PathBuf) {
    let env = Env::new();
    let dir = env.home.parent().unwrap().join("hook");
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hook.sh");
    fs::write(&path, script).unwrap();
    let settings = format!(
        r#"{{"waitpointSweepMs": 300, "onWake": ["sh", "{}"], "onWakeTimeoutMs": 500}}"#,
        path.display()
    );
    fs::write(env.home.join("settings.json"), settings).unwrap();
    (env, dir)
}

fn hook_state(env: &Env, id: &str) -> Value {
    let show: Value =
        serde_json::from_str(&env.ok("show", &env.waitpoint(&["show", id, "--json"]))).unwrap();
    show["hook_deliveries"][0].clone()
}

#[test]
fn a_hook_that_fails_twice_then_succeeds_is_retried_with_backoff() {
    // Fails on the first two calls, then saves its stdin and environment.
    let (env, dir) = hook_env(
        r#"d=$(dirname "$0"); n=$(cat "$d/count" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$d/count"
if [ $n -le 2 ]; then echo "not yet ($n)" >&2; exit 1; fi
cat > "$d/wake.json"; echo "$WAITPOINT_ID $WAITPOINT_WAKE_ID $WAITPOINT_ATTEMPT" > "$d/env""#,
    );
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("hooked").on(&live.engine);
    env.drop_file("x", &body(&id, &secret, ""));
    env.wait_until("first failure recorded", || {
        hook_state(&env, &id)["attempts"] == 1
    });
    assert!(
        !wakes(&env).is_empty(),
        "the inbox file is written before the hook runs"
    );
    assert_eq!(hook_state(&env, &id)["last_error"], "exit 1: not yet (1)");
    let check: Value =
        serde_json::from_str(&env.ok("check", &env.waitpoint(&["check", "--json"]))).unwrap();
    assert_eq!(
        check["waiting"][0]["badges"][0]["text"],
        "delivery retrying · 1 attempts"
    );
    // The error is beside the badge (a hover on the page), not only in `show`.
    assert_eq!(
        check["waiting"][0]["badges"][0]["detail"],
        "exit 1: not yet (1)"
    );
    let table = env.ok("check", &env.waitpoint(&["check"]));
    assert!(
        table.contains("delivery retrying · 1 attempts — last error: exit 1: not yet (1)"),
        "{table}"
    );
    live.advance_ms(1_000);
    env.wait_until("second failure", || hook_state(&env, &id)["attempts"] == 2);
    live.advance_ms(1_000);
    assert_eq!(
        hook_state(&env, &id)["attempts"],
        2,
        "backoff doubled: not yet"
    );
    live.advance_ms(1_000);
    env.wait_until("delivered", || {
        !hook_state(&env, &id)["delivered_at"].is_null()
    });
    assert_eq!(hook_state(&env, &id)["attempts"], 3);
    // Delivered: the earlier failures' error is not kept as if it were current.
    assert!(
        hook_state(&env, &id)["last_error"].is_null(),
        "{}",
        hook_state(&env, &id)
    );
    let got: Value = serde_json::from_slice(&fs::read(dir.join("wake.json")).unwrap()).unwrap();
    assert_eq!(got["waitpoint"]["id"], id.as_str());
    let envline = fs::read_to_string(dir.join("env")).unwrap();
    assert_eq!(envline.trim(), format!("{id} wk_{}_0001 3", &id[3..]));
}

#[test]
fn a_hook_that_hangs_is_killed_at_the_timeout_and_retried() {
    let (env, _) = hook_env("sleep 30");
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("hang").on(&live.engine);
    env.drop_file("x", &body(&id, &secret, ""));
    env.wait_until("timed out", || hook_state(&env, &id)["attempts"] == 1);
    assert!(
        hook_state(&env, &id)["last_error"]
            .as_str()
            .unwrap()
            .contains("timed out")
    );
    assert_eq!(wakes(&env).len(), 1, "the wake itself is never lost");
}

#[test]
fn a_hook_whose_grandchild_keeps_stderr_open_does_not_hold_the_hook_thread() {
    // Exits 0 at once, leaving a background process that holds its stderr for ten minutes.
    let (env, dir) = hook_env(r#"sleep 600 & echo $! >> "$(dirname "$0")/grandchild"; exit 0"#);
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("first").on(&live.engine);
    env.drop_file("x", &body(&id, &secret, ""));
    env.wait_until("the first wake's hook delivered", || {
        !hook_state(&env, &id)["delivered_at"].is_null()
    });
    // The hook thread is free: the next wake's hook runs too.
    let (id2, secret2) = Arming::new("second").on(&live.engine);
    env.drop_file("y", &body(&id2, &secret2, ""));
    env.wait_until("the second wake's hook delivered", || {
        !hook_state(&env, &id2)["delivered_at"].is_null()
    });
    for pid in fs::read_to_string(dir.join("grandchild")).unwrap().lines() {
        let _ = std::process::Command::new("kill").arg(pid.trim()).status();
    }
}

#[test]
fn hook_retries_survive_a_restart() {
    let (env, dir) = hook_env(
        r#"d=$(dirname "$0"); if [ -e "$d/fixed" ]; then exit 0; fi; echo broken >&2; exit 3"#,
    );
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("restart").on(&live.engine);
    env.drop_file("x", &body(&id, &secret, ""));
    env.wait_until("failed once", || hook_state(&env, &id)["attempts"] == 1);
    live.stop();
    fs::write(dir.join("fixed"), "").unwrap();
    let _live = Live::start(&env, T0.plus_ms(10_000));
    env.wait_until("delivered after restart", || {
        !hook_state(&env, &id)["delivered_at"].is_null()
    });
    assert_eq!(hook_state(&env, &id)["attempts"], 2);
}

#[test]
fn deleting_a_session_cancels_its_armed_waitpoints_so_late_signals_cannot_revive_it() {
    let env = Env::new();
    let _d = env.daemon();
    let a = env.arm("a", &["--session", "alice"]);
    let b = env.arm("b", &["--session", "bob"]);
    let out = env.ok(
        "delete",
        &env.waitpoint(&["session", "delete", "alice", "--json"]),
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let (aid, asec) = id_secret(&a);
    assert_eq!(v["cancelled"], serde_json::json!([aid]));
    assert_eq!(env.state(&aid)["status"], "cancelled");
    assert_eq!(env.state(&id_secret(&b).0)["status"], "armed");
    env.ok("late", &env.signal(&["--id", &aid, "--secret", &asec]));
    env.wait_drained();
    assert_eq!(env.state(&aid)["counters"]["signals"], 0);
    assert!(!env.home.join("sessions/alice").exists());
    // Gone from the session list, though its cancelled waitpoint is kept three days; back as
    // soon as it is used again.
    let listed = |env: &Env| -> Vec<String> {
        let v = env.waitpoint_json("sessions", &["sessions", "--json"]);
        v.as_array()
            .unwrap()
            .iter()
            .map(|l| l["session"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(listed(&env), ["bob"]);
    env.arm("again", &["--session", "alice"]);
    assert_eq!(listed(&env), ["alice", "bob"]);
}

#[test]
fn check_brief_is_one_line_and_empty_when_nothing_waits() {
    let env = Env::new();
    let brief = || env.ok("brief", &env.waitpoint(&["check", "--brief"]));
    assert_eq!(brief(), "");
    env.arm("train-arm2", &["--expires-in-hours", "3"]);
    let one = brief();
    assert!(
        one.starts_with("train-arm2 · 0/1 received · expires in 2h 59m")
            || one.starts_with("train-arm2 · 0/1 received · expires in 3h"),
        "{one}"
    );
    env.arm("second", &[]);
    assert_eq!(brief(), "2 waiting items · train-arm2\n");
}

#[test]
fn watch_redraws_when_a_waitpoint_changes() {
    let env = Env::new();
    let _d = env.daemon();
    let mut watch = env
        .command(WAITPOINT)
        .args(["watch", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let next = || -> Value {
        serde_json::from_str(&rx.recv_timeout(PATIENCE).expect("a redraw")).unwrap()
    };
    assert_eq!(next()["waiting"], serde_json::json!([]));
    let reply = env.arm("watched", &[]);
    assert_eq!(next()["waiting"][0]["label"], "watched");
    let (id, secret) = id_secret(&reply);
    env.ok(
        "signal",
        &env.signal(&["--id", &id, "--secret", &secret, "--status", "fail"]),
    );
    let mut saw_fail = false;
    for _ in 0..10 {
        let v = next();
        if v["waiting"][0]["badges"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["kind"] == "failure"))
        {
            saw_fail = true;
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(saw_fail, "the failure badge appeared on a redraw");
}
