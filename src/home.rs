//! The home directory (`CORTEX_HOME`): where every piece of state lives, and the one place that
//! knows the layout. Everything else asks [`Home`] for paths instead of joining strings.
//!
//! ```text
//! $CORTEX_HOME/
//!   settings.json                      optional settings (see settings/mod.rs)
//!   daemon.lock                        held by the running daemon (pid inside)
//!   webhook.json                       where the optional HTTP shim listens, while it is up
//!   ui-login.json                      the operator page's one-time login code (its SHA-256)
//!   log/daemon.log                     the daemon's log
//!   tmp/signals/                       the drop zone: *.json signal files
//!   tmp/signals/bad/                   refused files, each with a .reason beside it
//!   waitpoints/<id>/waitpoint.json     definition and state, replaced atomically
//!   waitpoints/<id>/signals/           one file per accepted signal, never rewritten
//!   timers/<id>.json                   durable timers
//!   callbacks/<id>.json                callback capabilities (token stored hashed)
//!   sessions/<channel>/wakes/new/      undelivered wakes (maildir-like)
//!   sessions/<channel>/wakes/cur/      wakes a reader has taken
//!   devices/<name>.json                a device the daemon collects signal files from over SSH
//!   devices/<name>.poll                a request to collect now (`device poll`), removed when done
//!   devices/<name>/status.json         the collector's state: last success, last error, backoff
//!   devices/<name>/spool/              the local mirror of the device's spool, swept like
//! tmp/signals/ index/sessions/<name>/<id>         empty marker: waitpoint <id> has session or
//! channel <name> index/sessions.complete            present once every waitpoint has its markers
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::durable::{Dir, Root};
use crate::error::{Error, Result};

/// The file name of a waitpoint's signal log, in its directory.
pub const SIGNAL_LOG: &str = "signals.jsonl";

/// A home directory and its layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
    /// The root directory itself, held: what every path of this home is reached from.
    dir: Arc<Root>,
}

