//! The wake adapters (`waitpoint adapter …`) against stand-ins for Claude Code and the Codex CLI:
//! scripts that record the argv, stdin and environment they were given and answer as the real
//! harness documents. The hooks are run the way a harness runs a command hook: the command,
//! its JSON on stdin, its exit status and output read back.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{Env, PATIENCE, WAITPOINT, id_secret, line as signal_line};

/// A stand-in harness program in its own directory: records what it was given under
/// `dir/record/`, and answers with `reply` (or `failing_reply` while `dir/record/fail` exists).
struct StandIn {
    dir: PathBuf,
}

impl StandIn {
    fn new(env: &Env, name: &str, reply: &str, failing_reply: &str) -> StandIn {
        let dir = env.home.join("..").join(format!("standin-{name}"));
        let record = dir.join("record");
        fs::create_dir_all(&record).unwrap();
        let script = format!(
            "#!/bin/sh\nr='{r}'\nprintf '%s\\n' \"$@\" > \"$r/argv.tmp\"\ncat > \"$r/stdin\"\nenv \
             > \"$r/env\"\npwd > \"$r/cwd\"\n\
             if [ -e \"$r/fail\" ]; then printf '%s\\n' '{failing_reply}'; else printf '%s\\n' \
                       '{reply}'; fi\n\
             mv \"$r/argv.tmp\" \"$r/argv\"\n",
            r = record.display()
        );
        let path = dir.join(name);
        fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        StandIn { dir }
    }

    fn record(&self, what: &str) -> String {
        fs::read_to_string(self.dir.join("record").join(what)).unwrap_or_default()
    }

    fn argv(&self) -> Vec<String> {
        self.record("argv").lines().map(str::to_owned).collect()
    }

    fn ran(&self) -> bool {
        self.dir.join("record/argv").exists()
    }

    fn forget_run(&self) {
        let _ = fs::remove_file(self.dir.join("record/argv"));
    }

    fn set_failing(&self, failing: bool) {
        let flag = self.dir.join("record/fail");
        if failing {
            fs::write(flag, "").unwrap();
        } else {
            let _ = fs::remove_file(flag);
        }
    }

    /// `PATH` for a daemon whose onWake finds this stand-in first.
    fn path(&self) -> String {
        let bin = Path::new(WAITPOINT).parent().unwrap();
        format!("{}:{}:/usr/bin:/bin", self.dir.display(), bin.display())
    }
}

const CLAUDE_OK: &str = r#"{"type":"result","subtype":"success","is_error":false,"result":"noted","session_id":"sess-123"}"#;
const CLAUDE_ERR: &str = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"result":"model overloaded","session_id":"sess-123"}"#;
const CODEX_OK: &str = r#"{"type":"thread.started","thread_id":"thr-1"}"#;
const CODEX_FAILED: &str = r#"{"type":"turn.failed","error":{"message":"quota"}}"#;

/// Starts `waitpoint adapter HOOK --session agent --timeout SECS` as a harness does.
fn hook(env: &Env, name: &str, timeout: &str) -> Child {
    start_hook(
        env,
        &["adapter", name, "--session", "agent", "--timeout", timeout],
    )
}

/// Starts a hook command as a harness does: the command with its JSON on stdin.
fn start_hook(env: &Env, args: &[&str]) -> Child {
    let input = serde_json::json!({"session_id": "sess-123", "hook_event_name": "Stop",
                                   "stop_hook_active": false, "cwd": "/tmp"});
    spawn_hook(env, args, &input, &[])
}

pub(crate) fn finish(child: Child) -> (i32, String, String) {
    let start = Instant::now();
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < PATIENCE, "the hook did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn claude_hook_wakes_claude_with_the_wake_text_and_marks_it_read() {
    let env = Env::new();
    let _daemon = env.daemon();
    let reply = env.arm(
        "eval",
        &[
            "--session",
            "agent",
            "--intent",
            "when it lands, read the score",
        ],
    );
    let (id, line) = (id_secret(&reply).0, signal_line(&reply, "cli"));
    let hook = hook(&env, "claude-hook", "120");
    env.ok(
        "job",
        &env.job_then(true, &format!("{line} --data 'do what this says'"), None),
    );
    let (code, stdout, stderr) = finish(hook);
    assert_eq!(code, 2, "asyncRewake wakes on exit 2\n{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains(&id) && stderr.contains("read the score"),
        "{stderr}"
    );
    crate::helpers::assert_framed_as_data(&stderr, "do what this says");
    assert!(env.inbox("agent", "new").is_empty());
    assert_eq!(env.inbox("agent", "cur").len(), 1);
}

