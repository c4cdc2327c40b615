//! Failpoints at each step of each commit, for the crash-point matrix and the fault-injection
//! tests. Compiled in only with the `failpoints` cargo feature (`cargo test --features
//! failpoints`); without it every [`failpoint!`](crate::failpoint!) expands to nothing, so release
//! builds carry none.
//!
//! The binaries read the `FAILPOINTS` environment variable at start (the `fail` crate's syntax,
//! `name=[cnt*]return(action)` joined by `;`, where `2*off->return(crash)` fires on the third
//! hit). An action is one of:
//!
//! - `crash`: the process SIGKILLs itself on the spot, exactly like a power cut or `kill -9`
//!   (no unwinding, no destructors, no buffered writes flushed);
//! - `eio` / `enospc`: the step fails with that errno, as a failing disk or a full one would;
//! - `emfile`: the step fails as when a per-user or per-process limit is reached (the
//!   [`WATCHER`] and [`SPOOL_OPEN`] points).
//!
//! The points, in the order a signal passes them (see `ARCHITECTURE.md`, "Commit order"): the
//! journal append passes [`JOURNAL_WRITE`] and [`JOURNAL_FSYNC`]; the engine then passes
//! [`ENGINE_AFTER_JOURNAL`] and writes the batch's files, each passing [`STORE_WRITE`] and
//! [`STORE_RENAME`]; the drop zone adds [`SPOOL_BEFORE_REMOVE`]; the checkpointer passes
//! [`JOURNAL_CHECKPOINT`]. Every durable `Root::commit` (creating a waitpoint, a held wake
//! delivered later, timers) passes [`STORE_WRITE`], [`STORE_FSYNC`], [`STORE_RENAME`] and
//! [`STORE_DIR_FSYNC`], and the outbox flush [`ENGINE_AFTER_DELIVERY`].

use std::io;
use std::path::Path;

use crate::error::{Error, Result};

/// `store`: the temp file exists, nothing written to it yet (an error here is a failed
/// `write`).
pub const STORE_WRITE: &str = "store-write";
/// `Root::commit`: the temp file is written, not yet fsynced (an error is a failed `fsync`).
pub const STORE_FSYNC: &str = "store-fsync";
/// `store`: the temp file is written (and fsynced, for a durable commit), not yet renamed over
/// the target.
pub const STORE_RENAME: &str = "store-rename";
/// `Root::commit`: renamed over the target, the directory not yet fsynced.
pub const STORE_DIR_FSYNC: &str = "store-dir-fsync";
/// Journal: the batch's line is not yet written to the active segment.
pub const JOURNAL_WRITE: &str = "journal-write";
/// Journal: the batch's line is written, not yet fdatasynced (an error is a failed `fsync`).
pub const JOURNAL_FSYNC: &str = "journal-fsync";
/// Engine: the batch is durable in the journal, none of its files written yet: what a power cut
/// leaves when none of the unsynced writes survived.
pub const ENGINE_AFTER_JOURNAL: &str = "engine-after-journal";
/// Engine: the outbox is in the inbox, the state not yet replaced with the outbox cleared.
pub const ENGINE_AFTER_DELIVERY: &str = "engine-after-delivery";
/// Drop zone: the signal's effect is durable, the spool file not yet removed.
pub const SPOOL_BEFORE_REMOVE: &str = "spool-before-remove";
/// Checkpoint: the filesystem is synced, the covered segments not yet deleted.
pub const JOURNAL_CHECKPOINT: &str = "journal-checkpoint";

/// Drop zone: a batch is about to open the spool to read its files (`emfile`: the process is
/// out of descriptors). Not a commit step, so not in [`ALL`].
pub const SPOOL_OPEN: &str = "spool-open";

/// The file watcher: an inotify instance cannot be had (`emfile`: the user's instances are all
/// in use). Not a commit step, so not in [`ALL`].
pub const WATCHER: &str = "watcher";

/// A device's collector: the remote spool is listed, nothing claimed yet. For tests that
/// change the remote spool in that window (`sleep(ms)` widens it). Not a commit step, so not
/// in [`ALL`].
pub const DEVICE_AFTER_LIST: &str = "device-after-list";

/// Timers and callbacks: a commit of several documents (a callback reset's revocation and
/// replacement) is durable as one intent file, none of the documents written yet. Not on a
/// signal's path, so not in [`ALL`].
pub const DOCS_AFTER_INTENT: &str = "docs-after-intent";

/// Every point, for tests that walk them all.
pub const ALL: [&str; 10] = [
    STORE_WRITE,
    STORE_FSYNC,
    STORE_RENAME,
    STORE_DIR_FSYNC,
    JOURNAL_WRITE,
    JOURNAL_FSYNC,
    ENGINE_AFTER_JOURNAL,
    ENGINE_AFTER_DELIVERY,
    SPOOL_BEFORE_REMOVE,
    JOURNAL_CHECKPOINT,
];

/// A failpoint: `failpoint!(NAME, "cannot fsync", path)` returns the error a real failure of
/// that step would (`Error::io(context, path, errno)`) from the enclosing function, or kills the
/// process, as `FAILPOINTS` says. Nothing at all without the `failpoints` feature.
#[macro_export]
macro_rules! failpoint {
    ($name:expr, $context:expr, $path:expr) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, |action: Option<String>| {
            $crate::failpoint::act($name, action.as_deref(), $context, $path)
        });
    };
}

/// Carries out a failpoint's action (called by [`failpoint!`]).
pub fn act<T>(name: &str, action: Option<&str>, context: &'static str, path: &Path) -> Result<T> {
    let errno = match action {
        Some("crash") => crash(),
        Some("eio") => rustix::io::Errno::IO.raw_os_error(),
        Some("enospc") => rustix::io::Errno::NOSPC.raw_os_error(),
        Some("emfile") => rustix::io::Errno::MFILE.raw_os_error(),
        other => {
            panic!("failpoint {name}: unknown action {other:?}; use crash, eio, enospc or emfile")
        }
    };
    // A warning, so tests can match each injected fault with the failure the daemon reported.
    tracing::warn!(failpoint = name, path = %path.display(), errno, "failpoint fired");
    Err(Error::io(
        context,
        path,
        io::Error::from_raw_os_error(errno),
    ))
}

fn crash() -> ! {
    // SAFETY: kill(2) on our own pid with SIGKILL; it does not return once delivered.
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    // SIGKILL cannot be caught; this is only reached if kill(2) itself failed.
    std::process::abort()
}
