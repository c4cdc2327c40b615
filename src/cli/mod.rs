//! Command-line front ends. Only this module knows clap, argv and the process environment: it
//! resolves them into a [`Home`], [`Settings`] and validated requests before calling the library.

pub mod signal;
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

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
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

/// SIGTERM and SIGINT, blocked in the calling thread (and so in every thread it starts later).
pub fn block_termination_signals() -> libc::sigset_t {
    // SAFETY: plain libc calls on a sigset_t we own; pthread_sigmask only changes this thread's
    // mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for the signals in `set` on a thread of its own: the first calls `stop` (a clean
/// shutdown), a second one exits at once.
pub fn stop_on_termination_signals(set: libc::sigset_t, stop: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let mut stop = Some(stop);
        loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` and `sig` are valid for the call; sigwait only reads and writes them.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                return;
            }
            match stop.take() {
                Some(stop) => {
                    tracing::info!(signal = sig, "stopping on signal");
                    stop();
                }
                None => std::process::exit(1),
            }
        }
    });
}

/// Logging: warnings and up to stderr for ordinary commands; for the daemon, info and up to
/// stderr and `log/daemon.log`. `RUST_LOG` overrides the level.
pub fn init_logging(daemon_log: Option<&Home>) {
    let default = if daemon_log.is_some() { "info" } else { "warn" };
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter());
    let file = daemon_log.and_then(|home| {
        let _ = crate::store::create_dir_private(&home.log_dir());
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(crate::store::FILE_MODE)
            .open(home.log_file())
            .ok()
            .map(|f| {
                tracing_subscriber::fmt::layer()
                    .with_writer(Mutex::new(f))
                    .with_ansi(false)
                    .with_filter(filter())
            })
    });
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(file)
        .try_init();
}

/// Maps a command's result to the process exit code, printing the error chain on stderr.
/// A closed stdout is not an error.
pub fn finish(program: &str, result: anyhow::Result<u8>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let mut stderr = std::io::stderr().lock();
            let _ = writeln!(stderr, "{program}: {e:#}");
            ExitCode::from(exit_code_for(&e))
        }
    }
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

/// argv as clap sees it (kept here so tests could inject it).
pub fn args() -> Vec<OsString> {
    std::env::args_os().collect()
}
