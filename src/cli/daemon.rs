//! `waitpoint daemon`: the daemon run in the foreground as a service. Process signals become
//! `DaemonControl` calls (SIGTERM and SIGINT a clean stop, SIGHUP a reload with re-resolved
//! settings), the startup drain shows a progress bar on a terminal, and the HTTP shim's address
//! is resolved from the flags, the settings and the environment.

use std::io::{self, IsTerminal};
use std::sync::Arc;

use clap::Args;

use crate::clock::{Clock, SystemClock};
use crate::daemon::{Daemon, DaemonConfig};
use crate::error::{Error, exit};
use crate::home::Home;
use crate::ingress::http::{self as shim, HttpConfig};
use crate::settings::Settings;

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

/// Runs the daemon in the foreground as a service: SIGTERM and SIGINT stop it cleanly (the
/// file in hand is finished, the lock released), SIGHUP re-reads the settings, and a large
/// startup backlog shows a progress bar when stderr is a terminal.
pub fn run(home: Home, settings: Settings, http: Option<HttpConfig>) -> anyhow::Result<u8> {
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
                    Err(e) => tracing::error!(error = %e, "SIGHUP: keeping the current settings"),
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
