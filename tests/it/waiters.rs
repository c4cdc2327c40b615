//! Waiters: the processes that block on a session's next wake (`next`, `wait`, the harness
//! hooks). What a harness user sees of them: they cost nothing while idle, there is one per
//! session, they leave with the harness that started them, and they never block a run that
//! cannot be woken (Claude Code's print mode).

use std::fs;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::helpers::{Env, PATIENCE, WAITPOINT, cpu_time};

/// A waiter child, killed on drop.
struct Waiter(Child);

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Waiter {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// Whether the process has an inotify instance open, i.e. it reached its wait.
fn is_watching(pid: u32) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().contains("inotify")))
}

fn spawn_waiter(env: &Env, args: &[&str]) -> Waiter {
    let child = env
        .command(WAITPOINT)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a waiter");
    Waiter(child)
}

#[test]
fn an_idle_waiter_uses_no_cpu() {
    let env = Env::new();
    let armed = env.arm("idle", &[]);
    let id = armed["id"].as_str().unwrap().to_owned();
    let waiters = [
        spawn_waiter(&env, &["next", "--session", "default", "--timeout", "60"]),
        spawn_waiter(&env, &["wait", &id, "--timeout", "60"]),
        spawn_waiter(
            &env,
            &[
                "adapter",
                "claude-hook",
                "--session",
                "default",
                "--timeout",
                "60",
            ],
        ),
    ];
    let start = Instant::now();
    while !waiters.iter().all(|w| is_watching(w.pid())) {
        assert!(
            start.elapsed() < PATIENCE,
            "the waiters never began to wait"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before: Vec<Duration> = waiters.iter().map(|w| cpu_time(w.pid())).collect();
    // The measurement itself: ten seconds of idling (the bug spun a core in well under one).
    std::thread::sleep(Duration::from_secs(10));
    for (w, before) in waiters.iter().zip(before) {
        let used = cpu_time(w.pid()) - before;
        let cmdline = fs::read_to_string(format!("/proc/{}/cmdline", w.pid()))
            .unwrap_or_default()
            .replace('\0', " ");
        assert!(
            used < Duration::from_millis(50),
            "an idle `{cmdline}` used {used:?} of CPU in 10 s"
        );
    }
}

/// Puts wakes into `channel`'s inbox until it holds `n` unread, each with a text of its own
/// (`marker-<k>`); returns the markers added.
fn fill_inbox(env: &Env, channel: &str, n: usize, next: &mut usize) -> Vec<String> {
    let home = waitpoint::home::Home::new(&env.home);
    let template: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/layouts/wake.example.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut added = Vec::new();
    while env.inbox(channel, "new").len() < n {
        *next += 1;
        let marker = format!("marker-{:05}", *next);
        let mut w = template.clone();
        w["wake_id"] = format!("wk_0000000a{:04x}_{:04}", *next, *next).into();
        w["session"] = channel.into();
        w["channel"] = channel.into();
        w["text"] = format!("Waitpoint wp_7a3e16f612fc: {marker}.\n").into();
        let wake: waitpoint::records::Wake = serde_json::from_value(w).unwrap();
        waitpoint::delivery::deliver(&home, &wake).unwrap();
        added.push(marker);
    }
    added
}

/// The markers a hook's output carries.
fn markers(text: &str) -> Vec<String> {
    text.match_indices("marker-")
        .map(|(i, _)| text[i..i + 12].to_owned())
        .collect()
}

/// The kill loop: fifteen rounds, each starting `args` on an inbox of 100 unread wakes
/// and sending it SIGTERM 10-164 ms in (taking a hundred wakes is slow, so some rounds land
/// mid-take). `handed` says which wakes a round handed over, from its exit status and the
/// stream it writes wakes to (stderr for a hook, stdout for `next`). None may be handed over
/// twice, and every wake is either handed over or still unread: none lost.
fn kill_loop(
    env: &Env,
    channel: &str,
    args: &[&str],
    stderr: bool,
    handed: impl Fn(std::process::ExitStatus, &str) -> Vec<String>,
) {
    let (mut next, mut made) = (0, std::collections::BTreeSet::new());
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    for run in 0..15u64 {
        made.extend(fill_inbox(env, channel, 100, &mut next));
        let (out, err) = if stderr {
            (Stdio::null(), Stdio::piped())
        } else {
            (Stdio::piped(), Stdio::null())
        };
        let mut reader = env
            .command(WAITPOINT)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(10 + run * 11));
        // kill(2) cannot fail on our own child before it is reaped (a zombie included): unchecked.
        let _ = kill_process(Pid::from_child(&reader), Signal::TERM);
        let mut text = String::new();
        let stream: Box<dyn std::io::Read> = match (reader.stdout.take(), reader.stderr.take()) {
            (Some(o), _) => Box::new(o),
            (_, Some(e)) => Box::new(e),
            _ => unreachable!("one stream is piped"),
        };
        std::io::Read::read_to_string(&mut { stream }, &mut text).unwrap();
        let status = reader.wait().unwrap();
        for m in handed(status, &text) {
            *seen.entry(m).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "handed over twice: {twice:?}");
    let unread: std::collections::BTreeSet<String> = env
        .inbox(channel, "new")
        .iter()
        .flat_map(|w| markers(w["text"].as_str().unwrap()))
        .collect();
    let lost: Vec<_> = made
        .iter()
        .filter(|m| !seen.contains_key(*m) && !unread.contains(*m))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} wakes lost (read, never handed over), e.g. {:?}",
        lost.len(),
        made.len(),
        &lost[..lost.len().min(5)]
    );
}

