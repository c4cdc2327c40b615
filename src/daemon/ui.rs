//! The operator page's requests (`/ui/`, served by the shim, `ingress/http/ui.rs`), run on the
//! loop like every other request from the shim. The page's view is not a view of its own: it is
//! each session as `agent::Session` reads it once: its line in the session list (ring, capsule,
//! counts) and its `wait_check` reply (intent, progress, badges with their retry errors, the latest
//! heartbeat) and each waitpoint's `show --json` (`render::show_json`: every signal with its
//! source and time, never the secret's hash), so the page, the terminal and the agent cannot
//! tell different stories. Its cancel is `waitpoint cancel`'s `Engine::cancel`.

use serde_json::{Value, json};

use crate::agent;
use crate::engine::Engine;
use crate::error::Result;
use crate::ingress::http::ui::UiRequest;
use crate::render;

/// Answers one of the page's requests.
pub(super) fn run(engine: &Engine, request: UiRequest) -> Result<Value> {
    match request {
        UiRequest::View => view(engine),
        UiRequest::Cancel { id, session } => {
            let wp = engine.cancel(&id, &session)?;
            tracing::info!(waitpoint = %wp.id, session = %session, "cancelled from the operator page");
            Ok(json!({
                "result": "cancelled",
                "waitpoint": render::public_view(&wp),
                "note": agent::cancelled_note(&wp),
            }))
        }
    }
}

/// Every session with its line, its `wait_check` reply and the full picture of each waitpoint
/// it waits on: each session read once, `bad/` read once for the whole view, and a picture's
/// badges those of its row.
fn view(engine: &Engine) -> Result<Value> {
    let refused = agent::refused_counts(engine.home())?;
    let mut sessions = Vec::new();
    for name in agent::session_names(engine)? {
        let mut s = agent::Session::read(engine, name)?;
        agent::add_refusals(&mut s.rows, &refused);
        let mut pictures = Vec::with_capacity(s.items.len());
        for (wp, row) in s.items.iter().zip(&s.rows) {
            let signals = engine.read_signals(&wp.id, 1)?;
            pictures.push(render::show_json(wp, &signals, &row.badges));
        }
        sessions.push(json!({ "line": s.line, "check": s.check_reply(), "waitpoints": pictures }));
    }
    Ok(json!({ "sessions": sessions }))
}
