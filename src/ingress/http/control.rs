//! The HTTP control surface of `events-and-timers.md`: an agent's callback reset and its timers,
//! for an operator's tools. Routes, their JSON, and what each does with the engine; the shim
//! (`routes.rs`) authenticates the caller and carries requests to the daemon's loop, which runs
//! them here.
//!
//! Every route here needs the operator credential (`CORTEX_WEBHOOK_TOKEN`, held by the daemon
//! only as its SHA-256): it grants control over every agent of the home, which a job's
//! waitpoint secret never does, and the signal route never accepts it. The caller's
//! `authority_class` is metadata: recorded on what it creates and logged, never a reason to
//! allow anything.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine::Engine;
use crate::engine::callbacks::IssuedCallback;
use crate::engine::timers::TimerRequest;
use crate::error::{Error, Result};
use crate::records::{CallbackMode, Timer, TimerStatus};

/// The control routes' prefix (creating and changing things).
pub const CONTROL_PREFIX: &str = "/api/control/agents/";
/// The read routes' prefix.
pub const AGENTS_PREFIX: &str = "/api/agents/";
/// The longest `authority_class` kept.
pub const MAX_AUTHORITY_CLASS_CHARS: usize = 64;

/// One control operation, parsed from its route and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlRequest {
    /// `POST /api/control/agents/:agent_id/reset-callback`.
    ResetCallback {
        agent: String,
        mode: Option<CallbackMode>,
        authority_class: Option<String>,
    },
    /// `POST /api/control/agents/:id/timers`.
    CreateTimer {
        agent: String,
        duration_ms: u64,
        interval_ms: Option<u64>,
        summary: Option<String>,
        authority_class: Option<String>,
    },
    /// `GET /api/agents/:id/timers`.
    ListTimers { agent: String, limit: usize },
    /// `GET /api/agents/:id/timers/:timer_id`.
    GetTimer { agent: String, timer_id: String },
    /// `POST /api/control/agents/:id/timers/:timer_id/cancel`.
    CancelTimer {
        agent: String,
        timer_id: String,
        authority_class: Option<String>,
    },
}

/// What a control operation produced.
#[derive(Debug, Clone)]
pub enum ControlOutcome {
    Reset(IssuedCallback),
    Created(Timer),
    Timer(Timer),
    Timers(Vec<Timer>),
}

/// Whether `path` is one of this surface's (so a request for it must authenticate first).
pub fn is_control_path(path: &str) -> bool {
    path.starts_with(CONTROL_PREFIX) || path.starts_with(AGENTS_PREFIX)
}

/// A route's answer when it cannot be run: status code and message.
pub type Refused = (u16, String);

/// The operation `method` on `path` asks for, with `body` (possibly empty). `Err` names what is
/// wrong with the request: 404 for no such route, 405 for the wrong method, 400 for a bad body.
pub fn parse(
    method: &str,
    path: &str,
    body: &[u8],
) -> std::result::Result<ControlRequest, Refused> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let (write, rest) = match (
        path.strip_prefix(CONTROL_PREFIX),
        path.strip_prefix(AGENTS_PREFIX),
    ) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return Err(no_route()),
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let want = |m: &str| {
        if method == m {
            Ok(())
        } else {
            Err((405, format!("use {m} on this route")))
        }
    };
    match (write, parts.as_slice()) {
        (true, [agent, "reset-callback"]) => {
            want("POST")?;
            #[derive(Deserialize, Default)]
            #[serde(deny_unknown_fields)]
            struct Body {
                #[serde(default)]
                delivery_mode: Option<String>,
                #[serde(default)]
                authority_class: Option<String>,
            }
            let b: Body = json_body(body)?;
            let mode = match b.delivery_mode.as_deref() {
                None => None,
                Some("wake" | "wake_hint") => Some(CallbackMode::Wake),
                Some("enqueue" | "enqueue_message") => Some(CallbackMode::Enqueue),
                Some(other) => {
                    return Err((
                        400,
                        format!("delivery_mode must be wake or enqueue, not {other:?}"),
                    ));
                }
            };
            Ok(ControlRequest::ResetCallback {
                agent: agent_of(agent)?,
                mode,
                authority_class: authority_class(b.authority_class)?,
            })
        }
        (true, [agent, "timers"]) => {
            want("POST")?;
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Body {
                duration_ms: u64,
                #[serde(default)]
                interval_ms: Option<u64>,
                #[serde(default)]
                summary: Option<String>,
                #[serde(default)]
                authority_class: Option<String>,
            }
            let b: Body = json_body(body)?;
            Ok(ControlRequest::CreateTimer {
                agent: agent_of(agent)?,
                duration_ms: b.duration_ms,
                interval_ms: b.interval_ms,
                summary: b.summary,
                authority_class: authority_class(b.authority_class)?,
            })
        }
        (true, [agent, "timers", timer_id, "cancel"]) => {
            want("POST")?;
            #[derive(Deserialize, Default)]
            #[serde(deny_unknown_fields)]
            struct Body {
                #[serde(default)]
                authority_class: Option<String>,
            }
            let b: Body = json_body(body)?;
            Ok(ControlRequest::CancelTimer {
                agent: agent_of(agent)?,
                timer_id: (*timer_id).to_owned(),
                authority_class: authority_class(b.authority_class)?,
            })
        }
        (false, [agent, "timers"]) => {
            want("GET")?;
            Ok(ControlRequest::ListTimers {
                agent: agent_of(agent)?,
                limit: limit_of(query)?,
            })
        }
        (false, [agent, "timers", timer_id]) => {
            want("GET")?;
            Ok(ControlRequest::GetTimer {
                agent: agent_of(agent)?,
                timer_id: (*timer_id).to_owned(),
            })
        }
        _ => Err(no_route()),
    }
}

