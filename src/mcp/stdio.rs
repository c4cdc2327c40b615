//! The stdio transport, with two additions the SDK's lacks: it notices when the client has gone
//! (end of stdin), so a call still waiting can give back what it took instead of answering
//! nobody; and a request the SDK cannot read still gets an answer its client can match.
//!
//! The SDK answers a line it cannot parse with an error that carries no `id` (JSON-RPC wants
//! the request's id whenever it can be read), so a client waiting on that id waits for ever.
//! Each line is checked here first: one with a readable id that the SDK would not parse is
//! handed on as a request of our own method [`REFUSED`] under the same id, naming what was
//! wrong, and the server answers it with an error ([`refusal_for`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use rmcp::ErrorData;
use rmcp::model::ClientJsonRpcMessage;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, ReadBuf};

/// The method a request the SDK could not read is handed on as.
pub const REFUSED: &str = "waitpoint/unreadable-request";

/// The longest line checked; a longer one goes through as it is, for the SDK's own limit.
const MAX_CHECKED_LINE: usize = 1 << 20;

/// Set once stdin reached its end: the client closed it or exited.
#[derive(Debug, Clone, Default)]
pub struct ClientGone(Arc<AtomicBool>);

impl ClientGone {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Stdin, read line by line: each line checked (see the module doc), [`ClientGone`] set at the
/// end.
pub struct WatchedStdin {
    inner: tokio::io::Stdin,
    gone: ClientGone,
    /// The line being read.
    line: Vec<u8>,
    /// Checked bytes not yet handed to the reader, from `ready_at` on.
    ready: Vec<u8>,
    ready_at: usize,
    /// In a line too long to check: bytes go through until its end.
    passing: bool,
}

/// The transport pair for `serve`, and the flag its reader sets.
pub fn stdio() -> ((WatchedStdin, tokio::io::Stdout), ClientGone) {
    let gone = ClientGone::default();
    let reader = WatchedStdin {
        inner: tokio::io::stdin(),
        gone: gone.clone(),
        line: Vec::new(),
        ready: Vec::new(),
        ready_at: 0,
        passing: false,
    };
    ((reader, tokio::io::stdout()), gone)
}

impl WatchedStdin {
    /// Takes in bytes read from stdin: whole lines are checked into `ready`.
    fn take_in(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let end = bytes.iter().position(|&b| b == b'\n');
            let (part, rest) = match end {
                Some(i) => (&bytes[..=i], &bytes[i + 1..]),
                None => (bytes, &[][..]),
            };
            bytes = rest;
            if self.passing {
                self.ready.extend_from_slice(part);
                self.passing = end.is_none();
                continue;
            }
            self.line.extend_from_slice(part);
            if end.is_some() {
                let line = std::mem::take(&mut self.line);
                self.ready.extend_from_slice(&checked(&line));
            } else if self.line.len() > MAX_CHECKED_LINE {
                self.ready.append(&mut self.line);
                self.passing = true;
            }
        }
    }
}

impl AsyncRead for WatchedStdin {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.ready_at < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.ready_at);
                buf.put_slice(&this.ready[this.ready_at..this.ready_at + n]);
                this.ready_at += n;
                if this.ready_at == this.ready.len() {
                    this.ready.clear();
                    this.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut raw = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut raw) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    this.gone.0.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(())) if raw.filled().is_empty() => {
                    // The end: a last line without its newline goes on as it is.
                    if !this.line.is_empty() {
                        this.ready.append(&mut this.line);
                        continue;
                    }
                    this.gone.0.store(true, Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(())) => {
                    let filled = raw.filled().to_vec();
                    this.take_in(&filled);
                }
            }
        }
    }
}

/// The line as the SDK should see it: unchanged when it reads it, or when no id can be read
/// from it (then there is nobody to answer); else a [`REFUSED`] request under the same id.
fn checked(line: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    if body.iter().all(u8::is_ascii_whitespace) {
        return line.into();
    }
    let Err(e) = serde_json::from_slice::<ClientJsonRpcMessage>(body) else {
        return line.into();
    };
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(body) else {
        return line.into();
    };
    let id = match request.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => return line.into(),
    };
    let method = request.get("method").and_then(Value::as_str);
    let version_ok = request.get("jsonrpc") == Some(&json!("2.0"));
    let reason = match request.get("params") {
        _ if !version_ok => r#""jsonrpc" must be "2.0""#.to_owned(),
        _ if method.is_none() => r#""method" must be a string"#.to_owned(),
        Some(p) if !p.is_object() => format!("params must be an object, not {p}"),
        _ => e.to_string(),
    };
    let replaced = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": REFUSED,
        "params": {
            "method": method,
            "invalid_request": method.is_none() || !version_ok,
            "reason": reason,
        },
    });
    let mut out = replaced.to_string().into_bytes();
    out.push(b'\n');
    out.into()
}

/// The MCP requests this server answers; one of these with params it cannot read is refused as
/// invalid params, anything else as an unknown method.
const KNOWN: [&str; 5] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "server/discover",
];

/// The error for a request the SDK handed over as a method of its own: a [`REFUSED`] line, or a
/// known method whose params it could not read.
pub fn refusal_for(method: &str, params: Option<&Value>) -> ErrorData {
    if method == REFUSED {
        let p = params.cloned().unwrap_or_default();
        let named = p["method"].as_str().unwrap_or("the request");
        let text = format!("{named}: {}", p["reason"].as_str().unwrap_or("unreadable"));
        return if p["invalid_request"] == true {
            ErrorData::invalid_request(text, None)
        } else {
            ErrorData::invalid_params(text, None)
        };
    }
    if KNOWN.contains(&method) {
        return ErrorData::invalid_params(
            format!("{method}: params do not match its schema"),
            None,
        );
    }
    ErrorData::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!("method not found: {method}"),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_readable_line_passes_and_an_unreadable_one_keeps_its_id() {
        let good = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";
        assert_eq!(&*checked(good), good);
        let bad = b"{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"tools/list\",\"params\":5}\n";
        let v: Value = serde_json::from_slice(&checked(bad)).unwrap();
        assert_eq!(
            (v["id"].clone(), v["method"].clone()),
            (json!(8), json!(REFUSED))
        );
        assert_eq!(v["params"]["method"], "tools/list");
        // No id: nobody to answer, so it goes on as it is.
        assert_eq!(&*checked(b"[1,2]\n"), b"[1,2]\n");
        assert_eq!(&*checked(b"not json\n"), b"not json\n");
    }
}
