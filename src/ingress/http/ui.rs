//! The operator page (`/ui/`, issue 28) on the shim: its routes, its login and its guards. The
//! page itself is three files in `ui/` (HTML, CSS, JavaScript), compiled into the binary and
//! served as they are: no build step, nothing fetched at run time. What it shows is a bounded
//! list of the sessions (no signal in it; `ETag`'d, a 304 building nothing) and, when the page
//! opens one, a waitpoint's picture, both composed off the daemon's loop from the views every
//! other front end shows (`daemon/ui.rs`); its one action, cancel, is the CLI's
//! `Engine::cancel`, run on the loop.
//!
//! Access: `waitpoint ui` writes the SHA-256 of a one-time code into `ui-login.json` (see
//! [`issue_login_code`]) and prints `http://ADDR/ui/login?code=CODE`. Visiting it consumes the
//! code and starts a login; so does POSTing the operator token (`CORTEX_WEBHOOK_TOKEN`) to
//! `/ui/login`, when the daemon has one. A login is two random values: a cookie
//! (`HttpOnly; SameSite=Strict`) and a place, the page's own prefix `/ui/s/PLACE/` that the
//! cookie's `Path` names and the login redirects to. Every route but the login, files
//! included, lives under a login's place and answers 401 without that login's cookie. A change
//! (cancel, logout) must also come from the page itself: its `Origin` must be the shim's own, and
//! it must carry the login's CSRF token, which only the page's view hands out.
//!
//! Cookies are not isolated by port, and every port of 127.0.0.1 is one site for `SameSite`:
//! a page another local user serves on 127.0.0.1 is sent our cookies and may set its own. So a
//! cookie alone opens nothing (issue 36):
//!
//! - A login is bound to the user who started it (the owner of the client's socket, `peer.rs`)
//!   and is refused to any other user, so a cookie replayed from another uid reads nothing and
//!   cancels nothing.
//! - The cookie's `Path` is the login's place, which no other port is ever sent (the page sends
//!   no `Referer`): another port's server is not sent the cookie for its own paths, and cannot
//!   overwrite or delete it (that takes the same name and path). A cookie of the same name it
//!   sets on a shorter path reaches us beside ours: every cookie of our name is tried, the one
//!   that is a live login for this user and this place counts, and an unknown one ends
//!   nothing.
//!
//! The page's Log out button ends its login (`POST .../logout`, Origin and CSRF token
//! checked): the cookie opens nothing from then on, and the browser is told to drop it.
//!
//! Logins live in the daemon's memory only (a restart logs everyone out), keyed by the
//! SHA-256 of their cookie, at most [`MAX_SESSIONS`] of them, each for [`SESSION_TTL_MS`].

use std::collections::HashMap;
use std::net::SocketAddr;

use http::header::{HeaderName, HeaderValue};
use hyper::body::Bytes;
use serde_json::{Value, json};

use super::head::{Head, PageBody, Reply, reply};
use super::routes::{Operator, budget_spent, operator, record_miss};
use super::{Outcome, Shared, Submission};
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::records::UiLogin;
use crate::sync::MutexExt;

/// The page's routes all start with this.
pub const UI_PREFIX: &str = "/ui";
/// The login route: `GET` with `?code=`, or `POST` with the operator token.
pub const LOGIN_PATH: &str = "/ui/login";
/// Where each login's place starts: a login's page is `/ui/s/PLACE/`, and every route of a
/// logged-in page is under it.
pub const PLACE_PREFIX: &str = "/ui/s/";
/// The page's view, polled with `If-None-Match` (under the login's place).
pub const VIEW_ROUTE: &str = "api/view";
/// Cancelling a waitpoint from the page (under the login's place).
pub const CANCEL_ROUTE: &str = "api/cancel";
/// Ending this login: its cookie stops working at once (under the login's place).
pub const LOGOUT_ROUTE: &str = "logout";
/// One waitpoint's full picture, its signals included (`?id=`, under the login's place): the
/// list has none of them, the page asks for one when its panel is opened.
pub const WAITPOINT_ROUTE: &str = "api/waitpoint";
/// The response header saying how many times the daemon has built the page's list since it
/// started: a 304 answered from what is kept leaves it as it was.
pub const BUILDS_HEADER: &str = "x-waitpoint-views-built";
/// The session cookie's name.
pub const COOKIE: &str = "waitpoint_ui";
/// How long a code `waitpoint ui` printed stays good.
pub const LOGIN_TTL_MS: i64 = 5 * 60_000;
/// How long a login lasts.
pub const SESSION_TTL_MS: i64 = 12 * 3_600_000;
/// Logins held at most; a new one beyond this ends the oldest.
pub const MAX_SESSIONS: usize = 64;
/// Every page response's Content-Security-Policy: the page's own files and nothing else.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src \
    'self'; img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The page's files, as served.
