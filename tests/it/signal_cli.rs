//! `cortex-signal`: flags, environment defaults, caps and exit codes as the spec documents them.

use std::io::Write;
use std::process::Stdio;

use crate::helpers::*;

fn spooled_body(env: &Env) -> serde_json::Value {
    let names = env.spooled();
    assert_eq!(names.len(), 1, "{names:?}");
    serde_json::from_slice(&std::fs::read(env.drop_zone().join(&names[0])).unwrap()).unwrap()
}

const ID: &str = "wp_0123456789ab";

#[test]
fn no_arguments_prints_help_and_sends_nothing() {
    let env = Env::new();
    let out = env
        .command(CORTEX_SIGNAL)
        .env("CORTEX_SIGNAL_ID", ID)
        .env("CORTEX_SIGNAL_SECRET", "s")
        .output()
        .unwrap();
    env.expect_code("bare cortex-signal", &out, 2);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("--exit-code") && text.contains("--no-spool"),
        "{text}"
    );
    assert!(env.spooled().is_empty());
}

#[test]
fn missing_id_or_secret_is_a_usage_error() {
    let env = Env::new();
    env.expect_code(
        "no id",
        &env.signal(&["--secret", "s", "--exit-code", "0"]),
        2,
    );
    env.expect_code(
        "no secret",
        &env.signal(&["--id", ID, "--exit-code", "0"]),
        2,
    );
    assert!(env.spooled().is_empty());
}

#[test]
fn exit_code_becomes_status_and_message_and_status_overrides_it() {
    let env = Env::new();
    env.ok(
        "spool",
        &env.signal(&["--id", ID, "--secret", "s", "--exit-code", "3"]),
    );
    let b = spooled_body(&env);
    assert_eq!(
        (b["status"].as_str(), b["message"].as_str()),
        (Some("fail"), Some("exit=3"))
    );
    std::fs::remove_dir_all(env.drop_zone()).unwrap();

    let out = env.signal(&[
        "--id",
        ID,
        "--secret",
        "s",
        "--exit-code",
        "0",
        "--status",
        "progress",
        "--message",
        "step 5",
    ]);
    env.ok("spool", &out);
    let b = spooled_body(&env);
    assert_eq!(
        (b["status"].as_str(), b["message"].as_str()),
        (Some("progress"), Some("step 5"))
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("transport: spool"));
}

#[test]
fn environment_supplies_id_secret_and_member() {
    let env = Env::new();
    let out = env
        .command(CORTEX_SIGNAL)
        .args(["--exit-code", "0"])
        .env("CORTEX_SIGNAL_ID", ID)
        .env("CORTEX_SIGNAL_SECRET", "abc")
        .env("CORTEX_SIGNAL_MEMBER", "arm2")
        .output()
        .unwrap();
    env.ok("env", &out);
    let b = spooled_body(&env);
    assert_eq!(b["id"], ID);
    assert_eq!(b["secret"], "abc");
    assert_eq!(b["member"], "arm2");
}

#[test]
fn oversize_message_or_data_is_a_usage_error_not_a_truncation() {
    let env = Env::new();
    let long = "m".repeat(2_001);
    env.expect_code(
        "message",
        &env.signal(&["--id", ID, "--secret", "s", "--message", &long]),
        2,
    );
    let big = env.home.join("../big.log");
    std::fs::write(&big, "d".repeat(16_001)).unwrap();
    let at = format!("@{}", big.display());
    let out = env.signal(&["--id", ID, "--secret", "s", "--data", &at]);
    env.expect_code("data file", &out, 2);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        said.contains("16000") && said.contains(&format!("--data {at} is over")),
        "{said}"
    );
    let out = env.signal(&["--id", ID, "--secret", "s", "--data", &"d".repeat(16_001)]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(said.contains("the --data text is over the limit"), "{said}");
    // A file that is not there: a usage error (2), said once.
    let missing = format!("@{}", env.home.join("../no-such.log").display());
    let out = env.signal(&["--id", ID, "--secret", "s", "--data", &missing]);
    env.expect_code("missing data file", &out, 2);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(said.matches("No such file").count(), 1, "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(env.spooled().is_empty());
}

#[test]
fn data_comes_from_a_file_stdin_or_the_literal() {
    let env = Env::new();
    let log = env.home.join("../tail.log");
    std::fs::write(&log, "loss 0.12\n").unwrap();
    env.ok(
        "file",
        &env.signal(&[
            "--id",
            ID,
            "--secret",
            "s",
            "--data",
            &format!("@{}", log.display()),
        ]),
    );
    assert_eq!(spooled_body(&env)["data"], "loss 0.12\n");
    std::fs::remove_dir_all(env.drop_zone()).unwrap();

    let mut child = env
        .command(CORTEX_SIGNAL)
        .args(["--id", ID, "--secret", "s", "--data", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin")
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(spooled_body(&env)["data"], "from stdin");
    std::fs::remove_dir_all(env.drop_zone()).unwrap();

    env.ok(
        "literal",
        &env.signal(&["--id", ID, "--secret", "s", "--data", "plain text"]),
    );
    assert_eq!(spooled_body(&env)["data"], "plain text");
}

#[test]
fn no_spool_with_no_reachable_daemon_exits_one() {
    let env = Env::new();
    let out = env.signal(&["--id", ID, "--secret", "s", "--no-spool"]);
    env.expect_code("no spool", &out, 1);
    assert!(env.spooled().is_empty());
}

#[test]
fn spool_writes_leave_no_temp_file_behind() {
    let env = Env::new();
    env.ok("spool", &env.signal(&["--id", ID, "--secret", "s"]));
    let all: Vec<_> = std::fs::read_dir(env.drop_zone())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "bad")
        .collect();
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(all[0].ends_with(".json"));
}
