//! Row 6: a `wait_create` round trip through `waitpoint mcp` (one long-lived server, JSON-RPC on
//! its stdio, as a harness talks to it) against `waitpoint create --json` run as a process, on
//! homes alike, in the same run.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

use crate::ours::{Bins, new_home, per_invocation};

/// (MCP round trips in ms, one per call; `create --json` ms per invocation).
pub fn wait_create_round_trip(bins: &Bins, dir: &Path, n: usize) -> (Vec<f64>, f64) {
    let home = new_home(&dir.join("mcp"), "{}");
    let mut server = Command::new(&bins.waitpoint)
        .args(["mcp", "--session", "bench"])
        .env_clear()
        .env("CORTEX_HOME", home.root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut to = server.stdin.take().unwrap();
    let mut from = BufReader::new(server.stdout.take().unwrap());
    let mut call = |id: u64, method: &str, params: Value| -> Value {
        let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(to, "{req}").unwrap();
        to.flush().unwrap();
        let mut line = String::new();
        from.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    call(
        0,
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "bench", "version": "1"}}),
    );
    let args = json!({"label": "bench", "intent": "measure the MCP round trip"});
    let mut times = Vec::with_capacity(n);
    // One warm-up call, then n timed ones, each a fresh durable waitpoint.
    for id in 1..=n as u64 + 1 {
        let t = Instant::now();
        let r = call(
            id,
            "tools/call",
            json!({"name": "wait_create", "arguments": args}),
        );
        assert_eq!(r["result"]["isError"], false, "{r}");
        if id > 1 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    drop(to);
    let _ = server.wait();

    let cli_home = new_home(&dir.join("cli"), "{}");
    let cli = per_invocation(n, || {
        let mut c = Command::new(&bins.waitpoint);
        c.args(["create", "--json", "--session", "bench", "--label", "bench"])
            .args(["--intent", "measure the MCP round trip"])
            .env_clear()
            .env("CORTEX_HOME", cli_home.root());
        c
    });
    (times, cli)
}
