//! The agent's loop in the real Gemini CLI 0.61, configured by `waitpoint setup gemini` alone,
//! talking to the scripted model's Gemini API on 127.0.0.1: each Gemini session is a waitpoint
//! session of its own (its process's record, written by the SessionStart hook, names it to
//! `waitpoint mcp`), woken in place by the AfterAgent hook while open, resumed in its project
//! once closed; once, never with another session's wake, and never holding a headless run.
//!
//! The binary comes from npm, pinned, installed by `scripts/test-deps` under
//! `$WAITPOINT_TEST_DEPS/gemini/`; a missing one fails the test with that hint.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Value, json};

use crate::agent_scenario::{
    AgentHarness, Armed, HOOK_HEADER, a_closed_session_is_resumed_once, armed_as, armed_reply,
    job_reports, play, read_once, setup, ten_turns_then_one_idle_waiter,
    two_sessions_each_see_and_get_only_their_own, waiters_of,
};
use crate::harness::{Run, Tmux, project_dir, run_bounded};
use crate::helpers::{DaemonGuard, Env, WAITPOINT};
use crate::model_server::{ModelServer, Reply, Request};

/// The bound on each harness run and each wait: a hang stops here; nothing is timed.
const LIMIT: Duration = Duration::from_secs(90);

/// The dummy key Gemini sends to the model server.
const API_KEY: &str = "waitpoint-test-gemini-key";

/// Gemini's name for the MCP server `waitpoint`'s tool `tool`.
fn tool(name: &str) -> String {
    format!("mcp_waitpoint_{name}")
}

/// Gemini CLI, installed by `scripts/test-deps`.
fn gemini_bin() -> PathBuf {
    let deps = std::env::var_os("WAITPOINT_TEST_DEPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-deps"));
    let bin = deps.join("gemini/node_modules/.bin/gemini");
    assert!(
        bin.exists(),
        "{} is missing: the Gemini tests need the real Gemini CLI (run scripts/test-deps; \
         scripts/test does)",
        bin.display()
    );
    bin
}

/// What the user typed last: the last text part of the newest user content (the first one
/// carries Gemini's session context in a part before it).
fn said(r: &Request) -> String {
    r.body()["contents"]
        .as_array()
        .and_then(|c| c.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["parts"].as_array())
        .and_then(|p| p.iter().rev().find_map(|p| p["text"].as_str()))
        .unwrap_or_default()
        .to_owned()
}

/// The agent, scripted as in `agent_loop`, with Gemini's tool names and what the user typed.
fn agent(r: &Request) -> Reply {
    if !r.offers_tool(&tool("wait_create")) {
        return Reply::text("my waitpoint tools are not connected yet");
    }
    let said = said(r);
    // "shell CMD" runs CMD with Gemini's own shell tool.
    if r.tool_result().is_none()
        && let Some(command) = said.strip_prefix("shell ")
    {
        return Reply::tool("run_shell_command", json!({"command": command}));
    }
    play(r, &said, &tool)
}

/// Gemini CLI for one test: the user's `~/.gemini/settings.json` as a first run leaves it
/// (API-key auth chosen, no updates, no usage statistics), the project trusted, and
/// `waitpoint setup gemini` run on top.
struct Gemini<'e> {
    env: &'e Env,
    project: PathBuf,
    base_url: String,
}

fn gemini_by_setup<'e>(env: &'e Env, server: &ModelServer) -> Gemini<'e> {
    let project = project_dir(env);
    let dir = env.user_home.join(".gemini");
    fs::create_dir_all(&dir).unwrap();
    // Without an auth type chosen the TUI opens on the auth dialog; the update check and the
    // usage statistics would reach for the network.
    let settings = json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
    });
    fs::write(
        dir.join("settings.json"),
        serde_json::to_string_pretty(&settings).unwrap(),
    )
    .unwrap();
    // Untrusted, the TUI asks whether to trust the folder, and `-p` and `--resume` exit 55.
    let mut trusted = serde_json::Map::new();
    trusted.insert(project.display().to_string(), json!("TRUST_FOLDER"));
    fs::write(
        dir.join("trustedFolders.json"),
        Value::Object(trusted).to_string(),
    )
    .unwrap();
    setup(env, &project, &["gemini"]);
    Gemini {
        env,
        project,
        base_url: server.url(),
    }
}

