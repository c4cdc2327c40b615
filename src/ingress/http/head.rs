//! What the shim reads of a request head (method, target, and the headers its rules look at:
//! Host, Origin, the body's framing, `Idempotency-Key`, `Authorization`, and for the operator
//! page `Cookie`, `If-None-Match` and `X-CSRF-Token`), the body limit of each route, and the reply
//! it sends (status, a short JSON body or one of the page's files, the headers that go with it).
//! Socket-free: hyper parses the bytes (`serve.rs`), a [`Head`] is built from what it parsed, and
//! what a request means is `routes.rs`'s business.

use super::{CALLBACK_PREFIX, SHORT_CALLBACK_PREFIX};
use crate::engine::callbacks::{self};
use crate::request::MAX_BODY_BYTES;
use http::header::{ALLOW, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Bytes;
use serde_json::{Value, json};
use std::net::IpAddr;

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
    /// The request target as sent (path and query; never normalised, so `/a/../b` is not `/b`).
    pub(super) path: String,
    pub(super) host: Option<String>,
    /// The `Origin` header as sent: a web page's request carries one.
    pub(super) origin: Option<String>,
    pub(super) content_length: Vec<String>,
    pub(super) transfer_encoding: bool,
    pub(super) idempotency_key: Option<Vec<u8>>,
    pub(super) authorization: Option<Vec<u8>>,
    /// Every `Cookie` header, joined as one list.
    pub(super) cookie: Option<String>,
    pub(super) if_none_match: Option<String>,
    /// The operator page's CSRF token (`X-CSRF-Token`).
    pub(super) csrf: Option<String>,
}

impl Head {
    /// The head hyper parsed, or the answer to a head the shim refuses outright (a second
    /// `Host`: which one names the target would be a guess).
    pub(super) fn from_parts(parts: &http::request::Parts) -> std::result::Result<Head, Reply> {
        use http::header::{
            AUTHORIZATION, CONTENT_LENGTH, COOKIE, HOST, IF_NONE_MATCH, ORIGIN, TRANSFER_ENCODING,
        };
        let h = &parts.headers;
        let text = |v: &http::HeaderValue| String::from_utf8_lossy(v.as_bytes()).trim().to_owned();
        let mut hosts = h.get_all(HOST).iter();
        let host = hosts.next().map(text);
        if hosts.next().is_some() {
            return Err(refused(400, "more than one Host header"));
        }
        // The last of repeated headers counts, as it did when the shim parsed heads itself.
        let last = |name: &str| {
            h.get_all(name)
                .iter()
                .next_back()
                .map(|v| v.as_bytes().to_vec())
        };
        let cookies: Vec<String> = h.get_all(COOKIE).iter().map(text).collect();
        Ok(Head {
            method: parts.method.as_str().to_owned(),
            path: parts.uri.to_string(),
            host,
            origin: h.get_all(ORIGIN).iter().next_back().map(text),
            content_length: h.get_all(CONTENT_LENGTH).iter().map(text).collect(),
            transfer_encoding: h.contains_key(TRANSFER_ENCODING),
            idempotency_key: last("idempotency-key"),
            authorization: last(AUTHORIZATION.as_str()),
            cookie: (!cookies.is_empty()).then(|| cookies.join("; ")),
            if_none_match: h.get_all(IF_NONE_MATCH).iter().next_back().map(text),
            csrf: last("x-csrf-token").map(|v| String::from_utf8_lossy(&v).trim().to_owned()),
        })
    }
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
    /// Seconds a 429 or 503 sender should wait (`Retry-After`).
    pub(super) retry_after_s: Option<u64>,
    /// The operator page's answers: a body of their own with its headers, sent instead of
    /// `body`'s JSON (boxed: every other answer goes without).
    pub(super) page: Option<Box<PageBody>>,
}

/// A body other than a short JSON one: the operator page's files, its view (whose bytes its
/// `ETag` is made from) and its short texts, with their content type and further headers
/// (security headers, a cookie, `ETag`, `Location`).
pub(super) struct PageBody {
    pub(super) content_type: &'static str,
    pub(super) bytes: Bytes,
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
}

pub(super) fn reply(code: u16, body: Value) -> Reply {
    Reply {
        code,
        body,
        allow: None,
        retry_after_s: None,
        page: None,
    }
}

pub(super) fn refused(code: u16, error: impl Into<String>) -> Reply {
    reply(code, json!({ "result": "refused", "error": error.into() }))
}

