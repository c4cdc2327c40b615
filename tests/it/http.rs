//! The loopback HTTP shim and `cortex-signal`'s HTTP path: every status code from curl and from a
//! plain Rust client, the miss budget on the daemon's clock, idempotency keys, the spool
//! fallback, the printed curl line, and the hardening (huge declared lengths, idle connections,
//! Host and Origin checks, loopback-only binds).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use waitpoint::clock::{Clock, ManualClock, SystemClock};
use waitpoint::daemon::{Daemon, DaemonConfig};
use waitpoint::home::Home;
use waitpoint::ingress::http::{HttpConfig, MISS_BUDGET, MISS_WINDOW_MS};
use waitpoint::settings::Settings;

use crate::helpers::*;

const UNKNOWN: &str = "wp_000000000000";
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A port nothing listens on (bound once and released; the kernel does not hand it out again
/// straight away).
/// Sends `request` as is and reads the answer to its end: status code and body.
pub(crate) fn raw(port: u16, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the shim");
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    // The shim may answer before reading all of a body it refuses; that is not our failure.
    let _ = s.write_all(request);
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("an answer");
    split_answer(&answer)
}

pub(crate) fn split_answer(answer: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, body.to_owned())
}

pub(crate) fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
Content-Length: {}\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

pub(crate) fn get(port: u16, path: &str) -> (u16, String) {
    raw(
        port,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Client {
    Curl,
    Rust,
}

impl Client {
    /// POSTs a signal body, with an `Idempotency-Key` when given.
    pub(crate) fn post(self, port: u16, key: Option<&str>, body: &str) -> (u16, Value) {
        let key_header = key.map(|k| format!("Idempotency-Key: {k}"));
        match self {
            Client::Rust => {
                let headers: Vec<&str> = key_header.iter().map(String::as_str).collect();
                let (code, body) = raw(
                    port,
                    &request(port, "POST", "/webhook/signal", &headers, body),
                );
                (code, parse_json(&body))
            }
            Client::Curl => {
                let mut cmd = Command::new("curl");
                cmd.args(["-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"])
                    .args(["-XPOST", "-H", "content-type: application/json"])
                    .args(["--data-binary", "@-"]);
                if let Some(h) = &key_header {
                    cmd.args(["-H", h]);
                }
                cmd.arg(format!("http://127.0.0.1:{port}/webhook/signal"));
                let (code, body) = run_curl(cmd, body);
                (code, parse_json(&body))
            }
        }
    }
}

/// Runs a curl command (`-w '\n%{http_code}'`) with `stdin`, returning code and body.
pub(crate) fn run_curl(mut cmd: Command, stdin: &str) -> (u16, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("curl must be installed (scripts/test-deps installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or_else(|| {
        panic!(
            "curl printed no status: {text:?} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code.trim().parse().unwrap(), body.to_owned())
}

pub(crate) fn progress(id: &str, secret: &str) -> String {
    body(id, secret, r#","status":"progress""#)
}

/// `field` of a line of `/proc/<pid>/status`, as a number (kB for memory, a count for Threads).
pub(crate) fn proc_status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

pub(crate) fn http_daemon(env: &Env) -> (DaemonGuard, u16) {
    let d = env.daemon_with(&["--http", "--port", "0"], &[]);
    let port = env.webhook_port();
    (d, port)
}

#[test]
fn every_status_code_from_curl_and_from_rust() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let barrier = env.arm("b", &["--member", "a", "--member", "b"]);
    let monitor = env.arm("m", &["--max-signals", "10"]);
    let (bid, bsec) = id_secret(&barrier);
    let (mid, msec) = id_secret(&monitor);
    let mut misses = 0;
    for client in [Client::Curl, Client::Rust] {
        let expect = |what: &str, (code, body): (u16, Value), want: u16| {
            assert_eq!(code, want, "{client:?}, {what}: {body}");
            body
        };
        let key = format!("{client:?}-1");
        let b = expect(
            "accepted",
            client.post(port, Some(&key), &progress(&mid, &msec)),
            202,
        );
        assert_eq!(b["result"], "accepted");
        let b = expect(
            "duplicate",
            client.post(port, Some(&key), &progress(&mid, &msec)),
            202,
        );
        assert_eq!(b["result"], "duplicate");

        let (oid, osec) = id_secret(&env.arm("one", &[]));
        expect(
            "resolve",
            client.post(port, None, &body(&oid, &osec, "")),
            202,
        );
        let b = expect(
            "resolved",
            client.post(port, None, &body(&oid, &osec, "")),
            410,
        );
        assert_eq!(b["status"], "resolved");

        let b = expect(
            "wrong secret",
            client.post(port, None, &body(&mid, "not-the-secret", "")),
            401,
        );
        assert_eq!(b["error"], "wrong secret");
        let b = expect(
            "unknown id",
            client.post(port, None, &body(UNKNOWN, &msec, "")),
            404,
        );
        assert_eq!(b["error"], "unknown waitpoint id");
        misses += 2;

        for extra in ["", r#","member":"z""#] {
            let b = expect(
                "member",
                client.post(port, None, &body(&bid, &bsec, extra)),
                422,
            );
            assert_eq!(b["expected"], json!(["a", "b"]), "{b}");
        }
        let huge = body(
            &mid,
            &msec,
            &format!(r#","message":"{}""#, "x".repeat(70_000)),
        );
        let b = expect("too large", client.post(port, None, &huge), 413);
        assert!(b["error"].as_str().unwrap().contains("65536"), "{b}");
    }
    // Each client's key was counted once.
    // A 202 waits for the journal line; the state file follows it.
    env.wait_until("the count", || env.state(&mid)["counters"]["signals"] == 2);

    // Spend the rest of the miss budget; then even a good signal gets 429, from either client.
    for _ in misses..MISS_BUDGET {
        assert_eq!(
            Client::Rust.post(port, None, &body(UNKNOWN, "x", "")).0,
            404
        );
    }
    for client in [Client::Curl, Client::Rust] {
        let (code, b) = client.post(port, None, &progress(&mid, &msec));
        assert_eq!(code, 429, "{client:?}: {b}");
    }
    // A 202 waits for the journal line; the state file follows it.
    env.wait_until("the count", || env.state(&mid)["counters"]["signals"] == 2);
}

#[test]
fn the_miss_budget_answers_429_until_a_minute_has_passed_on_the_daemon_clock() {
    let env = Env::new();
    let home = Home::new(&env.home);
    let settings = Settings::load(&home.settings_file(), |_| None).unwrap();
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let (daemon, control) = Daemon::new(
        DaemonConfig {
            home,
            settings,
            http: Some(HttpConfig::new("127.0.0.1", 0).unwrap()),
        },
        clock.clone(),
    )
    .unwrap();
    let runner = std::thread::spawn(move || daemon.run());
    let port = env.webhook_port();
    let (mid, msec) = id_secret(&env.arm("m", &[]));
    let good = progress(&mid, &msec);
    for i in 0..MISS_BUDGET {
        let (code, b) = if i % 2 == 0 {
            Client::Rust.post(port, None, &body(&mid, "wrong", ""))
        } else {
            Client::Rust.post(port, None, &body(UNKNOWN, "wrong", ""))
        };
        assert_eq!(code, if i % 2 == 0 { 401 } else { 404 }, "miss {i}: {b}");
    }
    assert_eq!(Client::Rust.post(port, None, &good).0, 429);
    assert_eq!(
        Client::Rust.post(port, None, &body(UNKNOWN, "x", "")).0,
        429
    );
    clock.advance_ms(MISS_WINDOW_MS - 1);
    assert_eq!(Client::Rust.post(port, None, &good).0, 429);
    clock.advance_ms(1);
    let (code, b) = Client::Rust.post(port, None, &good);
    assert_eq!(code, 202, "{b}");
    // A 202 waits for the journal line; the state file follows it.
    env.wait_until("the count", || env.state(&mid)["counters"]["signals"] == 1);

    // A clean shutdown takes the published address away.
    control.shutdown();
    runner.join().unwrap().unwrap();
    assert!(!env.home.join("webhook.json").exists(), "{}", env.tree());
}

/// A signal POSTed with curl as the user `uid` (root runs the tests; `setpriv` drops to it).
pub(crate) fn post_as(uid: u32, port: u16, body: &str) -> (u16, String) {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        &format!("--reuid={uid}"),
        &format!("--regid={uid}"),
        "--clear-groups",
        "curl",
        "-sS",
        "--max-time",
        "30",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-XPOST",
        "-H",
        "content-type: application/json",
        "--data-binary",
        "@-",
    ])
    .arg(format!("http://127.0.0.1:{port}/webhook/signal"));
    run_curl(cmd, body)
}

#[test]
fn another_users_misses_never_cost_a_sender_whose_requests_authenticate() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let (id, secret) = id_secret(&env.arm("m", &["--max-signals", "10"]));
    let nobody = 65534;
    let me = rustix::process::geteuid().as_raw();
    assert_ne!(
        me, nobody,
        "the test needs to run as a user other than nobody"
    );
    for i in 0..MISS_BUDGET {
        let (code, b) = post_as(nobody, port, &body(&id, "wrong", ""));
        assert_eq!(code, 401, "miss {i}: {b}");
    }
    // Nobody's budget is spent: even its right secret waits out the minute, and the answer
    // says how long (Retry-After, at most the window).
    let (code, b) = post_as(nobody, port, &progress(&id, &secret));
    assert_eq!(code, 429, "{b}");
    let head = Command::new("setpriv")
        .args([
            &format!("--reuid={nobody}"),
            &format!("--regid={nobody}"),
            "--clear-groups",
        ])
        .args(["curl", "-sS", "-D", "-", "-o", "/dev/null", "-XPOST"])
        .args(["-H", "content-type: application/json", "--data-binary"])
        .arg(progress(&id, &secret))
        .arg(format!("http://127.0.0.1:{port}/webhook/signal"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).to_ascii_lowercase();
    let after: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after:"))
        .unwrap_or_else(|| panic!("no Retry-After: {head}"))
        .trim()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&after), "{head}");
    // This user's signals, and its own misses, are not held up by nobody's.
    let (code, b) = post_as(me, port, &progress(&id, &secret));
    assert_eq!(code, 202, "{b}");
    let (code, b) = post_as(me, port, &body(&id, "wrong", ""));
    assert_eq!(code, 401, "{b}");
    assert_eq!(env.state(&id)["counters"]["signals"], 1);
}

#[test]
fn a_retried_post_with_the_same_idempotency_key_is_counted_once() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let (mid, msec) = id_secret(&env.arm("m", &["--max-signals", "5"]));
    let ok = body(&mid, &msec, r#","status":"ok","message":"round 1""#);
    let (code, first) = Client::Rust.post(port, Some("job-7-attempt"), &ok);
    assert_eq!((code, first["result"].as_str()), (202, Some("accepted")));
    assert_eq!(first["woke"], true);
    let (code, again) = Client::Curl.post(port, Some("job-7-attempt"), &ok);
    assert_eq!((code, again["result"].as_str()), (202, Some("duplicate")));
    let state = env.state(&mid);
    assert_eq!(
        (
            state["counters"]["signals"].as_u64(),
            state["counters"]["wakes"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(env.inbox("default", "new").len(), 1);

    // Another key is another signal; no key at all makes every request its own.
    assert_eq!(
        Client::Rust
            .post(port, Some("job-8"), &progress(&mid, &msec))
            .0,
        202
    );
    for _ in 0..2 {
        assert_eq!(Client::Rust.post(port, None, &progress(&mid, &msec)).0, 202);
    }
    // A 202 waits for the journal line; the state file follows it.
    env.wait_until("the count", || env.state(&mid)["counters"]["signals"] == 4);
    let shown: Value =
        serde_json::from_str(&env.ok("show", &env.waitpoint(&["show", &mid, "--json"]))).unwrap();
    assert_eq!(shown["signals"][0]["source"], "http:job-7-attempt");
}

#[test]
fn cortex_signal_posts_to_the_shim_the_daemon_published() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let (oid, osec) = id_secret(&env.arm("one", &[]));
    let signal = |args: &[&str]| {
        let mut all = vec!["--id", &oid, "--secret", &osec];
        all.extend_from_slice(args);
        env.signal(&all)
    };
    let out = signal(&["--exit-code", "0", "--no-spool"]);
    env.ok("over http", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("accepted (transport: http"), "{stderr}");
    assert!(stderr.contains("webhook.json"), "{stderr}");
    // Accepted means durable in the journal; the state file follows it.
    env.wait_until("the state written", || {
        env.state(&oid)["status"] == "resolved"
    });
    let state = env.state(&oid);
    assert_eq!(
        (state["status"].as_str(), state["outcome"].as_str()),
        (Some("resolved"), Some("ok"))
    );
    let shown: Value =
        serde_json::from_str(&env.ok("show", &env.waitpoint(&["show", &oid, "--json"]))).unwrap();
    assert!(
        shown["signals"][0]["source"]
            .as_str()
            .unwrap()
            .starts_with("http:cs-"),
        "{shown}"
    );

    let out = signal(&["--exit-code", "0"]);
    env.ok("already resolved", &out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already resolved"));

    // Refusals: judged from the home on this machine, and given by the route to a client
    // that names it with --url; the same words either way.
    let url = format!("http://127.0.0.1:{port}/webhook/signal");
    for via in [None, Some(url.as_str())] {
        let mut args = vec![
            "--id",
            oid.as_str(),
            "--secret",
            "wrong",
            "--exit-code",
            "0",
        ];
        args.extend(via.map(|u| ["--url", u]).into_iter().flatten());
        let out = env.signal(&args);
        env.expect_code("wrong secret", &out, 1);
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(said.contains("wrong secret"), "{said}");
        assert_eq!(said.contains("HTTP 401"), via.is_some(), "{said}");
    }

    let (bid, bsec) = id_secret(&env.arm("b", &["--member", "a", "--member", "b"]));
    for via in [None, Some(url.as_str())] {
        let mut args = vec!["--id", bid.as_str(), "--secret", bsec.as_str()];
        args.extend(via.map(|u| ["--url", u]).into_iter().flatten());
        let out = env.signal(&args);
        env.expect_code("no member", &out, 1);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("a, b"), "{stderr}");
        assert_eq!(stderr.contains("HTTP 422"), via.is_some(), "{stderr}");
    }
    // No refused signal was spooled; the local miss left a record of its id alone, which the
    // running daemon collects (one may be gone by the time it is read).
    for name in env.spooled() {
        let left = std::fs::read_to_string(env.drop_zone().join(&name)).unwrap_or_default();
        assert!(
            left.is_empty() || left.starts_with(r#"{"refused_by_sender":"#),
            "{name}: {left}"
        );
    }
}

#[test]
fn cortex_signal_falls_back_to_the_spool_when_the_daemon_is_gone_and_it_is_collected_later() {
    let env = Env::new();
    let (d, _port) = http_daemon(&env);
    let (oid, osec) = id_secret(&env.arm("one", &[]));
    d.kill();
    let address = env.home.join("webhook.json");
    assert!(
        address.exists(),
        "a killed daemon leaves its address behind"
    );

    let out = env.signal(&["--id", &oid, "--secret", &osec, "--exit-code", "0"]);
    env.ok("fallback", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("transport: spool") && stderr.contains("stale"),
        "{stderr}"
    );
    assert_eq!(env.spooled().len(), 1);

    let _d = env.daemon();
    env.ok(
        "collected",
        &env.waitpoint(&["wait", &oid, "--timeout", "120"]),
    );
    assert!(
        !address.exists(),
        "a daemon without --http removes a stale address"
    );
    assert!(env.spooled().is_empty());
}

#[test]
fn cortex_signal_falls_back_when_nothing_listens_at_the_url_or_port() {
    let env = Env::new();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/webhook/signal");
    let out = env.signal(&["--id", UNKNOWN, "--secret", "s", "--url", &url]);
    env.ok("--url", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unreachable") && stderr.contains("transport: spool"),
        "{stderr}"
    );
    let out = env
        .command(CORTEX_SIGNAL)
        .args(["--id", UNKNOWN, "--secret", "s"])
        .env("WEBHOOK_PORT", port.to_string())
        .output()
        .unwrap();
    env.ok("WEBHOOK_PORT", &out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no HTTP shim is published"));
    assert_eq!(env.spooled().len(), 2);
}

#[test]
fn webhook_port_alone_never_gets_the_secret_and_the_signal_is_spooled() {
    let env = Env::new();
    let _d = env.daemon();
    let (id, secret) = id_secret(&env.arm("ours", &[]));
    // Someone else's program listens on the port WEBHOOK_PORT names; ours runs without a shim.
    let stranger = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = stranger.local_addr().unwrap().port();
    let out = env
        .command(CORTEX_SIGNAL)
        .args(["--id", &id, "--secret", &secret, "--exit-code", "0"])
        .env("WEBHOOK_PORT", port.to_string())
        .output()
        .unwrap();
    env.ok("WEBHOOK_PORT set, nothing published", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("transport: spool") && stderr.contains("no HTTP shim is published"),
        "{stderr}"
    );
    // Finished, and nothing ever connected: a connection would wait in the backlog.
    stranger.set_nonblocking(true).unwrap();
    match stranger.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("cortex-signal connected to a stranger's listener: {other:?}"),
    }
    env.ok(
        "collected",
        &env.waitpoint(&["wait", &id, "--timeout", "120"]),
    );
    // Another home's shim, named explicitly, answers for itself: a refusal.
    let other = Env::new();
    let (_other_daemon, other_port) = http_daemon(&other);
    let url = format!("http://127.0.0.1:{other_port}/webhook/signal");
    let out = env.signal(&["--id", &id, "--secret", &secret, "--url", &url]);
    env.expect_code("explicit url", &out, 1);
}

#[test]
fn no_spool_with_nothing_listening_exits_one_and_writes_nothing() {
    let env = Env::new();
    let port = free_port();
    let out = env
        .command(CORTEX_SIGNAL)
        .args(["--id", UNKNOWN, "--secret", "s", "--no-spool"])
        .env("WEBHOOK_PORT", port.to_string())
        .output()
        .unwrap();
    env.expect_code("WEBHOOK_PORT", &out, 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-spool"));
    let url = format!("http://127.0.0.1:{port}/webhook/signal");
    let out = env.signal(&[
        "--id",
        UNKNOWN,
        "--secret",
        "s",
        "--url",
        &url,
        "--no-spool",
    ]);
    env.expect_code("--url", &out, 1);
    assert!(env.spooled().is_empty(), "{}", env.tree());
}

#[test]
fn a_huge_declared_content_length_is_413_without_the_daemon_allocating_it() {
    let env = Env::new();
    let (d, port) = http_daemon(&env);
    let pid = d.pid();
    // Nine clients at once, each declaring `claim(i)` bytes and sending a first 64 KB slice.
    let flood = |claim: fn(usize) -> &'static str| -> Vec<(u16, String)> {
        let clients: Vec<_> = (0..9)
            .map(|i| {
                let head = format!(
                    "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \
                     {}\r\n\r\n",
                    claim(i)
                );
                std::thread::spawn(move || {
                    let mut req = head.into_bytes();
                    req.extend(std::iter::repeat_n(b'x', 64 * 1024));
                    raw(port, &req)
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    };
    // A warm-up with small claims, so every worker has made its allocator arena before the
    // baseline is taken.
    for (code, body) in flood(|_| "10") {
        assert_eq!(code, 400, "{body}");
    }
    let (peak_rss, peak_vm) = (proc_status(pid, "VmHWM"), proc_status(pid, "VmPeak"));
    let claims = |i: usize| {
        [
            "1000000000",
            "1000000000000000000",
            "99999999999999999999999",
        ][i % 3]
    };
    for (i, (code, body)) in flood(claims).into_iter().enumerate() {
        // A length too long for 64 bits is no length at all: hyper answers that framing 400
        // (RFC 9112, 6.3) before the routes see it. Either way nothing is read or allocated.
        let want = if claims(i).len() > 19 { 400 } else { 413 };
        assert_eq!(code, want, "{}: {body}", claims(i));
    }
    assert_eq!(get(port, "/healthz").0, 200);
    let (rss, vm) = (proc_status(pid, "VmHWM"), proc_status(pid, "VmPeak"));
    // Declaring a gigabyte must cost nothing like it: neither resident nor reserved memory.
    assert!(
        rss < peak_rss + 16 * 1024,
        "peak RSS went from {peak_rss} kB to {rss} kB"
    );
    assert!(
        vm < peak_vm + 512 * 1024,
        "peak virtual memory went from {peak_vm} kB to {vm} kB"
    );
}

#[test]
fn binding_the_shim_anywhere_but_loopback_is_refused() {
    let env = Env::new();
    for addr in ["0.0.0.0", "192.0.2.1", "::", "example.com"] {
        let out = env.waitpoint(&["daemon", "--http", "--bind", addr]);
        env.expect_code(addr, &out, 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("loopback"), "{addr}: {stderr}");
    }
    let out = env.waitpoint(&["daemon", "--port", "4000"]);
    env.expect_code("--port without --http", &out, 2);
    assert!(!env.home.join("webhook.json").exists());
}

#[test]
fn the_curl_line_of_how_to_signal_works_as_printed() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let create = |extra: &[&str]| -> Value {
        let out = env
            .command(WAITPOINT)
            .args(["create", "--json", "--label", "c", "--intent", "i"])
            .args(extra)
            .env("WEBHOOK_PORT", port.to_string())
            .output()
            .unwrap();
        serde_json::from_str(&env.ok("create", &out)).unwrap()
    };
    for (before, outcome) in [("true", "ok"), ("false", "fail")] {
        let reply = create(&[]);
        let curl = line(&reply, "curl");
        assert!(curl.contains(&format!("127.0.0.1:{port}/")), "{curl}");
        let out = env.sh(&format!("{before}; {curl}"));
        let printed = env.ok("curl line", &out);
        assert!(printed.contains("accepted"), "{printed}");
        let id = id_secret(&reply).0;
        env.wait_until("the state written", || {
            env.state(&id)["status"] == "resolved"
        });
        let state = env.state(&id);
        assert_eq!(
            (state["status"].as_str(), state["outcome"].as_str()),
            (Some("resolved"), Some(outcome))
        );
    }
    let barrier = create(&["--member", "a"]);
    let curl = line(&barrier, "curl").replace("MEMBER", "a");
    env.ok("member curl line", &env.sh(&format!("true; {curl}")));
    env.wait_until("the barrier resolved", || {
        env.state(&id_secret(&barrier).0)["status"] == "resolved"
    });
}

#[test]
fn host_origin_and_unserved_routes_are_refused_without_spending_the_budget() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let (mid, msec) = id_secret(&env.arm("m", &[]));
    let miss = body(UNKNOWN, "x", "");
    let post_with = |header: &str| {
        raw(
            port,
            &request(port, "POST", "/webhook/signal", &[header], &miss),
        )
        .0
    };
    for _ in 0..MISS_BUDGET + 5 {
        let rebound = format!(
            "POST /webhook/signal HTTP/1.1\r\nHost: evil.example:{port}\r\nConnection: close\r\n\
Content-Length: {}\r\n\r\n{miss}",
            miss.len()
        );
        assert_eq!(raw(port, rebound.as_bytes()).0, 403);
        assert_eq!(post_with("Origin: http://127.0.0.1"), 403);
    }
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"])
        .args(["-H", "Origin: http://evil.example", "--data-binary", "@-"])
        .arg(format!("http://127.0.0.1:{port}/webhook/signal"));
    assert_eq!(run_curl(cmd, &miss).0, 403);

    assert_eq!(get(port, "/webhook/signal").0, 405);
    assert_eq!(get(port, "/").0, 404);
    assert_eq!(get(port, "/webhook/signal/../healthz").0, 404);
    assert_eq!(
        raw(port, &request(port, "POST", "/healthz", &[], "")).0,
        405
    );
    let chunked = format!(
        "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n\
{:x}\r\n{miss}\r\n0\r\n\r\n",
        miss.len()
    );
    assert_eq!(raw(port, chunked.as_bytes()).0, 411);
    let no_length = "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(port, no_length.as_bytes()).0, 411);
    assert_eq!(post_with("Idempotency-Key: a b"), 400);
    let (code, b) = raw(
        port,
        &request(port, "POST", "/webhook/signal", &[], "{not json"),
    );
    assert_eq!(code, 400, "{b}");

    // None of that was a miss.
    let (code, b) = Client::Rust.post(port, None, &progress(&mid, &msec));
    assert_eq!(code, 202, "{b}");
}

#[test]
fn settings_turn_the_shim_on_and_sigterm_takes_its_address_away() {
    let env =
        Env::with_settings(r#"{"waitpointSweepMs": 300, "webhook": {"enabled": true, "port": 0}}"#);
    let d = env.daemon();
    let port = env.webhook_port();
    assert_eq!(get(port, "/healthz").0, 200);
    let status = d.terminate();
    assert!(status.success(), "{status:?}");
    assert!(!env.home.join("webhook.json").exists(), "{}", env.tree());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn a_spooled_fallback_after_an_unanswered_post_keeps_the_signals_identity() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let reply = env.arm("t", &["--max-signals", "100"]);
    let (id, secret) = id_secret(&reply);
    // A relay that passes the POST on to the shim and, once the signal is recorded, hangs up
    // without passing the answer back: the daemon committed, the client heard nothing.
    let relay = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_port = relay.local_addr().unwrap().port();
    let state = env.home.join("waitpoints").join(&id).join("waitpoint.json");
    let relay_thread = std::thread::spawn(move || {
        let (mut client, _) = relay.accept().unwrap();
        client.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        let mut request = Vec::new();
        let mut chunk = [0u8; 4096];
        // Head and body: read until the body the head announces is in.
        loop {
            let n = client.read(&mut chunk).unwrap();
            request.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&request).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if body.len() >= len {
                    break;
                }
            }
        }
        let mut shim = TcpStream::connect(("127.0.0.1", port)).unwrap();
        shim.write_all(&request).unwrap();
        let start = std::time::Instant::now();
        while !std::fs::read_to_string(&state)
            .unwrap()
            .contains("\"signals\": 1")
        {
            assert!(
                start.elapsed() < PATIENCE,
                "the shim never recorded the relayed POST"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(client);
    });
    let out = env.signal(&[
        "--id",
        &id,
        "--secret",
        &secret,
        "--status",
        "progress",
        "--url",
        &format!("http://127.0.0.1:{relay_port}/webhook/signal"),
    ]);
    relay_thread.join().unwrap();
    let stderr = env.ok("cortex-signal", &out);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("spooled") && said.contains("same key"),
        "{stderr}{said}"
    );
    env.wait_drained();
    env.wait_trash_emptied();
    let records: Vec<String> = crate::invariants::records_of(&env.home, &id)
        .iter()
        .map(|r| r["source"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(records.len(), 1, "counted twice: {records:?}");
    assert!(records[0].contains("cs-"), "{records:?}");
    assert_eq!(env.state(&id)["counters"]["signals"], 1);
    let show: Value =
        serde_json::from_str(&env.ok("show", &env.waitpoint(&["show", &id, "--json"]))).unwrap();
    assert!(
        show["signals"][0]["source"]
            .as_str()
            .unwrap()
            .starts_with("http:cs-"),
        "{show}"
    );
}
