//! `waitpoint adapter …`: the wake adapters as one-line commands for harness configuration
//! (hooks and `onWake`). Clap types and stdio end here; `crate::harness::wake` does the work.

use std::io::{Read, Write};
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::Value;

use crate::engine::Engine;
use crate::error::{Error, exit};
use crate::harness::wake::{self, Resume};
use crate::harness::{self, Harness};
use crate::records::Wake;

use super::env_var;

/// The exit status Claude Code's `asyncRewake` hooks wake the session on.
pub const CLAUDE_REWAKE: u8 = 2;

// The doc comments here are the commands' help text, read in a terminal and in the man pages:
// `<ID>` and `[ids]` there are what they say, not HTML or links.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Debug, Subcommand)]
pub enum AdapterCommand {
    /// Claude Code `asyncRewake` hook: wait for the session's next wake and wake Claude with it
    ///
    /// Blocks until the session has an unread wake (or --timeout passes), takes it and any
    /// others waiting, writes their text to stderr and exits 2, which wakes an idle Claude Code
    /// session with that text. Exits 0 with no output when the timeout passes first, when a
    /// newer waiter replaces it (one per session), when Claude Code exits, or on a stop signal
    /// with nothing in hand. The session is Claude's own (the hook's stdin `session_id`) unless
    /// --session or $CORTEX_SESSION names one. On SessionEnd it ends the session's waiter; under
    /// `claude -p` (CLAUDE_CODE_ENTRYPOINT=sdk-cli) and inside a resume it returns at once.
    /// Its own errors (a settings file it cannot use, say) exit 1, never 2, which would wake
    /// the session with the error's text.
    /// Configure it as a SessionStart and Stop command hook with "asyncRewake": true and a
    /// "timeout" a little longer than --timeout, and as a SessionEnd hook (`waitpoint setup
    /// claude-code` does).
    ClaudeHook(HookArgs),
    /// Codex CLI `Stop` hook: wait for the session's next wake and continue the turn with it
    ///
    /// Blocks until the session has an unread wake (or --timeout passes), takes it and any
    /// others waiting, and prints {"decision":"block","reason":TEXT}, which makes Codex continue
    /// with TEXT as the next prompt. Prints nothing when the timeout passes first. Exits 0 either
    /// way. The session is the Codex thread's (the hook's stdin `session_id`) unless --session
    /// or $CORTEX_SESSION names one. In a `codex exec` run it hands over what is there and does
    /// not wait.
    CodexStopHook(HookArgs),
    /// `onWake` command: resume a Claude Code session with the wake as its prompt
    ///
    /// Reads the wake JSON the daemon gives an onWake command on stdin and runs
    /// `claude -p --resume ID --output-format json` with the wake's text on stdin. Exit 0 (and the
    /// wake marked read) when claude succeeds and its result is not an error; exit 1 otherwise,
    /// leaving the wake unread for the daemon to retry.
    ClaudeResume(ResumeArgs),
    /// `onWake` command: resume whichever harness session the wake's session lives in
    ///
    /// Reads the wake JSON the daemon gives an onWake command on stdin, looks up the harness
    /// session its waitpoint session was last seen in (recorded by `waitpoint mcp` and the
    /// hooks: the harness, its session id, the project directory), and resumes it there with
    /// the wake's text as the prompt, as claude-resume or codex-resume would. A session open in
    /// its harness is not resumed: its live hook delivers the wake, and this waits until it
    /// has. Exit 0 when the wake was delivered (or the session was never seen in a harness, and
    /// the wake stays unread for `wait_next`); exit 1 otherwise, for the daemon to retry.
    Resume(AnyResumeArgs),
    /// Claude Code status line: print the capsule of the session it is drawn for
    ///
    /// Reads the status line's JSON on stdin (its `session_id`) and prints one line: the
    /// waitpoint's label, "N/M received" and when it expires, or "N waiting items · <first
    /// label>", with a dot when something needs attention; nothing when the session waits on
    /// nothing. Configure it as "statusLine": {"type": "command", "command": "waitpoint adapter
    /// claude-statusline"} (`waitpoint setup claude-code` does). It runs on every redraw, so
    /// it reads and never writes.
    ClaudeStatusline(StatuslineArgs),
    /// `onWake` command: resume a Codex CLI session with the wake as its prompt
    ///
    /// Reads the wake JSON the daemon gives an onWake command on stdin and runs
    /// `codex exec --json resume ID -` with the wake's text on stdin. Exit 0 (and the wake marked
    /// read) when codex succeeds and reports no failed turn; exit 1 otherwise, leaving the wake
    /// unread for the daemon to retry.
    CodexResume(ResumeArgs),
    /// Gemini CLI hook (SessionStart, AfterAgent, SessionEnd): name the session, and wait for
    /// its next wake at a turn's end
    ///
    /// On SessionStart (a start, `/clear`, a resume) it records which session the Gemini
    /// process is in, so `waitpoint mcp`, which Gemini names no session, acts for it. On
    /// AfterAgent it blocks until the session has an unread wake (or --timeout passes), takes
    /// it and any others waiting, and prints {"decision":"block","reason":TEXT}, which makes
    /// Gemini continue with TEXT as the next prompt; nothing when the timeout passes first. In a
    /// headless run (`gemini -p`, a prompt on stdin, a resume) it returns at once. On
    /// SessionEnd it ends the session's waiter. Exits 0 always. The session is Gemini's own
    /// (gemini-<session_id>) unless --session or $CORTEX_SESSION names one. `waitpoint setup
    /// gemini` configures it.
    GeminiHook(HookArgs),
    /// `onWake` command: resume a Gemini CLI session with the wake as its prompt
    ///
    /// Reads the wake JSON the daemon gives an onWake command on stdin and runs
    /// `gemini --resume ID --output-format json` in the session's project with the wake's text
    /// on stdin. Exit 0 (and the wake marked read) when gemini succeeds and reports no error;
    /// exit 1 otherwise (the session still open in a Gemini process, its folder not trusted),
    /// leaving the wake unread for the daemon to retry.
    GeminiResume(ResumeArgs),
    /// OpenCode plugin's waiter: hand an open OpenCode session its wakes, marked read on ack
    ///
    /// Started by the waitpoint plugin (`waitpoint setup opencode`) as a child of OpenCode, one
    /// per open session. It becomes the session's one waiter (opencode-<ID>) and speaks lines:
    /// on stdin "wait" asks for the next wakes (the session is idle); it answers with one JSON
    /// line {"wakes":[ids],"text":TEXT} once the session has unread wakes, and reads "ack" (the
    /// plugin handed TEXT to OpenCode: the wakes are marked read) or "nack" (they stay unread).
    /// It exits when its stdin closes (the plugin's process is gone), when OpenCode exits, when
    /// a newer waiter replaces it, or on a stop signal; wakes not acked stay unread. Inside a
    /// resume it exits at once.
    OpencodeWaiter(OpencodeWaiterArgs),
}

