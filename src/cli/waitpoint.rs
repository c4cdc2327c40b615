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

use crate::clock::{Clock, SystemClock, Timestamp, human_duration};
use crate::daemon::{Daemon, DaemonConfig};
use crate::delivery;
use crate::engine::{self, CreateRequest, Engine, Quorum};
use crate::error::{Error, exit};
use crate::home::Home;
use crate::howto;
use crate::ingress::http::{self, HttpConfig};
use crate::model::{Outcome, Status, Waitpoint, Wake};
use crate::settings::Settings;

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
    /// Run the collector, sweeper and delivery in the foreground
    Daemon(DaemonArgs),
}

#[derive(Debug, Args)]
pub struct SessionArg {
    /// The session acting [default: $CORTEX_SESSION, else "default"]
    #[arg(
        long,
        value_name = "S",
        env = "CORTEX_SESSION",
        default_value = "default"
    )]
    pub session: String,
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
    /// Deadline in hours, fractions allowed (0.01 is 36 s) [default: waitpointTtlMs, 168; max 720]
    #[arg(long, value_name = "H")]
    pub expires_in_hours: Option<f64>,
    /// The device the job runs on, so its signal files are collected there
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    #[command(flatten)]
    pub session: SessionArg,
    /// The channel its wakes go to [default: the session]
    #[arg(long, value_name = "C")]
    pub channel: Option<String>,
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
    #[arg(long)]
    pub json: bool,
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
    let cli: Cli = match super::parse_args(super::args()) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let is_daemon = matches!(cli.command, Command::Daemon(_));
    let home = super::resolve_home(cli.home);
    super::init_logging(is_daemon.then_some(&home));
    super::finish("waitpoint", run(home, cli.command))
}

fn run(home: Home, command: Command) -> anyhow::Result<u8> {
    let settings = super::load_settings(&home)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    if let Command::Daemon(a) = command {
        let http = http_config(&a, &settings)?;
        // Before any thread exists, so every thread inherits the mask and only the waiter
        // below ever sees SIGTERM or SIGINT.
        let signals = super::block_termination_signals();
        let (daemon, control) = Daemon::new(
            DaemonConfig {
                home,
                settings,
                http,
            },
            clock,
        )?;
        super::stop_on_termination_signals(signals, move || control.shutdown());
        daemon.run()?;
        return Ok(exit::OK);
    }
    home.ensure()?;
    let engine = Engine::new(home, settings, clock);
    let mut out = io::stdout().lock();
    match command {
        Command::Create(a) => create(&engine, a, &mut out),
        Command::Check(a) => check(&engine, a, &mut out),
        Command::Show(a) => show(&engine, a, &mut out),
        Command::Cancel(a) => cancel(&engine, a, &mut out),
        Command::Next(a) => next(&engine, a, &mut out),
        Command::Wait(a) => wait(&engine, a, &mut out),
        Command::Daemon(_) => unreachable!("handled above"),
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
    Ok(Some(HttpConfig::new(bind, port)?))
}

fn print_json(out: &mut impl Write, v: &impl serde::Serialize) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut *out, v)?;
    writeln!(out)?;
    Ok(())
}

/// A waitpoint as commands print it: everything but the secret's hash.
pub fn public_view(wp: &Waitpoint) -> Value {
    let mut v = serde_json::to_value(wp).expect("waitpoints serialise");
    if let Some(o) = v.as_object_mut() {
        o.remove("secret_sha256");
    }
    v
}

fn parse_quorum(q: &str) -> anyhow::Result<Quorum> {
    if q == "all" {
        return Ok(Quorum::All);
    }
    q.parse::<u32>().map(Quorum::Count).map_err(|_| {
        Error::Usage(format!("--quorum must be a number or \"all\", not {q:?}")).into()
    })
}

