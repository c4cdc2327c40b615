//! `cortex-signal`: the spec's flags, their environment defaults, and the choice of transport:
//! `--url` if given, else the shim address this home's daemon published, else the spool (never a
//! port from `WEBHOOK_PORT` alone: the body carries the secret). An HTTP attempt that reaches no daemon, or one the daemon answers with "not
//! recorded" (429, 500, 503), falls back to the spool unless `--no-spool`.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser};

use crate::error::{Error, exit};
use crate::home::Home;
use crate::model::SignalStatus;
use crate::signal::{
    DataSource, HttpTransport, HttpUrl, Published, Sent, SignalBody, SpoolTransport, Transport,
    published_endpoint,
};

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

/// The waitpoint a command signals, with `cortex-signal`'s flags and environment defaults.
#[derive(Debug, Args)]
pub struct SignalTarget {
    /// The waitpoint's id (wp_ and 12 hex digits)
    #[arg(
        long,
        value_name = "wp_…",
        env = "CORTEX_SIGNAL_ID",
        hide_env_values = true
    )]
    pub id: Option<String>,
    /// The waitpoint's secret, as printed when it was armed
    #[arg(
        long,
        value_name = "HEX",
        env = "CORTEX_SIGNAL_SECRET",
        hide_env_values = true
    )]
    pub secret: Option<String>,
    /// Which member this is; required when the waitpoint names members
    #[arg(long, value_name = "NAME", env = "CORTEX_SIGNAL_MEMBER")]
    pub member: Option<String>,
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

/// Judges a finished body against the home (see [`crate::engine::prejudge`]) and says what the
/// daemon would: `Some((exit code, what to say))` when that settles it (refused: 1, in the HTTP
/// route's words; already closed: 0, nothing to do), `None` when the signal must be sent.
pub fn judge_locally(home: &Home, body: &[u8]) -> Option<(u8, String)> {
    use crate::clock::Clock;
    use crate::engine::{Prejudged, Refusal};
    let req = crate::ingress::parse_signal(body).ok()?;
    let now = crate::clock::SystemClock.now();
    // Unreadable here (the daemon may still read it): send.
    let why = match crate::engine::prejudge(home, now, &req).ok()? {
        Prejudged::Open | Prejudged::Unknowable => return None,
        Prejudged::Closed(status) => {
            return Some((
                exit::OK,
                format!(
                    "the waitpoint is already {}; nothing to do",
                    status.as_str()
                ),
            ));
        }
        Prejudged::Refused(Refusal::UnknownId) => "unknown waitpoint id".to_owned(),
        Prejudged::Refused(Refusal::Unauthorized) => "wrong secret".to_owned(),
        Prejudged::Refused(r) => r.reason(),
    };
    Some((exit::FAILURE, format!("refused: {why}")))
}

/// The id and secret, or the usage error the spec asks for when either is missing.
pub fn require_id_secret(
    id: Option<String>,
    secret: Option<String>,
) -> Result<(String, String), Error> {
    let id = id.ok_or_else(|| Error::Usage("missing --id (or CORTEX_SIGNAL_ID)".into()))?;
    let secret =
        secret.ok_or_else(|| Error::Usage("missing --secret (or CORTEX_SIGNAL_SECRET)".into()))?;
    Ok((id, secret))
}

