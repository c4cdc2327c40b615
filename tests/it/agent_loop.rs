//! The agent's loop in the real harnesses: Claude Code 2.1 and Codex CLI 0.171, configured by
//! `waitpoint setup` alone, talking to a scripted model on 127.0.0.1. An agent arms a
//! waitpoint, ends its turn, the job signals, and the agent is woken in its own session: in
//! place while the session is open, by a resume in its project once it was closed; once,
//! and never with another session's wake.

use std::fs;
use std::path::Path;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

use crate::agent_scenario::{
    AgentHarness, Armed, HOOK_HEADER, a_closed_session_is_resumed_once, armed, job_reports, play,
    read_once, setup, ten_turns_then_one_idle_waiter, turns_saying,
    two_sessions_each_see_and_get_only_their_own, waiters_of, woken_in,
};
use crate::harness::{self, Claude, Codex, claude_first_run, codex_env, harness_bin};
use crate::helpers::{DaemonGuard, Env, WAITPOINT};
use crate::model_server::{ModelServer, Reply, Request};

/// The bound on each harness run and each wait: a hang stops here; nothing is timed.
const LIMIT: Duration = Duration::from_secs(90);

/// The agent, scripted: "arm LABEL" arms a waitpoint, "check" lists what it waits on, "cancel
/// ID" disarms one; after a tool's result it ends its turn; a wake's text gets "woken".
fn agent(r: &Request) -> Reply {
    if !r.offers_tool("mcp__waitpoint__wait_create") && r.offers_tool("Bash") {
        return Reply::text("my waitpoint tools are not connected yet");
    }
    let said = r.last_user_text();
    if r.tool_result().is_none() && said.starts_with("Generate a concise") {
        // Codex's TUI asks for a title for the task on the side, quoting the prompt.
        return Reply::text("a title");
    }
    play(r, &said, &|t| format!("mcp__waitpoint__{t}"))
}

/// The daemon, started outside the project, able to run `harness` for a resume.
fn daemon(env: &Env, harness: &str, vars: &[(&'static str, String)]) -> DaemonGuard {
    let bins = [
        harness_bin(harness).parent().unwrap().to_owned(),
        Path::new(WAITPOINT).parent().unwrap().to_owned(),
    ];
    let path = format!("{}:{}:/usr/bin:/bin", bins[0].display(), bins[1].display());
    let mut all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.push(("PATH", &path));
    env.daemon_with_env(&all)
}

fn claude_by_setup<'e>(env: &'e Env, server: &ModelServer) -> Claude<'e> {
    let claude = claude_first_run(env, server);
    setup(env, &claude.project, &["claude-code", "--project"]);
    claude
}

/// The live waiters of this home: `adapter claude-hook` processes naming it (setup writes
/// `--home` into the hooks).
fn waiters(env: &Env) -> Vec<u32> {
    waiters_of(env, "adapter claude-hook")
}

/// Waits until `a`'s wake reached its harness session by the session's waiter (the hook's text,
/// not a resume's prompt), and checks it was read once.
fn woken_in_place(env: &Env, server: &ModelServer, session: &str, a: &Armed) {
    let woken = woken_in(server, &a.harness_session, a);
    assert!(
        woken.last_user_text().contains(HOOK_HEADER),
        "{}",
        server.summary()
    );
    read_once(env, session, a);
}

/// Waits until `session` has a waiter (`waiter.json` names it).
fn wait_for_waiter(env: &Env, session: &str, what: &str) {
    let record = env.home.join("sessions").join(session).join("waiter.json");
    env.wait_until(what, || record.exists());
}

/// Claude Code set up by `waitpoint setup`, a daemon that can resume it, and its TUI open with
/// our MCP server started.
fn open_claude<'e>(
    env: &'e Env,
    server: &ModelServer,
) -> (Claude<'e>, DaemonGuard, crate::harness::Tmux) {
    let claude = claude_by_setup(env, server);
    let daemon = daemon(env, "claude", &claude.vars());
    let tmux = claude.interactive(&[], LIMIT);
    wait_for_the_mcp_server(env);
    (claude, daemon, tmux)
}

/// Interactive Claude Code connects its MCP servers in the background: waits until ours started
/// (it remembers its session as it starts).
fn wait_for_the_mcp_server(env: &Env) {
    env.wait_until("the MCP server to start", || {
        fs::read_dir(env.home.join("sessions"))
            .is_ok_and(|d| d.flatten().any(|e| e.path().join("harness.json").exists()))
    });
}

