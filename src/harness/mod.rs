//! The agent harnesses a waitpoint session can live in (Claude Code, the Codex CLI, Gemini CLI):
//! how each tells us who is calling, the waitpoint session that follows from it, and the record of
//! it kept beside the session's inbox (`sessions/<s>/harness.json`) so that a wake for a closed
//! session can resume the right harness session in the right directory.
//!
//! A harness is one [`Harness`] variant: where it names its session (an environment variable, a
//! hook's standard input, an MCP request's `_meta`), how it is configured (`crate::setup`), and
//! how a live and a closed session are woken (`crate::harness::wake`). Nothing here reads the
//! process environment itself: front ends pass a lookup, so the rules are tested without one.

pub mod codex_app_server;
pub mod codex_lock;
pub mod gemini;
pub mod process_record;
pub mod transcript;
pub mod wake;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::durable;
use crate::error::Result;
use crate::home::Home;

/// A harness we know how to name, configure and wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Harness {
    /// Claude Code.
    #[serde(rename = "claude-code")]
    Claude,
    /// The Codex CLI.
    #[serde(rename = "codex")]
    Codex,
    /// Gemini CLI.
    #[serde(rename = "gemini")]
    Gemini,
    /// OpenCode.
    #[serde(rename = "opencode")]
    OpenCode,
}

impl Harness {
    /// The harness's name in records, `setup` and messages.
    pub fn name(self) -> &'static str {
        match self {
            Harness::Claude => "claude-code",
            Harness::Codex => "codex",
            Harness::Gemini => "gemini",
            Harness::OpenCode => "opencode",
        }
    }

    /// The program's usual name on `PATH`.
    pub fn program(self) -> &'static str {
        match self {
            Harness::Claude => "claude",
            Harness::Codex => "codex",
            Harness::Gemini => "gemini",
            Harness::OpenCode => "opencode",
        }
    }

    /// The waitpoint session of one of this harness's sessions: `claude-<id>` or `codex-<id>`,
    /// so `ls sessions/` tells an operator which harness each belongs to. `None` when the id
    /// is not a plain token: it becomes a directory name, and an argument of the harness's own
    /// command line on resume, so it may not start with `-` either.
    pub fn session_name(self, id: &str) -> Option<String> {
        let ok = id.len() <= 100
            && id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        ok.then(|| format!("{}-{id}", self.program()))
    }
}

/// Who is calling, as the harness says: which harness, its own session id (Claude Code's session
/// id, Codex's thread id), and the project directory the session runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    pub harness: Harness,
    pub session_id: String,
    /// Absolute: a record edited by hand (or written by an older version) with a relative one
    /// does not parse, and is set aside, since the resume would run wherever the daemon runs.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "absolute_dir"
    )]
    pub project_dir: Option<PathBuf>,
}

fn absolute_dir<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let dir = Option::<PathBuf>::deserialize(d)?;
    match dir {
        Some(p) if !p.is_absolute() => Err(serde::de::Error::custom(format!(
            "project_dir must be an absolute path, not {p:?}: a resume would run in the \
             daemon's own directory"
        ))),
        dir => Ok(dir),
    }
}

impl Caller {
    fn new(harness: Harness, session_id: &str, project_dir: Option<&str>) -> Option<Caller> {
        harness.session_name(session_id)?;
        Some(Caller {
            harness,
            session_id: session_id.to_owned(),
            project_dir: project_dir
                .filter(|d| Path::new(d).is_absolute())
                .map(PathBuf::from),
        })
    }

    /// The waitpoint session this caller acts for when nothing explicit names one.
    pub fn session(&self) -> String {
        self.harness
            .session_name(&self.session_id)
            .expect("checked when the caller was made")
    }
}

