//! Settings: `$CORTEX_HOME/settings.json`, with environment fallbacks for absent keys.
//!
//! The library never reads the environment itself: callers pass a lookup function (the CLI passes
//! `std::env::var`, tests pass a map), so resolution is a pure function of its inputs.

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::error::{Error, Result};
pub mod location;
use location::Location;

/// The largest settings file read.
pub const MAX_SETTINGS_BYTES: u64 = 64 * 1024;

pub const DAY_MS: u64 = 86_400_000;
/// The hard ceiling on any waitpoint's lifetime: 30 days.
pub const MAX_TTL_MS: u64 = 30 * DAY_MS;

/// Resolved settings with their defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Default lifetime of a waitpoint (`waitpointTtlMs`), also the age after which delivered
    /// wakes are removed from `cur/`.
    pub ttl_ms: u64,
    /// Sweep and collection interval (`waitpointSweepMs`); 0 turns the sweep off.
    pub sweep_ms: u64,
    /// Wake cap per waitpoint per sliding hour (`waitpointMaxWakesPerHour`).
    pub max_wakes_per_hour: u32,
    /// `onWake`: a command (argv, never a shell string) the daemon runs for each wake.
    pub on_wake: Option<Vec<String>>,
    /// `onWakeTimeoutMs`: how long one hook run may take before it is killed and retried.
    pub on_wake_timeout_ms: u64,
    /// The optional loopback HTTP shim (`"webhook": {"enabled": …, "port": …}`).
    pub webhook: WebhookSettings,
    /// Where waitpoints live (`"store"`, else `CORTEX_STORE`): the home's files by default.
    pub store: Location,
    /// The name this host goes by in a shared store (`"host"`, else the system's host name).
    pub host: Option<String>,
}

/// `"webhook"` in settings.json. Off unless enabled; the port falls back (in the CLI) to
/// `WEBHOOK_PORT`, then 3001. Other keys in the object are left to other tools.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookSettings {
    pub enabled: bool,
    /// 0 asks the system for a free port (the daemon publishes the one it got).
    pub port: Option<u16>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ttl_ms: 7 * DAY_MS,
            sweep_ms: 30_000,
            max_wakes_per_hour: 12,
            on_wake: None,
            on_wake_timeout_ms: 10_000,
            webhook: WebhookSettings::default(),
            store: Location::Files,
            host: None,
        }
    }
}

struct Key {
    json: &'static str,
    env: &'static str,
    min: u64,
    max: u64,
}

impl Key {
    fn range(&self) -> String {
        format!("an integer from {} to {}", self.min, self.max)
    }
}

const TTL: Key = Key {
    json: "waitpointTtlMs",
    env: "CORTEX_WAITPOINT_TTL_MS",
    min: 1,
    max: MAX_TTL_MS,
};
const SWEEP: Key = Key {
    json: "waitpointSweepMs",
    env: "CORTEX_WAITPOINT_SWEEP_MS",
    min: 0,
    max: DAY_MS,
};
const WAKES: Key = Key {
    json: "waitpointMaxWakesPerHour",
    env: "CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR",
    min: 1,
    max: 3600,
};

impl Settings {
    /// Reads `settings_file` (absent is fine) and fills absent keys from `env`.
    pub fn load(settings_file: &Path, env: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let text = read_trusted(settings_file)?;
        Self::resolve(settings_file, text.as_deref(), env)
    }

