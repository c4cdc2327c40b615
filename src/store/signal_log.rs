//! A waitpoint's recorded signals: `waitpoints/<id>/signals.jsonl`, one record per line in the
//! order of their `seq`, appended by each batch that records some (under the waitpoint's lock).
//!
//! One file a waitpoint instead of one file a signal: a signal then costs one `write` to a
//! file that exists (it is made with the waitpoint) instead of a file made, written and
//! renamed. The journal line made the records durable before they are appended, so the
//! append is not fsynced; the checkpoint makes it durable with everything else.
//!
//! What a reader may meet, and what it does:
//! - a last line without its newline: an append still being written, or one a crash or a
//!   failed write cut short. It is not a record yet and is left out. The journal still holds
//!   that batch (a checkpoint runs only after a batch's files are all written), and its replay
//!   writes the log again without it ([`merged`]).
//! - a complete line that does not parse: the file was damaged; the read fails and names the
//!   line, for that waitpoint only.
//! - records in the older form, one file each in `signals/<seq>-<key>.json` (a home written
//!   before the log): they are read too, and the log wins where both hold a `seq`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::durable::{self, MAX_RECORD_BYTES};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::records::SignalRecord;

use super::files::parse_signal_file_name;

/// The most bytes a log is read to: 64 records of the largest body for every 16 MB a single
/// record file may hold; a bigger one is refused for its waitpoint alone.
pub const MAX_LOG_BYTES: u64 = 4 * MAX_RECORD_BYTES;

/// A waitpoint's records as read: in `seq` order, and whether the log ended in a cut-short
/// line that was left out.
#[derive(Debug, Default)]
pub struct Logged {
    pub records: Vec<SignalRecord>,
    pub torn: bool,
}

/// `records` as log lines: compact JSON, each ending in a newline.
pub fn lines(records: &[SignalRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        serde_json::to_writer(&mut out, r).expect("our records always serialise");
        out.push(b'\n');
    }
    out
}

/// Every record of waitpoint `id`: the log's, and any in the older one-file-each form.
pub fn read(home: &Home, id: &str) -> Result<Logged> {
    let path = home.signal_log(id);
    let (mut by_seq, torn) = match read_log(&path)? {
        Some(bytes) => parse(&path, &bytes)?,
        None => (BTreeMap::new(), false),
    };
    for (name, file) in durable::list_dir(&home.signals_dir(id))? {
        let Some((seq, _)) = parse_signal_file_name(&name) else {
            continue;
        };
        if by_seq.contains_key(&seq) {
            continue;
        }
        if let Some(record) = durable::read_json::<SignalRecord>(&file)? {
            by_seq.insert(seq, record);
        }
    }
    Ok(Logged {
        records: by_seq.into_values().collect(),
        torn,
    })
}

/// The log's bytes, or `None` when there is none; only a regular file of at most
/// [`MAX_LOG_BYTES`] is read (a FIFO does not block, a link is not followed).
fn read_log(path: &Path) -> Result<Option<Vec<u8>>> {
    // A link, a FIFO or a directory under the log's name is not ours: it is set aside (with a
    // reason, logged) and read as no log, so it costs only itself and the next append makes
    // a real one.
    let link = |e: &Error| {
        matches!(e, Error::Io { source, .. }
            if source.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()))
    };
    match durable::read_capped(path, MAX_LOG_BYTES) {
        Err(e)
            if link(&e)
                || matches!(&e, Error::Corrupt { message, .. } if message == durable::NOT_REGULAR) =>
        {
            durable::set_aside_in_home(path, "is not a regular file where the home keeps a log")
                .map(|()| None)
        }
        other => other,
    }
}

/// The complete lines of a log by `seq`, and whether a cut-short last line was left out.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<(BTreeMap<u64, SignalRecord>, bool)> {
    let mut out = BTreeMap::new();
    let mut lines = bytes.split_inclusive(|b| *b == b'\n').enumerate();
    let mut torn = false;
    for (n, line) in &mut lines {
        let Some(line) = line.strip_suffix(b"\n") else {
            torn = true;
            break;
        };
        if line.is_empty() {
            continue;
        }
        let record: SignalRecord = serde_json::from_slice(line).map_err(|e| Error::Corrupt {
            path: path.to_owned(),
            message: format!("line {}: {e}", n + 1),
        })?;
        out.insert(record.seq, record);
    }
    Ok((out, torn))
}

/// What a replay must write so the log holds `wanted` (a journal entry's records) as well as
/// what it holds: nothing, the missing lines to append, or (after a cut-short line) the whole
/// log again, to be put in place of the old one.
pub enum Mend {
    Nothing,
    Append(Vec<u8>),
    Rewrite(Vec<u8>),
}

/// [`Mend`] for a log read as `have`.
pub fn merged(have: Logged, wanted: &[SignalRecord]) -> Mend {
    let missing: Vec<SignalRecord> = wanted
        .iter()
        .filter(|w| !have.records.iter().any(|r| r.seq == w.seq))
        .cloned()
        .collect();
    if have.torn {
        let mut all = have.records;
        all.extend(missing);
        all.sort_by_key(|r| r.seq);
        return Mend::Rewrite(lines(&all));
    }
    match missing.is_empty() {
        true => Mend::Nothing,
        false => Mend::Append(lines(&missing)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64) -> SignalRecord {
        crate::records::test_record(seq, &format!("spool:{seq}.json"))
    }

    #[test]
    fn a_cut_short_last_line_is_left_out_and_a_replay_writes_the_log_again_without_it() {
        let mut bytes = lines(&[record(1), record(2)]);
        bytes.extend_from_slice(br#"{"seq":3,"sou"#);
        let (read, torn) = parse(Path::new("log"), &bytes).unwrap();
        assert!(torn);
        assert_eq!(read.keys().copied().collect::<Vec<_>>(), [1, 2]);
        let have = Logged {
            records: read.into_values().collect(),
            torn,
        };
        let Mend::Rewrite(again) = merged(have, &[record(2), record(3)]) else {
            panic!("a torn log is written again whole");
        };
        let (again, torn) = parse(Path::new("log"), &again).unwrap();
        assert!(!torn);
        assert_eq!(again.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn a_replay_appends_only_the_records_missing_from_an_intact_log() {
        let have = Logged {
            records: vec![record(1), record(2)],
            torn: false,
        };
        let Mend::Append(tail) = merged(have, &[record(2), record(3)]) else {
            panic!("an intact log gets the missing lines appended");
        };
        let (tail, _) = parse(Path::new("log"), &tail).unwrap();
        assert_eq!(tail.keys().copied().collect::<Vec<_>>(), [3]);
        let full = Logged {
            records: vec![record(1)],
            torn: false,
        };
        assert!(matches!(merged(full, &[record(1)]), Mend::Nothing));
    }

    #[test]
    fn a_damaged_complete_line_is_an_error_naming_the_line() {
        let mut bytes = lines(&[record(1)]);
        bytes.extend_from_slice(b"not json\n");
        bytes.extend_from_slice(&lines(&[record(3)]));
        let e = parse(Path::new("log"), &bytes).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }
}
