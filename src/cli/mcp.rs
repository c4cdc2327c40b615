//! `waitpoint mcp`: the agent tools served over MCP on stdio, for the session the flags, the
//! environment or the harness name.

use std::sync::Arc;

use clap::Args;

use crate::clock::{Clock, SystemClock};
use crate::engine::Engine;
use crate::error::exit;
use crate::home::Home;
use crate::settings::Settings;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Act for this session in every call [default: $CORTEX_SESSION, else the harness's own
    /// session: Claude Code's (claude-$CLAUDE_CODE_SESSION_ID), the Codex thread each call
    /// names (codex-THREAD), the Gemini CLI session its SessionStart hook recorded for the
    /// Gemini process that started the server (gemini-ID, read on every call), the OpenCode
    /// session each call's harness_session names (opencode-ID), else "default"]
    #[arg(long, value_name = "S", env = "CORTEX_SESSION", hide_env = true)]
    pub session: Option<String>,
    /// Also ring Claude Code's channel (notifications/claude/channel, a research preview) when
    /// a wake arrives: a doorbell telling the agent to call wait_next, which takes the wake
    #[arg(long)]
    pub claude_channel: bool,
}

/// `waitpoint mcp`: serves until the client leaves. `broken` says what is wrong with the
/// settings, when they could not be used: every call is answered with it.
pub fn serve(
    home: Home,
    store: Option<&str>,
    mut settings: Settings,
    a: &McpArgs,
    broken: Option<String>,
) -> anyhow::Result<u8> {
    if let Some(url) = store {
        settings.store = crate::settings::location::Location::parse(url)
            .map_err(|e| crate::error::Error::Usage(format!("--store: {e}")))?;
    }
    home.ensure()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let engine = Engine::open(home, settings, clock, crate::store::Role::Command)?;
    if broken.is_none() {
        // Before reading or changing any state: what a dead daemon left in the journal.
        engine.replay_left_journal()?;
    }
    // Before stdout is locked anywhere: the server writes it from other threads.
    let lines = super::line_context(engine.home())?;
    crate::mcp::serve_stdio(crate::mcp::Config {
        engine,
        sessions: a.session.clone().map_or(
            crate::mcp::Sessions::FromHarness,
            crate::mcp::Sessions::Named,
        ),
        started_by: crate::harness::from_env(&super::env_var),
        lines,
        claude_channel: a.claude_channel,
        broken,
        // OpenCode names itself to the servers it starts, and starts them in its project.
        opencode_dir: super::env_var("OPENCODE")
            .filter(|v| v == "1")
            .and_then(|_| std::env::current_dir().ok()),
    })?;
    Ok(exit::OK)
}
