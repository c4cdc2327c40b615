//! The core round trip and the wake rules of the foundation: arm, signal through the spool,
//! wake the session.

use std::fs;

use crate::helpers::*;

#[test]
fn round_trip_cli_line_then_wait_exits_zero_and_next_prints_the_wake() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.create(&[
        "--label",
        "nightly training",
        "--intent",
        "compare the loss curve",
    ]);
    let (id, _) = id_secret(&reply);
    assert_eq!(reply["how_to_signal"]["recommended"], "cli");
    env.ok("cli line", &env.job_then(true, &line(&reply, "cli"), None));
    let out = env.waitpoint(&["wait", &id, "--timeout", "120"]);
    assert!(env.ok("wait", &out).contains("resolved ok"));

    let next = env.waitpoint(&["next", "--timeout", "5", "--json"]);
    let wake: serde_json::Value = serde_json::from_str(&env.ok("next", &next)).unwrap();
    assert_eq!(wake["waitpoint"]["id"], id.as_str());
    assert_eq!(wake["kind"], "resolved");
    assert_eq!(wake["waitpoint"]["intent"], "compare the loss curve");
    assert!(
        wake["text"]
            .as_str()
            .unwrap()
            .contains("compare the loss curve")
    );
    assert_eq!(wake["external_payload"]["reports"][0]["message"], "exit=0");
    assert!(
        env.inbox("default", "new").is_empty(),
        "next moved it out of new/"
    );
    assert_eq!(env.inbox("default", "cur").len(), 1);
    // Nothing more to read: `--timeout 0` answers at once with the timed-out code.
    env.expect_code("next again", &env.waitpoint(&["next", "--timeout", "0"]), 7);
}

#[test]
fn spec_shell_file_drop_line_works_pasted_into_sh() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.create(&["--label", "build", "--intent", "ship it"]);
    let (id, _) = id_secret(&reply);
    env.ok(
        "shell line",
        &env.job_then(false, &line(&reply, "shell"), None),
    );
    let out = env.waitpoint(&["wait", &id, "--timeout", "120"]);
    env.expect_code("wait on a failed job", &out, 4);
    let state = env.state(&id);
    assert_eq!(state["outcome"], "fail");
    let rec = crate::invariants::records_of(&env.home, &id).remove(0);
    assert_eq!(rec["message"], "exit=1");
    assert!(rec["source"].as_str().unwrap().starts_with("spool:"));
}

#[test]
fn device_waitpoint_recommends_the_shell_form_aimed_at_the_device_spool() {
    let env = Env::new();
    env.ok(
        "device add",
        &env.waitpoint(&["device", "add", "trainer1", "--host", "gpu1", "--user", "u"]),
    );
    let reply = env.arm("t", &["--device", "trainer1"]);
    assert_eq!(reply["how_to_signal"]["recommended"], "shell");
    assert!(line(&reply, "shell").contains("d=~/.cortex/tmp/signals;"));
}

#[test]
fn env_line_then_bare_cortex_signal_resolves() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &[]);
    let (id, _) = id_secret(&reply);
    let script = format!(
        "{}; true; cortex-signal --exit-code $?",
        line(&reply, "env")
    );
    env.ok("env line", &env.sh(&script));
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
}

#[test]
fn attach_to_pid_line_signals_when_the_process_ends() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &[]);
    let (id, _) = id_secret(&reply);
    let attach = line(&reply, "attach_to_pid");
    let script = format!("sleep 1 & pid=$!\n{}\nwait", attach.replace("PID", "$pid"));
    env.ok("attach line", &env.sh(&script));
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    let rec = env.state(&id);
    assert_eq!(rec["counters"]["ok"], 1);
}