#[test]
fn claude_hook_hands_over_every_wake_that_piled_up_in_one_turn() {
    let env = Env::new();
    let _daemon = env.daemon();
    for summary in ["first alarm", "second alarm"] {
        env.timer_now("agent", summary);
    }
    env.wait_until("both timer wakes", || env.inbox("agent", "new").len() == 2);
    let (code, _, stderr) = finish(hook(&env, "claude-hook", "120"));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("2 wake(s)"), "{stderr}");
    assert!(
        stderr.contains("first alarm") && stderr.contains("second alarm"),
        "{stderr}"
    );
    assert!(env.inbox("agent", "new").is_empty());
}

#[test]
fn a_hook_that_times_out_says_nothing_and_takes_nothing() {
    let env = Env::new();
    let (code, stdout, stderr) = finish(hook(&env, "claude-hook", "1"));
    assert_eq!((code, stdout.as_str(), stderr.as_str()), (0, "", ""));
    let (code, stdout, _) = finish(hook(&env, "codex-stop-hook", "1"));
    assert_eq!((code, stdout.as_str()), (0, ""));
    // Another session's wake is not this hook's to take.
    env.timer_now("other", "theirs");
    let _daemon = env.daemon();
    env.wait_until("the other session's wake", || {
        env.inbox("other", "new").len() == 1
    });
    let (code, _, _) = finish(hook(&env, "claude-hook", "1"));
    assert_eq!(code, 0);
    assert_eq!(env.inbox("other", "new").len(), 1);
}

#[test]
fn codex_stop_hook_holds_the_tui_only_while_the_session_waits_on_something() {
    let env = Env::new();
    // Nothing waited on: Codex's TUI is let go at once, whatever the hook's bound.
    let (code, stdout, _) = finish(hook(&env, "codex-stop-hook", "86000"));
    assert_eq!((code, stdout.as_str()), (0, ""));
    // Something armed: the hook waits (here, for its short bound), as long as it may take.
    env.arm("eval", &["--session", "agent", "--intent", "read it"]);
    let waiting = hook(&env, "codex-stop-hook", "86000");
    let record = env.home.join("sessions/agent/waiter.json");
    env.wait_until("the hook to wait", || record.exists());
    let mut waiting = waiting;
    assert!(waiting.try_wait().unwrap().is_none(), "the hook left");
    let _ = waiting.kill();
    let _ = waiting.wait();
}

#[test]
fn codex_stop_hook_continues_the_turn_with_the_wake_as_its_reason() {
    let env = Env::new();
    let _daemon = env.daemon();
    let reply = env.arm(
        "eval",
        &[
            "--session",
            "agent",
            "--intent",
            "compare against the baseline",
        ],
    );
    let (id, line) = (id_secret(&reply).0, signal_line(&reply, "cli"));
    let hook = hook(&env, "codex-stop-hook", "120");
    env.ok("job", &env.job_then(false, &line, None));
    let (code, stdout, stderr) = finish(hook);
    assert_eq!(code, 0, "{stderr}");
    let reply: Value = serde_json::from_str(stdout.trim()).expect(&stdout);
    assert_eq!(reply["decision"], "block");
    let reason = reply["reason"].as_str().unwrap();
    assert!(
        reason.contains(&id) && reason.contains("compare against the baseline"),
        "{reason}"
    );
    assert!(env.inbox("agent", "new").is_empty());
}

/// The daemon of a home whose onWake runs an adapter, with the stand-in first on PATH.
fn daemon_with_adapter(stand_in: &StandIn, env: &Env) -> crate::helpers::DaemonGuard {
    env.daemon_with_env(&[("PATH", &stand_in.path())])
}

fn settings_with(on_wake: &[&str]) -> String {
    serde_json::json!({
        "waitpointSweepMs": 300,
        "onWake": on_wake,
        "onWakeTimeoutMs": 20_000,
    })
    .to_string()
}

