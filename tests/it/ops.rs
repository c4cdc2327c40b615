//! Operations: `run` and `attach` signal what happened, `doctor` finds what is wrong, and the
//! daemon behaves as a service (SIGTERM mid-drain loses nothing, SIGHUP reloads, logs name
//! the waitpoint, a large backlog is summarised in the log).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

use crate::helpers::*;

/// The signal records of a waitpoint, oldest first.
fn records(env: &Env, id: &str) -> Vec<Value> {
    crate::invariants::records_of(&env.home, id)
}

fn stdout_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn only_spooled_body(env: &Env) -> Value {
    let names = env.spooled();
    assert_eq!(names.len(), 1, "{names:?}\n{}", env.tree());
    serde_json::from_slice(&fs::read(env.drop_zone().join(&names[0])).unwrap()).unwrap()
}

#[test]
fn run_passes_output_through_and_signals_ok_with_the_tail() {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("job", &[]));
    let _d = env.daemon();
    let out = env.waitpoint(&[
        "run",
        "--id",
        &id,
        "--secret",
        &secret,
        "--",
        "sh",
        "-c",
        "echo to-stdout; echo to-stderr >&2",
    ]);
    env.ok("run", &out);
    assert!(
        stdout_of(&out).contains("to-stdout"),
        "{}",
        env.report(&out)
    );
    assert!(
        stderr_of(&out).contains("to-stderr"),
        "{}",
        env.report(&out)
    );
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    let recs = records(&env, &id);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0]["status"], "ok");
    assert_eq!(recs[0]["message"], "exit=0");
    let data = recs[0]["data"].as_str().unwrap();
    assert!(
        data.contains("to-stdout\n") && data.contains("to-stderr\n"),
        "{data:?}"
    );
}

#[test]
fn run_signals_fail_with_the_exit_code_and_only_the_last_lines() {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("job", &[]));
    let _d = env.daemon();
    // The id and secret come from the environment, as for cortex-signal.
    let out = env
        .command(WAITPOINT)
        .env("CORTEX_SIGNAL_ID", &id)
        .env("CORTEX_SIGNAL_SECRET", &secret)
        .args([
            "run",
            "--tail-lines",
            "3",
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 200 ]; do i=$((i+1)); echo line $i; done; exit 3",
        ])
        .output()
        .unwrap();
    env.expect_code("run", &out, 3);
    env.expect_code(
        "wait",
        &env.waitpoint(&["wait", &id, "--timeout", "120"]),
        4,
    );
    let recs = records(&env, &id);
    assert_eq!(recs[0]["status"], "fail");
    assert_eq!(recs[0]["message"], "exit=3");
    assert_eq!(recs[0]["data"], "line 198\nline 199\nline 200\n");
}

#[test]
fn run_reports_death_by_signal_as_128_plus_n_and_a_missing_command_as_127() {
    let env = Env::new();
    let id = "wp_0123456789ab";
    let run = |command: &[&str]| {
        let mut args = vec!["run", "--id", id, "--secret", "s", "--"];
        args.extend_from_slice(command);
        env.waitpoint(&args)
    };
    let out = run(&["sh", "-c", "kill -TERM $$"]);
    env.expect_code("killed", &out, 143);
    let body = only_spooled_body(&env);
    assert_eq!(
        (body["status"].as_str(), body["message"].as_str()),
        (Some("fail"), Some("exit=143"))
    );
    fs::remove_dir_all(env.drop_zone()).unwrap();

    let out = run(&["no-such-command-anywhere"]);
    env.expect_code("not found", &out, 127);
    let body = only_spooled_body(&env);
    assert_eq!(body["message"], "exit=127");
    assert!(
        body["data"]
            .as_str()
            .unwrap()
            .contains("no-such-command-anywhere")
    );
}

#[test]
fn run_without_a_secret_is_a_usage_error_and_does_not_run_the_command() {
    let env = Env::new();
    let marker = env.home.join("../ran");
    let script = format!("touch {}", marker.display());
    let out = env.waitpoint(&["run", "--id", "wp_0123456789ab", "--", "sh", "-c", &script]);
    env.expect_code("no secret", &out, 2);
    assert!(!marker.exists(), "the command must not run");
    assert!(env.spooled().is_empty());
}

