//! The sending side (`cortex-signal`): build a signal body within the caps and hand it to a
//! [`Transport`]. The spool transport is the file-drop form of the spec; [`HttpTransport`] posts
//! to the daemon's loopback shim, found through the address file the daemon publishes
//! ([`published_endpoint`]).
//!
//! The HTTP client is a minimal HTTP/1.1 POST over `std::net::TcpStream` with connect and read
//! timeouts rather than an HTTP client crate: `cortex-signal` runs once per job, so its start-up
//! cost matters more than features, and the shim speaks one route on loopback.

use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde::Serialize;

use crate::durable::{self, FileLock, Root};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::records::{SignalStatus, WebhookAddress};
use crate::request::SIGNAL_PATH;
use crate::request::{MAX_BODY_BYTES, MAX_DATA_CHARS, MAX_MESSAGE_CHARS, check_member_name};

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
            DataSource::Literal(s) => (s.clone().into_bytes(), "the --data text".to_owned()),
            DataSource::Stdin => {
                let mut buf = Vec::new();
                stdin
                    .take(limit)
                    .read_to_end(&mut buf)
                    .map_err(|e| Error::io("cannot read", "standard input", e))?;
                (buf, "--data - (standard input)".to_owned())
            }
            DataSource::File(p) => {
                let what = format!("--data @{}", p.display());
                // The file the user named cannot be read: their mistake, a usage error.
                let read = std::fs::File::open(p).and_then(|f| {
                    let mut buf = Vec::new();
                    f.take(limit).read_to_end(&mut buf).map(|_| buf)
                });
                let buf = read.map_err(|e| Error::Usage(format!("{what}: cannot read it: {e}")))?;
                (buf, what)
            }
        };
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::Usage(format!("{what} is not UTF-8 text")))?;
        let n = text.chars().count();
        if n > MAX_DATA_CHARS {
            return Err(Error::Usage(format!(
                "{what} is over the limit of {MAX_DATA_CHARS} characters ({n}); \
send a shorter tail (e.g. `tail -c 8000`)"
            )));
        }
        Ok(text)
    }
}

impl SignalBody {
    /// Checks the caps and serialises the body. Oversize is a usage error, never a truncation.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        if !crate::names::is_waitpoint_id(&self.id) {
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
    /// The daemon answered over HTTP.
    Answered(HttpReply),
    /// No connection could be made, so nothing reached the daemon.
    Unreachable(String),
    /// The connection broke before an answer came: the daemon may or may not have the signal.
    NoAnswer(String),
}

/// The shim's answer: status code and its short JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    pub code: u16,
    pub body: String,
}

impl HttpReply {
    /// What the body says happened (`error`, else `message`, else `result`), for stderr. A
    /// member refusal's error already lists the expected members.
    pub fn summary(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap_or_default();
        ["error", "message", "result"]
            .iter()
            .find_map(|k| v.get(k).and_then(|x| x.as_str()))
            .unwrap_or("no explanation")
            .to_owned()
    }

    /// `result` of the body (`accepted`, `duplicate`, `closed`, `refused`, …).
    pub fn result(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        v.get("result").and_then(|r| r.as_str()).map(str::to_owned)
    }
}

/// A way of getting a signal body to the daemon.
pub trait Transport {
    fn send(&self, body: &[u8]) -> Result<Sent>;
}

/// The file-drop transport: a fresh name in the drop zone, written as `.tmp`, fsynced, renamed.
#[derive(Debug, Clone)]
pub struct SpoolTransport {
    /// The home the spool lies in: the file is written beneath it, never through a link.
    pub root: Arc<Root>,
    pub dir: PathBuf,
    /// The file's name when the signal already has an identity (`<key>.json`), so that this
    /// copy and an HTTP attempt under the same key are one signal.
    pub name: Option<String>,
}

impl SpoolTransport {
    pub fn new(root: Arc<Root>, dir: impl Into<PathBuf>) -> Self {
        SpoolTransport {
            root,
            dir: dir.into(),
            name: None,
        }
    }