#[test]
fn a_hook_stopped_by_sigterm_loses_no_wake_and_hands_none_over_twice() {
    let env = Env::new();
    let hook = [
        "adapter",
        "claude-hook",
        "--session",
        "agent",
        "--timeout",
        "60",
    ];
    // Claude Code takes a hook's text only when it exits 2.
    kill_loop(&env, "agent", &hook, true, |status, err| {
        if status.code() == Some(2) {
            markers(err)
        } else {
            Vec::new()
        }
    });
}

#[test]
fn next_stopped_by_sigterm_loses_no_wake_and_prints_none_twice() {
    let env = Env::new();
    let next = ["next", "--session", "reader", "--follow", "--json"];
    kill_loop(&env, "reader", &next, false, |status, out| {
        assert!(matches!(status.code(), Some(143) | None), "{status}");
        markers(out)
    });
}

/// `next` without a timeout may block for days: at a terminal it says on stderr what it waits
/// for and how to stop, and a wake still ends it; a script's `next` (stderr not a terminal)
/// says nothing.
#[test]
fn next_without_a_timeout_says_at_a_terminal_what_it_waits_for() {
    let env = Env::new();
    let _daemon = env.daemon();
    // `script` gives `next` a terminal and records what it wrote there.
    let typescript = env.home.join("../typescript");
    let next = format!("{WAITPOINT} next --session s1");
    let mut script = Waiter(
        env.command("script")
            .env("TERM", "xterm")
            .args(["-q", "-f", "-e", "-c", &next])
            .arg(&typescript)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("script(1) from util-linux; scripts/test-deps installs it"),
    );
    let notice = "waiting for the next wake on channel s1 (Ctrl-C to stop)";
    env.wait_until("the notice at the terminal", || {
        fs::read_to_string(&typescript).is_ok_and(|t| t.contains(notice))
    });
    env.timer_now("s1", "look at the queue");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = script.0.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < PATIENCE, "next did not end on the wake");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let drawn = fs::read_to_string(&typescript).unwrap();
    assert!(drawn.contains("look at the queue"), "{drawn}");

    // Not a terminal: nothing on stderr but what went wrong.
    let stderr = env.home.join("../next-stderr");
    let mut quiet = Waiter(
        env.command(WAITPOINT)
            .args(["next", "--session", "s2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn next"),
    );
    env.wait_until("next to wait", || is_watching(quiet.pid()));
    env.timer_now("s2", "again");
    let start = Instant::now();
    while quiet.0.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < PATIENCE, "next did not end on the wake");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs::read_to_string(&stderr).unwrap(), "");
}
