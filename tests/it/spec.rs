//! The spec, letter for letter: each test pastes the form `../shared/spec/` gives (the legacy
//! timer form, the HTTP routes with their field names, `cortex-signal`'s exit codes) and checks
//! what the spec says happens.

use std::fs;

use serde_json::{Value, json};

use crate::helpers::*;

/// The operator token the control-route tests start the daemon with.
const TOKEN: &str = "operator-token-0123456789";

/// `curl` against the shim: status code and JSON body.
fn curl(
    env: &Env,
    method: &str,
    url: &str,
    auth: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let mut args = vec!["-sS", "-o", "-", "-w", "\n%{http_code}", "-X", method];
    let header;
    if let Some(a) = auth {
        header = format!("Authorization: Bearer {a}");
        args.extend(["-H", &header]);
    }
    if let Some(b) = body {
        args.extend(["-H", "content-type: application/json", "--data-binary", b]);
    }
    args.push(url);
    let out = env.run("curl", &args);
    let text = env.ok("curl", &out);
    let (json, code) = text.rsplit_once('\n').unwrap();
    (
        code.trim().parse().unwrap(),
        serde_json::from_str(json).unwrap_or(Value::Null),
    )
}

#[test]
fn the_legacy_timer_form_and_the_operator_cli_forms_work_as_the_spec_writes_them() {
    let env = Env::new();
    // `holon timer --after-ms N [--every-ms N] [--summary TEXT]`, the legacy form.
    let legacy = env.waitpoint_json(
        "legacy form",
        &[
            "timer",
            "--after-ms",
            "60000",
            "--every-ms",
            "120000",
            "--summary",
            "legacy",
            "--json",
        ],
    );
    assert_eq!(legacy["duration_ms"], 60000);
    assert_eq!(legacy["interval_ms"], 120000);
    assert_eq!(legacy["repeat"], true);
    assert_eq!(legacy["summary"], "legacy");
    assert_eq!(legacy["agent_id"], "default", "{legacy}");
    assert!(legacy.get("session").is_none(), "{legacy}");
    // `timer create --after-ms N [--every-ms N] [--summary TEXT] [--agent ID]`.
    let made = env.waitpoint_json(
        "create",
        &[
            "timer",
            "create",
            "--after-ms",
            "5000",
            "--summary",
            "x",
            "--agent",
            "a7",
            "--json",
        ],
    );
    assert_eq!(made["agent_id"], "a7");
    let id = made["id"].as_str().unwrap();
    // `timer list [--limit N] [--agent ID]`, `timer cancel TIMER_ID [--agent ID]`.
    let list = env.waitpoint_json(
        "list",
        &["timer", "list", "--limit", "1", "--agent", "a7", "--json"],
    );
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], id);
    let listed_default = env.waitpoint_json("list default", &["timer", "list", "--json"]);
    assert_eq!(
        listed_default[0]["id"], legacy["id"],
        "agents see their own"
    );
    let cancelled = env.waitpoint_json(
        "cancel",
        &["timer", "cancel", id, "--agent", "a7", "--json"],
    );
    assert_eq!(cancelled["status"], "cancelled");
    // Idempotent.
    env.waitpoint_json(
        "cancel again",
        &["timer", "cancel", id, "--agent", "a7", "--json"],
    );
    // Another agent's timer is not found, and the error says "timer", not "waitpoint".
    let out = env.waitpoint(&["timer", "show", id]);
    env.expect_code("another agent's timer", &out, 3);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(&format!("no timer {id}")), "{said}");
    // The usage line does not present --agent as required.
    let help = env.ok("help", &env.waitpoint(&["timer", "create", "--help"]));
    let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert!(
        !usage.contains("--agent") && !usage.contains("--session"),
        "{usage}"
    );
}

