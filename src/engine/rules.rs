//! The waitpoint state machine as pure functions: who may report, what a signal does to the
//! state, and what a wake says. No I/O here, so the rules can be tested (and later modelled)
//! without a filesystem.

use crate::clock::{Timestamp, human_duration};
use crate::escape;
use crate::records::{
    DeadlineCase, DeadlineNotice, EXTERNAL_NOTICE, ExternalPayload, ExternalReport, HoldReason,
    Outcome, PendingWake, ReportFact, Round, SignalRecord, SignalStatus, Status, Waitpoint, Wake,
    WakeDigest, WakeKind, WakeSubject,
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

/// The log keeps the first this many heartbeats of a waitpoint whole; later ones lose their
/// data, and past the log's bounds are folded into counts (`LogSummary`).
pub const LOG_KEEP_HEARTBEATS: u64 = 16;
/// The records, and the bytes of their lines, that the log keeps in all. Past either, a signal
/// is folded unless a wake must carry it (a report that counts toward a wake not already
/// held), so the final report is never lost, and the log stays small enough to read.
pub const LOG_KEEP_RECORDS: u64 = 1_000;
pub const LOG_KEEP_BYTES: u64 = 4 * 1024 * 1024;
/// Folded signals the state keeps with their message, newest last.
pub const LOG_RECENT: usize = 3;
/// Folded identities the state remembers for de-duplication: more than one commit decides for
/// one waitpoint ([`super::MAX_SIGNALS_PER_WAITPOINT`]), so a signal a crash brings back
/// with its batch is a duplicate.
pub const LOG_KEYS: usize = 256;
/// The most reports (terminal signals) and heartbeats one wake carries; the rest are counted
/// and `waitpoint show` lists what the log kept.
pub const WAKE_REPORTS: usize = 24;
pub const WAKE_HEARTBEATS: usize = 3;

/// Where a waitpoint stood before a signal was applied, as [`keep_whole`] needs it.
#[derive(Debug, Clone, Copy)]
pub struct Before {
    terminal: u32,
    rounds: u64,
    held: bool,
}

impl Before {
    pub fn of(wp: &Waitpoint) -> Self {
        Before {
            terminal: wp.round.terminal,
            rounds: wp.counters.rounds,
            held: wp.pending_wake.is_some(),
        }
    }
}

/// What a folded signal's identity key is remembered as: a short digest, so the state stays
/// small whatever the keys are.
pub fn folded_key(key: &str) -> String {
    crate::secret::hash(key)[..16].to_owned()
}

/// Whether `key` is the identity of a signal the log folded (among the newest remembered).
pub fn is_folded(wp: &Waitpoint, key: &str) -> bool {
    !wp.log.keys.is_empty() && wp.log.keys.contains(&folded_key(key))
}

/// How the log keeps a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Its line, whole.
    Whole,
    /// Its line without the sender's `data` (`data_dropped`).
    WithoutData,
    /// No line: counted and summed up in the state's `log`.
    Folded,
}

/// Decides how the log keeps `rec`, just applied to `wp` (which stood at `before`), and notes
/// it in `wp.log`. `line_bytes` is the size of its whole line, `slim_bytes` of its line without
/// data; `key` is its identity key.
///
/// Whole: the first [`LOG_KEEP_HEARTBEATS`] heartbeats and any report while the log is under
/// [`LOG_KEEP_RECORDS`] and [`LOG_KEEP_BYTES`], and past them a report that counted toward a
/// wake not already held (the bound is then the wakes themselves). Without its data: anything
/// else while the log is under its bounds. Folded: the rest, counted, its identity remembered,
/// the newest [`LOG_RECENT`] kept in the state without their data.
pub fn keep_whole(
    wp: &mut Waitpoint,
    before: Before,
    rec: &SignalRecord,
    (line_bytes, slim_bytes): (u64, impl FnOnce() -> u64),
    key: &str,
) -> Keep {
    let counted = wp.counters.rounds > before.rounds || wp.round.terminal > before.terminal;
    if rec.status == SignalStatus::Progress {
        wp.log.last_heartbeat = Some(without_data(rec));
    }
    let log = &wp.log;
    let carried = rec.status.is_terminal() && counted && !before.held;
    let room = log.kept < LOG_KEEP_RECORDS;
    let fits = |bytes: u64| log.kept_bytes.saturating_add(bytes) <= LOG_KEEP_BYTES;
    let whole = rec.status.is_terminal() || log.kept_progress < LOG_KEEP_HEARTBEATS;
    if carried || (room && whole && fits(line_bytes)) {
        note_kept(wp, rec, line_bytes);
        return Keep::Whole;
    }
    if room {
        let slim = slim_bytes();
        if fits(slim) {
            note_kept(wp, rec, slim);
            return Keep::WithoutData;
        }
    }
    let log = &mut wp.log;
    match rec.status {
        SignalStatus::Ok => log.folded_ok += 1,
        SignalStatus::Fail => log.folded_fail += 1,
        SignalStatus::Progress => log.folded_progress += 1,
    }
    if log.first_folded.is_none() {
        log.first_folded = Some(fact(rec));
    }
    log.recent.push(without_data(rec));
    if log.recent.len() > LOG_RECENT {
        log.recent.remove(0);
    }
    log.keys.push(folded_key(key));
    if log.keys.len() > LOG_KEYS {
        log.keys.remove(0);
    }
    Keep::Folded
}