impl Gemini<'_> {
    /// What Gemini needs in its environment here; a daemon that resumes it needs it too.
    fn vars(&self) -> [(&'static str, String); 2] {
        [
            ("GEMINI_API_KEY", API_KEY.to_owned()),
            ("GOOGLE_GEMINI_BASE_URL", self.base_url.clone()),
        ]
    }

    fn command(&self) -> Command {
        let mut cmd = self.env.command(gemini_bin().to_str().unwrap());
        cmd.envs(self.vars()).current_dir(&self.project);
        cmd
    }

    /// `gemini -p PROMPT -o json ARGS…` in the project, killed after `limit`.
    fn print(&self, prompt: &str, args: &[&str]) -> Run {
        let mut cmd = self.command();
        cmd.args(["-p", prompt, "-o", "json"]).args(args);
        run_bounded(cmd, LIMIT)
    }

    /// The TUI in a private tmux server, returned once its prompt is ready for input.
    fn interactive(&self) -> Tmux {
        let tmux = Tmux::start(self.env, &self.project, self.vars(), &gemini_bin(), &[]);
        // The footer counts the MCP servers once they are connected; a prompt sent before
        // that may be offered no waitpoint tools.
        tmux.wait_for_pane(
            |p| p.contains("Type your message") && p.contains("1 MCP server"),
            LIMIT,
        );
        tmux
    }
}

impl Drop for Gemini<'_> {
    /// Gemini 0.61's TUI does not exit when its terminal goes away (the tmux server killed): it
    /// stays, reparented to init. Whatever Gemini still runs in the project is ended here.
    fn drop(&mut self) {
        for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let comm = fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            let here = fs::read_link(entry.path().join("cwd")).is_ok_and(|d| d == self.project);
            if here && comm.trim() == "node" {
                // A pid read from /proc; one that already exited is no failure.
                let pid = Pid::from_raw(pid).expect("a pid from /proc");
                let _ = kill_process(pid, Signal::KILL);
            }
        }
    }
}

/// The daemon, started outside the project, able to run Gemini (and node) for a resume.
fn daemon(env: &Env, gemini: &Gemini) -> DaemonGuard {
    let bins = [
        gemini_bin().parent().unwrap().to_owned(),
        Path::new(WAITPOINT).parent().unwrap().to_owned(),
    ];
    let path = format!("{}:{}:/usr/bin:/bin", bins[0].display(), bins[1].display());
    let vars = gemini.vars();
    let mut all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.push(("PATH", &path));
    env.daemon_with_env(&all)
}

/// The waitpoint `label` the agent armed: its id, secret and the Gemini session it belongs to
/// (the reply names the waitpoint session, `gemini-<session id>`).
fn armed(server: &ModelServer, label: &str) -> Armed {
    let (_, v) = armed_reply(server, label);
    let session = v["session"].as_str().expect("the waitpoint's session");
    let harness_session = session
        .strip_prefix("gemini-")
        .unwrap_or_else(|| panic!("not a Gemini session: {session}"));
    armed_as(&v, harness_session)
}

/// The waitpoint session of `a`.
fn session_of(a: &Armed) -> String {
    format!("gemini-{}", a.harness_session)
}

/// Whether `r` is a turn of the conversation that armed `a` (its history holds the reply).
fn in_conversation_of(r: &Request, a: &Armed) -> bool {
    r.conversation_contains(&a.secret)
}

/// The model turns whose user text holds `needle`.
fn turns_saying(server: &ModelServer, needle: &str) -> Vec<Request> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.offers_tool(&tool("wait_create")))
        .filter(|r| said(r).contains(needle))
        .collect()
}

/// Checks that one model turn, and only one, carried `a`'s wake: not also resumed, not twice.
fn reached_the_model_once(server: &ModelServer, a: &Armed) {
    let turns = turns_saying(server, &format!("Waitpoint {}", a.id));
    assert_eq!(turns.len(), 1, "{}", server.summary());
}

