//! Arming a waitpoint: the validated `wait_create` request, its limits, and the new
//! waitpoint with its one-time secret.

use super::Engine;
use crate::clock::human_duration;
use crate::error::{Error, Result};
use crate::records::{Counters, Round, Status, Waitpoint};
use crate::request::check_member_name;
use crate::request::check_name;
use crate::secret;
use crate::settings::MAX_TTL_MS;
use rand::Rng;

/// The largest `max_signals` a monitor may ask for.
pub const MAX_MAX_SIGNALS: u32 = 10_000;
/// The most members a barrier may name.
pub const MAX_MEMBERS: usize = 256;
/// The longest label, in characters.
pub const MAX_LABEL_CHARS: usize = 200;
/// The longest intent, in characters.
pub const MAX_INTENT_CHARS: usize = 4_000;
const HOUR_MS: f64 = 3_600_000.0;

/// How many terminal signals resolve a waitpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quorum {
    All,
    Count(u32),
}

/// A validated `wait_create`.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub label: String,
    pub intent: String,
    pub members: Vec<String>,
    pub quorum: Option<Quorum>,
    pub fail_fast: bool,
    pub max_signals: u32,
    pub expires_in_hours: Option<f64>,
    pub device: Option<String>,
    pub session: String,
    pub channel: String,
    /// `recheck_after_ms`: one "recheck" wake if nothing terminal arrived by then.
    pub recheck_after_ms: Option<u64>,
    /// `started_within_s`, in milliseconds: one early wake if no signal at all arrived by then.
    pub started_within_ms: Option<u64>,
    /// `heartbeat_within_s`, in milliseconds: after the first signal, a wake each time no
    /// further report arrives within this window.
    pub heartbeat_within_ms: Option<u64>,
}

impl CreateRequest {
    /// A request with the spec's defaults: no members, quorum by default, fail-fast on, one
    /// wake, the settings' lifetime, no device, the channel named after the session, no recheck.
    /// Set other fields with struct update syntax.
    pub fn new(label: impl Into<String>, intent: impl Into<String>, session: &str) -> Self {
        CreateRequest {
            label: label.into(),
            intent: intent.into(),
            members: Vec::new(),
            quorum: None,
            fail_fast: true,
            max_signals: 1,
            expires_in_hours: None,
            device: None,
            session: session.to_owned(),
            channel: session.to_owned(),
            recheck_after_ms: None,
            started_within_ms: None,
            heartbeat_within_ms: None,
        }
    }
}

/// A new waitpoint and its secret, which is never stored and exists only in this value.
#[derive(Debug, Clone)]
pub struct Created {
    pub waitpoint: Waitpoint,
    pub secret: String,
}

/// The shortest lifetime a waitpoint may be given: one second.
pub const MIN_TTL_MS: i64 = 1_000;
/// [`MIN_TTL_MS`] in hours as messages show it (rounded up, so it is itself accepted).
const MIN_TTL_HOURS_SHOWN: f64 = 0.0003;

