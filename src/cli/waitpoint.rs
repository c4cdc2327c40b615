//! `waitpoint`: the operator and agent CLI (create, check, show, cancel, next, wait) and
//! `waitpoint daemon`. Clap types end here; the library sees validated requests.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use notify::{RecursiveMode, Watcher};
use serde_json::{Value, json};

use crate::agent;
use crate::clock::{Clock, SystemClock};
use crate::engine::{self, CreateRequest, Engine, Quorum};
use crate::error::{Error, exit};
use crate::home::Home;
use crate::ingress::http::{self, HttpConfig};
use crate::model::{Outcome, Status, Waitpoint, Wake};
use crate::settings::Settings;

use super::{SessionArg, print_json, render};

/// Durable "wake me when this finishes" objects.
///
/// Arm a waitpoint with `create`, paste one of its `how_to_signal` lines after your job's
/// command, and let `waitpoint daemon` wake your session when the job reports.
#[derive(Debug, Parser)]
#[command(name = "waitpoint", version, propagate_version = true)]
pub struct Cli {
    /// The home directory holding all state [default: $CORTEX_HOME, else ~/.cortex]
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Arm a waitpoint and print its secret and ready-to-paste signal lines
    Create(CreateArgs),
    /// List what a session is waiting on
    Check(CheckArgs),
    /// Show one waitpoint in full: intent, progress, every signal
    Show(ShowArgs),
    /// Disarm a waitpoint (stops the waiting, not the job)
    Cancel(CancelArgs),
    /// Print the next wake of a session's channel and mark it read
    Next(NextArgs),
    /// Block until a waitpoint resolves, expires or is cancelled
    Wait(WaitArgs),
    /// A live view of `check` that redraws whenever something changes
    Watch(WatchArgs),
    /// Manage sessions
    #[command(subcommand)]
    Session(SessionCommand),
    /// Replace a waitpoint's secret: the old one is refused from now on
    ResetSecret(ResetSecretArgs),
    /// Durable timers: wakes after a delay, optionally repeating
    ///
    /// `waitpoint timer --after-ms N [--every-ms N] [--summary TEXT]`, without a subcommand, is
    /// the legacy form of `timer create` and does the same.
    Timer(super::timer::TimerArgs),
    /// Callback capability URLs for senders that can only POST
    #[command(subcommand)]
    Callback(super::callback::CallbackCommand),
    /// Run the collector, sweeper and delivery in the foreground
    ///
    /// The daemon takes the home's lock (one daemon per home), drains the drop zone (showing
    /// progress on a terminal when the backlog is large), re-delivers any wake a restart
    /// interrupted, then collects signal files as they arrive (inotify, with a periodic sweep
    /// as the source of truth), fires deadlines on time and delivers wakes into session inboxes.
    /// It logs to stderr and to log/daemon.log under the home.
    ///
    /// SIGTERM and SIGINT stop it cleanly: the file in hand is finished, the rest stay spooled,
    /// the lock is released and the exit status is 0. SIGHUP re-reads settings.json and the
    /// environment; a malformed file is logged and the current settings are kept.
    Daemon(DaemonArgs),
    /// Manage the devices whose spools the daemon collects over SSH
    Device(super::device::DeviceArgs),
    /// Serve the agent tools over the Model Context Protocol on stdin and stdout
    ///
    /// For an agent harness to start as an MCP server (`claude mcp add waitpoint -- waitpoint
    /// mcp`): the tools wait_create, wait_check, wait_cancel, wait_next, CreateTimer,
    /// ListTimers, GetTimer and CancelTimer, acting for one session (--session, else
    /// $CORTEX_SESSION, else "default"). It needs no running daemon; without one, signals wait
    /// in the spool and wakes come once `waitpoint daemon` runs. Only the protocol is written to
    /// stdout; warnings go to stderr. It exits 0 when the client closes stdin.
    Mcp(McpArgs),
    /// Wake adapters: hand a session's wakes to an agent harness (hooks, onWake resumes)
    ///
    /// One-line commands for a harness's configuration. Hooks block on the session's next wake
    /// and give its text to a live session (claude-hook for Claude Code's asyncRewake hooks,
    /// codex-stop-hook for Codex's Stop hook); resumes run as the daemon's onWake command and
    /// resume a closed session with the wake as its prompt (claude-resume, codex-resume). A
    /// wake is marked read only when the harness took it; a failure leaves it unread, and the
    /// daemon retries an onWake command. Run as an onWake command, the home is
    /// $WAITPOINT_HOME unless --home says otherwise.
    #[command(subcommand)]
    Adapter(super::adapter::AdapterCommand),
    // ---- operations and shell ergonomics (src/cli/ops.rs) ----
    /// Run a command, pass its output through, and signal its exit code and output tail
    ///
    /// Like `COMMAND; cortex-signal --exit-code $? --data <tail>`: the waitpoint gets ok for exit
    /// 0 and fail otherwise, the message `exit=N`, and the last lines of standard output and
    /// error as data. The id and secret are checked before the command starts. The exit status
    /// is the command's own: 128+N when signal N killed it, 127 when it cannot be found and 126
    /// when it cannot be run. A failure to signal is reported on stderr and does not change it.
    Run(super::ops::RunArgs),
    /// Wait for a running process to end, then signal ok
    ///
    /// The attach_to_pid shape without a sleep loop: a pidfd where the kernel has them (Linux
    /// 5.3 and later), otherwise a check every second. The exit code of a process that is not
    /// your child is not knowable, so the signal is ok with the message "pid PID exited".
    Attach(super::ops::AttachArgs),
    /// Check the home, the daemon and the machine, one line per check with how to fix it
    ///
    /// Checks the home's ownership and modes, settings.json, the drop zone, the inotify
    /// limits, whether a daemon holds the lock (and whether a dead one left it stale), the HTTP
    /// shim's address file, each device's reachability, stale *.tmp files and parked refused
    /// files. Nothing is changed. Each line starts with OK, WARN or FAIL; the exit status is 1
    /// when any check FAILs.
    Doctor(super::ops::DoctorArgs),
    /// Print a completion script for bash, zsh or fish
    ///
    /// For example: `waitpoint completions bash > ~/.local/share/bash-completion/completions/waitpoint`,
    /// or `--program cortex-signal` for the signal command.
    Completions(super::ops::CompletionsArgs),
    // ---- end operations ----
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Delete a session: cancel its armed waitpoints (a late signal cannot bring it back) and
    /// remove its inbox
    Delete(SessionDeleteArgs),
}

