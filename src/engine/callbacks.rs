//! Callbacks: capability URLs for senders that can only POST (a CI system's webhook, an alert
//! manager). A callback has one delivery mode and a token that is shown once and stored only as
//! SHA-256. Triggering it (over the HTTP shim, or by dropping a file in the spool) delivers a
//! `wake_hint` or `enqueue_message` wake to the owning session; whatever the sender wrote stays
//! external evidence, never instructions.

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::records::{
    CALLBACK_NOTICE, Callback, CallbackMode, CallbackRef, CallbackStatus, ExternalPayload,
    ExternalReport, Wake, WakeKind,
};
use crate::secret;
use crate::store::DocTxn;

use super::Engine;
use crate::request::check_name;

/// Callback ids are `cb_` and 12 hex digits.
pub const ID_PREFIX: &str = "cb_";
/// The callback routes' body limit (the spec's 256 KB).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// How many recent spool-trigger identities a callback remembers for de-duplication.
const RECENT_SOURCES: usize = 64;

/// A callback and its token, which exists only in this value.
#[derive(Debug, Clone)]
pub struct IssuedCallback {
    pub callback: Callback,
    pub token: String,
}

impl IssuedCallback {
    /// This callback as every front end shows it on creation or reset (the spec's reset reply):
    /// `ok`, `agent_id`, `external_trigger_id`, `trigger_url`, `delivery_mode` and `status`.
    /// The URL holds the token: it is shown here once and never stored.
    pub fn view(&self, trigger_url: &str) -> serde_json::Value {
        let cb = &self.callback;
        serde_json::json!({
            "ok": true,
            "agent_id": cb.session,
            "external_trigger_id": cb.id,
            "trigger_url": trigger_url,
            "delivery_mode": cb.mode.delivery_name(),
            "status": cb.status,
        })
    }
}

/// A callback as `callback list`, `show` and `cancel` and the agent's `CancelExternalTrigger`
/// show it: its record without the token's hash (the token itself is never stored).
pub fn public_view(cb: &Callback) -> serde_json::Value {
    let mut v = serde_json::to_value(cb).expect("callbacks serialise");
    if let Some(o) = v.as_object_mut() {
        o.remove("token_sha256");
    }
    v
}

/// What a trigger did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// Delivered as wake `wake_id`.
    Delivered { id: String, wake_id: String },
    /// The same spool file again (after a crash); not delivered twice.
    Duplicate { id: String },
    /// Unknown, malformed or revoked token, or its session is gone: rejected alike.
    Invalid,
    /// A valid token used on the other mode's route.
    WrongMode { expected: CallbackMode },
    /// The agent's timers and callbacks woke it as often as an hour allows (`budget.rs`):
    /// not delivered; try again at `retry_at`.
    Limited { id: String, retry_at: Timestamp },
}

/// The callback id a token names (`cb_<12 hex>_<secret>`), if it has that shape.
fn id_of(token: &str) -> Option<&str> {
    let id = token.get(..15)?;
    (crate::names::is_callback_id(id)
        && token.as_bytes().get(15) == Some(&b'_')
        && token.len() > 16)
        .then_some(id)
}

impl Engine {
    fn load_callback(&self, id: &str) -> Result<Option<Callback>> {
        self.store.callbacks().get_doc(id)
    }

    /// Issues a new callback for `session`.
    pub fn create_callback(
        &self,
        mode: CallbackMode,
        session: &str,
        label: Option<String>,
    ) -> Result<IssuedCallback> {
        let mut txn = self.store.callbacks().begin_docs()?;
        let issued = self.new_callback(mode, session, label, false)?;
        txn.put(&issued.callback)?;
        tracing::info!(
            callback = %issued.callback.id,
            session,
            mode = mode.as_str(),
            "callback created",
        );
        Ok(issued)
    }

    /// A new callback and its token, not yet stored.
    fn new_callback(
        &self,
        mode: CallbackMode,
        session: &str,
        label: Option<String>,
        default: bool,
    ) -> Result<IssuedCallback> {
        check_name("session", session)?;
        if label
            .as_ref()
            .is_some_and(|l| l.chars().count() > super::MAX_LABEL_CHARS)
        {
            return Err(Error::invalid(
                "label",
                format!("must be at most {} characters", super::MAX_LABEL_CHARS),
            ));
        }
        let id = self.fresh_prefixed_id(ID_PREFIX, |id| {
            // An id the store cannot answer for is not taken for granted as free.
            !matches!(self.store.callbacks().get_doc(id), Ok(None))
        });
        let token = format!("{id}_{}", secret::generate());
        let cb = Callback {
            id,
            session: session.to_owned(),
            label,
            mode,
            status: CallbackStatus::Active,
            token_sha256: secret::hash(&token),
            created_at: self.clock.now(),
            revoked_at: None,
            last_triggered_at: None,
            trigger_count: 0,
            recent_sources: Vec::new(),
            hook_deliveries: Vec::new(),
            default,
        };
        Ok(IssuedCallback {
            callback: cb,
            token,
        })
    }

