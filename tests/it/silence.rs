//! Silence is news (issue 18): `started_within`, `heartbeat_within`, `run --heartbeat` and the
//! device outage wake. Each rule is played on the daemon's manual clock, so "nothing happened
//! yet" is asserted after a barrier the daemon acknowledged, never after a sleep.

use std::fs;

use serde_json::Value;

use crate::helpers::*;

const MIN: i64 = 60_000;

/// The job these tests watch, armed on a [`Live`] daemon's clock for ten hours; each test adds
/// its silence windows and report count.
fn train() -> Arming {
    Arming::new("train")
        .intent("tell me if the run dies")
        .no_fail_fast()
        .expires_in_hours(10.0)
}

fn wakes(env: &Env) -> Vec<Value> {
    let mut w = env.inbox("default", "new");
    w.sort_by_key(|w| w["created_at"].as_str().unwrap_or("").to_owned());
    w
}

fn kinds(env: &Env) -> Vec<String> {
    wakes(env)
        .iter()
        .map(|w| w["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// Drops a signal file and waits until the daemon counted it.
fn report(env: &Env, id: &str, secret: &str, status: &str, message: &str, n: u64) {
    let extra = format!(r#","status":"{status}","message":"{message}""#);
    env.drop_file(&format!("r{n}"), &body(id, secret, &extra));
    env.wait_until("the report counted", || {
        env.state(id)["counters"]["signals"] == n
    });
}

#[test]
fn a_job_that_never_reports_wakes_once_at_started_within_and_stays_armed() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, secret) = train().started_within_ms(10 * MIN as u64).on(&live.engine);
    live.advance_ms(9 * MIN);
    live.settle();
    assert!(wakes(&env).is_empty(), "not before the window ends");
    live.advance_ms(MIN);
    env.wait_until("the not_started wake", || wakes(&env).len() == 1);
    let w = &wakes(&env)[0];
    assert_eq!(w["kind"], "not_started");
    let text = w["text"].as_str().unwrap();
    assert!(
        text.contains(
            "nothing has reported in 10m 0s since it was armed: is the signal line wired?"
        ),
        "{text}"
    );
    // The recommended line, repeated with a placeholder: the secret is never in a wake.
    assert!(
        text.contains(&format!(
            "CORTEX_SIGNAL_ID={id} CORTEX_SIGNAL_SECRET=SECRET cortex-signal"
        )),
        "{text}"
    );
    assert!(!text.contains(&secret), "the secret leaked into the wake");
    assert!(text.contains("What to do"), "{text}");
    assert_eq!(env.state(&id)["status"], "armed");
    // Quiet from now on, and a later signal counts as usual.
    live.advance_ms(60 * MIN);
    live.settle();
    assert_eq!(kinds(&env), ["not_started"], "one wake, not a schedule");
    report(&env, &id, &secret, "ok", "done", 1);
    env.wait_until("resolved", || env.state(&id)["status"] == "resolved");
    assert_eq!(kinds(&env), ["not_started", "resolved"]);
}

#[test]
fn a_job_that_goes_quiet_wakes_with_its_last_report_and_a_later_report_re_arms_the_watch() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, secret) = train()
        .heartbeat_within_ms(5 * MIN as u64)
        .max_signals(3)
        .on(&live.engine);
    live.advance_ms(20 * MIN);
    live.settle();
    assert!(
        wakes(&env).is_empty(),
        "no heartbeat watch before the first report"
    );
    report(&env, &id, &secret, "progress", "step 1200", 1);
    live.advance_ms(4 * MIN);
    live.settle();
    assert!(wakes(&env).is_empty(), "inside the window");
    live.advance_ms(MIN);
    env.wait_until("the went_quiet wake", || wakes(&env).len() == 1);
    let w = &wakes(&env)[0];
    assert_eq!(w["kind"], "went_quiet");
    let text = w["text"].as_str().unwrap();
    assert!(
        text.contains(
            "the job went quiet: nothing since its last report (progress, seq 1) 5m 0s ago"
        ),
        "{text}"
    );
    // The job's own words are data, inside the frame.
    assert_framed_as_data(text, "step 1200");
    assert_eq!(w["reports"][0]["seq"], 1);
    let state = env.state(&id);
    assert_eq!(state["status"], "armed");
    assert_eq!(state["silence"]["quiet_after_seq"], 1);
    // The record and the wake match their layouts.
    let schemas = crate::layouts::Schemas::load();
    schemas.check(
        "waitpoint",
        &env.home.join(format!("waitpoints/{id}/waitpoint.json")),
    );
    for f in fs::read_dir(env.home.join("sessions/default/wakes/new"))
        .unwrap()
        .flatten()
    {
        schemas.check("wake", &f.path());
    }
    // One wake per silence: nothing more while it stays quiet.
    live.advance_ms(30 * MIN);
    live.settle();
    assert_eq!(kinds(&env), ["went_quiet"]);
    // Back: a report re-arms the watch; the next silence wakes again.
    report(&env, &id, &secret, "progress", "step 2400", 2);
    live.advance_ms(4 * MIN);
    live.settle();
    assert_eq!(kinds(&env), ["went_quiet"], "re-armed, not fired");
    live.advance_ms(MIN);
    env.wait_until("the second silence", || wakes(&env).len() == 2);
    assert_eq!(kinds(&env), ["went_quiet", "went_quiet"]);
    // Silence wakes do not count toward max_signals: the monitor's own wakes are all left.
    report(&env, &id, &secret, "ok", "epoch 1", 3);
    env.wait_until("the report wake", || wakes(&env).len() == 3);
    let all = wakes(&env);
    let last = all.iter().find(|w| w["kind"] == "report").unwrap();
    assert!(
        last["summary"].as_str().unwrap().contains("wake 1 of 3"),
        "{last}"
    );
    assert_eq!(env.state(&id)["status"], "armed");
}