    /// Resolution proper: `text` is the settings file's content, if any.
    pub fn resolve(
        settings_file: &Path,
        text: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let bad = |message: String| Error::Settings {
            path: settings_file.to_owned(),
            message,
        };
        let file = match text {
            None => SettingsFile::default(),
            Some(t) => {
                serde_json::from_str::<Unique>(t)
                    .map_err(|e| bad(format!("not valid JSON: {e}")))?;
                match serde_json::from_str::<Value>(t) {
                    // An object only: a derived struct would take an array positionally.
                    Ok(v @ Value::Object(_)) => {
                        serde_json::from_value(v).map_err(|e| bad(e.to_string()))?
                    }
                    Ok(_) => return Err(bad("must be a JSON object".into())),
                    Err(e) => return Err(bad(format!("not valid JSON: {e}"))),
                }
            }
        };
        // A key the file leaves out falls back to its environment variable.
        let from_env = |key: &Key, given: Option<u64>| -> Result<Option<u64>> {
            if given.is_some() {
                return Ok(given);
            }
            let Some(raw) = env(key.env) else {
                return Ok(None);
            };
            match raw.trim().parse::<u64>() {
                Ok(n) if (key.min..=key.max).contains(&n) => Ok(Some(n)),
                _ => Err(Error::Usage(format!(
                    "environment variable {} must be {}, not {raw:?}",
                    key.env,
                    key.range()
                ))),
            }
        };
        let store = match file.store {
            Some(v) => Location::from_setting(&v).map_err(bad)?,
            None => match env("CORTEX_STORE") {
                Some(url) => Location::parse(&url)
                    .map_err(|e| bad(format!("environment variable CORTEX_STORE: {e}")))?,
                None => Location::Files,
            },
        };
        let d = Settings::default();
        Ok(Settings {
            store,
            host: file.host,
            webhook: file.webhook.unwrap_or_default(),
            on_wake: file.on_wake,
            on_wake_timeout_ms: file.on_wake_timeout_ms.unwrap_or(d.on_wake_timeout_ms),
            ttl_ms: from_env(&TTL, file.waitpoint_ttl_ms)?.unwrap_or(d.ttl_ms),
            sweep_ms: from_env(&SWEEP, file.waitpoint_sweep_ms)?.unwrap_or(d.sweep_ms),
            max_wakes_per_hour: from_env(&WAKES, file.waitpoint_max_wakes_per_hour)?
                .map(|n| n as u32)
                .unwrap_or(d.max_wakes_per_hour),
        })
    }
}

/// `settings.json` as written. Every key may be absent, and a key not named here is left to
/// other tools; each present key is checked by its own reader, whose error names the key and
/// says what it must be.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SettingsFile {
    #[serde(default, deserialize_with = "ttl")]
    waitpoint_ttl_ms: Option<u64>,
    #[serde(default, deserialize_with = "sweep")]
    waitpoint_sweep_ms: Option<u64>,
    #[serde(default, deserialize_with = "wakes")]
    waitpoint_max_wakes_per_hour: Option<u64>,
    #[serde(default, deserialize_with = "on_wake")]
    on_wake: Option<Vec<String>>,
    #[serde(default, deserialize_with = "on_wake_timeout")]
    on_wake_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "webhook")]
    webhook: Option<WebhookSettings>,
    /// Read by [`Location::from_setting`], which knows its forms.
    #[serde(default)]
    store: Option<Value>,
    #[serde(default, deserialize_with = "host")]
    host: Option<String>,
}

/// `"webhook"`: its own keys; others in the object are left to other tools.
#[derive(serde::Deserialize)]
struct WebhookFile {
    #[serde(default, deserialize_with = "webhook_enabled")]
    enabled: Option<bool>,
    #[serde(default, deserialize_with = "webhook_port")]
    port: Option<u16>,
}

type De<T, E> = std::result::Result<T, E>;

/// The key's value if `accept` takes it, else an error naming the key and what it must be.
fn key_value<'de, D: Deserializer<'de>, T>(
    d: D,
    key: &str,
    must_be: &str,
    accept: impl FnOnce(&Value) -> Option<T>,
) -> De<T, D::Error> {
    let v = Value::deserialize(d)?;
    accept(&v).ok_or_else(|| de::Error::custom(format!("key `{key}` must be {must_be}, not {v}")))
}

fn ranged<'de, D: Deserializer<'de>>(d: D, key: &Key) -> De<Option<u64>, D::Error> {
    key_value(d, key.json, &key.range(), |v| {
        v.as_u64()
            .filter(|n| (key.min..=key.max).contains(n))
            .map(Some)
    })
}

fn ttl<'de, D: Deserializer<'de>>(d: D) -> De<Option<u64>, D::Error> {
    ranged(d, &TTL)
}

fn sweep<'de, D: Deserializer<'de>>(d: D) -> De<Option<u64>, D::Error> {
    ranged(d, &SWEEP)
}

fn wakes<'de, D: Deserializer<'de>>(d: D) -> De<Option<u64>, D::Error> {
    ranged(d, &WAKES)
}

fn on_wake_timeout<'de, D: Deserializer<'de>>(d: D) -> De<Option<u64>, D::Error> {
    key_value(d, "onWakeTimeoutMs", "an integer from 1 to 3600000", |v| {
        v.as_u64().filter(|n| (1..=3_600_000).contains(n)).map(Some)
    })
}

