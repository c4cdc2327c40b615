//! Test helpers: a temp home with its own `$HOME`, running the real binaries, a daemon child
//! that is killed on drop, bounded waits, and failure reports that print the command, its
//! output and the home tree.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

pub const WAITPOINT: &str = env!("CARGO_BIN_EXE_waitpoint");
pub const CORTEX_SIGNAL: &str = env!("CARGO_BIN_EXE_cortex-signal");

/// The longest any test waits for the daemon to do something. Generous on purpose: this bounds
/// a hang, it is not a timing assertion. With the whole suite running on two cores, one fsync of
/// a small file was seen to take 27 s (ext4 flushing other tests' data first), so the bound is
/// far above that.
pub const PATIENCE: Duration = Duration::from_secs(120);

pub struct Env {
    _dir: tempfile::TempDir,
    pub home: PathBuf,
    pub user_home: PathBuf,
    bin_dir: PathBuf,
}

impl Env {
    /// A fresh home with a short sweep so parked-file and deadline tests finish quickly.
    pub fn new() -> Self {
        Self::with_settings(r#"{"waitpointSweepMs": 300}"#)
    }

    pub fn with_settings(settings: &str) -> Self {
        Self::in_dir(tempfile::tempdir().expect("temp dir"), settings)
    }

    /// A fresh home on `/dev/shm` (tmpfs): a filesystem where freeing a file never waits for
    /// the device, unlike this machine's root (mounted with `discard`), so the daemon takes
    /// the paths it takes on most users' disks.
    pub fn on_tmpfs(settings: &str) -> Self {
        let dir = tempfile::tempdir_in("/dev/shm").expect("a temp dir on /dev/shm (tmpfs)");
        Self::in_dir(dir, settings)
    }

    fn in_dir(dir: tempfile::TempDir, settings: &str) -> Self {
        let home = dir.path().join("cortex");
        let user_home = dir.path().join("user");
        fs::create_dir_all(&user_home).unwrap();
        fs::create_dir_all(&home).unwrap();
        fs::write(home.join("settings.json"), settings).unwrap();
        let bin_dir = Path::new(WAITPOINT).parent().unwrap().to_owned();
        Env {
            _dir: dir,
            home,
            user_home,
            bin_dir,
        }
    }

    /// A command with a clean environment: this home, a private `$HOME`, our binaries first on
    /// `PATH`, and none of the caller's CORTEX_* variables.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", self.bin_dir.display()))
            .env("HOME", &self.user_home)
            .env("CORTEX_HOME", &self.home)
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null());
        c
    }

    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program).args(args).output().expect("spawn")
    }

    pub fn waitpoint(&self, args: &[&str]) -> Output {
        self.run(WAITPOINT, args)
    }

    pub fn signal(&self, args: &[&str]) -> Output {
        self.run(CORTEX_SIGNAL, args)
    }

    /// Runs `sh -c script` in this environment.
    pub fn sh(&self, script: &str) -> Output {
        self.command("sh")
            .args(["-c", script])
            .output()
            .expect("spawn sh")
    }

    /// Runs a job that succeeds (`true`) or fails (`false`) with a `how_to_signal` line appended,
    /// exactly as a user pastes it, its `MEMBER` placeholder replaced by `member`.
    pub fn job_then(&self, job_ok: bool, line: &str, member: Option<&str>) -> Output {
        let job = if job_ok { "true" } else { "false" };
        let line = match member {
            Some(m) => line.replace("MEMBER", m),
            None => line.to_owned(),
        };
        self.sh(&format!("{job}; {line}"))
    }

    /// Asserts the exit code, printing everything useful when it is not the expected one.
    pub fn expect_code(&self, what: &str, out: &Output, code: i32) -> String {
        if out.status.code() != Some(code) {
            panic!(
                "{what}: expected exit {code}, got {:?}\n{}",
                out.status.code(),
                self.report(out)
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn ok(&self, what: &str, out: &Output) -> String {
        self.expect_code(what, out, 0)
    }

    pub fn report(&self, out: &Output) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}\n--- home\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.tree(),
            self.daemon_report()
        )
    }

    /// The last `n` lines of the daemon's log, for failure reports.
    pub fn daemon_log_tail(&self, n: usize) -> String {
        tail(&self.home.join("log/daemon.log"), n)
    }

    /// What the daemons started for this home said, for failure reports: the last lines of
    /// each one's stderr (a `daemon-stderr-*.txt` file beside the home, oldest first) and of
    /// `log/daemon.log`.
    pub fn daemon_report(&self) -> String {
        let mut stderrs: Vec<PathBuf> = fs::read_dir(self.home.join(".."))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        let name = p.file_name().unwrap().to_string_lossy();
                        name.starts_with(DAEMON_STDERR) && name.ends_with(".txt")
                    })
                    .collect()
            })
            .unwrap_or_default();
        stderrs.sort_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok());
        let mut out = String::new();
        for path in &stderrs {
            out.push_str(&format!(
                "--- daemon stderr {} (last {REPORT_LINES} lines)\n{}\n",
                path.file_name().unwrap().to_string_lossy(),
                tail(path, REPORT_LINES)
            ));
        }
        out.push_str(&format!(
            "--- log/daemon.log (last {REPORT_LINES} lines)\n{}",
            self.daemon_log_tail(REPORT_LINES)
        ));
        out
    }

    /// The reasons (`<path>: <why>`) of everything set aside into the home's quarantine.
    pub fn quarantined_reasons(&self) -> Vec<String> {
        fs::read_dir(self.home.join("quarantine"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".reason"))
                    .map(|e| fs::read_to_string(e.path()).unwrap())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Asserts that `rel` (a path under the home) was set aside into the quarantine as not a
    /// regular file, with its reason.
    pub fn assert_set_aside_as_not_regular(&self, rel: &str, what: &str) {
        let reasons = self.quarantined_reasons();
        let said = format!("{rel}: is not a regular file");
        assert!(
            reasons.iter().any(|r| r.starts_with(&said)),
            "{what}: {reasons:?}\n{}",
            self.tree()
        );
    }

    /// Every path under the home, one per line, for failure messages.
    pub fn tree(&self) -> String {
        let mut lines = Vec::new();
        walk(&self.home, &mut |p| {
            lines.push(p.strip_prefix(&self.home).unwrap().display().to_string())
        });
        lines.sort();
        lines.join("\n")
    }

    /// Every regular file under the home.
    pub fn files(&self) -> Vec<PathBuf> {
        files_under(&self.home)
    }

    /// Arms a waitpoint through the CLI (`waitpoint create --json`) labelled `label` with
    /// `extra` flags, its intent "i" unless `extra` has an `--intent`; the reply's JSON.
    /// Arming through the library is [`Arming`].
    pub fn arm(&self, label: &str, extra: &[&str]) -> Value {
        let mut args = vec!["--label", label];
        if !extra.contains(&"--intent") {
            args.extend(["--intent", "i"]);
        }
        args.extend_from_slice(extra);
        self.create(&args)
    }

    /// `waitpoint create --json` with `args`, returning the reply.
    pub fn create(&self, args: &[&str]) -> Value {
        let mut all = vec!["create", "--json"];
        all.extend_from_slice(args);
        self.waitpoint_json("create", &all)
    }

    /// Runs `waitpoint ARGS` (a `--json` form), which must succeed, and parses what it prints.
    pub fn waitpoint_json(&self, what: &str, args: &[&str]) -> Value {
        parse_json(&self.ok(what, &self.waitpoint(args)))
    }

    /// Creates a timer for `session` that fires at once (`timer create --after-ms 1`).
    pub fn timer_now(&self, session: &str, summary: &str) {
        let out = self.waitpoint(&[
            "timer",
            "create",
            "--after-ms",
            "1",
            "--summary",
            summary,
            "--session",
            session,
        ]);
        self.ok("timer create", &out);
    }

    /// The stored state of a waitpoint.
    /// An engine on this home, as a command would have it (no daemon: no journal checkpointer,
    /// no trash), for tests that drive the library in-process.
    pub fn engine(&self) -> waitpoint::engine::Engine {
        let home = waitpoint::home::Home::new(&self.home);
        home.ensure().unwrap();
        waitpoint::engine::Engine::new(
            home,
            waitpoint::settings::Settings::default(),
            std::sync::Arc::new(waitpoint::clock::SystemClock),
        )
    }

    /// A waitpoint's state, read as the engine reads it (`Root::read_json` takes the shared
    /// lock a rewrite over the state's spare respects), so a test that polls it while the
    /// daemon writes never reads one half written.
    pub fn state(&self, id: &str) -> Value {
        let path = self.home.join("waitpoints").join(id).join("waitpoint.json");
        waitpoint::home::Home::new(&self.home)
            .root_dir()
            .read_json(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), self.tree()))
            .unwrap_or_else(|| panic!("{}: missing\n{}", path.display(), self.tree()))
    }

    pub fn drop_zone(&self) -> PathBuf {
        self.home.join("tmp/signals")
    }

    /// Drops a signal file the way the spec says: write `.tmp`, rename to `.json`.
    pub fn drop_file(&self, name: &str, body: &str) {
        let dz = self.drop_zone();
        fs::create_dir_all(&dz).unwrap();
        let tmp = dz.join(format!("{name}.tmp"));
        fs::write(&tmp, body).unwrap();
        fs::rename(&tmp, dz.join(format!("{name}.json"))).unwrap();
    }

    /// Names left in the drop zone (`*.json`).
    pub fn spooled(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.drop_zone())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Files in a channel's inbox folder (`new` or `cur`).
    pub fn inbox(&self, channel: &str, folder: &str) -> Vec<Value> {
        let dir = self
            .home
            .join("sessions")
            .join(channel)
            .join("wakes")
            .join(folder);
        read_json_dir(&dir)
    }

    /// Starts `waitpoint daemon` and waits until it says it is ready.
    pub fn daemon(&self) -> DaemonGuard {
        self.daemon_with_env(&[])
    }

    pub fn daemon_with_env(&self, env: &[(&str, &str)]) -> DaemonGuard {
        self.daemon_with(&[], env)
    }

    /// Starts `waitpoint daemon ARGS…` with extra environment, and returns at once.
    pub fn daemon_spawned(&self, args: &[&str], env: &[(&str, &str)]) -> DaemonGuard {
        self.spawn_daemon(args, env, |_| {})
    }

    /// Starts `waitpoint daemon ARGS…` with its open-descriptor limit (soft and hard) set to
    /// `nofile` before it runs, and waits until it is ready.
    pub fn daemon_with_descriptor_limit(&self, args: &[&str], nofile: u64) -> DaemonGuard {
        self.until_ready(|| {
            self.spawn_daemon(args, &[], |cmd| {
                use rustix::process::{Resource, Rlimit, setrlimit};
                use std::os::unix::process::CommandExt;
                let limit = Rlimit {
                    current: Some(nofile),
                    maximum: Some(nofile),
                };
                // SAFETY: pre_exec runs the closure in the forked child before exec, where only
                // async-signal-safe work is allowed. rustix's setrlimit is one system call
                // (prlimit64) on a value copied in, without allocation or locks, and its error
                // becomes an io::Error from the raw errno, also without allocating.
                unsafe {
                    cmd.pre_exec(move || {
                        setrlimit(Resource::Nofile, limit).map_err(std::io::Error::from)
                    });
                }
            })
        })
    }

    fn spawn_daemon(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
        adjust: impl FnOnce(&mut Command),
    ) -> DaemonGuard {
        let stderr_path = self
            .home
            .join("..")
            .join(format!("{DAEMON_STDERR}{}.txt", rand_tag()));
        let stderr = fs::File::create(&stderr_path).unwrap();
        let mut cmd = self.command(WAITPOINT);
        cmd.arg("daemon")
            .args(args)
            .stdout(Stdio::null())
            .stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        adjust(&mut cmd);
        let child = cmd.spawn().expect("spawn daemon");
        DaemonGuard {
            child,
            stderr_path,
            log_path: self.home.join("log/daemon.log"),
        }
    }

    /// Starts `waitpoint daemon ARGS…` with extra environment and waits until it is ready.
    pub fn daemon_with(&self, args: &[&str], env: &[(&str, &str)]) -> DaemonGuard {
        self.until_ready(|| self.daemon_spawned(args, env))
    }

    /// Runs `start` and waits until the daemon it started says it is ready.
    fn until_ready(&self, start: impl FnOnce() -> DaemonGuard) -> DaemonGuard {
        let log = self.home.join("log/daemon.log");
        let before = fs::read_to_string(&log)
            .map(|s| s.matches("daemon ready").count())
            .unwrap_or(0);
        let guard = start();
        self.wait_until("the daemon to be ready", || {
            fs::read_to_string(&log)
                .map(|s| s.matches("daemon ready").count() > before)
                .unwrap_or(false)
        });
        guard
    }

    /// The port of the HTTP shim, from the address file the daemon publishes.
    pub fn webhook_port(&self) -> u16 {
        let file = self.home.join("webhook.json");
        self.wait_until("the webhook address file", || file.exists());
        let v: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        let addr: std::net::SocketAddr = v["addr"].as_str().unwrap().parse().unwrap();
        addr.port()
    }

    /// Polls `check` until it holds, at most [`PATIENCE`]; otherwise panics saying what it
    /// waited for, with what the daemons said and the home tree.
    pub fn wait_until(&self, what: &str, check: impl FnMut() -> bool) {
        self.wait_until_within(what, PATIENCE, check)
    }

    /// [`Env::wait_until`] with another bound, for work that is slow by design (thousands of
    /// durable commits).
    pub fn wait_until_within(&self, what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if check() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "gave up waiting for {what} (after {limit:?})\n{}\n--- home\n{}",
            self.daemon_report(),
            self.tree()
        );
    }

    /// Waits until the drop zone is empty (everything collected or parked).
    pub fn wait_drained(&self) {
        self.wait_until("the drop zone to drain", || self.spooled().is_empty());
    }

    /// The files in `tmp/trash/` (consumed spool files and replaced states not yet removed).
    pub fn trashed(&self) -> Vec<PathBuf> {
        fs::read_dir(self.home.join("tmp/trash"))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default()
    }

    /// Waits until the daemon's reaper has emptied the trash.
    pub fn wait_trash_emptied(&self) {
        self.wait_until("the trash to empty", || self.trashed().is_empty());
    }

    /// Writes a file under the home by path (for fabricating crash states).
    pub fn write(&self, rel: &str, bytes: &[u8]) {
        let p = self.home.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let mut f = fs::File::create(p).unwrap();
        f.write_all(bytes).unwrap();
    }
}

