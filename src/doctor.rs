//! `waitpoint doctor`: read-only checks of a home and the machine it runs on, each with a
//! verdict (OK, WARN, FAIL) and, when it is not OK, how to fix it.
//!
//! Nothing here changes the home: a doctor that created the missing drop zone would hide the
//! very problem it is asked about. The caller passes the settings it resolved (the library does
//! not read the environment) and where the kernel's inotify limits live.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::durable::{self, FileLock};
use crate::error::Error;
use crate::home::{Home, SIGNAL_LOG};
use crate::ingress::device;
use crate::records::WebhookAddress;
use crate::settings::Settings;
use crate::store::signal_log;
// The report's lines are the store's findings: one type, which the store (the lower layer)
// owns, so a store's health needs no translation into doctor's.
use crate::store::{Finding, Level};

fn ok(name: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        name,
        level: Level::Ok,
        detail: detail.into(),
        fix: None,
    }
}

fn bad(
    name: &'static str,
    level: Level,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        name,
        level,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

/// Temp files older than this are leftovers of interrupted writes, not writes in flight.
const STALE_TEMP: Duration = Duration::from_secs(3600);
/// Below these, inotify limits deserve a warning (the defaults of current kernels are above).
const MIN_USER_WATCHES: u64 = 1024;
const MIN_QUEUED_EVENTS: u64 = 16_384;
/// Walking a huge home stops here; the report says the walk was cut short.
const MAX_WALK: usize = 200_000;

/// What the checks look at.
pub struct Inputs<'a> {
    pub home: &'a Home,
    /// The settings as the daemon would resolve them, or why they do not resolve.
    pub settings: &'a Result<Settings, Error>,
    /// `/proc/sys/fs/inotify` on Linux.
    pub inotify_dir: PathBuf,
    /// Whether an inotify instance can be had now ([`probe_inotify`]).
    pub inotify_instance: Result<(), Error>,
    /// How the shared store the settings name is ([`crate::store::Cluster::health`]), or why
    /// it could not be asked; `None` for the home's own files.
    pub store: Option<Result<Vec<Finding>, Error>>,
    /// The `PATH` a daemon started from here would search for `onWake`'s program (the caller's
    /// own); a running daemon's own `PATH` is read from `/proc` instead when it can be.
    pub path: Option<std::ffi::OsString>,
}

/// Tries to get (and at once gives back) an inotify instance, as a daemon starting now would.
/// `home` only names where the watcher would look, for the error.
pub fn probe_inotify(home: &Home) -> Result<(), Error> {
    crate::failpoint!(
        crate::failpoint::WATCHER,
        "cannot start the file watcher on",
        &home.drop_zone()
    );
    // Dropped at once: the descriptor closes, the instance is given back.
    rustix::fs::inotify::init(rustix::fs::inotify::CreateFlags::CLOEXEC)
        .map(drop)
        .map_err(|e| {
            Error::io(
                "cannot start the file watcher on",
                home.drop_zone(),
                e.into(),
            )
        })
}

/// Runs every check, in the order they are printed.
pub fn run(inputs: &Inputs<'_>) -> Vec<Finding> {
    let home = inputs.home;
    let mut checks = vec![check_home(home)];
    if fs::symlink_metadata(home.root()).is_err() {
        return checks;
    }
    let walk = walk_home(home.root_dir());
    checks.push(check_modes(home, &walk));
    checks.push(check_settings(home, inputs.settings));
    checks.extend(store_checks(&inputs.store));
    checks.push(check_drop_zone(home));
    checks.push(check_inotify(&inputs.inotify_dir, &inputs.inotify_instance));
    checks.push(check_daemon(home));
    checks.push(check_on_wake(home, inputs.settings, inputs.path.as_deref()));
    checks.push(check_shim(home));
    checks.push(check_devices(home));
    checks.push(check_journal(home));
    checks.push(check_temps(&walk));
    checks.push(check_logs(&walk));
    checks.push(check_bad(home));
    checks.push(check_quarantine(home));
    checks
}

