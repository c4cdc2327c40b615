//! The shim's transport under load and abuse: idle and excess connections, smuggled and
//! dripped heads, keep-alive and pipelining, half-closed clients. What each route means is in
//! `http.rs`.

use crate::helpers::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::http::*;

#[test]
fn five_hundred_idle_connections_leave_healthz_answering_on_the_same_threads() {
    raise_open_file_limit();
    let env = Env::new();
    let (d, port) = http_daemon(&env);
    let pid = d.pid();
    let threads = proc_status(pid, "Threads");
    let (mid, msec) = id_secret(&env.arm("m", &[]));
    let mut idle = Vec::new();
    for i in 0..500 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        if i % 2 == 1 {
            // Half of them stall in the middle of a request head.
            s.write_all(b"POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
                .unwrap();
        }
        idle.push(s);
    }
    let (code, body) = get(port, "/healthz");
    assert_eq!(
        (code, parse_json(&body)["result"].as_str()),
        (200, Some("ok"))
    );
    assert_eq!(Client::Rust.post(port, None, &progress(&mid, &msec)).0, 202);
    assert_eq!(
        proc_status(pid, "Threads"),
        threads,
        "the thread count moved with the connections"
    );
    // They are still open, held without a thread each.
    for s in [&idle[0], &idle[499]] {
        s.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let e = (&*s).read(&mut byte).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    }
}

/// Issue 26 (7): under a descriptor limit of 256, 300 loopback connections (idle, a head half
/// sent, a body half sent) are more than the daemon can hold. The shim caps its connections
/// below the limit, closing the least active to make room, so the engine keeps its descriptors:
/// a valid signal over HTTP (on a fresh connection) and a valid drop-zone file are both applied
/// and woken on, and the daemon is still alive and serving.
#[test]
fn more_connections_than_descriptors_cost_no_signal_and_no_daemon() {
    const LIMIT: u64 = 256;
    const CONNECTIONS: usize = 300;
    raise_open_file_limit();
    let env = Env::new();
    let mut d = env.daemon_with_descriptor_limit(&["--http", "--port", "0"], LIMIT);
    let port = env.webhook_port();
    let (hid, hsec) = id_secret(&env.arm("over-http", &[]));
    let (fid, fsec) = id_secret(&env.arm("from-file", &[]));
    let signal = body(&hid, &hsec, "");
    let mut held = Vec::new();
    for i in 0..CONNECTIONS {
        // A connection the shim closed to make room may refuse a write: it is still held here.
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            continue;
        };
        let _ = match i % 3 {
            0 => Ok(()),
            1 => s.write_all(b"POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"),
            _ => s.write_all(
                format!(
                    "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \
                     {}\r\n\r\n{}",
                    signal.len(),
                    &signal[..signal.len() / 2]
                )
                .as_bytes(),
            ),
        };
        held.push(s);
    }
    let (code, answer) = Client::Rust.post(port, Some("over-the-limit"), &signal);
    assert_eq!(
        code,
        202,
        "{answer}\n--- daemon log\n{}",
        env.daemon_log_tail(30)
    );
    env.drop_file("beside-the-flood", &body(&fid, &fsec, ""));
    for id in [&hid, &fid] {
        let out = env.waitpoint(&["wait", id, "--timeout", "60"]);
        env.ok(&format!("wait {id}"), &out);
    }
    assert!(d.running(), "the daemon died\n{}", env.daemon_log_tail(30));
    assert_eq!(get(port, "/healthz").0, 200);
    assert_eq!(env.state(&hid)["counters"]["signals"], 1);
    assert_eq!(env.state(&fid)["counters"]["signals"], 1);
    crate::invariants::report(
        "9-http-descriptors",
        &[(
            "descriptors: loopback connections (idle, half a head, half a body) beyond a limit of \
             256, then a signal over HTTP and one in the drop zone: applied / daemon deaths",
            format!("{} held: 2 of 2 / 0", held.len()),
        )],
    );
    drop(held);
}

