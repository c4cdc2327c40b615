//! The shim's routes, apart from its transport: what each request means (the signal route, the
//! callback routes, the control routes, `/healthz`; the operator page's are in `ui.rs`), the miss
//! budget, and the status code each verdict is answered with. Nothing here touches a socket, so it
//! is tested with requests built in memory.

use super::head::{Head, Reply, body_length, callback_rest, is_loopback_host, refused, reply};
use super::{
    CALLBACK_PREFIX, HEALTH_PATH, MAX_KEY_CHARS, MISS_BUDGET, MISS_WINDOW_MS, Outcome, Shared,
    Submission, control, trigger_url,
};
use crate::clock::Timestamp;
use crate::engine::Verdict;
use crate::engine::callbacks::Trigger;
use crate::engine::rules::Refusal;
use crate::error::Error;
use crate::ingress::parse_signal;
use crate::records::CallbackMode;
use crate::request::SIGNAL_PATH;
use crate::request::{CallbackRequest, SignalRequest};
use crate::sync::MutexExt;
use serde_json::json;
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

/// Who a miss is counted against: the user owning the client's socket (every local process
/// comes from 127.0.0.1, so the address alone would make one budget of everybody's), or the
/// address where the kernel's table does not say.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Requester {
    User(u32),
    Address(std::net::IpAddr),
    Unknown,
}

/// A miss budget per [`Requester`]: one sender's unknown ids and wrong secrets cost only that
/// sender its access, never a sender whose requests authenticate.
#[derive(Debug, Default)]
pub struct MissBudgets {
    by_requester: std::collections::HashMap<Requester, MissBudget>,
}

impl MissBudgets {
    /// Whether `requester`'s window already holds [`MISS_BUDGET`] misses.
    pub fn spent(&mut self, requester: &Requester, now: Timestamp) -> bool {
        self.by_requester
            .get_mut(requester)
            .is_some_and(|b| b.spent(now))
    }

    /// Counts a miss against `requester`.
    pub fn record(&mut self, requester: Requester, now: Timestamp) {
        self.by_requester.entry(requester).or_default().record(now);
    }

    /// Seconds until `requester`'s oldest counted miss leaves the window.
    pub fn frees_in_s(&mut self, requester: &Requester, now: Timestamp) -> u64 {
        let oldest = self
            .by_requester
            .get_mut(requester)
            .and_then(|b| {
                b.forget_before(now);
                b.misses.front().copied()
            })
            .unwrap_or(now);
        let left = MISS_WINDOW_MS - now.millis_since(oldest);
        (left.max(0) as u64).div_ceil(1000).max(1)
    }

    /// Whether any requester has a miss in its window (if none, nobody's budget can be spent and
    /// the requester of a request need not be looked up). Forgets requesters with none.
    pub fn any(&mut self, now: Timestamp) -> bool {
        self.by_requester.retain(|_, b| b.misses_in_window(now) > 0);
        !self.by_requester.is_empty()
    }
}

/// The miss budget of one requester: timestamps of its misses inside the sliding window.
#[derive(Debug, Default)]
pub struct MissBudget {
    misses: VecDeque<Timestamp>,
}

impl MissBudget {
    fn forget_before(&mut self, now: Timestamp) {
        while let Some(first) = self.misses.front() {
            if now.millis_since(*first) >= MISS_WINDOW_MS {
                self.misses.pop_front();
            } else {
                break;
            }
        }
    }

    /// Whether the window already holds [`MISS_BUDGET`] misses.
    pub fn spent(&mut self, now: Timestamp) -> bool {
        self.forget_before(now);
        self.misses.len() >= MISS_BUDGET
    }

    /// How many misses the window holds at `now`.
    pub fn misses_in_window(&mut self, now: Timestamp) -> usize {
        self.forget_before(now);
        self.misses.len()
    }

    pub fn record(&mut self, now: Timestamp) {
        self.forget_before(now);
        self.misses.push_back(now);
    }
}

/// A route's answer: ready when the route has run, or the daemon loop's outcome still to come.
pub(super) enum Routed {
    Now(Reply),
    /// Answered once the loop sends its outcome, by whoever awaits this (the connection's task):
    /// the worker that ran the route is free meanwhile (see the module docs of `http`).
    Later(Later),
}

