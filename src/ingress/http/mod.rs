//! The optional loopback HTTP shim: `POST /webhook/signal`; the callback routes
//! `POST /api/callbacks/wake/<token>` and `POST /api/callbacks/enqueue/<token>` (and their short
//! forms `/callbacks/<mode>/<token>`); the authenticated control routes of [`super::control`],
//! only when the daemon holds an operator token; and `GET /healthz`. Nothing else.
//!
//! This is the only code that speaks HTTP on the server side. It turns a request into a
//! [`SignalRequest`] with the same [`parse_signal`] the drop zone uses, hands it to whoever
//! applies signals (the daemon loop, through a [`Submit`] callback) and answers with the status
//! code the spec gives the verdict, only after the verdict is durable.
//!
//! It is written on `std::net` with `httparse` for the request head rather than on tiny_http,
//! because every hardening point the shim needs fights tiny_http 0.12's design: it spawns one
//! thread per open connection with no limit, sets no socket timeouts, grows a header line
//! without bound, and on dropping a request whose body was not read it allocates a buffer of the
//! *declared* `Content-Length` (`vec![0; remaining]`), so a single request declaring an absurd
//! length aborts the process. Here instead:
//!
//! - One reactor thread owns the listener and every waiting connection, waits on them with
//!   `poll(2)` and reads whatever arrives without blocking. A connection goes to one of the
//!   [`WORKERS`] only once a whole request is buffered, so idle or slow clients never hold a
//!   thread; workers never read from a socket. At most [`MAX_CONNECTIONS`] are open (the least
//!   active waiting one is closed to make room); an idle one is closed after [`IDLE_TIMEOUT`].
//! - A request must arrive whole within [`REQUEST_TIMEOUT`] of its first byte (a deadline, not a
//!   per-read timeout, so dripping a byte at a time buys nothing). The head is capped at
//!   [`MAX_HEAD_BYTES`]. `Content-Length` is checked before a byte of the body is read: over
//!   [`MAX_BODY_BYTES`] is answered 413 at once, and the rest of what the client sends is read
//!   into a fixed buffer and dropped for at most a second before closing, so it sees the answer.
//!   Nothing is ever sized from a number the client sent; a connection buffers at most one head
//!   and one body.
//! - The `Host` header must name a loopback address or `localhost` (DNS rebinding), and any
//!   request carrying an `Origin` header is refused: a web page must not be able to spend the
//!   miss budget. Both are checked before the budget.
//! - Unknown ids and wrong secrets share one budget of [`MISS_BUDGET`] per [`MISS_WINDOW_MS`],
//!   read from the daemon's clock; while it is spent, signal requests get 429.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::clock::{Clock, Timestamp};
use crate::engine::callbacks::{self, Trigger};
use crate::engine::{Refusal, Verdict};
use crate::error::{Error, Result};
use crate::ingress::control::{self, ControlOutcome, ControlRequest};
use crate::ingress::{CallbackRequest, MAX_BODY_BYTES, SignalRequest, parse_signal};
use crate::model::CallbackMode;
use crate::model::WebhookAddress;
use crate::store;

mod framing;
mod routes;

use framing::*;

pub use routes::MissBudget;
use routes::route;

/// The port used when neither `--port`, settings nor `WEBHOOK_PORT` name one.
pub const DEFAULT_PORT: u16 = 3001;
/// The signal route.
pub const SIGNAL_PATH: &str = "/webhook/signal";
/// The liveness route.
pub const HEALTH_PATH: &str = "/healthz";
/// Misses (unknown ids and wrong secrets) allowed per window before the route answers 429.
pub const MISS_BUDGET: usize = 60;
/// The miss budget's sliding window.
pub const MISS_WINDOW_MS: i64 = 60_000;
/// Worker threads; the reactor is one more.
pub const WORKERS: usize = 4;
/// Open connections at most, idle or busy.
pub const MAX_CONNECTIONS: usize = 1024;
/// An idle keep-alive connection is closed after this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request's head and body must have arrived within this long of its first byte being read.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// The longest `Idempotency-Key`.
pub const MAX_KEY_CHARS: usize = 128;
const MAX_HEADERS: usize = 32;
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// After answering a request whose body was left unread, how long and how much of it is read
/// and thrown away before closing, so the client sees the answer rather than a reset.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1024 * 1024;
const CHUNK: usize = 8 * 1024;