#[derive(Debug, Args)]
pub struct SessionDeleteArgs {
    /// The session to delete
    pub session: String,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ResetSecretArgs {
    /// The waitpoint id
    pub id: String,
    #[command(flatten)]
    pub session: SessionArg,
    /// Print the reply as JSON
    #[arg(long, conflicts_with = "print")]
    pub json: bool,
    /// Print only one field of the reply
    #[arg(long, value_name = "FIELD", value_enum)]
    pub print: Option<PrintField>,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Print one compact JSON line per change instead of the table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Short name shown on the wake and in listings
    #[arg(long, value_name = "L")]
    pub label: String,
    /// What you are waiting for and what to do next; repeated back on the wake
    #[arg(long, value_name = "I")]
    pub intent: String,
    /// A job that will report (repeat for each); once set, every signal must name one
    #[arg(long = "member", value_name = "NAME")]
    pub members: Vec<String>,
    /// Terminal signals that resolve it: a number or "all" [default: all with members, else 1]
    #[arg(long, value_name = "N|all")]
    pub quorum: Option<String>,
    /// Do not wake on the first fail; wait for the quorum
    #[arg(long)]
    pub no_fail_fast: bool,
    /// How many times it may wake you; more than 1 keeps it open as a monitor
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub max_signals: u32,
    /// Deadline in hours, fractions allowed (0.01 is 36 s; at least 0.0003, one second)
    /// [default: waitpointTtlMs, 168; max 720]
    #[arg(long, value_name = "H", allow_negative_numbers = true)]
    pub expires_in_hours: Option<f64>,
    /// The device the job runs on, so its signal files are collected there
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    #[command(flatten)]
    pub session: SessionArg,
    /// The channel its wakes go to [default: the session]
    #[arg(long, value_name = "C")]
    pub channel: Option<String>,
    /// If nothing terminal has arrived after this many milliseconds, send one "recheck" wake
    /// (the waitpoint stays armed)
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub recheck_after_ms: Option<u64>,
    /// Print the reply as JSON
    #[arg(long, conflicts_with = "print")]
    pub json: bool,
    /// Print only one field of the reply, for scripts: `eval "$(waitpoint create … --print env)"`
    #[arg(long, value_name = "FIELD", value_enum)]
    pub print: Option<PrintField>,
}

/// The single fields `create --print` can print.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PrintField {
    Id,
    Secret,
    Env,
    Cli,
    Curl,
    Shell,
    AttachToPid,
    Recommended,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Print JSON
    #[arg(long, conflicts_with = "brief")]
    pub json: bool,
    /// One line for shell prompts and status bars (nothing when nothing waits)
    #[arg(long)]
    pub brief: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The waitpoint id
    pub id: String,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The waitpoint id
    pub id: String,
    #[command(flatten)]
    pub session: SessionArg,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct NextArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// The channel to read [default: the session]
    #[arg(long, value_name = "C")]
    pub channel: Option<String>,
    /// Keep printing wakes as they arrive
    #[arg(long)]
    pub follow: bool,
    /// Give up after this many seconds (0: do not wait) and exit 7
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print the wake JSON (one compact line per wake with --follow)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Also ring Claude Code's channel (notifications/claude/channel, a research preview) when
    /// a wake arrives: a doorbell telling the agent to call wait_next, which takes the wake
    #[arg(long)]
    pub claude_channel: bool,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The waitpoint id
    pub id: String,
    /// Give up after this many seconds and exit 7
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print the final state as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// How log lines are written, on stderr and in log/daemon.log
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = super::LogFormat::Text)]
    pub log_format: super::LogFormat,
    /// Also serve the loopback HTTP shim (POST /webhook/signal, GET /healthz); also turned on
    /// by "webhook": {"enabled": true} in settings.json
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

