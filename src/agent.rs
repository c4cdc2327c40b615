//! The agent's operations as every front end shows them: the `wait_create` reply, what a session
//! is waiting on (`wait_check`), taking the next wake from a watched inbox ([`Inbox`]), and what
//! a front end must be told about the machine to build them. The CLI (`waitpoint create --json`,
//! `check --json`, `next`), the MCP server (`waitpoint mcp`) and the wake adapters all call
//! these, so an agent gets the same JSON whichever way it asks.

use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher};
use serde_json::{Value, json};

use crate::durable::FileLock;
use crate::engine::{self, Created, Engine};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::howto::{self, HowToSignal};
use crate::records::{Status, Waitpoint, Wake};
use crate::render;
use crate::sync::MutexExt;

/// What a front end resolved from its environment that the reply's lines depend on.
#[derive(Debug, Clone, Copy)]
pub struct LineContext {
    /// The shim's port when no daemon published one (`WEBHOOK_PORT`, else 3001).
    pub fallback_port: u16,
    /// Whether the home is the one a bare `cortex-signal` would find (`~/.cortex` with no
    /// `CORTEX_HOME`); otherwise the local lines name it.
    pub home_is_implicit: bool,
}

/// The port printed lines use: the shim's, when this home's daemon published one; else the
/// front end's fallback.
pub fn webhook_port(home: &Home, fallback: u16) -> u16 {
    shim_of(home, fallback, false).0
}

/// The URL a new callback's sender POSTs to, on the port [`webhook_port`] names. It holds the
/// token, so it exists only in the reply that issues it.
pub fn trigger_url(
    home: &Home,
    fallback: u16,
    issued: &engine::callbacks::IssuedCallback,
) -> String {
    crate::ingress::http::trigger_url(
        webhook_port(home, fallback),
        issued.callback.mode,
        &issued.token,
    )
}

/// The shim the `curl` line posts to, from one read of the published address: its port (the
/// published one, else `fallback`) and whether it is listening, turned on in settings
/// (`enabled`) but not running, or off.
fn shim_of(home: &Home, fallback: u16, enabled: bool) -> (u16, howto::Shim) {
    match crate::sender::published_endpoint(home) {
        crate::sender::Published::Up(url) => (url.port, howto::Shim::Listening),
        _ if enabled => (fallback, howto::Shim::Configured),
        _ => (fallback, howto::Shim::Off),
    }
}

/// Whether this home's HTTP shim is listening now (a daemon published its address).
pub fn shim_listening(home: &Home) -> bool {
    matches!(
        crate::sender::published_endpoint(home),
        crate::sender::Published::Up(_)
    )
}

/// Whether a daemon holds this home's lock right now (signals are applied only by one).
pub fn daemon_running(home: &Home) -> bool {
    FileLock::is_held(&home.daemon_lock())
}

/// The `how_to_signal` lines of a new (or re-secreted) waitpoint.
pub fn how_to_signal(engine: &Engine, created: &Created, ctx: LineContext) -> Result<HowToSignal> {
    let home = engine.home();
    let device = created
        .waitpoint
        .device
        .as_deref()
        .map(|d| crate::ingress::device::require(home, d))
        .transpose()?;
    let root = home.root().to_string_lossy().into_owned();
    let drop_zone = home.drop_zone().to_string_lossy().into_owned();
    let settings = engine.settings();
    let (port, shim) = shim_of(
        home,
        settings.webhook.port.unwrap_or(ctx.fallback_port),
        settings.webhook.enabled,
    );
    Ok(howto::build(
        &created.waitpoint,
        &created.secret,
        &howto::Target {
            home_override: (!ctx.home_is_implicit).then_some(root.as_str()),
            local_drop_zone: &drop_zone,
            webhook_port: port,
            shim,
            device_spool: device.as_ref().map(|d| d.spool.as_str()),
        },
    ))
}

/// The `wait_create` reply: the waitpoint's public state with `secret` and `how_to_signal`
/// (the JSON of `waitpoint create --json`).
pub fn created_reply(created: &Created, lines: &HowToSignal) -> Value {
    let mut v = render::public_view(&created.waitpoint);
    let o = v
        .as_object_mut()
        .expect("a waitpoint serialises to an object");
    o.insert("secret".into(), json!(created.secret));
    o.insert(
        "how_to_signal".into(),
        serde_json::to_value(lines).expect("plain strings serialise"),
    );
    v
}

