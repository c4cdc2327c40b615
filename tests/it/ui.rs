//! The operator page (`/ui/` on the HTTP shim, `waitpoint ui`): in a real headless Chromium
//! driven by Selenium (`ui_browser.py`, at a desktop's and a phone's size: login, rings and
//! capsules, a live update, the popover and the bottom sheet, cancel with its confirmation,
//! hostile text shown as text), and from curl for what a browser would not send: no cookie, a
//! used code, a foreign Origin, no CSRF token, and what the view must never hold.
//!
//! Chromium, its driver and Selenium are installed by `scripts/test-deps`; a missing one fails
//! the test with that hint. The screenshots go to `target/ui-screenshots/`; with
//! `WAITPOINT_UPDATE_SCREENSHOTS=1` the desktop one also replaces `docs/operator-page.png`, the
//! picture README.md shows.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

use crate::helpers::*;
use crate::mcp::dep;

const TOKEN: &str = "operator-token-0123456789abcdef";
const HOSTILE_LABEL: &str = "<script>window.pwned=1</script>";
const HOSTILE_INTENT: &str = r#"<img src=x onerror="window.pwned=1">"#;

/// A program from the system the browser tests need, or a failure saying how to get it.
fn system_tool(path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(
        p.exists(),
        "{path} is missing: the operator page's tests run a real Chromium (run scripts/test-deps, \
which installs Debian's chromium and chromium-driver)"
    );
    p
}

/// A daemon with the shim and an operator token.
fn daemon(env: &Env) -> DaemonGuard {
    env.daemon_with(
        &["--http", "--port", "0"],
        &[("CORTEX_WEBHOOK_TOKEN", TOKEN)],
    )
}

/// `waitpoint ui`'s login address.
fn login_url(env: &Env) -> String {
    let out = env.waitpoint(&["ui"]);
    let url = env.ok("waitpoint ui", &out).trim().to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.contains("/ui/login?code="),
        "{url}"
    );
    url
}

/// One answer from curl: status, headers (names lowercased) and body.
struct Answer {
    code: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn curl(env: &Env, method: &str, url: &str, headers: &[&str], body: Option<&str>) -> Answer {
    curl_as(env, None, method, url, headers, body)
}

/// [`curl`] run as the user `uid` (root runs the tests; `setpriv` drops to it), or as this
/// process's user when `None`.
fn curl_as(
    env: &Env,
    uid: Option<u32>,
    method: &str,
    url: &str,
    headers: &[&str],
    body: Option<&str>,
) -> Answer {
    let drop_to = uid.map(|u| [format!("--reuid={u}"), format!("--regid={u}")]);
    let mut args: Vec<&str> = match &drop_to {
        Some([reuid, regid]) => vec![reuid, regid, "--clear-groups", "curl"],
        None => vec![],
    };
    args.extend(["-sS", "-i", "--max-time", "30", "-X", method, url]);
    for h in headers {
        args.extend(["-H", h]);
    }
    if let Some(b) = body {
        args.extend(["--data-binary", b]);
    }
    let out = env.run(if uid.is_some() { "setpriv" } else { "curl" }, &args);
    let text = env.ok("curl", &out);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let code = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        code,
        headers,
        body: body.to_owned(),
    }
}

/// A login as curl holds it: the cookie header to send (`Cookie: waitpoint_ui=…`), the cookie's
/// value, and the page's address (its login's place, where the cookie is sent).
struct Login {
    cookie: String,
    value: String,
    page: String,
}

/// The login a 303 from the login route started.
fn login_from(env: &Env, a: &Answer) -> Login {
    assert_eq!(a.code, 303, "{}", a.body);
    let set = a.header("set-cookie").expect("a cookie").to_owned();
    let pair = set.split(';').next().unwrap().to_owned();
    let location = a.header("location").expect("where the page is");
    assert!(
        location.starts_with("/ui/s/") && location.ends_with('/'),
        "{location}"
    );
    let path = set
        .split(';')
        .find_map(|attr| attr.trim().strip_prefix("Path="))
        .expect("a Path");
    assert_eq!(
        format!("{path}/"),
        location,
        "the cookie goes to the page only"
    );
    Login {
        value: pair.split_once('=').unwrap().1.to_owned(),
        cookie: format!("Cookie: {pair}"),
        page: format!("http://127.0.0.1:{}{location}", env.webhook_port()),
    }
}

