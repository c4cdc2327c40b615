//! The drop zone (`tmp/signals/`): reading signal files safely, handing them to the engine, and
//! removing or parking them afterwards.
//!
//! A file is read only if it is a regular, single-linked file no bigger than the cap, opened
//! without following symlinks and without blocking on FIFOs, so nothing outside the spool is
//! ever read. Every pass opens the spool afresh beneath the home's root ([`durable::Dir`]), each
//! directory on the way not followed if it is a link, and lists, reads, parks and removes
//! through that handle only: a spool or `bad/` swapped for a link is refused, never followed.
//! Whatever the engine refuses is parked under `bad/` with a `.reason` file; nothing is deleted
//! unparsed. A file leaves the spool only after its effect is durable.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Arc;

use crate::clock::Timestamp;
use crate::durable::{self, Dir, Kind, Root};
use crate::engine::callbacks::Trigger;
use crate::engine::{Engine, Verdict};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ingress::{SpoolBody, parse_spool_body};
use crate::request::{CallbackRequest, MAX_BODY_BYTES, SignalRequest, Source};

mod park;

pub use park::safe_stem;

/// What became of one spool file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOutcome {
    /// Applied (accepted, duplicate or already resolved) and removed from the spool.
    Consumed(Verdict),
    /// A callback trigger, delivered (or a re-collected duplicate) and removed from the spool.
    Triggered(String),
    /// Refused and moved to `bad/`, with the reason.
    Parked(String),
    /// Does not parse yet but was written moments ago, probably by a writer that skipped the
    /// `.tmp`-then-rename step; left in place for the next pass.
    Deferred,
    /// Gone before we got to it (another collector, or an operator).
    Vanished,
}

/// A spool directory and the `bad/` directory where its refused files go.
#[derive(Debug, Clone)]
pub struct Spool {
    /// Where the spool is (for messages and the watcher; it is reached through `root`).
    pub dir: PathBuf,
    pub bad: PathBuf,
    /// The home's root, and the spool's path beneath it: the spool is opened one directory
    /// at a time from the root, none followed if it is a link.
    root: Arc<Root>,
    rel: PathBuf,
    /// For a device's local mirror: the device, which makes identities `device:<name>:<file>`.
    pub device: Option<String>,
    /// When set (the daemon's drop zone), a refused file is not parked on the spot: it is
    /// queued here and parked later by [`Spool::park_queued`], a few at a time, so a flood of
    /// refusals costs accepted signals nothing. The file stays in the spool meanwhile, so a
    /// crash loses no refusal.
    queued: Option<std::cell::RefCell<Vec<QueuedPark>>>,
    /// With removal behind the batch ([`Spool::with_removal_behind`]; the daemon's drop
    /// zone): the consumed files handed to the trash's reaper and perhaps not removed yet. A
    /// batch naming one of them (a sweep that listed it, or its hint met a sweep that collected
    /// it first) waits for the removals instead of reading it again. `None`: removed before
    /// the batch returns.
    handed: Option<std::cell::RefCell<std::collections::HashSet<String>>>,
}

/// A refusal waiting to be parked.
#[derive(Debug, Clone)]
pub struct QueuedPark {
    pub name: String,
    reason: String,
    bytes: Option<Vec<u8>>,
    waitpoint: Option<String>,
    at: Timestamp,
}

/// The most consumed files a spool remembers as handed behind before it waits for the reaper:
/// twice what the reaper holds back while files are still arriving ([`durable::HOLD_MAX`]), so
/// a burst never makes the loop wait for removals the reaper chose to hold.
const HANDED_MAX: usize = 2 * durable::HOLD_MAX;

/// The name of the directory inside a spool where refused files are parked.
const BAD: &str = "bad";

/// A batch of spool files read and parsed, waiting for its verdicts (see
/// [`Spool::read_batch`]).
pub struct Collection {
    /// The spool as opened for this batch; `None` when it could not be (every result is in).
    dz: Option<Dir>,
    names: Vec<String>,
    /// One per name; `None` until the file's verdict settles it.
    results: Vec<Option<Result<FileOutcome>>>,
    /// The files that hold a signal to apply: index into `names`, the request, the bytes read.
    readable: Vec<(usize, SignalRequest, Vec<u8>)>,
    items: Vec<(SignalRequest, Source)>,
}

