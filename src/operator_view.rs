//! The operator's view, rendered for a terminal: `check` (table and one-line brief), `show`, and
//! the badges that make silent failures visible. Pure functions of the records and `now`, so the
//! output can be snapshot-tested with a fixed clock; `--json` carries the same facts.

use serde::Serialize;
use serde_json::Value;

use crate::clock::{Timestamp, human_duration};
use crate::delivery;
use crate::engine::{self, rules::HOUR_MS};
use crate::escape;
use crate::home::Home;
use crate::ingress::device::{Device, DeviceStatus};
use crate::records::{HoldReason, Outcome, SignalRecord, Status, Timer, Waitpoint};

/// A badge on a waiting item: each one a way a wake can fail silently, or a failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Badge {
    /// `wake_limit`, `delivery_retrying`, `wakes_this_hour`, `failure`, `quiet`, `unread`,
    /// `refused`.
    pub kind: &'static str,
    pub text: String,
    /// What a hover shows: for `delivery_retrying`, the last attempt's error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Whether it puts the attention dot on the one-line summary.
    pub attention: bool,
}

/// One row of `check`.
#[derive(Debug, Clone, Serialize)]
pub struct CheckItem {
    pub id: String,
    pub label: String,
    pub status: Status,
    pub progress: String,
    pub received: u32,
    pub needed: u32,
    pub expires_at: Timestamp,
    pub time_left: String,
    /// Fired or expired, and its wake still on its way to the session (not yet read there):
    /// shown as "delivering", never with a deadline.
    pub delivering: bool,
    pub badges: Vec<Badge>,
    /// The newest `progress` report, if any: a heartbeat shows up when you next look.
    pub latest_heartbeat: Option<Heartbeat>,
    /// With a silence watch: the last report of any status, and how long ago it came.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_report: Option<LastReportView>,
}

/// The last report of a waitpoint with a silence watch, as `check` and `show` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LastReportView {
    pub at: Timestamp,
    /// How long ago, in words (`3m 2s ago`).
    pub age: String,
    pub status: &'static str,
}

impl LastReportView {
    pub fn of(wp: &Waitpoint, now: Timestamp) -> Option<LastReportView> {
        let last = wp.silence.last_report.as_ref()?;
        Some(LastReportView {
            at: last.at,
            age: time_left(last.at, now),
            status: last.status.as_str(),
        })
    }
}

/// The `quiet` badge: which silence, and for how long.
fn quiet_text(wp: &Waitpoint, now: Timestamp) -> String {
    let s = &wp.silence;
    match &s.last_report {
        Some(last) => format!(
            "quiet: no report for {} (heartbeat_within {})",
            human_duration(now.millis_since(last.at)),
            human_duration(s.heartbeat_within_ms.unwrap_or(0) as i64)
        ),
        None => format!(
            "not started: nothing reported in {} since it was armed",
            human_duration(now.millis_since(wp.created_at))
        ),
    }
}

/// A waitpoint's newest `progress` report, as `check` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Heartbeat {
    pub at: Timestamp,
    /// How long ago, in words (`3m 2s ago`).
    pub age: String,
    pub member: Option<String>,
    /// The sender's text, exact: external data. The terminal views and `wait_check`'s text show
    /// it clipped and spelled out by the one rule (`escape`).
    pub message: Option<String>,
}

impl Heartbeat {
    pub fn of(s: &SignalRecord, now: Timestamp) -> Heartbeat {
        Heartbeat {
            at: s.received_at,
            age: time_left(s.received_at, now),
            member: s.member.clone(),
            message: s.message.clone(),
        }
    }

    /// `heartbeat 3m ago (arm2): step 12000`, on one line.
    fn line(&self, width: usize) -> String {
        let mut text = format!("heartbeat {}", self.age);
        if let Some(m) = &self.member {
            text.push_str(&format!(" ({})", escape::name(m)));
        }
        if let Some(msg) = &self.message {
            text.push_str(&format!(": {}", clip(&visible(msg), width)));
        }
        text
    }
}