/// Logs in with a fresh code.
fn log_in(env: &Env) -> Login {
    login_from(env, &curl(env, "GET", &login_url(env), &[], None))
}

fn state(env: &Env, id: &str) -> Value {
    env.waitpoint_json("show", &["show", "--json", id])
}

fn run_browser(env: &Env, config: &Value) -> Output {
    let python = dep("venv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/ui_browser.py");
    env.command(python.to_str().unwrap())
        .arg(script)
        .arg(config.to_string())
        .output()
        .expect("run the browser script")
}

#[test]
fn the_operator_page_in_a_real_browser_shows_sessions_live_and_cancels_only_when_confirmed() {
    let chromium = system_tool("/usr/bin/chromium");
    let chromedriver = system_tool("/usr/bin/chromedriver");
    // Every wake's onWake fails: a fired waitpoint shows the retrying badge with the error.
    let env = Env::with_settings(
        &json!({
            "waitpointSweepMs": 300,
            "onWake": ["sh", "-c", "echo 'hook says no' >&2; exit 1"],
        })
        .to_string(),
    );
    let _d = daemon(&env);
    let flaky = env.arm("flaky", &["--session", "retry"]);
    let (flaky_id, flaky_secret) = id_secret(&flaky);
    env.ok(
        "signal flaky",
        &env.signal(&["--id", &flaky_id, "--secret", &flaky_secret]),
    );
    env.wait_until("a failed onWake on record", || {
        state(&env, &flaky_id)["hook_deliveries"][0]["attempts"].as_u64() >= Some(1)
    });
    let alice = env.arm(
        "train-arm2",
        &[
            "--session",
            "alice",
            "--intent",
            "all three arms; wake me when they are all in",
            "--member",
            "arm2",
            "--member",
            "arm6",
        ],
    );
    let (alice_id, alice_secret) = id_secret(&alice);
    env.arm(
        HOSTILE_LABEL,
        &["--session", "mallory", "--intent", HOSTILE_INTENT],
    );
    let keep = env.arm("keep-me", &["--session", "bob"]);
    let doomed = env.arm("cancel-me", &["--session", "bob"]);
    // A session whose only waitpoint is cancelled waits on nothing: no ring, no capsule.
    let idle = env.arm("done", &["--session", "idle"]);
    env.ok(
        "cancel",
        &env.waitpoint(&["cancel", "--session", "idle", &id_secret(&idle).0]),
    );
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let message = "step 1200 of 5000";
    let signal = [
        CORTEX_SIGNAL,
        "--id",
        &alice_id,
        "--secret",
        &alice_secret,
        "--status",
        "progress",
        "--member",
        "arm2",
        "--message",
        message,
    ];
    for (viewport, size) in [("desktop", [1280, 800]), ("phone", [390, 844])] {
        let config = json!({
            "viewport": viewport,
            "size": size,
            "chromium": chromium,
            "chromedriver": chromedriver,
            "driver_log": env.home.join(format!("../chromedriver-{viewport}.log")),
            "login_url": login_url(&env),
            "screenshot": shots.join(format!("{viewport}.png")),
            "signal_command": signal,
            "alice": {
                "session": "alice",
                "capsule": "train-arm2 · 0/2 received · expires in",
                "intent": "all three arms; wake me when they are all in",
                "message": message,
                "source_prefix": "http:",
            },
            "idle": "idle",
            "retry": { "session": "retry", "error": "exit 1: hook says no" },
            "hostile": { "session": "mallory", "label": HOSTILE_LABEL, "intent": HOSTILE_INTENT },
            "bob": { "session": "bob", "keep": id_secret(&keep).0, "cancel": id_secret(&doomed).0 },
        });
        let out = run_browser(&env, &config);
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with("ok\n"),
            "the {viewport} run failed: {}\n--- chromedriver\n{}\n{}",
            env.report(&out),
            std::fs::read_to_string(env.home.join(format!("../chromedriver-{viewport}.log")))
                .unwrap_or_default()
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n"),
            env.daemon_report()
        );
        assert!(shots.join(format!("{viewport}.png")).exists());
    }
    // The README's picture is kept in the repository; this run refreshes it when asked, as
    // scripts/gen-man refreshes the pages (a shot holds the time, so it differs every run).
    let kept = Path::new(env!("CARGO_MANIFEST_DIR")).join(README_PICTURE);
    if std::env::var_os("WAITPOINT_UPDATE_SCREENSHOTS").is_some() {
        std::fs::copy(shots.join("desktop.png"), &kept).unwrap();
    }
    assert_eq!(
        state(&env, &id_secret(&doomed).0)["status"],
        "cancelled",
        "confirmed"
    );
    assert_eq!(
        state(&env, &id_secret(&keep).0)["status"],
        "armed",
        "dismissed"
    );
}