#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, Args)]
pub struct OpencodeWaiterArgs {
    /// OpenCode's session id (ses_…): the waitpoint session is opencode-<ID>
    #[arg(long, value_name = "ID")]
    pub session: String,
    /// The session's project directory (where a resume of it runs)
    #[arg(long, value_name = "DIR")]
    pub dir: Option<String>,
}

#[derive(Debug, Args)]
pub struct HookArgs {
    /// The session to hand wakes of [default: $CORTEX_SESSION, else the harness's own session
    /// (the hook's stdin `session_id`), else "default"]
    #[arg(long, value_name = "S", env = "CORTEX_SESSION", hide_env = true)]
    pub session: Option<String>,
    /// Give up after this many seconds with nothing to hand over
    #[arg(long, value_name = "SECS", default_value_t = 3300)]
    pub timeout: u64,
}

#[derive(Debug, Args)]
pub struct StatuslineArgs {
    /// The session to show [default: $CORTEX_SESSION, else the one Claude Code draws the line
    /// for]
    #[arg(long, value_name = "S", env = "CORTEX_SESSION", hide_env = true)]
    pub session: Option<String>,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The harness session to resume (Claude's session id, Codex's thread id) [default: the one
    /// recorded for the wake's session when it was last seen in this harness, else the waitpoint
    /// session's name]
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

#[derive(Debug, Args)]
pub struct AnyResumeArgs {
    /// Only handle wakes of this waitpoint session; others are left unread for their own adapter
    #[arg(long, value_name = "S")]
    pub session: Option<String>,
    /// Claude only: resume into a new session id (for a session that may be open elsewhere)
    #[arg(long)]
    pub fork_session: bool,
}

pub fn run(engine: &Engine, cmd: AdapterCommand) -> anyhow::Result<u8> {
    match cmd {
        AdapterCommand::ClaudeHook(a) => hook(engine, a, Harness::Claude),
        AdapterCommand::CodexStopHook(a) => hook(engine, a, Harness::Codex),
        AdapterCommand::Resume(a) => resume_any(engine, a),
        AdapterCommand::ClaudeStatusline(a) => statusline(engine, a),
        AdapterCommand::ClaudeResume(a) => resume(engine, a, Harness::Claude),
        AdapterCommand::CodexResume(a) => resume(engine, a, Harness::Codex),
        AdapterCommand::GeminiHook(a) => gemini_hook(engine, a),
        AdapterCommand::GeminiResume(a) => resume(engine, a, Harness::Gemini),
        AdapterCommand::OpencodeWaiter(a) => opencode_waiter(engine, a),
    }
}

/// Gemini CLI's hooks: the session's record on SessionStart and SessionEnd, the waiter on
/// AfterAgent.
fn gemini_hook(engine: &Engine, a: HookArgs) -> anyhow::Result<u8> {
    let input = harness_input();
    let home = engine.home();
    let caller = harness::gemini::from_hook_input(&input);
    let session = match (&a.session, &caller) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => c.session(),
        (None, None) => "default".to_owned(),
    };
    // The Gemini process, which runs the hook under a shell and is the MCP server's parent too.
    let gemini = crate::process::starter_pid();
    if let Some(c) = &caller {
        harness::remember(home, &session, c)?;
    }
    match input["hook_event_name"].as_str() {
        Some("SessionStart") => {
            if let (Some(pid), Some(c)) = (gemini, &caller) {
                harness::process_record::record_process(home, pid, c)?;
            }
            return Ok(exit::OK);
        }
        Some("SessionEnd") => {
            wake::end_waiter(home, &session)?;
            // On `/clear` Gemini runs SessionEnd and the next SessionStart at once: the record
            // is the next session's to overwrite, never this hook's to remove after it did.
            if input["reason"] != "clear"
                && let (Some(pid), Some(c)) = (gemini, &caller)
            {
                harness::process_record::forget_process(home, pid, &c.session())?;
            }
            return Ok(exit::OK);
        }
        _ => {}
    }
    // Nobody is idle in a headless run, and Gemini runs hooks in line: a wait would hold it.
    // A resume's own hooks must not take the wake the resume is delivering.
    if env_var(wake::RESUMING_ENV).is_some() || gemini.is_none_or(harness::gemini::is_headless) {
        return Ok(exit::OK);
    }
    // The TUI is held while this hook runs (typed prompts queue, slash commands are refused):
    // only while the agent waits on something.
    if !crate::agent_view::session_waits(engine, &session)? {
        return Ok(exit::OK);
    }
    let interrupt = super::interrupt_on_stop_signals()?;
    let mut waiter = wake::Waiter::start(home, &session, gemini.into_iter().collect())?;
    // Esc stops Gemini waiting for this hook without stopping it, and writes to the transcript.
    if let Some(path) = input["transcript_path"]
        .as_str()
        .map(std::path::PathBuf::from)
        && let Some(from) = harness::gemini::transcript_len(&path)
    {
        let watched = path.clone();
        waiter.leave_when(
            watched,
            Box::new(move || harness::gemini::transcript_moved_on(&path, from)),
        );
    }
    let wakes = wake::take_pending(home, &waiter, Duration::from_secs(a.timeout), &interrupt)?;
    if wakes.is_empty() {
        return Ok(exit::OK);
    }
    // Gemini may have stopped waiting while they were taken: they go back rather than to no one.
    if waiter.should_leave() {
        wake::give_back(home, &wakes);
        return Ok(exit::OK);
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{}", wake::codex_stop_reply(&wakes)).and_then(|()| out.flush()) {
        wake::give_back(home, &wakes);
        return Err(anyhow::Error::from(e).context("cannot hand the wakes to the harness"));
    }
    Ok(exit::OK)
}

fn hook(engine: &Engine, a: HookArgs, harness: Harness) -> anyhow::Result<u8> {
    let input = harness_input();
    // A resumed run's own hooks: the resume is delivering a wake already, and nobody is idle.
    // Claude Code without a terminal runs async hooks synchronously: a wait would hold it up.
    if env_var(wake::RESUMING_ENV).is_some()
        || (harness == Harness::Claude && harness::claude_print_mode(&env_var))
    {
        return Ok(exit::OK);
    }
    // `codex exec`: hand over what is there already, but never hold the run up waiting.
    let timeout = if harness == Harness::Codex && codex_exec_run(&input) {
        Duration::ZERO
    } else {
        Duration::from_secs(a.timeout)
    };
    let caller = harness::from_hook_input(harness, &input).or_else(|| match harness {
        Harness::Claude => harness::from_env(&env_var),
        Harness::Codex | Harness::Gemini | Harness::OpenCode => None,
    });
    let session = match (&a.session, &caller) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => c.session(),
        (None, None) => "default".to_owned(),
    };
    let home = engine.home();
    if let Some(c) = &caller {
        harness::remember(home, &session, c)?;
    }
    // Claude Code moves its process to a new session on `/clear` while its MCP server keeps the
    // old id in its environment: the process's record says which session it is in now, and
    // `waitpoint mcp` reads it on every call. A `/clear` ends one session and starts the next:
    // the end leaves the record to the start.
    if harness == Harness::Claude
        && let (Some(c), Some(pid)) = (&caller, crate::process::starter_pid())
    {
        match input["hook_event_name"].as_str() {
            Some("SessionStart") => harness::process_record::record_process(home, pid, c)?,
            Some("SessionEnd") if input["reason"] != "clear" => {
                harness::process_record::forget_process(home, pid, &c.session())?;
            }
            _ => {}
        }
    }
    if input["hook_event_name"] == "SessionEnd" {
        wake::end_waiter(home, &session)?;
        return Ok(exit::OK);
    }
    // Codex's TUI waits on its Stop hook (it shows "Running hook" and queues what the user
    // types): it is held only while the agent waits on something, and then as long as that
    // may take, not ten minutes.
    let timeout =
        if harness == Harness::Codex && !crate::agent_view::session_waits(engine, &session)? {
            Duration::ZERO
        } else {
            timeout
        };
    let Some(serves) = served_harness(harness, &input) else {
        // Nobody sees the thread: a wake handed over would continue it unseen. It waits for
        // the thread's resume instead.
        return Ok(exit::OK);
    };
    // A stop signal while wakes are in hand must not lose them: it is turned into a request
    // to stop, and what was taken is handed over first.
    let interrupt = super::interrupt_on_stop_signals()?;
    let waiter = wake::Waiter::start(home, &session, serves)?;
    let wakes = wake::take_pending(home, &waiter, timeout, &interrupt)?;
    if wakes.is_empty() {
        return Ok(exit::OK);
    }
    let handed = match harness {
        Harness::Claude => {
            let mut err = std::io::stderr().lock();
            err.write_all(wake::hook_text(&wakes).as_bytes())
                .and_then(|()| err.flush())
        }
        Harness::Codex | Harness::Gemini | Harness::OpenCode => {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", wake::codex_stop_reply(&wakes)).and_then(|()| out.flush())
        }
    };
    if let Err(e) = handed {
        wake::give_back(home, &wakes);
        return Err(anyhow::Error::from(e).context("cannot hand the wakes to the harness"));
    }
    Ok(match harness {
        Harness::Claude => CLAUDE_REWAKE,
        Harness::Codex | Harness::Gemini | Harness::OpenCode => exit::OK,
    })
}

