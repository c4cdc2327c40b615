//! Sending a finished signal, shared by `cortex-signal`, `waitpoint run` and `waitpoint attach`:
//! the waitpoint's flags and environment defaults ([`SignalTarget`]), the local judgement of a
//! refusal, and the choice of transport: `--url` if given, else the shim address this home's
//! daemon published, else the spool (never a port from `WEBHOOK_PORT` alone: the body carries
//! the secret). An HTTP attempt that reaches no daemon, or one the daemon answers with "not
//! recorded" (429, 500, 503), falls back to the spool unless `--no-spool`.

use anyhow::Context;
use clap::Args;
use std::sync::Arc;

use crate::error::{Error, exit};
use crate::home::Home;
use crate::sender::{
    HttpTransport, HttpUrl, Published, Sent, SpoolTransport, Transport, published_endpoint,
};

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
    /// Which member this is; required when the waitpoint names members. At most 64 characters,
    /// none of them a control or invisible one (a line separator, a bidi control)
    #[arg(
        long,
        value_name = "NAME",
        env = "CORTEX_SIGNAL_MEMBER",
        hide_env_values = true
    )]
    pub member: Option<String>,
}

/// What the home settles about a signal before it is sent (see [`judge_locally`]).
#[derive(Debug)]
pub struct Judged {
    /// 1 when refused, 0 when the waitpoint is already closed (nothing to do).
    pub code: u8,
    /// What to say, in the HTTP route's words.
    pub said: String,
    /// The waitpoint id, when the refusal is a miss (an unknown id or a wrong secret), which
    /// [`Judged::leave_miss`] leaves for the daemon's log.
    pub miss: Option<String>,
}

/// Judges a finished body against the home (see [`crate::engine::prejudge`]) and says what the
/// daemon would, when that settles it; `None` when the signal must be sent.
pub fn judge_locally(home: &Home, body: &[u8]) -> Option<Judged> {
    use crate::clock::{Clock, SystemClock};
    use crate::engine::Prejudged;
    use crate::engine::rules::Refusal;
    use std::sync::Arc;
    // On a store shared by several hosts this home's files hold no waitpoints: the daemon
    // judges, and hands the signal to the leader.
    if super::load_settings(home)
        .is_ok_and(|s| s.store != crate::settings::location::Location::Files)
    {
        return None;
    }
    // A home that holds no waitpoints (a device's, or one with no daemon yet) has nothing to
    // judge by.
    if !home.waitpoints_dir().is_dir() {
        return None;
    }
    let req = crate::ingress::parse_signal(body).ok()?;
    let now = SystemClock.now();
    // Unreadable here (the daemon may still read it): send.
    let store = crate::store::Files::new(home.clone(), Arc::new(SystemClock), Default::default());
    let judged = crate::engine::prejudge(&store, now, &req).ok()?;
    let why = match &judged {
        Prejudged::Open => return None,
        Prejudged::Closed(status) => {
            return Some(Judged {
                code: exit::OK,
                said: format!(
                    "the waitpoint is already {}; nothing to do",
                    status.as_str()
                ),
                miss: None,
            });
        }
        Prejudged::Refused(Refusal::UnknownId) => "unknown waitpoint id".to_owned(),
        Prejudged::Refused(Refusal::Unauthorized) => "wrong secret".to_owned(),
        Prejudged::Refused(r) => r.reason(),
    };
    let miss = matches!(
        judged,
        Prejudged::Refused(Refusal::UnknownId | Refusal::Unauthorized)
    );
    Some(Judged {
        code: exit::FAILURE,
        said: format!("refused: {why}"),
        miss: miss.then_some(req.id),
    })
}

impl Judged {
    /// Leaves a miss judged here where the daemon sees it: a miss record naming the id alone
    /// (never the secret) in the spool, which the daemon logs as a warning and parks in `bad/`,
    /// where `doctor` counts it. A detached job whose stderr nobody reads then still leaves a
    /// trace of a typo, counted once, since nothing else was sent. Returns what to add to the
    /// sender's line on stderr (nothing when this is no miss).
    pub fn leave_miss(&self, home: &Home) -> String {
        let Some(id) = &self.miss else {
            return String::new();
        };
        match SpoolTransport::new(Arc::clone(home.root_dir()), home.drop_zone())
            .send(&crate::sender::miss_record(id))
        {
            Ok(_) => "; the miss is left in the spool for the daemon's log".to_owned(),
            Err(e) => format!("; the miss could not be left for the daemon's log: {e}"),
        }
    }
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
    send_as(home, body, url, no_spool, program, true)
}

/// [`send`], saying on stderr only what went wrong when `say_done` is false (a heartbeat every
/// few minutes should not fill the job's stderr with "accepted").
pub fn send_as(
    home: &Home,
    body: &[u8],
    url: Option<&str>,
    no_spool: bool,
    program: &str,
    say_done: bool,
) -> anyhow::Result<u8> {
    // On the daemon's machine the home says at once whether the signal would be refused; only
    // what it cannot say is sent. Not with --url: that names some other daemon's endpoint.
    if url.is_none()
        && let Some(judged) = judge_locally(home, body)
    {
        let left = judged.leave_miss(home);
        if say_done || judged.code != exit::OK {
            eprintln!(
                "{program}: {} (judged from {}; nothing was sent{left})",
                judged.said,
                home.root().display()
            );
        }
        return Ok(judged.code);
    }
    let mut why_spool = "no HTTP shim is published for this home".to_owned();
    // The signal's identity, whichever way it goes: the POST's Idempotency-Key and, if it falls
    // back, the spool file's name. A daemon that recorded the POST but whose answer never came
    // then finds the spooled copy a duplicate.
    let key = format!(
        "{}{}",
        crate::request::SENDER_KEY_PREFIX,
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
                    if say_done {
                        eprintln!("{program}: {what} ({via})");
                    }
                    return Ok(exit::OK);
                }
                410 => {
                    if say_done {
                        eprintln!(
                            "{program}: the waitpoint {}; nothing to do ({via})",
                            reply.summary()
                        );
                    }
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
    let transport = SpoolTransport::keyed(Arc::clone(home.root_dir()), home.drop_zone(), &key);
    let Sent::Spooled(path) = transport
        .send(body)
        .context("cannot write the signal to the spool")?
    else {
        unreachable!("the spool transport only spools");
    };
    if say_done {
        eprintln!(
            "{program}: spooled {} (transport: spool, because {why_spool}; the daemon collects it)",
            path.display()
        );
    }
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
