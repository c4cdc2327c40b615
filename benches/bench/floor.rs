//! The baselines: minimal programs that do only the physical minimum each row is compared with.
//!
//! - the durable per-file floor: one write + fsync + rename + directory fsync per file;
//! - the no-sync floor: the same without either fsync;
//! - one fsync of a small file (the "plus one fsync" of the latency target);
//! - the notification floor: a child process that watches a directory with inotify and renames
//!   every file it sees into a second directory;
//! - a trivial loopback HTTP server that answers every request 202 and records nothing (row 5's
//!   baseline for the shim).

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Files per second for `n` files of `body` written into `dir` the durable way (`sync` on) or
/// the fast way (`sync` off).
pub fn file_floor(dir: &Path, n: usize, body: &[u8], sync: bool) -> f64 {
    fs::create_dir_all(dir).unwrap();
    let d = File::open(dir).unwrap();
    let start = Instant::now();
    for i in 0..n {
        let tmp = dir.join(format!(".{i}.tmp"));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .unwrap();
        f.write_all(body).unwrap();
        if sync {
            f.sync_all().unwrap();
        }
        fs::rename(&tmp, dir.join(format!("{i}.json"))).unwrap();
        if sync {
            d.sync_all().unwrap();
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// CPU time (user + system) this process has used, in seconds.
pub fn cpu_secs_self() -> f64 {
    // SAFETY: getrusage writes into the struct it is given and has no other effect.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// The median time of one fsync of a freshly written small file, in milliseconds.
pub fn fsync_ms(dir: &Path, n: usize) -> f64 {
    fs::create_dir_all(dir).unwrap();
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let mut f = File::create(dir.join(format!("f{i}"))).unwrap();
        f.write_all(b"{\"x\":1}\n").unwrap();
        let t = Instant::now();
        f.sync_all().unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    percentile(&mut times, 50.0)
}

/// The `p`th percentile (nearest rank) of `values`, which it sorts.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// A blocking inotify watch on one directory for files renamed into it (or, with
/// [`watch_for`](Self::watch_for), for other events).
pub struct Inotify {
    fd: i32,
    buf: Vec<u8>,
    pending: std::collections::VecDeque<Vec<u8>>,
}

impl Inotify {
    pub fn watch(dir: &Path) -> Self {
        Self::watch_for(dir, libc::IN_MOVED_TO)
    }

    /// Watches `dir` for the events in `mask`; a queue that overflowed gives an empty name.
    pub fn watch_for(dir: &Path, mask: u32) -> Self {
        fs::create_dir_all(dir).unwrap();
        // SAFETY: plain syscalls on a descriptor this value owns; the path is NUL-terminated.
        unsafe {
            let fd = libc::inotify_init1(libc::IN_CLOEXEC);
            assert!(fd >= 0, "inotify_init1");
            let mut c = dir.as_os_str().as_bytes().to_vec();
            c.push(0);
            let wd = libc::inotify_add_watch(fd, c.as_ptr().cast(), mask);
            assert!(wd >= 0, "inotify_add_watch {}", dir.display());
            Inotify {
                fd,
                buf: vec![0; 64 * 1024],
                pending: Default::default(),
            }
        }
    }

    /// The next name renamed into the directory (blocks).
    pub fn next(&mut self) -> Vec<u8> {
        loop {
            if let Some(name) = self.pending.pop_front() {
                return name;
            }
            // SAFETY: reads into a buffer we own, within its length.
            let n = unsafe { libc::read(self.fd, self.buf.as_mut_ptr().cast(), self.buf.len()) };
            assert!(n > 0, "inotify read");
            let mut at = 0usize;
            while at + 16 <= n as usize {
                let len = u32::from_ne_bytes(self.buf[at + 12..at + 16].try_into().unwrap());
                let name = &self.buf[at + 16..at + 16 + len as usize];
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                self.pending.push_back(name[..end].to_vec());
                at += 16 + len as usize;
            }
        }
    }

    /// Whether an event is waiting, waiting at most `ms` for one.
    pub fn ready(&self, ms: i32) -> bool {
        if !self.pending.is_empty() {
            return true;
        }
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one descriptor this value owns, through a struct we own.
        unsafe { libc::poll(&mut p, 1, ms) > 0 }
    }

    /// Blocks until `name` is renamed into the directory.
    pub fn wait_for(&mut self, name: &str) {
        while self.next() != name.as_bytes() {}
    }
}

impl Drop for Inotify {
    fn drop(&mut self) {
        // SAFETY: closes the descriptor this value owns.
        unsafe { libc::close(self.fd) };
    }
}

/// The body of the notification-floor child: watch `from`, rename each file into `to`.
pub fn run_watcher(from: &Path, to: &Path) -> ! {
    let mut w = Inotify::watch(from);
    println!("ready");
    std::io::stdout().flush().unwrap();
    loop {
        let name = w.next();
        let name = std::ffi::OsStr::from_bytes(&name);
        let _ = fs::rename(from.join(name), to.join(name));
    }
}

/// Starts the notification-floor child (this same program with `--floor-watcher`).
pub fn spawn_watcher(from: &Path, to: &Path) -> Child {
    fs::create_dir_all(from).unwrap();
    fs::create_dir_all(to).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--floor-watcher")
        .arg(from)
        .arg(to)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

/// Latencies in ms from a rename into `from` to the file's arrival in `to` via the watcher.
pub fn notification_floor(dir: &Path, n: usize) -> Vec<f64> {
    let (from, to) = (dir.join("in"), dir.join("out"));
    let mut child = spawn_watcher(&from, &to);
    let mut seen = Inotify::watch(&to);
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let tmp = from.join(format!(".{i}.tmp"));
        fs::write(&tmp, b"{\"x\":1}\n").unwrap();
        let name = format!("{i}.json");
        let t = Instant::now();
        fs::rename(&tmp, from.join(&name)).unwrap();
        seen.wait_for(&name);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let _ = child.kill();
    let _ = child.wait();
    times
}

/// A loopback HTTP server that answers every request 202 with a short JSON body, as the shim
/// answers an accepted signal, and does nothing else; returns its port. One thread per
/// connection and keep-alive, so it is the HTTP floor for the same client and the same number
/// of connections. The threads live as long as the benchmark.
pub fn spawn_http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || answer(stream));
        }
    });
    port
}

