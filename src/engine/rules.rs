//! The waitpoint state machine as pure functions: who may report, what a signal does to the
//! state, and what a wake says. No I/O here, so the rules can be tested (and later modelled)
//! without a filesystem.

use crate::clock::{Timestamp, human_duration};
use crate::escape;
use crate::records::{
    DeadlineCase, DeadlineNotice, EXTERNAL_NOTICE, ExternalPayload, ExternalReport, HoldReason,
    Outcome, PendingWake, ReportFact, Round, SignalRecord, SignalStatus, Status, Waitpoint, Wake,
    WakeKind, WakeSubject,
};

/// Why a well-formed signal was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A wrong secret. Its [`reason`](Refusal::reason) is the same as [`UnknownId`]'s, so a
    /// refusal that reaches a `.reason` file or a log never tells which of the two it was.
    ///
    /// [`UnknownId`]: Refusal::UnknownId
    Unauthorized,
    /// No such waitpoint. Kept apart from [`Unauthorized`](Refusal::Unauthorized) only because
    /// the HTTP route's contract answers 404 here and 401 there; everywhere else the two read
    /// alike.
    UnknownId,
    /// The waitpoint names members and the signal names none.
    MemberMissing { expected: Vec<String> },
    /// The signal names a member that is not on the list.
    MemberUnknown {
        member: String,
        expected: Vec<String>,
    },
}

impl Refusal {
    /// A reason fit for a `.reason` file, a log line or an HTTP body.
    pub fn reason(&self) -> String {
        match self {
            Refusal::Unauthorized | Refusal::UnknownId => {
                "unknown waitpoint id or wrong secret".to_owned()
            }
            Refusal::MemberMissing { expected } => format!(
                "this waitpoint names its members; the signal must carry \"member\", one of: {}",
                expected.join(", ")
            ),
            Refusal::MemberUnknown { member, expected } => format!(
                "member {member:?} is not on this waitpoint's list; expected one of: {}",
                expected.join(", ")
            ),
        }
    }
}

/// Member rules: once a waitpoint names members, every signal must name one of them.
pub fn check_member(wp: &Waitpoint, member: Option<&str>) -> Result<(), Refusal> {
    if wp.members.is_empty() {
        return Ok(());
    }
    match member {
        None => Err(Refusal::MemberMissing {
            expected: wp.members.clone(),
        }),
        Some(m) if wp.members.iter().any(|x| x == m) => Ok(()),
        Some(m) => Err(Refusal::MemberUnknown {
            member: m.to_owned(),
            expected: wp.members.clone(),
        }),
    }
}

/// How long a multi-signal waitpoint holds its wake after completing, so a late member's report
/// lands in the same wake.
pub const GRACE_MS: i64 = 3_000;
/// The window of the wake cap.
pub const HOUR_MS: i64 = 3_600_000;

/// A round that a signal completed: the signals from `first_seq` on go into its wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedRound {
    pub kind: WakeKind,
    pub first_seq: u64,
    pub outcome: Outcome,
}

