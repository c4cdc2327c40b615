//! The agent's loop in the real OpenCode 1.18.33, configured by `waitpoint setup opencode`
//! alone, talking to a scripted model on 127.0.0.1 over Chat Completions (its
//! `@ai-sdk/openai-compatible` provider). An agent arms a waitpoint, ends its turn, the job
//! signals, and the agent is woken in its own session (`opencode-<ses_…>`): in place while the
//! session is open (the plugin's waiter, no keystroke), by `opencode run --session` in its
//! project once it was closed; once, and never with another session's wake.
//!
//! OpenCode comes from npm, pinned, installed by `scripts/test-deps` under
//! `$WAITPOINT_TEST_DEPS/opencode/`, with `seed/`: the `@opencode-ai/plugin` package OpenCode
//! installs into each of its config directories as it starts, linked in here so it never
//! fetches (a missing one fails the test with that hint).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::agent_scenario::{
    AgentHarness, HOOK_HEADER, a_closed_session_is_resumed_once, armed,
    idle_waiter_spends_almost_nothing, job_reports, play, read_once, setup, turns_saying,
    two_sessions_each_see_and_get_only_their_own, waiters_of, wakes_of, woken_in,
};
use crate::harness::Tmux;
use crate::helpers::{DaemonGuard, Env, WAITPOINT};
use crate::model_server::{ModelServer, Reply, Request};

/// The bound on each run and each wait: a hang stops here; nothing is timed.
const LIMIT: Duration = Duration::from_secs(120);

/// `$WAITPOINT_TEST_DEPS/opencode`, checked: the binary and the plugin package seed.
fn deps() -> PathBuf {
    let deps = std::env::var_os("WAITPOINT_TEST_DEPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-deps"))
        .join("opencode");
    for need in ["node_modules/.bin/opencode", "seed/package-lock.json"] {
        assert!(
            deps.join(need).exists(),
            "{} is missing: the OpenCode tests need the real OpenCode 1.18.33 and its plugin \
             package (run scripts/test-deps; scripts/test does)",
            deps.join(need).display()
        );
    }
    deps
}

/// The agent, scripted: "arm LABEL" arms a waitpoint, "check" lists what it waits on, "cancel
/// ID" disarms one; after a tool's result it ends its turn; a wake's text gets "woken".
fn agent(r: &Request) -> Reply {
    play(r, &r.last_user_text(), &|t| format!("mcp__waitpoint__{t}"))
}

/// OpenCode for one test: the user's config naming the model server as its one provider, the
/// project, and the environment that keeps it off the network.
struct OpenCode<'e> {
    env: &'e Env,
    bin: PathBuf,
    project: PathBuf,
}

/// Links the plugin package seed into an OpenCode config directory, as OpenCode's own install
/// leaves it (package.json, package-lock.json, node_modules).
fn seed(deps: &Path, dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    for f in ["package.json", "package-lock.json"] {
        fs::copy(deps.join("seed").join(f), dir.join(f)).unwrap();
    }
    std::os::unix::fs::symlink(deps.join("seed/node_modules"), dir.join("node_modules")).unwrap();
}

fn opencode_env<'e>(env: &'e Env, server: &ModelServer) -> OpenCode<'e> {
    let deps = deps();
    let project = env.user_home.join("project");
    fs::create_dir_all(&project).unwrap();
    let project = project.canonicalize().unwrap();
    let config = env.user_home.join(".config/opencode");
    seed(&deps, &config);
    seed(&deps, &project.join(".opencode"));
    let user = json!({
        "model": "scripted/m",
        "small_model": "scripted/m",
        "autoupdate": false,
        "share": "disabled",
        "provider": {"scripted": {
            "npm": "@ai-sdk/openai-compatible",
            "options": {"baseURL": format!("{}/v1", server.url()), "apiKey": "test-key"},
            "models": {"m": {"name": "m", "tool_call": true}},
        }},
    });
    fs::write(
        config.join("opencode.json"),
        serde_json::to_string_pretty(&user).unwrap(),
    )
    .unwrap();
    OpenCode {
        env,
        bin: deps.join("node_modules/.bin/opencode"),
        project,
    }
}