/// The caller a harness announces in the environment of the processes it starts (MCP servers,
/// hooks): Claude Code sets `CLAUDE_CODE_SESSION_ID` and `CLAUDE_PROJECT_DIR`. Codex passes MCP
/// servers no such variable; its calls carry the thread instead ([`from_codex_meta`]).
pub fn from_env(var: &dyn Fn(&str) -> Option<String>) -> Option<Caller> {
    let id = var("CLAUDE_CODE_SESSION_ID")?;
    Caller::new(Harness::Claude, &id, var("CLAUDE_PROJECT_DIR").as_deref())
}

/// Whether this process was started by Claude Code running without a terminal (`claude -p`, the
/// SDKs): there, a hook marked `asyncRewake` runs synchronously, so a hook that waited for a
/// wake would hold the whole run up, and nobody is idle to be woken.
pub fn claude_print_mode(var: &dyn Fn(&str) -> Option<String>) -> bool {
    var("CLAUDE_CODE_ENTRYPOINT").is_some_and(|e| e.starts_with("sdk"))
}

/// The caller of one Codex `tools/call`, from its `_meta["x-codex-turn-metadata"]` (an object,
/// or the same object as a JSON string): the thread id and the turn's working directory.
pub fn from_codex_meta(meta: &serde_json::Map<String, Value>) -> Option<Caller> {
    let turn = meta.get("x-codex-turn-metadata")?;
    let parsed;
    let turn = match turn {
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s).ok()?;
            &parsed
        }
        v => v,
    };
    let thread = turn["thread_id"].as_str()?;
    Caller::new(Harness::Codex, thread, workspace_of(turn))
}

/// The directory a Codex turn works in: `cwd` if given, else the first of its `workspaces` (an
/// object keyed by path, as Codex 0.171 sends it for a git checkout, or a list of paths).
fn workspace_of(turn: &Value) -> Option<&str> {
    if let Some(cwd) = turn["cwd"].as_str() {
        return Some(cwd);
    }
    match &turn["workspaces"] {
        Value::Object(o) => o.keys().next().map(String::as_str),
        Value::Array(a) => a.first()?.as_str(),
        _ => None,
    }
}

/// The caller a hook is run for, from the JSON the harness writes on the hook's standard input:
/// both Claude Code and Codex give `session_id` and `cwd`.
pub fn from_hook_input(harness: Harness, input: &Value) -> Option<Caller> {
    Caller::new(
        harness,
        input["session_id"].as_str()?,
        input["cwd"].as_str(),
    )
}

/// The MCP tool argument OpenCode's plugin (`setup opencode`) fills in with the calling session's
/// id: OpenCode gives an MCP server no session id (neither in its environment nor in a call's
/// `_meta`), and one server serves every session of an OpenCode process.
pub const OPENCODE_SESSION_ARG: &str = "harness_session";

/// The caller an OpenCode tool call names in [`OPENCODE_SESSION_ARG`], working in `project_dir`
/// (the MCP server's directory, which OpenCode starts it in). Whatever the value, the session is
/// an `opencode-…` one: a model that writes the argument itself can reach no other harness's
/// session, and a value that is not a plain token (a path, an option) is refused.
pub fn from_opencode_arg(id: &str, project_dir: Option<&str>) -> Option<Caller> {
    Caller::new(Harness::OpenCode, id, project_dir)
}

/// Whether a Codex session is a `codex exec` run, from the start of its transcript (the rollout
/// file a hook's stdin names): its first line is the session's metadata, whose `source` is
/// `exec` there. Nobody is idle in such a run, so a hook that waited would only hold it up.
/// `head` may be cut short: the line is long (it carries the base instructions), and the field
/// comes early in it.
pub fn codex_is_exec(head: &[u8]) -> bool {
    let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
    if let Ok(meta) = serde_json::from_slice::<Value>(first) {
        return meta["payload"]["source"] == "exec";
    }
    let needle = br#""source":"exec""#;
    first.windows(needle.len()).any(|w| w == needle)
}

fn record_file(home: &Home, session: &str) -> PathBuf {
    home.sessions_dir().join(session).join("harness.json")
}

