//! `waitpoint device …`: adding, listing, testing and polling the devices whose spools the
//! daemon collects over SSH. Clap types and rendering only; `ingress::device` does the work.
//!
//! `device poll NAME` asks a running daemon to collect now by committing `devices/<name>.poll`,
//! which the daemon watches; its collector removes the file once the round's outcome is in
//! `devices/<name>/status.json`, and the command then prints that outcome. When no daemon holds
//! the home's lock, `poll` takes the lock itself and collects in-process, mirror and engine
//! both, exactly as the daemon would, then releases it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::durable::FileLock;
use crate::engine::Engine;
use crate::error::{Error, exit};
use crate::ingress::device::{
    self, Collector, DEFAULT_REMOTE_SPOOL, Device, DeviceStatus, SshOptions,
};
use crate::ingress::spool::FileOutcome;
use crate::operator_view;

#[derive(Debug, Args)]
pub struct DeviceArgs {
    #[command(subcommand)]
    pub command: DeviceCommand,
}

#[derive(Debug, Subcommand)]
pub enum DeviceCommand {
    /// Add a device whose spool the daemon collects over SSH
    Add(AddArgs),
    /// List devices with their collector state
    List(JsonArg),
    /// Show one device and its collector state
    Show(NameArgs),
    /// Remove a device (files already collected into its mirror are kept)
    Remove(NameArgs),
    /// Connect, verify the host key, list the remote spool and report latency
    Test(NameArgs),
    /// Collect from a device now (through the running daemon, or in-process without one)
    Poll(PollArgs),
}

#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    /// The device's name
    pub name: String,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The device's name, used by `create --device`
    pub name: String,
    /// Host name or address to connect to
    #[arg(long, value_name = "H")]
    pub host: String,
    /// SSH port
    #[arg(long, value_name = "P", default_value_t = 22)]
    pub port: u16,
    /// Login name on the device [default: $USER]
    #[arg(long, value_name = "U")]
    pub user: Option<String>,
    /// Private key to authenticate with [default: ask the ssh-agent at $SSH_AUTH_SOCK]
    #[arg(long, value_name = "FILE")]
    pub identity: Option<PathBuf>,
    /// The spool directory on the device (`~/` is the login's home there)
    #[arg(long, value_name = "PATH", default_value = DEFAULT_REMOTE_SPOOL)]
    pub spool: String,
    /// known_hosts file the host key must be in [default: ~/.ssh/known_hosts]
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// Collection interval for this device in ms (0: only on `device poll`) [default:
    /// waitpointSweepMs]
    #[arg(long, value_name = "MS")]
    pub sweep_ms: Option<u64>,
    /// Print the record as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PollArgs {
    /// The device's name
    pub name: String,
    /// How long to wait for a running daemon's collector, in seconds; exit 7 after
    #[arg(long, value_name = "SECS", default_value_t = 120.0)]
    pub timeout: f64,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// Runs one `device` subcommand. `user_home` and `agent_socket` come from the environment.
