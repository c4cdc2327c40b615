//! The operator's view in a terminal: the session list and its rings, the capsule's rule
//! (armed ones, and fired or expired ones only while their wake is being delivered), the cap
//! in force, and cancel's question.

use std::process::{Output, Stdio};

use serde_json::Value;

use crate::helpers::*;

#[test]
fn the_capsule_counts_armed_ones_and_says_delivering_until_a_wake_is_read() {
    let env = Env::new();
    let _d = env.daemon();
    let brief = || env.ok("brief", &env.waitpoint(&["check", "--brief"]));
    let signal = |armed: &Value| {
        let (id, secret) = id_secret(armed);
        env.ok("signal", &env.signal(&["--id", &id, "--secret", &secret]));
    };
    let (first, second) = (env.arm("first", &[]), env.arm("second", &[]));
    let third = env.arm("third", &["--expires-in-hours", "3"]);
    signal(&first);
    signal(&second);
    env.wait_until("two wakes in the inbox", || {
        env.inbox("default", "new").len() == 2
    });
    // Resolved ones are no longer "waiting items" and never "expire in": they are delivering.
    let line = brief();
    assert!(
        line.starts_with("third · 0/1 received · expires in ")
            && line.ends_with(" · 2 delivering\n"),
        "{line}"
    );
    let table = env.ok("check", &env.waitpoint(&["check"]));
    assert_eq!(table.matches("delivering").count(), 2, "{table}");
    // Read, they have told their story in the transcript: the capsule drops them.
    env.ok("next", &env.waitpoint(&["next", "--timeout", "5"]));
    env.ok("next", &env.waitpoint(&["next", "--timeout", "5"]));
    let line = brief();
    assert!(!line.contains("delivering"), "{line}");
    assert!(
        line.starts_with("third · 0/1 received · expires in "),
        "{line}"
    );
    // Nothing armed, one wake on its way: said so, with no deadline.
    signal(&third);
    env.wait_until("the third wake", || env.inbox("default", "new").len() == 1);
    assert_eq!(brief(), "third · resolved · wake delivering\n");
    env.ok("next", &env.waitpoint(&["next", "--timeout", "5"]));
    assert_eq!(brief(), "");
}

#[test]
fn views_show_the_wake_cap_the_daemon_applies_not_their_own_shells() {
    let env = Env::new();
    let _d = env.daemon_with_env(&[("CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR", "3")]);
    let (id, secret) = id_secret(&env.arm("mailbox", &["--max-signals", "10"]));
    for n in 1..=4 {
        let seq = format!("{n}");
        env.ok(
            "signal",
            &env.signal(&["--id", &id, "--secret", &secret, "--message", &seq]),
        );
        if n < 4 {
            env.wait_until("the wake", || env.inbox("default", "new").len() == n);
        }
    }
    env.wait_until("the fourth wake held at the cap", || {
        env.state(&id)["pending_wake"]["reason"] == "wake_limit"
    });
    // This shell has no CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR: its own default would say 12.
    let badges = |v: &Value| -> Vec<String> {
        v["badges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["text"].as_str().unwrap().to_owned())
            .collect()
    };
    let shown = badges(&env.waitpoint_json("show", &["show", &id, "--json"]));
    let checked = badges(&env.waitpoint_json("check", &["check", "--json"])["waiting"][0]);
    for texts in [&shown, &checked] {
        assert!(
            texts
                .iter()
                .any(|t| t.starts_with("wake limit reached (3/h)")),
            "{texts:?}"
        );
        assert!(
            texts.iter().any(|t| t == "3/3 wakes this hour"),
            "{texts:?}"
        );
    }
}

/// Runs `waitpoint ARGS` with a terminal for its stdin and stderr (script(1)), typing
/// `answer` and a newline; returns what the terminal showed.
fn on_a_terminal(env: &Env, args: &str, answer: &str) -> (Output, String) {
    use std::io::Write;
    let mut child = env
        .command("script")
        .env("TERM", "xterm")
        .args([
            "-q",
            "-e",
            "-c",
            &format!("{WAITPOINT} {args}"),
            "/dev/null",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux; scripts/test-deps installs it");
    writeln!(child.stdin.take().unwrap(), "{answer}").unwrap();
    let out = child.wait_with_output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, shown)
}

#[test]
fn cancel_asks_on_a_terminal_and_says_the_job_keeps_running() {
    let env = Env::new();
    let (id, _) = id_secret(&env.arm("train", &[]));
    let status = || env.waitpoint_json("show", &["show", &id, "--json"])["status"].clone();
    // Dismissed (anything but y): still armed.
    let (out, shown) = on_a_terminal(&env, &format!("cancel {id}"), "n");
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains(&format!(
            "Cancel {id} \"train\"? This stops the waiting, not the job: it keeps running. [y/N]"
        )),
        "{shown}"
    );
    assert!(shown.contains("left armed"), "{shown}");
    assert_eq!(status(), "armed");
    let (_, shown) = on_a_terminal(&env, &format!("cancel {id}"), "");
    assert!(shown.contains("left armed"), "Enter alone is no: {shown}");
    assert_eq!(status(), "armed");
    // Confirmed: cancelled.
    let (out, shown) = on_a_terminal(&env, &format!("cancel {id}"), "y");
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("the job itself keeps running"), "{shown}");
    assert_eq!(status(), "cancelled");
    // --yes on a terminal, and any caller without one, are not asked.
    let (id, _) = id_secret(&env.arm("second", &[]));
    let (_, shown) = on_a_terminal(&env, &format!("cancel --yes {id}"), "n");
    assert!(!shown.contains("[y/N]"), "{shown}");
    assert_eq!(
        env.waitpoint_json("show", &["show", &id, "--json"])["status"],
        "cancelled"
    );
    let (id, _) = id_secret(&env.arm("third", &[]));
    let out = env.waitpoint(&["cancel", &id]);
    env.ok("cancel from a pipe", &out);
    assert!(!stderr_of(&out).contains("[y/N]"));
    assert_eq!(
        env.waitpoint_json("show", &["show", &id, "--json"])["status"],
        "cancelled"
    );
}

