//! A scripted model server on 127.0.0.1 for driving the real agent harnesses: it speaks the
//! Anthropic Messages API as Claude Code uses it (`POST /v1/messages`, streamed or not) and the
//! OpenAI Responses API as Codex uses it (`POST /v1/responses`, streamed), the Gemini API as
//! Gemini CLI uses it (`POST /v1beta/models/M:streamGenerateContent?alt=sse`), and a test's script
//! decides each answer from the request. Every request is recorded so a test can assert on what
//! the harness sent (a tool result, a wake's text, a session header) and wait for it.
//!
//! Plain std: one thread accepts, one thread serves each connection, and every reply closes its
//! connection, so there is no keep-alive state to get wrong and nothing outlives a test for long.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// What the server answers, without asking the script, to the harness's side requests (Claude Code
/// asks for a session title in a request that offers no tools), so scripts only deal with
/// conversation turns.
const HOUSEKEEPING_REPLY: &str = r#"{"title": "Scripted session"}"#;

/// A client that connects and then says nothing must not pin a thread forever.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// One request the server received: method, path (with its query), headers (names in lower
/// case) and the JSON body (a string when the body was not JSON, null when there was none).
#[derive(Debug, Clone)]
pub struct Request {
    json: Value,
}

/// What the model says in one turn: a text, which ends the turn, or a tool call, which ends
/// it with `tool_use` (Anthropic) or a function call (Responses) so that the harness runs the
/// tool and sends its result back in the next request.
#[derive(Debug, Clone)]
pub enum Reply {
    Text(String),
    Tool { name: String, input: Value },
}

type Script = dyn Fn(&Request) -> Reply + Send + Sync;

/// The running server; it stops accepting when dropped.
pub struct ModelServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    script: Box<Script>,
    log: Mutex<Vec<Request>>,
    logged: Condvar,
    stopping: AtomicBool,
    next_id: AtomicU64,
}