/// The shared store's findings as report lines.
fn store_checks(store: &Option<Result<Vec<Finding>, Error>>) -> Vec<Finding> {
    match store {
        None => Vec::new(),
        Some(Err(e)) => vec![Finding {
            name: "store",
            level: Level::Fail,
            detail: format!("cannot open the store: {e}"),
            fix: Some(
                "check `store` in settings.json (or --store) and that the cluster runs".into(),
            ),
        }],
        Some(Ok(found)) => found.clone(),
    }
}

/// The worst level in a report.
pub fn worst(checks: &[Finding]) -> Level {
    checks.iter().map(|c| c.level).max().unwrap_or(Level::Ok)
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn check_home(home: &Home) -> Finding {
    let root = home.root();
    let meta = match fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) => {
            return bad(
                "home",
                Level::Fail,
                format!("{} cannot be read: {e}", root.display()),
                "start `waitpoint daemon` once (it creates the home), or pass the right --home",
            );
        }
    };
    if !meta.is_dir() {
        return bad(
            "home",
            Level::Fail,
            format!("{} is not a directory", root.display()),
            "point --home or CORTEX_HOME at a directory",
        );
    }
    if meta.uid() != euid() {
        return bad(
            "home",
            Level::Fail,
            format!("{} is owned by uid {}, not you", root.display(), meta.uid()),
            format!("chown -R $(id -u) {}", root.display()),
        );
    }
    ok(
        "home",
        format!("{} is yours ({:04o})", root.display(), meta.mode() & 0o7777),
    )
}

struct Walk {
    /// Paths with group or other permission bits, or owned by someone else.
    too_open: Vec<(PathBuf, u32, bool)>,
    not_ours: Vec<PathBuf>,
    stale_temps: Vec<PathBuf>,
    /// Signal logs bigger than a reader reads (`signal_log::MAX_LOG_READ`), with their size.
    big_logs: Vec<(PathBuf, u64)>,
    truncated: bool,
}

fn walk_home(home: &durable::Root) -> Walk {
    let mut walk = Walk {
        too_open: Vec::new(),
        not_ours: Vec::new(),
        stale_temps: Vec::new(),
        big_logs: Vec::new(),
        truncated: false,
    };
    let uid = euid();
    let now = SystemTime::now();
    let mut stack = vec![home.path().to_owned()];
    let mut seen = 0usize;
    while let Some(path) = stack.pop() {
        seen += 1;
        if seen > MAX_WALK {
            walk.truncated = true;
            break;
        }
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.uid() != uid {
            walk.not_ours.push(path.clone());
        }
        if meta.mode() & 0o077 != 0 {
            walk.too_open
                .push((path.clone(), meta.mode() & 0o7777, meta.is_dir()));
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if meta.is_file()
            && name.ends_with(durable::TEMP_SUFFIX)
            && meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age > STALE_TEMP)
        {
            walk.stale_temps.push(path.clone());
        }
        if meta.is_file() && name == SIGNAL_LOG && meta.len() > signal_log::MAX_LOG_READ {
            walk.big_logs.push((path.clone(), meta.len()));
        }
        if meta.is_dir()
            && let Ok(entries) = home.list_dir(&path)
        {
            stack.extend(entries.into_iter().map(|(_, p)| p));
        }
    }
    walk
}

/// A path found walking the home, on one line: a name anyone who can write the drop zone chose
/// may hold a newline or a bidi override, so it goes through the one rule (`escape`).
fn shown_path(p: &Path) -> String {
    crate::escape::line(&p.display().to_string()).into_owned()
}

