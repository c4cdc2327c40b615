//! The sending side (`cortex-signal`): build a signal body within the caps and hand it to a
//! [`Transport`]. The spool transport is the file-drop form of the spec; other transports (the
//! HTTP shim) plug in behind the same trait.

use std::io::Read;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::ingress::{MAX_BODY_BYTES, MAX_DATA_CHARS, MAX_MESSAGE_CHARS, check_member_name};
use crate::model::SignalStatus;
use crate::store;

/// The JSON body every transport sends: the spec's fields, nulls omitted.
#[derive(Debug, Clone, Serialize)]
pub struct SignalBody {
    pub id: String,
    pub secret: String,
    pub status: SignalStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

/// Where `--data` comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    File(PathBuf),
    Stdin,
    Literal(String),
}

impl DataSource {
    /// `@file`, `-`, or the literal text.
    pub fn parse(arg: &str) -> Self {
        if arg == "-" {
            DataSource::Stdin
        } else if let Some(path) = arg.strip_prefix('@') {
            DataSource::File(PathBuf::from(path))
        } else {
            DataSource::Literal(arg.to_owned())
        }
    }

    /// Reads the data, refusing (never truncating) past the cap. At most one byte more than the
    /// largest allowed text is read, so a huge file or endless stdin costs nothing.
    pub fn read(&self, stdin: impl Read) -> Result<String> {
        let limit = (MAX_DATA_CHARS * 4 + 1) as u64;
        let (bytes, what) = match self {
            DataSource::Literal(s) => (s.clone().into_bytes(), "--data".to_owned()),
            DataSource::Stdin => {
                let mut buf = Vec::new();
                stdin
                    .take(limit)
                    .read_to_end(&mut buf)
                    .map_err(|e| Error::io("cannot read", "standard input", e))?;
                (buf, "standard input".to_owned())
            }
            DataSource::File(p) => {
                let f = std::fs::File::open(p).map_err(|e| Error::io("cannot open", p, e))?;
                let mut buf = Vec::new();
                f.take(limit)
                    .read_to_end(&mut buf)
                    .map_err(|e| Error::io("cannot read", p, e))?;
                (buf, p.display().to_string())
            }
        };
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::Usage(format!("--data from {what} is not UTF-8 text")))?;
        let n = text.chars().count();
        if n > MAX_DATA_CHARS {
            return Err(Error::Usage(format!(
                "--data from {what} is over the limit of {MAX_DATA_CHARS} characters; \
send a shorter tail (e.g. `tail -c 8000`)"
            )));
        }
        Ok(text)
    }
}

impl SignalBody {
    /// Checks the caps and serialises the body. Oversize is a usage error, never a truncation.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        if !crate::ingress::is_waitpoint_id(&self.id) {
            return Err(Error::Usage(format!(
                "--id must be wp_ followed by 12 hex digits, not {:?}",
                self.id
            )));
        }
        if self.secret.is_empty() {
            return Err(Error::Usage("--secret is empty".into()));
        }
        if let Some(m) = &self.message {
            let n = m.chars().count();
            if n > MAX_MESSAGE_CHARS {
                return Err(Error::Usage(format!(
                    "--message is {n} characters; the limit is {MAX_MESSAGE_CHARS}"
                )));
            }
        }
        if let Some(m) = &self.member {
            check_member_name(m).map_err(|e| Error::Usage(format!("--member: {e}")))?;
        }
        if let Some(d) = &self.data {
            let n = d.chars().count();
            if n > MAX_DATA_CHARS {
                return Err(Error::Usage(format!(
                    "--data is {n} characters; the limit is {MAX_DATA_CHARS}"
                )));
            }
        }
        let bytes = serde_json::to_vec(self).expect("a signal body always serialises");
        if bytes.len() > MAX_BODY_BYTES {
            return Err(Error::Usage(format!(
                "the signal is {} bytes; the limit is {MAX_BODY_BYTES}",
                bytes.len()
            )));
        }
        Ok(bytes)
    }
}

/// What a transport did with a signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Written durably into a spool for the daemon to collect.
    Spooled(PathBuf),
}

/// A way of getting a signal body to the daemon.
pub trait Transport {
    fn send(&self, body: &[u8]) -> Result<Sent>;
}

/// The file-drop transport: a fresh name in the drop zone, written as `.tmp`, fsynced, renamed.
#[derive(Debug, Clone)]
pub struct SpoolTransport {
    pub dir: PathBuf,
}

impl SpoolTransport {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SpoolTransport { dir: dir.into() }
    }

    /// A name no other writer will pick: time in nanoseconds, pid, and 32 random bits.
    fn fresh_name() -> String {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let tag: u32 = rand::rng().next_u32();
        format!("{nanos}-{}-{tag:08x}.json", std::process::id())
    }
}

impl Transport for SpoolTransport {
    fn send(&self, body: &[u8]) -> Result<Sent> {
        store::create_dir_private(&self.dir)?;
        let path = self.dir.join(Self::fresh_name());
        store::commit(&path, body)?;
        Ok(Sent::Spooled(path))
    }
}
