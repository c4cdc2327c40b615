//! Time: the [`Timestamp`] every file records (RFC 3339 UTC on disk), and the [`Clock`] the engine
//! and daemon read instead of the system time, so tests can drive deadlines without sleeping.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::sync::MutexExt;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;

/// Milliseconds since the Unix epoch, written as RFC 3339 UTC with millisecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// A system time (a file's mtime), to the millisecond; before the epoch counts as it.
    pub fn from_system(t: SystemTime) -> Self {
        Timestamp(
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This instant plus `ms` milliseconds (saturating).
    pub fn plus_ms(self, ms: i64) -> Self {
        Timestamp(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, never negative.
    pub fn millis_since(self, earlier: Timestamp) -> i64 {
        (self.0 - earlier.0).max(0)
    }

    /// Parses RFC 3339 (any offset; stored back as UTC).
    pub fn parse(text: &str) -> Option<Self> {
        let t = OffsetDateTime::parse(text, &Rfc3339).ok()?;
        Some(Timestamp((t.unix_timestamp_nanos() / 1_000_000) as i64))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let format = format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        );
        let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0) * 1_000_000)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        match t.format(&format) {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "{}ms", self.0),
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Timestamp::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("not an RFC 3339 time: {text:?}")))
    }
}

/// A short human duration: `45s`, `3m 20s`, `6h 2m`, `2d 4h`.
pub fn human_duration(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    let (d, h, m, sec) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60, s % 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {sec}s")
    } else {
        format!("{sec}s")
    }
}

/// Parses a duration as people write it: `90s`, `10m`, `1h30m`, `2d`, `500ms`; a bare number is
/// seconds. Returns milliseconds.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "{text:?} is not a duration: write it like 90s, 10m, 1h30m or 2d (a bare number is \
             seconds)"
        )
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(bad());
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(1000))
            .ok_or_else(bad);
    }
    let mut total: u64 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_ms: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total = n
            .checked_mul(unit_ms)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(bad)?;
    }
    Ok(total)
}

/// Where "now" comes from.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(d.as_millis() as i64)
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
    // Serialises `advance` so concurrent readers never see time go backwards.
    step: Mutex<()>,
}

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        ManualClock {
            now: AtomicI64::new(start.0),
            step: Mutex::new(()),
        }
    }

    pub fn advance_ms(&self, ms: i64) {
        let _guard = self.step.lock_or_recover();
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn set(&self, t: Timestamp) {
        let _guard = self.step.lock_or_recover();
        self.now.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.now.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_through_rfc3339() {
        let t = Timestamp::from_millis(1_764_567_890_123);
        let text = t.to_string();
        assert_eq!(text, "2025-12-01T05:44:50.123Z");
        assert_eq!(Timestamp::parse(&text), Some(t));
    }

    #[test]
    fn durations_parse_as_written() {
        assert_eq!(parse_duration("90s"), Ok(90_000));
        assert_eq!(parse_duration("10m"), Ok(600_000));
        assert_eq!(parse_duration("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration("2d"), Ok(172_800_000));
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("45"), Ok(45_000));
        for bad in ["", "m", "10x", "1.5h", "-3s", "10 m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn human_durations_pick_two_units() {
        assert_eq!(human_duration(45_000), "45s");
        assert_eq!(human_duration(200_000), "3m 20s");
        assert_eq!(human_duration(6 * 3_600_000 + 120_000), "6h 2m");
        assert_eq!(human_duration(2 * 86_400_000 + 4 * 3_600_000), "2d 4h");
    }
}
