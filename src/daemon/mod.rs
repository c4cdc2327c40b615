//! The daemon: one loop that owns every state transition while it runs. This file is the
//! loop and its router; each job it routes to has its own file: `collect` (drop zone, device
//! mirrors, HTTP), `schedule` (the due queue), `hooks` (the `onWake` runner), `watch` (the
//! filesystem watch), `janitor` (clean-up), `retry` (the prompt retry of what a failed
//! commit kept back) and `ui` (the operator page's view and cancel).
//!
//! Inputs arrive as [`Event`]s on one channel: hints from the filesystem watcher (inotify via
//! `notify`), signals from the optional HTTP shim (`ingress::http`), and requests from whoever
//! holds the [`DaemonControl`] (shutdown, a nudge to re-check the clock). Timers are the loop's
//! own: the periodic sweep of the drop zone, which is the source of truth (inotify is only a hint
//! and may overflow), and a deadline queue, so a deadline fires on time without scanning every
//! waitpoint.
//!
//! Devices (`ingress::device`) run one collector thread each; they only copy files into local
//! mirrors and report [`Event::Device`], and the loop applies the mirrored files like drop-zone
//! files.
//!
//! The entry point takes its inputs — home, settings, clock — so tests can run a daemon
//! in-process on a temp home with a manual clock. The process's signals are the CLI's business:
//! it turns SIGTERM/SIGINT into [`DaemonControl::shutdown`] and SIGHUP into
//! [`DaemonControl::reload`] with freshly resolved settings.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::{Clock, Timestamp};
use crate::durable::FileLock;
use crate::engine::{self, Engine};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ingress::device::{self, DeviceEvent, Fleet, SshOptions};
use crate::ingress::http::ui::UiRequest;
use crate::ingress::http::{self, HttpConfig, Shim, Submission};
use crate::ingress::spool::Spool;
use crate::settings::{DAY_MS, Settings};

mod collect;
mod devices;
mod hooks;
mod janitor;
mod leading;
mod retry;
mod schedule;
mod ui;
mod watch;

use crate::sync::MutexExt;
pub use collect::{collect_file, collect_files};
use hooks::HookRunner;
use schedule::DueQueue;
pub use ui::{
    MAX_AGE_MS as UI_LIST_MAX_AGE_MS, MAX_ROWS_PER_SESSION as UI_MAX_ROWS_PER_SESSION,
    MAX_ROWS_SHOWN as UI_MAX_ROWS_SHOWN, MAX_SESSIONS_SHOWN as UI_MAX_SESSIONS_SHOWN,
};

/// Everything the engine loop reacts to.
#[derive(Debug)]
pub enum Event {
    /// A file in the drop zone may be ready (a hint; the file may be gone already).
    SpoolFile(String),
    /// A new waitpoint directory appeared; its deadline joins the queue.
    WaitpointAppeared(String),
    /// A timer was created or changed (e.g. cancelled by the CLI); its due time is re-read.
    TimerChanged(String),
    /// A callback changed in a shared store (triggered on another host): its `onWake`
    /// deliveries, if any, are the leader's to start.
    CallbackChanged(String),
    /// The watcher lost events (queue overflow) or failed: sweep everything.
    Rescan,
    /// An `onWake` hook attempt finished.
    HookDone {
        /// The wake's owner: a waitpoint, timer or callback id.
        owner: String,
        wake_id: String,
        /// The session whose run it was; `None` when nothing was run.
        channel: Option<String>,
        result: std::result::Result<(), String>,
    },
    /// A request that came in over the HTTP shim and needs the loop: a signal (applied like a
    /// spool file, its verdict sent back once durable; the shim answers only then), a
    /// callback's trigger, a control request, or the operator page's cancel.
    Http(Submission),
    /// Re-read the clock and run whatever is due (used by tests that move a manual clock).
    Nudge,
    /// Answer on this channel once every earlier event is handled and what is due now has run:
    /// a barrier that tests wait on instead of sleeping (see [`DaemonControl::barrier`]).
    Barrier(Sender<()>),
    /// A device collector or the watcher of `devices/` has news (files landed, a record
    /// changed, a poll was asked for).
    Device(DeviceEvent),
    /// Finish the work in hand and return.
    Shutdown,
    /// Use these settings from now on (the caller re-read them, e.g. on SIGHUP).
    Reload(Settings),
    /// This daemon started (`true`) or stopped leading the shared store's hosts: only the
    /// leader applies signals and runs waitpoints' deadlines (`docs/etcd.md`).
    /// The second field numbers the changes, so a change the start-up scan already followed
    /// needs no second scan.
    Leading(bool, u64),
    /// Another host handed signals over for the leader to apply.
    Forwarded,
    /// Wakes for this host's inboxes wait in the shared store.
    Wakes,
}

