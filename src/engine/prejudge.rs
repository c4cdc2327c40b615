//! Judging a signal where it is sent, before it is sent: what the daemon would answer, read
//! through the store without changing anything (`cortex-signal` on the daemon's machine).

use super::rules;
use super::rules::Refusal;
use super::service::in_grace_window;
use crate::clock::Timestamp;
use crate::error::Result;
use crate::records::Status;
use crate::request::SignalRequest;
use crate::store::Store;

/// What a sender on the daemon's machine can know of its signal before sending it, from the
/// home alone (see [`prejudge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prejudged {
    /// It would be refused, with the same refusal the daemon would give.
    Refused(Refusal),
    /// The waitpoint is closed (and past its grace window): answered "already ...".
    Closed(Status),
    /// Nothing here refuses it: send it, and let the daemon decide.
    Open,
}

/// Judges `req` against the waitpoint as `store` holds it, without changing anything, as the
/// daemon would (wrong secret, unknown id, missing or unlisted member, closed), so a sender on
/// the daemon's machine hears "refused" at once instead of having its signal parked later. Only
/// what this cannot see (a state changing meanwhile) is left to the daemon, which decides again
/// in any case.
pub fn prejudge(store: &dyn Store, now: Timestamp, req: &SignalRequest) -> Result<Prejudged> {
    let Some(wp) = store.get(&req.id)? else {
        return Ok(Prejudged::Refused(Refusal::UnknownId));
    };
    if !req.secret.verify(&wp.secret_sha256) {
        return Ok(Prejudged::Refused(Refusal::Unauthorized));
    }
    if wp.status != Status::Armed && !in_grace_window(&wp, now) {
        return Ok(Prejudged::Closed(wp.status));
    }
    if let Err(r) = rules::check_member(&wp, req.member.as_deref()) {
        return Ok(Prejudged::Refused(r));
    }
    Ok(Prejudged::Open)
}