pub struct DaemonGuard {
    child: Child,
    pub stderr_path: PathBuf,
    /// Its home's `log/daemon.log`.
    log_path: PathBuf,
}

// ---- daemons driven by signals (tests/it/ops.rs) ----
impl Env {
    /// Starts `waitpoint daemon ARGS` and returns once it holds the home's lock, without waiting
    /// for its startup drain to finish.
    pub fn daemon_started(&self, args: &[&str]) -> DaemonGuard {
        let guard = self.daemon_spawned(args, &[]);
        let pid = guard.pid().to_string();
        let lock = self.home.join("daemon.lock");
        self.wait_until("the daemon to take its lock", || {
            fs::read_to_string(&lock).is_ok_and(|s| s.trim() == pid)
        });
        guard
    }
}

impl DaemonGuard {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `Signal::TERM`) to the daemon, our own child, not yet reaped.
    pub fn send(&self, signal: Signal) {
        kill_process(Pid::from_child(&self.child), signal).expect("kill failed");
    }

    /// Waits (at most [`PATIENCE`]) for the daemon to exit; its exit code and stderr.
    pub fn wait_exit(&mut self) -> (Option<i32>, String) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let stderr = fs::read_to_string(&self.stderr_path).unwrap_or_default();
                return (status.code(), stderr);
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the daemon did not exit\n{}",
                fs::read_to_string(&self.stderr_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
// ---- end daemons driven by signals ----

impl DaemonGuard {
    /// Stops the daemon the way an operator does (SIGTERM) and returns how it exited.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // kill(2) cannot fail on our own child before it is reaped (a zombie included): unchecked.
        let _ = kill_process(Pid::from_child(&self.child), Signal::TERM);
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < PATIENCE, "the daemon ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the daemon is still running (it has not exited or been killed).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the daemon (SIGKILL: the engine must survive that) and returns its stderr.
    pub fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

impl Drop for DaemonGuard {
    /// Kills the daemon; when the test is failing (a panic unwinds through the guard), prints
    /// what the daemon said, so the failure shows it.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- daemon {} stderr, {} (last {REPORT_LINES} lines)\n{}\n--- {} (last \
                 {REPORT_LINES} lines)\n{}",
                self.child.id(),
                self.stderr_path.display(),
                tail(&self.stderr_path, REPORT_LINES),
                self.log_path.display(),
                tail(&self.log_path, REPORT_LINES)
            );
        }
    }
}

