//! Operations and shell ergonomics of `waitpoint`: `run`, `attach`, `doctor`, `completions`, and
//! running the daemon as a service (signals, progress). Clap types for these live here so the
//! main command file stays a list of commands.

use std::ffi::OsString;
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::clock::{Clock, SystemClock};
use crate::daemon::{Daemon, DaemonConfig};
use crate::doctor;
use crate::error::{Error, exit};
use crate::home::Home;
use crate::ingress::http::{self as shim, HttpConfig};
use crate::process;
use crate::records::SignalStatus;
use crate::sender::SignalBody;
use crate::settings::Settings;
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

#[derive(Debug, Args)]
pub struct DoctorArgs {}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The directory to write the home layout into (new, or without waitpoints)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The home whose waitpoints to copy into the store (--store, or the settings' `store`)
    #[arg(value_name = "HOME")]
    pub from: PathBuf,
}

/// `waitpoint export DIR`: every waitpoint of the store, with its records, written as an
/// ordinary home, all read at one revision.
pub fn export(
    engine: &crate::engine::Engine,
    a: ExportArgs,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
    let to = Home::new(a.dir);
    if to
        .waitpoints_dir()
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        return Err(Error::Usage(format!(
            "{} holds waitpoints already; export into a new directory",
            to.waitpoints_dir().display()
        ))
        .into());
    }
    to.ensure()?;
    let files = crate::store::Files::new(to.clone(), Arc::new(SystemClock), Default::default());
    let copied = crate::store::copy_all(engine.store(), &files)?;
    crate::store::Store::rebuild_index(&files)?;
    let at = copied
        .revision
        .map(|r| format!(" at revision {r}"))
        .unwrap_or_default();
    writeln!(
        out,
        "exported {} waitpoints ({} signal records) and {} timers{at} to {}",
        copied.waitpoints,
        copied.records,
        copied.timers,
        to.root().display()
    )?;
    Ok(exit::OK)
}

/// `waitpoint import HOME`: a single machine's waitpoints, with their records, and its timers
/// copied into the store; ids the store has already are left alone and listed. The source is
/// only read ([`crate::store::import`]); what cannot be imported is listed with its reason and
/// makes the exit status 1.
pub fn import(
    engine: &crate::engine::Engine,
    a: ImportArgs,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
    let from = Home::new(a.from);
    if !from.waitpoints_dir().is_dir() {
        return Err(Error::Usage(format!(
            "{} has no waitpoints directory; is it a waitpoint home?",
            from.root().display()
        ))
        .into());
    }
    let (copied, refused) = crate::store::import::import_home(from.root(), engine.store())?;
    for id in &copied.skipped {
        writeln!(out, "skipped {id}: the store has it already")?;
    }
    for r in &refused {
        writeln!(
            out,
            "refused {}: {}",
            crate::render::visible(&r.what),
            crate::render::visible(&r.reason)
        )?;
    }
    writeln!(
        out,
        "imported {} waitpoints ({} signal records) and {} timers from {}; {} skipped, {} refused",
        copied.waitpoints,
        copied.records,
        copied.timers,
        from.root().display(),
        copied.skipped.len(),
        refused.len()
    )?;
    Ok(if refused.is_empty() {
        exit::OK
    } else {
        exit::FAILURE
    })
}