/// The page's picture the README shows, kept in the repository.
const README_PICTURE: &str = "docs/operator-page.png";

#[test]
fn the_readme_shows_the_pages_picture_from_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("]({README_PICTURE})")),
        "README.md shows no {README_PICTURE}"
    );
    let png = std::fs::read(root.join(README_PICTURE)).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "{README_PICTURE} is no PNG");
    // Small: a picture, not a weight on every clone.
    assert!(
        png.len() < 300_000,
        "{README_PICTURE} is {} bytes",
        png.len()
    );
}

#[test]
fn the_operator_page_answers_401_without_a_login_and_refuses_changes_from_elsewhere() {
    let env = Env::new();
    let _d = daemon(&env);
    let port = env.webhook_port();
    let base = format!("http://127.0.0.1:{port}");
    let origin = format!("Origin: {base}");
    let reply = env.arm("guarded", &["--session", "s1"]);
    let (id, secret) = id_secret(&reply);
    let cancel_body = json!({ "id": id, "session": "s1" }).to_string();

    // No cookie: every /ui route but the login answers 401 and says what to run.
    for (method, path) in [
        ("GET", "/ui/"),
        ("GET", "/ui/ui.js"),
        ("GET", "/ui/api/view"),
        ("POST", "/ui/api/cancel"),
    ] {
        let a = curl(
            &env,
            method,
            &format!("{base}{path}"),
            &[&origin],
            Some(&cancel_body)
                .filter(|_| method == "POST")
                .map(|s| s.as_str()),
        );
        assert_eq!(a.code, 401, "{method} {path}: {}", a.body);
        assert!(a.body.contains("waitpoint ui"), "{}", a.body);
    }

    // `waitpoint ui` keeps only the code's hash, privately; the code works once.
    let url = login_url(&env);
    let code = url.rsplit_once("code=").unwrap().1.to_owned();
    let file = env.home.join("ui-login.json");
    let stored = std::fs::read_to_string(&file).unwrap();
    assert!(!stored.contains(&code), "{stored}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let first = curl(&env, "GET", &url, &[], None);
    let set = first.header("set-cookie").unwrap().to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui/s/"] {
        assert!(set.contains(attribute), "{set}");
    }
    let me = login_from(&env, &first);
    let (cookie, page_url) = (me.cookie.as_str(), me.page.as_str());
    assert!(!file.exists(), "the used code is gone");
    let again = curl(&env, "GET", &url, &[], None);
    assert_eq!(again.code, 401, "a code works once: {}", again.body);
    // The cookie opens its own place only: not the page's old address, not another place.
    for elsewhere in [
        format!("{base}/ui/"),
        format!("{base}/ui/api/view"),
        format!("{base}/ui/s/0123456789abcdef0123456789abcdef/api/view"),
    ] {
        let a = curl(&env, "GET", &elsewhere, &[cookie], None);
        assert_eq!(a.code, 401, "{elsewhere}: {}", a.body);
    }

    // Logged in: the page with its headers, the view ETag'd.
    let page = curl(&env, "GET", page_url, &[cookie], None);
    assert_eq!(page.code, 200, "{}", page.body);
    assert_eq!(
        page.header("content-security-policy"),
        Some(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
        )
    );
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    let view_url = format!("{page_url}api/view");
    let view = curl(&env, "GET", &view_url, &[cookie], None);
    assert_eq!(view.code, 200, "{}", view.body);
    assert_eq!(view.header("cache-control"), Some("no-store"));
    assert_eq!(view.header("x-content-type-options"), Some("nosniff"));
    let etag = view.header("etag").expect("an ETag").to_owned();
    let v: Value = serde_json::from_str(&view.body).unwrap();
    let csrf = v["csrf"].as_str().unwrap().to_owned();
    let secret_hash = state_file_hash(&env, &id);
    for never in [secret.as_str(), secret_hash.as_str(), TOKEN, &me.value] {
        assert!(
            !view.body.contains(never),
            "the view holds a secret: {never}"
        );
        assert!(!page.body.contains(never));
    }
    assert!(view.body.contains("\"guarded\""), "{}", view.body);
    let unchanged = curl(
        &env,
        "GET",
        &view_url,
        &[cookie, &format!("If-None-Match: {etag}")],
        None,
    );
    assert_eq!(unchanged.code, 304, "{}", unchanged.body);
    // Another site's page cannot read it either (a fetch from it carries its Origin).
    let foreign = curl(
        &env,
        "GET",
        &view_url,
        &[cookie, "Origin: http://evil.example"],
        None,
    );
    assert_eq!(foreign.code, 403, "{}", foreign.body);

    // A cancel needs the page's Origin and the login's CSRF token.
    let cancel = |headers: &[&str]| {
        let mut all = vec![cookie, "Content-Type: application/json"];
        all.extend_from_slice(headers);
        curl(
            &env,
            "POST",
            &format!("{page_url}api/cancel"),
            &all,
            Some(&cancel_body),
        )
    };
    let with_csrf = format!("X-CSRF-Token: {csrf}");
    for (what, headers) in [
        ("no CSRF token", vec![origin.as_str()]),
        (
            "a wrong CSRF token",
            vec![origin.as_str(), "X-CSRF-Token: nope"],
        ),
        (
            "a foreign Origin",
            vec!["Origin: http://evil.example", with_csrf.as_str()],
        ),
        ("no Origin", vec![with_csrf.as_str()]),
    ] {
        let a = cancel(&headers);
        assert_eq!(a.code, 403, "{what}: {}", a.body);
        assert_eq!(state(&env, &id)["status"], "armed", "{what}");
    }
    let done = cancel(&[&origin, &with_csrf]);
    assert_eq!(done.code, 200, "{}", done.body);
    assert_eq!(state(&env, &id)["status"], "cancelled");
    assert!(done.body.contains("keeps running"), "{}", done.body);

    // The operator token logs in too; a wrong one does not.
    let login = format!("{base}/ui/login");
    let wrong = curl(&env, "POST", &login, &[], Some("token=nope"));
    assert_eq!(wrong.code, 401, "{}", wrong.body);
    let right = curl(&env, "POST", &login, &[], Some(&format!("token={TOKEN}")));
    let by_token = login_from(&env, &right);
    let other = log_in(&env);
    for second in [&by_token, &other] {
        let page = curl(&env, "GET", &second.page, &[&second.cookie], None);
        assert_eq!(page.code, 200, "a second login works beside the first");
    }

    // Logging out is a change too: only from the page; then that cookie opens nothing, and the
    // browser is told to drop it. The other login is untouched.
    let logout = |headers: &[&str]| {
        let mut all = vec![cookie];
        all.extend_from_slice(headers);
        curl(&env, "POST", &format!("{page_url}logout"), &all, Some(""))
    };
    assert_eq!(logout(&[&origin]).code, 403, "without the CSRF token");
    assert_eq!(
        logout(&["Origin: http://evil.example", &with_csrf]).code,
        403
    );
    let view_with = |l: &Login| {
        curl(
            &env,
            "GET",
            &format!("{}api/view", l.page),
            &[&l.cookie],
            None,
        )
        .code
    };
    assert_eq!(view_with(&me), 200, "a refused logout logs nobody out");
    let out = logout(&[&origin, &with_csrf]);
    assert_eq!(out.code, 200, "{}", out.body);
    let cleared = out.header("set-cookie").unwrap();
    assert!(
        cleared.contains("Max-Age=0") && cleared.contains(&format!("Path={}", &set_path(&set))),
        "{cleared}"
    );
    assert_eq!(view_with(&me), 401, "a logged-out cookie opens nothing");
    assert_eq!(view_with(&other), 200, "the other login stays");
}

