//! Bad input is refused with a clear reason and parked, never deleted silently; a wrong secret
//! is refused exactly like an unknown id.

use std::fs;

use crate::helpers::*;

fn parked(env: &Env) -> Vec<(String, String)> {
    let bad = env.drop_zone().join("bad");
    let mut out = Vec::new();
    for e in fs::read_dir(&bad).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".reason") {
            out.push((stem.to_owned(), fs::read_to_string(e.path()).unwrap()));
        }
    }
    out.sort();
    out
}

fn reason_of(env: &Env, stem: &str) -> String {
    parked(env)
        .into_iter()
        .find(|(s, _)| s == stem)
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("{stem} not parked\n{}", env.tree()))
}

#[test]
fn refused_files_are_parked_with_a_reason_beside_them() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &["--member", "arm2"]);
    let (id, secret) = id_secret(&reply);
    env.drop_file("not-json", "this is not json");
    env.drop_file("no-member", &body(&id, &secret, ""));
    env.drop_file("unlisted", &body(&id, &secret, r#","member":"arm9""#));
    env.drop_file(
        "bad-status",
        &body(&id, &secret, r#","member":"arm2","status":"maybe""#),
    );
    env.wait_until("four parked", || parked(&env).len() == 4);
    env.wait_drained();

    assert!(reason_of(&env, "not-json").contains("not a valid signal"));
    assert!(reason_of(&env, "no-member").contains("must carry \"member\""));
    assert!(
        reason_of(&env, "no-member").contains("arm2"),
        "lists the expected members"
    );
    assert!(reason_of(&env, "unlisted").contains("\"arm9\" is not on this waitpoint's list"));
    assert!(reason_of(&env, "bad-status").contains("`status`"));
    for stem in ["not-json", "no-member", "unlisted", "bad-status"] {
        assert!(
            env.drop_zone()
                .join("bad")
                .join(format!("{stem}.json"))
                .exists()
        );
    }
    assert_eq!(env.state(&id)["counters"]["signals"], 0, "nothing counted");
}

#[test]
fn wrong_secret_and_unknown_id_are_refused_alike() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &[]);
    let (id, _) = id_secret(&reply);
    let wrong = "0".repeat(64);
    env.drop_file("wrong-secret", &body(&id, &wrong, ""));
    env.drop_file("unknown-id", &body("wp_0123456789ab", &wrong, ""));
    env.wait_until("both parked", || parked(&env).len() == 2);
    // First line: `<time> refused "<name>": <reason>`; the reason part must be identical.
    let reason = |stem: &str| {
        let text = reason_of(&env, stem);
        let first = text.lines().next().unwrap().to_owned();
        first.split_once("\": ").unwrap().1.to_owned()
    };
    assert_eq!(
        reason("wrong-secret"),
        reason("unknown-id"),
        "must not tell the cases apart"
    );
    assert_eq!(env.state(&id)["status"], "armed");
}

#[test]
fn a_parked_copy_never_keeps_the_real_secret() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &["--member", "a"]);
    let (id, secret) = id_secret(&reply);
    env.drop_file("forgot-member", &body(&id, &secret, ""));
    env.wait_until("parked", || parked(&env).len() == 1);
    let copy = fs::read_to_string(env.drop_zone().join("bad/forgot-member.json")).unwrap();
    assert!(!copy.contains(&secret), "{copy}");
    assert!(copy.contains("redacted"));
    assert!(copy.contains(&id), "everything but the secret is kept");
}

#[test]
fn temp_files_are_never_read_and_stale_ones_are_removed() {
    let env = Env::new();
    let reply = env.arm("t", &[]);
    let (id, secret) = id_secret(&reply);
    fs::create_dir_all(env.drop_zone()).unwrap();
    let fresh = env.drop_zone().join("inflight.tmp");
    let stale = env.drop_zone().join("abandoned.tmp");
    fs::write(&fresh, body(&id, &secret, "")).unwrap();
    fs::write(&stale, body(&id, &secret, "")).unwrap();
    env.ok(
        "age it",
        &env.run("touch", &["-d", "2 days ago", stale.to_str().unwrap()]),
    );
    let _d = env.daemon();
    env.wait_until("stale temp removed", || !stale.exists());
    assert!(fresh.exists(), "a fresh temp file is left for its writer");
    assert_eq!(
        env.state(&id)["counters"]["signals"],
        0,
        "temp files are never read"
    );
}

