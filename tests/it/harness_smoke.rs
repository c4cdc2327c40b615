//! The harness infrastructure proven on the real binaries: Claude Code (`-p` and interactive
//! under tmux) and Codex CLI (`exec`) talk to the scripted model server, call `waitpoint mcp`'s
//! tools, and run hooks, including Claude Code's `asyncRewake` wake of an idle session.

use std::fs;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{self, claude_env, codex_env};
use crate::helpers::{Env, WAITPOINT};
use crate::model_server::{ModelServer, Reply, Request};

/// The bound on each harness run and each wait here. A run takes about a second on an idle
/// machine; this only stops a hang.
const LIMIT: Duration = Duration::from_secs(60);

/// Asks for `wait_check` when told to "check", then ends the turn with "armed" once the tool's
/// result is back.
fn check_script(r: &Request) -> Reply {
    if r.tool_result().is_some() {
        Reply::text("armed")
    } else if r.last_user_text().contains("check") {
        Reply::tool("mcp__waitpoint__wait_check", json!({}))
    } else {
        Reply::text("nothing to do")
    }
}

#[test]
fn claude_print_answers_with_the_scripted_text() {
    let env = Env::new();
    let server = ModelServer::start(|_| Reply::text("Hello from the script"));
    let claude = claude_env(&env, &server);
    let run = claude.print("hello", &[], LIMIT);
    assert_eq!(
        run.ok().trim(),
        "Hello from the script",
        "{}",
        server.summary()
    );
    let turn = server.wait_for_request(|r| r.last_user_text().contains("hello"), LIMIT);
    assert!(
        turn.session_id().is_some_and(|id| id.len() == 36),
        "no session header: {turn:?}"
    );
}

