//! The shape of every id and name that becomes part of a path in the home: waitpoint, timer,
//! callback and wake ids, and session, channel, agent and device names. One rule each, applied
//! twice: when a request arrives (the engine's checks) and when a record is read back from any
//! store, a file, an etcd key or a home being imported (the records' deserialisers in
//! `records.rs`). A name that passes can be joined to a directory of the home and stays in it:
//! no `/`, no `..`, nothing a shell or a command line reads as an option.

use serde::{Deserialize, Deserializer};

/// The longest session, channel, agent or device name.
pub const MAX_NAME_BYTES: usize = 128;

/// True for `<prefix>` followed by 12 lowercase hex digits.
pub fn is_prefixed_id(id: &str, prefix: &str) -> bool {
    id.len() == prefix.len() + 12
        && id.starts_with(prefix)
        && id[prefix.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// True for a syntactically valid waitpoint id: `wp_` and 12 lowercase hex digits.
pub fn is_waitpoint_id(id: &str) -> bool {
    is_prefixed_id(id, "wp_")
}

/// True for a syntactically valid timer id: `tm_` and 12 lowercase hex digits.
pub fn is_timer_id(id: &str) -> bool {
    is_prefixed_id(id, "tm_")
}

/// True for a syntactically valid callback id: `cb_` and 12 lowercase hex digits.
pub fn is_callback_id(id: &str) -> bool {
    is_prefixed_id(id, "cb_")
}

/// True for a wake id (`wk_<hex>_<n>`): 1-64 letters, digits and `_`.
pub fn is_wake_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// True for a session, channel, agent or device name: 1-128 letters, digits, `.`, `_`, `-`
/// or `@`, not `.` or `..`, and not starting with `-` (a leading `-` reads as an option
/// wherever a name reaches a command line, as a session did in `claude -p --resume`).
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name != "."
        && name != ".."
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b))
}

/// What a rule refuses, worded for a request's error text.
pub const NAME_RULE: &str =
    "must be 1-128 characters of letters, digits, '.', '_', '-' or '@', not starting with '-'";

/// Deserialises a string only if `ok` accepts it, so a record read back from a store with an
/// id or name that would lead out of its directory fails to parse, like any corrupt record.
fn checked<'de, D: Deserializer<'de>>(
    d: D,
    ok: fn(&str) -> bool,
    what: &str,
) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if ok(&s) {
        Ok(s)
    } else {
        Err(serde::de::Error::custom(format!(
            "{s:?} is not a valid {what}"
        )))
    }
}

/// `deserialize_with` for a waitpoint id.
pub fn de_waitpoint_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    checked(d, is_waitpoint_id, "waitpoint id")
}

/// `deserialize_with` for a timer id.
pub fn de_timer_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    checked(d, is_timer_id, "timer id")
}

/// `deserialize_with` for a callback id.
pub fn de_callback_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    checked(d, is_callback_id, "callback id")
}

/// `deserialize_with` for a wake id.
pub fn de_wake_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    checked(d, is_wake_id, "wake id")
}

/// `deserialize_with` for a session, channel, agent or device name.
pub fn de_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    checked(d, is_name, "name (session, channel or agent)")
}

/// `deserialize_with` for an optional name (a waitpoint's device).
pub fn de_opt_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(s) if !is_name(&s) => Err(serde::de::Error::custom(format!(
            "{s:?} is not a valid device name"
        ))),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_their_directory_or_read_as_options_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "-rf",
            "--dangerously-skip-permissions",
            "a b",
            "é",
            &"x".repeat(129),
        ] {
            assert!(!is_name(bad), "{bad:?} passed");
        }
        for good in ["main", "claude-1f2e", "a.b_c-d@host", &"x".repeat(128)] {
            assert!(is_name(good), "{good:?} refused");
        }
    }

    #[test]
    fn ids_have_their_prefix_and_twelve_hex_digits() {
        assert!(is_waitpoint_id("wp_0123456789ab"));
        assert!(!is_waitpoint_id("wp_0123456789AB"));
        assert!(!is_waitpoint_id("y/../../../precious"));
        assert!(!is_timer_id("wp_0123456789ab"));
        assert!(is_callback_id("cb_0123456789ab"));
        assert!(is_wake_id("wk_0123456789ab_0001"));
        assert!(!is_wake_id("wk_../x"));
        assert!(!is_wake_id(""));
    }
}