#[test]
fn attach_signals_when_the_process_ends() {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("attached", &[]));
    let _d = env.daemon();
    let mut job = Command::new("sleep").arg("300").spawn().unwrap();
    let pid = job.id().to_string();
    let mut attach = env
        .command(WAITPOINT)
        .args(["attach", "--pid", &pid, "--id", &id, "--secret", &secret])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the job runs, nothing has been signalled.
    assert_eq!(env.state(&id)["counters"]["signals"], 0);
    assert!(
        attach.try_wait().unwrap().is_none(),
        "attach returned early"
    );
    job.kill().unwrap();
    job.wait().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = attach.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < PATIENCE, "attach did not return");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "attach exited {status:?}");
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    let recs = records(&env, &id);
    assert_eq!(recs[0]["status"], "ok");
    assert_eq!(recs[0]["message"], format!("pid {pid} exited"));
}

/// A home in the shape a real install has: private modes throughout.
fn private_env() -> Env {
    let env = Env::new();
    env.ok("init", &env.waitpoint(&["check"]));
    fs::set_permissions(&env.home, fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(
        env.home.join("settings.json"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    env
}

fn doctor(env: &Env) -> (Option<i32>, Vec<String>) {
    let out = env.waitpoint(&["doctor"]);
    let lines: Vec<String> = stdout_of(&out).lines().map(str::to_owned).collect();
    for line in &lines {
        assert!(
            ["OK ", "WARN ", "FAIL "]
                .iter()
                .any(|p| line.starts_with(p)),
            "not a check line: {line:?}"
        );
    }
    (out.status.code(), lines)
}

fn line<'a>(lines: &'a [String], check: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.split_whitespace().nth(1) == Some(check))
        .unwrap_or_else(|| panic!("no {check} line in {lines:#?}"))
}

#[test]
fn doctor_passes_a_healthy_home_with_a_running_daemon() {
    let env = private_env();
    let _d = env.daemon();
    let (code, lines) = doctor(&env);
    assert_eq!(code, Some(0), "{lines:#?}");
    assert!(line(&lines, "daemon").starts_with("OK"), "{lines:#?}");
    assert!(line(&lines, "drop-zone").starts_with("OK"), "{lines:#?}");
    assert!(line(&lines, "modes").starts_with("OK"), "{lines:#?}");
}

/// A home made with a plain `mkdir` (0755, its settings.json 0644) is one the daemon runs on:
/// doctor warns, naming the command that makes it private, and exits 0 as for any warning.
#[test]
fn doctor_warns_on_a_home_made_with_mkdir_that_the_daemon_runs_on() {
    let env = Env::new();
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&env.home), 0o755, "the test home is a plain mkdir's");
    let _d = env.daemon();
    let dir = env.home.join("waitpoints");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let (code, lines) = doctor(&env);
    assert_eq!(code, Some(0), "{lines:#?}");
    let modes = line(&lines, "modes");
    assert!(modes.starts_with("WARN"), "{modes}");
    assert!(
        modes.contains(&format!("chmod 700 {}", env.home.display())),
        "{modes}"
    );
    assert!(modes.contains(&dir.display().to_string()), "{modes}");
}

/// What the daemon refuses, doctor fails: a home other users can write.
#[test]
fn doctor_fails_on_a_home_others_can_write_which_the_daemon_refuses() {
    let env = private_env();
    fs::set_permissions(&env.home, fs::Permissions::from_mode(0o777)).unwrap();
    let (code, lines) = doctor(&env);
    assert_eq!(code, Some(1), "{lines:#?}");
    let modes = line(&lines, "modes");
    assert!(modes.starts_with("FAIL"), "{modes}");
    assert!(
        modes.contains(&format!("chmod go-w {}", env.home.display())),
        "{modes}"
    );
    let (code, stderr) = env.daemon_spawned(&[], &[]).wait_exit();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("lets other users write"), "{stderr}");
}

