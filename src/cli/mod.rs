//! Command-line front ends. Only this module knows clap, argv and the process environment: it
//! resolves them into a [`Home`], [`Settings`] and validated requests before calling the library.
//! This file holds the command line (`Cli`, its dispatch) and what the command files share; each
//! command or group of commands is a file of its own, and none reaches into a sibling.

pub mod adapter;
pub mod callback;
pub mod completions;
pub mod daemon;
pub mod device;
pub mod doctor;
mod environment;
mod hints;
pub mod job;
mod logging;
pub mod man;
pub mod mcp;
mod progress;
mod sending;
pub mod setup;
pub mod signal;
pub mod timer;
pub mod transfer;
pub mod ui;
pub mod waitpoint;

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::clock::{Clock, SystemClock};
use crate::engine::Engine;
use crate::error::{exit_code_for, is_broken_pipe};

use crate::home::Home;
use crate::settings::Settings;
pub(crate) use environment::line_context;
pub use environment::{
    default_home_root, default_session, env_var, harness_caller, home_dir, is_implicit_default,
    load_settings, login_name, resolve_home, ssh_options, webhook_port_env,
};
pub use hints::field_hint;
pub use logging::{LogFormat, init_logging};
pub use sending::{SignalTarget, judge_locally, require_id_secret, send, send_as};

/// The `waitpoint` command's clap definition (man pages and completions are made from it).
pub fn waitpoint_command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// The `cortex-signal` command's clap definition.
pub fn cortex_signal_command() -> clap::Command {
    <signal::SignalArgs as clap::CommandFactory>::command()
}

/// The drain's progress bar, for the daemon command.
pub use progress::DrainBar;
/// Stderr written around the drain's progress bar, for the log layer.
use progress::Stderr as LogStderr;

/// Maps a command's result to the process exit code, printing the error chain on stderr.
/// A closed stdout is not an error.
pub fn finish(program: &str, result: anyhow::Result<u8>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => ExitCode::from(report(program, &e)),
    }
}

/// Prints `e` as `program: …` on stderr (its chain, each cause once, and the flag behind a
/// refused field) and returns its exit code.
fn report(program: &str, e: &anyhow::Error) -> u8 {
    let hint = e
        .chain()
        .find_map(|e| match e.downcast_ref::<crate::error::Error>() {
            Some(crate::error::Error::Invalid { field, .. }) => field_hint(field),
            _ => None,
        })
        .map(|flag| format!(" (the flag {flag})"))
        .unwrap_or_default();
    // The chain, each cause once: an error whose text already quotes its source (ours do:
    // "cannot open PATH: No such file") would otherwise say it twice.
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{program}: {text}{hint}");
    exit_code_for(e)
}

/// Parses argv with clap. On `--help`/`--version` or a usage error, clap's message is printed and
/// the exit code to use is returned (0 for help and version, 2 for usage errors).
pub fn parse_args<T: clap::Parser>(argv: Vec<OsString>) -> Result<T, ExitCode> {
    T::try_parse_from(argv).map_err(|e| {
        let _ = e.print();
        ExitCode::from(match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                crate::error::exit::OK
            }
            _ => crate::error::exit::USAGE,
        })
    })
}

/// Arms the failpoints named in `FAILPOINTS` (builds with the `failpoints` feature only; see
/// `crate::failpoint`). They stay armed for the life of the process.
pub fn setup_failpoints() {
    #[cfg(feature = "failpoints")]
    std::mem::forget(fail::FailScenario::setup());
}

/// argv as clap sees it (kept here so tests could inject it).
pub fn args() -> Vec<OsString> {
    std::env::args_os().collect()
}

/// The session a command acts for (`--session`, `$CORTEX_SESSION`), shared by the command groups.
#[derive(Debug, clap::Args)]
pub struct SessionArg {
    /// The session acting [default: $CORTEX_SESSION, else the harness's session when run inside
    /// one (Claude Code: claude-$CLAUDE_CODE_SESSION_ID; Gemini CLI: the session recorded for
    /// its process), else "default"]
    #[arg(
        long,
        value_name = "S",
        env = "CORTEX_SESSION",
        default_value_t = default_session(),
        hide_default_value = true,
        hide_env_values = true
    )]
    pub session: String,
}

