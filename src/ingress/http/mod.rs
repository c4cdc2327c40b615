//! The optional loopback HTTP shim: `POST /webhook/signal`; the callback routes
//! `POST /api/callbacks/wake/<token>` and `POST /api/callbacks/enqueue/<token>` (and their short
//! forms `/callbacks/<mode>/<token>`); the authenticated control routes of [`control`],
//! only when the daemon holds an operator token; the operator page under `/ui/` ([`ui`]); and
//! `GET /healthz`. Nothing else.
//!
//! This is the only code that speaks HTTP on the server side. It turns a request into a
//! [`SignalRequest`] with the same [`parse_signal`](crate::ingress::parse_signal) the drop zone
//! uses, hands it to whoever applies signals (the daemon loop, through a [`Submit`] callback) and
//! answers with the status code the spec gives the verdict, only after the verdict is durable.
//!
//! It is served by hyper 1.x (HTTP/1.1 only) on a tokio runtime the shim owns, in a thread of
//! its own; the engine stays synchronous. Until issue 26 the shim's transport was 767
//! hand-written lines (a `poll(2)` reactor and its own framing); under 1,000 idle loopback
//! connections at the usual descriptor limit that transport left the engine without descriptors
//! (valid signals got 500, the drop zone stalled, the daemon panicked). Parsing, keep-alive,
//! pipelining, `100 Continue` and half-closes are now hyper's; what the shim adds:
//!
//! - One runtime thread holds every connection and [`WORKERS`] threads run the routes: idle or
//!   slow clients never hold a thread, and the thread count does not move with the connections.
//!   A worker does not wait for the daemon's loop: a route whose answer is the loop's outcome (a
//!   signal, a callback, a control operation) hands the loop its [`Outcome`] and the waiting to
//!   the connection's task, which answers once the outcome is durable. Only the operator page's
//!   requests are waited for on a worker (its views thread answers in milliseconds; its cancel
//!   is a person's click). Workers that waited
//!   capped the requests in flight to the loop at their number, so at most four signals ever
//!   shared a commit however many clients waited, and a stalled commit held every route up.
//! - At most [`connection_cap`] connections are open: the descriptor limit less a reserve for the
//!   engine (a quarter of it, at least [`ENGINE_RESERVE`]), at most [`MAX_CONNECTIONS`]. At the cap
//!   the least active connection not waiting on a verdict is closed to make room; a failed
//!   accept (out of descriptors) closes one too and is retried after a pause, never a panic.
//! - A request head must be whole within [`IDLE_TIMEOUT`] of the connection opening or of its
//!   last answer (hyper's header read timeout, so dripping a byte at a time buys nothing), and
//!   is capped at [`MAX_HEAD_BYTES`] (431). The body must follow within [`REQUEST_TIMEOUT`]
//!   (408). `Content-Length` is checked before a byte of the body is read: over the route's
//!   limit ([`MAX_BODY_BYTES`](crate::request::MAX_BODY_BYTES), 256 KB for callbacks) is
//!   answered 413 at once, a chunked body 411, and the rest of what the client sends is read
//!   into a fixed buffer and dropped for at most a second before closing, so it sees the answer.
//!   Nothing is ever sized from a number the client sent; a connection buffers at most one head
//!   and one body.
//! - The `Host` header must name a loopback address or `localhost` (DNS rebinding), and any
//!   request carrying an `Origin` header is refused: a web page must not be able to spend the
//!   miss budget. Both are checked before the budget.
//! - Unknown ids, wrong secrets and bad tokens cost their sender: each local user (the owner of
//!   the client's socket, `peer.rs`; the address where that cannot be read) has a budget of
//!   [`MISS_BUDGET`] per [`MISS_WINDOW_MS`], read from the daemon's clock. While a sender's is
//!   spent, its requests get 429; another user's requests that authenticate never do.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::Clock;
use crate::engine::Verdict;
use crate::engine::callbacks::Trigger;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::records::CallbackMode;
use crate::records::WebhookAddress;
use crate::request::{CallbackRequest, SIGNAL_PATH, SignalRequest};
use control::{ControlOutcome, ControlRequest};

pub mod control;
mod head;
mod peer;
mod routes;
mod serve;
pub mod ui;

pub use routes::{MissBudget, MissBudgets, Requester};
pub use serve::{connection_cap, descriptor_limit};