/// Shells `completions` writes for.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Programs `completions` covers.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Program {
    Waitpoint,
    CortexSignal,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to write a completion script for
    #[arg(value_enum)]
    pub shell: Shell,
    /// The program to complete
    #[arg(long, value_enum, default_value_t = Program::Waitpoint)]
    pub program: Program,
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
    if let Some((exit::FAILURE, said)) = super::judge_locally(home, &probe) {
        eprintln!("waitpoint run: {said}; the command was not started");
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

/// `waitpoint doctor`: one line per check; exit 1 when any check fails.
pub fn doctor(home: &Home, store: Option<&str>, _a: DoctorArgs) -> anyhow::Result<u8> {
    let mut settings = super::load_settings(home);
    if let (Some(url), Ok(s)) = (store, settings.as_mut()) {
        s.store = crate::store::Location::parse(url)
            .map_err(|e| Error::Usage(format!("--store: {e}")))?;
    }
    let store = settings.as_ref().ok().and_then(|s| {
        crate::store::open_shared(
            &s.store,
            s.host.as_deref(),
            home,
            crate::store::Role::Command,
        )
        .transpose()
        .map(|opened| opened.map(|st| st.health()))
    });
    let checks = doctor::run(&doctor::Inputs {
        home,
        settings: &settings,
        inotify_dir: PathBuf::from("/proc/sys/fs/inotify"),
        inotify_instance: doctor::probe_inotify(home),
        store,
    });
    let mut out = io::stdout().lock();
    for check in &checks {
        // A check may name a file of the home, and a name may hold anything.
        writeln!(out, "{}", crate::render::visible_text(&check.to_string()))?;
    }
    Ok(if doctor::worst(&checks) == doctor::Level::Fail {
        exit::FAILURE
    } else {
        exit::OK
    })
}

/// `waitpoint completions SHELL`: the completion script on stdout.
pub fn completions(a: CompletionsArgs) -> anyhow::Result<u8> {
    let (mut cmd, name) = match a.program {
        Program::Waitpoint => (super::waitpoint_command(), "waitpoint"),
        Program::CortexSignal => (super::cortex_signal_command(), "cortex-signal"),
    };
    let shell = match a.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = io::stdout().lock();
    clap_complete::generate(shell, &mut cmd, name, &mut out);
    out.flush()?;
    Ok(exit::OK)
}

/// Runs the daemon in the foreground as a service: SIGTERM and SIGINT stop it cleanly (the
/// file in hand is finished, the lock released), SIGHUP re-reads the settings, and a large
/// startup backlog shows a progress bar when stderr is a terminal.
pub fn run_daemon(
    home: Home,
    settings: Settings,
    http: Option<crate::ingress::http::HttpConfig>,
) -> anyhow::Result<u8> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    // Registered before the daemon takes its lock, so a signal at any moment after that (even
    // during start-up) takes the clean path instead of killing the process like a crash.
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (daemon, control) = Daemon::new(
        DaemonConfig {
            home: home.clone(),
            settings,
            http,
        },
        clock,
    )?;
    let daemon = daemon.with_ssh_options(super::ssh_options());
    let daemon = if io::stderr().is_terminal() {
        daemon.with_progress(Box::new(super::DrainBar))
    } else {
        daemon
    };
    let handle = signals.handle();
    let listener = std::thread::spawn(move || {
        for sig in signals.forever() {
            if sig == SIGHUP {
                match super::load_settings(&home) {
                    Ok(s) => {
                        tracing::info!("SIGHUP: re-reading settings");
                        control.reload(s);
                    }
                    Err(e) => tracing::error!("SIGHUP: keeping the current settings: {e}"),
                }
            } else {
                tracing::info!(signal = sig, "shutting down on signal");
                control.shutdown();
            }
        }
    });
    let result = daemon.run();
    handle.close();
    let _ = listener.join();
    result?;
    Ok(exit::OK)
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// How log lines are written, on stderr and in log/daemon.log
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = super::LogFormat::Text)]
    pub log_format: super::LogFormat,
    /// Also serve the loopback HTTP shim (POST /webhook/signal, GET /healthz); also turned on
    /// by "webhook": {"enabled": true} in settings.json. It holds at most 1,024 connections,
    /// fewer under a low open-file limit: a quarter of the limit (at least 128) is kept for the
    /// engine, and the least active connection is closed to make room. The daemon raises its
    /// soft open-file limit to the hard one when it starts
    #[arg(long)]
    pub http: bool,
    /// The shim's port; 0 picks a free one [default: settings webhook.port, else
    /// $WEBHOOK_PORT, else 3001]
    #[arg(long, value_name = "P")]
    pub port: Option<u16>,
    /// The shim's address; loopback only [default: 127.0.0.1]
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
}

/// The shim's address from `--http/--port/--bind`, settings and `WEBHOOK_PORT`, in that order.
pub(super) fn http_config(
    a: &DaemonArgs,
    settings: &Settings,
) -> anyhow::Result<Option<HttpConfig>> {
    if !a.http && !settings.webhook.enabled {
        if a.port.is_some() || a.bind.is_some() {
            return Err(Error::Usage(
                "--port and --bind configure the HTTP shim; add --http (or set \"webhook\": \
{\"enabled\": true} in settings.json)"
                    .into(),
            )
            .into());
        }
        return Ok(None);
    }
    let port = match a.port.or(settings.webhook.port) {
        Some(p) => p,
        None => super::webhook_port_env()?.unwrap_or(shim::DEFAULT_PORT),
    };
    let bind = a.bind.as_deref().unwrap_or("127.0.0.1");
    // The operator token turns the control routes on; the shim keeps only its hash.
    let token = std::env::var(crate::secret::OPERATOR_TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty());
    if token.as_deref().is_some_and(|t| t.trim().len() < 16) {
        return Err(Error::Usage(format!(
            "{} must be at least 16 characters (it guards every agent's timers and callbacks)",
            crate::secret::OPERATOR_TOKEN_ENV
        ))
        .into());
    }
    Ok(Some(
        HttpConfig::new(bind, port)?.with_control_token(token.as_deref().map(str::trim)),
    ))
}
