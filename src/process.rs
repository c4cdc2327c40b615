//! Processes around a job: running a command with its output passed through while keeping a
//! bounded tail of it (`waitpoint run`), waiting for a process we did not start to end
//! (`waitpoint attach`), and the waiting both they and the `onWake` hook runner share: a child
//! waited for with a deadline and no polling, and its output collected for a bounded time after
//! it ends (a grandchild left in the background may hold the pipes open for ever).
//!
//! Memory stays bounded whatever the command prints: only the last lines are kept, each line and
//! the whole tail are capped in characters, and a line that never ends is cut to its last bytes.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The last lines of a command's output, bounded in lines and characters.
#[derive(Debug, Clone)]
pub struct Tail {
    /// The newest line seen, kept whatever the caps (a heartbeat's message).
    last: Option<String>,
    lines: VecDeque<String>,
    chars: usize,
    max_lines: usize,
    max_chars: usize,
}

impl Tail {
    /// Keeps at most `max_lines` lines and `max_chars` characters (newlines included).
    pub fn new(max_lines: usize, max_chars: usize) -> Self {
        Tail {
            last: None,
            lines: VecDeque::new(),
            chars: 0,
            max_lines,
            max_chars,
        }
    }

    /// Adds one line (with its newline, if it had one), dropping the oldest lines past the caps.
    /// A line longer than the character cap keeps its end, which is where errors usually are.
    pub fn push(&mut self, line: String) {
        if !line.trim().is_empty() {
            self.last = Some(line.clone());
        }
        if self.max_lines == 0 || self.max_chars == 0 {
            return;
        }
        let n = line.chars().count();
        let line = if n > self.max_chars {
            line.chars().skip(n - self.max_chars).collect()
        } else {
            line
        };
        self.chars += line.chars().count();
        self.lines.push_back(line);
        while self.lines.len() > self.max_lines || self.chars > self.max_chars {
            let Some(old) = self.lines.pop_front() else {
                break;
            };
            self.chars -= old.chars().count();
        }
    }

    /// The kept text, oldest line first.
    pub fn text(&self) -> String {
        self.lines.iter().map(String::as_str).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// The newest non-blank line, without its newline.
    pub fn last_line(&self) -> Option<String> {
        self.last.as_ref().map(|l| l.trim_end().to_owned())
    }

    /// How many bytes of an unfinished line to hold for this tail: a UTF-8 character takes at
    /// most four, so a line cut to this many bytes still fills the character cap.
    fn line_bytes(&self) -> usize {
        self.max_chars * 4
    }
}

/// Splits a byte stream into lines for a [`Tail`], holding at most `max_bytes` of an unfinished
/// line (its end is kept).
struct LineSplitter {
    partial: Vec<u8>,
    max_bytes: usize,
}

impl LineSplitter {
    fn new(max_bytes: usize) -> Self {
        LineSplitter {
            partial: Vec::new(),
            max_bytes,
        }
    }

    fn feed(&mut self, mut bytes: &[u8], tail: &Mutex<Tail>) {
        while let Some(i) = bytes.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&bytes[..=i]);
            self.flush(tail);
            bytes = &bytes[i + 1..];
        }
        self.partial.extend_from_slice(bytes);
        if self.partial.len() > self.max_bytes {
            let cut = self.partial.len() - self.max_bytes;
            self.partial.drain(..cut);
        }
    }

    fn flush(&mut self, tail: &Mutex<Tail>) {
        if self.partial.is_empty() {
            return;
        }
        let line = String::from_utf8_lossy(&self.partial).into_owned();
        self.partial.clear();
        tail.lock().expect("tail lock").push(line);
    }
}

/// How a command run by [`run_command`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// The exit status to pass on: the command's own, 128+N when signal N killed it, and the
    /// shell's 127 (not found) or 126 (cannot be run) when it never started.
    pub code: i32,
    /// Why the command could not be started, if it was not.
    pub spawn_error: Option<String>,
    /// The last lines of its standard output and standard error, interleaved as they arrived.
    pub tail: String,
}

