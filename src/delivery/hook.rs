//! The optional `onWake` hook: a command (argv, never a shell string) run for each wake with the
//! wake JSON on stdin and `WAITPOINT_*` variables in its environment. Exit 0 means delivered;
//! anything else, or running past the timeout, is a failed attempt to retry later.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process;

/// One run of the hook.
#[derive(Debug, Clone)]
pub struct HookRun {
    pub argv: Vec<String>,
    pub stdin: Vec<u8>,
    pub env: Vec<(String, String)>,
    /// Where it runs; the caller's own directory when `None`.
    pub cwd: Option<std::path::PathBuf>,
    pub timeout: Duration,
    /// Whether our own SIGTERM, SIGINT or SIGHUP ends the run (its whole group) before we go:
    /// set by a runner that is itself a program someone may stop, such as the resume adapter
    /// the daemon runs, so the harness it started never runs on after it.
    pub stop_on_signals: bool,
}

/// How much of the hook's stderr is kept as the error of a failed attempt.
const ERROR_TAIL: usize = 500;

/// What a finished run printed: standard output (when captured) and the tail of standard error.
#[derive(Debug)]
pub struct Finished {
    pub status: std::process::ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// How much of a captured standard output is kept.
const MAX_STDOUT: u64 = 1 << 20;

/// Runs `h` to its end or its timeout: stdin fed from a thread (a program that does not read it
/// cannot wedge us), stderr kept (64 KB at most), stdout kept too when `capture_stdout`. A run
/// past the timeout is killed. `Err` is a one-line reason.
pub fn run_to_end(h: &HookRun, capture_stdout: bool) -> Result<Finished, String> {
    let (program, args) = h.argv.split_first().ok_or("onWake is empty")?;
    let mut command = Command::new(program);
    if let Some(dir) = &h.cwd {
        command.current_dir(dir);
    }
    // The operator token grants control over every agent of the home, and a signal secret
    // resolves a waitpoint; a hook (and the harness it resumes) is a program the daemon runs
    // for the agent, not the operator nor a job, so it is given neither.
    for name in crate::secret::SECRET_ENVS {
        command.env_remove(name);
    }
    // A process group of its own, so a run past its timeout is killed with everything it
    // started: a harness's launcher (Codex's npm wrapper) killed alone leaves the real
    // program running under init, still holding the session.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .args(args)
        .envs(h.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(if capture_stdout {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {program:?}: {e}"))?;
    let mut stdin = child.stdin.take();
    let input = h.stdin.clone();
    // Not joined: a grandchild holding stdin open could keep a large write blocked; the thread
    // ends by itself once the pipe closes.
    std::thread::spawn(move || {
        if let Some(s) = stdin.as_mut() {
            let _ = s.write_all(&input);
        }
    });
    let out = process::drain(child.stdout.take(), MAX_STDOUT);
    let err = process::drain(child.stderr.take(), 64 * 1024);
    // No polling, and no unbounded wait on the pipes: a hook whose grandchild keeps stderr
    // open would otherwise hold this thread (and every later wake's hook) for ever.
    let status = match process::wait_killing_group(child, h.timeout, h.stop_on_signals) {
        Ok(process::Ended::Exited(status)) => status,
        Ok(process::Ended::TimedOut) => {
            return Err(format!(
                "timed out after {} ms (ended with everything it started)",
                h.timeout.as_millis()
            ));
        }
        Ok(process::Ended::Stopped) => {
            return Err(format!(
                "{program:?} was ended with everything it started: we were told to stop"
            ));
        }
        Err(e) => return Err(format!("cannot wait for {program:?}: {e}")),
    };
    Ok(Finished {
        status,
        stdout: process::collect_output(&out),
        stderr: process::collect_output(&err),
    })
}

/// Runs the hook to completion or timeout. `Err` carries a one-line reason for the record.
pub fn run(h: &HookRun) -> Result<(), String> {
    let done = run_to_end(h, false)?;
    let (status, err) = (done.status, done.stderr);

    if status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&err);
    let tail: String = text
        .trim()
        .chars()
        .rev()
        .take(ERROR_TAIL)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let code = status
        .code()
        .map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}"));
    Err(if tail.is_empty() {
        code
    } else {
        format!("{code}: {}", tail.replace('\n', " / "))
    })
}

#[cfg(test)]
mod group_tests {
    use super::*;

    #[test]
    fn a_run_past_its_timeout_is_killed_with_everything_it_started() {
        let tmp = tempfile::tempdir().unwrap();
        let pid_file = tmp.path().join("grandchild");
        let script = format!("sleep 300 & echo $! > {}; wait", pid_file.display());
        let run = HookRun {
            argv: vec!["sh".into(), "-c".into(), script],
            stdin: Vec::new(),
            env: Vec::new(),
            cwd: None,
            timeout: Duration::from_millis(500),
            stop_on_signals: false,
        };
        let e = run_to_end(&run, false).unwrap_err();
        assert!(e.contains("timed out"), "{e}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Killed with its group: gone, or a zombie waiting for init to reap it.
        let gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        let start = std::time::Instant::now();
        while !gone() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(), "the hook's own child outlived the killed run");
    }
}
