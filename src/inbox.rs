//! Waiting for a session's wakes without polling: a watched inbox ([`Inbox`]) that takes the
//! next wake, the change watches under it ([`wake_on_change`], inotify or, past the kernel's
//! limits, a poller), and the [`Interrupt`] that stops a reader between steps. The CLI's `next`,
//! the MCP server's `wait_next` and the wake adapters' waiters all wait here.

use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher};

use crate::error::{Error, Result};
use crate::home::Home;
use crate::records::Wake;
use crate::sync::MutexExt;

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
                error = %e,
                every_ms = POLL_EVERY.as_millis() as u64,
                "inotify cannot be had; looking at intervals instead"
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
        home.root_dir().create_dir_private(&dir)?;
        home.root_dir()
            .create_dir_private(&home.inbox_cur(channel))?;
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