impl Event {
    /// Whether handling it may change what the operator page's list shows: everything but
    /// the loop's own bookkeeping and the page's reads.
    fn may_change_the_page(&self) -> bool {
        !matches!(
            self,
            Event::Nudge
                | Event::Barrier(_)
                | Event::Shutdown
                | Event::Http(Submission::Ui {
                    request: UiRequest::View { .. } | UiRequest::Waitpoint { .. },
                    ..
                })
        )
    }
}

/// Told how the startup drain of a backlog advances (the CLI draws a bar on a terminal).
pub trait DrainProgress: Send {
    fn start(&mut self, total: usize);
    fn advance(&mut self, done: usize);
    fn finish(&mut self);
}

/// A startup backlog at least this large is reported as it drains.
pub const BACKLOG_REPORT_MIN: usize = 100;
/// How often (in files) the log gets a summary line while a backlog drains.
const BACKLOG_LOG_EVERY: usize = 500;

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
    stop: Arc<AtomicBool>,
}

impl DaemonControl {
    /// Asks the loop to stop after the batch or event in hand (a sweep in progress stops
    /// between batches; the rest stay spooled for the next start).
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.tx.send(Event::Shutdown);
    }

    /// Replaces the settings the loop runs with.
    pub fn reload(&self, settings: Settings) {
        let _ = self.tx.send(Event::Reload(settings));
    }

    /// Asks the loop to re-read the clock now.
    pub fn nudge(&self) {
        let _ = self.tx.send(Event::Nudge);
    }

    /// Waits until the loop has handled every event sent before this one and run what was
    /// due then; `false` if it did not answer within `limit` (or has stopped).
    pub fn barrier(&self, limit: Duration) -> bool {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Event::Barrier(tx)).is_ok() && rx.recv_timeout(limit).is_ok()
    }
}

/// A daemon that holds its home's lock and is ready to [`run`](Daemon::run).
pub struct Daemon {
    engine: Engine,
    spool: Spool,
    rx: Receiver<Event>,
    tx: Sender<Event>,
    due: DueQueue,
    deferred: Vec<(Instant, String)>,
    /// When to try again what a failed commit kept back (see `retry`).
    retry: retry::Backoff,
    /// Refused drop-zone files waiting to be parked, a few each turn of the loop (see
    /// [`Daemon::park_some`]), and their names, which sweeps leave alone meanwhile.
    to_park: std::collections::VecDeque<crate::ingress::spool::QueuedPark>,
    parking: HashSet<String>,
    /// Barriers to answer once this turn of the loop has run what is due.
    barriers: Vec<Sender<()>>,
    /// How many leadership changes the store has reported, and how many of them the last full
    /// scan of the waitpoints came after.
    lead_changes: Arc<std::sync::atomic::AtomicU64>,
    scanned_after: u64,
    hooks: Option<HookRunner>,
    next_gc: Timestamp,
    /// When to walk the engine's directories for stale temp files (see `gc_engine_temps`).
    next_temp_walk: Timestamp,
    clock: Arc<dyn Clock>,
    stop: Arc<AtomicBool>,
    progress: Option<Box<dyn DrainProgress>>,
    devices: Fleet,
    /// Armed waitpoints with a heartbeat window, by device: who hears of a device's outage.
    silent_devices: HashMap<String, HashSet<String>>,
    /// The shim's listener, bound in `new` so a port in use fails the start.
    http: Option<http::Bound>,
    /// The operator page's list and pictures, built off the loop; told of every change the
    /// loop makes or hears of (`ui.rs`). Started with the shim.
    views: Option<ui::Views>,
    /// The shim's count of signals on their way to the loop (with the shim).
    arriving: Option<http::Arriving>,
    lock: FileLock,
}

