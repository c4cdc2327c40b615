//! The real agent harnesses, Claude Code and Codex CLI, set up for one test: a private home
//! whose configuration points them at a [`ModelServer`] on 127.0.0.1, registers `waitpoint mcp`
//! as the MCP server `waitpoint`, and answers every first-run question in advance, so they run
//! with no network besides loopback and no prompt. Claude Code runs under `-p` or interactively
//! inside a private tmux server; Codex runs `codex exec` or its TUI, in tmux too.
//!
//! The binaries come from npm, pinned, installed by `scripts/test-deps` (which `scripts/test`
//! runs) under `$WAITPOINT_TEST_DEPS/harness/`; a missing one fails the test with that hint.
//!
//! What each harness needs was found with the pinned versions, Claude Code 2.1.197 and Codex
//! CLI 0.171.0; a new version may ask for something else, so the pins move together with this
//! file.

use std::fs;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{Env, PATIENCE, WAITPOINT};
use crate::model_server::ModelServer;

/// The dummy key both harnesses send to the model server.
const API_KEY: &str = "sk-ant-waitpoint-test-0123456789abcdefghij";

/// A harness binary installed by `scripts/test-deps`: `claude` or `codex`.
pub fn harness_bin(name: &str) -> PathBuf {
    let deps = std::env::var_os("WAITPOINT_TEST_DEPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-deps"));
    let bin = deps.join("harness/node_modules/.bin").join(name);
    assert!(
        bin.exists(),
        "{} is missing: the harness tests need the real Claude Code and Codex CLI \
         (run scripts/test-deps; scripts/test does)",
        bin.display()
    );
    bin
}

/// How a bounded run of a harness ended.
#[derive(Debug)]
pub struct Run {
    /// None when the run was killed at its time limit.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The standard output of a run that exited 0; panics with both streams otherwise.
    pub fn ok(&self) -> &str {
        assert!(
            self.status.is_some_and(|s| s.success()),
            "the harness {}\n--- stdout\n{}\n--- stderr\n{}",
            match self.status {
                Some(s) => format!("failed ({s})"),
                None => "was killed at its time limit".to_owned(),
            },
            self.stdout,
            self.stderr
        );
        &self.stdout
    }
}

/// Runs `cmd` to its end or until `limit`, when it is killed. Its output goes to files, not
/// pipes, so a chatty child cannot block on a full pipe while we wait.
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Run {
    let mut stdout = tempfile::tempfile().unwrap();
    let mut stderr = tempfile::tempfile().unwrap();
    let mut child = cmd
        .stdout(stdout.try_clone().unwrap())
        .stderr(stderr.try_clone().unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |f: &mut fs::File| {
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    Run {
        status,
        stdout: read(&mut stdout),
        stderr: read(&mut stderr),
    }
}

fn read_json(path: &Path) -> Value {
    fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| json!({}))
}

fn write_json(path: &Path, v: &Value) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

/// The MCP server's `env`: this home's CORTEX_HOME, then `vars`.
fn server_env(env: &Env, vars: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut all = vec![("CORTEX_HOME".to_owned(), env.home.display().to_string())];
    all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    all
}

/// The test's project directory, `$HOME/project`, created; canonical, because both harnesses
/// key their per-project state by the real path.
pub fn project_dir(env: &Env) -> PathBuf {
    let project = env.user_home.join("project");
    fs::create_dir_all(&project).unwrap();
    project.canonicalize().unwrap()
}

/// Claude Code for one test: `$HOME/.claude.json`, the project with its `.mcp.json` and
/// `.claude/settings.json`, and the environment that points it at the model server.
pub struct Claude<'e> {
    env: &'e Env,
    pub project: PathBuf,
    base_url: String,
}

/// Sets up Claude Code in `env`'s home against `server`, with `waitpoint mcp` registered as
/// the MCP server `waitpoint` (CORTEX_HOME of `env`) and its tools allowed.
pub fn claude_env<'e>(env: &'e Env, server: &ModelServer) -> Claude<'e> {
    let claude = claude_first_run(env, server);
    claude.edit_settings(|s| s["enableAllProjectMcpServers"] = json!(true));
    claude.mcp_server("waitpoint", WAITPOINT, &["mcp"], &[]);
    claude
}

