//! The daemon's own inotify watch of flat directories (the drop zone, the timers, the
//! waitpoints): only the events that say an entry is complete (`IN_MOVED_TO`, `IN_CLOSE_WRITE`;
//! for the waitpoints also `IN_CREATE`) and the queue's overflow are asked of the kernel.
//!
//! `notify` 8.2.2 (the pinned release) asks for `IN_OPEN`, `IN_MODIFY`, `IN_ATTRIB`,
//! `IN_CREATE`, `IN_DELETE` and `IN_MOVED_FROM` on every watch and has no way to ask for
//! fewer (its `EventKindMask` arrives with 9.0), so the daemon's own open, read and rename of
//! every spool file woke its watcher thread several times a signal only to be filtered out,
//! and its open and close of each waitpoint's directory (for the waitpoint's lock) did too.
//! The kernel filters here instead. `notify` stays for the recursive watch of the devices.
//! (Here in `store`, below the daemon, since the files store watches its waitpoints with it.)

use rustix::event::{PollFd, PollFlags, poll};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::thread::JoinHandle;

/// What the watch reports: a complete file's name in the watched directory at that index, or
/// that events were lost (the queue overflowed, a watched directory went away).
pub(crate) enum Seen<'a> {
    Ready(usize, &'a str),
    Lost,
}

/// A running watch; dropping it stops its thread.
pub(crate) struct DirWatch {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

/// The events that say a file is complete: renamed in, or closed after writing.
pub(crate) const COMPLETE_FILES: WatchFlags = WatchFlags::MOVED_TO.union(WatchFlags::CLOSE_WRITE);

impl DirWatch {
    /// Watches `dirs` (not recursively) for the events in `mask` (and the queue's overflow) and
    /// calls `on` on a thread of its own.
    pub(crate) fn spawn(
        dirs: &[PathBuf],
        mask: WatchFlags,
        mut on: impl FnMut(Seen<'_>) + Send + 'static,
    ) -> std::io::Result<DirWatch> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        let mut wds = Vec::with_capacity(dirs.len());
        for dir in dirs {
            // A link where a watched directory should be is not followed: the watch would
            // otherwise hear a directory outside the home (the sweep sets the link aside).
            let wd = inotify::add_watch(
                &fd,
                dir,
                mask | WatchFlags::ONLYDIR | WatchFlags::DONT_FOLLOW,
            )?;
            wds.push(wd);
        }
        let stop = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        let stop_thread = stop.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("waitpoint-dirwatch".into())
            .spawn(move || run(fd, stop_thread, &wds, &mut on))?;
        Ok(DirWatch {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(fd: OwnedFd, stop: OwnedFd, wds: &[i32], on: &mut dyn FnMut(Seen<'_>)) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 16 * 1024];
    loop {
        let mut fds = [
            PollFd::new(&fd, PollFlags::IN),
            PollFd::new(&stop, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => {
                on(Seen::Lost);
                return;
            }
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        let mut reader = inotify::Reader::new(fd.as_fd(), &mut buf);
        loop {
            let event = match reader.next() {
                Ok(e) => e,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    on(Seen::Lost);
                    break;
                }
            };
            let flags = event.events();
            if flags.intersects(ReadFlags::QUEUE_OVERFLOW | ReadFlags::IGNORED) {
                on(Seen::Lost);
                continue;
            }
            let Some(index) = wds.iter().position(|&w| w == event.wd()) else {
                continue;
            };
            if let Some(name) = event.file_name().and_then(|n| n.to_str().ok()) {
                on(Seen::Ready(index, name));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// The watch reports complete files (closed after writing, renamed in) in the directory
    /// they arrived in, and not the reader's own opens: a read of an existing file comes
    /// before the write in the kernel's queue, so had it been reported it would come first.
    #[test]
    fn reports_complete_files_and_not_reads() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("old"), b"x").unwrap();
        let (tx, rx) = mpsc::channel();
        let dirs = [a.path().to_owned(), b.path().to_owned()];
        let watch = DirWatch::spawn(&dirs, COMPLETE_FILES, move |seen| {
            let _ = tx.send(match seen {
                Seen::Ready(i, name) => format!("{i}:{name}"),
                Seen::Lost => "lost".to_owned(),
            });
        })
        .unwrap();
        let _ = std::fs::read(a.path().join("old")).unwrap();
        std::fs::write(a.path().join("new"), b"y").unwrap();
        assert_eq!(rx.recv().unwrap(), "0:new");
        std::fs::write(a.path().join(".tmp"), b"z").unwrap();
        assert_eq!(rx.recv().unwrap(), "0:.tmp");
        std::fs::rename(a.path().join(".tmp"), b.path().join("moved")).unwrap();
        assert_eq!(rx.recv().unwrap(), "1:moved");
        drop(watch);
    }
}
