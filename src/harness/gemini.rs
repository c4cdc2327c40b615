//! Gemini CLI: whether a Gemini process is a headless run, and whether its session moved on
//! past a waiting hook (its transcript). Gemini gives an MCP server no session id (not in its
//! environment, not in a call's `_meta`), while its hooks get `session_id` on stdin; both are
//! children of the same Gemini process, so its `SessionStart` hook records which session the
//! process is in (`super::process_record`).

use std::path::Path;

use crate::harness::{Caller, Harness};

/// Whether Gemini process `pid` runs headless (`gemini -p`, a prompt piped in, a resume run by
/// the daemon): nothing in a hook's environment or input says so, but the process's own argv
/// has `-p`/`--prompt`, or its standard input is not a terminal. Nobody is idle in such a run,
/// and a hook that waited would hold it up. A process that cannot be read counts as headless:
/// better a wake delivered by a resume later than a run held up.
pub fn is_headless(pid: rustix::process::RawPid) -> bool {
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
        .custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOFOLLOW).bits() as i32)
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
