//! Wake adapters: turning a wake in a session's inbox into a turn of a real agent harness.
//!
//! The inbox stays the source of truth. An adapter takes a wake to the harness in one of the
//! ways the harness documents, and only a success marks the wake read; a failure leaves it
//! unread (the `onWake` runner retries it, with the "delivery retrying" badge meanwhile).
//!
//! - Hooks that block on the session's next wake and hand its text to a live session: Claude
//!   Code's `asyncRewake` command hook (exit 2, the text on stderr, wakes an idle session) and
//!   Codex's `Stop` hook (a `{"decision":"block","reason":…}` reply continues the turn).
//! - Resuming a closed session non-interactively with the wake text as the prompt, as an
//!   `onWake` command: `claude -p --resume ID` and `codex exec resume ID -`.
//!
//! This module builds the harness's command line and judges its answer; running it is the only
//! I/O besides the inbox.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::delivery::{self, hook, hook::HookRun};
use crate::error::Result;
use crate::home::Home;
use crate::model::Wake;

/// The harnesses with a resume adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Harness {
    /// Claude Code: `claude -p --resume ID --output-format json`, the prompt on stdin.
    Claude,
    /// The Codex CLI: `codex exec --json resume ID -`, the prompt on stdin.
    Codex,
}

impl Harness {
    /// The program's usual name on `PATH`.
    pub fn program(self) -> &'static str {
        match self {
            Harness::Claude => "claude",
            Harness::Codex => "codex",
        }
    }
}

/// One resume of a harness session.
#[derive(Debug, Clone)]
pub struct Resume {
    pub harness: Harness,
    /// The program to run (the harness's usual name unless told otherwise).
    pub program: String,
    /// The harness's session (Claude's session id, Codex's thread id or name).
    pub target: String,
    /// Claude only: resume into a new session id, for a session that may be open elsewhere.
    pub fork: bool,
}

impl Resume {
    /// The arguments after the program. The prompt goes on stdin, never in argv.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = match self.harness {
            Harness::Claude => vec![
                "-p".into(),
                "--resume".into(),
                self.target.clone(),
                "--output-format".into(),
                "json".into(),
            ],
            Harness::Codex => vec![
                "exec".into(),
                "--json".into(),
                "resume".into(),
                self.target.clone(),
                "-".into(),
            ],
        };
        if self.fork && self.harness == Harness::Claude {
            a.push("--fork-session".into());
        }
        a
    }
}

/// The prompt a resumed session is given: the wake's own text, which frames any external payload
/// as data.
pub fn prompt(wake: &Wake) -> String {
    wake.text.clone()
}

/// Whether a harness run succeeded, from its exit status and standard output. Claude Code prints
/// one JSON result (`is_error` says whether the turn failed); Codex prints JSON events, where a
/// `turn.failed` or `error` event is a failure even under exit status 0.
pub fn judge(harness: Harness, success: bool, exit: &str, stdout: &str) -> Result<(), String> {
    if !success {
        return Err(format!("{} {exit}", harness.program()));
    }
    match harness {
        Harness::Claude => {
            let v: Value = serde_json::from_str(stdout.trim()).map_err(|e| {
                format!(
                    "claude printed no JSON result ({e}): {}",
                    first_line(stdout)
                )
            })?;
            if v["is_error"].as_bool().unwrap_or(false) {
                return Err(format!(
                    "claude reported an error: {}",
                    v["result"].as_str().unwrap_or("(no text)")
                ));
            }
            Ok(())
        }
        Harness::Codex => {
            for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
                let Ok(ev) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                let kind = ev["type"].as_str().unwrap_or("");
                if kind == "turn.failed" || kind == "error" {
                    return Err(format!("codex reported {kind}: {}", first_line(line)));
                }
            }
            Ok(())
        }
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(300).collect()
}

