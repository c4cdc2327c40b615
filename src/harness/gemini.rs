//! Gemini CLI: which of its sessions an MCP call comes from, and whether a Gemini process is a
//! headless run. Gemini gives an MCP server no session id (not in its environment, not in a
//! call's `_meta`), while its hooks get `session_id` on stdin; both are children of the same
//! Gemini process. So its `SessionStart` hook records "process P is in session S" under the home
//! (`harness-pids/<P>.json`), and `waitpoint mcp` reads the record of its own parent on every
//! call: after `/clear` the same process moves to a new session, and the record with it.
//!
//! A record names its process by pid and start time (clock ticks since boot, from
//! `/proc/P/stat`): a pid reused by another process after Gemini exited does not match, and its
//! record is ignored (and removed when the next record is written). Records are written
//! atomically beneath the home, read without following a link and capped in size, and each
//! write prunes those whose process is gone, so the folder holds one per running Gemini.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::durable;
use crate::error::Result;
use crate::harness::{Caller, Harness};
use crate::home::Home;

/// The folder of the records, one per running Gemini process.
pub fn records_dir(home: &Home) -> PathBuf {
    home.root().join("harness-pids")
}

fn record_file(home: &Home, pid: libc::pid_t) -> PathBuf {
    records_dir(home).join(format!("{pid}.json"))
}

/// "Process `pid`, started at `started`, is in `caller`'s session."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ProcessRecord {
    pid: libc::pid_t,
    started: u64,
    caller: Caller,
}

/// When process `pid` started, in clock ticks since boot (field 22 of `/proc/PID/stat`);
/// `None` when it is gone.
pub fn start_ticks(pid: libc::pid_t) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name sits in parentheses and may hold anything; the fields after the last ')' are
    // fixed: the state is the first, the start time the twentieth.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The process that started this one, shells and wrappers passed over: for a hook or an MCP
/// server of Gemini's, the Gemini process whose record names the session.
pub fn starter() -> Option<libc::pid_t> {
    crate::process::starter_pid()
}

/// Records that Gemini process `pid` is in `caller`'s session (its `SessionStart` hook, at
/// start, on `/clear` and on a resume), and removes the records of processes that are gone.
pub fn record_process(home: &Home, pid: libc::pid_t, caller: &Caller) -> Result<()> {
    let Some(started) = start_ticks(pid) else {
        // Gone already: nobody will call for it.
        return Ok(());
    };
    let dir = records_dir(home);
    durable::create_dir_private(&dir)?;
    prune(home);
    let record = ProcessRecord {
        pid,
        started,
        caller: caller.clone(),
    };
    durable::commit_json(&record_file(home, pid), &record)
}

/// The session Gemini process `pid` is in now, if its record is there and names this very
/// process (not an earlier one under the same pid).
pub fn caller_of_process(home: &Home, pid: libc::pid_t) -> Option<Caller> {
    let record = read_record(home, pid)?;
    (Some(record.started) == start_ticks(pid)).then_some(record.caller)
}

fn read_record(home: &Home, pid: libc::pid_t) -> Option<ProcessRecord> {
    let found: Option<ProcessRecord> = durable::read_json_or_set_aside(
        &home.quarantine_dir(),
        home.root(),
        &record_file(home, pid),
    )
    .ok()
    .flatten();
    // A record edited by hand into another pid, or a session id that is not a plain token,
    // names nothing.
    found.filter(|r| {
        r.pid == pid
            && r.caller
                .harness
                .session_name(&r.caller.session_id)
                .is_some()
    })
}

/// Forgets process `pid` (its `SessionEnd` on exit), if its record still names `session`: a
/// `/clear` has written the next session's already.
pub fn forget_process(home: &Home, pid: libc::pid_t, session: &str) -> Result<()> {
    if read_record(home, pid).is_some_and(|r| r.caller.session() == session) {
        let file = record_file(home, pid);
        match durable::unlink(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(crate::error::Error::io("cannot remove", &file, e)),
        }
    }
    Ok(())
}