fn create(engine: &Engine, a: CreateArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let quorum = a.quorum.as_deref().map(parse_quorum).transpose()?;
    let session = a.session.session;
    let channel = a.channel.unwrap_or_else(|| session.clone());
    let created = engine.create(CreateRequest {
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
    })?;
    let home = engine.home();
    let root = home.root().to_string_lossy().into_owned();
    let drop_zone = home.drop_zone().to_string_lossy().into_owned();
    let port = super::webhook_port_env()?.unwrap_or(http::DEFAULT_PORT);
    let lines = howto::build(
        &created.waitpoint,
        &created.secret,
        &howto::Target {
            home_override: (!super::is_implicit_default(home)).then_some(root.as_str()),
            local_drop_zone: &drop_zone,
            webhook_port: port,
        },
    );
    let wp = &created.waitpoint;
    if let Some(field) = a.print {
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
    if a.json {
        let mut v = public_view(wp);
        let o = v.as_object_mut().expect("an object");
        o.insert("secret".into(), json!(created.secret));
        o.insert("how_to_signal".into(), serde_json::to_value(&lines)?);
        print_json(out, &v)?;
        return Ok(exit::OK);
    }
    let now = engine.now();
    writeln!(out, "armed {}  {:?}", wp.id, wp.label)?;
    writeln!(
        out,
        "  session {} · channel {} · {} · expires {} ({})",
        wp.session,
        wp.channel,
        progress(wp),
        wp.expires_at,
        time_left(wp.expires_at, now)
    )?;
    writeln!(
        out,
        "  secret (shown once, stored only hashed): {}",
        created.secret
    )?;
    if let Some(note) = &lines.member_note {
        writeln!(out, "  members: {note}")?;
    }
    let recommended = if lines.recommended == "shell" {
        &lines.shell
    } else {
        &lines.cli
    };
    writeln!(
        out,
        "\nAppend to the job's command line ({}):",
        lines.recommended
    )?;
    writeln!(out, "  {recommended}")?;
    writeln!(out, "\nOther forms:")?;
    for (name, line) in [
        ("env", &lines.env),
        ("cli", &lines.cli),
        ("curl", &lines.curl),
        ("shell", &lines.shell),
        ("attach_to_pid", &lines.attach_to_pid),
    ] {
        writeln!(out, "  {name}:\n    {line}")?;
    }
    Ok(exit::OK)
}

/// `1/3 received`: terminal reports counted toward the current round's quorum.
fn progress(wp: &Waitpoint) -> String {
    if wp.max_signals > 1 {
        format!(
            "{}/{} reports · {}/{} received",
            wp.counters.wakes, wp.max_signals, wp.round.terminal, wp.quorum
        )
    } else {
        format!(
            "{}/{} received",
            wp.round.terminal.min(wp.quorum),
            wp.quorum
        )
    }
}

fn time_left(at: Timestamp, now: Timestamp) -> String {
    if at > now {
        format!("in {}", human_duration(at.millis_since(now)))
    } else {
        format!("{} ago", human_duration(now.millis_since(at)))
    }
}

/// The waitpoints `session` is waiting on: armed ones it may see, and fired or expired ones
/// whose wake it has not read yet.
fn waiting_for(engine: &Engine, session: &str) -> anyhow::Result<Vec<Waitpoint>> {
    engine::check_name("session", session)?;
    let home = engine.home();
    Ok(engine
        .list()?
        .into_iter()
        .filter(|wp| wp.visible_to(session))
        .filter(|wp| {
            wp.status == Status::Armed
                || (wp.status != Status::Cancelled && engine::has_undelivered_wake(home, wp))
        })
        .collect())
}

fn check(engine: &Engine, a: CheckArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let session = a.session.session;
    let items = waiting_for(engine, &session)?;
    if a.json {
        let v: Vec<Value> = items.iter().map(public_view).collect();
        print_json(out, &json!({ "session": session, "waiting": v }))?;
        return Ok(exit::OK);
    }
    if items.is_empty() {
        writeln!(out, "session {session} is waiting on nothing")?;
        return Ok(exit::OK);
    }
    let now = engine.now();
    writeln!(
        out,
        "{:<16} {:<24} {:<9} {:<22} DEADLINE",
        "ID", "LABEL", "STATUS", "PROGRESS"
    )?;
    for wp in &items {
        let mut badges = Vec::new();
        if wp.counters.fail > 0 {
            badges.push(format!("{} failure signal(s)", wp.counters.fail));
        }
        if wp.status != Status::Armed {
            badges.push("wake not yet read".to_owned());
        }
        writeln!(
            out,
            "{:<16} {:<24} {:<9} {:<22} {}{}",
            wp.id,
            clip(&wp.label, 24),
            wp.status.as_str(),
            progress(wp),
            if wp.status == Status::Armed {
                time_left(wp.expires_at, now)
            } else {
                "-".to_owned()
            },
            if badges.is_empty() {
                String::new()
            } else {
                format!("  [{}]", badges.join("] ["))
            }
        )?;
    }
    Ok(exit::OK)
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let head: String = s.chars().take(n - 1).collect();
        format!("{head}…")
    }
}

