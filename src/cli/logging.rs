//! Logging set-up: stderr (around the drain's progress bar) for every command, and
//! `log/daemon.log` for the daemon, as text or JSON lines.

use std::io::IsTerminal;
use std::sync::Mutex;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::home::Home;

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
            .with_writer(|| super::LogStderr)
            .with_filter(filter())
            .boxed()
    } else {
        layer()
            .with_writer(|| super::LogStderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter())
            .boxed()
    };
    let file = daemon_log.and_then(|home| {
        let root = home.root_dir();
        let _ = root.create_dir_private(&home.log_dir());
        // Reached beneath the home: a link planted as the log is set aside, never written
        // through.
        let f = root.open_append(&home.log_file()).ok()?;
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
