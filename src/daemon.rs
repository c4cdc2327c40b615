//! The daemon: one loop that owns every state transition while it runs.
//!
//! Inputs arrive as [`Event`]s on one channel: hints from the filesystem watcher (inotify via
//! `notify`), signals from the optional HTTP shim (`ingress::http`), and requests from whoever
//! holds the [`DaemonControl`] (shutdown, a nudge to re-check the clock). Timers are the loop's own: the periodic sweep of the drop zone, which is
//! the source of truth (inotify is only a hint and may overflow), and a deadline queue, so a
//! deadline fires on time without scanning every waitpoint.
//!
//! Devices (`ingress::device`) run one collector thread each; they only copy files into local
//! mirrors and report [`Event::Device`], and the loop applies the mirrored files like drop-zone
//! files.
//!
//! The entry point takes its inputs — home, settings, clock — so tests can run a daemon
//! in-process on a temp home with a manual clock. The process's signals are the CLI's business:
//! it turns SIGTERM/SIGINT into [`DaemonControl::shutdown`] and SIGHUP into
//! [`DaemonControl::reload`] with freshly resolved settings.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use notify::{EventKind, RecursiveMode, Watcher};

use crate::clock::{Clock, Timestamp};
use crate::delivery::{self, hook, hook::HookRun};
use crate::engine::{self, Engine, HookJob, Verdict};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ingress::Source;
use crate::ingress::device::{self, DeviceEvent, Fleet, SshOptions};
use crate::ingress::http::{self, HttpConfig, Shim, Submission};
use crate::ingress::spool::{FileOutcome, SETTLE_MS, Spool, is_candidate};
use crate::journal;
use crate::settings::{DAY_MS, Settings};
use crate::store::{self, FileLock};

/// Everything the engine loop reacts to.
#[derive(Debug)]
pub enum Event {
    /// A file in the drop zone may be ready (a hint; the file may be gone already).
    SpoolFile(String),
    /// A new waitpoint directory appeared; its deadline joins the queue.
    WaitpointAppeared(String),
    /// A timer was created or changed (e.g. cancelled by the CLI); its due time is re-read.
    TimerChanged(String),
    /// The watcher lost events (queue overflow) or failed: sweep everything.
    Rescan,
    /// An `onWake` hook attempt finished.
    HookDone {
        /// The wake's owner: a waitpoint, timer or callback id.
        owner: String,
        wake_id: String,
        result: std::result::Result<(), String>,
    },
    /// A signal that came in over the HTTP shim. The loop applies it like a spool file and
    /// sends the verdict back once it is durable; the shim answers only then.
    HttpSignal(Submission),
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
    /// Refused drop-zone files waiting to be parked, a few each turn of the loop (see
    /// [`Daemon::park_some`]), and their names, which sweeps leave alone meanwhile.
    to_park: std::collections::VecDeque<crate::ingress::spool::QueuedPark>,
    parking: HashSet<String>,
    /// Barriers to answer once this turn of the loop has run what is due.
    barriers: Vec<Sender<()>>,
    hooks: Option<HookRunner>,
    next_gc: Timestamp,
    /// When to walk the engine's directories for stale temp files (see `gc_engine_temps`).
    next_temp_walk: Timestamp,
    clock: Arc<dyn Clock>,
    stop: Arc<AtomicBool>,
    progress: Option<Box<dyn DrainProgress>>,
    devices: Fleet,
    /// The shim's listener, bound in `new` so a port in use fails the start.
    http: Option<http::Bound>,
    lock: FileLock,
}

/// When each waitpoint next needs the engine: one entry per waitpoint, earliest first. This is
/// what keeps idle cost independent of how many waitpoints are armed: nothing is scanned, the
/// loop sleeps until the first entry.
#[derive(Debug, Default)]
struct DueQueue {
    by_time: BTreeSet<(Timestamp, String)>,
    at: HashMap<String, Timestamp>,
}