/// Where the shim listens: a loopback address only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    pub addr: SocketAddr,
    /// SHA-256 of the operator token (`CORTEX_WEBHOOK_TOKEN`) the control routes require; no
    /// token, no control routes.
    pub control_token_sha256: Option<String>,
}

impl HttpConfig {
    /// `bind` is an IP literal or `localhost`; anything that is not loopback is refused, since
    /// the shim has no authentication beyond each waitpoint's secret and is meant for jobs on
    /// this machine only.
    pub fn new(bind: &str, port: u16) -> Result<Self> {
        let ip: IpAddr = if bind.eq_ignore_ascii_case("localhost") {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            let literal = bind.trim_start_matches('[').trim_end_matches(']');
            literal.parse().map_err(|_| {
                Error::Usage(format!(
                    "--bind {bind:?} is not an IP address; the webhook binds a loopback address \
such as 127.0.0.1 or ::1"
                ))
            })?
        };
        if !ip.is_loopback() {
            return Err(Error::Usage(format!(
                "refusing to bind the webhook to {ip}: it listens on loopback only (127.0.0.0/8 \
or ::1). A job on another machine should drop a signal file instead (create with --device)"
            )));
        }
        Ok(HttpConfig {
            addr: SocketAddr::new(ip, port),
            control_token_sha256: None,
        })
    }

    /// Turns the control routes on for callers presenting `token` (kept only as its hash).
    pub fn with_control_token(mut self, token: Option<&str>) -> Self {
        self.control_token_sha256 = token.map(crate::secret::hash);
        self
    }

    /// Binds the listener (port 0 picks a free one), so a port in use is reported when the
    /// daemon starts rather than later.
    pub fn bind(&self) -> Result<Bound> {
        if !self.addr.ip().is_loopback() {
            return Err(Error::Usage(format!(
                "refusing to bind the webhook to {}: loopback only",
                self.addr
            )));
        }
        let listener = TcpListener::bind(self.addr)
            .map_err(|e| Error::io("cannot listen on", self.addr.to_string(), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("cannot read the address of", self.addr.to_string(), e))?;
        Ok(Bound {
            listener,
            addr,
            control: self.control_token_sha256.clone(),
        })
    }
}

/// A bound, not yet serving, listener.
#[derive(Debug)]
pub struct Bound {
    listener: TcpListener,
    addr: SocketAddr,
    control: Option<String>,
}

impl Bound {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Work handed to whoever applies it (the daemon's loop), with where to send the outcome. The
/// outcome must be sent only once it is durable; dropping the sender unanswered means nothing
/// was recorded.
pub enum Submission {
    /// `POST /webhook/signal`.
    Signal {
        request: SignalRequest,
        /// The idempotency key; the signal's identity is [`Source::Http`](super::Source::Http)
        /// of it.
        key: String,
        reply: Sender<Result<Verdict>>,
    },
    /// `POST /api/callbacks/<mode>/<token>`; `key` is the request's `Idempotency-Key`, the
    /// trigger's identity, when it sent one.
    Callback {
        request: CallbackRequest,
        key: Option<String>,
        reply: Sender<Result<Trigger>>,
    },
    /// An authenticated control operation.
    Control {
        request: ControlRequest,
        reply: Sender<Result<ControlOutcome>>,
    },
}

impl std::fmt::Debug for Submission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Submission::Signal { request, key, .. } => f
                .debug_struct("Submission::Signal")
                .field("request", request)
                .field("key", key)
                .finish_non_exhaustive(),
            Submission::Callback { request, .. } => f
                .debug_struct("Submission::Callback")
                .field("request", request)
                .finish_non_exhaustive(),
            Submission::Control { request, .. } => f
                .debug_struct("Submission::Control")
                .field("request", request)
                .finish_non_exhaustive(),
        }
    }
}

