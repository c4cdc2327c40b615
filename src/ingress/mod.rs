//! Ingress: everything that turns outside input into a [`SignalRequest`] for the engine.
//!
//! Every route (the drop zone in [`spool`], device mirrors filled by [`device`], the optional
//! loopback shim in [`http`]) parses with [`parse_signal`], so one set of size and shape rules
//! applies no matter how a signal came in. Parsing checks shape and caps only; who may signal
//! what is the engine's business.

pub mod control;
pub mod device;
pub mod http;
mod sftp_long;
pub mod spool;

use serde::Deserialize;
use serde_json::Value;

use crate::model::SignalStatus;

/// Largest request or spool file accepted, in bytes (the spec's 64 KB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest `message`, in characters.
pub const MAX_MESSAGE_CHARS: usize = 2_000;
/// Longest `data`, in characters (a string's own length, or the JSON text of any other value).
pub const MAX_DATA_CHARS: usize = 16_000;
/// Longest member name, in characters.
pub const MAX_MEMBER_CHARS: usize = 64;

/// A field that was present, whatever its value (`null` included), as opposed to absent.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// A signal as the sender wrote it: the spec's JSON body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireSignal {
    id: String,
    secret: String,
    /// Absent means ok; present it must be one of the three (`null` is not a status).
    #[serde(default, deserialize_with = "present")]
    status: Option<Value>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    member: Option<String>,
    #[serde(default)]
    data: Option<Value>,
}

/// A well-formed signal, not yet authenticated. Its `Debug` leaves the secret out, so a request
/// that ends up in a log line or a panic message never carries it.
#[derive(Clone, PartialEq)]
pub struct SignalRequest {
    pub id: String,
    /// The plaintext secret as sent. Never logged, never written; the engine hashes it.
    pub secret: String,
    pub status: SignalStatus,
    pub message: Option<String>,
    pub member: Option<String>,
    pub data: Option<Value>,
}

impl std::fmt::Debug for SignalRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalRequest")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .field("status", &self.status)
            .field("message", &self.message)
            .field("member", &self.member)
            .field("data", &self.data)
            .finish()
    }
}

/// Where a signal came from. Its [`identity`](Source::identity) is what de-duplicates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file in the local drop zone, by file name.
    Spool(String),
    /// A file collected from a device's spool over SSH, by device and file name.
    Device { device: String, file: String },
    /// A request to the HTTP shim, by its `Idempotency-Key` (one the shim made up when the
    /// request carried none).
    Http(String),
}

/// The prefix of the keys `cortex-signal` (and `run`, `attach`) mint for each signal: `cs-` and
/// 32 lowercase hex digits.
pub const SENDER_KEY_PREFIX: &str = "cs-";

/// True for a key `cortex-signal` minted ([`SENDER_KEY_PREFIX`]).
pub fn is_sender_key(key: &str) -> bool {
    key.strip_prefix(SENDER_KEY_PREFIX).is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

impl Source {
    /// Where the signal came from, as its record says: `spool:<file name>`,
    /// `device:<device>:<file name>`, `http:<Idempotency-Key>`.
    pub fn origin(&self) -> String {
        match self {
            Source::Spool(name) => format!("spool:{name}"),
            Source::Device { device, file } => format!("device:{device}:{file}"),
            Source::Http(key) => format!("http:{key}"),
        }
    }

    /// The signal's identity: the same file name, or the same idempotency key, is the same
    /// signal ([`identity_of`] its origin).
    pub fn identity(&self) -> String {
        identity_of(&self.origin())
    }
}

/// A signal's identity from its origin (a record's `source`). A key `cortex-signal` minted is the
/// signal's identity whichever way it came, as the `Idempotency-Key` of its POST or as the name
/// of the spool file it fell back to (`<key>.json`): `key:<key>`, so the second copy to arrive
/// is a duplicate. Any other origin is its own identity.
pub fn identity_of(origin: &str) -> String {
    let sender_key = origin
        .strip_prefix("spool:")
        .and_then(|name| name.strip_suffix(".json"))
        .or_else(|| origin.strip_prefix("http:"))
        .filter(|k| is_sender_key(k));
    match sender_key {
        Some(key) => format!("key:{key}"),
        None => origin.to_owned(),
    }
}

/// True for a syntactically valid waitpoint id: `wp_` and 12 lowercase hex digits.
pub fn is_waitpoint_id(id: &str) -> bool {
    crate::engine::is_prefixed_id(id, "wp_")
}

/// Checks a member name's shape (the engine checks it against the waitpoint's list).
pub fn check_member_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("member name is empty".into());
    }
    if name.chars().count() > MAX_MEMBER_CHARS {
        return Err(format!(
            "member name is longer than {MAX_MEMBER_CHARS} characters"
        ));
    }
    if name.chars().any(char::is_control) {
        return Err("member name contains control characters".into());
    }
    Ok(())
}

/// A callback trigger dropped into the spool: the shell-job form of `POST /callbacks/...`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireCallback {
    callback: String,
    mode: String,
    #[serde(default)]
    text: Option<String>,
}

/// A callback trigger, not yet authenticated.
#[derive(Clone, PartialEq, Eq)]
pub struct CallbackRequest {
    /// The capability token. Never logged, never written.
    pub token: String,
    pub mode: crate::model::CallbackMode,
    pub text: Option<String>,
}

impl std::fmt::Debug for CallbackRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackRequest")
            .field("token", &"[redacted]")
            .field("mode", &self.mode)
            .field("text", &self.text)
            .finish()
    }
}

/// What a spool file asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum SpoolBody {
    Signal(SignalRequest),
    Callback(CallbackRequest),
}