fn no_route() -> Refused {
    (
        404,
        "no such control route; they are POST /api/control/agents/:agent_id/reset-callback, \
         POST /api/control/agents/:id/timers, GET /api/agents/:id/timers, \
         GET /api/agents/:id/timers/:timer_id and POST \
         /api/control/agents/:id/timers/:timer_id/cancel"
            .to_owned(),
    )
}

/// An optional JSON object body: empty (or blank) is `T::default()`-like only when every field
/// is optional, which serde decides from `{}`.
fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> std::result::Result<T, Refused> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            (400, format!("the body must be a JSON object: {inner}"))
        } else {
            (400, format!("{path}: {inner}"))
        }
    })
}

fn agent_of(raw: &str) -> std::result::Result<String, Refused> {
    crate::request::check_name("agent_id", raw)
        .map(|()| raw.to_owned())
        .map_err(|e| (400, e.to_string()))
}

fn authority_class(raw: Option<String>) -> std::result::Result<Option<String>, Refused> {
    match raw {
        Some(a)
            if a.is_empty()
                || a.chars().count() > MAX_AUTHORITY_CLASS_CHARS
                || !a
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')) =>
        {
            Err((
                400,
                format!(
                    "authority_class must be 1-{MAX_AUTHORITY_CLASS_CHARS} letters, digits or _ - \
                     . :"
                ),
            ))
        }
        other => Ok(other),
    }
}

fn limit_of(query: &str) -> std::result::Result<usize, Refused> {
    let mut limit = 50;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let Some(("limit", v)) = pair.split_once('=') else {
            return Err((400, format!("unknown query parameter {pair:?}; only limit")));
        };
        limit = v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or((400, format!("limit must be 1-1000, not {v:?}")))?;
    }
    Ok(limit)
}

/// Runs a control operation (on the daemon's loop, which owns the engine).
pub fn run(engine: &Engine, request: ControlRequest) -> Result<ControlOutcome> {
    match request {
        ControlRequest::ResetCallback {
            agent,
            mode,
            authority_class,
        } => {
            let issued = engine.reset_default_callback(&agent, mode)?;
            tracing::info!(
                agent = %agent,
                callback = %issued.callback.id,
                authority_class = authority_class.as_deref().unwrap_or("-"),
                "default callback reset over HTTP",
            );
            Ok(ControlOutcome::Reset(issued))
        }
        ControlRequest::CreateTimer {
            agent,
            duration_ms,
            interval_ms,
            summary,
            authority_class,
        } => engine
            .create_timer(TimerRequest {
                duration_ms,
                interval_ms,
                summary,
                session: agent,
                authority_class,
            })
            .map(ControlOutcome::Created),
        ControlRequest::ListTimers { agent, limit } => engine
            .list_timers(&agent, limit)
            .map(ControlOutcome::Timers),
        ControlRequest::GetTimer { agent, timer_id } => engine
            .timer_for(&timer_id, &agent)
            .map(ControlOutcome::Timer),
        ControlRequest::CancelTimer {
            agent,
            timer_id,
            authority_class,
        } => {
            let t = engine.cancel_timer(&timer_id, &agent)?;
            tracing::info!(
                agent = %agent,
                timer = %t.id,
                authority_class = authority_class.as_deref().unwrap_or("-"),
                "timer cancelled over HTTP",
            );
            Ok(ControlOutcome::Timer(t))
        }
    }
}

