//! The daemon: one loop that owns every state transition while it runs.
//!
//! Inputs arrive as [`Event`]s on one channel: hints from the filesystem watcher (inotify via
//! `notify`), signals from the optional HTTP shim (`ingress::http`), and requests from whoever
//! holds the [`DaemonControl`] (shutdown, a nudge to re-check the clock). Timers are the loop's own: the periodic sweep of the drop zone, which is
//! the source of truth (inotify is only a hint and may overflow), and a deadline queue, so a
//! deadline fires on time without scanning every waitpoint.
//!
//! The entry point takes its inputs — home, settings, clock — so tests can run a daemon
//! in-process on a temp home with a manual clock.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use notify::{EventKind, RecursiveMode, Watcher};

use crate::clock::{Clock, Timestamp};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ingress::Source;
use crate::ingress::http::{self, HttpConfig, Shim, Submission};
use crate::ingress::spool::{FileOutcome, SETTLE_MS, Spool, is_candidate};
use crate::model::Status;
use crate::settings::{DAY_MS, Settings};
use crate::store::FileLock;

/// Everything the engine loop reacts to.
#[derive(Debug)]
pub enum Event {
    /// A file in the drop zone may be ready (a hint; the file may be gone already).
    SpoolFile(String),
    /// A new waitpoint directory appeared; its deadline joins the queue.
    WaitpointAppeared(String),
    /// The watcher lost events (queue overflow) or failed: sweep everything.
    Rescan,
    /// A signal that came in over the HTTP shim. The loop applies it like a spool file and
    /// sends the verdict back once it is durable; the shim answers only then.
    HttpSignal(Submission),
    /// Re-read the clock and run whatever is due (used by tests that move a manual clock).
    Nudge,
    /// Finish the work in hand and return.
    Shutdown,
}

/// What the daemon needs to run.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub home: Home,
    pub settings: Settings,
    /// Serve the loopback HTTP shim too (off by default).
    pub http: Option<HttpConfig>,
}

/// A handle to a running (or about to run) daemon.
#[derive(Debug, Clone)]
pub struct DaemonControl {
    tx: Sender<Event>,
}

impl DaemonControl {
    /// Asks the loop to stop after the event in hand.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Event::Shutdown);
    }

    /// Asks the loop to re-read the clock now.
    pub fn nudge(&self) {
        let _ = self.tx.send(Event::Nudge);
    }
}

/// A daemon that holds its home's lock and is ready to [`run`](Daemon::run).
pub struct Daemon {
    engine: Engine,
    spool: Spool,
    rx: Receiver<Event>,
    tx: Sender<Event>,
    deadlines: BTreeSet<(Timestamp, String)>,
    deferred: Vec<(Instant, String)>,
    /// The shim's listener, bound in `new` so a port in use fails the start.
    http: Option<http::Bound>,
    clock: Arc<dyn Clock>,
    _lock: FileLock,
}

/// Stale `*.tmp` files in the drop zone are removed after a day.
const STALE_TEMP_MS: i64 = DAY_MS as i64;
/// The longest the loop sleeps without looking at the clock, so a clock step is noticed.
const MAX_IDLE: Duration = Duration::from_secs(60);

impl Daemon {
    /// Takes the home's daemon lock (a second daemon gets [`Error::Locked`]).
    pub fn new(config: DaemonConfig, clock: Arc<dyn Clock>) -> Result<(Daemon, DaemonControl)> {
        config.home.ensure()?;
        let lock = FileLock::try_acquire_writing_pid(&config.home.daemon_lock())?;
        let http = config.http.map(|c| c.bind()).transpose()?;
        let (tx, rx) = mpsc::channel();
        let spool = Spool::new(config.home.drop_zone());
        let engine = Engine::new(config.home, config.settings, clock.clone());
        let control = DaemonControl { tx: tx.clone() };
        Ok((
            Daemon {
                engine,
                spool,
                rx,
                tx,
                deadlines: BTreeSet::new(),
                deferred: Vec::new(),
                http,
                clock,
                _lock: lock,
            },
            control,
        ))
    }

