//! Delivery: putting wakes into a session's inbox and taking them out again.
//!
//! The inbox is maildir-like: `sessions/<channel>/wakes/new/<wake_id>.json` until a reader takes
//! it, then `cur/`. Wake ids are stable, so delivering the same wake twice (after a crash) is a
//! no-op when a reader already took it, and a consumer can always de-duplicate by id.

pub mod hook;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::clock::Timestamp;
use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::records::{HookDelivery, Waitpoint, Wake};

/// This host's inboxes, as the store hands them to the engine: the one way the engine reaches
/// a session's inbox (delivering, clearing read wakes, removing a deleted session's), so the
/// engine knows neither the home's layout nor this module. Readers (`next`, `wait_next`, the
/// adapters) use the functions below on the home directly.
#[derive(Debug, Clone)]
pub struct Inboxes {
    home: Home,
}

impl Inboxes {
    pub fn new(home: Home) -> Inboxes {
        Inboxes { home }
    }

    /// See [`deliver`].
    pub fn deliver(&self, wake: &Wake) -> Result<()> {
        deliver(&self.home, wake)
    }

    /// See [`stage`]; a replay (`replay`) stages only a wake that is not already intact in
    /// `new/` (see [`is_intact_in_new`]) nor taken by a reader. A wake the batch has just
    /// decided goes straight to `new/`: its id is new, so no reader can have taken it (a wake's
    /// file exists only once a journal line holding it was committed, and then it is replayed).
    pub fn stage(&self, wake: &Wake, replay: bool, files: &mut durable::Unsynced) {
        if !replay {
            files.add_json(&new_file(&self.home, wake), wake);
        } else if !is_intact_in_new(&self.home, wake) {
            stage(&self.home, wake, files);
        }
    }

    /// See [`remove_inbox`].
    pub fn remove(&self, session: &str) -> Result<()> {
        remove_inbox(&self.home, session)
    }

    /// See [`remove_read_older_than`].
    pub fn remove_read_older_than(&self, now: Timestamp, ttl_ms: i64) -> Result<usize> {
        remove_read_older_than(&self.home, now, ttl_ms)
    }
}

/// A waitpoint's wakes that are still on their way to the session: pending, in the outbox,
/// awaiting the hook, or unread in the inbox.
pub fn has_undelivered_wake(home: &Home, wp: &Waitpoint) -> bool {
    !wp.outbox.is_empty()
        || wp.pending_wake.is_some()
        || wp.hook_deliveries.iter().any(HookDelivery::is_pending)
        || (wp.counters.wakes > 0 && is_unread(home, &wp.channel, &wp.wake_id(wp.counters.wakes)))
}

fn wake_file(dir: &Path, wake_id: &str) -> PathBuf {
    dir.join(format!("{wake_id}.json"))
}

/// Makes `wake` durable in its channel's `new/` unless a reader already moved it to `cur/`.
pub fn deliver(home: &Home, wake: &Wake) -> Result<()> {
    match inbox_target(home, wake) {
        Some(target) => {
            home.root_dir().create_dir_private(parent_of(&target))?;
            home.root_dir().commit_json(&target, wake)
        }
        None => Ok(()),
    }
}

/// Like [`deliver`], into a set of journaled files: written (without fsync) when `files`
/// commits (which makes `new/` if missing); the journal line written before makes it durable.
pub fn stage(home: &Home, wake: &Wake, files: &mut durable::Unsynced) {
    if let Some(target) = inbox_target(home, wake) {
        files.add_json(&target, wake);
    }
}

/// Where `wake` goes in `new/`, or `None` when a reader took it already (its name in `cur/`,
/// looked at beneath the home, not followed). Readers make `cur/` themselves before they move a
/// wake there.
fn inbox_target(home: &Home, wake: &Wake) -> Option<PathBuf> {
    let cur = home.inbox_cur(&wake.channel);
    if home.root_dir().exists(&wake_file(&cur, &wake.wake_id)) {
        return None;
    }
    Some(new_file(home, wake))
}

/// `wake`'s file in its inbox's `new/`.
fn new_file(home: &Home, wake: &Wake) -> PathBuf {
    wake_file(&home.inbox_new(&wake.channel), &wake.wake_id)
}

fn parent_of(path: &Path) -> &Path {
    path.parent().expect("a wake file is inside its inbox")
}

