//! Logging set-up: stderr (around the drain's progress bar) for every command, and
//! `log/daemon.log` for the daemon, as text or JSON lines.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

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
    let terminal = std::io::stderr().is_terminal();
    let file = daemon_log.and_then(|home| {
        let root = home.root_dir();
        let _ = root.create_dir_private(&home.log_dir());
        // Reached beneath the home: a link planted as the log is set aside, never written
        // through.
        root.open_append(&home.log_file()).ok()
    });
    let layers = match file {
        // Without a terminal neither copy has colours, so both hold the same bytes: each line
        // is formatted once and written to both (the daemon logs every signal it accepts).
        Some(f) if !terminal => vec![layer(Both(Mutex::new(f)), json, false, filter())],
        Some(f) => vec![
            layer(|| super::LogStderr, json, true, filter()),
            layer(Mutex::new(f), json, false, filter()),
        ],
        None => vec![layer(|| super::LogStderr, json, terminal, filter())],
    };
    let _ = tracing_subscriber::registry().with(layers).try_init();
}

/// One log layer writing to `writer`, as text (with colours when `ansi`) or JSON lines.
fn layer<W>(
    writer: W,
    json: bool,
    ansi: bool,
    filter: EnvFilter,
) -> Box<dyn Layer<Registry> + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(writer);
    if json {
        layer.json().with_filter(filter).boxed()
    } else {
        layer.with_ansi(ansi).with_filter(filter).boxed()
    }
}

/// The daemon's two sinks as one: each line goes to `log/daemon.log` and to stderr (around the
/// drain's progress bar). A line the file could not take is an error, after stderr has had it;
/// stderr's own errors (a closed pipe) are not.
struct Both(Mutex<std::fs::File>);

impl<'a> MakeWriter<'a> for Both {
    type Writer = BothWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        BothWriter(self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

struct BothWriter<'a>(std::sync::MutexGuard<'a, std::fs::File>);

impl Write for BothWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let file = self.0.write_all(buf);
        let _ = super::LogStderr.write_all(buf);
        file.map(|()| buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = super::LogStderr.flush();
        self.0.flush()
    }
}