/// The port used when neither `--port`, settings nor `WEBHOOK_PORT` name one.
pub const DEFAULT_PORT: u16 = 3001;
/// The liveness route.
pub const HEALTH_PATH: &str = "/healthz";
/// Misses (unknown ids and wrong secrets) allowed per window before the route answers 429.
pub const MISS_BUDGET: usize = 60;
/// The miss budget's sliding window.
pub const MISS_WINDOW_MS: i64 = 60_000;
/// Worker threads running the routes; the runtime's thread is one more.
pub const WORKERS: usize = 4;
/// Open connections at most, idle or busy, whatever the descriptor limit.
pub const MAX_CONNECTIONS: usize = 1024;
/// Open connections at least, however low the descriptor limit.
pub const MIN_CONNECTIONS: usize = 16;
/// Descriptors kept for the engine at least, whatever the limit (see [`connection_cap`]).
pub const ENGINE_RESERVE: u64 = 128;
/// A request head must be whole this long after the connection opened or its last answer went
/// out; an idle keep-alive connection is closed then too.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request's body must have arrived within this long of its head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// The longest `Idempotency-Key`.
pub const MAX_KEY_CHARS: usize = 128;
const MAX_HEADERS: usize = 32;
/// After answering a request whose body was left unread, how long and how much of it is read
/// and thrown away before closing, so the client sees the answer rather than a reset.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1024 * 1024;

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

/// The applier's end of a [`Submission`]: where its outcome goes, once. Sending never blocks
/// and needs no runtime; the shim's end is awaited by the connection's task, or by a worker
/// for the operator page. Dropping it unanswered means nothing was done (the shim answers 503).
pub struct Outcome<T>(tokio::sync::oneshot::Sender<T>);

impl<T> Outcome<T> {
    /// A new outcome and the shim's end of it.
    pub(super) fn pair() -> (Outcome<T>, tokio::sync::oneshot::Receiver<T>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Outcome(tx), rx)
    }

    /// Sends the outcome; a client gone meanwhile changes nothing (the outcome stands).
    pub fn send(self, outcome: T) {
        let _ = self.0.send(outcome);
    }
}

/// Work handed to whoever applies it (the daemon's loop), with where to send the outcome. The
/// outcome must be sent only once it is durable; dropping the [`Outcome`] unanswered means
/// nothing was recorded.
pub enum Submission {
    /// `POST /webhook/signal`.
    Signal {
        request: SignalRequest,
        /// The idempotency key; the signal's identity is
        /// [`Source::Http`](crate::request::Source::Http) of it.
        key: String,
        reply: Outcome<Result<Verdict>>,
    },
    /// `POST /api/callbacks/<mode>/<token>`; `key` is the request's `Idempotency-Key`, the
    /// trigger's identity, when it sent one.
    Callback {
        request: CallbackRequest,
        key: Option<String>,
        reply: Outcome<Result<Trigger>>,
    },
    /// An authenticated control operation.
    Control {
        request: ControlRequest,
        reply: Outcome<Result<ControlOutcome>>,
    },
    /// The operator page's list, a waitpoint's picture or a cancel, from a logged-in page.
    Ui {
        request: ui::UiRequest,
        reply: Outcome<Result<ui::UiAnswer>>,
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
            Submission::Ui { request, .. } => f
                .debug_struct("Submission::Ui")
                .field("request", request)
                .finish_non_exhaustive(),
        }
    }
}

/// How many signals the shim has received and not yet handed to the loop (their routes are
/// running). The loop waits a moment for them before it commits what it holds: each would
/// otherwise wait a whole commit, its `fdatasync` included, behind one it just missed. The
/// count covers only requests already here, so an idle shim never delays a commit.
#[derive(Clone, Default)]
pub struct Arriving(Arc<AtomicUsize>);