/// Runs the harness with the wake as the prompt; on success marks the wake read. `Err` is the
/// reason, for the `onWake` runner's record; the wake stays unread.
pub fn resume(home: &Home, wake: &Wake, r: &Resume, timeout: Duration) -> Result<(), String> {
    let run = HookRun {
        argv: std::iter::once(r.program.clone()).chain(r.args()).collect(),
        stdin: prompt(wake).into_bytes(),
        env: Vec::new(),
        timeout,
    };
    let done = hook::run_to_end(&run, true).map_err(|e| format!("{}: {e}", r.program))?;
    let (status, out) = (
        done.status,
        String::from_utf8_lossy(&done.stdout).into_owned(),
    );
    let exit = status.code().map_or_else(
        || "was killed by a signal".to_owned(),
        |c| format!("exited {c}"),
    );
    judge(r.harness, status.success(), &exit, &out).map_err(|why| {
        let err = String::from_utf8_lossy(&done.stderr);
        match err.trim().lines().last() {
            Some(line) => format!("{why} (stderr: {})", first_line(line)),
            None => why,
        }
    })?;
    delivery::mark_read(home, &wake.channel, &wake.wake_id)
        .map_err(|e| format!("resumed, but cannot mark the wake read: {e}"))?;
    Ok(())
}

/// Blocks until the session has a wake (or `timeout` passes), then takes it and every other
/// unread one, oldest first: one harness turn for what piled up.
pub fn take_pending(home: &Home, session: &str, timeout: Duration) -> Result<Vec<Wake>> {
    let deadline = Some(Instant::now() + timeout);
    let inbox = crate::agent::Inbox::open(home, session)?;
    let Some(first) = inbox.take(deadline, Duration::from_secs(60), &|| false)? else {
        return Ok(Vec::new());
    };
    let mut wakes = vec![first];
    while let Some(w) = delivery::take_next(home, session)? {
        wakes.push(w);
    }
    Ok(wakes)
}

/// The text a hook hands to the harness for these wakes.
pub fn hook_text(wakes: &[Wake]) -> String {
    let parts: Vec<&str> = wakes.iter().map(|w| w.text.trim_end()).collect();
    format!(
        "waitpoint: {} wake(s) for this session.\n\n{}\n",
        wakes.len(),
        parts.join("\n\n---\n\n")
    )
}

/// Codex's `Stop` hook reply that continues the turn with the wakes as its prompt.
pub fn codex_stop_reply(wakes: &[Wake]) -> String {
    json!({ "decision": "block", "reason": hook_text(wakes) }).to_string()
}

/// Puts taken wakes back among the unread (a hook that could not hand them over).
pub fn give_back(home: &Home, wakes: &[Wake]) {
    for w in wakes {
        if let Err(e) = delivery::untake(home, &w.channel, &w.wake_id) {
            tracing::error!(wake = %w.wake_id, "cannot put a wake back: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_resumes_with_json_output_and_codex_reads_the_prompt_from_stdin() {
        let r = Resume {
            harness: Harness::Claude,
            program: "claude".into(),
            target: "abc".into(),
            fork: true,
        };
        assert_eq!(
            r.args(),
            [
                "-p",
                "--resume",
                "abc",
                "--output-format",
                "json",
                "--fork-session"
            ]
        );
        let c = Resume {
            harness: Harness::Codex,
            program: "codex".into(),
            target: "t1".into(),
            fork: true,
        };
        assert_eq!(c.args(), ["exec", "--json", "resume", "t1", "-"]);
    }

    #[test]
    fn a_harness_failure_is_judged_from_its_output_not_only_its_status() {
        let claude = |out: &str| judge(Harness::Claude, true, "exited 0", out);
        assert!(claude(r#"{"type":"result","is_error":false,"result":"done"}"#).is_ok());
        let e = claude(r#"{"type":"result","is_error":true,"result":"quota"}"#).unwrap_err();
        assert!(e.contains("quota"), "{e}");
        assert!(claude("not json").is_err());
        let codex = |out: &str| judge(Harness::Codex, true, "exited 0", out);
        assert!(codex("{\"type\":\"thread.started\"}\n{\"type\":\"turn.completed\"}\n").is_ok());
        assert!(codex("{\"type\":\"turn.started\"}\n{\"type\":\"turn.failed\"}\n").is_err());
        assert!(judge(Harness::Codex, false, "exited 1", "").is_err());
    }
}