pub const INDEX_HTML: &str = include_str!("ui/index.html");
pub const UI_CSS: &str = include_str!("ui/ui.css");
pub const UI_JS: &str = include_str!("ui/ui.js");
pub const LOGIN_HTML: &str = include_str!("ui/login.html");

/// What the page asks of the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UiRequest {
    /// The page's list: its sessions with their rings, capsules and rows (bounded), unless it
    /// is still the one whose `ETag` the page holds (`known`).
    View { known: Option<String> },
    /// One waitpoint's full picture (`show --json`, its latest signals).
    Waitpoint { id: String },
    /// Cancel waitpoint `id` of `session`, as `waitpoint cancel` does.
    Cancel { id: String, session: String },
}

/// The daemon's answer to a [`UiRequest`].
#[derive(Debug, Clone)]
pub enum UiAnswer {
    /// The list: its `ETag`, its JSON text unless it is the one the page holds, and how many
    /// times the list has been built.
    View {
        etag: String,
        json: Option<std::sync::Arc<str>>,
        builds: u64,
    },
    /// Any other answer, as JSON.
    Json(Value),
}

/// Writes a fresh one-time login code's hash into `home`'s login file (replacing any earlier
/// code), good for [`LOGIN_TTL_MS`] from `now`, and returns the code: the only place it ever is
/// in plain text.
pub fn issue_login_code(home: &Home, now: Timestamp) -> Result<String> {
    let code = crate::secret::random_hex(16);
    let record = UiLogin {
        code_sha256: crate::secret::hash(&code),
        expires_at: now.plus_ms(LOGIN_TTL_MS),
    };
    home.root_dir()
        .commit_json(&home.ui_login_file(), &record)?;
    Ok(code)
}

/// Whether `code` is the code in `home`'s login file and still good; a right code is consumed
/// (the file removed) before this says yes, so it opens one login only. An expired file is
/// removed too.
fn consume_login_code(home: &Home, code: &str, now: Timestamp) -> Result<bool> {
    let (root, file) = (home.root_dir(), &home.ui_login_file());
    let Some(record) = root.read_json::<UiLogin>(file)? else {
        return Ok(false);
    };
    if now >= record.expires_at {
        root.remove_durably(file)?;
        return Ok(false);
    }
    if !crate::secret::verify(code, &record.code_sha256) {
        return Ok(false);
    }
    // The removal is the claim: of two requests racing with the right code, only the one
    // whose unlink finds the file opens a login.
    match root.unlink(file) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(crate::error::Error::io("cannot remove", file, e)),
    }
    if let Some(dir) = file.parent() {
        root.fsync_dir(dir)?;
    }
    Ok(true)
}

/// One login: who started it, its place, its CSRF token and when it ends.
#[derive(Debug, Clone)]
struct Login {
    /// The user whose client started it; no other user's request is served with it.
    uid: u32,
    /// The page's own prefix is `/ui/s/{place}/`; the cookie is sent there only.
    place: String,
    csrf: String,
    expires_at: Timestamp,
    started_at: Timestamp,
}

/// A started login: its cookie value and its place.
struct Started {
    cookie: String,
    place: String,
}

/// The page's state in the shim: the home whose login code it takes, and the live logins by the
/// SHA-256 of their cookie.
#[derive(Debug)]
pub(super) struct UiState {
    home: Home,
    logins: std::sync::Mutex<HashMap<String, Login>>,
}

