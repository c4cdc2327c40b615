//! Which harness session a harness process is in now: `harness-pids/<pid>.json` under the home,
//! one record per running harness process. A harness that gives an MCP server no session id
//! (Gemini CLI), or one whose session id moves on while the process stays (Claude Code and
//! Gemini after `/clear`), has its `SessionStart` hook record "process P is in session S", and
//! `waitpoint mcp` (and the CLI in the harness's shell tool) reads the record of the process
//! that started it on every call.
//!
//! A record names its process by pid and start time (clock ticks since boot, from
//! `/proc/P/stat`): a pid reused by another process after the harness exited does not match,
//! and its record is ignored (and removed when the next record is written). Records are written
//! atomically beneath the home, read without following a link and capped in size, and each
//! write prunes those whose process is gone, so the folder holds one per running harness.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::durable;
use crate::error::Result;
use crate::harness::Caller;
use crate::home::Home;

/// The folder of the records, one per running harness process.
pub fn records_dir(home: &Home) -> PathBuf {
    home.root().join("harness-pids")
}

fn record_file(home: &Home, pid: rustix::process::RawPid) -> PathBuf {
    records_dir(home).join(format!("{pid}.json"))
}

/// "Process `pid`, started at `started`, is in `caller`'s session."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ProcessRecord {
    pid: rustix::process::RawPid,
    started: u64,
    caller: Caller,
}

/// When process `pid` started, in clock ticks since boot (field 22 of `/proc/PID/stat`);
/// `None` when it is gone.
pub fn start_ticks(pid: rustix::process::RawPid) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name sits in parentheses and may hold anything; the fields after the last ')' are
    // fixed: the state is the first, the start time the twentieth.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The process that started this one, shells and wrappers passed over: for a hook or an MCP
/// server of a harness's, the harness process whose record names the session.
/// (Here, not called as `process::starter_pid` from the front ends: `mcp` may not import
/// `process`, by the layer table.)
pub fn starter() -> Option<rustix::process::RawPid> {
    crate::process::starter_pid()
}

/// Records that harness process `pid` is in `caller`'s session (its `SessionStart` hook, at
/// start, on `/clear` and on a resume), and removes the records of processes that are gone.
pub fn record_process(home: &Home, pid: rustix::process::RawPid, caller: &Caller) -> Result<()> {
    let Some(started) = start_ticks(pid) else {
        // Gone already: nobody will call for it.
        return Ok(());
    };
    let dir = records_dir(home);
    home.root_dir().create_dir_private(&dir)?;
    prune(home);
    let record = ProcessRecord {
        pid,
        started,
        caller: caller.clone(),
    };
    home.root_dir()
        .commit_json(&record_file(home, pid), &record)
}

/// The session harness process `pid` is in now, if its record is there and names this very
/// process (not an earlier one under the same pid).
pub fn caller_of_process(home: &Home, pid: rustix::process::RawPid) -> Option<Caller> {
    let record = read_record(home, pid)?;
    (Some(record.started) == start_ticks(pid)).then_some(record.caller)
}

fn read_record(home: &Home, pid: rustix::process::RawPid) -> Option<ProcessRecord> {
    let found: Option<ProcessRecord> =
        durable::read_json_or_set_aside(home.root_dir(), &record_file(home, pid))
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
pub fn forget_process(home: &Home, pid: rustix::process::RawPid, session: &str) -> Result<()> {
    if read_record(home, pid).is_some_and(|r| r.caller.session() == session) {
        let file = record_file(home, pid);
        match home.root_dir().unlink(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(crate::error::Error::io("cannot remove", &file, e)),
        }
    }
    Ok(())
}

/// The running harness process whose record names `session`, if any: the session is open there
/// (a TUI between turns, a `-p` run), so a resume in a second process would write the same
/// conversation from two places.
pub fn open_in(home: &Home, session: &str) -> Option<rustix::process::RawPid> {
    pids(home)
        .into_iter()
        .find(|&pid| caller_of_process(home, pid).is_some_and(|c| c.session() == session))
}

/// The pids that have a record; at most [`MAX_RECORDS`] are looked at, so a folder filled by
/// hand costs a bounded time.
fn pids(home: &Home) -> Vec<rustix::process::RawPid> {
    home.root_dir()
        .list_names(&records_dir(home))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| n.strip_suffix(".json")?.parse().ok())
        .filter(|&pid: &rustix::process::RawPid| pid > 0)
        .take(MAX_RECORDS)
        .collect()
}

/// How many records a scan looks at: far more harness processes than one user runs at once.
const MAX_RECORDS: usize = 4096;

/// Removes the records whose process is gone or is another process now.
fn prune(home: &Home) {
    for pid in pids(home) {
        let live = read_record(home, pid).is_some_and(|r| Some(r.started) == start_ticks(pid));
        if !live {
            let _ = home.root_dir().unlink(&record_file(home, pid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Harness;
    use serde_json::json;

    fn caller(id: &str) -> Caller {
        crate::harness::from_hook_input(Harness::Gemini, &json!({"session_id": id, "cwd": "/p"}))
            .unwrap()
    }

    #[test]
    fn a_process_record_names_the_session_until_clear_moves_it_and_exit_forgets_it() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let me = std::process::id() as rustix::process::RawPid;
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
        let pid = child.id() as rustix::process::RawPid;
        record_process(&home, pid, &caller("gone")).unwrap();
        assert_eq!(caller_of_process(&home, pid), Some(caller("gone")));
        // The same pid started at another time is another process.
        let file = record_file(&home, pid);
        let mut reused: ProcessRecord =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        reused.started += 1;
        home.root_dir().commit_json(&file, &reused).unwrap();
        assert_eq!(caller_of_process(&home, pid), None);
        child.kill().unwrap();
        child.wait().unwrap();
        let me = std::process::id() as rustix::process::RawPid;
        record_process(&home, me, &caller("live")).unwrap();
        assert!(!file.exists(), "the gone process's record is pruned");
    }

    #[test]
    fn a_linked_record_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let me = std::process::id() as rustix::process::RawPid;
        record_process(&home, me, &caller("a1")).unwrap();
        let file = record_file(&home, me);
        let outside = dir.path().join("outside.json");
        std::fs::copy(&file, &outside).unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&outside, &file).unwrap();
        assert_eq!(caller_of_process(&home, me), None);
        assert!(outside.exists());
    }
}