impl From<Reply> for Routed {
    fn from(r: Reply) -> Routed {
        Routed::Now(r)
    }
}

/// The rest of a route once its submission is made: the loop's outcome awaited, then mapped.
pub(super) struct Later(Pin<Box<dyn Future<Output = Reply> + Send>>);

impl Later {
    /// Hands the loop the submission `make` builds around an [`Outcome`], and returns the rest
    /// of the route: `finish` maps the outcome once it comes; a loop gone without one (shutting
    /// down) is answered 503, `nothing` saying what was not done.
    fn submit<T: Send + 'static>(
        shared: &Arc<Shared>,
        make: impl FnOnce(Outcome<T>) -> Submission,
        nothing: &'static str,
        finish: impl FnOnce(&Shared, T) -> Reply + Send + 'static,
    ) -> Routed {
        let (outcome, awaited) = Outcome::pair();
        let submitted = (shared.submit)(make(outcome));
        let shared = Arc::clone(shared);
        Routed::Later(Later(Box::pin(async move {
            match awaited.await {
                Ok(v) if submitted => finish(&shared, v),
                _ => refused(503, format!("the daemon is shutting down; {nothing}")),
            }
        })))
    }

    /// The reply, once the outcome has come.
    pub(super) async fn reply(self) -> Reply {
        self.0.await
    }
}

/// Decides the answer to a request; `body` is `None` when it was not read.
pub(super) fn route(
    shared: &Arc<Shared>,
    head: &Head,
    body: Option<&[u8]>,
    peer: Option<SocketAddr>,
) -> Routed {
    match &head.host {
        None => return refused(400, "a Host header is required").into(),
        Some(h) if !is_loopback_host(h) => {
            return refused(
                403,
                "the Host header must name a loopback address or localhost",
            )
            .into();
        }
        Some(_) => {}
    }
    // The operator page answers web pages (its own), so it applies its own Origin rules.
    if super::ui::is_ui_path(&head.path) {
        return super::ui::route(shared, head, peer, body).into();
    }
    if head.origin.is_some() {
        return refused(
            403,
            "requests from web pages (with an Origin header) are not served",
        )
        .into();
    }
    match (head.method.as_str(), head.path.as_str()) {
        _ if is_signal(head) => signal(shared, head, body, peer),
        ("POST", p) if callback_rest(p).is_some() => callback(shared, head, body, peer),
        (_, p) if control::is_control_path(p) => control_route(shared, head, body, peer),
        _ => other_route(head).into(),
    }
}

/// Whether `head` is for the signal route (`POST /webhook/signal`), the one whose requests the
/// loop batches; the transport counts them as arriving ([`super::Arriving`]).
pub(super) fn is_signal(head: &Head) -> bool {
    head.method == "POST" && head.path == SIGNAL_PATH
}

/// The routes answered from the request alone.
fn other_route(head: &Head) -> Reply {
    match (head.method.as_str(), head.path.as_str()) {
        ("GET" | "HEAD", HEALTH_PATH) => reply(200, json!({ "result": "ok" })),
        (_, HEALTH_PATH) => Reply {
            allow: Some("GET, HEAD"),
            ..refused(405, "use GET on /healthz")
        },
        (_, SIGNAL_PATH) => Reply {
            allow: Some("POST"),
            ..refused(405, "use POST on /webhook/signal")
        },
        _ => reply(
            404,
            json!({ "result": "not_found", "error": "this shim serves POST /webhook/signal, POST \
                /api/callbacks/<mode>/<token>, the control routes under /api/control/agents/ and \
                /api/agents/ (with the operator token), the operator page under /ui/ (run \
                `waitpoint ui`), and GET /healthz" }),
        ),
    }
}