#[test]
fn a_timer_file_that_says_session_still_reads_and_is_shown_as_agent_id() {
    let env = Env::new();
    let made = env.waitpoint_json(
        "create",
        &["timer", "create", "--after-ms", "600000", "--json"],
    );
    let id = made["id"].as_str().unwrap().to_owned();
    let path = env.home.join("timers").join(format!("{id}.json"));
    let text = fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"agent_id\": \"default\""), "{text}");
    // As an earlier version wrote it.
    fs::write(&path, text.replace("\"agent_id\"", "\"session\"")).unwrap();
    let shown = env.waitpoint_json("show", &["timer", "show", &id, "--json"]);
    assert_eq!(shown["agent_id"], "default", "{shown}");
}

#[test]
fn the_control_routes_are_off_without_the_operator_token() {
    let env = Env::new();
    let _d = env.daemon_with(&["--http", "--port", "0"], &[]);
    let port = env.webhook_port();
    let (code, body) = curl(
        &env,
        "GET",
        &format!("http://127.0.0.1:{port}/api/agents/default/timers"),
        Some(TOKEN),
        None,
    );
    assert_eq!(code, 404, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("CORTEX_WEBHOOK_TOKEN"),
        "{body}"
    );
}

#[test]
fn the_control_routes_need_the_operator_token_and_do_what_the_spec_says() {
    let env = Env::new();
    let _d = env.daemon_with(
        &["--http", "--port", "0"],
        &[("CORTEX_WEBHOOK_TOKEN", TOKEN)],
    );
    let port = env.webhook_port();
    let api = |path: &str| format!("http://127.0.0.1:{port}{path}");
    let timers = api("/api/control/agents/a1/timers");

    // Without the token, or with a wrong one (or a waitpoint's secret): 401.
    let (wid, wsecret) = id_secret(&env.arm("w", &[]));
    let create = r#"{"duration_ms": 600000, "interval_ms": 3600000, "summary": "look again", "authority_class": "operator"}"#;
    for auth in [None, Some("wrong-token-0123456789"), Some(wsecret.as_str())] {
        let (code, body) = curl(&env, "POST", &timers, auth, Some(create));
        assert_eq!(code, 401, "{auth:?}: {body}");
    }
    // The signal route never takes the operator token: a wrong secret is refused all the same.
    let signal = json!({"id": wid, "secret": TOKEN, "status": "ok"}).to_string();
    let (code, _) = curl(
        &env,
        "POST",
        &api("/webhook/signal"),
        Some(TOKEN),
        Some(&signal),
    );
    assert_eq!(code, 401);
    assert_eq!(env.state(&wid)["status"], "armed");

    // POST /api/control/agents/:id/timers, with the spec's fields.
    let (code, t) = curl(&env, "POST", &timers, Some(TOKEN), Some(create));
    assert_eq!(code, 201, "{t}");
    assert_eq!(t["agent_id"], "a1");
    assert_eq!(
        (t["duration_ms"].as_u64(), t["interval_ms"].as_u64()),
        (Some(600000), Some(3600000))
    );
    assert_eq!(t["repeat"], true);
    assert_eq!(t["status"], "active");
    assert_eq!(t["authority_class"], "operator", "recorded as metadata");
    let tid = t["id"].as_str().unwrap().to_owned();
    // A bad field is named.
    let (code, bad) = curl(
        &env,
        "POST",
        &timers,
        Some(TOKEN),
        Some(r#"{"duration_ms": 0}"#),
    );
    assert_eq!(code, 400);
    assert!(
        bad["error"].as_str().unwrap().contains("duration_ms"),
        "{bad}"
    );

    // GET /api/agents/:id/timers and /api/agents/:id/timers/:timer_id.
    let (code, list) = curl(
        &env,
        "GET",
        &api("/api/agents/a1/timers"),
        Some(TOKEN),
        None,
    );
    assert_eq!(code, 200);
    assert_eq!(list["timers"][0]["id"], tid.as_str(), "{list}");
    let (code, one) = curl(
        &env,
        "GET",
        &api(&format!("/api/agents/a1/timers/{tid}")),
        Some(TOKEN),
        None,
    );
    assert_eq!((code, one["id"].as_str()), (200, Some(tid.as_str())));
    // Owned only: another agent reads it as not found, whatever authority the caller claims.
    let (code, _) = curl(
        &env,
        "GET",
        &api(&format!("/api/agents/a2/timers/{tid}")),
        Some(TOKEN),
        None,
    );
    assert_eq!(code, 404);
    let (code, _) = curl(
        &env,
        "POST",
        &api(&format!("/api/control/agents/a2/timers/{tid}/cancel")),
        Some(TOKEN),
        Some(r#"{"authority_class": "root"}"#),
    );
    assert_eq!(code, 404, "authority_class elevated nothing");

    // POST .../timers/:timer_id/cancel: cancelled; again: the same (idempotent).
    let cancel = api(&format!("/api/control/agents/a1/timers/{tid}/cancel"));
    for _ in 0..2 {
        let (code, c) = curl(
            &env,
            "POST",
            &cancel,
            Some(TOKEN),
            Some(r#"{"authority_class": "operator"}"#),
        );
        assert_eq!(
            (code, c["status"].as_str()),
            (200, Some("cancelled")),
            "{c}"
        );
    }
    // The CLI sees the same timer under the same agent.
    let shown = env.waitpoint_json("show", &["timer", "show", &tid, "--agent", "a1", "--json"]);
    assert_eq!(shown["status"], "cancelled");

    // POST /api/control/agents/:agent_id/reset-callback: ok, agent_id, external_trigger_id,
    // trigger_url, delivery_mode, status.
    let reset = api("/api/control/agents/a1/reset-callback");
    let (code, first) = curl(&env, "POST", &reset, Some(TOKEN), None);
    assert_eq!(code, 200, "{first}");
    let mut keys: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "agent_id",
            "delivery_mode",
            "external_trigger_id",
            "ok",
            "status",
            "trigger_url"
        ]
    );
    assert_eq!(
        (
            first["ok"].as_bool(),
            first["agent_id"].as_str(),
            first["delivery_mode"].as_str(),
            first["status"].as_str()
        ),
        (Some(true), Some("a1"), Some("wake_hint"), Some("active"))
    );
    let url = first["trigger_url"].as_str().unwrap().to_owned();
    assert!(url.starts_with(&api("/api/callbacks/wake/")), "{url}");
    assert_eq!(curl(&env, "POST", &url, None, None).0, 202);
    // A second reset revokes the first URL and issues a new one.
    let (_, second) = curl(&env, "POST", &reset, Some(TOKEN), None);
    let new_url = second["trigger_url"].as_str().unwrap().to_owned();
    assert_ne!(second["external_trigger_id"], first["external_trigger_id"]);
    assert_eq!(curl(&env, "POST", &url, None, None).0, 404);
    assert_eq!(curl(&env, "POST", &new_url, None, None).0, 202);
    let old = env.waitpoint_json(
        "old callback",
        &[
            "callback",
            "show",
            first["external_trigger_id"].as_str().unwrap(),
            "--agent",
            "a1",
            "--json",
        ],
    );
    assert_eq!(old["status"], "revoked");
    // The wrong method is 405; an unknown control path 404.
    assert_eq!(curl(&env, "GET", &reset, Some(TOKEN), None).0, 405);
    assert_eq!(
        curl(
            &env,
            "POST",
            &api("/api/control/agents/a1/nothing"),
            Some(TOKEN),
            None
        )
        .0,
        404
    );
    // The token is in no file under the home.
    for f in crate::invariants::all_files(&env.home) {
        let bytes = fs::read(&f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(TOKEN),
            "{}",
            f.display()
        );
    }
}

#[test]
fn without_the_shim_cortex_signal_exits_1_for_what_the_daemon_would_refuse() {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("one", &[]));
    let (bid, bsec) = id_secret(&env.arm("b", &["--member", "arm2", "--member", "arm6"]));
    let cases: [(&str, Vec<&str>, &str); 4] = [
        (
            "wrong secret",
            vec!["--id", &id, "--secret", "00ff"],
            "wrong secret",
        ),
        (
            "unknown id",
            vec!["--id", "wp_0123456789ab", "--secret", &secret],
            "unknown waitpoint id",
        ),
        (
            "missing member",
            vec!["--id", &bid, "--secret", &bsec],
            "arm2, arm6",
        ),
        (
            "unlisted member",
            vec!["--id", &bid, "--secret", &bsec, "--member", "arm9"],
            "arm2, arm6",
        ),
    ];
    for (what, args, says) in cases {
        let out = env.signal(&args);
        env.expect_code(what, &out, 1);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(says) && said.contains("refused"),
            "{what}: {said}"
        );
    }
    // No refused signal is spooled; the two misses (not the member refusals) leave a record of
    // the id alone for the daemon's log.
    let mut left: Vec<String> = env
        .spooled()
        .iter()
        .map(|n| fs::read_to_string(env.drop_zone().join(n)).unwrap())
        .collect();
    let mut expected = [
        format!(r#"{{"refused_by_sender":"{id}"}}"#),
        r#"{"refused_by_sender":"wp_0123456789ab"}"#.to_owned(),
    ];
    left.sort();
    expected.sort();
    assert_eq!(left, expected, "{}", env.tree());
    // What the home cannot refuse is spooled (exit 0): the daemon is not running.
    env.ok("valid", &env.signal(&["--id", &id, "--secret", &secret]));
    assert_eq!(env.spooled().len(), 3);
    // `waitpoint run` checks before the command starts.
    let ran = env.home.join("../ran");
    let out = env.waitpoint(&[
        "run",
        "--id",
        &bid,
        "--secret",
        &bsec,
        "--",
        "touch",
        ran.to_str().unwrap(),
    ]);
    env.expect_code("run without its member", &out, 1);
    assert!(
        !ran.exists(),
        "the command ran though its signal would be refused"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("not started"));
}

