//! HTTP/1.1 framing for the shim: a request head parsed and checked (host, origin, lengths), how
//! much of a buffer is one request, and a reply written with its status line. No routes: what a
//! request means is `routes.rs`'s business.

use super::*;

/// The most bytes one request may take: a full head and the largest body of any route.
pub(super) const MAX_REQUEST_BYTES: usize = MAX_HEAD_BYTES + callbacks::MAX_BODY_BYTES;

/// The callback route's rest (`<mode>/<token>`) when `path` is one, in either form.
pub(super) fn callback_rest(path: &str) -> Option<&str> {
    path.strip_prefix(CALLBACK_PREFIX)
        .or_else(|| path.strip_prefix(SHORT_CALLBACK_PREFIX))
}

/// The body limit of the route `path` names: 256 KB for callbacks, 64 KB for signals.
pub(super) fn body_limit(path: &str) -> usize {
    if callback_rest(path).is_some() {
        callbacks::MAX_BODY_BYTES
    } else {
        MAX_BODY_BYTES
    }
}

/// A request that can be answered now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ready {
    /// No end of head within [`MAX_HEAD_BYTES`].
    HeadTooLarge,
    /// The head does not parse.
    BadHead(String),
    /// The head alone decides (the body is absent, too large, or not framed by a length);
    /// the connection closes after the answer.
    HeadOnly(Head),
    /// Head and body are all in the buffer: `total` bytes, the body starting at `head_len`.
    Whole {
        head: Head,
        head_len: usize,
        total: usize,
    },
}

/// Whether the request at the front of `buf` can be answered yet. `None`: wait for more bytes
/// (the `bool` says whether the client is waiting for `100 Continue` first).
pub(super) fn framing(buf: &[u8]) -> std::result::Result<Ready, bool> {
    let Some(head_len) = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4) else {
        return if buf.len() >= MAX_HEAD_BYTES {
            Ok(Ready::HeadTooLarge)
        } else {
            Err(false)
        };
    };
    if head_len > MAX_HEAD_BYTES {
        return Ok(Ready::HeadTooLarge);
    }
    let head = match parse_head(&buf[..head_len]) {
        Ok(h) => h,
        Err(HeadError::TooLarge) => return Ok(Ready::HeadTooLarge),
        Err(HeadError::Bad(why)) => return Ok(Ready::BadHead(why)),
    };
    match body_length(&head) {
        Err(_) => Ok(Ready::HeadOnly(head)),
        Ok(n) if buf.len() >= head_len + n => Ok(Ready::Whole {
            head,
            head_len,
            total: head_len + n,
        }),
        Ok(_) => Err(head.expect_continue),
    }
}

/// The body's length from `Content-Length`, checked before a byte of it is read; or the answer
/// to give without reading it.
pub(super) fn body_length(head: &Head) -> std::result::Result<usize, Reply> {
    if head.transfer_encoding {
        return Err(refused(
            411,
            "send the body with a Content-Length, not a Transfer-Encoding",
        ));
    }
    let length = match head.content_length.as_slice() {
        [] => return Ok(0),
        // Too many digits for a u64 is simply too large.
        [one] if !one.is_empty() && one.bytes().all(|b| b.is_ascii_digit()) => {
            one.parse::<u64>().unwrap_or(u64::MAX)
        }
        _ => return Err(refused(400, "Content-Length must be one decimal number")),
    };
    let limit = body_limit(&head.path);
    if length > limit as u64 {
        return Err(refused(
            413,
            format!("the body is over the {limit}-byte limit"),
        ));
    }
    Ok(length as usize)
}

/// The parts of a request head the shim looks at.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) method: String,
    pub(super) path: String,
    http10: bool,
    pub(super) host: Option<String>,
    pub(super) origin: bool,
    pub(super) content_length: Vec<String>,
    pub(super) transfer_encoding: bool,
    pub(super) expect_continue: bool,
    pub(super) connection_close: bool,
    pub(super) connection_keep_alive: bool,
    pub(super) idempotency_key: Option<Vec<u8>>,
    pub(super) authorization: Option<Vec<u8>>,
}

impl Head {
    pub(super) fn keep_alive(&self) -> bool {
        if self.http10 {
            self.connection_keep_alive
        } else {
            !self.connection_close
        }
    }
}

pub(super) enum HeadError {
    TooLarge,
    Bad(String),
}

/// Parses a complete head (`bytes` ends at its blank line).
pub(super) fn parse_head(bytes: &[u8]) -> std::result::Result<Head, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(HeadError::Bad("incomplete request".into())),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(e) => return Err(HeadError::Bad(format!("malformed request: {e}"))),
    }
    let mut head = Head {
        method: req.method.unwrap_or_default().to_owned(),
        path: req.path.unwrap_or_default().to_owned(),
        http10: req.version == Some(0),
        ..Head::default()
    };
    for h in req.headers.iter() {
        let value = || String::from_utf8_lossy(h.value).trim().to_owned();
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            if head.host.is_some() {
                return Err(HeadError::Bad("more than one Host header".into()));
            }
            head.host = Some(value());
        } else if name.eq_ignore_ascii_case("origin") {
            head.origin = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            head.content_length.push(value());
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.transfer_encoding = true;
        } else if name.eq_ignore_ascii_case("expect") {
            head.expect_continue = value().eq_ignore_ascii_case("100-continue");
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value().split(',') {
                let token = token.trim();
                head.connection_close |= token.eq_ignore_ascii_case("close");
                head.connection_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("idempotency-key") {
            head.idempotency_key = Some(h.value.to_vec());
        } else if name.eq_ignore_ascii_case("authorization") {
            head.authorization = Some(h.value.to_vec());
        }
    }
    Ok(head)
}

/// Whether a `Host` header names this machine: a loopback IP literal or `localhost`, with an
/// optional port. Anything else is a name some DNS answered with 127.0.0.1 (rebinding).
pub(super) fn is_loopback_host(host: &str) -> bool {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return false;
        };
        match after {
            "" => (inside, None),
            _ => match after.strip_prefix(':') {
                Some(p) => (inside, Some(p)),
                None => return false,
            },
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    port_ok
        && (name.eq_ignore_ascii_case("localhost")
            || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()))
}

/// A response: status and a short JSON body saying what happened.
pub(super) struct Reply {
    pub(super) code: u16,
    pub(super) body: Value,
    pub(super) allow: Option<&'static str>,
}

pub(super) fn reply(code: u16, body: Value) -> Reply {
    Reply {
        code,
        body,
        allow: None,
    }
}

pub(super) fn refused(code: u16, error: impl Into<String>) -> Reply {
    reply(code, json!({ "result": "refused", "error": error.into() }))
}

pub(super) fn reason_phrase(code: u16) -> &'static str {
    http::StatusCode::from_u16(code)
        .ok()
        .and_then(|c| c.canonical_reason())
        .unwrap_or("Unknown")
}

pub(super) fn write_reply(
    stream: &mut TcpStream,
    r: &Reply,
    close: bool,
    head_only: bool,
) -> io::Result<()> {
    let body = format!("{}\n", r.body);
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nCache-Control: no-store\r\n",
        r.code,
        reason_phrase(r.code),
        body.len()
    );
    if let Some(allow) = r.allow {
        out.push_str(&format!("Allow: {allow}\r\n"));
    }
    if close {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(&body);
    }
    stream.write_all(out.as_bytes())?;
    stream.flush()
}