/// The exit status a shell would report for `status`.
pub fn shell_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// Runs `program args` with inherited standard input, copying its standard output and error
/// to `out` and `err` as they come and keeping the last lines in `tail` (which the caller may
/// read meanwhile: a heartbeat's message). While it runs, SIGTERM and SIGHUP sent to us are passed
/// on to it, and SIGINT and SIGQUIT (which a terminal already sends to the whole foreground group)
/// do not kill us, so the outcome is always reported.
pub fn run_command(
    program: &OsString,
    args: &[OsString],
    tail: Arc<Mutex<Tail>>,
    out: Box<dyn Write + Send>,
    err: Box<dyn Write + Send>,
) -> io::Result<RunOutcome> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGQUIT,
    ])?;
    // The wrapper signals for the job, so the job has no use for the secret: it stays out of
    // the job's environment (and so of every process the job starts).
    let spawned = Command::new(program)
        .args(args)
        .env_remove(crate::secret::SIGNAL_SECRET_ENV)
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            signals.handle().close();
            let code = if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            let message = format!("cannot run {}: {e}", program.to_string_lossy());
            return Ok(RunOutcome {
                code,
                tail: format!("{message}\n"),
                spawn_error: Some(message),
            });
        }
    };
    let pid = child.id() as rustix::process::RawPid;
    let handle = signals.handle();
    let forwarder = std::thread::spawn(move || {
        for sig in signals.forever() {
            let forward = match sig {
                signal_hook::consts::SIGTERM => Some(rustix::process::Signal::TERM),
                signal_hook::consts::SIGHUP => Some(rustix::process::Signal::HUP),
                _ => None,
            };
            // A pid we spawned and have not reaped yet.
            if let Some(s) = forward {
                send_signal(pid, s);
            }
        }
    });
    let (done_tx, done_rx) = mpsc::channel();
    let pumps = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ];
    let mut running = 0;
    for (source, sink) in pumps.into_iter().zip([out, err]) {
        let Some(source) = source else { continue };
        let tail = Arc::clone(&tail);
        let done = done_tx.clone();
        running += 1;
        std::thread::spawn(move || {
            pump(source, sink, &tail);
            let _ = done.send(());
        });
    }
    let status = child.wait();
    handle.close();
    let _ = forwarder.join();
    let status = status?;
    // A grandchild left running in the background can hold the pipes open forever; the command
    // itself is over, so wait only briefly for the rest of its output.
    for _ in 0..running {
        if done_rx.recv_timeout(OUTPUT_GRACE).is_err() {
            break;
        }
    }
    let text = tail.lock().expect("tail lock").text();
    Ok(RunOutcome {
        code: shell_code(status),
        spawn_error: None,
        tail: text,
    })
}

/// How long a command's output is still read after the command itself has ended: what its
/// pipes still hold arrives at once; a grandchild keeping them open is not waited for.
pub const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// How a child waited for by [`wait_killing_group`] ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited (or was killed by someone else) by itself.
    Exited(ExitStatus),
    /// It ran past its timeout, and its group was ended.
    TimedOut,
    /// We were asked to stop (SIGTERM, SIGINT or SIGHUP), and its group was ended first.
    Stopped,
}

/// How long a group asked to end (SIGTERM) has before it is killed. A harness given the time
/// writes out the transcript of the turn it was in, which is how a later attempt learns that
/// the turn had begun.
pub const TERM_GRACE: Duration = Duration::from_secs(5);