impl UiState {
    pub(super) fn new(home: Home) -> Self {
        UiState {
            home,
            logins: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Starts a login for user `uid`.
    fn start(&self, uid: u32, now: Timestamp) -> Started {
        let cookie = crate::secret::random_hex(32);
        let place = crate::secret::random_hex(16);
        let mut logins = self.logins.lock_or_recover();
        logins.retain(|_, l| l.expires_at > now);
        while logins.len() >= MAX_SESSIONS {
            let oldest = logins
                .iter()
                .min_by_key(|(_, l)| l.started_at)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => logins.remove(&k),
                None => break,
            };
        }
        logins.insert(
            crate::secret::hash(&cookie),
            Login {
                uid,
                place: place.clone(),
                csrf: crate::secret::random_hex(32),
                expires_at: now.plus_ms(SESSION_TTL_MS),
                started_at: now,
            },
        );
        Started { cookie, place }
    }

    /// Ends the login `key` names (the SHA-256 of its cookie, as [`UiState::login_of`] found it).
    fn end(&self, key: &str) {
        self.logins.lock_or_recover().remove(key);
    }

    /// The live login, and its key, that one of the request's cookies of our name opens for
    /// user `uid` at `place`. Every cookie of the name is tried: another port of this host may
    /// have set one of its own beside ours, and that one opens and ends nothing.
    fn login_of(
        &self,
        head: &Head,
        uid: u32,
        place: &str,
        now: Timestamp,
    ) -> Option<(String, Login)> {
        let header = head.cookie.as_deref()?;
        let logins = self.logins.lock_or_recover();
        cookie_values(header).find_map(|cookie| {
            let key = crate::secret::hash(cookie);
            let login = logins.get(&key)?;
            (login.uid == uid && login.place == place && login.expires_at > now)
                .then(|| (key, login.clone()))
        })
    }
}

/// Every value of our cookie in a `Cookie` header's list, in the order sent.
fn cookie_values(header: &str) -> impl Iterator<Item = &str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// Whether `path` is one of the page's.
pub(super) fn is_ui_path(path: &str) -> bool {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    path == UI_PREFIX || path.starts_with("/ui/")
}

/// The headers every page response carries.
fn page_headers() -> Vec<(HeaderName, HeaderValue)> {
    vec![
        (
            HeaderName::from_static("content-security-policy"),
            HeaderValue::from_static(CSP),
        ),
        (
            HeaderName::from_static("x-content-type-options"),
            HeaderValue::from_static("nosniff"),
        ),
        (
            HeaderName::from_static("referrer-policy"),
            HeaderValue::from_static("no-referrer"),
        ),
    ]
}

/// A page response: `body` with its content type and the page's headers.
fn page(code: u16, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    Reply {
        page: Some(Box::new(PageBody {
            content_type,
            bytes: body.into(),
            headers: page_headers(),
        })),
        ..reply(code, Value::Null)
    }
}

/// `r` with one more header (`r` is one of [`page`]'s).
fn with_header(mut r: Reply, name: HeaderName, value: HeaderValue) -> Reply {
    if let Some(p) = r.page.as_mut() {
        p.headers.push((name, value));
    }
    r
}

fn text(code: u16, message: &str) -> Reply {
    page(code, "text/plain; charset=utf-8", format!("{message}\n"))
}

fn unauthorized() -> Reply {
    text(
        401,
        "Not logged in. Run `waitpoint ui` and open the address it prints (its code works once).",
    )
}

/// The shim's own origin, the only one the page's changes may come from.
fn own_origin(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// Answers a request for one of the page's routes, from `peer`, with its `body` when read.
pub(super) fn route(
    shared: &Shared,
    head: &Head,
    peer: Option<SocketAddr>,
    body: Option<&[u8]>,
) -> Reply {
    let (path, query) = head.path.split_once('?').unwrap_or((&head.path, ""));
    // A request from another site's page is refused outright: no route here is meant for one.
    if head
        .origin
        .as_deref()
        .is_some_and(|o| o != own_origin(shared.addr))
    {
        return text(403, "requests from other sites' pages are not served");
    }
    let now = shared.clock.now();
    match (head.method.as_str(), path) {
        ("GET", LOGIN_PATH) if query.is_empty() => {
            return page(200, "text/html; charset=utf-8", LOGIN_HTML);
        }
        ("GET", LOGIN_PATH) => return login_with_code(shared, query, peer, now),
        ("POST", LOGIN_PATH) => return login_with_token(shared, body, peer, now),
        (_, LOGIN_PATH) => return with_allow(text(405, "use GET or POST"), "GET, POST"),
        _ => {}
    }
    // Everything else is a logged-in page's, under its login's place.
    let Some((place, rest)) = path
        .strip_prefix(PLACE_PREFIX)
        .and_then(|p| p.split_once('/'))
    else {
        return unauthorized();
    };
    // The login must be this user's: a cookie another local user was sent (every port of
    // 127.0.0.1 is sent it) opens nothing from that user's programs.
    let Some(uid) = peer.and_then(|p| shared.peers.uid(p, shared.addr)) else {
        return unauthorized();
    };
    let Some((key, login)) = shared.ui.login_of(head, uid, place, now) else {
        return unauthorized();
    };
    match (head.method.as_str(), rest) {
        ("GET", "" | "index.html") => page(200, "text/html; charset=utf-8", INDEX_HTML),
        ("GET", "ui.css") => page(200, "text/css; charset=utf-8", UI_CSS),
        ("GET", "ui.js") => page(200, "text/javascript; charset=utf-8", UI_JS),
        ("GET", VIEW_ROUTE) => view(shared, head, &login),
        ("GET", WAITPOINT_ROUTE) => waitpoint(shared, query),
        ("POST", CANCEL_ROUTE) => cancel(shared, head, body, &login),
        ("POST", LOGOUT_ROUTE) => logout(shared, head, &key, &login),
        (_, VIEW_ROUTE | WAITPOINT_ROUTE) => with_allow(text(405, "use GET"), "GET"),
        (_, CANCEL_ROUTE | LOGOUT_ROUTE) => with_allow(text(405, "use POST"), "POST"),
        _ => text(404, "no such page"),
    }
}

fn with_allow(r: Reply, allow: &'static str) -> Reply {
    Reply {
        allow: Some(allow),
        ..r
    }
}

/// The `Path` of a login's cookie, its place: the only path it is ever sent to.
fn place_path(place: &str) -> String {
    format!("{PLACE_PREFIX}{place}")
}

/// A new login for the user owning `peer`'s socket: its cookie, and a redirect to its page.
/// Refused when that user cannot be told (the login is bound to them).
fn logged_in(shared: &Shared, peer: Option<SocketAddr>, now: Timestamp) -> Reply {
    let Some(uid) = peer.and_then(|p| shared.peers.uid(p, shared.addr)) else {
        tracing::warn!("operator page: a login was refused: the client's user cannot be told");
        return text(
            403,
            "cannot tell which local user is connecting, and a login is bound to its user",
        );
    };
    let Started { cookie, place } = shared.ui.start(uid, now);
    let path = place_path(&place);
    let set = format!("{COOKIE}={cookie}; HttpOnly; SameSite=Strict; Path={path}");
    let r = with_header(
        text(303, &format!("logged in; the page is at {path}/")),
        http::header::SET_COOKIE,
        HeaderValue::from_str(&set).expect("hex is a valid header value"),
    );
    with_header(
        r,
        http::header::LOCATION,
        HeaderValue::from_str(&format!("{path}/")).expect("hex is a valid header value"),
    )
}

/// `GET /ui/login?code=…`: the one-time code `waitpoint ui` printed.
fn login_with_code(
    shared: &Shared,
    query: &str,
    peer: Option<SocketAddr>,
    now: Timestamp,
) -> Reply {
    if let Some(r) = budget_spent(shared, peer) {
        return r;
    }
    let code = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("code="))
        .unwrap_or_default();
    match consume_login_code(&shared.ui.home, code, now) {
        Ok(true) => logged_in(shared, peer, now),
        Ok(false) => {
            record_miss(shared, peer);
            tracing::warn!("operator page: a login code was refused (unknown, used or expired)");
            text(
                401,
                "This login code is unknown, used or expired. Run `waitpoint ui` for a new one.",
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "operator page: cannot read the login code");
            text(500, "cannot read the login code (see the daemon's log)")
        }
    }
}

/// `POST /ui/login` with `token=…` (a form): the operator token, when the daemon has one.
fn login_with_token(
    shared: &Shared,
    body: Option<&[u8]>,
    peer: Option<SocketAddr>,
    now: Timestamp,
) -> Reply {
    let token = body
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|b| {
            b.split('&')
                .find_map(|pair| pair.strip_prefix("token="))
                .map(form_decode)
        })
        .filter(|t| !t.is_empty());
    match operator(shared, peer, token.as_deref(), LOGIN_PATH) {
        Operator::Right => logged_in(shared, peer, now),
        Operator::Off => text(
            404,
            "this daemon has no operator token; run `waitpoint ui` for a login address",
        ),
        Operator::Spent(r) => r,
        Operator::Missing | Operator::Wrong => text(401, "wrong operator token"),
    }
}