fn some_paths<'a>(paths: impl Iterator<Item = &'a Path>, count: usize) -> String {
    let shown: Vec<String> = paths.take(3).map(shown_path).collect();
    let more = count.saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// The home's modes. What the daemon refuses to start on (a directory of the home another user
/// owns or can write, a settings.json others can write) is a FAIL, found by the daemon's own
/// checks, so the two cannot disagree; any other path looser than private (a home made with a
/// plain `mkdir`, 0755) is a WARN with the command that fixes it.
fn check_modes(home: &Home, walk: &Walk) -> Finding {
    if let Err(e) = home.check_private() {
        let text = e.to_string();
        // The daemon's refusal names its fix (`…; fix: chmod go-w DIR; refusing …`): it goes
        // on the fix line.
        let (detail, fix) = match text.split_once("; fix: ") {
            Some((before, after)) => match after.split_once("; ") {
                Some((fix, rest)) => (format!("{before}; {rest}"), fix.to_owned()),
                None => (before.to_owned(), after.to_owned()),
            },
            None => (
                text.clone(),
                "make the home's directories yours and writable by you alone (chmod 700)"
                    .to_owned(),
            ),
        };
        return bad(
            "modes",
            Level::Fail,
            format!("the daemon refuses this home: {detail}"),
            fix,
        );
    }
    let settings = home.settings_file();
    if let Some((path, mode, _)) = walk
        .too_open
        .iter()
        .find(|(p, m, _)| *p == settings && m & 0o022 != 0)
    {
        return bad(
            "modes",
            Level::Fail,
            format!(
                "{} (mode {mode:04o}) can be written by other users, and it decides what runs \
                 (onWake): the daemon refuses it",
                path.display()
            ),
            format!("chmod go-w {}", path.display()),
        );
    }
    if !walk.not_ours.is_empty() {
        let n = walk.not_ours.len();
        return bad(
            "modes",
            Level::Warn,
            format!(
                "{n} path(s) are owned by another user: {}",
                some_paths(walk.not_ours.iter().map(PathBuf::as_path), n)
            ),
            "chown -R $(id -u) the home; run the daemon and the commands as the same user",
        );
    }
    if !walk.too_open.is_empty() {
        let n = walk.too_open.len();
        let list: Vec<String> = walk
            .too_open
            .iter()
            .take(3)
            .map(|(p, m, _)| format!("{} ({m:04o})", shown_path(p)))
            .collect();
        let more = n.saturating_sub(list.len());
        let dirs: Vec<String> = walk
            .too_open
            .iter()
            .filter(|(_, _, d)| *d)
            .take(3)
            .map(|(p, _, _)| shown_path(p))
            .collect();
        let files = walk.too_open.iter().any(|(_, _, d)| !d);
        let mut fix = Vec::new();
        if !dirs.is_empty() {
            fix.push(format!("chmod 700 {}", dirs.join(" ")));
        }
        if files {
            fix.push("chmod 600 the files listed".to_owned());
        }
        return bad(
            "modes",
            Level::Warn,
            format!(
                "{n} path(s) can be read or written by others (wakes carry job output): {}{}",
                list.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ),
            fix.join("; "),
        );
    }
    let note = if walk.truncated {
        format!(" (checked the first {MAX_WALK} paths)")
    } else {
        String::new()
    };
    ok(
        "modes",
        format!("every path is yours, directories 0700 and files 0600{note}"),
    )
}

fn check_settings(home: &Home, settings: &Result<Settings, Error>) -> Finding {
    match settings {
        Ok(s) => ok(
            "settings",
            format!(
                "ttl {} ms, sweep {} ms, at most {} wakes/h",
                s.ttl_ms, s.sweep_ms, s.max_wakes_per_hour
            ),
        ),
        Err(e) => bad(
            "settings",
            Level::Fail,
            e.to_string(),
            format!(
                "correct the value named above in {} or the environment (see waitpoint(5)); \
the daemon refuses to start until then",
                home.settings_file().display()
            ),
        ),
    }
}

fn check_drop_zone(home: &Home) -> Finding {
    let dz = home.drop_zone();
    let create = format!(
        "mkdir -m 700 -p {} (the daemon also creates it when it starts)",
        dz.display()
    );
    match fs::symlink_metadata(&dz) {
        Err(_) => bad(
            "drop-zone",
            Level::Fail,
            format!(
                "{} is missing: cortex-signal and jobs cannot report",
                dz.display()
            ),
            create,
        ),
        Ok(m) if !m.is_dir() => bad(
            "drop-zone",
            Level::Fail,
            format!("{} is not a directory", dz.display()),
            format!("move it away, then {create}"),
        ),
        Ok(m) if m.mode() & 0o200 == 0 => bad(
            "drop-zone",
            Level::Fail,
            format!("{} is not writable", dz.display()),
            format!("chmod 700 {}", dz.display()),
        ),
        Ok(_) => {
            let pending = crate::ingress::spool::Spool::new(home)
                .pending()
                .map(|p| p.len())
                .unwrap_or(0);
            ok(
                "drop-zone",
                format!("{} ({pending} signal file(s) waiting)", dz.display()),
            )
        }
    }
}

fn read_number(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn check_inotify(dir: &Path, instance: &Result<(), Error>) -> Finding {
    if let Err(e) = instance {
        return bad(
            "inotify",
            Level::Warn,
            format!(
                "no inotify instance can be had now ({e}): a daemon starting now finds signals \
                 by the sweep alone (waitpointSweepMs)"
            ),
            "sysctl fs.inotify.max_user_instances=512, or end the processes that hold them \
             (ls -l /proc/*/fd | grep inotify)",
        );
    }
    let watches = read_number(&dir.join("max_user_watches"));
    let queued = read_number(&dir.join("max_queued_events"));
    let (Some(watches), Some(queued)) = (watches, queued) else {
        return bad(
            "inotify",
            Level::Warn,
            format!(
                "cannot read the limits in {}; signals are then found by the sweep only",
                dir.display()
            ),
            "on Linux, check that /proc is mounted; elsewhere keep waitpointSweepMs short",
        );
    };
    let mut low = Vec::new();
    let mut fix = Vec::new();
    if watches < MIN_USER_WATCHES {
        low.push(format!("max_user_watches {watches} < {MIN_USER_WATCHES}"));
        fix.push("sysctl fs.inotify.max_user_watches=65536".to_owned());
    }
    if queued < MIN_QUEUED_EVENTS {
        low.push(format!("max_queued_events {queued} < {MIN_QUEUED_EVENTS}"));
        fix.push("sysctl fs.inotify.max_queued_events=16384".to_owned());
    }
    if low.is_empty() {
        ok(
            "inotify",
            format!("max_user_watches {watches}, max_queued_events {queued}"),
        )
    } else {
        bad(
            "inotify",
            Level::Warn,
            format!(
                "{} (bursts overflow the queue and fall back to full sweeps)",
                low.join(", ")
            ),
            format!("{} (persist it in /etc/sysctl.d/)", fix.join(" and ")),
        )
    }
}

fn check_daemon(home: &Home) -> Finding {
    let lock = home.daemon_lock();
    let holder = FileLock::holder(home.root_dir(), &lock);
    let start = "start it: `waitpoint daemon`, or `systemctl --user start waitpoint` with \
scripts/waitpoint.service";
    match &holder {
        crate::durable::LockHolder::Held { pid } => ok(
            "daemon",
            format!("running (pid {pid}), holding {}", lock.display()),
        ),
        crate::durable::LockHolder::Free => bad(
            "daemon",
            Level::Warn,
            "no daemon is running: signals wait in the spool and nothing fires",
            start,
        ),
        crate::durable::LockHolder::Stale { .. } => bad(
            "daemon",
            Level::Fail,
            format!(
                "stale lock: {}; the daemon died without shutting down (a crash or kill -9)",
                holder.stale_text(&lock).unwrap_or_default()
            ),
            format!(
                "read {} for the cause, then {start} (the stale lock is taken over safely)",
                home.log_file().display()
            ),
        ),
    }
}

/// Whether the daemon can start `onWake`'s program: an absolute path must be an executable
/// file; a bare name is looked up on the `PATH` the daemon has (the running daemon's, read from
/// `/proc`, else the caller's); a relative path would be resolved against the daemon's
/// directory, whatever that is.
fn check_on_wake(
    home: &Home,
    settings: &Result<Settings, Error>,
    path: Option<&std::ffi::OsStr>,
) -> Finding {
    const NAME: &str = "on-wake";
    let Ok(settings) = settings else {
        return ok(NAME, "not checked: the settings do not resolve (above)");
    };
    let Some(program) = settings.on_wake.as_ref().and_then(|argv| argv.first()) else {
        return ok(
            NAME,
            "not set: a wake waits in its session's inbox until it is read",
        );
    };
    let setup_fix = "run `waitpoint setup claude-code` (or `codex`) again, which writes the full \
                     path, or make onWake's first item an absolute path (`command -v NAME`)";
    let fix = |name: &str| setup_fix.replace("NAME", name);
    let file = home.settings_file();
    let program_path = Path::new(program);
    if program.contains('/') {
        if !program_path.is_absolute() {
            return bad(
                NAME,
                Level::Fail,
                format!(
                    "onWake runs {program:?}, a relative path, which the daemon resolves \
                     against its own working directory ({})",
                    file.display()
                ),
                fix(program_path
                    .file_name()
                    .unwrap_or_default()
                    .to_str()
                    .unwrap_or("")),
            );
        }
        return match executable(program_path) {
            Ok(()) => ok(NAME, format!("onWake runs {program}")),
            Err(why) => bad(
                NAME,
                Level::Fail,
                format!("onWake runs {program}, which {why}: the daemon cannot start it"),
                fix(program_path
                    .file_name()
                    .unwrap_or_default()
                    .to_str()
                    .unwrap_or("")),
            ),
        };
    }
    let (search, whose) = match daemon_path(home) {
        Some(p) => (Some(p), "the running daemon's PATH"),
        None => (
            path.map(ToOwned::to_owned),
            "this shell's PATH (a daemon started elsewhere, by systemd say, has its own)",
        ),
    };
    let found = search.as_ref().and_then(|p| {
        std::env::split_paths(p)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(program))
            .find(|c| executable(c).is_ok())
    });
    match found {
        Some(at) => ok(
            NAME,
            format!(
                "onWake runs {program:?}, found on {whose} at {}",
                at.display()
            ),
        ),
        None => bad(
            NAME,
            Level::Fail,
            format!(
                "onWake runs {program:?}, which is not on {whose}: the daemon cannot start it \
                 and every wake's delivery fails"
            ),
            fix(program),
        ),
    }
}

/// `Ok` when `path` is a file this user may execute; else what it is.
fn executable(path: &Path) -> Result<(), &'static str> {
    match fs::metadata(path) {
        Err(_) => Err("does not exist"),
        Ok(m) if !m.is_file() => Err("is not a file"),
        Ok(_) => {
            rustix::fs::access(path, rustix::fs::Access::EXEC_OK).map_err(|_| "is not executable")
        }
    }
}