/// The `Path` a `Set-Cookie` names.
fn set_path(set: &str) -> String {
    set.split(';')
        .find_map(|attr| attr.trim().strip_prefix("Path="))
        .expect("a Path")
        .to_owned()
}

/// The secret's hash as the waitpoint's file keeps it.
fn state_file_hash(env: &Env, id: &str) -> String {
    let text =
        std::fs::read_to_string(env.home.join(format!("waitpoints/{id}/waitpoint.json"))).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["secret_sha256"].as_str().unwrap().to_owned()
}

#[test]
fn waitpoint_ui_without_a_running_shim_says_how_to_start_one() {
    let env = Env::new();
    let out = env.waitpoint(&["ui"]);
    env.expect_code("waitpoint ui without a daemon", &out, 1);
    let err = stderr_of(&out);
    assert!(err.contains("waitpoint daemon --http"), "{err}");
    assert!(!env.home.join("ui-login.json").exists());
}

/// Every port of 127.0.0.1 is one site to a browser, and cookies are not isolated by port: a
/// page another local user serves there may be sent the operator's cookie. Replayed from that
/// user's programs it opens nothing; from the operator's it still works. (The browser test
/// shows another port is not sent it at all, and cannot replace it.)
#[test]
fn a_login_is_refused_to_another_local_user_holding_its_cookie() {
    let env = Env::new();
    let _d = daemon(&env);
    let base = format!("http://127.0.0.1:{}", env.webhook_port());
    let origin = format!("Origin: {base}");
    let nobody = 65534;
    assert_ne!(
        rustix::process::geteuid().as_raw(),
        nobody,
        "the test needs to run as a user other than nobody"
    );
    let (id, _) = id_secret(&env.arm("guarded", &["--session", "s1"]));
    let cancel_body = json!({ "id": id, "session": "s1" }).to_string();
    let me = log_in(&env);
    let view_url = format!("{}api/view", me.page);
    let view = curl(&env, "GET", &view_url, &[&me.cookie], None);
    assert_eq!(view.code, 200, "{}", view.body);
    let csrf = serde_json::from_str::<Value>(&view.body).unwrap()["csrf"]
        .as_str()
        .unwrap()
        .to_owned();
    let with_csrf = format!("X-CSRF-Token: {csrf}");
    let cancel = |uid| {
        curl_as(
            &env,
            uid,
            "POST",
            &format!("{}api/cancel", me.page),
            &[
                &me.cookie,
                &origin,
                &with_csrf,
                "Content-Type: application/json",
            ],
            Some(&cancel_body),
        )
    };

    // Another user replays everything the operator's browser holds: refused.
    for path in ["", "ui.js", "api/view"] {
        let url = format!("{}{path}", me.page);
        let a = curl_as(&env, Some(nobody), "GET", &url, &[&me.cookie], None);
        assert_eq!(a.code, 401, "GET {path} as nobody: {}", a.body);
        assert!(!a.body.contains("guarded"), "{}", a.body);
    }
    let a = cancel(Some(nobody));
    assert_eq!(a.code, 401, "a cancel as nobody: {}", a.body);
    assert_eq!(state(&env, &id)["status"], "armed");
    let a = curl_as(
        &env,
        Some(nobody),
        "POST",
        &format!("{}logout", me.page),
        &[&me.cookie, &origin, &with_csrf],
        Some(""),
    );
    assert_eq!(a.code, 401, "a logout as nobody: {}", a.body);

    // The operator's own programs: the login was ended by none of that.
    let view = curl(&env, "GET", &view_url, &[&me.cookie], None);
    assert_eq!(view.code, 200, "{}", view.body);
    let a = cancel(None);
    assert_eq!(a.code, 200, "{}", a.body);
    assert_eq!(state(&env, &id)["status"], "cancelled");

    // A login nobody redeemed is nobody's alone: its code works for them, its cookie not for
    // the operator.
    let theirs = login_from(
        &env,
        &curl_as(&env, Some(nobody), "GET", &login_url(&env), &[], None),
    );
    let url = format!("{}api/view", theirs.page);
    let a = curl_as(&env, Some(nobody), "GET", &url, &[&theirs.cookie], None);
    assert_eq!(a.code, 200, "{}", a.body);
    let a = curl(&env, "GET", &url, &[&theirs.cookie], None);
    assert_eq!(a.code, 401, "{}", a.body);
}