/// The owning agent of a timer or callback. The spec's operator CLI names it `--agent`; a
/// session is the spec's agent, so `--session` is the same flag.
#[derive(Debug, clap::Args)]
pub struct AgentArg {
    /// The agent (session) acting [default: $CORTEX_SESSION, else the harness's session when
    /// run inside one, else "default"]
    #[arg(
        long = "agent",
        visible_alias = "session",
        value_name = "ID",
        env = "CORTEX_SESSION",
        default_value_t = default_session(),
        hide_default_value = true,
        hide_env = true
    )]
    pub session: String,
}

/// SIGTERM, SIGINT and SIGHUP turned into an [`crate::inbox::Interrupt`] for a reader of wakes, so
/// one stopped with a wake in hand hands it over (or gives it back) before it exits, instead of
/// dying with it taken.
pub fn interrupt_on_stop_signals() -> anyhow::Result<crate::inbox::Interrupt> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let interrupt = crate::inbox::Interrupt::default();
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    let raised = interrupt.clone();
    std::thread::Builder::new()
        .name("stop-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                raised.raise(signal);
            }
        })?;
    Ok(interrupt)
}

/// Prints `v` as pretty JSON and a newline: every command's `--json` output.
pub fn print_json(
    out: &mut (impl Write + ?Sized),
    v: &impl serde::Serialize,
) -> anyhow::Result<()> {
    // The text spells hidden characters as JSON escapes: a program reads the same values, and
    // a terminal shows no raw separator or bidi override from a sender.
    let text = serde_json::to_string_pretty(v)?;
    writeln!(out, "{}", crate::escape::json_text(&text))?;
    Ok(())
}

