//! The shim's transport: one reactor thread that owns the listener and every waiting
//! connection (`poll(2)` through rustix, non-blocking reads, deadlines, the connection cap), and
//! the workers that answer a connection once its request is whole. The rules an answer follows
//! are in `routes.rs`; the bytes on the wire in `framing.rs`; the module docs in `mod.rs` say why
//! it is built this way.

use super::*;

/// An open connection and the bytes of its next request so far.
pub(super) struct Conn {
    /// Non-blocking while the reactor holds it, blocking while a worker does.
    pub(super) stream: TcpStream,
    pub(super) buf: Vec<u8>,
    /// When the first byte of the request in `buf` arrived; `None` while idle.
    pub(super) started: Option<Instant>,
    pub(super) idle_since: Instant,
    pub(super) continue_sent: bool,
    /// Set once an answer was sent without reading the body: the rest of what the client
    /// sends is read and thrown away until then (or `LINGER_BYTES`), and the connection closed.
    pub(super) draining: Option<(Instant, usize)>,
    /// The client shut down its sending side after some bytes (`shutdown(SHUT_WR)`): a complete
    /// request in `buf` is still answered, then the connection closes.
    pub(super) peer_closed: bool,
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

/// A connection whose request is ready, and what it is.
pub(super) struct Job {
    pub(super) conn: Conn,
    pub(super) ready: Ready,
}

pub(super) struct Reactor {
    pub(super) listener: TcpListener,
    pub(super) shared: Arc<Shared>,
    pub(super) wake_rx: UnixStream,
    pub(super) back: Receiver<Conn>,
    pub(super) jobs: SyncSender<Job>,
    /// Connections waiting for bytes (idle, mid-request, or draining).
    pub(super) conns: Vec<Conn>,
    /// Ready requests no worker was free for yet.
    pub(super) queued: VecDeque<Job>,
}

impl Reactor {
    pub(super) fn run(mut self) {
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

pub(super) struct Worker {
    pub(super) shared: Arc<Shared>,
    pub(super) jobs: Arc<Mutex<Receiver<Job>>>,
    pub(super) back: Sender<Conn>,
    pub(super) waker: UnixStream,
}

impl Worker {
    pub(super) fn run(self) {
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
pub(super) fn answer(shared: &Shared, job: Job) -> Option<Conn> {
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