#[test]
fn a_silence_that_would_end_after_the_deadline_is_left_to_the_deadline_notice() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, secret) = Arming::new("short")
        .expires_in_hours(0.1) // six minutes
        .heartbeat_within_ms((5 * MIN) as u64)
        .started_within_ms((5 * MIN + 30_000) as u64)
        .on(&live.engine);
    live.advance_ms(2 * MIN);
    report(&env, &id, &secret, "progress", "alive", 1);
    live.advance_ms(5 * MIN);
    // The state is written with the wake in its outbox before the wake reaches the inbox:
    // wait for the wake itself.
    env.wait_until("the deadline wake", || {
        env.state(&id)["status"] == "expired" && !wakes(&env).is_empty()
    });
    assert_eq!(kinds(&env), ["deadline"]);
}

#[test]
fn a_spent_hourly_cap_holds_a_silence_wake_until_the_hour_has_room() {
    let env = Env::new();
    fs::write(
        env.home.join("settings.json"),
        r#"{"waitpointMaxWakesPerHour": 1}"#,
    )
    .unwrap();
    let live = Live::start(&env, T0);
    let (id, secret) = train()
        .heartbeat_within_ms(5 * MIN as u64)
        .max_signals(5)
        .on(&live.engine);
    report(&env, &id, &secret, "ok", "epoch 1", 1);
    env.wait_until("the report wake", || wakes(&env).len() == 1);
    live.advance_ms(6 * MIN);
    live.settle();
    assert_eq!(kinds(&env), ["report"], "the cap is spent");
    assert!(
        env.state(&id)["silence"]["held_until"].is_string(),
        "{}",
        env.state(&id)
    );
    live.advance_ms(55 * MIN);
    env.wait_until("the held silence wake", || wakes(&env).len() == 2);
    assert_eq!(kinds(&env), ["report", "went_quiet"]);
}