/// The running Gemini process whose record names `session`, if any: the session is open there
/// (a TUI between turns, a `-p` run), so a resume in a second process would write the same
/// conversation from two places.
pub fn open_in(home: &Home, session: &str) -> Option<libc::pid_t> {
    pids(home)
        .into_iter()
        .find(|&pid| caller_of_process(home, pid).is_some_and(|c| c.session() == session))
}

/// The pids that have a record; at most [`MAX_RECORDS`] are looked at, so a folder filled by
/// hand costs a bounded time.
fn pids(home: &Home) -> Vec<libc::pid_t> {
    durable::list_names(&records_dir(home))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| n.strip_suffix(".json")?.parse().ok())
        .filter(|&pid: &libc::pid_t| pid > 0)
        .take(MAX_RECORDS)
        .collect()
}

/// How many records a scan looks at: far more Gemini processes than one user runs at once.
const MAX_RECORDS: usize = 4096;

/// Removes the records whose process is gone or is another process now.
fn prune(home: &Home) {
    for pid in pids(home) {
        let live = read_record(home, pid).is_some_and(|r| Some(r.started) == start_ticks(pid));
        if !live {
            let _ = durable::unlink(&record_file(home, pid));
        }
    }
}

/// Whether Gemini process `pid` runs headless (`gemini -p`, a prompt piped in, a resume run by
/// the daemon): nothing in a hook's environment or input says so, but the process's own argv
/// has `-p`/`--prompt`, or its standard input is not a terminal. Nobody is idle in such a run,
/// and a hook that waited would hold it up. A process that cannot be read counts as headless:
/// better a wake delivered by a resume later than a run held up.
pub fn is_headless(pid: libc::pid_t) -> bool {
    let Ok(argv) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return true;
    };
    let stdin = std::fs::read_link(format!("/proc/{pid}/fd/0")).ok();
    headless(&argv, stdin.as_deref())
}

fn headless(argv: &[u8], stdin: Option<&std::path::Path>) -> bool {
    let prompt_flag = argv
        .split(|&b| b == 0)
        .take_while(|a| *a != b"--")
        .any(|a| a == b"-p" || a == b"--prompt" || a.starts_with(b"--prompt="));
    let terminal = stdin.is_some_and(is_terminal_path);
    prompt_flag || !terminal
}

fn is_terminal_path(p: &Path) -> bool {
    let p = p.to_string_lossy();
    p.starts_with("/dev/pts/") || p.starts_with("/dev/tty")
}

/// The length of a Gemini session's transcript (`transcript_path` on a hook's stdin) now;
/// `None` when it is not a regular file that can be opened without blocking or following a
/// link.
pub fn transcript_len(path: &Path) -> Option<u64> {
    let f = open_transcript(path)?;
    Some(f.metadata().ok()?.len())
}

fn open_transcript(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    f.metadata().ok()?.is_file().then_some(f)
}

/// Whether the session moved on past a hook that started when its transcript was `from` bytes
/// long: a message was written since (Esc writes an `info` "Request cancelled.", a prompt a
/// `user` message). Gemini also appends `{"$set": …}` updates, which are no message; a
/// transcript that shrank or cannot be read any more counts as moved on. At most 64 KiB of
/// what was appended is read.
pub fn transcript_moved_on(path: &Path, from: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Some(mut f) = open_transcript(path) else {
        return true;
    };
    let len = f.metadata().map_or(0, |m| m.len());
    if len < from {
        return true;
    }
    let mut added = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_err() || f.take(64 * 1024).read_to_end(&mut added).is_err()
    {
        return true;
    }
    moved_on(&added)
}

fn moved_on(added: &[u8]) -> bool {
    added
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .any(|v| v.get("type").is_some())
}