impl Collection {
    /// The signals to apply, in order, with their sources.
    pub fn items(&self) -> &[(SignalRequest, Source)] {
        &self.items
    }
}

impl Spool {
    /// The home's drop zone (`tmp/signals/`).
    pub fn new(home: &Home) -> Self {
        Self::beneath(home, home.drop_zone())
    }

    fn beneath(home: &Home, dir: PathBuf) -> Self {
        let root = Arc::clone(home.root_dir());
        let rel = dir
            .strip_prefix(root.path())
            .expect("a spool lies beneath its home")
            .to_owned();
        Spool {
            bad: dir.join(BAD),
            dir,
            root,
            rel,
            device: None,
            queued: None,
            handed: None,
        }
    }

    /// Opens the spool for one pass; `None` when it does not exist yet. A spool (or any
    /// directory above it, up to the home's root) that is a link, not a directory or not
    /// ours is refused ([`Error::Insecure`]).
    fn open(&self) -> Result<Option<Dir>> {
        match Dir::open_beneath(&self.root, &self.rel) {
            Err(e) if e.is_not_found() => Ok(None),
            other => other.map(Some),
        }
    }

    /// [`open`](Self::open) for a batch's reads: the descriptor it takes may not be there
    /// (EMFILE), which the fault tests inject here.
    fn open_to_read(&self) -> Result<Option<Dir>> {
        crate::failpoint!(crate::failpoint::SPOOL_OPEN, "cannot open", &self.dir);
        self.open()
    }

    /// Opens the spool, made when missing, for a writer that fills it (a device's collector).
    pub fn open_or_make(&self) -> Result<Dir> {
        Dir::make_beneath(&self.root, &self.rel)
    }

    /// Consumed files are removed behind each batch, by the trash's reaper
    /// ([`durable::Trash::dispose_behind`]), so the next batch need not wait for the
    /// removals: the daemon's drop zone, where they queue for the directory's lock behind the
    /// files arriving. A batch naming one of them waits for them first
    /// ([`durable::Trash::wait_behind`]). Without a running reaper they are removed at once.
    pub fn with_removal_behind(mut self) -> Self {
        self.handed = Some(Default::default());
        self
    }

    /// This spool, with refusals queued for [`Spool::park_queued`] instead of parked at once.
    pub fn with_queued_parking(mut self) -> Self {
        self.queued = Some(std::cell::RefCell::new(Vec::new()));
        self
    }

    /// The local mirror of a device's spool. Only the collector writes there, always through
    /// a commit, so a file in it is complete and an unparseable one is parked at once.
    pub fn for_device(home: &Home, device: &str) -> Self {
        Spool {
            device: Some(device.to_owned()),
            ..Self::beneath(home, home.device_spool(device))
        }
    }

    fn source_of(&self, name: &str) -> Source {
        match &self.device {
            None => Source::Spool(name.to_owned()),
            Some(device) => Source::Device {
                device: device.clone(),
                file: name.to_owned(),
            },
        }
    }