/// The adversary's smuggling and slowloris cases, held on hyper as they were on the hand-written
/// transport: a body framed two ways (Content-Length and chunked) or with two lengths is refused
/// and the connection closed, so a request hidden in it is never read as a second request; a
/// head dripped a byte at a time is cut off at the header deadline however long it keeps
/// dripping.
#[test]
fn smuggled_requests_are_never_served_and_a_dripped_head_is_cut_off() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let (id, secret) = id_secret(&env.arm("t", &["--max-signals", "10"]));
    let signal = progress(&id, &secret);
    let hidden = format!(
        "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{signal}",
        signal.len()
    );
    let chunk = format!("0\r\n\r\n{hidden}");
    let cases = [
        (
            "Content-Length and chunked",
            format!(
                "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\
Transfer-Encoding: chunked\r\n\r\n{chunk}",
                chunk.len()
            ),
            411,
        ),
        (
            "two lengths",
            format!(
                "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 7\r\n\
Content-Length: {}\r\n\r\n0000000{hidden}",
                7 + hidden.len()
            ),
            400,
        ),
    ];
    for (what, bytes, want) in cases {
        let (code, body) = raw(port, bytes.as_bytes());
        assert_eq!(code, want, "{what}: {body}");
        assert_eq!(
            body.matches("HTTP/1.1 ").count(),
            0,
            "{what}: a second answer: {body}"
        );
    }
    assert_eq!(
        env.state(&id)["counters"]["signals"],
        0,
        "a hidden request was served"
    );

    // Slowloris: one byte of a head every 200 ms until the shim hangs up.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let head = hidden.as_bytes();
    let mut sent = 0;
    let start = std::time::Instant::now();
    let closed = loop {
        assert!(
            start.elapsed() < CLIENT_TIMEOUT,
            "still open after {sent} bytes dripped"
        );
        if s.write_all(&head[sent % 40..sent % 40 + 1]).is_err() {
            break true;
        }
        sent += 1;
        let mut byte = [0u8; 64];
        match s.read(&mut byte) {
            Ok(0) => break true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break true,
        }
    };
    assert!(closed);
    assert_eq!(get(port, "/healthz").0, 200);
    assert_eq!(env.state(&id)["counters"]["signals"], 0);
}

/// 500 client sockets here plus 500 in the daemon (which inherits the limit) need more than a
/// common soft limit of 1024 once other tests run alongside.
fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    // `None` is RLIM_INFINITY, above every number.
    let lim = getrlimit(Resource::Nofile);
    if lim.current.unwrap_or(u64::MAX) < lim.maximum.unwrap_or(u64::MAX) {
        let raised = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        // Best effort, as before: the tests run on with the limit they have.
        let _ = setrlimit(Resource::Nofile, raised);
    }
}

#[test]
fn keep_alive_and_pipelined_requests_are_answered_in_order() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let (mid, msec) = id_secret(&env.arm("m", &[]));
    let signal = progress(&mid, &msec);
    let one = |key: &str| {
        format!(
            "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: {key}\r\n\
Content-Length: {}\r\n\r\n{signal}",
            signal.len()
        )
    };
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    // Two in one write, then a third after the first answers came back.
    s.write_all(format!("{}{}", one("p1"), one("p1")).as_bytes())
        .unwrap();
    let mut seen = String::new();
    let mut chunk = [0u8; 4096];
    while seen.matches("HTTP/1.1 ").count() < 2 {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
    }
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    s.read_to_string(&mut seen).unwrap();
    let results: Vec<&str> = ["\"accepted\"", "\"duplicate\"", "\"ok\""]
        .into_iter()
        .filter(|r| seen.contains(r))
        .collect();
    assert_eq!(results.len(), 3, "{seen}");
    assert!(
        seen.find("\"accepted\"") < seen.find("\"duplicate\""),
        "{seen}"
    );
    assert_eq!(env.state(&mid)["counters"]["signals"], 1);
}

