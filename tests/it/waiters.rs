//! Waiters: the processes that block on a session's next wake (`next`, `wait`, the harness
//! hooks). What a harness user sees of them: they cost nothing while idle, there is one per
//! session, they leave with the harness that started them, and they never block a run that
//! cannot be woken (Claude Code's print mode).

use std::fs;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

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
        let wake: waitpoint::model::Wake = serde_json::from_value(w).unwrap();
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

#[test]
fn a_hook_stopped_by_sigterm_loses_no_wake_and_hands_none_over_twice() {
    let env = Env::new();
    let mut next = 0;
    let mut made = std::collections::BTreeSet::new();
    let mut handed: std::collections::BTreeMap<String, usize> = Default::default();
    for run in 0..15u64 {
        made.extend(fill_inbox(&env, "agent", 100, &mut next));
        let mut hook = env
            .command(WAITPOINT)
            .args([
                "adapter",
                "claude-hook",
                "--session",
                "agent",
                "--timeout",
                "60",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Somewhere between starting and handing over: the take of a hundred wakes is slow.
        std::thread::sleep(Duration::from_millis(10 + run * 11));
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(hook.id() as libc::pid_t, libc::SIGTERM) };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut hook.stderr.take().unwrap(), &mut err).unwrap();
        let status = hook.wait().unwrap();
        // Claude Code takes a hook's text only when it exits 2.
        if status.code() == Some(2) {
            for m in markers(&err) {
                *handed.entry(m).or_default() += 1;
            }
        }
    }
    let twice: Vec<_> = handed.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "handed over twice: {twice:?}");
    let unread: std::collections::BTreeSet<String> = env
        .inbox("agent", "new")
        .iter()
        .flat_map(|w| markers(w["text"].as_str().unwrap()))
        .collect();
    let lost: Vec<_> = made
        .iter()
        .filter(|m| !handed.contains_key(*m) && !unread.contains(*m))
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
fn next_stopped_by_sigterm_loses_no_wake_and_prints_none_twice() {
    let env = Env::new();
    let mut next = 0;
    let mut made = std::collections::BTreeSet::new();
    let mut printed: std::collections::BTreeMap<String, usize> = Default::default();
    for run in 0..15u64 {
        made.extend(fill_inbox(&env, "reader", 100, &mut next));
        let mut reader = env
            .command(WAITPOINT)
            .args(["next", "--session", "reader", "--follow", "--json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(10 + run * 11));
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(reader.id() as libc::pid_t, libc::SIGTERM) };
        let mut out = String::new();
        std::io::Read::read_to_string(&mut reader.stdout.take().unwrap(), &mut out).unwrap();
        let status = reader.wait().unwrap();
        assert!(matches!(status.code(), Some(143) | None), "{status}");
        for m in markers(&out) {
            *printed.entry(m).or_default() += 1;
        }
    }
    let twice: Vec<_> = printed.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "printed twice: {twice:?}");
    let unread: std::collections::BTreeSet<String> = env
        .inbox("reader", "new")
        .iter()
        .flat_map(|w| markers(w["text"].as_str().unwrap()))
        .collect();
    let lost: Vec<_> = made
        .iter()
        .filter(|m| !printed.contains_key(*m) && !unread.contains(*m))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} lost: {lost:?}",
        lost.len(),
        made.len()
    );
}
