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

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use serde_json::{Value, json};

use crate::delivery::{self, hook, hook::HookRun};
use crate::error::{Error, Result};
use crate::harness::Harness;
use crate::home::Home;
use crate::records::Wake;

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
    /// The session's project directory: both harnesses find a session only from where it ran
    /// (Claude Code keeps sessions per project; Codex asks about the directory's trust).
    pub dir: Option<PathBuf>,
}

/// Set in a resumed harness's environment: its own hooks (which inherit it) must not take the
/// wake that the resume is delivering, nor wait for another.
pub const RESUMING_ENV: &str = "WAITPOINT_RESUMING";

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
            // The session ran in its directory before, so the directory was the user's choice;
            // without the flag Codex refuses any directory that is not a trusted git checkout.
            Harness::Codex => vec![
                "exec".into(),
                "--json".into(),
                "--skip-git-repo-check".into(),
                "resume".into(),
                self.target.clone(),
                "-".into(),
            ],
            // The prompt is read from stdin when no message is given; the JSON events say how
            // the turn ended.
            Harness::OpenCode => vec![
                "run".into(),
                "--session".into(),
                self.target.clone(),
                "--format".into(),
                "json".into(),
            ],
        };
        if self.fork && self.harness == Harness::Claude {
            a.push("--fork-session".into());
        }
        a
    }
}

/// The prompt a resumed session is given: the wake's own text, which frames any external payload
/// as data, through the one rule (a wake an older version wrote may hold anything).
pub fn prompt(wake: &Wake) -> String {
    crate::escape::text(&wake.text)
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
        // `opencode run --format json` prints one JSON event a line; a failed turn is an
        // `error` event, and a run that printed no event at all never reached the model.
        Harness::OpenCode => {
            let mut events = 0;
            for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
                let Ok(ev) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                events += 1;
                if ev["type"] == "error" {
                    return Err(format!("opencode reported an error: {}", first_line(line)));
                }
            }
            if events == 0 {
                return Err(format!(
                    "opencode printed no JSON event: {}",
                    first_line(stdout)
                ));
            }
            Ok(())
        }
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(300).collect()
}

/// The line of a failed run's standard error that says why: the last one that reads like an
/// error message and is not a frame of a stack trace, else the last that is not a frame. A
/// harness that dies with a backtrace ends its stderr with frames (`9: <unknown>`), and the
/// cause ("thread ... already has an active writer") comes before them.
fn cause_line(stderr: &str) -> Option<&str> {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let is_frame = |l: &str| {
        let numbered = l
            .split_once(':')
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        numbered
            || l.starts_with("at ")
            || l.starts_with("stack backtrace")
            || l.starts_with("note: ")
            || l.starts_with("0x")
    };
    const WHY: [&str; 13] = [
        "error",
        "fail",
        "cannot",
        "can't",
        "unable",
        "refused",
        "denied",
        "already",
        "not found",
        "no such",
        "panicked",
        "invalid",
        "timed out",
    ];
    let says_why = |l: &str| {
        let low = l.to_lowercase();
        WHY.iter().any(|w| low.contains(w))
    };
    let mut candidates = lines.iter().rev().filter(|l| !is_frame(l));
    lines
        .iter()
        .rev()
        .find(|l| !is_frame(l) && says_why(l))
        .or_else(|| candidates.next())
        .or(lines.last())
        .copied()
}

/// Runs the harness with the wake as the prompt; on success marks the wake read. `Err` is the
/// reason, for the `onWake` runner's record; the wake stays unread.
pub fn resume(home: &Home, wake: &Wake, r: &Resume, timeout: Duration) -> Result<(), String> {
    let run = HookRun {
        argv: std::iter::once(r.program.clone()).chain(r.args()).collect(),
        stdin: prompt(wake).into_bytes(),
        env: vec![(RESUMING_ENV.to_owned(), wake.wake_id.clone())],
        cwd: r.dir.clone(),
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
        match cause_line(&err) {
            Some(line) => format!("{why} (stderr: {})", first_line(line)),
            None => why,
        }
    })?;
    delivery::mark_read(home, &wake.channel, &wake.wake_id)
        .map_err(|e| format!("resumed, but cannot mark the wake read: {e}"))?;
    Ok(())
}

