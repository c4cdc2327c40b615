//! The drop zone (`tmp/signals/`): reading signal files safely, handing them to the engine, and
//! removing or parking them afterwards.
//!
//! A file is read only if it is a regular, single-linked file no bigger than the cap, opened
//! without following symlinks and without blocking on FIFOs, so nothing outside the spool is
//! ever read. Every pass opens the spool afresh beneath the home's root ([`store::Dir`]), each
//! directory on the way not followed if it is a link, and lists, reads, parks and removes
//! through that handle only: a spool or `bad/` swapped for a link is refused, never followed. Whatever the engine refuses is parked under `bad/` with a `.reason` file; nothing
//! is deleted unparsed. A file leaves the spool only after its effect is durable.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde_json::Value;

use crate::clock::Timestamp;
use crate::engine::callbacks::Trigger;
use crate::engine::{Engine, Verdict};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ingress::{
    CallbackRequest, MAX_BODY_BYTES, SignalRequest, Source, SpoolBody, parse_spool_body,
};
use crate::secret;
use crate::store::{self, Dir, Entry};

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
    root: PathBuf,
    rel: PathBuf,
    /// For a device's local mirror: the device, which makes identities `device:<name>:<file>`.
    pub device: Option<String>,
    /// When set (the daemon's drop zone), a refused file is not parked on the spot: it is
    /// queued here and parked later by [`Spool::park_queued`], a few at a time, so a flood of
    /// refusals costs accepted signals nothing. The file stays in the spool meanwhile, so a
    /// crash loses no refusal.
    queued: Option<std::cell::RefCell<Vec<QueuedPark>>>,
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
        let root = home.root().to_owned();
        let rel = dir
            .strip_prefix(&root)
            .expect("a spool lies beneath its home")
            .to_owned();
        Spool {
            bad: dir.join(BAD),
            dir,
            root,
            rel,
            device: None,
            queued: None,
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

    /// Opens the spool, made when missing, for a writer that fills it (a device's collector).
    pub fn open_or_make(&self) -> Result<Dir> {
        Dir::make_beneath(&self.root, &self.rel)
    }

    /// This spool, with refusals queued for [`Spool::park_queued`] instead of parked at once.
    pub fn with_queued_parking(mut self) -> Self {
        self.queued = Some(std::cell::RefCell::new(Vec::new()));
        self
    }

    /// Takes the refusals queued since the last call.
    pub fn take_queued(&self) -> Vec<QueuedPark> {
        self.queued
            .as_ref()
            .map(|q| std::mem::take(&mut *q.borrow_mut()))
            .unwrap_or_default()
    }

    /// Parks queued refusals now, the spool opened once for all of them (their files still in
    /// the spool; one gone meanwhile is fine). One result per refusal, in order.
    pub fn park_queued(&self, queue: &[QueuedPark]) -> Vec<Result<()>> {
        let dz = match self.open() {
            Ok(Some(dz)) => dz,
            Ok(None) => return queue.iter().map(|_| Ok(())).collect(),
            Err(e) => {
                let message = e.to_string();
                return queue
                    .iter()
                    .map(|_| {
                        Err(Error::Insecure {
                            path: self.dir.clone(),
                            message: message.clone(),
                        })
                    })
                    .collect();
            }
        };
        queue
            .iter()
            .map(|q| {
                let there = dz
                    .entry(OsStr::new(&q.name))
                    .map_err(|e| Error::io("cannot inspect", self.dir.join(&q.name), e))?;
                match there {
                    None => Ok(()),
                    Some(_) => self.park_now(&dz, q),
                }
            })
            .collect()
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
        let mut c = Collection {
            dz: None,
            names: names.to_vec(),
            results: Vec::with_capacity(names.len()),
            readable: Vec::new(),
            items: Vec::new(),
        };
        // The spool must still be the real directory it was: a symlink swapped in would have
        // foreign files read, moved and removed. Every file is kept for a later attempt.
        let dz = match self.open() {
            Ok(Some(dz)) => dz,
            Ok(None) => {
                c.results = names
                    .iter()
                    .map(|_| Some(Ok(FileOutcome::Vanished)))
                    .collect();
                return c;
            }
            Err(e) => {
                let message = e.to_string();
                c.results = names
                    .iter()
                    .map(|_| {
                        Some(Err(Error::Insecure {
                            path: self.dir.clone(),
                            message: message.clone(),
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
    /// journal): into the daemon's trash, or for good without one. The removals need no fsync:
    /// a file a crash brings back is found recorded and removed again as a duplicate, and the
    /// next checkpoint makes them durable anyway.
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
            Some(trash) => trash.take_all_from(dz, names),
            None => store::unlink_all(dz, names),
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
                tracing::warn!(waitpoint = %request.id, file = ?name, secret_fp = %request.secret.fingerprint(), "refused signal file: {reason}");
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
                tracing::info!(waitpoint = %id, seq, file = ?name, woke = wake.is_some(), "signal accepted");
            }
            Verdict::Duplicate { id, .. } => {
                tracing::info!(waitpoint = %id, file = ?name, "duplicate signal (already recorded); removing");
            }
            Verdict::Closed { id, status, .. } => {
                tracing::info!(waitpoint = %id, file = ?name, "late signal: waitpoint already {}; removing", status.as_str());
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
            tracing::warn!(file = ?name, "refused callback file: {reason}");
            self.park(dz, name, &reason, Some(bytes), None, engine.now())?;
            Ok(FileOutcome::Parked(reason))
        };
        let id = match engine.trigger_callback(&c.token, c.mode, c.text, Some(identity))? {
            Trigger::Delivered { id, .. } | Trigger::Duplicate { id } => id,
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

    /// Moves a refused file to `bad/<stem>.json` with `bad/<stem>.reason` beside it. A parseable
    /// file's secret is redacted in the parked copy (only its fingerprint is kept), because only
    /// secrets' hashes may rest under the home. `waitpoint` is the id the file claimed, when it
    /// parsed far enough to have one, so the log line names it.
    fn park(
        &self,
        dz: &Dir,
        name: &str,
        reason: &str,
        bytes: Option<&[u8]>,
        waitpoint: Option<&str>,
        now: Timestamp,
    ) -> Result<()> {
        let job = QueuedPark {
            name: name.to_owned(),
            reason: reason.to_owned(),
            bytes: bytes.map(<[u8]>::to_vec),
            waitpoint: waitpoint.map(str::to_owned),
            at: now,
        };
        match &self.queued {
            Some(queue) => {
                queue.borrow_mut().push(job);
                Ok(())
            }
            None => self.park_now(dz, &job),
        }
    }

    fn park_now(&self, dz: &Dir, job: &QueuedPark) -> Result<()> {
        let (name, reason, now) = (job.name.as_str(), job.reason.as_str(), job.at);
        let (bytes, waitpoint) = (job.bytes.as_deref(), job.waitpoint.as_deref());
        // A real directory of ours, not a link out of the home.
        let bad = dz.child_or_make(BAD)?;
        let stem = safe_stem(name);
        let (target, reason_file) = free_bad_names(&bad, &stem)?;
        let source = OsStr::new(name);
        let entry = dz
            .entry(source)
            .map_err(|e| Error::io("cannot inspect", dz.path().join(name), e))?;
        let hard_linked = matches!(entry, Some(Entry::File { links, .. }) if links > 1);
        let lone_file = matches!(entry, Some(Entry::File { links: 1, .. }));
        let redacted = bytes.and_then(redact_secret);
        let note = match &redacted {
            Some((_, Some(fp))) => format!(
                "{now} refused {name:?}: {reason}\n(secret redacted in this copy; sha256 starts {fp})\n"
            ),
            Some((_, None)) => {
                format!(
                    "{now} refused {name:?}: {reason}\n(secret-like text redacted in this copy)\n"
                )
            }
            None if bytes.is_none() && hard_linked => format!(
                "{now} refused {name:?}: {reason}\n(the link was removed from the spool; the file \
it names elsewhere is untouched, and no copy of it is kept here)\n"
            ),
            None if bytes.is_none() => format!(
                "{now} refused {name:?}: {reason}\n(any secret-like text is redacted in this copy)\n"
            ),
            None => format!("{now} refused {name:?}: {reason}\n"),
        };
        bad.commit(&reason_file, note.as_bytes())?;
        match redacted {
            Some((copy, _)) => {
                bad.commit(&target, &copy)?;
                dz.unlink_durably(source)?;
            }
            // A second name of a file that lives elsewhere: parking the link would keep that
            // file's content (maybe a secret) under the home, so only our name for it goes.
            None if bytes.is_none() && hard_linked => dz.unlink_durably(source)?,
            // Refused unread for its size: copied with every secret-like run removed, so no
            // plaintext rests in bad/ however large the file.
            None if bytes.is_none() && lone_file => {
                copy_redacted(dz, source, &bad, &target)?;
                dz.unlink_durably(source)?;
            }
            None => dz.rename_durably(source, &bad, &target)?,
        }
        tracing::warn!(waitpoint, file = ?name, parked = %bad.path().join(&target).display(), "parked refused spool file: {reason}");
        Ok(())
    }

    fn park_raw(&self, dz: &Dir, name: &OsString, reason: &str) -> Result<()> {
        let bad = dz.child_or_make(BAD)?;
        let stem = safe_stem(&name.to_string_lossy());
        let (target, reason_file) = free_bad_names(&bad, &stem)?;
        bad.commit(&reason_file, format!("refused: {reason}\n").as_bytes())?;
        // The content may be a well-formed signal under a bad name: its secret must not rest
        // in the parked copy either.
        match read_regular(dz, name).ok().and_then(|b| redact_secret(&b)) {
            Some((copy, _)) => {
                bad.commit(&target, &copy)?;
                dz.unlink_durably(name)
            }
            None => dz.rename_durably(name, &bad, &target),
        }
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
            let Ok(Some(Entry::File { modified, .. })) = dz.entry(OsStr::new(&name)) else {
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

/// Free names in `bad/` for a parked copy and its reason: `<stem>.json`, or `<stem>.1.json`
/// and so on when taken.
fn free_bad_names(bad: &Dir, stem: &str) -> Result<(String, String)> {
    let taken = |name: &str| {
        bad.entry(OsStr::new(name))
            .map(|e| e.is_some())
            .map_err(|e| Error::io("cannot inspect", bad.path().join(name), e))
    };
    for n in 0u32.. {
        let base = if n == 0 {
            stem.to_owned()
        } else {
            format!("{stem}.{n}")
        };
        let (target, reason) = (format!("{base}.json"), format!("{base}.reason"));
        if !taken(&target)? && !taken(&reason)? {
            return Ok((target, reason));
        }
    }
    unreachable!("some name in bad/ is free")
}

/// How long an unparseable file is given to finish being written before it is parked.
pub const SETTLE_MS: u128 = 2_000;

/// Whether the file changed within [`SETTLE_MS`]. This compares against the filesystem's own
/// clock (mtimes), not the engine's, because it asks about the file, not about waitpoints.
fn is_fresh(dz: &Dir, name: &str) -> bool {
    match dz.entry(OsStr::new(name)) {
        Ok(Some(Entry::File { modified, .. })) => modified
            .elapsed()
            .is_ok_and(|age| age.as_millis() < SETTLE_MS),
        _ => false,
    }
}

/// Whether a name in the drop zone is a signal file to collect.
pub fn is_candidate(name: &str) -> bool {
    name.ends_with(".json") && !store::is_temp_name(name) && name != "bad"
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
        Ok(Some(Entry::Symlink)) => return Err(ReadError::Refused(SYMLINK.into())),
        Ok(Some(Entry::File { .. })) => {}
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
                _ if e.raw_os_error() == Some(libc::ELOOP) => ReadError::Refused(SYMLINK.into()),
                // Swapped for a socket (ENXIO) or a device (ENODEV) since the look.
                _ if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENODEV)) => {
                    ReadError::Refused(NOT_REGULAR.into())
                }
                _ => ReadError::Io(e),
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

/// The stem a refused file is parked under in `bad/` (before any `.1`, `.2` for clashes): control
/// characters and `/` become `_`, and a leading dot gets a `_` before it.
pub fn safe_stem(name: &str) -> String {
    let stem = name.strip_suffix(".json").unwrap_or(name);
    let mut s: String = stem
        .chars()
        .map(|c| if c.is_control() || c == '/' { '_' } else { c })
        .collect();
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '_');
    }
    s.chars().take(120).collect()
}

/// For a body with a `secret`: the body with the secret replaced, and the secret's fingerprint.
/// A body that parses as a JSON object is rewritten as JSON; one that does not (broken JSON,
/// too deep, a stray byte) still has every `"secret": "…"` value blanked out in its text, so no
/// parked copy keeps a plaintext secret.
fn redact_secret(bytes: &[u8]) -> Option<(Vec<u8>, Option<String>)> {
    let by_key = match serde_json::from_slice::<Value>(bytes) {
        // Parsed, escapes are decoded and a key given twice is kept once: the copy is written
        // from the value, so an earlier duplicate is gone with it.
        Ok(mut value) => {
            let fp = value.as_object_mut().and_then(|obj| {
                // A signal's secret, or a callback trigger's token: both are capabilities,
                // whatever type the sender gave them.
                let key = ["secret", "callback"]
                    .into_iter()
                    .find(|k| obj.contains_key(*k))?;
                let old = obj.get(key)?;
                let fp = secret::fingerprint(old.as_str().unwrap_or(&old.to_string()));
                obj.insert(
                    key.into(),
                    Value::String(format!("[redacted; sha256 starts {fp}]")),
                );
                Some(fp)
            });
            Some((store::to_pretty_json(&value), fp))
        }
        Err(_) => redact_secret_text(bytes).map(|(b, fp)| (b, Some(fp))),
    };
    // Then any run of hex long enough to be a secret, anywhere (in an array, a message, an
    // escaped spelling): the parked copy holds no plaintext secret of any waitpoint.
    let (text, fp) = by_key.unwrap_or_else(|| (bytes.to_vec(), None));
    let (text, ran) = secret::redact_hex_runs(&text);
    match fp {
        Some(fp) => Some((text, Some(fp))),
        None if ran || text != bytes => Some((text, None)),
        None => None,
    }
}

/// Copies a file too large to read at once into `bad/target`, every secret-like run of hex
/// removed, reading it through a handle opened without following links or blocking.
fn copy_redacted(dz: &Dir, source: &OsStr, bad: &Dir, target: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let path = || dz.path().join(source);
    let mut file = dz
        .open_read(source)
        .map_err(|e| Error::io("cannot read", path(), e))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io("cannot read", path(), e))?;
    if !meta.is_file() || meta.nlink() != 1 {
        return dz.rename_durably(source, bad, target);
    }
    bad.commit_with(target, |out| {
        let mut redactor = secret::HexRedactor::default();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut clean = Vec::with_capacity(chunk.len() + 16);
        loop {
            let n = match file.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            redactor.feed(&chunk[..n], &mut clean);
            out.write_all(&clean)?;
            clean.clear();
        }
        redactor.finish(&mut clean);
        out.write_all(&clean)
    })
}

/// The textual fallback of [`redact_secret`]: replaces the string after each `"secret"` key.
/// Returns the fingerprint of the first secret found, or `None` when there is none.
fn redact_secret_text(bytes: &[u8]) -> Option<(Vec<u8>, String)> {
    const KEY: &[u8] = b"\"secret\"";
    let mut out = Vec::with_capacity(bytes.len());
    let mut first_fp = None;
    let mut rest = bytes;
    while let Some(at) = find(rest, KEY) {
        let after_key = at + KEY.len();
        out.extend_from_slice(&rest[..after_key]);
        rest = &rest[after_key..];
        // `"secret"`, optional blanks, `:`, optional blanks, then the quoted value.
        let colon = skip_blanks(rest);
        if rest.get(colon) != Some(&b':') {
            continue;
        }
        let quote = colon + 1 + skip_blanks(&rest[colon + 1..]);
        if rest.get(quote) != Some(&b'"') {
            continue;
        }
        let start = quote + 1;
        let mut end = start;
        while end < rest.len() && rest[end] != b'"' {
            end += if rest[end] == b'\\' { 2 } else { 1 };
        }
        let end = end.min(rest.len());
        let fp = secret::fingerprint(&String::from_utf8_lossy(&rest[start..end]));
        out.extend_from_slice(&rest[..start]);
        out.extend_from_slice(format!("[redacted; sha256 starts {fp}]").as_bytes());
        first_fp.get_or_insert(fp);
        rest = &rest[end..];
    }
    out.extend_from_slice(rest);
    first_fp.map(|fp| (out, fp))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn skip_blanks(b: &[u8]) -> usize {
    b.iter()
        .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_broken_json_are_redacted_too() {
        let body =
            b"\xef\xbb\xbf{\"id\":\"wp_0123456789ab\", \"secret\" : \"s3cr\\\"et\",\"x\":[[[";
        let (copy, fp) = redact_secret(body).unwrap();
        let fp = fp.expect("found by its key");
        let copy = String::from_utf8_lossy(&copy);
        assert!(!copy.contains("s3cr"), "{copy}");
        assert!(
            copy.contains(&format!("[redacted; sha256 starts {fp}]")),
            "{copy}"
        );
        assert!(copy.contains("wp_0123456789ab"), "the rest is kept: {copy}");
        assert_eq!(redact_secret(b"no secret here"), None);
        // A key with no value after it, at the very end, is left as it is.
        assert_eq!(redact_secret(b"{\"secret\""), None);
    }

    #[test]
    fn a_secret_in_any_place_or_spelling_leaves_no_plaintext_in_the_copy() {
        let s = secret::generate();
        let escaped: String = s.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
        for body in [
            format!(r#"{{"id":"wp_0123456789ab","\u0073ecret":"{s}"}}"#),
            format!(r#"{{"id":"wp_0123456789ab","secret":"{s}","secret":"other"}}"#),
            format!(r#"{{"id":"wp_0123456789ab","secret":["{s}"]}}"#),
            format!(r#"{{"id":"wp_0123456789ab","data":{{"nested":["{escaped}"]}}"#),
            format!(r#"not json {escaped} at all"#),
        ] {
            let (copy, _) = redact_secret(body.as_bytes()).unwrap_or_else(|| panic!("{body}"));
            let copy = String::from_utf8_lossy(&copy);
            assert!(
                !copy.contains(&s) && !copy.contains(&escaped),
                "{body}\n{copy}"
            );
        }
    }

    #[test]
    fn secrets_in_valid_json_are_redacted() {
        let (copy, _) =
            redact_secret(br#"{"id":"wp_0123456789ab","secret":"abc","memebr":1}"#).unwrap();
        assert!(!String::from_utf8_lossy(&copy).contains("\"abc\""));
    }
}
