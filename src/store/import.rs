//! `waitpoint import`'s reading of another home: read-only, bounded, and one bad record costing
//! only its own waitpoint or timer.
//!
//! The source is someone else's directory, so it is trusted no more than a drop file: every
//! file is reached beneath its root without following a link and read only when it is a
//! regular file within [`MAX_RECORD_BYTES`](crate::durable::MAX_RECORD_BYTES); every record
//! passes the same id and name rules as on arming (`names.rs`, applied as it parses) and must
//! lie where its id says. What fails is refused with its reason and the rest goes on. Nothing
//! in the source is written, moved or set aside: an import is a copy.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::durable::{self, Dir, Root};
use crate::error::Result;
use crate::names::{is_timer_id, is_waitpoint_id};
use crate::records::{SignalRecord, Timer, Waitpoint};

use super::files::parse_signal_file_name;
use super::{Copied, Store};

/// Something of the source that was not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The waitpoint or timer id, or the file's place in the source when there is no id.
    pub what: String,
    pub reason: String,
}

/// Copies every readable waitpoint (with its records) and timer of the home at `root` into
/// `to`. An id `to` has already is left alone and listed in `skipped`; a waitpoint or timer
/// with any file that is unreadable, oversized, a link, or naming ids that break the rules is
/// refused whole, with its reason, and the import goes on.
pub fn import_home(root: &Root, to: &dyn Store) -> Result<(Copied, Vec<Refused>)> {
    let mut copied = Copied::default();
    let mut refused = Vec::new();
    let mut refuse = |what: &str, reason: String| {
        refused.push(Refused {
            what: what.to_owned(),
            reason,
        })
    };
    match Dir::open_beneath(root, Path::new("waitpoints")) {
        Ok(dir) => {
            let mut names = dir.names()?;
            names.sort();
            for name in names {
                if durable::is_temp_name(&name) {
                    continue;
                }
                if !is_waitpoint_id(&name) {
                    refuse(
                        &format!("waitpoints/{name}"),
                        "is not named after a waitpoint id".into(),
                    );
                    continue;
                }
                match read_waitpoint(root, &name) {
                    Ok((wp, records)) => {
                        if to.put_whole(&wp, &records)? {
                            copied.waitpoints += 1;
                            copied.records += records.len();
                        } else {
                            copied.skipped.push(wp.id);
                        }
                    }
                    Err(reason) => refuse(&name, reason),
                }
            }
        }
        Err(e) if e.is_not_found() => {}
        Err(e) => refuse("waitpoints", e.to_string()),
    }
    match Dir::open_beneath(root, Path::new("timers")) {
        Ok(dir) => {
            let mut names = dir.names()?;
            names.sort();
            for name in names {
                let Some(id) = name.strip_suffix(".json") else {
                    continue;
                };
                if durable::is_temp_name(&name) {
                    continue;
                }
                if !is_timer_id(id) {
                    refuse(
                        &format!("timers/{name}"),
                        "is not named after a timer id".into(),
                    );
                    continue;
                }
                let rel = format!("timers/{name}");
                match read_one::<Timer>(root, &rel) {
                    Ok(t) if t.id != id => {
                        refuse(id, format!("{rel} holds timer {:?}", t.id));
                    }
                    Ok(t) => super::copy_timer(t, to, &mut copied)?,
                    Err(reason) => refuse(id, reason),
                }
            }
        }
        Err(e) if e.is_not_found() => {}
        Err(e) => refuse("timers", e.to_string()),
    }
    Ok((copied, refused))
}

/// A waitpoint of the source and its records, or why it cannot be imported.
fn read_waitpoint(
    root: &Root,
    id: &str,
) -> std::result::Result<(Waitpoint, Vec<SignalRecord>), String> {
    let wp: Waitpoint = read_one(root, &format!("waitpoints/{id}/waitpoint.json"))?;
    if wp.id != id {
        return Err(format!(
            "waitpoints/{id}/waitpoint.json says its id is {:?}",
            wp.id
        ));
    }
    let mut records = Vec::new();
    let signals = format!("waitpoints/{id}/signals");
    let dir = match Dir::open_beneath(root, Path::new(&signals)) {
        Ok(d) => Some(d),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e.to_string()),
    };
    if let Some(dir) = dir {
        let names = dir.names().map_err(|e| e.to_string())?;
        for name in names {
            if durable::is_temp_name(&name) {
                continue;
            }
            if parse_signal_file_name(&name).is_none() {
                return Err(format!(
                    "{signals}/{name} is not named like a signal record"
                ));
            }
            records.push(read_one::<SignalRecord>(
                root,
                &format!("{signals}/{name}"),
            )?);
        }
    }
    // The log (a line a crash cut short is not a record, as for the home's own readers).
    let log = format!("waitpoints/{id}/signals.jsonl");
    match durable::read_record_bytes(root, &root.path().join(&log)) {
        Ok(Ok(Some(bytes))) => {
            let parsed = super::signal_log::parse(&bytes);
            if let Some((line, why)) = parsed.damaged.first() {
                return Err(format!("{log}: line {line}: {why}"));
            }
            let logged = parsed.records;
            records.retain(|r| !logged.contains_key(&r.seq));
            records.extend(logged.into_values());
        }
        Ok(Ok(None)) => {}
        Ok(Err((_, why))) => return Err(format!("{log} {why}")),
        Err(e) => return Err(e.to_string()),
    }
    records.sort_by_key(|r| r.seq);
    Ok((wp, records))
}

/// One record of the source at `rel` beneath `root`, read as [`durable::read_record_bytes`]
/// reads (no link, no FIFO, capped), parsed with the records' rules; never moved.
fn read_one<T: DeserializeOwned>(root: &Root, rel: &str) -> std::result::Result<T, String> {
    let path = root.path().join(rel);
    let bytes = match durable::read_record_bytes(root, &path) {
        Ok(Ok(Some(b))) => b,
        Ok(Ok(None)) => return Err(format!("{rel} is missing")),
        Ok(Err((culprit, why))) => {
            let at = culprit.strip_prefix(root.path()).unwrap_or(&culprit);
            return Err(format!("{} {why}", at.display()));
        }
        Err(e) => return Err(e.to_string()),
    };
    serde_json::from_slice(&bytes).map_err(|e| format!("{rel} does not parse: {e}"))
}