impl OpenCode<'_> {
    /// What OpenCode needs in its environment: no registry (a fetch fails at once), no update
    /// or model list fetched.
    fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("npm_config_registry", "http://127.0.0.1:9".into()),
            ("OPENCODE_DISABLE_AUTOUPDATE", "1".into()),
            ("OPENCODE_DISABLE_MODELS_FETCH", "1".into()),
            ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".into()),
        ]
    }

    fn command(&self) -> Command {
        let mut c = self.env.command(self.bin.to_str().unwrap());
        c.envs(self.vars()).current_dir(&self.project);
        c
    }

    /// `opencode run --format json ARGS… PROMPT` in the project, to its end (bounded).
    fn run(&self, prompt: &str, args: &[&str]) -> (bool, String, Duration) {
        let started = Instant::now();
        let mut child = self
            .command()
            .args(["run", "--format", "json"])
            .args(args)
            .arg(prompt)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = started + LIMIT;
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}\n--- stderr\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text, started.elapsed())
    }
}

fn opencode_by_setup<'e>(env: &'e Env, server: &ModelServer) -> OpenCode<'e> {
    let oc = opencode_env(env, server);
    setup(env, &oc.project, &["opencode", "--project"]);
    oc
}

/// The daemon, started outside the project, able to run `opencode` for a resume.
fn daemon(env: &Env, oc: &OpenCode) -> DaemonGuard {
    let path = format!(
        "{}:{}:/usr/bin:/bin",
        oc.bin.parent().unwrap().display(),
        Path::new(WAITPOINT).parent().unwrap().display()
    );
    let vars = oc.vars();
    let mut all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.push(("PATH", &path));
    env.daemon_with_env(&all)
}

/// The live OpenCode waiters of this home: `adapter opencode-waiter` processes naming it.
fn waiters(env: &Env) -> Vec<u32> {
    waiters_of(env, "adapter opencode-waiter")
}

#[test]
fn opencode_run_in_a_project_with_the_plugin_answers_at_once_and_leaves_no_waiter() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let oc = opencode_by_setup(&env, &server);
    let (ok, out, _) = oc.run("hello", &[]);
    assert!(ok, "{out}");
    assert!(out.contains("\"text\":\"ok\""), "{out}");
    assert!(waiters(&env).is_empty(), "a waiter outlived `opencode run`");
    // A wake waiting for a session (its resume fails here: the daemon's PATH has no opencode)
    // is not taken by a run of that session: nobody is idle in a run, and a prompt handed to
    // it as it ends would be lost.
    let _daemon = env.daemon();
    let (ok, out, _) = oc.run("arm run-1", &[]);
    assert!(ok, "{out}");
    let a = armed(&server, "run-1");
    let session = format!("opencode-{}", a.harness_session);
    job_reports(&env, &a);
    env.wait_until("the wake in the inbox", || {
        wakes_of(&env, &session, "new", &a.id) == 1
    });
    let (ok, out, _) = oc.run("hello again", &["--session", &a.harness_session]);
    assert!(ok, "{out}");
    assert!(out.contains("\"text\":\"ok\""), "{out}");
    assert_eq!(wakes_of(&env, &session, "new", &a.id), 1, "{}", env.tree());
    assert!(
        turns_saying(&server, &format!("Waitpoint {}", a.id)).is_empty(),
        "{}",
        server.summary()
    );
    assert!(waiters(&env).is_empty(), "a waiter outlived `opencode run`");
}

#[test]
fn a_closed_opencode_session_is_resumed_in_its_project_by_a_daemon_started_elsewhere() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let oc = opencode_by_setup(&env, &server);
    let _daemon = daemon(&env, &oc);
    oc.turn("arm closed-1 then stop", None);
    let a = armed(&server, "closed-1");
    assert!(
        a.harness_session.starts_with("ses_"),
        "{}",
        a.harness_session
    );
    a_closed_session_is_resumed_once(&env, &server, &oc, &oc.project, &a);
}

#[test]
fn two_opencode_sessions_in_one_project_each_see_and_get_only_their_own() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let oc = opencode_by_setup(&env, &server);
    let _daemon = daemon(&env, &oc);
    two_sessions_each_see_and_get_only_their_own(&env, &server, &oc);
}

impl AgentHarness for OpenCode<'_> {
    fn name(&self) -> &'static str {
        "opencode"
    }
    fn resume_flag(&self) -> &'static str {
        "--session"
    }
    /// A run that fails is a failure of the scenario, said with what OpenCode printed.
    fn run_headless(&self, prompt: &str, args: &[&str]) {
        let (ok, out, _) = self.run(prompt, args);
        assert!(ok, "{out}");
    }
}