#[test]
fn sessions_lists_each_with_a_ring_when_it_waits_its_capsule_and_unread_wakes() {
    let env = Env::new();
    assert_eq!(
        env.ok("sessions", &env.waitpoint(&["sessions"])),
        "no sessions yet\n"
    );
    let _d = env.daemon();
    env.arm("train", &["--session", "alice"]);
    let (id, secret) = id_secret(&env.arm("eval", &["--session", "bob"]));
    env.ok("signal", &env.signal(&["--id", &id, "--secret", &secret]));
    env.wait_until("bob's wake", || env.inbox("bob", "new").len() == 1);
    let listed = env.waitpoint_json("sessions", &["sessions", "--json"]);
    let by_name = |name: &str| -> Value {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["session"] == name)
            .unwrap_or_else(|| panic!("{name} in {listed}"))
            .clone()
    };
    let alice = by_name("alice");
    assert_eq!(
        (alice["waiting"].clone(), alice["ring"].clone()),
        (true.into(), "○".into())
    );
    assert!(
        alice["capsule"]
            .as_str()
            .unwrap()
            .starts_with("train · 0/1 received · expires in")
    );
    assert_eq!(alice["unread_wakes"], 0);
    // Its job reported: nothing armed, so no ring; the capsule says its wake is on its way.
    let bob = by_name("bob");
    assert_eq!(
        (bob["waiting"].clone(), bob["ring"].clone()),
        (false.into(), "".into())
    );
    assert_eq!(bob["capsule"], "eval · resolved · wake delivering");
    assert_eq!(
        (bob["armed"].clone(), bob["delivering"].clone()),
        (0.into(), 1.into())
    );
    assert_eq!(bob["unread_wakes"], 1);
    let text = env.ok("sessions", &env.waitpoint(&["sessions"]));
    let line = |name: &str| {
        text.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .to_owned()
    };
    assert!(
        line("alice").starts_with("○ alice  train · 0/1 received"),
        "{text}"
    );
    assert!(
        line("bob").starts_with("  bob    eval · resolved · wake delivering  (1 unread)"),
        "{text}"
    );
    // `session list` is the same list.
    assert_eq!(
        env.ok("session list", &env.waitpoint(&["session", "list"])),
        text
    );
    // Read, the wake leaves the capsule; the session stays listed, quiet.
    env.ok(
        "next",
        &env.waitpoint(&["next", "--session", "bob", "--timeout", "5"]),
    );
    let text = env.ok("sessions", &env.waitpoint(&["sessions"]));
    assert!(text.lines().any(|l| l == "  bob"), "{text}");
}