/// `s` for one line of a terminal: every character that could move the cursor, redraw the
/// screen, write the clipboard (OSC 52) or reorder the text is shown as `\u{…}`, so text from
/// outside (labels, intents, sources, messages, file names, hook errors) reads as what it is.
/// Every terminal view passes such text through here or [`visible_text`] (the one rule,
/// [`escape`]), once; JSON output keeps exact values (its text spells them as JSON escapes,
/// `escape::json_text`).
pub fn visible(s: &str) -> std::borrow::Cow<'_, str> {
    escape::line(s)
}

/// Like [`visible`], for text of several lines (a wake's text): its newlines and tabs stay.
pub fn visible_text(s: &str) -> String {
    escape::text(s)
}

/// Terminal styling: ANSI colour or plain text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    pub color: bool,
}

impl Style {
    fn paint(self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
}

/// `1/3 received`: terminal reports counted toward the current round's quorum.
pub fn progress(wp: &Waitpoint) -> String {
    let (got, need) = received(wp);
    if wp.max_signals > 1 && need > 1 {
        format!(
            "{}/{} reports · {got}/{need} received",
            wp.counters.rounds, wp.max_signals
        )
    } else if wp.max_signals > 1 {
        format!("{}/{} reports", wp.counters.rounds, wp.max_signals)
    } else {
        format!("{got}/{need} received")
    }
}

fn received(wp: &Waitpoint) -> (u32, u32) {
    // A one-shot's round reset when it completed, so what it received is what its counters
    // say: a fail-fast barrier resolved by one failure of two received 1, not 2.
    let got = if wp.status == Status::Resolved && wp.max_signals == 1 {
        let terminal = wp.counters.ok.saturating_add(wp.counters.fail);
        u32::try_from(terminal).unwrap_or(u32::MAX).min(wp.quorum)
    } else {
        wp.round.terminal.min(wp.quorum)
    };
    (got, wp.quorum)
}

/// `in 3h 2m` or `5m 0s ago`.
pub fn time_left(at: Timestamp, now: Timestamp) -> String {
    if at > now {
        format!("in {}", human_duration(at.millis_since(now)))
    } else {
        format!("{} ago", human_duration(now.millis_since(at)))
    }
}

/// Wakes sent in the trailing hour.
pub fn wakes_this_hour(wp: &Waitpoint, now: Timestamp) -> usize {
    wp.recent_wakes
        .iter()
        .filter(|t| now.as_millis().saturating_sub(t.as_millis()) < HOUR_MS)
        .count()
}

/// The badges of a waitpoint, most urgent first. `cap` is this process's setting, used only
/// until the daemon has weighed a wake of `wp` and recorded the cap it applies.
pub fn badges(home: &Home, wp: &Waitpoint, cap: u32, now: Timestamp) -> Vec<Badge> {
    let cap = wp.wake_cap.unwrap_or(cap);
    let mut out = Vec::new();
    if wp
        .pending_wake
        .as_ref()
        .is_some_and(|p| p.reason == HoldReason::WakeLimit)
    {
        out.push(Badge {
            kind: "wake_limit",
            text: format!(
                "wake limit reached ({cap}/h) — the next wake waits until the hour clears"
            ),
            detail: None,
            attention: true,
        });
    }
    if let Some(h) = wp
        .hook_deliveries
        .iter()
        .filter(|h| h.is_pending() && h.attempts > 0)
        .max_by_key(|h| h.attempts)
    {
        out.push(Badge {
            kind: "delivery_retrying",
            text: format!("delivery retrying · {} attempts", h.attempts),
            detail: h.last_error.clone(),
            attention: true,
        });
    }
    let n = wakes_this_hour(wp, now);
    if cap >= 2 && n as u32 >= cap - 2 && n > 0 {
        out.push(Badge {
            kind: "wakes_this_hour",
            text: format!("{n}/{cap} wakes this hour"),
            detail: None,
            attention: true,
        });
    }
    if wp.counters.fail > 0 {
        out.push(Badge {
            kind: "failure",
            text: if wp.counters.fail == 1 {
                "failure reported".to_owned()
            } else {
                format!("{} failures reported", wp.counters.fail)
            },
            detail: None,
            attention: true,
        });
    }
    if wp.status == Status::Armed && engine::silence::is_quiet(wp) {
        out.push(Badge {
            kind: "quiet",
            text: quiet_text(wp, now),
            detail: None,
            attention: true,
        });
    }
    if wp.status != Status::Armed && delivery::has_undelivered_wake(home, wp) {
        out.push(Badge {
            kind: "unread",
            text: "wake not yet read".to_owned(),
            detail: None,
            attention: false,
        });
    }
    out
}

/// The badge of a waitpoint `n` of whose signals were refused (see `agent_view::add_refusals`).
pub fn refused_badge(n: usize) -> Badge {
    Badge {
        kind: "refused",
        text: format!(
            "{n} signal{} refused — see tmp/signals/bad/ (each file's .reason says why)",
            if n == 1 { "" } else { "s" }
        ),
        detail: None,
        attention: true,
    }
}

/// The rows of `check` for the waitpoints a session waits on.
pub fn check_items(
    home: &Home,
    items: &[Waitpoint],
    heartbeats: &[Option<SignalRecord>],
    cap: u32,
    now: Timestamp,
) -> Vec<CheckItem> {
    items
        .iter()
        .enumerate()
        .map(|(i, wp)| {
            let (received, needed) = received(wp);
            CheckItem {
                id: wp.id.clone(),
                label: wp.label.clone(),
                status: wp.status,
                progress: progress(wp),
                received,
                needed,
                expires_at: wp.expires_at,
                time_left: time_left(wp.expires_at, now),
                delivering: wp.status != Status::Armed,
                badges: badges(home, wp, cap, now),
                latest_heartbeat: heartbeats
                    .get(i)
                    .and_then(Option::as_ref)
                    .map(|s| Heartbeat::of(s, now)),
                last_report: LastReportView::of(wp, now),
            }
        })
        .collect()
}

/// The `check` table.
pub fn check_table(session: &str, items: &[CheckItem], style: Style) -> String {
    if items.is_empty() {
        return format!("session {session} is waiting on nothing\n");
    }
    let mut out = format!(
        "{:<16} {:<24} {:<9} {:<28} DEADLINE\n",
        "ID", "LABEL", "STATUS", "PROGRESS"
    );
    for it in items {
        let deadline = if it.delivering {
            "delivering".to_owned()
        } else {
            format!("expires {}", it.time_left)
        };
        out.push_str(&format!(
            "{:<16} {:<24} {:<9} {:<28} {deadline}\n",
            it.id,
            clip(&visible(&it.label), 24),
            it.status.as_str(),
            it.progress,
        ));
        for b in &it.badges {
            let text = match (b.kind, &b.detail) {
                ("failure", _) => style.paint("1;31", &format!("✖ {}", b.text)),
                ("unread", _) => style.paint("2", &b.text),
                (_, Some(detail)) => style.paint(
                    "33",
                    &format!("▲ {} — last error: {}", b.text, clip(&visible(detail), 60)),
                ),
                (_, None) => style.paint("33", &format!("▲ {}", b.text)),
            };
            out.push_str(&format!("{:16} {text}\n", ""));
        }
        if let Some(h) = &it.latest_heartbeat {
            let text = style.paint("2", &format!("♥ {}", h.line(60)));
            out.push_str(&format!("{:16} {text}\n", ""));
        }
        if let Some(r) = &it.last_report {
            let text = style.paint("2", &format!("last report {} ({})", r.age, r.status));
            out.push_str(&format!("{:16} {text}\n", ""));
        }
    }
    out
}

/// The one-line summary for shell prompts and status bars (the spec's capsule): the armed
/// waitpoints, and a fired or expired one only while its wake is still being delivered, said as
/// such. Empty when there is neither, so an ordinary session shows nothing at all.
pub fn check_brief(items: &[CheckItem]) -> String {
    let dot = if items.iter().any(|i| i.badges.iter().any(|b| b.attention)) {
        "● "
    } else {
        ""
    };
    let (delivering, armed): (Vec<&CheckItem>, Vec<&CheckItem>) =
        items.iter().partition(|i| i.delivering);
    let also = match delivering.len() {
        0 => String::new(),
        n => format!(" · {n} delivering"),
    };
    let line = match (armed.as_slice(), delivering.as_slice()) {
        ([], []) => return String::new(),
        ([one], _) => {
            let beat = one
                .latest_heartbeat
                .as_ref()
                .map(|h| format!(" · heartbeat {}", h.age))
                .unwrap_or_default();
            format!(
                "{} · {} · expires {}{beat}{also}",
                visible(&one.label),
                one.progress,
                one.time_left
            )
        }
        ([first, ..], _) => format!(
            "{} waiting items · {}{also}",
            armed.len(),
            visible(&first.label)
        ),
        ([], [one]) => format!(
            "{} · {} · wake delivering",
            visible(&one.label),
            one.status.as_str()
        ),
        ([], [first, ..]) => format!(
            "{} wakes delivering · {}",
            delivering.len(),
            visible(&first.label)
        ),
    };
    format!("{dot}{line}\n")
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let head: String = s.chars().take(n - 1).collect();
        format!("{head}…")
    }
}

