//! `waitpoint run` and `waitpoint attach`: a job watched to its end and its outcome signalled
//! to its waitpoint, with `progress` heartbeats while it lives.

use std::ffi::OsString;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;

use crate::error::exit;
use crate::home::Home;
use crate::process;
use crate::records::SignalStatus;
use crate::sender::SignalBody;
use crate::sync::MutexExt;

impl super::SignalTarget {
    /// A body for this waitpoint, checked now so a typo fails before the job runs, not after.
    fn body(&self, message: Option<String>) -> anyhow::Result<SignalBody> {
        let (id, secret) = super::require_id_secret(self.id.clone(), self.secret.clone())?;
        let body = SignalBody {
            id,
            secret,
            status: SignalStatus::Ok,
            message,
            member: self.member.clone().filter(|m| !m.is_empty()),
            data: None,
        };
        body.to_bytes()?;
        Ok(body)
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: super::SignalTarget,
    /// How many of the last lines of output to send as data (within the 16,000-character cap)
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub tail_lines: usize,
    /// Send a `progress` report every DURATION while the command runs, its last output line as
    /// the message (for a waitpoint armed with --heartbeat-within a little longer): 5m, 90s
    #[arg(long, value_name = "DURATION", value_parser = parse_interval)]
    pub heartbeat: Option<u64>,
    /// The command to run and its arguments (put them after `--`)
    #[arg(
        value_name = "COMMAND",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(OsString)
    )]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The process to wait for (any process you can see, not only your children)
    #[arg(long, value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
    pub pid: i32,
    #[command(flatten)]
    pub target: super::SignalTarget,
    /// One-line summary for the wake [default: "pid PID exited"]
    #[arg(long, value_name = "TEXT")]
    pub message: Option<String>,
    /// Send a `progress` report every DURATION while the process lives (for a waitpoint armed
    /// with --heartbeat-within a little longer): 5m, 90s
    #[arg(long, value_name = "DURATION", value_parser = parse_interval)]
    pub heartbeat: Option<u64>,
}

/// A heartbeat interval: a duration of at least one second.
fn parse_interval(text: &str) -> Result<u64, String> {
    match crate::clock::parse_duration(text)? {
        ms if ms < 1_000 => Err(format!(
            "{text:?} is under a second; beat at most once a second"
        )),
        ms => Ok(ms),
    }
}