impl ModelServer {
    /// Starts a server on an ephemeral port of 127.0.0.1 that answers every conversation turn
    /// with `script(request)`.
    pub fn start(script: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the model server");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            script: Box::new(script),
            log: Mutex::new(Vec::new()),
            logged: Condvar::new(),
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        });
        let acceptor = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if shared.stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let shared = shared.clone();
                    std::thread::spawn(move || serve(&shared, stream));
                }
            })
        };
        ModelServer {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The base URL without a trailing slash, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order, side requests included.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.log().clone()
    }

    /// Waits until a request matching `pred` has arrived (possibly before the call) and
    /// returns the first such; panics after `timeout` with a summary of what did arrive.
    pub fn wait_for_request(&self, pred: impl Fn(&Request) -> bool, timeout: Duration) -> Request {
        let deadline = Instant::now() + timeout;
        let mut log = self.shared.log();
        loop {
            if let Some(found) = log.iter().find(|r| pred(r)) {
                return found.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                let summary = summarize(&log);
                drop(log);
                panic!("no matching request within {timeout:?}; received:\n{summary}");
            }
            log = self
                .shared
                .logged
                .wait_timeout(log, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// One line per request received so far, for failure messages.
    pub fn summary(&self) -> String {
        summarize(&self.shared.log())
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // The acceptor sits in accept(2): one more connection wakes it to see the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

impl Shared {
    fn log(&self) -> MutexGuard<'_, Vec<Request>> {
        // A panicking script is reported to its client; the log itself stays usable.
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn id(&self, prefix: &str) -> String {
        format!(
            "{prefix}_{:020}",
            self.next_id.fetch_add(1, Ordering::SeqCst)
        )
    }
}

fn summarize(log: &[Request]) -> String {
    log.iter()
        .map(|r| {
            let mut turn = match r.tool_result() {
                Some(result) => format!("tool result: {result}"),
                None => format!("user: {}", r.last_user_text()),
            };
            turn = turn.replace('\n', " ");
            if let Some((cut, _)) = turn.char_indices().nth(160) {
                turn.truncate(cut);
            }
            format!("  {} {}  {turn}", r.method(), r.path())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Reply {
    /// A turn that says `text` and ends.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Text(text.into())
    }

    /// A turn that calls the tool `name` with `input`. Name tools the way Claude Code does,
    /// `mcp__<server>__<tool>` for MCP tools; for Codex the server sends such a name as the
    /// tool `<tool>` in the namespace `mcp__<server>`, which is how Codex offers them.
    pub fn tool(name: impl Into<String>, input: Value) -> Reply {
        Reply::Tool {
            name: name.into(),
            input,
        }
    }

    fn stop_reason(&self) -> &'static str {
        match self {
            Reply::Text(_) => "end_turn",
            Reply::Tool { .. } => "tool_use",
        }
    }
}

impl Request {
    pub fn method(&self) -> &str {
        self.json["method"].as_str().unwrap_or_default()
    }

    /// The request target as sent, query included (`/v1/messages?beta=true`).
    pub fn path(&self) -> &str {
        self.json["path"].as_str().unwrap_or_default()
    }

    /// A header's value; `name` in any case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.json["headers"][name.to_ascii_lowercase()].as_str()
    }

    pub fn body(&self) -> &Value {
        &self.json["body"]
    }

    /// The harness's session: Claude Code's `X-Claude-Code-Session-Id`, or the `session-id`
    /// Codex sends (its thread id).
    pub fn session_id(&self) -> Option<&str> {
        self.header("x-claude-code-session-id")
            .or_else(|| self.header("session-id"))
            .or_else(|| self.header("x-session-id"))
    }

    /// The text of the newest user message (all its text parts, joined by newlines); empty when
    /// there is none. Claude Code puts system reminders in the same message as what was typed,
    /// so match with `contains`.
    pub fn last_user_text(&self) -> String {
        let Some(message) = self.turns().rev().find(|m| m["role"] == "user") else {
            return String::new();
        };
        if self.api() == Api::Gemini {
            return gemini_texts(message);
        }
        match &message["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter(|p| matches!(p["type"].as_str(), Some("text" | "input_text")))
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        }
    }

    /// When the newest turn carries a tool's result (an Anthropic `tool_result` block, a
    /// Responses `function_call_output` item), its text.
    pub fn tool_result(&self) -> Option<String> {
        let newest = self.turns().rev().find(|m| {
            m["role"] == "user" || m["role"] == "tool" || m["type"] == "function_call_output"
        })?;
        if self.api() == Api::Gemini {
            return gemini_function_response(newest);
        }
        if newest["type"] == "function_call_output" {
            return Some(text_of(&newest["output"]));
        }
        if newest["role"] == "tool" {
            return Some(text_of(&newest["content"]));
        }
        let results: Vec<String> = newest["content"]
            .as_array()?
            .iter()
            .filter(|p| p["type"] == "tool_result")
            .map(|p| text_of(&p["content"]))
            .collect();
        (!results.is_empty()).then(|| results.join("\n"))
    }

    /// Whether any text anywhere in the conversation (not the system prompt or tool
    /// definitions) contains `needle`.
    pub fn conversation_contains(&self, needle: &str) -> bool {
        let conversation = match self.api() {
            Api::Messages => &self.body()["messages"],
            Api::Responses => &self.body()["input"],
            Api::Gemini => &self.body()["contents"],
            Api::ChatCompletions => &self.body()["messages"],
            Api::Other => return false,
        };
        let mut found = false;
        visit_strings(conversation, &mut |s| found |= s.contains(needle));
        found
    }

    /// Whether the request offers the model the tool `name` (MCP tools named
    /// `mcp__<server>__<tool>` for both harnesses).
    pub fn offers_tool(&self, name: &str) -> bool {
        self.body()["tools"].as_array().is_some_and(|tools| {
            tools.iter().any(|t| {
                t["name"] == name
                    || t["functionDeclarations"]
                        .as_array()
                        .is_some_and(|fs| fs.iter().any(|f| f["name"] == name))
                    || t["function"]["name"] == chat_tool_name(name).as_str()
                    || t["tools"].as_array().is_some_and(|inner| {
                        inner.iter().any(|i| {
                            format!("{}__{}", text_of(&t["name"]), text_of(&i["name"])) == name
                        })
                    })
            })
        })
    }

    fn api(&self) -> Api {
        let route = self.path().split('?').next().unwrap_or_default();
        if self.method() != "POST" {
            Api::Other
        } else if route.ends_with("/messages") {
            Api::Messages
        } else if route.ends_with("/responses") {
            Api::Responses
        } else if route.ends_with(":streamGenerateContent") || route.ends_with(":generateContent") {
            Api::Gemini
        } else if route.ends_with("/chat/completions") {
            Api::ChatCompletions
        } else {
            Api::Other
        }
    }

    /// The conversation's items: Anthropic messages or Responses input items.
    fn turns(&self) -> impl DoubleEndedIterator<Item = &Value> {
        let items = match self.api() {
            Api::Messages => self.body()["messages"].as_array(),
            Api::Responses => self.body()["input"].as_array(),
            Api::Gemini => self.body()["contents"].as_array(),
            Api::ChatCompletions => self.body()["messages"].as_array(),
            Api::Other => None,
        };
        items.into_iter().flatten()
    }

    /// Claude Code's side requests (a session title) offer no tools; they are not turns of
    /// the conversation a script plays.
    fn is_housekeeping(&self) -> bool {
        self.body()["tools"].as_array().is_none_or(Vec::is_empty)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Api {
    Messages,
    Responses,
    Gemini,
    ChatCompletions,
    Other,
}

/// The text of a tool result's content: a string, or the text parts of an array.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn visit_strings(v: &Value, f: &mut dyn FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter().for_each(|i| visit_strings(i, f)),
        Value::Object(map) => map.values().for_each(|i| visit_strings(i, f)),
        _ => {}
    }
}

/// Serves one connection: one request, one reply, then close.
fn serve(shared: &Shared, stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let Some(request) = read_request(&mut reader, &mut writer) else {
        return;
    };
    if shared.stopping.load(Ordering::SeqCst) {
        return;
    }
    {
        let mut log = shared.log();
        log.push(request.clone());
        shared.logged.notify_all();
    }
    let _ = answer(shared, &request, &mut writer);
}

/// Reads a request line, headers and body (by Content-Length or chunked); None when the
/// client closed or sent something unreadable.
fn read_request(reader: &mut impl BufRead, writer: &mut impl Write) -> Option<Request> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    if headers
        .get("expect")
        .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
    {
        writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").ok()?;
    }
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
    let raw = if chunked {
        read_chunked(reader)?
    } else {
        let len: usize = headers
            .get("content-length")
            .map_or(Some(0), |l| l.parse().ok())?;
        let mut raw = vec![0; len];
        reader.read_exact(&mut raw).ok()?;
        raw
    };
    let body = if raw.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&raw)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into_owned()))
    };
    Some(Request {
        json: json!({"method": method, "path": path, "headers": headers, "body": body}),
    })
}