    /// A spool transport that names the file after the signal's key.
    pub fn keyed(root: Arc<Root>, dir: impl Into<PathBuf>, key: &str) -> Self {
        SpoolTransport {
            root,
            dir: dir.into(),
            name: Some(format!("{key}.json")),
        }
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

/// The miss record for waitpoint `id` (see [`crate::request::MISS_KEY`]): the id alone.
pub fn miss_record(id: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ crate::request::MISS_KEY: id }))
        .expect("a string serialises")
}

impl Transport for SpoolTransport {
    fn send(&self, body: &[u8]) -> Result<Sent> {
        self.root.create_dir_private(&self.dir)?;
        let path = self
            .dir
            .join(self.name.clone().unwrap_or_else(Self::fresh_name));
        self.root.commit(&path, body)?;
        Ok(Sent::Spooled(path))
    }
}

/// An `http://host:port/path` endpoint (no TLS: the shim is loopback only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl HttpUrl {
    /// The shim's signal route on 127.0.0.1 at `port`.
    pub fn loopback(port: u16) -> Self {
        HttpUrl {
            host: "127.0.0.1".into(),
            port,
            path: SIGNAL_PATH.into(),
        }
    }

    /// Parses `--url`. Only `http://`; the port defaults to 80 and the path to `/`.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: &str| Error::Usage(format!("--url {url:?}: {why}"));
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// URLs are supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(bad("the path has spaces or control characters"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (inside, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed [ in the host"))?;
            (format!("[{inside}]"), after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (authority.to_owned(), None),
            }
        };
        if host.is_empty() || host == "[]" || host.contains('@') {
            return Err(bad("it names no host"));
        }
        let port = match port {
            None => 80,
            Some(p) => p.parse().map_err(|_| bad("the port is not a number"))?,
        };
        Ok(HttpUrl {
            host,
            port,
            path: path.to_owned(),
        })
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}:{}{}", self.host, self.port, self.path)
    }
}

/// Where the daemon says its shim listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// A daemon holds the home and published this endpoint.
    Up(HttpUrl),
    /// An address file is there but cannot be trusted (the daemon that wrote it is gone).
    Stale(String),
    /// No address file: the shim is not running for this home.
    Absent,
}

/// Reads `webhook.json`. The file counts only while some daemon holds the home's lock, so a
/// file left by a daemon that was killed is recognised as stale without trusting its pid.
pub fn published_endpoint(home: &Home) -> Published {
    let file = home.webhook_address_file();
    let record: WebhookAddress = match home.root_dir().read_json(&file) {
        Ok(Some(r)) => r,
        Ok(None) => return Published::Absent,
        Err(e) => return Published::Stale(format!("cannot use it: {e}")),
    };
    let lock = home.daemon_lock();
    let holder = FileLock::holder(home.root_dir(), &lock);
    match &holder {
        durable::LockHolder::Held { .. } => {}
        durable::LockHolder::Stale { .. } => {
            return Published::Stale(format!(
                "no daemon is running for this home ({})",
                holder.stale_text(&lock).unwrap_or_default()
            ));
        }
        durable::LockHolder::Free => {
            return Published::Stale(format!(
                "no daemon is running for this home (the shim's pid {} left it behind)",
                record.pid
            ));
        }
    }
    match HttpUrl::parse(&record.url) {
        Ok(url) => Published::Up(url),
        Err(e) => Published::Stale(format!("it holds no usable URL: {e}")),
    }
}

/// How long to wait for a connection to the shim.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long to wait for the shim's answer, which comes once the signal is durable.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of an answer read.
const MAX_REPLY_BYTES: u64 = 64 * 1024;

/// The HTTP transport: one `POST` with an `Idempotency-Key`, so a retry with the same key is
/// counted once.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    pub url: HttpUrl,
    pub idempotency_key: String,
}

impl HttpTransport {
    fn connect(&self) -> std::result::Result<TcpStream, String> {
        let host = self.url.host.trim_start_matches('[').trim_end_matches(']');
        let addrs = (host, self.url.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self.url.host))?;
        let mut last = format!("{} resolves to no address", self.url.host);
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(s) => return Ok(s),
                Err(e) => last = format!("cannot connect to {addr}: {e}"),
            }
        }
        Err(last)
    }
}

