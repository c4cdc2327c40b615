//! Parking refused files: each moved to `bad/<stem>.json` with a `.reason` beside it, its
//! secret redacted in the parked copy (only hashes of secrets rest under the home), at once or
//! queued for the daemon to park a few at a time.

use super::{BAD, QueuedPark, Spool, read_regular};
use crate::clock::Timestamp;
use crate::durable::{self, Dir, Kind};
use crate::error::{Error, Result};
use crate::secret;
use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};

impl Spool {
    /// Takes the refusals queued since the last call.
    pub fn take_queued(&self) -> Vec<QueuedPark> {
        self.queued
            .as_ref()
            .map(|q| std::mem::take(&mut *q.borrow_mut()))
            .unwrap_or_default()
    }

    /// Parks queued refusals now, the spool opened once for all of them (their files still in
    /// the spool; one gone meanwhile is fine). One result per refusal, in order.
    pub fn park_queued(&self, queue: &[QueuedPark]) -> Vec<Result<()>> {
        let dz = match self.open() {
            Ok(Some(dz)) => dz,
            Ok(None) => return queue.iter().map(|_| Ok(())).collect(),
            Err(e) => {
                let message = e.to_string();
                return queue
                    .iter()
                    .map(|_| {
                        Err(Error::Insecure {
                            path: self.dir.clone(),
                            message: message.clone(),
                        })
                    })
                    .collect();
            }
        };
        queue
            .iter()
            .map(|q| {
                let there = dz
                    .entry(OsStr::new(&q.name))
                    .map_err(|e| Error::io("cannot inspect", self.dir.join(&q.name), e))?;
                match there {
                    None => Ok(()),
                    Some(_) => self.park_now(&dz, q),
                }
            })
            .collect()
    }

    /// Moves a refused file to `bad/<stem>.json` with `bad/<stem>.reason` beside it. A parseable
    /// file's secret is redacted in the parked copy (only its fingerprint is kept), because only
    /// secrets' hashes may rest under the home. `waitpoint` is the id the file claimed, when it
    /// parsed far enough to have one, so the log line names it.
    pub(super) fn park(
        &self,
        dz: &Dir,
        name: &str,
        reason: &str,
        bytes: Option<&[u8]>,
        waitpoint: Option<&str>,
        now: Timestamp,
    ) -> Result<()> {
        let job = QueuedPark {
            name: name.to_owned(),
            reason: reason.to_owned(),
            bytes: bytes.map(<[u8]>::to_vec),
            waitpoint: waitpoint.map(str::to_owned),
            at: now,
        };
        match &self.queued {
            Some(queue) => {
                queue.borrow_mut().push(job);
                Ok(())
            }
            None => self.park_now(dz, &job),
        }
    }

    pub(super) fn park_now(&self, dz: &Dir, job: &QueuedPark) -> Result<()> {
        let (name, reason, now) = (job.name.as_str(), job.reason.as_str(), job.at);
        let (bytes, waitpoint) = (job.bytes.as_deref(), job.waitpoint.as_deref());
        // A real directory of ours, not a link out of the home.
        let bad = dz.child_or_make(BAD)?;
        let stem = safe_stem(name);
        let (target, reason_file) = free_bad_names(&bad, &stem)?;
        let source = OsStr::new(name);
        let entry = dz
            .entry(source)
            .map_err(|e| Error::io("cannot inspect", dz.path().join(name), e))?;
        let hard_linked = matches!(entry, Some(Kind::File { links, .. }) if links > 1);
        let lone_file = matches!(entry, Some(Kind::File { links: 1, .. }));
        let redacted = bytes.and_then(redact_secret);
        let note = match &redacted {
            Some((_, Some(fp))) => format!(
                "{now} refused {name:?}: {reason}\n(secret redacted in this copy; sha256 starts \
                 {fp})\n"
            ),
            Some((_, None)) => {
                format!(
                    "{now} refused {name:?}: {reason}\n(secret-like text redacted in this copy)\n"
                )
            }
            None if bytes.is_none() && hard_linked => format!(
                "{now} refused {name:?}: {reason}\n(the link was removed from the spool; the file \
it names elsewhere is untouched, and no copy of it is kept here)\n"
            ),
            None if bytes.is_none() => format!(
                "{now} refused {name:?}: {reason}\n(this copy keeps at most its first {} KB, \
with any secret-like text redacted)\n",
                EXCERPT / 1024
            ),
            None => format!("{now} refused {name:?}: {reason}\n"),
        };
        bad.commit(&reason_file, note.as_bytes())?;
        match redacted {
            Some((copy, _)) => {
                bad.commit(&target, &copy)?;
                dz.unlink_durably(source)?;
            }
            // A second name of a file that lives elsewhere: parking the link would keep that
            // file's content (maybe a secret) under the home, so only our name for it goes.
            None if bytes.is_none() && hard_linked => dz.unlink_durably(source)?,
            // Refused unread (its size, its name): an excerpt is copied with every secret-like
            // run removed, so no plaintext rests in bad/, and no large file is copied at all.
            None if bytes.is_none() && lone_file => {
                copy_redacted(dz, source, &bad, &target)?;
                dz.unlink_durably(source)?;
            }
            None => dz.rename_durably(source, &bad, &target)?,
        }
        tracing::warn!(
            waitpoint,
            file = ?name,
            parked = %bad.path().join(&target).display(),
            reason = %reason,
            "parked refused spool file",
        );
        Ok(())
    }