fn read_chunked(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut raw = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
        if size == 0 {
            // Trailers, if any, end with an empty line.
            loop {
                line.clear();
                if reader.read_line(&mut line).ok()? == 0 || line.trim().is_empty() {
                    return Some(raw);
                }
            }
        }
        let start = raw.len();
        raw.resize(start + size, 0);
        reader.read_exact(&mut raw[start..]).ok()?;
        line.clear();
        reader.read_line(&mut line).ok()?;
    }
}

fn answer(shared: &Shared, request: &Request, out: &mut impl Write) -> std::io::Result<()> {
    let route = request.path().split('?').next().unwrap_or_default();
    if request.method() == "POST" && route.ends_with("/messages/count_tokens") {
        return send_json(out, 200, &json!({"input_tokens": 1}));
    }
    if request.method() == "HEAD" {
        // Claude Code sends `HEAD /` to its base URL as it starts, to warm up the connection;
        // a 404 satisfies it.
        return out.write_all(
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        );
    }
    let api = request.api();
    if api == Api::Other {
        let message = format!(
            "the scripted model server has no {} {route}",
            request.method()
        );
        let reply =
            json!({"type": "error", "error": {"type": "not_found_error", "message": message}});
        return send_json(out, 404, &reply);
    }
    let reply = if matches!(api, Api::Messages | Api::Gemini | Api::ChatCompletions)
        && request.is_housekeeping()
    {
        Reply::text(gemini_housekeeping(request).unwrap_or_else(|| HOUSEKEEPING_REPLY.to_owned()))
    } else {
        match catch_unwind(AssertUnwindSafe(|| (shared.script)(request))) {
            Ok(reply) => reply,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                // A 400, not a 5xx, which the harnesses retry with backoff.
                let reply = json!({"type": "error", "error": {"type": "invalid_request_error",
                    "message": format!("the model server's script panicked: {why}")}});
                return send_json(out, 400, &reply);
            }
        }
    };
    let stream = request.body()["stream"] == true;
    if api == Api::Gemini {
        let answer = gemini_answer(&reply);
        return if request.path().contains(":streamGenerateContent") {
            send_sse_data(out, &[answer])
        } else {
            send_json(out, 200, &answer)
        };
    }
    match (api, stream) {
        (Api::ChatCompletions, _) => send_chat_sse(out, &chat_chunks(shared, request, &reply)),
        (Api::Messages, true) => send_sse(out, &messages_events(shared, request, &reply)),
        (Api::Messages, false) => send_json(out, 200, &message(shared, request, &reply)),
        (_, true) => send_sse(out, &responses_events(shared, request, &reply)),
        (_, false) => {
            let output = vec![output_item(shared, &reply)];
            send_json(out, 200, &response(shared, request, output, "completed"))
        }
    }
}