impl Home {
    /// A home at `root` (made absolute against the current directory when relative, so lines
    /// printed for other shells point at the same place).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let root = if root.is_absolute() {
            root
        } else {
            std::env::current_dir()
                .map(|cwd| cwd.join(&root))
                .unwrap_or(root)
        };
        // Every path of this home is reached beneath its root (durable/beneath.rs).
        let dir = Arc::new(Root::new(&root, &root.join("quarantine")));
        Home { root, dir }
    }

    fn fixed_dirs(&self) -> [PathBuf; 11] {
        [
            self.root.clone(),
            self.root.join("tmp"),
            self.drop_zone(),
            self.bad_dir(),
            self.waitpoints_dir(),
            self.timers_dir(),
            self.callbacks_dir(),
            self.sessions_dir(),
            self.log_dir(),
            self.journal_dir(),
            self.devices_dir(),
        ]
    }

    /// Creates the home and its fixed directories (mode 0700) when missing.
    pub fn ensure(&self) -> Result<()> {
        for dir in self.fixed_dirs() {
            // Never make a directory through a link that stands where one of ours should be
            // (parents come first in the list, so a linked parent is met before its children).
            if dir != self.root
                && fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink())
            {
                return Err(Error::Insecure {
                    path: dir.clone(),
                    message: format!(
                        "is a symbolic link; the home's directories must be real ones; fix: rm {} \
                         (the daemon makes the directory)",
                        dir.display()
                    ),
                });
            }
            self.dir.create_dir_private(&dir)?;
        }
        Ok(())
    }

    /// Refuses a home that another user could change: the root and its fixed directories must
    /// be ours and writable by nobody else. Anyone who can write there could plant or swap
    /// state files, read secrets' effects, or redirect wakes, so the daemon does not start.
    pub fn check_private(&self) -> Result<()> {
        let extra = [self.trash_dir(), self.quarantine_dir()];
        for dir in self.fixed_dirs().into_iter().chain(extra) {
            // Opened one directory at a time from the root without following a link, as every
            // pass over the home does: a directory swapped for a symlink would send its files,
            // their removals and their renames elsewhere. The root alone may be a link the user
            // made (`~/.cortex -> /data/cortex`).
            let rel = dir.strip_prefix(&self.root).unwrap_or(Path::new(""));
            match Dir::open_beneath(&self.dir, rel) {
                Ok(_) => {}
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root directory, for the operations that take it rather than a path to look it up by
    /// (`durable::read_json_or_set_aside`).
    pub fn root_dir(&self) -> &Arc<Root> {
        &self.dir
    }

    pub fn settings_file(&self) -> PathBuf {
        self.root.join("settings.json")
    }

    pub fn daemon_lock(&self) -> PathBuf {
        self.root.join("daemon.lock")
    }

    /// `webhook.json`: the address the daemon's HTTP shim is bound to, present while it is up.
    pub fn webhook_address_file(&self) -> PathBuf {
        self.root.join("webhook.json")
    }

    /// `ui-login.json`: the hash of the one-time code `waitpoint ui` printed, until it is used
    /// or expires.
    pub fn ui_login_file(&self) -> PathBuf {
        self.root.join("ui-login.json")
    }

    pub fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }

    pub fn log_file(&self) -> PathBuf {
        self.log_dir().join("daemon.log")
    }

    /// `tmp/signals/`: where jobs drop signal files.
    pub fn drop_zone(&self) -> PathBuf {
        self.root.join("tmp").join("signals")
    }

    /// `tmp/signals/bad/`: refused files, parked with a reason.
    pub fn bad_dir(&self) -> PathBuf {
        self.drop_zone().join("bad")
    }

    pub fn waitpoints_dir(&self) -> PathBuf {
        self.root.join("waitpoints")
    }

    /// `timers/`: one `<id>.json` per durable timer.
    pub fn timers_dir(&self) -> PathBuf {
        self.root.join("timers")
    }

    pub fn timer_file(&self, id: &str) -> PathBuf {
        self.timers_dir().join(format!("{id}.json"))
    }

    /// `callbacks/`: one `<id>.json` per callback capability.
    pub fn callbacks_dir(&self) -> PathBuf {
        self.root.join("callbacks")
    }

    pub fn callback_file(&self, id: &str) -> PathBuf {
        self.callbacks_dir().join(format!("{id}.json"))
    }

    pub fn waitpoint_dir(&self, id: &str) -> PathBuf {
        self.waitpoints_dir().join(id)
    }

    pub fn waitpoint_file(&self, id: &str) -> PathBuf {
        self.waitpoint_dir(id).join("waitpoint.json")
    }

    /// Where records were kept one file each before the log (still read, never written).
    pub fn signals_dir(&self, id: &str) -> PathBuf {
        self.waitpoint_dir(id).join("signals")
    }

    /// The waitpoint's recorded signals, one JSON line each (`store/signal_log.rs`).
    pub fn signal_log(&self, id: &str) -> PathBuf {
        self.waitpoint_dir(id).join(SIGNAL_LOG)
    }

    pub fn sessions_dir(&self) -> PathBuf {
        self.root.join("sessions")
    }

    pub fn inbox_new(&self, channel: &str) -> PathBuf {
        self.sessions_dir().join(channel).join("wakes").join("new")
    }

    pub fn inbox_cur(&self, channel: &str) -> PathBuf {
        self.sessions_dir().join(channel).join("wakes").join("cur")
    }

    /// `index/sessions/<name>/`: an empty marker file per waitpoint whose session or channel is
    /// `name`, so a session's waitpoints are found without reading every waitpoint.
    pub fn session_index(&self, name: &str) -> PathBuf {
        self.session_index_root().join(name)
    }

    /// `index/sessions/`.
    pub fn session_index_root(&self) -> PathBuf {
        self.root.join("index").join("sessions")
    }

    /// `index/deleted/`: a `<session>.json` per deleted session (when it was deleted), so the
    /// session lists leave it out while the waitpoints it cancelled are kept.
    pub fn deleted_sessions_dir(&self) -> PathBuf {
        self.root.join("index").join("deleted")
    }

    /// `index/sessions.complete`: written after a full rebuild; without it the index is not
    /// trusted (a home made before the index existed) and readers scan every waitpoint.
    pub fn session_index_complete(&self) -> PathBuf {
        self.root.join("index").join("sessions.complete")
    }

    /// `journal/`: the write-ahead journal of signal batches (`journal/<n>.jsonl`).
    pub fn journal_dir(&self) -> PathBuf {
        self.root.join("journal")
    }

    /// `tmp/trash/`: files the daemon is done with, removed in the background (see
    /// [`crate::durable::Trash`]).
    pub fn trash_dir(&self) -> PathBuf {
        self.root.join("tmp").join("trash")
    }

    /// `quarantine/`: records that do not parse, set aside so the rest goes on (each with a
    /// `.reason` beside it).
    pub fn quarantine_dir(&self) -> PathBuf {
        self.root.join("quarantine")
    }

    /// `devices/`: device records and, per device, its collector state and local mirror.
    pub fn devices_dir(&self) -> PathBuf {
        self.root.join("devices")
    }

    /// `devices/<name>.json`: the device record `device add` writes.
    pub fn device_file(&self, name: &str) -> PathBuf {
        self.devices_dir().join(format!("{name}.json"))
    }

    /// `devices/<name>.poll`: present while a `device poll` waits for the daemon.
    pub fn device_poll_file(&self, name: &str) -> PathBuf {
        self.devices_dir().join(format!("{name}.poll"))
    }

    /// `devices/<name>/`: the collector's own directory for one device.
    pub fn device_dir(&self, name: &str) -> PathBuf {
        self.devices_dir().join(name)
    }

    /// `devices/<name>/status.json`: written only by the device's collector.
    pub fn device_status_file(&self, name: &str) -> PathBuf {
        self.device_dir(name).join("status.json")
    }

    /// `devices/<name>/spool/`: the local mirror of the device's spool.
    pub fn device_spool(&self, name: &str) -> PathBuf {
        self.device_dir(name).join("spool")
    }
}
