//! `waitpoint setup`: what a harness's configuration needs for the agent loop (the MCP server,
//! the hooks that wake a live session, Claude Code's status line) and the home's `onWake`
//! resume of a closed one, merged into the files that are there.
//!
//! Planning is pure: each file's text before goes in, its text after and a line per change come
//! out, so the merge rules are tested without a disk. A merge keeps everything it does not own
//! (other servers, other hooks, a status line of the user's own, comments in TOML) and owns only
//! entries that run `waitpoint`: running it twice changes nothing. What it does not own stays
//! byte for byte (`json.rs` rewrites only the values that change), and a merge that could only
//! be made by losing something (a key twice, our entry's place holding another shape) is
//! refused with the reason. How the files are reached and replaced is `disk.rs`.

mod disk;
mod json;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::harness::Harness;

pub use disk::{Access, Found, MAX_FILE_BYTES, Written, read};

/// Where a harness's configuration goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The user's own files: every project.
    User,
    /// The project's files: this project, for everyone who works in it.
    Project,
}

/// What a plan depends on.
#[derive(Debug, Clone)]
pub struct Context {
    /// How the harness, its hooks and the daemon's `onWake` run us: an absolute path (the
    /// daemon's `PATH` is not the shell's), written the same everywhere.
    pub program: String,
    /// The home, when it is not the one found without being told (`~/.cortex`): the MCP
    /// server and every hook are given it explicitly, since a harness passes hooks its own
    /// environment, not the MCP server's.
    pub home: Option<PathBuf>,
    /// The home's `settings.json`.
    pub home_settings: PathBuf,
    /// The user's home directory.
    pub user_dir: PathBuf,
    /// Where Codex keeps the user's `config.toml` and `hooks.json` when `$CODEX_HOME` says
    /// (`None`: `~/.codex`). A project's `.codex/` is where it is whatever this says.
    pub codex_home: Option<PathBuf>,
    /// The project directory.
    pub project_dir: PathBuf,
}

impl Context {
    /// A `waitpoint` command line for a harness's configuration.
    fn command(&self, args: &str) -> String {
        match &self.home {
            Some(h) => format!(
                "{} --home {} {args}",
                shell_word(&self.program),
                shell_word(&h.to_string_lossy())
            ),
            None => format!("{} {args}", shell_word(&self.program)),
        }
    }

    fn mcp_env(&self) -> Map<String, Value> {
        let mut env = Map::new();
        if let Some(h) = &self.home {
            env.insert("CORTEX_HOME".into(), json!(h.to_string_lossy()));
        }
        env
    }
}

/// Quotes `s` for `sh` when it needs it.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%".contains(&b));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// One file of a plan: its text before (`None`: absent) and after, and what changed.
#[derive(Debug, Clone)]
pub struct Edit {
    pub path: PathBuf,
    pub before: Option<String>,
    pub after: String,
    pub changes: Vec<String>,
}

impl Edit {
    /// Whether writing it changes the file.
    pub fn changes_anything(&self) -> bool {
        self.before.as_deref() != Some(self.after.as_str())
    }
}

/// A file refused for a reason (it does not parse, holds something of an unexpected shape, is a
/// link or not a regular file): named with the reason and the fix, left alone.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}; {fix}", path.display())]
pub struct Unmergeable {
    pub path: PathBuf,
    pub reason: String,
    pub fix: String,
}

/// What to do about a file whose content setup cannot merge.
const FIX_CONTENT: &str = "fix or move it, then run setup again";

impl Unmergeable {
    fn content(path: &Path, reason: String) -> Unmergeable {
        Unmergeable {
            path: path.to_owned(),
            reason,
            fix: FIX_CONTENT.into(),
        }
    }
}

/// What a file of the plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Where Claude Code reads its MCP servers (`~/.claude.json`, the project's `.mcp.json`).
    ClaudeMcp,
    /// Claude Code's settings: hooks, status line, tool permissions.
    ClaudeSettings,
    /// The user's approval of the project's `.mcp.json` server, where Claude Code's own
    /// approval dialog writes it (`.claude/settings.local.json`, the user's and not shared);
    /// Claude Code does not take an approval from the project's shared settings.
    ClaudeApproval,
    /// Codex's `config.toml`: the MCP server.
    CodexConfig,
    /// Codex's `hooks.json`.
    CodexHooks,
    /// Gemini CLI's `settings.json`: the MCP server and the hooks.
    GeminiSettings,
    /// OpenCode's `opencode.json`: the MCP server.
    OpenCodeConfig,
    /// OpenCode's plugin file, ours as a whole: the session route and the live wake.
    OpenCodePlugin,
    /// The home's `settings.json`: `onWake`.
    Home,
}

/// A file of the plan, with the directory it is reached from and how.
#[derive(Debug, Clone)]
pub struct Place {
    pub path: PathBuf,
    /// The directory the user named or owns (the project, the user's home directory, the
    /// waitpoint home): opened as it is, a link there being the user's own choice.
    pub root: PathBuf,
    pub access: Access,
}

