//! A sender cannot silence its waitpoint (issue 36, class 1): whatever one secret's holder
//! sends, what the engine stores and reads for the waitpoint is bounded, the final report and
//! the deadline are always processed, and a wake carries a bounded digest of what arrived.

use std::fs;
use std::path::PathBuf;

use serde_json::Value;
use waitpoint::engine::rules::{
    LOG_KEEP_BYTES, LOG_KEEP_HEARTBEATS, LOG_KEEP_RECORDS, WAKE_HEARTBEATS,
};
use waitpoint::request::MAX_DATA_CHARS;
use waitpoint::store::signal_log::MAX_LOG_READ;

use crate::helpers::*;

/// A heartbeat's body as big as the caps allow: a 16,000-character `data`.
fn big_heartbeat(id: &str, secret: &str, n: u64) -> String {
    let data = "x".repeat(MAX_DATA_CHARS - 16);
    body(
        id,
        secret,
        &format!(r#","status":"progress","message":"step {n}","data":"{data}""#),
    )
}

fn log_path(env: &Env, id: &str) -> PathBuf {
    env.home.join("waitpoints").join(id).join("signals.jsonl")
}

/// The first unread wake of `kind` in the default session's inbox, once there is one.
fn wake_of_kind(env: &Env, kind: &str) -> Value {
    let find = || {
        env.inbox("default", "new")
            .into_iter()
            .find(|w| w["kind"] == kind)
    };
    env.wait_until(&format!("a {kind} wake"), || find().is_some());
    find().unwrap()
}

fn only_wake(env: &Env) -> Value {
    let wakes = env.inbox("default", "new");
    assert_eq!(wakes.len(), 1, "one wake:\n{}", env.tree());
    wakes.into_iter().next().unwrap()
}

#[test]
fn a_flood_of_heartbeats_is_folded_and_the_final_report_wakes_with_a_bounded_digest() {
    const FLOOD: u64 = 1_200;
    let env = Env::new();
    let daemon = env.daemon();
    let (id, secret) = id_secret(&env.arm("train", &[]));
    for n in 1..=FLOOD {
        env.drop_file(&format!("hb{n:04}"), &big_heartbeat(&id, &secret, n));
    }
    env.wait_until("every heartbeat counted", || {
        env.state(&id)["counters"]["progress"] == FLOOD
    });

    // The log kept the first heartbeats whole, the next ones without their data, and folded
    // the rest into counts.
    let log_len = fs::metadata(log_path(&env, &id)).unwrap().len();
    assert!(
        log_len <= LOG_KEEP_BYTES,
        "the log holds {log_len} bytes after {FLOOD} heartbeats\n{}",
        env.tree()
    );
    let logged = crate::invariants::records_of(&env.home, &id);
    assert_eq!(logged.len() as u64, LOG_KEEP_RECORDS);
    let whole = logged.iter().filter(|r| !r["data"].is_null()).count();
    assert_eq!(whole as u64, LOG_KEEP_HEARTBEATS);
    assert!(
        logged[whole..]
            .iter()
            .all(|r| r["data_dropped"] == true && r["message"].is_string())
    );
    let state = env.state(&id);
    assert_eq!(state["log"]["kept"], LOG_KEEP_RECORDS);
    assert_eq!(state["log"]["folded_progress"], FLOOD - LOG_KEEP_RECORDS);
    assert_eq!(state["log"]["first_folded"]["seq"], LOG_KEEP_RECORDS + 1);
    let recent = state["log"]["recent"].as_array().unwrap();
    assert_eq!(recent.last().unwrap()["message"], format!("step {FLOOD}"));
    assert!(
        recent.iter().all(|r| r["data"].is_null()),
        "a folded heartbeat keeps no data in the state"
    );

    // A retry of a folded heartbeat (its file again, by the same name) is a duplicate, also
    // for a daemon started since, which knows it only from the state.
    daemon.terminate();
    let _daemon = env.daemon();
    env.drop_file(
        &format!("hb{FLOOD:04}"),
        &big_heartbeat(&id, &secret, FLOOD),
    );
    env.wait_until("the retry collected", || env.spooled().is_empty());
    assert_eq!(env.state(&id)["counters"]["signals"], FLOOD);
    // The newest heartbeat is told from the state, folded as it is.
    assert_eq!(
        env.state(&id)["log"]["last_heartbeat"]["message"],
        format!("step {FLOOD}")
    );
    let check = env.ok("check", &env.waitpoint(&["check", "--session", "default"]));
    assert!(check.contains(&format!("step {FLOOD}")), "{check}");

    // The job's final report is processed and wakes the session once, with a digest.
    let out = env
        .command(CORTEX_SIGNAL)
        .args(["--id", &id, "--message", "done: loss 0.1", "--status", "ok"])
        .env("CORTEX_SIGNAL_SECRET", &secret)
        .output()
        .unwrap();
    env.ok("the final signal", &out);
    env.wait_until("the wake", || env.inbox("default", "new").len() == 1);
    let wake = only_wake(&env);
    assert_eq!(wake["kind"], "resolved");
    let reports = wake["reports"].as_array().unwrap();
    let heartbeats = reports.iter().filter(|r| r["status"] == "progress").count();
    assert_eq!(heartbeats, WAKE_HEARTBEATS, "{wake:#}");
    assert_eq!(reports.last().unwrap()["status"], "ok");
    assert_eq!(wake["digest"]["signals"], FLOOD + 1);
    assert_eq!(wake["digest"]["shown"], reports.len());
    let text = wake["text"].as_str().unwrap();
    assert!(
        text.len() < 8 * 1024,
        "the wake's text is {} bytes:\n{text}",
        text.len()
    );
    assert!(text.contains(&format!("{} arrived", FLOOD + 1)), "{text}");
    assert!(text.contains(&format!("waitpoint show {id}")), "{text}");
    assert!(text.contains("done: loss 0.1"), "{text}");

    // Every reader still answers, and `show` says what was folded.
    let shown = env.ok("show", &env.waitpoint(&["show", &id]));
    assert!(
        shown.contains(&format!(
            "folded    {} not kept whole",
            FLOOD - LOG_KEEP_RECORDS
        )),
        "{shown}"
    );
    assert!(shown.contains(&format!("step {FLOOD}")), "{shown}");
    env.ok("check", &env.waitpoint(&["check", "--session", "default"]));
}

/// Writes a log of `n` heartbeat records (`seq` 1 to `n`) of `line_bytes` each, and a state
/// that counts them, as a home written before logs were bounded would hold.
fn plant_old_log(env: &Env, id: &str, n: u64, line_bytes: usize) {
    let mut log = Vec::with_capacity(n as usize * line_bytes);
    for seq in 1..=n {
        let head = format!(
            r#"{{"seq":{seq},"source":"spool:old{seq}.json","status":"progress","member":null,"message":"step {seq}","data":""#
        );
        let tail = r#"","received_at":"2026-12-01T00:00:01.000Z"}"#;
        let pad = line_bytes.saturating_sub(head.len() + tail.len() + 1);
        log.extend_from_slice(head.as_bytes());
        log.extend(std::iter::repeat_n(b'x', pad));
        log.extend_from_slice(tail.as_bytes());
        log.push(b'\n');
    }
    fs::write(log_path(env, id), &log).unwrap();
    let path = env.home.join("waitpoints").join(id).join("waitpoint.json");
    let mut state = env.state(id);
    state["counters"]["signals"] = n.into();
    state["counters"]["progress"] = n.into();
    fs::write(&path, serde_json::to_vec(&state).unwrap()).unwrap();
}

#[test]
fn a_log_bigger_than_any_reader_reads_still_lets_the_final_report_and_the_deadline_through() {
    // 72 MiB of heartbeats: past what a log was ever read to (64 MiB before it was bounded).
    const LINE: usize = 16 * 1024;
    const N: u64 = 72 * 64;
    let env = Env::new();
    // Armed on the clock the daemon below starts at, so its deadline is an hour from there.
    let engine = waitpoint::engine::Engine::new(
        waitpoint::home::Home::new(&env.home),
        waitpoint::settings::Settings::default(),
        std::sync::Arc::new(waitpoint::clock::ManualClock::new(T0)),
    );
    let (finishing, secret) = Arming::new("finishing").on(&engine);
    let (expiring, _) = Arming::new("expiring").expires_in_hours(1.0).on(&engine);
    for id in [&finishing, &expiring] {
        plant_old_log(&env, id, N, LINE);
    }
    assert!(fs::metadata(log_path(&env, &finishing)).unwrap().len() > 64 << 20);

    // `doctor` names the logs.
    let out = env.waitpoint(&["doctor"]);
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        report.contains("2 signal log(s) bigger than") && report.contains(&finishing),
        "{report}"
    );
    const { assert!(MAX_LOG_READ < 64 << 20) };

    // The views answer from the log's newest part.
    let shown = env.ok("show", &env.waitpoint(&["show", &finishing]));
    assert!(shown.contains(&format!("step {N}")), "{shown}");
    let check = env.ok("check", &env.waitpoint(&["check", "--session", "default"]));
    assert!(check.contains(&format!("step {N}")), "{check}");

    let live = Live::start(&env, T0);
    // The final report resolves its waitpoint and wakes the session.
    env.drop_file("final", &body(&finishing, &secret, r#","message":"done""#));
    let wake = wake_of_kind(&env, "resolved");
    assert_eq!(env.state(&finishing)["status"], "resolved");
    assert_eq!(wake["digest"]["signals"], N + 1);
    // The deadline passes and is told, once.
    live.advance_ms(2 * 3_600_000);
    let deadline = wake_of_kind(&env, "deadline");
    assert_eq!(env.state(&expiring)["status"], "expired");
    let text = deadline["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("only heartbeats arrived ({N})")),
        "{text}"
    );
    live.stop();
}