/// `rec` as the log keeps it past its bounds: without the sender's data, and saying so.
pub fn without_data(rec: &SignalRecord) -> SignalRecord {
    SignalRecord {
        data_dropped: rec.data.is_some(),
        data: None,
        ..rec.clone()
    }
}

/// Counts `rec` among the records the log keeps whole (its line is `line_bytes` long).
pub fn note_kept(wp: &mut Waitpoint, rec: &SignalRecord, line_bytes: u64) {
    let log = &mut wp.log;
    log.kept += 1;
    log.kept_bytes = log.kept_bytes.saturating_add(line_bytes);
    if !rec.status.is_terminal() {
        log.kept_progress += 1;
    }
}

/// The signals a wake is about: every one from `first_seq` on (`seq` counts folded ones too),
/// of which `records` are at hand, in `seq` order: those the log kept and the folded ones the
/// state still holds.
#[derive(Debug, Clone, Default)]
pub struct Carried {
    pub first_seq: u64,
    pub records: Vec<SignalRecord>,
}

impl Carried {
    /// How many signals arrived from `first_seq` up to `wp`'s newest.
    pub fn count(&self, wp: &Waitpoint) -> u64 {
        (wp.counters.signals + 1).saturating_sub(self.first_seq.max(1))
    }

    /// What one wake shows of them: the newest [`WAKE_REPORTS`] reports and the newest
    /// [`WAKE_HEARTBEATS`] heartbeats, in `seq` order.
    pub fn shown(&self) -> Vec<&SignalRecord> {
        let newest = |terminal: bool, n: usize| {
            self.records
                .iter()
                .rev()
                .filter(move |s| s.status.is_terminal() == terminal)
                .take(n)
        };
        let mut out: Vec<&SignalRecord> = newest(true, WAKE_REPORTS)
            .chain(newest(false, WAKE_HEARTBEATS))
            .collect();
        out.sort_by_key(|s| s.seq);
        out
    }
}

/// A round that a signal completed: the signals from `first_seq` on go into its wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedRound {
    pub kind: WakeKind,
    pub first_seq: u64,
    pub outcome: Outcome,
    /// Completed by a failure with `fail_fast` on: its wake goes out at once, with no grace
    /// window ("the first failure wakes you immediately").
    pub failed_fast: bool,
}