/// Claude Code as a new user has it after its first run in the project (onboarding done, the
/// project trusted, the key approved), with nothing else configured: what `waitpoint setup`
/// starts from.
pub fn claude_first_run<'e>(env: &'e Env, server: &ModelServer) -> Claude<'e> {
    let project = project_dir(env);
    // Without onboarding done it shows the first-run screens and tries api.anthropic.com;
    // without the project's trust accepted it asks "Is this a project you trust?"; without the
    // key's last 20 characters approved, interactive mode asks "Do you want to use this API
    // key?" (with No preselected).
    let key_tail = &API_KEY[API_KEY.len() - 20..];
    let mut projects = serde_json::Map::new();
    projects.insert(
        project.display().to_string(),
        json!({"hasTrustDialogAccepted": true}),
    );
    write_json(
        &env.user_home.join(".claude.json"),
        &json!({
            "hasCompletedOnboarding": true,
            "customApiKeyResponses": {"approved": [key_tail], "rejected": []},
            "projects": projects,
        }),
    );
    let claude = Claude {
        env,
        project,
        base_url: server.url(),
    };
    // A server from the project's `.mcp.json` waits for approval ("New MCP server found in
    // this project") in interactive mode unless the project's settings enable them all; under
    // -p it starts either way. Each MCP tool call asks for permission unless allowed: under
    // -p the call fails with "Claude requested permissions to use …".
    claude.edit_settings(|s| s["enableAllProjectMcpServers"] = json!(true));
    claude.mcp_server("waitpoint", WAITPOINT, &["mcp"], &[]);
    claude
}

impl Claude<'_> {
    /// Registers (or replaces) the project MCP server `name` = `command args…` with this home's
    /// CORTEX_HOME and `vars` in its environment, and allows all its tools.
    pub fn mcp_server(&self, name: &str, command: &str, args: &[&str], vars: &[(&str, &str)]) {
        let path = self.project.join(".mcp.json");
        let mut config = read_json(&path);
        let env: serde_json::Map<String, Value> = server_env(self.env, vars)
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        config["mcpServers"][name] = json!({"command": command, "args": args, "env": env});
        write_json(&path, &config);
        let rule = format!("mcp__{name}");
        self.edit_settings(|s| {
            let allow = &mut s["permissions"]["allow"];
            if !allow.as_array().is_some_and(|a| a.contains(&json!(rule))) {
                match allow.as_array_mut() {
                    Some(a) => a.push(json!(rule)),
                    None => *allow = json!([rule]),
                }
            }
        });
    }

    /// Adds a command hook for `event` (`Stop`, `SessionEnd`, …) to the project's settings.
    /// With `async_rewake` it runs in the background and, when it exits 2, wakes the model with
    /// its stderr (interactive mode; under -p it runs in line like any hook).
    pub fn hook(&self, event: &str, command: &str, async_rewake: bool) {
        let mut handler = json!({"type": "command", "command": command});
        if async_rewake {
            handler["asyncRewake"] = json!(true);
        }
        self.edit_settings(|s| {
            let groups = &mut s["hooks"][event];
            let group = json!({"hooks": [handler]});
            match groups.as_array_mut() {
                Some(g) => g.push(group),
                None => *groups = json!([group]),
            }
        });
    }

    fn edit_settings(&self, edit: impl FnOnce(&mut Value)) {
        let path = self.project.join(".claude/settings.json");
        let mut settings = read_json(&path);
        edit(&mut settings);
        write_json(&path, &settings);
    }

    /// What Claude Code needs in its environment here; a daemon that resumes it needs it too.
    pub fn vars(&self) -> [(&'static str, String); 4] {
        [
            ("ANTHROPIC_BASE_URL", self.base_url.clone()),
            ("ANTHROPIC_API_KEY", API_KEY.to_owned()),
            // No telemetry, error reports or update checks (the first covers the second too;
            // it is named so that no updater runs whatever the first comes to mean).
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
            ("DISABLE_AUTOUPDATER", "1".to_owned()),
        ]
    }

    /// `claude` in the project directory with the test's clean environment; add arguments.
    pub fn command(&self) -> Command {
        let mut cmd = self.env.command(harness_bin("claude").to_str().unwrap());
        cmd.envs(self.vars()).current_dir(&self.project);
        cmd
    }

    /// `claude -p ARGS… PROMPT` in the project, killed after `limit`.
    pub fn print(&self, prompt: &str, args: &[&str], limit: Duration) -> Run {
        let mut cmd = self.command();
        cmd.arg("-p").args(args).arg(prompt);
        run_bounded(cmd, limit)
    }

    /// Interactive `claude ARGS…` in a private tmux server (a 200×50 pane), returned once its
    /// prompt is ready for input.
    pub fn interactive(&self, args: &[&str], limit: Duration) -> Tmux {
        let tmux = Tmux::start(
            self.env,
            &self.project,
            self.vars(),
            &harness_bin("claude"),
            args,
        );
        // The footer's hint says the prompt is ready: "? for shortcuts", or "← for agents" when
        // a status line takes the footer's place.
        tmux.wait_for_pane(
            |pane| pane.contains("? for shortcuts") || pane.contains("← for agents"),
            limit,
        );
        tmux
    }
}

