//! `layouts/` is the on-disk contract: every example validates against its schema, and every
//! JSON file the engine writes validates against the schema of its kind. Also: no plaintext
//! secret is ever written under the home or logged.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::helpers::*;

const BASE: &str = "https://waitpoint.invalid/layouts/";

fn layouts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("layouts")
}

fn load(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub struct Schemas {
    validators: Vec<(String, jsonschema::Validator)>,
}

impl Schemas {
    pub fn load() -> Self {
        let mut registry = jsonschema::Registry::new();
        let mut names = Vec::new();
        for e in fs::read_dir(layouts_dir()).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(kind) = name.strip_suffix(".schema.json") {
                registry = registry
                    .add(format!("{BASE}{name}"), load(&e.path()))
                    .unwrap();
                names.push(kind.to_owned());
            }
        }
        let registry = registry.prepare().unwrap();
        let validators = names
            .into_iter()
            .map(|kind| {
                let schema = serde_json::json!({ "$ref": format!("{BASE}{kind}.schema.json") });
                let v = jsonschema::options()
                    .with_registry(&registry)
                    .build(&schema)
                    .unwrap();
                (kind, v)
            })
            .collect();
        Schemas { validators }
    }

    pub fn check(&self, kind: &str, path: &Path) {
        self.check_value(kind, &path.display().to_string(), &load(path));
    }

    /// [`Schemas::check`] for a document in hand (`what` names it in the failure).
    pub fn check_value(&self, kind: &str, what: &str, doc: &Value) {
        let v = &self
            .validators
            .iter()
            .find(|(k, _)| k == kind)
            .unwrap_or_else(|| panic!("no schema for {kind}"))
            .1;
        let errors: Vec<String> = v
            .iter_errors(doc)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{what} does not match {kind}: {errors:#?}"
        );
    }
}

/// The lines of a JSON Lines file, each parsed (a test fails on one that does not parse).
pub fn jsonl_lines(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(n, l)| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{} line {}: {e}", path.display(), n + 1))
        })
        .collect()
}

/// Which layout a file under the home belongs to, by where it sits.
pub fn kind_of(rel: &Path) -> Option<&'static str> {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let p: Vec<&str> = parts.iter().map(String::as_str).collect();
    match p.as_slice() {
        ["settings.json"] => Some("settings"),
        ["webhook.json"] => Some("webhook-address"),
        ["ui-login.json"] => Some("ui-login"),
        ["waitpoints", _, "waitpoint.json"] => Some("waitpoint"),
        ["waitpoints", _, "signals", _] => Some("signal-record"),
        ["waitpoints", _, "signals.jsonl"] => Some("signal-record"),
        ["sessions", _, "wakes", "new" | "cur", _] => Some("wake"),
        ["sessions", _, "harness.json"] => Some("session-harness"),
        ["sessions", _, "waiter.json"] => Some("session-waiter"),
        ["timers", _] => Some("timer"),
        ["callbacks", _] => Some("callback"),
        ["tmp", "signals", "bad", _] => None,
        ["tmp", "signals", _] => Some("spool-signal"),
        ["devices", _] => Some("device"),
        ["devices", _, "status.json"] => Some("device-status"),
        ["devices", _, "spool", "bad", _] => None,
        ["devices", _, "spool", _] => Some("spool-signal"),
        _ => None,
    }
}

/// Validates every JSON file under the home against its layout; returns how many of each kind.
fn check_home(env: &Env) -> std::collections::BTreeMap<&'static str, usize> {
    let schemas = Schemas::load();
    let mut checked = std::collections::BTreeMap::new();
    for path in env.files() {
        let rel = path.strip_prefix(&env.home).unwrap();
        let name = rel.file_name().unwrap().to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        if name.ends_with(".jsonl")
            && let Some(kind) = kind_of(rel)
        {
            for (n, line) in jsonl_lines(&path).iter().enumerate() {
                schemas.check_value(kind, &format!("{} line {}", rel.display(), n + 1), line);
                *checked.entry(kind).or_default() += 1;
            }
            continue;
        }
        if !name.ends_with(".json") {
            continue;
        }
        if let Some(kind) = kind_of(rel) {
            schemas.check(kind, &path);
            *checked.entry(kind).or_default() += 1;
        }
    }
    checked
}

#[test]
fn every_layout_has_an_example_that_validates() {
    let schemas = Schemas::load();
    assert!(schemas.validators.len() >= 5);
    for (kind, _) in &schemas.validators {
        let example = layouts_dir().join(format!("{kind}.example.json"));
        assert!(example.exists(), "layouts/{kind}.example.json is missing");
        schemas.check(kind, &example);
        // Further examples of one layout (a wake of each silence kind):
        // `<kind>.<what>.example.json`.
        for e in std::fs::read_dir(layouts_dir()).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let more = name
                .strip_prefix(&format!("{kind}."))
                .and_then(|r| r.strip_suffix(".example.json"));
            if more.is_some_and(|what| !what.is_empty()) {
                schemas.check(kind, &e.path());
            }
        }
    }
}