/// The timer id an outcome changed, for the daemon to reschedule.
pub fn changed_timer(outcome: &ControlOutcome) -> Option<&str> {
    match outcome {
        ControlOutcome::Created(t) => Some(&t.id),
        ControlOutcome::Timer(t) if t.status == TimerStatus::Cancelled => Some(&t.id),
        _ => None,
    }
}

/// The status code and body for an outcome. `trigger_url` makes a reset's URL from its token.
pub fn answer(
    outcome: Result<ControlOutcome>,
    trigger_url: impl Fn(CallbackMode, &str) -> String,
) -> (u16, Value) {
    match outcome {
        Ok(ControlOutcome::Reset(issued)) => {
            let url = trigger_url(issued.callback.mode, &issued.token);
            (200, issued.view(&url))
        }
        Ok(ControlOutcome::Created(t)) => (201, to_value(&t)),
        Ok(ControlOutcome::Timer(t)) => (200, to_value(&t)),
        Ok(ControlOutcome::Timers(list)) => (200, json!({ "timers": list })),
        Err(e @ Error::Invalid { .. }) => (400, error_body(&e)),
        Err(e @ Error::Usage(_)) => (400, error_body(&e)),
        Err(e @ Error::NotFound { .. }) => (404, error_body(&e)),
        Err(e @ Error::Conflict(_)) => (409, error_body(&e)),
        Err(e) => {
            tracing::error!(error = %e, "a control operation failed");
            (
                500,
                json!({ "result": "error", "error": "the daemon could not finish the operation \
                    (see its log); it may or may not have taken effect" }),
            )
        }
    }
}

fn to_value(t: &Timer) -> Value {
    serde_json::to_value(t).expect("a timer serialises")
}

fn error_body(e: &Error) -> Value {
    json!({ "result": "refused", "error": e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_to_their_operations_and_nothing_else() {
        assert_eq!(
            parse(
                "POST",
                "/api/control/agents/a1/timers",
                br#"{"duration_ms":5,"summary":"s","authority_class":"operator"}"#
            ),
            Ok(ControlRequest::CreateTimer {
                agent: "a1".into(),
                duration_ms: 5,
                interval_ms: None,
                summary: Some("s".into()),
                authority_class: Some("operator".into()),
            })
        );
        assert_eq!(
            parse("GET", "/api/agents/a1/timers?limit=3", b""),
            Ok(ControlRequest::ListTimers {
                agent: "a1".into(),
                limit: 3
            })
        );
        assert_eq!(
            parse("POST", "/api/control/agents/a1/reset-callback", b""),
            Ok(ControlRequest::ResetCallback {
                agent: "a1".into(),
                mode: None,
                authority_class: None
            })
        );
        assert_eq!(
            parse("GET", "/api/control/agents/a1/timers", b"")
                .unwrap_err()
                .0,
            405
        );
        assert_eq!(parse("GET", "/api/agents/a1/nope", b"").unwrap_err().0, 404);
        let (code, why) = parse(
            "POST",
            "/api/control/agents/a1/timers",
            br#"{"duration_ms":"x"}"#,
        )
        .unwrap_err();
        assert_eq!(code, 400);
        assert!(why.starts_with("duration_ms:"), "{why}");
        let (code, why) = parse(
            "POST",
            "/api/control/agents/a1/timers",
            br#"{"duration_ms":1,"authority_class":"root; rm -rf"}"#,
        )
        .unwrap_err();
        assert_eq!(code, 400);
        assert!(why.contains("authority_class"), "{why}");
        assert_eq!(
            parse(
                "POST",
                "/api/control/agents/../timers",
                br#"{"duration_ms":1}"#
            )
            .unwrap_err()
            .0,
            400
        );
    }
}
