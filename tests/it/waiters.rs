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