/// Cookies of our name set by another port's server reach the page beside its own: its login
/// still opens, and none of them ends it.
#[test]
fn another_ports_cookies_of_the_same_name_neither_open_nor_end_a_login() {
    let env = Env::new();
    let _d = daemon(&env);
    let me = log_in(&env);
    let origin = format!("Origin: http://127.0.0.1:{}", env.webhook_port());
    let view_url = format!("{}api/view", me.page);
    let view = |cookie: &str| curl(&env, "GET", &view_url, &[cookie], None);
    let other = log_in(&env);
    for tossed in [
        format!("Cookie: waitpoint_ui=bogus; waitpoint_ui={}", me.value),
        format!("Cookie: waitpoint_ui={}; waitpoint_ui=bogus", me.value),
        // Another live login's cookie is not this place's.
        format!(
            "Cookie: waitpoint_ui={}; waitpoint_ui={}",
            other.value, me.value
        ),
    ] {
        assert_eq!(view(&tossed).code, 200, "{tossed}");
    }
    assert_eq!(view("Cookie: waitpoint_ui=bogus").code, 401);
    assert_eq!(
        view(&format!("Cookie: waitpoint_ui={}", other.value)).code,
        401,
        "another login's cookie opens its own place only"
    );
    // A logout carrying only a bogus cookie (and the page's origin) ends nothing.
    let a = curl(
        &env,
        "POST",
        &format!("{}logout", me.page),
        &["Cookie: waitpoint_ui=bogus", &origin, "X-CSRF-Token: nope"],
        Some(""),
    );
    assert_eq!(a.code, 401, "{}", a.body);
    assert_eq!(view(&me.cookie).code, 200, "the login is whole");
}