fn signal(
    shared: &Arc<Shared>,
    head: &Head,
    body: Option<&[u8]>,
    peer: Option<SocketAddr>,
) -> Routed {
    let body = match body {
        Some(b) => b,
        None => {
            return body_length(head)
                .err()
                .unwrap_or_else(|| refused(400, "the body was not read"))
                .into();
        }
    };
    if head.content_length.is_empty() {
        return refused(411, "a Content-Length header is required").into();
    }
    let key = match idempotency_key(head) {
        Ok(k) => k.unwrap_or_else(|| format!("gen-{}", crate::secret::random_hex(16))),
        Err(r) => return r.into(),
    };
    if let Some(r) = budget_spent(shared, peer) {
        return r.into();
    }
    match parse_signal(body) {
        Err(reason) => refused(400, reason).into(),
        Ok(request) => apply(shared, request, key, peer),
    }
}

/// The request's `Idempotency-Key`, if it sent a well-formed one.
fn idempotency_key(head: &Head) -> std::result::Result<Option<String>, Reply> {
    match &head.idempotency_key {
        None => Ok(None),
        Some(k)
            if !k.is_empty()
                && k.len() <= MAX_KEY_CHARS
                && k.iter().all(|b| (0x21..=0x7e).contains(b)) =>
        {
            Ok(Some(String::from_utf8_lossy(k).into_owned()))
        }
        Some(_) => Err(refused(
            400,
            format!("Idempotency-Key must be 1-{MAX_KEY_CHARS} visible ASCII characters"),
        )),
    }
}

/// The control routes: off (404) without an operator token; 401 without the right one (a wrong
/// one spends the miss budget, so the token cannot be guessed at speed); then the operation,
/// run on the daemon's loop.
fn control_route(
    shared: &Arc<Shared>,
    head: &Head,
    body: Option<&[u8]>,
    peer: Option<SocketAddr>,
) -> Routed {
    let presented = head
        .authorization
        .as_deref()
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match operator(shared, peer, presented, &head.path) {
        Operator::Right => {}
        Operator::Off => {
            return refused(
                404,
                "the control routes are off: start the daemon with CORTEX_WEBHOOK_TOKEN set to \
                 turn them on",
            )
            .into();
        }
        Operator::Spent(r) => return r.into(),
        Operator::Wrong => return refused(401, "wrong operator token").into(),
        Operator::Missing => {
            return refused(
                401,
                "the control routes need the operator token: Authorization: Bearer \
                 $CORTEX_WEBHOOK_TOKEN",
            )
            .into();
        }
    }
    let Some(body) = body else {
        return body_length(head)
            .err()
            .unwrap_or_else(|| refused(400, "the body was not read"))
            .into();
    };
    let request = match control::parse(&head.method, &head.path, body) {
        Ok(r) => r,
        Err((405, why)) => {
            return Reply {
                allow: Some(if head.path.starts_with(control::CONTROL_PREFIX) {
                    "POST"
                } else {
                    "GET"
                }),
                ..refused(405, why)
            }
            .into();
        }
        Err((code, why)) => return refused(code, why).into(),
    };
    Later::submit(
        shared,
        |reply| Submission::Control { request, reply },
        "nothing was done",
        |shared, outcome| {
            if let Err(e) = &outcome
                && let Some(r) = unavailable(e)
            {
                return r;
            }
            let port = shared.addr.port();
            let (code, body) =
                control::answer(outcome, |mode, token| trigger_url(port, mode, token));
            reply(code, body)
        },
    )
}

/// What the operator token a request presented comes to.
pub(super) enum Operator {
    /// The daemon has no operator token: the routes that need one are off.
    Off,
    /// The sender's miss budget is spent: this answer (429), before any comparison.
    Spent(Reply),
    Missing,
    /// A wrong token: counted against the sender's budget and logged.
    Wrong,
    Right,
}

/// Checks the operator token `presented` to `route` against the daemon's (its hash, compared
/// in constant time), after the sender's miss budget, so the token cannot be guessed at speed.
pub(super) fn operator(
    shared: &Shared,
    peer: Option<SocketAddr>,
    presented: Option<&str>,
    route: &str,
) -> Operator {
    let Some(expected) = &shared.control else {
        return Operator::Off;
    };
    if let Some(r) = budget_spent(shared, peer) {
        return Operator::Spent(r);
    }
    match presented {
        None => Operator::Missing,
        Some(token) if crate::secret::verify(token, expected) => Operator::Right,
        Some(_) => {
            record_miss(shared, peer);
            let peer_text = peer.map(|p| p.to_string()).unwrap_or_default();
            tracing::warn!(peer = %peer_text, path = %route, "refused: wrong operator token");
            Operator::Wrong
        }
    }
}