    /// A callback the session owns; another session's id reads as not found.
    pub fn callback_for(&self, id: &str, session: &str) -> Result<Callback> {
        match self.load_callback(id)? {
            Some(c) if c.session == session => Ok(c),
            _ => Err(Error::not_found_for_session("callback", id)),
        }
    }

    /// The session's callbacks, newest first.
    pub fn list_callbacks(&self, session: Option<&str>) -> Result<Vec<Callback>> {
        if let Some(s) = session {
            check_name("agent_id", s)?;
        }
        let mut out = self.store.callbacks().all_docs()?;
        out.retain(|c| session.is_none_or(|s| c.session == s));
        out.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        Ok(out)
    }

    /// Revokes a callback; revoking a revoked one is a no-op.
    pub fn cancel_callback(&self, id: &str, session: &str) -> Result<Callback> {
        let mut txn = self.store.callbacks().begin_docs()?;
        let mut cb = owned(txn.as_mut(), id, session)?;
        if cb.status == CallbackStatus::Active {
            cb.status = CallbackStatus::Revoked;
            cb.revoked_at = Some(self.clock.now());
            txn.put(&cb)?;
            tracing::info!(callback = %id, session, "callback revoked");
        }
        Ok(cb)
    }

    /// Replaces an active callback's token: the old token is refused from now on, the callback
    /// keeps its id. A revoked callback stays revoked (cancelling revokes the capability for
    /// good, as does deleting its session); issue a new one instead.
    pub fn reset_callback(&self, id: &str, session: &str) -> Result<IssuedCallback> {
        let mut txn = self.store.callbacks().begin_docs()?;
        let mut cb = owned(txn.as_mut(), id, session)?;
        if cb.status == CallbackStatus::Revoked {
            return Err(Error::Conflict(format!(
                "callback {id} is revoked, and a revoked callback stays revoked; \
                 `waitpoint callback create` issues a new one"
            )));
        }
        let token = format!("{id}_{}", secret::generate());
        cb.token_sha256 = secret::hash(&token);
        txn.put(&cb)?;
        tracing::info!(callback = %id, session, "callback token reset; the old one is refused");
        Ok(IssuedCallback {
            callback: cb,
            token,
        })
    }

    /// The spec's reset: revokes the agent's current default capability (if it has one) and
    /// issues a replacement with a new id and token, in `mode` or the old one's (`wake` when
    /// there was none). The old one is revoked before the new one exists, so the agent never
    /// holds two.
    pub fn reset_default_callback(
        &self,
        session: &str,
        mode: Option<CallbackMode>,
    ) -> Result<IssuedCallback> {
        check_name("agent_id", session)?;
        let mut txn = self.store.callbacks().begin_docs()?;
        let mut old_mode = None;
        let mut label = None;
        let mut revoked = Vec::new();
        for listed in self.list_callbacks(Some(session))? {
            // Read again in the transaction, so the write is checked against what it read.
            let Some(mut cb) = txn.read(&listed.id)? else {
                continue;
            };
            if cb.default && cb.status == CallbackStatus::Active {
                cb.status = CallbackStatus::Revoked;
                cb.revoked_at = Some(self.clock.now());
                old_mode = Some(cb.mode);
                label = cb.label.clone();
                revoked.push(cb);
            }
        }
        let mode = mode.or(old_mode).unwrap_or(CallbackMode::Wake);
        let issued = self.new_callback(mode, session, label, true)?;
        // The revocation and the replacement are one commit: a reset cut short leaves the old
        // default active or the new one in its place, never neither.
        let mut docs = revoked.clone();
        docs.push(issued.callback.clone());
        txn.put_all(&docs)?;
        for cb in &revoked {
            tracing::info!(callback = %cb.id, session, "default callback revoked by a reset");
        }
        tracing::info!(
            callback = %issued.callback.id,
            session,
            "default callback issued by a reset",
        );
        Ok(issued)
    }

    /// Revokes every callback of a session (used when the session is deleted).
    pub(super) fn revoke_session_callbacks(&self, session: &str) -> Result<Vec<String>> {
        let mut revoked = Vec::new();
        for cb in self.list_callbacks(Some(session))? {
            if cb.status == CallbackStatus::Active {
                self.cancel_callback(&cb.id, session)?;
                revoked.push(cb.id);
            }
        }
        Ok(revoked)
    }