#[test]
fn an_open_opencode_session_is_woken_in_place_once_by_one_idle_waiter() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let oc = opencode_by_setup(&env, &server);
    let _daemon = daemon(&env, &oc);
    let tmux = Tmux::start(&env, &oc.project, oc.vars(), &oc.bin, &[]);
    tmux.wait_for_pane(|p| p.contains("scripted"), LIMIT);
    tmux.send_line("arm live-1");
    let a = armed(&server, "live-1");
    let session = format!("opencode-{}", a.harness_session);
    // The turn ended; the plugin's waiter holds the session.
    env.wait_until("the session's waiter", || {
        env.home
            .join("sessions")
            .join(&session)
            .join("waiter.json")
            .exists()
    });
    let one = waiters(&env);
    assert_eq!(one.len(), 1, "{one:?}");
    idle_waiter_spends_almost_nothing(one[0]);
    job_reports(&env, &a);
    // No keystroke: the plugin hands the wake to the idle session, in the same session.
    let woken = woken_in(&server, &a.harness_session, &a);
    assert!(
        woken.last_user_text().contains(HOOK_HEADER),
        "not the plugin's text:\n{}",
        server.summary()
    );
    tmux.wait_for_pane(|p| p.contains("woken"), LIMIT);
    read_once(&env, &session, &a);
    // Not also resumed: the wake reached the model once.
    assert_eq!(
        turns_saying(&server, &format!("Waitpoint {}", a.id)).len(),
        1,
        "{}",
        server.summary()
    );
    // Still one waiter for the session after the woken turn, and none once OpenCode exits.
    env.wait_until("one waiter again", || waiters(&env).len() == 1);
    tmux.send_line("/exit");
    env.wait_until("no waiter once the session closed", || {
        waiters(&env).is_empty()
    });
}