/// A waitpoint as commands print it: everything but the secret's hash.
pub fn public_view(wp: &Waitpoint) -> Value {
    let mut v = serde_json::to_value(wp).expect("waitpoints serialise");
    if let Some(o) = v.as_object_mut() {
        o.remove("secret_sha256");
    }
    v
}

/// `show --json`: the public view plus every signal and the badges.
pub fn show_json(wp: &Waitpoint, signals: &[SignalRecord], badges: &[Badge]) -> Value {
    let mut v = public_view(wp);
    let o = v.as_object_mut().expect("an object");
    o.insert(
        "signals".into(),
        serde_json::to_value(signals).expect("signals serialise"),
    );
    o.insert(
        "badges".into(),
        serde_json::to_value(badges).expect("badges serialise"),
    );
    v
}

/// `show`: the full picture of one waitpoint. Never the secret.
pub fn show_text(
    wp: &Waitpoint,
    signals: &[SignalRecord],
    badges: &[Badge],
    now: Timestamp,
) -> String {
    let mut o = String::new();
    let mut line = |s: String| {
        o.push_str(&s);
        o.push('\n');
    };
    line(format!("{}  {:?}", wp.id, wp.label));
    let outcome = match wp.outcome {
        Some(Outcome::Ok) => " (ok)",
        Some(Outcome::Fail) => " (fail)",
        None => "",
    };
    line(format!("  status    {}{outcome}", wp.status.as_str()));
    line(format!("  intent    {}", visible(&wp.intent)));
    line(format!(
        "  session   {} · channel {}",
        wp.session, wp.channel
    ));
    line(format!("  progress  {}", progress(wp)));
    line(format!(
        "  rules     quorum {} · fail_fast {} · max_signals {}",
        wp.quorum, wp.fail_fast, wp.max_signals
    ));
    line(format!("  created   {}", wp.created_at));
    line(format!(
        "  deadline  {} ({})",
        wp.expires_at,
        time_left(wp.expires_at, now)
    ));
    if let Some(at) = wp.resolved_at {
        line(format!("  closed    {at}"));
    }
    if let Some(d) = &wp.device {
        line(format!("  device    {d}"));
    }
    let s = &wp.silence;
    if !s.is_off() {
        let mut watches = Vec::new();
        if let Some(ms) = s.started_within_ms {
            watches.push(format!("started_within {}", human_duration(ms as i64)));
        }
        if let Some(ms) = s.heartbeat_within_ms {
            watches.push(format!("heartbeat_within {}", human_duration(ms as i64)));
        }
        line(format!("  silence   {}", watches.join(" · ")));
        if let Some(r) = LastReportView::of(wp, now) {
            line(format!("  last      {} at {} ({})", r.status, r.at, r.age));
        }
    }
    for b in badges {
        line(format!("  badge     {}", b.text));
    }
    if !wp.members.is_empty() {
        line("  members".to_owned());
        for m in &wp.members {
            let reports: Vec<String> = signals
                .iter()
                .filter(|s| s.member.as_deref() == Some(m))
                .map(|s| format!("{} at {}", s.status.as_str(), s.received_at))
                .collect();
            let text = if reports.is_empty() {
                "no report yet".to_owned()
            } else {
                reports.join(", ")
            };
            line(format!("    {:<16} {text}", escape::name(m)));
        }
    }
    let c = &wp.counters;
    line(format!(
        "  signals   {} ({} ok, {} fail, {} progress) · wakes {}",
        c.signals, c.ok, c.fail, c.progress, c.wakes
    ));
    let log = &wp.log;
    if log.folded() > 0 {
        line(format!(
            "  folded    {} not kept whole in the log ({} ok, {} fail, {} progress){}; the newest \
{} are listed without their data",
            log.folded(),
            log.folded_ok,
            log.folded_fail,
            log.folded_progress,
            log.first_folded
                .as_ref()
                .map(|f| format!(" from #{} on", f.seq))
                .unwrap_or_default(),
            log.recent.len()
        ));
    }
    for s in signals {
        let msg = s
            .message
            .as_ref()
            .map(|m| format!("  message: {}", escape::quoted(m)))
            .unwrap_or_default();
        line(format!(
            "    #{:<4} {:<8} {:<10} {} via {}{msg}",
            s.seq,
            s.status.as_str(),
            s.member.as_deref().map_or("-".into(), escape::name),
            s.received_at,
            escape::name(&s.source),
        ));
    }
    if let Some(p) = &wp.pending_wake {
        let why = match p.reason {
            HoldReason::Grace => "grace window for late reports",
            HoldReason::WakeLimit => "hourly wake limit",
        };
        line(format!(
            "  next wake {} ({why}), {}",
            p.due_at,
            time_left(p.due_at, now)
        ));
    }
    if !wp.outbox.is_empty() {
        line(format!("  pending delivery: {} wake(s)", wp.outbox.len()));
    }
    for h in &wp.hook_deliveries {
        let last = h
            .last_error
            .as_ref()
            .map(|e| format!("; last error: {}", visible(e)))
            .unwrap_or_default();
        let state = match h.delivered_at {
            Some(at) => format!("delivered {at}"),
            None => format!("next try {}", h.next_attempt_at),
        };
        line(format!(
            "  onWake    {} · {} attempt(s){last} · {state}",
            h.wake_id, h.attempts
        ));
    }
    o
}

