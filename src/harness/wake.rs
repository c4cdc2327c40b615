//! Wake adapters: turning a wake in a session's inbox into a turn of a real agent harness.
//!
//! The inbox stays the source of truth. An adapter takes a wake to the harness in one of the
//! ways the harness documents, and only a success marks the wake read; a failure leaves it
//! unread (the `onWake` runner retries it, with the "delivery retrying" badge meanwhile).
//!
//! - Hooks that block on the session's next wake and hand its text to a live session: Claude
//!   Code's `asyncRewake` command hook (exit 2, the text on stderr, wakes an idle session) and
//!   Codex's `Stop` hook (a `{"decision":"block","reason":…}` reply continues the turn), and
//!   Gemini CLI's `AfterAgent` hook (the same reply).
//! - Resuming a closed session non-interactively with the wake text as the prompt, as an
//!   `onWake` command: `claude -p --resume ID`, `codex exec resume ID -` and
//!   `gemini --resume ID -o json`.
//!
//! This module builds the harness's command line and judges its answer; running it is the only
//! I/O besides the inbox.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// The harness's own directory (Claude Code's config directory, Codex's home): its
    /// transcripts, searched before a resume of a wake is started again
    /// ([`super::transcript`]), and Codex's thread locks; `None` when not known.
    pub harness_home: Option<PathBuf>,
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
            // Without a terminal Gemini reads the prompt from stdin and answers headless.
            // Folder trust is left as the user set it: a folder never trusted would load its
            // own `.gemini/` (hooks, MCP servers) if this run trusted it; it exits 55 instead,
            // which the judgement names.
            Harness::Gemini => vec![
                "--resume".into(),
                self.target.clone(),
                "--output-format".into(),
                "json".into(),
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

/// The prompt a resumed session is given: a first line naming the wake, then the wake's own
/// text, which frames any external payload as data, through the one rule (a wake an older
/// version wrote may hold anything). The harness keeps the prompt in its transcript, so the
/// transcript tells a later attempt that this wake's turn began ([`super::transcript`]). The
/// line comes first because the frame runs to the text's end: a line after it would read as the
/// sender's.
pub fn prompt(wake: &Wake) -> String {
    format!(
        "(waitpoint wake {})\n\n{}",
        wake.wake_id,
        crate::escape::text(&wake.text)
    )
}

/// Whether a harness run succeeded, from its exit status and standard output. Claude Code prints
/// one JSON result (`is_error` says whether the turn failed); Codex prints JSON events, where a
/// `turn.failed` or `error` event is a failure even under exit status 0.
pub fn judge(harness: Harness, success: bool, exit: &str, stdout: &str) -> Result<(), String> {
    if !success {
        if harness == Harness::Gemini
            && let Some(why) = gemini_exit(exit)
        {
            return Err(format!("gemini {exit}: {why}"));
        }
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
        // `-o json` prints one object: `session_id`, `response`, `stats`, and `error` when the
        // turn failed.
        Harness::Gemini => {
            let v: Value = serde_json::from_str(stdout.trim()).map_err(|e| {
                format!(
                    "gemini printed no JSON result ({e}): {}",
                    first_line(stdout)
                )
            })?;
            if !v["error"].is_null() {
                let message = v["error"]["message"]
                    .as_str()
                    .map_or_else(|| v["error"].to_string(), str::to_owned);
                return Err(format!(
                    "gemini reported an error: {}",
                    first_line(&message)
                ));
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

/// What Gemini CLI 0.61's own exit statuses mean for a resume.
fn gemini_exit(exit: &str) -> Option<&'static str> {
    match exit {
        "exited 55" => Some(
            "the project folder is not trusted (trust it in Gemini, or list it in \
             ~/.gemini/trustedFolders.json)",
        ),
        "exited 42" => Some("no session with this id in the project (removed, or another folder)"),
        _ => None,
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

/// How a resume refused for good says so: the harness has no such session (one that never had
/// a turn has no transcript to resume), and no retry can change that.
pub const NO_SUCH_SESSION: &str = "the harness has no conversation to resume for session";

/// Whether a failed run says the harness has no such session: Claude Code prints "No
/// conversation found with session ID: …" for a session that never had a turn; Gemini CLI
/// exits 42 for an id it does not know in the project; OpenCode says "Session not found".
fn no_such_session(harness: Harness, code: Option<i32>, stdout: &str, stderr: &str) -> bool {
    match harness {
        Harness::Claude => [stdout, stderr]
            .iter()
            .any(|t| t.contains("No conversation found")),
        Harness::Gemini => code == Some(42),
        // `opencode run --session` of an unknown id: exit 1, "Session not found".
        Harness::OpenCode => [stdout, stderr]
            .iter()
            .any(|t| t.contains("Session not found")),
        Harness::Codex => false,
    }
}

/// Runs the harness with the wake as the prompt; on success marks the wake read. `Err` is the
/// reason, for the `onWake` runner's record; the wake stays unread.
pub fn resume(home: &Home, wake: &Wake, r: &Resume, timeout: Duration) -> Result<(), String> {
    // A Gemini session open between two turns has no waiter (its AfterAgent hook waits only so
    // long), yet a second process resuming it would write the same conversation from two
    // places: the wake waits for the session's next turn, or for it to close.
    if r.harness == Harness::Gemini
        && let Some(pid) = crate::harness::process_record::open_in(home, &wake.channel)
    {
        return Err(format!(
            "session {} is open in gemini (pid {pid}) with no waiter; its next turn's end takes \
             the wake, or a resume once it closes",
            wake.channel
        ));
    }
    let run = HookRun {
        argv: std::iter::once(r.program.clone()).chain(r.args()).collect(),
        stdin: prompt(wake).into_bytes(),
        env: vec![(RESUMING_ENV.to_owned(), wake.wake_id.clone())],
        cwd: r.dir.clone(),
        timeout,
        stop_on_signals: true,
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
    let err = String::from_utf8_lossy(&done.stderr);
    if !status.success() && no_such_session(r.harness, status.code(), &out, &err) {
        return Err(format!("{NO_SUCH_SESSION} {}", r.target));
    }
    judge(r.harness, status.success(), &exit, &out).map_err(|why| match cause_line(&err) {
        Some(line) => format!("{why} (stderr: {})", first_line(line)),
        None => why,
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
    interrupt: &crate::inbox::Interrupt,
) -> Result<Vec<Wake>> {
    let deadline = Some(Instant::now() + timeout);
    let session = &waiter.session;
    let mut inbox = crate::inbox::Inbox::open(home, session)?;
    inbox.watch_also(&home.sessions_dir().join(session))?;
    if let Some((file, _)) = &waiter.abandoned {
        // Not watchable (gone, another kind of file): the test is still asked every minute.
        let _ = inbox.watch_also(file);
    }
    interrupt.wake(inbox.poker());
    waiter.watch_harness(inbox.poker());
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
    interrupt: &crate::inbox::Interrupt,
) -> Result<Vec<Wake>> {
    let session = &waiter.session;
    let mut inbox = crate::inbox::Inbox::open(home, session)?;
    inbox.watch_also(&home.sessions_dir().join(session))?;
    interrupt.wake(inbox.poker());
    waiter.watch_harness(inbox.poker());
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
    /// The harness's processes: the waiter serves them, and leaves once every one has exited.
    harness: Vec<rustix::process::RawPid>,
    harness_gone: Arc<AtomicBool>,
    /// A file whose change may mean the harness gave up on this waiter, and the test of it.
    abandoned: Option<(PathBuf, Abandoned)>,
    /// The one watch of the harness's processes: whether it runs, and whom it pokes (the inbox
    /// of the call waiting now: [`unread_pending`] is called once per idle turn).
    watching: AtomicBool,
    harness_poke: Arc<std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>>,
    _presence: File,
}

/// Whether the harness has given up on a waiter, asked when the watched file changes.
type Abandoned = Box<dyn Fn() -> bool + Send + Sync>;

#[derive(Serialize, Deserialize)]
struct WaiterRecord {
    pid: u32,
    token: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    harness_pids: Vec<rustix::process::RawPid>,
}

fn waiter_record(home: &Home, session: &str) -> PathBuf {
    home.sessions_dir().join(session).join("waiter.json")
}

fn presence_lock(home: &Home, session: &str) -> Result<File> {
    let dir = home.sessions_dir().join(session);
    home.root_dir().create_dir_private(&dir)?;
    let path = dir.join("waiter.lock");
    home.root_dir().open_or_create(&path)
}

impl Waiter {
    /// Becomes `session`'s one waiter, serving the harness's processes `harness` (the process
    /// that started it, or the terminals that show the session; none when not known). Blocks
    /// while a resume of this session is running, which holds the lock
    /// exclusively; the wake it delivers is read by the time this returns.
    pub fn start(
        home: &Home,
        session: &str,
        harness: Vec<rustix::process::RawPid>,
    ) -> Result<Waiter> {
        crate::request::check_name("session", session)?;
        let presence = presence_lock(home, session)?;
        let lock = home.sessions_dir().join(session).join("waiter.lock");
        presence
            .lock_shared()
            .map_err(|e| Error::io("cannot lock", &lock, e))?;
        let token = crate::secret::random_hex(8);
        let record = waiter_record(home, session);
        home.root_dir().commit_json(
            &record,
            &WaiterRecord {
                pid: std::process::id(),
                token: token.clone(),
                harness_pids: harness.clone(),
            },
        )?;
        Ok(Waiter {
            home: home.clone(),
            session: session.to_owned(),
            token,
            record,
            harness,
            harness_gone: Arc::new(AtomicBool::new(false)),
            abandoned: None,
            watching: AtomicBool::new(false),
            harness_poke: Default::default(),
            _presence: presence,
        })
    }

    /// Leaves also when `abandoned` says so, asked whenever `watch` changes. Gemini CLI stops
    /// waiting for a hook when the user presses Esc but leaves the hook's process running: a
    /// wake it handed over then would be read by nobody. What Gemini writes to the session's
    /// transcript meanwhile says so.
    pub fn leave_when(&mut self, watch: PathBuf, abandoned: Abandoned) {
        self.abandoned = Some((watch, abandoned));
    }

    /// Pokes `poke` (and every later caller's poke) once the harness's processes have all
    /// exited. The kernel tells (a pidfd per process): nothing polls while they live. One
    /// thread watches, however often this is called.
    fn watch_harness(&self, poke: std::sync::mpsc::Sender<()>) {
        *self
            .harness_poke
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(poke);
        if self.harness.is_empty() || self.watching.swap(true, Ordering::Relaxed) {
            return;
        }
        let (pids, poke, gone) = (
            self.harness.clone(),
            self.harness_poke.clone(),
            self.harness_gone.clone(),
        );
        std::thread::spawn(move || {
            for pid in pids {
                let _ = crate::process::wait_for_exit(pid, true, Duration::from_secs(5));
            }
            gone.store(true, Ordering::Relaxed);
            let poke = poke
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(p) = poke.as_ref() {
                let _ = p.send(());
            }
        });
    }

    /// The session this waiter serves.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Whether this waiter should stop waiting: its harness exited, or `waiter.json` no longer
    /// names it (a newer waiter replaced it, or the session ended).
    pub fn should_leave(&self) -> bool {
        if self.harness_gone.load(Ordering::Relaxed) {
            return true;
        }
        if self.abandoned.as_ref().is_some_and(|(_, gone)| gone()) {
            return true;
        }
        // Reached beneath the home without following a link; one that is not a record (a link,
        // huge, not JSON) is set aside, and this waiter leaves as for a removed one.
        let found = crate::durable::read_json_or_set_aside::<WaiterRecord>(
            self.home.root_dir(),
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
            let _ = self.home.root_dir().unlink(&self.record);
        }
    }
}

/// Ends `session`'s waiter (the harness's session ended): its record is removed, and the
/// waiter, which watches for that, leaves. True when there was one.
pub fn end_waiter(home: &Home, session: &str) -> Result<bool> {
    crate::request::check_name("session", session)?;
    let record = waiter_record(home, session);
    match home.root_dir().unlink(&record) {
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
    /// A resume started for it earlier did not finish (killed mid-turn, or past its bound),
    /// but the harness's transcript shows the turn began: the agent has it, and it is now
    /// marked read rather than given a second time.
    InTranscript,
    /// The harness has no such session to resume (Claude Code's session that never had a
    /// turn): no retry can deliver it, so it stays unread for the session's next reader
    /// (`wait_next`, `waitpoint next`, a live waiter).
    NoSuchSession,
}

/// `sessions/<s>/resume.json`: the resume of a wake this session had started, written before
/// the harness is started and removed once the wake is read. Found on a later attempt for the
/// same wake, it says a turn may have begun already, and the harness's transcript is asked.
#[derive(Debug, Serialize, Deserialize)]
struct ResumeRecord {
    wake_id: String,
    harness: Harness,
    target: String,
    /// When the first attempt for this wake started, in milliseconds since the epoch.
    started_at_ms: u64,
}

fn resume_record(home: &Home, session: &str) -> PathBuf {
    home.sessions_dir().join(session).join("resume.json")
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Before resuming with `wake`: whether an earlier resume of it already gave it to the harness
/// (then it is marked read here), and the record of this attempt, written durably before the
/// harness starts.
fn begin_resume(
    home: &Home,
    wake: &Wake,
    r: &Resume,
) -> std::result::Result<Option<Handed>, String> {
    let path = resume_record(home, &wake.channel);
    let earlier = crate::durable::read_json_or_set_aside::<ResumeRecord>(home.root_dir(), &path)
        .ok()
        .flatten()
        .filter(|e| e.wake_id == wake.wake_id);
    let started_at_ms = match &earlier {
        Some(e) => {
            // File times are coarser than our clock: a little before, not a turn missed.
            let since = UNIX_EPOCH + Duration::from_millis(e.started_at_ms.saturating_sub(2_000));
            match super::transcript::holds(
                r.harness,
                r.harness_home.as_deref(),
                since,
                &wake.wake_id,
            ) {
                super::transcript::Seen::Yes => {
                    delivery::mark_read(home, &wake.channel, &wake.wake_id)
                        .map_err(|e| format!("cannot mark the wake read: {e}"))?;
                    let _ = home.root_dir().remove_durably(&path);
                    return Ok(Some(Handed::InTranscript));
                }
                seen => tracing::info!(
                    wake = %wake.wake_id,
                    ?seen,
                    "a resume of this wake was started before; its turn is not in the transcript, \
                     so it is started again"
                ),
            }
            e.started_at_ms
        }
        None => epoch_ms(SystemTime::now()),
    };
    home.root_dir()
        .commit_json(
            &path,
            &ResumeRecord {
                wake_id: wake.wake_id.clone(),
                harness: r.harness,
                target: r.target.clone(),
                started_at_ms,
            },
        )
        .map_err(|e| format!("cannot record the resume before starting it: {e}"))?;
    Ok(None)
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
        crate::inbox::wake_on_change(&home.inbox_new(channel)).map_err(|e| e.to_string())?;
    if !delivery::is_unread(home, channel, id) {
        return Ok(Handed::AlreadyRead);
    }
    // An open Codex thread refuses any other writer: wait for its turn's end (its Stop hook's
    // waiter takes the wake) or its exit, then resume at once. This comes before the presence
    // lock, which that waiter needs.
    let mut said = false;
    while r.harness == Harness::Codex
        && let Some(pid) = super::codex_lock::holder(r.harness_home.as_deref(), &r.target)
    {
        if !said {
            tracing::info!(
                wake = %id,
                thread = %r.target,
                pid,
                "the thread is open in Codex; the wake waits for its turn's end or its exit",
            );
            said = true;
        }
        if !crate::inbox::wait_for_change(&changes, Some(deadline), Duration::from_secs(1)) {
            return Err(format!(
                "thread {} stayed open in Codex (process {pid}) for {} s; the wake waits for \
                 its next turn's end or its exit",
                r.target,
                timeout.as_secs()
            ));
        }
        if !delivery::is_unread(home, channel, id) {
            return Ok(Handed::TakenLive);
        }
    }
    loop {
        match presence.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => return Err(format!("cannot lock: {e}")),
        }
        // A live waiter holds the session: it takes the wake. The lock's release (its harness
        // exited first) sends no event, hence the second's look again.
        if !crate::inbox::wait_for_change(&changes, Some(deadline), Duration::from_secs(1)) {
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
    if let Some(handed) = begin_resume(home, wake, r)? {
        return Ok(handed);
    }
    // A failed run keeps the record: whether its turn began is for the next attempt's look
    // at the transcript to say (a turn killed at its bound began; a refused one did not).
    let ran = resume(
        home,
        wake,
        r,
        deadline.saturating_duration_since(Instant::now()),
    );
    if ran
        .as_ref()
        .is_err_and(|why| why.starts_with(NO_SUCH_SESSION))
    {
        // Nothing began: the record goes, and the wake stays for the session's next reader.
        let _ = home
            .root_dir()
            .remove_durably(&resume_record(home, channel));
        return Ok(Handed::NoSuchSession);
    }
    ran?;
    let _ = home
        .root_dir()
        .remove_durably(&resume_record(home, channel));
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
            tracing::error!(wake = %w.wake_id, error = %e, "cannot put a wake back");
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
        let node = "file:///x/cli.js:12\n    throw e;\nTypeError: cannot read x\n    at f \
                    (cli.js:1:2)\n    at g (cli.js:3:4)\n";
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
            harness_home: None,
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
            harness_home: None,
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
        let gemini = |out: &str| judge(Harness::Gemini, true, "exited 0", out);
        assert!(gemini(r#"{"session_id":"u","response":"done","stats":{}}"#).is_ok());
        let e =
            gemini(r#"{"session_id":"u","error":{"type":"Error","message":"quota"}}"#).unwrap_err();
        assert!(e.contains("quota"), "{e}");
        assert!(gemini("not json").is_err());
        // Its own exit statuses say why: an untrusted folder, an unknown session.
        let e = judge(Harness::Gemini, false, "exited 55", "").unwrap_err();
        assert!(e.contains("not trusted"), "{e}");
        let e = judge(Harness::Gemini, false, "exited 42", "").unwrap_err();
        assert!(e.contains("no session with this id"), "{e}");
    }

    #[test]
    fn gemini_resumes_headless_with_json_output_its_prompt_on_stdin() {
        let g = Resume {
            harness: Harness::Gemini,
            program: "gemini".into(),
            target: "u1".into(),
            fork: true,
            dir: None,
            harness_home: None,
        };
        assert_eq!(g.args(), ["--resume", "u1", "--output-format", "json"]);
    }

    #[test]
    fn opencode_judged_from_its_json_events() {
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
            harness_home: None,
        };
        assert_eq!(r.args(), ["run", "--session", "ses_1", "--format", "json"]);
    }
}
