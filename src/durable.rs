//! Durable files under the home: every file the engine writes, reads, renames or removes is
//! reached through this module, which owns the rules all of them share (modes, temp names, no
//! link followed beneath a home) and hands each job to a file of its own:
//!
//! - `synced.rs`: the synced commit ([`Root::commit`], [`Batch`]): temp file, fsync, rename, fsync
//!   the directory, so a file survives a power cut once the call returns.
//! - `unsynced.rs`: the files a journal entry already made durable ([`Unsynced`]), written
//!   atomically without their own fsync, and a state's spare ([`spare_name`]).
//! - `path.rs`: every operation by path (open, create, list, rename, remove, fsync a
//!   directory), each path's directory reached as `beneath.rs` says.
//! - `dir.rs`: the same operations relative to a directory held open ([`Dir`]).
//! - `beneath.rs`: a home's [`Root`] and how a path under it is reached from it, never
//!   through a link.
//! - `outside.rs`: the few operations on paths outside every home ([`outside`]), named so.
//! - `temp.rs`: temp files: their names and the sweep of those a crash left.
//! - `lock.rs`, `read.rs`, `trash.rs`: the locks that serialise writers, reading records
//!   safely, and the trash that frees replaced files off the caller's thread.
//! - `events.rs`: which filesystem events say a watched file is complete.

use std::io;
use std::path::Path;

use serde::Serialize;

use crate::error::Result;

mod beneath;
mod dir;
mod events;
mod lock;
pub mod outside;
mod path;
mod read;
mod synced;
mod temp;
mod trash;
mod unsynced;

pub use beneath::{Place, Root};
pub use dir::{Dir, Kind, Rewrite};
pub use events::is_ready_kind;
pub use lock::{FileLock, LockHolder};
pub use path::unlink_all;
pub use read::{
    MAX_RECORD_BYTES, NOT_REGULAR, read_json_or_set_aside, read_record_bytes, set_aside,
};
pub use synced::Batch;
pub use temp::{TEMP_PREFIX, TEMP_SUFFIX, is_temp_name};
pub use trash::{HOLD_MAX, INCOMING_QUIET, Reaper, Trash, frees_wait_for_device};
pub use unsynced::{SPARE_REST, Unsynced, spare_name};

/// Mode of every directory the engine creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file the engine creates.
pub const FILE_MODE: u32 = 0o600;

/// A root for a unit test's temp directory, its quarantine inside it.
#[cfg(test)]
pub(crate) fn test_root(dir: &Path) -> Root {
    Root::new(dir, &dir.join("quarantine"))
}

fn not_found() -> io::Error {
    io::Error::from(io::ErrorKind::NotFound)
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The most fsyncs a batch issues at once.
const SYNC_THREADS: usize = 8;

/// An [`Unsynced`] commit of at most this many files is written inline.
const INLINE_UNSYNCED: usize = 4;

fn distinct_parents<'a>(paths: impl Iterator<Item = &'a Path>) -> Vec<&'a Path> {
    let mut dirs: Vec<&Path> = paths.map(parent_of).collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Runs `f` on every item, up to [`SYNC_THREADS`] at a time, and returns the first error.
/// fsyncs issued together wait for the device together, which is the point of a batch; one or
/// two items are done inline, since a thread would cost more than it saves.
fn each_concurrently<T: Sync>(items: &[T], f: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
    if items.len() <= 2 {
        return items.iter().try_for_each(&f);
    }
    let threads = items.len().min(SYNC_THREADS);
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                scope.spawn(move || items.iter().skip(t).step_by(threads).try_for_each(f))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an fsync thread panicked"))
            .collect()
    });
    results.into_iter().collect()
}

/// Pretty JSON with a trailing newline: stable key order (struct order), pleasant for `jq`/`diff`.
pub fn to_pretty_json<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(value).expect("our records always serialise");
    out.push(b'\n');
    out
}