    /// The names of the files waiting to be collected (`*.json`, never temp files), in name
    /// order, which for names that start with the time (`$(date +%s)-…`, the spec's
    /// `$(date +%s%N)-…`) is arrival order.
    pub fn pending(&self) -> Result<Vec<String>> {
        // Swapped for a symlink (or made writable by others) since the start: touch nothing.
        let Some(dz) = self.open()? else {
            return Ok(Vec::new());
        };
        let mut names = Vec::new();
        for raw in dz.raw_names()? {
            let name = match raw.into_string() {
                Ok(name) => name,
                Err(raw) => {
                    // Not UTF-8: park it under a readable name so an operator sees it.
                    self.park_raw(&dz, &raw, "file name is not UTF-8")?;
                    continue;
                }
            };
            if is_candidate(&name) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// The first half of collecting `names`: opens the spool afresh, reads and parses each
    /// file. The signals to apply are in [`Collection::items`]; the daemon applies them
    /// ([`Engine::apply_batch`]) and hands the verdicts to [`settle_batch`](Self::settle_batch).
    pub fn read_batch(&self, engine: &Engine, names: &[String]) -> Collection {
        self.settle_handed(engine, names);
        let mut c = Collection {
            dz: None,
            names: names.to_vec(),
            results: Vec::with_capacity(names.len()),
            readable: Vec::new(),
            items: Vec::new(),
        };
        // The spool must still be the real directory it was: a symlink swapped in would have
        // foreign files read, moved and removed. Every file is kept for a later attempt.
        let dz = match self.open_to_read() {
            Ok(Some(dz)) => dz,
            Ok(None) => {
                c.results = names
                    .iter()
                    .map(|_| Some(Ok(FileOutcome::Vanished)))
                    .collect();
                return c;
            }
            Err(e) => {
                // The same error for every file (`Error` is not `Clone`): a refusal stays a
                // refusal, and an I/O failure (EMFILE when out of descriptors) stays one, so
                // the log says which; either way every file is kept for the next attempt.
                let message = e.to_string();
                let io_kind = match &e {
                    Error::Io { source, .. } => Some(source.kind()),
                    _ => None,
                };
                c.results = names
                    .iter()
                    .map(|_| {
                        Some(Err(match io_kind {
                            Some(kind) => Error::io(
                                "cannot open the spool",
                                self.dir.clone(),
                                io::Error::new(kind, message.clone()),
                            ),
                            None => Error::Insecure {
                                path: self.dir.clone(),
                                message: message.clone(),
                            },
                        }))
                    })
                    .collect();
                return c;
            }
        };
        for (i, name) in names.iter().enumerate() {
            match self.read_request(&dz, engine, name) {
                Ok(Ok((request, bytes))) => {
                    c.items.push((request.clone(), self.source_of(name)));
                    c.readable.push((i, request, bytes));
                    c.results.push(None);
                }
                Ok(Err(outcome)) => c.results.push(Some(Ok(outcome))),
                Err(e) => c.results.push(Some(Err(e))),
            }
        }
        c.dz = Some(dz);
        c
    }

    /// The second half: with one verdict per item of `c` (an `Err` keeps that file), parks or
    /// removes each file, the consumed ones together now that every signal of theirs is
    /// durable. One result per name, in order; an `Err` leaves that file in the spool for the
    /// next attempt.
    pub fn settle_batch(
        &self,
        engine: &Engine,
        c: Collection,
        verdicts: Vec<Result<Verdict>>,
    ) -> Vec<(String, Result<FileOutcome>)> {
        let Collection {
            dz,
            names,
            mut results,
            readable,
            ..
        } = c;
        if let Some(dz) = &dz {
            let mut consumed = Vec::new();
            for ((i, request, bytes), verdict) in readable.iter().zip(verdicts) {
                let name = &names[*i];
                results[*i] = Some(match verdict {
                    Err(e) => Err(e),
                    Ok(v) => match self.settle(dz, engine, name, request, bytes, &v) {
                        Ok(Some(parked)) => Ok(parked),
                        Ok(None) => {
                            consumed.push(*i);
                            Ok(FileOutcome::Consumed(v))
                        }
                        Err(e) => Err(e),
                    },
                });
            }
            let taken: Vec<&str> = consumed.iter().map(|i| names[*i].as_str()).collect();
            if let Err(e) = self.remove_consumed(engine, dz, &taken) {
                // Recorded but maybe not removed: the next attempt finds each a duplicate.
                let message = e.to_string();
                for i in consumed {
                    results[i] = Some(Err(Error::io(
                        "cannot remove",
                        self.dir.join(&names[i]),
                        io::Error::other(message.clone()),
                    )));
                }
            }
        }
        names
            .into_iter()
            .zip(
                results
                    .into_iter()
                    .map(|r| r.expect("every name has a result")),
            )
            .collect()
    }

    /// Removes the batch's consumed files once every signal of theirs is durable (in the
    /// journal). Here and now where freeing a file does not wait for the device: an unlink is
    /// one call in one directory, where a move to the daemon's trash is a rename across two
    /// (the filesystem's rename lock) and a wake of the reaper to unlink it later. Where it
    /// waits (a `discard` mount, [`durable::frees_wait_for_device`]), into the trash, so the batch
    /// does not wait for the device. The removals need no fsync: a file a crash brings back is
    /// found recorded and removed again as a duplicate, and the next checkpoint makes them
    /// durable anyway.
    fn remove_consumed(&self, engine: &Engine, dz: &Dir, names: &[&str]) -> Result<()> {
        #[cfg(feature = "failpoints")]
        if let Some(first) = names.first() {
            crate::failpoint!(
                crate::failpoint::SPOOL_BEFORE_REMOVE,
                "cannot remove",
                &dz.path().join(first)
            );
        }
        match engine.trash() {
            Some(trash) if self.handed.is_some() && !names.is_empty() => {
                let owned: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
                if let Some(handed) = &self.handed {
                    handed.borrow_mut().extend(owned.iter().cloned());
                }
                trash.dispose_behind(dz.try_clone()?, owned)
            }
            Some(trash) => trash.dispose(dz, names),
            None => durable::unlink_all(dz, names),
        }
    }

    /// Forgets the files handed behind once the reaper has removed them all, and waits for it
    /// when `names` (a batch about to be read, hinted or swept) holds one of them, or too many
    /// are remembered (the reaper fell behind).
    fn settle_handed(&self, engine: &Engine, names: &[String]) {
        let Some(handed) = &self.handed else {
            return;
        };
        let mut handed = handed.borrow_mut();
        let Some(trash) = engine.trash().filter(|_| !handed.is_empty()) else {
            return;
        };
        if handed.len() > HANDED_MAX || names.iter().any(|n| handed.contains(n)) {
            trash.wait_behind();
            handed.clear();
        } else if trash.behind_done() {
            handed.clear();
        }
    }

    /// Reads and parses one file. `Ok(Err(outcome))` when it is not a signal to apply (gone,
    /// parked, or deferred while its writer may still be writing).
    #[allow(clippy::type_complexity)]
    fn read_request(
        &self,
        dz: &Dir,
        engine: &Engine,
        name: &str,
    ) -> Result<std::result::Result<(SignalRequest, Vec<u8>), FileOutcome>> {
        // The name reaches the wake's text (`spool:<name>`): one a sender could break a line
        // or a terminal with is refused at the door.
        if !is_safe_name(name) {
            let reason = UNSAFE_NAME.to_owned();
            self.park(dz, name, &reason, None, None, engine.now())?;
            return Ok(Err(FileOutcome::Parked(reason)));
        }
        let bytes = match read_regular(dz, OsStr::new(name)) {
            Ok(b) => b,
            Err(ReadError::Gone) => return Ok(Err(FileOutcome::Vanished)),
            Err(ReadError::Refused(reason)) => {
                self.park(dz, name, &reason, None, None, engine.now())?;
                return Ok(Err(FileOutcome::Parked(reason)));
            }
            Err(ReadError::Io(e)) => return Err(Error::io("cannot read", dz.path().join(name), e)),
        };
        match parse_spool_body(&bytes) {
            Ok(SpoolBody::Signal(r)) => Ok(Ok((r, bytes))),
            Ok(SpoolBody::Callback(c)) => Ok(Err(self.trigger(dz, engine, name, &bytes, c)?)),
            // Refused by its sender already: parked (and so logged as a warning naming the id)
            // like any other miss, and counted once, since its sender sent nothing else.
            Ok(SpoolBody::Miss { id }) => {
                let reason = format!(
                    "{} (judged by its sender on this machine, which sent nothing)",
                    crate::engine::rules::Refusal::UnknownId.reason()
                );
                self.park(dz, name, &reason, Some(&bytes), Some(&id), engine.now())?;
                Ok(Err(FileOutcome::Parked(reason)))
            }
            Err(_) if self.device.is_none() && is_fresh(dz, name) => Ok(Err(FileOutcome::Deferred)),
            Err(reason) => {
                self.park(dz, name, &reason, Some(&bytes), None, engine.now())?;
                Ok(Err(FileOutcome::Parked(reason)))
            }
        }
    }

    /// Logs the engine's verdict on a file and parks it when refused (`Some(Parked)`); `None`
    /// means the file is consumed and the caller removes it.
    fn settle(
        &self,
        dz: &Dir,
        engine: &Engine,
        name: &str,
        request: &SignalRequest,
        bytes: &[u8],
        verdict: &Verdict,
    ) -> Result<Option<FileOutcome>> {
        match verdict {
            Verdict::Refused(refusal) => {
                let reason = refusal.reason();
                tracing::warn!(
                    waitpoint = %request.id,
                    file = ?name,
                    secret_fp = %request.secret.fingerprint(),
                    reason = %reason,
                    "refused signal file",
                );
                self.park(
                    dz,
                    name,
                    &reason,
                    Some(bytes),
                    Some(&request.id),
                    engine.now(),
                )?;
                return Ok(Some(FileOutcome::Parked(reason)));
            }
            Verdict::Accepted { id, seq, wake, .. } => {
                tracing::info!(
                    waitpoint = %id,
                    seq,
                    file = ?name,
                    woke = wake.is_some(),
                    "signal accepted",
                );
            }
            Verdict::Duplicate { id, .. } => {
                tracing::info!(
                    waitpoint = %id,
                    file = ?name,
                    "duplicate signal (already recorded); removing",
                );
            }
            Verdict::Closed { id, status, .. } => {
                tracing::info!(
                    waitpoint = %id,
                    file = ?name,
                    status = status.as_str(),
                    "late signal: the waitpoint is closed; removing",
                );
            }
            Verdict::Queued { id } => {
                tracing::info!(
                    waitpoint = %id,
                    file = ?name,
                    "signal handed over to the leading daemon; removing",
                );
            }
        }
        Ok(None)
    }

    /// The spool form of a callback: the token's capability, checked by the engine.
    fn trigger(
        &self,
        dz: &Dir,
        engine: &Engine,
        name: &str,
        bytes: &[u8],
        c: CallbackRequest,
    ) -> Result<FileOutcome> {
        let identity = self.source_of(name).identity();
        let refuse = |reason: String| -> Result<FileOutcome> {
            tracing::warn!(file = ?name, reason = %reason, "refused callback file");
            self.park(dz, name, &reason, Some(bytes), None, engine.now())?;
            Ok(FileOutcome::Parked(reason))
        };
        let id = match engine.trigger_callback(&c.token, c.mode, c.text, Some(identity))? {
            Trigger::Delivered { id, .. } | Trigger::Duplicate { id } => id,
            // Kept for a later pass: the agent's hour has no room for another wake yet.
            Trigger::Limited { .. } => return Ok(FileOutcome::Deferred),
            Trigger::Invalid => {
                return refuse("unknown, revoked or malformed callback token".into());
            }
            Trigger::WrongMode { expected } => {
                return refuse(format!(
                    "this callback's mode is {}, not {}",
                    expected.as_str(),
                    c.mode.as_str()
                ));
            }
        };
        dz.unlink_durably(OsStr::new(name))?;
        Ok(FileOutcome::Triggered(id))
    }

    /// Removes `*.tmp` files older than `max_age_ms` (a writer that died mid-write).
    pub fn remove_stale_temps(&self, now: Timestamp, max_age_ms: i64) -> Result<usize> {
        let Some(dz) = self.open()? else {
            return Ok(0);
        };
        let mut removed = 0;
        for name in dz.names()? {
            if !name.ends_with(".tmp") {
                continue;
            }
            let Ok(Some(Kind::File { modified, .. })) = dz.entry(OsStr::new(&name)) else {
                continue;
            };
            let mtime = Timestamp::from_system(modified);
            if now.millis_since(mtime) > max_age_ms {
                dz.unlink_durably(OsStr::new(&name))?;
                tracing::info!(file = ?name, "removed stale temp file");
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// How long an unparseable file is given to finish being written before it is parked.
pub const SETTLE_MS: u128 = 2_000;

/// Whether the file changed within [`SETTLE_MS`]. This compares against the filesystem's own
/// clock (mtimes), not the engine's, because it asks about the file, not about waitpoints.
fn is_fresh(dz: &Dir, name: &str) -> bool {
    match dz.entry(OsStr::new(name)) {
        Ok(Some(Kind::File { modified, .. })) => modified
            .elapsed()
            .is_ok_and(|age| age.as_millis() < SETTLE_MS),
        _ => false,
    }
}

/// Whether a name in the drop zone is a signal file to collect.
/// Why a file whose name is not [`is_safe_name`] is parked.
const UNSAFE_NAME: &str = "its name is not 1-128 characters of letters, digits and ._-@+=,:~ \
(cortex-signal and the shell line never write such a name); it is not read";

/// Whether a drop-zone file's name is one a signal may have: at most 128 characters, ASCII
/// letters, digits and `._-@+=,:~`, not starting with `.` (what `cortex-signal`, the reply's
/// shell line and the spec's `$(date +%s%N)-$RANDOM.json` write).
pub fn is_safe_name(name: &str) -> bool {
    name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@+=,:~".contains(&b))
}

pub fn is_candidate(name: &str) -> bool {
    name.ends_with(".json") && !durable::is_temp_name(name) && name != "bad"
}

enum ReadError {
    Gone,
    Refused(String),
    Io(io::Error),
}

/// Reads a spool file only if it is safe to: a regular file with one link, at most the cap.
fn read_regular(dz: &Dir, name: &OsStr) -> std::result::Result<Vec<u8>, ReadError> {
    const NOT_REGULAR: &str = "is not a regular file (directory, FIFO, socket or device)";
    const SYMLINK: &str = "is a symbolic link; only regular files are read";
    // Look before opening: opening a device or a socket can have effects of its own, so only
    // what is a regular file now is opened at all (and checked again once open, for races).
    match dz.entry(name) {
        Ok(Some(Kind::Symlink)) => return Err(ReadError::Refused(SYMLINK.into())),
        Ok(Some(Kind::File { .. })) => {}
        Ok(Some(_)) => return Err(ReadError::Refused(NOT_REGULAR.into())),
        Ok(None) => return Err(ReadError::Gone),
        Err(e) => return Err(ReadError::Io(e)),
    }
    let file = match dz.open_read(name) {
        Ok(f) => f,
        Err(e) => {
            return Err(match e.kind() {
                io::ErrorKind::NotFound => ReadError::Gone,
                io::ErrorKind::PermissionDenied => {
                    ReadError::Refused("cannot be read (permission denied)".into())
                }
                _ => match rustix::io::Errno::from_io_error(&e) {
                    Some(rustix::io::Errno::LOOP) => ReadError::Refused(SYMLINK.into()),
                    // Swapped for a socket (ENXIO) or a device (ENODEV) since the look.
                    Some(rustix::io::Errno::NXIO | rustix::io::Errno::NODEV) => {
                        ReadError::Refused(NOT_REGULAR.into())
                    }
                    _ => ReadError::Io(e),
                },
            });
        }
    };
    let meta = file.metadata().map_err(ReadError::Io)?;
    use std::os::unix::fs::MetadataExt;
    if !meta.is_file() {
        return Err(ReadError::Refused(NOT_REGULAR.into()));
    }
    if meta.nlink() > 1 {
        return Err(ReadError::Refused(
            "has more than one hard link; only files written into the spool are read".into(),
        ));
    }
    if meta.len() > MAX_BODY_BYTES as u64 {
        return Err(ReadError::Refused(format!(
            "larger than {MAX_BODY_BYTES} bytes ({} bytes)",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Read one byte past the cap so a file that grew after the stat is caught, not truncated.
    file.take(MAX_BODY_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() > MAX_BODY_BYTES {
        return Err(ReadError::Refused(format!(
            "grew past {MAX_BODY_BYTES} bytes while being read"
        )));
    }
    Ok(bytes)
}