/// Calls `f` on every path under `dir` (not following links), parents before their children.
fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        f(&p);
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            walk(&p, f);
        }
    }
}

/// Every regular file under `dir` (links and other special files left out).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk(dir, &mut |p| {
        if fs::symlink_metadata(p)
            .map(|m| m.is_file())
            .unwrap_or(false)
        {
            out.push(p.to_owned());
        }
    });
    out
}

/// A loopback port nothing listens on at the time of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A command's stderr as text.
pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `text` parsed as JSON; a panic that shows the text when it is not.
pub fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// How the files a daemon's stderr goes to are named, in its home's parent directory.
const DAEMON_STDERR: &str = "daemon-stderr-";

/// How many of a log's last lines a failure report shows.
const REPORT_LINES: usize = 40;

/// The last `n` lines of a file (nothing when it cannot be read).
fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn rand_tag() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ u64::from(std::process::id())
}

/// The `*.json` files of a directory (not temp files), parsed, in name order; none when it is
/// missing.
pub fn read_json_dir(dir: &Path) -> Vec<Value> {
    let mut names: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    let n = p.file_name().unwrap().to_string_lossy();
                    n.ends_with(".json") && !n.starts_with('.')
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        .map(|p| serde_json::from_slice(&fs::read(p).unwrap()).unwrap())
        .collect()
}

