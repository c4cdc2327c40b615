//! `waitpoint mcp` spoken to line by line, as no SDK client speaks: malformed and unknown
//! requests, a client that vanishes mid-wait, a request the SDK cannot read, and the session a
//! harness names in the server's environment. The SDK clients' view is in `mcp.rs`.

use crate::helpers::{Env, PATIENCE, WAITPOINT};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `waitpoint mcp` with pipes, spoken to line by line.
pub(crate) struct Raw {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Raw {
    pub(crate) fn start(env: &Env) -> Raw {
        Raw::start_with(env, &[])
    }

    pub(crate) fn start_with(env: &Env, args: &[&str]) -> Raw {
        let mut c = env.command(WAITPOINT);
        c.arg("mcp").args(args);
        Raw::spawn(c)
    }

    pub(crate) fn spawn(mut command: std::process::Command) -> Raw {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Raw {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    pub(crate) fn send(&mut self, line: &str) {
        let w = self.stdin.as_mut().unwrap();
        w.write_all(line.as_bytes()).unwrap();
        w.write_all(b"\n").unwrap();
        w.flush().unwrap();
    }

    /// The next message `pick` accepts, skipping others; every stdout line must be a JSON-RPC
    /// message.
    fn next_message(&mut self, what: &str, pick: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {what}"));
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout carried a non-protocol line ({e}): {line}"));
            assert_eq!(v["jsonrpc"], "2.0", "{line}");
            if pick(&v) {
                return v;
            }
        }
    }

    /// The answer to request `id`.
    pub(crate) fn answer(&mut self, id: u64) -> Value {
        self.next_message(&format!("answer to request {id}"), |v| v["id"] == id)
    }

    /// The next notification of `method`.
    pub(crate) fn notification(&mut self, method: &str) -> Value {
        self.next_message(&format!("{method} notification"), |v| v["method"] == method)
    }

    /// Calls `wait_next` (request 2, up to 60 s) with a progress token and returns once the
    /// server's first progress report for it arrives: the call is then waiting inside the
    /// server, not just written to its stdin.
    fn wait_next_waiting(&mut self) {
        self.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait_next","arguments":{"timeout_s":60},"_meta":{"progressToken":"waiting"}}}"#);
        let report = self.notification("notifications/progress");
        assert_eq!(report["params"]["progressToken"], "waiting", "{report}");
    }

    /// The handshake; returns the server's `initialize` result.
    pub(crate) fn initialize(&mut self) -> Value {
        self.send(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
        );
        let result = self.answer(1)["result"].clone();
        assert_eq!(result["protocolVersion"], "2025-11-25");
        self.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        result
    }

    /// Closes stdin and waits for the exit; returns the status and stderr.
    pub(crate) fn close(mut self) -> (std::process::ExitStatus, String) {
        drop(self.stdin.take());
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "waitpoint mcp did not exit after stdin closed"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut self.child.stderr.take().unwrap(), &mut err).unwrap();
        (status, err)
    }
}

impl Raw {
    /// `waitpoint mcp` started by a harness that sets `vars` in its environment.
    pub(crate) fn start_in(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Raw {
        let mut c = env.command(WAITPOINT);
        c.arg("mcp").args(args).envs(vars.iter().copied());
        Raw::spawn(c)
    }

    /// A `tools/call` with `_meta`, answered.
    pub(crate) fn call(&mut self, id: u64, tool: &str, args: Value, meta: Value) -> Value {
        let req = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                         "params": {"name": tool, "arguments": args, "_meta": meta}});
        self.send(&req.to_string());
        self.answer(id)["result"].clone()
    }
}

#[test]
fn malformed_and_unknown_requests_get_protocol_errors_and_the_server_lives_on() {
    let env = Env::new();
    let mut s = Raw::start(&env);
    s.initialize();
    s.send("this is not json");
    s.send(r#"{"jsonrpc":"2.0","id":2,"method":"no/such/method"}"#);
    assert_eq!(s.answer(2)["error"]["code"], -32601);
    s.send(
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nope","arguments":{}}}"#,
    );
    assert_eq!(s.answer(3)["error"]["code"], -32602);
    s.send(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"wait_create","arguments":{"label":7,"intent":"i"}}}"#);
    let typed = s.answer(4);
    assert_eq!(typed["result"]["isError"], true, "{typed}");
    assert!(
        typed["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("label: invalid type")
    );
    // A 10 MB request line: refused by the engine's bounds, not by running out of anything.
    let huge = "x".repeat(10 << 20);
    s.send(&format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"wait_create","arguments":{{"label":"t","intent":"{huge}"}}}}}}"#
    ));
    let big = s.answer(5);
    assert_eq!(big["result"]["isError"], true);
    assert_eq!(
        big["result"]["content"][0]["text"],
        "intent must be 1-4000 characters"
    );
    s.send(r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"wait_check","arguments":{}}}"#);
    assert_eq!(s.answer(6)["result"]["isError"], false);
    let (status, stderr) = s.close();
    assert!(status.success(), "exit {status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !env.home.join("waitpoints").exists() || env.tree().matches("waitpoint.json").count() == 0
    );
}