fn roles(h: Harness, scope: Scope, ctx: &Context) -> Vec<(Role, PathBuf)> {
    let (user, project) = (&ctx.user_dir, &ctx.project_dir);
    let mut files = match (h, scope) {
        (Harness::Claude, Scope::User) => vec![
            (Role::ClaudeMcp, user.join(".claude.json")),
            (Role::ClaudeSettings, user.join(".claude/settings.json")),
        ],
        (Harness::Claude, Scope::Project) => vec![
            (Role::ClaudeMcp, project.join(".mcp.json")),
            (Role::ClaudeSettings, project.join(".claude/settings.json")),
            (
                Role::ClaudeApproval,
                project.join(".claude/settings.local.json"),
            ),
        ],
        (Harness::Codex, Scope::User) => {
            let dir = ctx
                .codex_home
                .clone()
                .unwrap_or_else(|| user.join(".codex"));
            vec![
                (Role::CodexConfig, dir.join("config.toml")),
                (Role::CodexHooks, dir.join("hooks.json")),
            ]
        }
        (Harness::Codex, Scope::Project) => vec![
            (Role::CodexConfig, project.join(".codex/config.toml")),
            (Role::CodexHooks, project.join(".codex/hooks.json")),
        ],
        (Harness::Gemini, Scope::User) => {
            vec![(Role::GeminiSettings, user.join(".gemini/settings.json"))]
        }
        (Harness::Gemini, Scope::Project) => {
            vec![(Role::GeminiSettings, project.join(".gemini/settings.json"))]
        }
        (Harness::OpenCode, Scope::User) => vec![
            (
                Role::OpenCodeConfig,
                user.join(".config/opencode/opencode.json"),
            ),
            (
                Role::OpenCodePlugin,
                user.join(".config/opencode/plugins/waitpoint.js"),
            ),
        ],
        (Harness::OpenCode, Scope::Project) => vec![
            (Role::OpenCodeConfig, project.join("opencode.json")),
            (
                Role::OpenCodePlugin,
                project.join(".opencode/plugins/waitpoint.js"),
            ),
        ],
    };
    files.push((Role::Home, ctx.home_settings.clone()));
    files
}

/// The files `setup` reads, in the order the plan edits them: the project's (`--project`) are
/// never reached through a link, the user's only through a link to the user's own regular file.
pub fn files(h: Harness, scope: Scope, ctx: &Context) -> Vec<Place> {
    roles(h, scope, ctx)
        .into_iter()
        .map(|(role, path)| {
            let (root, access) = match (role, scope) {
                (Role::Home, _) => (home_root(ctx), Access::Home),
                // The directory `$CODEX_HOME` names is the user's own choice, opened as it is.
                (Role::CodexConfig | Role::CodexHooks, Scope::User)
                    if let Some(dir) = &ctx.codex_home =>
                {
                    (dir.clone(), Access::User)
                }
                (_, Scope::User) => (ctx.user_dir.clone(), Access::User),
                (_, Scope::Project) => (ctx.project_dir.clone(), Access::Project),
            };
            Place { path, root, access }
        })
        .collect()
}

fn home_root(ctx: &Context) -> PathBuf {
    ctx.home_settings
        .parent()
        .map(Path::to_owned)
        .unwrap_or_default()
}

/// The plan: for each of [`files`] (given with its text, `None` when absent, in that order),
/// the text after.
pub fn plan(
    h: Harness,
    scope: Scope,
    ctx: &Context,
    current: &[(PathBuf, Option<String>)],
) -> Result<Vec<Edit>, Unmergeable> {
    current
        .iter()
        .enumerate()
        .map(|(i, (_, before))| plan_file(h, scope, ctx, i, before.as_deref()))
        .collect()
}

/// The plan for the `index`th of [`files`] alone, over its text `before` (`None`: absent):
/// each file's merge depends on that file only, so one that changed under us is planned again
/// by itself.
pub fn plan_file(
    h: Harness,
    scope: Scope,
    ctx: &Context,
    index: usize,
    before: Option<&str>,
) -> Result<Edit, Unmergeable> {
    let (role, path) = roles(h, scope, ctx)
        .into_iter()
        .nth(index)
        .expect("an index of files()");
    let mut changes = Vec::new();
    let path = &path;
    let after = match role {
        Role::Home => merge_json(path, before, |v| home_settings(v, ctx, &mut changes))?,
        Role::ClaudeMcp => merge_json(path, before, |v| claude_mcp(v, ctx, scope, &mut changes))?,
        Role::ClaudeSettings => {
            merge_json(path, before, |v| claude_settings(v, ctx, &mut changes))?
        }
        Role::ClaudeApproval => merge_json(path, before, |v| claude_approval(v, &mut changes))?,
        Role::CodexConfig => codex_config(path, before, ctx, &mut changes)?,
        Role::CodexHooks => merge_json(path, before, |v| codex_hooks(v, ctx, &mut changes))?,
        Role::GeminiSettings => {
            merge_json(path, before, |v| gemini_settings(v, ctx, &mut changes))?
        }
        Role::OpenCodeConfig => {
            merge_json(path, before, |v| opencode_config(v, ctx, &mut changes))?
        }
        Role::OpenCodePlugin => opencode_plugin(path, before, ctx, &mut changes)?,
    };
    Ok(Edit {
        path: path.clone(),
        before: before.map(str::to_owned),
        after,
        changes,
    })
}

