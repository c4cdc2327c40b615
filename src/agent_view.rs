//! The agent's view: the operations as every front end shows them to an agent (the
//! `wait_create` reply, what a session is waiting on for `wait_check`, its sessions) and what a
//! front end must be told about the machine to build them. The CLI (`waitpoint create --json`,
//! `check --json`), the MCP server (`waitpoint mcp`) and the wake adapters all call these, so an
//! agent gets the same JSON whichever way it asks.

use serde_json::{Value, json};

use crate::delivery;
use crate::durable::FileLock;
use crate::engine::{self, Created, Engine};
use crate::error::Result;
use crate::home::Home;
use crate::howto::{self, HowToSignal};
use crate::operator_view;
use crate::records::{Status, Waitpoint, Wake};

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
fn shim_of(home: &Home, fallback: u16, enabled: bool) -> (u16, howto::ShimState) {
    match crate::sender::published_endpoint(home) {
        crate::sender::Published::Up(url) => (url.port, howto::ShimState::Listening),
        _ if enabled => (fallback, howto::ShimState::Configured),
        _ => (fallback, howto::ShimState::Off),
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
    FileLock::is_held(home.root_dir(), &home.daemon_lock())
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
    let mut v = operator_view::public_view(&created.waitpoint);
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
                || (wp.status != Status::Cancelled && delivery::has_undelivered_wake(home, wp))
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
    pub rows: Vec<operator_view::CheckItem>,
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
            capsule: operator_view::check_brief(&rows).trim_end().to_owned(),
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
    rows: &[operator_view::CheckItem],
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
    for (name, path) in home.root_dir().list_dir(&home.bad_dir())? {
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
    rows: &mut [operator_view::CheckItem],
    counts: &std::collections::HashMap<String, usize>,
) {
    for row in rows {
        if let Some(&n) = counts.get(&row.id) {
            row.badges.push(operator_view::refused_badge(n));
        }
    }
}

/// The rows `check` shows for `items`: progress, deadline, badges and the latest heartbeat.
pub fn check_rows(engine: &Engine, items: &[Waitpoint]) -> Result<Vec<operator_view::CheckItem>> {
    let heartbeats = items
        .iter()
        .map(|wp| engine.latest_heartbeat(wp))
        .collect::<Result<Vec<_>>>()?;
    Ok(operator_view::check_items(
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