#[test]
fn a_client_that_vanishes_mid_wait_leaves_its_wake_unread() {
    let env = Env::new();
    let mut s = Raw::start(&env);
    s.initialize();
    s.wait_next_waiting();
    // The call is blocking inside the server now; the client goes away.
    let (status, stderr) = s.close();
    assert!(status.success(), "exit {status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // A wake that arrives for a vanished reader stays unread for the next one.
    let mut s = Raw::start(&env);
    s.initialize();
    s.wait_next_waiting();
    drop(s.stdin.take());
    env.timer_now("default", "for a reader that left");
    let _daemon = env.daemon();
    env.wait_until("the timer's wake", || {
        !env.inbox("default", "new").is_empty() || !env.inbox("default", "cur").is_empty()
    });
    let (status, _) = s.close();
    assert!(status.success());
    let out = env.waitpoint(&["next", "--session", "default", "--timeout", "10", "--json"]);
    let wake: Value = serde_json::from_str(&env.ok("next", &out)).unwrap();
    assert_eq!(wake["kind"], "timer");
}

#[test]
fn a_request_the_sdk_cannot_read_is_answered_under_its_own_id() {
    let env = Env::new();
    let mut s = Raw::start(&env);
    s.initialize();
    for (line, id, code, says) in [
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":5}"#,
            json!(8),
            -32602,
            "params must be an object",
        ),
        (
            r#"{"id":"x9","method":"ping"}"#,
            json!("x9"),
            -32600,
            "jsonrpc",
        ),
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{}}"#,
            json!(10),
            -32602,
            "tools/call",
        ),
        (
            r#"{"jsonrpc":"2.0","id":11,"method":"no/such"}"#,
            json!(11),
            -32601,
            "no/such",
        ),
    ] {
        s.send(line);
        let answer = s.next_message(&format!("an answer to {line}"), |v| v["id"] == id);
        assert_eq!(answer["error"]["code"], code, "{line}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{line}: {message}");
    }
    // And the server reads on.
    s.send(r#"{"jsonrpc":"2.0","id":12,"method":"ping"}"#);
    assert_eq!(s.answer(12)["result"], json!({}));
}

/// What Codex 0.171 puts in each call's `_meta` (abridged), in a git checkout at `cwd`.
fn codex_turn(thread: &str, cwd: &str) -> Value {
    json!({"callId": "call_1", "threadId": thread, "sessionId": thread,
           "x-codex-turn-metadata": {"session_id": thread, "thread_id": thread,
                                     "turn_id": "turn-1", "turn_trigger": "exec",
                                     "workspaces": {cwd: {"has_changes": false}}}})
}

#[test]
fn each_codex_thread_is_a_session_of_its_own_and_remembered_for_resume() {
    let env = Env::new();
    let mut s = Raw::start(&env);
    s.initialize();
    let armed = s.call(
        2,
        "wait_create",
        json!({"label": "a's job", "intent": "thread a waits"}),
        codex_turn("thread-a", "/work/a"),
    );
    let id = armed["structuredContent"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let theirs = s.call(
        3,
        "wait_check",
        json!({}),
        codex_turn("thread-b", "/work/b"),
    );
    assert_eq!(theirs["structuredContent"]["session"], "codex-thread-b");
    assert_eq!(
        theirs["structuredContent"]["waiting"],
        json!([]),
        "{theirs}"
    );
    let cancel = s.call(
        4,
        "wait_cancel",
        json!({"id": id}),
        codex_turn("thread-b", "/work/b"),
    );
    assert_eq!(cancel["isError"], true, "{cancel}");
    let own = s.call(
        5,
        "wait_check",
        json!({}),
        codex_turn("thread-a", "/work/a"),
    );
    assert_eq!(own["structuredContent"]["session"], "codex-thread-a");
    assert_eq!(own["structuredContent"]["waiting"][0]["id"], id.as_str());
    let seen: Value = serde_json::from_str(
        &std::fs::read_to_string(env.home.join("sessions/codex-thread-a/harness.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        seen,
        json!({"harness": "codex", "session_id": "thread-a", "project_dir": "/work/a"})
    );
    // A call that names no thread acts for the default session, as before.
    let plain = s.call(6, "wait_check", json!({}), json!({}));
    assert_eq!(plain["structuredContent"]["session"], "default");
}

#[test]
fn claude_code_names_the_session_in_the_servers_environment_and_a_named_one_wins() {
    let env = Env::new();
    let claude = [
        ("CLAUDE_CODE_SESSION_ID", "5e1f0c2a-claude"),
        ("CLAUDE_PROJECT_DIR", "/work/p"),
    ];
    let mut s = Raw::start_in(&env, &[], &claude);
    s.initialize();
    let v = s.call(2, "wait_check", json!({}), json!({}));
    assert_eq!(v["structuredContent"]["session"], "claude-5e1f0c2a-claude");
    assert!(
        env.home
            .join("sessions/claude-5e1f0c2a-claude/harness.json")
            .exists()
    );
    // One inbox shared on purpose: the named session, whoever calls.
    let mut shared = Raw::start_in(&env, &["--session", "myproject"], &claude);
    shared.initialize();
    let v = shared.call(2, "wait_check", json!({}), codex_turn("t", "/x"));
    assert_eq!(v["structuredContent"]["session"], "myproject");
}