#[test]
fn a_cancelled_waitpoint_tells_the_job_what_cancel_said() {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("c", &[]));
    let cancel = env.ok("cancel", &env.waitpoint(&["cancel", &id]));
    let out = env.signal(&["--id", &id, "--secret", &secret]);
    let job = env.ok("late signal", &out);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("already cancelled; nothing to do"),
        "{job}{said}"
    );
    assert!(
        cancel.contains("already cancelled; nothing to do"),
        "cancel promised something else: {cancel}"
    );
}

#[test]
fn the_curl_line_says_it_needs_the_shim_when_none_listens() {
    let env = Env::new();
    let off = env.arm("t", &[]);
    let note = off["how_to_signal"]["curl_note"]
        .as_str()
        .unwrap_or_default();
    assert!(note.contains("waitpoint daemon --http"), "{off}");
    let human = env.ok(
        "create",
        &env.waitpoint(&["create", "--label", "t", "--intent", "i"]),
    );
    assert!(human.contains("waitpoint daemon --http"), "{human}");
    let _d = env.daemon_with(&["--http", "--port", "0"], &[]);
    let port = env.webhook_port();
    let on = env.arm("t", &[]);
    assert!(on["how_to_signal"].get("curl_note").is_none(), "{on}");
    let curl_line = on["how_to_signal"]["curl"].as_str().unwrap();
    assert!(
        curl_line.contains(&format!("127.0.0.1:{port}/")),
        "{curl_line}"
    );
}