#[test]
fn a_restart_recomputes_the_watches_and_a_silence_that_ended_meanwhile_is_not_reported() {
    let env = Env::new();
    // A hook makes a drained wake due at once, so the start-up drain services what is due
    // mid-way: the silence watches must wait until the whole backlog is in.
    fs::write(env.home.join("settings.json"), r#"{"onWake": ["true"]}"#).unwrap();
    let clock = std::sync::Arc::new(waitpoint::clock::ManualClock::new(T0));
    let live = Live::start_with(&env, clock.clone());
    let (quiet, q_secret) = train()
        .heartbeat_within_ms(5 * MIN as u64)
        .max_signals(3)
        .on(&live.engine);
    let (back, b_secret) = train()
        .started_within_ms(5 * MIN as u64)
        .heartbeat_within_ms(5 * MIN as u64)
        .max_signals(3)
        .on(&live.engine);
    let (done, d_secret) = Arming::new("done").expires_in_hours(10.0).on(&live.engine);
    let (filler, f_secret) = Arming::new("filler")
        .max_signals(1000)
        .expires_in_hours(10.0)
        .on(&live.engine);
    report(&env, &quiet, &q_secret, "progress", "a", 1);
    live.stop();
    // While no daemon runs: another job finishes, a busy one reports more than one batch's
    // worth, and `back`'s job reports last in name order (so in the drain's last batch); the
    // clock passes every window.
    env.drop_file("a-done", &body(&done, &d_secret, ""));
    for n in 0..waitpoint::engine::MAX_BATCH {
        let progress = r#","status":"progress""#;
        env.drop_file(&format!("b-{n:03}"), &body(&filler, &f_secret, progress));
    }
    env.drop_file(
        "z-late",
        &body(&back, &b_secret, r#","status":"progress","message":"late""#),
    );
    clock.advance_ms(10 * MIN);
    let live = Live::start_with(&env, clock.clone());
    env.wait_until("the late report counted", || {
        env.state(&back)["counters"]["signals"] == 1
    });
    let of = |id: &str| -> Vec<String> {
        wakes(&env)
            .iter()
            .filter(|w| w["waitpoint"]["id"] == id)
            .map(|w| w["kind"].as_str().unwrap().to_owned())
            .collect()
    };
    env.wait_until("the quiet one's wake", || of(&quiet).len() == 1);
    live.settle();
    assert_eq!(of(&quiet), ["went_quiet"]);
    assert_eq!(of(&done), ["resolved"]);
    assert!(
        of(&back).is_empty(),
        "back reported during the outage: {:?}",
        of(&back)
    );
    // `back`'s heartbeat window runs from that report.
    live.advance_ms(5 * MIN);
    env.wait_until("back's own silence", || of(&back).len() == 1);
    assert_eq!(of(&back), ["went_quiet"]);
    // And a restart does not send what was already sent.
    live.stop();
    let live = Live::start_with(&env, clock);
    live.settle();
    assert_eq!((of(&quiet).len(), of(&back).len()), (1, 1));
}

#[test]
fn check_and_show_carry_the_last_report_and_a_quiet_badge() {
    let env = Env::new();
    let live = Live::start(&env, T0);
    let (id, secret) = train()
        .heartbeat_within_ms(5 * MIN as u64)
        .max_signals(3)
        .on(&live.engine);
    report(&env, &id, &secret, "progress", "step 9", 1);
    live.advance_ms(5 * MIN);
    env.wait_until("the went_quiet wake", || wakes(&env).len() == 1);
    live.settle();
    let check: Value =
        serde_json::from_str(&env.ok("check", &env.waitpoint(&["check", "--json"]))).unwrap();
    let item = &check["waiting"][0];
    assert_eq!(item["last_report"]["status"], "progress", "{check}");
    let badges: Vec<&str> = item["badges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["kind"].as_str().unwrap())
        .collect();
    assert!(badges.contains(&"quiet"), "{check}");
    let show = env.ok("show", &env.waitpoint(&["show", &id]));
    assert!(show.contains("silence   heartbeat_within 5m 0s"), "{show}");
    assert!(show.contains("quiet: no report for"), "{show}");
}

#[test]
fn silence_windows_are_checked_and_named_by_their_flags() {
    let env = Env::new();
    for (args, text) in [
        (
            vec!["--heartbeat-within", "500ms"],
            "heartbeat_within_s must be at least 1 second",
        ),
        (
            vec!["--started-within", "30d"],
            "started_within_s must be shorter than the waitpoint's lifetime",
        ),
        (vec!["--started-within", "ten"], "is not a duration"),
    ] {
        let mut all = vec!["create", "--label", "x", "--intent", "i"];
        all.extend(&args);
        let out = env.waitpoint(&all);
        env.expect_code(&format!("{args:?}"), &out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(text), "{args:?}: {stderr}");
    }
    // Armed with both: the record says so, and how_to_signal offers the run line.
    let reply = env.create(&[
        "--label",
        "x",
        "--intent",
        "i",
        "--started-within",
        "10m",
        "--heartbeat-within",
        "90s",
    ]);
    let (id, _) = id_secret(&reply);
    let silence = &env.state(&id)["silence"];
    assert_eq!(silence["started_within_ms"], 600_000);
    assert_eq!(silence["heartbeat_within_ms"], 90_000);
    let run = reply["how_to_signal"]["run"].as_str().unwrap();
    assert!(
        run.contains("waitpoint run --heartbeat 60s -- COMMAND"),
        "{run}"
    );
}

/// The inbox's wakes of one kind.
fn of_kind(env: &Env, kind: &str) -> Vec<Value> {
    wakes(env)
        .into_iter()
        .filter(|w| w["kind"] == kind)
        .collect()
}

/// Arms a waitpoint with a 3 s heartbeat window through the CLI; its id and secret.
fn arm_job(env: &Env) -> (String, String) {
    let reply = env.create(&[
        "--label",
        "job",
        "--intent",
        "i",
        "--heartbeat-within",
        "3s",
    ]);
    id_secret(&reply)
}

/// `waitpoint run --heartbeat 1s -- sh -c SCRIPT` for the waitpoint, its id and secret in the
/// environment.
fn run_beating(env: &Env, id: &str, secret: &str, script: &str) -> std::process::Command {
    let mut c = env.command(WAITPOINT);
    c.args(["run", "--heartbeat", "1s", "--", "sh", "-c", script])
        .env("CORTEX_SIGNAL_ID", id)
        .env("CORTEX_SIGNAL_SECRET", secret);
    c
}

#[test]
fn a_run_heartbeat_job_killed_with_its_wrapper_is_reported_quiet_within_one_window() {
    use std::os::unix::process::CommandExt;
    let env = Env::new();
    let _d = env.daemon();
    let (id, secret) = arm_job(&env);
    // The wrapper and its job in a process group of their own, as one machine's processes.
    let mut wrapper = run_beating(
        &env,
        &id,
        &secret,
        "echo step 1; echo step 2; exec sleep 600",
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .process_group(0)
    .spawn()
    .unwrap();
    env.wait_until("a heartbeat with the last output line", || {
        let s = env.state(&id);
        s["counters"]["progress"].as_u64().unwrap_or(0) >= 1
            && s["silence"]["last_report"]["message"] == "step 2"
    });
    // The OOM killer takes both (the whole group), so no final report is ever sent.
    let pgid = rustix::process::Pid::from_raw(wrapper.id() as i32).unwrap();
    rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL).unwrap();
    let _ = wrapper.wait();
    let beats = env.state(&id)["counters"]["signals"].as_u64().unwrap();
    env.wait_until("the went_quiet wake", || {
        !of_kind(&env, "went_quiet").is_empty()
    });
    let w = &of_kind(&env, "went_quiet")[0];
    let text = w["text"].as_str().unwrap();
    assert!(text.contains(&format!("(progress, seq {beats})")), "{text}");
    assert_framed_as_data(text, "step 2");
    let s = env.state(&id);
    assert_eq!(s["status"], "armed");
    assert_eq!(s["counters"]["ok"], 0, "no final report came");
}

/// Arms a waitpoint bound to device `gpu` with a 2 s heartbeat window; the create reply.
fn arm_on_gpu(env: &Env) -> Value {
    env.create(&[
        "--label",
        "remote",
        "--intent",
        "i",
        "--device",
        "gpu",
        "--heartbeat-within",
        "2s",
    ])
}

#[test]
fn a_device_out_of_reach_longer_than_heartbeat_within_wakes_its_waitpoints_once() {
    let mut sshd = crate::sshd::Sshd::start();
    let env = Env::new();
    crate::devices::add_device(&env, &sshd, "gpu", &[]);
    let d = env.daemon();
    let reply = arm_on_gpu(&env);
    let (id, _) = id_secret(&reply);
    let status = || crate::devices::status(&env, "gpu");
    env.wait_until("a good round", || status()["reachable"] == true);
    sshd.kill();
    env.wait_until("the device_unreachable wake", || {
        !of_kind(&env, "device_unreachable").is_empty()
    });
    let w = &of_kind(&env, "device_unreachable")[0];
    let text = w["text"].as_str().unwrap();
    assert!(
        text.contains("device gpu has been unreachable for"),
        "{text}"
    );
    assert!(text.contains("cannot connect"), "{text}");
    assert_eq!(w["waitpoint"]["id"], id.as_str());
    // Once per outage: later failed rounds of the same outage add nothing.
    let failures = status()["failures"].as_u64().unwrap();
    env.wait_until("two more failed rounds", || {
        status()["failures"].as_u64().unwrap_or(0) >= failures + 2
    });
    assert_eq!(of_kind(&env, "device_unreachable").len(), 1);
    assert_eq!(env.state(&id)["status"], "armed");
    // Nor does a restart: the outage noticed is on the record. The restarted daemon's first
    // round fails at once; `device poll` then queues behind that round's report in the
    // daemon's loop and returns once a second round is done, so both have been heard.
    drop(d);
    let failures = status()["failures"].as_u64().unwrap();
    let _d = env.daemon();
    env.wait_until("the first round after the restart", || {
        status()["failures"].as_u64().unwrap_or(0) > failures
    });
    let polled = env.waitpoint(&["device", "poll", "gpu", "--timeout", "100"]);
    assert!(polled.status.code().is_some(), "{}", env.report(&polled));
    assert!(status()["failures"].as_u64().unwrap() >= failures + 2);
    assert_eq!(of_kind(&env, "device_unreachable").len(), 1);
}

#[test]
fn run_heartbeats_say_nothing_on_stderr_and_carry_the_last_output_line() {
    let env = Env::new();
    let (id, secret) = arm_job(&env);
    // No daemon: every report is spooled, so the files show what was sent.
    let out = run_beating(&env, &id, &secret, "echo compiling; sleep 2.5; echo linked")
        .output()
        .unwrap();
    env.ok("run", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("spooled").count(),
        1,
        "only the final report is told: {stderr}"
    );
    let mut beats = 0;
    let mut finals = 0;
    for f in fs::read_dir(env.drop_zone()).unwrap().flatten() {
        let Ok(bytes) = fs::read(f.path()) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        match v["status"].as_str() {
            Some("progress") => {
                beats += 1;
                assert_eq!(v["message"], "compiling", "{v}");
                assert!(v.get("data").is_none_or(Value::is_null), "{v}");
            }
            Some("ok") => finals += 1,
            _ => {}
        }
    }
    assert!(beats >= 1, "no heartbeat was sent");
    assert_eq!(finals, 1);
}

#[test]
fn a_device_job_goes_quiet_only_after_a_round_found_nothing_and_one_outage_wakes_once() {
    let mut sshd = crate::sshd::Sshd::start();
    let env = Env::new();
    crate::devices::add_device(&env, &sshd, "gpu", &[]);
    let _d = env.daemon();
    let reply = arm_on_gpu(&env);
    let (id, secret) = id_secret(&reply);
    assert!(
        reply["how_to_signal"]["run"].is_null(),
        "no run line for a device: {reply}"
    );
    sshd.drop_remote("beat", &body(&id, &secret, r#","status":"progress""#));
    env.wait_until("the device's report counted", || {
        env.state(&id)["counters"]["signals"] == 1
    });
    let reported = waitpoint::clock::Timestamp::parse(
        env.state(&id)["silence"]["last_report"]["at"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    env.wait_until("the went_quiet wake", || {
        !of_kind(&env, "went_quiet").is_empty()
    });
    // Told only once a round after the window's end had looked at the device.
    let text = of_kind(&env, "went_quiet")[0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let round = text
        .split("last good round ")
        .nth(1)
        .and_then(|t| t.split(')').next())
        .and_then(waitpoint::clock::Timestamp::parse)
        .unwrap_or_else(|| panic!("no last good round in {text}"));
    assert!(round.millis_since(reported) >= 2_000, "{text}");
    // Back, then the device goes: one wake for that silence, not a went_quiet and a
    // device_unreachable both.
    sshd.drop_remote("beat2", &body(&id, &secret, r#","status":"progress""#));
    env.wait_until("the second report counted", || {
        env.state(&id)["counters"]["signals"] == 2
    });
    sshd.kill();
    let silences = || of_kind(&env, "went_quiet").len() + of_kind(&env, "device_unreachable").len();
    env.wait_until("a wake for the second silence", || silences() == 2);
    let failures = crate::devices::status(&env, "gpu")["failures"]
        .as_u64()
        .unwrap();
    env.wait_until("two more failed rounds", || {
        crate::devices::status(&env, "gpu")["failures"]
            .as_u64()
            .unwrap_or(0)
            >= failures + 2
    });
    let polled = env.waitpoint(&["device", "poll", "gpu", "--timeout", "100"]);
    assert!(polled.status.code().is_some(), "{}", env.report(&polled));
    assert_eq!(silences(), 2, "{:?}", kinds(&env));
}

#[test]
fn heartbeats_for_a_closed_waitpoint_stop_without_a_word() {
    let env = Env::new();
    let (id, secret) = arm_job(&env);
    env.ok("cancel", &env.waitpoint(&["cancel", &id]));
    let out = run_beating(&env, &id, &secret, "sleep 2.5")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The final report is judged (closed) and said once; no beat said anything.
    assert_eq!(stderr.matches("judged from").count(), 1, "{stderr}");
}
