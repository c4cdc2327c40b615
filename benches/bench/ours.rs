//! Our side of each row: homes filled through the library, the real release binaries run as
//! child processes, and what they cost measured from outside (wall time, /proc).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use waitpoint::clock::SystemClock;
use waitpoint::durable;
use waitpoint::engine::{CreateRequest, Engine};
use waitpoint::home::Home;
use waitpoint::records::Waitpoint;
use waitpoint::settings::Settings;

use waitpoint::sender::{Published, published_endpoint};

use crate::floor::{Inotify, percentile};
use crate::http::{Load, Request, load};

/// The release binaries under test.
pub struct Bins {
    pub waitpoint: PathBuf,
    pub cortex_signal: PathBuf,
}

/// A home for one row, with `settings.json`.
pub fn new_home(dir: &Path, settings: &str) -> Home {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("settings.json"), settings).unwrap();
    let home = Home::new(dir);
    home.ensure().unwrap();
    home
}

/// An engine on the store the home's settings name (its files, or a cluster).
pub fn engine(home: &Home) -> Engine {
    let settings = Settings::load(&home.settings_file(), |_| None).unwrap();
    Engine::open(
        home.clone(),
        settings,
        Arc::new(SystemClock),
        waitpoint::store::Role::Command,
    )
    .unwrap()
}

fn request(session: &str, max_signals: u32) -> CreateRequest {
    CreateRequest {
        fail_fast: false,
        max_signals,
        expires_in_hours: Some(24.0),
        ..CreateRequest::new("bench", "measure the engine", session)
    }
}

/// An armed waitpoint and the secret to signal it with.
pub struct Armed {
    pub wp: Waitpoint,
    pub secret: String,
}

/// Arms `n` waitpoints through the engine (every write fsynced, as in real use).
pub fn arm(home: &Home, n: usize, session: &str, max_signals: u32) -> Vec<Armed> {
    let e = engine(home);
    (0..n)
        .map(|_| {
            let c = e.create(request(session, max_signals)).unwrap();
            Armed {
                wp: c.waitpoint,
                secret: c.secret,
            }
        })
        .collect()
}

/// Arms `n` waitpoints fast: one through the engine, the rest copies of it with fresh ids
/// written without fsync (setting up a benchmark need not survive a power cut). `session_of`
/// names each copy's session (which is also its channel); `tweak` changes each copy (given
/// its index) before it is written.
pub fn arm_fast_with(
    home: &Home,
    n: usize,
    session_of: impl Fn(usize) -> String,
    tweak: impl Fn(&mut Waitpoint, usize),
) -> Armed {
    let template = arm(home, 1, &session_of(0), 1).pop().unwrap();
    for i in 1..n {
        let mut wp = template.wp.clone();
        tweak(&mut wp, i);
        wp.id = format!("wp_{:012x}", 0x0b00_0000_0000u64 + i as u64);
        wp.session = session_of(i);
        wp.channel = wp.session.clone();
        // The shape `create` leaves: the state, its empty spare and an empty record log.
        let dir = home.waitpoint_dir(&wp.id);
        fs::create_dir_all(&dir).unwrap();
        fs::write(home.signal_log(&wp.id), b"").unwrap();
        fs::write(dir.join("waitpoint.json"), durable::to_pretty_json(&wp)).unwrap();
        fs::write(dir.join(durable::spare_name("waitpoint.json")), b"").unwrap();
        // Its session's index marker, as `create` commits it before the waitpoint appears.
        let index = home.session_index(&wp.session);
        fs::create_dir_all(&index).unwrap();
        fs::write(index.join(&wp.id), b"").unwrap();
    }
    // Every waitpoint has its markers: the index is complete, as in a home `create` made.
    fs::write(home.session_index_complete(), b"").unwrap();
    template
}

pub fn body(a: &Armed, status: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": a.wp.id, "secret": a.secret, "status": status, "message": "exit=0",
    }))
    .unwrap()
}

/// A running `waitpoint daemon`, stopped (SIGTERM) on drop.
pub struct Daemon {
    pub child: Child,
    stderr: PathBuf,
}