#[test]
fn a_file_written_in_place_is_not_parked_while_still_being_written() {
    let env = Env::new();
    let _d = env.daemon();
    let reply = env.arm("t", &[]);
    let (id, secret) = id_secret(&reply);
    // A writer that skips the .tmp step: open, write half, pause, write the rest.
    let path = env.drop_zone().join("in-place.json");
    let text = body(&id, &secret, "");
    let (head, tail) = text.split_at(10);
    {
        use std::io::Write;
        let mut f = fs::File::create(&path).unwrap();
        f.write_all(head.as_bytes()).unwrap();
        f.flush().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(700));
        f.write_all(tail.as_bytes()).unwrap();
    }
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    assert!(parked(&env).is_empty());
}

/// A signal its sender refused on the daemon's machine (a wrong secret, an unknown id) leaves a
/// miss record, never the secret: the daemon logs each as a warning naming the id and the
/// reason, and parks it where `doctor` counts it, so a detached job's typo is findable; each
/// miss once, since the sender sent nothing else.
#[test]
fn a_miss_judged_by_the_sender_is_logged_by_the_daemon_and_counted_once() {
    let env = Env::new();
    let _d = env.daemon();
    let (id, secret) = id_secret(&env.arm("t", &[]));
    let wrong = "not-the-secret-of-any-waitpoint";
    let unknown = "wp_0123456789ab";
    for (what, args) in [
        ("wrong secret", [id.as_str(), wrong]),
        ("unknown waitpoint id", [unknown, secret.as_str()]),
    ] {
        let out = env.signal(&["--id", args[0], "--secret", args[1], "--exit-code", "0"]);
        env.expect_code(what, &out, 1);
        let said = stderr_of(&out);
        assert!(
            said.contains(what) && said.contains("nothing was sent"),
            "{said}"
        );
    }
    env.wait_until("both misses parked", || {
        parked(&env).len() == 2 && env.spooled().is_empty()
    });
    env.wait_drained();
    // The warning is logged as the file is parked: wait for the line, not only the file.
    let daemon_log = || fs::read_to_string(env.home.join("log/daemon.log")).unwrap_or_default();
    env.wait_until("both warnings logged", || {
        let log = daemon_log();
        [id.as_str(), unknown]
            .iter()
            .all(|miss| log.lines().any(|l| l.contains("WARN") && l.contains(miss)))
    });
    let log = daemon_log();
    for miss in [id.as_str(), unknown] {
        let warned: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(miss))
            .collect();
        assert_eq!(warned.len(), 1, "one warning for {miss}:\n{log}");
        assert!(
            warned[0].contains("unknown waitpoint id or wrong secret"),
            "{}",
            warned[0]
        );
    }
    let report = env.ok("doctor", &env.waitpoint(&["doctor"]));
    assert!(report.contains("2 refused signal file(s)"), "{report}");
    // The session whose waitpoint it was sees the miss where it looks: check, and wait_check's
    // JSON (the same rows); once, as the daemon counted it.
    let table = env.ok("check", &env.waitpoint(&["check"]));
    assert!(
        table.contains("1 signal refused — see tmp/signals/bad/ (each file's .reason says why)"),
        "{table}"
    );
    let badges = env.waitpoint_json("check", &["check", "--json"])["waiting"][0]["badges"].clone();
    assert!(
        badges
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["kind"] == "refused"),
        "{badges}"
    );
    // A consumed file may leave the trash while the home is read.
    for path in env.files() {
        let Ok(bytes) = fs::read(&path) else { continue };
        assert!(
            !String::from_utf8_lossy(&bytes).contains(wrong),
            "{} holds the secret",
            path.display()
        );
    }
}

#[test]
fn the_refused_badge_claims_no_reason_a_refusal_did_not_have() {
    let env = Env::new();
    let _d = env.daemon();
    let (id, secret) = id_secret(&env.arm("barrier", &["--member", "a", "--member", "b"]));
    env.drop_file("stray", &body(&id, &secret, r#","member":"zz""#));
    env.wait_until("the stray member parked", || parked(&env).len() == 1);
    let table = env.ok("check", &env.waitpoint(&["check"]));
    assert!(table.contains("1 signal refused"), "{table}");
    assert!(
        !table.contains("wrong secret"),
        "a member refusal is not a wrong secret:\n{table}"
    );
}