/// An argv, never a shell string; `null` is no command.
fn on_wake<'de, D: Deserializer<'de>>(d: D) -> De<Option<Vec<String>>, D::Error> {
    let must_be = "a non-empty array of strings (argv, never a shell string), e.g. \
                   [\"notify-send\", \"wake\"]";
    key_value(d, "onWake", must_be, |v| match v {
        Value::Null => Some(None),
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<Vec<String>>>()
            .filter(|argv| argv.first().is_some_and(|p| !p.is_empty()))
            .map(Some),
        _ => None,
    })
}

fn webhook<'de, D: Deserializer<'de>>(d: D) -> De<Option<WebhookSettings>, D::Error> {
    let v = Value::deserialize(d)?;
    if !v.is_object() {
        return Err(de::Error::custom(format!(
            "key `webhook` must be an object, not {v}"
        )));
    }
    let w: WebhookFile = serde_json::from_value(v).map_err(de::Error::custom)?;
    Ok(Some(WebhookSettings {
        enabled: w.enabled.unwrap_or(false),
        port: w.port,
    }))
}

fn webhook_enabled<'de, D: Deserializer<'de>>(d: D) -> De<Option<bool>, D::Error> {
    key_value(d, "webhook.enabled", "true or false", |v| {
        v.as_bool().map(Some)
    })
}

fn webhook_port<'de, D: Deserializer<'de>>(d: D) -> De<Option<u16>, D::Error> {
    key_value(d, "webhook.port", "an integer from 0 to 65535", |v| {
        v.as_u64().and_then(|n| u16::try_from(n).ok()).map(Some)
    })
}

/// A host name of letters, digits, `-`, `_` and `.`; `null` is none.
fn host<'de, D: Deserializer<'de>>(d: D) -> De<Option<String>, D::Error> {
    let must_be = "a name of letters, digits, - _ and .";
    key_value(d, "host", must_be, |v| match v {
        Value::Null => Some(None),
        Value::String(h)
            if !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) =>
        {
            Some(Some(h.clone()))
        }
        _ => None,
    })
}