/// Entry point of the `waitpoint` binary.
pub fn main() -> ExitCode {
    setup_failpoints();
    let cli: Cli = match parse_args(args()) {
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
    let home = resolve_home(home_flag);
    init_logging(
        log_format.is_some().then_some(&home),
        log_format.unwrap_or_default(),
    );
    let claude_hook = matches!(
        &cli.command,
        Command::Adapter(adapter::AdapterCommand::ClaudeHook(_))
    );
    let result = run(home, cli.store.as_deref(), cli.command);
    match result {
        // Exit 2 is how Claude Code's `asyncRewake` hook wakes the session, its stderr the
        // model's next input: the hook's own error (a bad settings file, say) must never read
        // as a wake.
        Err(e) if claude_hook && !is_broken_pipe(&e) => {
            let code = report("waitpoint", &e);
            ExitCode::from(if code == adapter::CLAUDE_REWAKE {
                crate::error::exit::FAILURE
            } else {
                code
            })
        }
        result => finish("waitpoint", result),
    }
}

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
    /// Where waitpoints live: `files` (the home, the default) or `etcd://HOST:PORT,…[/PREFIX]`,
    /// a cluster several hosts share (builds with the `etcd` feature) [default: the `store`
    /// key of settings.json, else $CORTEX_STORE, else files]
    #[arg(long, global = true, value_name = "URL")]
    pub store: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Arm a waitpoint and print its secret and ready-to-paste signal lines
    Create(waitpoint::CreateArgs),
    /// List what a session is waiting on
    Check(waitpoint::CheckArgs),
    /// Show one waitpoint in full: intent, progress, every signal
    Show(waitpoint::ShowArgs),
    /// Disarm a waitpoint (stops the waiting, not the job)
    Cancel(waitpoint::CancelArgs),
    /// Print the next wake of a session's channel and mark it read
    Next(waitpoint::NextArgs),
    /// Mark a wake read: an onWake command that delivered the wake itself says so
    ///
    /// For an `onWake` command of your own that hands the wake to a harness by its own means
    /// (an HTTP API, a message queue): run `waitpoint ack` once the harness has it, and no
    /// waiter or adapter delivers it again. The daemon gives every onWake command
    /// $WAITPOINT_WAKE_ID and $WAITPOINT_CHANNEL, which are the defaults here. Exit 0 when the
    /// wake is now read (or was already); 3 when the session has no such wake.
    Ack(waitpoint::AckArgs),
    /// Block until a waitpoint resolves, expires or is cancelled
    Wait(waitpoint::WaitArgs),
    /// A live view of `check` that redraws whenever something changes
    Watch(waitpoint::WatchArgs),
    /// List the sessions: a hollow ring on those waiting on a machine, the capsule, unread wakes
    Sessions(waitpoint::SessionsArgs),
    /// Manage sessions
    #[command(subcommand)]
    Session(waitpoint::SessionCommand),
    /// Replace a waitpoint's secret: the old one is refused from now on
    ///
    /// The new secret is committed before it is printed, and only its hash is kept: a reset
    /// killed between the two leaves a secret nobody saw and the old one refused. Run it again.
    ResetSecret(waitpoint::ResetSecretArgs),
    /// Durable timers: wakes after a delay, optionally repeating
    ///
    /// `waitpoint timer --after-ms N [--every-ms N] [--summary TEXT]`, without a subcommand, is
    /// the legacy form of `timer create` and does the same.
    Timer(timer::TimerArgs),
    /// Callback capability URLs for senders that can only POST
    #[command(subcommand)]
    Callback(callback::CallbackCommand),
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
    Daemon(daemon::DaemonArgs),
    /// Manage the devices whose spools the daemon collects over SSH
    Device(device::DeviceArgs),
    /// Serve the agent tools over the Model Context Protocol on stdin and stdout
    ///
    /// For an agent harness to start as an MCP server (`claude mcp add waitpoint -- waitpoint
    /// mcp`): the tools wait_create, wait_check, wait_cancel, wait_next, CreateTimer,
    /// ListTimers, GetTimer, CancelTimer, CreateExternalTrigger and CancelExternalTrigger, acting
    /// for the harness's own session (Claude Code's session, each Codex thread, the OpenCode
    /// session its plugin names in each call's harness_session argument) unless --session or
    /// $CORTEX_SESSION names one. It needs no running daemon; without one, signals wait in the
    /// spool and wakes come once `waitpoint daemon` runs. Only the protocol is written to stdout;
    /// warnings go to stderr. It exits 0 when the client closes stdin.
    Mcp(mcp::McpArgs),
    /// Configure an agent harness for waitpoints: its MCP server, hooks and status line
    ///
    /// Writes into the harness's files (the user's with --user, the default; the project's with
    /// --project) the MCP server entry (`waitpoint mcp`), the hooks that wake a live session
    /// (Claude Code: SessionStart, Stop and SessionEnd; Codex: Stop; Gemini CLI: SessionStart,
    /// AfterAgent and SessionEnd, with its MCP server trusted), Claude Code's status line
    /// (the capsule), and into the home's settings the onWake that resumes a closed session
    /// (`waitpoint adapter resume`), each running waitpoint by its full path (the daemon's PATH
    /// is not the shell's). What is there is kept byte for byte: other servers and hooks, a
    /// status line or onWake of your own (said, not replaced), numbers as written, TOML
    /// comments, each file's mode. A file it cannot merge without losing something (a key twice,
    /// hooks of another shape) is refused with the reason, and then nothing is written. In a
    /// project and in the home no link is followed and only regular files are opened; in the
    /// user's files a link is followed, and said, only to the user's own regular file. A file
    /// that changes while setup writes it (a running harness) is merged again; a change is
    /// printed once it is read back from disk. Running it again changes nothing; --dry-run
    /// writes nothing.
    Setup(setup::SetupArgs),
    /// Wake adapters: hand a session's wakes to an agent harness (hooks, onWake resumes)
    ///
    /// One-line commands for a harness's configuration. Hooks block on the session's next wake
    /// and give its text to a live session (claude-hook for Claude Code's asyncRewake hooks,
    /// codex-stop-hook for Codex's Stop hook, gemini-hook for Gemini CLI's AfterAgent hook;
    /// opencode-waiter for OpenCode's plugin, which acks what it handed over); resumes run as
    /// the daemon's onWake command and resume a closed session with the wake as its prompt
    /// (claude-resume, codex-resume, gemini-resume; resume for whichever harness). A
    /// wake is marked read only when the harness took it; a failure leaves it unread, and the
    /// daemon retries an onWake command. Run as an onWake command, the home is
    /// $WAITPOINT_HOME unless --home says otherwise.
    #[command(subcommand)]
    Adapter(adapter::AdapterCommand),
    /// Run a command, pass its output through, and signal its exit code and output tail
    ///
    /// Like `COMMAND; cortex-signal --exit-code $? --data <tail>`: the waitpoint gets ok for exit
    /// 0 and fail otherwise, the message `exit=N`, and the last lines of standard output and
    /// error as data. The id and secret are checked before the command starts. The exit status
    /// is the command's own: 128+N when signal N killed it, 127 when it cannot be found and 126
    /// when it cannot be run. A failure to signal is reported on stderr and does not change it.
    Run(job::RunArgs),
    /// Wait for a running process to end, then signal ok
    ///
    /// The attach_to_pid shape without a sleep loop: a pidfd where the kernel has them (Linux
    /// 5.3 and later), otherwise a check every second. The exit code of a process that is not
    /// your child is not knowable, so the signal is ok with the message "pid PID exited".
    Attach(job::AttachArgs),
    /// Check the home, the daemon and the machine, one line per check with how to fix it
    ///
    /// Checks the home's ownership and modes, settings.json, the drop zone, the inotify
    /// limits, whether a daemon holds the lock (and whether a dead one left it stale), whether
    /// the daemon can start onWake's program (an executable absolute path, or a name on the
    /// running daemon's PATH, else on this shell's), the HTTP shim's address file, each device's
    /// reachability, stale *.tmp files and parked refused files. Nothing is changed. Each line
    /// starts with OK, WARN or FAIL; the exit status is 1 when any check FAILs. A FAIL of the modes
    /// is what the daemon refuses to start on (a home or settings.json other users can write);
    /// modes merely looser than private are a WARN.
    Doctor(doctor::DoctorArgs),
    /// Print the operator page's address, with a one-time login code
    ///
    /// The page (/ui/ on the daemon's HTTP shim, so it needs `waitpoint daemon --http`) lists
    /// the sessions: a hollow ring beside one that waits on a machine, and its capsule. Click a
    /// capsule for its waitpoints (intent, progress, the latest heartbeat, badges) and a cancel
    /// button, which asks first: cancelling stops the waiting, not the external job, which keeps
    /// running; open "Members and signals" for a waitpoint's member reports and newest signals
    /// with their source and time. It updates as signals arrive, without reloading. It shows at
    /// most 100 sessions and 300 waitpoints (50 a session) and says how many it leaves out
    /// (`waitpoint check --session NAME` lists them all); a change made by another command
    /// (`cancel`, `next`) shows within a minute.
    ///
    /// The address (http://127.0.0.1:PORT/ui/login?code=CODE) logs one browser in: the code
    /// works once, within 5 minutes, and a new `waitpoint ui` replaces it. Only its SHA-256 is
    /// kept, in ui-login.json under the home. The login belongs to the local user whose browser
    /// used the code (another user's programs holding its cookie get 401), and its page has an
    /// address of its own, /ui/s/PLACE/, the only one its cookie is sent to. Without a login
    /// every /ui route answers 401. When the daemon has an operator token (CORTEX_WEBHOOK_TOKEN),
    /// POSTing it to /ui/login (the form at that address) logs in too. The page fetches nothing
    /// from elsewhere and shows neither secrets nor their hashes.
    Ui(ui::UiArgs),
    /// Write every waitpoint of the store into TARGET_DIR as an ordinary home, read at one revision
    ///
    /// So `ls`, `jq`, `show` and `doctor` work on a cluster's state: `waitpoint --store
    /// etcd://… export /tmp/snapshot`, then `waitpoint --home /tmp/snapshot doctor` or
    /// `waitpoint --home /tmp/snapshot check --session S`.
    Export(transfer::ExportArgs),
    /// Copy the waitpoints of a home on this machine, with their signals, into the store
    ///
    /// For moving a single machine into a cluster: `waitpoint --store etcd://… import
    /// ~/.cortex`. Ids the store has already are left alone and listed. The source is only
    /// read, never changed: each file at most 16 MB, no link followed, every id and name
    /// checked as on arming. A waitpoint or timer with a file that fails is refused whole,
    /// listed with its reason, and the rest is imported; the exit status is then 1.
    Import(transfer::ImportArgs),
    /// Print a completion script for bash, zsh or fish
    ///
    /// For example: `waitpoint completions bash >
    /// ~/.local/share/bash-completion/completions/waitpoint`, or `--program cortex-signal` for the
    /// signal command.
    Completions(completions::CompletionsArgs),
}

