//! Waiters: the processes that block on a session's next wake (`next`, `wait`, the harness
//! hooks). What a harness user sees of them: they cost nothing while idle, there is one per
//! session, they leave with the harness that started them, and they never block a run that
//! cannot be woken (Claude Code's print mode).

use std::fs;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{Env, PATIENCE, WAITPOINT};

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

/// The CPU time (user + system) a process has used so far, from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("the waiter is running");
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are
    // fixed: utime and stime are the 12th and 13th of them.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / per_second)
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