/// Entry point of the `waitpoint` binary.
pub fn main() -> ExitCode {
    super::setup_failpoints();
    let cli: Cli = match super::parse_args(super::args()) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let log_format = match &cli.command {
        Command::Daemon(a) => Some(a.log_format),
        _ => None,
    };
    // An onWake command is told its home by the daemon that runs it.
    let home_flag = match (&cli.command, cli.home) {
        (Command::Adapter(_), None) => std::env::var_os("WAITPOINT_HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from),
        (_, flag) => flag,
    };
    let home = super::resolve_home(home_flag);
    super::init_logging(
        log_format.is_some().then_some(&home),
        log_format.unwrap_or_default(),
    );
    super::finish("waitpoint", run(home, cli.command))
}

fn run(home: Home, command: Command) -> anyhow::Result<u8> {
    // These need neither settings nor a prepared home (doctor must see the home as it is).
    let command = match command {
        Command::Run(a) => return super::ops::run(&home, a),
        Command::Attach(a) => return super::ops::attach(&home, a),
        Command::Doctor(a) => return super::ops::doctor(&home, a),
        Command::Completions(a) => return super::ops::completions(a),
        other => other,
    };
    let settings = super::load_settings(&home)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    if let Command::Daemon(a) = command {
        let http = http_config(&a, &settings)?;
        return super::ops::run_daemon(home, settings, http);
    }
    home.ensure()?;
    let engine = Engine::new(home, settings, clock);
    // Before reading or changing any state: what a dead daemon left in the journal.
    engine.replay_left_journal()?;
    if let Command::Mcp(a) = command {
        // Before stdout is locked here: the server writes it from other threads.
        let lines = line_context(engine.home())?;
        crate::mcp::serve_stdio(crate::mcp::Config {
            engine,
            session: a.session.session,
            lines,
            claude_channel: a.claude_channel,
        })?;
        return Ok(exit::OK);
    }
    let mut out = io::stdout().lock();
    match command {
        Command::Create(a) => create(&engine, a, &mut out),
        Command::Check(a) => check(&engine, a, &mut out),
        Command::Show(a) => show(&engine, a, &mut out),
        Command::Cancel(a) => cancel(&engine, a, &mut out),
        Command::Next(a) => next(&engine, a, &mut out),
        Command::Wait(a) => wait(&engine, a, &mut out),
        Command::Watch(a) => watch(&engine, a, &mut out),
        Command::Session(SessionCommand::Delete(a)) => session_delete(&engine, a, &mut out),
        Command::ResetSecret(a) => {
            let created = engine.reset_secret(&a.id, &a.session.session)?;
            print_created(&engine, &created, a.print, a.json, &mut out)
        }
        Command::Timer(args) => super::timer::run_timer(&engine, args.into_command(), &mut out),
        Command::Adapter(cmd) => {
            // The Codex hook writes its reply to stdout itself.
            drop(out);
            super::adapter::run(&engine, cmd)
        }
        Command::Callback(cmd) => {
            super::callback::run_callback(&engine, cmd, webhook_port(engine.home())?, &mut out)
        }
        Command::Device(a) => super::device::run(
            &engine,
            a,
            &super::home_dir(),
            super::login_name(),
            &super::ssh_options(),
            &mut out,
        ),
        Command::Daemon(_)
        | Command::Mcp(_)
        | Command::Run(_)
        | Command::Attach(_)
        | Command::Doctor(_)
        | Command::Completions(_) => unreachable!("handled above"),
    }
}

/// The shim's address from `--http/--port/--bind`, settings and `WEBHOOK_PORT`, in that order.
fn http_config(a: &DaemonArgs, settings: &Settings) -> anyhow::Result<Option<HttpConfig>> {
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
        None => super::webhook_port_env()?.unwrap_or(http::DEFAULT_PORT),
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

fn parse_quorum(q: &str) -> anyhow::Result<Quorum> {
    if q == "all" {
        return Ok(Quorum::All);
    }
    q.parse::<u32>().map(Quorum::Count).map_err(|_| {
        Error::invalid("quorum", format!("must be a number or \"all\", not {q:?}")).into()
    })
}

fn create(engine: &Engine, a: CreateArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let quorum = a.quorum.as_deref().map(parse_quorum).transpose()?;
    let session = a.session.session;
    let channel = a.channel.unwrap_or_else(|| session.clone());
    let created = agent::create(
        engine,
        CreateRequest {
            label: a.label,
            intent: a.intent,
            members: a.members,
            quorum,
            fail_fast: !a.no_fail_fast,
            max_signals: a.max_signals,
            expires_in_hours: a.expires_in_hours,
            device: a.device,
            session,
            channel,
            recheck_after_ms: a.recheck_after_ms,
        },
    )?;
    print_created(engine, &created, a.print, a.json, out)
}

/// What the reply's lines depend on in this process's environment.
fn line_context(home: &Home) -> anyhow::Result<agent::LineContext> {
    Ok(agent::LineContext {
        fallback_port: super::webhook_port_env()?.unwrap_or(http::DEFAULT_PORT),
        home_is_implicit: super::is_implicit_default(home),
    })
}

/// The port printed lines use (see [`agent::webhook_port`]).
fn webhook_port(home: &Home) -> anyhow::Result<u16> {
    Ok(agent::webhook_port(home, line_context(home)?.fallback_port))
}

/// Prints a `wait_create` reply (also used by `reset-secret`, whose reply has the same shape).
fn print_created(
    engine: &Engine,
    created: &engine::Created,
    print: Option<PrintField>,
    json_out: bool,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let lines = agent::how_to_signal(engine, created, line_context(engine.home())?)?;
    let wp = &created.waitpoint;
    if let Some(field) = print {
        let text = match field {
            PrintField::Id => &wp.id,
            PrintField::Secret => &created.secret,
            PrintField::Env => &lines.env,
            PrintField::Cli => &lines.cli,
            PrintField::Curl => &lines.curl,
            PrintField::Shell => &lines.shell,
            PrintField::AttachToPid => &lines.attach_to_pid,
            PrintField::Recommended => lines.recommended_line(),
        };
        writeln!(out, "{text}")?;
        return Ok(exit::OK);
    }
    if json_out {
        print_json(out, &agent::created_reply(created, &lines))?;
        return Ok(exit::OK);
    }
    let now = engine.now();
    writeln!(out, "armed {}  {:?}", wp.id, wp.label)?;
    writeln!(
        out,
        "  session {} · channel {} · {} · expires {} ({})",
        wp.session,
        wp.channel,
        render::progress(wp),
        wp.expires_at,
        render::time_left(wp.expires_at, now)
    )?;
    writeln!(
        out,
        "  secret (shown once, stored only hashed): {}",
        created.secret
    )?;
    if let Some(note) = &lines.member_note {
        writeln!(out, "  members: {note}")?;
    }
    writeln!(
        out,
        "\nAppend to the job's command line ({}):",
        lines.recommended
    )?;
    writeln!(out, "  {}", lines.recommended_line())?;
    writeln!(out, "\nOther forms:")?;
    for (name, line) in [
        ("env", &lines.env),
        ("cli", &lines.cli),
        ("curl", &lines.curl),
        ("shell", &lines.shell),
        ("attach_to_pid", &lines.attach_to_pid),
    ] {
        writeln!(out, "  {name}:\n    {line}")?;
        if name == "curl"
            && let Some(note) = &lines.curl_note
        {
            writeln!(out, "    ({note})")?;
        }
    }
    Ok(exit::OK)
}

fn check(engine: &Engine, a: CheckArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let session = a.session.session;
    let items = agent::waiting_for(engine, &session)?;
    let devices = devices_to_mention(engine, &items)?;
    if a.json {
        let mut reply = agent::check(engine, &session, &items)?;
        if !devices.is_empty() {
            let d: Vec<Value> = devices
                .iter()
                .map(|d| super::device::view(engine, d))
                .collect();
            reply["devices"] = json!(d);
        }
        print_json(out, &reply)?;
        return Ok(exit::OK);
    }
    let now = engine.now();
    let rows = agent::check_rows(engine, &items)?;
    if a.brief {
        write!(out, "{}", render::check_brief(&rows))?;
    } else {
        for d in &devices {
            let st = crate::ingress::device::load_status(engine.home(), &d.name)?;
            if st.reachable == Some(false) {
                writeln!(
                    out,
                    "device {} is unreachable ({}); its files wait there",
                    d.name,
                    super::device::detail(&st, now)
                )?;
            }
        }
        write!(
            out,
            "{}",
            render::check_table(&session, &rows, terminal_style())
        )?;
    }
    Ok(exit::OK)
}

fn session_delete(
    engine: &Engine,
    a: SessionDeleteArgs,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let ended = engine.delete_session(&a.session)?;
    if a.json {
        print_json(
            out,
            &json!({
                "session": a.session,
                "cancelled": ended.waitpoints,
                "cancelled_timers": ended.timers,
                "revoked_callbacks": ended.callbacks,
            }),
        )?;
    } else {
        let list = |what: &str, ids: &[String]| {
            let mut s = format!("{} {what}", ids.len());
            if !ids.is_empty() {
                s.push_str(&format!(" ({})", ids.join(", ")));
            }
            s
        };
        writeln!(
            out,
            "deleted session {}; cancelled {}, cancelled {}, revoked {}",
            a.session,
            list("armed waitpoint(s)", &ended.waitpoints),
            list("timer(s)", &ended.timers),
            list("callback(s)", &ended.callbacks),
        )?;
    }
    Ok(exit::OK)
}

/// The devices `check` reports on: those the listed waitpoints are bound to, and any that is
/// unreachable.
fn devices_to_mention(
    engine: &Engine,
    items: &[Waitpoint],
) -> anyhow::Result<Vec<crate::ingress::device::Device>> {
    use crate::ingress::device;
    let home = engine.home();
    let mut out = Vec::new();
    for d in device::list(home)? {
        let bound = items.iter().any(|wp| wp.device.as_deref() == Some(&d.name));
        if bound || device::load_status(home, &d.name)?.reachable == Some(false) {
            out.push(d);
        }
    }
    Ok(out)
}

/// Redraws `check` whenever a waitpoint of the session or its inbox changes (inotify), and once
/// a minute so the time left stays true. Plain and separated by blank lines when piped.
fn watch(engine: &Engine, a: WatchArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    use std::collections::HashSet;
    use std::io::IsTerminal;
    let session = a.session.session;
    engine::check_name("session", &session)?;
    let home = engine.home();
    let inbox = home.inbox_new(&session);
    crate::store::create_dir_private(&inbox)?;
    let tty = io::stdout().is_terminal();
    let style = terminal_style();
    let (mut watcher, rx) = wake_on_change(&home.waitpoints_dir())?;
    watcher.watch(&inbox, RecursiveMode::NonRecursive)?;
    let mut watched: HashSet<String> = HashSet::new();
    let mut last = String::new();
    loop {
        let items = agent::waiting_for(engine, &session)?;
        for wp in &items {
            if watched.insert(wp.id.clone()) {
                // A waitpoint removed meanwhile simply stops producing events.
                let _ = watcher.watch(&home.waitpoint_dir(&wp.id), RecursiveMode::NonRecursive);
            }
        }
        let rows = agent::check_rows(engine, &items)?;
        let text = if a.json {
            format!("{}\n", json!({ "session": session, "waiting": rows }))
        } else {
            render::check_table(&session, &rows, style)
        };
        if text != last {
            if tty && !a.json {
                write!(out, "\x1b[H\x1b[2J")?;
            } else if !last.is_empty() && !a.json {
                writeln!(out)?;
            }
            write!(out, "{text}")?;
            out.flush()?;
            last = text;
        }
        wait_for_change(&rx, None);
    }
}

/// Colour only on a terminal, and never with `NO_COLOR` set.
fn terminal_style() -> render::Style {
    use std::io::IsTerminal;
    render::Style {
        color: io::stdout().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
    }
}

fn show(engine: &Engine, a: ShowArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let wp = engine.load_visible(&a.id, None)?;
    let signals = engine.read_signals(&wp.id, 1)?;
    let now = engine.now();
    let badges = render::badges(
        engine.home(),
        &wp,
        engine.settings().max_wakes_per_hour,
        now,
    );
    if a.json {
        print_json(out, &render::show_json(&wp, &signals, &badges))?;
    } else {
        write!(out, "{}", render::show_text(&wp, &signals, &badges, now))?;
    }
    Ok(exit::OK)
}

fn cancel(engine: &Engine, a: CancelArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let wp = engine.cancel(&a.id, &a.session.session)?;
    if a.json {
        print_json(out, &render::public_view(&wp))?;
    } else {
        writeln!(out, "{}", agent::cancelled_note(&wp))?;
    }
    Ok(exit::OK)
}

/// Even without a deadline the CLI looks again every minute, in case an event was lost.
const LOOK_AGAIN: Duration = Duration::from_secs(60);

fn wake_on_change(
    dir: &std::path::Path,
) -> anyhow::Result<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
    Ok(agent::wake_on_change(dir)?)
}

fn wait_for_change(rx: &mpsc::Receiver<()>, deadline: Option<Instant>) -> bool {
    agent::wait_for_change(rx, deadline, LOOK_AGAIN)
}

fn deadline_of(timeout: Option<f64>) -> anyhow::Result<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            Ok(Some(Instant::now() + Duration::from_secs_f64(t)))
        }
        Some(t) => {
            Err(Error::Usage(format!("--timeout must be 0 or more seconds, not {t}")).into())
        }
    }
}