/// Merges with `f`, which refuses (with the reason) a value of ours in a place of another
/// shape: changing its shape would lose what the user has there.
fn merge_json(
    path: &Path,
    before: Option<&str>,
    f: impl FnOnce(&mut Map<String, Value>) -> Result<(), String>,
) -> Result<String, Unmergeable> {
    let refuse = |reason: String| Unmergeable::content(path, reason);
    let text = before.filter(|t| !t.trim().is_empty());
    let old = match text {
        None => json!({}),
        Some(text) => json::parse(text).map_err(refuse)?,
    };
    let mut v = old.clone();
    let obj = v
        .as_object_mut()
        .ok_or_else(|| refuse("is not a JSON object".into()))?;
    f(obj).map_err(refuse)?;
    match text {
        // Nothing to change: the file stays byte for byte.
        Some(text) if v == old => Ok(before.unwrap_or(text).to_owned()),
        // What is not ours stays as it is written, not as a parse and print would write it.
        Some(text) => json::edit(text, &old, &v).map_err(refuse),
        None => Ok(serde_json::to_string_pretty(&v).expect("JSON values print") + "\n"),
    }
}

/// The object at `key` (`where_` names `v` in a refusal), made when missing; `Err` when it is
/// there but not an object.
fn object_at<'a>(
    v: &'a mut Map<String, Value>,
    key: &str,
    where_: &str,
) -> Result<&'a mut Map<String, Value>, String> {
    let slot = v.entry(key.to_owned()).or_insert_with(|| json!({}));
    let kind = kind_of(slot);
    slot.as_object_mut()
        .ok_or_else(|| not_shaped(&format!("{where_}{key}"), kind, "an object"))
}

/// The array at `key`, made when missing; `Err` when it is there but not an array.
fn array_at<'a>(
    v: &'a mut Map<String, Value>,
    key: &str,
    where_: &str,
) -> Result<&'a mut Vec<Value>, String> {
    let slot = v.entry(key.to_owned()).or_insert_with(|| json!([]));
    let kind = kind_of(slot);
    slot.as_array_mut()
        .ok_or_else(|| not_shaped(&format!("{where_}{key}"), kind, "an array"))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn not_shaped(key: &str, is: &str, want: &str) -> String {
    format!(
        "{key} is {is}, not {want} as the harness expects; setup would have to replace it and \
         lose what it holds"
    )
}

/// Sets `map[key]` to `value`, noting `what` when that changed it.
fn set(
    map: &mut Map<String, Value>,
    key: &str,
    value: Value,
    what: String,
    changes: &mut Vec<String>,
) {
    if map.get(key) != Some(&value) {
        map.insert(key.to_owned(), value);
        changes.push(what);
    }
}

/// Whether a hook entry's command is one of ours: a `waitpoint … adapter …` line.
fn is_ours(command: &str) -> bool {
    command.contains("waitpoint") && command.contains(" adapter ")
}

/// Puts `hook` (a command hook object) under `hooks[event]`: replacing the entry of ours there,
/// else adding a group of its own after the user's.
fn put_hook(
    hooks: &mut Map<String, Value>,
    event: &str,
    hook: Value,
    changes: &mut Vec<String>,
) -> Result<(), String> {
    let groups = array_at(hooks, event, "hooks.")?;
    for group in groups.iter_mut() {
        let Some(list) = group["hooks"].as_array_mut() else {
            continue;
        };
        for h in list.iter_mut() {
            if h["command"].as_str().is_some_and(is_ours) {
                if *h != hook {
                    *h = hook;
                    changes.push(format!("updated the {event} hook"));
                }
                return Ok(());
            }
        }
    }
    groups.push(json!({ "hooks": [hook] }));
    changes.push(format!("added a {event} hook: {}", hook_command(groups)));
    Ok(())
}