pub fn run(
    engine: &Engine,
    args: DeviceArgs,
    user_home: &Path,
    env_user: Option<String>,
    opts: &SshOptions,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let home = engine.home();
    match args.command {
        DeviceCommand::Add(a) => add(engine, a, user_home, env_user, out),
        DeviceCommand::List(a) => {
            let all = device::list(home)?;
            if a.json {
                let v: Vec<Value> = all
                    .iter()
                    .map(|d| {
                        operator_view::device_view(
                            d,
                            &device::load_status(engine.home(), &d.name).unwrap_or_default(),
                        )
                    })
                    .collect();
                super::print_json(out, &json!({ "devices": v }))?;
                return Ok(exit::OK);
            }
            if all.is_empty() {
                writeln!(
                    out,
                    "no devices; `waitpoint device add NAME --host H` adds one"
                )?;
                return Ok(exit::OK);
            }
            writeln!(
                out,
                "{:<16} {:<32} {:<12} DETAIL",
                "NAME", "TARGET", "STATE"
            )?;
            for d in &all {
                let st = device::load_status(home, &d.name)?;
                writeln!(
                    out,
                    "{:<16} {:<32} {:<12} {}",
                    d.name,
                    format!("{}@{}:{}", d.user, d.host, d.port),
                    state_word(&st),
                    operator_view::device_detail(&st, engine.now())
                )?;
            }
            Ok(exit::OK)
        }
        DeviceCommand::Show(a) => {
            let d = device::require(home, &a.name)?;
            if a.json {
                super::print_json(
                    out,
                    &operator_view::device_view(
                        &d,
                        &device::load_status(engine.home(), &d.name).unwrap_or_default(),
                    ),
                )?;
                return Ok(exit::OK);
            }
            let st = device::load_status(home, &d.name)?;
            let now = engine.now();
            writeln!(out, "{}", d.name)?;
            writeln!(out, "  target       {}@{}:{}", d.user, d.host, d.port)?;
            writeln!(out, "  spool        {}", d.spool)?;
            writeln!(
                out,
                "  auth         {}",
                d.identity
                    .as_ref()
                    .map_or("ssh-agent".to_owned(), |p| format!("key {}", p.display()))
            )?;
            writeln!(out, "  known_hosts  {}", d.known_hosts.display())?;
            writeln!(
                out,
                "  interval     {}",
                d.sweep_ms
                    .map_or("waitpointSweepMs".to_owned(), |ms| format!("{ms} ms"))
            )?;
            writeln!(
                out,
                "  mirror       {}",
                home.device_spool(&d.name).display()
            )?;
            writeln!(
                out,
                "  state        {} {}",
                state_word(&st),
                operator_view::device_detail(&st, now)
            )?;
            writeln!(out, "  collected    {} file(s) in all", st.total_collected)?;
            Ok(exit::OK)
        }
        DeviceCommand::Remove(a) => {
            device::remove(home, &a.name)?;
            writeln!(
                out,
                "removed device {} (files on it stay there; files already mirrored are still \
                 applied)",
                a.name
            )?;
            Ok(exit::OK)
        }
        DeviceCommand::Test(a) => test(engine, a, opts, out),
        DeviceCommand::Poll(a) => poll(engine, a, opts, out),
    }
}

fn add(
    engine: &Engine,
    a: AddArgs,
    user_home: &Path,
    env_user: Option<String>,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let user = a.user.or(env_user).ok_or_else(|| {
        Error::Usage("--user is needed (USER is not set in the environment)".into())
    })?;
    let identity = match a.identity {
        None => None,
        Some(p) => {
            let abs = absolute(&p);
            if !abs.is_file() {
                return Err(Error::Usage(format!(
                    "--identity {}: no such key file",
                    abs.display()
                ))
                .into());
            }
            Some(abs)
        }
    };
    let known_hosts = a
        .known_hosts
        .map(|p| absolute(&p))
        .unwrap_or_else(|| user_home.join(".ssh").join("known_hosts"));
    let d = Device {
        name: a.name,
        host: a.host,
        port: a.port,
        user,
        identity,
        known_hosts,
        spool: a.spool,
        sweep_ms: a.sweep_ms,
        added_at: engine.now(),
    };
    device::add(engine.home(), &d)?;
    if a.json {
        super::print_json(out, &d)?;
    } else {
        writeln!(
            out,
            "added device {} ({}@{}:{}, spool {}); check it with `waitpoint device test {}`",
            d.name, d.user, d.host, d.port, d.spool, d.name
        )?;
    }
    Ok(exit::OK)
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_owned()
    } else {
        std::env::current_dir()
            .map(|c| c.join(p))
            .unwrap_or_else(|_| p.to_owned())
    }
}

fn test(
    engine: &Engine,
    a: NameArgs,
    opts: &SshOptions,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let d = device::require(engine.home(), &a.name)?;
    let conn = device::connect(&d, opts)?;
    let started = Instant::now();
    let entries = conn.list(&d, &device::claim_tag(engine.home(), &d.name))?;
    let list_ms = started.elapsed().as_millis() as u64;
    let claimed = entries
        .iter()
        .filter(|e| matches!(e, device::RemoteEntry::Claimed(_)))
        .count();
    let waiting = entries.len() - claimed;
    if a.json {
        super::print_json(
            out,
            &json!({
                "device": d.name, "ok": true, "connect_ms": conn.connect_ms,
                "list_ms": list_ms, "waiting": waiting, "claimed": claimed,
            }),
        )?;
    } else {
        writeln!(
            out,
            "ok: {} — host key verified against {}, authenticated as {}; spool {}: {waiting} \
             file(s) waiting{}; connect {} ms, list {list_ms} ms",
            d.name,
            d.known_hosts.display(),
            d.user,
            d.spool,
            if claimed > 0 {
                format!(", {claimed} claimed by an interrupted round")
            } else {
                String::new()
            },
            conn.connect_ms
        )?;
    }
    Ok(exit::OK)
}

