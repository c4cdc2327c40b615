//! Command-line front ends. Only this module knows clap, argv and the process environment: it
//! resolves them into a [`Home`], [`Settings`] and validated requests before calling the library.

pub mod adapter;
pub mod callback;
pub mod device;
pub mod man;
pub mod ops;
pub mod progress;
pub use crate::render;
pub mod signal;
pub mod timer;
pub mod waitpoint;

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::error::{exit_code_for, is_broken_pipe};
use crate::home::Home;
use crate::settings::Settings;

/// `--home` > `CORTEX_HOME` > `~/.cortex`.
pub fn resolve_home(flag: Option<PathBuf>) -> Home {
    Home::new(flag.unwrap_or_else(default_home_root))
}

/// `CORTEX_HOME`, else `~/.cortex`.
pub fn default_home_root() -> PathBuf {
    match std::env::var_os("CORTEX_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => home_dir().join(".cortex"),
    }
}

/// Whether `home` is the one a bare `cortex-signal` (no `CORTEX_HOME`) would use.
pub fn is_implicit_default(home: &Home) -> bool {
    home.root() == home_dir().join(".cortex")
}

/// `$HOME`, else `/`.
pub fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// The login name for `device add`'s default `--user`: `$USER`, `$LOGNAME`, else the name of
/// the effective uid in the password database.
pub fn login_name() -> Option<String> {
    for var in ["USER", "LOGNAME"] {
        if let Ok(v) = std::env::var(var)
            && !v.is_empty()
        {
            return Some(v);
        }
    }
    // The password file's line for our uid (`name:x:uid:...`). Users known only to a
    // directory service have $USER set by their login anyway.
    let uid = rustix::process::geteuid().as_raw().to_string();
    std::fs::read_to_string("/etc/passwd")
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)? == uid && !name.is_empty()).then(|| name.to_owned())
        })
}

/// What SSH collectors take from the environment: the ssh-agent's socket.
pub fn ssh_options() -> crate::ingress::device::SshOptions {
    crate::ingress::device::SshOptions {
        agent_socket: std::env::var_os("SSH_AUTH_SOCK")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
    }
}

/// Settings of `home`, with the process environment as the fallback for absent keys.
pub fn load_settings(home: &Home) -> crate::error::Result<Settings> {
    Settings::load(&home.settings_file(), |k| std::env::var(k).ok())
}

/// `WEBHOOK_PORT`, when set: the port the HTTP shim uses unless told otherwise.
pub fn webhook_port_env() -> crate::error::Result<Option<u16>> {
    match std::env::var("WEBHOOK_PORT") {
        Ok(raw) if !raw.trim().is_empty() => raw.trim().parse().map(Some).map_err(|_| {
            crate::error::Error::Usage(format!(
                "environment variable WEBHOOK_PORT must be a port number, not {raw:?}"
            ))
        }),
        _ => Ok(None),
    }
}

/// How log lines are written (`waitpoint daemon --log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event
    #[default]
    Text,
    /// One JSON object per line, with the fields (`waitpoint`, `file`, …) as keys
    Json,
}

/// Logging: warnings and up to stderr for ordinary commands; for the daemon, info and up to
/// stderr and `log/daemon.log`, in `format`. `RUST_LOG` overrides the level. `cortex-signal`
/// calls this only in builds with failpoints, since nothing else on its path logs (see
/// `cli::signal::main`).
pub fn init_logging(daemon_log: Option<&Home>, format: LogFormat) {
    let default = if daemon_log.is_some() { "info" } else { "warn" };
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let json = format == LogFormat::Json;
    let layer = tracing_subscriber::fmt::layer;
    let stderr = if json {
        layer()
            .json()
            .with_writer(|| progress::Stderr)
            .with_filter(filter())
            .boxed()
    } else {
        layer()
            .with_writer(|| progress::Stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter())
            .boxed()
    };
    let file = daemon_log.and_then(|home| {
        let _ = crate::store::create_dir_private(&home.log_dir());
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(crate::store::FILE_MODE)
            .open(home.log_file())
            .ok()?;
        Some(if json {
            layer()
                .json()
                .with_writer(Mutex::new(f))
                .with_filter(filter())
                .boxed()
        } else {
            layer()
                .with_writer(Mutex::new(f))
                .with_ansi(false)
                .with_filter(filter())
                .boxed()
        })
    });
    let layers: Vec<_> = std::iter::once(stderr).chain(file).collect();
    let _ = tracing_subscriber::registry().with(layers).try_init();
}

/// Maps a command's result to the process exit code, printing the error chain on stderr.
/// A closed stdout is not an error.
pub fn finish(program: &str, result: anyhow::Result<u8>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let hint = e
                .chain()
                .find_map(|e| match e.downcast_ref::<crate::error::Error>() {
                    Some(crate::error::Error::Invalid { field, .. }) => field_hint(field),
                    _ => None,
                })
                .map(|flag| format!(" (the flag {flag})"))
                .unwrap_or_default();
            // The chain, each cause once: an error whose text already quotes its source
            // (ours do: "cannot open PATH: No such file") would otherwise say it twice.
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
            ExitCode::from(exit_code_for(&e))
        }
    }
}

/// The CLI's hint for a request field the engine refused: the flag that sets it. The engine's
/// text names the field, as every front end shows it; only the CLI knows its flags.
pub fn field_hint(field: &str) -> Option<&'static str> {
    Some(match field {
        "label" => "--label",
        "intent" => "--intent",
        "members" => "--member",
        "quorum" => "--quorum",
        "max_signals" => "--max-signals",
        "expires_in_hours" => "--expires-in-hours",
        "recheck_after_ms" => "--recheck-after-ms",
        "device" => "--device",
        "session" => "--session",
        "channel" => "--channel",
        "duration_ms" => "--after-ms",
        "interval_ms" => "--every-ms",
        "summary" => "--summary",
        _ => return None,
    })
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
    /// The session acting [default: $CORTEX_SESSION, else "default"]
    #[arg(
        long,
        value_name = "S",
        env = "CORTEX_SESSION",
        default_value = "default"
    )]
    pub session: String,
}

/// The owning agent of a timer or callback. The spec's operator CLI names it `--agent`; a
/// session is the spec's agent, so `--session` is the same flag.
#[derive(Debug, clap::Args)]
pub struct AgentArg {
    /// The agent (session) acting [default: $CORTEX_SESSION, else "default"]
    #[arg(
        long = "agent",
        visible_alias = "session",
        value_name = "ID",
        env = "CORTEX_SESSION",
        default_value = "default",
        hide_default_value = true,
        hide_env = true
    )]
    pub session: String,
}

/// Prints `v` as pretty JSON and a newline: every command's `--json` output.
pub fn print_json(out: &mut impl Write, v: &impl serde::Serialize) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut *out, v)?;
    writeln!(out)?;
    Ok(())
}