/// The processes a hook's waiter serves: the harness that ran the hook, whose exit ends the
/// wait. Codex running its threads in its managed app-server (which outlives every terminal)
/// is served through the terminals that show the thread; `None` when there is none (the user
/// quit while the hook ran, or the thread is driven by another client).
fn served_harness(harness: Harness, input: &Value) -> Option<Vec<rustix::process::RawPid>> {
    let starter = crate::process::starter_pid();
    let managed = harness == Harness::Codex
        && starter.is_some_and(harness::codex_app_server::is_managed_app_server);
    if !managed {
        return Some(starter.into_iter().collect());
    }
    let thread = input["session_id"].as_str()?;
    let cwd = std::path::Path::new(input["cwd"].as_str()?);
    let codex_home = harness_home_of(Harness::Codex)?;
    let terminals = harness::codex_app_server::terminals(&codex_home, thread, cwd);
    (!terminals.is_empty()).then_some(terminals)
}

/// The harness's JSON on a command's stdin (hooks, the status line), read whole so the harness
/// never blocks writing it; `Null` when it is not JSON.
fn harness_input() -> Value {
    let mut raw = Vec::new();
    let _ = std::io::stdin().take(1 << 20).read_to_end(&mut raw);
    serde_json::from_slice(&raw).unwrap_or(Value::Null)
}