#[test]
fn doctor_fails_on_a_missing_drop_zone_and_does_not_create_it() {
    let env = private_env();
    fs::remove_dir_all(env.drop_zone()).unwrap();
    let (code, lines) = doctor(&env);
    assert_eq!(code, Some(1), "{lines:#?}");
    let dz = line(&lines, "drop-zone");
    assert!(dz.starts_with("FAIL") && dz.contains("mkdir"), "{dz}");
    assert!(!env.drop_zone().exists(), "doctor must change nothing");
}

#[test]
fn doctor_tells_a_stale_lock_from_a_clean_stop() {
    let env = private_env();
    let d = env.daemon();
    let pid = d.pid();
    d.kill();
    let (code, lines) = doctor(&env);
    assert_eq!(code, Some(1), "{lines:#?}");
    let daemon = line(&lines, "daemon");
    assert!(
        daemon.starts_with("FAIL")
            && daemon.contains("stale lock")
            && daemon.contains(&pid.to_string()),
        "{daemon}"
    );

    let mut d = env.daemon();
    d.send(Signal::TERM);
    assert_eq!(d.wait_exit().0, Some(0));
    let (code, lines) = doctor(&env);
    let daemon = line(&lines, "daemon");
    assert!(
        daemon.starts_with("WARN") && daemon.contains("no daemon is running"),
        "{daemon}"
    );
    assert_eq!(code, Some(0), "{lines:#?}");
}

#[test]
fn sigterm_during_a_busy_drain_loses_nothing_and_exits_zero() {
    const FILES: usize = 2_000;
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("backlog", &[]));
    let text = body(&id, &secret, r#","status":"progress""#);
    let names: Vec<String> = (0..FILES).map(|i| format!("b{i:05}")).collect();
    for name in &names {
        env.drop_file(name, &text);
    }
    let mut d = env.daemon_started(&[]);
    env.wait_until("the drain to be under way", || {
        env.spooled().len() < FILES - 20
    });
    d.send(Signal::TERM);
    let (code, stderr) = d.wait_exit();
    assert_eq!(code, Some(0), "{stderr}");

    let check = |expect_all_recorded: bool| {
        let mut recorded: BTreeMap<String, usize> = BTreeMap::new();
        for r in records(&env, &id) {
            let source = r["source"].as_str().unwrap();
            let name = source.strip_prefix("spool:").unwrap();
            *recorded
                .entry(name.trim_end_matches(".json").to_owned())
                .or_default() += 1;
        }
        let spooled: Vec<String> = env
            .spooled()
            .iter()
            .map(|n| n.trim_end_matches(".json").to_owned())
            .collect();
        // The log keeps the first heartbeats and folds the rest into the state's counts
        // (`engine::rules::keep_whole`): a name is in the log once, or folded, or spooled.
        let folded = env.state(&id)["log"]["folded_progress"]
            .as_u64()
            .unwrap_or(0) as usize;
        for name in &names {
            let times = recorded.get(name).copied().unwrap_or(0);
            let waiting = spooled.contains(name);
            assert!(
                times <= 1 && !(times == 1 && waiting),
                "{name}: recorded {times} time(s), spooled {waiting}"
            );
        }
        assert_eq!(
            env.state(&id)["counters"]["signals"].as_u64().unwrap() as usize,
            recorded.len() + folded
        );
        assert_eq!(
            recorded.len() + folded + spooled.len(),
            FILES,
            "lost or doubled"
        );
        if expect_all_recorded {
            assert_eq!(recorded.len() + folded, FILES);
            assert!(spooled.is_empty());
        }
    };
    check(false);

    // Thousands of durable commits: allow for a slow, shared disk.
    let slow = PATIENCE * 10;
    let _d = env.daemon_started(&[]);
    env.wait_until_within("the rest of the backlog", slow, || env.spooled().is_empty());
    env.wait_until_within("the summary line", slow, || {
        fs::read_to_string(env.home.join("log/daemon.log"))
            .is_ok_and(|l| l.contains("backlog drained"))
    });
    check(true);
    let log = fs::read_to_string(env.home.join("log/daemon.log")).unwrap();
    assert!(log.contains("shutting down on signal"), "{log}");
    assert!(log.contains("draining a backlog of"), "{log}");
}