/// A form field's value decoded (`+` and `%XX`); a `%` not followed by two hex digits is kept.
fn form_decode(v: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes[i..] {
            [b'%', hi, lo, ..] => hex(hi).zip(hex(lo)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Hands `request` to the daemon and waits for its answer.
fn submit(shared: &Shared, request: UiRequest) -> std::result::Result<Result<UiAnswer>, Reply> {
    let (tx, rx) = Outcome::pair();
    let submitted = (shared.submit)(Submission::Ui { request, reply: tx });
    // The page's answers come from the daemon's views thread (a cancel from its loop), so a
    // worker waits here, not a connection's task: a view is built in milliseconds and the page
    // polls one at a time.
    match rx.blocking_recv() {
        Ok(v) if submitted => Ok(v),
        _ => Err(text(503, "the daemon is shutting down")),
    }
}

/// `GET .../api/view`: the list with this login's CSRF token, `ETag`'d: a list unchanged since
/// the `If-None-Match` the page sends is answered 304, and the daemon builds nothing for it.
fn view(shared: &Shared, head: &Head, login: &Login) -> Reply {
    let known = head.if_none_match.clone();
    let (etag, json, builds) = match submit(shared, UiRequest::View { known }) {
        Ok(Ok(UiAnswer::View { etag, json, builds })) => (etag, json, builds),
        Ok(Ok(UiAnswer::Json(_))) => return text(500, "the daemon answered the list wrongly"),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "operator page: cannot compose the view");
            return text(
                500,
                "the daemon could not read the waitpoints (see its log)",
            );
        }
        Err(r) => return r,
    };
    let r = match json {
        None => page(304, "application/json", Bytes::new()),
        Some(list) => page(
            200,
            "application/json",
            format!("{{\"csrf\":{},\"view\":{list}}}", json!(login.csrf)),
        ),
    };
    let tag = HeaderValue::from_str(&etag).expect("hex is a valid header value");
    let r = with_header(r, http::header::ETAG, tag);
    with_header(
        r,
        HeaderName::from_static(BUILDS_HEADER),
        HeaderValue::from(builds),
    )
}

/// `GET .../api/waitpoint?id=…`: one waitpoint's full picture.
fn waitpoint(shared: &Shared, query: &str) -> Reply {
    let id = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("id="))
        .unwrap_or_default();
    if !crate::names::is_waitpoint_id(id) {
        return text(400, "id must be a waitpoint id (wp_ and 12 hex digits)");
    }
    match submit(shared, UiRequest::Waitpoint { id: id.to_owned() }) {
        Ok(Ok(UiAnswer::Json(v))) => page(200, "application/json", format!("{v}\n")),
        Ok(Ok(UiAnswer::View { .. })) => text(500, "the daemon answered the waitpoint wrongly"),
        Ok(Err(Error::NotFound { .. })) => text(404, "no such waitpoint"),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "operator page: cannot read a waitpoint");
            text(500, "the daemon could not read the waitpoint (see its log)")
        }
        Err(r) => r,
    }
}