/// Applies an accepted signal (whose `seq` is the next one).
///
/// `progress` is recorded and wakes nobody. A terminal signal counts toward the round's quorum
/// (once per member when members are named); the round completes at the quorum, or at once on a
/// `fail` when `fail_fast` is on. `max_signals` is how many times the waitpoint may wake you
/// (the spec's words): a round that starts the `max_signals`th wake resolves it; earlier ones keep
/// a monitor open, and a round that folds into a wake already held (the grace window, the hourly
/// cap) starts no wake of its own, so it resolves nothing. A signal that reaches a waitpoint no longer armed (only possible inside
/// the grace window) is recorded and carried by the pending wake, and changes nothing else.
pub fn apply_signal(wp: &mut Waitpoint, rec: &SignalRecord) -> Option<CompletedRound> {
    wp.counters.signals = rec.seq;
    super::silence::note_report(wp, rec);
    match rec.status {
        SignalStatus::Ok => wp.counters.ok += 1,
        SignalStatus::Fail => wp.counters.fail += 1,
        SignalStatus::Progress => wp.counters.progress += 1,
    }
    if wp.status != Status::Armed || !rec.status.is_terminal() {
        return None;
    }
    let counts = match (&rec.member, wp.members.is_empty()) {
        (_, true) | (None, false) => true,
        (Some(m), false) => !wp.round.members.contains(m),
    };
    if !counts {
        return None;
    }
    wp.round.terminal += 1;
    if let Some(m) = &rec.member {
        wp.round.members.push(m.clone());
    }
    let failed_now = rec.status == SignalStatus::Fail;
    wp.round.failed |= failed_now;
    let complete = wp.round.terminal >= wp.quorum || (wp.fail_fast && failed_now);
    if !complete {
        return None;
    }
    let outcome = if wp.round.failed {
        Outcome::Fail
    } else {
        Outcome::Ok
    };
    let first_seq = wp.round.start_seq.max(1);
    wp.counters.rounds += 1;
    wp.round = Round {
        start_seq: rec.seq + 1,
        ..Round::default()
    };
    // Wakes sent so far, plus the one this round starts (none when it folds into a held wake).
    let starts_a_wake = wp.pending_wake.is_none();
    let kind = if starts_a_wake && wp.counters.wakes + 1 >= u64::from(wp.max_signals) {
        wp.status = Status::Resolved;
        wp.outcome = Some(outcome);
        wp.resolved_at = Some(rec.received_at);
        WakeKind::Resolved
    } else {
        WakeKind::Report
    };
    Some(CompletedRound {
        kind,
        first_seq,
        outcome,
    })
}

/// When the sliding-hour cap has room again, or `None` when it has room now. Forgets wakes
/// older than an hour and records the cap it weighed (what the views show) as side effects.
pub fn cap_frees_at(wp: &mut Waitpoint, now: Timestamp, cap: u32) -> Option<Timestamp> {
    wp.wake_cap = Some(cap);
    wp.recent_wakes
        .retain(|t| now.as_millis().saturating_sub(t.as_millis()) < HOUR_MS);
    let cap = cap.max(1) as usize;
    let n = wp.recent_wakes.len();
    (n >= cap).then(|| wp.recent_wakes[n - cap].plus_ms(HOUR_MS))
}

/// Decides when a completed round's wake goes out. Returns the round back when it should be
/// sent now; otherwise it becomes (or folds into) the pending wake.
pub fn schedule_wake(
    wp: &mut Waitpoint,
    done: CompletedRound,
    now: Timestamp,
    cap: u32,
) -> Option<CompletedRound> {
    if let Some(p) = &mut wp.pending_wake {
        if done.kind == WakeKind::Resolved {
            p.kind = WakeKind::Resolved;
        }
        if done.outcome == Outcome::Fail {
            p.outcome = Outcome::Fail;
        }
        p.rounds += 1;
        return None;
    }
    let hold = |reason, due_at| PendingWake {
        reason,
        due_at,
        kind: done.kind,
        outcome: done.outcome,
        first_seq: done.first_seq,
        rounds: 1,
    };
    if wp.quorum > 1 {
        wp.pending_wake = Some(hold(HoldReason::Grace, now.plus_ms(GRACE_MS)));
        return None;
    }
    if let Some(at) = cap_frees_at(wp, now, cap) {
        wp.pending_wake = Some(hold(HoldReason::WakeLimit, at));
        return None;
    }
    Some(done)
}

/// Whether the pending wake should go out at `now`. A grace window that ends while the cap is
/// spent turns into a cap hold; a cap hold waits until the hour has room.
pub fn release_pending(wp: &mut Waitpoint, now: Timestamp, cap: u32) -> Option<PendingWake> {
    let due = wp.pending_wake.as_ref()?.due_at;
    if due > now {
        return None;
    }
    if let Some(at) = cap_frees_at(wp, now, cap) {
        let p = wp.pending_wake.as_mut()?;
        p.reason = HoldReason::WakeLimit;
        p.due_at = at;
        return None;
    }
    wp.pending_wake.take()
}