/// Asks the agent in the TUI to arm `label`, again while a turn comes before the tools do (the
/// session's first turn may), and returns what it armed.
fn arm_in_tui(env: &Env, server: &ModelServer, tmux: &crate::harness::Tmux, label: &str) -> Armed {
    let cue = format!("arm {label}");
    let is_armed = |r: &Request| {
        r.tool_result()
            .is_some_and(|t| t.contains("\"secret\"") && t.contains(label))
    };
    let too_early = |r: &Request| {
        r.last_user_text().contains(&cue)
            && r.offers_tool("Bash")
            && !r.offers_tool("mcp__waitpoint__wait_create")
    };
    for tries in 1.. {
        tmux.send_line(&format!("please {cue} before the job starts"));
        let mut done = false;
        env.wait_until("the arming turn", || {
            let rs = server.requests();
            done = rs.iter().any(is_armed);
            done || rs.iter().filter(|r| too_early(r)).count() >= tries
        });
        if done {
            break;
        }
        assert!(tries < 5, "the tools never came:\n{}", server.summary());
    }
    armed(server, label)
}

#[test]
fn after_clear_a_claude_code_session_arms_and_is_woken_in_the_conversation_the_user_is_in() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let (_claude, _daemon, tmux) = open_claude(&env, &server);
    // Before the session's first turn: the old id never gets a transcript to resume.
    tmux.send_line("/clear");
    // The new conversation's SessionStart hook has run: it remembers its session.
    env.wait_until("the new conversation's first hook", || {
        fs::read_dir(env.home.join("sessions")).is_ok_and(|d| {
            d.flatten()
                .filter(|e| e.path().join("harness.json").exists())
                .count()
                == 2
        })
    });
    let a = arm_in_tui(&env, &server, &tmux, "clr-1");
    // The turn ran in the new conversation, and the waitpoint belongs to it.
    let session = format!("claude-{}", a.harness_session);
    assert_eq!(env.state(&a.id)["session"], session.as_str());
    wait_for_waiter(&env, &session, "the new conversation's waiter");
    job_reports(&env, &a);
    tmux.wait_for_pane(|p| p.contains("woken"), LIMIT);
    woken_in_place(&env, &server, &session, &a);
}

#[test]
fn an_open_claude_code_session_is_woken_in_place_once_by_one_idle_waiter() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let (_claude, _daemon, tmux) = open_claude(&env, &server);
    let a = arm_in_tui(&env, &server, &tmux, "live-1");
    let session = format!("claude-{}", a.harness_session);
    // The status line carries the capsule of this session.
    tmux.wait_for_pane(|p| p.contains("live-1 · 0/1 received · expires in"), LIMIT);
    // The turn ended; the Stop hook's waiter holds the session.
    wait_for_waiter(&env, &session, "the session's waiter");
    job_reports(&env, &a);
    // No keystroke: the waiter's exit wakes the idle session with the wake.
    tmux.wait_for_pane(|p| p.contains("woken"), LIMIT);
    assert_eq!(
        turns_saying(&server, HOOK_HEADER).len(),
        1,
        "{}",
        server.summary()
    );
    // Not also resumed: no turn was given the wake's bare text as its prompt.
    let resumed = turns_saying(&server, &format!("Waitpoint {}", a.id))
        .iter()
        .filter(|r| !r.last_user_text().contains(HOOK_HEADER))
        .count();
    assert_eq!(resumed, 0, "{}", server.summary());
    read_once(&env, &session, &a);

    // Ten more turns: each Stop starts a waiter, which replaces the one before, so the
    // session never has more than one. A turn's own waiter is the one started after its model
    // request (the previous turn's was started before Claude Code sent it).
    ten_turns_then_one_idle_waiter(&env, &session, &waiters, |n| {
        let said = format!("turn {n}");
        tmux.send_line(&said);
        server.wait_for_request(|r| r.last_user_text().trim() == said, LIMIT);
    });

    tmux.send_line("/exit");
    env.wait_until("no waiter once the session closed", || {
        waiters(&env).is_empty()
    });
}

