//! Whether a harness's own transcript holds a wake: the question a resume asks before it starts
//! again a resume that was started for the same wake and never finished (the daemon or the
//! adapter was killed mid-turn, or the turn outlasted the `onWake` bound). A harness writes the
//! prompt of a turn to its transcript when the turn begins, and a resume's prompt names its
//! wake ([`super::wake::prompt`]), so a transcript that names the wake means the agent has it:
//! starting again would give it a second copy.
//!
//! The transcripts are the harness's files, outside the home: they are only read, never
//! written, and only what a resume of this wake could have written is looked at (files changed
//! since it started, their last [`TAIL_BYTES`], at most [`MAX_FILES`] of them).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::harness::Harness;

/// How much of the end of one transcript is searched: the turn a resume started is appended
/// at its end, and a long session's transcript runs to hundreds of megabytes.
pub const TAIL_BYTES: u64 = 16 << 20;

/// How many changed transcripts are searched at most.
pub const MAX_FILES: usize = 64;

/// How many directory entries are looked at at most while finding them.
const MAX_ENTRIES: usize = 20_000;

/// What a transcript search found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A transcript changed since the resume started names the wake.
    Yes,
    /// None does: the harness never began that turn.
    No,
    /// This harness's transcripts are not known to us (nowhere to look): a resume goes ahead.
    Unknown,
}

/// Where `harness` keeps its transcripts under `root` (Claude Code's config directory, Codex's
/// home), and how deep below it the files lie: Claude Code keeps `projects/<dir>/<id>.jsonl`,
/// Codex `sessions/<yyyy>/<mm>/<dd>/rollout-<time>-<thread>.jsonl`.
fn layout(harness: Harness) -> Option<(&'static str, usize)> {
    match harness {
        Harness::Claude => Some(("projects", 1)),
        Harness::Codex => Some(("sessions", 3)),
        // Not looked up for Gemini CLI and OpenCode: a cut-off resume of them is started again.
        Harness::Gemini | Harness::OpenCode => None,
    }
}

/// Whether a transcript of `harness` under `root` changed since `since` names `wake_id`.
pub fn holds(harness: Harness, root: Option<&Path>, since: SystemTime, wake_id: &str) -> Seen {
    let (Some(root), Some((sub, depth))) = (root, layout(harness)) else {
        return Seen::Unknown;
    };
    let mut files = Vec::new();
    let mut budget = MAX_ENTRIES;
    changed_jsonl(&root.join(sub), depth, since, &mut budget, &mut files);
    // The newest first: the resumed turn is in the file written last.
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    let needle = wake_id.as_bytes();
    let found = files.iter().take(MAX_FILES).any(|(_, path)| {
        crate::durable::outside::read_tail(path, TAIL_BYTES)
            .ok()
            .flatten()
            .is_some_and(|(bytes, _)| bytes.windows(needle.len()).any(|w| w == needle))
    });
    if found { Seen::Yes } else { Seen::No }
}

/// The `.jsonl` files `depth` directories below `dir` modified at `since` or later, with their
/// times. Links are not followed, and what cannot be read is passed over.
fn changed_jsonl(
    dir: &Path,
    depth: usize,
    since: SystemTime,
    budget: &mut usize,
    out: &mut Vec<(SystemTime, PathBuf)>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        // `file_type` of a directory entry does not follow a link.
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if depth > 0 {
            if kind.is_dir() {
                changed_jsonl(&path, depth - 1, since, budget, out);
            }
            continue;
        }
        if !kind.is_file() || path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        if let Ok(modified) = entry.metadata().and_then(|m| m.modified())
            && modified >= since
        {
            out.push((modified, path));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn a_changed_transcript_naming_the_wake_is_seen_in_each_harness_layout() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let before = SystemTime::now() - Duration::from_secs(60);
        let wake = "wk_0123abcd_1";
        write(
            &root.join("projects/-work-proj/s1.jsonl"),
            &format!("{{\"message\":\"(waitpoint wake {wake})\"}}\n"),
        );
        assert_eq!(holds(Harness::Claude, Some(root), before, wake), Seen::Yes);
        assert_eq!(
            holds(Harness::Claude, Some(root), before, "wk_0123abcd_2"),
            Seen::No
        );
        // Codex's dated folders, three levels down; a file at the wrong depth is not one.
        write(
            &root.join("sessions/2026/12/04/rollout-x-t1.jsonl"),
            &format!("{{\"text\":\"{wake}\"}}\n"),
        );
        assert_eq!(holds(Harness::Codex, Some(root), before, wake), Seen::Yes);
        std::fs::remove_file(root.join("sessions/2026/12/04/rollout-x-t1.jsonl")).unwrap();
        write(
            &root.join("sessions/rollout-x-t1.jsonl"),
            &format!("{{\"text\":\"{wake}\"}}\n"),
        );
        assert_eq!(holds(Harness::Codex, Some(root), before, wake), Seen::No);
        // Nowhere to look: nobody knows.
        assert_eq!(holds(Harness::Claude, None, before, wake), Seen::Unknown);
    }

    #[test]
    fn a_transcript_older_than_the_resume_or_behind_a_link_is_not_looked_at() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let wake = "wk_0123abcd_1";
        write(&root.join("projects/p/old.jsonl"), wake);
        let after = SystemTime::now() + Duration::from_secs(60);
        assert_eq!(holds(Harness::Claude, Some(root), after, wake), Seen::No);
        let outside = tempfile::tempdir().unwrap();
        write(&outside.path().join("x.jsonl"), wake);
        std::fs::remove_dir_all(root.join("projects/p")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("projects/p")).unwrap();
        let before = SystemTime::now() - Duration::from_secs(60);
        assert_eq!(holds(Harness::Claude, Some(root), before, wake), Seen::No);
    }
}