#[test]
fn members_quorum_two_of_three_resolves_on_the_second_and_refuses_late_arms() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.create(&[
        "--label",
        "T2 ladder",
        "--intent",
        "all arms",
        "--member",
        "arm2",
        "--member",
        "arm6",
        "--member",
        "arm8",
        "--quorum",
        "2",
    ]);
    let (id, _) = id_secret(&reply);
    let cli = line(&reply, "cli");
    assert!(cli.contains("--member MEMBER"), "{cli}");
    assert!(
        reply["how_to_signal"]["member_note"]
            .as_str()
            .unwrap()
            .contains("arm2, arm6, arm8")
    );
    for form in ["env", "cli", "curl", "shell", "attach_to_pid"] {
        assert!(
            line(&reply, form).contains("MEMBER"),
            "{form} carries the placeholder"
        );
    }

    env.ok("arm2", &env.job_then(true, &cli, Some("arm2")));
    env.wait_until("arm2 recorded", || {
        env.state(&id)["counters"]["signals"] == 1
    });
    // The same member again does not count twice toward the quorum.
    env.ok("arm2 again", &env.job_then(true, &cli, Some("arm2")));
    env.wait_until("arm2 twice recorded", || {
        env.state(&id)["counters"]["signals"] == 2
    });
    assert_eq!(env.state(&id)["status"], "armed");
    assert!(
        env.inbox("default", "new").is_empty(),
        "no wake before the quorum"
    );

    env.ok("arm6", &env.job_then(true, &cli, Some("arm6")));
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    let wakes = env.inbox("default", "new");
    assert_eq!(wakes.len(), 1);
    let members: Vec<_> = wakes[0]["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["member"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        members,
        ["arm2", "arm2", "arm6"],
        "the wake carries every signal so far"
    );

    // A late arm is "already resolved": removed from the spool, not parked, not counted.
    env.ok("arm8", &env.job_then(true, &cli, Some("arm8")));
    env.wait_drained();
    assert_eq!(env.state(&id)["counters"]["signals"], 3);
    assert!(
        fs::read_dir(env.drop_zone().join("bad"))
            .unwrap()
            .next()
            .is_none()
    );
}

#[test]
fn fail_fast_on_wakes_on_the_first_failure() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &["--member", "a", "--member", "b"]);
    let (id, _) = id_secret(&reply);
    let cli = line(&reply, "cli");
    env.ok("a fails", &env.job_then(false, &cli, Some("a")));
    env.expect_code(
        "wait",
        &env.waitpoint(&["wait", &id, "--timeout", "120"]),
        4,
    );
    assert_eq!(env.state(&id)["counters"]["signals"], 1);
    // Resolved by one failure of two: it received one, not two.
    let show = env.ok("show", &env.waitpoint(&["show", &id]));
    assert!(
        show.contains("1/2 received") && !show.contains("2/2"),
        "{show}"
    );
}

#[test]
fn a_fail_fast_failure_wakes_at_once_without_the_grace_window() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("barrier")
        .members(&["a", "b", "c"])
        .on(&live.engine);
    env.drop_file(
        "a-fails",
        &body(&id, &secret, r#","status":"fail","member":"a""#),
    );
    // The clock stands still: a wake held for the three-second grace would never go out.
    env.wait_until("the wake", || env.inbox("default", "new").len() == 1);
    let state = env.state(&id);
    assert_eq!(state["status"], "resolved");
    assert!(state["pending_wake"].is_null(), "{state:#}");
    assert_eq!(env.inbox("default", "new")[0]["kind"], "resolved");
    // A later arm is answered "already resolved", not carried.
    env.drop_file("b-ok", &body(&id, &secret, r#","member":"b""#));
    live.settle();
    env.wait_until("the late one collected", || env.spooled().is_empty());
    assert_eq!(env.state(&id)["counters"]["signals"], 1);
}

#[test]
fn fail_fast_off_waits_for_the_quorum_even_after_a_failure() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &["--member", "a", "--member", "b", "--no-fail-fast"]);
    let (id, _) = id_secret(&reply);
    let cli = line(&reply, "cli");
    env.ok("a fails", &env.job_then(false, &cli, Some("a")));
    env.wait_until("a recorded", || env.state(&id)["counters"]["signals"] == 1);
    assert_eq!(env.state(&id)["status"], "armed");
    env.ok("b ok", &env.job_then(true, &cli, Some("b")));
    // Resolved, and the outcome remembers the failure.
    env.expect_code(
        "wait",
        &env.waitpoint(&["wait", &id, "--timeout", "120"]),
        4,
    );
    assert_eq!(env.state(&id)["counters"]["signals"], 2);
}