#[test]
fn a_closed_claude_code_session_is_resumed_in_its_project_by_a_daemon_started_elsewhere() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let claude = claude_by_setup(&env, &server);
    // The daemon's directory is not the project: the resume finds the project on its own.
    let _daemon = daemon(&env, "claude", &claude.vars());
    claude.turn("arm closed-1 then stop", None);
    let a = armed(&server, "closed-1");
    a_closed_session_is_resumed_once(&env, &server, &claude, &claude.project, &a);
}

/// What is killed while a resumed turn is under way.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// The daemon's process group: the daemon alone, as a service manager's stop of it.
    DaemonGroup,
    /// The daemon and everything it started: the adapter, Claude Code, its children (a crash
    /// of the machine, as far as the processes go).
    Everything,
}

/// The processes descended from `pid`, `pid` first.
fn process_tree(pid: u32) -> Vec<u32> {
    let parent_of = |p: u32| -> Option<u32> {
        let stat = fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let all: Vec<u32> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(all.iter().filter(|&&c| parent_of(c) == Some(p)));
        i += 1;
    }
    tree
}

#[test]
fn a_resumed_turn_of_minutes_cut_off_by_a_kill_reaches_the_agent_once() {
    for cut in [Cut::DaemonGroup, Cut::Everything] {
        let env = Env::new();
        let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gate = released.clone();
        // The resumed turn thinks until the test lets it end: a real agent's turn of minutes.
        let server = ModelServer::start(move |r| {
            if r.last_user_text().contains("Waitpoint wp_") {
                while !gate.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            agent(r)
        });
        let claude = claude_by_setup(&env, &server);
        let daemon = daemon(&env, "claude", &claude.vars());
        claude.print("arm long-1 then stop", &[], LIMIT).ok();
        let a = armed(&server, "long-1");
        let session = format!("claude-{}", a.harness_session);
        job_reports(&env, &a);
        woken_in(&server, &a.harness_session, &a);
        // Mid-turn: Claude Code has the turn's prompt in its transcript, as it has within a
        // moment of a turn's start (a kill in that moment is a turn that never began).
        let wake_id = env.inbox(&session, "new")[0]["wake_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let projects = env.user_home.join(".claude/projects");
        env.wait_until("the turn in Claude Code's transcript", || {
            fs::read_dir(&projects)
                .into_iter()
                .flatten()
                .flatten()
                .any(|d| {
                    fs::read_dir(d.path())
                        .into_iter()
                        .flatten()
                        .flatten()
                        .any(|f| fs::read_to_string(f.path()).is_ok_and(|t| t.contains(&wake_id)))
                })
        });
        let doomed = match cut {
            Cut::DaemonGroup => vec![daemon.pid()],
            Cut::Everything => process_tree(daemon.pid()),
        };
        for pid in doomed {
            // Processes of this test's own tree; one that already exited is no failure.
            let pid = Pid::from_raw(pid as i32).expect("a pid from /proc");
            let _ = kill_process(pid, Signal::KILL);
        }
        drop(daemon);
        released.store(true, std::sync::atomic::Ordering::SeqCst);
        let _again = self::daemon(&env, "claude", &claude.vars());
        read_once(&env, &session, &a);
        assert_eq!(
            turns_saying(&server, &format!("Waitpoint {}", a.id)).len(),
            1,
            "{cut:?}: {}",
            server.summary()
        );
        // The resume that delivered it removes its record right after marking it read.
        let record = env.home.join("sessions").join(&session).join("resume.json");
        env.wait_until("the resume's record removed", || !record.exists());
    }
}

#[test]
fn two_claude_code_sessions_in_one_project_each_see_and_get_only_their_own() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let claude = claude_by_setup(&env, &server);
    let _daemon = daemon(&env, "claude", &claude.vars());
    two_sessions_each_see_and_get_only_their_own(&env, &server, &claude);
}

impl AgentHarness for Claude<'_> {
    fn name(&self) -> &'static str {
        "claude"
    }
    fn recorded_name(&self) -> &'static str {
        "claude-code"
    }
    fn resume_flag(&self) -> &'static str {
        "--resume"
    }
    fn run_headless(&self, prompt: &str, args: &[&str]) {
        self.print(prompt, args, LIMIT).ok();
    }
}

#[test]
fn claude_print_mode_in_a_project_with_the_hooks_answers_at_once() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let claude = claude_by_setup(&env, &server);
    // The hooks wait up to a day in an open session; under -p they must not wait at all.
    let run = claude.print("hello", &[], LIMIT);
    assert_eq!(run.ok().trim(), "ok", "{}", run.stderr);
    assert!(waiters(&env).is_empty());
}

