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
//! - a complete line that does not parse: the file was damaged; the line is skipped and
//!   logged, the records around it still count, and `doctor` names the log.
//! - a log bigger than [`MAX_LOG_READ`]: only its newest part is read.
//! - records in the older form, one file each in `signals/<seq>-<key>.json` (a home written
//!   before the log): they are read too, and the log wins where both hold a `seq`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::durable::{self, Root};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::records::SignalRecord;

use super::files::parse_signal_file_name;

/// The most bytes of a log that are read: its newest part when it is bigger. The engine keeps
/// a log well under this (`engine::rules::LOG_KEEP_BYTES`); a bigger one (written before the
/// log was bounded, or grown by hand) is read from its end, so every reader still answers and
/// the deadline and the final signal are still processed. `doctor` names such a log.
pub const MAX_LOG_READ: u64 = 8 * 1024 * 1024;

/// A waitpoint's records as read: in `seq` order; whether the log ended in a cut-short line
/// that was left out; whether its oldest part was left unread (bigger than [`MAX_LOG_READ`]);
/// and how many complete lines did not parse (skipped, each logged).
#[derive(Debug, Default)]
pub struct Logged {
    pub records: Vec<SignalRecord>,
    pub torn: bool,
    pub head_unread: bool,
    pub damaged: u64,
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
    let mut logged = match read_log(home.root_dir(), &path)? {
        Some((bytes, head_unread)) => {
            let parsed = parse_tail(&bytes, head_unread);
            for (line, why) in &parsed.damaged {
                tracing::warn!(
                    waitpoint = %id,
                    path = %path.display(),
                    line,
                    why = %why,
                    "a line of the signal log does not parse and is skipped",
                );
            }
            Logged {
                records: parsed.records.into_values().collect(),
                torn: parsed.torn,
                head_unread,
                damaged: parsed.damaged.len() as u64,
            }
        }
        None => Logged::default(),
    };
    let mut older = BTreeMap::new();
    for (name, file) in home.root_dir().list_dir(&home.signals_dir(id))? {
        let Some((seq, _)) = parse_signal_file_name(&name) else {
            continue;
        };
        if logged.records.iter().any(|r| r.seq == seq) {
            continue;
        }
        if let Some(record) = home.root_dir().read_json::<SignalRecord>(&file)? {
            older.insert(seq, record);
        }
    }
    if !older.is_empty() {
        logged.records.extend(older.into_values());
        logged.records.sort_by_key(|r| r.seq);
    }
    Ok(logged)
}

/// The records of waitpoint `id` from `first_seq` on, read from the log's end: a monitor's or
/// a heartbeat sender's wake costs the log's newest lines, not the whole log.
pub fn read_from(home: &Home, id: &str, first_seq: u64) -> Result<Vec<SignalRecord>> {
    if first_seq <= 1 || home.signals_dir(id).exists() {
        let mut all = read(home, id)?.records;
        all.retain(|r| r.seq >= first_seq);
        return Ok(all);
    }
    let path = home.signal_log(id);
    let mut window = TAIL_FIRST_READ;
    loop {
        let Some((bytes, head_unread)) = read_log_tail(home.root_dir(), &path, window)? else {
            return Ok(Vec::new());
        };
        let parsed = parse_tail(&bytes, head_unread);
        // Enough once a record before the range was read (every one after it is in hand), or
        // the whole log, or as much as any reader reads.
        let before_range = parsed.records.keys().next().is_some_and(|s| *s < first_seq);
        if before_range || !head_unread || window >= MAX_LOG_READ {
            return Ok(parsed
                .records
                .into_values()
                .filter(|r| r.seq >= first_seq)
                .collect());
        }
        window = (window * 4).min(MAX_LOG_READ);
    }
}

/// How much of a log's end [`read_from`] reads first.
const TAIL_FIRST_READ: u64 = 64 * 1024;

/// The log's newest bytes (at most [`MAX_LOG_READ`]) and whether older ones were left unread,
/// or `None` when there is none; only a regular file is read (a FIFO does not block, a link is
/// not followed).
fn read_log(root: &Root, path: &Path) -> Result<Option<(Vec<u8>, bool)>> {
    read_log_tail(root, path, MAX_LOG_READ)
}

/// [`read_log`] to at most `cap` bytes from the end.
fn read_log_tail(root: &Root, path: &Path, cap: u64) -> Result<Option<(Vec<u8>, bool)>> {
    // A link, a FIFO or a directory under the log's name is not ours: it is set aside (with a
    // reason, logged) and read as no log, so it costs only itself and the next append makes
    // a real one.
    let link = |e: &Error| {
        matches!(e, Error::Io { source, .. }
            if source.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()))
    };
    let is_not_regular =
        |e: &Error| matches!(e, Error::Corrupt { message, .. } if message == durable::NOT_REGULAR);
    match root.read_tail(path, cap) {
        Err(e) if link(&e) || is_not_regular(&e) => root
            .set_aside(path, "is not a regular file where the home keeps a log")
            .map(|()| None),
        other => other,
    }
}