/// A thread that sends a `progress` report every interval until it is stopped (dropped): the
/// heartbeat of `run --heartbeat` and `attach --heartbeat`. Each beat is a new signal with its
/// own identity; a failed one is said once on stderr and the job goes on.
struct Heartbeat {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    fn start(
        home: &Home,
        mut body: SignalBody,
        every_ms: Option<u64>,
        message: impl Fn(u64) -> String + Send + 'static,
        program: &'static str,
    ) -> Heartbeat {
        let Some(every_ms) = every_ms else {
            return Heartbeat {
                stop: None,
                thread: None,
            };
        };
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let home = home.clone();
        body.status = SignalStatus::Progress;
        body.data = None;
        let thread = std::thread::spawn(move || {
            let mut warned = false;
            for beat in 1.. {
                match rx.recv_timeout(Duration::from_millis(every_ms)) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let mut b = body.clone();
                b.message = Some(message(beat));
                let sent = crate::sender::fit_body(b)
                    .map_err(anyhow::Error::from)
                    .and_then(|bytes| super::send_as(&home, &bytes, None, false, program, false));
                match sent {
                    // Refused (the secret, the member, a closed waitpoint): said once by send,
                    // and no later beat would fare better.
                    Ok(code) if code != exit::OK => return,
                    Ok(_) => {}
                    Err(e) if !warned => {
                        eprintln!(
                            "{program}: a heartbeat could not be sent (the job goes on): {e:#}"
                        );
                        warned = true;
                    }
                    Err(_) => {}
                }
            }
        });
        Heartbeat {
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        // Closing the channel wakes the thread at once; a beat in flight finishes first, so
        // the final report is never overtaken by a late heartbeat.
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A heartbeat's message: the last output line, cut to the message cap.
fn beat_message(last: Option<String>, beat: u64) -> String {
    match last {
        Some(line) => {
            let n = line.chars().count();
            let keep = crate::request::MAX_MESSAGE_CHARS.min(200);
            if n > keep {
                line.chars().skip(n - keep).collect()
            } else {
                line
            }
        }
        None => format!("alive (heartbeat {beat}, no output yet)"),
    }
}

/// How often `attach` looks again where the kernel has no pidfds.
const ATTACH_POLL: Duration = Duration::from_secs(1);

/// `waitpoint run`: the command's output passes through; its exit code and output tail are
/// signalled; the exit status is the command's own.
pub fn run(home: &Home, a: RunArgs) -> anyhow::Result<u8> {
    let mut body = a.target.body(None)?;
    // The id, secret and member are checked before the command starts: a job started against
    // a waitpoint that will refuse its signal would run for hours for nothing.
    let probe = crate::sender::fit_body(body.clone())?;
    if let Some(judged) = super::judge_locally(home, &probe)
        && judged.code == exit::FAILURE
    {
        let left = judged.leave_miss(home);
        eprintln!(
            "waitpoint run: {}; the command was not started{left}",
            judged.said
        );
        return Ok(exit::FAILURE);
    }
    let (program, args) = a.command.split_first().expect("clap requires a command");
    let tail = Arc::new(Mutex::new(process::Tail::new(
        a.tail_lines,
        crate::request::MAX_DATA_CHARS,
    )));
    let heartbeat = {
        let tail = Arc::clone(&tail);
        let last = move |beat| {
            let line = tail.lock_or_recover().last_line();
            beat_message(line, beat)
        };
        Heartbeat::start(home, body.clone(), a.heartbeat, last, "waitpoint run")
    };
    let outcome = process::run_command(
        program,
        args,
        tail,
        Box::new(io::stdout()),
        Box::new(io::stderr()),
    );
    drop(heartbeat);
    let outcome = outcome?;
    if let Some(why) = &outcome.spawn_error {
        eprintln!("waitpoint run: {why}");
    }
    body.status = if outcome.code == 0 {
        SignalStatus::Ok
    } else {
        SignalStatus::Fail
    };
    body.message = Some(format!("exit={}", outcome.code));
    body.data = (!outcome.tail.is_empty()).then_some(outcome.tail);
    send_reporting_failure(home, body, "waitpoint run");
    Ok(u8::try_from(outcome.code).unwrap_or(exit::FAILURE))
}

/// Sends after the job is over. A failure to signal is said loudly but does not replace the
/// job's own outcome, which is what the caller's shell acts on.
fn send_reporting_failure(home: &Home, body: SignalBody, program: &str) -> bool {
    let sent = crate::sender::fit_body(body)
        .map_err(anyhow::Error::from)
        .and_then(|bytes| super::send(home, &bytes, None, false, program));
    if let Err(e) = &sent {
        eprintln!("{program}: cannot signal the waitpoint: {e:#}");
    }
    sent.is_ok()
}

/// `waitpoint attach`: waits for a process that is not ours, then signals ok.
pub fn attach(home: &Home, a: AttachArgs) -> anyhow::Result<u8> {
    let message = a.message.unwrap_or_else(|| format!("pid {} exited", a.pid));
    let body = a.target.body(Some(message))?;
    if process::process_exists(a.pid) {
        let pid = a.pid;
        let alive = move |beat| format!("pid {pid} alive (heartbeat {beat})");
        let heartbeat =
            Heartbeat::start(home, body.clone(), a.heartbeat, alive, "waitpoint attach");
        let waited = process::wait_for_exit(a.pid, true, ATTACH_POLL);
        drop(heartbeat);
        waited?;
    } else {
        eprintln!(
            "waitpoint attach: pid {} is not running; signalling now",
            a.pid
        );
    }
    Ok(if send_reporting_failure(home, body, "waitpoint attach") {
        exit::OK
    } else {
        exit::FAILURE
    })
}