/// Applies an accepted signal (whose `seq` is the next one).
///
/// `progress` is recorded and wakes nobody. A terminal signal counts toward the round's quorum
/// (once per member when members are named); the round completes at the quorum, or at once on a
/// `fail` when `fail_fast` is on. `max_signals` is how many times the waitpoint may wake you
/// (the spec's words): a round that starts the `max_signals`th wake resolves it; earlier ones keep
/// a monitor open, and a round that folds into a wake already held (the grace window, the hourly
/// cap) starts no wake of its own, so it resolves nothing. A signal that reaches a waitpoint no
/// longer armed (only possible inside the grace window) is recorded and carried by the pending
/// wake, and changes nothing else.
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
        failed_fast: wp.fail_fast && failed_now,
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
    if wp.quorum > 1 && !done.failed_fast {
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
/// carried yet (a report held back by the cap included), folded ones counted. Returns the deadline
/// notice for the wake.
pub fn expire(wp: &mut Waitpoint, pending: &Carried, now: Timestamp) -> DeadlineNotice {
    let arrived = pending.count(wp);
    let pending = &pending.records;
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
    } else if arrived == 0 {
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

/// Builds the next wake (counting it in `counters.wakes` and the cap's window), carrying a
/// bounded digest of `carried` ([`Carried::shown`], and how many arrived in all). `rounds` is
/// how many reports it carries (more than one when the cap folded them).
pub fn compose_wake(
    wp: &mut Waitpoint,
    kind: WakeKind,
    outcome: Option<Outcome>,
    carried: &Carried,
    deadline: Option<DeadlineNotice>,
    rounds: u64,
    now: Timestamp,
) -> Wake {
    let arrived = carried.count(wp);
    let signals: Vec<SignalRecord> = carried.shown().into_iter().cloned().collect();
    let signals = &signals[..];
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
        (WakeKind::Deadline, Some(n)) => deadline_headline(wp, n, arrived, &waited),
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
    let digest = (arrived > signals.len() as u64).then_some(WakeDigest {
        signals: arrived,
        shown: signals.len() as u64,
    });
    if let Some(d) = &digest {
        text.push_str(&format!(
            "Signals: {} arrived for this wake; shown here are the newest {} (at most \
             {WAKE_REPORTS} \
reports and {WAKE_HEARTBEATS} heartbeats); the rest are counted, and `waitpoint show {}` lists \
every one the log kept.\n",
            d.signals, d.shown, wp.id
        ));
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
        digest,
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

fn deadline_headline(wp: &Waitpoint, n: &DeadlineNotice, pending: u64, waited: &str) -> String {
    match n.case {
        DeadlineCase::NobodyReported => format!("deadline passed after {waited}; nobody reported"),
        DeadlineCase::OnlyHeartbeats => format!(
            "deadline passed after {waited}; only heartbeats arrived ({pending}), no result"
        ),
        DeadlineCase::SomeMembers => format!(
            "deadline passed after {waited}; only some members reported (reported: {}; missing: \
             {})",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::test_record;

    /// A one-shot waitpoint, armed, with no signal yet (the layouts' example, reset).
    fn armed(max_signals: u32) -> Waitpoint {
        let mut wp: Waitpoint =
            serde_json::from_str(include_str!("../../layouts/waitpoint.example.json")).unwrap();
        wp.members.clear();
        wp.quorum = 1;
        wp.max_signals = max_signals;
        wp.status = Status::Armed;
        wp.outcome = None;
        wp.resolved_at = None;
        wp.counters = Default::default();
        wp.round = Round {
            start_seq: 1,
            ..Round::default()
        };
        wp.pending_wake = None;
        wp.recent_wakes.clear();
        wp.log = Default::default();
        wp
    }

    fn signal(seq: u64, status: SignalStatus) -> SignalRecord {
        SignalRecord {
            status,
            message: Some(format!("report {seq}")),
            data: Some(serde_json::json!({ "step": seq })),
            ..test_record(seq, &format!("spool:{seq}.json"))
        }
    }

    /// Applies `rec` as the engine does and says how the log keeps it.
    fn apply(wp: &mut Waitpoint, rec: &SignalRecord, bytes: u64) -> Keep {
        let before = Before::of(wp);
        apply_signal(wp, rec);
        keep_whole(wp, before, rec, (bytes, || bytes / 2), &rec.source)
    }

    #[test]
    fn the_first_heartbeats_are_kept_whole_then_without_data_then_folded_into_counts() {
        let mut wp = armed(1);
        let n = LOG_KEEP_RECORDS + 40;
        let kept: Vec<Keep> = (1..=n)
            .map(|seq| apply(&mut wp, &signal(seq, SignalStatus::Progress), 100))
            .collect();
        let whole = LOG_KEEP_HEARTBEATS as usize;
        let limit = LOG_KEEP_RECORDS as usize;
        assert!(kept[..whole].iter().all(|k| *k == Keep::Whole));
        assert!(kept[whole..limit].iter().all(|k| *k == Keep::WithoutData));
        assert!(kept[limit..].iter().all(|k| *k == Keep::Folded));
        assert_eq!(wp.counters.progress, n);
        assert_eq!(wp.log.kept, LOG_KEEP_RECORDS);
        assert_eq!(wp.log.folded_progress, 40);
        assert_eq!(
            wp.log.first_folded.as_ref().map(|f| f.seq),
            Some(LOG_KEEP_RECORDS + 1)
        );
        let recent: Vec<u64> = wp.log.recent.iter().map(|r| r.seq).collect();
        assert_eq!(recent, [n - 2, n - 1, n]);
        assert!(
            wp.log
                .recent
                .iter()
                .all(|r| r.data.is_none() && r.data_dropped)
        );
        assert!(is_folded(&wp, &format!("spool:{n}.json")));
        assert!(
            !is_folded(&wp, "spool:3.json"),
            "a kept one is found in the log"
        );
    }

    #[test]
    fn the_logs_byte_bound_drops_data_before_it_folds() {
        let mut wp = armed(1);
        assert_eq!(
            apply(
                &mut wp,
                &signal(1, SignalStatus::Progress),
                LOG_KEEP_BYTES - 60
            ),
            Keep::Whole
        );
        // 100 bytes whole do not fit; 50 without data do.
        assert_eq!(
            apply(&mut wp, &signal(2, SignalStatus::Progress), 100),
            Keep::WithoutData
        );
        assert_eq!(
            apply(&mut wp, &signal(3, SignalStatus::Progress), 100),
            Keep::Folded
        );
    }

    #[test]
    fn past_the_log_bounds_a_report_a_wake_must_carry_is_kept_one_for_a_held_wake_is_folded() {
        let mut wp = armed(100);
        // The byte budget spent by one report.
        assert_eq!(
            apply(&mut wp, &signal(1, SignalStatus::Ok), LOG_KEEP_BYTES),
            Keep::Whole
        );
        // The next completes a round that starts a wake of its own: carried, so kept whole.
        assert_eq!(
            apply(&mut wp, &signal(2, SignalStatus::Ok), 100),
            Keep::Whole
        );
        // With a wake held (the hourly cap), a round folds into it: folded.
        wp.pending_wake = Some(PendingWake {
            reason: HoldReason::WakeLimit,
            due_at: Timestamp::from_millis(0),
            kind: WakeKind::Report,
            outcome: Outcome::Ok,
            first_seq: 3,
            rounds: 1,
        });
        assert_eq!(
            apply(&mut wp, &signal(3, SignalStatus::Ok), 100),
            Keep::Folded
        );
        assert_eq!(wp.log.folded_ok, 1);
        assert_eq!(wp.counters.ok, 3);
    }

    #[test]
    fn a_wake_shows_the_newest_reports_and_heartbeats_and_counts_the_rest() {
        let mut wp = armed(1);
        let records: Vec<SignalRecord> = (1..=200)
            .map(|seq| {
                let status = match seq % 2 {
                    0 => SignalStatus::Ok,
                    _ => SignalStatus::Progress,
                };
                signal(seq, status)
            })
            .collect();
        wp.counters.signals = 250;
        let carried = Carried {
            first_seq: 1,
            records,
        };
        let shown = carried.shown();
        assert_eq!(carried.count(&wp), 250);
        let heartbeats: Vec<u64> = shown
            .iter()
            .filter(|s| !s.status.is_terminal())
            .map(|s| s.seq)
            .collect();
        assert_eq!(heartbeats, [195, 197, 199]);
        let reports = shown.iter().filter(|s| s.status.is_terminal()).count();
        assert_eq!(reports, WAKE_REPORTS);
        assert!(shown.windows(2).all(|w| w[0].seq < w[1].seq));
        let wake = compose_wake(
            &mut wp,
            WakeKind::Resolved,
            Some(Outcome::Ok),
            &carried,
            None,
            1,
            Timestamp::from_millis(0),
        );
        assert_eq!(
            wake.digest,
            Some(WakeDigest {
                signals: 250,
                shown: (WAKE_REPORTS + WAKE_HEARTBEATS) as u64
            })
        );
        assert_eq!(wake.reports.len(), WAKE_REPORTS + WAKE_HEARTBEATS);
    }
}