/// Where a delivered wake may be: unread in `new/`, then read in `cur/`.
fn inbox_dirs(home: &Home, channel: &str) -> [PathBuf; 2] {
    [home.inbox_new(channel), home.inbox_cur(channel)]
}

/// Reads a delivered wake's file from `new/` or `cur/`, as it is on disk: reached beneath the
/// home, a regular file of at most a record's size.
pub fn read_delivered(home: &Home, channel: &str, wake_id: &str) -> Result<Option<Vec<u8>>> {
    for dir in inbox_dirs(home, channel) {
        let file = wake_file(&dir, wake_id);
        if let Some(bytes) = home
            .root_dir()
            .read_capped(&file, durable::MAX_RECORD_BYTES)?
        {
            return Ok(Some(bytes));
        }
    }
    Ok(None)
}

/// Whether `wake` is readable in `new/` (a power cut can leave its name with no data). One a
/// reader took into `cur/` is [`stage`]'s to skip.
pub fn is_intact_in_new(home: &Home, wake: &Wake) -> bool {
    matches!(
        home.root_dir()
            .read_json::<Wake>(&wake_file(&home.inbox_new(&wake.channel), &wake.wake_id)),
        Ok(Some(_))
    )
}

/// Whether the wake is still waiting in `new/` (not yet taken by a reader).
pub fn is_unread(home: &Home, channel: &str, wake_id: &str) -> bool {
    wake_file(&home.inbox_new(channel), wake_id).exists()
}

/// The unread wakes of a channel, oldest first.
pub fn unread(home: &Home, channel: &str) -> Result<Vec<Wake>> {
    let dir = home.inbox_new(channel);
    let mut wakes = Vec::new();
    for (name, path) in home.root_dir().list_dir(&dir)? {
        if durable::is_temp_name(&name) || !name.ends_with(".json") {
            continue;
        }
        // A wake taken by another reader between the listing and the read is simply gone; one
        // that does not parse is set aside, so the good ones behind it are still read.
        if let Some(w) = durable::read_json_or_set_aside::<Wake>(home.root_dir(), &path)? {
            wakes.push(w);
        }
    }
    wakes.sort_by(|a, b| (a.created_at, &a.wake_id).cmp(&(b.created_at, &b.wake_id)));
    Ok(wakes)
}

/// Takes the oldest unread wake: moves it to `cur/` and returns it. When two readers race, each
/// wake goes to exactly one of them (the rename decides).
pub fn take_next(home: &Home, channel: &str) -> Result<Option<Wake>> {
    for wake in unread(home, channel)? {
        if mark_read(home, channel, &wake.wake_id)? {
            return Ok(Some(wake));
        }
    }
    Ok(None)
}

/// Wake ids are `wk_<hex>_<n>`; anything else never names a file of ours.
fn check_wake_id(wake_id: &str) -> Result<()> {
    if crate::names::is_wake_id(wake_id) {
        Ok(())
    } else {
        Err(Error::invalid(
            "wake_id",
            format!("{wake_id:?} is not a wake id"),
        ))
    }
}

/// Puts a wake that [`take_next`] took back among the unread (a reader that could not hand it on,
/// such as an MCP call cancelled after the take), so the next reader gets it.
pub fn untake(home: &Home, channel: &str, wake_id: &str) -> Result<()> {
    check_wake_id(wake_id)?;
    let new = home.inbox_new(channel);
    let cur = home.inbox_cur(channel);
    let from = wake_file(&cur, wake_id);
    home.root_dir()
        .rename(&from, &wake_file(&new, wake_id))
        .map_err(|e| Error::io("cannot move", &from, e))?;
    home.root_dir().fsync_dir(&new)?;
    home.root_dir().fsync_dir(&cur)
}

/// Marks one wake read (moves it to `cur/`), for a reader that handed it on by other means (a
/// wake adapter that resumed the agent). False when it was no longer unread.
pub fn mark_read(home: &Home, channel: &str, wake_id: &str) -> Result<bool> {
    check_wake_id(wake_id)?;
    let new = home.inbox_new(channel);
    let cur = home.inbox_cur(channel);
    home.root_dir().create_dir_private(&cur)?;
    let from = wake_file(&new, wake_id);
    match home.root_dir().rename(&from, &wake_file(&cur, wake_id)) {
        Ok(()) => {
            home.root_dir().fsync_dir(&cur)?;
            home.root_dir().fsync_dir(&new)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("cannot move", &from, e)),
    }
}