fn statusline(engine: &Engine, a: StatuslineArgs) -> anyhow::Result<u8> {
    let input = harness_input();
    let session = match a.session {
        Some(s) => s,
        None => match harness::from_hook_input(Harness::Claude, &input)
            .or_else(|| harness::from_env(&env_var))
        {
            Some(c) => c.session(),
            None => "default".to_owned(),
        },
    };
    let items = crate::agent_view::waiting_for(engine, &session)?;
    let rows = crate::agent_view::check_rows(engine, &items)?;
    print!("{}", crate::operator_view::check_brief(&rows));
    Ok(exit::OK)
}

/// Whether the Codex session a hook runs for is a `codex exec` run: the start of the transcript
/// its stdin names says (Codex's own file; at most 64 KiB of it is read).
fn codex_exec_run(input: &Value) -> bool {
    let Some(path) = input["transcript_path"].as_str() else {
        return false;
    };
    let mut head = Vec::new();
    match std::fs::File::open(path) {
        Ok(f) => {
            let _ = f.take(64 * 1024).read_to_end(&mut head);
            harness::codex_is_exec(&head)
        }
        Err(_) => false,
    }
}

/// The wake an `onWake` command is given on stdin.
fn wake_from_stdin() -> anyhow::Result<Wake> {
    let mut input = Vec::new();
    std::io::stdin().take(1 << 20).read_to_end(&mut input)?;
    Ok(serde_json::from_slice(&input).map_err(|e| {
        Error::Usage(format!(
            "stdin must be a wake's JSON, as the daemon gives an onWake command: {e}"
        ))
    })?)
}