#[test]
fn sighup_reloads_settings_and_keeps_them_when_the_file_is_malformed() {
    let env = Env::new();
    let mut d = env.daemon_started(&[]);
    env.wait_until("ready", || {
        fs::read_to_string(env.home.join("log/daemon.log"))
            .is_ok_and(|l| l.contains("daemon ready"))
    });
    fs::write(
        env.home.join("settings.json"),
        r#"{"waitpointSweepMs": 300, "waitpointMaxWakesPerHour": 30}"#,
    )
    .unwrap();
    d.send(Signal::HUP);
    let log = || fs::read_to_string(env.home.join("log/daemon.log")).unwrap();
    env.wait_until("the reload", || log().contains("settings reloaded"));
    assert!(log().contains("max_wakes_per_hour=30"), "{}", log());

    fs::write(env.home.join("settings.json"), "{not json").unwrap();
    d.send(Signal::HUP);
    env.wait_until("the refusal", || {
        log().contains("keeping the current settings")
    });
    // Still collecting after both.
    fs::write(env.home.join("settings.json"), "{}").unwrap();
    let (id, secret) = id_secret(&env.arm("t", &[]));
    env.drop_file("after-hup", &body(&id, &secret, ""));
    env.wait_drained();
    assert_eq!(env.state(&id)["status"], "resolved");
    d.send(Signal::INT);
    assert_eq!(d.wait_exit().0, Some(0));
}

/// A daemon logging in `format` that collected one good signal file and one with a wrong
/// secret, then stopped: its home, its guard (for its stderr) and the waitpoint's id.
fn logged_a_good_and_a_refused_file(format: &str) -> (Env, DaemonGuard, String) {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("t", &["--max-signals", "3"]));
    let mut d = env.daemon_started(&["--log-format", format]);
    env.drop_file("good", &body(&id, &secret, ""));
    env.drop_file("wrong-secret", &body(&id, "nope", ""));
    env.wait_drained();
    d.send(Signal::TERM);
    assert_eq!(d.wait_exit().0, Some(0));
    (env, d, id)
}

#[test]
fn json_logs_name_the_waitpoint_on_every_line_about_one() {
    let (env, _d, id) = logged_a_good_and_a_refused_file("json");
    let log = fs::read_to_string(env.home.join("log/daemon.log")).unwrap();
    let mut about = 0;
    for line in log.lines() {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["fields"]["message"].is_string(), "{line}");
        if line.contains(&id) {
            about += 1;
            assert_eq!(v["fields"]["waitpoint"], id.as_str(), "{line}");
        }
    }
    // Accepted, delivered, refused and parked at least.
    assert!(about >= 4, "{log}");
}

#[test]
fn without_a_terminal_the_daemons_stderr_and_its_log_file_hold_the_same_lines() {
    // Each line is formatted once for both sinks there: neither may miss one or differ.
    for format in ["text", "json"] {
        let (env, d, id) = logged_a_good_and_a_refused_file(format);
        let log = fs::read_to_string(env.home.join("log/daemon.log")).unwrap();
        let stderr = fs::read_to_string(&d.stderr_path).unwrap();
        assert!(
            log.contains("signal accepted") && log.contains(&id),
            "{log}"
        );
        assert_eq!(stderr, log, "{format}: stderr and log/daemon.log differ");
    }
}