/// A private tmux server with one pane (`main`); killed, with what runs in it, on drop.
pub struct Tmux {
    socket: PathBuf,
    conf: PathBuf,
    pane_pid: Option<i32>,
}

impl Tmux {
    /// Starts `program args…` in `dir` in a new private tmux server of `env`'s home (one
    /// 200×50 pane, `main`), with the test's clean environment plus `vars`.
    pub fn start(
        env: &Env,
        dir: &Path,
        vars: impl IntoIterator<Item = (&'static str, String)>,
        program: &Path,
        args: &[&str],
    ) -> Tmux {
        let tmux_dir = env.user_home.join("tmux");
        fs::create_dir_all(&tmux_dir).unwrap();
        // A dead pane stays, so a harness that exits at once can still be read.
        let conf = tmux_dir.join("tmux.conf");
        let settings = "set -g remain-on-exit on\nset -g history-limit 10000\n";
        fs::write(&conf, settings).unwrap();
        let mut tmux = Tmux {
            socket: tmux_dir.join("socket"),
            conf,
            pane_pid: None,
        };
        let mut cmd = env.command("tmux");
        // The pane's command inherits the server's environment: this one, and TERM from tmux.
        cmd.envs(vars)
            .current_dir(dir)
            .args(tmux.base_args())
            .args(["new-session", "-d", "-s", "main"])
            .args(["-x", "200", "-y", "50", "-c"])
            .arg(dir)
            .arg("--")
            .arg(program)
            .args(args);
        let out = cmd.output().expect("spawn tmux");
        assert!(out.status.success(), "tmux new-session: {out:?}");
        let pid = tmux.tmux(&["display-message", "-p", "-t", "main", "#{pane_pid}"]);
        tmux.pane_pid = pid.trim().parse().ok();
        tmux
    }

    fn base_args(&self) -> [&Path; 4] {
        [Path::new("-S"), &self.socket, Path::new("-f"), &self.conf]
    }

    /// A tmux client command for this server.
    fn client(&self) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .args(self.base_args())
            .stdin(Stdio::null());
        cmd
    }

    /// Runs a tmux command against this server; its stdout.
    fn tmux(&self, args: &[&str]) -> String {
        let out = self.client().args(args).output().expect("spawn tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` (one short line), waits until the screen shows it, and presses Enter.
    /// Typing and Enter read by the harness in one go would look like a paste, where Enter is a
    /// newline in the text instead of sending it.
    pub fn send_line(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "main", "-l", text]);
        self.wait_for_pane(|pane| pane.contains(text), PATIENCE);
        self.send_keys(&["Enter"]);
    }