/// The `PATH` of the daemon running for `home`, if one runs and its environment can be read.
fn daemon_path(home: &Home) -> Option<std::ffi::OsString> {
    use std::os::unix::ffi::OsStrExt;
    let crate::durable::LockHolder::Held { pid } =
        FileLock::holder(home.root_dir(), &home.daemon_lock())
    else {
        return None;
    };
    use std::io::Read;
    let mut environ = Vec::new();
    fs::File::open(format!("/proc/{pid}/environ"))
        .ok()?
        .take(1 << 20)
        .read_to_end(&mut environ)
        .ok()?;
    environ
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"PATH="))
        .map(|v| std::ffi::OsStr::from_bytes(v).to_owned())
}

fn check_shim(home: &Home) -> Finding {
    let path = home.webhook_address_file();
    // Read as its owner writes it (`records::WebhookAddress`), not guessed at.
    let record = match home.root_dir().read_json::<WebhookAddress>(&path) {
        Ok(None) => return ok("http-shim", "no address published (signals use the spool)"),
        Ok(Some(r)) => r,
        Err(e) => {
            return bad(
                "http-shim",
                Level::Fail,
                format!("{} is not a shim address record: {e}", path.display()),
                format!("restart the daemon, or remove {}", path.display()),
            );
        }
    };
    let Ok(addr) = record.addr.parse::<SocketAddr>() else {
        return bad(
            "http-shim",
            Level::Fail,
            format!(
                "{} does not hold an address: {:?}",
                path.display(),
                record.addr
            ),
            format!("restart the daemon, or remove {}", path.display()),
        );
    };
    if !addr.ip().is_loopback() {
        return bad(
            "http-shim",
            Level::Fail,
            format!(
                "{} publishes {addr}, which is not a loopback address",
                path.display()
            ),
            "the shim listens on loopback only: restart the daemon",
        );
    }
    match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(_) => ok("http-shim", format!("listening on {addr}")),
        Err(e) => bad(
            "http-shim",
            Level::Fail,
            format!(
                "stale address file: {} names {addr}, which refuses connections ({e})",
                path.display()
            ),
            format!(
                "restart the daemon (it rewrites the file), or remove {}; cortex-signal falls \
back to the spool meanwhile",
                path.display()
            ),
        ),
    }
}

