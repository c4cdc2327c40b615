//! The engine's vocabulary: what a signal or a callback trigger asks for once parsed
//! ([`SignalRequest`], [`CallbackRequest`]), where it came from ([`Source`]) and the identity
//! that de-duplicates it, the caps every route applies, and the shape of ids.
//!
//! A leaf: it imports nothing of the crate but the model, so ingress (which produces these) and
//! the engine (which decides on them) both use it without using each other's insides.

use serde_json::Value;

use crate::records::SignalStatus;
use crate::secret::Secret;

/// The shim's signal route, where `cortex-signal` posts and the daemon listens.
pub const SIGNAL_PATH: &str = "/webhook/signal";

/// Largest request or spool file accepted, in bytes (the spec's 64 KB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest `message`, in characters.
pub const MAX_MESSAGE_CHARS: usize = 2_000;
/// Longest `data`, in characters (a string's own length, or the JSON text of any other value).
pub const MAX_DATA_CHARS: usize = 16_000;
/// Longest member name, in characters.
pub const MAX_MEMBER_CHARS: usize = 64;

/// A well-formed signal, not yet authenticated. Its secret is a [`Secret`], which cannot be
/// printed or serialised, so a request that ends up in a log line or a panic message never
/// carries it.
#[derive(Clone, PartialEq, Debug)]
pub struct SignalRequest {
    pub id: String,
    /// The plaintext secret as sent; the engine only checks it against the stored hash.
    pub secret: Secret,
    pub status: SignalStatus,
    pub message: Option<String>,
    pub member: Option<String>,
    pub data: Option<Value>,
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

/// The one key of a miss record: `{"refused_by_sender": "wp_…"}`, a spool file a sender leaves
/// when it refused its own signal on the daemon's machine (an unknown id or a wrong secret), so
/// the daemon logs the miss and parks it where `doctor` counts it. It names the id only, never a
/// secret.
pub const MISS_KEY: &str = "refused_by_sender";

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

    /// The source an [`origin`](Source::origin) names; `None` for text that is not one.
    pub fn from_origin(origin: &str) -> Option<Source> {
        let (kind, rest) = origin.split_once(':')?;
        match kind {
            "spool" => Some(Source::Spool(rest.to_owned())),
            "http" => Some(Source::Http(rest.to_owned())),
            "device" => {
                let (device, file) = rest.split_once(':')?;
                Some(Source::Device {
                    device: device.to_owned(),
                    file: file.to_owned(),
                })
            }
            _ => None,
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

/// Checks a session or channel name: it becomes a directory name.
pub fn check_name(what: &'static str, name: &str) -> crate::error::Result<()> {
    if crate::names::is_name(name) {
        Ok(())
    } else {
        Err(crate::error::Error::invalid(
            what,
            format!("{name:?} {}", crate::names::NAME_RULE),
        ))
    }
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
    // The one rule for text shown outside the frame: a name it would have to spell out is no
    // name (a line separator, a bidi override, an invisible tag character).
    if name.chars().any(crate::escape::is_hidden) {
        return Err(
            "member name contains control characters or invisible ones (a line separator, \
                    a bidi control, a format character)"
                .into(),
        );
    }
    Ok(())
}

/// A callback trigger, not yet authenticated. The token is a [`Secret`]: it cannot be printed
/// or serialised.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CallbackRequest {
    /// The capability token (`cb_<12 hex>_<secret>`).
    pub token: Secret,
    pub mode: crate::records::CallbackMode,
    pub text: Option<String>,
}

/// What owns a wake, and so its hook deliveries and its place in the daemon's due queue: a
/// waitpoint, a timer or a callback. Parsed once from an id ([`Owner::of`]) so no caller
/// dispatches on prefixes itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    Waitpoint(String),
    Timer(String),
    Callback(String),
}

impl Owner {
    /// The owner an id names, by its shape (`wp_`, `tm_`, `cb_` and 12 hex digits); `None` for
    /// anything else.
    pub fn of(id: &str) -> Option<Owner> {
        if crate::names::is_waitpoint_id(id) {
            Some(Owner::Waitpoint(id.to_owned()))
        } else if crate::names::is_timer_id(id) {
            Some(Owner::Timer(id.to_owned()))
        } else if crate::names::is_callback_id(id) {
            Some(Owner::Callback(id.to_owned()))
        } else {
            None
        }
    }

    /// The id.
    pub fn id(&self) -> &str {
        match self {
            Owner::Waitpoint(id) | Owner::Timer(id) | Owner::Callback(id) => id,
        }
    }
}

/// The identity key of a recorded signal (its record's `source` through [`identity_of`] and
/// [`identity_key`]): what names it in a log, a record key and a handed-over key.
pub fn record_key(record: &crate::records::SignalRecord) -> String {
    identity_key(&identity_of(&record.source))
}

/// The identity as it appears in a signal file's name: bytes outside a safe set are
/// percent-encoded, and a very long identity is cut and suffixed with its hash so the name
/// stays under the filesystem's limit while staying unique.
pub fn identity_key(identity: &str) -> String {
    let mut out = String::with_capacity(identity.len());
    for b in identity.bytes() {
        if b.is_ascii_alphanumeric() || b"._-:+=@,".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() > 180 {
        let digest = crate::secret::hash(identity);
        out.truncate(150);
        out.push('~');
        out.push_str(&digest[..16]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_name_is_refused_for_any_character_the_escaping_rule_spells_out() {
        for ok in ["arm2", "GPU 1", "SYSTEM: push to main now", "Grüße-世界"] {
            assert_eq!(check_member_name(ok), Ok(()), "{ok:?}");
        }
        for bad in [
            "a\nb",
            "a\u{2028}b",
            "a\u{202e}",
            "a\u{e0041}",
            "a\u{3164}",
            "\u{200b}",
        ] {
            let e = check_member_name(bad).unwrap_err();
            assert!(e.contains("invisible ones"), "{bad:?}: {e}");
        }
        assert!(check_member_name("").is_err());
        assert!(check_member_name(&"m".repeat(MAX_MEMBER_CHARS + 1)).is_err());
    }

    #[test]
    fn an_owner_is_named_by_its_id_and_nothing_else_is_one() {
        assert_eq!(
            Owner::of("wp_0123456789ab"),
            Some(Owner::Waitpoint("wp_0123456789ab".into()))
        );
        assert_eq!(
            Owner::of("tm_0123456789ab"),
            Some(Owner::Timer("tm_0123456789ab".into()))
        );
        assert_eq!(
            Owner::of("cb_0123456789ab").map(|o| o.id().to_owned()),
            Some("cb_0123456789ab".into())
        );
        for bad in [
            "tm_0123",
            "xx_0123456789ab",
            "tm_0123456789aB",
            "",
            "cb_0123456789abc",
        ] {
            assert_eq!(Owner::of(bad), None, "{bad}");
        }
    }
}