/// `id` and `secret` of a create reply.
pub fn id_secret(reply: &Value) -> (String, String) {
    (
        reply["id"].as_str().unwrap().to_owned(),
        reply["secret"].as_str().unwrap().to_owned(),
    )
}

/// A `how_to_signal` line of a create reply.
pub fn line(reply: &Value, form: &str) -> String {
    reply["how_to_signal"][form].as_str().unwrap().to_owned()
}

/// An arming through the library (`Engine::create`, what `wait_create` does), for tests that
/// drive an engine or a [`Live`] daemon in-process: the request's options as a builder over the
/// spec's defaults, with intent "i" and session "default"; [`Arming::on`] arms it and returns
/// the id and the secret. Arming through the CLI is [`Env::arm`].
pub struct Arming(waitpoint::engine::CreateRequest);

impl Arming {
    pub fn new(label: &str) -> Arming {
        Arming(waitpoint::engine::CreateRequest::new(label, "i", "default"))
    }

    pub fn intent(mut self, intent: &str) -> Arming {
        self.0.intent = intent.to_owned();
        self
    }

    /// The session, and the channel named after it.
    pub fn session(mut self, session: &str) -> Arming {
        self.0.session = session.to_owned();
        self.0.channel = session.to_owned();
        self
    }

    pub fn members(mut self, members: &[&str]) -> Arming {
        self.0.members = members.iter().map(|m| m.to_string()).collect();
        self
    }