/// Reads the settings file only if it can be trusted: what it says decides what runs (`onWake`),
/// so it must be ours (or root's) and writable by nobody else, and it must be a regular file of
/// at most [`MAX_SETTINGS_BYTES`] (a FIFO would hang the reader, `/dev/zero` would never end).
/// A symlink is followed, and the file it names is checked. `None` when there is none.
fn read_trusted(path: &Path) -> Result<Option<String>> {
    let refuse = |message: String| Error::Settings {
        path: path.to_owned(),
        message,
    };
    const NOT_REGULAR: &str = "is not a regular file (a FIFO, socket, device or directory); \
                               settings are read only from one";
    // Look before opening: opening a device can have effects of its own.
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return Err(refuse(NOT_REGULAR.into())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("cannot read", path, e)),
    }
    // O_NONBLOCK: a FIFO swapped in since the look must not block the open.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("cannot read", path, e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| Error::io("cannot inspect", path, e))?;
    if !meta.is_file() {
        return Err(refuse(NOT_REGULAR.into()));
    }
    let euid = rustix::process::geteuid().as_raw();
    let insecure = |message: String| Error::Insecure {
        path: path.to_owned(),
        message,
    };
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(insecure(format!(
            "owned by uid {}, not by this user (uid {euid}) or root, and it decides what runs \
             (onWake); fix: chown {euid} {}",
            meta.uid(),
            path.display()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(insecure(format!(
            "mode {mode:04o} lets other users write it, and it decides what runs (onWake); fix: \
             chmod go-w {}",
            path.display()
        )));
    }
    if meta.len() > MAX_SETTINGS_BYTES {
        return Err(refuse(format!(
            "is {} bytes; settings are at most {MAX_SETTINGS_BYTES}",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_SETTINGS_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read", path, e))?;
    if bytes.len() as u64 > MAX_SETTINGS_BYTES {
        return Err(refuse(format!(
            "grew past {MAX_SETTINGS_BYTES} bytes while being read"
        )));
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| refuse("is not UTF-8 text".into()))
}

/// Any JSON value, refused when an object in it names a key twice (serde_json would keep the
/// last silently, so a second `onWake` further down could hide behind the first).
struct Unique;

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_str<E>(self, _: &str) -> std::result::Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_unit<E>(self) -> std::result::Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Unique, A::Error> {
        while seq.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Unique, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("key `{key}` is given twice")));
            }
            map.next_value::<Unique>()?;
        }
        Ok(Unique)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults_apply_without_file_or_env() {
        let s = Settings::resolve(Path::new("s.json"), None, no_env).unwrap();
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn file_wins_over_env_and_env_fills_absent_keys() {
        let env = |k: &str| match k {
            "CORTEX_WAITPOINT_SWEEP_MS" => Some("500".to_owned()),
            "CORTEX_WAITPOINT_TTL_MS" => Some("1000".to_owned()),
            _ => None,
        };
        let s = Settings::resolve(
            Path::new("s.json"),
            Some(r#"{"waitpointTtlMs": 2000}"#),
            env,
        )
        .unwrap();
        assert_eq!((s.ttl_ms, s.sweep_ms), (2000, 500));
    }

    #[test]
    fn malformed_value_names_file_and_key() {
        let err = Settings::resolve(
            Path::new("/h/settings.json"),
            Some(r#"{"waitpointSweepMs": "fast"}"#),
            no_env,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/h/settings.json"), "{err}");
        assert!(err.contains("waitpointSweepMs"), "{err}");
    }

    #[test]
    fn ttl_above_the_thirty_day_ceiling_is_refused() {
        let text = format!(r#"{{"waitpointTtlMs": {}}}"#, MAX_TTL_MS + 1);
        assert!(Settings::resolve(Path::new("s.json"), Some(&text), no_env).is_err());
    }

    #[test]
    fn on_wake_is_an_argv_array_never_a_shell_string() {
        let ok = Settings::resolve(
            Path::new("s"),
            Some(r#"{"onWake":["notify","-u"]}"#),
            no_env,
        );
        assert_eq!(
            ok.unwrap().on_wake,
            Some(vec!["notify".into(), "-u".into()])
        );
        for bad in [
            r#"{"onWake":"notify -u"}"#,
            r#"{"onWake":[]}"#,
            r#"{"onWake":[1]}"#,
        ] {
            let err = Settings::resolve(Path::new("s"), Some(bad), no_env).unwrap_err();
            assert!(err.to_string().contains("onWake"), "{err}");
        }
    }

    #[test]
    fn webhook_is_off_by_default_and_read_from_its_object() {
        let s = Settings::resolve(Path::new("s"), None, no_env).unwrap();
        assert_eq!(s.webhook, WebhookSettings::default());
        let text = r#"{"webhook": {"enabled": true, "port": 4100, "token": "other tool's"}}"#;
        let s = Settings::resolve(Path::new("s"), Some(text), no_env).unwrap();
        assert_eq!(
            s.webhook,
            WebhookSettings {
                enabled: true,
                port: Some(4100)
            }
        );
        for bad in [
            r#"{"webhook": true}"#,
            r#"{"webhook": {"enabled": "yes"}}"#,
            r#"{"webhook": {"port": 70000}}"#,
        ] {
            let err = Settings::resolve(Path::new("s"), Some(bad), no_env).unwrap_err();
            assert!(err.to_string().contains("webhook"), "{bad}: {err}");
        }
    }

    #[test]
    fn each_key_says_what_it_must_be_and_only_an_object_is_settings() {
        let err = |text: &str| {
            Settings::resolve(Path::new("s"), Some(text), no_env)
                .unwrap_err()
                .to_string()
        };
        assert!(
            err(r#"{"waitpointTtlMs": 0}"#)
                .contains("key `waitpointTtlMs` must be an integer from 1 to 2592000000, not 0"),
            "{}",
            err(r#"{"waitpointTtlMs": 0}"#)
        );
        assert!(err(r#"{"host": "a b"}"#).contains("key `host` must be a name"));
        assert!(err(r#"{"onWakeTimeoutMs": -1}"#).contains("key `onWakeTimeoutMs`"));
        // A derived reader would take an array's items as the keys in order.
        assert!(err("[1000, 500]").contains("must be a JSON object"));
        assert!(err(r#"{"a": 1, "a": 2}"#).contains("key `a` is given twice"));
        let nulls = r#"{"onWake": null, "host": null, "otherTool": {"x": 1}}"#;
        let s = Settings::resolve(Path::new("s"), Some(nulls), no_env).unwrap();
        assert_eq!((s.on_wake, s.host), (None, None));
    }

    #[test]
    fn zero_sweep_is_allowed_and_means_off() {
        let s = Settings::resolve(Path::new("s"), Some(r#"{"waitpointSweepMs":0}"#), no_env);
        assert_eq!(s.unwrap().sweep_ms, 0);
    }
}