/// Answers requests on one connection until the client closes it.
fn answer(stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    let reply = b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: \
                  22\r\n\r\n{\"result\":\"accepted\"}\n";
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let (length, close) = crate::http::headers(&mut reader)?;
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        out.write_all(reply)?;
        if close {
            return Ok(());
        }
    }
}

/// A fresh scratch directory under `base`.
pub fn scratch(base: &Path, name: &str) -> PathBuf {
    let dir = base.join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The filesystem `dir` is on, in words for the table's heading: its type, its device, and for
/// ext4 whether it has a journal (`/sys/fs/ext4/<device>/journal_task` reads `<none>` without
/// one). Without a journal ext4's inode allocator steps over every inode freed recently, so a
/// file made right after others were removed costs several times what it costs on a default
/// ext4; the heading says so, since every per-file figure in the table moves with it.
pub fn filesystem(dir: &Path) -> String {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    // The longest mount point that holds `dir`: fields 5 (mount point), then after " - ":
    // type and source.
    let best = info
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split(' ').nth(4)?.replace("\\040", " ");
            let mut r = right.split(' ');
            let (kind, source) = (r.next()?.to_owned(), r.next()?.to_owned());
            dir.starts_with(&point).then_some((point, kind, source))
        })
        .max_by_key(|(point, _, _)| point.len());
    let Some((point, kind, source)) = best else {
        return "an unknown filesystem".into();
    };
    let journal = if kind == "ext4" {
        let dev = source.rsplit('/').next().unwrap_or_default();
        match fs::read_to_string(format!("/sys/fs/ext4/{dev}/journal_task")) {
            Ok(t) if t.trim() == "<none>" => {
                " WITHOUT a journal (a journal-less quirk: its inode allocator steps over every \
                 inode freed recently, so making files among removals costs 6-12x a default \
                 ext4's)"
            }
            Ok(_) => " with a journal (mkfs.ext4's default, as users' disks are)",
            Err(_) => "",
        }
    } else {
        ""
    };
    format!("{kind}{journal}, {source} mounted at {point}")
}

/// One signal's spool file, read whole into `buf` and unlinked.
fn consume(path: &Path, buf: &mut Vec<u8>) {
    buf.clear();
    File::open(path).unwrap().read_to_end(buf).unwrap();
    fs::remove_file(path).unwrap();
}

/// A wake: written as a temp file in `new`, then renamed into place as `name`.
fn make_wake(new: &Path, name: &str, bytes: &[u8]) {
    let tmp = new.join(format!(".{name}.tmp"));
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, new.join(name)).unwrap();
}

/// A waitpoint's state as the layout keeps it: rewritten over its spare, then the two names
/// exchanged (`renameat2(RENAME_EXCHANGE)`), so a rewrite makes and frees no file.
struct State {
    spare: PathBuf,
    spare_c: Vec<u8>,
    state_c: Vec<u8>,
}