impl Daemon {
    pub fn start(bins: &Bins, home: &Home) -> Daemon {
        let stderr = home.root().join("daemon.stderr");
        let child = Command::new(&bins.waitpoint)
            .arg("daemon")
            .env("CORTEX_HOME", home.root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Daemon { child, stderr }
    }

    /// Waits for the "daemon ready" line (bounded).
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        let log = self.stderr.with_file_name("log").join("daemon.log");
        while Instant::now() < deadline {
            for f in [&self.stderr, &log] {
                if fs::read_to_string(f).is_ok_and(|t| t.contains("daemon ready")) {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("daemon never became ready");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident set (VmHWM) in MB.
    pub fn peak_rss_mb(&self) -> f64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb / 1024.0
    }

    /// User + system CPU seconds used so far.
    pub fn cpu_secs(&self) -> f64 {
        cpu_secs(self.pid())
    }
}

/// User + system CPU seconds process `pid` has used so far.
pub fn cpu_secs(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signals our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

pub fn pending_json(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.ends_with(".json") && !n.starts_with('.')
        })
        .count()
}

/// Waits until every one of `names` has left `drop_zone`, told by `removed` (a watch for
/// removals set before they were renamed in). Listing a drop zone of thousands of files every
/// millisecond instead took a good part of a core and the directory's lock from the daemon
/// being measured. A lost count (the queue overflowed) falls back to listing.
fn wait_removed(mut removed: Inotify, drop_zone: &Path, names: &[String]) {
    let mut left: std::collections::HashSet<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    while !left.is_empty() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the drop zone to empty"
        );
        if !removed.ready(1000) {
            continue;
        }
        let name = removed.next();
        if name.is_empty() {
            wait_until("the drop zone to empty", || pending_json(drop_zone) == 0);
            return;
        }
        left.remove(name.as_slice());
    }
}

pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Writes `per` signals of `status` to each of `armed` into `stage` (outside any drop zone),
/// named in the order they are to be renamed in; returns the names.
pub fn stage_signals(stage: &Path, armed: &[Armed], per: usize, status: &str) -> Vec<String> {
    fs::create_dir_all(stage).unwrap();
    let mut names = Vec::new();
    for round in 0..per {
        for (i, a) in armed.iter().enumerate() {
            let name = format!("{round:03}-{i:06}.json");
            fs::write(stage.join(&name), body(a, status)).unwrap();
            names.push(name);
        }
    }
    names
}

/// Row 1's input: a home with `n_wp` armed monitors and `per_wp` `ok` signals to each staged
/// beside it, and a copy of the same files staged for the SQLite peer.
pub struct IngestSetup {
    pub home: Home,
    pub armed: Vec<Armed>,
    pub stage: PathBuf,
    pub names: Vec<String>,
    /// The same files, for the peer.
    pub peer_stage: PathBuf,
    /// When the last waitpoint was armed.
    pub armed_at: Instant,
}