fn check_devices(home: &Home) -> Finding {
    // The records through their owner's loader, reached through its connect loop.
    let devices = match device::list(home) {
        Ok(d) => d,
        Err(e) => {
            return bad(
                "devices",
                Level::Warn,
                format!("cannot read the device records: {e}"),
                format!(
                    "look at {} (`waitpoint device list` says more)",
                    home.devices_dir().display()
                ),
            );
        }
    };
    if devices.is_empty() {
        return ok("devices", "none configured");
    }
    let mut reachable = Vec::new();
    let mut problems = Vec::new();
    for d in &devices {
        match device::probe(d) {
            Ok(()) => reachable.push(d.name.clone()),
            Err(why) => problems.push(format!("{}: {why}", d.name)),
        }
    }
    if problems.is_empty() {
        ok(
            "devices",
            format!("{} reachable: {}", reachable.len(), reachable.join(", ")),
        )
    } else {
        bad(
            "devices",
            Level::Warn,
            format!(
                "{} of {} unreachable ({}); their files wait there until they are back",
                problems.len(),
                devices.len(),
                problems.join("; ")
            ),
            "check the host is up and its SSH port open; `waitpoint device test NAME` says more",
        )
    }
}

/// Segments a running daemon checkpoints within a few seconds; left without one, they hold
/// committed signals whose files may be incomplete until a daemon replays them.
fn check_journal(home: &Home) -> Finding {
    let numbers =
        crate::journal::list_segments(home.root_dir(), &home.journal_dir()).unwrap_or_default();
    let segments = numbers.len();
    for seg in crate::journal::list_segment_paths(&home.journal_dir(), &numbers) {
        if let Err(e) = crate::journal::read_segment(home.root_dir(), &seg) {
            return bad(
                "journal",
                Level::Fail,
                format!("{e}"),
                format!(
                    "the daemon decides nothing while it is there. Look at the line (sed -n \
'<line>p' {seg}), keep a copy, then move the segment out of journal/ (mv {seg} {}/) and start \
the daemon: its lines are not replayed, so a batch in it whose files a crash lost stays lost \
(`waitpoint show` tells what each waitpoint has)",
                    home.quarantine_dir().display(),
                    seg = seg.display()
                ),
            );
        }
    }
    if segments == 0 {
        return ok("journal", "empty (every committed batch is checkpointed)");
    }
    if durable::FileLock::is_held(home.root_dir(), &home.daemon_lock()) {
        return ok(
            "journal",
            format!("{segments} segment(s); the running daemon checkpoints them"),
        );
    }
    bad(
        "journal",
        Level::Warn,
        format!(
            "{segments} segment(s) of committed signals left by a daemon that did not stop \
cleanly; their files may be incomplete until they are replayed"
        ),
        "start the daemon (waitpoint daemon): it replays the journal before anything else",
    )
}