fn hook_command(groups: &[Value]) -> String {
    groups
        .last()
        .and_then(|g| g["hooks"][0]["command"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn mcp_entry(ctx: &Context, extra: Map<String, Value>) -> Value {
    let mut entry = Map::new();
    entry.insert("command".into(), json!(ctx.program));
    entry.insert("args".into(), json!(["mcp"]));
    let env = ctx.mcp_env();
    if !env.is_empty() {
        entry.insert("env".into(), Value::Object(env));
    }
    entry.extend(extra);
    Value::Object(entry)
}

/// Claude Code's MCP server: `mcpServers.waitpoint` in `~/.claude.json` or the project's
/// `.mcp.json`.
fn claude_mcp(
    v: &mut Map<String, Value>,
    ctx: &Context,
    scope: Scope,
    changes: &mut Vec<String>,
) -> Result<(), String> {
    let servers = object_at(v, "mcpServers", "")?;
    let mut extra = Map::new();
    if scope == Scope::User {
        extra.insert("type".into(), json!("stdio"));
    }
    set(
        servers,
        "waitpoint",
        mcp_entry(ctx, extra),
        "set the MCP server waitpoint (waitpoint mcp)".into(),
        changes,
    );
    Ok(())
}

/// How long Claude Code lets a hook run, and how long our waiter waits inside that.
const CLAUDE_HOOK_TIMEOUT_S: u64 = 86_400;
const CLAUDE_WAIT_S: u64 = 86_000;

/// Claude Code's settings: the hooks that wake a live session, the status line, the tools
/// allowed without asking, and the project's `.mcp.json` server enabled.
fn claude_settings(
    v: &mut Map<String, Value>,
    ctx: &Context,
    changes: &mut Vec<String>,
) -> Result<(), String> {
    let waiter = json!({
        "type": "command",
        "asyncRewake": true,
        "timeout": CLAUDE_HOOK_TIMEOUT_S,
        "command": ctx.command(&format!("adapter claude-hook --timeout {CLAUDE_WAIT_S}")),
    });
    let end = json!({ "type": "command", "command": ctx.command("adapter claude-hook") });
    let hooks = object_at(v, "hooks", "")?;
    for event in ["SessionStart", "Stop"] {
        put_hook(hooks, event, waiter.clone(), changes)?;
    }
    put_hook(hooks, "SessionEnd", end, changes)?;
    let status = json!({ "type": "command", "command": ctx.command("adapter claude-statusline") });
    match v.get("statusLine") {
        Some(s) if !s["command"].as_str().is_some_and(is_ours) => changes.push(
            "left the status line as it is (yours); `waitpoint adapter claude-statusline` \
             prints the capsule"
                .into(),
        ),
        _ => set(
            v,
            "statusLine",
            status,
            "set the status line (the capsule)".into(),
            changes,
        ),
    }
    let allow = array_at(object_at(v, "permissions", "")?, "allow", "permissions.")?;
    if !allow.contains(&json!("mcp__waitpoint")) {
        allow.push(json!("mcp__waitpoint"));
        changes.push("allowed the waitpoint tools (mcp__waitpoint)".into());
    }
    Ok(())
}

/// The user's approval of the project's MCP server `waitpoint`.
fn claude_approval(v: &mut Map<String, Value>, changes: &mut Vec<String>) -> Result<(), String> {
    let list = array_at(v, "enabledMcpjsonServers", "")?;
    if !list.contains(&json!("waitpoint")) {
        list.push(json!("waitpoint"));
        changes.push("approved the project's MCP server waitpoint for you".into());
    }
    Ok(())
}

/// How long Codex lets the Stop hook run, and how long our waiter waits inside that: a day, as
/// for Claude Code, since a job that outlasts the wait would leave the open session without its
/// wake (Codex has no upper bound on a hook's timeout). The hook waits only while the agent
/// waits on something, and Esc takes the prompt back.
const CODEX_HOOK_TIMEOUT_S: u64 = 86_400;
const CODEX_WAIT_S: u64 = 86_000;

/// Codex's hooks file: the Stop hook that continues a turn with a wake.
fn codex_hooks(
    v: &mut Map<String, Value>,
    ctx: &Context,
    changes: &mut Vec<String>,
) -> Result<(), String> {
    let stop = json!({
        "type": "command",
        "timeout": CODEX_HOOK_TIMEOUT_S,
        "command": ctx.command(&format!("adapter codex-stop-hook --timeout {CODEX_WAIT_S}")),
    });
    put_hook(object_at(v, "hooks", "")?, "Stop", stop, changes)
}

/// How long Gemini CLI lets the AfterAgent hook run, and how long our waiter waits inside that
/// (Gemini counts hook timeouts in milliseconds): a day, as for Codex, since a job that outlasts
/// the wait would leave the open session without its wake. While it waits, the TUI shows
/// "Executing Hook" and holds what the user types; it waits only while the session waits on
/// something, and Esc takes the prompt back.
const GEMINI_HOOK_TIMEOUT_MS: u64 = 86_400_000;
const GEMINI_WAIT_S: u64 = 86_000;
/// The SessionStart and SessionEnd hooks only write or remove a small record.
const GEMINI_QUICK_HOOK_MS: u64 = 10_000;
/// `wait_next` may block for up to 300 s; Gemini's default MCP timeout is ten minutes, and a
/// bound of our own says what the server needs.
const GEMINI_TOOL_TIMEOUT_MS: u64 = 330_000;

/// Gemini CLI's `settings.json`: the MCP server (trusted, so its tools exist in headless runs
/// and need no confirmation) and the hooks that name the session and wake it.
fn gemini_settings(
    v: &mut Map<String, Value>,
    ctx: &Context,
    changes: &mut Vec<String>,
) -> Result<(), String> {
    let mut extra = Map::new();
    extra.insert("trust".into(), json!(true));
    extra.insert("timeout".into(), json!(GEMINI_TOOL_TIMEOUT_MS));
    set(
        object_at(v, "mcpServers", "")?,
        "waitpoint",
        mcp_entry(ctx, extra),
        "set the MCP server waitpoint (waitpoint mcp, trusted)".into(),
        changes,
    );
    let hook = |args: &str, timeout: u64| {
        json!({
            "type": "command",
            "name": "waitpoint",
            "command": ctx.command(args),
            "timeout": timeout,
        })
    };
    let hooks = object_at(v, "hooks", "")?;
    let quick = hook("adapter gemini-hook", GEMINI_QUICK_HOOK_MS);
    put_hook(hooks, "SessionStart", quick.clone(), changes)?;
    put_hook(
        hooks,
        "AfterAgent",
        hook(
            &format!("adapter gemini-hook --timeout {GEMINI_WAIT_S}"),
            GEMINI_HOOK_TIMEOUT_MS,
        ),
        changes,
    )?;
    put_hook(hooks, "SessionEnd", quick, changes)
}

/// Codex's `config.toml`: `[mcp_servers.waitpoint]`, comments and the rest kept as they are.
/// Codex 0.171 runs the hooks of `hooks.json` without a feature switch (`features.codex_hooks`
/// is deprecated there), so none is written.
fn codex_config(
    path: &Path,
    before: Option<&str>,
    ctx: &Context,
    changes: &mut Vec<String>,
) -> Result<String, Unmergeable> {
    use toml_edit::{DocumentMut, Item, Table, value};
    let text = before.unwrap_or_default().to_owned();
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e| Unmergeable::content(path, format!("is not TOML ({e})")))?;
    let servers = doc
        .entry("mcp_servers")
        .or_insert_with(|| {
            let mut t = Table::new();
            t.set_implicit(true);
            Item::Table(t)
        })
        .as_table_mut()
        .ok_or_else(|| Unmergeable::content(path, "mcp_servers is not a table".into()))?;
    let mut want = Table::new();
    want["command"] = value(ctx.program.as_str());
    let mut args = toml_edit::Array::new();
    args.push("mcp");
    want["args"] = value(args);
    let env = ctx.mcp_env();
    if !env.is_empty() {
        let mut t = toml_edit::InlineTable::new();
        for (k, v) in env {
            t.insert(&k, v.as_str().unwrap_or_default().into());
        }
        want["env"] = value(t);
    }
    // wait_next may block for up to 300 s.
    want["tool_timeout_sec"] = value(330);
    let same = servers
        .get("waitpoint")
        .and_then(Item::as_table)
        .is_some_and(|t| t.to_string() == want.to_string());
    if !same {
        servers.insert("waitpoint", Item::Table(want));
        changes.push("set the MCP server waitpoint (waitpoint mcp)".into());
    }
    if changes.is_empty() {
        return Ok(text);
    }
    Ok(doc.to_string())
}

/// How long OpenCode waits for a waitpoint tool call, in ms: `wait_next` may block 300 s.
const OPENCODE_TOOL_TIMEOUT_MS: u64 = 330_000;

/// OpenCode's `opencode.json`: `mcp.waitpoint`, a local server.
fn opencode_config(
    v: &mut Map<String, Value>,
    ctx: &Context,
    changes: &mut Vec<String>,
) -> Result<(), String> {
    let mut entry = Map::new();
    entry.insert("type".into(), json!("local"));
    entry.insert("command".into(), json!([ctx.program, "mcp"]));
    let env = ctx.mcp_env();
    if !env.is_empty() {
        entry.insert("environment".into(), Value::Object(env));
    }
    entry.insert("timeout".into(), json!(OPENCODE_TOOL_TIMEOUT_MS));
    set(
        object_at(v, "mcp", "")?,
        "waitpoint",
        Value::Object(entry),
        "set the MCP server waitpoint (waitpoint mcp)".into(),
        changes,
    );
    Ok(())
}

/// The first line of the plugin file setup writes: a file that starts with it is ours, to
/// replace; any other file at its path is the user's, and refused.
const OPENCODE_PLUGIN_MARK: &str =
    "// waitpoint's OpenCode plugin, written by `waitpoint setup opencode`; setup rewrites it.";

/// OpenCode's plugin, whole: the waitpoint command line it runs, then its code.
fn opencode_plugin_text(ctx: &Context) -> String {
    let mut argv = vec![ctx.program.clone()];
    if let Some(h) = &ctx.home {
        argv.extend(["--home".to_owned(), h.to_string_lossy().into_owned()]);
    }
    format!(
        "{OPENCODE_PLUGIN_MARK}\nconst WAITPOINT = {};\n{}",
        json!(argv),
        include_str!("harness/opencode_plugin.js")
    )
}

fn opencode_plugin(
    path: &Path,
    before: Option<&str>,
    ctx: &Context,
    changes: &mut Vec<String>,
) -> Result<String, Unmergeable> {
    let want = opencode_plugin_text(ctx);
    match before {
        Some(text) if text == want => {}
        Some(text) if text.starts_with(OPENCODE_PLUGIN_MARK) => {
            changes.push("updated the waitpoint plugin".into())
        }
        Some(_) => {
            return Err(Unmergeable::content(
                path,
                "is not the plugin setup writes (its first line is not waitpoint's); setup \
                 would replace it and lose it"
                    .into(),
            ));
        }
        None => changes.push(
            "added the waitpoint plugin (the calling session on each tool call; wakes an idle \
             session)"
                .into(),
        ),
    }
    Ok(want)
}

/// The home's settings: `onWake` resumes a closed session in whichever harness armed it. The
/// daemon runs it with its own `PATH`, so it names the program as the hooks do; an `onWake`
/// of ours written with another path (an older setup's bare `waitpoint`, a moved binary) is
/// brought up to date.
fn home_settings(
    v: &mut Map<String, Value>,
    ctx: &Context,
    changes: &mut Vec<String>,
) -> Result<(), String> {
    let want = json!([ctx.program, "adapter", "resume"]);
    let ours = |w: &Value| {
        w.as_array().is_some_and(|a| {
            a.len() == 3
                && a[0].as_str().is_some_and(|p| {
                    Path::new(p).file_name() == Some(std::ffi::OsStr::new("waitpoint"))
                })
                && a[1] == "adapter"
                && a[2] == "resume"
        })
    };
    match v.get("onWake") {
        None | Some(Value::Null) => set(
            v,
            "onWake",
            want,
            format!(
                "set onWake to resume a closed session ({} adapter resume)",
                ctx.program
            ),
            changes,
        ),
        Some(w) if *w == want => {}
        Some(w) if ours(w) => set(
            v,
            "onWake",
            want,
            format!(
                "updated onWake to run {} (the daemon does not search the shell's PATH)",
                ctx.program
            ),
            changes,
        ),
        Some(_) => {
            changes.push(format!(
                "left onWake as it is (yours); {want} resumes a closed session"
            ));
            return Ok(());
        }
    }
    // A resume runs a whole agent turn, which takes minutes; the daemon's default bound for
    // an `onWake` run (10 s) killed it and started it again, the model seeing the wake again
    // each time.
    match v.get("onWakeTimeoutMs").and_then(Value::as_u64) {
        None => set(
            v,
            "onWakeTimeoutMs",
            json!(RESUME_TIMEOUT_MS),
            format!(
                "set onWakeTimeoutMs to {RESUME_TIMEOUT_MS} (an hour), so a resumed turn is not \
                 killed for taking minutes"
            ),
            changes,
        ),
        Some(ms) if ms < RESUME_TIMEOUT_MS => changes.push(format!(
            "left onWakeTimeoutMs at {ms} (yours); a resumed turn longer than that is killed and \
             started again: {RESUME_TIMEOUT_MS} lets a turn take an hour"
        )),
        Some(_) => {}
    }
    Ok(())
}

/// The `onWakeTimeoutMs` setup writes: the most the settings take, an hour.
const RESUME_TIMEOUT_MS: u64 = 3_600_000;

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(home: Option<&str>) -> Context {
        Context {
            program: "waitpoint".into(),
            home: home.map(PathBuf::from),
            home_settings: "/h/settings.json".into(),
            user_dir: "/u".into(),
            codex_home: None,
            project_dir: "/p".into(),
        }
    }

    fn run(h: Harness, scope: Scope, ctx: &Context, texts: &[Option<&str>]) -> Vec<Edit> {
        let current: Vec<_> = files(h, scope, ctx)
            .into_iter()
            .zip(texts)
            .map(|(p, t)| (p.path, t.map(str::to_owned)))
            .collect();
        plan(h, scope, ctx, &current).unwrap()
    }

    /// A second run, over what the first one wrote, changes nothing.
    fn assert_unchanged_again(h: Harness, scope: Scope, c: &Context, first: &[Edit]) {
        let texts: Vec<Option<&str>> = first.iter().map(|e| Some(e.after.as_str())).collect();
        for e in run(h, scope, c, &texts) {
            let what = (e.path.display(), &e.changes);
            assert!(!e.changes_anything(), "{what:?}");
        }
    }

    #[test]
    fn claude_project_setup_keeps_what_is_there_and_is_idempotent() {
        let c = ctx(Some("/data/my home"));
        let settings = concat!(
            r#"{"model": "opus", "hooks": {"Stop": [{"hooks": [{"type": "command", "#,
            r#""command": "notify-send done"}]}]}, "statusLine": {"type": "command", "#,
            r#""command": "my-line"}}"#
        );
        let first = run(
            Harness::Claude,
            Scope::Project,
            &c,
            &[None, Some(settings), None, Some("{}")],
        );
        let s: Value = serde_json::from_str(&first[1].after).unwrap();
        assert_eq!(s["model"], "opus");
        let stop = s["hooks"]["Stop"].as_array().unwrap();
        assert_eq!(stop[0]["hooks"][0]["command"], "notify-send done");
        assert_eq!(
            stop[1]["hooks"][0]["command"],
            "waitpoint --home '/data/my home' adapter claude-hook --timeout 86000"
        );
        assert_eq!(stop[1]["hooks"][0]["asyncRewake"], true);
        assert_eq!(s["statusLine"]["command"], "my-line");
        assert!(
            first[1]
                .changes
                .iter()
                .any(|c| c.contains("left the status line"))
        );
        let mcp: Value = serde_json::from_str(&first[0].after).unwrap();
        assert_eq!(
            mcp["mcpServers"]["waitpoint"]["env"]["CORTEX_HOME"],
            "/data/my home"
        );
        let approval: Value = serde_json::from_str(&first[2].after).unwrap();
        assert_eq!(approval["enabledMcpjsonServers"], json!(["waitpoint"]));
        let home: Value = serde_json::from_str(&first[3].after).unwrap();
        assert_eq!(home["onWake"], json!(["waitpoint", "adapter", "resume"]));
        assert_eq!(home["onWakeTimeoutMs"], json!(RESUME_TIMEOUT_MS));
        assert_unchanged_again(Harness::Claude, Scope::Project, &c, &first);
    }

    #[test]
    fn a_resume_is_given_an_hour_unless_the_user_chose_a_bound_which_is_kept_and_named() {
        let c = ctx(None);
        let mine = r#"{"onWake": ["waitpoint", "adapter", "resume"], "onWakeTimeoutMs": 20000}"#;
        let first = run(Harness::Codex, Scope::User, &c, &[None, None, Some(mine)]);
        let home: Value = serde_json::from_str(&first[2].after).unwrap();
        assert_eq!(home["onWakeTimeoutMs"], json!(20000));
        assert!(
            first[2]
                .changes
                .iter()
                .any(|n| n.contains("left onWakeTimeoutMs at 20000")),
            "{:?}",
            first[2].changes
        );
    }

    #[test]
    fn codex_setup_edits_toml_keeping_comments_and_an_own_on_wake() {
        let c = ctx(None);
        let toml = "# my config\nmodel = \"o3\"\n\n[mcp_servers.other]\ncommand = \"x\"\n";
        let own = r#"{"onWake": ["my-notifier"]}"#;
        let first = run(
            Harness::Codex,
            Scope::User,
            &c,
            &[Some(toml), None, Some(own)],
        );
        let after = &first[0].after;
        assert!(after.starts_with("# my config\nmodel = \"o3\""), "{after}");
        assert!(after.contains("[mcp_servers.other]"), "{after}");
        assert!(
            after.contains("[mcp_servers.waitpoint]\ncommand = \"waitpoint\"\nargs = [\"mcp\"]"),
            "{after}"
        );
        let hooks: Value = serde_json::from_str(&first[1].after).unwrap();
        assert_eq!(
            hooks["hooks"]["Stop"][0]["hooks"][0]["command"],
            "waitpoint adapter codex-stop-hook --timeout 86000"
        );
        assert!(!first[2].changes_anything());
        assert!(first[2].changes[0].contains("left onWake"));
        assert_unchanged_again(Harness::Codex, Scope::User, &c, &first);
    }

    #[test]
    fn gemini_setup_keeps_what_is_there_trusts_its_server_counts_ms_and_is_idempotent() {
        let c = ctx(Some("/data/h"));
        let settings = r#"{"security": {"auth": {"selectedType": "gemini-api-key"}},
  "mcpServers": {"other": {"command": "x"}},
  "hooks": {"AfterAgent": [{"hooks": [{"type": "command", "command": "notify-send done"}]}]}}"#;
        let first = run(Harness::Gemini, Scope::User, &c, &[Some(settings), None]);
        assert_eq!(first[0].path, Path::new("/u/.gemini/settings.json"));
        let s: Value = serde_json::from_str(&first[0].after).unwrap();
        assert_eq!(s["security"]["auth"]["selectedType"], "gemini-api-key");
        assert_eq!(s["mcpServers"]["other"]["command"], "x");
        let server = &s["mcpServers"]["waitpoint"];
        assert_eq!(
            server["trust"], true,
            "headless runs offer only trusted tools"
        );
        assert_eq!(server["timeout"], json!(GEMINI_TOOL_TIMEOUT_MS));
        assert_eq!(server["env"]["CORTEX_HOME"], "/data/h");
        let after = s["hooks"]["AfterAgent"].as_array().unwrap();
        assert_eq!(after[0]["hooks"][0]["command"], "notify-send done");
        let ours = &after[1]["hooks"][0];
        assert_eq!(
            ours["command"],
            "waitpoint --home /data/h adapter gemini-hook --timeout 86000"
        );
        // Milliseconds, and longer than the wait inside.
        assert_eq!(ours["timeout"], json!(86_400_000));
        assert!(ours["timeout"].as_u64().unwrap() > GEMINI_WAIT_S * 1000);
        for event in ["SessionStart", "SessionEnd"] {
            assert_eq!(
                s["hooks"][event][0]["hooks"][0]["command"],
                "waitpoint --home /data/h adapter gemini-hook",
                "{event}"
            );
        }
        let home: Value = serde_json::from_str(&first[1].after).unwrap();
        assert_eq!(home["onWake"], json!(["waitpoint", "adapter", "resume"]));
        assert_unchanged_again(Harness::Gemini, Scope::User, &c, &first);
        // The project's own file, with --project.
        let p = run(Harness::Gemini, Scope::Project, &c, &[None, None]);
        assert_eq!(p[0].path, Path::new("/p/.gemini/settings.json"));
        assert_unchanged_again(Harness::Gemini, Scope::Project, &c, &p);
    }

    #[test]
    fn gemini_setup_refuses_what_it_would_lose() {
        let c = ctx(None);
        for (text, says) in [
            (
                r#"{"hooks": {"AfterAgent": {"x": 1}}}"#,
                "hooks.AfterAgent is an object",
            ),
            (r#"{"mcpServers": []}"#, "mcpServers is an array"),
            (r#"{"hooks": {}, "hooks": {}}"#, "hooks"),
        ] {
            let current: Vec<_> = files(Harness::Gemini, Scope::User, &c)
                .into_iter()
                .zip([Some(text.to_owned()), None])
                .map(|(p, t)| (p.path, t))
                .collect();
            let e = plan(Harness::Gemini, Scope::User, &c, &current).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn opencode_setup_adds_the_server_and_the_plugin_keeping_the_rest_and_is_idempotent() {
        let c = ctx(Some("/data/my home"));
        let config = r#"{
  "model": "x/y",
  "mcp": {"other": {"type": "remote", "url": "http://a"}}
}"#;
        let first = run(
            Harness::OpenCode,
            Scope::Project,
            &c,
            &[Some(config), None, None],
        );
        assert_eq!(first[0].path, Path::new("/p/opencode.json"));
        assert!(
            first[0].after.starts_with("{\n  \"model\": \"x/y\",\n"),
            "{}",
            first[0].after
        );
        assert!(first[0].after.contains(r#""other": {"type": "remote""#));
        let v = json::parse(&first[0].after).unwrap();
        assert_eq!(
            v["mcp"]["waitpoint"],
            json!({"type": "local", "command": ["waitpoint", "mcp"],
                   "environment": {"CORTEX_HOME": "/data/my home"}, "timeout": 330000})
        );
        assert_eq!(
            first[1].path,
            Path::new("/p/.opencode/plugins/waitpoint.js")
        );
        let plugin = &first[1].after;
        assert!(plugin.starts_with(OPENCODE_PLUGIN_MARK), "{plugin}");
        assert!(
            plugin.contains(r#"const WAITPOINT = ["waitpoint","--home","/data/my home"];"#),
            "{plugin}"
        );
        assert!(plugin.contains("opencode-waiter"));
        let home: Value = serde_json::from_str(&first[2].after).unwrap();
        assert_eq!(home["onWake"], json!(["waitpoint", "adapter", "resume"]));
        assert_unchanged_again(Harness::OpenCode, Scope::Project, &c, &first);
        // An older plugin of ours is brought up to date; a file of the user's is refused.
        let old = format!("{OPENCODE_PLUGIN_MARK}\nconst WAITPOINT = [\"old\"];\n");
        let again = run(
            Harness::OpenCode,
            Scope::Project,
            &c,
            &[None, Some(&old), None],
        );
        assert_eq!(again[1].after, *plugin);
        let current: Vec<_> = files(Harness::OpenCode, Scope::Project, &c)
            .into_iter()
            .zip([None, Some("export const Mine = 1\n".to_owned()), None])
            .map(|(p, t)| (p.path, t))
            .collect();
        let e = plan(Harness::OpenCode, Scope::Project, &c, &current).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/p/.opencode/plugins/waitpoint.js: is not the plugin setup writes"),
            "{e}"
        );
        let user = run(
            Harness::OpenCode,
            Scope::User,
            &ctx(None),
            &[None, None, None],
        );
        assert_eq!(user[0].path, Path::new("/u/.config/opencode/opencode.json"));
        assert_eq!(
            user[1].path,
            Path::new("/u/.config/opencode/plugins/waitpoint.js")
        );
    }

    #[test]
    fn a_file_that_does_not_parse_is_refused_by_name() {
        let c = ctx(None);
        let current: Vec<_> = files(Harness::Claude, Scope::User, &c)
            .into_iter()
            .map(|p| (p.path, Some("{not json".to_owned())))
            .collect();
        let e = plan(Harness::Claude, Scope::User, &c, &current).unwrap_err();
        assert!(
            e.to_string().starts_with("/u/.claude.json: is not JSON"),
            "{e}"
        );
    }
}