/// Hands a submission over; false when nobody is taking them any more (shutting down).
pub type Submit = Box<dyn Fn(Submission) -> bool + Send + Sync>;

struct Shared {
    submit: Submit,
    /// Where the shim listens (a reset's trigger URL names it).
    addr: SocketAddr,
    /// SHA-256 of the operator token; `None` turns the control routes off.
    control: Option<String>,
    clock: Arc<dyn Clock>,
    budget: Mutex<MissBudget>,
    /// Connections handed to workers and not yet handed back or closed.
    busy: AtomicUsize,
    stop: AtomicBool,
}

/// The running shim. Stopping it (or dropping it) closes the listener and every connection the
/// reactor holds, and removes the address file.
pub struct Shim {
    addr: SocketAddr,
    shared: Arc<Shared>,
    waker: UnixStream,
    reactor: Option<JoinHandle<()>>,
    address_file: PathBuf,
}

impl Shim {
    /// Starts serving on `bound`, then publishes the address in `address_file`.
    pub fn start(
        bound: Bound,
        clock: Arc<dyn Clock>,
        submit: Submit,
        address_file: PathBuf,
    ) -> Result<Shim> {
        let Bound {
            listener,
            addr,
            control,
        } = bound;
        let what = addr.to_string();
        let io_err = |context: &'static str| {
            let what = what.clone();
            move |e| Error::io(context, what, e)
        };
        listener
            .set_nonblocking(true)
            .map_err(io_err("cannot set up"))?;
        let (waker, wake_rx) = UnixStream::pair().map_err(io_err("cannot make a waker for"))?;
        for end in [&waker, &wake_rx] {
            end.set_nonblocking(true).map_err(io_err("cannot set up"))?;
        }
        let shared = Arc::new(Shared {
            submit,
            addr,
            control,
            clock,
            budget: Mutex::new(MissBudget::default()),
            busy: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(WORKERS);
        let (back_tx, back_rx) = mpsc::channel::<Conn>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        for n in 0..WORKERS {
            let worker = Worker {
                shared: shared.clone(),
                jobs: jobs_rx.clone(),
                back: back_tx.clone(),
                waker: waker.try_clone().map_err(io_err("cannot set up"))?,
            };
            std::thread::Builder::new()
                .name(format!("webhook-{n}"))
                .spawn(move || worker.run())
                .map_err(io_err("cannot start a worker for"))?;
        }
        let reactor = Reactor {
            listener,
            shared: shared.clone(),
            wake_rx,
            back: back_rx,
            jobs: jobs_tx,
            conns: Vec::new(),
            queued: VecDeque::new(),
        };
        let handle = std::thread::Builder::new()
            .name("webhook".into())
            .spawn(move || reactor.run())
            .map_err(io_err("cannot start the reactor for"))?;
        let shim = Shim {
            addr,
            shared,
            waker,
            reactor: Some(handle),
            address_file,
        };
        let record = WebhookAddress {
            url: format!("http://{addr}{SIGNAL_PATH}"),
            addr: addr.to_string(),
            pid: std::process::id(),
            started_at: shim.shared.clock.now(),
        };
        store::commit_json(&shim.address_file, &record)?;
        tracing::info!(%addr, "webhook listening on http://{addr}{SIGNAL_PATH}");
        Ok(shim)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes the connections the reactor holds and removes the address file.
    /// A worker busy with a request finishes it (its verdict is sent if the loop still runs).
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let Some(reactor) = self.reactor.take() else {
            return;
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = (&self.waker).write(&[1]);
        let _ = reactor.join();
        if let Err(e) = store::remove_durably(&self.address_file) {
            tracing::error!("cannot remove the webhook address file: {e}");
        }
        tracing::info!(addr = %self.addr, "webhook stopped");
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Removes an address file a daemon that did not shut down cleanly left behind.
pub fn remove_stale_address(address_file: &std::path::Path) -> Result<()> {
    store::remove_durably(address_file)
}

/// An open connection and the bytes of its next request so far.
struct Conn {
    /// Non-blocking while the reactor holds it, blocking while a worker does.
    stream: TcpStream,
    buf: Vec<u8>,
    /// When the first byte of the request in `buf` arrived; `None` while idle.
    started: Option<Instant>,
    idle_since: Instant,
    continue_sent: bool,
    /// Set once an answer was sent without reading the body: the rest of what the client
    /// sends is read and thrown away until then (or `LINGER_BYTES`), and the connection closed.
    draining: Option<(Instant, usize)>,
    /// The client shut down its sending side after some bytes (`shutdown(SHUT_WR)`): a complete
    /// request in `buf` is still answered, then the connection closes.
    peer_closed: bool,
}

impl Conn {
    fn new(stream: TcpStream) -> Self {
        Conn {
            stream,
            buf: Vec::new(),
            started: None,
            idle_since: Instant::now(),
            continue_sent: false,
            draining: None,
            peer_closed: false,
        }
    }

    /// When the reactor gives up on this connection.
    fn deadline(&self) -> Instant {
        match (self.draining, self.started) {
            (Some((until, _)), _) => until,
            (None, Some(started)) => started + REQUEST_TIMEOUT,
            (None, None) => self.idle_since + IDLE_TIMEOUT,
        }
    }

    /// When it last showed a sign of life, for choosing whom to close when full.
    fn activity(&self) -> Instant {
        self.started.unwrap_or(self.idle_since)
    }

    /// Reads what is there without blocking, up to the most one request may take. `false`
    /// when the connection is finished (closed by the peer, failed, or drained enough).
    fn read_available(&mut self) -> bool {
        let mut chunk = [0u8; CHUNK];
        loop {
            if let Some((_, left)) = &mut self.draining {
                match (&self.stream).read(&mut chunk) {
                    Ok(0) => return false,
                    Ok(n) if n >= *left => return false,
                    Ok(n) => *left -= n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
                continue;
            }
            let room = MAX_REQUEST_BYTES.saturating_sub(self.buf.len()).min(CHUNK);
            if room == 0 {
                return true;
            }
            match (&self.stream).read(&mut chunk[..room]) {
                // The end of what the client sends: nothing more will come, but what came may
                // be a whole request, which it still waits to hear about.
                Ok(0) if self.buf.is_empty() => return false,
                Ok(0) => {
                    self.peer_closed = true;
                    return true;
                }
                Ok(n) => {
                    self.started.get_or_insert_with(Instant::now);
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// The callback routes' prefix, the spec's: `POST /api/callbacks/<wake|enqueue>/<token>`.
pub const CALLBACK_PREFIX: &str = "/api/callbacks/";
/// The callback routes' short form, `POST /callbacks/<wake|enqueue>/<token>`, kept for senders
/// configured with it.
pub const SHORT_CALLBACK_PREFIX: &str = "/callbacks/";

/// The URL a sender POSTs to. The token is the capability: treat the URL as a secret.
pub fn trigger_url(port: u16, mode: CallbackMode, token: &str) -> String {
    format!(
        "http://127.0.0.1:{port}{CALLBACK_PREFIX}{}/{token}",
        mode.as_str()
    )
}

/// A connection whose request is ready, and what it is.
struct Job {
    conn: Conn,
    ready: Ready,
}

struct Reactor {
    listener: TcpListener,
    shared: Arc<Shared>,
    wake_rx: UnixStream,
    back: Receiver<Conn>,
    jobs: SyncSender<Job>,
    /// Connections waiting for bytes (idle, mid-request, or draining).
    conns: Vec<Conn>,
    /// Ready requests no worker was free for yet.
    queued: VecDeque<Job>,
}

impl Reactor {
    fn run(mut self) {
        while !self.shared.stop.load(Ordering::SeqCst) {
            while let Ok(conn) = self.back.try_recv() {
                // Bytes of a pipelined next request may be here already.
                self.settle(conn);
            }
            if !self.dispatch_queued() {
                return;
            }
            let now = Instant::now();
            let (live, expired): (Vec<Conn>, Vec<Conn>) = std::mem::take(&mut self.conns)
                .into_iter()
                .partition(|c| c.deadline() > now);
            self.conns = live;
            for mut c in expired {
                if c.started.is_some() && c.draining.is_none() {
                    // Best effort: the socket is non-blocking and the answer tiny.
                    let r = refused(408, "the request did not arrive in time");
                    let _ = write_reply(&mut c.stream, &r, true, false);
                }
            }
            // With nothing to time out, sleep until woken (a connection, a worker, or stop).
            let wait = self
                .conns
                .iter()
                .map(|c| c.deadline().saturating_duration_since(now))
                .min();
            // poll(2) over every waiting connection, not an event library: the reactor waits on
            // at most MAX_CONNECTIONS + 2 descriptors, rebuilt each turn, which poll does in one
            // call with no registration to keep in step with the connection list.
            use rustix::event::{PollFd, PollFlags, Timespec};
            // Rounded up to the millisecond, so a deadline is not polled for in a busy loop.
            let timeout = wait.map(|w| {
                let ms = w
                    .as_millis()
                    .saturating_add(1)
                    .min(i64::MAX as u128 / 1_000_000) as i64;
                Timespec {
                    tv_sec: ms / 1000,
                    tv_nsec: (ms % 1000) * 1_000_000,
                }
            });
            let ready: Vec<bool> = {
                let mut fds: Vec<PollFd<'_>> = [
                    PollFd::new(&self.wake_rx, PollFlags::IN),
                    PollFd::new(&self.listener, PollFlags::IN),
                ]
                .into_iter()
                .chain(
                    self.conns
                        .iter()
                        .map(|c| PollFd::new(&c.stream, PollFlags::IN)),
                )
                .collect();
                match rustix::event::poll(&mut fds, timeout.as_ref()) {
                    Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        tracing::error!("webhook poll failed: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                }
            };
            if ready[0] {
                let mut sink = [0u8; 64];
                while matches!((&self.wake_rx).read(&mut sink), Ok(n) if n > 0) {}
            }
            // Highest index first, so `swap_remove` leaves the lower ones where `fds` says.
            let readable: Vec<usize> = (0..self.conns.len())
                .rev()
                .filter(|i| ready[i + 2])
                .collect();
            let mut touched = Vec::with_capacity(readable.len());
            for i in readable {
                let mut conn = self.conns.swap_remove(i);
                if conn.read_available() {
                    touched.push(conn);
                }
            }
            for conn in touched {
                self.settle(conn);
            }
            if ready[1] {
                self.accept_all();
            }
        }
    }

    /// Queues the connection's request for a worker when it is complete; otherwise keeps
    /// watching it.
    fn settle(&mut self, mut conn: Conn) {
        if conn.draining.is_some() || conn.buf.is_empty() {
            self.conns.push(conn);
            return;
        }
        match framing(&conn.buf) {
            Ok(ready) => self.queued.push_back(Job { conn, ready }),
            // Incomplete, and the client will send no more: nothing to answer.
            Err(_) if conn.peer_closed => drop(conn),
            Err(wants_continue) => {
                if wants_continue && !conn.continue_sent {
                    // curl and others wait for this before sending a larger body.
                    conn.continue_sent = true;
                    let _ = (&conn.stream).write(b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                self.conns.push(conn);
            }
        }
    }

    /// Hands queued requests to free workers; false when the workers are gone.
    fn dispatch_queued(&mut self) -> bool {
        while let Some(job) = self.queued.pop_front() {
            match self.jobs.try_send(job) {
                Ok(()) => {
                    self.shared.busy.fetch_add(1, Ordering::SeqCst);
                }
                Err(mpsc::TrySendError::Full(job)) => {
                    self.queued.push_front(job);
                    return true;
                }
                Err(mpsc::TrySendError::Disconnected(_)) => return false,
            }
        }
        true
    }

    fn open(&self) -> usize {
        self.conns.len() + self.queued.len() + self.shared.busy.load(Ordering::SeqCst)
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.open() >= MAX_CONNECTIONS && !self.close_least_active() {
                        // Every connection is in a worker's hands: refuse this one outright.
                        drop(stream);
                        continue;
                    }
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    self.conns.push(Conn::new(stream));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors or the like: make room if we can, and do not spin.
                    tracing::warn!("webhook cannot accept a connection: {e}");
                    if !self.close_least_active() {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    return;
                }
            }
        }
    }

    /// Closes the waiting connection that has been quiet longest, to make room.
    fn close_least_active(&mut self) -> bool {
        let oldest = self
            .conns
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.activity())
            .map(|(i, _)| i);
        match oldest {
            Some(i) => {
                self.conns.swap_remove(i);
                true
            }
            None => false,
        }
    }
}

struct Worker {
    shared: Arc<Shared>,
    jobs: Arc<Mutex<Receiver<Job>>>,
    back: Sender<Conn>,
    waker: UnixStream,
}

impl Worker {
    fn run(self) {
        loop {
            let next = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).recv();
            let Ok(job) = next else { return };
            if let Some(conn) = answer(&self.shared, job) {
                let _ = self.back.send(conn);
            }
            self.shared.busy.fetch_sub(1, Ordering::SeqCst);
            // Tell the reactor a worker is free (and maybe a connection came back).
            let _ = (&self.waker).write(&[1]);
        }
    }
}

/// Answers a ready request. Returns the connection when it stays open (for the next request,
/// or to drain a body that was not read).
fn answer(shared: &Shared, job: Job) -> Option<Conn> {
    let Job { mut conn, ready } = job;
    conn.stream.set_nonblocking(false).ok()?;
    conn.stream.set_write_timeout(Some(WRITE_TIMEOUT)).ok()?;
    let peer = conn.stream.peer_addr().ok();
    let (reply, head_only, keep_alive, consumed) = match ready {
        Ready::HeadTooLarge => (
            refused(
                431,
                format!("the request head is over {MAX_HEAD_BYTES} bytes"),
            ),
            false,
            false,
            None,
        ),
        Ready::BadHead(why) => (refused(400, why), false, false, None),
        Ready::HeadOnly(head) => (
            route(shared, &head, None, peer),
            head.method == "HEAD",
            false,
            None,
        ),
        Ready::Whole {
            head,
            head_len,
            total,
        } => (
            route(shared, &head, Some(&conn.buf[head_len..total]), peer),
            head.method == "HEAD",
            head.keep_alive() && !conn.peer_closed,
            Some(total),
        ),
    };
    let written = write_reply(&mut conn.stream, &reply, !keep_alive, head_only).is_ok();
    let now = Instant::now();
    match consumed {
        Some(total) if written && keep_alive => {
            conn.buf.drain(..total);
            conn.started = (!conn.buf.is_empty()).then_some(now);
            conn.idle_since = now;
            conn.continue_sent = false;
        }
        // Everything was read: a plain close.
        Some(_) => return None,
        None if !written => return None,
        None => {
            let _ = conn.stream.shutdown(Shutdown::Write);
            conn.buf = Vec::new();
            conn.draining = Some((now + LINGER, LINGER_BYTES));
        }
    }
    conn.stream.set_nonblocking(true).ok()?;
    Some(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_the_shim_sends_goes_out_with_its_reason_phrase() {
        for (code, phrase) in [
            (200, "OK"),
            (201, "Created"),
            (202, "Accepted"),
            (401, "Unauthorized"),
            (404, "Not Found"),
            (405, "Method Not Allowed"),
            (409, "Conflict"),
            (410, "Gone"),
            (413, "Payload Too Large"),
            (422, "Unprocessable Entity"),
            (429, "Too Many Requests"),
            (503, "Service Unavailable"),
        ] {
            assert_eq!(reason_phrase(code), phrase, "{code}");
        }
    }

    #[test]
    fn only_loopback_binds_are_accepted() {
        for ok in ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"] {
            assert!(HttpConfig::new(ok, 0).is_ok(), "{ok}");
        }
        for bad in [
            "0.0.0.0",
            "192.168.1.10",
            "::",
            "example.com",
            "::ffff:127.0.0.1",
        ] {
            let err = HttpConfig::new(bad, 0).unwrap_err();
            assert_eq!(err.kind(), crate::error::ErrorKind::Usage, "{bad}");
        }
        let msg = HttpConfig::new("0.0.0.0", 3001).unwrap_err().to_string();
        assert!(msg.contains("loopback"), "{msg}");
    }

    #[test]
    fn host_must_be_loopback_or_localhost() {
        for ok in [
            "127.0.0.1",
            "127.0.0.1:3001",
            "localhost",
            "LOCALHOST:80",
            "[::1]",
            "[::1]:3001",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:3001",
            "localhost.evil.example",
            "10.0.0.1:3001",
            "127.0.0.1:",
            "127.0.0.1:x",
            "[::1",
            "",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn the_budget_is_sixty_misses_in_a_sliding_minute() {
        let mut b = MissBudget::default();
        let t0 = Timestamp::from_millis(1_000_000);
        for i in 0..MISS_BUDGET {
            assert!(!b.spent(t0.plus_ms(i as i64)));
            b.record(t0.plus_ms(i as i64));
        }
        assert!(b.spent(t0.plus_ms(100)));
        // The first miss leaves the window one minute after it happened.
        assert!(b.spent(t0.plus_ms(MISS_WINDOW_MS - 1)));
        assert!(!b.spent(t0.plus_ms(MISS_WINDOW_MS)));
    }

    #[test]
    fn a_request_is_ready_only_when_whole_and_never_sized_by_its_claim() {
        let head = "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\n";
        assert_eq!(framing(head.as_bytes()), Err(false));
        assert_eq!(framing(&[b'a'; MAX_HEAD_BYTES]), Ok(Ready::HeadTooLarge));
        for claim in [
            "1000000000",
            "1000000000000000000",
            "99999999999999999999999",
        ] {
            let req = format!("{head}Content-Length: {claim}\r\n\r\nabc");
            let Ok(Ready::HeadOnly(h)) = framing(req.as_bytes()) else {
                panic!("{claim} is not answered from the head")
            };
            assert_eq!(body_length(&h).err().map(|r| r.code), Some(413));
        }
        let partial = format!("{head}Content-Length: 5\r\n\r\nabc");
        assert_eq!(framing(partial.as_bytes()), Err(false));
        let expecting = format!("{head}Content-Length: 5\r\nExpect: 100-continue\r\n\r\nabc");
        assert_eq!(framing(expecting.as_bytes()), Err(true));
        // Two pipelined requests: the first is ready, and only its bytes are taken.
        let first = format!("{head}Content-Length: 5\r\n\r\nabcde");
        let both = format!("{first}{first}");
        let Ok(Ready::Whole {
            head_len, total, ..
        }) = framing(both.as_bytes())
        else {
            panic!("not ready")
        };
        assert_eq!((total, total - head_len), (first.len(), 5));
        let chunked = format!("{head}Transfer-Encoding: chunked\r\n\r\n");
        assert!(matches!(
            framing(chunked.as_bytes()),
            Ok(Ready::HeadOnly(_))
        ));
    }

    #[test]
    fn heads_are_parsed_for_what_the_shim_checks() {
        let raw =
            b"POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1:3001\r\nContent-Length: 12\r\n\
Idempotency-Key: abc\r\nConnection: close\r\nExpect: 100-continue\r\n\r\n";
        let Ok(h) = parse_head(raw) else {
            panic!("does not parse")
        };
        assert_eq!((h.method.as_str(), h.path.as_str()), ("POST", SIGNAL_PATH));
        assert_eq!(h.content_length, vec!["12".to_owned()]);
        assert_eq!(h.idempotency_key.as_deref(), Some(&b"abc"[..]));
        assert!(h.expect_continue && h.connection_close && !h.keep_alive());
        let old = parse_head(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()
            .unwrap();
        assert!(!old.keep_alive());
        assert!(matches!(
            parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
    }
}