    /// Triggers the callback `token` names on the `route` mode's route. `text` is an enqueue's
    /// message; `source` is the trigger's identity (a spool file's, or an HTTP request's
    /// `Idempotency-Key`): the same one again is a duplicate, not a second delivery.
    pub fn trigger_callback(
        &self,
        token: &secret::Secret,
        route: CallbackMode,
        text: Option<String>,
        source: Option<String>,
    ) -> Result<Trigger> {
        let Some(id) = id_of(token.expose_secret()) else {
            return Ok(Trigger::Invalid);
        };
        let mut txn = self.store.callbacks().begin_docs()?;
        let Some(mut cb) = txn.read(id)? else {
            return Ok(Trigger::Invalid);
        };
        if !token.verify(&cb.token_sha256) || cb.status != CallbackStatus::Active {
            return Ok(Trigger::Invalid);
        }
        if cb.mode != route {
            return Ok(Trigger::WrongMode { expected: cb.mode });
        }
        if let Some(src) = &source
            && cb.recent_sources.contains(src)
        {
            return Ok(Trigger::Duplicate { id: cb.id });
        }
        if let Err(retry_at) = self.take_event_wake(&cb.session) {
            tracing::warn!(
                callback = %cb.id,
                session = %cb.session,
                until = %retry_at,
                "callback refused at the agent's hourly wake limit",
            );
            return Ok(Trigger::Limited {
                id: cb.id,
                retry_at,
            });
        }
        let now = self.clock.now();
        let wake = callback_wake(&cb, text, now);
        self.deliver_owned(&wake, &mut cb.hook_deliveries)?;
        cb.trigger_count += 1;
        cb.last_triggered_at = Some(now);
        if let Some(src) = source {
            cb.recent_sources.push(src);
            let excess = cb.recent_sources.len().saturating_sub(RECENT_SOURCES);
            cb.recent_sources.drain(..excess);
        }
        txn.put(&cb)?;
        tracing::info!(callback = %cb.id, wake = %wake.wake_id, "callback triggered");
        Ok(Trigger::Delivered {
            id: cb.id,
            wake_id: wake.wake_id,
        })
    }

    pub(super) fn record_callback_hook(
        &self,
        id: &str,
        wake_id: &str,
        result: std::result::Result<(), String>,
    ) -> Result<Option<Timestamp>> {
        let txn = std::cell::RefCell::new(self.store.callbacks().begin_docs()?);
        let read = txn.borrow_mut().read(id)?;
        self.note_owned_hook(
            read,
            |cb| &mut cb.hook_deliveries,
            |cb| txn.borrow_mut().put(cb),
            |cb| super::next_hook_after(&cb.hook_deliveries, Timestamp::from_millis(i64::MIN)),
            (id, wake_id, result),
        )
    }

    /// Services a callback's pending hook deliveries.
    pub fn service_callback(&self, id: &str) -> Result<super::Service> {
        let Some(cb) = self.load_callback(id)? else {
            return Ok(super::Service::default());
        };
        let now = self.clock.now();
        Ok(super::Service {
            next_due: super::next_hook_after(&cb.hook_deliveries, now),
            hooks_due: super::hooks_due(&cb.id, &cb.session, &cb.hook_deliveries, now),
        })
    }
}

/// The callback `id` read in `txn`, if `session` owns it; another session's reads as not found.
fn owned(txn: &mut dyn DocTxn<Callback>, id: &str, session: &str) -> Result<Callback> {
    match txn.read(id)? {
        Some(c) if c.session == session => Ok(c),
        _ => Err(Error::not_found_for_session("callback", id)),
    }
}

fn callback_wake(cb: &Callback, text: Option<String>, now: Timestamp) -> Wake {
    let n = cb.trigger_count + 1;
    let name = cb
        .label
        .as_deref()
        .map_or(cb.id.as_str().into(), crate::escape::line);
    let (kind, summary, mut prose) = match cb.mode {
        CallbackMode::Wake => (
            WakeKind::WakeHint,
            format!("callback {name}: look at the external state"),
            format!(
                "Callback {} ({name}) was triggered: look at the external state it watches. \
An accepted callback does not prove that any work completed.\n",
                cb.id
            ),
        ),
        CallbackMode::Enqueue => (
            WakeKind::EnqueueMessage,
            format!("callback {name}: message queued"),
            format!("Callback {} ({name}) delivered a message.\n", cb.id),
        ),
    };
    let reports = match &text {
        Some(t) => vec![ExternalReport {
            seq: n,
            member: None,
            message: Some(t.clone()),
            data: None,
        }],
        None => Vec::new(),
    };
    if let Some(t) = &text {
        prose.push_str(&format!(
            "\nExternal payload. {CALLBACK_NOTICE}\n  text: {}\n",
            crate::escape::quoted(t)
        ));
    }
    Wake {
        wake_id: format!("wk_{}_{n:04}", cb.id.trim_start_matches(ID_PREFIX)),
        kind,
        created_at: now,
        session: cb.session.clone(),
        channel: cb.session.clone(),
        waitpoint: None,
        timer: None,
        callback: Some(CallbackRef {
            id: cb.id.clone(),
            label: cb.label.clone(),
            mode: cb.mode,
        }),
        waited_ms: now.millis_since(cb.created_at),
        summary,
        reports: Vec::new(),
        deadline: None,
        external_payload: ExternalPayload {
            notice: CALLBACK_NOTICE.to_owned(),
            reports,
        },
        digest: None,
        text: prose,
    }
}
