//! The operator page's requests (`/ui/`, served by the shim, `ingress/http/ui.rs`), run on the
//! loop like every other request from the shim. The page's view is not a view of its own: it is
//! the session list of `agent::sessions` (ring, capsule, counts), each session's `wait_check`
//! reply (`agent::check`: intent, progress, badges with their retry errors, the latest
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
/// it waits on.
fn view(engine: &Engine) -> Result<Value> {
    let now = engine.now();
    let cap = engine.settings().max_wakes_per_hour;
    let mut sessions = Vec::new();
    for line in agent::sessions(engine)? {
        let items = agent::waiting_for(engine, &line.session)?;
        let check = agent::check(engine, &line.session, &items)?;
        let mut pictures = Vec::with_capacity(items.len());
        for wp in &items {
            let signals = engine.read_signals(&wp.id, 1)?;
            let badges = render::badges(engine.home(), wp, cap, now);
            pictures.push(render::show_json(wp, &signals, &badges));
        }
        sessions.push(json!({ "line": line, "check": check, "waitpoints": pictures }));
    }
    Ok(json!({ "sessions": sessions }))
}
