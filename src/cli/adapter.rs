//! `waitpoint adapter …`: the wake adapters as one-line commands for harness configuration
//! (hooks and `onWake`). Clap types and stdio end here; `crate::adapter` does the work.

use std::io::{Read, Write};
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::adapter::{self, Harness, Resume};
use crate::engine::Engine;
use crate::error::{Error, exit};
use crate::model::Wake;

use super::SessionArg;

/// The exit status Claude Code's `asyncRewake` hooks wake the session on.
pub const CLAUDE_REWAKE: u8 = 2;

#[derive(Debug, Subcommand)]
pub enum AdapterCommand {
    /// Claude Code `asyncRewake` hook: wait for the session's next wake and wake Claude with it
    ///
    /// Blocks until the session has an unread wake (or --timeout passes), takes it and any
    /// others waiting, writes their text to stderr and exits 2, which wakes an idle Claude Code
    /// session with that text. Exits 0 with no output when the timeout passes first. Claude
    /// passes the hook's JSON on stdin; it is read and ignored. Configure it as a SessionStart
    /// and Stop command hook with "asyncRewake": true and a "timeout" a little longer than
    /// --timeout.
    ClaudeHook(HookArgs),
    /// Codex CLI `Stop` hook: wait for the session's next wake and continue the turn with it
    ///
    /// Blocks until the session has an unread wake (or --timeout passes), takes it and any
    /// others waiting, and prints {"decision":"block","reason":TEXT}, which makes Codex continue
    /// with TEXT as the next prompt. Prints nothing when the timeout passes first. Exits 0 either
    /// way. Codex passes the hook's JSON on stdin; it is read and ignored.
    CodexStopHook(HookArgs),
    /// `onWake` command: resume a Claude Code session with the wake as its prompt
    ///
    /// Reads the wake JSON the daemon gives an onWake command on stdin and runs
    /// `claude -p --resume ID --output-format json` with the wake's text on stdin. Exit 0 (and the
    /// wake marked read) when claude succeeds and its result is not an error; exit 1 otherwise,
    /// leaving the wake unread for the daemon to retry.
    ClaudeResume(ResumeArgs),
    /// `onWake` command: resume a Codex CLI session with the wake as its prompt
    ///
    /// Reads the wake JSON the daemon gives an onWake command on stdin and runs
    /// `codex exec --json resume ID -` with the wake's text on stdin. Exit 0 (and the wake marked
    /// read) when codex succeeds and reports no failed turn; exit 1 otherwise, leaving the wake
    /// unread for the daemon to retry.
    CodexResume(ResumeArgs),
}

#[derive(Debug, Args)]
pub struct HookArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Give up after this many seconds with nothing to hand over
    #[arg(long, value_name = "SECS", default_value_t = 3300)]
    pub timeout: u64,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The harness session to resume (Claude's session id, Codex's thread id) [default: the
    /// waitpoint session's name]
    #[arg(long, value_name = "ID")]
    pub resume: Option<String>,
    /// Only handle wakes of this waitpoint session; others are left unread for their own adapter
    #[arg(long, value_name = "S")]
    pub session: Option<String>,
    /// Claude only: resume into a new session id (for a session that may be open elsewhere)
    #[arg(long)]
    pub fork_session: bool,
    /// The harness program [default: claude or codex, found on PATH]
    #[arg(long, value_name = "PATH")]
    pub program: Option<String>,
}

pub fn run(engine: &Engine, cmd: AdapterCommand) -> anyhow::Result<u8> {
    match cmd {
        AdapterCommand::ClaudeHook(a) => hook(engine, a, Harness::Claude),
        AdapterCommand::CodexStopHook(a) => hook(engine, a, Harness::Codex),
        AdapterCommand::ClaudeResume(a) => resume(engine, a, Harness::Claude),
        AdapterCommand::CodexResume(a) => resume(engine, a, Harness::Codex),
    }
}

fn hook(engine: &Engine, a: HookArgs, harness: Harness) -> anyhow::Result<u8> {
    // The harness's hook JSON: read it so the harness never blocks writing it.
    let mut ignored = Vec::new();
    let _ = std::io::stdin().take(1 << 20).read_to_end(&mut ignored);
    let home = engine.home();
    let wakes = adapter::take_pending(home, &a.session.session, Duration::from_secs(a.timeout))?;
    if wakes.is_empty() {
        return Ok(exit::OK);
    }
    let handed = match harness {
        Harness::Claude => {
            let mut err = std::io::stderr().lock();
            err.write_all(adapter::hook_text(&wakes).as_bytes())
                .and_then(|()| err.flush())
        }
        Harness::Codex => {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", adapter::codex_stop_reply(&wakes)).and_then(|()| out.flush())
        }
    };
    if let Err(e) = handed {
        adapter::give_back(home, &wakes);
        return Err(anyhow::Error::from(e).context("cannot hand the wakes to the harness"));
    }
    Ok(match harness {
        Harness::Claude => CLAUDE_REWAKE,
        Harness::Codex => exit::OK,
    })
}

fn resume(engine: &Engine, a: ResumeArgs, harness: Harness) -> anyhow::Result<u8> {
    let mut input = Vec::new();
    std::io::stdin().take(1 << 20).read_to_end(&mut input)?;
    let wake: Wake = serde_json::from_slice(&input).map_err(|e| {
        Error::Usage(format!(
            "stdin must be a wake's JSON, as the daemon gives an onWake command: {e}"
        ))
    })?;
    if a.session.as_deref().is_some_and(|s| s != wake.channel) {
        // Another session's wake: not ours to hand over, so it stays unread.
        return Ok(exit::OK);
    }
    let r = Resume {
        harness,
        program: a.program.unwrap_or_else(|| harness.program().to_owned()),
        target: a.resume.unwrap_or_else(|| wake.session.clone()),
        fork: a.fork_session,
    };
    // Inside the daemon's own limit for an onWake run, so the harness is never orphaned.
    let limit = Duration::from_millis(engine.settings().on_wake_timeout_ms)
        .saturating_sub(Duration::from_secs(1))
        .max(Duration::from_secs(1));
    match adapter::resume(engine.home(), &wake, &r, limit) {
        Ok(()) => Ok(exit::OK),
        Err(reason) => {
            eprintln!("waitpoint adapter: {reason}; the wake stays unread");
            Ok(exit::FAILURE)
        }
    }
}
