//! `waitpoint setup claude-code|codex|gemini`: reads the harness's and the home's configuration
//! files, asks `crate::setup` for the merge, prints each change and writes the files that change
//! (nothing with `--dry-run`).

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::error::exit;
use crate::harness::Harness;
use crate::home::Home;
use crate::setup::{self, Context, Edit, Found, Place, Scope, Written};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum HarnessName {
    /// Claude Code: the MCP server, the SessionStart/Stop/SessionEnd hooks, the status line
    ClaudeCode,
    /// The Codex CLI: the MCP server, the Stop hook
    Codex,
    /// Gemini CLI: the MCP server (trusted), the SessionStart/AfterAgent/SessionEnd hooks
    Gemini,
    /// OpenCode: the MCP server, the plugin that names the calling session and wakes an idle one
    Opencode,
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// The harness to configure
    pub harness: HarnessName,
    /// Configure the user's files, for every project (the default)
    #[arg(long, conflicts_with = "project")]
    pub user: bool,
    /// Configure this project's files (.mcp.json, .claude/settings.json; .codex/;
    /// .gemini/settings.json), for everyone who works in it
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
        HarnessName::Gemini => Harness::Gemini,
        HarnessName::Opencode => Harness::OpenCode,
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
        // Codex's own variable, read as Codex reads it (relative to where it runs).
        codex_home: super::env_var("CODEX_HOME")
            .map(std::path::absolute)
            .transpose()?,
        project_dir: std::path::absolute(project_dir)?,
    };
    // Every file is read and merged before any is written: one refused leaves all as they were.
    let places = setup::files(harness, scope, &ctx);
    let mut planned = Vec::new();
    for (index, place) in places.iter().enumerate() {
        let found = setup::read(place)?;
        let edit = setup::plan_file(harness, scope, &ctx, index, found.text.as_deref())?;
        planned.push((found, edit));
    }
    let mut changed = 0;
    for (index, (found, edit)) in planned.into_iter().enumerate() {
        if let Some(note) = &found.note {
            writeln!(out, "{note}")?;
        }
        let edit = if a.dry_run || !edit.changes_anything() {
            edit
        } else {
            let (edit, attempts) =
                settle(harness, scope, &ctx, index, &places[index], found, edit)?;
            if attempts > 1 {
                writeln!(
                    out,
                    "{}: changed while setup wrote it (another program writes it too); merged \
                     again over its new text ({attempts} attempts)",
                    edit.path.display()
                )?;
            }
            edit
        };
        for c in &edit.changes {
            writeln!(out, "{}: {c}", edit.path.display())?;
        }
        if edit.changes_anything() {
            changed += 1;
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
    if harness == Harness::Codex && scope == Scope::Project {
        // Codex reads a project's .codex/ only once the project is trusted; untrusted, it
        // offers the model no waitpoint tools and runs no hook, and says nothing of why.
        let codex_home = ctx
            .codex_home
            .clone()
            .unwrap_or_else(|| ctx.user_dir.join(".codex"));
        writeln!(
            out,
            "Codex reads {} only in a trusted project: trust it when Codex asks on its first run \
             there, or add to {}:\n  [projects.\"{}\"]\n  trust_level = \"trusted\"",
            ctx.project_dir.join(".codex").display(),
            codex_home.join("config.toml").display(),
            ctx.project_dir.display()
        )?;
    }
    if harness == Harness::Gemini && scope == Scope::Project {
        gemini_trust_note(&ctx, out)?;
    }
    Ok(exit::OK)
}

/// Gemini CLI reads a project's `.gemini/settings.json` only in a trusted folder, and a headless
/// run or a resume in an untrusted one exits 55: how to trust it.
fn gemini_trust_note(ctx: &Context, out: &mut impl Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "Gemini CLI reads {} only in a trusted folder (untrusted, `gemini -p` and a resume exit \
         55): trust it when Gemini asks on its first run there, or add to {}:\n  {{{}: \
         \"TRUST_FOLDER\"}}",
        ctx.project_dir.join(".gemini/settings.json").display(),
        ctx.user_dir.join(".gemini/trustedFolders.json").display(),
        serde_json::Value::from(ctx.project_dir.to_string_lossy()),
    )?;
    Ok(())
}

/// How many times a file that changes under us is read, merged and written again before setup
/// gives up (a harness rewriting it many times a second).
const ATTEMPTS: usize = 25;

/// Writes `edit`, planned over `found`: again over the new text when the file changed between
/// the read and the write, and read back afterwards, so a change is reported only once it is on
/// disk. The edit that was written comes back, with how many attempts it took.
fn settle(
    harness: Harness,
    scope: Scope,
    ctx: &Context,
    index: usize,
    place: &Place,
    mut found: Found,
    mut edit: Edit,
) -> anyhow::Result<(Edit, usize)> {
    for attempt in 1..=ATTEMPTS {
        if found.replace(&edit.after)? == Written::Done {
            // Another writer may have replaced it right after us, from a text without ours.
            let back = setup::read(place)?;
            let again = setup::plan_file(harness, scope, ctx, index, back.text.as_deref())?;
            if !again.changes_anything() {
                return Ok((edit, attempt));
            }
        }
        found = setup::read(place)?;
        edit = setup::plan_file(harness, scope, ctx, index, found.text.as_deref())?;
        if !edit.changes_anything() {
            return Ok((edit, attempt));
        }
    }
    anyhow::bail!(
        "{}: changed every time setup wrote it ({ATTEMPTS} times): another program (the harness \
         itself?) keeps rewriting it; quit it, then run setup again",
        place.path.display()
    )
}

/// How a harness, its hooks and the daemon's `onWake` run us: the absolute path of `waitpoint`
/// on `PATH` when that is this binary (a path that survives an upgrade in place), else this
/// binary's own path. Never the bare name: the daemon's `PATH` is not the shell's.
fn program() -> String {
    let me = std::env::current_exe().and_then(std::fs::canonicalize).ok();
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .filter(|d| d.is_absolute())
            .map(|d| d.join("waitpoint"))
            .find(|c| c.is_file())
    });
    match (me, on_path) {
        (Some(me), Some(p)) if std::fs::canonicalize(&p).ok().as_ref() == Some(&me) => {
            p.to_string_lossy().into_owned()
        }
        (Some(me), _) => me.to_string_lossy().into_owned(),
        (None, _) => "waitpoint".to_owned(),
    }
}