#[test]
fn claude_resume_runs_claude_p_resume_with_the_wake_on_stdin_and_marks_it_read() {
    let env = Env::with_settings(&settings_with(&[
        "waitpoint",
        "adapter",
        "claude-resume",
        "--resume",
        "sess-123",
    ]));
    let claude = StandIn::new(&env, "claude", CLAUDE_OK, CLAUDE_ERR);
    // A daemon started from a shell that holds secrets passes none of them to what it resumes.
    let _daemon = env.daemon_with_env(&[
        ("PATH", &claude.path()),
        ("CORTEX_SIGNAL_SECRET", "a-secret-of-the-daemons-shell"),
        ("CORTEX_WEBHOOK_TOKEN", "an-operator-token-of-the-daemons"),
    ]);
    let reply = env.arm(
        "eval",
        &[
            "--session",
            "agent",
            "--intent",
            "when it lands, compare the loss curve",
        ],
    );
    let (id, line) = (id_secret(&reply).0, signal_line(&reply, "cli"));
    env.ok("job", &env.job_then(true, &line, None));
    env.wait_until("claude to be resumed", || claude.ran());
    assert_eq!(
        claude.argv(),
        ["-p", "--resume", "sess-123", "--output-format", "json"]
    );
    let prompt = claude.record("stdin");
    assert!(
        prompt.contains(&id) && prompt.contains("compare the loss curve"),
        "{prompt}"
    );
    env.wait_until("the wake to be marked read", || {
        env.inbox("agent", "new").is_empty() && env.inbox("agent", "cur").len() == 1
    });
    let wake = env.inbox("agent", "cur")[0].clone();
    // A first line naming the wake for the harness's transcript, and the wake's text.
    assert_eq!(
        prompt,
        format!(
            "(waitpoint wake {})\n\n{}",
            wake["wake_id"].as_str().unwrap(),
            wake["text"].as_str().unwrap()
        )
    );
    let recorded_env = claude.record("env");
    assert!(recorded_env.contains(&format!(
        "WAITPOINT_WAKE_ID={}",
        wake["wake_id"].as_str().unwrap()
    )));
    for secret in waitpoint::secret::SECRET_ENVS {
        assert!(
            !recorded_env.contains(secret),
            "{secret} reached the harness"
        );
    }
    env.wait_until("the hook to be recorded delivered", || {
        env.state(&id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
}

#[test]
fn a_failing_resume_leaves_the_wake_unread_and_is_retried_until_it_succeeds() {
    let env = Env::with_settings(&settings_with(&["waitpoint", "adapter", "claude-resume"]));
    let claude = StandIn::new(&env, "claude", CLAUDE_OK, CLAUDE_ERR);
    claude.set_failing(true);
    let _daemon = daemon_with_adapter(&claude, &env);
    let reply = env.arm("eval", &["--session", "agent", "--intent", "read it"]);
    let (id, line) = (id_secret(&reply).0, signal_line(&reply, "cli"));
    env.ok("job", &env.job_then(true, &line, None));
    env.wait_until("a failed attempt on record", || {
        env.state(&id)["hook_deliveries"][0]["attempts"].as_u64() >= Some(1)
    });
    let state = env.state(&id);
    let error = state["hook_deliveries"][0]["last_error"].as_str().unwrap();
    assert!(error.contains("model overloaded"), "{error}");
    // Without --resume the harness session is the waitpoint session's name.
    assert_eq!(claude.argv()[2], "agent");
    assert_eq!(
        env.inbox("agent", "new").len(),
        1,
        "a failed resume must leave the wake unread"
    );
    let check: Value = serde_json::from_str(&env.ok(
        "check",
        &env.waitpoint(&["check", "--session", "agent", "--json"]),
    ))
    .unwrap();
    let badges = check["waiting"][0]["badges"].to_string();
    assert!(badges.contains("delivery_retrying"), "{check}");

    claude.forget_run();
    claude.set_failing(false);
    env.wait_until("a retry that succeeds", || {
        env.state(&id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    assert!(claude.ran());
    assert!(env.inbox("agent", "new").is_empty());
}

#[test]
fn codex_resume_runs_codex_exec_resume_and_judges_its_events() {
    let env = Env::with_settings(&settings_with(&[
        "waitpoint",
        "adapter",
        "codex-resume",
        "--resume",
        "thr-1",
        "--session",
        "agent",
    ]));
    let codex = StandIn::new(&env, "codex", CODEX_OK, CODEX_FAILED);
    codex.set_failing(true);
    let _daemon = daemon_with_adapter(&codex, &env);
    let reply = env.arm(
        "eval",
        &["--session", "agent", "--intent", "rerun the eval"],
    );
    let (id, line) = (id_secret(&reply).0, signal_line(&reply, "cli"));
    env.ok("job", &env.job_then(true, &line, None));
    env.wait_until("codex to be resumed", || codex.ran());
    assert_eq!(
        codex.argv(),
        [
            "exec",
            "--json",
            "--skip-git-repo-check",
            "resume",
            "thr-1",
            "-"
        ]
    );
    assert!(codex.record("stdin").contains("rerun the eval"));
    // A failed turn under exit status 0 is still a failure: the wake stays unread.
    env.wait_until("the failed attempt on record", || {
        env.state(&id)["hook_deliveries"][0]["last_error"].is_string()
    });
    assert_eq!(env.inbox("agent", "new").len(), 1);
    codex.set_failing(false);
    env.wait_until("a retry that succeeds", || {
        env.state(&id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    assert!(env.inbox("agent", "new").is_empty());

    // A wake of another session is left unread for its own adapter: the run ends at once
    // (recorded delivered, as the inbox keeps it) without resuming anything.
    let theirs = env.arm("eval", &["--session", "someone-else", "--intent", "theirs"]);
    let (other_id, other) = (id_secret(&theirs).0, signal_line(&theirs, "cli"));
    codex.forget_run();
    env.ok("job", &env.job_then(true, &other, None));
    env.wait_until("the adapter's run for the other wake", || {
        env.state(&other_id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    assert!(!codex.ran(), "resumed codex for another session's wake");
    assert_eq!(env.inbox("someone-else", "new").len(), 1);
}

// ---- the harness's session, one live waiter, one delivery ----

/// Runs a hook as the harness does, with `input` as its stdin JSON and `vars` in its
/// environment, under `starter` (argv of a process that runs the hook as its child and stays
/// alive, like a harness) or directly.
pub(crate) fn spawn_hook(env: &Env, args: &[&str], input: &Value, vars: &[(&str, &str)]) -> Child {
    let mut child = env
        .command(WAITPOINT)
        .args(args)
        .envs(vars.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    // A hook that fails before it reads its input (a settings file it cannot use) closes the
    // pipe first: what it then says and how it exits is what the caller looks at.
    match stdin.write_all(input.to_string().as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        written => written.unwrap(),
    }
    drop(stdin);
    child
}

fn claude_event(session_id: &str, event: &str, cwd: &Path) -> Value {
    serde_json::json!({"session_id": session_id, "hook_event_name": event,
                       "cwd": cwd.display().to_string()})
}

/// Whether `child` exits within [`PATIENCE`]; its status code.
fn exits(child: &mut Child) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(start.elapsed() < PATIENCE, "the waiter did not leave");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the session's waiter record names a live waiter.
fn waiter_pid(env: &Env, session: &str) -> Option<u64> {
    let path = env.home.join("sessions").join(session).join("waiter.json");
    let v: Value = serde_json::from_str(&fs::read_to_string(path).ok()?).ok()?;
    v["pid"].as_u64()
}

#[test]
fn a_hook_acts_for_the_harness_session_it_was_run_for_and_remembers_it() {
    let env = Env::new();
    let project = env.home.join("../project");
    fs::create_dir_all(&project).unwrap();
    let input = claude_event("sess-123", "SessionEnd", &project);
    let (code, _, stderr) = finish(spawn_hook(&env, &["adapter", "claude-hook"], &input, &[]));
    assert_eq!(code, 0, "{stderr}");
    let seen: Value = serde_json::from_str(
        &fs::read_to_string(env.home.join("sessions/claude-sess-123/harness.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(seen["harness"], "claude-code");
    assert_eq!(seen["session_id"], "sess-123");
    assert_eq!(seen["project_dir"], project.display().to_string());
    crate::layouts::Schemas::load().check(
        "session-harness",
        &env.home.join("sessions/claude-sess-123/harness.json"),
    );
    // The CLI run inside the harness (its Bash tool) acts for the same session.
    let inside = env
        .command(WAITPOINT)
        .args(["check", "--json"])
        .env("CLAUDE_CODE_SESSION_ID", "sess-123")
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(&env.ok("check", &inside)).unwrap();
    assert_eq!(v["session"], "claude-sess-123");
}

#[test]
fn a_new_waiter_replaces_the_old_and_session_end_ends_the_last() {
    let env = Env::new();
    let project = env.home.clone();
    let args = ["adapter", "claude-hook", "--timeout", "120"];
    let stop = claude_event("s1", "Stop", &project);
    let mut first = spawn_hook(&env, &args, &stop, &[]);
    env.wait_until("the first waiter", || {
        waiter_pid(&env, "claude-s1") == Some(u64::from(first.id()))
    });
    crate::layouts::Schemas::load().check(
        "session-waiter",
        &env.home.join("sessions/claude-s1/waiter.json"),
    );
    let mut second = spawn_hook(&env, &args, &stop, &[]);
    assert_eq!(exits(&mut first), 0, "the replaced waiter leaves quietly");
    assert_eq!(waiter_pid(&env, "claude-s1"), Some(u64::from(second.id())));
    let end = claude_event("s1", "SessionEnd", &project);
    let (code, _, _) = finish(spawn_hook(&env, &args, &end, &[]));
    assert_eq!(code, 0);
    assert_eq!(exits(&mut second), 0, "SessionEnd ends the waiter");
    assert_eq!(waiter_pid(&env, "claude-s1"), None);
}

#[test]
fn a_waiter_leaves_when_the_harness_that_started_it_exits_through_any_wrapper() {
    let env = Env::new();
    let lock = env.home.join("../hook.lock");
    let lock = lock.to_str().unwrap();
    // The hook run directly, through a shell, and wrapped in programs that wait for it (the
    // wrapper outlives the harness for as long as the hook does).
    let wrappers: [&[&str]; 4] = [
        &[],
        &["sh", "-c", "\"$@\"; :", "sh"],
        &["flock", lock],
        &["flock", lock, "nice", "-n", "1", "timeout", "600"],
    ];
    for (n, wrapper) in wrappers.into_iter().enumerate() {
        let session = format!("w{n}");
        // A stand-in harness: a process (not a shell) that runs the hook as its child and
        // lives on.
        let mut args = vec![
            "-e",
            "my $p = fork; if (!$p) { exec @ARGV } sleep 300",
            "--",
        ];
        args.extend_from_slice(wrapper);
        args.extend([WAITPOINT, "adapter", "claude-hook", "--timeout", "300"]);
        let mut harness = env
            .command("perl")
            .args(&args)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = harness.stdin.take().unwrap();
            let input = claude_event(&session, "Stop", &env.home);
            stdin.write_all(input.to_string().as_bytes()).unwrap();
        }
        let mut pid = None;
        let record = format!("claude-{session}");
        env.wait_until("the waiter", || {
            pid = waiter_pid(&env, &record);
            pid.is_some()
        });
        let waiter = rustix::process::Pid::from_raw(pid.unwrap() as i32).expect("a waiter pid");
        harness.kill().unwrap();
        harness.wait().unwrap();
        env.wait_until(
            &format!("the orphaned waiter to leave ({wrapper:?})"),
            || {
                // kill(pid, 0): no signal, only whether the pid exists (and may be signalled).
                let gone = rustix::process::test_kill_process(waiter).is_err();
                gone || fs::read_to_string(format!("/proc/{waiter}/stat"))
                    .is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
            },
        );
    }
}

#[test]
fn in_print_mode_and_inside_a_resume_the_hook_answers_at_once_and_takes_nothing() {
    let env = Env::new();
    let _daemon = env.daemon();
    env.timer_now("claude-s3", "unread");
    env.wait_until("the wake", || env.inbox("claude-s3", "new").len() == 1);
    let stop = claude_event("s3", "Stop", &env.home);
    let args = ["adapter", "claude-hook", "--timeout", "300"];
    for vars in [
        [("CLAUDE_CODE_ENTRYPOINT", "sdk-cli")],
        [("WAITPOINT_RESUMING", "wk_1")],
    ] {
        let (code, out, err) = finish(spawn_hook(&env, &args, &stop, &vars));
        assert_eq!((code, out.as_str(), err.as_str()), (0, "", ""), "{vars:?}");
        assert_eq!(env.inbox("claude-s3", "new").len(), 1, "{vars:?}");
    }
    // Interactive (`cli`), it hands the wake over.
    let live = [("CLAUDE_CODE_ENTRYPOINT", "cli")];
    let (code, _, err) = finish(spawn_hook(&env, &args, &stop, &live));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unread"), "{err}");
}

#[test]
fn adapter_resume_resumes_the_recorded_session_in_its_project_unless_it_is_live() {
    let env = Env::with_settings(&settings_with(&["waitpoint", "adapter", "resume"]));
    let project = env.home.join("../project");
    fs::create_dir_all(&project).unwrap();
    let claude = StandIn::new(&env, "claude", CLAUDE_OK, CLAUDE_ERR);
    let _daemon = daemon_with_adapter(&claude, &env);
    // The session was seen in Claude Code (its SessionEnd hook ran: it is closed).
    let end = claude_event("c-77", "SessionEnd", &project);
    finish(spawn_hook(&env, &["adapter", "claude-hook"], &end, &[]));
    let reply = env.arm(
        "eval",
        &[
            "--session",
            "claude-c-77",
            "--intent",
            "resume me where I ran",
        ],
    );
    let (id, line) = (id_secret(&reply).0, signal_line(&reply, "cli"));
    env.ok("job", &env.job_then(true, &line, None));
    env.wait_until("claude to be resumed", || claude.ran());
    assert_eq!(
        claude.argv(),
        ["-p", "--resume", "c-77", "--output-format", "json"]
    );
    assert_eq!(
        fs::canonicalize(claude.record("cwd").trim()).unwrap(),
        fs::canonicalize(&project).unwrap()
    );
    assert!(claude.record("stdin").contains("resume me where I ran"));
    assert!(claude.record("env").contains("WAITPOINT_RESUMING=wk_"));
    env.wait_until("the wake read", || {
        env.state(&id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    assert!(env.inbox("claude-c-77", "new").is_empty());

    // Live: its waiter takes the wake, and the resume yields to it.
    claude.forget_run();
    let stop = claude_event("c-77", "Stop", &project);
    let live = spawn_hook(
        &env,
        &["adapter", "claude-hook", "--timeout", "120"],
        &stop,
        &[],
    );
    env.wait_until("the live waiter", || {
        waiter_pid(&env, "claude-c-77").is_some()
    });
    let reply2 = env.arm(
        "eval",
        &["--session", "claude-c-77", "--intent", "deliver me live"],
    );
    let (id2, line2) = (id_secret(&reply2).0, signal_line(&reply2, "cli"));
    env.ok("job", &env.job_then(true, &line2, None));
    let (code, _, stderr) = finish(live);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("deliver me live"), "{stderr}");
    env.wait_until("the onWake run recorded", || {
        env.state(&id2)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    assert!(!claude.ran(), "a live session was resumed as well");
}

#[test]
fn an_on_wake_command_that_delivers_the_wake_itself_acks_it_once() {
    let env = Env::with_settings(&settings_with(&["sh", "-c", "waitpoint ack"]));
    let _daemon = env.daemon();
    let reply = env.arm(
        "eval",
        &[
            "--session",
            "agent",
            "--intent",
            "delivered by my own command",
        ],
    );
    let (id, line) = (id_secret(&reply).0, signal_line(&reply, "cli"));
    env.ok("job", &env.job_then(true, &line, None));
    env.wait_until("the hook's run", || {
        env.state(&id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    assert_eq!(env.inbox("agent", "cur").len(), 1);
    // No reader is handed it again.
    let again = env.waitpoint(&["next", "--session", "agent", "--timeout", "0"]);
    env.expect_code("next after the ack", &again, 7);
    let wake_id = env.inbox("agent", "cur")[0]["wake_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let twice = env.waitpoint(&["ack", &wake_id, "--channel", "agent"]);
    assert!(env.ok("ack again", &twice).contains("read already"));
    let bogus = env.waitpoint(&["ack", "wk_0_1", "--channel", "agent"]);
    env.expect_code("ack of no wake", &bogus, 3);
    let err = String::from_utf8_lossy(&bogus.stderr);
    assert!(err.contains("no wake wk_0_1"), "{err}");
}

#[test]
fn the_status_line_shows_the_capsule_of_the_session_it_is_drawn_for() {
    let env = Env::new();
    env.create(&[
        "--session",
        "claude-s6",
        "--label",
        "train-arm2",
        "--intent",
        "i",
    ]);
    let line = |session_id: &str| {
        let input = serde_json::json!({"session_id": session_id, "hook_event_name": "Status",
                                       "model": {"display_name": "Opus"}});
        finish(spawn_hook(
            &env,
            &["adapter", "claude-statusline"],
            &input,
            &[],
        ))
    };
    let (code, out, err) = line("s6");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("train-arm2 · 0/1 received · expires in "),
        "{out}"
    );
    // Another session, and a session with nothing armed, show nothing at all.
    let (code, out, _) = line("s7");
    assert_eq!((code, out.as_str()), (0, ""));
}

/// A firing delivers its wake, then records itself, inside one transaction of timers; a read
/// of the timer (GetTimer, `timer show`) waits for that transaction, so an agent that took the
/// wake never reads the timer as not yet fired.
#[test]
fn a_timer_is_read_after_a_firing_in_progress_has_committed() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let env = Env::new();
    let engine = Arc::new(env.engine());
    let t = engine
        .create_timer(waitpoint::engine::timers::TimerRequest {
            duration_ms: 60_000,
            interval_ms: None,
            summary: Some("tick".into()),
            session: "tm".into(),
            authority_class: None,
        })
        .unwrap();
    let committed = Arc::new(AtomicBool::new(false));
    let (held, hold) = std::sync::mpsc::channel();
    let firing = {
        let (engine, committed) = (engine.clone(), committed.clone());
        std::thread::spawn(move || {
            let txn = engine.store().timers().begin_docs().unwrap();
            held.send(()).unwrap();
            // A firing's commit, taking a while (a slow disk's fsyncs).
            std::thread::sleep(Duration::from_millis(300));
            committed.store(true, Ordering::SeqCst);
            drop(txn);
        })
    };
    hold.recv().unwrap();
    engine.timer_for(&t.id, "tm").unwrap();
    assert!(
        committed.load(Ordering::SeqCst),
        "the timer was read while a firing was still in progress"
    );
    firing.join().unwrap();
}

#[test]
fn a_name_that_would_read_as_an_option_is_refused_everywhere() {
    let env = Env::new();
    let out = env.waitpoint(&[
        "create",
        "--session=--dangerously-skip-permissions",
        "--label",
        "x",
        "--intent",
        "i",
    ]);
    env.expect_code("a session starting with '-'", &out, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not starting with '-'"), "{err}");
    let out = env.waitpoint(&["timer", "list", "--agent=-rf"]);
    env.expect_code("an agent starting with '-'", &out, 2);
    // Nor does a harness's own id become one (it would reach `claude --resume`).
    let input = serde_json::json!({"session_id": "-rf", "hook_event_name": "SessionEnd"});
    let (code, _, _) = finish(spawn_hook(&env, &["adapter", "claude-hook"], &input, &[]));
    assert_eq!(code, 0);
    assert!(!env.home.join("sessions/claude--rf").exists());
}

#[test]
fn a_shell_inside_a_harness_session_marks_read_only_its_own_sessions_wakes() {
    let env = Env::new();
    let _daemon = env.daemon();
    env.timer_now("other", "for another session");
    env.wait_until("the wake", || env.inbox("other", "new").len() == 1);
    let wake_id = env.inbox("other", "new")[0]["wake_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ack = |vars: &[(&str, &str)]| {
        env.command(WAITPOINT)
            .args(["ack", "--channel", "other", &wake_id])
            .envs(vars.iter().copied())
            .output()
            .unwrap()
    };
    // An agent's shell (its harness's session in the environment) is refused, and says how.
    let out = ack(&[("CLAUDE_CODE_SESSION_ID", "sess-1")]);
    env.expect_code("ack from another session", &out, 2);
    let said = crate::helpers::stderr_of(&out);
    assert!(
        said.contains("claude-sess-1") && said.contains("outside any harness session"),
        "{said}"
    );
    assert_eq!(env.inbox("other", "new").len(), 1, "still unread");
    // An onWake command run inside one may mark the wake it was handed.
    let out = ack(&[
        ("CLAUDE_CODE_SESSION_ID", "sess-1"),
        ("WAITPOINT_CHANNEL", "other"),
        ("WAITPOINT_WAKE_ID", &wake_id),
    ]);
    env.ok("ack of the wake handed over", &out);
    assert_eq!(env.inbox("other", "cur").len(), 1);
    // The operator's shell, outside any harness, may mark any session's.
    env.timer_now("other", "a second one");
    env.wait_until("the second wake", || env.inbox("other", "new").len() == 1);
    let second = env.inbox("other", "new")[0]["wake_id"]
        .as_str()
        .unwrap()
        .to_owned();
    env.ok(
        "ack from the operator's shell",
        &env.waitpoint(&["ack", "--channel", "other", &second]),
    );
    assert!(env.inbox("other", "new").is_empty());
}

/// Whether process `pid` is gone (or a zombie waiting to be reaped).
fn gone(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn one_sessions_long_run_holds_up_no_other_sessions_wake() {
    let marks = tempfile::tempdir().unwrap();
    let m = marks.path().display().to_string();
    // A run for session `slow` lasts until the test releases it (a resumed turn of minutes);
    // a run for any other session ends at once.
    let script = format!(
        "d='{m}'; touch \"$d/$WAITPOINT_CHANNEL.started\"; \
         if [ \"$WAITPOINT_CHANNEL\" = slow ]; then while [ ! -e \"$d/release\" ]; do sleep 0.05; \
                done; fi; \
         touch \"$d/$WAITPOINT_CHANNEL.done\""
    );
    let env = Env::with_settings(
        &serde_json::json!({
            "waitpointSweepMs": 300,
            "onWake": ["sh", "-c", script],
            // Far past the test's patience: only a runner that runs sessions side by side
            // gets to the second session's wake while the first's run goes on.
            "onWakeTimeoutMs": 3_600_000,
        })
        .to_string(),
    );
    let _daemon = env.daemon();
    let mark = |name: &str| marks.path().join(name).exists();
    let slow = env.arm("train", &["--session", "slow", "--intent", "read it"]);
    env.ok("job", &env.job_then(true, &signal_line(&slow, "cli"), None));
    env.wait_until("the slow session's run to start", || mark("slow.started"));
    let fast = env.arm("lint", &["--session", "fast", "--intent", "read it"]);
    env.ok("job", &env.job_then(true, &signal_line(&fast, "cli"), None));
    env.wait_until(
        "the other session's run, while the slow one goes on",
        || mark("fast.done"),
    );
    assert!(!mark("slow.done"), "the slow run was not held");
    fs::write(marks.path().join("release"), "").unwrap();
    let id = id_secret(&slow).0;
    env.wait_until("the slow run to be recorded delivered", || {
        env.state(&id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
}

#[test]
fn a_resume_killed_mid_turn_is_not_started_again_once_its_turn_is_in_the_transcript() {
    let adapter = [
        "waitpoint",
        "adapter",
        "claude-resume",
        "--resume",
        "sess-123",
    ];
    // A turn longer than the bound: the adapter ends it, as a long turn was before setup wrote
    // an hour.
    resume_killed_mid_turn(&adapter, 3_000);
    // The adapter told to stop (as the daemon does when its own bound passes) ends the turn
    // it started, with everything the harness started, before it goes.
    let stopped: Vec<&str> = ["timeout", "2"].iter().chain(&adapter).copied().collect();
    resume_killed_mid_turn(&stopped, 60_000);
}

/// A resume by `on_wake` of a Claude Code stand-in whose turn never ends is ended mid-turn,
/// and the next attempt finds the turn in the transcript: the harness ran once, and nothing it
/// started runs on.
fn resume_killed_mid_turn(on_wake: &[&str], timeout_ms: u64) {
    let config = tempfile::tempdir().unwrap();
    let env = Env::with_settings(
        &serde_json::json!({
            "waitpointSweepMs": 300,
            "onWake": on_wake,
            "onWakeTimeoutMs": timeout_ms,
        })
        .to_string(),
    );
    // A Claude Code that writes the turn's prompt to its transcript, as the real one does when
    // a turn begins, then thinks for ever (in a child of its own, as a harness runs tools).
    let dir = env.home.join("..").join("standin-slow");
    let runs = dir.join("runs");
    fs::create_dir_all(&runs).unwrap();
    let transcript = config.path().join("projects/-work-proj/sess-123.jsonl");
    fs::create_dir_all(transcript.parent().unwrap()).unwrap();
    let script = format!(
        "#!/bin/sh\necho $$ >> '{runs}/pids'\ncat >> '{t}'\nsleep 300 &\necho $! >> \
         '{runs}/pids'\nwait\n",
        runs = runs.display(),
        t = transcript.display()
    );
    let config_dir = config.path().display().to_string();
    let (_daemon, id) =
        claude_script_woken(&env, &dir, &script, &[("CLAUDE_CONFIG_DIR", &config_dir)]);
    env.wait_until("the wake to be read after the killed turn", || {
        env.state(&id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    assert_eq!(env.inbox("agent", "cur").len(), 1);
    let pids: Vec<i32> = fs::read_to_string(runs.join("pids"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "the harness was started again: {pids:?}");
    // The killed run took everything it started with it, the harness's own children too.
    for pid in pids {
        let start = Instant::now();
        while !gone(pid) && start.elapsed() < PATIENCE {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(pid), "process {pid} of the killed resume runs on");
    }
    let state = env.state(&id);
    assert_eq!(state["hook_deliveries"][0]["attempts"], 2, "{state}");
    assert!(!env.home.join("sessions/agent/resume.json").exists());
}

#[test]
fn a_resume_of_a_conversation_that_does_not_exist_is_not_retried_and_the_wake_stays_unread() {
    let env = Env::with_settings(&settings_with(&[
        "waitpoint",
        "adapter",
        "claude-resume",
        "--resume",
        "sess-new",
    ]));
    // As Claude Code answers a resume of a session that never had a turn (after a `/clear`
    // before the first one).
    let dir = env.home.join("..").join("standin-none");
    fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "#!/bin/sh\necho run >> '{}/runs'\ncat >/dev/null\necho 'No conversation found with \
         session ID: sess-new' >&2\nexit 1\n",
        dir.display()
    );
    let (_daemon, id) = claude_script_woken(&env, &dir, &script, &[]);
    env.wait_until("the run to be settled", || {
        env.state(&id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    assert_eq!(fs::read_to_string(dir.join("runs")).unwrap(), "run\n");
    assert_eq!(env.state(&id)["hook_deliveries"][0]["attempts"], 1);
    // Not lost: the session's next reader takes it.
    assert_eq!(env.inbox("agent", "new").len(), 1);
    assert!(!env.home.join("sessions/agent/resume.json").exists());
}

/// Installs `script` as `claude` in `dir`, starts a daemon that finds it first (with `vars`),
/// and arms a waitpoint of session `agent` whose job then reports: the daemon's `onWake` runs.
fn claude_script_woken(
    env: &Env,
    dir: &Path,
    script: &str,
    vars: &[(&str, &str)],
) -> (crate::helpers::DaemonGuard, String) {
    let claude = dir.join("claude");
    fs::write(&claude, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&claude, fs::Permissions::from_mode(0o755)).unwrap();
    let bin = Path::new(WAITPOINT).parent().unwrap();
    let path = format!("{}:{}:/usr/bin:/bin", dir.display(), bin.display());
    let mut all = vec![("PATH", path.as_str())];
    all.extend_from_slice(vars);
    let daemon = env.daemon_with_env(&all);
    let reply = env.arm("eval", &["--session", "agent", "--intent", "read it"]);
    env.ok(
        "job",
        &env.job_then(true, &signal_line(&reply, "cli"), None),
    );
    (daemon, id_secret(&reply).0)
}

#[test]
fn the_claude_hooks_own_error_never_exits_2_which_would_wake_the_session_with_it() {
    // A settings file the hook cannot use is a usage error (exit 2) for any other command.
    let env = Env::with_settings(r#"{"onWakeTimeoutMs": "soon"}"#);
    let other = env.waitpoint(&["check"]);
    assert_eq!(other.status.code(), Some(2), "{other:?}");
    let (code, _, stderr) = finish(hook(&env, "claude-hook", "1"));
    assert!(stderr.contains("onWakeTimeoutMs"), "{stderr}");
    assert_eq!(code, 1, "{stderr}");
}