/// Waits for `child`, which leads a process group of its own, at most `timeout`; with
/// `on_stop_signals`, also until we are sent SIGTERM, SIGINT or SIGHUP. Either way the whole
/// group is ended before we return: asked with SIGTERM, then killed once `grace` passed, so
/// nothing it started outlives it.
///
/// A runner that is itself run in a group of its own (the daemon runs `onWake` so) passes
/// its stop on to the group it leads: the daemon ending the runner's group reaches the
/// harness's group too, which would otherwise run on under init. It uses half the grace, so
/// its own killing comes before the one of whoever stopped it.
pub fn wait_killing_group(
    child: Child,
    timeout: Duration,
    on_stop_signals: bool,
) -> io::Result<Ended> {
    enum Told {
        Exited(io::Result<ExitStatus>),
        Stop,
    }
    let pid = child.id() as rustix::process::RawPid;
    let (tx, rx) = mpsc::channel();
    let mut child = child;
    let exits = tx.clone();
    let waiter = std::thread::spawn(move || {
        let _ = exits.send(Told::Exited(child.wait()));
    });
    let signals = if on_stop_signals {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
        let handle = signals.handle();
        std::thread::spawn(move || {
            if signals.forever().next().is_some() {
                let _ = tx.send(Told::Stop);
            }
        });
        Some(handle)
    } else {
        drop(tx);
        None
    };
    let told = rx.recv_timeout(timeout);
    if let Some(h) = &signals {
        h.close();
    }
    let (ended, grace) = match told {
        Ok(Told::Exited(status)) => {
            let _ = waiter.join();
            return status.map(Ended::Exited);
        }
        Ok(Told::Stop) => (Ended::Stopped, TERM_GRACE / 2),
        Err(_) => (Ended::TimedOut, TERM_GRACE),
    };
    // The leader is not reaped yet (the waiter is still in wait(2)), so its group id cannot
    // have been reused when it is asked; after its exit, the rest of the group (if any) still
    // holds the id.
    if let Some(group) = rustix::process::Pid::from_raw(pid) {
        use rustix::process::{Signal, kill_process_group};
        let _ = kill_process_group(group, Signal::TERM);
        let _ = rx.recv_timeout(grace);
        let _ = kill_process_group(group, Signal::KILL);
    }
    let _ = waiter.join();
    Ok(ended)
}

/// Reads `pipe` (at most `cap` bytes) on a thread; the receiver gets what was read once the
/// pipe closes. Collect it with [`collect_output`].
pub fn drain(pipe: Option<impl Read + Send + 'static>, cap: u64) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(p) = pipe {
            let _ = p.take(cap).read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

/// What a [`drain`] read, once the process has ended: waiting at most [`OUTPUT_GRACE`] for the
/// pipe to close, and empty if it did not (a grandchild holds it).
pub fn collect_output(rx: &mpsc::Receiver<Vec<u8>>) -> Vec<u8> {
    rx.recv_timeout(OUTPUT_GRACE).unwrap_or_default()
}

/// Copies `source` to `sink` and into the tail. A sink that fails (our stdout closed) stops
/// the copying, never the reading, so the command is not blocked on a full pipe.
fn pump(mut source: Box<dyn Read + Send>, mut sink: Box<dyn Write + Send>, tail: &Mutex<Tail>) {
    let mut splitter = LineSplitter::new(tail.lock().expect("tail lock").line_bytes());
    let mut buf = [0u8; 8192];
    let mut sink_ok = true;
    loop {
        let n = match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if sink_ok {
            sink_ok = sink
                .write_all(&buf[..n])
                .and_then(|()| sink.flush())
                .is_ok();
        }
        splitter.feed(&buf[..n], tail);
    }
    splitter.flush(tail);
}

/// How [`wait_for_exit`] waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMethod {
    /// A pidfd became readable (Linux 5.3 and later): no polling at all.
    Pidfd,
    /// `kill(pid, 0)` every interval, where pidfds are not available.
    Poll,
}

/// Whether a process with this pid exists (it may belong to another user).
pub fn process_exists(pid: rustix::process::RawPid) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    // Signal 0 only checks for existence and permission; nothing is delivered.
    match rustix::process::test_kill_process(pid) {
        Ok(()) | Err(rustix::io::Errno::PERM) => true,
        Err(_) => false,
    }
}

/// The nearest ancestor of this process that is not a shell or a wrapper: the program that
/// started us through `sh -c` (as harnesses run a hook's command line), through programs that
/// only run their argument and wait for it (`flock`, `nice`, `timeout`, ...), or directly.
/// `None` when there is none but init, i.e. our starter is gone already.
///
/// A wrapper lives exactly as long as what it runs, so watching one would keep a waiter alive
/// after its harness exited (until its own timeout, a day later).
pub fn starter_pid() -> Option<rustix::process::RawPid> {
    let mut pid = rustix::process::getppid()?.as_raw_nonzero().get();
    // A few levels at most: `sh -c` inside `flock` inside `nice` is already unusual.
    for _ in 0..8 {
        let (comm, parent) = comm_and_parent(pid)?;
        if !PASS_THROUGH.contains(&comm.as_str()) {
            break;
        }
        pid = parent;
    }
    (pid > 1).then_some(pid)
}