/// Blocks until the session has a wake (or `timeout` passes, `waiter` is told to leave, or
/// `interrupt` is raised), then takes it and every other unread one, oldest first: one harness
/// turn for what piled up. Raised while taking, it stops taking: the caller hands over what it
/// holds, and the rest stays unread.
pub fn take_pending(
    home: &Home,
    waiter: &Waiter,
    timeout: Duration,
    interrupt: &crate::agent::Interrupt,
) -> Result<Vec<Wake>> {
    let deadline = Some(Instant::now() + timeout);
    let session = &waiter.session;
    let mut inbox = crate::agent::Inbox::open(home, session)?;
    inbox.watch_also(&home.sessions_dir().join(session))?;
    interrupt.wake(inbox.poker());
    if let Some(pid) = waiter.starter {
        let (poke, gone) = (inbox.poker(), waiter.starter_gone.clone());
        // Told by the kernel (a pidfd) when the harness exits: nothing polls while it lives.
        std::thread::spawn(move || {
            let _ = crate::process::wait_for_exit(pid, true, Duration::from_secs(5));
            gone.store(true, Ordering::Relaxed);
            let _ = poke.send(());
        });
    }
    let stop = || interrupt.raised().is_some() || waiter.should_leave();
    let Some(first) = inbox.take(deadline, Duration::from_secs(60), &stop)? else {
        return Ok(Vec::new());
    };
    let mut wakes = vec![first];
    while interrupt.raised().is_none()
        && let Some(w) = delivery::take_next(home, session)?
    {
        wakes.push(w);
    }
    Ok(wakes)
}

/// Blocks until the session has unread wakes (or `waiter` is told to leave, or `interrupt` is
/// raised) and returns them, oldest first, still unread: for a waiter that hands them to its
/// harness by other means and marks them read ([`mark_handed`]) only once the harness took
/// them. A waiter that dies in between leaves them unread, and its lock released, so the next
/// waiter or a resume delivers them. Idle, it waits on the kernel (inotify, a pidfd): nothing
/// polls.
pub fn unread_pending(
    home: &Home,
    waiter: &Waiter,
    interrupt: &crate::agent::Interrupt,
) -> Result<Vec<Wake>> {
    let session = &waiter.session;
    let mut inbox = crate::agent::Inbox::open(home, session)?;
    inbox.watch_also(&home.sessions_dir().join(session))?;
    interrupt.wake(inbox.poker());
    // Called once per idle turn: one watch of the harness serves them all, and pokes the
    // inbox of the call waiting when the harness exits.
    *waiter
        .harness_poke
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(inbox.poker());
    if let Some(pid) = waiter.starter
        && !waiter.watching.swap(true, Ordering::Relaxed)
    {
        let (poke, gone) = (waiter.harness_poke.clone(), waiter.starter_gone.clone());
        std::thread::spawn(move || {
            let _ = crate::process::wait_for_exit(pid, true, Duration::from_secs(5));
            gone.store(true, Ordering::Relaxed);
            let poke = poke
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(p) = poke.as_ref() {
                let _ = p.send(());
            }
        });
    }
    let stop = || interrupt.raised().is_some() || waiter.should_leave();
    inbox.wait_unread(Duration::from_secs(60), &stop)
}

/// Marks wakes read that [`unread_pending`] returned and the harness took. One already read (a
/// `wait_next` of the model's took it meanwhile) is left as it is.
pub fn mark_handed(home: &Home, wakes: &[Wake]) -> Result<()> {
    for w in wakes {
        delivery::mark_read(home, &w.channel, &w.wake_id)?;
    }
    Ok(())
}