#[test]
fn a_closed_codex_thread_is_resumed_with_its_wake_and_codex_exec_never_waits_on_the_hook() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let mut codex = codex_env(&env, &server);
    setup(&env, &codex.project, &["codex"]);
    codex.trust_hooks();
    let _daemon = daemon(&env, "codex", &codex.vars());
    // With the Stop hook trusted, an exec run still ends at once: nobody is idle to wake.
    let run = codex.exec("arm cx-1 then stop", &[], LIMIT);
    let thread = harness::thread_id(run.ok());
    let a = armed(&server, "cx-1");
    assert_eq!(a.harness_session, thread);
    let seen: Value = serde_json::from_str(
        &fs::read_to_string(
            env.home
                .join(format!("sessions/codex-{thread}/harness.json")),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(seen["harness"], "codex");
    job_reports(&env, &a);
    woken_in(&server, &thread, &a);
    let session = format!("codex-{thread}");
    read_once(&env, &session, &a);
}

#[test]
fn an_open_codex_session_continues_its_turn_with_its_wake_without_a_keystroke() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let mut codex = codex_env(&env, &server);
    setup(&env, &codex.project, &["codex"]);
    // The Stop hook setup wrote is new to Codex, which runs it only once trusted.
    codex.trust_hooks();
    let _daemon = daemon(&env, "codex", &codex.vars());
    let tmux = codex.interactive(&[], LIMIT);
    tmux.send_line("arm cx-live");
    let a = armed(&server, "cx-live");
    let thread = a.harness_session.as_str();
    let session = format!("codex-{thread}");
    // The turn ended; the Stop hook's waiter holds it open for the session's next wake.
    wait_for_waiter(&env, &session, "the session's waiter");
    job_reports(&env, &a);
    // No keystroke: the hook's reply continues the turn, in the same thread, with the wake.
    let woken = woken_in(&server, thread, &a);
    assert!(
        woken.last_user_text().contains(HOOK_HEADER),
        "not the hook's text:\n{}",
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
}

#[test]
fn two_codex_threads_in_one_project_each_see_and_get_only_their_own() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let mut codex = codex_env(&env, &server);
    setup(&env, &codex.project, &["codex"]);
    codex.trust_hooks();
    let _daemon = daemon(&env, "codex", &codex.vars());
    two_sessions_each_see_and_get_only_their_own(&env, &server, &codex);
}

impl AgentHarness for Codex<'_> {
    fn name(&self) -> &'static str {
        "codex"
    }
    fn resume_flag(&self) -> &'static str {
        "resume"
    }
    fn run_headless(&self, prompt: &str, args: &[&str]) {
        self.exec(prompt, args, LIMIT).ok();
    }
}

/// An open Codex TUI whose user pressed Esc while the Stop hook waited: the waiter is gone, and
/// the thread stays open (Codex's writer lock held). Then a daemon starts and the job reports,
/// so the resume meets the open thread. Returns the TUI, the waitpoint, its session, the daemon.
fn codex_open_without_a_waiter<'e>(
    env: &'e Env,
    server: &ModelServer,
    codex: &mut crate::harness::Codex<'e>,
) -> (crate::harness::Tmux, Armed, String, DaemonGuard) {
    setup(env, &codex.project, &["codex"]);
    codex.trust_hooks();
    let tmux = codex.interactive(&[], LIMIT);
    tmux.send_line("arm cx-esc");
    let a = armed(server, "cx-esc");
    let session = format!("codex-{}", a.harness_session);
    wait_for_waiter(env, &session, "the Stop hook's waiter");
    tmux.send_keys(&["Escape"]);
    // Codex kills the hook: its record stays, the process goes.
    env.wait_until("Esc to end the waiter", || {
        waiters_of(env, "adapter codex-stop-hook").is_empty()
    });
    let daemon = daemon(env, "codex", &codex.vars());
    job_reports(env, &a);
    (tmux, a, session, daemon)
}

/// The hook delivery of `a`'s wake, once the daemon settled it: delivered at the first attempt.
fn delivered_at_first_attempt(env: &Env, a: &Armed) {
    env.wait_until("the onWake run to be settled", || {
        env.state(&a.id)["hook_deliveries"][0]["delivered_at"].is_string()
    });
    let state = env.state(&a.id);
    assert_eq!(
        state["hook_deliveries"][0]["attempts"], 1,
        "a resume refused by the open thread: {state}"
    );
}

