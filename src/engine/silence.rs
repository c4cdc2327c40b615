//! Silence is news: the `started_within` and `heartbeat_within` watches, and the device-outage
//! wake. A job that never reported, one that stopped reporting, and a device that stays out of
//! reach each wake the session early, long before the deadline, and the waitpoint stays armed.
//!
//! The watches keep no timer of their own: [`silence_due`] computes when one is due from the
//! record (its arming time, its last report, what was already sent), so it joins the daemon's
//! one due queue beside the deadline, and a restart recomputes it from the records. Silence
//! wakes count toward the hourly cap (a spent cap holds one back) but not toward
//! `max_signals`, which counts the job's own results; their wake ids are numbered apart.

use super::{Engine, next_due, rules};
use crate::clock::{Timestamp, human_duration};
use crate::error::Result;
use crate::howto;
use crate::records::{DeviceHealth, LastReport, WakeSubject};
use crate::records::{SignalRecord, Status, Waitpoint, Wake, WakeKind};
use crate::sync::MutexExt;
use std::sync::Arc;

/// The placeholder a repeated signal line carries where the secret goes: only its hash is
/// stored, so no wake can carry it.
pub const SECRET_PLACEHOLDER: &str = "SECRET";

/// How soon a device-bound waitpoint whose window ended is looked at again while its device has
/// not had a round since (its reports may be waiting there).
const DEVICE_RECHECK_MS: i64 = 2_000;

/// Where the daemon learns a device's reachability and spool, for the wakes that name it.
pub type DeviceLookup = Arc<dyn Fn(&str) -> Option<(DeviceHealth, String)> + Send + Sync>;

/// When a silence watch of `wp` is next due: the "never started" time while nothing has
/// reported, or the end of the heartbeat window after the last report, not before a time the
/// hourly cap set, and only while it is armed and before its deadline (the deadline's own
/// notice then says what came and what did not).
pub fn silence_due(wp: &Waitpoint) -> Option<Timestamp> {
    if wp.status != Status::Armed {
        return None;
    }
    let s = &wp.silence;
    let started = match (s.started_within_ms, &s.last_report) {
        (Some(ms), None) if !s.not_started_sent => Some(wp.created_at.plus_ms(ms as i64)),
        _ => None,
    };
    let quiet = match (s.heartbeat_within_ms, &s.last_report) {
        (Some(ms), Some(last)) if s.quiet_after_seq != Some(last.seq) => {
            Some(last.at.plus_ms(ms as i64))
        }
        _ => None,
    };
    let due = started.into_iter().chain(quiet).min()?;
    let due = s.held_until.map_or(due, |h| due.max(h));
    (due < wp.expires_at).then_some(due)
}

/// Records `rec` as the waitpoint's last report: the heartbeat window starts again from it.
pub fn note_report(wp: &mut Waitpoint, rec: &SignalRecord) {
    if wp.silence.is_off() {
        return;
    }
    wp.silence.last_report = Some(LastReport {
        seq: rec.seq,
        at: rec.received_at,
        status: rec.status,
        message: rec.message.clone(),
    });
    wp.silence.held_until = None;
}

/// Whether `wp` has gone quiet: a "went quiet" wake was sent and no report came since.
pub fn is_quiet(wp: &Waitpoint) -> bool {
    let s = &wp.silence;
    s.quiet_after_seq.is_some() && s.quiet_after_seq == s.last_report.as_ref().map(|l| l.seq)
        || s.not_started_sent && s.last_report.is_none()
}

impl Engine {
    /// Tells the engine how to look a device up for the silence wakes (the daemon knows its
    /// collectors); without it, a wake says nothing of the device.
    pub fn set_device_lookup(&self, lookup: DeviceLookup) {
        *self.devices.lock_or_recover() = Some(lookup);
    }