impl DueQueue {
    fn set(&mut self, id: &str, when: Option<Timestamp>) {
        if let Some(old) = self.at.remove(id) {
            self.by_time.remove(&(old, id.to_owned()));
        }
        if let Some(t) = when {
            self.by_time.insert((t, id.to_owned()));
            self.at.insert(id.to_owned(), t);
        }
    }

    fn first(&self) -> Option<Timestamp> {
        self.by_time.first().map(|(t, _)| *t)
    }

    fn pop_due(&mut self, now: Timestamp) -> Option<String> {
        let (t, _) = self.by_time.first()?;
        if *t > now {
            return None;
        }
        let (_, id) = self.by_time.pop_first()?;
        self.at.remove(&id);
        Some(id)
    }

    fn len(&self) -> usize {
        self.at.len()
    }

    fn clear(&mut self) {
        self.by_time.clear();
        self.at.clear();
    }
}

/// Runs `onWake` hooks on a worker thread, so a slow hook never stalls the engine loop, and
/// reports each attempt back to the loop as [`Event::HookDone`].
struct HookRunner {
    jobs: Sender<(HookJob, HookRun)>,
    in_flight: HashSet<String>,
}

impl HookRunner {
    fn start(events: Sender<Event>) -> Self {
        let (jobs, rx) = mpsc::channel::<(HookJob, HookRun)>();
        std::thread::Builder::new()
            .name("on-wake".into())
            .spawn(move || {
                for (job, run) in rx {
                    let result = hook::run(&run);
                    let _ = events.send(Event::HookDone {
                        owner: job.owner,
                        wake_id: job.wake_id,
                        result,
                    });
                }
            })
            .expect("spawn the hook thread");
        HookRunner {
            jobs,
            in_flight: HashSet::new(),
        }
    }
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

impl Daemon {
    /// Takes the home's daemon lock (a second daemon gets [`Error::Locked`]).
    pub fn new(config: DaemonConfig, clock: Arc<dyn Clock>) -> Result<(Daemon, DaemonControl)> {
        config.home.ensure()?;
        config.home.check_private()?;
        // A clean stop empties the lock file: a pid left in it means the last daemon died, and
        // only a death (of the daemon or of a command) mid-commit leaves temp files behind.
        let died = std::fs::read_to_string(config.home.daemon_lock())
            .is_ok_and(|pid| !pid.trim().is_empty());
        let lock = FileLock::try_acquire_writing_pid(&config.home.daemon_lock())?;
        let http = config.http.map(|c| c.bind()).transpose()?;
        let (tx, rx) = mpsc::channel();
        let spool = Spool::new(&config.home).with_queued_parking();
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
        let engine = Engine::new(config.home, config.settings, Arc::clone(&clock));
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
                to_park: Default::default(),
                parking: HashSet::new(),
                barriers: Vec::new(),
                hooks,
                next_gc,
                next_temp_walk,
                clock,
                stop,
                progress: None,
                devices,
                http,
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
                    "no file watcher ({e}); finding signals by the sweep alone, every {} ms",
                    self.engine.settings().sweep_ms
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
        // not all written. Dropped at the end of `run`, the checkpointer empties the journal.
        let (journal, _replayed) = self.engine.replay_journal()?;
        let _checkpointer = journal::Checkpointer::start(journal);
        // From here on, what the engine frees goes to the trash, emptied as it fills.
        let _reaper = crate::store::Reaper::start(self.engine.open_trash()?);
        self.rescan_waitpoints();
        let drained = self.drain_backlog() + self.sweep_devices();
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
                Ok(event) => self.handle(event),
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
                self.sweep_spool();
                self.sweep_devices();
                self.devices.reconcile();
                self.ensure_index();
                self.gc();
                next_sweep = Some(Instant::now() + Duration::from_millis(sweep));
            }
            self.retry_deferred();
            self.run_due();
            if idle {
                self.park_some();
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
        let home = self.engine.home().clone();
        self.engine =
            Engine::new(home, settings, Arc::clone(&self.clock)).with_journal_of(&self.engine);
    }