fn poll(
    engine: &Engine,
    a: PollArgs,
    opts: &SshOptions,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let home = engine.home();
    let d = device::require(home, &a.name)?;
    if !a.timeout.is_finite() || a.timeout < 0.0 {
        return Err(Error::Usage(format!(
            "--timeout must be 0 or more seconds, not {}",
            a.timeout
        ))
        .into());
    }
    match FileLock::try_acquire_writing_pid(home.root_dir(), &home.daemon_lock()) {
        Ok(_lock) => {
            // No daemon: be the daemon for one round, so only the lock holder records signals.
            let interval = d.sweep_ms.unwrap_or(engine.settings().sweep_ms);
            let mut collector = Collector::new(d.clone(), home.clone(), opts.clone());
            let (landed, error, status) = collector.round_recorded(engine.now(), interval);
            let mirror = device::mirror(home, &d.name);
            let (mut applied, mut parked) = (0, 0);
            for file in mirror.pending()? {
                match crate::daemon::collect_file(&mirror, engine, &file)? {
                    FileOutcome::Consumed(_) | FileOutcome::Triggered(_) => applied += 1,
                    FileOutcome::Parked(_) => parked += 1,
                    FileOutcome::Deferred | FileOutcome::Vanished => {}
                }
            }
            // Leave nothing in the journal: no daemon runs to checkpoint it.
            engine.checkpoint_journal()?;
            let _ = home
                .root_dir()
                .remove_durably(&home.device_poll_file(&d.name));
            report(
                out,
                &d,
                &status,
                a.json,
                Some((landed.len(), applied, parked)),
            )?;
            Ok(if error.is_some() {
                exit::FAILURE
            } else {
                exit::OK
            })
        }
        Err(Error::Locked { .. }) => {
            let asked = engine.now();
            let poll_file = home.device_poll_file(&d.name);
            home.root_dir()
                .commit(&poll_file, format!("{asked}\n").as_bytes())?;
            let deadline = Instant::now() + Duration::from_secs_f64(a.timeout);
            loop {
                let status = device::load_status(home, &d.name)?;
                let answered =
                    !poll_file.exists() && status.last_attempt_at.is_some_and(|t| t >= asked);
                if answered {
                    report(out, &d, &status, a.json, None)?;
                    return Ok(if status.reachable == Some(true) {
                        exit::OK
                    } else {
                        exit::FAILURE
                    });
                }
                if Instant::now() >= deadline {
                    if !a.json {
                        writeln!(
                            out,
                            "the daemon did not answer the poll of {} within {}s",
                            d.name, a.timeout
                        )?;
                    }
                    return Ok(exit::TIMED_OUT);
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        }
        Err(e) => Err(e.into()),
    }
}

fn report(
    out: &mut impl Write,
    d: &Device,
    st: &DeviceStatus,
    as_json: bool,
    local: Option<(usize, usize, usize)>,
) -> anyhow::Result<()> {
    if as_json {
        let mut v = serde_json::to_value(st)?;
        let o = v.as_object_mut().expect("an object");
        o.insert("device".into(), json!(d.name));
        o.insert(
            "by".into(),
            json!(if local.is_some() {
                "this process"
            } else {
                "daemon"
            }),
        );
        super::print_json(out, &v)?;
        return Ok(());
    }
    match (&st.last_error, local) {
        (Some(e), _) => writeln!(
            out,
            "{}: unreachable: {}",
            d.name,
            operator_view::visible(e)
        )?,
        (None, Some((landed, applied, parked))) => writeln!(
            out,
            "{}: collected {landed} file(s) (no daemon running: applied {applied}, parked \
             {parked})",
            d.name
        )?,
        (None, None) => writeln!(
            out,
            "{}: collected {} file(s) (the daemon applies them)",
            d.name, st.last_collected
        )?,
    }
    Ok(())
}

fn state_word(st: &DeviceStatus) -> &'static str {
    match st.reachable {
        None => "not polled",
        Some(true) => "reachable",
        Some(false) => "unreachable",
    }
}