impl State {
    fn new(dir: &Path, body: &[u8]) -> State {
        let (state, spare) = (dir.join("state.json"), dir.join(".state.spare"));
        fs::write(&state, body).unwrap();
        fs::write(&spare, body).unwrap();
        let cstr = |p: &Path| [p.as_os_str().as_bytes(), b"\0"].concat();
        State {
            spare_c: cstr(&spare),
            state_c: cstr(&state),
            spare,
        }
    }

    fn rewrite(&self, bytes: &[u8]) {
        fs::write(&self.spare, bytes).unwrap();
        // SAFETY: both paths are NUL-terminated buffers that outlive the call.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                self.spare_c.as_ptr().cast(),
                libc::AT_FDCWD,
                self.state_c.as_ptr().cast(),
                libc::RENAME_EXCHANGE,
            )
        };
        assert_eq!(rc, 0, "renameat2 RENAME_EXCHANGE");
    }
}

/// A waitpoint's record log, appended to.
fn open_log(dir: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log.jsonl"))
        .unwrap()
}

/// Signals per second for `n` signals through the file work the layout needs and nothing else,
/// no fsync: per signal, read the spool file and unlink it, create the wake file (temp, then
/// rename into `new/`), rewrite the waitpoint's state over its spare (write the spare, then
/// `renameat2(RENAME_EXCHANGE)`), and append one line to the waitpoint's log. This is the
/// ceiling of the layout itself: what the daemon could reach with no overhead of its own. Also
/// returns the CPU this process spent per signal in that loop (us; the spool files' making
/// before it is left out), the least CPU the layout's file work costs a signal.
pub fn layout_floor(dir: &Path, n: usize, body: &[u8]) -> (f64, f64) {
    let (spool, new, wp) = (dir.join("spool"), dir.join("new"), dir.join("wp"));
    for d in [&spool, &new, &wp] {
        fs::create_dir_all(d).unwrap();
    }
    for i in 0..n {
        fs::write(spool.join(format!("{i}.json")), body).unwrap();
    }
    let state = State::new(&wp, body);
    let mut log = open_log(&wp);
    let mut buf = Vec::with_capacity(4096);
    let cpu = cpu_secs_self();
    let start = Instant::now();
    for i in 0..n {
        consume(&spool.join(format!("{i}.json")), &mut buf);
        make_wake(&new, &format!("{i}.json"), &buf);
        state.rewrite(&buf);
        log.write_all(&buf).unwrap();
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    (rate, (cpu_secs_self() - cpu) * 1e6 / n as f64)
}

/// [`layout_floor`] for `n_wp` waitpoints x `per` signals, taken `batch` at a time in the order
/// they are staged (round by round), the way the daemon batches them: per signal, read the
/// spool file and unlink it; per batch and waitpoint it touched, one append of its lines to the
/// log and one state rewrite over its spare; a wake for each of a waitpoint's first `wakes`
/// rounds (the engine's hourly cap: later rounds fold into the wake it holds). No fsync.
/// Returns signals per second and this process's CPU per signal (us).
pub fn layout_floor_batched(
    dir: &Path,
    (n_wp, per): (usize, usize),
    body: &[u8],
    batch: usize,
    wakes: usize,
) -> (f64, f64) {
    let (spool, new) = (dir.join("spool"), dir.join("new"));
    for d in [&spool, &new] {
        fs::create_dir_all(d).unwrap();
    }
    let mut names = Vec::with_capacity(n_wp * per);
    for round in 0..per {
        for i in 0..n_wp {
            let name = format!("{round:03}-{i:06}.json");
            fs::write(spool.join(&name), body).unwrap();
            names.push((name, i, round));
        }
    }
    let mut waitpoints: Vec<(State, File)> = (0..n_wp)
        .map(|i| {
            let wp = dir.join(format!("wp{i}"));
            fs::create_dir_all(&wp).unwrap();
            (State::new(&wp, body), open_log(&wp))
        })
        .collect();
    let mut lines: Vec<Vec<u8>> = vec![Vec::new(); n_wp];
    let mut buf = Vec::with_capacity(4096);
    let cpu = cpu_secs_self();
    let start = Instant::now();
    for chunk in names.chunks(batch) {
        let mut touched = Vec::new();
        for (name, i, round) in chunk {
            consume(&spool.join(name), &mut buf);
            if lines[*i].is_empty() {
                touched.push(*i);
            }
            lines[*i].extend_from_slice(&buf);
            if *round < wakes {
                make_wake(&new, name, &buf);
            }
        }
        for i in touched {
            let (state, log) = &mut waitpoints[i];
            log.write_all(&lines[i]).unwrap();
            lines[i].clear();
            state.rewrite(&buf);
        }
    }
    let n = names.len();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    (rate, (cpu_secs_self() - cpu) * 1e6 / n as f64)
}