fn resume_any(engine: &Engine, a: AnyResumeArgs) -> anyhow::Result<u8> {
    let wake = wake_from_stdin()?;
    if a.session.as_deref().is_some_and(|s| s != wake.channel) {
        return Ok(exit::OK);
    }
    let Some(caller) = harness::recall(engine.home(), &wake.channel)? else {
        // Not a harness's session (or never seen in one): the wake stays unread for whoever
        // reads this session (`wait_next`, `waitpoint next`).
        eprintln!(
            "waitpoint adapter: session {} was never seen in a harness; the wake stays unread",
            wake.channel
        );
        return Ok(exit::OK);
    };
    let r = Resume {
        harness: caller.harness,
        program: caller.harness.program().to_owned(),
        target: caller.session_id,
        fork: a.fork_session,
        dir: caller.project_dir,
        harness_home: harness_home_of(caller.harness),
    };
    hand_over(engine, &wake, &r)
}

fn resume(engine: &Engine, a: ResumeArgs, harness: Harness) -> anyhow::Result<u8> {
    let wake = wake_from_stdin()?;
    if a.session.as_deref().is_some_and(|s| s != wake.channel) {
        // Another session's wake: not ours to hand over, so it stays unread.
        return Ok(exit::OK);
    }
    let seen = harness::recall(engine.home(), &wake.channel)?.filter(|c| c.harness == harness);
    let target = match (a.resume, &seen) {
        (Some(id), _) => id,
        (None, Some(c)) => c.session_id.clone(),
        (None, None) => wake.session.clone(),
    };
    if target.starts_with('-') {
        return Err(
            Error::invalid("resume", format!("{target:?} would be read as an option")).into(),
        );
    }
    let r = Resume {
        harness,
        program: a.program.unwrap_or_else(|| harness.program().to_owned()),
        target,
        fork: a.fork_session,
        dir: seen.and_then(|c| c.project_dir),
        harness_home: harness_home_of(harness),
    };
    hand_over(engine, &wake, &r)
}

/// The harness's own directory (its transcripts, Codex's thread locks), as it finds it itself:
/// Claude Code under
/// `$CLAUDE_CONFIG_DIR` (else `~/.claude`), Codex under `$CODEX_HOME` (else `~/.codex`). The
/// daemon runs this adapter with the environment it was started with, the user's.
fn harness_home_of(harness: Harness) -> Option<std::path::PathBuf> {
    let (var, default) = match harness {
        Harness::Claude => ("CLAUDE_CONFIG_DIR", ".claude"),
        Harness::Codex => ("CODEX_HOME", ".codex"),
        // Nothing of Gemini's or OpenCode's own directory is read on a resume.
        Harness::Gemini | Harness::OpenCode => return None,
    };
    let dir = env_var(var)
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| env_var("HOME").map(|h| std::path::Path::new(&h).join(default)))?;
    dir.is_absolute().then_some(dir)
}