/// The refusal of a change that does not come from the page itself: its Origin must be the
/// shim's own and it must carry the login's CSRF token. `None` when it does.
fn not_from_the_page(shared: &Shared, head: &Head, login: &Login) -> Option<Reply> {
    if head.origin.as_deref() != Some(own_origin(shared.addr).as_str()) {
        return Some(text(
            403,
            "a change must come from the page itself (its Origin)",
        ));
    }
    let csrf_ok = head
        .csrf
        .as_deref()
        .is_some_and(|t| constant_time_eq::constant_time_eq(t.as_bytes(), login.csrf.as_bytes()));
    (!csrf_ok).then(|| text(403, "a change must carry the page's CSRF token"))
}

/// `POST .../logout`, from the page: the login (`key`) ends and the browser is told to drop its
/// cookie.
fn logout(shared: &Shared, head: &Head, key: &str, login: &Login) -> Reply {
    if let Some(refused) = not_from_the_page(shared, head, login) {
        return refused;
    }
    shared.ui.end(key);
    let path = place_path(&login.place);
    let clear = format!("{COOKIE}=; Max-Age=0; HttpOnly; SameSite=Strict; Path={path}");
    with_header(
        text(200, "logged out; run `waitpoint ui` for a new address"),
        http::header::SET_COOKIE,
        HeaderValue::from_str(&clear).expect("a valid header value"),
    )
}