/// The answer to a request whose write the shared store refused because this host's daemon no
/// longer leads the cluster ([`ErrorKind::Unavailable`](crate::error::ErrorKind::Unavailable)):
/// 503 with `Retry-After`, the lease's time, by when another daemon leads (and this one, a
/// standby then, hands the request over to it). Nothing was written, so a retry is safe, and
/// a signal's retry under the same `Idempotency-Key` counts once. `None` for any other error.
fn unavailable(e: &Error) -> Option<Reply> {
    let after_s = e.retry_after_s()?;
    Some(Reply {
        retry_after_s: Some(after_s),
        ..reply(
            503,
            json!({ "result": "unavailable", "error": e.to_string(), "retry_after_s": after_s }),
        )
    })
}

/// The 429 answer while the sender's miss budget is spent (its unknown ids, wrong secrets and
/// bad callback tokens all draw on it).
pub(super) fn budget_spent(shared: &Shared, peer: Option<SocketAddr>) -> Option<Reply> {
    let now = shared.clock.now();
    let mut budgets = shared.budget.lock_or_recover();
    if !budgets.any(now) {
        return None;
    }
    let requester = requester_of(shared, peer);
    budgets.spent(&requester, now).then(|| Reply {
        retry_after_s: Some(budgets.frees_in_s(&requester, now)),
        ..refused(
            429,
            "too many unknown ids, wrong secrets or bad tokens in the last minute; try again later",
        )
    })
}

/// Counts one miss against the sender's budget.
pub(super) fn record_miss(shared: &Shared, peer: Option<SocketAddr>) {
    let requester = requester_of(shared, peer);
    shared
        .budget
        .lock_or_recover()
        .record(requester, shared.clock.now());
}

/// Whose budget a request from `peer` draws on.
fn requester_of(shared: &Shared, peer: Option<SocketAddr>) -> Requester {
    match peer {
        None => Requester::Unknown,
        Some(p) => shared
            .peers
            .uid(p, shared.addr)
            .map_or(Requester::Address(p.ip()), Requester::User),
    }
}

/// `POST /callbacks/<mode>/<token>`: an empty body is enough for `wake`; `enqueue` takes an
/// optional `{"text": ...}`. Unknown, revoked and wrong-mode tokens spend the miss budget like
/// unknown ids, so the routes cannot be used to guess tokens.
fn callback(
    shared: &Arc<Shared>,
    head: &Head,
    body: Option<&[u8]>,
    peer: Option<SocketAddr>,
) -> Routed {
    let Some(body) = body else {
        return body_length(head)
            .err()
            .unwrap_or_else(|| refused(400, "the body was not read"))
            .into();
    };
    let rest = callback_rest(&head.path).unwrap_or_default();
    let Some((mode, token)) = rest
        .split_once('/')
        .and_then(|(m, t)| CallbackMode::parse(m).map(|m| (m, t)))
    else {
        return reply(
            404,
            json!({ "result": "not_found", "error": "callback routes are \
                /api/callbacks/wake/<token> and /api/callbacks/enqueue/<token>" }),
        )
        .into();
    };
    if let Some(r) = budget_spent(shared, peer) {
        return r.into();
    }
    let text = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        #[derive(serde::Deserialize)]
        struct EnqueueBody {
            #[serde(default)]
            text: Option<String>,
        }
        match serde_json::from_slice::<EnqueueBody>(body) {
            Ok(b) => b.text,
            Err(e) => {
                return refused(
                    400,
                    format!("the body must be JSON like {{\"text\": \"...\"}}: {e}"),
                )
                .into();
            }
        }
    };
    let key = match idempotency_key(head) {
        Ok(k) => k,
        Err(r) => return r.into(),
    };
    let request = CallbackRequest {
        token: crate::secret::Secret::new(token),
        mode,
        text,
    };
    Later::submit(
        shared,
        |reply| Submission::Callback {
            request,
            key,
            reply,
        },
        "nothing was delivered",
        move |shared, outcome| callback_reply(shared, outcome, peer),
    )
}