impl Arriving {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Counts one signal until the returned mark drops (its route has run: it was submitted,
    /// or refused).
    fn one(&self) -> OnItsWay {
        self.0.fetch_add(1, Ordering::SeqCst);
        OnItsWay(Arc::clone(&self.0))
    }
}

/// One signal counted in [`Arriving`] while it is on its way to the loop.
struct OnItsWay(Arc<AtomicUsize>);

impl Drop for OnItsWay {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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
    budget: Mutex<MissBudgets>,
    /// The operator page's login code file and logins.
    ui: ui::UiState,
    /// The owners of the open connections (`peer.rs`).
    peers: Arc<peer::PeerUids>,
    arriving: Arriving,
}

/// The running shim. Stopping it (or dropping it) closes the listener and every connection,
/// and removes the address file.
pub struct Shim {
    addr: SocketAddr,
    serving: serve::Serving,
    /// The home whose address file this shim publishes.
    home: Home,
    arriving: Arriving,
    stopped: bool,
}

impl Shim {
    /// Starts serving on `bound`, holding at most [`connection_cap`] connections for the
    /// descriptor limit now, then publishes the address in `home`'s address file. The operator
    /// page's logins take the one-time code `waitpoint ui` leaves in `home`.
    pub fn start(bound: Bound, clock: Arc<dyn Clock>, submit: Submit, home: &Home) -> Result<Shim> {
        let Bound {
            listener,
            addr,
            control,
        } = bound;
        let shared = Arc::new(Shared {
            submit,
            addr,
            control,
            clock: clock.clone(),
            budget: Mutex::new(MissBudgets::default()),
            ui: ui::UiState::new(home.clone()),
            peers: Arc::default(),
            arriving: Arriving::default(),
        });
        let arriving = shared.arriving.clone();
        let cap = connection_cap(descriptor_limit());
        let serving = serve::start(listener, shared, cap)?;
        let shim = Shim {
            addr,
            serving,
            home: home.clone(),
            arriving,
            stopped: false,
        };
        let record = WebhookAddress {
            url: format!("http://{addr}{SIGNAL_PATH}"),
            addr: addr.to_string(),
            pid: std::process::id(),
            started_at: clock.now(),
        };
        let root = home.root_dir();
        root.commit_json(&home.webhook_address_file(), &record)?;
        tracing::info!(%addr, connections = cap, "webhook listening on http://{addr}{SIGNAL_PATH}");
        Ok(shim)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The count of signals on their way to the loop.
    pub fn arriving(&self) -> Arriving {
        self.arriving.clone()
    }

    /// Stops accepting, closes every connection and removes the address file. A worker busy
    /// with a request finishes it (its verdict is sent if the loop still runs).
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.serving.stop();
        let root = self.home.root_dir();
        if let Err(e) = root.remove_durably(&self.home.webhook_address_file()) {
            tracing::error!(error = %e, "cannot remove the webhook address file");
        }
        tracing::info!(addr = %self.addr, "webhook stopped");
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Removes the address file a daemon of `home` that did not shut down cleanly left behind.
pub fn remove_stale_address(home: &Home) -> Result<()> {
    home.root_dir().remove_durably(&home.webhook_address_file())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::OnceLock;

    /// A signal counts as arriving from the moment the shim has read it until its route has
    /// handed it to the loop, and not after: the loop waits for it while it is on its way, and
    /// never for one it already holds.
    #[test]
    fn a_signal_counts_as_arriving_until_its_route_hands_it_to_the_loop() {
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::new(tmp.path());
        let arriving: Arc<OnceLock<Arriving>> = Arc::default();
        let counted_at_submit = Arc::new(Mutex::new(Vec::new()));
        let submit: Submit = {
            let (arriving, counted) = (Arc::clone(&arriving), Arc::clone(&counted_at_submit));
            Box::new(move |s| {
                if let Submission::Signal { request, reply, .. } = s {
                    let count = arriving.get().map(Arriving::count);
                    counted.lock().unwrap().push(count);
                    reply.send(Ok(Verdict::Duplicate {
                        id: request.id,
                        next_due: None,
                    }));
                }
                true
            })
        };
        let bound = HttpConfig::new("127.0.0.1", 0).unwrap().bind().unwrap();
        let clock = Arc::new(crate::clock::SystemClock);
        let shim = Shim::start(bound, clock, submit, &home).unwrap();
        arriving.set(shim.arriving()).ok().unwrap();
        assert_eq!(shim.arriving().count(), 0);
        let body = r#"{"id":"wp_0123456789ab","secret":"s","status":"progress"}"#;
        let mut client = std::net::TcpStream::connect(shim.addr()).unwrap();
        write!(
            client,
            "POST {SIGNAL_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
        assert_eq!(*counted_at_submit.lock().unwrap(), [Some(1)]);
        assert_eq!(shim.arriving().count(), 0, "answered, so no longer coming");
    }
}