#[test]
fn a_client_that_half_closes_after_a_whole_request_is_answered_and_recorded() {
    let env = Env::new();
    let (_d, port) = http_daemon(&env);
    let reply = env.arm("t", &["--max-signals", "100"]);
    let (id, secret) = id_secret(&reply);
    for (n, keep_alive) in [(0, false), (1, true), (2, true)] {
        let key = format!("Idempotency-Key: half-{n}");
        let mut req = request(
            port,
            "POST",
            "/webhook/signal",
            &[&key],
            &progress(&id, &secret),
        );
        if keep_alive {
            // Without `Connection: close` the shim would keep the connection open; the client's
            // half-close must end it after the answer all the same.
            req = String::from_utf8(req)
                .unwrap()
                .replace("Connection: close\r\n", "")
                .into_bytes();
        }
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        s.write_all(&req).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)
            .expect("an answer, then the close");
        let (code, body) = split_answer(&answer);
        assert_eq!(code, 202, "request {n}: {body}");
    }
    // A 202 waits for the journal line, not for the state file written after it.
    env.wait_until("the third state", || {
        env.state(&id)["counters"]["signals"] == 3
    });
    // Half a request and then the half-close: nothing to answer, nothing recorded.
    let whole = request(
        port,
        "POST",
        "/webhook/signal",
        &[],
        &progress(&id, &secret),
    );
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    s.write_all(&whole[..whole.len() - 5]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("a close");
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    assert_eq!(get(port, "/healthz").0, 200);
    assert_eq!(env.state(&id)["counters"]["signals"], 3);
}

/// The shim's workers never wait for the daemon's loop. A commit that cannot finish (another
/// process holds the waitpoint's lock, so the loop blocks in the first signal's batch) keeps
/// twice as many signals as there are workers waiting, and `/healthz`, which needs a worker,
/// still answers. Released, every signal is answered 202 and counted once. Workers that waited
/// for the verdict were all taken by the first four signals, and the route answered nothing
/// until the commit finished.
#[test]
fn signals_waiting_on_a_stalled_commit_leave_the_shim_workers_free() {
    use waitpoint::ingress::http::WORKERS;
    let env = Env::new();
    let (d, port) = http_daemon(&env);
    let (id, secret) = id_secret(&env.arm("held", &["--max-signals", "100"]));
    let held = std::fs::File::open(env.home.join("waitpoints").join(&id)).unwrap();
    held.lock().unwrap();
    let signal = progress(&id, &secret);
    let mut waiting = Vec::new();
    for n in 0..2 * WORKERS {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        s.write_all(
            format!(
                "POST /webhook/signal HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: held-{n}\r\n\
                 Connection: close\r\nContent-Length: {}\r\n\r\n{signal}",
                signal.len()
            )
            .as_bytes(),
        )
        .unwrap();
        waiting.push(s);
    }
    // The loop is in the first signal's commit, waiting for the lock this test holds.
    let daemon = format!(" {} ", d.pid());
    env.wait_until("the daemon's loop to wait for the waitpoint's lock", || {
        std::fs::read_to_string("/proc/locks")
            .unwrap()
            .lines()
            .any(|l| l.contains("->") && l.contains(&daemon))
    });
    let mut health = TcpStream::connect(("127.0.0.1", port)).unwrap();
    health
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    health
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    if let Err(e) = health.read_to_end(&mut answer) {
        panic!(
            "/healthz did not answer while {} signals waited on a stalled commit: {e}",
            2 * WORKERS
        );
    }
    assert_eq!(split_answer(&answer).0, 200);
    drop(held);
    for (n, mut s) in waiting.into_iter().enumerate() {
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).unwrap();
        let (code, body) = split_answer(&answer);
        assert_eq!(code, 202, "signal {n}: {body}");
    }
    // A 202 means the journal holds the signal; the state file is written just after, so it
    // is read once it has caught up, and then it must count each signal once.
    let counted = || env.state(&id)["counters"]["signals"].as_u64().unwrap_or(0);
    env.wait_until("the state to count the last commit", || {
        counted() >= 2 * WORKERS as u64
    });
    assert_eq!(counted(), 2 * WORKERS as u64);
}