/// Parses a spool file: a signal, or (with a `callback` key) a callback trigger.
pub fn parse_spool_body(bytes: &[u8]) -> Result<SpoolBody, String> {
    let looks_like_callback = bytes.len() <= MAX_BODY_BYTES
        && serde_json::from_slice::<Value>(bytes)
            .ok()
            .is_some_and(|v| v.get("callback").is_some());
    if !looks_like_callback {
        return parse_signal(bytes).map(SpoolBody::Signal);
    }
    let wire: WireCallback =
        serde_json::from_slice(bytes).map_err(|e| format!("not a valid callback trigger: {e}"))?;
    let mode = crate::model::CallbackMode::parse(&wire.mode)
        .ok_or_else(|| "`mode` must be wake or enqueue".to_owned())?;
    Ok(SpoolBody::Callback(CallbackRequest {
        token: wire.callback,
        mode,
        text: wire.text,
    }))
}

/// Parses and shape-checks a signal body. The error is a reason fit for a `.reason` file or an
/// HTTP body: it never echoes the secret.
pub fn parse_signal(bytes: &[u8]) -> Result<SignalRequest, String> {
    if bytes.len() > MAX_BODY_BYTES {
        return Err(format!(
            "larger than {MAX_BODY_BYTES} bytes ({} bytes)",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let wire: WireSignal =
        serde_json::from_str(text).map_err(|e| format!("not a valid signal: {e}"))?;
    if !is_waitpoint_id(&wire.id) {
        return Err(format!(
            "`id` must be wp_ followed by 12 hex digits, not {:?}",
            crate::secret::echo(&wire.id)
        ));
    }
    if wire.secret.is_empty() {
        return Err("`secret` is empty".into());
    }
    let status = match &wire.status {
        None => SignalStatus::Ok,
        Some(Value::String(s)) => SignalStatus::parse(s).ok_or_else(|| {
            format!(
                "`status` must be ok, fail or progress, not {:?}",
                crate::secret::echo(s)
            )
        })?,
        Some(other) => {
            return Err(format!(
                "`status` must be ok, fail or progress, not {}",
                crate::secret::echo(&other.to_string())
            ));
        }
    };
    if let Some(m) = &wire.message {
        let n = m.chars().count();
        if n > MAX_MESSAGE_CHARS {
            return Err(format!(
                "`message` is {n} characters; the limit is {MAX_MESSAGE_CHARS}"
            ));
        }
    }
    if let Some(member) = &wire.member {
        check_member_name(member).map_err(|e| format!("`member`: {e}"))?;
    }
    let data = match wire.data {
        Some(Value::Null) | None => None,
        Some(v) => {
            let n = data_chars(&v);
            if n > MAX_DATA_CHARS {
                return Err(format!(
                    "`data` is {n} characters; the limit is {MAX_DATA_CHARS}"
                ));
            }
            Some(v)
        }
    };
    Ok(SignalRequest {
        id: wire.id,
        secret: wire.secret,
        status,
        message: wire.message,
        member: wire.member,
        data,
    })
}

/// The length `data` counts against its cap.
pub fn data_chars(v: &Value) -> usize {
    match v {
        Value::String(s) => s.chars().count(),
        other => other.to_string().chars().count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "wp_0123456789ab";

    #[test]
    fn minimal_body_defaults_to_ok() {
        let r = parse_signal(format!(r#"{{"id":"{ID}","secret":"s"}}"#).as_bytes()).unwrap();
        assert_eq!(r.status, SignalStatus::Ok);
    }

    #[test]
    fn path_like_ids_are_refused() {
        let err = parse_signal(br#"{"id":"../../etc","secret":"s"}"#).unwrap_err();
        assert!(err.contains("`id`"), "{err}");
    }

    #[test]
    fn unknown_fields_and_duplicates_are_refused() {
        assert!(
            parse_signal(format!(r#"{{"id":"{ID}","secret":"s","memebr":"a"}}"#).as_bytes())
                .is_err()
        );
        assert!(
            parse_signal(format!(r#"{{"id":"{ID}","id":"{ID}","secret":"s"}}"#).as_bytes())
                .is_err()
        );
    }

    #[test]
    fn caps_are_enforced_not_truncated() {
        let long = "x".repeat(MAX_MESSAGE_CHARS + 1);
        let body = format!(r#"{{"id":"{ID}","secret":"s","message":"{long}"}}"#);
        assert!(
            parse_signal(body.as_bytes())
                .unwrap_err()
                .contains("message")
        );
        let data = "y".repeat(MAX_DATA_CHARS + 1);
        let body = format!(r#"{{"id":"{ID}","secret":"s","data":"{data}"}}"#);
        assert!(parse_signal(body.as_bytes()).unwrap_err().contains("data"));
    }

    #[test]
    fn reasons_never_echo_the_secret() {
        let body = format!(r#"{{"id":"{ID}","secret":"TOPSECRET","status":"maybe"}}"#);
        let err = parse_signal(body.as_bytes()).unwrap_err();
        assert!(!err.contains("TOPSECRET"), "{err}");
    }

    #[test]
    fn a_null_or_non_string_status_is_refused_not_taken_for_ok() {
        for status in ["null", "1", "[\"ok\"]"] {
            let body = format!(r#"{{"id":"{ID}","secret":"s","status":{status}}}"#);
            let err = parse_signal(body.as_bytes()).unwrap_err();
            assert!(
                err.starts_with("`status` must be ok, fail or progress"),
                "{err}"
            );
        }
        let absent = format!(r#"{{"id":"{ID}","secret":"s"}}"#);
        assert_eq!(
            parse_signal(absent.as_bytes()).unwrap().status,
            SignalStatus::Ok
        );
    }
}