#[test]
fn progress_is_recorded_and_never_wakes() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &[]);
    let (id, secret) = id_secret(&reply);
    for step in ["step 1000", "step 2000", "step 3000"] {
        env.ok(
            "progress",
            &env.signal(&[
                "--id",
                &id,
                "--secret",
                &secret,
                "--status",
                "progress",
                "--message",
                step,
            ]),
        );
    }
    env.wait_until("three heartbeats", || {
        env.state(&id)["counters"]["progress"] == 3
    });
    let state = env.state(&id);
    assert_eq!(state["status"], "armed");
    assert_eq!(state["counters"]["wakes"], 0);
    assert!(env.inbox("default", "new").is_empty());
    let show = env.ok("show", &env.waitpoint(&["show", &id]));
    assert!(show.contains("step 3000"), "{show}");
}

#[test]
fn monitor_with_max_signals_three_wakes_three_times_then_resolves() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("nightly", &["--max-signals", "3"]);
    let (id, secret) = id_secret(&reply);
    for n in 1..=3 {
        env.ok(
            "report",
            &env.signal(&[
                "--id",
                &id,
                "--secret",
                &secret,
                "--message",
                &format!("report {n}"),
            ]),
        );
        env.wait_until("the report's wake", || {
            env.inbox("default", "new").len() == n
        });
        // The wake is written back before the state (a waiting session hears first), so the
        // state is waited for too; it must get there, and never past it.
        let expected = if n < 3 { "armed" } else { "resolved" };
        env.wait_until(&format!("the state after report {n}"), || {
            env.state(&id)["counters"]["signals"] == n
        });
        assert_eq!(env.state(&id)["status"], expected, "after report {n}");
    }
    let kinds: Vec<_> = env
        .inbox("default", "new")
        .iter()
        .map(|w| w["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["report", "report", "resolved"]);
    env.ok("a fourth", &env.signal(&["--id", &id, "--secret", &secret]));
    env.wait_drained();
    assert_eq!(
        env.state(&id)["counters"]["signals"],
        3,
        "late report not counted"
    );
}

#[test]
fn the_same_file_name_is_heard_once() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &["--max-signals", "5"]);
    let (id, secret) = id_secret(&reply);
    env.drop_file("reused-name", &body(&id, &secret, r#","status":"ok""#));
    env.wait_until("first", || env.state(&id)["counters"]["signals"] == 1);
    env.wait_drained();
    env.drop_file("reused-name", &body(&id, &secret, r#","status":"ok""#));
    env.wait_drained();
    assert_eq!(env.state(&id)["counters"]["signals"], 1);
}

#[test]
fn cancel_is_for_the_owning_session_only_and_wait_reports_it() {
    let env = Env::new();
    let reply = env.arm("t", &["--session", "alice"]);
    let (id, _) = id_secret(&reply);
    env.expect_code(
        "bob cannot see it",
        &env.waitpoint(&["cancel", &id, "--session", "bob"]),
        3,
    );
    env.ok(
        "alice cancels",
        &env.waitpoint(&["cancel", &id, "--session", "alice"]),
    );
    env.ok(
        "again is a no-op",
        &env.waitpoint(&["cancel", &id, "--session", "alice"]),
    );
    env.expect_code("wait", &env.waitpoint(&["wait", &id, "--timeout", "5"]), 6);
    assert_eq!(env.state(&id)["status"], "cancelled");
}

#[test]
fn cancelling_a_resolved_waitpoint_is_a_conflict() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &[]);
    let (id, secret) = id_secret(&reply);
    env.ok("signal", &env.signal(&["--id", &id, "--secret", &secret]));
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    let out = env.waitpoint(&["cancel", &id]);
    env.expect_code("cancel resolved", &out, 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already resolved"));
}

#[test]
fn wait_times_out_with_its_own_code() {
    let env = Env::new();
    let reply = env.arm("t", &[]);
    let (id, _) = id_secret(&reply);
    env.expect_code(
        "wait",
        &env.waitpoint(&["wait", &id, "--timeout", "0.2"]),
        7,
    );
    env.expect_code(
        "unknown id",
        &env.waitpoint(&["wait", "wp_000000000000"]),
        3,
    );
}

#[test]
fn a_deadline_expires_the_waitpoint_with_a_notice_saying_nobody_reported() {
    let env = Env::new();
    let _d = env.daemon();
    // 0.0003 h is about one second.
    let reply = env.arm("t", &["--expires-in-hours", "0.0003"]);
    let (id, _) = id_secret(&reply);
    env.expect_code(
        "wait",
        &env.waitpoint(&["wait", &id, "--timeout", "120"]),
        5,
    );
    env.wait_until("the notice", || env.inbox("default", "new").len() == 1);
    let wake = &env.inbox("default", "new")[0];
    assert_eq!(wake["kind"], "deadline");
    assert_eq!(wake["deadline"]["case"], "nobody_reported");
}

#[test]
fn check_follows_the_union_rule_and_hides_read_wakes() {
    let env = Env::new();
    let _d = env.daemon();
    // Armed by an earlier session but delivered to bob's channel: bob waits on it.
    let reply = env.arm("relay", &["--session", "old", "--channel", "bob"]);
    let (id, secret) = id_secret(&reply);
    let check = |s: &str| -> serde_json::Value {
        serde_json::from_str(&env.ok(
            "check",
            &env.waitpoint(&["check", "--json", "--session", s]),
        ))
        .unwrap()
    };
    assert_eq!(check("bob")["waiting"][0]["id"], id.as_str());
    assert_eq!(check("old")["waiting"][0]["id"], id.as_str());
    assert!(check("carol")["waiting"].as_array().unwrap().is_empty());
    let human = env.ok("check", &env.waitpoint(&["check", "--session", "bob"]));
    assert!(
        human.contains("relay") && human.contains("0/1 received"),
        "{human}"
    );

    env.ok("signal", &env.signal(&["--id", &id, "--secret", &secret]));
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    // Fired but unread: still shown. Once read: gone.
    assert_eq!(check("bob")["waiting"][0]["status"], "resolved");
    env.ok(
        "next",
        &env.waitpoint(&["next", "--session", "bob", "--timeout", "5"]),
    );
    assert!(check("bob")["waiting"].as_array().unwrap().is_empty());
}

#[test]
fn next_follow_streams_wakes_as_json_lines() {
    let env = Env::new();
    let _d = env.daemon();
    let a = env.arm("a", &[]);
    let b = env.arm("b", &[]);
    let mut follow = env
        .command(WAITPOINT)
        .args(["next", "--follow", "--json", "--timeout", "20"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follow.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    for r in [&a, &b] {
        let (id, secret) = id_secret(r);
        env.ok("signal", &env.signal(&["--id", &id, "--secret", &secret]));
    }
    let mut ids = Vec::new();
    for _ in 0..2 {
        let line = lines
            .recv_timeout(PATIENCE)
            .expect("a wake line from next --follow");
        let wake: serde_json::Value = serde_json::from_str(&line).unwrap();
        ids.push(wake["waitpoint"]["id"].as_str().unwrap().to_owned());
    }
    let _ = follow.kill();
    let _ = follow.wait();
    ids.sort();
    let mut want = vec![id_secret(&a).0, id_secret(&b).0];
    want.sort();
    assert_eq!(ids, want);
    // Printed means taken: both are read now.
    assert_eq!(env.inbox("default", "cur").len(), 2);
}

#[test]
fn second_daemon_on_the_same_home_exits_with_a_clear_error() {
    let env = Env::new();
    let _d = env.daemon();
    let out = env.waitpoint(&["daemon"]);
    env.expect_code("second daemon", &out, 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("another daemon"));
}

#[test]
fn malformed_settings_name_the_file_and_key() {
    let env = Env::with_settings(r#"{"waitpointSweepMs": "soon"}"#);
    let out = env.waitpoint(&["check"]);
    env.expect_code("check", &out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("settings.json") && err.contains("waitpointSweepMs"),
        "{err}"
    );
}

#[test]
fn environment_fills_settings_the_file_does_not_set() {
    let env = Env::with_settings("{}");
    let out = env
        .command(WAITPOINT)
        .args(["create", "--json", "--label", "t", "--intent", "i"])
        .env("CORTEX_WAITPOINT_TTL_MS", "60000")
        .output()
        .unwrap();
    let reply: serde_json::Value = serde_json::from_str(&env.ok("create", &out)).unwrap();
    let created =
        waitpoint::clock::Timestamp::parse(reply["created_at"].as_str().unwrap()).unwrap();
    let expires =
        waitpoint::clock::Timestamp::parse(reply["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!(expires.millis_since(created), 60_000);
}

#[test]
fn create_validates_its_bounds() {
    let env = Env::new();
    for args in [
        vec!["--expires-in-hours", "721"],
        vec!["--expires-in-hours", "0"],
        vec!["--quorum", "3", "--member", "a", "--member", "b"],
        vec!["--quorum", "some"],
        vec!["--max-signals", "0"],
        vec!["--member", "a", "--member", "a"],
        vec!["--session", "../evil"],
    ] {
        let mut all = vec!["create", "--label", "t", "--intent", "i"];
        all.extend(args.iter());
        env.expect_code(&format!("{args:?}"), &env.waitpoint(&all), 2);
    }
}

#[test]
fn cli_refusals_name_the_request_field_and_add_the_flag() {
    let env = Env::new();
    for (args, text) in [
        (
            vec!["--max-signals", "0"],
            "max_signals must be 1-10000 (the flag --max-signals)",
        ),
        (
            vec!["--member", "a", "--member", "a"],
            "members name \"a\" twice (the flag --member)",
        ),
        (
            vec!["--quorum", "some"],
            "quorum must be a number or \"all\", not \"some\" (the flag --quorum)",
        ),
        // A negative number is a value, not an unknown flag; too small to signal in, refused.
        (
            vec!["--expires-in-hours", "-1"],
            "expires_in_hours must be at least 0.0003 (one second) and at most 720, not -1.0 (the \
             flag --expires-in-hours)",
        ),
        (
            vec!["--expires-in-hours", "1e-300"],
            "expires_in_hours must be at least 0.0003 (one second) and at most 720, not 1e-300 \
             (the flag --expires-in-hours)",
        ),
    ] {
        let mut all = vec!["create", "--label", "t", "--intent", "i"];
        all.extend(args.iter());
        let out = env.waitpoint(&all);
        env.expect_code(&format!("{args:?}"), &out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim(), format!("waitpoint: {text}"));
    }
    let out = env.waitpoint(&[
        "timer",
        "create",
        "--after-ms",
        "5",
        "--summary",
        &"s".repeat(5000),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("summary must be at most") && stderr.ends_with("(the flag --summary)\n"),
        "{stderr}"
    );
}

#[test]
fn home_is_created_private() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let fresh = env.home.join("nested-new-home");
    let out = env
        .command(WAITPOINT)
        .args([
            "--home",
            fresh.to_str().unwrap(),
            "create",
            "--label",
            "t",
            "--intent",
            "i",
            "--json",
        ])
        .output()
        .unwrap();
    env.ok("create", &out);
    for p in [
        &fresh,
        &fresh.join("waitpoints"),
        &fresh.join("tmp/signals"),
    ] {
        assert_eq!(
            fs::metadata(p).unwrap().permissions().mode() & 0o777,
            0o700,
            "{}",
            p.display()
        );
    }
    let wp_dir = fs::read_dir(fresh.join("waitpoints"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mode = fs::metadata(wp_dir.join("waitpoint.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}