/// `POST .../api/cancel` with `{"id": …, "session": …}`: only from the page (its own origin and
/// the login's CSRF token).
fn cancel(shared: &Shared, head: &Head, body: Option<&[u8]>, login: &Login) -> Reply {
    if let Some(refused) = not_from_the_page(shared, head, login) {
        return refused;
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        id: String,
        session: String,
    }
    let Some(Ok(Body { id, session })) = body.map(serde_json::from_slice::<Body>) else {
        return text(
            400,
            "the body must be JSON like {\"id\": …, \"session\": …}",
        );
    };
    match submit(shared, UiRequest::Cancel { id, session }) {
        Ok(Ok(UiAnswer::Json(v))) => page(200, "application/json", format!("{v}\n")),
        Ok(Ok(UiAnswer::View { .. })) => text(500, "the daemon answered the cancel wrongly"),
        Ok(Err(e)) => {
            let code = match e {
                Error::NotFound { .. } => 404,
                Error::Conflict(_) => 409,
                Error::Invalid { .. } | Error::Usage(_) => 400,
                _ => {
                    tracing::error!(error = %e, "operator page: cannot cancel");
                    return text(500, "the daemon could not cancel it (see its log)");
                }
            };
            text(code, &e.to_string())
        }
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_small_enough_to_read_in_one_sitting() {
        let total = INDEX_HTML.len() + UI_CSS.len() + UI_JS.len() + LOGIN_HTML.len();
        assert!(total < 50 * 1024, "the page's files are {total} bytes");
    }

    #[test]
    fn a_login_code_works_once_and_not_after_it_expires() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let file = home.ui_login_file();
        let t0 = Timestamp::from_millis(1_000_000);
        let code = issue_login_code(&home, t0).unwrap();
        let stored = std::fs::read_to_string(&file).unwrap();
        assert!(!stored.contains(&code), "only the hash is kept: {stored}");
        assert!(!consume_login_code(&home, "wrong", t0).unwrap());
        assert!(consume_login_code(&home, &code, t0.plus_ms(1)).unwrap());
        assert!(
            !consume_login_code(&home, &code, t0.plus_ms(2)).unwrap(),
            "used"
        );
        let code = issue_login_code(&home, t0).unwrap();
        assert!(!consume_login_code(&home, &code, t0.plus_ms(LOGIN_TTL_MS)).unwrap());
        assert!(!file.exists(), "an expired code is removed");
    }

    fn with_cookies(cookies: &[&str]) -> Head {
        Head {
            cookie: Some(
                cookies
                    .iter()
                    .map(|c| format!("{COOKIE}={c}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            ..Head::default()
        }
    }

    #[test]
    fn a_login_opens_only_for_its_user_at_its_place_and_a_bogus_cookie_beside_it_ends_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ui = UiState::new(Home::new(dir.path()));
        let t0 = Timestamp::from_millis(1_000_000);
        let (operator, other) = (1000, 1001);
        let Started { cookie, place } = ui.start(operator, t0);
        let mine = with_cookies(&[&cookie]);
        assert!(ui.login_of(&mine, operator, &place, t0).is_some());
        assert!(
            ui.login_of(&mine, other, &place, t0).is_none(),
            "another uid"
        );
        assert!(ui.login_of(&mine, operator, "elsewhere", t0).is_none());
        // Another port's cookie of our name, sent before ours or after it: ours still counts.
        for both in [[&*cookie, "bogus"], ["bogus", &*cookie]] {
            let (key, _) = ui
                .login_of(&with_cookies(&both), operator, &place, t0)
                .unwrap();
            assert_eq!(key, crate::secret::hash(&cookie));
        }
        assert!(
            ui.login_of(&with_cookies(&["bogus"]), operator, &place, t0)
                .is_none()
        );
        assert!(ui.login_of(&mine, operator, &place, t0).is_some());
        assert!(
            ui.login_of(&mine, operator, &place, t0.plus_ms(SESSION_TTL_MS))
                .is_none(),
            "expired"
        );
    }

    #[test]
    fn every_cookie_of_our_name_is_found_among_others() {
        let all = |h| cookie_values(h).collect::<Vec<_>>();
        assert_eq!(all("a=1; waitpoint_ui=abc; b=2"), ["abc"]);
        assert_eq!(all("waitpoint_ui=abc; waitpoint_ui=def"), ["abc", "def"]);
        assert!(all("waitpoint_uix=abc").is_empty());
        assert!(all("waitpoint_ui=").is_empty());
        assert_eq!(form_decode("a%2Bb+c%zz"), "a+b c%zz");
    }
}