    /// Presses keys by their tmux names (`Enter`, `Escape`, `C-c`).
    pub fn send_keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "main"];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    /// The visible screen, wrapped lines joined.
    pub fn capture_pane(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-t", "main"])
    }

    /// Polls the screen until `pred` holds and returns it; panics with the last screen after
    /// `timeout`.
    pub fn wait_for_pane(&self, pred: impl Fn(&str) -> bool, timeout: Duration) -> String {
        self.poll_pane(pred, timeout).unwrap_or_else(|pane| {
            panic!("the pane did not show what was expected within {timeout:?}:\n{pane}")
        })
    }

    /// Polls the screen until `pred` holds (`Ok`, the screen) or `timeout` passes (`Err`, the
    /// last screen).
    pub fn poll_pane(
        &self,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<String, String> {
        let start = Instant::now();
        loop {
            let pane = self.capture_pane();
            if pred(&pane) {
                return Ok(pane);
            }
            if start.elapsed() >= timeout {
                return Err(pane);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .client()
            .arg("kill-server")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // The harness gets SIGHUP and runs its SessionEnd hooks; let it finish before the
        // test's home is removed under it. It is tmux's child, not ours: watch /proc.
        let Some(pid) = self.pane_pid else { return };
        let stat = format!("/proc/{pid}/stat");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            match fs::read_to_string(&stat) {
                Ok(s)
                    if !s
                        .rsplit_once(')')
                        .is_some_and(|(_, rest)| rest.starts_with(" Z")) =>
                {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => return,
            }
        }
    }
}

/// Codex CLI for one test: `$CODEX_HOME/config.toml` with a model provider for the model
/// server and the MCP servers, optional hooks, and a project directory.
pub struct Codex<'e> {
    env: &'e Env,
    pub home: PathBuf,
    pub project: PathBuf,
    base_url: String,
    servers: Vec<McpServer>,
    hooks: bool,
    /// Whether the TUI may run its threads in Codex's managed app-server (see `interactive`).
    pub managed: bool,
}

/// An MCP server entry of Codex's config: `command args…` with `env`.
struct McpServer {
    name: String,
    command: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// Sets up Codex in `env`'s home (`$HOME/.codex`) against `server`, with `waitpoint mcp`
/// registered as the MCP server `waitpoint` (CORTEX_HOME of `env`).
pub fn codex_env<'e>(env: &'e Env, server: &ModelServer) -> Codex<'e> {
    let mut codex = Codex {
        env,
        home: env.user_home.join(".codex"),
        project: project_dir(env),
        base_url: server.url(),
        servers: Vec::new(),
        hooks: false,
        managed: false,
    };
    codex.mcp_server("waitpoint", WAITPOINT, &["mcp"], &[]);
    codex
}

/// A TOML basic string: JSON's string escapes are all valid TOML.
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