fn show(engine: &Engine, a: ShowArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let wp = engine.load_visible(&a.id, None)?;
    let signals = engine.read_signals(&wp.id, 1)?;
    if a.json {
        let mut v = public_view(&wp);
        v.as_object_mut()
            .expect("an object")
            .insert("signals".into(), serde_json::to_value(&signals)?);
        print_json(out, &v)?;
        return Ok(exit::OK);
    }
    let now = engine.now();
    writeln!(out, "{}  {:?}", wp.id, wp.label)?;
    writeln!(
        out,
        "  status    {}{}",
        wp.status.as_str(),
        match wp.outcome {
            Some(Outcome::Ok) => " (ok)",
            Some(Outcome::Fail) => " (fail)",
            None => "",
        }
    )?;
    writeln!(out, "  intent    {}", wp.intent)?;
    writeln!(out, "  session   {} · channel {}", wp.session, wp.channel)?;
    writeln!(out, "  progress  {}", progress(&wp))?;
    writeln!(
        out,
        "  rules     quorum {} · fail_fast {} · max_signals {}",
        wp.quorum, wp.fail_fast, wp.max_signals
    )?;
    writeln!(out, "  created   {}", wp.created_at)?;
    writeln!(
        out,
        "  deadline  {} ({})",
        wp.expires_at,
        time_left(wp.expires_at, now)
    )?;
    if let Some(d) = &wp.device {
        writeln!(out, "  device    {d}")?;
    }
    if !wp.members.is_empty() {
        writeln!(out, "  members")?;
        for m in &wp.members {
            let reports: Vec<String> = signals
                .iter()
                .filter(|s| s.member.as_deref() == Some(m))
                .map(|s| format!("{} at {}", s.status.as_str(), s.received_at))
                .collect();
            let line = if reports.is_empty() {
                "no report yet".to_owned()
            } else {
                reports.join(", ")
            };
            writeln!(out, "    {m:<16} {line}")?;
        }
    }
    writeln!(
        out,
        "  signals   {} ({} ok, {} fail, {} progress) · wakes {}",
        wp.counters.signals,
        wp.counters.ok,
        wp.counters.fail,
        wp.counters.progress,
        wp.counters.wakes
    )?;
    for s in &signals {
        writeln!(
            out,
            "    #{:<4} {:<8} {:<10} {} via {}{}",
            s.seq,
            s.status.as_str(),
            s.member.as_deref().unwrap_or("-"),
            s.received_at,
            s.source,
            s.message
                .as_ref()
                .map(|m| format!("  message: {m:?}"))
                .unwrap_or_default()
        )?;
    }
    if !wp.outbox.is_empty() {
        writeln!(out, "  pending delivery: {} wake(s)", wp.outbox.len())?;
    }
    Ok(exit::OK)
}

fn cancel(engine: &Engine, a: CancelArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let wp = engine.cancel(&a.id, &a.session.session)?;
    if a.json {
        print_json(out, &public_view(&wp))?;
    } else {
        writeln!(
            out,
            "cancelled {} {:?} (the job itself keeps running; its signal will be refused as late)",
            wp.id, wp.label
        )?;
    }
    Ok(exit::OK)
}

/// A watcher whose events only wake us up; the caller re-reads the state each time.
fn wake_on_change(
    dir: &std::path::Path,
) -> anyhow::Result<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
        let _ = tx.send(());
    })?;
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    Ok((watcher, rx))
}

/// Waits for the next change event until `deadline`; false when the deadline passed.
fn wait_for_change(rx: &mpsc::Receiver<()>, deadline: Option<Instant>) -> bool {
    // Even without a deadline we look again every minute, in case an event was lost.
    let cap = Duration::from_secs(60);
    let timeout = deadline.map_or(cap, |d| {
        d.saturating_duration_since(Instant::now()).min(cap)
    });
    let got = rx.recv_timeout(timeout).is_ok();
    while rx.try_recv().is_ok() {}
    got || deadline.is_none_or(|d| Instant::now() < d)
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
            "── wake {} ({:?}) at {}",
            wake.wake_id, wake.kind, wake.created_at
        )?;
        write!(out, "{}", wake.text)?;
    }
    out.flush()?;
    Ok(())
}

fn next(engine: &Engine, a: NextArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let channel = a.channel.unwrap_or(a.session.session);
    engine::check_name("channel", &channel)?;
    let home = engine.home();
    let dir = home.inbox_new(&channel);
    crate::store::create_dir_private(&dir)?;
    crate::store::create_dir_private(&home.inbox_cur(&channel))?;
    let deadline = deadline_of(a.timeout)?;
    // Watch before the first look, so a wake landing in between is not missed.
    let (_watcher, rx) = wake_on_change(&dir)?;
    loop {
        while let Some(wake) = delivery::take_next(home, &channel)? {
            print_wake(out, &wake, a.json, a.follow)?;
            if !a.follow {
                return Ok(exit::OK);
            }
        }
        if !wait_for_change(&rx, deadline) {
            return Ok(exit::TIMED_OUT);
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
            _ if !wp.outbox.is_empty() => None,
            (Status::Resolved, Some(Outcome::Fail)) => Some(exit::RESOLVED_FAIL),
            (Status::Resolved, _) => Some(exit::OK),
            (Status::Expired, _) => Some(exit::EXPIRED),
            (Status::Cancelled, _) => Some(exit::CANCELLED),
        };
        if let Some(code) = code {
            if a.json {
                print_json(out, &public_view(&wp))?;
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