    pub(super) fn park_raw(&self, dz: &Dir, name: &OsString, reason: &str) -> Result<()> {
        let bad = dz.child_or_make(BAD)?;
        let stem = safe_stem(&name.to_string_lossy());
        let (target, reason_file) = free_bad_names(&bad, &stem)?;
        bad.commit(&reason_file, format!("refused: {reason}\n").as_bytes())?;
        // The content may be a well-formed signal under a bad name: its secret must not rest
        // in the parked copy either.
        match read_regular(dz, name).ok().and_then(|b| redact_secret(&b)) {
            Some((copy, _)) => {
                bad.commit(&target, &copy)?;
                dz.unlink_durably(name)
            }
            None => dz.rename_durably(name, &bad, &target),
        }
    }
}

/// Free names in `bad/` for a parked copy and its reason: `<stem>.json`, or `<stem>.1.json`
/// and so on when taken.
pub(super) fn free_bad_names(bad: &Dir, stem: &str) -> Result<(String, String)> {
    let taken = |name: &str| {
        bad.entry(OsStr::new(name))
            .map(|e| e.is_some())
            .map_err(|e| Error::io("cannot inspect", bad.path().join(name), e))
    };
    for n in 0u32.. {
        let base = if n == 0 {
            stem.to_owned()
        } else {
            format!("{stem}.{n}")
        };
        let (target, reason) = (format!("{base}.json"), format!("{base}.reason"));
        if !taken(&target)? && !taken(&reason)? {
            return Ok((target, reason));
        }
    }
    unreachable!("some name in bad/ is free")
}

/// The stem a refused file is parked under in `bad/` (before any `.1`, `.2` for clashes): control
/// characters and `/` become `_`, and a leading dot gets a `_` before it.
pub fn safe_stem(name: &str) -> String {
    let stem = name.strip_suffix(".json").unwrap_or(name);
    let mut s: String = stem
        .chars()
        .map(|c| if c.is_control() || c == '/' { '_' } else { c })
        .collect();
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '_');
    }
    s.chars().take(120).collect()
}

/// For a body with a `secret`: the body with the secret replaced, and the secret's fingerprint.
/// A body that parses as a JSON object is rewritten as JSON; one that does not (broken JSON,
/// too deep, a stray byte) still has every `"secret": "…"` value blanked out in its text, so no
/// parked copy keeps a plaintext secret.
pub(super) fn redact_secret(bytes: &[u8]) -> Option<(Vec<u8>, Option<String>)> {
    let by_key = match serde_json::from_slice::<Value>(bytes) {
        // Parsed, escapes are decoded and a key given twice is kept once: the copy is written
        // from the value, so an earlier duplicate is gone with it.
        Ok(mut value) => {
            let fp = value.as_object_mut().and_then(|obj| {
                // A signal's secret, or a callback trigger's token: both are capabilities,
                // whatever type the sender gave them.
                let key = ["secret", "callback"]
                    .into_iter()
                    .find(|k| obj.contains_key(*k))?;
                let old = obj.get(key)?;
                let fp = secret::fingerprint(old.as_str().unwrap_or(&old.to_string()));
                obj.insert(
                    key.into(),
                    Value::String(format!("[redacted; sha256 starts {fp}]")),
                );
                Some(fp)
            });
            Some((durable::to_pretty_json(&value), fp))
        }
        Err(_) => redact_secret_text(bytes).map(|(b, fp)| (b, Some(fp))),
    };
    // Then any run of hex long enough to be a secret, anywhere (in an array, a message, an
    // escaped spelling): the parked copy holds no plaintext secret of any waitpoint.
    let (text, fp) = by_key.unwrap_or_else(|| (bytes.to_vec(), None));
    let (text, ran) = secret::redact_hex_runs(&text);
    match fp {
        Some(fp) => Some((text, Some(fp))),
        None if ran || text != bytes => Some((text, None)),
        None => None,
    }
}

/// Copies a file too large to read at once into `bad/target`, every secret-like run of hex
/// removed, reading it through a handle opened without following links or blocking.
/// How much of a file refused unread is kept in `bad/`: enough to see what it was. A larger
/// file (a 2 GB sparse one filled the disk and held the batch up while it was copied whole) is
/// cut there.
pub(super) const EXCERPT: u64 = 64 * 1024;