/// What a command needs before it can run, so that `run` prepares exactly that much.
enum Stage {
    /// Neither settings nor a prepared home (`doctor` must see the home as it is).
    Bare(Bare),
    /// The settings first.
    Configured(Configured),
}

enum Bare {
    Run(job::RunArgs),
    Attach(job::AttachArgs),
    Doctor(doctor::DoctorArgs),
    Ui(ui::UiArgs),
    Completions(completions::CompletionsArgs),
    Setup(setup::SetupArgs),
}

// One value per process, moved once: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Configured {
    /// A process that runs until stopped, opening what it needs itself.
    Daemon(daemon::DaemonArgs),
    Mcp(mcp::McpArgs),
    /// A command on an engine of the prepared home, its journal replayed.
    Engine(EngineCommand),
}

enum EngineCommand {
    Create(waitpoint::CreateArgs),
    Check(waitpoint::CheckArgs),
    Show(waitpoint::ShowArgs),
    Cancel(waitpoint::CancelArgs),
    Next(waitpoint::NextArgs),
    Ack(waitpoint::AckArgs),
    Wait(waitpoint::WaitArgs),
    Watch(waitpoint::WatchArgs),
    Sessions(waitpoint::SessionsArgs),
    SessionDelete(waitpoint::SessionDeleteArgs),
    ResetSecret(waitpoint::ResetSecretArgs),
    Timer(timer::TimerArgs),
    Callback(callback::CallbackCommand),
    Device(device::DeviceArgs),
    Adapter(adapter::AdapterCommand),
    Export(transfer::ExportArgs),
    Import(transfer::ImportArgs),
}

