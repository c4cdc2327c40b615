//! Ingress: everything that turns outside input into a [`SignalRequest`] for the engine.
//!
//! Every route (the drop zone in [`spool`], device mirrors filled by [`device`], the optional
//! loopback shim in [`http`]) parses with [`parse_signal`], so one set of size and shape rules
//! applies no matter how a signal came in. Parsing checks shape and caps only; who may signal
//! what is the engine's business.

pub mod device;
pub mod http;
pub mod spool;

use crate::request::CallbackRequest;
use crate::request::MAX_BODY_BYTES;
use crate::request::MAX_DATA_CHARS;
use crate::request::MAX_MESSAGE_CHARS;
use crate::request::MISS_KEY;
use crate::request::SignalRequest;
use crate::request::check_member_name;
use serde::Deserialize;
use serde_json::Value;

use crate::records::SignalStatus;
use crate::secret::Secret;

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

/// A callback trigger dropped into the spool: the shell-job form of `POST /callbacks/...`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireCallback {
    callback: String,
    mode: String,
    #[serde(default)]
    text: Option<String>,
}

/// What a spool file asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum SpoolBody {
    Signal(SignalRequest),
    Callback(CallbackRequest),
    /// A miss its sender judged on this machine and left for the daemon's log
    /// ([`MISS_KEY`]): waitpoint `id`, an unknown id or a wrong secret.
    Miss {
        id: String,
    },
}

/// Parses a spool file: a signal, a callback trigger (a `callback` key), or a miss record (the
/// one key [`MISS_KEY`]).
pub fn parse_spool_body(bytes: &[u8]) -> Result<SpoolBody, String> {
    // Almost every file is a signal: one typed pass settles it. A body it takes has no
    // `callback` or miss key (a signal's fields are closed), so the passes below would have
    // found the same signal; anything else takes them, and their errors are what is told.
    if let Ok(signal) = parse_signal(bytes) {
        return Ok(SpoolBody::Signal(signal));
    }
    let value = (bytes.len() <= MAX_BODY_BYTES)
        .then(|| serde_json::from_slice::<Value>(bytes).ok())
        .flatten();
    if let Some(miss) = value.as_ref().and_then(|v| v.get(MISS_KEY)) {
        return match miss.as_str() {
            Some(id)
                if crate::names::is_waitpoint_id(id)
                    && value
                        .as_ref()
                        .is_some_and(|v| v.as_object().is_some_and(|o| o.len() == 1)) =>
            {
                Ok(SpoolBody::Miss { id: id.to_owned() })
            }
            _ => Err(format!(
                "not a valid miss record: `{MISS_KEY}` must be the only key, a waitpoint id"
            )),
        };
    }
    let looks_like_callback = value.is_some_and(|v| v.get("callback").is_some());
    if !looks_like_callback {
        return parse_signal(bytes).map(SpoolBody::Signal);
    }
    let wire: WireCallback =
        serde_json::from_slice(bytes).map_err(|e| format!("not a valid callback trigger: {e}"))?;
    let mode = crate::records::CallbackMode::parse(&wire.mode)
        .ok_or_else(|| "`mode` must be wake or enqueue".to_owned())?;
    Ok(SpoolBody::Callback(CallbackRequest {
        token: Secret::new(wire.callback),
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
    if !crate::names::is_waitpoint_id(&wire.id) {
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
        secret: Secret::new(wire.secret),
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
    fn a_miss_record_names_a_waitpoint_id_and_nothing_else() {
        let record = format!(r#"{{"{MISS_KEY}":"{ID}"}}"#);
        assert_eq!(
            parse_spool_body(record.as_bytes()),
            Ok(SpoolBody::Miss { id: ID.to_owned() })
        );
        for bad in [
            format!(r#"{{"{MISS_KEY}":"{ID}","secret":"s"}}"#),
            format!(r#"{{"{MISS_KEY}":"../etc"}}"#),
            format!(r#"{{"{MISS_KEY}":7}}"#),
        ] {
            let why = parse_spool_body(bad.as_bytes()).unwrap_err();
            assert!(why.contains("not a valid miss record"), "{bad}: {why}");
        }
    }

    /// `parse_spool_body` tries the typed signal first and takes what it accepts: that is only
    /// right while a signal's fields are closed, so that a body carrying a `callback` or miss
    /// key beside a signal's fields is never taken for a signal.
    #[test]
    fn a_signal_shaped_body_with_a_callback_or_miss_key_is_judged_as_that_not_as_a_signal() {
        let signal = format!(r#""id":"{ID}","secret":"s""#);
        let callback = format!(r#"{{{signal},"callback":"cb_x","mode":"wake"}}"#);
        let why = parse_spool_body(callback.as_bytes()).unwrap_err();
        assert!(why.contains("not a valid callback trigger"), "{why}");
        let miss = format!(r#"{{{signal},"{MISS_KEY}":"{ID}"}}"#);
        let why = parse_spool_body(miss.as_bytes()).unwrap_err();
        assert!(why.contains("not a valid miss record"), "{why}");
        assert!(matches!(
            parse_spool_body(format!("{{{signal}}}").as_bytes()),
            Ok(SpoolBody::Signal(r)) if r.id == ID
        ));
    }

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
