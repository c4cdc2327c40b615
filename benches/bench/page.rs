//! Row 11: what open operator pages (`waitpoint ui`) cost the daemon at 10,000 waitpoints. Each
//! page is a client doing what the page's script does: `GET api/view` every 500 ms with the
//! last `ETag`, as its login (its cookie, at its place). Measured from outside: the daemon's CPU
//! from /proc while nothing happens, and signal latency (drop zone to wake) with the pages
//! polling against none.

use std::io::{Read, Write};
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

/// One `GET` on a connection of its own (`Connection: close`, read to the end).
fn get(port: u16, path: &str, headers: &[String]) -> Answer {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole head");
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let mut lines = head.lines();
    let code = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = all[split + 4..].to_vec();
    Answer {
        code,
        headers,
        body,
    }
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

/// `pages` clients polling the list as the page does, until `stop`; counts their 304s.
fn poll(
    port: u16,
    cookie: &str,
    place: &str,
    pages: usize,
    stop: &Arc<AtomicBool>,
    not_modified: &Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..pages)
        .map(|_| {
            let (cookie, path) = (cookie.to_owned(), format!("{place}api/view"));
            let (stop, not_modified) = (Arc::clone(stop), Arc::clone(not_modified));
            std::thread::spawn(move || {
                let mut etag: Option<String> = None;
                while !stop.load(Ordering::SeqCst) {
                    let mut headers = vec![cookie.clone()];
                    if let Some(t) = &etag {
                        headers.push(format!("If-None-Match: {t}"));
                    }
                    let a = get(port, &path, &headers);
                    match a.code {
                        200 => etag = a.header("etag").map(str::to_owned),
                        304 => {
                            not_modified.fetch_add(1, Ordering::SeqCst);
                        }
                        other => panic!("the page's poll got {other}"),
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        })
        .collect()
}

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
    let half = n_lat / 2;
    let lat = ours::arm(&home, n_lat, "lat", 1);
    let (daemon, port) = ours::start_shim(bins, &home);
    let cpu_over = |secs: Duration| {
        let c0 = daemon.cpu_secs();
        std::thread::sleep(secs);
        (daemon.cpu_secs() - c0) * 100.0 / secs.as_secs_f64()
    };
    let quiet = cpu_over(idle);
    let without = ours::drop_to_wake(&home.drop_zone(), &home, &lat[..half]);

    let (cookie, place) = log_in(bins, &home, port);
    let first = get(
        port,
        &format!("{place}api/view"),
        std::slice::from_ref(&cookie),
    );
    assert_eq!(first.code, 200);
    let stop = Arc::new(AtomicBool::new(false));
    let not_modified = Arc::new(AtomicU64::new(0));
    let pollers = poll(port, &cookie, &place, pages, &stop, &not_modified);
    // Every page has its list (the first poll of each is a 200) before anything is measured.
    std::thread::sleep(Duration::from_secs(2));
    let before = not_modified.load(Ordering::SeqCst);
    let polled = cpu_over(idle);
    let idle_304s = not_modified.load(Ordering::SeqCst) - before;
    let with = ours::drop_to_wake(&home.drop_zone(), &home, &lat[half..]);
    stop.store(true, Ordering::SeqCst);
    for p in pollers {
        p.join().unwrap();
    }
    drop(daemon);
    PageCost {
        idle_cpu_pct: (quiet, polled),
        latency: (without, with),
        list_bytes: first.body.len(),
        not_modified: idle_304s,
    }
}