/// The answer to a callback's outcome; a token that matched nothing spends the sender's budget.
fn callback_reply(
    shared: &Shared,
    outcome: crate::error::Result<Trigger>,
    peer: Option<SocketAddr>,
) -> Reply {
    let peer_text = peer.map(|p| p.to_string()).unwrap_or_default();
    let miss = |what: &str| {
        record_miss(shared, peer);
        tracing::warn!(peer = %peer_text, reason = what, "callback refused");
    };
    match outcome {
        Ok(Trigger::Delivered { id, wake_id }) => reply(
            202,
            json!({ "result": "accepted", "id": id, "wake_id": wake_id, "message": "delivered; an \
                accepted callback does not prove that work completed" }),
        ),
        Ok(Trigger::Duplicate { id }) => reply(202, json!({ "result": "duplicate", "id": id })),
        Ok(Trigger::Limited { id, retry_at }) => {
            let after_s = (retry_at.as_millis() - shared.clock.now().as_millis()).max(0) / 1000 + 1;
            let mut limited = reply(
                429,
                json!({
                    "result": "refused",
                    "id": id,
                    "error": "the agent's timers and callbacks woke it as often as an hour \
                              allows; nothing was delivered",
                    "retry_after_s": after_s}),
            );
            limited.retry_after_s = Some(after_s as u64);
            limited
        }
        Ok(Trigger::Invalid) => {
            miss("unknown, revoked or malformed token");
            refused(404, "unknown, revoked or malformed callback token")
        }
        Ok(Trigger::WrongMode { expected }) => {
            miss("token used on the other mode's route");
            refused(
                409,
                format!(
                    "this callback's mode is {}; use {CALLBACK_PREFIX}{}/<token>",
                    expected.as_str(),
                    expected.as_str()
                ),
            )
        }
        Err(e) if let Some(r) = unavailable(&e) => {
            tracing::warn!(error = %e, "callback not delivered");
            r
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot deliver a callback");
            reply(
                500,
                json!({ "result": "error", "error": "the daemon could not deliver the callback \
                                                     (see its log)" }),
            )
        }
    }
}

/// Hands the signal to the engine loop; its durable verdict is mapped once it comes.
fn apply(
    shared: &Arc<Shared>,
    request: SignalRequest,
    key: String,
    peer: Option<SocketAddr>,
) -> Routed {
    let id = request.id.clone();
    Later::submit(
        shared,
        |reply| Submission::Signal {
            request,
            key,
            reply,
        },
        "nothing was recorded",
        move |shared, verdict| signal_reply(shared, verdict, &id, peer),
    )
}