impl Command {
    fn stage(self) -> Stage {
        use Configured::Engine;
        use EngineCommand as E;
        let engine = |c| Stage::Configured(Engine(c));
        match self {
            Command::Run(a) => Stage::Bare(Bare::Run(a)),
            Command::Attach(a) => Stage::Bare(Bare::Attach(a)),
            Command::Doctor(a) => Stage::Bare(Bare::Doctor(a)),
            Command::Ui(a) => Stage::Bare(Bare::Ui(a)),
            Command::Completions(a) => Stage::Bare(Bare::Completions(a)),
            Command::Setup(a) => Stage::Bare(Bare::Setup(a)),
            Command::Daemon(a) => Stage::Configured(Configured::Daemon(a)),
            Command::Mcp(a) => Stage::Configured(Configured::Mcp(a)),
            Command::Create(a) => engine(E::Create(a)),
            Command::Check(a) => engine(E::Check(a)),
            Command::Show(a) => engine(E::Show(a)),
            Command::Cancel(a) => engine(E::Cancel(a)),
            Command::Next(a) => engine(E::Next(a)),
            Command::Ack(a) => engine(E::Ack(a)),
            Command::Wait(a) => engine(E::Wait(a)),
            Command::Watch(a) => engine(E::Watch(a)),
            Command::Sessions(a) | Command::Session(waitpoint::SessionCommand::List(a)) => {
                engine(E::Sessions(a))
            }
            Command::Session(waitpoint::SessionCommand::Delete(a)) => engine(E::SessionDelete(a)),
            Command::ResetSecret(a) => engine(E::ResetSecret(a)),
            Command::Timer(a) => engine(E::Timer(a)),
            Command::Callback(a) => engine(E::Callback(a)),
            Command::Device(a) => engine(E::Device(a)),
            Command::Adapter(a) => engine(E::Adapter(a)),
            Command::Export(a) => engine(E::Export(a)),
            Command::Import(a) => engine(E::Import(a)),
        }
    }
}

