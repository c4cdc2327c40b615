//! Row 11: what open operator pages (`waitpoint ui`) cost the daemon at 10,000 waitpoints. Each
//! page is a client doing what the page's script does: `GET api/view` every 500 ms with the
//! last `ETag`, as its login (its cookie, at its place). Measured from outside: the daemon's CPU
//! from /proc while nothing happens, and signal latency (drop zone to wake) with the pages
//! polling against none.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use waitpoint::home::Home;

use crate::ours::{self, Bins};

/// What row 11 measured.
pub struct PageCost {
    /// Daemon CPU while idle, in % of one core: no page, then the pages polling.
    pub idle_cpu_pct: (f64, f64),
    /// Drop-zone-to-wake latencies (ms): no page, then the pages polling.
    pub latency: (Vec<f64>, Vec<f64>),
    /// The list's size as the page receives it (bytes), and 304s answered while idle.
    pub list_bytes: usize,
    pub not_modified: u64,
    /// Times the list was built while idle.
    pub idle_builds: u64,
    /// A poll's wall time right after a change (the list built again and sent), ms.
    pub build_ms: Vec<f64>,
}

/// One answer: status, headers (names lowercased) and body.
struct Answer {
    code: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A keep-alive connection to the shim, as a browser holds one per page.
struct Conn {
    port: u16,
    r: BufReader<TcpStream>,
}

impl Conn {
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        Conn {
            port,
            r: BufReader::new(s),
        }
    }

    /// One `GET` and its whole answer; a connection the shim closed is opened again.
    fn get(&mut self, path: &str, headers: &[String]) -> Answer {
        let port = self.port;
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
        for h in headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        for _ in 0..2 {
            if let Some(a) = self.try_get(&req) {
                return a;
            }
            *self = Conn::open(port);
        }
        panic!("no answer to GET {path}");
    }