/// One timer as a line: id, status, firings, interval, next firing, summary.
pub fn timer_line(t: &Timer) -> String {
    let next = t
        .next_fire_at
        .map(|n| format!("next {n}"))
        .unwrap_or_else(|| "-".to_owned());
    let every = t
        .interval_ms
        .map(|i| format!(" every {i} ms"))
        .unwrap_or_default();
    format!(
        "{}  {:<9} fired {}{every}  {next}  {}",
        t.id,
        t.status.as_str(),
        t.fire_count,
        visible(t.summary.as_deref().unwrap_or(""))
    )
}

/// The last success, and for an unreachable device the error and the next try.
pub fn device_detail(st: &DeviceStatus, now: Timestamp) -> String {
    let ago = |t: Timestamp| format!("{} ago", human_duration(now.millis_since(t)));
    let last_ok = st
        .last_success_at
        .map_or("never collected".to_owned(), |t| {
            format!("last collected {}", ago(t))
        });
    let summary = match (&st.last_error, st.reachable) {
        (Some(e), Some(false)) => format!(
            "{last_ok}; {} failure(s), next try {}; last error: {}",
            st.failures,
            st.next_attempt_at
                .map_or("on poll".to_owned(), |t| if t > now {
                    format!("in {}", human_duration(t.millis_since(now)))
                } else {
                    "now".to_owned()
                }),
            visible(e)
        ),
        _ => last_ok,
    };
    // What the operator has to look at: the files left on the device, and why.
    const SHOWN: usize = 3;
    let mut left: Vec<String> = st
        .left_on_device
        .iter()
        .take(SHOWN)
        .map(|l| format!("{} ({})", escape::name(&l.file), visible(&l.reason)))
        .collect();
    if st.left_on_device.len() > SHOWN {
        left.push(format!(
            "and {} more (see status.json)",
            st.left_on_device.len() - SHOWN
        ));
    }
    if left.is_empty() {
        summary
    } else {
        format!("{summary}; left on the device: {}", left.join(", "))
    }
}

/// A device record with its collector state, as `--json` prints it.
pub fn device_view(d: &Device, st: &DeviceStatus) -> Value {
    let mut v = serde_json::to_value(d).expect("devices serialise");
    v.as_object_mut().expect("an object").insert(
        "status".into(),
        serde_json::to_value(st).expect("status serialises"),
    );
    v
}