/// The waitpoints `session` is waiting on (the spec's union rule: armed ones it armed or whose
/// wakes come to it), and fired or expired ones whose wake it has not read yet.
pub fn waiting_for(engine: &Engine, session: &str) -> Result<Vec<Waitpoint>> {
    crate::request::check_name("session", session)?;
    let home = engine.home();
    Ok(engine
        .list_visible(session)?
        .into_iter()
        .filter(|wp| {
            wp.status == Status::Armed
                || (wp.status != Status::Cancelled && engine::has_undelivered_wake(home, wp))
        })
        .collect())
}

/// Whether `session` waits on anything: a waitpoint ([`waiting_for`]), an active timer, or an
/// unread wake.
pub fn session_waits(engine: &Engine, session: &str) -> Result<bool> {
    Ok(!waiting_for(engine, session)?.is_empty()
        || engine
            .list_timers(session, usize::MAX)?
            .iter()
            .any(|t| t.status == crate::records::TimerStatus::Active)
        || !crate::delivery::unread(engine.home(), session)?.is_empty())
}

/// One session as the session list shows it (`waitpoint sessions`, the operator's page).
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionLine {
    pub session: String,
    /// It waits on a machine (something armed): the hollow ring. Deliberately not the amber
    /// dot, which means "blocked on you".
    pub waiting: bool,
    /// `○` when it waits, else empty.
    pub ring: &'static str,
    /// The capsule (`check --brief`, without its newline); empty when nothing is armed or
    /// delivering.
    pub capsule: String,
    /// Whether a badge puts the dot on the capsule.
    pub attention: bool,
    /// Armed waitpoints (what the capsule counts on a phone).
    pub armed: usize,
    /// Fired or expired ones whose wake has not been read yet.
    pub delivering: usize,
    pub unread_wakes: usize,
}

/// One session as its full views see it, each part read once: the waitpoints it waits on
/// ([`waiting_for`]), their rows, its unread wakes, and its line in the session list.
#[derive(Debug, Clone)]
pub struct Session {
    pub line: SessionLine,
    pub items: Vec<Waitpoint>,
    pub rows: Vec<render::CheckItem>,
    pub unread: Vec<Wake>,
}

impl Session {
    /// Reads session `name`'s waitpoints, rows and unread wakes.
    pub fn read(engine: &Engine, name: String) -> Result<Session> {
        let items = waiting_for(engine, &name)?;
        let rows = check_rows(engine, &items)?;
        let unread = crate::delivery::unread(engine.home(), &name)?;
        let armed = rows.iter().filter(|r| !r.delivering).count();
        let line = SessionLine {
            ring: if armed > 0 { "○" } else { "" },
            waiting: armed > 0,
            capsule: render::check_brief(&rows).trim_end().to_owned(),
            attention: rows.iter().any(|r| r.badges.iter().any(|b| b.attention)),
            armed,
            delivering: rows.len() - armed,
            unread_wakes: unread.len(),
            session: name,
        };
        Ok(Session {
            line,
            items,
            rows,
            unread,
        })
    }

    /// Its `wait_check` reply (see [`check`]).
    pub fn check_reply(&self) -> Value {
        check_reply(&self.line.session, &self.items, &self.rows, &self.unread)
    }
}

/// Every session the home knows of, by name: those with an inbox, and those a kept waitpoint
/// names (the one that armed it, the channel its wakes go to).
/// A session deleted (`waitpoint session delete`) is left out until a waitpoint naming it is
/// armed again or a wake lands in it.
pub fn session_names(engine: &Engine) -> Result<std::collections::BTreeSet<String>> {
    let mut created = std::collections::BTreeMap::<String, Vec<_>>::new();
    engine.for_each_waitpoint(|wp| {
        for name in [wp.session, wp.channel] {
            created.entry(name).or_default().push(wp.created_at);
        }
        Ok(())
    })?;
    let inboxes = crate::delivery::channels(engine.home())?;
    let mut names = std::collections::BTreeSet::new();
    for (name, times) in created {
        if inboxes.contains(&name) || !engine.listed_as_deleted(&name, times)? {
            names.insert(name);
        }
    }
    names.extend(inboxes);
    Ok(names)
}