#[test]
fn every_json_file_the_engine_writes_matches_its_layout_and_no_secret_leaks() {
    let env = Env::new();
    let d = env.daemon_with_env(&[("RUST_LOG", "trace")]);
    let mut secrets = Vec::new();
    // A resolved barrier with members, a monitor, a heartbeat-only deadline, a cancelled one,
    // a refused file and a pending spool file.
    let barrier = env.arm("b", &["--member", "a", "--member", "b"]);
    let monitor = env.arm("m", &["--max-signals", "2"]);
    let deadline = env.arm("d", &["--expires-in-hours", "0.0003"]);
    let cancelled = env.arm("c", &[]);
    for r in [&barrier, &monitor, &deadline, &cancelled] {
        secrets.push(id_secret(r).1);
    }
    let cli = line(&barrier, "cli");
    env.ok("a", &env.job_then(true, &cli, Some("a")));
    // While it is armed: refused on this machine at once; a file dropped without the member is
    // parked. (b's failure below resolves it at once: fail-fast has no grace window.)
    env.expect_code(
        "forgot member",
        &env.sh(&format!("true; {}", cli.replace(" --member MEMBER", ""))),
        1,
    );
    let (bid, bsec) = id_secret(&barrier);
    env.drop_file("forgot-member", &body(&bid, &bsec, ""));
    env.wait_until("the file without its member parked", || {
        env.drop_zone().join("bad/forgot-member.reason").exists()
    });
    env.ok("b", &env.job_then(false, &cli, Some("b")));
    let (mid, msec) = id_secret(&monitor);
    env.ok(
        "m1",
        &env.signal(&["--id", &mid, "--secret", &msec, "--data", "{\"loss\": 0.1}"]),
    );
    let (did, dsec) = id_secret(&deadline);
    env.ok(
        "hb",
        &env.signal(&["--id", &did, "--secret", &dsec, "--status", "progress"]),
    );
    let (cid, _) = id_secret(&cancelled);
    env.ok("cancel", &env.waitpoint(&["cancel", &cid]));
    env.expect_code(
        "barrier",
        &env.waitpoint(&["wait", &id_secret(&barrier).0, "--timeout", "120"]),
        4,
    );
    env.expect_code(
        "deadline",
        &env.waitpoint(&["wait", &did, "--timeout", "120"]),
        5,
    );
    env.wait_drained();
    env.ok("read one", &env.waitpoint(&["next", "--timeout", "1"]));
    // Replaced states leave the trash moments later (consumed spool files never enter it).
    env.wait_trash_emptied();
    let stderr = d.kill();
    // One signal left in the spool, as a job would leave it while the daemon is down.
    env.drop_file("pending", &body(&mid, "not-the-secret", ""));

    let checked = check_home(&env);
    for kind in [
        "settings",
        "waitpoint",
        "signal-record",
        "wake",
        "spool-signal",
    ] {
        assert!(
            checked.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} file was checked: {checked:?}"
        );
    }
    let deadline_wake = env
        .inbox("default", "new")
        .into_iter()
        .chain(env.inbox("default", "cur"))
        .find(|w| w["kind"] == "deadline")
        .expect("a deadline wake");
    assert_eq!(deadline_wake["deadline"]["case"], "only_heartbeats");

    // The secrets: in no file under the home, in no log line (trace level), on no stderr.
    let log = fs::read_to_string(env.home.join("log/daemon.log")).unwrap();
    assert!(log.contains("TRACE") || log.contains("DEBUG") || log.contains("INFO"));
    for secret in &secrets {
        for path in env.files() {
            let bytes = fs::read(&path).unwrap();
            assert!(
                !String::from_utf8_lossy(&bytes).contains(secret.as_str()),
                "plaintext secret in {}",
                path.display()
            );
        }
        assert!(
            !stderr.contains(secret.as_str()),
            "secret on the daemon's stderr"
        );
    }
}

#[test]
fn device_record_and_collector_state_match_their_layouts() {
    let env = Env::new();
    // A port nobody listens on: the poll fails fast and records the device as unreachable.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    env.ok(
        "device add",
        &env.waitpoint(&[
            "device",
            "add",
            "gpu",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--user",
            "u",
        ]),
    );
    env.expect_code("poll", &env.waitpoint(&["device", "poll", "gpu"]), 1);
    let schemas = Schemas::load();
    let mut kinds = Vec::new();
    for path in env.files() {
        let rel = path.strip_prefix(&env.home).unwrap();
        if let Some(kind @ ("device" | "device-status")) = kind_of(rel) {
            schemas.check(kind, &path);
            kinds.push(kind);
        }
    }
    kinds.sort();
    assert_eq!(kinds, ["device", "device-status"], "{}", env.tree());
}

#[test]
fn the_webhook_address_and_http_signal_records_match_their_layouts() {
    let env = Env::new();
    let _d = env.daemon_with(&["--http", "--port", "0"], &[]);
    env.webhook_port();
    let (id, secret) = id_secret(&env.arm("h", &[]));
    env.ok(
        "over http",
        &env.signal(&["--id", &id, "--secret", &secret, "--no-spool"]),
    );
    // The 202 waits for the journal line; the record and state follow it.
    env.wait_until("the state written", || {
        env.state(&id)["counters"]["signals"] == 1
    });
    let checked = check_home(&env);
    for kind in ["webhook-address", "signal-record"] {
        assert_eq!(checked.get(kind), Some(&1), "{checked:?}");
    }
    let record = crate::invariants::records_of(&env.home, &id).remove(0);
    assert!(record["source"].as_str().unwrap().starts_with("http:"));
}
