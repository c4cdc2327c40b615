//! The wake adapters (`waitpoint adapter …`) against stand-ins for Claude Code and the Codex CLI:
//! scripts that record the argv, stdin and environment they were given and answer as the real
//! harness documents. The hooks are run the way a harness runs a command hook: the command,
//! its JSON on stdin, its exit status and output read back.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{Env, PATIENCE, WAITPOINT};

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
            "#!/bin/sh\nr='{r}'\nprintf '%s\\n' \"$@\" > \"$r/argv.tmp\"\ncat > \"$r/stdin\"\nenv > \"$r/env\"\n\
             if [ -e \"$r/fail\" ]; then printf '%s\\n' '{failing_reply}'; else printf '%s\\n' '{reply}'; fi\n\
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

/// Arms a waitpoint for `session` and returns (id, cli line).
fn arm(env: &Env, session: &str, intent: &str) -> (String, String) {
    let reply = env.create(&["--session", session, "--label", "eval", "--intent", intent]);
    (
        reply["id"].as_str().unwrap().to_owned(),
        reply["how_to_signal"]["cli"].as_str().unwrap().to_owned(),
    )
}

/// Starts `waitpoint adapter HOOK --session agent --timeout SECS` as a harness does.
fn hook(env: &Env, name: &str, timeout: &str) -> Child {
    start_hook(
        env,
        &["adapter", name, "--session", "agent", "--timeout", timeout],
    )
}

/// Starts a hook command as a harness does: the command with its JSON on stdin.
fn start_hook(env: &Env, args: &[&str]) -> Child {
    let mut child = env
        .command(WAITPOINT)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(br#"{"session_id":"sess-123","hook_event_name":"Stop","stop_hook_active":false,"cwd":"/tmp"}"#)
        .unwrap();
    drop(stdin);
    child
}

fn finish(child: Child) -> (i32, String, String) {
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
    let (id, line) = arm(&env, "agent", "when it lands, read the score");
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
fn codex_stop_hook_continues_the_turn_with_the_wake_as_its_reason() {
    let env = Env::new();
    let _daemon = env.daemon();
    let (id, line) = arm(&env, "agent", "compare against the baseline");
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
    let _daemon = daemon_with_adapter(&claude, &env);
    let (id, line) = arm(&env, "agent", "when it lands, compare the loss curve");
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
    assert_eq!(prompt, wake["text"].as_str().unwrap());
    let recorded_env = claude.record("env");
    assert!(recorded_env.contains(&format!(
        "WAITPOINT_WAKE_ID={}",
        wake["wake_id"].as_str().unwrap()
    )));
    assert!(!recorded_env.contains("CORTEX_SIGNAL_SECRET"));
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
    let (id, line) = arm(&env, "agent", "read it");
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
    let (id, line) = arm(&env, "agent", "rerun the eval");
    env.ok("job", &env.job_then(true, &line, None));
    env.wait_until("codex to be resumed", || codex.ran());
    assert_eq!(
        codex.argv(),
        ["exec", "--json", "--skip-git-repo-check", "resume", "thr-1", "-"]
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
    let (other_id, other) = arm(&env, "someone-else", "theirs");
    codex.forget_run();
    env.ok("job", &env.job_then(true, &other, None));
    env.wait_until("the adapter's run for the other wake", || {
        env.state(&other_id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    assert!(!codex.ran(), "resumed codex for another session's wake");
    assert_eq!(env.inbox("someone-else", "new").len(), 1);
}