/// The session list: one [`SessionLine`] per session of [`session_names`].
pub fn sessions(engine: &Engine) -> Result<Vec<SessionLine>> {
    session_names(engine)?
        .into_iter()
        .map(|name| Session::read(engine, name).map(|s| s.line))
        .collect()
}

/// The `wait_check` reply for `items` (what [`waiting_for`] found for `session`): each
/// waitpoint with its intent, progress, deadline, badges (the refused signals' included) and
/// latest heartbeat, and the unread wakes of the session's channel.
pub fn check(engine: &Engine, session: &str, items: &[Waitpoint]) -> Result<Value> {
    let mut rows = check_rows(engine, items)?;
    add_refusals(&mut rows, &refused_counts(engine.home())?);
    let unread = crate::delivery::unread(engine.home(), session)?;
    Ok(check_reply(session, items, &rows, &unread))
}

fn check_reply(
    session: &str,
    items: &[Waitpoint],
    rows: &[render::CheckItem],
    unread: &[Wake],
) -> Value {
    let waiting: Vec<Value> = items
        .iter()
        .zip(rows)
        .map(|(wp, row)| {
            let mut v = serde_json::to_value(row).expect("rows serialise");
            v["intent"] = json!(wp.intent);
            v
        })
        .collect();
    let unread: Vec<Value> = unread
        .iter()
        .map(|w| {
            json!({
                "wake_id": w.wake_id,
                "kind": w.kind.as_str(),
                "created_at": w.created_at,
                "summary": w.summary,
            })
        })
        .collect();
    json!({ "session": session, "waiting": waiting, "unread_wakes": unread })
}

/// How many signals were refused for each waitpoint id and parked in the drop zone's `bad/` (a
/// wrong secret, or a sender's own record of its miss), so a typo in a job's script shows where
/// its session looks, not only in the daemon's log. It reads `bad/`, so only the full views
/// (`check`, `wait_check`, the page) call it, once per view, never the brief line.
pub fn refused_counts(home: &Home) -> Result<std::collections::HashMap<String, usize>> {
    let mut counts = std::collections::HashMap::<String, usize>::new();
    for (name, path) in crate::durable::list_dir(&home.bad_dir())? {
        if !name.ends_with(".json") {
            continue;
        }
        // A parked copy that is a link, huge or unreadable names nothing here.
        let Ok(Ok(Some(bytes))) = crate::durable::read_record_bytes(home.root_dir(), &path) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        let id = v.get(crate::request::MISS_KEY).or_else(|| v.get("id"));
        if let Some(id) = id.and_then(Value::as_str) {
            *counts.entry(id.to_owned()).or_default() += 1;
        }
    }
    Ok(counts)
}

/// Adds a `refused` badge to each row whose waitpoint has a count in `counts`
/// ([`refused_counts`]).
pub fn add_refusals(
    rows: &mut [render::CheckItem],
    counts: &std::collections::HashMap<String, usize>,
) {
    for row in rows {
        if let Some(&n) = counts.get(&row.id) {
            row.badges.push(render::refused_badge(n));
        }
    }
}

/// The rows `check` shows for `items`: progress, deadline, badges and the latest heartbeat.
pub fn check_rows(engine: &Engine, items: &[Waitpoint]) -> Result<Vec<render::CheckItem>> {
    let heartbeats = items
        .iter()
        .map(|wp| engine.latest_heartbeat(wp))
        .collect::<Result<Vec<_>>>()?;
    Ok(render::check_items(
        engine.home(),
        items,
        &heartbeats,
        engine.settings().max_wakes_per_hour,
        engine.now(),
    ))
}

/// What `cancel` says: the job keeps running, and what it will be told when it signals (the
/// words `cortex-signal` prints then, exit 0).
pub fn cancelled_note(wp: &Waitpoint) -> String {
    format!(
        "cancelled {} {:?}: the job itself keeps running; when it signals it is told \
\"already cancelled; nothing to do\" (cortex-signal exits 0)",
        wp.id, wp.label
    )
}