    /// Runs until [`DaemonControl::shutdown`]. Returns an error only if the daemon cannot
    /// start (the watcher cannot be set up); failures while running are logged and retried.
    pub fn run(mut self) -> Result<()> {
        let _watcher = self.watch()?;
        let home = self.engine.home().clone();
        tracing::info!(home = %home.root().display(), "daemon starting");
        self.rescan_waitpoints();
        let drained = self.sweep_spool();
        let shim = self.start_shim()?;
        tracing::info!(drained, armed = self.deadlines.len(), "daemon ready");
        self.fire_due_deadlines();
        let sweep = self.engine.settings().sweep_ms;
        let mut next_sweep = (sweep > 0).then(|| Instant::now() + Duration::from_millis(sweep));
        loop {
            let timeout = self.time_to_next(next_sweep);
            match self.rx.recv_timeout(timeout) {
                Ok(Event::Shutdown) => break,
                Ok(event) => self.handle(event),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if let Some(at) = next_sweep
                && Instant::now() >= at
            {
                self.sweep_spool();
                self.gc();
                next_sweep = Some(Instant::now() + Duration::from_millis(sweep));
            }
            self.retry_deferred();
            self.fire_due_deadlines();
        }
        if let Some(shim) = shim {
            shim.stop();
        }
        tracing::info!("daemon stopped");
        Ok(())
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::SpoolFile(name) => self.collect(&name),
            Event::WaitpointAppeared(id) => match self.engine.load(&id) {
                Ok(Some(wp)) if wp.status == Status::Armed => {
                    self.deadlines.insert((wp.expires_at, wp.id));
                }
                Ok(_) => {}
                Err(e) => tracing::error!(waitpoint = %id, "cannot read new waitpoint: {e}"),
            },
            Event::Rescan => {
                tracing::warn!("watcher asked for a rescan; sweeping everything");
                self.rescan_waitpoints();
                self.sweep_spool();
            }
            Event::HttpSignal(s) => {
                let verdict = self.engine.apply_signal(&s.request, &Source::Http(s.key));
                let _ = s.reply.send(verdict);
            }
            Event::Nudge | Event::Shutdown => {}
        }
    }

    /// Starts the HTTP shim when configured (publishing its address), and otherwise removes an
    /// address file a daemon that did not stop cleanly left behind.
    fn start_shim(&mut self) -> Result<Option<Shim>> {
        let file = self.engine.home().webhook_address_file();
        let Some(bound) = self.http.take() else {
            http::remove_stale_address(&file)?;
            return Ok(None);
        };
        let tx = self.tx.clone();
        let submit: http::Submit = Box::new(move |s| tx.send(Event::HttpSignal(s)).is_ok());
        Shim::start(bound, self.clock.clone(), submit, file).map(Some)
    }

    fn time_to_next(&self, next_sweep: Option<Instant>) -> Duration {
        let now = Instant::now();
        let mut wait = MAX_IDLE;
        if let Some(at) = next_sweep {
            wait = wait.min(at.saturating_duration_since(now));
        }
        if let Some((at, _)) = self.deadlines.first() {
            let ms = at.millis_since(self.engine.now());
            wait = wait.min(Duration::from_millis(ms as u64));
        }
        if let Some((at, _)) = self.deferred.iter().min_by_key(|(at, _)| *at) {
            wait = wait.min(at.saturating_duration_since(now));
        }
        wait
    }