/// The answer to a signal's verdict; an unknown id or a wrong secret spends the sender's budget.
fn signal_reply(
    shared: &Shared,
    verdict: crate::error::Result<Verdict>,
    id: &str,
    peer: Option<SocketAddr>,
) -> Reply {
    let peer_text = peer.map(|p| p.to_string()).unwrap_or_default();
    let miss = |what: &str| {
        record_miss(shared, peer);
        tracing::warn!(
            waitpoint = %id,
            peer = %peer_text,
            reason = what,
            "webhook signal refused"
        );
    };
    match verdict {
        Ok(Verdict::Accepted {
            id,
            seq,
            wake,
            status,
            ..
        }) => reply(
            202,
            json!({
                "result": "accepted",
                "id": id,
                "seq": seq,
                "woke": wake.is_some(),
                "status": status.as_str()
            }),
        ),
        Ok(Verdict::Duplicate { id, .. }) => reply(
            202,
            json!({ "result": "duplicate", "id": id, "message": "already recorded under this \
                Idempotency-Key; not counted again" }),
        ),
        Ok(Verdict::Queued { id }) => reply(
            202,
            json!({ "result": "queued", "id": id, "message": "kept by the cluster; the leading \
                daemon counts it" }),
        ),
        Ok(Verdict::Closed { id, status, .. }) => reply(
            410,
            json!({
                "result": "closed",
                "id": id,
                "status": status.as_str(),
                "message": format!("already {}", status.as_str())
            }),
        ),
        Ok(Verdict::Refused(Refusal::UnknownId)) => {
            miss("unknown waitpoint id");
            refused(404, "unknown waitpoint id")
        }
        Ok(Verdict::Refused(Refusal::Unauthorized)) => {
            miss("wrong secret");
            refused(401, "wrong secret")
        }
        Ok(Verdict::Refused(r)) => {
            let expected = match &r {
                Refusal::MemberMissing { expected } | Refusal::MemberUnknown { expected, .. } => {
                    expected.clone()
                }
                Refusal::Unauthorized | Refusal::UnknownId => Vec::new(),
            };
            reply(
                422,
                json!({ "result": "refused", "error": r.reason(), "expected": expected }),
            )
        }
        Err(e) if let Some(r) = unavailable(&e) => {
            tracing::warn!(waitpoint = %id, error = %e, "webhook signal not recorded");
            r
        }
        Err(e) => {
            tracing::error!(waitpoint = %id, error = %e, "cannot record a webhook signal");
            reply(
                500,
                // The failure may have come after the batch's journal line was durable (its
                // files then come with the replay), so "not recorded" would be a guess: the
                // truth is that the outcome is unknown, and a retry under the same key is safe.
                json!({ "result": "unknown", "error": "the daemon could not finish recording the \
                    signal (see its log); it may or may not count: send it again with the same \
                    Idempotency-Key, which counts once" }),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::head::head_of;
    use super::*;
    use crate::clock::ManualClock;
    use crate::engine::rules::Refusal;
    use std::sync::Arc;
    use std::sync::Mutex;

    /// A shim's shared state with no socket behind it; `verdict` answers every signal.
    fn shared(control: Option<&str>, verdict: fn() -> Verdict) -> Shared {
        Shared {
            submit: Box::new(move |s| {
                if let Submission::Signal { reply, .. } = s {
                    reply.send(Ok(verdict()));
                }
                true
            }),
            addr: "127.0.0.1:3001".parse().unwrap(),
            control: control.map(crate::secret::hash),
            clock: Arc::new(ManualClock::new(Timestamp::from_millis(0))),
            budget: Mutex::new(MissBudgets::default()),
            ui: super::super::ui::UiState::new(crate::home::Home::new("/nonexistent")),
            peers: Arc::default(),
            arriving: Default::default(),
        }
    }

    /// The route's answer, its outcome awaited when it is the loop's.
    fn answered(s: &Arc<Shared>, h: &Head, body: Option<&[u8]>, peer: Option<SocketAddr>) -> Reply {
        match route(s, h, body, peer) {
            Routed::Now(r) => r,
            Routed::Later(rest) => tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(rest.reply()),
        }
    }

    fn head(text: &str) -> Head {
        head_of(text).ok().expect("a head the shim reads")
    }

    const BODY: &[u8] = br#"{"id":"wp_0123456789ab","secret":"s"}"#;

    fn post_signal(s: &Arc<Shared>) -> u16 {
        let h = head(&format!(
            "POST /webhook/signal HTTP/1.1\nHost: 127.0.0.1\nContent-Length: {}\n\n",
            BODY.len()
        ));
        answered(s, &h, Some(BODY), None).code
    }

    #[test]
    fn wrong_secrets_spend_the_miss_budget_and_then_the_route_answers_429() {
        let s = Arc::new(shared(None, || Verdict::Refused(Refusal::Unauthorized)));
        for _ in 0..MISS_BUDGET {
            assert_eq!(post_signal(&s), 401);
        }
        assert_eq!(post_signal(&s), 429, "the budget is spent");
        // A minute later it has room again.
        let clock = ManualClock::new(Timestamp::from_millis(MISS_WINDOW_MS));
        let s2 = Arc::new(Shared {
            clock: Arc::new(clock),
            budget: Mutex::new(std::mem::take(&mut *s.budget.lock().unwrap())),
            ..shared(None, || Verdict::Refused(Refusal::Unauthorized))
        });
        assert_eq!(post_signal(&s2), 401);
    }

    #[test]
    fn web_pages_and_foreign_hosts_are_refused_before_the_budget() {
        let s = Arc::new(shared(None, || Verdict::Refused(Refusal::UnknownId)));
        let from_page = head(
            "POST /webhook/signal HTTP/1.1\nHost: 127.0.0.1\nOrigin: \
             https://evil.example\nContent-Length: 2\n\n",
        );
        assert_eq!(answered(&s, &from_page, Some(b"{}"), None).code, 403);
        let rebound = head("GET /healthz HTTP/1.1\nHost: evil.example\n\n");
        assert_eq!(answered(&s, &rebound, None, None).code, 403);
        assert!(!s.budget.lock().unwrap().any(Timestamp::from_millis(0)));
        let health = head("GET /healthz HTTP/1.1\nHost: localhost\n\n");
        assert_eq!(answered(&s, &health, None, None).code, 200);
    }

    #[test]
    fn a_lost_lease_answers_503_with_retry_after_on_the_signal_callback_and_control_routes() {
        let lost = || Error::LeaseLost { retry_after_s: 7 };
        let s = Arc::new(Shared {
            submit: Box::new(move |sub| {
                match sub {
                    Submission::Signal { reply, .. } => reply.send(Err(lost())),
                    Submission::Callback { reply, .. } => reply.send(Err(lost())),
                    Submission::Control { reply, .. } => reply.send(Err(lost())),
                    Submission::Ui { reply, .. } => reply.send(Err(lost())),
                }
                true
            }),
            ..shared(Some("operator-token-0123456789"), || {
                Verdict::Refused(Refusal::UnknownId)
            })
        });
        let signal = head(&format!(
            "POST /webhook/signal HTTP/1.1\nHost: 127.0.0.1\nContent-Length: {}\n\n",
            BODY.len()
        ));
        let callback =
            head("POST /api/callbacks/wake/tok HTTP/1.1\nHost: 127.0.0.1\nContent-Length: 0\n\n");
        let control = head(
            "GET /api/agents/a1/timers HTTP/1.1\nHost: 127.0.0.1\nAuthorization: Bearer \
             operator-token-0123456789\n\n",
        );
        for (route_name, h, body) in [
            ("signal", &signal, BODY),
            ("callback", &callback, &b""[..]),
            ("control", &control, &b""[..]),
        ] {
            let r = answered(&s, h, Some(body), None);
            assert_eq!(r.code, 503, "{route_name}: {}", r.body);
            assert!(
                r.body["error"]
                    .as_str()
                    .unwrap()
                    .contains("no longer leads"),
                "{route_name}: {}",
                r.body
            );
            let resp = r.into_response(false);
            assert_eq!(
                resp.headers().get(hyper::header::RETRY_AFTER).unwrap(),
                "7",
                "{route_name}"
            );
        }
        // A stale read is still the control route's 409, without Retry-After.
        let stale = Arc::new(Shared {
            submit: Box::new(|sub| {
                if let Submission::Control { reply, .. } = sub {
                    reply.send(Err(Error::Conflict("it changed".into())));
                }
                true
            }),
            ..shared(Some("operator-token-0123456789"), || {
                Verdict::Refused(Refusal::UnknownId)
            })
        });
        let r = answered(&stale, &control, Some(b""), None);
        assert_eq!((r.code, r.retry_after_s), (409, None));
    }

    #[test]
    fn control_routes_are_off_without_a_token_and_need_the_right_one() {
        let get = |auth: &str| {
            head(&format!(
                "GET /api/agents/a1/timers HTTP/1.1\nHost: 127.0.0.1\n{auth}\n"
            ))
        };
        let off = Arc::new(shared(None, || Verdict::Refused(Refusal::UnknownId)));
        assert_eq!(answered(&off, &get(""), Some(b""), None).code, 404);
        let on = Arc::new(shared(Some("operator-token-0123456789"), || {
            Verdict::Refused(Refusal::UnknownId)
        }));
        assert_eq!(answered(&on, &get(""), Some(b""), None).code, 401);
        let wrong = get("Authorization: Bearer nope\n");
        assert_eq!(answered(&on, &wrong, Some(b""), None).code, 401);
        assert_eq!(
            on.budget
                .lock()
                .unwrap()
                .by_requester
                .get_mut(&Requester::Unknown)
                .map_or(0, |b| b.misses_in_window(Timestamp::from_millis(0))),
            1,
            "a wrong token spends the budget; a missing one does not"
        );
    }
}
