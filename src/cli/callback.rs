//! `waitpoint callback ...`: callback capabilities (create, list, show, cancel, reset) from the
//! operator's side; the engine owns their rules.

use std::io::Write;

use clap::{Args, Subcommand};

use crate::engine::Engine;
use crate::engine::callbacks::public_view;
use crate::error::exit;
use crate::records::{Callback, CallbackMode};

use super::{AgentArg, print_json};

#[derive(Debug, Subcommand)]
pub enum CallbackCommand {
    /// Issue a capability URL that wakes the session (or queues a message) when POSTed to
    Create(CallbackCreateArgs),
    /// List the session's callbacks (never their tokens)
    List(CallbackListArgs),
    /// Show one callback (never its token)
    Show(CallbackIdArgs),
    /// Revoke a callback's token, for good
    Cancel(CallbackIdArgs),
    /// Without ID: revoke the agent's default callback and issue a replacement (the spec's
    /// reset); with ID: replace that active callback's token (a revoked one stays revoked)
    ///
    /// The revocation and the replacement are one commit: cut short, the agent keeps its old
    /// default or has the new one, never neither. The token is printed after the commit; a
    /// reset killed in between leaves a token nobody saw: run it again.
    Reset(CallbackResetArgs),
}

#[derive(Debug, Args)]
pub struct CallbackResetArgs {
    /// The callback whose token to replace (cb_…); without it, the agent's default callback
    #[arg(value_name = "CALLBACK_ID")]
    pub id: Option<String>,
    /// The replacement default's mode [default: the old default's, else wake]
    #[arg(long, value_name = "MODE", value_parser = ["wake", "enqueue"], conflicts_with = "id")]
    pub mode: Option<String>,
    #[command(flatten)]
    pub session: AgentArg,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CallbackCreateArgs {
    /// wake: an empty POST wakes the session with a hint; enqueue: the POST's text is queued
    #[arg(long, value_name = "MODE", value_parser = ["wake", "enqueue"])]
    pub mode: String,
    /// A name for it, shown on its wakes
    #[arg(long, value_name = "L")]
    pub label: Option<String>,
    #[command(flatten)]
    pub session: AgentArg,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CallbackListArgs {
    #[command(flatten)]
    pub session: AgentArg,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CallbackIdArgs {
    /// The callback id (cb_…)
    // Not `ID`: that is --agent's value, and clap's usage line shows both.
    #[arg(value_name = "CALLBACK_ID")]
    pub id: String,
    #[command(flatten)]
    pub session: AgentArg,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

fn callback_line(cb: &Callback) -> String {
    let status = match cb.status {
        crate::records::CallbackStatus::Active => "active",
        crate::records::CallbackStatus::Revoked => "revoked",
    };
    format!(
        "{}  {:<7} {:<7} triggered {}  {}",
        cb.id,
        cb.mode.as_str(),
        status,
        cb.trigger_count,
        crate::operator_view::visible(cb.label.as_deref().unwrap_or(""))
    )
}

pub fn run_callback(
    engine: &Engine,
    cmd: CallbackCommand,
    fallback_port: u16,
    out: &mut impl Write,
) -> anyhow::Result<u8> {
    let issued = |out: &mut dyn Write,
                  reset: bool,
                  json_out: bool,
                  i: crate::engine::callbacks::IssuedCallback|
     -> anyhow::Result<()> {
        let url = crate::agent_view::trigger_url(engine.home(), fallback_port, &i);
        let cb = &i.callback;
        if json_out {
            let v = i.view(&url);
            super::print_json(out, &v)?;
        } else {
            writeln!(
                out,
                "{} {} ({})",
                if reset { "reset" } else { "created" },
                cb.id,
                cb.mode.as_str()
            )?;
            writeln!(
                out,
                "  trigger_url (shown once; treat it as a secret): {url}"
            )?;
            let spool = engine.home().drop_zone();
            writeln!(
                out,
                "  without the HTTP shim: put {{\"callback\":\"{}\",\"mode\":\"{}\"}} in \
                 {}/<fresh name>.json",
                i.token,
                cb.mode.as_str(),
                spool.display()
            )?;
        }
        Ok(())
    };
    match cmd {
        CallbackCommand::Create(a) => {
            let mode = CallbackMode::parse(&a.mode).expect("clap checked the value");
            let i = engine.create_callback(mode, &a.session.session, a.label)?;
            issued(out, false, a.json, i)?;
        }
        CallbackCommand::List(a) => {
            let list = engine.list_callbacks(Some(&a.session.session))?;
            if a.json {
                let v: Vec<_> = list.iter().map(public_view).collect();
                print_json(out, &v)?;
            } else {
                for cb in &list {
                    writeln!(out, "{}", callback_line(cb))?;
                }
            }
        }
        CallbackCommand::Show(a) => {
            let cb = engine.callback_for(&a.id, &a.session.session)?;
            if a.json {
                print_json(out, &public_view(&cb))?;
            } else {
                writeln!(out, "{}", callback_line(&cb))?;
                writeln!(
                    out,
                    "  created {} · last triggered {}{}",
                    cb.created_at,
                    cb.last_triggered_at
                        .map(|t| t.to_string())
                        .unwrap_or_else(|| "never".into()),
                    cb.revoked_at
                        .map(|t| format!(" · revoked {t}"))
                        .unwrap_or_default()
                )?;
                writeln!(
                    out,
                    "  (the token was shown once at creation; `callback reset` issues a new one)"
                )?;
            }
        }
        CallbackCommand::Cancel(a) => {
            let cb = engine.cancel_callback(&a.id, &a.session.session)?;
            if a.json {
                print_json(out, &public_view(&cb))?;
            } else {
                writeln!(out, "revoked {}", cb.id)?;
            }
        }
        CallbackCommand::Reset(a) => {
            let i = match &a.id {
                Some(id) => engine.reset_callback(id, &a.session.session)?,
                None => engine.reset_default_callback(
                    &a.session.session,
                    a.mode.as_deref().and_then(CallbackMode::parse),
                )?,
            };
            issued(out, true, a.json, i)?;
        }
    }
    Ok(exit::OK)
}