/// Remembers that `session` lives in `caller`'s harness session, for a later resume. Written
/// only when it changed, so a front end may call it on every request. A session named
/// explicitly and shared by several harness sessions remembers the last one that called.
pub fn remember(home: &Home, session: &str, caller: &Caller) -> Result<()> {
    crate::request::check_name("session", session)?;
    let file = record_file(home, session);
    if recall(home, session).ok().flatten().as_ref() == Some(caller) {
        return Ok(());
    }
    let root = home.root_dir();
    root.create_dir_private(file.parent().expect("a session directory"))?;
    root.commit_json(&file, caller)
}

/// The harness session `session` was last seen in, if any.
pub fn recall(home: &Home, session: &str) -> Result<Option<Caller>> {
    crate::request::check_name("session", session)?;
    // Reached beneath the home without following a link, size-capped; a bad one is set aside.
    let found: Option<Caller> =
        durable::read_json_or_set_aside(home.root_dir(), &record_file(home, session))?;
    // A record edited by hand into a session id that is not a plain token never reaches an argv.
    Ok(found.filter(|c| c.harness.session_name(&c.session_id).is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn claude_code_names_its_session_in_the_environment() {
        let vars = [
            (
                "CLAUDE_CODE_SESSION_ID",
                "3f2a9c1e-0b7d-4e52-9a61-5c8d2e7f1a04",
            ),
            ("CLAUDE_PROJECT_DIR", "/work/proj"),
        ];
        let c = from_env(&env(&vars)).unwrap();
        assert_eq!(c.session(), "claude-3f2a9c1e-0b7d-4e52-9a61-5c8d2e7f1a04");
        assert_eq!(c.project_dir.as_deref(), Some(Path::new("/work/proj")));
        assert!(from_env(&env(&[])).is_none());
        // An id that is not a plain token never becomes a directory name.
        assert!(from_env(&env(&[("CLAUDE_CODE_SESSION_ID", "../x")])).is_none());
        // Nor does one that a harness's argv would take for an option.
        assert!(from_env(&env(&[("CLAUDE_CODE_SESSION_ID", "-rf")])).is_none());
    }

    #[test]
    fn an_opencode_call_names_only_an_opencode_session() {
        let c = from_opencode_arg("ses_0a1B2c3D4e5F", Some("/work/proj")).unwrap();
        assert_eq!(c.session(), "opencode-ses_0a1B2c3D4e5F");
        assert_eq!(c.project_dir.as_deref(), Some(Path::new("/work/proj")));
        // Never another harness's session, a path or an option.
        for bad in ["../claude-x", "-rf", "", "a/b", "x y"] {
            assert!(from_opencode_arg(bad, None).is_none(), "{bad}");
        }
        let rec = serde_json::to_value(&c).unwrap();
        assert_eq!(rec["harness"], "opencode");
    }

    #[test]
    fn print_mode_is_an_sdk_entrypoint() {
        assert!(claude_print_mode(&env(&[(
            "CLAUDE_CODE_ENTRYPOINT",
            "sdk-cli"
        )])));
        assert!(!claude_print_mode(&env(&[(
            "CLAUDE_CODE_ENTRYPOINT",
            "cli"
        )])));
        assert!(!claude_print_mode(&env(&[])));
    }

    #[test]
    fn a_codex_call_names_its_thread_in_meta() {
        let turn = json!({"session_id": "s", "thread_id": "0199a2b3-c4d5", "turn_id": "t",
                          "cwd": "/work/proj"});
        for meta in [
            json!({"x-codex-turn-metadata": turn}),
            json!({"x-codex-turn-metadata": turn.to_string()}),
        ] {
            let c = from_codex_meta(meta.as_object().unwrap()).unwrap();
            assert_eq!(c.session(), "codex-0199a2b3-c4d5");
            assert_eq!(c.project_dir.as_deref(), Some(Path::new("/work/proj")));
        }
        // As Codex 0.171 sends it for a git checkout: workspaces keyed by path.
        let ws = json!({"x-codex-turn-metadata": {"thread_id": "t1",
                        "workspaces": {"/a": {"has_changes": false}}}});
        let c = from_codex_meta(ws.as_object().unwrap()).unwrap();
        assert_eq!(c.project_dir.as_deref(), Some(Path::new("/a")));
        assert!(from_codex_meta(json!({}).as_object().unwrap()).is_none());
    }

    #[test]
    fn a_codex_exec_run_is_told_by_its_transcript() {
        let exec = concat!(
            r#"{"type":"session_meta","payload":{"id":"t","source":"exec","#,
            r#""originator":"codex_exec"}}"#
        )
        .as_bytes();
        assert!(codex_is_exec(exec));
        assert!(codex_is_exec(&exec[..60]), "cut short, after the field");
        let tui = br#"{"type":"session_meta","payload":{"id":"t","source":"cli"}}
{"x":"\"source\":\"exec\""}"#;
        assert!(!codex_is_exec(tui));
        assert!(!codex_is_exec(b""));
    }

    #[test]
    fn a_hook_reads_its_caller_from_stdin() {
        let input = json!({"session_id": "abc-1", "cwd": "/p", "hook_event_name": "Stop"});
        let c = from_hook_input(Harness::Claude, &input).unwrap();
        assert_eq!(
            (c.session().as_str(), c.project_dir.unwrap()),
            ("claude-abc-1", "/p".into())
        );
        // A relative directory is no place to resume in.
        let rel = json!({"session_id": "abc", "cwd": "p"});
        assert_eq!(
            from_hook_input(Harness::Codex, &rel).unwrap().project_dir,
            None
        );
    }

    #[test]
    fn the_record_is_written_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let c = from_hook_input(Harness::Codex, &json!({"session_id": "t9", "cwd": "/p"})).unwrap();
        assert_eq!(recall(&home, "codex-t9").unwrap(), None);
        remember(&home, "codex-t9", &c).unwrap();
        assert_eq!(recall(&home, "codex-t9").unwrap(), Some(c.clone()));
        let file = record_file(&home, "codex-t9");
        let before = std::fs::metadata(&file).unwrap().modified().unwrap();
        remember(&home, "codex-t9", &c).unwrap();
        assert_eq!(
            std::fs::metadata(&file).unwrap().modified().unwrap(),
            before
        );
        // A link where the record should be is never followed: set aside, the target untouched.
        let outside = dir.path().join("outside.json");
        std::fs::write(&outside, r#"{"harness":"codex","session_id":"evil"}"#).unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&outside, &file).unwrap();
        assert_eq!(recall(&home, "codex-t9").unwrap(), None);
        assert!(outside.exists() && !file.exists());
        remember(&home, "codex-t9", &c).unwrap();
        // A hand-edited id that could reach an argv as an option or a path is ignored.
        std::fs::write(&file, r#"{"harness":"codex","session_id":"../x"}"#).unwrap();
        assert_eq!(recall(&home, "codex-t9").unwrap(), None);
    }

    #[test]
    fn a_record_with_a_relative_project_dir_is_set_aside_not_resumed_in_the_daemons_directory() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let c = from_hook_input(Harness::Codex, &json!({"session_id": "t9", "cwd": "/p"})).unwrap();
        remember(&home, "codex-t9", &c).unwrap();
        let file = record_file(&home, "codex-t9");
        // A relative project directory would be the daemon's: the record is set aside, and the
        // next call of the harness writes a whole one.
        std::fs::write(
            &file,
            r#"{"harness":"codex","session_id":"t9","project_dir":"proj"}"#,
        )
        .unwrap();
        assert_eq!(recall(&home, "codex-t9").unwrap(), None);
        assert!(!file.exists());
        // Set aside with the reason, as every record that does not parse.
        let said: String = std::fs::read_dir(home.quarantine_dir())
            .unwrap()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect();
        assert!(
            said.contains("project_dir must be an absolute path, not \"proj\""),
            "{said}"
        );
        remember(&home, "codex-t9", &c).unwrap();
        assert_eq!(recall(&home, "codex-t9").unwrap(), Some(c.clone()));
    }
}