fn run(home: Home, store: Option<&str>, command: Command) -> anyhow::Result<u8> {
    let command = match command.stage() {
        Stage::Bare(bare) => return run_bare(&home, store, bare),
        Stage::Configured(command) => command,
    };
    let mut settings = match (load_settings(&home), &command) {
        (Ok(s), _) => s,
        // A harness shows a server that exits as dead, with the reason out of sight: the MCP
        // server serves instead and answers every call with what is wrong.
        (Err(e), Configured::Mcp(a)) => {
            let broken = format!("{e}; fix it, then restart the MCP server");
            tracing::error!(
                error = %e,
                "the settings cannot be loaded; fix them, then restart the MCP server"
            );
            return mcp::serve(home, store, Settings::default(), a, Some(broken));
        }
        (Err(e), _) => return Err(e.into()),
    };
    if let Some(url) = store {
        settings.store = crate::settings::location::Location::parse(url)
            .map_err(|e| crate::error::Error::Usage(format!("--store: {e}")))?;
    }
    match command {
        Configured::Daemon(a) => {
            let http = daemon::http_config(&a, &settings)?;
            daemon::run(home, settings, http)
        }
        Configured::Mcp(a) => mcp::serve(home, None, settings, &a, None),
        Configured::Engine(command) => run_on_engine(home, settings, command),
    }
}

fn run_bare(home: &Home, store: Option<&str>, command: Bare) -> anyhow::Result<u8> {
    match command {
        Bare::Run(a) => job::run(home, a),
        Bare::Attach(a) => job::attach(home, a),
        Bare::Doctor(a) => doctor::run(home, store, a),
        Bare::Ui(a) => ui::run(home, a, &mut io::stdout().lock()),
        Bare::Completions(a) => completions::run(a),
        Bare::Setup(a) => setup::run(home, a, &mut io::stdout().lock()),
    }
}

fn run_on_engine(home: Home, settings: Settings, command: EngineCommand) -> anyhow::Result<u8> {
    use EngineCommand as C;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    home.ensure()?;
    let engine = Engine::open(home, settings, clock, crate::store::Role::Command)?;
    // Before reading or changing any state: what a dead daemon left in the journal.
    engine.replay_left_journal()?;
    let mut out = io::stdout().lock();
    match command {
        C::Create(a) => waitpoint::create(&engine, a, &mut out),
        C::Check(a) => waitpoint::check(&engine, a, &mut out),
        C::Show(a) => waitpoint::show(&engine, a, &mut out),
        C::Cancel(a) => waitpoint::cancel(&engine, a, &mut out),
        C::Next(a) => waitpoint::next(&engine, a, &mut out),
        C::Ack(a) => waitpoint::ack(&engine, a, &mut out),
        C::Wait(a) => waitpoint::wait(&engine, a, &mut out),
        C::Watch(a) => waitpoint::watch(&engine, a, &mut out),
        C::Sessions(a) => waitpoint::sessions(&engine, a, &mut out),
        C::SessionDelete(a) => waitpoint::session_delete(&engine, a, &mut out),
        C::ResetSecret(a) => {
            let created = engine.reset_secret(&a.id, &a.session.session)?;
            waitpoint::print_created(&engine, &created, a.print, a.json, &mut out)
        }
        C::Timer(args) => timer::run_timer(&engine, args.into_command(), &mut out),
        C::Adapter(cmd) => {
            // The Codex hook writes its reply to stdout itself.
            drop(out);
            adapter::run(&engine, cmd)
        }
        C::Callback(cmd) => callback::run_callback(
            &engine,
            cmd,
            line_context(engine.home())?.fallback_port,
            &mut out,
        ),
        C::Export(a) => transfer::export(&engine, a, &mut out),
        C::Import(a) => transfer::import(&engine, a, &mut out),
        C::Device(a) => device::run(
            &engine,
            a,
            &home_dir(),
            login_name(),
            &ssh_options(),
            &mut out,
        ),
    }
}
