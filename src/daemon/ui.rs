//! The operator page's requests (`/ui/`, served by the shim, `ingress/http/ui.rs`). Its list and
//! its waitpoint pictures are built off the loop, on a thread of their own ([`Views`]) reading
//! the store through an engine of their own; its cancel is `waitpoint cancel`'s
//! `Engine::cancel`, run on the loop like every other change.
//!
//! The list is not a view of its own: each session is `agent_view::Session` read once, its line in
//! the session list (ring, capsule, counts) and its `wait_check` rows (intent, progress, badges
//! with their retry errors, the latest heartbeat), so the page, the terminal and the agent
//! cannot tell different stories. It carries no signal: a waitpoint's signals are its picture,
//! `operator_view::show_json` (`show --json`, never the secret's hash), asked for when the page
//! opens it. It is bounded: at most [`MAX_SESSIONS_SHOWN`] sessions and [`MAX_ROWS_SHOWN`] rows
//! ([`MAX_ROWS_PER_SESSION`] a session), and it says how many it leaves out.
//!
//! With 10,000 waitpoints the list was 12 MB, built on the loop at every poll of every open
//! page, even for a 304 (issue 36): an open tab cost half a core and stalled signals by up to a
//! second. Now the loop only counts its changes ([`Views::changed`], a generation every event
//! and every due run that may change what the list shows bumps), and the list is built again
//! only when that count moved or the list is [`MAX_AGE_MS`] old (its times are relative, and
//! a `cancel` or `next` run by another process tells the loop nothing), and builds take at most
//! a twentieth of a core ([`BUILD_SHARE`]): while changes stream in, a poll waits for its turn. A
//! poll whose `ETag` is the kept list's costs a comparison.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Instant;

use serde_json::{Value, json};

use crate::agent_view;
use crate::clock::{Clock, Timestamp};
use crate::engine::Engine;
use crate::error::Result;
use crate::ingress::http::Outcome;
use crate::ingress::http::ui::{UiAnswer, UiRequest};
use crate::operator_view;
use crate::settings::Settings;
use crate::settings::location::Location;

/// Sessions the list shows at most (by name); the rest are counted.
pub const MAX_SESSIONS_SHOWN: usize = 100;
/// Waitpoint rows the list shows at most, all sessions together; the rest are counted.
pub const MAX_ROWS_SHOWN: usize = 300;
/// Waitpoint rows one session shows at most.
pub const MAX_ROWS_PER_SESSION: usize = 50;
/// The newest signals a waitpoint's picture shows at most.
pub const MAX_SIGNALS_SHOWN: u64 = 200;
/// A kept list is built again after this long even without a change the loop saw.
pub const MAX_AGE_MS: i64 = 60_000;
/// Builds take at most one part in this many of a core: after a build that took `t`, the next
/// starts no sooner than `(BUILD_SHARE - 1) * t` after it ended (a poll waits for it). While
/// signals stream in, every poll would otherwise build (180 ms each at 10,000 waitpoints).
pub const BUILD_SHARE: u32 = 20;

/// Cancels a waitpoint for the page, on the loop.
pub(super) fn cancel(engine: &Engine, id: &str, session: &str) -> Result<UiAnswer> {
    let wp = engine.cancel(id, session)?;
    tracing::info!(waitpoint = %wp.id, session = %session, "cancelled from the operator page");
    Ok(UiAnswer::Json(json!({
        "result": "cancelled",
        "waitpoint": operator_view::public_view(&wp),
        "note": agent_view::cancelled_note(&wp),
    })))
}

/// What the views thread is asked.
enum Job {
    Ask(UiRequest, Outcome<Result<UiAnswer>>),
    Settings(Box<Settings>),
}

/// The page's list and pictures, built on a thread of their own. Cloned into the shim's
/// submit; the thread ends when every clone is gone.
#[derive(Clone)]
pub(super) struct Views {
    jobs: Sender<Job>,
    generation: Arc<AtomicU64>,
}

impl Views {
    /// Starts the thread with `engine`, an engine of its own sharing the loop's store, on
    /// `clock` (the loop's).
    pub(super) fn start(engine: Engine, clock: Arc<dyn Clock>) -> Views {
        let (jobs, rx) = mpsc::channel();
        let generation = Arc::new(AtomicU64::new(0));
        let builder = Builder {
            engine,
            clock,
            generation: Arc::clone(&generation),
            kept: None,
            builds: 0,
            next_build: Instant::now(),
        };
        std::thread::Builder::new()
            .name("ui-views".into())
            .spawn(move || builder.serve(rx))
            .expect("spawn the operator page's thread");
        Views { jobs, generation }
    }