fn check_temps(walk: &Walk) -> Finding {
    if walk.stale_temps.is_empty() {
        return ok("temp-files", "no stale *.tmp files");
    }
    let n = walk.stale_temps.len();
    bad(
        "temp-files",
        Level::Warn,
        format!(
            "{n} *.tmp file(s) older than an hour, left by interrupted writes: {}",
            some_paths(walk.stale_temps.iter().map(PathBuf::as_path), n)
        ),
        "they were never part of any state and are safe to delete \
(find HOME -name '*.tmp' -mmin +60 -delete); the daemon removes drop-zone ones after a day",
    )
}

fn check_logs(walk: &Walk) -> Finding {
    if walk.big_logs.is_empty() {
        return ok("logs", "every signal log is within what a reader reads");
    }
    let n = walk.big_logs.len();
    let list = walk
        .big_logs
        .iter()
        .take(5)
        .map(|(p, len)| format!("{} ({len} bytes)", p.display()))
        .collect::<Vec<_>>()
        .join(", ");
    bad(
        "logs",
        Level::Warn,
        format!(
            "{n} signal log(s) bigger than {} bytes, of which only the newest part is read \
(written before logs were bounded, or grown by hand): {list}",
            signal_log::MAX_LOG_READ
        ),
        "the waitpoints still work; `waitpoint show ID` lists the records read. To keep the \
older records, copy the log elsewhere; to reclaim the space, stop the daemon and cut the log \
to its newest lines (whole lines only)",
    )
}

