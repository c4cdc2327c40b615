//! Whether a Codex thread is open in a Codex process: Codex holds an exclusive `flock` on
//! `$CODEX_HOME/thread-writer-locks/<thread>.lock` while a process (its TUI, its app server, a
//! `codex exec`) writes the thread, and refuses any other writer meanwhile ("thread ... already
//! has an active writer"). A resume of an open thread could only fail, so the resume adapter
//! waits for the holder instead. The lock is read from `/proc/locks`, never taken: taking it,
//! even for a moment, could make Codex itself fail to open the thread.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The process holding thread `thread`'s writer lock under Codex's home `codex_home`, if one
/// does. `None` too when the lock file is missing or not a regular file (no Codex wrote the
/// thread here), or `/proc/locks` cannot be read.
pub fn holder(codex_home: Option<&Path>, thread: &str) -> Option<rustix::process::RawPid> {
    // A thread id that is not a plain token never names a path (`Harness::session_name`).
    crate::harness::Harness::Codex.session_name(thread)?;
    let lock = codex_home?
        .join("thread-writer-locks")
        .join(format!("{thread}.lock"));
    let meta = std::fs::symlink_metadata(&lock).ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    holder_in(&locks, meta.dev(), meta.ino())
}

/// The pid of a granted lock on the file `(dev, ino)` in `/proc/locks`'s text. A line is
/// `N: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE START END` (major and minor in hex); a waiter
/// still blocked on a lock has `->` after its number and is not a holder.
fn holder_in(locks: &str, dev: u64, ino: u64) -> Option<rustix::process::RawPid> {
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    locks.lines().find_map(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let kind = fields.next()?;
        if kind == "->" {
            return None;
        }
        let (pid, place) = (fields.nth(2)?, fields.next()?);
        let mut parts = place.split(':');
        let maj = u32::from_str_radix(parts.next()?, 16).ok()?;
        let min = u32::from_str_radix(parts.next()?, 16).ok()?;
        let inode: u64 = parts.next()?.parse().ok()?;
        (maj == major && min == minor && inode == ino)
            .then(|| pid.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_names_its_holder_and_a_waiter_or_another_file_does_not() {
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 00:2a:777 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 5151 00:2a:888 0 EOF\n\
                     2: POSIX  ADVISORY  READ 99 fd:01:777 0 EOF\n";
        let dev = rustix::fs::makedev(0, 0x2a);
        assert_eq!(holder_in(locks, dev, 777), Some(4242));
        assert_eq!(
            holder_in(locks, dev, 888),
            None,
            "a blocked waiter holds nothing"
        );
        assert_eq!(holder_in(locks, dev, 999), None);
        assert_eq!(
            holder_in(locks, rustix::fs::makedev(0xfd, 1), 777),
            Some(99)
        );
    }

    #[test]
    fn a_real_flock_is_seen_and_its_release_too() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("thread-writer-locks");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t-1.lock");
        let file = std::fs::File::create(&path).unwrap();
        assert_eq!(holder(Some(home.path()), "t-1"), None);
        file.lock().unwrap();
        assert_eq!(
            holder(Some(home.path()), "t-1"),
            Some(std::process::id() as rustix::process::RawPid)
        );
        file.unlock().unwrap();
        assert_eq!(holder(Some(home.path()), "t-1"), None);
        // A name that could reach outside the folder is never looked at.
        assert_eq!(holder(Some(home.path()), "../t-1"), None);
    }
}