/// Resumes the harness with the wake unless a live waiter of the session takes it; exit 0 when
/// the wake was delivered either way, 1 (the wake unread, retried by the daemon) otherwise.
fn hand_over(engine: &Engine, wake: &Wake, r: &Resume) -> anyhow::Result<u8> {
    // Inside the daemon's own limit for an onWake run, so the harness is never orphaned.
    let limit = Duration::from_millis(engine.settings().on_wake_timeout_ms)
        .saturating_sub(Duration::from_secs(1))
        .max(Duration::from_secs(1));
    match wake::resume_or_yield(engine.home(), wake, r, limit) {
        Ok(wake::Handed::NoSuchSession) => {
            eprintln!(
                "waitpoint adapter: {} has no conversation {} to resume (it never had a turn); \
                 the wake stays unread for the session's next reader, and is not retried",
                r.harness.program(),
                r.target
            );
            Ok(exit::OK)
        }
        Ok(handed) => {
            tracing::info!(wake = %wake.wake_id, ?handed, "wake handed over");
            Ok(exit::OK)
        }
        Err(reason) => {
            eprintln!("waitpoint adapter: {reason}; the wake stays unread");
            Ok(exit::FAILURE)
        }
    }
}

/// What the OpenCode plugin says to its waiter, a line at a time.
#[derive(Debug, PartialEq, Eq)]
enum PluginSays {
    /// The session is idle: hand over the next wakes.
    Wait,
    /// The wakes last handed over reached OpenCode.
    Ack,
    /// They did not (or anything else it said): they stay unread.
    Nack,
    /// Its stdin closed: the plugin's process (OpenCode) is gone.
    Gone,
}

fn plugin_says(line: Option<&str>) -> PluginSays {
    match line.map(str::trim) {
        None => PluginSays::Gone,
        Some("wait") => PluginSays::Wait,
        Some("ack") => PluginSays::Ack,
        Some(_) => PluginSays::Nack,
    }
}

fn opencode_waiter(engine: &Engine, a: OpencodeWaiterArgs) -> anyhow::Result<u8> {
    // A resumed run delivers its wake itself; its plugin must not hand over another.
    if env_var(wake::RESUMING_ENV).is_some() {
        return Ok(exit::OK);
    }
    let caller = harness::from_opencode_arg(&a.session, a.dir.as_deref()).ok_or_else(|| {
        Error::invalid(
            "session",
            format!("{:?} is not an OpenCode session id", a.session),
        )
    })?;
    let home = engine.home();
    let session = caller.session();
    harness::remember(home, &session, &caller)?;
    let interrupt = super::interrupt_on_stop_signals()?;
    // The plugin's lines arrive on a thread, so a wait for wakes also ends when stdin closes.
    let (lines, said) = std::sync::mpsc::channel();
    let raised = interrupt.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if lines.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = lines.send(None);
        raised.raise(rustix::process::Signal::PIPE.as_raw());
    });
    let next = || plugin_says(said.recv().ok().flatten().as_deref());
    let plugin_host = crate::process::starter_pid().into_iter().collect();
    let waiter = wake::Waiter::start(home, &session, plugin_host)?;
    loop {
        match next() {
            PluginSays::Wait => {}
            PluginSays::Gone => return Ok(exit::OK),
            // An answer with nothing handed over: ignored.
            PluginSays::Ack | PluginSays::Nack => continue,
        }
        let wakes = wake::unread_pending(home, &waiter, &interrupt)?;
        if wakes.is_empty() {
            return Ok(exit::OK);
        }
        let ids: Vec<&str> = wakes.iter().map(|w| w.wake_id.as_str()).collect();
        let line = serde_json::json!({"wakes": ids, "text": wake::hook_text(&wakes)});
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").and_then(|()| out.flush())?;
        drop(out);
        match next() {
            PluginSays::Ack => wake::mark_handed(home, &wakes)?,
            PluginSays::Gone => return Ok(exit::OK),
            PluginSays::Wait | PluginSays::Nack => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_marks_wakes_read_only_with_an_ack() {
        assert_eq!(plugin_says(Some("ack\n")), PluginSays::Ack);
        assert_eq!(plugin_says(Some("wait")), PluginSays::Wait);
        assert_eq!(plugin_says(Some("nack")), PluginSays::Nack);
        assert_eq!(plugin_says(Some("acknowledged")), PluginSays::Nack);
        assert_eq!(plugin_says(None), PluginSays::Gone);
    }
}