/// Arms a waitpoint for a front end: the named device must exist, so the reply's `shell` line
/// points at its real spool.
pub fn create(engine: &Engine, req: engine::CreateRequest) -> Result<Created> {
    if let Some(d) = req.device.as_deref() {
        crate::ingress::device::require(engine.home(), d)?;
    }
    engine.create(req)
}

/// A watcher whose events only wake the caller up; the caller re-reads the state each time.
///
/// Reads are not changes: inotify reports the caller's own `opendir` and `closedir` of the
/// watched directory (notify asks for `IN_OPEN` and `IN_CLOSE_NOWRITE`), so forwarding them made
/// every re-read wake the caller again, and an idle waiter spun a core. Only events that can
/// change what a re-read finds are forwarded; an error or an overflow is forwarded too, since the
/// caller's re-read is exactly the rescan it asks for.
pub fn wake_on_change(dir: &Path) -> Result<(DirWatch, mpsc::Receiver<()>)> {
    let (tx, rx) = mpsc::channel();
    Ok((watch_into(dir, tx)?, rx))
}

/// A reader's watcher: inotify's, or notify's poller when the kernel's inotify limits are
/// reached (instances or watches), so a reader waits either way.
pub type DirWatch = Box<dyn notify::Watcher + Send>;

/// How often the poller looks when inotify cannot be had.
const POLL_EVERY: Duration = Duration::from_secs(1);

/// A watcher on `dir` that sends to `tx` on each change (see [`wake_on_change`]).
fn watch_into(dir: &Path, tx: mpsc::Sender<()>) -> Result<DirWatch> {
    let handler = |tx: mpsc::Sender<()>| {
        move |res: notify::Result<notify::Event>| {
            if res.is_ok_and(|e| is_read_only(&e.kind)) {
                return;
            }
            let _ = tx.send(());
        }
    };
    match inotify_on(dir, handler(tx.clone())) {
        Ok(w) => Ok(w),
        Err(e) if is_limit(&e) => {
            tracing::warn!(
                dir = %dir.display(),
                "inotify cannot be had ({e}); looking every {} ms instead",
                POLL_EVERY.as_millis()
            );
            let config = notify::Config::default().with_poll_interval(POLL_EVERY);
            let mut poller =
                notify::PollWatcher::new(handler(tx), config).map_err(|e| watch_error(dir, e))?;
            poller
                .watch(dir, RecursiveMode::NonRecursive)
                .map_err(|e| watch_error(dir, e))?;
            Ok(Box::new(poller))
        }
        Err(e) => Err(watch_error(dir, e)),
    }
}

fn inotify_on(
    dir: &Path,
    handler: impl notify::EventHandler,
) -> std::result::Result<DirWatch, notify::Error> {
    if let Err(Error::Io { source, .. }) = injected_watcher_fault(dir) {
        return Err(notify::Error::io(source));
    }
    let mut watcher = notify::recommended_watcher(handler)?;
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    Ok(Box::new(watcher))
}

/// The `watcher` failpoint's fault, if one is injected (nothing in a release build).
fn injected_watcher_fault(dir: &Path) -> Result<()> {
    crate::failpoint!(
        crate::failpoint::WATCHER,
        "cannot start the file watcher on",
        dir
    );
    let _ = dir;
    Ok(())
}

/// Whether `e` is the kernel saying no more inotify instances or watches for this user.
fn is_limit(e: &notify::Error) -> bool {
    match &e.kind {
        notify::ErrorKind::MaxFilesWatch => true,
        notify::ErrorKind::Io(io) => matches!(io.raw_os_error(), Some(24 | 28)),
        _ => false,
    }
}

fn watch_error(dir: &Path, e: notify::Error) -> Error {
    Error::Usage(format!("cannot watch {}: {e}", dir.display()))
}

/// Whether an event only says that someone looked (opened, read, or closed without writing).
fn is_read_only(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    matches!(kind, notify::EventKind::Access(a) if *a != AccessKind::Close(AccessMode::Write))
}

/// Waits for the next change event, at most `look_again` and never past `deadline`; false when
/// the deadline passed.
pub fn wait_for_change(
    rx: &mpsc::Receiver<()>,
    deadline: Option<Instant>,
    look_again: Duration,
) -> bool {
    let timeout = deadline.map_or(look_again, |d| {
        d.saturating_duration_since(Instant::now()).min(look_again)
    });
    let got = rx.recv_timeout(timeout).is_ok();
    while rx.try_recv().is_ok() {}
    got || deadline.is_none_or(|d| Instant::now() < d)
}