pub(super) fn copy_redacted(dz: &Dir, source: &OsStr, bad: &Dir, target: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let path = || dz.path().join(source);
    let mut file = dz
        .open_read(source)
        .map_err(|e| Error::io("cannot read", path(), e))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io("cannot read", path(), e))?;
    if !meta.is_file() || meta.nlink() != 1 {
        return dz.rename_durably(source, bad, target);
    }
    bad.commit_with(target, |out| {
        let mut redactor = secret::HexRedactor::default();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut clean = Vec::with_capacity(chunk.len() + 16);
        let mut file = (&mut file).take(EXCERPT);
        loop {
            let n = match file.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            redactor.feed(&chunk[..n], &mut clean);
            out.write_all(&clean)?;
            clean.clear();
        }
        redactor.finish(&mut clean);
        out.write_all(&clean)
    })
}

/// The textual fallback of [`redact_secret`]: replaces the string after each `"secret"` key.
/// Returns the fingerprint of the first secret found, or `None` when there is none.
pub(super) fn redact_secret_text(bytes: &[u8]) -> Option<(Vec<u8>, String)> {
    const KEY: &[u8] = b"\"secret\"";
    let mut out = Vec::with_capacity(bytes.len());
    let mut first_fp = None;
    let mut rest = bytes;
    while let Some(at) = find(rest, KEY) {
        let after_key = at + KEY.len();
        out.extend_from_slice(&rest[..after_key]);
        rest = &rest[after_key..];
        // `"secret"`, optional blanks, `:`, optional blanks, then the quoted value.
        let colon = skip_blanks(rest);
        if rest.get(colon) != Some(&b':') {
            continue;
        }
        let quote = colon + 1 + skip_blanks(&rest[colon + 1..]);
        if rest.get(quote) != Some(&b'"') {
            continue;
        }
        let start = quote + 1;
        let mut end = start;
        while end < rest.len() && rest[end] != b'"' {
            end += if rest[end] == b'\\' { 2 } else { 1 };
        }
        let end = end.min(rest.len());
        let fp = secret::fingerprint(&String::from_utf8_lossy(&rest[start..end]));
        out.extend_from_slice(&rest[..start]);
        out.extend_from_slice(format!("[redacted; sha256 starts {fp}]").as_bytes());
        first_fp.get_or_insert(fp);
        rest = &rest[end..];
    }
    out.extend_from_slice(rest);
    first_fp.map(|fp| (out, fp))
}

pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

pub(super) fn skip_blanks(b: &[u8]) -> usize {
    b.iter()
        .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_broken_json_are_redacted_too() {
        let body =
            b"\xef\xbb\xbf{\"id\":\"wp_0123456789ab\", \"secret\" : \"s3cr\\\"et\",\"x\":[[[";
        let (copy, fp) = redact_secret(body).unwrap();
        let fp = fp.expect("found by its key");
        let copy = String::from_utf8_lossy(&copy);
        assert!(!copy.contains("s3cr"), "{copy}");
        assert!(
            copy.contains(&format!("[redacted; sha256 starts {fp}]")),
            "{copy}"
        );
        assert!(copy.contains("wp_0123456789ab"), "the rest is kept: {copy}");
        assert_eq!(redact_secret(b"no secret here"), None);
        // A key with no value after it, at the very end, is left as it is.
        assert_eq!(redact_secret(b"{\"secret\""), None);
    }

    #[test]
    fn a_secret_in_any_place_or_spelling_leaves_no_plaintext_in_the_copy() {
        let s = secret::generate();
        let escaped: String = s.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
        for body in [
            format!(r#"{{"id":"wp_0123456789ab","\u0073ecret":"{s}"}}"#),
            format!(r#"{{"id":"wp_0123456789ab","secret":"{s}","secret":"other"}}"#),
            format!(r#"{{"id":"wp_0123456789ab","secret":["{s}"]}}"#),
            format!(r#"{{"id":"wp_0123456789ab","data":{{"nested":["{escaped}"]}}"#),
            format!(r#"not json {escaped} at all"#),
        ] {
            let (copy, _) = redact_secret(body.as_bytes()).unwrap_or_else(|| panic!("{body}"));
            let copy = String::from_utf8_lossy(&copy);
            assert!(
                !copy.contains(&s) && !copy.contains(&escaped),
                "{body}\n{copy}"
            );
        }
    }

    #[test]
    fn secrets_in_valid_json_are_redacted() {
        let (copy, _) =
            redact_secret(br#"{"id":"wp_0123456789ab","secret":"abc","memebr":1}"#).unwrap();
        assert!(!String::from_utf8_lossy(&copy).contains("\"abc\""));
    }
}