/// How the engine looks a device up for the silence wakes: its collector's status and spool.
fn device_lookup(home: Home) -> engine::silence::DeviceLookup {
    Arc::new(move |name| {
        let d = device::load(&home, name).ok().flatten()?;
        let st = device::load_status(&home, name).unwrap_or_default();
        let health = crate::records::DeviceHealth {
            reachable: st.reachable,
            last_success_at: st.last_success_at,
            unreachable_since: (st.reachable == Some(false))
                .then(|| st.last_success_at.unwrap_or(d.added_at)),
            last_error: st.last_error,
        };
        Some((health, d.spool))
    })
}

/// Read wakes are cleaned from `cur/` this often.
const GC_EVERY_MS: i64 = 3_600_000;

/// Stale `*.tmp` files in the drop zone are removed after a day.
const STALE_TEMP_MS: i64 = DAY_MS as i64;
/// How often the engine's directories are walked for stale temp files without a death.
const TEMP_WALK_EVERY_MS: i64 = DAY_MS as i64;
/// The longest the loop sleeps without looking at the clock, so a clock step is noticed.
const MAX_IDLE: Duration = Duration::from_secs(60);
/// Refused files parked per turn of the loop (see [`Daemon::park_some`]).
const PARK_PER_TURN: usize = 32;

/// Raises the soft limit on open descriptors to the hard one. The usual soft limit (1,024) is a
/// default for programs that never asked; the daemon holds the home's handles, the journal,
/// inotify, the files of a batch and, with `--http`, one descriptor per connection (capped from
/// this limit, see [`http::connection_cap`]). Failing to raise it is logged, not fatal: the
/// daemon works within the limit it has.
fn raise_descriptor_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some() && limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => tracing::debug!(
                from = limit.current,
                to = limit.maximum,
                "raised the open-descriptor limit"
            ),
            Err(e) => tracing::warn!(
                soft = limit.current,
                error = %e,
                "cannot raise the open-descriptor limit to the hard one"
            ),
        }
    }
}

impl Daemon {
    /// Takes the home's daemon lock (a second daemon gets [`Error::Locked`]).
    pub fn new(config: DaemonConfig, clock: Arc<dyn Clock>) -> Result<(Daemon, DaemonControl)> {
        raise_descriptor_limit();
        config.home.ensure()?;
        config.home.check_private()?;
        // A clean stop empties the lock file: a pid left in it means the last daemon died, and
        // only a death (of the daemon or of a command) mid-commit leaves temp files behind.
        let home = &config.home;
        // Taken first: a link or a FIFO planted as the lock is set aside as it is opened, so
        // the pid read below is this home's own, and no read waits on a FIFO.
        let lock = FileLock::try_acquire_writing_pid(home.root_dir(), &home.daemon_lock())?;
        let died = lock.previous_pid().is_some();
        let http = config.http.map(|c| c.bind()).transpose()?;
        let (tx, rx) = mpsc::channel();
        let spool = Spool::new(&config.home)
            .with_queued_parking()
            .with_removal_behind();
        let hooks = config
            .settings
            .on_wake
            .is_some()
            .then(|| HookRunner::start(tx.clone()));
        let device_tx = tx.clone();
        let devices = Fleet::new(
            config.home.clone(),
            SshOptions::default(),
            config.settings.sweep_ms,
            Arc::clone(&clock),
            Arc::new(move |e| {
                let _ = device_tx.send(Event::Device(e));
            }),
        );
        let engine = Engine::open(
            config.home.clone(),
            config.settings,
            Arc::clone(&clock),
            crate::store::Role::Daemon,
        )?;
        engine.set_device_lookup(device_lookup(config.home));
        let stop = Arc::new(AtomicBool::new(false));
        let control = DaemonControl {
            tx: tx.clone(),
            stop: Arc::clone(&stop),
        };
        let next_gc = engine.now();
        let next_temp_walk = if died {
            engine.now()
        } else {
            engine.now().plus_ms(TEMP_WALK_EVERY_MS)
        };
        Ok((
            Daemon {
                engine,
                spool,
                rx,
                tx,
                due: DueQueue::default(),
                deferred: Vec::new(),
                retry: retry::Backoff::default(),
                to_park: Default::default(),
                parking: HashSet::new(),
                barriers: Vec::new(),
                lead_changes: Arc::default(),
                scanned_after: 0,
                hooks,
                next_gc,
                next_temp_walk,
                clock,
                stop,
                progress: None,
                devices,
                silent_devices: HashMap::new(),
                http,
                views: None,
                arriving: None,
                lock,
            },
            control,
        ))
    }