    /// Holds every silence wake back until [`release_silence`](Self::release_silence): the
    /// daemon does so while it collects what arrived during its outage, so a silence that ended
    /// meanwhile is not reported.
    pub fn hold_silence(&self) {
        self.silence_held
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Ends the hold; returns the waitpoints whose silence came due meanwhile, for the caller
    /// to look at again now.
    pub fn release_silence(&self) -> Vec<String> {
        self.silence_held
            .store(false, std::sync::atomic::Ordering::SeqCst);
        std::mem::take(&mut *self.held.lock_or_recover())
    }

    pub(super) fn silence_is_held(&self) -> bool {
        self.silence_held.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(super) fn note_held(&self, id: &str) {
        self.held.lock_or_recover().push(id.to_owned());
    }

    fn device(&self, name: &str) -> Option<(DeviceHealth, String)> {
        let lookup = self.devices.lock_or_recover().clone();
        lookup.and_then(|f| f(name))
    }

    /// Puts a due silence wake of `wp` in its outbox (the caller saves and flushes it).
    pub(super) fn queue_due_silence(&self, wp: &mut Waitpoint, now: Timestamp) -> Result<()> {
        if self.silence_is_held() {
            return Ok(());
        }
        let Some(due) = silence_due(wp) else {
            return Ok(());
        };
        // Serviced late, past the deadline too: the deadline's notice says what came and what
        // did not, so a silence is not told on top of it.
        if due > now || now >= wp.expires_at {
            return Ok(());
        }
        if let Some(at) = rules::cap_frees_at(wp, now, self.settings.max_wakes_per_hour) {
            tracing::info!(waitpoint = %wp.id, "a silence wake waits for the hourly wake limit");
            wp.silence.held_until = Some(at);
            return Ok(());
        }
        wp.silence.held_until = None;
        let wake = match wp.silence.last_report.clone() {
            None => {
                wp.silence.not_started_sent = true;
                let line = self.signal_line(wp);
                tracing::info!(
                    waitpoint = %wp.id,
                    "nothing reported within started_within; wake sent",
                );
                compose(wp, WakeKind::NotStarted, not_started(wp, &line), None, now)
            }
            Some(last) => {
                let device = wp.device.as_deref().and_then(|d| self.device(d));
                // A device's reports reach us only through its rounds: quiet is news once a
                // round after the window found nothing (or the device is out of reach, which
                // the wake then says). Until then, look again shortly.
                let window_end = last
                    .at
                    .plus_ms(wp.silence.heartbeat_within_ms.unwrap_or(0) as i64);
                if let Some((h, _)) = &device
                    && h.reachable != Some(false)
                    && h.last_success_at.is_none_or(|t| t < window_end)
                {
                    wp.silence.held_until = Some(now.plus_ms(DEVICE_RECHECK_MS));
                    return Ok(());
                }
                wp.silence.quiet_after_seq = Some(last.seq);
                // One silence, one wake: an outage behind it is told here, not again.
                if let Some((h, _)) = &device
                    && h.reachable == Some(false)
                {
                    wp.silence.outage_noticed = h.unreachable_since;
                }
                let record = self
                    .carried(wp, last.seq, &[])?
                    .records
                    .into_iter()
                    .find(|r| r.seq == last.seq);
                let lines = went_quiet(wp, &last, device.as_ref().map(|(h, _)| h), now);
                tracing::info!(waitpoint = %wp.id, "no report within heartbeat_within; wake sent");
                compose(wp, WakeKind::WentQuiet, lines, record.as_ref(), now)
            }
        };
        wp.outbox.push(wake);
        Ok(())
    }

    /// A device has been out of reach since `since` (its last good round): wakes the armed
    /// waitpoint `id` bound to it, once per outage, when the outage has lasted longer than its
    /// `heartbeat_within`. Returns when to look at the waitpoint again.
    pub fn notice_device_outage(
        &self,
        id: &str,
        since: Timestamp,
        error: &str,
    ) -> Result<Option<Timestamp>> {
        let mut txn = self.store.begin()?;
        let Some((mut wp, _)) = txn.read(id)? else {
            return Ok(None);
        };
        let now = self.clock.now();
        let Some(window) = wp.silence.heartbeat_within_ms else {
            return Ok(next_due(&wp));
        };
        // An outage that began before the waitpoint was armed counts from its arming.
        let long_enough = now.millis_since(since.max(wp.created_at)) > window as i64;
        if wp.status != Status::Armed
            || now >= wp.expires_at
            || wp.device.is_none()
            || !long_enough
            || wp.silence.outage_noticed == Some(since)
            || self.silence_held.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(next_due(&wp));
        }
        if rules::cap_frees_at(&mut wp, now, self.settings.max_wakes_per_hour).is_some() {
            // Asked again at the device's next failed round.
            return Ok(next_due(&wp));
        }
        wp.silence.outage_noticed = Some(since);
        // One silence, one wake: the quiet watch of the same last report is told by this one.
        wp.silence.quiet_after_seq = wp.silence.last_report.as_ref().map(|l| l.seq);
        let device = wp.device.clone().unwrap_or_default();
        let lines = vec![
            format!(
                "device {device} has been unreachable for {} (since {since}, its last good \
round), longer than heartbeat_within ({}): {error}",
                human_duration(now.millis_since(since)),
                human_duration(window as i64)
            ),
            "Its signal files may be waiting over there; they are collected when it is back."
                .to_owned(),
            format!(
                "What to do: check the device (`waitpoint device show {device}`, can you ssh to \
it?); if the job is lost with it, cancel this waitpoint (wait_cancel). It stays armed."
            ),
        ];
        tracing::info!(
            waitpoint = %wp.id,
            device = %device,
            "device unreachable past heartbeat_within; wake sent",
        );
        let wake = compose(&mut wp, WakeKind::DeviceUnreachable, lines, None, now);
        wp.outbox.push(wake);
        txn.put(&wp)?;
        self.flush_outbox(txn.as_mut(), &mut wp)?;
        Ok(next_due(&wp))
    }

    /// The `how_to_signal.recommended` line of `wp`, with [`SECRET_PLACEHOLDER`] for its secret.
    fn signal_line(&self, wp: &Waitpoint) -> String {
        let root = self.home.root().to_string_lossy().into_owned();
        let drop_zone = self.home.drop_zone().to_string_lossy().into_owned();
        let spool = wp
            .device
            .as_deref()
            .and_then(|d| self.device(d))
            .map(|(_, s)| s);
        let lines = howto::build(
            wp,
            SECRET_PLACEHOLDER,
            &howto::Target {
                home_override: Some(&root),
                local_drop_zone: &drop_zone,
                // Only the `curl` line names the port, and it is never the recommended one.
                webhook_port: self.settings.webhook.port.unwrap_or(0),
                shim: howto::ShimState::Off,
                device_spool: spool.as_deref(),
            },
        );
        lines.recommended_line().clone()
    }
}

fn not_started(wp: &Waitpoint, line: &str) -> Vec<String> {
    let within = wp.silence.started_within_ms.unwrap_or(0) as i64;
    vec![
        format!(
            "nothing has reported in {} since it was armed: is the signal line wired?",
            human_duration(within)
        ),
        format!(
            "The line to end the job's command with (how_to_signal.recommended; \
             {SECRET_PLACEHOLDER} \
is the secret wait_create returned, which is not stored anywhere):\n  {line}"
        ),
        format!(
            "What to do: check that the job started and that its command ends with that line. It \
stays armed until {}; a later signal counts as usual. If the job will not run, cancel it \
(wait_cancel); if the secret is lost, re-arm with wait_create.",
            wp.expires_at
        ),
    ]
}

fn went_quiet(
    wp: &Waitpoint,
    last: &LastReport,
    device: Option<&DeviceHealth>,
    now: Timestamp,
) -> Vec<String> {
    let window = wp.silence.heartbeat_within_ms.unwrap_or(0) as i64;
    let mut lines = vec![format!(
        "the job went quiet: nothing since its last report ({}, seq {}) {} ago at {}, and \
heartbeat_within is {}",
        last.status.as_str(),
        last.seq,
        human_duration(now.millis_since(last.at)),
        last.at,
        human_duration(window)
    )];
    if let (Some(name), Some(h)) = (&wp.device, device) {
        lines.push(match h.reachable {
            Some(true) => format!(
                "Its device {name} is reachable (last good round {}): the job itself stopped \
reporting.",
                h.last_success_at
                    .map_or("never".to_owned(), |t| t.to_string())
            ),
            Some(false) => format!(
                "Its device {name} is unreachable (last good round {}): {}. Its files may be \
waiting over there.",
                h.last_success_at
                    .map_or("never".to_owned(), |t| t.to_string()),
                h.last_error
                    .as_deref()
                    .map_or("no error recorded".into(), crate::escape::line)
            ),
            None => format!("Its device {name} has not been reached yet."),
        });
    }
    lines.push(
        "What to do: check the job (is it still running? did its machine reboot or run out of \
memory?). If it is only slower than heartbeat_within, nothing is needed: the next report re-arms \
this watch. If it died, cancel this waitpoint (wait_cancel) and run the job again."
            .to_owned(),
    );
    lines
}

/// A silence wake: `lines[0]` is its headline, the rest its advice; `record` (the last
/// report) is carried as a report and its text as the external payload.
fn compose(
    wp: &mut Waitpoint,
    kind: WakeKind,
    lines: Vec<String>,
    record: Option<&SignalRecord>,
    now: Timestamp,
) -> Wake {
    wp.silence.notices += 1;
    wp.recent_wakes.push(now);
    let wp = &*wp;
    let headline = &lines[0];
    let signals: Vec<SignalRecord> = record.cloned().into_iter().collect();
    let external = rules::external_payload(&signals);
    let stop = if headline.ends_with(['?', '.']) {
        ""
    } else {
        "."
    };
    let label = crate::escape::line(&wp.label);
    let mut text = format!("Waitpoint {} \"{label}\": {headline}{stop}\n", wp.id);
    for line in &lines[1..] {
        text.push_str(line);
        text.push('\n');
    }
    rules::push_intent_and_payload(&mut text, wp, &external);
    Wake {
        wake_id: wp.silence_wake_id(wp.silence.notices),
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
            outcome: None,
        }),
        waited_ms: now.millis_since(wp.created_at),
        summary: format!("{label}: {headline}"),
        reports: signals.iter().map(rules::fact).collect(),
        deadline: None,
        external_payload: external,
        digest: None,
        text,
    }
}
