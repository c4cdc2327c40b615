//! Temp files: how they are named (hidden, ending in `.tmp`, so every reader skips them and
//! `ls -a` shows what they are) and the sweep that removes those a crash left behind.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rand::Rng;

use super::{list_dir, parent_of, remove_durably};
use crate::clock::Timestamp;
use crate::error::Result;

/// Prefix that marks temp files; every reader skips names starting with it.
pub const TEMP_PREFIX: char = '.';
/// Suffix of temp files, so `ls -a` and the stale-temp sweep recognise them.
pub const TEMP_SUFFIX: &str = ".tmp";

/// A fresh temp path beside `target`: `.<name>.<random>.tmp`.
pub(super) fn temp_path_for(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tag: u64 = rand::rng().next_u64();
    parent_of(target).join(format!("{TEMP_PREFIX}{name}.{tag:016x}{TEMP_SUFFIX}"))
}

/// Removes `*.tmp` files older than `max_age_ms` anywhere under `dir` (commits a crash cut
/// short). Symlinks are never followed. Returns how many were removed.
pub fn remove_stale_temps(dir: &Path, now: Timestamp, max_age_ms: i64) -> Result<usize> {
    let mut removed = 0;
    for (name, path) in list_dir(dir)? {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            removed += remove_stale_temps(&path, now, max_age_ms)?;
        } else if meta.is_file() && name.ends_with(TEMP_SUFFIX) {
            let mtime = Timestamp::from_millis(meta.mtime() * 1000);
            if now.millis_since(mtime) > max_age_ms {
                remove_durably(&path)?;
                tracing::info!(file = %path.display(), "removed a stale temp file");
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// True for names the engine treats as in-flight temp files.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX) || name.ends_with(TEMP_SUFFIX)
}