/// Waits for the model turn of `a`'s conversation that carries `a`'s wake.
fn woken_in(server: &ModelServer, a: &Armed) -> Request {
    let wake = format!("Waitpoint {}", a.id);
    server.wait_for_request(
        |r| in_conversation_of(r, a) && said(r).contains(&wake),
        LIMIT,
    )
}

fn waiters(env: &Env) -> Vec<u32> {
    waiters_of(env, "adapter gemini-hook")
}

fn waiter_recorded(env: &Env, session: &str) -> bool {
    env.home
        .join("sessions")
        .join(session)
        .join("waiter.json")
        .exists()
}

/// Types "arm LABEL" until the tools are there (the TUI connects MCP servers as it starts),
/// and returns what was armed.
fn arm_in(tmux: &Tmux, server: &ModelServer, label: &str) -> Armed {
    let is_armed = |r: &Request| r.tool_result().is_some_and(|t| t.contains(label));
    // A turn of the conversation (the side requests, a routing classifier's, offer no tools).
    let too_early = |r: &Request| {
        said(r).contains(&format!("arm {label}"))
            && r.path().contains(":streamGenerateContent")
            && !r.offers_tool(&tool("wait_create"))
    };
    for tries in 1.. {
        submit(
            tmux,
            server,
            &format!("please arm {label} before the job starts"),
        );
        tmux.wait_for_pane(
            |_| {
                let rs = server.requests();
                rs.iter().any(is_armed) || rs.iter().filter(|r| too_early(r)).count() >= tries
            },
            LIMIT,
        );
        if server.requests().iter().any(is_armed) {
            break;
        }
        assert!(tries < 5, "the tools never came:\n{}", server.summary());
        stop_waiting(tmux);
    }
    armed(server, label)
}

/// Types `text` and presses Enter until Gemini sends it: an Enter that comes while the TUI
/// settles after an Esc or a `/clear` is sometimes lost (the text stays in the input; Enter on
/// an empty input does nothing, so pressing it again sends nothing twice).
fn submit(tmux: &Tmux, server: &ModelServer, text: &str) {
    tmux.send_line(text);
    let sent = |r: &Request| said(r).contains(text);
    for _ in 0..10 {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if server.requests().iter().any(sent) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        tmux.send_keys(&["Enter"]);
    }
    server.wait_for_request(sent, LIMIT);
}

/// Esc, as a user does to type while a turn's waiter waits (a prompt typed meanwhile is
/// queued, a slash command refused): Gemini stops waiting for the hook, and may put the
/// cancelled turn's prompt back in the input, which is cleared.
fn stop_waiting(tmux: &Tmux) {
    // The turn is over once its hook runs; an Esc before that would cancel the turn instead.
    tmux.wait_for_pane(|p| p.contains("Executing Hook"), LIMIT);
    // An Esc that lands while Gemini is still settling the turn's end cancels the request
    // instead ("Request cancelled") and the hook goes on running (seen once in CI); a user
    // presses it again.
    let stopped = |p: &str| !p.contains("Executing Hook");
    for _ in 0..3 {
        tmux.send_keys(&["Escape"]);
        if tmux.poll_pane(stopped, Duration::from_secs(10)).is_ok() {
            break;
        }
    }
    tmux.wait_for_pane(stopped, LIMIT);
    tmux.send_keys(&["-N", "300", "BSpace"]);
    tmux.wait_for_pane(|p| p.contains("Type your message"), LIMIT);
}