/// A session's live waiter: the hook process that hands the session's wakes to its running
/// harness. There is one per session: a new one replaces the old (`waiter.json` names the
/// newest, and an older one leaves when it sees another name there). It leaves too when the
/// harness that started it exits, or when the session ends (the file removed).
///
/// While it lives it holds `waiter.lock` shared: the kernel releases that when the process
/// dies however it dies, so a resume of a closed session can tell a live one from a gone one
/// without trusting a pid ([`resume_or_yield`]).
pub struct Waiter {
    home: Home,
    session: String,
    token: String,
    record: PathBuf,
    starter: Option<libc::pid_t>,
    starter_gone: Arc<AtomicBool>,
    /// [`unread_pending`]'s one watch of the harness: whether it runs, and whom it pokes.
    watching: AtomicBool,
    harness_poke: Arc<std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>>,
    _presence: File,
}

#[derive(Serialize, Deserialize)]
struct WaiterRecord {
    pid: u32,
    token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    harness_pid: Option<libc::pid_t>,
}

fn waiter_record(home: &Home, session: &str) -> PathBuf {
    home.sessions_dir().join(session).join("waiter.json")
}

fn presence_lock(home: &Home, session: &str) -> Result<File> {
    let dir = home.sessions_dir().join(session);
    crate::durable::create_dir_private(&dir)?;
    let path = dir.join("waiter.lock");
    crate::durable::open_or_create(&path).map_err(|e| Error::io("cannot open lock", &path, e))
}

impl Waiter {
    /// Becomes `session`'s one waiter, started by process `starter` (the harness; `None` when
    /// not known). Blocks while a resume of this session is running, which holds the lock
    /// exclusively; the wake it delivers is read by the time this returns.
    pub fn start(home: &Home, session: &str, starter: Option<libc::pid_t>) -> Result<Waiter> {
        crate::request::check_name("session", session)?;
        let presence = presence_lock(home, session)?;
        let lock = home.sessions_dir().join(session).join("waiter.lock");
        presence
            .lock_shared()
            .map_err(|e| Error::io("cannot lock", &lock, e))?;
        let token = crate::secret::random_hex(8);
        let record = waiter_record(home, session);
        crate::durable::commit_json(
            &record,
            &WaiterRecord {
                pid: std::process::id(),
                token: token.clone(),
                harness_pid: starter,
            },
        )?;
        Ok(Waiter {
            home: home.clone(),
            session: session.to_owned(),
            token,
            record,
            starter,
            starter_gone: Arc::new(AtomicBool::new(false)),
            watching: AtomicBool::new(false),
            harness_poke: Default::default(),
            _presence: presence,
        })
    }

    /// The session this waiter serves.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Whether this waiter should stop waiting: its harness exited, or `waiter.json` no longer
    /// names it (a newer waiter replaced it, or the session ended).
    pub fn should_leave(&self) -> bool {
        if self.starter_gone.load(Ordering::Relaxed) {
            return true;
        }
        // Reached beneath the home without following a link; one that is not a record (a link,
        // huge, not JSON) is set aside, and this waiter leaves as for a removed one.
        let found = crate::durable::read_json_or_set_aside::<WaiterRecord>(
            &self.home.quarantine_dir(),
            self.home.root(),
            &self.record,
        );
        match found {
            Ok(Some(r)) => r.token != self.token,
            Ok(None) => true,
            // The record cannot be read now (an I/O error): nothing says who replaced whom.
            Err(_) => false,
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // Leave no record naming a waiter that is gone; a newer one's record stays.
        if !self.should_leave() {
            let _ = crate::durable::unlink(&self.record);
        }
    }
}

/// Ends `session`'s waiter (the harness's session ended): its record is removed, and the
/// waiter, which watches for that, leaves. True when there was one.
pub fn end_waiter(home: &Home, session: &str) -> Result<bool> {
    crate::request::check_name("session", session)?;
    let record = waiter_record(home, session);
    match crate::durable::unlink(&record) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("cannot remove", &record, e)),
    }
}

/// How a resume adapter's turn with a wake ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handed {
    /// The harness session was resumed with it, and it is marked read.
    Resumed,
    /// A live waiter of the session took it (the session is open; it got the wake there).
    TakenLive,
    /// It was read already when we looked.
    AlreadyRead,
}

