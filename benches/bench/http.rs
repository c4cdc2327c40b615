//! Row 5's load: a small HTTP/1.1 keep-alive client run from several threads at once, each
//! posting for a fixed time and timing every answer. It is the same client against the shim
//! and against the baseline server, so the ratio compares servers, not clients.
//!
//! Written on `std::net` rather than driving `wrk`: the benchmark stays self-contained (no
//! package to install) and bounded in time, and every answer's status code is checked, so a
//! run that got errors says so instead of reporting a fast rate.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// What one request of the load is.
#[derive(Clone)]
pub enum Request {
    /// `POST path` with this JSON body and a fresh `Idempotency-Key` each time, so every
    /// request is a new signal rather than a duplicate.
    Post { path: String, body: String },
    /// `GET path` (the shim's `/healthz`: HTTP alone, no engine).
    Get { path: String },
}

/// The outcome of a load run.
pub struct Load {
    /// Answers with the expected status code.
    pub ok: usize,
    /// Answers with any other code, and requests that got no answer.
    pub bad: usize,
    /// Wall time the clients ran, in seconds.
    pub secs: f64,
    /// Milliseconds from each request's first byte to its whole answer (expected ones only).
    pub latencies: Vec<f64>,
}

impl Load {
    /// Expected answers per second.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.secs
    }
}

/// Runs `clients` connections to `127.0.0.1:port` for `duration`, each sending `request`
/// back to back on one keep-alive connection (reconnecting if the server closes it), and
/// counting answers with status `expect`.
pub fn load(port: u16, request: &Request, clients: usize, duration: Duration, expect: u16) -> Load {
    let start = Instant::now();
    let deadline = start + duration;
    let threads: Vec<_> = (0..clients)
        .map(|tid| {
            let request = request.clone();
            std::thread::spawn(move || client(port, &request, tid, deadline, expect))
        })
        .collect();
    let mut total = Load {
        ok: 0,
        bad: 0,
        secs: 0.0,
        latencies: Vec::new(),
    };
    for t in threads {
        let (ok, bad, mut lat) = t.join().expect("a load client panicked");
        total.ok += ok;
        total.bad += bad;
        total.latencies.append(&mut lat);
    }
    total.secs = start.elapsed().as_secs_f64();
    total
}

/// One client: `(expected answers, other outcomes, latencies in ms)`.
fn client(
    port: u16,
    request: &Request,
    tid: usize,
    deadline: Instant,
    expect: u16,
) -> (usize, usize, Vec<f64>) {
    let (mut ok, mut bad, mut latencies) = (0, 0, Vec::new());
    let mut conn: Option<BufReader<TcpStream>> = None;
    let mut n = 0u64;
    while Instant::now() < deadline {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => {
                    s.set_nodelay(true).ok();
                    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
                    conn.insert(BufReader::new(s))
                }
                Err(_) => {
                    bad += 1;
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        n += 1;
        let bytes = render(request, port, &format!("bench-{tid}-{n}"));
        let t = Instant::now();
        match exchange(c, &bytes) {
            Ok((code, keep)) => {
                if code == expect {
                    ok += 1;
                    latencies.push(t.elapsed().as_secs_f64() * 1e3);
                } else {
                    bad += 1;
                }
                if !keep {
                    conn = None;
                }
            }
            Err(_) => {
                bad += 1;
                conn = None;
            }
        }
    }
    (ok, bad, latencies)
}

fn render(request: &Request, port: u16, key: &str) -> Vec<u8> {
    match request {
        Request::Post { path, body } => format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
Content-Length: {}\r\nIdempotency-Key: {key}\r\n\r\n{body}",
            body.len()
        ),
        Request::Get { path } => format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
    }
    .into_bytes()
}

/// Sends one request and reads its whole answer: `(status code, connection stays open)`.
fn exchange(c: &mut BufReader<TcpStream>, request: &[u8]) -> io::Result<(u16, bool)> {
    c.get_mut().write_all(request)?;
    let mut line = String::new();
    if c.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let code: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP answer: {line:?}")))?;
    let (length, close) = headers(c)?;
    let mut body = vec![0; length];
    c.read_exact(&mut body)?;
    Ok((code, !close))
}

/// Reads header lines up to the blank one (the first line already read): the
/// `Content-Length` (0 when absent) and whether `Connection: close` was said. Shared by the
/// client and the baseline server.
pub fn headers(r: &mut impl BufRead) -> io::Result<(usize, bool)> {
    let (mut length, mut close) = (0usize, false);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if line == "\r\n" {
            return Ok((length, close));
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        } else if lower.starts_with("connection:") && lower.contains("close") {
            close = true;
        }
    }
}