#[test]
fn an_open_gemini_session_is_woken_in_place_once_by_one_idle_waiter() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let gemini = gemini_by_setup(&env, &server);
    let _daemon = daemon(&env, &gemini);
    let tmux = gemini.interactive();
    let a = arm_in(&tmux, &server, "live-1");
    let session = session_of(&a);
    // The turn ended; the AfterAgent hook's waiter holds the session.
    env.wait_until("the session's waiter", || waiter_recorded(&env, &session));
    job_reports(&env, &a);
    // No keystroke: the hook's reply continues the turn with the wake.
    let woken = woken_in(&server, &a);
    assert!(
        said(&woken).contains(HOOK_HEADER),
        "not the hook's text:\n{}",
        server.summary()
    );
    tmux.wait_for_pane(|p| p.contains("woken"), LIMIT);
    read_once(&env, &session, &a);
    // Once, and not also resumed: no other turn carried the wake.
    reached_the_model_once(&server, &a);
    // Nothing waited on any more: the woken turn's end lets the TUI go, no hook holds it.
    tmux.wait_for_pane(
        |p| p.contains("Type your message") && !p.contains("Executing Hook"),
        LIMIT,
    );
    assert!(waiters(&env).is_empty());

    // Something armed again: each turn's end holds the session for it.
    arm_in(&tmux, &server, "keep-1");
    // Ten more turns, each after Esc, as a user who does not want to wait has to: Gemini then
    // abandons the turn's hook without stopping it; the waiter sees it in the transcript and
    // leaves, and the next turn's end starts the next: never more than one.
    ten_turns_then_one_idle_waiter(&env, &session, &waiters, |n| {
        stop_waiting(&tmux);
        submit(&tmux, &server, &format!("turn {n}"));
    });

    // Slash commands cannot be queued while a hook runs: Esc first, then /quit.
    stop_waiting(&tmux);
    tmux.send_line("/quit");
    env.wait_until("no waiter once the session closed", || {
        waiters(&env).is_empty()
    });
}

#[test]
fn a_closed_gemini_session_is_resumed_in_its_project_by_a_daemon_started_elsewhere() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let gemini = gemini_by_setup(&env, &server);
    // The daemon's directory is not the project: the resume finds the project on its own.
    let _daemon = daemon(&env, &gemini);
    let run = gemini.print("arm closed-1 then stop", &[]);
    let out: Value = serde_json::from_str(run.ok()).unwrap();
    let a = armed(&server, "closed-1");
    assert_eq!(out["session_id"].as_str(), Some(a.harness_session.as_str()));
    a_closed_session_is_resumed_once(&env, &server, &gemini, &gemini.project, &a);
}

#[test]
fn two_gemini_sessions_in_one_project_each_see_and_get_only_their_own() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let gemini = gemini_by_setup(&env, &server);
    let _daemon = daemon(&env, &gemini);
    two_sessions_each_see_and_get_only_their_own(&env, &server, &gemini);
}

/// Gemini's requests carry no session id: a conversation is told by its history, the
/// waitpoint session by the reply (see [`armed`]).
impl AgentHarness for Gemini<'_> {
    fn name(&self) -> &'static str {
        "gemini"
    }
    fn resume_flag(&self) -> &'static str {
        "--resume"
    }
    fn run_headless(&self, prompt: &str, args: &[&str]) {
        self.print(prompt, args).ok();
    }
    fn armed(&self, server: &ModelServer, label: &str) -> Armed {
        armed(server, label)
    }
    fn in_conversation(&self, r: &Request, a: &Armed) -> bool {
        in_conversation_of(r, a)
    }
    fn said(&self, r: &Request) -> String {
        said(r)
    }
    fn is_agent_turn(&self, r: &Request) -> bool {
        r.offers_tool(&tool("wait_create"))
    }
}

#[test]
fn gemini_prompt_mode_in_a_project_with_the_hooks_answers_at_once() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let gemini = gemini_by_setup(&env, &server);
    // The AfterAgent hook waits ten minutes in an open session; under -p it must not wait at
    // all (the run is killed at LIMIT, and fails, if it does).
    let run = gemini.print("hello", &[]);
    let out: Value = serde_json::from_str(run.ok()).unwrap();
    assert_eq!(out["response"], "ok", "{}", run.stderr);
    assert!(waiters(&env).is_empty());
    // So is a prompt piped in, which Gemini also answers headless.
    let mut cmd = gemini.command();
    cmd.args(["-o", "json"]).stdin(std::process::Stdio::piped());
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"hello").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let piped = rx
        .recv_timeout(LIMIT)
        .expect("a piped prompt held")
        .unwrap();
    let out: Value = serde_json::from_slice(&piped.stdout).unwrap();
    assert_eq!(out["response"], "ok");
    assert!(waiters(&env).is_empty());
}