/// Programs that run a command line and wait for it without being the harness: shells, and the
/// wrappers people put in front of a hook's command (by their `comm`, at most 15 bytes).
const PASS_THROUGH: [&str; 21] = [
    "sh", "dash", "bash", "zsh", "fish", "ksh", "env", "timeout", "flock", "nice", "ionice",
    "nohup", "stdbuf", "setsid", "chrt", "taskset", "time", "setpriv", "unshare", "sudo", "doas",
];

/// A process's command name and parent, from `/proc/PID/stat`.
fn comm_and_parent(pid: rustix::process::RawPid) -> Option<(String, rustix::process::RawPid)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name sits in parentheses and may hold anything, spaces and ')' included; the fields
    // after the last ')' are fixed: the state, then the parent.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let comm = stat.get(open + 1..close)?.to_owned();
    let parent = stat
        .get(close + 1..)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((comm, parent))
}

/// Sends `signal` to process `pid`; a pid that is not positive is ignored (it would name a
/// process group).
pub fn send_signal(pid: rustix::process::RawPid, signal: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Blocks until process `pid` (not our child) has ended. Uses a pidfd when the kernel has
/// them, else polls every `poll_interval`. `pid` must be positive: zero and negative values
/// name process groups.
pub fn wait_for_exit(
    pid: rustix::process::RawPid,
    prefer_pidfd: bool,
    poll_interval: Duration,
) -> io::Result<WaitMethod> {
    if pid <= 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a pid must be a positive number",
        ));
    }
    if prefer_pidfd && let Some(method) = wait_pidfd(pid)? {
        return Ok(method);
    }
    while process_exists(pid) {
        std::thread::sleep(poll_interval);
    }
    Ok(WaitMethod::Poll)
}

/// `Ok(None)` when pidfds are unavailable (old kernel, seccomp) and the caller should poll.
fn wait_pidfd(pid: rustix::process::RawPid) -> io::Result<Option<WaitMethod>> {
    use rustix::event::{PollFd, PollFlags};
    let Some(raw) = rustix::process::Pid::from_raw(pid) else {
        return Ok(None);
    };
    let fd = match rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        // Gone already: that is the end we wait for.
        Err(rustix::io::Errno::SRCH) => return Ok(Some(WaitMethod::Pidfd)),
        Err(_) => return Ok(None),
    };
    loop {
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => return Ok(Some(WaitMethod::Pidfd)),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines_within_both_caps() {
        let mut t = Tail::new(3, 100);
        for i in 0..10 {
            t.push(format!("line {i}\n"));
        }
        assert_eq!(t.text(), "line 7\nline 8\nline 9\n");
        let mut t = Tail::new(100, 10);
        t.push("aaaa\n".into());
        t.push("bbbb\n".into());
        t.push("cccc\n".into());
        assert_eq!(t.text(), "bbbb\ncccc\n");
        let mut t = Tail::new(5, 4);
        t.push("0123456789".into());
        assert_eq!(t.text(), "6789", "an overlong line keeps its end");
    }

    #[test]
    fn splitter_bounds_a_line_that_never_ends() {
        let tail = Mutex::new(Tail::new(10, 1000));
        let mut s = LineSplitter::new(8);
        for _ in 0..1000 {
            s.feed(b"xxxxxxxxxxxxxxxx", &tail);
        }
        assert!(s.partial.len() <= 8);
        s.feed(b"yz\nnext", &tail);
        s.flush(&tail);
        let text = tail.lock().unwrap().text();
        assert_eq!(text, "xxxxxxxxyz\nnext");
    }

    fn child_and_waiter(prefer_pidfd: bool) {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as rustix::process::RawPid;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(wait_for_exit(pid, prefer_pidfd, Duration::from_millis(20)));
        });
        child.kill().unwrap();
        // Reaping it is what makes the pid disappear for the polling fallback.
        child.wait().unwrap();
        let method = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the waiter returns once the process is gone")
            .unwrap();
        if !prefer_pidfd {
            assert_eq!(method, WaitMethod::Poll);
        }
    }

    #[test]
    fn waiting_for_a_pid_returns_when_it_ends_with_pidfd_or_polling() {
        child_and_waiter(true);
        child_and_waiter(false);
    }

    #[test]
    fn non_positive_pids_are_refused() {
        assert!(wait_for_exit(0, true, Duration::from_millis(1)).is_err());
        assert!(wait_for_exit(-1, false, Duration::from_millis(1)).is_err());
    }
}
