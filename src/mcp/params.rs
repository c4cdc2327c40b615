//! The MCP tools' arguments: Rust types whose JSON Schemas the server publishes, and the
//! deserialisation that names the field a wrong argument sits in.
//!
//! Bounds are not checked here: the engine checks them, once for every front end, and its texts
//! name these same fields (`max_signals must be 1-10000`).

use std::borrow::Cow;

use rmcp::schemars::{self, JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

use crate::engine::Quorum;
use crate::records::CallbackMode;

/// Arguments deserialised so that an error names its field: `max_signals: invalid type: string
/// "x", expected u32`, not the bare serde message. The schema is `T`'s.
#[derive(Debug)]
pub struct Fields<T>(pub T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Fields<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        serde_path_to_error::deserialize(value)
            .map(Fields)
            .map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                if path == "." {
                    de::Error::custom(inner)
                } else {
                    de::Error::custom(format!("{path}: {inner}"))
                }
            })
    }
}

impl<T: JsonSchema> JsonSchema for Fields<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

/// `quorum`: a positive number, or `"all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumArg(pub Quorum);

impl<'de> Deserialize<'de> for QuorumArg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = QuorumArg;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number or \"all\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<QuorumArg, E> {
                u32::try_from(v)
                    .map(|n| QuorumArg(Quorum::Count(n)))
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<QuorumArg, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!("must be at least 1, not {v}"))),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<QuorumArg, E> {
                if v == "all" {
                    Ok(QuorumArg(Quorum::All))
                } else {
                    Err(E::custom(format!("must be a number or \"all\", not {v:?}")))
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for QuorumArg {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Quorum".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "How many terminal (ok/fail) signals resolve it: a number, or \"all\" \
        (every member). Default: \"all\" with members, otherwise 1.",
            "anyOf": [
                { "type": "integer", "minimum": 1 },
                { "type": "string", "enum": ["all"] }
            ]
        })
    }
}

/// `wait_create`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitCreate {
    /// Short name shown on the wake and in listings, e.g. "nightly training".
    pub label: String,
    /// What you are waiting for and what you will do when it lands. You will read it hours
    /// later in a fresh turn with none of today's context: write it for a stranger.
    pub intent: String,
    /// Names of the jobs that will report (a barrier); once set, every signal must name one.
    #[serde(default)]
    pub members: Vec<String>,
    pub quorum: Option<QuorumArg>,
    /// Wake on the first `fail` even if the quorum is not met. Default true.
    pub fail_fast: Option<bool>,
    /// How many times it may wake you. Default 1; higher keeps it open as a monitor.
    #[schemars(range(min = 1, max = crate::engine::MAX_MAX_SIGNALS))]
    pub max_signals: Option<u32>,
    /// Deadline after which you are told nothing (more) arrived. Default 168 (7 days), at most
    /// 720, at least 0.0003 (one second); fractions allowed.
    #[schemars(range(min = 0.0003, max = 720.0))]
    pub expires_in_hours: Option<f64>,
    /// The connected device the job runs on, so its signal files are collected there.
    pub device: Option<String>,
    /// If nothing terminal has arrived after this many milliseconds, send one "recheck" wake
    /// (the waitpoint stays armed).
    #[schemars(range(min = 1))]
    pub recheck_after_ms: Option<u64>,
    /// If no signal at all (progress included) has arrived this many seconds after arming, you
    /// get one early wake saying so ("is the signal line wired?"); it stays armed.
    #[schemars(range(min = 1))]
    pub started_within_s: Option<u64>,
    /// After the first signal: if no further report arrives within this many seconds, you are
    /// woken ("the job went quiet"); a later report re-arms it. Pair with `waitpoint run
    /// --heartbeat` (how_to_signal.run).
    #[schemars(range(min = 1))]
    pub heartbeat_within_s: Option<u64>,
}

/// `wait_cancel`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitCancel {
    /// The waitpoint id (wp_…), as wait_create or wait_check returned it.
    pub id: String,
}

/// The longest `wait_next` blocks, in seconds.
pub const MAX_WAIT_NEXT_S: f64 = 300.0;

/// `wait_next`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitNext {
    /// How long to wait for a wake, in seconds: 0 (the default) only looks, at most 300.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = MAX_WAIT_NEXT_S))]
    pub timeout_s: f64,
}

/// `CreateTimer`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTimer {
    /// Delay before the first firing, in milliseconds (positive, at most ten years).
    #[schemars(range(min = 1, max = crate::engine::timers::MAX_TIMER_MS))]
    pub duration_ms: u64,
    /// Repeat every this many milliseconds after that (positive, at most ten years; fires past
    /// the agent's hourly wake budget wait for room);
    /// omit for a one-shot timer.
    #[schemars(range(
        min = crate::engine::timers::MIN_INTERVAL_MS,
        max = crate::engine::timers::MAX_TIMER_MS
    ))]
    pub interval_ms: Option<u64>,
    /// What the wake should remind you of.
    pub summary: Option<String>,
}

/// `ListTimers`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTimers {
    /// At most this many, newest first. Default 50.
    pub limit: Option<u32>,
}

/// `GetTimer`'s and `CancelTimer`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimerId {
    /// The timer id (tm_…), as CreateTimer or ListTimers returned it.
    pub timer_id: String,
}

/// How an external trigger delivers, in the spec's names.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryMode {
    /// An empty POST wakes you to look at the external state.
    #[default]
    WakeHint,
    /// The POST's `text` is queued for you as a message.
    EnqueueMessage,
}

impl DeliveryMode {
    pub fn mode(self) -> CallbackMode {
        match self {
            DeliveryMode::WakeHint => CallbackMode::Wake,
            DeliveryMode::EnqueueMessage => CallbackMode::Enqueue,
        }
    }
}

/// `CreateExternalTrigger`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateExternalTrigger {
    /// wake_hint (the default): an empty POST wakes you; enqueue_message: the POST's `text` is
    /// queued for you.
    pub delivery_mode: Option<DeliveryMode>,
    /// A name for it, shown on its wakes.
    pub label: Option<String>,
}

/// `CancelExternalTrigger`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExternalTriggerId {
    /// The trigger's id (cb_…), as CreateExternalTrigger returned it.
    pub external_trigger_id: String,
}