/// [`parse`] of a log's end: read from the middle (`head_unread`), the first line may be a
/// piece of one, and is not a record.
fn parse_tail(bytes: &[u8], head_unread: bool) -> Parsed {
    let from = match head_unread {
        true => bytes
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |i| i + 1),
        false => 0,
    };
    parse(&bytes[from..])
}

/// A log's lines, parsed.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub records: BTreeMap<u64, SignalRecord>,
    /// Whether a last line without its newline was left out.
    pub torn: bool,
    /// Complete lines that did not parse: their number (from 1) and why.
    pub damaged: Vec<(usize, String)>,
}

/// The complete lines of a log by `seq`; a cut-short last line and lines that do not parse are
/// left out and said. A damaged line costs only itself: the records around it still count.
pub(crate) fn parse(bytes: &[u8]) -> Parsed {
    let mut out = Parsed::default();
    for (n, line) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
        let Some(line) = line.strip_suffix(b"\n") else {
            out.torn = true;
            break;
        };
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<SignalRecord>(line) {
            Ok(record) => {
                out.records.insert(record.seq, record);
            }
            Err(e) => out.damaged.push((n + 1, e.to_string())),
        }
    }
    out
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
    if have.torn && have.head_unread {
        // The log was not read whole, so it is not written again whole: the cut-short line is
        // ended (a damaged line readers skip) and the missing records follow it.
        let mut bytes = b"\n".to_vec();
        bytes.extend(lines(&missing));
        return Mend::Append(bytes);
    }
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

    fn logged(records: Vec<SignalRecord>, torn: bool) -> Logged {
        Logged {
            records,
            torn,
            ..Logged::default()
        }
    }

    #[test]
    fn a_cut_short_last_line_is_left_out_and_a_replay_writes_the_log_again_without_it() {
        let mut bytes = lines(&[record(1), record(2)]);
        bytes.extend_from_slice(br#"{"seq":3,"sou"#);
        let read = parse(&bytes);
        assert!(read.torn);
        assert_eq!(read.records.keys().copied().collect::<Vec<_>>(), [1, 2]);
        let have = logged(read.records.into_values().collect(), true);
        let Mend::Rewrite(again) = merged(have, &[record(2), record(3)]) else {
            panic!("a torn log is written again whole");
        };
        let again = parse(&again);
        assert!(!again.torn);
        assert_eq!(again.records.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn a_torn_log_read_only_in_part_is_mended_by_an_append_that_ends_the_cut_line() {
        let mut bytes = lines(&[record(1), record(2)]);
        bytes.extend_from_slice(br#"{"seq":3,"sou"#);
        let have = Logged {
            head_unread: true,
            ..logged(vec![record(2)], true)
        };
        let Mend::Append(tail) = merged(have, &[record(3)]) else {
            panic!("a log read in part is never written again whole");
        };
        bytes.extend(tail);
        let read = parse(&bytes);
        assert_eq!(read.records.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(read.damaged.len(), 1, "the cut line is skipped as damaged");
    }

    #[test]
    fn a_replay_appends_only_the_records_missing_from_an_intact_log() {
        let have = logged(vec![record(1), record(2)], false);
        let Mend::Append(tail) = merged(have, &[record(2), record(3)]) else {
            panic!("an intact log gets the missing lines appended");
        };
        let tail = parse(&tail);
        assert_eq!(tail.records.keys().copied().collect::<Vec<_>>(), [3]);
        let full = logged(vec![record(1)], false);
        assert!(matches!(merged(full, &[record(1)]), Mend::Nothing));
    }

    #[test]
    fn a_damaged_complete_line_costs_only_itself_and_is_named() {
        let mut bytes = lines(&[record(1)]);
        bytes.extend_from_slice(b"not json\n");
        bytes.extend_from_slice(&lines(&[record(3)]));
        let read = parse(&bytes);
        assert_eq!(read.records.keys().copied().collect::<Vec<_>>(), [1, 3]);
        assert_eq!(read.damaged.len(), 1);
        assert_eq!(
            read.damaged[0].0, 2,
            "the damaged line is named by its number"
        );
    }

    #[test]
    fn a_read_from_a_seq_reads_back_from_the_end_until_it_has_the_whole_range() {
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::new(tmp.path());
        let id = "wp_0123456789ab";
        std::fs::create_dir_all(home.waitpoint_dir(id)).unwrap();
        // 3,000 records of about 1 KB, every tenth seq folded (not in the log).
        let records: Vec<SignalRecord> = (1..=3_000u64)
            .filter(|seq| seq % 10 != 0)
            .map(|seq| SignalRecord {
                message: Some("m".repeat(1_000)),
                ..record(seq)
            })
            .collect();
        std::fs::write(home.signal_log(id), lines(&records)).unwrap();
        for first in [2_995, 2_990, 2_000, 11, 2] {
            let got: Vec<u64> = read_from(&home, id, first)
                .unwrap()
                .iter()
                .map(|r| r.seq)
                .collect();
            let want: Vec<u64> = records
                .iter()
                .map(|r| r.seq)
                .filter(|s| *s >= first)
                .collect();
            assert_eq!(got, want, "from {first}");
        }
        assert!(read_from(&home, "wp_000000000000", 5).unwrap().is_empty());
    }
}