impl Codex<'_> {
    /// Registers (or replaces) the MCP server `name` = `command args…` with this home's
    /// CORTEX_HOME and `vars`: Codex passes its MCP servers only a short whitelist of its own
    /// variables (HOME, PATH, LANG…) plus their configured `env`.
    pub fn mcp_server(&mut self, name: &str, command: &str, args: &[&str], vars: &[(&str, &str)]) {
        self.servers.retain(|s| s.name != name);
        self.servers.push(McpServer {
            name: name.to_owned(),
            command: command.to_owned(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: server_env(self.env, vars),
        });
        self.write_config();
    }

    /// Runs `exec` and the TUI with the hooks of `hooks.json` trusted, however they got there.
    pub fn trust_hooks(&mut self) {
        self.hooks = true;
    }

    /// Adds a command hook for `event` (`Stop`, `SessionStart`, …) in `$CODEX_HOME/hooks.json`.
    /// Codex runs only hooks it trusts; `exec` then passes `--dangerously-bypass-hook-trust`,
    /// without which they are skipped silently.
    pub fn hook(&mut self, event: &str, command: &str) {
        let path = self.home.join("hooks.json");
        let mut hooks = read_json(&path);
        let group = json!({"hooks": [{"type": "command", "command": command, "timeout": 60}]});
        match hooks["hooks"][event].as_array_mut() {
            Some(g) => g.push(group),
            None => hooks["hooks"][event] = json!([group]),
        }
        write_json(&path, &hooks);
        self.hooks = true;
    }

    fn write_config(&self) {
        // An unknown model name: Codex then uses fallback metadata (and says so in an `error`
        // item of `exec --json`) and offers MCP tools up front, one namespace per server,
        // where a catalogue model (gpt-5.5) hides them behind its tool_search tool.
        // No approval prompts and no sandbox: tool calls run as they come. No update check
        // and no analytics: nothing to reach but the model server.
        let mut toml = format!(
            "model = \"scripted-model\"\nmodel_provider = \"scripted\"\n\
             approval_policy = \"never\"\nsandbox_mode = \"danger-full-access\"\n\
             check_for_update_on_startup = false\n\n\
             [analytics]\nenabled = false\n\n\
             [model_providers.scripted]\nname = \"Scripted model server\"\n\
             base_url = {}\nwire_api = \"responses\"\nenv_key = \"WAITPOINT_TEST_MODEL_KEY\"\n",
            toml_str(&format!("{}/v1", self.base_url))
        );
        for server in &self.servers {
            let args: Vec<String> = server.args.iter().map(|a| toml_str(a)).collect();
            let vars: Vec<String> = server
                .env
                .iter()
                .map(|(k, v)| format!("{} = {}", toml_str(k), toml_str(v)))
                .collect();
            toml += &format!(
                "\n[mcp_servers.{}]\ncommand = {}\nargs = [{}]\nenv = {{ {} }}\n",
                toml_str(&server.name),
                toml_str(&server.command),
                args.join(", "),
                vars.join(", ")
            );
        }
        fs::create_dir_all(&self.home).unwrap();
        fs::write(self.home.join("config.toml"), toml).unwrap();
    }

    /// `codex` in the project directory with the test's clean environment; add arguments.
    pub fn command(&self) -> Command {
        let mut cmd = self.env.command(harness_bin("codex").to_str().unwrap());
        cmd.envs(self.vars()).current_dir(&self.project);
        cmd
    }

    /// What Codex needs in its environment here; a daemon that resumes it needs it too.
    pub fn vars(&self) -> [(&'static str, String); 2] {
        [
            ("CODEX_HOME", self.home.display().to_string()),
            ("WAITPOINT_TEST_MODEL_KEY", API_KEY.to_owned()),
        ]
    }

    /// The interactive Codex TUI, `codex ARGS…` in the project, in a private tmux server (a
    /// 200×50 pane), returned once its prompt is ready for input.
    ///
    /// Unless `managed`, the TUI runs its threads itself (`--no-daemon`); otherwise it starts
    /// (or joins) Codex's managed app-server under CODEX_HOME, as a user's TUI does, which then
    /// runs the hooks and MCP servers. A hook-trust flag would keep the TUI from the
    /// app-server, so there the hooks are trusted as a user does, in the TUI's review dialog.
    pub fn interactive(&self, args: &[&str], limit: Duration) -> Tmux {
        let mut all = if self.managed {
            vec![]
        } else {
            // Without --no-daemon the TUI would run its session in the shared app server
            // (a detached daemon with an updater loop beside it) that outlives the pane.
            vec!["--no-daemon"]
        };
        // A new or changed hook holds the start at "Hooks need review" until someone answers.
        if self.hooks && !self.managed {
            all.push("--dangerously-bypass-hook-trust");
        }
        all.extend_from_slice(args);
        let tmux = Tmux::start(
            self.env,
            &self.project,
            self.vars(),
            &harness_bin("codex"),
            &all,
        );
        // The footer names the model once the session is configured; the bare composer with
        // "? for shortcuts" shows before that, and a first-run dialog (the hooks' review) can
        // still take its place then.
        let ready =
            |pane: &str| pane.contains("? for shortcuts") && pane.contains("scripted-model");
        let review = "Hooks need review";
        let start = Instant::now();
        loop {
            let left = limit.saturating_sub(start.elapsed());
            let pane = tmux.wait_for_pane(|pane| ready(pane) || pane.contains(review), left);
            if ready(&pane) {
                return tmux;
            }
            // The second choice: "Trust all and continue". Asked again until the dialog goes.
            tmux.send_keys(&["Down", "Enter"]);
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The processes of Codex's managed app-server of this CODEX_HOME (the server and its
    /// updater loop, both run from `$CODEX_HOME/packages`), found by their command lines.
    pub fn managed_daemons(&self) -> Vec<u32> {
        let packages = self.home.join("packages").display().to_string();
        fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).starts_with(&packages))
            })
            .collect()
    }

    /// `codex exec --json ARGS… PROMPT` in the project, killed after `limit`. Its stdout is
    /// one JSON event per line; the first, `thread.started`, names the thread ([`thread_id`]).
    pub fn exec(&self, prompt: &str, args: &[&str], limit: Duration) -> Run {
        let mut cmd = self.command();
        // The project is no git repository, which `exec` refuses unless told.
        cmd.args(["exec", "--json", "--skip-git-repo-check"]);
        if self.hooks {
            cmd.arg("--dangerously-bypass-hook-trust");
        }
        cmd.args(args).arg(prompt);
        run_bounded(cmd, limit)
    }
}

impl Drop for Codex<'_> {
    /// Codex's managed app-server and its updater outlive every TUI by design; the test's
    /// must not outlive the test. Its hooks and MCP servers go with it (their stdin closes).
    fn drop(&mut self) {
        if !self.managed {
            return;
        }
        let _ = self
            .command()
            .args(["app-server", "daemon", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        for pid in self.managed_daemons() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// The thread id (a UUIDv7, also the session id Codex sends) from `codex exec --json` output.
pub fn thread_id(exec_stdout: &str) -> String {
    exec_stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "thread.started")
        .and_then(|e| e["thread_id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no thread.started event in:\n{exec_stdout}"))
}

/// The `codex exec --json` events of type `kind` (`item.completed`, …), parsed.
pub fn events(exec_stdout: &str, kind: &str) -> Vec<Value> {
    exec_stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == kind)
        .collect()
}