/// The wake with this id wherever the session's inbox holds it (unread or read), parsed.
pub fn find(home: &Home, channel: &str, wake_id: &str) -> Result<Option<Wake>> {
    for dir in inbox_dirs(home, channel) {
        if let Some(w) = home
            .root_dir()
            .read_json::<Wake>(&wake_file(&dir, wake_id))?
        {
            return Ok(Some(w));
        }
    }
    Ok(None)
}

/// The channels that have an inbox (`sessions/<name>/`), by name; an entry whose name could
/// not be a channel is not one and is skipped.
pub fn channels(home: &Home) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (name, path) in home.root_dir().list_dir(&home.sessions_dir())? {
        // Not followed: a symlink in `sessions/` is no inbox of this home.
        let is_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if crate::names::is_name(&name) && is_dir {
            out.push(name);
        }
    }
    Ok(out)
}

/// Removes a session's whole inbox (`sessions/<session>/`), durably.
pub fn remove_inbox(home: &Home, session: &str) -> Result<()> {
    let dir = home.sessions_dir().join(session);
    // A home where no wake has landed yet has no `sessions/`: nothing to remove.
    if std::fs::symlink_metadata(home.sessions_dir())
        .is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
    {
        return Ok(());
    }
    home.root_dir().remove_tree(&dir)?;
    home.root_dir().fsync_dir(&home.sessions_dir())
}

/// Removes read wakes (in `cur/`) created more than `ttl_ms` before `now`, from every session's
/// inbox; returns how many went. Unread wakes are never touched: only a reader retires a wake.
pub fn remove_read_older_than(home: &Home, now: Timestamp, ttl_ms: i64) -> Result<usize> {
    let mut removed = 0;
    for (channel, _) in home.root_dir().list_dir(&home.sessions_dir())? {
        let cur = home.inbox_cur(&channel);
        for (name, path) in home.root_dir().list_dir(&cur)? {
            if durable::is_temp_name(&name) || !name.ends_with(".json") {
                continue;
            }
            let old = match home.root_dir().read_json::<Wake>(&path) {
                Ok(Some(w)) => now.millis_since(w.created_at) > ttl_ms,
                Ok(None) => false,
                // An unreadable file in cur/ is the reader's; leave it alone.
                Err(_) => false,
            };
            if old {
                home.root_dir().remove_durably(&path)?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wake(id: &str, created_ms: i64) -> Wake {
        let text = include_str!("../../layouts/wake.example.json");
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        v["wake_id"] = id.into();
        v["channel"] = "s1".into();
        v["created_at"] = Timestamp::from_millis(created_ms).to_string().into();
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn read_wakes_past_their_ttl_go_and_unread_or_young_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let day = 86_400_000;
        let (old_read, young_read, old_unread) = ("wk_aa_1", "wk_aa_2", "wk_aa_3");
        for (id, at) in [(old_read, 0), (young_read, 9 * day), (old_unread, 0)] {
            deliver(&home, &wake(id, at)).unwrap();
        }
        assert!(mark_read(&home, "s1", old_read).unwrap());
        assert!(mark_read(&home, "s1", young_read).unwrap());

        let now = Timestamp::from_millis(10 * day);
        assert_eq!(remove_read_older_than(&home, now, 7 * day).unwrap(), 1);
        assert_eq!(find(&home, "s1", old_read).unwrap(), None);
        assert!(find(&home, "s1", young_read).unwrap().is_some());
        assert!(
            is_unread(&home, "s1", old_unread),
            "an unread wake is the reader's"
        );

        remove_inbox(&home, "s1").unwrap();
        assert!(!home.sessions_dir().join("s1").exists());
    }

    #[test]
    fn a_delivered_wake_swapped_for_a_link_or_a_fifo_is_not_read_through() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().join("home"));
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "not the home's").unwrap();
        deliver(&home, &wake("wk_aa_1", 0)).unwrap();
        let file = wake_file(&home.inbox_new("s1"), "wk_aa_1");
        assert!(read_delivered(&home, "s1", "wk_aa_1").unwrap().is_some());
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&secret, &file).unwrap();
        let read = read_delivered(&home, "s1", "wk_aa_1");
        assert!(
            !matches!(&read, Ok(Some(b)) if b.starts_with(b"not the home's")),
            "{read:?}"
        );
        std::fs::remove_file(&file).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &file,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Answers at once (a FIFO is not a wake), never waits for a writer.
        assert!(read_delivered(&home, "s1", "wk_aa_1").is_err());
    }
}