    /// Something the list may show changed (or is about to): the kept list is stale.
    pub(super) fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Hands the thread a request; false when it has stopped.
    pub(super) fn ask(&self, request: UiRequest, reply: Outcome<Result<UiAnswer>>) -> bool {
        self.jobs.send(Job::Ask(request, reply)).is_ok()
    }

    /// The daemon's settings changed (the wake cap the rows show is one).
    pub(super) fn reload(&self, settings: Settings) {
        self.changed();
        let _ = self.jobs.send(Job::Settings(Box::new(settings)));
    }
}

/// A built list: the generation it was built at, when, its `ETag` and its JSON text.
struct Kept {
    generation: u64,
    at: Timestamp,
    etag: String,
    json: Arc<str>,
}

struct Builder {
    engine: Engine,
    clock: Arc<dyn Clock>,
    generation: Arc<AtomicU64>,
    kept: Option<Kept>,
    builds: u64,
    /// When the next build may start ([`BUILD_SHARE`]).
    next_build: Instant,
}

impl Builder {
    fn serve(mut self, jobs: Receiver<Job>) {
        for job in jobs {
            match job {
                Job::Ask(request, reply) => {
                    reply.send(self.answer(request));
                }
                Job::Settings(settings) => {
                    let home = self.engine.home().clone();
                    let clock = Arc::clone(&self.clock);
                    self.engine = Engine::new(home, *settings, clock).with_store_of(&self.engine);
                    self.kept = None;
                }
            }
        }
    }

    fn answer(&mut self, request: UiRequest) -> Result<UiAnswer> {
        match request {
            UiRequest::View { known } => self.view(known.as_deref()),
            UiRequest::Waitpoint { id } => picture(&self.engine, &id).map(UiAnswer::Json),
            // Changes are the loop's; the shim never sends one here.
            UiRequest::Cancel { .. } => Err(crate::error::Error::Usage(
                "a cancel is run on the daemon's loop".into(),
            )),
        }
    }

    /// The list, built again only when the loop changed something since it was built or it
    /// is [`MAX_AGE_MS`] old; no JSON when it is the one the page holds (`known`).
    fn view(&mut self, known: Option<&str>) -> Result<UiAnswer> {
        let fresh = |b: &Builder| {
            let now = b.engine.now();
            b.kept.as_ref().is_some_and(|k| {
                k.generation == b.generation.load(Ordering::SeqCst)
                    && now.millis_since(k.at) < MAX_AGE_MS
                    && now >= k.at
            })
        };
        if !fresh(self) {
            // The answer is never older than the request; under a stream of changes it waits
            // for its turn instead.
            std::thread::sleep(self.next_build.saturating_duration_since(Instant::now()));
        }
        if !fresh(self) {
            let (generation, now) = (self.generation.load(Ordering::SeqCst), self.engine.now());
            let started = Instant::now();
            let json: Arc<str> = Arc::from(list(&self.engine)?.to_string());
            let took = started.elapsed();
            self.next_build = Instant::now() + took * (BUILD_SHARE - 1);
            tracing::debug!(
                ms = took.as_millis() as u64,
                bytes = json.len(),
                "operator page: list built"
            );
            self.builds += 1;
            let etag = format!("\"{}\"", &crate::secret::hash(&json)[..32]);
            self.kept = Some(Kept {
                generation,
                at: now,
                etag,
                json,
            });
        }
        let kept = self.kept.as_ref().expect("kept above");
        Ok(UiAnswer::View {
            etag: kept.etag.clone(),
            json: (known != Some(kept.etag.as_str())).then(|| Arc::clone(&kept.json)),
            builds: self.builds,
        })
    }
}