    /// Reports the startup drain of a large backlog to `progress` as well as to the log.
    pub fn with_progress(mut self, progress: Box<dyn DrainProgress>) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Sets what device collectors need from the environment (the ssh-agent socket).
    pub fn with_ssh_options(mut self, opts: SshOptions) -> Self {
        self.devices.set_options(opts);
        self
    }

    /// Runs until [`DaemonControl::shutdown`]. Returns an error only if the daemon cannot
    /// start; failures while running are logged and retried.
    pub fn run(mut self) -> Result<()> {
        // inotify is a hint: without it (the user's instances all in use) the sweep finds
        // everything, only later. With the sweep off too, nothing would ever be collected.
        let _watcher = match self.watch() {
            Ok(w) => Some(w),
            Err(e) if self.engine.settings().sweep_ms > 0 => {
                tracing::warn!(
                    sweep_ms = self.engine.settings().sweep_ms,
                    error = %e,
                    "no file watcher; finding signals by the sweep alone"
                );
                None
            }
            Err(e) => {
                return Err(Error::Usage(format!(
                    "{e}; and waitpointSweepMs is 0, so nothing would ever be collected: free an \
                     inotify instance (sysctl fs.inotify.max_user_instances) or turn the sweep on"
                )));
            }
        };
        let home = self.engine.home().clone();
        tracing::info!(home = %home.root().display(), "daemon starting");
        // Before any state is read: a crash may have left committed batches whose files are
        // not all written. Dropped at the end of `run`, the store's background work (on files,
        // the journal's checkpointer) finishes.
        self.engine.recover_store()?;
        let _store_work = self.engine.store().background()?;
        // On a shared store, the election of the one daemon that applies signals; the home's
        // files need none (this daemon holds the home's lock) and lead at once.
        let leading = Mutex::new(self.tx.clone());
        let changes = Arc::clone(&self.lead_changes);
        let _campaign = self.engine.store().lead(Box::new(move |on| {
            let n = changes.fetch_add(1, Ordering::SeqCst) + 1;
            let _ = leading.lock_or_recover().send(Event::Leading(on, n));
        }))?;
        self.deliver_wakes();
        // From here on, what the engine frees goes to the trash, emptied as it fills.
        let _reaper = crate::durable::Reaper::start(self.engine.open_trash()?);
        // What arrived while no daemon ran is collected before any silence is reported: a job
        // that reported during the outage did not go quiet.
        self.engine.hold_silence();
        // A store of one home leads from the start: the scan below follows that, and the
        // event it sent needs no second scan of every waitpoint (seconds at a million).
        self.scanned_after = self.lead_changes.load(Ordering::SeqCst);
        self.rescan_waitpoints();
        let drained = self.drain_backlog() + self.sweep_devices();
        let now = self.engine.now();
        for id in self.engine.release_silence() {
            self.due.set(&id, Some(now));
        }
        // After the drain: readers scan until the index is complete, signals should not wait.
        self.ensure_index();
        self.devices.reconcile();
        // After a death, before "ready": the temp files it left are gone by then.
        if self.engine.now() >= self.next_temp_walk {
            self.gc_engine_temps();
        }
        let shim = self.start_shim()?;
        tracing::info!(
            drained,
            devices = self.devices.names().len(),
            scheduled = self.due.len(),
            "daemon ready"
        );
        self.run_due();
        let mut sweep = self.engine.settings().sweep_ms;
        let mut next_sweep = (sweep > 0).then(|| Instant::now() + Duration::from_millis(sweep));
        loop {
            if self.stopping() {
                break;
            }
            let timeout = self.time_to_next(next_sweep);
            // Set when no event was waiting: only then are refusals parked, so events (new
            // signals above all) always go first.
            let mut idle = false;
            match self.rx.recv_timeout(timeout) {
                Ok(Event::Shutdown) => break,
                Ok(event) => {
                    // Told before and after: a list built while the event is handled is
                    // stale once it is done.
                    let changes = event.may_change_the_page();
                    if changes {
                        self.views_changed();
                    }
                    self.handle(event);
                    if changes {
                        self.views_changed();
                    }
                }
                Err(RecvTimeoutError::Timeout) => idle = true,
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // A reload (wherever it was handled, batching included) may change the interval.
            if self.engine.settings().sweep_ms != sweep {
                sweep = self.engine.settings().sweep_ms;
                next_sweep = (sweep > 0).then(|| Instant::now() + Duration::from_millis(sweep));
            }
            if let Some(at) = next_sweep
                && Instant::now() >= at
            {
                if self.sweep_spool() + self.sweep_devices() > 0 {
                    self.views_changed();
                }
                self.apply_forwarded();
                self.deliver_wakes();
                self.devices.reconcile();
                self.ensure_index();
                self.gc();
                next_sweep = Some(Instant::now() + Duration::from_millis(sweep));
            }
            if self.retry.take_due(Instant::now()) {
                self.retry_kept_back();
            }
            self.retry_deferred();
            self.run_due();
            if idle && !self.to_park.is_empty() {
                self.park_some();
                // A refused signal is a badge on the page.
                self.views_changed();
            }
            if self.engine.now() >= self.next_gc {
                self.gc_read_wakes();
            }
            if self.engine.now() >= self.next_temp_walk {
                self.gc_engine_temps();
            }
            for ack in self.barriers.drain(..) {
                let _ = ack.send(());
            }
        }
        if let Some(shim) = shim {
            shim.stop();
        }
        // A clean stop leaves the lock file empty, so a pid left in it later means a crash.
        self.lock.clear();
        tracing::info!("daemon stopped");
        Ok(())
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Tells the operator page's list that something it may show changed.
    fn views_changed(&self) {
        if let Some(v) = &self.views {
            v.changed();
        }
    }

    /// New settings take effect for everything after this event. The engine is rebuilt with
    /// them; its cache of recorded identities reloads from disk on first use.
    fn reload(&mut self, settings: Settings) {
        if &settings == self.engine.settings() {
            tracing::info!("settings re-read; nothing changed");
            return;
        }
        tracing::info!(
            ttl_ms = settings.ttl_ms,
            sweep_ms = settings.sweep_ms,
            max_wakes_per_hour = settings.max_wakes_per_hour,
            "settings reloaded"
        );
        if settings.on_wake.is_some() && self.hooks.is_none() {
            self.hooks = Some(HookRunner::start(self.tx.clone()));
        }
        if let Some(v) = &self.views {
            v.reload(settings.clone());
        }
        let home = self.engine.home().clone();
        self.engine =
            Engine::new(home, settings, Arc::clone(&self.clock)).with_store_of(&self.engine);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::SpoolFile(name) => self.collect_hinted(name),
            Event::WaitpointAppeared(id) => self.load_appeared(id),
            Event::TimerChanged(id) => self.reschedule_timer(&id),
            Event::HookDone {
                owner: waitpoint,
                wake_id,
                channel,
                result,
            } => {
                if let (Some(h), Some(channel)) = (&mut self.hooks, &channel) {
                    h.finished(channel, &wake_id);
                }
                match self
                    .engine
                    .record_hook_attempt(&waitpoint, &wake_id, result)
                {
                    Ok(next) => self.due.set(&waitpoint, next),
                    Err(e) => {
                        tracing::error!(
                            waitpoint = %waitpoint,
                            wake = %wake_id,
                            error = %e,
                            "cannot record hook attempt",
                        );
                        self.due
                            .set(&waitpoint, Some(self.engine.now().plus_ms(1000)));
                    }
                }
            }
            Event::Rescan => {
                tracing::warn!("watcher asked for a rescan; sweeping everything");
                self.rescan_waitpoints();
                self.sweep_spool();
                self.sweep_devices();
            }
            Event::Reload(settings) => self.reload(settings),
            Event::Leading(on, n) => self.on_leading(on, n),
            Event::Forwarded => self.apply_forwarded(),
            Event::CallbackChanged(id) => self.after_trigger(&id),
            Event::Wakes => self.deliver_wakes(),
            Event::Device(e) => self.on_device(e),
            Event::Http(Submission::Signal {
                request,
                key,
                reply,
            }) => self.apply_http(request, key, reply),
            Event::Http(Submission::Callback {
                request,
                key,
                reply,
            }) => {
                // The request's Idempotency-Key is the trigger's identity: a retry under the
                // same key is a duplicate, not a second wake.
                let key = key.unwrap_or_else(|| format!("gen-{}", crate::secret::random_hex(16)));
                let source = Some(format!("http:{key}"));
                let outcome = self.engine.trigger_callback(
                    &request.token,
                    request.mode,
                    request.text,
                    source,
                );
                if let Ok(engine::callbacks::Trigger::Delivered { id, .. }) = &outcome {
                    self.after_trigger(id);
                }
                reply.send(outcome);
            }
            Event::Http(Submission::Control { request, reply }) => {
                let outcome = crate::ingress::http::control::run(&self.engine, request);
                if let Some(id) = outcome
                    .as_ref()
                    .ok()
                    .and_then(crate::ingress::http::control::changed_timer)
                {
                    let id = id.to_owned();
                    self.reschedule_timer(&id);
                }
                reply.send(outcome);
            }
            Event::Http(Submission::Ui { request, reply }) => match request {
                UiRequest::Cancel { id, session } => {
                    reply.send(ui::cancel(&self.engine, &id, &session));
                }
                // The shim's submit hands reads to the views thread; one that reached the
                // loop anyway goes there too, or is answered as the daemon stopping.
                other => {
                    if let Some(v) = &self.views {
                        v.ask(other, reply);
                    }
                }
            },
            Event::Barrier(ack) => self.barriers.push(ack),
            Event::Nudge | Event::Shutdown => {}
        }
    }

    /// Starts the HTTP shim when configured (publishing its address), and otherwise removes an
    /// address file a daemon that did not stop cleanly left behind.
    fn start_shim(&mut self) -> Result<Option<Shim>> {
        let Some(bound) = self.http.take() else {
            http::remove_stale_address(self.engine.home())?;
            return Ok(None);
        };
        let tx = self.tx.clone();
        let reader = Engine::new(
            self.engine.home().clone(),
            self.engine.settings().clone(),
            Arc::clone(&self.clock),
        )
        .with_store_of(&self.engine);
        let views = ui::Views::start(reader, Arc::clone(&self.clock));
        self.views = Some(views.clone());
        // The page's reads go to its own thread; everything else, its cancel included, to the
        // loop.
        let submit: http::Submit = Box::new(move |s| match s {
            Submission::Ui { request, reply } if !matches!(request, UiRequest::Cancel { .. }) => {
                views.ask(request, reply)
            }
            s => tx.send(Event::Http(s)).is_ok(),
        });
        let shim = Shim::start(bound, self.clock.clone(), submit, self.engine.home())?;
        self.arriving = Some(shim.arriving());
        Ok(Some(shim))
    }
}