/// The waiter the plugin starts, driven as the plugin drives it: a wake it prints stays unread
/// until the plugin says "ack"; a "nack" leaves it for the next "wait"; its stdin's close ends
/// it.
#[test]
fn the_plugins_waiter_marks_a_wake_read_only_when_the_plugin_acks_and_leaves_with_its_stdin() {
    use std::io::{BufRead, BufReader, Write};
    let env = Env::new();
    let _daemon = env.daemon();
    let session = "opencode-ses_ack1";
    let mut child = env
        .command(WAITPOINT)
        .args(["adapter", "opencode-waiter", "--session", "ses_ack1"])
        .args(["--dir", "/srv/proj"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = child.stdin.take().unwrap();
    let mut from = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut handed = |to: &mut std::process::ChildStdin, line: &mut String| -> Value {
        writeln!(to, "wait").unwrap();
        line.clear();
        from.read_line(line).unwrap();
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    env.timer_now(session, "ack me");
    let first = handed(&mut to, &mut line);
    let id = first["wakes"][0].as_str().unwrap().to_owned();
    assert!(
        first["text"].as_str().unwrap().contains(HOOK_HEADER),
        "{first}"
    );
    // Printed, not yet taken by OpenCode: still unread.
    assert_eq!(env.inbox(session, "new").len(), 1);
    writeln!(to, "nack").unwrap();
    let again = handed(&mut to, &mut line);
    assert_eq!(again["wakes"][0], id.as_str());
    writeln!(to, "ack").unwrap();
    env.wait_until("the acked wake read", || {
        env.inbox(session, "cur").len() == 1 && env.inbox(session, "new").is_empty()
    });
    // Remembered for a resume, in the plugin's project.
    let seen: Value = serde_json::from_str(
        &fs::read_to_string(env.home.join(format!("sessions/{session}/harness.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (seen["harness"].as_str(), seen["project_dir"].as_str()),
        (Some("opencode"), Some("/srv/proj"))
    );
    // The plugin's process is gone: the waiter leaves, waiting or not.
    writeln!(to, "wait").unwrap();
    drop(to);
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the waiter outlived its stdin");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(child.wait().unwrap().success());
    assert!(
        !env.home
            .join(format!("sessions/{session}/waiter.json"))
            .exists()
    );
}

/// The MCP server as OpenCode starts it (`OPENCODE=1`, in the project): every tool declares
/// `harness_session`, which selects an `opencode-…` session and nothing else; started by
/// anything else, the server offers no such argument and refuses it, as before.
#[test]
fn the_plugins_session_argument_is_offered_and_taken_only_under_opencode() {
    use crate::mcp_raw::Raw;
    let env = Env::new();
    let project = env.user_home.canonicalize().unwrap();
    let mut c = env.command(WAITPOINT);
    c.arg("mcp").env("OPENCODE", "1").current_dir(&project);
    let mut s = Raw::spawn(c);
    s.initialize();
    s.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    let tools = s.answer(2)["result"]["tools"].as_array().unwrap().clone();
    assert!(tools.len() >= 10);
    for t in &tools {
        assert_eq!(
            t["inputSchema"]["properties"]["harness_session"]["type"], "string",
            "{t}"
        );
    }
    let armed = s.call(
        3,
        "wait_create",
        json!({"label": "a", "intent": "session a waits", "harness_session": "ses_a1"}),
        json!({}),
    );
    let id = armed["structuredContent"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let theirs = s.call(
        4,
        "wait_check",
        json!({"harness_session": "ses_b2"}),
        json!({}),
    );
    assert_eq!(theirs["structuredContent"]["session"], "opencode-ses_b2");
    assert_eq!(
        theirs["structuredContent"]["waiting"],
        json!([]),
        "{theirs}"
    );
    let cancel = s.call(
        5,
        "wait_cancel",
        json!({"id": id, "harness_session": "ses_b2"}),
        json!({}),
    );
    assert_eq!(cancel["isError"], true, "{cancel}");
    let seen: Value = serde_json::from_str(
        &fs::read_to_string(env.home.join("sessions/opencode-ses_a1/harness.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        seen,
        json!({"harness": "opencode", "session_id": "ses_a1",
               "project_dir": project.display().to_string()})
    );
    // Never another harness's session, nor a path.
    for (n, bad) in ["../claude-x", "claude-x/..", "-rf"].iter().enumerate() {
        let r = s.call(
            6 + n as u64,
            "wait_check",
            json!({"harness_session": bad}),
            json!({}),
        );
        assert_eq!(r["isError"], true, "{r}");
        assert!(r.to_string().contains("harness_session"), "{r}");
    }
    s.close();

    let mut plain = Raw::start(&env);
    plain.initialize();
    plain.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    let tools = plain.answer(2)["result"]["tools"].clone();
    assert!(!tools.to_string().contains("harness_session"), "{tools}");
    // Refused where a tool reads arguments; ignored, selecting nothing, by one that takes none.
    let r = plain.call(
        3,
        "wait_create",
        json!({"label": "x", "intent": "y", "harness_session": "ses_a1"}),
        json!({}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert!(r.to_string().contains("harness_session"), "{r}");
    let r = plain.call(
        4,
        "wait_check",
        json!({"harness_session": "ses_a1"}),
        json!({}),
    );
    assert_eq!(r["structuredContent"]["session"], "default", "{r}");
}

/// OpenCode killed outright (its pipe to the waiter held open elsewhere): the waiter sees its
/// harness exit, after a turn it handed wakes over in as well as before, and leaves.
#[test]
fn the_plugins_waiter_leaves_when_opencode_exits_even_with_its_stdin_open() {
    use std::io::{BufRead, BufReader, Write};
    let env = Env::new();
    let _daemon = env.daemon();
    let session = "opencode-ses_gone1";
    // A stand-in OpenCode: a process (not a shell) that runs the waiter as its child and lives
    // on; the test holds the waiter's stdin.
    let mut harness = env
        .command("perl")
        .args([
            "-e",
            "my $p = fork; if (!$p) { exec @ARGV } sleep 300",
            "--",
        ])
        .args([
            WAITPOINT,
            "adapter",
            "opencode-waiter",
            "--session",
            "ses_gone1",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = harness.stdin.take().unwrap();
    let mut from = BufReader::new(harness.stdout.take().unwrap());
    env.timer_now(session, "one");
    writeln!(to, "wait").unwrap();
    let mut line = String::new();
    from.read_line(&mut line).unwrap();
    assert!(line.contains("wk_"), "{line}");
    writeln!(to, "ack").unwrap();
    writeln!(to, "wait").unwrap();
    let record = env.home.join(format!("sessions/{session}/waiter.json"));
    let waiter: Value = serde_json::from_str(&fs::read_to_string(&record).unwrap()).unwrap();
    let pid = waiter["pid"].as_u64().unwrap() as i32;
    assert_eq!(waiter["harness_pids"], json!([harness.id()]));
    env.wait_until("the wake read", || env.inbox(session, "cur").len() == 1);
    harness.kill().unwrap();
    harness.wait().unwrap();
    env.wait_until("the waiter gone with its harness", || {
        !Path::new(&format!("/proc/{pid}")).exists()
            || fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.starts_with(" Z")))
    });
    drop(to);
}
