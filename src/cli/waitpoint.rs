//! The `waitpoint` commands about waitpoints themselves: create, check, show, cancel, next,
//! wait, watch, session delete and reset-secret. Clap types end here; the library sees
//! validated requests. The command line itself (`Cli`) and its dispatch are in `cli/mod.rs`.

use std::io::{self, IsTerminal, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use notify::RecursiveMode;
use serde_json::{Value, json};

use crate::agent_view;
use crate::engine::{self, CreateRequest, Engine, Quorum};
use crate::error::{Error, exit};
use crate::records::{Outcome, Status, Waitpoint, Wake};

use super::{SessionArg, print_json};
use crate::operator_view;
use crate::sync::MutexExt;

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// List the sessions: a hollow ring on those waiting on a machine, the capsule, unread
    /// wakes (the same as `waitpoint sessions`)
    List(SessionsArgs),
    /// Delete a session: cancel its armed waitpoints (a late signal cannot bring it back) and
    /// remove its inbox
    ///
    /// Its timers are cancelled and its callbacks revoked too. The session leaves the session
    /// lists (`waitpoint sessions`, the page) at once, though its cancelled waitpoints are kept
    /// three days (`index/deleted/<session>.json` says when it was deleted); a waitpoint armed
    /// in it later brings it back.
    Delete(SessionDeleteArgs),
}

#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// Print JSON: one object per session
    #[arg(long)]
    pub json: bool,
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
    /// A job that will report (repeat for each); once set, every signal must name one. At most 64
    /// characters, none of them a control or invisible one (a line separator, a bidi control)
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
    /// If no signal at all (progress included) has arrived this long after arming, send one
    /// early wake saying so (the waitpoint stays armed): 10m, 1h30m, 90s
    #[arg(long, value_name = "DURATION", value_parser = crate::clock::parse_duration)]
    pub started_within: Option<u64>,
    /// After the first signal, wake when no further report arrives within this window; a later
    /// report re-arms it (pair with `waitpoint run --heartbeat`): 10m, 1h
    #[arg(long, value_name = "DURATION", value_parser = crate::clock::parse_duration)]
    pub heartbeat_within: Option<u64>,
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
    /// Do not ask first (only a terminal is asked; a script or a pipe never is)
    #[arg(long, short = 'y')]
    pub yes: bool,
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
pub struct AckArgs {
    /// The wake's id
    #[arg(value_name = "WAKE_ID", env = "WAITPOINT_WAKE_ID", hide_env = true)]
    pub wake_id: String,
    /// The session (channel) whose inbox holds it [default: $WAITPOINT_CHANNEL, else the
    /// session]. Inside a harness session, only that session's own wakes (and the wake an
    /// onWake command was handed) can be marked read; another session's only from a shell
    /// outside any harness
    #[arg(long, value_name = "C", env = "WAITPOINT_CHANNEL", hide_env = true)]
    pub channel: Option<String>,
    #[command(flatten)]
    pub session: SessionArg,
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

fn parse_quorum(q: &str) -> anyhow::Result<Quorum> {
    if q == "all" {
        return Ok(Quorum::All);
    }
    q.parse::<u32>().map(Quorum::Count).map_err(|_| {
        Error::invalid("quorum", format!("must be a number or \"all\", not {q:?}")).into()
    })
}

pub(super) fn create(engine: &Engine, a: CreateArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let quorum = a.quorum.as_deref().map(parse_quorum).transpose()?;
    let session = a.session.session;
    let channel = a.channel.unwrap_or_else(|| session.clone());
    let created = agent_view::create(
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
            started_within_ms: a.started_within,
            heartbeat_within_ms: a.heartbeat_within,
        },
    )?;
    print_created(engine, &created, a.print, a.json, out)
}

