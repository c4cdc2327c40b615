//! The shim's transport, on hyper: a thread of its own running a single-threaded tokio runtime
//! that accepts loopback connections and serves HTTP/1.1 on each, the connection cap (derived
//! from the descriptor limit, with the least active connection closed to make room), and the
//! fixed pool of workers that run the routes, which block until the daemon's verdict is durable.
//! The rules an answer follows are in `routes.rs`; what is read of a head, and the reply, in
//! `head.rs`; the module docs in `mod.rs` say why it is built this way.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::task::{Context, Poll};

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Notify, oneshot};

use super::head::{Head, body_length, body_limit, refused};
use super::peer::{self, PeerUids};
use super::routes::{Routed, is_signal, route};
use super::{
    Arriving, ENGINE_RESERVE, IDLE_TIMEOUT, LINGER, LINGER_BYTES, MAX_CONNECTIONS, MAX_HEAD_BYTES,
    MAX_HEADERS, MIN_CONNECTIONS, OnItsWay, REQUEST_TIMEOUT, Shared, WORKERS,
};
use crate::error::{Error, Result};
use crate::sync::MutexExt;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Bytes;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The running transport: its thread, and how to stop it.
pub(super) struct Serving {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Serving {
    /// Stops accepting, closes every connection (dropping the runtime drops their tasks) and
    /// waits for the thread. A worker busy with a request finishes it.
    pub(super) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A request ready for the routes, and where its reply goes.
struct Job {
    head: Head,
    body: Option<Bytes>,
    peer: SocketAddr,
    reply: oneshot::Sender<Routed>,
    /// A signal is counted as arriving until its route has run (dropped with the job).
    _counted: Option<OnItsWay>,
}

/// Starts the workers and the runtime's thread serving `listener`, holding at most `cap`
/// connections.
pub(super) fn start(listener: TcpListener, shared: Arc<Shared>, cap: usize) -> Result<Serving> {
    let what = shared.addr.to_string();
    let io_err = |context: &'static str| {
        let what = what.clone();
        move |e| Error::io(context, what, e)
    };
    listener
        .set_nonblocking(true)
        .map_err(io_err("cannot set up"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(io_err("cannot start the runtime for"))?;
    let listener = {
        let _inside = runtime.enter();
        tokio::net::TcpListener::from_std(listener).map_err(io_err("cannot set up"))?
    };
    let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
    let jobs_rx = Arc::new(Mutex::new(jobs_rx));
    for n in 0..WORKERS {
        let (shared, jobs) = (shared.clone(), jobs_rx.clone());
        std::thread::Builder::new()
            .name(format!("webhook-{n}"))
            .spawn(move || work(&shared, &jobs))
            .map_err(io_err("cannot start a worker for"))?;
    }
    let (stop_tx, stop_rx) = oneshot::channel();
    let peers = Arc::clone(&shared.peers);
    let arriving = shared.arriving.clone();
    let thread = std::thread::Builder::new()
        .name("webhook".into())
        .spawn(move || {
            runtime.block_on(accept(listener, jobs_tx, cap, stop_rx, peers, arriving));
            // Dropping the runtime here drops every connection's task, closing its socket.
        })
        .map_err(io_err("cannot start the listener thread for"))?;
    Ok(Serving {
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

/// A worker: runs the routes for ready requests until the transport is gone. It does not wait
/// for the daemon's loop: a route the loop answers comes back as [`Routed::Later`], which the
/// connection's task awaits (the operator page's routes apart, see the module docs).
fn work(shared: &Arc<Shared>, jobs: &Mutex<Receiver<Job>>) {
    loop {
        let next = jobs.lock_or_recover().recv();
        let Ok(job) = next else { return };
        let routed = route(shared, &job.head, job.body.as_deref(), Some(job.peer));
        // Submitted (or refused): no longer on its way to the loop.
        drop(job._counted);
        // The connection may be gone (closed, evicted, shutting down): the verdict stands.
        let _ = job.reply.send(routed);
    }
}

/// The HTTP/1.1 settings of every connection.
fn builder() -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        // A head must be whole this long after the connection opened or its last answer went
        // out: idle and slowloris connections alike are closed then, however they drip.
        .header_read_timeout(IDLE_TIMEOUT)
        .max_header_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS)
        // Room for one whole head and a little: a connection's buffer stays small (hyper's
        // default is about 400 KB), and bodies pass through it a chunk at a time.
        .max_buf_size(2 * MAX_HEAD_BYTES)
        // A client that shuts down its sending side after a whole request still hears the
        // answer (curl --data and scripts do this); without it hyper drops the connection.
        .half_close(true);
    b
}

async fn accept(
    listener: tokio::net::TcpListener,
    jobs: Sender<Job>,
    cap: usize,
    mut stop: oneshot::Receiver<()>,
    peers: Arc<PeerUids>,
    arriving: Arriving,
) {
    let conns = Arc::new(Mutex::new(Conns::new(cap)));
    let builder = Arc::new(builder());
    loop {
        let accepted = tokio::select! {
        _ = &mut stop => return,
        a = listener.accept() => a};
        match accepted {
            Ok((stream, peer)) => {
                let Some(slot) = Conns::admit(&conns) else {
                    // Every connection is waiting on a verdict: refuse this one outright.
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let conn = Connection {
                    slot,
                    conns: conns.clone(),
                    _peer: PeerUids::open(&peers, peer),
                    arriving: arriving.clone(),
                };
                tokio::spawn(conn.serve(stream, peer, builder.clone(), jobs.clone()));
            }
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE) or the like: make room if we can, and
                // do not spin on a backlog that cannot be accepted yet.
                tracing::warn!(error = %e, "webhook cannot accept a connection");
                Conns::evict_least_active(&conns);
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        }
    }
}

/// The open connections, for the cap.
struct Conns {
    cap: usize,
    next: u64,
    open: HashMap<u64, Arc<Slot>>,
    /// Milliseconds are counted from here.
    epoch: Instant,
}

/// One connection's entry.
struct Slot {
    id: u64,
    /// When it last showed a sign of life (opened, a request arrived, an answer went out), in
    /// milliseconds since [`Conns::epoch`].
    active: AtomicU64,
    /// Waiting on a worker's verdict: never closed to make room, since the verdict's answer
    /// would be lost.
    busy: AtomicBool,
    evict: Notify,
}

impl Conns {
    fn new(cap: usize) -> Self {
        Conns {
            cap,
            next: 0,
            open: HashMap::new(),
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A slot for a new connection, closing the least active one when at the cap; `None` when
    /// every open connection is waiting on a verdict.
    fn admit(conns: &Mutex<Conns>) -> Option<Arc<Slot>> {
        let mut c = conns.lock_or_recover();
        if c.open.len() >= c.cap && !c.evict_one() {
            return None;
        }
        c.next += 1;
        let slot = Arc::new(Slot {
            id: c.next,
            active: AtomicU64::new(c.now_ms()),
            busy: AtomicBool::new(false),
            evict: Notify::new(),
        });
        c.open.insert(slot.id, slot.clone());
        Some(slot)
    }

    fn evict_least_active(conns: &Mutex<Conns>) -> bool {
        conns.lock_or_recover().evict_one()
    }

    /// Closes the connection that has been quiet longest and is not waiting on a verdict.
    fn evict_one(&mut self) -> bool {
        let oldest = self
            .open
            .values()
            .filter(|s| !s.busy.load(Ordering::SeqCst))
            .min_by_key(|s| s.active.load(Ordering::SeqCst))
            .map(|s| s.id);
        let Some(slot) = oldest.and_then(|id| self.open.remove(&id)) else {
            return false;
        };
        // `notify_one` keeps the permit if the task is not waiting yet, so it is never missed.
        slot.evict.notify_one();
        true
    }
}

/// A connection's task: its slot, given back when the task ends however it ends.
struct Connection {
    slot: Arc<Slot>,
    conns: Arc<Mutex<Conns>>,
    /// Its owner, read once, while it is open (`peer.rs`).
    _peer: peer::Open,
    arriving: Arriving,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut c = self.conns.lock_or_recover();
        if c.open
            .get(&self.slot.id)
            .is_some_and(|s| Arc::ptr_eq(s, &self.slot))
        {
            c.open.remove(&self.slot.id);
        }
    }
}

impl Connection {
    fn touch(&self) {
        let now = self.conns.lock_or_recover().now_ms();
        self.slot.active.store(now, Ordering::SeqCst);
    }

    async fn serve(
        self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
        builder: Arc<http1::Builder>,
        jobs: Sender<Job>,
    ) {
        let this = Arc::new(self);
        let handler = this.clone();
        let service = service_fn(move |req| {
            let (this, jobs) = (handler.clone(), jobs.clone());
            async move { this.answer(req, peer, jobs).await }
        });
        let back = Arc::new(Mutex::new(None));
        let io = Held {
            stream: Some(stream),
            back: back.clone(),
        };
        let served = builder.serve_connection(TokioIo::new(io), service);
        tokio::select! {
        // However it ended (an answer with `Connection: close`, the client's close, a head
        // hyper refused or that came too slowly), the socket comes back for the close.
        _ = served => {}
        _ = this.slot.evict.notified() => return}
        let stream = back.lock_or_recover().take();
        if let Some(stream) = stream {
            tokio::select! {
                _ = linger(stream) => {}
                _ = this.slot.evict.notified() => {}
            }
        }
    }

    /// One request: the head checked, the body read within its limits and deadline, then the
    /// routes run on a worker and their reply sent once the verdict is durable (awaited here,
    /// not on the worker, when it is the loop's). An `Err` ends
    /// the connection unanswered (the client went away mid-body, or broke its framing).
    async fn answer(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        jobs: Sender<Job>,
    ) -> std::result::Result<Response<Full<Bytes>>, BodyError> {
        self.touch();
        let (parts, body) = req.into_parts();
        let head = match Head::from_parts(&parts) {
            Ok(h) => h,
            Err(r) => return Ok(r.into_response(true)),
        };
        // The length is checked before a byte of the body is read; a body the routes will not
        // take (too large, chunked, a bad length) is never read, and the answer comes from the
        // head alone.
        let body = match body_length(&head) {
            Err(_) => None,
            Ok(length) => {
                let read = Limited::new(body, length.min(body_limit(&head.path))).collect();
                match tokio::time::timeout(REQUEST_TIMEOUT, read).await {
                    Ok(Ok(collected)) => Some(collected.to_bytes()),
                    Ok(Err(e)) => return Err(BodyError(e.to_string())),
                    Err(_) => {
                        let r = refused(408, "the request did not arrive in time");
                        return Ok(r.into_response(true));
                    }
                }
            }
        };
        let unread = body.is_none();
        let (tx, rx) = oneshot::channel();
        self.slot.busy.store(true, Ordering::SeqCst);
        let counted = is_signal(&head).then(|| self.arriving.one());
        let sent = jobs
            .send(Job {
                head,
                body,
                peer,
                reply: tx,
                _counted: counted,
            })
            .is_ok();
        let reply = match rx.await {
            Ok(Routed::Now(r)) if sent => r,
            // The worker is free again; this task waits for the loop's outcome.
            Ok(Routed::Later(rest)) if sent => rest.reply().await,
            _ => refused(503, "the daemon is shutting down; nothing was recorded"),
        };
        self.slot.busy.store(false, Ordering::SeqCst);
        self.touch();
        Ok(reply.into_response(unread))
    }
}

/// A connection's socket as hyper holds it, handed back into `back` when hyper lets go of it
/// (after an error too, which `without_shutdown` would not give back), so that the close can
/// linger.
struct Held {
    stream: Option<tokio::net::TcpStream>,
    back: Arc<Mutex<Option<tokio::net::TcpStream>>>,
}

impl Held {
    fn stream(&mut self) -> std::io::Result<Pin<&mut tokio::net::TcpStream>> {
        match self.stream.as_mut() {
            Some(s) => Ok(Pin::new(s)),
            None => Err(std::io::ErrorKind::NotConnected.into()),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            *self.back.lock_or_recover() = Some(s);
        }
    }
}

impl AsyncRead for Held {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut().stream() {
            Ok(s) => s.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Held {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut().stream() {
            Ok(s) => s.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut().stream() {
            Ok(s) => s.poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut().stream() {
            Ok(s) => s.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut().stream() {
            Ok(s) => s.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// What ends a connection unanswered: the body could not be read whole.
#[derive(Debug, thiserror::Error)]
#[error("the request body could not be read: {0}")]
struct BodyError(String);

/// After the last answer (often one sent without reading the body, or hyper's to a head it
/// refused): no more is sent, and what the client still sends is read and thrown away (at most
/// [`LINGER_BYTES`], for at most [`LINGER`]) before closing. Closing with unread bytes would
/// reset the connection, and a client still sending could lose the answer to the reset.
async fn linger(mut stream: tokio::net::TcpStream) {
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 8 * 1024];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// How many connections the shim holds at most, given the soft limit on open descriptors
/// (`None`: unlimited). The engine keeps a quarter of the limit, and at least
/// [`ENGINE_RESERVE`], for what it opens itself (the home's directory handles, the journal,
/// inotify, the files of a batch, hooks' pipes, device sessions); the shim takes the rest, at
/// most [`MAX_CONNECTIONS`] and at least [`MIN_CONNECTIONS`]. With the usual soft limit of 1,024
/// that is 768; the daemon raises its soft limit to the hard one when it starts, so with a hard
/// limit of 4,096 or more it is 1,024.
pub fn connection_cap(soft_limit: Option<u64>) -> usize {
    let Some(soft) = soft_limit else {
        return MAX_CONNECTIONS;
    };
    let reserve = (soft / 4).max(ENGINE_RESERVE);
    let room = usize::try_from(soft.saturating_sub(reserve)).unwrap_or(usize::MAX);
    room.clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

/// The soft limit on open descriptors now; `None` when unlimited.
pub fn descriptor_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_leaves_the_engine_a_quarter_of_the_descriptors() {
        assert_eq!(connection_cap(Some(1024)), 768);
        assert_eq!(connection_cap(Some(256)), 128);
        assert_eq!(connection_cap(Some(4096)), MAX_CONNECTIONS);
        assert_eq!(connection_cap(Some(1 << 20)), MAX_CONNECTIONS);
        assert_eq!(connection_cap(None), MAX_CONNECTIONS);
        assert_eq!(connection_cap(Some(64)), MIN_CONNECTIONS);
    }
}
