//! Rows 9 and 10: what the agent loop costs a harness user between turns. An idle waiter (the
//! hook that holds an open session) against `tail -F`, the tool an engineer would leave
//! watching a file; and Claude Code's status line command, which runs on every redraw, against
//! starting a process that does nothing.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ours::{self, Bins, cpu_secs};

/// A child killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn watching(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten().any(|fd| {
            fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().contains("inotify"))
        })
    })
}

/// CPU seconds per minute of `child` once it is waiting, over `idle`.
fn idle_cpu_per_minute(child: &Running, idle: Duration) -> f64 {
    let pid = child.0.id();
    let start = Instant::now();
    while !watching(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "it never began to wait"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = cpu_secs(pid);
    std::thread::sleep(idle);
    (cpu_secs(pid) - before) * 60.0 / idle.as_secs_f64()
}

/// Row 9: (waiter, `tail -F`) CPU seconds per minute while idle.
pub fn idle_waiter(b: &Bins, dir: &Path, idle: Duration) -> (f64, f64) {
    let home = ours::new_home(dir, "{}");
    let waiter = Running(
        Command::new(&b.waitpoint)
            .args(["--home"])
            .arg(home.root())
            .args([
                "adapter",
                "claude-hook",
                "--session",
                "bench",
                "--timeout",
                "3600",
            ])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ours = idle_cpu_per_minute(&waiter, idle);
    let log = dir.join("job.log");
    fs::write(&log, "").unwrap();
    let tail = Running(
        Command::new("tail")
            .arg("-F")
            .arg(&log)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (ours, idle_cpu_per_minute(&tail, idle))
}

/// Row 10: (status line, `true`) p50 of `n` runs, in ms.
pub fn statusline(b: &Bins, dir: &Path, n: usize) -> (f64, f64) {
    let home = ours::new_home(dir, "{}");
    let engine = ours::engine(&home);
    // The session shown waits on a few waitpoints among many armed on the machine.
    for i in 0..200 {
        let session = if i % 50 == 0 {
            "claude-bench"
        } else {
            "someone-else"
        };
        let req = waitpoint::engine::CreateRequest::new(
            format!("job {i}"),
            "the benchmark's job",
            session,
        );
        engine.create(req).unwrap();
    }
    let input =
        br#"{"session_id":"bench","hook_event_name":"Status","model":{"display_name":"Opus"}}"#;
    let time = |cmd: &mut Command| {
        let mut runs = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            let _ = child.stdin.take().unwrap().write_all(input);
            assert!(child.wait().unwrap().success());
            runs.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        ours::p(&runs, 50.0)
    };
    let mut line = Command::new(&b.waitpoint);
    line.arg("--home")
        .arg(home.root())
        .args(["adapter", "claude-statusline"]);
    let ours = time(&mut line);
    let floor = time(&mut Command::new("true"));
    (ours, floor)
}