fn send_json(out: &mut impl Write, status: u16, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or_default();
    write!(
        out,
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

/// Server-sent events, each `event: NAME` plus `data: JSON`; the connection's close ends the
/// stream.
fn send_sse(out: &mut impl Write, events: &[(&str, Value)]) -> std::io::Result<()> {
    sse_head(out)?;
    for (name, data) in events {
        write!(out, "event: {name}\ndata: {data}\n\n")?;
        out.flush()?;
    }
    Ok(())
}

/// The content block of an Anthropic message for `reply`.
fn content_block(shared: &Shared, reply: &Reply) -> Value {
    match reply {
        Reply::Text(text) => json!({"type": "text", "text": text}),
        Reply::Tool { name, input } => {
            json!({"type": "tool_use", "id": shared.id("toolu"), "name": name, "input": input})
        }
    }
}

/// A non-streamed Messages API answer.
fn message(shared: &Shared, request: &Request, reply: &Reply) -> Value {
    json!({
        "id": shared.id("msg"),
        "type": "message",
        "role": "assistant",
        "model": request.body()["model"],
        "content": [content_block(shared, reply)],
        "stop_reason": reply.stop_reason(),
        "stop_sequence": null,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    })
}

/// A streamed Messages API answer: message_start; the block as content_block_start, one delta
/// and content_block_stop; then message_delta (the stop reason) and message_stop.
fn messages_events(
    shared: &Shared,
    request: &Request,
    reply: &Reply,
) -> Vec<(&'static str, Value)> {
    let block = content_block(shared, reply);
    let (start, delta) = match reply {
        Reply::Text(text) => (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": text}),
        ),
        Reply::Tool { input, .. } => (
            json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
            json!({"type": "input_json_delta", "partial_json": input.to_string()}),
        ),
    };
    let message = json!({
        "id": shared.id("msg"), "type": "message", "role": "assistant",
        "model": request.body()["model"], "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": {"input_tokens": 1, "output_tokens": 1}});
    vec![
        (
            "message_start",
            json!({"type": "message_start", "message": message}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": start}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "usage": {"output_tokens": 1},
                "delta": {"stop_reason": reply.stop_reason(), "stop_sequence": null}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]
}

/// The output item of a Responses answer for `reply`.
fn output_item(shared: &Shared, reply: &Reply) -> Value {
    match reply {
        Reply::Text(text) => json!({
            "type": "message", "id": shared.id("msg"), "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}),
        Reply::Tool { name, input } => {
            let mut call = json!({
                "type": "function_call", "id": shared.id("fc"), "call_id": shared.id("call"),
                "name": name, "arguments": input.to_string(), "status": "completed"});
            // Codex offers an MCP server's tools as one namespace `mcp__<server>` holding the
            // tools by their own names, and only runs a call that names both.
            if let Some((server, tool)) = name
                .strip_prefix("mcp__")
                .and_then(|rest| rest.split_once("__"))
            {
                call["namespace"] = json!(format!("mcp__{server}"));
                call["name"] = json!(tool);
            }
            call
        }
    }
}

/// A Responses object with `output` and `status`.
fn response(shared: &Shared, request: &Request, output: Vec<Value>, status: &str) -> Value {
    json!({
        "id": shared.id("resp"), "object": "response", "status": status,
        "model": request.body()["model"], "output": output,
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}},
    })
}

/// A streamed Responses answer as Codex 0.171 accepts it: response.created, the output item as
/// output_item.added and output_item.done, then response.completed with the whole output.
fn responses_events(
    shared: &Shared,
    request: &Request,
    reply: &Reply,
) -> Vec<(&'static str, Value)> {
    let created = response(shared, request, Vec::new(), "in_progress");
    let item = output_item(shared, reply);
    let mut completed = created.clone();
    completed["status"] = json!("completed");
    completed["output"] = json!([item]);
    vec![
        (
            "response.created",
            json!({"type": "response.created", "response": created}),
        ),
        (
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        ),
        (
            "response.output_item.done",
            json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        ),
        (
            "response.completed",
            json!({"type": "response.completed", "response": completed}),
        ),
    ]
}

/// The text parts of a Gemini API content (`{"role", "parts": [{"text"}, ...]}`), joined by
/// newlines.
fn gemini_texts(content: &Value) -> String {
    content["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `functionResponse` parts of a Gemini API content, as text (their `response` objects).
fn gemini_function_response(content: &Value) -> Option<String> {
    let results: Vec<String> = content["parts"]
        .as_array()?
        .iter()
        .filter_map(|p| p.get("functionResponse"))
        .map(|r| {
            let mut texts = Vec::new();
            visit_strings(&r["response"], &mut |s| texts.push(s.to_owned()));
            texts.join("\n")
        })
        .collect();
    (!results.is_empty()).then(|| results.join("\n"))
}

/// Gemini CLI's side requests ask for JSON in a schema (`generationConfig.responseJsonSchema`):
/// whether the model or the user speaks next, a title. The answer fills the schema's required
/// fields, the next speaker always the user, so no side request starts a turn.
fn gemini_housekeeping(request: &Request) -> Option<String> {
    let config = &request.body()["generationConfig"];
    let schema = config
        .get("responseJsonSchema")
        .or_else(|| config.get("responseSchema"))?;
    let mut answer = serde_json::Map::new();
    for field in schema["required"].as_array().into_iter().flatten() {
        let Some(name) = field.as_str() else { continue };
        let value = match name {
            "next_speaker" => json!("user"),
            // Gemini spells the types in capitals (`INTEGER`), JSON Schema in lower case.
            _ => match schema["properties"][name]["type"]
                .as_str()
                .map(str::to_ascii_lowercase)
                .as_deref()
            {
                Some("boolean") => json!(false),
                Some("number" | "integer") => json!(1),
                Some("array") => json!([]),
                Some("object") => json!({}),
                _ => json!("scripted"),
            },
        };
        answer.insert(name.to_owned(), value);
    }
    Some(Value::Object(answer).to_string())
}

/// A Gemini API answer (`GenerateContentResponse`) for `reply`: one candidate whose one part is
/// the text or the `functionCall`. Gemini CLI names an MCP tool `mcp_<server>_<tool>`, and the
/// script names it so.
fn gemini_answer(reply: &Reply) -> Value {
    let part = match reply {
        Reply::Text(text) => json!({"text": text}),
        Reply::Tool { name, input } => json!({"functionCall": {"name": name, "args": input}}),
    };
    json!({
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP",
                        "index": 0}],
        "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
        "modelVersion": "scripted-model",
    })
}

/// Server-sent events with data lines only (`data: JSON`), as the Gemini API streams with
/// `?alt=sse`; the connection's close ends the stream.
fn send_sse_data(out: &mut impl Write, events: &[Value]) -> std::io::Result<()> {
    sse_head(out)?;
    for data in events {
        write!(out, "data: {data}\r\n\r\n")?;
        out.flush()?;
    }
    Ok(())
}

/// The head of a server-sent-events answer; the connection's close ends the stream.
fn sse_head(out: &mut impl Write) -> std::io::Result<()> {
    out.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
          connection: close\r\n\r\n",
    )
}

/// How OpenCode names an MCP tool: `<server>_<tool>` for the script's `mcp__<server>__<tool>`.
fn chat_tool_name(name: &str) -> String {
    match name.strip_prefix("mcp__").and_then(|n| n.split_once("__")) {
        Some((server, tool)) => format!("{server}_{tool}"),
        None => name.to_owned(),
    }
}

/// A streamed Chat Completions answer as OpenCode's `@ai-sdk/openai-compatible` provider reads
/// it: `chat.completion.chunk`s, the text or one tool call as a delta, a chunk with the finish
/// reason and the usage, then `[DONE]`. Sent for a request that did not ask to stream, too.
fn chat_chunks(shared: &Shared, request: &Request, reply: &Reply) -> Vec<Value> {
    let id = shared.id("chatcmpl");
    let chunk = |delta: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 1,
               "model": request.body()["model"],
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let (delta, finish) = match reply {
        Reply::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
        Reply::Tool { name, input } => (
            json!({"role": "assistant", "tool_calls": [{"index": 0, "id": shared.id("call"),
                "type": "function", "function": {"name": chat_tool_name(name),
                "arguments": input.to_string()}}]}),
            "tool_calls",
        ),
    };
    let mut last = chunk(json!({}), json!(finish));
    last["usage"] = json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2});
    vec![chunk(delta, Value::Null), last]
}

/// Chat Completions' server-sent events: `data:` lines only, ended by `data: [DONE]`.
fn send_chat_sse(out: &mut impl Write, chunks: &[Value]) -> std::io::Result<()> {
    sse_head(out)?;
    for chunk in chunks {
        write!(out, "data: {chunk}\n\n")?;
    }
    out.write_all(b"data: [DONE]\n\n")?;
    out.flush()
}