    fn try_get(&mut self, req: &str) -> Option<Answer> {
        self.r.get_mut().write_all(req.as_bytes()).ok()?;
        let mut status = String::new();
        if self.r.read_line(&mut status).ok()? == 0 {
            return None;
        }
        let code = status.split_whitespace().nth(1)?.parse().ok()?;
        let mut headers = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            if self.r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if line == "\r\n" {
                break;
            }
            if let Some((n, v)) = line.split_once(':') {
                headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        self.r.read_exact(&mut body).ok()?;
        Some(Answer {
            code,
            headers,
            body,
        })
    }
}

/// One `GET` on a connection of its own.
fn get(port: u16, path: &str, headers: &[String]) -> Answer {
    Conn::open(port).get(path, headers)
}

/// How many times the daemon has built the list, as it says in every answer to the page.
fn builds(a: &Answer) -> u64 {
    a.header(waitpoint::ingress::http::ui::BUILDS_HEADER)
        .and_then(|b| b.parse().ok())
        .expect("the builds header")
}

/// Logs in with `waitpoint ui`'s code: the cookie header and the page's place.
fn log_in(bins: &Bins, home: &Home, port: u16) -> (String, String) {
    let out = Command::new(&bins.waitpoint)
        .arg("ui")
        .env_clear()
        .env("CORTEX_HOME", home.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "waitpoint ui: {out:?}");
    let url = String::from_utf8(out.stdout).unwrap();
    let path = url
        .trim()
        .split_once(&format!(":{port}"))
        .unwrap()
        .1
        .to_owned();
    let a = get(port, &path, &[]);
    assert_eq!(a.code, 303, "{}", String::from_utf8_lossy(&a.body));
    let cookie = a.header("set-cookie").unwrap().split(';').next().unwrap();
    (
        format!("Cookie: {cookie}"),
        a.header("location").unwrap().to_owned(),
    )
}

/// What the polling pages are told, and what they count.
#[derive(Default)]
struct Pages {
    stop: AtomicBool,
    /// While set, the pages are closed: nothing is polled.
    closed: AtomicBool,
    not_modified: AtomicU64,
}

/// `pages` clients polling the list as the page does, until told to stop; they count their
/// 304s.
fn poll(
    port: u16,
    cookie: &str,
    place: &str,
    pages: usize,
    state: &Arc<Pages>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..pages)
        .map(|_| {
            let (cookie, path) = (cookie.to_owned(), format!("{place}api/view"));
            let state = Arc::clone(state);
            std::thread::spawn(move || {
                let mut conn = Conn::open(port);
                let mut etag: Option<String> = None;
                while !state.stop.load(Ordering::SeqCst) {
                    if state.closed.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    let mut headers = vec![cookie.clone()];
                    if let Some(t) = &etag {
                        headers.push(format!("If-None-Match: {t}"));
                    }
                    let a = conn.get(&path, &headers);
                    match a.code {
                        200 => etag = a.header("etag").map(str::to_owned),
                        304 => {
                            state.not_modified.fetch_add(1, Ordering::SeqCst);
                        }
                        other => panic!("the page's poll got {other}"),
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        })
        .collect()
}

/// ms from each signal's rename into the drop zone to its wake in the `lat` inbox, one at a
/// time, its files named for `round` (a name is a signal's identity: one used again would be a
/// duplicate).
fn drop_to_wake(home: &Home, armed: &[ours::Armed], round: usize) -> Vec<f64> {
    let mut inbox = crate::floor::Inotify::watch(&home.inbox_new("lat"));
    let drop_zone = home.drop_zone();
    armed
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let tmp = drop_zone.join(format!(".page-{round}-{i}.tmp"));
            std::fs::write(&tmp, ours::body(a, "ok")).unwrap();
            let t = std::time::Instant::now();
            std::fs::rename(&tmp, drop_zone.join(format!("page-{round}-{i:06}.json"))).unwrap();
            inbox.wait_for(&format!("{}.json", a.wp.wake_id(1)));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

/// Polls timed right after a change.
const BUILDS_TIMED: usize = 5;

/// Row 11: `n` waitpoints in sessions of 100, `n_lat` one-shot ones in session `lat` for the
/// latencies; a daemon with the shim; then idle CPU and latencies with no page, and with
/// `pages` pages polling.
pub fn page_cost(
    bins: &Bins,
    dir: &std::path::Path,
    n: usize,
    n_lat: usize,
    pages: usize,
    idle: Duration,
) -> PageCost {
    let home = ours::new_home(dir, ours::SHIM_SETTINGS);
    ours::arm_fast_with(&home, n, |i| format!("s{:03}", i / 100), |_, _| {});
    let mut lat = ours::arm(&home, n_lat + BUILDS_TIMED, "lat", 1);
    let timed = lat.split_off(n_lat);
    let (daemon, port) = ours::start_shim(bins, &home);
    let cpu_over = |secs: Duration| {
        let c0 = daemon.cpu_secs();
        std::thread::sleep(secs);
        (daemon.cpu_secs() - c0) * 100.0 / secs.as_secs_f64()
    };
    let quiet = cpu_over(idle);
    let (cookie, place) = log_in(bins, &home, port);
    let first = get(
        port,
        &format!("{place}api/view"),
        std::slice::from_ref(&cookie),
    );
    assert_eq!(first.code, 200);
    let state = Arc::new(Pages::default());
    let pollers = poll(port, &cookie, &place, pages, &state);
    // Every page has its list (the first poll of each is a 200) before anything is measured.
    std::thread::sleep(Duration::from_secs(2));
    let before = state.not_modified.load(Ordering::SeqCst);
    let list = format!("{place}api/view");
    let built = builds(&get(port, &list, std::slice::from_ref(&cookie)));
    let polled = cpu_over(idle);
    let idle_304s = state.not_modified.load(Ordering::SeqCst) - before;
    let idle_builds = builds(&get(port, &list, std::slice::from_ref(&cookie))) - built;
    // The latencies in rounds, the pages closed and open in turn, so a drift of this machine
    // favours neither.
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let rounds = 4;
    for (round, chunk) in lat.chunks(n_lat.div_ceil(rounds)).enumerate() {
        let open = round % 2 == 1;
        state.closed.store(!open, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(600));
        let times = drop_to_wake(&home, chunk, round);
        if open { &mut with } else { &mut without }.extend(times);
    }
    state.stop.store(true, Ordering::SeqCst);
    for p in pollers {
        p.join().unwrap();
    }
    // What one poll costs after a change: the list built again and sent.
    let mut build_ms = Vec::new();
    for (i, a) in timed.iter().enumerate() {
        drop_to_wake(&home, std::slice::from_ref(a), 100 + i);
        let t = std::time::Instant::now();
        let a = get(port, &list, std::slice::from_ref(&cookie));
        assert_eq!(a.code, 200);
        build_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(daemon);
    PageCost {
        idle_cpu_pct: (quiet, polled),
        latency: (without, with),
        list_bytes: first.body.len(),
        not_modified: idle_304s,
        idle_builds,
        build_ms,
    }
}