#[test]
fn a_heartbeat_shows_in_check_and_brief_with_its_age() {
    let env = Env::new();
    let _d = env.daemon();
    let (id, secret) = id_secret(&env.arm("train", &["--max-signals", "5"]));
    let beat = [
        &["--id", id.as_str(), "--secret", secret.as_str()][..],
        &["--status", "progress", "--message", "step 12000"],
    ]
    .concat();
    env.ok("heartbeat", &env.signal(&beat));
    env.wait_until("recorded", || env.state(&id)["counters"]["progress"] == 1);
    let table = env.ok("check", &env.waitpoint(&["check"]));
    assert!(
        table.contains("heartbeat") && table.contains("ago") && table.contains("step 12000"),
        "{table}"
    );
    let brief = env.ok("brief", &env.waitpoint(&["check", "--brief"]));
    assert!(
        brief.contains("heartbeat") && brief.contains("ago"),
        "{brief}"
    );
    let json = env.waitpoint_json("check --json", &["check", "--json"]);
    assert_eq!(
        json["waiting"][0]["latest_heartbeat"]["message"],
        "step 12000"
    );
}

#[test]
fn the_shell_line_names_every_file_afresh_under_dash_and_without_gnu_date() {
    let env = Env::new();
    let reply = env.arm("m", &["--max-signals", "5"]);
    let (id, _) = id_secret(&reply);
    let shell = line(&reply, "shell");
    assert!(
        !shell.contains("$RANDOM") && !shell.contains("%N"),
        "{shell}"
    );
    // A `date` that prints %N as it is, as a non-GNU one does.
    let bin = env.home.join("../fake-bin");
    fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("date");
    fs::write(
        &fake,
        "#!/bin/sh\ncase \"$1\" in *%N*) printf '%s\\n' \"${1#+}\";; *) exec /bin/date \"$@\";; \
         esac\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    // Two signals from one shell in the same second: two files, two signals.
    let out = env
        .command("dash")
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .arg("-c")
        .arg(format!("true; {shell}; true; {shell}"))
        .output()
        .unwrap();
    env.ok("two signals under dash", &out);
    assert_eq!(env.spooled().len(), 2, "{}", env.tree());
    let _d = env.daemon();
    env.wait_until("both recorded", || {
        env.state(&id)["counters"]["signals"] == 2
    });
}

#[test]
fn after_a_kill_9_doctor_and_cortex_signal_say_the_same_about_the_lock() {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("m", &["--max-signals", "3"]));
    let d = env.daemon_with(&["--http", "--port", "0"], &[]);
    env.webhook_port();
    let pid = d.pid();
    d.kill();
    let out = env.signal(&["--id", &id, "--secret", &secret, "--status", "progress"]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    env.ok("spooled", &out);
    let doctor = String::from_utf8_lossy(&env.waitpoint(&["doctor"]).stdout).into_owned();
    let lock = env.home.join("daemon.lock");
    let words = format!("{} names pid {pid}, which is not running", lock.display());
    assert!(said.contains(&words), "cortex-signal: {said}");
    let line = doctor
        .lines()
        .find(|l| l.contains("daemon "))
        .unwrap_or_default();
    assert!(line.contains(&words), "doctor: {doctor}");
}

#[test]
fn not_found_errors_name_the_kind_and_only_scoped_lookups_mention_the_session() {
    let env = Env::new();
    for (args, says) in [
        (
            vec!["show", "wp_0123456789ab"],
            "no waitpoint wp_0123456789ab\n",
        ),
        (
            vec!["cancel", "wp_0123456789ab"],
            "no waitpoint wp_0123456789ab (or it is not this session's)\n",
        ),
        (
            vec!["timer", "cancel", "tm_0123456789ab"],
            "no timer tm_0123456789ab (or it is not this session's)\n",
        ),
        (
            vec!["callback", "show", "cb_0123456789ab"],
            "no callback cb_0123456789ab (or it is not this session's)\n",
        ),
    ] {
        let out = env.waitpoint(&args);
        env.expect_code(&format!("{args:?}"), &out, 3);
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("waitpoint: {says}"),
            "{args:?}"
        );
    }
}