#[test]
fn after_esc_an_open_codex_thread_gets_its_wake_at_its_next_turn_end_not_refused_resumes() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let mut codex = codex_env(&env, &server);
    let (tmux, a, session, _daemon) = codex_open_without_a_waiter(&env, &server, &mut codex);
    // The user's next turn ends, and its Stop hook hands the wake over in the same thread.
    tmux.send_line("turn two");
    woken_in_place(&env, &server, &session, &a);
    delivered_at_first_attempt(&env, &a);
    assert_eq!(
        turns_saying(&server, &format!("Waitpoint {}", a.id)).len(),
        1,
        "{}",
        server.summary()
    );
}

#[test]
fn after_esc_and_quit_a_codex_thread_is_resumed_as_soon_as_codex_lets_it_go() {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let mut codex = codex_env(&env, &server);
    let (tmux, a, session, _daemon) = codex_open_without_a_waiter(&env, &server, &mut codex);
    // The resume runs, and meets the open thread; then the user quits.
    env.wait_until("the resume to meet the open thread", || {
        !waiters_of(&env, "adapter resume").is_empty()
    });
    drop(tmux);
    let resumed = woken_in(&server, &a.harness_session, &a);
    assert!(!resumed.last_user_text().contains(HOOK_HEADER));
    read_once(&env, &session, &a);
    delivered_at_first_attempt(&env, &a);
}

/// Whether process `pid`'s parent is Codex's managed app-server.
fn child_of_the_app_server(pid: u32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let parent = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_default();
    let cmdline = fs::read(format!("/proc/{parent}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    cmdline.contains("app-server") && cmdline.contains("--managed-daemon")
}

#[test]
fn a_codex_thread_run_by_its_managed_app_server_is_woken_in_place_and_after_quit_resumed_with_no_waiter_left()
 {
    let env = Env::new();
    let server = ModelServer::start(agent);
    let mut codex = codex_env(&env, &server);
    // As a user's Codex runs: its TUI starts the app-server, which runs the thread's hooks.
    codex.managed = true;
    setup(&env, &codex.project, &["codex"]);
    codex.trust_hooks();
    let _daemon = daemon(&env, "codex", &codex.vars());
    let tmux = codex.interactive(&[], LIMIT);
    tmux.send_line("arm cx-app-1");
    let a = armed(&server, "cx-app-1");
    let session = format!("codex-{}", a.harness_session);
    wait_for_waiter(&env, &session, "the Stop hook's waiter");
    let hook = waiters_of(&env, "adapter codex-stop-hook");
    assert!(
        hook.len() == 1 && child_of_the_app_server(hook[0]),
        "the hook does not run in the managed app-server: {hook:?}"
    );
    // Open: the terminal shows the thread, and the wake continues its turn there.
    job_reports(&env, &a);
    woken_in_place(&env, &server, &session, &a);
    tmux.wait_for_pane(|p| p.contains("woken"), LIMIT);
    // The woken turn ends with a Stop hook of its own, which finds nothing armed and leaves.
    // Typed while it runs, a line is only queued by Codex, and was seen lost (once in a few
    // runs): the user types once the thread is idle.
    env.wait_until("the woken turn's Stop hook to leave", || {
        waiters_of(&env, "adapter codex-stop-hook").is_empty()
    });
    // A second waitpoint, and the user quits while the Stop hook waits for it.
    tmux.send_line("arm cx-app-2");
    let b = armed(&server, "cx-app-2");
    wait_for_waiter(&env, &session, "the second Stop hook's waiter");
    tmux.send_line("/quit");
    // The app-server keeps the thread, but nobody sees it: the waiter leaves with the terminal.
    env.wait_until("the waiter to leave with the terminal", || {
        waiters_of(&env, "adapter codex-stop-hook").is_empty()
    });
    job_reports(&env, &b);
    let resumed = woken_in(&server, &b.harness_session, &b);
    assert!(
        !resumed.last_user_text().contains(HOOK_HEADER),
        "handed to the quit terminal's hook, not resumed:\n{}",
        server.summary()
    );
    read_once(&env, &session, &b);
    assert_eq!(
        turns_saying(&server, &format!("Waitpoint {}", b.id)).len(),
        1,
        "{}",
        server.summary()
    );
}