/// Expires an armed waitpoint whose deadline has passed. `pending` are the signals no wake has
/// carried yet (a report held back by the cap included). Returns the deadline notice for the
/// wake.
pub fn expire(wp: &mut Waitpoint, pending: &[SignalRecord], now: Timestamp) -> DeadlineNotice {
    let terminal: Vec<&SignalRecord> = pending.iter().filter(|s| s.status.is_terminal()).collect();
    let last_heartbeat = pending
        .iter()
        .rev()
        .find(|s| s.status == SignalStatus::Progress)
        .map(fact);
    let mut reported: Vec<String> = Vec::new();
    for s in &terminal {
        if let Some(m) = &s.member
            && !reported.contains(m)
        {
            reported.push(m.clone());
        }
    }
    let missing: Vec<String> = wp
        .members
        .iter()
        .filter(|m| !reported.contains(m))
        .cloned()
        .collect();
    let case = if wp.max_signals > 1 {
        DeadlineCase::MonitorEnded
    } else if pending.is_empty() {
        DeadlineCase::NobodyReported
    } else if terminal.is_empty() {
        DeadlineCase::OnlyHeartbeats
    } else if !wp.members.is_empty() {
        DeadlineCase::SomeMembers
    } else {
        DeadlineCase::QuorumNotMet
    };
    let notice = DeadlineNotice {
        case,
        reported,
        missing,
        last_heartbeat,
        wakes_sent: wp.counters.wakes,
    };
    wp.status = Status::Expired;
    wp.resolved_at = Some(now);
    wp.pending_wake = None;
    notice
}

pub(super) fn fact(s: &SignalRecord) -> ReportFact {
    ReportFact {
        seq: s.seq,
        source: s.source.clone(),
        status: s.status,
        member: s.member.clone(),
        received_at: s.received_at,
    }
}

fn who(s: &SignalRecord) -> String {
    match &s.member {
        Some(m) => format!("{} {}", escape::name(m), s.status.as_str()),
        None => s.status.as_str().to_owned(),
    }
}

/// Builds the next wake (counting it in `counters.wakes` and the cap's window), carrying
/// `signals`. `rounds` is how many reports it carries (more than one when the cap folded them).
pub fn compose_wake(
    wp: &mut Waitpoint,
    kind: WakeKind,
    outcome: Option<Outcome>,
    signals: &[SignalRecord],
    deadline: Option<DeadlineNotice>,
    rounds: u64,
    now: Timestamp,
) -> Wake {
    wp.counters.wakes += 1;
    wp.recent_wakes.push(now);
    let wp = &*wp;
    let waited_ms = now.millis_since(wp.created_at);
    let waited = human_duration(waited_ms);
    let outcome_word = match outcome {
        Some(Outcome::Ok) => "ok",
        Some(Outcome::Fail) => "FAILED",
        None => "",
    };
    let reports: Vec<ReportFact> = signals.iter().map(fact).collect();
    let reporters = signals.iter().map(who).collect::<Vec<_>>().join(", ");
    let headline = match (kind, &deadline) {
        (WakeKind::Resolved, _) => format!("resolved {outcome_word} after {waited}"),
        (WakeKind::Report, _) if rounds > 1 => format!(
            "wake {} of {} ({outcome_word}) after {waited}; the hourly wake limit or the grace \
window folded {rounds} reports into it",
            wp.counters.wakes, wp.max_signals
        ),
        (WakeKind::Report, _) => format!(
            "wake {} of {} ({outcome_word}) after {waited}",
            wp.counters.wakes, wp.max_signals
        ),
        (WakeKind::Deadline, Some(n)) => deadline_headline(wp, n, signals.len(), &waited),
        (WakeKind::Deadline, None) => format!("deadline passed after {waited}"),
        (WakeKind::Recheck, _) => format!(
            "recheck: nothing terminal has arrived after {waited}; it is still armed \
(deadline {})",
            wp.expires_at
        ),
        (
            WakeKind::Timer
            | WakeKind::WakeHint
            | WakeKind::EnqueueMessage
            | WakeKind::NotStarted
            | WakeKind::WentQuiet
            | WakeKind::DeviceUnreachable,
            _,
        ) => {
            format!("{} after {waited}", kind.as_str())
        }
    };
    let label = escape::line(&wp.label);
    let summary = if reporters.is_empty() {
        format!("{label}: {headline}")
    } else {
        format!("{label}: {headline} — {reporters}")
    };
    let external = external_payload(signals);
    let mut text = format!("Waitpoint {} \"{label}\": {headline}.\n", wp.id);
    if !reports.is_empty() {
        text.push_str("Reported: ");
        let lines: Vec<String> = signals
            .iter()
            .map(|s| {
                let source = escape::name(&s.source);
                format!("{} (via {source}, {})", who(s), s.received_at)
            })
            .collect();
        text.push_str(&lines.join("; "));
        text.push('\n');
    }
    push_intent_and_payload(&mut text, wp, &external);
    Wake {
        wake_id: wp.wake_id(wp.counters.wakes),
        kind,
        created_at: now,
        session: wp.session.clone(),
        channel: wp.channel.clone(),
        timer: None,
        callback: None,
        waitpoint: Some(WakeSubject {
            id: wp.id.clone(),
            label: wp.label.clone(),
            intent: wp.intent.clone(),
            status: wp.status,
            outcome,
        }),
        waited_ms,
        summary,
        reports,
        deadline,
        external_payload: external,
        text,
    }
}

