//! `cortex-signal`: the spec's flags and their environment defaults. How a finished signal is
//! sent (the transport choice) is shared with `waitpoint run` and `attach`: see `sending`.

use std::process::ExitCode;

use clap::Parser;

use crate::error::exit;

use super::{SignalTarget, require_id_secret, send};
use crate::records::SignalStatus;
use crate::sender::{DataSource, SignalBody};

/// Report a job's result to a waitpoint.
///
/// Append it to the job's command line: `python train.py; cortex-signal --exit-code $?`.
/// Exit status: 0 when the signal was accepted, already resolved, or spooled; 1 when it was
/// refused, or the daemon was unreachable with --no-spool; 2 on a usage error or a missing id
/// or secret.
#[derive(Debug, Parser)]
#[command(name = "cortex-signal", version)]
pub struct SignalArgs {
    #[command(flatten)]
    pub target: SignalTarget,
    /// Status from an exit code (0 is ok, anything else fail), and `exit=N` as the message
    /// unless --message is given
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub exit_code: Option<i64>,
    /// ok, fail or progress; overrides the status --exit-code derives [default: ok]
    #[arg(long, value_name = "STATUS", value_parser = ["ok", "fail", "progress"])]
    pub status: Option<String>,
    /// One-line summary shown in the wake (at most 2,000 characters)
    #[arg(long, value_name = "TEXT")]
    pub message: Option<String>,
    /// Extra payload: @FILE, - for stdin, or the literal text (at most 16,000 characters);
    /// delivered as data, never as instructions
    #[arg(long, value_name = "@FILE|-|TEXT", allow_hyphen_values = true)]
    pub data: Option<String>,
    /// Signal endpoint [default: http://127.0.0.1:$WEBHOOK_PORT/webhook/signal, taken only
    /// from the address this home's daemon published while it runs; else the spool]
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Fail instead of writing to the spool when the daemon cannot be reached
    #[arg(long)]
    pub no_spool: bool,
}

/// Entry point of the `cortex-signal` binary.
pub fn main() -> ExitCode {
    super::setup_failpoints();
    let argv = super::args();
    // The spec: with no arguments it prints its help and sends nothing, even when the
    // environment would supply an id and secret.
    if argv.len() <= 1 {
        let mut cmd = <SignalArgs as clap::CommandFactory>::command();
        let _ = cmd.print_help();
        return ExitCode::from(exit::USAGE);
    }
    let args: SignalArgs = match super::parse_args(argv) {
        Ok(a) => a,
        Err(code) => return code,
    };
    // No logging subscriber: nothing on this path emits a tracing event (a unit test below
    // holds that), and setting one up links and initialises tracing-subscriber, its regex-based
    // `RUST_LOG` filter and the progress-bar writer, which cost more than the rest of the
    // process's own work. The one exception is an injected fault's warning, which exists only in
    // builds with failpoints, so those keep the daemon's logging.
    #[cfg(feature = "failpoints")]
    super::init_logging(None, super::LogFormat::Text);
    super::finish("cortex-signal", run(args))
}

fn run(args: SignalArgs) -> anyhow::Result<u8> {
    let (id, secret) = require_id_secret(args.target.id, args.target.secret)?;
    let status = match (args.status.as_deref(), args.exit_code) {
        (Some(s), _) => SignalStatus::parse(s).expect("clap checked the value"),
        (None, Some(0)) | (None, None) => SignalStatus::Ok,
        (None, Some(_)) => SignalStatus::Fail,
    };
    let message = args
        .message
        .or_else(|| args.exit_code.map(|c| format!("exit={c}")));
    let data = args
        .data
        .map(|d| DataSource::parse(&d).read(std::io::stdin().lock()))
        .transpose()?;
    let body = SignalBody {
        id,
        secret,
        status,
        message,
        member: args.target.member.filter(|m| !m.is_empty()),
        data,
    }
    .to_bytes()?;

    let home = super::resolve_home(None);
    send(
        &home,
        &body,
        args.url.as_deref(),
        args.no_spool,
        "cortex-signal",
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::{Context, SubscriberExt};

    use super::*;
    use crate::clock::{Clock, SystemClock};
    use crate::home::Home;
    use crate::records::WebhookAddress;

    /// Counts every event at every level.
    struct Count(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> Layer<S> for Count {
        fn on_event(&self, _: &tracing::Event<'_>, _: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// `cortex-signal` installs no logging subscriber (that start-up cost is most of what it
    /// would spend besides the fsyncs), which is only right while nothing it runs logs. This
    /// walks every way `send` can go short of a live shim and fails on any event, trace level
    /// included: if it does, give `cortex-signal` its subscriber back.
    #[test]
    fn sending_logs_nothing_so_cortex_signal_needs_no_subscriber() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().join("home"));
        let body = br#"{"id":"wp_0123456789ab","secret":"s","status":"ok"}"#;
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{closed}/webhook/signal");
        let events = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry().with(Count(events.clone()));
        tracing::subscriber::with_default(subscriber, || {
            assert_eq!(send(&home, body, None, false, "t").unwrap(), exit::OK);
            assert_eq!(send(&home, body, Some(&url), false, "t").unwrap(), exit::OK);
            assert!(send(&home, body, Some(&url), true, "t").is_err());
            // An address file no running daemon stands behind, then one that does not parse.
            let stale = WebhookAddress {
                url: url.clone(),
                addr: format!("127.0.0.1:{closed}"),
                pid: 1,
                started_at: SystemClock.now(),
            };
            std::fs::write(
                home.webhook_address_file(),
                serde_json::to_vec(&stale).unwrap(),
            )
            .unwrap();
            assert_eq!(send(&home, body, None, false, "t").unwrap(), exit::OK);
            std::fs::write(home.webhook_address_file(), b"{").unwrap();
            assert_eq!(send(&home, body, None, false, "t").unwrap(), exit::OK);
        });
        assert_eq!(
            events.load(Ordering::SeqCst),
            0,
            "events logged while sending"
        );
    }
}