/// A request to stop, raised from outside (the CLI turns SIGTERM, SIGINT and SIGHUP into it):
/// a reader asks [`Interrupt::raised`] between steps, so one stopped while it has a wake in
/// hand finishes handing it over instead of dying with it taken and never delivered.
#[derive(Debug, Clone, Default)]
pub struct Interrupt(Arc<Raised>);

#[derive(Debug, Default)]
struct Raised {
    signal: AtomicI32,
    pokes: Mutex<Vec<mpsc::Sender<()>>>,
}

impl Interrupt {
    /// Raises it (for `signal`, a positive number) and wakes every waiting reader.
    pub fn raise(&self, signal: i32) {
        self.0.signal.store(signal, Ordering::SeqCst);
        for poke in self.0.pokes.lock_or_recover().iter() {
            let _ = poke.send(());
        }
    }

    /// The signal it was raised for, if it was.
    pub fn raised(&self) -> Option<i32> {
        Some(self.0.signal.load(Ordering::SeqCst)).filter(|s| *s > 0)
    }

    /// Wakes `poke` when raised (an [`Inbox::poker`]), so a wait ends at once.
    pub fn wake(&self, poke: mpsc::Sender<()>) {
        self.0.pokes.lock_or_recover().push(poke);
    }
}

/// A channel's inbox, watched: each [`Inbox::take`] takes the next unread wake (marking it
/// read), waiting for one to arrive. One watcher serves every take, so a reader that takes many
/// (`next --follow`) sets it up once.
pub struct Inbox<'h> {
    home: &'h Home,
    channel: String,
    watcher: DirWatch,
    changes: mpsc::Receiver<()>,
    poke: mpsc::Sender<()>,
}

impl<'h> Inbox<'h> {
    pub fn open(home: &'h Home, channel: &str) -> Result<Inbox<'h>> {
        crate::request::check_name("channel", channel)?;
        let dir = home.inbox_new(channel);
        crate::durable::create_dir_private(&dir)?;
        crate::durable::create_dir_private(&home.inbox_cur(channel))?;
        // Watch before the first look, so a wake landing in between is not missed.
        let (poke, changes) = mpsc::channel();
        let watcher = watch_into(&dir, poke.clone())?;
        Ok(Inbox {
            home,
            channel: channel.to_owned(),
            watcher,
            changes,
            poke,
        })
    }

    /// Also wakes a waiting [`Inbox::take`] on changes in `dir`, so its `stop` is asked again
    /// (a waiter watches its session's directory to see that it was replaced).
    pub fn watch_also(&mut self, dir: &Path) -> Result<()> {
        self.watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|e| watch_error(dir, e))
    }

    /// A handle that wakes a waiting [`Inbox::take`] from another thread, so its `stop` is
    /// asked again at once.
    pub fn poker(&self) -> mpsc::Sender<()> {
        self.poke.clone()
    }

    /// The unread wakes, oldest first, left unread, once there is one; empty when `stop` said
    /// to give up first. For a reader that marks them read only once it handed them on
    /// (OpenCode's plugin, which delivers through OpenCode's own API).
    pub fn wait_unread(&self, look_again: Duration, stop: &dyn Fn() -> bool) -> Result<Vec<Wake>> {
        loop {
            if stop() {
                return Ok(Vec::new());
            }
            let unread = crate::delivery::unread(self.home, &self.channel)?;
            if !unread.is_empty() {
                return Ok(unread);
            }
            wait_for_change(&self.changes, None, look_again);
        }
    }

    /// The next unread wake, taken; `None` when `deadline` passed or `stop` said to give up
    /// first. `stop` is asked at least every `look_again`.
    pub fn take(
        &self,
        deadline: Option<Instant>,
        look_again: Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Wake>> {
        loop {
            if stop() {
                return Ok(None);
            }
            if let Some(wake) = crate::delivery::take_next(self.home, &self.channel)? {
                return Ok(Some(wake));
            }
            if !wait_for_change(&self.changes, deadline, look_again) {
                return Ok(None);
            }
        }
    }
}