/// A daemon with the shim in this process, on a manual clock: what the page's list costs is
/// then a function of what changed, not of when the test ran.
struct InProcess {
    clock: std::sync::Arc<waitpoint::clock::ManualClock>,
    control: waitpoint::daemon::DaemonControl,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcess {
    fn start(env: &Env) -> InProcess {
        use waitpoint::daemon::{Daemon, DaemonConfig};
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let clock = std::sync::Arc::new(waitpoint::clock::ManualClock::new(
            waitpoint::clock::Timestamp::from_millis(now),
        ));
        let home = waitpoint::home::Home::new(&env.home);
        let settings =
            waitpoint::settings::Settings::load(&home.settings_file(), |_| None).unwrap();
        let http = waitpoint::ingress::http::HttpConfig::new("127.0.0.1", 0).unwrap();
        let (daemon, control) = Daemon::new(
            DaemonConfig {
                home,
                settings,
                http: Some(http),
            },
            clock.clone(),
        )
        .unwrap();
        let thread = std::thread::spawn(move || daemon.run().unwrap());
        env.webhook_port();
        InProcess {
            clock,
            control,
            thread: Some(thread),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.control.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How many times the daemon had built the list when it answered `a`.
fn builds(a: &Answer) -> u64 {
    a.header(waitpoint::ingress::http::ui::BUILDS_HEADER)
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("no builds header: {:?}", a.headers))
}

#[test]
fn a_304_builds_nothing_and_the_list_carries_no_signal_a_waitpoints_picture_does() {
    let env = Env::new();
    let daemon = InProcess::start(&env);
    let (id, secret) = id_secret(&env.arm("listed", &["--session", "s1", "--max-signals", "10"]));
    let progress = |message: &str| {
        let args = ["--id", &id, "--secret", &secret, "--status", "progress"];
        let out = env.signal(&[&args[..], &["--message", message]].concat());
        env.ok("signal", &out);
    };
    // The loop tells the list of a change before and after handling it: once the loop is past
    // the barrier, no change of the signal's is still to come.
    let settled = || {
        assert!(
            daemon.control.barrier(std::time::Duration::from_secs(60)),
            "the daemon did not reach the barrier"
        )
    };
    for message in ["older-report-1", "older-report-2", "the-newest-report"] {
        progress(message);
    }
    settled();
    let me = log_in(&env);
    let view_url = format!("{}api/view", me.page);
    let first = curl(&env, "GET", &view_url, &[&me.cookie], None);
    assert_eq!(first.code, 200, "{}", first.body);
    let built = builds(&first);
    let etag = first.header("etag").unwrap().to_owned();
    // The row says what the capsule says (the newest heartbeat); no signal is in the list.
    assert!(first.body.contains("the-newest-report"), "{}", first.body);
    for never in [
        "older-report-1",
        "older-report-2",
        "received_at",
        "\"signals\"",
    ] {
        assert!(
            !first.body.contains(never),
            "{never} in the list: {}",
            first.body
        );
    }
    // Polls with the list's ETag: 304, and nothing is built for them.
    let poll = |tag: &str| {
        curl(
            &env,
            "GET",
            &view_url,
            &[&me.cookie, &format!("If-None-Match: {tag}")],
            None,
        )
    };
    for _ in 0..5 {
        let a = poll(&etag);
        assert_eq!(a.code, 304, "{}", a.body);
        assert_eq!(builds(&a), built, "a 304 built the list again");
    }
    // A signal changes it: the next poll builds it once and sends it.
    progress("later");
    settled();
    let changed = poll(&etag);
    assert_eq!(changed.code, 200, "{}", changed.body);
    assert_eq!(builds(&changed), built + 1);
    assert!(changed.body.contains("later"), "{}", changed.body);
    let etag = changed.header("etag").unwrap().to_owned();
    assert_eq!(builds(&poll(&etag)), built + 1);
    // Relative times age, and another process's `cancel` or `next` tells the loop nothing:
    // a list this old is built again.
    daemon
        .clock
        .advance_ms(waitpoint::daemon::UI_LIST_MAX_AGE_MS);
    assert_eq!(builds(&poll(&etag)), built + 2);

    // A waitpoint's picture, asked for by the page when it is opened: its signals.
    let picture = curl(
        &env,
        "GET",
        &format!("{}api/waitpoint?id={id}", me.page),
        &[&me.cookie],
        None,
    );
    assert_eq!(picture.code, 200, "{}", picture.body);
    let p: Value = serde_json::from_str(&picture.body).unwrap();
    let messages: Vec<&str> = p["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            "older-report-1",
            "older-report-2",
            "the-newest-report",
            "later"
        ]
    );
    assert_eq!(p["signals_not_shown"], 0);
    assert!(!picture.body.contains(&state_file_hash(&env, &id)));
    for (query, code) in [
        ("id=wp_000000000000", 404),
        ("id=../../etc", 400),
        ("", 400),
    ] {
        let url = format!("{}api/waitpoint?{query}", me.page);
        let a = curl(&env, "GET", &url, &[&me.cookie], None);
        assert_eq!(a.code, code, "{query}: {}", a.body);
    }
    let url = format!("{}api/waitpoint?id={id}", me.page);
    assert_eq!(curl(&env, "GET", &url, &[], None).code, 401);
}

#[test]
fn the_list_is_bounded_and_says_how_many_it_leaves_out() {
    use waitpoint::daemon::{UI_MAX_ROWS_PER_SESSION, UI_MAX_ROWS_SHOWN, UI_MAX_SESSIONS_SHOWN};
    let env = Env::new();
    let _d = daemon(&env);
    // By name: one session with a row too many; full ones until the rows are all shown; one
    // whose rows find none left; and one-row sessions until there is one session too many.
    let full = UI_MAX_ROWS_SHOWN / UI_MAX_ROWS_PER_SESSION - 1;
    let singles = UI_MAX_SESSIONS_SHOWN - (1 + full + 1) + 1;
    let mut plan = vec![("aaa-big".to_owned(), UI_MAX_ROWS_PER_SESSION + 1)];
    plan.extend((1..=full).map(|i| (format!("aab-{i}"), UI_MAX_ROWS_PER_SESSION)));
    plan.push(("aac-over".to_owned(), 2));
    plan.extend((1..=singles).map(|i| (format!("s-{i:04}"), 1)));
    let script: String = plan
        .iter()
        .map(|(session, n)| {
            format!(
                "i=0; while [ $i -lt {n} ]; do waitpoint create --label w-$i --intent i \
--session {session} >/dev/null; i=$((i+1)); done; "
            )
        })
        .collect();
    env.ok("arm them", &env.sh(&format!("set -e; {script}")));
    let me = log_in(&env);
    let v = view(&env, &me);
    let sessions = v["view"]["sessions"].as_array().unwrap();
    let shown = |s: &Value| s["check"]["waiting"].as_array().unwrap().len();
    let named = |name: &str| {
        sessions
            .iter()
            .find(|s| s["line"]["session"] == name)
            .unwrap_or_else(|| panic!("{name} not in the list"))
    };
    assert_eq!(sessions.len(), UI_MAX_SESSIONS_SHOWN);
    assert_eq!(
        v["view"]["sessions_not_shown"],
        1,
        "{} is left out",
        plan.last().unwrap().0
    );
    let big = named("aaa-big");
    assert_eq!(shown(big), UI_MAX_ROWS_PER_SESSION);
    assert_eq!(big["not_shown"], 1);
    assert_eq!(
        big["line"]["armed"],
        UI_MAX_ROWS_PER_SESSION + 1,
        "the line counts them all"
    );
    let over = named("aac-over");
    assert_eq!((shown(over), &over["not_shown"]), (0, &json!(2)));
    assert_eq!(over["line"]["armed"], 2);
    assert_eq!(sessions.iter().map(shown).sum::<usize>(), UI_MAX_ROWS_SHOWN);
    // The one-row sessions shown are past the budget too.
    assert_eq!(v["view"]["waitpoints_not_shown"], 1 + 2 + (singles - 1));
}

#[test]
fn a_deleted_session_leaves_the_page_until_it_is_used_again() {
    let env = Env::new();
    let daemon = InProcess::start(&env);
    env.arm("a", &["--session", "alice"]);
    env.arm("b", &["--session", "bob"]);
    let me = log_in(&env);
    let listed = || -> Vec<String> {
        view(&env, &me)["view"]["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["line"]["session"].as_str().unwrap().to_owned())
            .collect()
    };
    env.wait_until("both sessions on the page", || listed() == ["alice", "bob"]);
    env.ok("delete", &env.waitpoint(&["session", "delete", "alice"]));
    // A delete run by another process tells the loop nothing: the list is built again once
    // it is as old as a list may be.
    daemon
        .clock
        .advance_ms(waitpoint::daemon::UI_LIST_MAX_AGE_MS);
    assert_eq!(listed(), ["bob"]);
    env.arm("again", &["--session", "alice"]);
    env.wait_until("the session back once used again", || {
        listed() == ["alice", "bob"]
    });
}

/// The page's list (`api/view`), as the page asks for it.
fn view(env: &Env, me: &Login) -> Value {
    let view = curl(
        env,
        "GET",
        &format!("{}api/view", me.page),
        &[&me.cookie],
        None,
    );
    assert_eq!(view.code, 200, "{}", view.body);
    serde_json::from_str(&view.body).unwrap()
}