fn check_bad(home: &Home) -> Finding {
    let bad_dir = home.bad_dir();
    let parked = home
        .root_dir()
        .list_dir(&bad_dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|(n, _)| n.ends_with(".json"))
        .count();
    if parked == 0 {
        return ok("refused", "no refused signal files");
    }
    bad(
        "refused",
        Level::Warn,
        format!(
            "{parked} refused signal file(s) parked in {}",
            bad_dir.display()
        ),
        format!(
            "read {}/*.reason, fix the sender, then delete the pairs you have dealt with",
            bad_dir.display()
        ),
    )
}

fn check_quarantine(home: &Home) -> Finding {
    let dir = home.quarantine_dir();
    let set_aside = home
        .root_dir()
        .list_dir(&dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|(n, _)| !n.ends_with(".reason"))
        .count();
    if set_aside == 0 {
        return ok("records", "every record parses");
    }
    bad(
        "records",
        Level::Warn,
        format!(
            "{set_aside} record(s) that did not parse set aside in {}; the rest went on without \
             them",
            dir.display()
        ),
        format!(
            "read {}/*.reason; repair a record and move it back to its place (the name says where, \
with % for /), or delete the pair",
            dir.display()
        ),
    )
}

/// Makes a path's permission bits exactly `mode` (tests of this module use it).
#[cfg(test)]
fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs_for(home: &Home) -> Vec<Finding> {
        let settings = Ok(Settings::default());
        run(&Inputs {
            home,
            settings: &settings,
            inotify_dir: PathBuf::from("/proc/sys/fs/inotify"),
            inotify_instance: Ok(()),
            store: None,
            path: None,
        })
    }

    fn find<'a>(checks: &'a [Finding], name: &str) -> &'a Finding {
        checks.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn a_fresh_home_has_no_failures() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().join("h"));
        home.ensure().unwrap();
        let checks = inputs_for(&home);
        assert_ne!(worst(&checks), Level::Fail, "{checks:#?}");
    }

    #[test]
    fn journal_segments_left_without_a_daemon_warn_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().join("h"));
        home.ensure().unwrap();
        assert_eq!(check_journal(&home).level, Level::Ok);
        fs::write(
            home.journal_dir().join("00000000000000000001.jsonl"),
            "{}\n",
        )
        .unwrap();
        let c = check_journal(&home);
        assert_eq!(c.level, Level::Warn, "{c}");
        assert!(c.fix.unwrap().contains("waitpoint daemon"));
    }

    #[test]
    fn low_inotify_limits_warn_with_the_sysctl_to_run() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("max_user_watches"), "100\n").unwrap();
        fs::write(dir.path().join("max_queued_events"), "16384\n").unwrap();
        let c = check_inotify(dir.path(), &Ok(()));
        assert_eq!(c.level, Level::Warn);
        assert!(c.fix.unwrap().contains("max_user_watches"));
        let c = check_inotify(&dir.path().join("absent"), &Ok(()));
        assert_eq!(c.level, Level::Warn);
        fs::write(dir.path().join("max_user_watches"), "65536\n").unwrap();
        assert_eq!(check_inotify(dir.path(), &Ok(())).level, Level::Ok);
        let exhausted = Err(Error::io(
            "cannot start the file watcher on",
            "/h/tmp/signals",
            std::io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error()),
        ));
        let c = check_inotify(dir.path(), &exhausted);
        assert_eq!(c.level, Level::Warn, "{c}");
        assert!(c.detail.contains("sweep alone"), "{c}");
        assert!(c.fix.unwrap().contains("max_user_instances"));
    }

    #[test]
    fn stale_shim_address_and_unreadable_device_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().join("h"));
        home.ensure().unwrap();
        // A port nobody listens on: bind, note it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let published = |addr: String| {
            home.root_dir()
                .commit_json(
                    &home.webhook_address_file(),
                    &WebhookAddress {
                        url: format!("http://{addr}/webhook/signal"),
                        addr,
                        pid: 1,
                        started_at: crate::clock::Timestamp::from_millis(0),
                    },
                )
                .unwrap()
        };
        published(format!("127.0.0.1:{port}"));
        assert_eq!(check_shim(&home).level, Level::Fail);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        published(addr.to_string());
        assert_eq!(check_shim(&home).level, Level::Ok);
        fs::write(home.webhook_address_file(), "127.0.0.1:1\n").unwrap();
        assert!(
            check_shim(&home)
                .detail
                .contains("not a shim address record")
        );

        let mut gpu = device::Device {
            name: "gpu".into(),
            host: "127.0.0.1".into(),
            port,
            user: "u".into(),
            identity: None,
            known_hosts: "/dev/null".into(),
            spool: "~/.cortex/tmp/signals".into(),
            sweep_ms: None,
            added_at: crate::clock::Timestamp::from_millis(0),
        };
        device::add(&home, &gpu).unwrap();
        let c = check_devices(&home);
        assert_eq!(c.level, Level::Warn);
        assert!(c.detail.contains("gpu"), "{}", c.detail);
        device::remove(&home, "gpu").unwrap();
        gpu.port = addr.port();
        device::add(&home, &gpu).unwrap();
        assert_eq!(check_devices(&home).level, Level::Ok);
    }

    #[test]
    fn group_readable_files_warn_with_a_chmod_and_group_writable_settings_fail() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().join("h"));
        home.ensure().unwrap();
        chmod(home.root(), 0o700);
        fs::write(home.settings_file(), "{}").unwrap();
        chmod(&home.settings_file(), 0o644);
        let checks = inputs_for(&home);
        let c = find(&checks, "modes");
        assert_eq!(c.level, Level::Warn, "{c:?}");
        assert!(c.fix.as_deref().unwrap().contains("chmod 600"), "{c:?}");
        // Writable by the group, it is what the daemon refuses.
        chmod(&home.settings_file(), 0o664);
        let checks = inputs_for(&home);
        let c = find(&checks, "modes");
        assert_eq!(c.level, Level::Fail, "{c:?}");
        assert!(c.fix.as_deref().unwrap().contains("chmod go-w"), "{c:?}");
    }
}