/// Delivers `wake` to a closed session by resuming it, unless the session is live: then its
/// waiter delivers it, and this waits (up to `timeout`) until it has. Exactly one of the two
/// delivers: the resume holds the session's presence lock exclusively, so a waiter starting
/// meanwhile waits for it, and a waiter that dies without taking the wake releases the lock,
/// after which the resume goes ahead.
pub fn resume_or_yield(
    home: &Home,
    wake: &Wake,
    r: &Resume,
    timeout: Duration,
) -> std::result::Result<Handed, String> {
    let deadline = Instant::now() + timeout;
    let (channel, id) = (&wake.channel, &wake.wake_id);
    let presence = presence_lock(home, channel).map_err(|e| e.to_string())?;
    let (_watcher, changes) =
        crate::agent::wake_on_change(&home.inbox_new(channel)).map_err(|e| e.to_string())?;
    if !delivery::is_unread(home, channel, id) {
        return Ok(Handed::AlreadyRead);
    }
    loop {
        match presence.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => return Err(format!("cannot lock: {e}")),
        }
        // A live waiter holds the session: it takes the wake. The lock's release (its harness
        // exited first) sends no event, hence the second's look again.
        if !crate::agent::wait_for_change(&changes, Some(deadline), Duration::from_secs(1)) {
            return Err(format!(
                "session {channel} has a live waiter, which did not take the wake within {} s",
                timeout.as_secs()
            ));
        }
        if !delivery::is_unread(home, channel, id) {
            return Ok(Handed::TakenLive);
        }
    }
    if !delivery::is_unread(home, channel, id) {
        return Ok(Handed::AlreadyRead);
    }
    resume(
        home,
        wake,
        r,
        deadline.saturating_duration_since(Instant::now()),
    )?;
    Ok(Handed::Resumed)
}

/// The text a hook hands to the harness for these wakes.
pub fn hook_text(wakes: &[Wake]) -> String {
    let parts: Vec<String> = wakes
        .iter()
        .map(|w| prompt(w).trim_end().to_owned())
        .collect();
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
    fn a_failed_resume_is_logged_with_the_line_that_says_why_not_the_last_frame() {
        let codex = "Error: thread 019a already has an active writer\n\nStack backtrace:\n   \
0: std::backtrace::Backtrace::capture\n   8: main\n   9: <unknown>\n";
        assert_eq!(
            cause_line(codex),
            Some("Error: thread 019a already has an active writer")
        );
        let node = "file:///x/cli.js:12\n    throw e;\nTypeError: cannot read x\n    at f (cli.js:1:2)\n    at g (cli.js:3:4)\n";
        assert_eq!(cause_line(node), Some("TypeError: cannot read x"));
        assert_eq!(cause_line("just one line\n"), Some("just one line"));
        assert_eq!(cause_line("  \n"), None);
    }

    #[test]
    fn claude_resumes_with_json_output_and_codex_reads_the_prompt_from_stdin() {
        let r = Resume {
            harness: Harness::Claude,
            program: "claude".into(),
            target: "abc".into(),
            fork: true,
            dir: None,
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
            dir: None,
        };
        assert_eq!(
            c.args(),
            [
                "exec",
                "--json",
                "--skip-git-repo-check",
                "resume",
                "t1",
                "-"
            ]
        );
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
        let opencode = |out: &str| judge(Harness::OpenCode, true, "exited 0", out);
        assert!(opencode("{\"type\":\"step_start\"}\n{\"type\":\"text\"}\n").is_ok());
        assert!(opencode("{\"type\":\"error\",\"error\":{\"name\":\"APIError\"}}\n").is_err());
        assert!(opencode("").is_err());
    }

    #[test]
    fn opencode_resumes_its_session_with_json_events_and_the_prompt_on_stdin() {
        let r = Resume {
            harness: Harness::OpenCode,
            program: "opencode".into(),
            target: "ses_1".into(),
            fork: true,
            dir: None,
        };
        assert_eq!(r.args(), ["run", "--session", "ses_1", "--format", "json"]);
    }
}