#[test]
fn text_logs_name_the_waitpoint_too() {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("t", &[]));
    let _d = env.daemon();
    env.drop_file("good", &body(&id, &secret, ""));
    env.wait_drained();
    let log = fs::read_to_string(env.home.join("log/daemon.log")).unwrap();
    let accepted = log
        .lines()
        .find(|l| l.contains("signal accepted"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(accepted.contains(&format!("waitpoint={id}")), "{accepted}");
}

#[test]
fn the_systemd_unit_restarts_on_failure_and_runs_a_valid_daemon_command() {
    let unit = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/waitpoint.service"
    ))
    .unwrap();
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in the unit"))
            .to_owned()
    };
    assert_eq!(value("Restart"), "on-failure");
    assert!(value("ExecReload").contains("-HUP"));
    let exec = value("ExecStart");
    let mut words = exec.split_whitespace();
    assert!(words.next().unwrap().ends_with("/waitpoint"), "{exec}");
    let args: Vec<&str> = words.collect();
    assert_eq!(args.first(), Some(&"daemon"), "{exec}");
    // The flags it passes are ones the daemon accepts.
    let env = Env::new();
    let mut with_help = args.clone();
    with_help.push("--help");
    env.ok("the unit's command line", &env.waitpoint(&with_help));
}

#[test]
fn data_from_stdin_past_the_cap_is_refused_clearly_without_reading_it_all() {
    use std::io::Write;
    let env = Env::new();
    let mut child = env
        .command(CORTEX_SIGNAL)
        .args(["--id", "wp_0123456789ab", "--secret", "s", "--data", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Ten megabytes, far past the cap: cortex-signal stops reading early, so the writer gets
    // a broken pipe instead of cortex-signal buffering it all.
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..160 {
            if stdin.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    env.expect_code("oversize stdin", &out, 2);
    let err = stderr_of(&out);
    assert!(
        err.contains("standard input") && err.contains("16000"),
        "{err}"
    );
    assert!(env.spooled().is_empty());
}

#[test]
fn a_large_backlog_shows_progress_on_a_terminal_only() {
    const FILES: usize = 150;
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("bar", &[]));
    let text = body(&id, &secret, r#","status":"progress""#);
    for i in 0..FILES {
        env.drop_file(&format!("p{i:04}"), &text);
    }
    // `script` gives the daemon a terminal for stderr (with TERM set, as in any terminal
    // session) and records what it drew.
    let typescript = env.home.join("../typescript");
    let daemon = format!("{WAITPOINT} daemon");
    let mut script = env
        .command("script")
        .env("TERM", "xterm")
        .args(["-q", "-f", "-e", "-c", &daemon])
        .arg(&typescript)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("script(1) from util-linux; scripts/test-deps installs it");
    let log = env.home.join("log/daemon.log");
    env.wait_until_within("the backlog to drain", PATIENCE * 4, || {
        fs::read_to_string(&log).is_ok_and(|l| l.contains("backlog drained"))
    });
    let pid: i32 = fs::read_to_string(env.home.join("daemon.lock"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The daemon the test started (its pid from the lock it holds).
    let pid = Pid::from_raw(pid).expect("a pid in daemon.lock");
    kill_process(pid, Signal::TERM).expect("SIGTERM to the daemon");
    let start = Instant::now();
    while script.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < PATIENCE, "script did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    let drawn = String::from_utf8_lossy(&fs::read(&typescript).unwrap()).into_owned();
    assert!(
        drawn.contains("draining backlog") && drawn.contains(&format!("/{FILES} files")),
        "{drawn}"
    );
    let log = fs::read_to_string(&log).unwrap();
    assert!(!log.contains("draining backlog "), "no bar in the log file");
    assert!(log.contains(&format!("draining a backlog of {FILES} signal files")));
}

#[test]
fn sigterm_the_moment_the_lock_is_taken_is_still_a_clean_stop() {
    let env = Env::new();
    // The window between taking the lock and the loop is short; several tries make a
    // regression (SIGTERM killing the process like a crash) show up.
    for round in 0..5 {
        let mut d = env.daemon_started(&[]);
        d.send(Signal::TERM);
        let (code, stderr) = d.wait_exit();
        assert_eq!(code, Some(0), "round {round}: {stderr}");
        assert_eq!(
            fs::read_to_string(env.home.join("daemon.lock")).unwrap(),
            "",
            "round {round}: a clean stop empties the lock"
        );
    }
}