    /// Sets up the watcher on the drop zone and the waitpoints directory. Its callback only
    /// forwards hints; all work happens on the loop.
    fn watch(&self) -> Result<notify::RecommendedWatcher> {
        let tx = self.tx.clone();
        let drop_zone = self.spool.dir.clone();
        let waitpoints = self.engine.home().waitpoints_dir();
        let (dz, wd) = (drop_zone.clone(), waitpoints.clone());
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let event = match res {
                Ok(e) => e,
                Err(_) => {
                    let _ = tx.send(Event::Rescan);
                    return;
                }
            };
            if event.need_rescan() {
                let _ = tx.send(Event::Rescan);
                return;
            }
            if !is_ready_kind(&event.kind) {
                return;
            }
            for path in &event.paths {
                let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                let parent = path.parent().unwrap_or(Path::new(""));
                if parent == dz && is_candidate(name) {
                    let _ = tx.send(Event::SpoolFile(name.to_owned()));
                } else if parent == wd && crate::ingress::is_waitpoint_id(name) {
                    let _ = tx.send(Event::WaitpointAppeared(name.to_owned()));
                }
            }
        })
        .map_err(|e| Error::io("cannot start the file watcher on", &drop_zone, to_io(e)))?;
        for dir in [&drop_zone, &waitpoints] {
            watcher
                .watch(dir, RecursiveMode::NonRecursive)
                .map_err(|e| Error::io("cannot watch", dir, to_io(e)))?;
        }
        Ok(watcher)
    }

    fn collect(&mut self, name: &str) {
        match self.spool.collect(&self.engine, name) {
            Ok(FileOutcome::Deferred) => {
                let at = Instant::now() + Duration::from_millis(SETTLE_MS as u64 + 100);
                if !self.deferred.iter().any(|(_, n)| n == name) {
                    self.deferred.push((at, name.to_owned()));
                }
            }
            Ok(_) => {}
            // The file stays in the spool; the next sweep tries again.
            Err(e) => {
                tracing::error!(file = ?name, "cannot collect signal file (kept for retry): {e}")
            }
        }
    }

    fn retry_deferred(&mut self) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) =
            self.deferred.drain(..).partition(|(at, _)| *at <= now);
        self.deferred = later;
        for (_, name) in due {
            self.collect(&name);
        }
    }

    /// Collects every pending file in the drop zone; returns how many there were.
    fn sweep_spool(&mut self) -> usize {
        let names = match self.spool.pending() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!("cannot list the drop zone: {e}");
                return 0;
            }
        };
        for name in &names {
            self.collect(name);
        }
        names.len()
    }

    /// Reloads the deadline queue from disk and finishes deliveries a restart interrupted.
    fn rescan_waitpoints(&mut self) {
        let all = match self.engine.list() {
            Ok(all) => all,
            Err(e) => {
                tracing::error!("cannot scan waitpoints: {e}");
                return;
            }
        };
        self.deadlines.clear();
        for wp in all {
            if !wp.outbox.is_empty()
                && let Err(e) = self.engine.redeliver(&wp.id)
            {
                tracing::error!(waitpoint = %wp.id, "cannot re-deliver wake: {e}");
            }
            if wp.status == Status::Armed {
                self.deadlines.insert((wp.expires_at, wp.id));
            }
        }
    }

    /// Expires every waitpoint whose deadline has passed; each fires once, however late.
    fn fire_due_deadlines(&mut self) {
        let now = self.engine.now();
        while let Some((at, id)) = self.deadlines.first().cloned() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            match self.engine.expire_if_due(&id) {
                Ok(true) => tracing::info!(waitpoint = %id, "deadline passed; notice sent"),
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(waitpoint = %id, "cannot expire (will retry): {e}");
                    self.deadlines.insert((now.plus_ms(1000), id));
                    break;
                }
            }
        }
    }

    fn gc(&mut self) {
        if let Err(e) = self
            .spool
            .remove_stale_temps(self.engine.now(), STALE_TEMP_MS)
        {
            tracing::error!("cannot clean stale temp files: {e}");
        }
    }
}

/// Filesystem events after which a drop-zone file is complete: renamed in, or closed after
/// writing. A bare create is not one (the writer may still be writing).
fn is_ready_kind(kind: &EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
    matches!(
        kind,
        EventKind::Modify(ModifyKind::Name(
            RenameMode::To | RenameMode::Both | RenameMode::Any
        )) | EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Create(notify::event::CreateKind::Folder)
    )
}

fn to_io(e: notify::Error) -> std::io::Error {
    match e.kind {
        notify::ErrorKind::Io(io) => io,
        other => std::io::Error::other(format!("{other:?}")),
    }
}
