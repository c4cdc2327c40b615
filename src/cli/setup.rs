//! `waitpoint setup claude-code|codex`: reads the harness's and the home's configuration files,
//! asks `crate::setup` for the merge, prints each change and writes the files that change
//! (nothing with `--dry-run`).

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::error::{Error, exit};
use crate::harness::Harness;
use crate::home::Home;
use crate::setup::{self, Context, Scope};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum HarnessName {
    /// Claude Code: the MCP server, the SessionStart/Stop/SessionEnd hooks, the status line
    ClaudeCode,
    /// The Codex CLI: the MCP server, the Stop hook
    Codex,
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// The harness to configure
    pub harness: HarnessName,
    /// Configure the user's files, for every project (the default)
    #[arg(long, conflicts_with = "project")]
    pub user: bool,
    /// Configure this project's files (.mcp.json, .claude/settings.json; .codex/), for everyone
    /// who works in it
    #[arg(long)]
    pub project: bool,
    /// The project directory [default: the current directory]
    #[arg(long, value_name = "DIR", requires = "project")]
    pub project_dir: Option<PathBuf>,
    /// Print what would change and write nothing
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(home: &Home, a: SetupArgs, out: &mut impl Write) -> anyhow::Result<u8> {
    let harness = match a.harness {
        HarnessName::ClaudeCode => Harness::Claude,
        HarnessName::Codex => Harness::Codex,
    };
    let scope = if a.project {
        Scope::Project
    } else {
        Scope::User
    };
    let project_dir = match a.project_dir {
        Some(d) => d,
        None => std::env::current_dir()?,
    };
    let ctx = Context {
        program: program(),
        home: (!super::is_implicit_default(home)).then(|| home.root().to_owned()),
        home_settings: home.settings_file(),
        user_dir: super::home_dir(),
        project_dir: std::path::absolute(project_dir)?,
    };
    let mut current = Vec::new();
    for path in setup::files(harness, scope, &ctx) {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io("cannot read", &path, e).into()),
        };
        current.push((path, text));
    }
    let edits = setup::plan(harness, scope, &ctx, &current)?;
    let mut changed = 0;
    for e in &edits {
        for c in &e.changes {
            writeln!(out, "{}: {c}", e.path.display())?;
        }
        if !e.changes_anything() {
            continue;
        }
        changed += 1;
        if !a.dry_run {
            if let Some(dir) = e.path.parent() {
                std::fs::create_dir_all(dir).map_err(|err| Error::io("cannot create", dir, err))?;
            }
            crate::durable::commit(&e.path, e.after.as_bytes())?;
        }
    }
    let verdict = match (changed, a.dry_run) {
        (0, _) => format!("{} is set up already; nothing changed", harness.name()),
        (n, true) => format!("dry run: {n} file(s) would change; nothing written"),
        (n, false) => format!("{} set up: {n} file(s) changed", harness.name()),
    };
    writeln!(out, "{verdict}")?;
    if harness == Harness::Codex && changed > 0 && !a.dry_run {
        writeln!(
            out,
            "Codex asks you to trust new hooks: accept the waitpoint Stop hook when it asks \
             (`codex exec` runs need --dangerously-bypass-hook-trust)."
        )?;
    }
    Ok(exit::OK)
}

/// How a harness should run us: `waitpoint` when that name on `PATH` is this binary, else this
/// binary's full path.
fn program() -> String {
    let me = std::env::current_exe().and_then(std::fs::canonicalize).ok();
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("waitpoint"))
            .find(|c| c.is_file())
            .and_then(|c| std::fs::canonicalize(c).ok())
    });
    match me {
        Some(me) if on_path.as_ref() != Some(&me) => me.to_string_lossy().into_owned(),
        _ => "waitpoint".to_owned(),
    }
}