    /// The first sweep at start: like any sweep, plus progress and summary lines when the
    /// backlog is large. Returns how many files were handled.
    fn drain_backlog(&mut self) -> usize {
        let names = self.pending_names();
        let total = names.len();
        if total < BACKLOG_REPORT_MIN {
            return self.collect_all(&names);
        }
        tracing::info!(total, "draining a backlog of {total} signal files");
        let started = Instant::now();
        let mut progress = self.progress.take();
        if let Some(p) = progress.as_mut() {
            p.start(total);
        }
        let mut done = 0;
        for chunk in names.chunks(engine::MAX_BATCH) {
            if self.stopping() {
                break;
            }
            let before = done;
            self.collect_batch(chunk);
            done += chunk.len();
            if let Some(p) = progress.as_mut() {
                p.advance(done);
            }
            if done / BACKLOG_LOG_EVERY > before / BACKLOG_LOG_EVERY && done < total {
                tracing::info!(done, total, "drained {done} of {total} backlog files");
            }
        }
        if let Some(p) = progress.as_mut() {
            p.finish();
        }
        self.progress = progress;
        let ms = started.elapsed().as_millis() as u64;
        if done < total {
            tracing::info!(
                done,
                total,
                ms,
                "stopping: drained {done} of {total} backlog files; the rest stay spooled"
            );
        } else {
            tracing::info!(done, total, ms, "backlog drained: {total} files in {ms} ms");
        }
        done
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::SpoolFile(name) => self.collect_hinted(name),
            Event::WaitpointAppeared(id) => match self.engine.load(&id) {
                Ok(Some(wp)) => self.due.set(&wp.id, engine::next_due(&wp)),
                Ok(None) => {}
                Err(e) => tracing::error!(waitpoint = %id, "cannot read new waitpoint: {e}"),
            },
            Event::TimerChanged(id) => self.reschedule_timer(&id),
            Event::HookDone {
                owner: waitpoint,
                wake_id,
                result,
            } => {
                if let Some(h) = &mut self.hooks {
                    h.in_flight.remove(&wake_id);
                }
                match self
                    .engine
                    .record_hook_attempt(&waitpoint, &wake_id, result)
                {
                    Ok(next) => self.due.set(&waitpoint, next),
                    Err(e) => {
                        tracing::error!(waitpoint = %waitpoint, wake = %wake_id, "cannot record hook attempt: {e}");
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
            Event::Device(e) => self.on_device(e),
            Event::HttpSignal(Submission::Signal {
                request,
                key,
                reply,
            }) => self.apply_http(request, key, reply),
            Event::HttpSignal(Submission::Callback {
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
                let _ = reply.send(outcome);
            }
            Event::HttpSignal(Submission::Control { request, reply }) => {
                let outcome = crate::ingress::control::run(&self.engine, request);
                if let Some(id) = outcome
                    .as_ref()
                    .ok()
                    .and_then(crate::ingress::control::changed_timer)
                {
                    let id = id.to_owned();
                    self.reschedule_timer(&id);
                }
                let _ = reply.send(outcome);
            }
            Event::Barrier(ack) => self.barriers.push(ack),
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
        if !self.to_park.is_empty() {
            // Refusals are waiting to be parked: look for events, then park some more.
            return Duration::ZERO;
        }
        let now = Instant::now();
        let mut wait = MAX_IDLE;
        if let Some(at) = next_sweep {
            wait = wait.min(at.saturating_duration_since(now));
        }
        if let Some(at) = self.due.first() {
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
        crate::failpoint!(
            crate::failpoint::WATCHER,
            "cannot start the file watcher on",
            &drop_zone
        );
        let waitpoints = self.engine.home().waitpoints_dir();
        let devices = self.engine.home().devices_dir();
        let timers = self.engine.home().timers_dir();
        let (dz, wd, dd, td) = (
            drop_zone.clone(),
            waitpoints.clone(),
            devices.clone(),
            timers.clone(),
        );
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
                } else if parent == td
                    && let Some(id) = name.strip_suffix(".json")
                    && engine::timers::is_timer_id(id)
                {
                    let _ = tx.send(Event::TimerChanged(id.to_owned()));
                } else if let Some(hint) = device::hint_for(path, &dd) {
                    let _ = tx.send(Event::Device(hint));
                }
            }
        })
        .map_err(|e| Error::io("cannot start the file watcher on", &drop_zone, to_io(e)))?;
        crate::store::create_dir_private(&timers)?;
        for dir in [&drop_zone, &waitpoints, &timers] {
            watcher
                .watch(dir, RecursiveMode::NonRecursive)
                .map_err(|e| Error::io("cannot watch", dir, to_io(e)))?;
        }
        // Recursive, so each device's mirror is watched from the moment its directory appears.
        watcher
            .watch(&devices, RecursiveMode::Recursive)
            .map_err(|e| Error::io("cannot watch", &devices, to_io(e)))?;
        Ok(watcher)
    }

    fn collect(&mut self, name: &str) {
        self.collect_batch(&[name.to_owned()]);
    }

    /// Collects the hinted file together with every other file already hinted (up to a
    /// batch), so a burst of signals shares its fsyncs. Other events met on the way go back on
    /// the channel in their order; a shutdown needs nothing, its flag is already set.
    fn collect_hinted(&mut self, first: String) {
        let mut names = vec![first];
        self.gather(|event, n| match event {
            Event::SpoolFile(name) => {
                if !names.contains(&name) {
                    names.push(name);
                }
                *n = names.len();
                None
            }
            other => Some(other),
        });
        self.collect_batch(&names);
    }

    /// Takes the events already waiting on the channel, offering each to `take`, which keeps
    /// it (returns `None`, setting the count it now holds) or hands it back. Stops at an empty
    /// channel, a shutdown (its flag is already set) or a full batch; the events handed back
    /// go back on the channel in their order.
    fn gather(&mut self, mut take: impl FnMut(Event, &mut usize) -> Option<Event>) {
        let mut held = 1;
        let mut others = Vec::new();
        while held < engine::MAX_BATCH {
            match self.rx.try_recv() {
                Ok(Event::Shutdown) | Err(_) => break,
                Ok(event) => others.extend(take(event, &mut held)),
            }
        }
        for event in others {
            let _ = self.tx.send(event);
        }
    }

    /// Applies an HTTP signal together with every other one already waiting on the channel
    /// (up to a batch), so concurrent clients share one journal commit; each answer is sent
    /// once the batch is durable. Other events go back on the channel in their order.
    fn apply_http(
        &mut self,
        request: crate::ingress::SignalRequest,
        key: String,
        reply: mpsc::Sender<Result<Verdict>>,
    ) {
        let mut items = vec![(request, Source::Http(key))];
        let mut replies = vec![reply];
        self.gather(|event, n| match event {
            Event::HttpSignal(Submission::Signal {
                request,
                key,
                reply,
            }) => {
                items.push((request, Source::Http(key)));
                replies.push(reply);
                *n = items.len();
                None
            }
            other => Some(other),
        });
        for (verdict, reply) in self.engine.apply_batch(&items).into_iter().zip(replies) {
            if let Ok(v) = &verdict {
                self.after_verdict(v);
            }
            let _ = reply.send(verdict);
        }
    }

    /// Collects `names` (at most a batch) as one group commit.
    fn collect_batch(&mut self, names: &[String]) {
        let names: Vec<String> = names
            .iter()
            .filter(|n| !self.parking.contains(*n))
            .cloned()
            .collect();
        for (name, outcome) in self.spool.collect_batch(&self.engine, &names) {
            self.after_collect(&name, outcome);
        }
        for q in self.spool.take_queued() {
            if self.parking.insert(q.name.clone()) {
                self.to_park.push_back(q);
            }
        }
    }

    /// Parks a few queued refusals: each costs several fsyncs, and done on the spot a flood of
    /// them made accepted signals wait behind it. The loop calls this only when no event is
    /// waiting, a few at a time, so a signal that arrives meanwhile goes ahead of the flood.
    fn park_some(&mut self) {
        for _ in 0..PARK_PER_TURN {
            let Some(q) = self.to_park.pop_front() else {
                return;
            };
            if let Err(e) = self.spool.park_queued(&q) {
                tracing::error!(file = ?q.name, "cannot park refused signal file (kept for the next sweep): {e}");
            }
            self.parking.remove(&q.name);
        }
    }

    fn after_collect(&mut self, name: &str, outcome: Result<FileOutcome>) {
        match outcome {
            Ok(FileOutcome::Consumed(verdict)) => self.after_verdict(&verdict),
            Ok(FileOutcome::Triggered(callback)) => self.after_trigger(&callback),
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

    /// Collects every pending file in the drop zone; returns how many were handled.
    fn sweep_spool(&mut self) -> usize {
        let names = self.pending_names();
        self.collect_all(&names)
    }

    fn pending_names(&self) -> Vec<String> {
        self.spool.pending().unwrap_or_else(|e| {
            tracing::error!("cannot list the drop zone: {e}");
            Vec::new()
        })
    }

    /// Collects `names` in order, a batch at a time, stopping early (between batches) on
    /// shutdown.
    fn collect_all(&mut self, names: &[String]) -> usize {
        let mut done = 0;
        for chunk in names.chunks(engine::MAX_BATCH) {
            if self.stopping() {
                break;
            }
            self.collect_batch(chunk);
            done += chunk.len();
            // A long sweep (a backlog, a flood of junk) lets what arrived meanwhile go first.
            self.serve_waiting_events();
        }
        done
    }

    /// Handles the signals that arrived while a sweep was going (hinted files, HTTP requests),
    /// at most a batch of events; anything that would start a sweep of its own, or stop or
    /// reconfigure the loop, goes back on the channel for the loop.
    fn serve_waiting_events(&mut self) {
        let mut later = Vec::new();
        for _ in 0..engine::MAX_BATCH {
            match self.rx.try_recv() {
                Ok(e @ (Event::SpoolFile(_) | Event::HttpSignal(_))) => self.handle(e),
                Ok(Event::Shutdown) => {
                    later.push(Event::Shutdown);
                    break;
                }
                Ok(other) => later.push(other),
                Err(_) => break,
            }
        }
        for event in later {
            let _ = self.tx.send(event);
        }
    }

    fn on_device(&mut self, event: DeviceEvent) {
        match event {
            DeviceEvent::Landed { device, files } => {
                for file in files {
                    self.collect_mirrored(&device, &file);
                }
            }
            DeviceEvent::File { device, file } => self.collect_mirrored(&device, &file),
            DeviceEvent::Record(_) => self.devices.reconcile(),
            DeviceEvent::Poll(name) => self.devices.poll(&name),
        }
    }

    /// Every route's accepted signal ends here: its waitpoint's next due time joins the queue
    /// (a grace window, a hook delivery), so no ingress path can skip the wake rules.
    fn after_verdict(&mut self, verdict: &Verdict) {
        // A duplicate or late file can still have changed the state (the engine replays
        // records a crash left unapplied before it answers), so every verdict that names a
        // waitpoint carries its next due time.
        let (id, next_due) = match verdict {
            Verdict::Accepted { id, next_due, .. }
            | Verdict::Duplicate { id, next_due }
            | Verdict::Closed { id, next_due, .. } => (id, *next_due),
            Verdict::Refused(_) => return,
        };
        self.due.set(id, next_due);
        // Anything due right now (a wake for the hook) is handled on this same turn.
        if next_due.is_some_and(|t| t <= self.engine.now()) {
            self.run_due();
        }
    }

    /// A triggered callback's wake may have an `onWake` delivery to start.
    fn after_trigger(&mut self, callback: &str) {
        if self.hooks.is_some() {
            self.due.set(callback, Some(self.engine.now()));
            self.run_due();
        }
    }

    /// Applies one file from a device's mirror; on error it stays there for the next sweep.
    fn collect_mirrored(&mut self, device: &str, file: &str) {
        let spool = device::mirror(self.engine.home(), device);
        match spool.collect(&self.engine, file) {
            Ok(FileOutcome::Consumed(verdict)) => self.after_verdict(&verdict),
            Ok(FileOutcome::Triggered(callback)) => self.after_trigger(&callback),
            Ok(_) => {}
            Err(e) => tracing::error!(
                device,
                file,
                "cannot collect mirrored signal file (kept for retry): {e}"
            ),
        }
    }

    /// Collects every file waiting in any device mirror (also of devices since removed: those
    /// files were already taken off the device). Returns how many there were.
    fn sweep_devices(&mut self) -> usize {
        let home = self.engine.home().clone();
        let mut n = 0;
        for name in device::mirrored_devices(&home) {
            let names = match device::mirror(&home, &name).pending() {
                Ok(names) => names,
                Err(e) => {
                    tracing::error!(device = %name, "cannot list the device mirror: {e}");
                    continue;
                }
            };
            n += names.len();
            for file in names {
                self.collect_mirrored(&name, &file);
            }
        }
        n
    }

    /// Rebuilds the due queue from disk. On start this also finishes whatever a restart
    /// interrupted: each waitpoint is serviced once, so missed deadlines fire once, not once per
    /// missed sweep, and interrupted deliveries complete.
    /// The scan streams (one waitpoint in memory at a time), so memory grows with the due
    /// queue, not with the size of every waitpoint.
    fn rescan_waitpoints(&mut self) {
        self.due.clear();
        let now = self.engine.now();
        let due = &mut self.due;
        let scanned = self.engine.for_each_waitpoint(|wp| {
            let at = engine::next_due(&wp);
            // Finish interrupted deliveries at once; everything else waits its turn in the queue.
            let at = if wp.outbox.is_empty() { at } else { Some(now) };
            due.set(&wp.id, at);
            Ok(())
        });
        if let Err(e) = scanned {
            tracing::error!("cannot scan waitpoints: {e}");
        }
        match self.engine.all_timers() {
            Ok(timers) => {
                for t in timers {
                    let due = engine::timers::timer_next_due(&t, Timestamp::from_millis(i64::MIN));
                    self.due.set(&t.id, due);
                }
            }
            Err(e) => tracing::error!("cannot scan timers: {e}"),
        }
        match self.engine.list_callbacks(None) {
            Ok(cbs) => {
                for cb in cbs
                    .iter()
                    .filter(|c| c.hook_deliveries.iter().any(|h| h.is_pending()))
                {
                    self.due.set(&cb.id, Some(now));
                }
            }
            Err(e) => tracing::error!("cannot scan callbacks: {e}"),
        }
    }

    /// Builds the session index when the home has none yet (made before it existed).
    fn ensure_index(&self) {
        if self.engine.index_is_complete() {
            return;
        }
        let started = Instant::now();
        match self.engine.rebuild_index() {
            Ok(added) => tracing::info!(
                added,
                ms = started.elapsed().as_millis() as u64,
                "session index rebuilt"
            ),
            Err(e) => tracing::error!(
                "cannot rebuild the session index (readers scan instead; will retry at the next sweep): {e}"
            ),
        }
    }

    /// A timer file changed: read that one timer (not the whole directory) and requeue it.
    fn reschedule_timer(&mut self, id: &str) {
        match self.engine.load_timer(id) {
            Ok(t) => {
                let due = t.and_then(|t| {
                    engine::timers::timer_next_due(&t, Timestamp::from_millis(i64::MIN))
                });
                self.due.set(id, due);
            }
            Err(e) => tracing::error!(timer = %id, "cannot read timer: {e}"),
        }
    }

    /// Services every waitpoint whose time has come.
    fn run_due(&mut self) {
        let now = self.engine.now();
        // Take everything due first and service each once: an entry that comes back due again
        // waits for the next turn of the loop instead of spinning here.
        let mut ids = Vec::new();
        while let Some(id) = self.due.pop_due(now) {
            ids.push(id);
        }
        for id in ids {
            // One queue for every kind of owner.
            let serviced = match crate::request::Owner::of(&id) {
                Some(crate::request::Owner::Timer(t)) => self.engine.service_timer(&t),
                Some(crate::request::Owner::Callback(c)) => self.engine.service_callback(&c),
                _ => self.engine.service(&id),
            };
            match serviced {
                Ok(service) => {
                    self.due.set(&id, service.next_due);
                    for job in service.hooks_due {
                        self.start_hook(job);
                    }
                }
                Err(e) => {
                    tracing::error!(waitpoint = %id, "cannot service waitpoint (will retry): {e}");
                    self.due.set(&id, Some(now.plus_ms(1000)));
                }
            }
        }
    }

    fn start_hook(&mut self, job: HookJob) {
        let Some(runner) = &mut self.hooks else {
            return;
        };
        if runner.in_flight.contains(&job.wake_id) {
            return;
        }
        let settings = self.engine.settings();
        let Some(argv) = settings.on_wake.clone() else {
            return;
        };
        let home = self.engine.home();
        let stdin = match delivery::read_delivered(home, &job.channel, &job.wake_id) {
            Ok(Some(b)) => b,
            Ok(None) => {
                tracing::warn!(owner = %job.owner, wake = %job.wake_id, "wake no longer in the inbox; not running the hook for it");
                let _ = self.tx.send(Event::HookDone {
                    owner: job.owner,
                    wake_id: job.wake_id,
                    result: Ok(()),
                });
                return;
            }
            Err(e) => {
                tracing::error!(owner = %job.owner, "cannot read wake for the hook: {e}");
                return;
            }
        };
        let wake_file = home
            .inbox_new(&job.channel)
            .join(format!("{}.json", job.wake_id));
        let env = vec![
            ("WAITPOINT_ID".to_owned(), job.owner.clone()),
            ("WAITPOINT_WAKE_ID".to_owned(), job.wake_id.clone()),
            ("WAITPOINT_CHANNEL".to_owned(), job.channel.clone()),
            ("WAITPOINT_ATTEMPT".to_owned(), job.attempt.to_string()),
            (
                "WAITPOINT_HOME".to_owned(),
                home.root().display().to_string(),
            ),
            (
                "WAITPOINT_WAKE_FILE".to_owned(),
                wake_file.display().to_string(),
            ),
        ];
        let run = HookRun {
            argv,
            stdin,
            env,
            timeout: Duration::from_millis(settings.on_wake_timeout_ms),
        };
        runner.in_flight.insert(job.wake_id.clone());
        if runner.jobs.send((job, run)).is_err() {
            tracing::error!("the hook thread is gone; hooks will not run");
        }
    }

    fn gc_read_wakes(&mut self) {
        match self.engine.gc_read_wakes() {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "removed read wakes older than the TTL"),
            Err(e) => tracing::error!("cannot clean read wakes: {e}"),
        }
        self.next_gc = self.engine.now().plus_ms(GC_EVERY_MS);
    }

    /// The drop zone's abandoned temp files, at every sweep (the sweep lists it anyway).
    fn gc(&mut self) {
        if let Err(e) = self
            .spool
            .remove_stale_temps(self.engine.now(), STALE_TEMP_MS)
        {
            tracing::error!("cannot clean stale temp files: {e}");
        }
    }

    /// A commit killed mid-way leaves its temp file beside the target; nothing else ever
    /// writes one, so a day-old temp under the engine's directories is such a leftover. Walking
    /// them costs in proportion to every file of every waitpoint (seconds of CPU at 100,000
    /// armed), so it runs at start only after a daemon died, and otherwise once a day.
    fn gc_engine_temps(&mut self) {
        let home = self.engine.home();
        for dir in [home.waitpoints_dir(), home.sessions_dir()] {
            if let Err(e) = store::remove_stale_temps(&dir, self.engine.now(), STALE_TEMP_MS) {
                tracing::error!("cannot clean stale temp files: {e}");
            }
        }
        self.next_temp_walk = self.engine.now().plus_ms(TEMP_WALK_EVERY_MS);
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