impl Transport for HttpTransport {
    fn send(&self, body: &[u8]) -> Result<Sent> {
        let mut stream = match self.connect() {
            Ok(s) => s,
            Err(why) => return Ok(Sent::Unreachable(why)),
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n\
Content-Length: {len}\r\nIdempotency-Key: {key}\r\nConnection: close\r\n\r\n",
            path = self.url.path,
            host = self.url.host,
            port = self.url.port,
            len = body.len(),
            key = self.idempotency_key,
        );
        let exchange = (|| -> std::io::Result<Vec<u8>> {
            stream.set_read_timeout(Some(READ_TIMEOUT))?;
            stream.set_write_timeout(Some(READ_TIMEOUT))?;
            stream.write_all(head.as_bytes())?;
            stream.write_all(body)?;
            stream.flush()?;
            let mut answer = Vec::new();
            (&mut stream)
                .take(MAX_REPLY_BYTES)
                .read_to_end(&mut answer)?;
            Ok(answer)
        })();
        let answer = match exchange {
            Ok(a) => a,
            Err(e) => return Ok(Sent::NoAnswer(format!("{}: {e}", self.url))),
        };
        match parse_reply(&answer) {
            Some(reply) => Ok(Sent::Answered(reply)),
            None => Ok(Sent::NoAnswer(format!(
                "{} sent no HTTP answer ({} bytes)",
                self.url,
                answer.len()
            ))),
        }
    }
}

/// Status code and body of an HTTP/1.x response read to its end.
fn parse_reply(bytes: &[u8]) -> Option<HttpReply> {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status_line = head.lines().next()?;
    let mut parts = status_line.split(' ');
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?.parse().ok()?;
    Some(HttpReply {
        code,
        body: body.trim().to_owned(),
    })
}

/// Serialises `body`, dropping the oldest part of its data until the whole body fits the
/// request cap. Data heavy in control characters (colour codes) grows when JSON-escaped, so a
/// tail within the character cap can still be too many bytes.
pub fn fit_body(mut body: SignalBody) -> crate::error::Result<Vec<u8>> {
    loop {
        let encoded = serde_json::to_vec(&body).map_or(0, |b| b.len());
        let data_chars = body.data.as_ref().map_or(0, |d| d.chars().count());
        if encoded <= MAX_BODY_BYTES || data_chars == 0 {
            return body.to_bytes();
        }
        let data = body.data.take().unwrap_or_default();
        body.data = Some(data.chars().skip(data_chars - data_chars * 3 / 4).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_body_shrinks_escaped_data_until_the_body_fits() {
        let body = SignalBody {
            id: "wp_0123456789ab".into(),
            secret: "s".into(),
            status: SignalStatus::Fail,
            message: Some("exit=1".into()),
            member: None,
            data: Some("\u{1b}".repeat(MAX_DATA_CHARS)),
        };
        let bytes = fit_body(body).unwrap();
        assert!(bytes.len() <= MAX_BODY_BYTES);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(!v["data"].as_str().unwrap().is_empty());
    }

    #[test]
    fn urls_parse_with_defaults_and_refuse_what_we_cannot_speak() {
        assert_eq!(
            HttpUrl::parse("http://127.0.0.1:3001/webhook/signal").unwrap(),
            HttpUrl::loopback(3001)
        );
        let u = HttpUrl::parse("http://localhost").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("localhost", 80, "/")
        );
        let u = HttpUrl::parse("http://[::1]:9/x").unwrap();
        assert_eq!(u.to_string(), "http://[::1]:9/x");
        for bad in [
            "https://127.0.0.1/",
            "127.0.0.1:3001",
            "http://:80/",
            "http://h:port/",
            "http://h/a b",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replies_are_read_for_code_and_body() {
        let r = parse_reply(
            b"HTTP/1.1 410 Gone\r\nContent-Length: \
                              3\r\n\r\n{\"result\":\"closed\",\"message\":\"already resolved\"}\n",
        )
        .unwrap();
        assert_eq!(r.code, 410);
        assert_eq!(r.result().as_deref(), Some("closed"));
        assert_eq!(r.summary(), "already resolved");
        assert!(parse_reply(b"garbage").is_none());
    }
}
