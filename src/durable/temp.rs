//! Temp files: how they are named (hidden, ending in `.tmp`, so every reader skips them and
//! `ls -a` shows what they are) and the sweep that removes those a crash left behind.

use std::path::{Path, PathBuf};

use rand::Rng;

use rustix::fs::{AtFlags, FileType};

use super::dir::names_of;
use super::{Root, parent_of};
use crate::clock::Timestamp;
use crate::error::{Error, Result};

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

impl Root {
    /// Removes `*.tmp` files older than `max_age_ms` anywhere under `dir`, a directory beneath
    /// this root (commits a crash cut short). Every directory is reached beneath the root and
    /// every entry looked at through its directory's handle, so no link is followed; a path
    /// not beneath the root is refused. Returns how many were removed.
    pub fn remove_stale_temps(&self, dir: &Path, now: Timestamp, max_age_ms: i64) -> Result<usize> {
        let Some(fd) = self.open_dir(dir, false)? else {
            return Ok(0);
        };
        let mut removed = 0;
        for name in names_of(&fd, dir)? {
            let path = dir.join(&name);
            let Ok(st) = rustix::fs::statat(&fd, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    removed += self.remove_stale_temps(&path, now, max_age_ms)?;
                }
                FileType::RegularFile if name.to_string_lossy().ends_with(TEMP_SUFFIX) => {
                    let mtime = Timestamp::from_millis(st.st_mtime * 1000);
                    if now.millis_since(mtime) > max_age_ms {
                        match rustix::fs::unlinkat(&fd, name.as_os_str(), AtFlags::empty()) {
                            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                            Err(e) => return Err(Error::io("cannot remove", &path, e.into())),
                        }
                        rustix::fs::fsync(&fd)
                            .map_err(|e| Error::io("cannot fsync directory", dir, e.into()))?;
                        tracing::info!(file = %path.display(), "removed a stale temp file");
                        removed += 1;
                    }
                }
                _ => {}
            }
        }
        Ok(removed)
    }
}

/// True for names the engine treats as in-flight temp files.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX) || name.ends_with(TEMP_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{self, File};
    use std::os::unix::fs::symlink;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    #[test]
    fn the_stale_temp_sweep_follows_no_link_and_stays_beneath_its_root() {
        let d = tempfile::tempdir().unwrap();
        let (root, outside) = (d.path().join("home"), d.path().join("outside"));
        fs::create_dir_all(root.join("a")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        let old = |path: &Path| {
            File::create(path)
                .unwrap()
                .set_modified(UNIX_EPOCH + Duration::from_secs(1000))
                .unwrap();
        };
        old(&root.join("a/.x.tmp"));
        old(&outside.join(".y.tmp"));
        symlink(&outside, root.join("a/link")).unwrap();
        let home = Root::new(&root, &root.join("quarantine"));
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let now = Timestamp::from_millis(i64::try_from(ms).unwrap());
        assert_eq!(home.remove_stale_temps(&root, now, 1000).unwrap(), 1);
        assert!(!root.join("a/.x.tmp").exists());
        assert!(
            outside.join(".y.tmp").exists(),
            "a link in the home is not followed"
        );
        let err = home.remove_stale_temps(&outside, now, 1000).unwrap_err();
        assert!(err.to_string().contains("beneath the home"), "{err}");
        assert!(outside.join(".y.tmp").exists());
    }
}