fn print_wake(out: &mut impl Write, wake: &Wake, json: bool, compact: bool) -> anyhow::Result<()> {
    if json && compact {
        serde_json::to_writer(&mut *out, wake)?;
        writeln!(out)?;
    } else if json {
        print_json(out, wake)?;
    } else {
        writeln!(
            out,
            "── wake {} ({}) at {}",
            wake.wake_id,
            wake.kind.as_str(),
            wake.created_at
        )?;
        write!(out, "{}", wake.text)?;
    }
    out.flush()?;
    Ok(())
}

fn next(engine: &Engine, a: NextArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let channel = a.channel.unwrap_or(a.session.session);
    let deadline = deadline_of(a.timeout)?;
    let inbox = agent::Inbox::open(engine.home(), &channel)?;
    loop {
        match inbox.take(deadline, LOOK_AGAIN, &|| false)? {
            Some(wake) => print_wake(out, &wake, a.json, a.follow)?,
            None => return Ok(exit::TIMED_OUT),
        }
        if !a.follow {
            return Ok(exit::OK);
        }
    }
}

fn wait(engine: &Engine, a: WaitArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let deadline = deadline_of(a.timeout)?;
    let dir = engine.home().waitpoint_dir(&a.id);
    engine.load_visible(&a.id, None)?;
    let (_watcher, rx) = wake_on_change(&dir)?;
    loop {
        let wp = engine.load_visible(&a.id, None)?;
        // Done means closed *and* its wake is in the inbox, so `wait && next` never races.
        let code = match (wp.status, wp.outcome) {
            (Status::Armed, _) => None,
            _ if !wp.outbox.is_empty() || wp.pending_wake.is_some() => None,
            (Status::Resolved, Some(Outcome::Fail)) => Some(exit::RESOLVED_FAIL),
            (Status::Resolved, _) => Some(exit::OK),
            (Status::Expired, _) => Some(exit::EXPIRED),
            (Status::Cancelled, _) => Some(exit::CANCELLED),
        };
        if let Some(code) = code {
            if a.json {
                print_json(out, &render::public_view(&wp))?;
            } else {
                let how = match wp.outcome {
                    Some(Outcome::Ok) => " ok",
                    Some(Outcome::Fail) => " with a failure",
                    None => "",
                };
                writeln!(out, "{} {}{how}", wp.id, wp.status.as_str())?;
            }
            return Ok(code);
        }
        if !wait_for_change(&rx, deadline) {
            if !a.json {
                writeln!(out, "{} still armed; gave up waiting", wp.id)?;
            }
            return Ok(exit::TIMED_OUT);
        }
    }
}
