//! `waitpoint timer ...`: the events-and-timers operator CLI for timers, and its legacy form.
//! Clap types end here; the engine sees validated requests.

use std::io::Write;

use clap::{Args, Subcommand};

use crate::engine::Engine;
use crate::engine::timers::TimerRequest;
use crate::error::exit;

use super::{AgentArg, print_json};
use crate::operator_view;

/// `waitpoint timer`: a subcommand, or the legacy creation form's flags alone.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct TimerArgs {
    #[command(subcommand)]
    pub command: Option<TimerCommand>,
    /// The legacy form `timer --after-ms N [--every-ms N] [--summary TEXT]`: `timer create`.
    #[command(flatten)]
    pub legacy: TimerCreateArgs,
}

impl TimerArgs {
    /// The subcommand to run: the one given, or `create` for the legacy form.
    pub fn into_command(self) -> TimerCommand {
        self.command.unwrap_or(TimerCommand::Create(self.legacy))
    }
}

#[derive(Debug, Subcommand)]
pub enum TimerCommand {
    /// Create a durable timer: a wake after N ms, optionally repeating
    Create(TimerCreateArgs),
    /// List the session's timers, newest first
    List(TimerListArgs),
    /// Show one of the session's timers
    Show(TimerIdArgs),
    /// Cancel a timer (cancelling a cancelled one is fine; a completed one cannot be)
    Cancel(TimerIdArgs),
}

#[derive(Debug, Args)]
pub struct TimerCreateArgs {
    /// Delay before the first firing, in milliseconds (positive)
    // Required, but an `Option`: in the legacy form (`timer --after-ms N`) these flags sit
    // beside the subcommands, and clap waives the requirement when a subcommand is given.
    #[arg(
        long,
        value_name = "N",
        required = true,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub after_ms: Option<u64>,
    /// Repeat every N milliseconds after that (positive)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub every_ms: Option<u64>,
    /// What the wake should remind you of
    #[arg(long, value_name = "TEXT")]
    pub summary: Option<String>,
    #[command(flatten)]
    pub session: AgentArg,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TimerListArgs {
    /// At most this many
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub limit: usize,
    #[command(flatten)]
    pub session: AgentArg,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TimerIdArgs {
    /// The timer id (tm_…)
    // Not `ID`: that is --agent's value, and clap's usage line shows both.
    #[arg(value_name = "TIMER_ID")]
    pub id: String,
    #[command(flatten)]
    pub session: AgentArg,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run_timer(engine: &Engine, cmd: TimerCommand, out: &mut impl Write) -> anyhow::Result<u8> {
    match cmd {
        TimerCommand::Create(a) => {
            let t = engine.create_timer(TimerRequest {
                duration_ms: a.after_ms.expect("clap requires --after-ms"),
                interval_ms: a.every_ms,
                summary: a.summary,
                session: a.session.session,
                authority_class: None,
            })?;
            if a.json {
                print_json(out, &t)?;
            } else {
                writeln!(out, "{}", operator_view::timer_line(&t))?;
            }
        }
        TimerCommand::List(a) => {
            let list = engine.list_timers(&a.session.session, a.limit)?;
            if a.json {
                print_json(out, &list)?;
            } else if list.is_empty() {
                // Said, as `check` says it: an empty output reads like a command that failed.
                writeln!(out, "session {} has no timers", a.session.session)?;
            } else {
                for t in &list {
                    writeln!(out, "{}", operator_view::timer_line(t))?;
                }
            }
        }
        TimerCommand::Show(a) => {
            let t = engine.timer_for(&a.id, &a.session.session)?;
            if a.json {
                print_json(out, &t)?;
            } else {
                writeln!(out, "{}", operator_view::timer_line(&t))?;
                writeln!(
                    out,
                    "  created {}  last fired {}",
                    t.created_at,
                    t.last_fired_at
                        .map(|x| x.to_string())
                        .unwrap_or_else(|| "never".into())
                )?;
            }
        }
        TimerCommand::Cancel(a) => {
            let t = engine.cancel_timer(&a.id, &a.session.session)?;
            if a.json {
                print_json(out, &t)?;
            } else {
                writeln!(out, "cancelled {}", t.id)?;
            }
        }
    }
    Ok(exit::OK)
}