impl Reply {
    /// The response hyper writes: the JSON body and its headers, and `Connection: close` when
    /// the connection must end after it (the body was left unread, or the head was refused).
    pub(super) fn into_response(self, close: bool) -> Response<Full<Bytes>> {
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (content_type, bytes, headers) = match self.page {
            Some(page) => (page.content_type, page.bytes, page.headers),
            None => (
                "application/json",
                Bytes::from(format!("{}\n", self.body)),
                Vec::new(),
            ),
        };
        let mut r = Response::new(Full::new(bytes));
        *r.status_mut() = status;
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(allow) = self.allow {
            h.insert(ALLOW, HeaderValue::from_static(allow));
        }
        if let Some(s) = self.retry_after_s {
            h.insert(hyper::header::RETRY_AFTER, HeaderValue::from(s));
        }
        if close {
            h.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        for (name, value) in headers {
            h.insert(name, value);
        }
        r
    }
}

/// A head written as text (`METHOD TARGET HTTP/1.1` and `Name: value` lines), as hyper would
/// hand it over: for testing the rules without a socket.
#[cfg(test)]
pub(super) fn head_of(text: &str) -> std::result::Result<Head, Reply> {
    let mut lines = text.lines();
    let mut first = lines.next().unwrap_or_default().split_whitespace();
    let mut b = http::Request::builder()
        .method(first.next().unwrap_or_default())
        .uri(first.next().unwrap_or_default());
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').expect("a header line");
        b = b.header(name.trim(), value.trim());
    }
    let (parts, ()) = b.body(()).expect("a valid request").into_parts();
    Head::from_parts(&parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::ingress::http::HttpConfig;
    use crate::ingress::http::MISS_BUDGET;
    use crate::ingress::http::MISS_WINDOW_MS;
    use crate::ingress::http::MissBudget;
    use crate::request::SIGNAL_PATH;

    #[test]
    fn every_status_the_shim_sends_goes_out_with_its_reason_phrase() {
        for (code, phrase) in [
            (200, "OK"),
            (201, "Created"),
            (202, "Accepted"),
            (401, "Unauthorized"),
            (404, "Not Found"),
            (405, "Method Not Allowed"),
            (408, "Request Timeout"),
            (409, "Conflict"),
            (410, "Gone"),
            (411, "Length Required"),
            (413, "Payload Too Large"),
            (422, "Unprocessable Entity"),
            (429, "Too Many Requests"),
            (503, "Service Unavailable"),
        ] {
            let r = refused(code, "x").into_response(false);
            assert_eq!(r.status().canonical_reason(), Some(phrase), "{code}");
        }
    }

    #[test]
    fn only_loopback_binds_are_accepted() {
        for ok in ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"] {
            assert!(HttpConfig::new(ok, 0).is_ok(), "{ok}");
        }
        for bad in [
            "0.0.0.0",
            "192.168.1.10",
            "::",
            "example.com",
            "::ffff:127.0.0.1",
        ] {
            let err = HttpConfig::new(bad, 0).unwrap_err();
            assert_eq!(err.kind(), crate::error::ErrorKind::Usage, "{bad}");
        }
        let msg = HttpConfig::new("0.0.0.0", 3001).unwrap_err().to_string();
        assert!(msg.contains("loopback"), "{msg}");
    }

    #[test]
    fn host_must_be_loopback_or_localhost() {
        for ok in [
            "127.0.0.1",
            "127.0.0.1:3001",
            "localhost",
            "LOCALHOST:80",
            "[::1]",
            "[::1]:3001",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:3001",
            "localhost.evil.example",
            "10.0.0.1:3001",
            "127.0.0.1:",
            "127.0.0.1:x",
            "[::1",
            "",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn the_budget_is_sixty_misses_in_a_sliding_minute() {
        let mut b = MissBudget::default();
        let t0 = Timestamp::from_millis(1_000_000);
        for i in 0..MISS_BUDGET {
            assert!(!b.spent(t0.plus_ms(i as i64)));
            b.record(t0.plus_ms(i as i64));
        }
        assert!(b.spent(t0.plus_ms(100)));
        // The first miss leaves the window one minute after it happened.
        assert!(b.spent(t0.plus_ms(MISS_WINDOW_MS - 1)));
        assert!(!b.spent(t0.plus_ms(MISS_WINDOW_MS)));
    }

    #[test]
    fn a_body_is_sized_from_its_route_and_never_by_its_claim() {
        let head = "POST /webhook/signal HTTP/1.1\nHost: 127.0.0.1\n";
        for claim in [
            "1000000000",
            "1000000000000000000",
            "99999999999999999999999",
        ] {
            let h = head_of(&format!("{head}Content-Length: {claim}\n"))
                .ok()
                .unwrap();
            assert_eq!(body_length(&h).err().map(|r| r.code), Some(413), "{claim}");
        }
        let h = head_of(&format!("{head}Content-Length: 5\n")).ok().unwrap();
        assert_eq!(body_length(&h).ok(), Some(5));
        let h = head_of(&format!("{head}Content-Length: 5\nContent-Length: 5\n"))
            .ok()
            .unwrap();
        assert_eq!(body_length(&h).err().map(|r| r.code), Some(400));
        let h = head_of(&format!("{head}Transfer-Encoding: chunked\n"))
            .ok()
            .unwrap();
        assert_eq!(body_length(&h).err().map(|r| r.code), Some(411));
        let callback =
            "POST /api/callbacks/wake/t HTTP/1.1\nHost: 127.0.0.1\nContent-Length: 100000\n";
        assert_eq!(
            body_length(&head_of(callback).ok().unwrap()).ok(),
            Some(100_000)
        );
    }

    #[test]
    fn heads_are_read_for_what_the_shim_checks() {
        let h = head_of(
            "POST /webhook/signal HTTP/1.1\nHost: 127.0.0.1:3001\nContent-Length: 12\n\
Idempotency-Key: abc\nOrigin: https://evil.example\nAuthorization: Bearer t\n",
        )
        .ok()
        .unwrap();
        assert_eq!((h.method.as_str(), h.path.as_str()), ("POST", SIGNAL_PATH));
        assert_eq!(h.host.as_deref(), Some("127.0.0.1:3001"));
        assert_eq!(h.content_length, vec!["12".to_owned()]);
        assert_eq!(h.idempotency_key.as_deref(), Some(&b"abc"[..]));
        assert_eq!(h.authorization.as_deref(), Some(&b"Bearer t"[..]));
        assert_eq!(h.origin.as_deref(), Some("https://evil.example"));
        assert!(!h.transfer_encoding);
        // The target is kept as sent: `..` is not resolved into another route.
        let dotted = head_of("GET /webhook/signal/../healthz HTTP/1.1\nHost: a\n")
            .ok()
            .unwrap();
        assert_eq!(dotted.path, "/webhook/signal/../healthz");
        let two_hosts = head_of("GET / HTTP/1.1\nHost: a\nHost: b\n");
        assert_eq!(two_hosts.err().map(|r| r.code), Some(400));
    }
}