#[test]
fn claude_calls_waitpoint_tools_and_returns_their_result_to_the_model() {
    let env = Env::new();
    let server = ModelServer::start(check_script);
    let claude = claude_env(&env, &server);
    claude.mcp_server(
        "waitpoint",
        WAITPOINT,
        &["mcp"],
        &[("CORTEX_SESSION", "s1")],
    );
    let run = claude.print("check what I wait on", &[], LIMIT);
    assert_eq!(run.ok().trim(), "armed", "{}", server.summary());
    let asked = server.wait_for_request(|r| r.last_user_text().contains("check"), LIMIT);
    assert!(asked.offers_tool("mcp__waitpoint__wait_check"), "{asked:?}");
    let result = server.wait_for_request(|r| r.tool_result().is_some(), LIMIT);
    let text = result.tool_result().unwrap();
    assert!(text.contains(r#""session""#), "{text}");
    assert_eq!(result.session_id(), asked.session_id());
}

#[test]
fn codex_exec_calls_waitpoint_tools_and_returns_their_result_to_the_model() {
    let env = Env::new();
    let server = ModelServer::start(check_script);
    let mut codex = codex_env(&env, &server);
    codex.mcp_server(
        "waitpoint",
        WAITPOINT,
        &["mcp"],
        &[("CORTEX_SESSION", "s1")],
    );
    let run = codex.exec("check what I wait on", &[], LIMIT);
    let out = run.ok();
    let calls = harness::events(out, "item.completed");
    let call = calls
        .iter()
        .find(|e| e["item"]["type"] == "mcp_tool_call")
        .unwrap_or_else(|| panic!("no MCP tool call in:\n{out}"));
    assert_eq!(call["item"]["server"], "waitpoint", "{call}");
    assert_eq!(call["item"]["tool"], "wait_check", "{call}");
    assert_eq!(call["item"]["status"], "completed", "{call}");
    let said: Vec<&Value> = calls
        .iter()
        .map(|e| &e["item"])
        .filter(|i| i["type"] == "agent_message")
        .collect();
    assert_eq!(said.last().unwrap()["text"], "armed", "{out}");

    let asked = server.wait_for_request(|r| r.last_user_text().contains("check"), LIMIT);
    assert!(asked.offers_tool("mcp__waitpoint__wait_check"), "{asked:?}");
    let result = server.wait_for_request(|r| r.tool_result().is_some(), LIMIT);
    let text = result.tool_result().unwrap();
    assert!(text.contains(r#""session""#), "{text}");
    assert_eq!(
        result.session_id(),
        Some(harness::thread_id(out).as_str()),
        "{}",
        server.summary()
    );
}

#[test]
fn codex_exec_runs_hooks_that_see_the_thread_id() {
    let env = Env::new();
    let server = ModelServer::start(|_| Reply::text("done"));
    let mut codex = codex_env(&env, &server);
    let seen = env.user_home.join("stop-hook.json");
    codex.hook("Stop", &format!("cat > '{}'", seen.display()));
    let run = codex.exec("hello", &[], LIMIT);
    let thread = harness::thread_id(run.ok());
    let input: Value = serde_json::from_slice(
        &fs::read(&seen)
            .unwrap_or_else(|e| panic!("the Stop hook did not run ({e}):\n{}", run.stderr)),
    )
    .unwrap();
    assert_eq!(input["hook_event_name"], "Stop", "{input}");
    assert_eq!(input["session_id"], thread.as_str(), "{input}");
}

#[test]
fn interactive_claude_shows_the_scripted_answer() {
    let env = Env::new();
    let server = ModelServer::start(|r| {
        if r.last_user_text().contains("hello") {
            Reply::text("Hello from the script")
        } else {
            Reply::text("unexpected turn")
        }
    });
    let claude = claude_env(&env, &server);
    let tmux = claude.interactive(&[], LIMIT);
    tmux.send_line("hello");
    tmux.wait_for_pane(|pane| pane.contains("Hello from the script"), LIMIT);
    // Every model request belongs to the one session, the title Claude Code asks for on the
    // side (which the server answers by itself) included; its connectivity check (`HEAD /`)
    // carries no session.
    let turns: Vec<Request> = server
        .requests()
        .into_iter()
        .filter(|r| r.method() == "POST")
        .collect();
    let session = turns[0].session_id();
    assert!(session.is_some(), "{}", server.summary());
    assert!(
        turns.iter().all(|r| r.session_id() == session),
        "{}",
        server.summary()
    );
}

#[test]
fn interactive_claude_is_woken_by_an_async_rewake_hook_without_a_keystroke() {
    let env = Env::new();
    let server = ModelServer::start(|r| {
        if r.conversation_contains("waitpoint: wake-42") {
            Reply::text("woken by the hook")
        } else {
            Reply::text("going idle")
        }
    });
    let claude = claude_env(&env, &server);
    // The hook fires after every turn; it wakes the session once, a second after the first.
    let once = env.user_home.join("woke");
    claude.hook(
        "Stop",
        &format!(
            "[ -e '{0}' ] && exit 0; touch '{0}'; sleep 1; echo 'waitpoint: wake-42' >&2; exit 2",
            once.display()
        ),
        true,
    );
    let tmux = claude.interactive(&[], LIMIT);
    tmux.send_line("start");
    tmux.wait_for_pane(|pane| pane.contains("going idle"), LIMIT);
    let wake = server.wait_for_request(|r| r.last_user_text().contains("wake-42"), LIMIT);
    assert!(
        wake.last_user_text().contains("Stop hook blocking error"),
        "{wake:?}"
    );
    tmux.wait_for_pane(|pane| pane.contains("woken by the hook"), LIMIT);
}

#[test]
fn claude_print_runs_an_async_rewake_hook_in_line_and_answers_its_wake() {
    let env = Env::new();
    let server = ModelServer::start(|r| {
        if r.last_user_text().contains("wake-43") {
            Reply::text("woken by the hook")
        } else {
            Reply::text("going idle")
        }
    });
    let claude = claude_env(&env, &server);
    let once = env.user_home.join("woke");
    claude.hook(
        "Stop",
        &format!(
            "[ -e '{0}' ] && exit 0; touch '{0}'; echo 'waitpoint: wake-43' >&2; exit 2",
            once.display()
        ),
        true,
    );
    // Under -p the hook is not left in the background: the run waits for it, and its exit 2
    // continues the same run with its stderr as the Stop hook's feedback.
    let run = claude.print("start", &[], LIMIT);
    assert_eq!(run.ok().trim(), "woken by the hook", "{}", server.summary());
    let wake = server.wait_for_request(|r| r.last_user_text().contains("wake-43"), LIMIT);
    assert!(
        wake.last_user_text().starts_with("Stop hook feedback:"),
        "{wake:?}"
    );
}

#[test]
fn interactive_claude_runs_session_end_hooks_on_exit() {
    let env = Env::new();
    let server = ModelServer::start(|_| Reply::text("unused"));
    let claude = claude_env(&env, &server);
    let seen = env.user_home.join("session-end.json");
    claude.hook("SessionEnd", &format!("cat > '{}'", seen.display()), false);
    let tmux = claude.interactive(&[], LIMIT);
    tmux.send_line("/exit");
    env.wait_until_within("the SessionEnd hook", LIMIT, || {
        fs::read(&seen).is_ok_and(|b| serde_json::from_slice::<Value>(&b).is_ok())
    });
    let input: Value = serde_json::from_slice(&fs::read(&seen).unwrap()).unwrap();
    assert_eq!(input["hook_event_name"], "SessionEnd", "{input}");
    assert_eq!(input["reason"], "prompt_input_exit", "{input}");
    assert_eq!(
        input["cwd"],
        claude.project.display().to_string(),
        "{input}"
    );
}