pub fn ingest_setup(dir: &Path, n_wp: usize, per_wp: usize) -> IngestSetup {
    let home = new_home(dir, r#"{"waitpointSweepMs": 30000}"#);
    let armed = arm(&home, n_wp, "bench", 10_000);
    let armed_at = Instant::now();
    let stage = home.root().join("tmp").join("stage");
    let names = stage_signals(&stage, &armed, per_wp, "ok");
    let peer_stage = dir.with_extension("peer-stage");
    let _ = fs::remove_dir_all(&peer_stage);
    fs::create_dir_all(&peer_stage).unwrap();
    for name in &names {
        fs::copy(stage.join(name), peer_stage.join(name)).unwrap();
    }
    IngestSetup {
        home,
        armed,
        stage,
        names,
        peer_stage,
        armed_at,
    }
}

/// Row 1: signals/s from the drop zone to committed state, the staged signals all renamed
/// into the drop zone at once while the daemon runs.
pub fn ingest(bins: &Bins, setup: &IngestSetup) -> Ingest {
    let (home, stage, names) = (&setup.home, &setup.stage, &setup.names);
    // A job reports long after its waitpoint was armed; in the first second a state's spare
    // is still resting (`durable::SPARE_REST`) and its rewrite makes a new file. The signals
    // arrive once that second is over, as a job's would.
    std::thread::sleep(durable::SPARE_REST.saturating_sub(setup.armed_at.elapsed()));
    let daemon = Daemon::start(bins, home);
    daemon.wait_ready();
    let drop_zone = home.drop_zone();
    let removed = Inotify::watch_for(&drop_zone, libc::IN_DELETE | libc::IN_MOVED_FROM);
    let cpu = daemon.cpu_secs();
    let t = Instant::now();
    for name in names {
        fs::rename(stage.join(name), drop_zone.join(name)).unwrap();
    }
    wait_removed(removed, &drop_zone, names);
    let rate = names.len() as f64 / t.elapsed().as_secs_f64();
    // The CPU window goes on until the reaper has removed what the batches moved to the trash:
    // that work left the commit path, not the daemon. (The checkpoint's syncfs, every 5 s, is
    // outside it.)
    let trash = home.root().join("tmp").join("trash");
    wait_until("the trash to empty", || {
        fs::read_dir(&trash).map_or(true, |d| d.count() == 0)
    });
    let cpu_us = (daemon.cpu_secs() - cpu) * 1e6 / names.len() as f64;
    drop(daemon);
    // Never lose or double-count: every signal is recorded exactly once.
    let e = engine(home);
    let recorded: u64 = e.list().unwrap().iter().map(|w| w.counters.signals).sum();
    assert_eq!(recorded as usize, names.len(), "recorded signals");
    Ingest { rate, cpu_us }
}

/// Row 1's figures for one round.
pub struct Ingest {
    /// Signals per second, drop zone to committed.
    pub rate: f64,
    /// The daemon's CPU time (user + system, all threads, the reaper's removals included) per
    /// signal, in microseconds; `/proc` counts it in 10 ms ticks.
    pub cpu_us: f64,
}

/// Row 2: ms from a signal file's rename into the drop zone to its wake in the inbox, over `n`
/// sequential signals to `n` one-shot waitpoints.
pub fn latency(bins: &Bins, dir: &Path, n: usize) -> Vec<f64> {
    let home = new_home(dir, r#"{"waitpointSweepMs": 30000}"#);
    let armed = arm(&home, n, "lat", 1);
    let daemon = Daemon::start(bins, &home);
    daemon.wait_ready();
    let times = drop_to_wake(&home.drop_zone(), &home, &armed);
    drop(daemon);
    times
}

/// ms from each signal's rename into `drop_zone` to its wake in `inbox_home`'s `lat` inbox,
/// one signal at a time (the waitpoints armed for session `lat`).
pub fn drop_to_wake(drop_zone: &Path, inbox_home: &Home, armed: &[Armed]) -> Vec<f64> {
    let mut inbox = Inotify::watch(&inbox_home.inbox_new("lat"));
    let mut times = Vec::with_capacity(armed.len());
    for (i, a) in armed.iter().enumerate() {
        let tmp = drop_zone.join(format!(".lat-{i}.tmp"));
        fs::write(&tmp, body(a, "ok")).unwrap();
        let t = Instant::now();
        fs::rename(&tmp, drop_zone.join(format!("lat-{i:06}.json"))).unwrap();
        inbox.wait_for(&format!("{}.json", a.wp.wake_id(1)));
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times
}

/// Mean wall ms per run of `cmd` over `n` runs (after one warm-up run).
pub fn per_invocation(n: usize, mut cmd: impl FnMut() -> Command) -> f64 {
    let run = |c: &mut Command| {
        let st = c
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "{c:?} failed");
    };
    run(&mut cmd());
    let t = Instant::now();
    for _ in 0..n {
        run(&mut cmd());
    }
    t.elapsed().as_secs_f64() * 1e3 / n as f64
}

/// A daemon on `home` with the HTTP shim enabled on a free loopback port (the home's settings
/// must say so), and that port once the shim has published it.
pub fn start_shim(bins: &Bins, home: &Home) -> (Daemon, u16) {
    let daemon = Daemon::start(bins, home);
    daemon.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Published::Up(url) = published_endpoint(home) {
            return (daemon, url.port);
        }
        assert!(
            Instant::now() < deadline,
            "the shim never published its address"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// How many signals `a`'s waitpoint has recorded (read once its daemon is stopped).
fn recorded(home: &Home, a: &Armed) -> u64 {
    let wp = engine(home).load(&a.wp.id).unwrap().expect("the waitpoint");
    wp.counters.signals
}

/// Settings for a home whose daemon runs the shim on a port the kernel picks.
pub const SHIM_SETTINGS: &str =
    r#"{"waitpointSweepMs": 30000, "webhook": {"enabled": true, "port": 0}}"#;

/// Row 3: `cortex-signal` on the spool path (a home with no daemon), `curl` posting the same
/// JSON to the shim of a running daemon (so each post is a signal recorded durably before its
/// 202), and `/bin/true`; ms each.
pub fn invocations(bins: &Bins, dir: &Path, n: usize) -> (f64, f64, f64) {
    let home = new_home(&dir.join("spool"), "{}");
    let a = arm(&home, 1, "inv", 10_000).pop().unwrap();
    let ours = per_invocation(n, || {
        let mut c = Command::new(&bins.cortex_signal);
        c.args(["--status", "progress", "--message", "tick"])
            .env_clear()
            .env("CORTEX_HOME", home.root())
            .env("CORTEX_SIGNAL_ID", &a.wp.id)
            .env("CORTEX_SIGNAL_SECRET", &a.secret);
        c
    });
    let shim_home = new_home(&dir.join("shim"), SHIM_SETTINGS);
    let s = arm(&shim_home, 1, "inv", 10_000).pop().unwrap();
    let (daemon, port) = start_shim(bins, &shim_home);
    let json = String::from_utf8(body(&s, "progress")).unwrap();
    let url = format!("http://127.0.0.1:{port}/webhook/signal");
    let curl = per_invocation(n, || {
        let mut c = Command::new("curl");
        // --fail: an answer other than 2xx fails the run instead of being timed.
        c.args([
            "-sS",
            "--fail",
            "-XPOST",
            &url,
            "-H",
            "Content-Type: application/json",
        ])
        .args(["-d", &json]);
        c
    });
    drop(daemon);
    let recorded = recorded(&shim_home, &s);
    // One warm-up run, then n timed ones: every 202 is a recorded signal.
    assert_eq!(recorded as usize, n + 1, "signals the shim recorded");
    let truth = per_invocation(n, || Command::new("/bin/true"));
    (ours, curl, truth)
}

/// Row 5's figures: the shim under load against the static-202 server, same client.
pub struct ShimLoad {
    pub signals: Load,
    pub health: Load,
    pub floor: Load,
}

/// Row 5: `clients` keep-alive connections posting `progress` signals to the static-202 server
/// on `floor_port` for `duration`, then the same posts to the shim (each a fresh
/// `Idempotency-Key`, so each 202 is a new signal, durable before its answer), then
/// `GET /healthz` on the shim. Checks that the waitpoint recorded exactly the signals answered
/// 202.
pub fn shim_throughput(
    bins: &Bins,
    dir: &Path,
    clients: usize,
    duration: Duration,
    floor_port: u16,
) -> ShimLoad {
    let home = new_home(dir, SHIM_SETTINGS);
    let a = arm(&home, 1, "load", 1).pop().unwrap();
    let post = Request::Post {
        path: "/webhook/signal".into(),
        body: String::from_utf8(body(&a, "progress")).unwrap(),
    };
    let floor = load(floor_port, &post, clients, duration, 202);
    let (daemon, port) = start_shim(bins, &home);
    let signals = load(port, &post, clients, duration, 202);
    let health = load(
        port,
        &Request::Get {
            path: "/healthz".into(),
        },
        clients,
        duration,
        200,
    );
    drop(daemon);
    let recorded = recorded(&home, &a);
    assert_eq!(
        recorded as usize, signals.ok,
        "every 202 is one recorded signal"
    );
    ShimLoad {
        signals,
        health,
        floor,
    }
}

/// One point of row 4.
pub struct ScalePoint {
    pub first_start_ms: f64,
    pub start_ms: f64,
    pub rss_mb: f64,
    pub check_ms: f64,
    pub idle_cpu_s_per_min: f64,
}

/// Row 4 at one size: `n` armed waitpoints, 10 of them in the session that is checked.
pub fn scale(bins: &Bins, dir: &Path, n: usize, idle: Duration) -> ScalePoint {
    let (home, template) = scale_home(dir, n, false);
    let first_start_ms = start_to_first_signal(bins, &home, &template).0;
    let (start_ms, daemon) = start_to_first_signal(bins, &home, &template);
    let rss_mb = daemon.peak_rss_mb();
    let cpu0 = daemon.cpu_secs();
    std::thread::sleep(idle);
    let idle_cpu_s_per_min = (daemon.cpu_secs() - cpu0) * 60.0 / idle.as_secs_f64();
    drop(daemon);
    let check_ms = per_invocation(20, || {
        let mut c = Command::new(&bins.waitpoint);
        c.args(["check", "--session", "me", "--json"])
            .env_clear()
            .env("CORTEX_HOME", home.root());
        c
    });
    ScalePoint {
        first_start_ms,
        start_ms,
        rss_mb,
        check_ms,
        idle_cpu_s_per_min,
    }
}

/// Row 7: what the silence watches cost at `n` armed, against the same home without them.
pub struct WatchCost {
    /// Median start to first collected signal, without and with the watches (ms).
    pub start_ms: (f64, f64),
    /// Daemon CPU while idle, without and with (s per minute).
    pub idle_cpu: (f64, f64),
    /// Peak RSS after the start, without and with (MB).
    pub rss_mb: (f64, f64),
}

/// Builds both homes first, then starts their daemons in turn (plain, watched, watched, plain,
/// ...) so both are measured under the same conditions (the writeback of a freshly generated
/// home, the page cache), and takes the medians.
pub fn watch_cost(bins: &Bins, dir: &Path, n: usize, idle: Duration) -> WatchCost {
    let homes = [
        scale_home(&dir.join("plain"), n, false),
        scale_home(&dir.join("watched"), n, true),
    ];
    let mut starts: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..4 {
        for k in [round % 2, 1 - round % 2] {
            let (home, template) = &homes[k];
            starts[k].push(start_to_first_signal(bins, home, template).0);
        }
    }
    let mut idle_cpu = [0.0; 2];
    let mut rss = [0.0; 2];
    for (k, (home, template)) in homes.iter().enumerate() {
        let (_, daemon) = start_to_first_signal(bins, home, template);
        rss[k] = daemon.peak_rss_mb();
        let cpu0 = daemon.cpu_secs();
        std::thread::sleep(idle);
        idle_cpu[k] = (daemon.cpu_secs() - cpu0) * 60.0 / idle.as_secs_f64();
    }
    WatchCost {
        start_ms: (p(&starts[0], 50.0), p(&starts[1], 50.0)),
        idle_cpu: (idle_cpu[0], idle_cpu[1]),
        rss_mb: (rss[0], rss[1]),
    }
}

/// A generated home of `n` armed waitpoints, 10 of them in session `me`. With `watches`, both
/// silence watches are set on every one: half never reported (the started_within watch is due
/// in 6 h), half reported just now (the heartbeat_within watch is due in 1 h), so each holds a
/// place in the due queue.
fn scale_home(dir: &Path, n: usize, watches: bool) -> (Home, Armed) {
    let home = new_home(dir, r#"{"waitpointSweepMs": 30000}"#);
    let mine = 10;
    let now = waitpoint::clock::Clock::now(&SystemClock);
    let template = arm_fast_with(
        &home,
        n,
        |i| {
            if i < mine {
                "me".to_owned()
            } else {
                format!("s{}", i / 100)
            }
        },
        |wp, i| {
            if watches {
                wp.silence.started_within_ms = Some(6 * 3_600_000);
                wp.silence.heartbeat_within_ms = Some(3_600_000);
                wp.silence.last_report = (i % 2 == 1).then_some(waitpoint::records::LastReport {
                    seq: 1,
                    at: now,
                    status: waitpoint::records::SignalStatus::Progress,
                    message: None,
                });
            }
        },
    );
    (home, template)
}

/// Starts the daemon with one signal file waiting and times start to that file's collection.
fn start_to_first_signal(bins: &Bins, home: &Home, a: &Armed) -> (f64, Daemon) {
    let drop_zone = home.drop_zone();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("first-{nanos}.json");
    let path = drop_zone.join(&name);
    fs::write(&path, body(a, "progress")).unwrap();
    let t = Instant::now();
    let daemon = Daemon::start(bins, home);
    wait_until("the first signal to be collected", || !path.exists());
    let ms = t.elapsed().as_secs_f64() * 1e3;
    daemon.wait_ready();
    (ms, daemon)
}

pub fn p(values: &[f64], q: f64) -> f64 {
    percentile(&mut values.to_vec(), q)
}