/// The page's list: each shown session's line and `wait_check` rows (bounded, see the module
/// doc), `bad/` read once for the whole list, and the counts of what is not shown.
fn list(engine: &Engine) -> Result<Value> {
    let refused = agent_view::refused_counts(engine.home())?;
    let (names, inboxes, from_index) = session_names(engine)?;
    let mut sessions_not_shown = 0;
    let mut rows_left = MAX_ROWS_SHOWN;
    let mut rows_not_shown = 0;
    let mut sessions = Vec::new();
    for name in names {
        if sessions.len() == MAX_SESSIONS_SHOWN {
            sessions_not_shown += 1;
            continue;
        }
        let has_inbox = inboxes.contains(&name);
        let mut s = agent_view::Session::read(engine, name)?;
        // A name the index keeps for waitpoints since removed (it only over-approximates) is
        // no session: `waitpoint sessions` does not list it either. One whose waitpoints are
        // all cancelled or done still is.
        if from_index
            && s.items.is_empty()
            && !has_inbox
            && !names_a_kept_waitpoint(engine, &s.line.session)?
        {
            continue;
        }
        let shown = s.rows.len().min(MAX_ROWS_PER_SESSION).min(rows_left);
        rows_left -= shown;
        let not_shown = s.rows.len() - shown;
        rows_not_shown += not_shown;
        s.items.truncate(shown);
        s.rows.truncate(shown);
        agent_view::add_refusals(&mut s.rows, &refused);
        let mut check = s.check_reply();
        // The page shows the count of unread wakes (in the line), not their texts.
        check.as_object_mut().map(|o| o.remove("unread_wakes"));
        sessions.push(json!({ "line": s.line, "check": check, "not_shown": not_shown }));
    }
    Ok(json!({
        // Its relative times ("expires in", "ago") are as of then: the page says so.
        "built_at": engine.now(),
        "sessions": sessions,
        "sessions_not_shown": sessions_not_shown,
        "waitpoints_not_shown": rows_not_shown,
    }))
}

/// The names the list looks at: `agent_view::session_names`, but on the home's files with a
/// complete index, the index's names and the inboxes, without reading every waitpoint (half of
/// a build at 10,000); the names that have an inbox; and whether the names came from the index.
fn session_names(engine: &Engine) -> Result<(BTreeSet<String>, BTreeSet<String>, bool)> {
    let home = engine.home();
    let inboxes: BTreeSet<String> = crate::delivery::channels(home)?.into_iter().collect();
    if engine.settings().store != Location::Files || !engine.index_is_complete() {
        return Ok((agent_view::session_names(engine)?, inboxes, false));
    }
    let mut names: BTreeSet<String> = home
        .root_dir()
        .list_dir(&home.session_index_root())?
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| crate::names::is_name(name))
        .collect();
    names.extend(inboxes.iter().cloned());
    // A deleted session is left out until a waitpoint naming it is armed again (or a wake
    // lands): only its index markers' waitpoints are read, and only for the few deleted.
    for (file, _) in home.root_dir().list_dir(&home.deleted_sessions_dir())? {
        let Some(name) = file.strip_suffix(".json") else {
            continue;
        };
        if !names.contains(name) || inboxes.contains(name) {
            continue;
        }
        let mut created = Vec::new();
        for (id, _) in home.root_dir().list_dir(&home.session_index(name))? {
            if crate::names::is_waitpoint_id(&id)
                && let Some(wp) = engine.load(&id)?
            {
                created.push(wp.created_at);
            }
        }
        if engine.listed_as_deleted(name, created)? {
            names.remove(name);
        }
    }
    Ok((names, inboxes, true))
}

/// Whether one of the index's markers for `name` is a waitpoint still kept (only asked of a
/// name with nothing to show, so a stale name costs a few reads).
fn names_a_kept_waitpoint(engine: &Engine, name: &str) -> Result<bool> {
    for (id, _) in engine
        .home()
        .root_dir()
        .list_dir(&engine.home().session_index(name))?
    {
        if crate::names::is_waitpoint_id(&id) && engine.load(&id)?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// One waitpoint's picture: `show --json` with its newest [`MAX_SIGNALS_SHOWN`] signals and
/// the badges of its row (refusals included), and how many older signals it leaves out.
fn picture(engine: &Engine, id: &str) -> Result<Value> {
    let wp = engine
        .load(id)?
        .ok_or_else(|| crate::error::Error::NotFound {
            what: "waitpoint",
            id: id.to_owned(),
            scoped: false,
        })?;
    let first = wp
        .counters
        .signals
        .saturating_sub(MAX_SIGNALS_SHOWN - 1)
        .max(1);
    let signals = engine.read_signals(&wp.id, first)?;
    let mut rows = agent_view::check_rows(engine, std::slice::from_ref(&wp))?;
    agent_view::add_refusals(&mut rows, &agent_view::refused_counts(engine.home())?);
    let badges = rows.pop().map(|r| r.badges).unwrap_or_default();
    let mut v = operator_view::show_json(&wp, &signals, &badges);
    v["signals_not_shown"] = json!(first - 1);
    Ok(v)
}