    pub fn quorum(mut self, quorum: waitpoint::engine::Quorum) -> Arming {
        self.0.quorum = Some(quorum);
        self
    }

    pub fn max_signals(mut self, max_signals: u32) -> Arming {
        self.0.max_signals = max_signals;
        self
    }

    /// Fail-fast off: a failed report does not end the waitpoint.
    pub fn no_fail_fast(mut self) -> Arming {
        self.0.fail_fast = false;
        self
    }

    pub fn expires_in_hours(mut self, hours: f64) -> Arming {
        self.0.expires_in_hours = Some(hours);
        self
    }

    pub fn started_within_ms(mut self, ms: u64) -> Arming {
        self.0.started_within_ms = Some(ms);
        self
    }

    pub fn heartbeat_within_ms(mut self, ms: u64) -> Arming {
        self.0.heartbeat_within_ms = Some(ms);
        self
    }

    /// Arms it on `engine`; the id and the secret.
    pub fn on(self, engine: &waitpoint::engine::Engine) -> (String, String) {
        let c = engine.create(self.0).unwrap();
        (c.waitpoint.id, c.secret)
    }
}

/// A spool body for `id`/`secret` with extra JSON fields (`,"member":"a"`).
pub fn body(id: &str, secret: &str, extra: &str) -> String {
    format!(r#"{{"id":"{id}","secret":"{secret}"{extra}}}"#)
}

/// A daemon running in this process on a manual clock, for rules that play out over hours.
pub struct Live {
    pub clock: std::sync::Arc<waitpoint::clock::ManualClock>,
    pub engine: waitpoint::engine::Engine,
    control: waitpoint::daemon::DaemonControl,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Live {
    /// Starts a daemon on `env`'s home with its settings, the clock at `start`.
    pub fn start(env: &Env, start: waitpoint::clock::Timestamp) -> Live {
        use std::sync::Arc;
        use waitpoint::clock::ManualClock;
        let clock = Arc::new(ManualClock::new(start));
        Self::start_with(env, clock)
    }

    pub fn start_with(env: &Env, clock: std::sync::Arc<waitpoint::clock::ManualClock>) -> Live {
        use waitpoint::daemon::{Daemon, DaemonConfig};
        let home = waitpoint::home::Home::new(&env.home);
        let settings =
            waitpoint::settings::Settings::load(&home.settings_file(), |_| None).unwrap();
        let (daemon, control) = Daemon::new(
            DaemonConfig {
                home: home.clone(),
                settings: settings.clone(),
                http: None,
            },
            clock.clone(),
        )
        .unwrap();
        let thread = std::thread::spawn(move || daemon.run().unwrap());
        let engine = waitpoint::engine::Engine::new(home, settings, clock.clone());
        Live {
            clock,
            engine,
            control,
            thread: Some(thread),
        }
    }

    /// Moves the clock and lets the daemon act on it.
    pub fn advance_ms(&self, ms: i64) {
        self.clock.advance_ms(ms);
        self.control.nudge();
    }

    /// Returns once the daemon has handled everything sent to it so far and run what is due
    /// at the clock's time: after this, what has not happened is not going to without more
    /// time (the barrier tests wait on instead of sleeping).
    pub fn settle(&self) {
        assert!(
            self.control.barrier(PATIENCE),
            "the daemon did not reach the barrier within {PATIENCE:?}"
        );
    }

    /// Stops the daemon and waits for it to return.
    pub fn stop(mut self) {
        self.control.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.control.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A fixed instant for tests on a manual clock: 2026-12-01T00:00:00Z.
pub const T0: waitpoint::clock::Timestamp =
    waitpoint::clock::Timestamp::from_millis(1_796_083_200_000);

/// Asserts that `payload` appears in a wake's `text` only inside its external-payload frame.
pub fn assert_framed_as_data(text: &str, payload: &str) {
    let (ours, theirs) = text
        .split_once("\nExternal payload. ")
        .unwrap_or_else(|| panic!("no external-payload frame:\n{text}"));
    assert!(
        !ours.contains(payload),
        "job text outside the frame:\n{text}"
    );
    assert!(theirs.contains(payload), "the payload is missing:\n{text}");
    assert!(
        theirs.starts_with(waitpoint::records::EXTERNAL_NOTICE),
        "the frame lacks its notice:\n{text}"
    );
}

/// The CPU time (user + system) a process has used so far, from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("the waiter is running");
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are
    // fixed: utime and stime are the 12th and 13th of them.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = rustix::param::clock_ticks_per_second();
    Duration::from_millis(ticks * 1000 / per_second)
}