/// What the senders of `signals` wrote, kept apart and labelled as data.
pub(super) fn external_payload(signals: &[SignalRecord]) -> ExternalPayload {
    ExternalPayload {
        notice: EXTERNAL_NOTICE.to_owned(),
        reports: signals
            .iter()
            .filter(|s| s.message.is_some() || s.data.is_some())
            .map(|s| ExternalReport {
                seq: s.seq,
                member: s.member.clone(),
                message: s.message.clone(),
                data: s.data.clone(),
            })
            .collect(),
    }
}

/// The end every waitpoint wake's text shares: the intent the agent wrote, then the senders'
/// words inside the external-payload frame, quoted line by line.
pub(super) fn push_intent_and_payload(
    text: &mut String,
    wp: &Waitpoint,
    external: &ExternalPayload,
) {
    text.push_str(&format!(
        "Intent you wrote when arming it: {}\n",
        escape::text(&wp.intent)
    ));
    if external.reports.is_empty() {
        return;
    }
    text.push_str(&format!("\nExternal payload. {EXTERNAL_NOTICE}\n"));
    for r in &external.reports {
        let tag = r.member.as_deref().map_or("signal".into(), escape::name);
        if let Some(m) = &r.message {
            text.push_str(&format!(
                "  [{} {tag}] message: {}\n",
                r.seq,
                escape::quoted(m)
            ));
        }
        if let Some(d) = &r.data {
            text.push_str(&format!("  [{} {tag}] data: {}\n", r.seq, escape::json(d)));
        }
    }
}

/// Member names as a deadline's headline lists them.
fn names(members: &[String]) -> String {
    members
        .iter()
        .map(|m| escape::name(m))
        .collect::<Vec<_>>()
        .join(", ")
}

fn deadline_headline(wp: &Waitpoint, n: &DeadlineNotice, pending: usize, waited: &str) -> String {
    match n.case {
        DeadlineCase::NobodyReported => format!("deadline passed after {waited}; nobody reported"),
        DeadlineCase::OnlyHeartbeats => format!(
            "deadline passed after {waited}; only heartbeats arrived ({pending}), no result"
        ),
        DeadlineCase::SomeMembers => format!(
            "deadline passed after {waited}; only some members reported (reported: {}; missing: {})",
            names(&n.reported),
            names(&n.missing)
        ),
        DeadlineCase::QuorumNotMet => format!(
            "deadline passed after {waited}; {} of {} required reports arrived",
            wp.round.terminal, wp.quorum
        ),
        DeadlineCase::MonitorEnded => format!(
            "monitor reached its deadline after {waited}; it woke you {} time(s){}",
            n.wakes_sent,
            if pending > 0 {
                format!(", and {pending} report(s) had not reached you yet")
            } else {
                String::new()
            }
        ),
    }
}