/// Prints a `wait_create` reply (also used by `reset-secret`, whose reply has the same shape).
pub(super) fn print_created(
    engine: &Engine,
    created: &engine::Created,
    print: Option<PrintField>,
    json_out: bool,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let lines = agent_view::how_to_signal(engine, created, super::line_context(engine.home())?)?;
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
        print_json(out, &agent_view::created_reply(created, &lines))?;
        return Ok(exit::OK);
    }
    let now = engine.now();
    writeln!(out, "armed {}  {:?}", wp.id, wp.label)?;
    writeln!(
        out,
        "  session {} · channel {} · {} · expires {} ({})",
        wp.session,
        wp.channel,
        operator_view::progress(wp),
        wp.expires_at,
        operator_view::time_left(wp.expires_at, now)
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

pub(super) fn check(engine: &Engine, a: CheckArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let session = a.session.session;
    let items = agent_view::waiting_for(engine, &session)?;
    let devices = devices_to_mention(engine, &items)?;
    if a.json {
        let mut reply = agent_view::check(engine, &session, &items)?;
        if !devices.is_empty() {
            let d: Vec<Value> = devices
                .iter()
                .map(|d| {
                    operator_view::device_view(
                        d,
                        &crate::ingress::device::load_status(engine.home(), &d.name)
                            .unwrap_or_default(),
                    )
                })
                .collect();
            reply["devices"] = json!(d);
        }
        print_json(out, &reply)?;
        return Ok(exit::OK);
    }
    let now = engine.now();
    let mut rows = agent_view::check_rows(engine, &items)?;
    if !a.brief {
        agent_view::add_refusals(&mut rows, &agent_view::refused_counts(engine.home())?);
    }
    if a.brief {
        write!(out, "{}", operator_view::check_brief(&rows))?;
    } else {
        for d in &devices {
            let st = crate::ingress::device::load_status(engine.home(), &d.name)?;
            if st.reachable == Some(false) {
                writeln!(
                    out,
                    "device {} is unreachable ({}); its files wait there",
                    d.name,
                    operator_view::device_detail(&st, now)
                )?;
            }
        }
        write!(
            out,
            "{}",
            operator_view::check_table(&session, &rows, terminal_style())
        )?;
    }
    Ok(exit::OK)
}

/// `waitpoint sessions`: one line per session the home knows of.
pub(super) fn sessions(
    engine: &Engine,
    a: SessionsArgs,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let lines = agent_view::sessions(engine)?;
    if a.json {
        print_json(out, &lines)?;
        return Ok(exit::OK);
    }
    if lines.is_empty() {
        writeln!(out, "no sessions yet")?;
        return Ok(exit::OK);
    }
    let width = lines
        .iter()
        .map(|l| l.session.chars().count())
        .max()
        .unwrap_or(0);
    for l in &lines {
        let mut line = format!(
            "{} {:<width$}",
            if l.waiting { "○" } else { " " },
            operator_view::visible(&l.session)
        );
        if !l.capsule.is_empty() {
            line.push_str(&format!("  {}", l.capsule));
        }
        if l.unread_wakes > 0 {
            line.push_str(&format!("  ({} unread)", l.unread_wakes));
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(exit::OK)
}

pub(super) fn session_delete(
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
pub(super) fn watch(engine: &Engine, a: WatchArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    use std::collections::HashSet;
    use std::io::IsTerminal;
    let session = a.session.session;
    crate::request::check_name("session", &session)?;
    let home = engine.home();
    let inbox = home.inbox_new(&session);
    home.root_dir().create_dir_private(&inbox)?;
    let tty = io::stdout().is_terminal();
    let style = terminal_style();
    let (mut watcher, rx) = wake_on_change(&home.waitpoints_dir())?;
    watcher.watch(&inbox, RecursiveMode::NonRecursive)?;
    let mut watched: HashSet<String> = HashSet::new();
    let mut last = String::new();
    loop {
        let items = agent_view::waiting_for(engine, &session)?;
        for wp in &items {
            if watched.insert(wp.id.clone()) {
                // A waitpoint removed meanwhile simply stops producing events.
                let _ = watcher.watch(&home.waitpoint_dir(&wp.id), RecursiveMode::NonRecursive);
            }
        }
        let rows = agent_view::check_rows(engine, &items)?;
        let text = if a.json {
            let v = json!({ "session": session, "waiting": rows });
            format!("{}\n", crate::escape::json(&v))
        } else {
            operator_view::check_table(&session, &rows, style)
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
fn terminal_style() -> operator_view::Style {
    use std::io::IsTerminal;
    operator_view::Style {
        color: io::stdout().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
    }
}

pub(super) fn show(engine: &Engine, a: ShowArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let wp = engine.load_visible(&a.id, None)?;
    let signals = engine.known_signals(&wp)?;
    let now = engine.now();
    let badges = operator_view::badges(
        engine.home(),
        &wp,
        engine.settings().max_wakes_per_hour,
        now,
    );
    if a.json {
        print_json(out, &operator_view::show_json(&wp, &signals, &badges))?;
    } else {
        write!(
            out,
            "{}",
            operator_view::show_text(&wp, &signals, &badges, now)
        )?;
    }
    Ok(exit::OK)
}

pub(super) fn cancel(engine: &Engine, a: CancelArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    use std::io::IsTerminal;
    // Only a person at a terminal is asked: a script, a pipe and the agent's tool are not.
    if !a.yes && io::stdin().is_terminal() && io::stderr().is_terminal() {
        let wp = engine.load_visible(&a.id, Some(&a.session.session))?;
        if wp.status == Status::Armed && !confirm_cancel(&wp)? {
            writeln!(out, "{} left armed", wp.id)?;
            return Ok(exit::OK);
        }
    }
    let wp = engine.cancel(&a.id, &a.session.session)?;
    if a.json {
        print_json(out, &operator_view::public_view(&wp))?;
    } else {
        writeln!(out, "{}", agent_view::cancelled_note(&wp))?;
    }
    Ok(exit::OK)
}

/// Asks on the terminal whether to cancel; only `y` or `yes` says so.
fn confirm_cancel(wp: &Waitpoint) -> anyhow::Result<bool> {
    let mut err = io::stderr().lock();
    write!(
        err,
        "Cancel {} {:?}? This stops the waiting, not the job: it keeps running. [y/N] ",
        wp.id,
        operator_view::visible(&wp.label).as_ref()
    )?;
    err.flush()?;
    let mut answer = String::new();
    io::stdin().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// Even without a deadline the CLI looks again every minute, in case an event was lost.
const LOOK_AGAIN: Duration = Duration::from_secs(60);

fn wake_on_change(
    dir: &std::path::Path,
) -> anyhow::Result<(crate::inbox::DirWatch, mpsc::Receiver<()>)> {
    Ok(crate::inbox::wake_on_change(dir)?)
}

/// Told when waitpoint `id` may have changed: its directory's events on the home's files; the
/// store's own watch on a store shared by several hosts, where the home holds no waitpoints.
fn watch_waitpoint(
    engine: &Engine,
    id: &str,
) -> anyhow::Result<(crate::store::Guard, mpsc::Receiver<()>)> {
    if engine.store().host().is_none() {
        let (watcher, rx) = wake_on_change(&engine.home().waitpoint_dir(id))?;
        return Ok((crate::store::Guard::new(watcher), rx));
    }
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let id = id.to_owned();
    let guard = engine.store().watch(Box::new(move |hint| {
        let ours = match &hint {
            crate::store::Hint::Changed(changed) => *changed == id,
            crate::store::Hint::Resync => true,
            _ => false,
        };
        if ours {
            let _ = tx.lock_or_recover().send(());
        }
    }))?;
    Ok((guard, rx))
}

fn wait_for_change(rx: &mpsc::Receiver<()>, deadline: Option<Instant>) -> bool {
    crate::inbox::wait_for_change(rx, deadline, LOOK_AGAIN)
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
        let text = serde_json::to_string(wake)?;
        writeln!(out, "{}", crate::escape::json_text(&text))?;
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
        write!(out, "{}", operator_view::visible_text(&wake.text))?;
    }
    out.flush()?;
    Ok(())
}

pub(super) fn next(engine: &Engine, a: NextArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let channel = a.channel.unwrap_or(a.session.session);
    let deadline = deadline_of(a.timeout)?;
    // A stop signal between taking a wake and printing it must not lose it: the wake in hand
    // is printed, then the command ends as the signal asked (128 + its number).
    let interrupt = super::interrupt_on_stop_signals()?;
    let inbox = crate::inbox::Inbox::open(engine.home(), &channel)?;
    interrupt.wake(inbox.poker());
    // Without a timeout this may block for days: someone at a terminal is told what for, and
    // how to stop (a script reading stdout is not).
    if a.timeout.is_none()
        && std::io::stderr().is_terminal()
        && crate::delivery::unread(engine.home(), &channel)?.is_empty()
    {
        let what = if a.follow { "wakes" } else { "the next wake" };
        eprintln!("waiting for {what} on channel {channel} (Ctrl-C to stop)");
    }
    let stopped = || interrupt.raised().map(|s| 128 + s as u8);
    loop {
        match inbox.take(deadline, LOOK_AGAIN, &|| interrupt.raised().is_some())? {
            Some(wake) => {
                if let Err(e) = print_wake(out, &wake, a.json, a.follow) {
                    crate::harness::wake::give_back(engine.home(), std::slice::from_ref(&wake));
                    return Err(e.context("cannot print the wake; it stays unread"));
                }
            }
            None => return Ok(stopped().unwrap_or(exit::TIMED_OUT)),
        }
        if let Some(code) = stopped() {
            return Ok(code);
        }
        if !a.follow {
            return Ok(exit::OK);
        }
    }
}

pub(super) fn ack(engine: &Engine, a: AckArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let own = a.session.session;
    let channel = a.channel.unwrap_or_else(|| own.clone());
    crate::request::check_name("channel", &channel)?;
    // An agent's shell acts for its own session: marking another session's wake read would
    // hide it from the agent it was for. This guards against a mistake, not an attacker (any
    // process of the user can move the files); the operator's shell, outside any harness, may,
    // and so may an onWake command for the wake it was handed.
    let env = super::env_var;
    let handed = env("WAITPOINT_CHANNEL").as_deref() == Some(channel.as_str())
        && env("WAITPOINT_WAKE_ID").as_deref() == Some(a.wake_id.as_str());
    if channel != own
        && !handed
        && let Some(caller) = super::harness_caller()
    {
        return Err(Error::Usage(format!(
            "this shell runs inside the harness session {}, acting for session {own}: it marks \
read only {own}'s wakes, not {channel}'s; run `waitpoint ack --channel {channel} {}` from a \
shell outside any harness session",
            caller.session(),
            a.wake_id
        ))
        .into());
    }
    let home = engine.home();
    if crate::delivery::mark_read(home, &channel, &a.wake_id)? {
        writeln!(out, "{} marked read", a.wake_id)?;
    } else if crate::delivery::read_delivered(home, &channel, &a.wake_id)?.is_some() {
        writeln!(out, "{} was read already", a.wake_id)?;
    } else {
        return Err(
            Error::not_found("wake", &format!("{} in session {channel}", a.wake_id)).into(),
        );
    }
    Ok(exit::OK)
}

pub(super) fn wait(engine: &Engine, a: WaitArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let deadline = deadline_of(a.timeout)?;
    engine.load_visible(&a.id, None)?;
    let (_watcher, rx) = watch_waitpoint(engine, &a.id)?;
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
                print_json(out, &operator_view::public_view(&wp))?;
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
                // Closed but its wake not in the inbox yet is not "still armed".
                match wp.status {
                    Status::Armed => writeln!(out, "{} still armed; gave up waiting", wp.id)?,
                    other => writeln!(
                        out,
                        "{} {} but its wake is not delivered yet; gave up waiting",
                        wp.id,
                        other.as_str()
                    )?,
                }
            }
            return Ok(exit::TIMED_OUT);
        }
    }
}