/// Sends a finished body the way `cortex-signal` does. This is the one place that picks the
/// transport, shared by `cortex-signal`, `waitpoint run` and `waitpoint attach`; `program`
/// prefixes what it says on stderr. Returns the exit code for a sent signal.
pub fn send(
    home: &Home,
    body: &[u8],
    url: Option<&str>,
    no_spool: bool,
    program: &str,
) -> anyhow::Result<u8> {
    // On the daemon's machine the home says at once whether the signal would be refused; only
    // what it cannot say is sent. Not with --url: that names some other daemon's endpoint.
    if url.is_none()
        && let Some((code, said)) = judge_locally(home, body)
    {
        eprintln!(
            "{program}: {said} (judged from {}; nothing was sent)",
            home.root().display()
        );
        return Ok(code);
    }
    let mut why_spool = "no HTTP shim is published for this home".to_owned();
    // The signal's identity, whichever way it goes: the POST's Idempotency-Key and, if it falls
    // back, the spool file's name. A daemon that recorded the POST but whose answer never came
    // then finds the spooled copy a duplicate.
    let key = format!(
        "{}{}",
        crate::ingress::SENDER_KEY_PREFIX,
        crate::secret::random_hex(16)
    );
    if let Some((url, found)) = endpoint(url, home, &mut why_spool)? {
        let http = HttpTransport {
            url: url.clone(),
            idempotency_key: key.clone(),
        };
        let via = format!("transport: http, {url} from {found}");
        match http.send(body)? {
            Sent::Answered(reply) => match reply.code {
                202 => {
                    let what = if reply.result().as_deref() == Some("duplicate") {
                        "already recorded (duplicate)"
                    } else {
                        "accepted"
                    };
                    eprintln!("{program}: {what} ({via})");
                    return Ok(exit::OK);
                }
                410 => {
                    eprintln!(
                        "{program}: the waitpoint {}; nothing to do ({via})",
                        reply.summary()
                    );
                    return Ok(exit::OK);
                }
                429 | 503 => {
                    why_spool = format!(
                        "the daemon answered HTTP {} ({}); nothing was recorded",
                        reply.code,
                        reply.summary()
                    );
                }
                500 => {
                    why_spool = "the daemon could not finish recording it (HTTP 500); the \
spooled copy carries the same key, so it counts once"
                        .to_owned();
                }
                code => {
                    eprintln!(
                        "{program}: refused with HTTP {code}: {} ({via})",
                        reply.summary()
                    );
                    return Ok(exit::FAILURE);
                }
            },
            Sent::Unreachable(why) => why_spool = format!("the daemon is unreachable: {why}"),
            Sent::NoAnswer(why) => {
                why_spool = format!(
                    "the daemon did not answer ({why}); the spooled copy carries the same key, so \
it counts once even if the daemon did record the signal"
                )
            }
            Sent::Spooled(_) => unreachable!("the HTTP transport does not spool"),
        }
    }
    if no_spool {
        anyhow::bail!("{why_spool}, and --no-spool forbids the spool");
    }
    let transport = SpoolTransport::keyed(home.drop_zone(), &key);
    let Sent::Spooled(path) = transport
        .send(body)
        .context("cannot write the signal to the spool")?
    else {
        unreachable!("the spool transport only spools");
    };
    eprintln!(
        "{program}: spooled {} (transport: spool, because {why_spool}; the daemon collects it)",
        path.display()
    );
    Ok(exit::OK)
}

/// The HTTP endpoint to try and where it came from: `--url` when given (the user named it), else
/// the address this home's daemon published while it holds the home's lock. Never a port taken
/// from `WEBHOOK_PORT` alone: whatever listens there may be another user's program, and the body
/// carries the secret. A stale address file is noted in `why_spool` and skipped.
fn endpoint(
    url: Option<&str>,
    home: &Home,
    why_spool: &mut String,
) -> anyhow::Result<Option<(HttpUrl, String)>> {
    if let Some(u) = url {
        return Ok(Some((HttpUrl::parse(u)?, "--url".into())));
    }
    let file = home.webhook_address_file();
    match published_endpoint(home) {
        Published::Up(url) => return Ok(Some((url, file.display().to_string()))),
        Published::Stale(why) => {
            *why_spool = format!("{} is stale: {why}", file.display());
        }
        Published::Absent => {}
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::{Context, SubscriberExt};

    use super::*;
    use crate::clock::{Clock, SystemClock};
    use crate::model::WebhookAddress;

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