#[test]
fn after_clear_a_gemini_waitpoint_wakes_the_new_conversation_in_place() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let gemini = gemini_by_setup(&env, &server);
    let _daemon = daemon(&env, &gemini);
    let tmux = gemini.interactive();
    let first = arm_in(&tmux, &server, "before-clear");
    stop_waiting(&tmux);
    tmux.send_line("/clear");
    // The screen is cleared once its hooks ran; a prompt typed before that is not sent.
    tmux.wait_for_pane(
        |p| {
            !p.contains("before-clear")
                && !p.contains("Executing Hook")
                && p.contains("Type your message")
        },
        LIMIT,
    );
    // `/clear` starts a new session in the same process: the arm after it is the new one's.
    let second = arm_in(&tmux, &server, "after-clear");
    assert_ne!(first.harness_session, second.harness_session);
    let session = session_of(&second);
    env.wait_until("the new session's waiter", || {
        waiter_recorded(&env, &session)
    });
    job_reports(&env, &second);
    let woken = woken_in(&server, &second);
    assert!(
        said(&woken).contains(HOOK_HEADER),
        "not woken in place:\n{}",
        server.summary()
    );
    assert!(!in_conversation_of(&woken, &first), "the old conversation");
    read_once(&env, &session, &second);
    // Something armed again: the turn ends with a waiter. The terminal closes: Gemini waits for
    // a running hook before it exits, so the waiter must see the hangup and leave.
    arm_in(&tmux, &server, "kept");
    env.wait_until("the next waiter", || !waiters(&env).is_empty());
    drop(tmux);
    env.wait_until("no waiter once the terminal closed", || {
        waiters(&env).is_empty()
    });
}

#[test]
fn a_gemini_session_open_between_turns_is_not_resumed_beside_itself_and_its_next_turn_takes_the_wake()
 {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let gemini = gemini_by_setup(&env, &server);
    let _daemon = daemon(&env, &gemini);
    let tmux = gemini.interactive();
    let a = arm_in(&tmux, &server, "between");
    let session = session_of(&a);
    // Esc: Gemini stops waiting for the turn's hook; its waiter must leave, not take the wake
    // for a hook nobody reads.
    stop_waiting(&tmux);
    env.wait_until("the abandoned waiter gone", || waiters(&env).is_empty());
    job_reports(&env, &a);
    // The daemon tries to resume it and is refused while the session is open in the TUI.
    env.wait_until("a refused resume", || {
        env.daemon_log_tail(200).contains("is open in gemini")
    });
    assert_eq!(
        crate::agent_scenario::wakes_of(&env, &session, "new", &a.id),
        1
    );
    // The next turn's end takes it, in place.
    submit(&tmux, &server, "turn after the job");
    let woken = woken_in(&server, &a);
    assert!(
        said(&woken).contains(HOOK_HEADER),
        "not woken in place:\n{}",
        server.summary()
    );
    read_once(&env, &session, &a);
    reached_the_model_once(&server, &a);
}

#[test]
fn the_cli_in_geminis_shell_tool_acts_for_its_gemini_session() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let gemini = gemini_by_setup(&env, &server);
    gemini.print("arm shell-1", &[]).ok();
    let a = armed(&server, "shell-1");
    // The shell tool runs only when approved; yolo approves it in a headless run.
    let in_a = [
        "--resume",
        a.harness_session.as_str(),
        "--approval-mode",
        "yolo",
    ];
    gemini.print("shell waitpoint check --json", &in_a).ok();
    let listed = server.wait_for_request(
        |r| r.tool_result().is_some_and(|t| t.contains("\"waiting\"")),
        LIMIT,
    );
    let listed = listed.tool_result().unwrap();
    assert!(
        listed.contains(&a.id) && listed.contains(&format!("\"{}\"", session_of(&a))),
        "{listed}"
    );
}