impl Engine {
    /// Arms a new waitpoint (`wait_create`).
    pub fn create(&self, req: CreateRequest) -> Result<Created> {
        let invalid = |field, m: String| Err(Error::invalid(field, m));
        let label = req.label.trim().to_owned();
        if label.is_empty() || label.chars().count() > MAX_LABEL_CHARS {
            return invalid("label", format!("must be 1-{MAX_LABEL_CHARS} characters"));
        }
        let intent = req.intent.trim().to_owned();
        if intent.is_empty() || intent.chars().count() > MAX_INTENT_CHARS {
            return invalid("intent", format!("must be 1-{MAX_INTENT_CHARS} characters"));
        }
        check_name("session", &req.session)?;
        check_name("channel", &req.channel)?;
        if let Some(d) = &req.device {
            check_name("device", d)?;
        }
        if req.members.len() > MAX_MEMBERS {
            return invalid("members", format!("may name at most {MAX_MEMBERS} jobs"));
        }
        for (i, m) in req.members.iter().enumerate() {
            check_member_name(m).map_err(|e| {
                Error::invalid("members", format!("{}: {e}", crate::escape::quoted(m)))
            })?;
            if req.members[..i].contains(m) {
                return invalid("members", format!("name {m:?} twice"));
            }
        }
        let quorum = match (req.quorum, req.members.len()) {
            (None | Some(Quorum::All), 0) => 1,
            (None | Some(Quorum::All), n) => n as u32,
            (Some(Quorum::Count(q)), n) => {
                if q == 0 || (n > 0 && q as usize > n) {
                    return invalid(
                        "quorum",
                        format!(
                            "{q} must be at least 1{}",
                            if n > 0 {
                                format!(" and at most the {n} members")
                            } else {
                                String::new()
                            }
                        ),
                    );
                }
                q
            }
        };
        if req.max_signals == 0 || req.max_signals > MAX_MAX_SIGNALS {
            return invalid("max_signals", format!("must be 1-{MAX_MAX_SIGNALS}"));
        }
        let lifetime_ms = match req.expires_in_hours {
            None => self.settings.ttl_ms as i64,
            Some(h) => {
                let max_h = MAX_TTL_MS as f64 / HOUR_MS;
                // Below a second a deadline is gone before anyone could signal (1e-300 was
                // accepted and expired at once).
                let min_h = MIN_TTL_MS as f64 / HOUR_MS;
                if !h.is_finite() || h < min_h || h > max_h {
                    return invalid(
                        "expires_in_hours",
                        format!(
                            "must be at least {MIN_TTL_HOURS_SHOWN} (one second) and at most \
                             {max_h}, not {h:?}"
                        ),
                    );
                }
                (h * HOUR_MS).round() as i64
            }
        };
        match req.recheck_after_ms {
            Some(0) => {
                return invalid(
                    "recheck_after_ms",
                    "must be a positive number of milliseconds".into(),
                );
            }
            // A recheck after the deadline could never come; one past the clock's range wrapped.
            Some(ms) if ms >= lifetime_ms as u64 => {
                return invalid(
                    "recheck_after_ms",
                    format!(
                        "must be less than the waitpoint's lifetime ({lifetime_ms} ms), not {ms}"
                    ),
                );
            }
            _ => {}
        }
        for (field, value) in [
            ("started_within_s", req.started_within_ms),
            ("heartbeat_within_s", req.heartbeat_within_ms),
        ] {
            check_window(field, value, lifetime_ms)?;
        }
        let now = self.clock.now();
        let secret = secret::generate();
        let waitpoint = Waitpoint {
            id: self.fresh_id(),
            label,
            intent,
            session: req.session,
            channel: req.channel,
            members: req.members,
            quorum,
            fail_fast: req.fail_fast,
            max_signals: req.max_signals,
            device: req.device,
            status: Status::Armed,
            outcome: None,
            created_at: now,
            expires_at: now.plus_ms(lifetime_ms),
            resolved_at: None,
            secret_sha256: secret::hash(&secret),
            counters: Counters::default(),
            round: Round {
                start_seq: 1,
                ..Round::default()
            },
            pending_wake: None,
            recent_wakes: Vec::new(),
            wake_cap: None,
            outbox: Vec::new(),
            hook_deliveries: Vec::new(),
            recheck_at: req.recheck_after_ms.map(|ms| now.plus_ms(ms as i64)),
            recheck_sent: false,
            silence: crate::records::Silence {
                started_within_ms: req.started_within_ms,
                heartbeat_within_ms: req.heartbeat_within_ms,
                ..Default::default()
            },
            log: crate::records::LogSummary::default(),
        };
        self.store.create(&waitpoint)?;
        Ok(Created { waitpoint, secret })
    }

    fn fresh_id(&self) -> String {
        self.fresh_prefixed_id("wp_", |id| !matches!(self.store.get(id), Ok(None)))
    }

    /// A fresh `<prefix><12 hex>` id that `taken` does not know.
    pub(super) fn fresh_prefixed_id(&self, prefix: &str, taken: impl Fn(&str) -> bool) -> String {
        loop {
            let mut b = [0u8; 6];
            rand::rng().fill_bytes(&mut b);
            let id = format!("{prefix}{}", hex::encode(b));
            if !taken(&id) {
                return id;
            }
        }
    }
}

/// The shortest silence window: one second, like the shortest lifetime.
pub const MIN_WINDOW_MS: u64 = 1_000;

/// Checks a silence window: at least a second, and shorter than the waitpoint's lifetime (a
/// window that ends after the deadline could never be reported; the deadline says it all).
fn check_window(field: &'static str, value: Option<u64>, lifetime_ms: i64) -> Result<()> {
    match value {
        Some(ms) if ms < MIN_WINDOW_MS => Err(Error::invalid(
            field,
            format!("must be at least 1 second, not {ms} ms"),
        )),
        Some(ms) if ms >= lifetime_ms as u64 => Err(Error::invalid(
            field,
            format!(
                "must be shorter than the waitpoint's lifetime ({}), not {}",
                human_duration(lifetime_ms),
                // Past i64 (u64::MAX seconds, say) the cast wrapped and said "0s".
                human_duration(i64::try_from(ms).unwrap_or(i64::MAX))
            ),
        )),
        _ => Ok(()),
    }
}