/// The caller a Gemini hook names (its stdin's `session_id` and `cwd`).
pub fn from_hook_input(input: &serde_json::Value) -> Option<Caller> {
    super::from_hook_input(Harness::Gemini, input)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn caller(id: &str) -> Caller {
        from_hook_input(&json!({"session_id": id, "cwd": "/p"})).unwrap()
    }

    #[test]
    fn a_process_record_names_the_session_until_clear_moves_it_and_exit_forgets_it() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let me = std::process::id() as libc::pid_t;
        assert_eq!(caller_of_process(&home, me), None);
        record_process(&home, me, &caller("a1")).unwrap();
        assert_eq!(caller_of_process(&home, me), Some(caller("a1")));
        assert_eq!(open_in(&home, "gemini-a1"), Some(me));
        // `/clear`: SessionEnd(clear) of a1, SessionStart(clear) of b2, in the same process.
        record_process(&home, me, &caller("b2")).unwrap();
        forget_process(&home, me, "gemini-a1").unwrap();
        assert_eq!(caller_of_process(&home, me), Some(caller("b2")));
        assert_eq!(open_in(&home, "gemini-a1"), None);
        forget_process(&home, me, "gemini-b2").unwrap();
        assert_eq!(caller_of_process(&home, me), None);
    }

    #[test]
    fn a_record_of_a_gone_or_reused_pid_names_nothing_and_is_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        record_process(&home, pid, &caller("gone")).unwrap();
        assert_eq!(caller_of_process(&home, pid), Some(caller("gone")));
        // The same pid started at another time is another process.
        let file = record_file(&home, pid);
        let mut reused: ProcessRecord =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        reused.started += 1;
        durable::commit_json(&file, &reused).unwrap();
        assert_eq!(caller_of_process(&home, pid), None);
        child.kill().unwrap();
        child.wait().unwrap();
        let me = std::process::id() as libc::pid_t;
        record_process(&home, me, &caller("live")).unwrap();
        assert!(!file.exists(), "the gone process's record is pruned");
    }

    #[test]
    fn a_linked_record_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let me = std::process::id() as libc::pid_t;
        record_process(&home, me, &caller("a1")).unwrap();
        let file = record_file(&home, me);
        let outside = dir.path().join("outside.json");
        std::fs::copy(&file, &outside).unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&outside, &file).unwrap();
        assert_eq!(caller_of_process(&home, me), None);
        assert!(outside.exists());
    }

    #[test]
    fn a_transcript_moves_on_with_a_message_not_with_an_update() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("session.jsonl");
        std::fs::write(&t, "{\"type\":\"gemini\",\"content\":\"ok\"}\n").unwrap();
        let from = transcript_len(&t).unwrap();
        assert!(!transcript_moved_on(&t, from));
        let mut f = std::fs::OpenOptions::new().append(true).open(&t).unwrap();
        std::io::Write::write_all(&mut f, b"{\"$set\":{\"lastUpdated\":\"x\"}}\n").unwrap();
        assert!(!transcript_moved_on(&t, from), "an update is no message");
        std::io::Write::write_all(
            &mut f,
            b"{\"id\":\"1\",\"type\":\"info\",\"content\":\"Request cancelled.\"}\n",
        )
        .unwrap();
        assert!(transcript_moved_on(&t, from));
        // Rewritten shorter, or gone: moved on (leaving loses nothing).
        assert!(transcript_moved_on(&t, from + 10_000));
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&t, &link).unwrap();
        assert_eq!(transcript_len(&link), None);
        assert!(transcript_moved_on(&link, 0));
    }

    #[test]
    fn headless_is_a_prompt_flag_or_no_terminal() {
        let tty = Some(Path::new("/dev/pts/3"));
        let argv = |s: &str| s.replace(' ', "\0").into_bytes();
        assert!(!headless(&argv("node gemini"), tty));
        assert!(!headless(&argv("node gemini -i hello"), tty));
        assert!(headless(&argv("node gemini -p hi"), tty));
        assert!(headless(&argv("node gemini --prompt=hi"), tty));
        assert!(headless(
            &argv("node gemini --resume x -o json"),
            Some(Path::new("/dev/null"))
        ));
        assert!(headless(&argv("node gemini"), None));
        // After `--` it is the prompt's text, not a flag.
        assert!(!headless(&argv("node gemini -- -p"), tty));
    }
}
