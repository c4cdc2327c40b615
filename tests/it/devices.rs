//! Device spools over SSH, against a real OpenSSH server on 127.0.0.1 (see `sshd`): files a job
//! drops on the "device" reach their waitpoints through the local mirror, and no crash, dropped
//! link or bad file loses or doubles a signal.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::*;
use crate::sshd::Sshd;

pub(crate) fn add_device(env: &Env, sshd: &Sshd, name: &str, extra: &[&str]) {
    add_device_with(
        env,
        sshd,
        name,
        Some(&sshd.identity),
        &sshd.known_hosts,
        extra,
    );
}

/// `device add` for this server with a chosen key (`None`: the agent) and known_hosts file.
fn add_device_with(
    env: &Env,
    sshd: &Sshd,
    name: &str,
    identity: Option<&Path>,
    known_hosts: &Path,
    extra: &[&str],
) {
    let port = sshd.port.to_string();
    let mut args = vec![
        "device",
        "add",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--known-hosts",
        known_hosts.to_str().unwrap(),
        "--spool",
        sshd.spool.to_str().unwrap(),
    ];
    if let Some(id) = identity {
        args.extend(["--identity", id.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    env.ok("device add", &env.waitpoint(&args));
}

pub(crate) fn status(env: &Env, device: &str) -> Value {
    let p = env.home.join("devices").join(device).join("status.json");
    fs::read(&p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

fn mirror(env: &Env, device: &str) -> PathBuf {
    env.home.join("devices").join(device).join("spool")
}

/// `*.json` names waiting in a device's local mirror.
fn mirrored(env: &Env, device: &str) -> Vec<String> {
    fs::read_dir(mirror(env, device))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

/// The sources of every recorded signal of a waitpoint.
fn sources(env: &Env, id: &str) -> Vec<String> {
    let out = env.waitpoint(&["show", id, "--json"]);
    let v: Value = serde_json::from_str(&env.ok("show", &out)).unwrap();
    v["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["source"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits for the daemon's first round (run at start) to finish, so a test's later `poll` is
/// the round that sees what the test drops.
fn wait_first_round(env: &Env) {
    env.wait_until("the collector's first round", || {
        status(env, "gpu")["reachable"] == true
    });
}

#[test]
fn shell_line_on_a_device_resolves_its_waitpoint_through_the_mirror() {
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &[]);
    let _d = env.daemon();
    let reply = env.arm("t", &["--device", "gpu"]);
    let (id, _) = id_secret(&reply);
    assert_eq!(reply["how_to_signal"]["recommended"], "shell");
    let shell = line(&reply, "shell");
    assert!(
        shell.contains(&format!("d={};", sshd.spool.display())),
        "the shell line aims at the device's spool: {shell}"
    );
    env.ok("job on the device", &env.sh(&format!("true; {shell}")));
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    let state = env.state(&id);
    assert_eq!(state["outcome"], "ok");
    let src = sources(&env, &id);
    assert_eq!(src.len(), 1);
    assert!(
        src[0].starts_with("device:gpu:") && src[0].ends_with(".json"),
        "{src:?}"
    );
    assert!(sshd.remote_names().is_empty(), "{:?}", sshd.remote_names());
    env.wait_until("the mirror to drain", || mirrored(&env, "gpu").is_empty());
    let list = env.ok("device list", &env.waitpoint(&["device", "list"]));
    assert!(list.contains("gpu") && list.contains("reachable"), "{list}");
    // The signal record carries the device identity and still matches its layout.
    let schemas = crate::layouts::Schemas::load();
    let log = env.home.join("waitpoints").join(&id).join("signals.jsonl");
    let lines = crate::layouts::jsonl_lines(&log);
    assert!(!lines.is_empty(), "no record in {log:?}");
    for line in &lines {
        schemas.check_value("signal-record", &log.display().to_string(), line);
    }
}

#[test]
fn member_file_from_a_device_and_a_local_signal_together_resolve_a_barrier() {
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &[]);
    let _d = env.daemon();
    let reply = env.arm(
        "b",
        &["--member", "arm1", "--member", "arm2", "--device", "gpu"],
    );
    let (id, _) = id_secret(&reply);
    let shell = line(&reply, "shell").replace("MEMBER", "arm1");
    env.ok("arm1 on the device", &env.sh(&format!("true; {shell}")));
    env.wait_until("arm1 to be recorded", || {
        env.state(&id)["counters"]["signals"] == 1
    });
    assert_eq!(env.state(&id)["status"], "armed");
    // The device only says where to collect: a signal from the local CLI still counts.
    let cli = line(&reply, "cli").replace("MEMBER", "arm2");
    env.ok("arm2 locally", &env.sh(&format!("true; {cli}")));
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    let out = env.waitpoint(&["show", &id, "--json"]);
    let v: Value = serde_json::from_str(&env.ok("show", &out)).unwrap();
    let by_member: BTreeSet<(String, String)> = v["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let src = s["source"].as_str().unwrap();
            let route = src.split(':').next().unwrap().to_owned();
            (s["member"].as_str().unwrap().to_owned(), route)
        })
        .collect();
    assert_eq!(
        by_member,
        BTreeSet::from([
            ("arm1".to_owned(), "device".to_owned()),
            ("arm2".to_owned(), "spool".to_owned()),
        ])
    );
}

#[test]
fn unknown_or_changed_host_key_is_refused_with_the_line_that_adds_it() {
    let sshd = Sshd::start();
    let env = Env::new();
    let empty = env.home.join("../empty_known_hosts");
    fs::write(&empty, "").unwrap();
    add_device_with(&env, &sshd, "gpu", Some(&sshd.identity), &empty, &[]);
    let port = sshd.port.to_string();
    sshd.drop_remote("1-waiting", r#"{"id":"wp_000000000000","secret":"s"}"#);
    let out = env.waitpoint(&["device", "test", "gpu"]);
    env.expect_code("test, unknown key", &out, 1);
    let err = stderr_of(&out);
    assert!(err.contains("unknown host key"), "{err}");
    assert!(err.contains(&format!("[127.0.0.1]:{port}")), "{err}");
    let fix = format!(
        "ssh-keyscan -p {port} -t ed25519 127.0.0.1 >> {}",
        empty.display()
    );
    assert!(
        err.contains(&fix),
        "the message says how to add the key: {err}"
    );
    env.expect_code(
        "poll, unknown key",
        &env.waitpoint(&["device", "poll", "gpu"]),
        1,
    );
    assert_eq!(sshd.remote_names(), ["1-waiting.json"], "nothing was taken");
    let list = env.ok("list", &env.waitpoint(&["device", "list"]));
    assert!(
        list.contains("unreachable") && list.contains("unknown host key"),
        "{list}"
    );

    // A different key under the same name is a mismatch, refused just as firmly.
    let other = env.home.join("../other_key");
    let kg = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(kg.status.success());
    let other_pub = fs::read_to_string(other.with_extension("pub")).unwrap();
    let key: Vec<&str> = other_pub.split_whitespace().take(2).collect();
    fs::write(&empty, format!("[127.0.0.1]:{port} {}\n", key.join(" "))).unwrap();
    let out = env.waitpoint(&["device", "test", "gpu"]);
    env.expect_code("test, changed key", &out, 1);
    let err = stderr_of(&out);
    assert!(err.contains("does NOT match"), "{err}");
    assert!(err.contains("ssh-keygen -R"), "{err}");

    // Following the advice makes the device work.
    fs::write(&empty, "").unwrap();
    let scan = env.sh(&fix);
    env.ok("the suggested ssh-keyscan line", &scan);
    let out = env.ok(
        "test after adding the key",
        &env.waitpoint(&["device", "test", "gpu"]),
    );
    assert!(out.contains("1 file(s) waiting"), "{out}");
}

#[test]
fn offline_device_waits_backs_off_shows_in_check_and_catches_up() {
    let mut sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &[]);
    sshd.kill();
    let _d = env.daemon();
    let reply = env.arm("t", &["--device", "gpu"]);
    let (id, _) = id_secret(&reply);
    env.ok("job", &env.job_then(true, &line(&reply, "shell"), None));
    env.wait_until("two failed attempts", || {
        status(&env, "gpu")["failures"].as_u64().unwrap_or(0) >= 2
    });
    let st = status(&env, "gpu");
    assert_eq!(st["reachable"], false);
    assert_eq!(st["last_success_at"], Value::Null);
    assert!(
        st["last_error"]
            .as_str()
            .unwrap()
            .contains("cannot connect"),
        "{st}"
    );
    // The wait before the next try doubles with each failure.
    let failures = st["failures"].as_u64().unwrap() as u32;
    let at = |k: &str| {
        waitpoint::clock::Timestamp::parse(st[k].as_str().unwrap())
            .unwrap()
            .as_millis()
    };
    assert_eq!(
        (at("next_attempt_at") - at("last_attempt_at")) as u64,
        waitpoint::ingress::device::backoff_ms(300, failures)
    );
    assert_eq!(sshd.remote_names().len(), 1, "the file waits on the device");
    let list = env.ok("list", &env.waitpoint(&["device", "list"]));
    assert!(
        list.contains("unreachable") && list.contains("never collected"),
        "{list}"
    );
    assert!(list.contains("last error: cannot connect"), "{list}");
    let check = env.ok("check", &env.waitpoint(&["check"]));
    assert!(check.contains("device gpu is unreachable"), "{check}");
    assert!(check.contains(&id), "{check}");

    // Everything else keeps working meanwhile.
    let local = env.arm("l", &[]);
    let (lid, _) = id_secret(&local);
    env.ok("local", &env.job_then(true, &line(&local, "cli"), None));
    env.ok(
        "local wait",
        &env.waitpoint(&["wait", &lid, "--timeout", "120"]),
    );

    sshd.restart();
    env.ok(
        "poll after restart",
        &env.waitpoint(&["device", "poll", "gpu"]),
    );
    env.ok("wait", &env.waitpoint(&["wait", &id, "--timeout", "120"]));
    let st = status(&env, "gpu");
    assert_eq!(st["reachable"], true);
    assert_eq!(st["failures"], 0);
    let check = env.ok("check", &env.waitpoint(&["check"]));
    assert!(!check.contains("unreachable"), "{check}");
}

/// A daemon collecting from `gpu` only on demand (its first round done), a monitor waitpoint,
/// and `n` progress files for it waiting on the device. Returns the identities they will get.
fn progress_files_waiting(sshd: &Sshd, n: usize) -> (Env, DaemonGuard, String, BTreeSet<String>) {
    let env = Env::new();
    add_device(&env, sshd, "gpu", &["--sweep-ms", "0"]);
    let d = env.daemon();
    wait_first_round(&env);
    let reply = env.arm("m", &[]);
    let (id, secret) = id_secret(&reply);
    let mut names = BTreeSet::new();
    for i in 0..n {
        let name = format!("{i:05}-job");
        sshd.drop_remote(&name, &body(&id, &secret, r#","status":"progress""#));
        names.insert(format!("device:gpu:{name}.json"));
    }
    (env, d, id, names)
}

fn spawn_poll(env: &Env) -> Child {
    env.command(WAITPOINT)
        .args(["device", "poll", "gpu"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn sshd_killed_mid_collection_then_restarted_loses_and_doubles_nothing() {
    let mut sshd = Sshd::start();
    const N: usize = 400;
    let (env, _d, id, names) = progress_files_waiting(&sshd, N);
    let poll = spawn_poll(&env);
    // Pull the plug once the round is under way.
    let start = Instant::now();
    while sshd
        .remote_names()
        .iter()
        .filter(|n| n.ends_with(".json"))
        .count()
        == N
        && start.elapsed() < PATIENCE
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    sshd.kill();
    let out = poll.wait_with_output().unwrap();
    let remaining = sshd.remote_names().len();
    assert!(
        remaining > 0,
        "the round finished before the kill; the test proved nothing\n{}",
        env.report(&out)
    );
    env.expect_code("poll during the outage", &out, 1);
    assert_eq!(status(&env, "gpu")["reachable"], false);

    sshd.restart();
    env.ok(
        "poll after restart",
        &env.waitpoint(&["device", "poll", "gpu"]),
    );
    assert!(sshd.remote_names().is_empty(), "{:?}", sshd.remote_names());
    env.wait_until("every signal to be recorded", || {
        env.state(&id)["counters"]["signals"] == N as u64 && mirrored(&env, "gpu").is_empty()
    });
    let src = sources(&env, &id);
    assert_eq!(src.len(), N, "nothing doubled");
    assert_eq!(
        src.into_iter().collect::<BTreeSet<_>>(),
        names,
        "nothing lost"
    );
    assert_eq!(env.state(&id)["counters"]["progress"], N as u64);
}

#[test]
fn a_claimed_file_left_by_a_crash_is_collected_on_the_next_round() {
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &["--sweep-ms", "0"]);
    let reply = env.arm("t", &["--device", "gpu"]);
    let (id, secret) = id_secret(&reply);
    // What a collector that died between claiming and copying leaves on the device.
    let tag = waitpoint::ingress::device::claim_tag(&waitpoint::home::Home::new(&env.home), "gpu");
    let claimed = format!(".7-crash.json.claimed-{tag}");
    fs::write(sshd.spool.join(&claimed), body(&id, &secret, "")).unwrap();
    // Another collector's claim is not ours to take.
    let foreign = ".8-other.json.claimed-elsewhere";
    fs::write(sshd.spool.join(foreign), body(&id, &secret, "")).unwrap();
    // No daemon: `poll` collects in-process.
    let out = env.ok("poll", &env.waitpoint(&["device", "poll", "gpu"]));
    assert!(
        out.contains("collected 1 file(s)") && out.contains("applied 1"),
        "{out}"
    );
    assert_eq!(env.state(&id)["status"], "resolved");
    assert_eq!(sources(&env, &id), ["device:gpu:7-crash.json"]);
    assert_eq!(sshd.remote_names(), [foreign]);
}

#[test]
fn malformed_remote_file_is_parked_locally_and_removed_remotely() {
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &["--sweep-ms", "0"]);
    let _d = env.daemon();
    wait_first_round(&env);
    sshd.drop_remote("5-broken", r#"{"id": "wp_0000"#);
    // The first round leaves it (a writer may still be writing) and says so; the next one,
    // finding it unchanged, takes it.
    env.ok("poll", &env.waitpoint(&["device", "poll", "gpu"]));
    assert_eq!(sshd.remote_names(), ["5-broken.json"]);
    let left = &status(&env, "gpu")["left_on_device"];
    assert_eq!(left[0]["file"], "5-broken.json", "{left}");
    assert_eq!(left[0]["settling"], true, "{left}");
    env.ok("poll", &env.waitpoint(&["device", "poll", "gpu"]));
    assert!(sshd.remote_names().is_empty(), "{:?}", sshd.remote_names());
    let bad = mirror(&env, "gpu").join("bad");
    // The reason is committed first, then the file beside it.
    env.wait_until("the file to be parked", || {
        bad.join("5-broken.reason").exists() && bad.join("5-broken.json").exists()
    });
    assert_eq!(
        fs::read_to_string(bad.join("5-broken.json")).unwrap(),
        r#"{"id": "wp_0000"#
    );
    let reason = fs::read_to_string(bad.join("5-broken.reason")).unwrap();
    assert!(reason.contains("not a valid signal"), "{reason}");
    // Polling again does not fetch it again.
    env.ok("poll again", &env.waitpoint(&["device", "poll", "gpu"]));
    assert_eq!(status(&env, "gpu")["last_collected"], 0);
}

#[test]
fn a_thousand_files_are_collected_in_one_round() {
    let sshd = Sshd::start();
    const N: u64 = 1000;
    let (env, _d, id, _) = progress_files_waiting(&sshd, N as usize);
    env.ok("poll", &env.waitpoint(&["device", "poll", "gpu"]));
    assert_eq!(status(&env, "gpu")["last_collected"], N);
    assert!(sshd.remote_names().is_empty());
    env.wait_until_within("all signals recorded", Duration::from_secs(180), || {
        env.state(&id)["counters"]["progress"] == N
    });
    assert_eq!(env.state(&id)["counters"]["signals"], N);
}

#[test]
fn ssh_agent_authenticates_a_device_without_an_identity_file() {
    let sshd = Sshd::start();
    let env = Env::new();
    let sock = env.home.join("../agent.sock");
    let mut agent = Command::new("ssh-agent")
        .args(["-D", "-a"])
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ssh-agent (openssh-client)");
    env.wait_until("the agent socket", || sock.exists());
    let added = Command::new("ssh-add")
        .arg(&sshd.identity)
        .env("SSH_AUTH_SOCK", &sock)
        .output()
        .unwrap();
    assert!(added.status.success(), "{}", stderr_of(&added));
    add_device_with(&env, &sshd, "gpu", None, &sshd.known_hosts, &[]);
    let out = env.waitpoint(&["device", "test", "gpu"]);
    env.expect_code("without an agent", &out, 1);
    assert!(
        stderr_of(&out).contains("SSH_AUTH_SOCK"),
        "{}",
        stderr_of(&out)
    );
    let out = env
        .command(WAITPOINT)
        .args(["device", "test", "gpu"])
        .env("SSH_AUTH_SOCK", &sock)
        .output()
        .unwrap();
    env.ok("with the agent", &out);
    let _ = agent.kill();
    let _ = agent.wait();
}

#[test]
fn create_with_an_unknown_device_is_a_usage_error() {
    let env = Env::new();
    let out = env.waitpoint(&[
        "create", "--label", "t", "--intent", "i", "--device", "nope",
    ]);
    env.expect_code("create", &out, 2);
    let err = stderr_of(&out);
    assert!(err.contains("no device named \"nope\""), "{err}");
    assert!(
        !env.home.join("waitpoints").exists()
            || fs::read_dir(env.home.join("waitpoints"))
                .unwrap()
                .next()
                .is_none()
    );
}

#[test]
fn device_add_validates_and_list_show_remove_round_trip() {
    let env = Env::new();
    let out = env.waitpoint(&[
        "device",
        "add",
        "gpu",
        "--host",
        "h",
        "--user",
        "u",
        "--identity",
        "/no/such/key",
    ]);
    env.expect_code("missing key", &out, 2);
    assert!(stderr_of(&out).contains("no such key file"));
    env.ok(
        "add",
        &env.waitpoint(&["device", "add", "gpu", "--host", "h.example", "--user", "u"]),
    );
    env.expect_code(
        "add twice",
        &env.waitpoint(&["device", "add", "gpu", "--host", "h", "--user", "u"]),
        1,
    );
    let rec: Value =
        serde_json::from_slice(&fs::read(env.home.join("devices/gpu.json")).unwrap()).unwrap();
    assert_eq!(rec["spool"], "~/.cortex/tmp/signals");
    assert_eq!(rec["port"], 22);
    assert_eq!(rec["identity"], Value::Null);
    assert_eq!(
        rec["known_hosts"],
        env.user_home.join(".ssh/known_hosts").to_str().unwrap()
    );
    let show = env.ok("show", &env.waitpoint(&["device", "show", "gpu"]));
    assert!(
        show.contains("u@h.example:22")
            && show.contains("ssh-agent")
            && show.contains("not polled"),
        "{show}"
    );
    let reply = env.arm("t", &["--device", "gpu"]);
    assert!(line(&reply, "shell").contains("d=~/.cortex/tmp/signals;"));
    env.ok("remove", &env.waitpoint(&["device", "remove", "gpu"]));
    env.expect_code(
        "show removed",
        &env.waitpoint(&["device", "show", "gpu"]),
        2,
    );
    let list = env.ok("list", &env.waitpoint(&["device", "list"]));
    assert!(list.contains("no devices"), "{list}");
}

#[test]
fn two_device_records_of_one_spool_never_finish_each_others_claims() {
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu-a", &["--sweep-ms", "0"]);
    add_device(&env, &sshd, "gpu-b", &["--sweep-ms", "0"]);
    let reply = env.arm("t", &["--device", "gpu-a", "--max-signals", "10"]);
    let (id, secret) = id_secret(&reply);
    // A claim gpu-a's collector made and did not finish.
    let home = waitpoint::home::Home::new(&env.home);
    let tag_a = waitpoint::ingress::device::claim_tag(&home, "gpu-a");
    let tag_b = waitpoint::ingress::device::claim_tag(&home, "gpu-b");
    assert_ne!(tag_a, tag_b);
    let claimed = format!(".7-a.json.claimed-{tag_a}");
    fs::write(
        sshd.spool.join(&claimed),
        body(&id, &secret, r#","status":"progress""#),
    )
    .unwrap();
    env.ok("poll b", &env.waitpoint(&["device", "poll", "gpu-b"]));
    assert_eq!(
        sshd.remote_names(),
        [claimed.as_str()],
        "gpu-b took gpu-a's claim"
    );
    assert_eq!(env.state(&id)["counters"]["signals"], 0);
    env.ok("poll a", &env.waitpoint(&["device", "poll", "gpu-a"]));
    assert!(sshd.remote_names().is_empty(), "{:?}", sshd.remote_names());
    assert_eq!(sources(&env, &id), ["device:gpu-a:7-a.json"]);
}

#[test]
fn a_remote_file_over_the_cap_stays_on_the_device_whole() {
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &["--sweep-ms", "0"]);
    let reply = env.arm("t", &["--device", "gpu"]);
    let (id, secret) = id_secret(&reply);
    let big = format!(
        r#"{{"id":"{id}","secret":"{secret}","data":"{}"}}"#,
        "x".repeat(1_000_000)
    );
    sshd.drop_remote("9-big", &big);
    sshd.drop_remote("10-ok", &body(&id, &secret, ""));
    env.ok("poll", &env.waitpoint(&["device", "poll", "gpu"]));
    // The good one is collected; the big one is left as it was, not cut short, not deleted.
    assert_eq!(sshd.remote_names(), ["9-big.json"]);
    assert_eq!(
        fs::read_to_string(sshd.spool.join("9-big.json")).unwrap(),
        big
    );
    assert_eq!(sources(&env, &id), ["device:gpu:10-ok.json"]);
    let bad = mirror(&env, "gpu").join("bad");
    assert!(
        fs::read_dir(&bad).map(|d| d.count()).unwrap_or(0) == 0,
        "parked a cut-short copy"
    );
}

#[test]
fn a_remote_file_that_cannot_be_claimed_does_not_stall_the_device() {
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &["--sweep-ms", "0"]);
    let reply = env.arm("t", &["--device", "gpu", "--max-signals", "5"]);
    let (id, secret) = id_secret(&reply);
    // A directory already holds the name the claim would rename the first file to, so that
    // one rename fails (as root, permissions would not stop it).
    let tag = waitpoint::ingress::device::claim_tag(&waitpoint::home::Home::new(&env.home), "gpu");
    let blocker = sshd.spool.join(format!(".1-stuck.json.claimed-{tag}"));
    fs::create_dir_all(blocker.join("in-the-way")).unwrap();
    sshd.drop_remote("1-stuck", &body(&id, &secret, r#","status":"progress""#));
    sshd.drop_remote("2-fine", &body(&id, &secret, r#","status":"progress""#));
    env.ok("poll", &env.waitpoint(&["device", "poll", "gpu"]));
    assert_eq!(sources(&env, &id), ["device:gpu:2-fine.json"]);
    assert!(sshd.remote_names().contains(&"1-stuck.json".to_owned()));
    let status: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(env.home.join("devices/gpu/status.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(status["reachable"], true, "{status}");
}

#[test]
fn a_remote_file_written_in_place_in_two_steps_is_collected_whole() {
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &["--sweep-ms", "0"]);
    let reply = env.arm("t", &["--device", "gpu"]);
    let (id, secret) = id_secret(&reply);
    let whole = body(&id, &secret, "");
    let (first, rest) = whole.split_at(whole.len() / 2);
    // Written straight to its final name, half now and half later, as a careless job would.
    let path = sshd.spool.join("3-halves.json");
    fs::write(&path, first).unwrap();
    env.ok("poll", &env.waitpoint(&["device", "poll", "gpu"]));
    assert_eq!(sshd.remote_names(), ["3-halves.json"], "the half was taken");
    use std::io::Write as _;
    fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(rest.as_bytes())
        .unwrap();
    env.ok("poll", &env.waitpoint(&["device", "poll", "gpu"]));
    assert!(sshd.remote_names().is_empty(), "{:?}", sshd.remote_names());
    assert_eq!(sources(&env, &id), ["device:gpu:3-halves.json"]);
    assert!(
        !mirror(&env, "gpu").join("bad").exists()
            || fs::read_dir(mirror(&env, "gpu").join("bad"))
                .unwrap()
                .count()
                == 0,
        "a fragment was parked"
    );
    assert!(status(&env, "gpu").get("left_on_device").is_none());
}

#[test]
fn a_hard_linked_remote_file_is_left_on_the_device_and_reported() {
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &["--sweep-ms", "0"]);
    let reply = env.arm("t", &["--device", "gpu"]);
    let (id, secret) = id_secret(&reply);
    // A file outside the spool, given a second name inside it.
    let outside = sshd.spool.join("../outside.json");
    fs::write(&outside, body(&id, &secret, "")).unwrap();
    fs::hard_link(&outside, sshd.spool.join("4-linked.json")).unwrap();
    env.ok("poll", &env.waitpoint(&["device", "poll", "gpu"]));
    assert_eq!(sshd.remote_names(), ["4-linked.json"]);
    assert!(outside.exists());
    assert_eq!(env.state(&id)["counters"]["signals"], 0);
    let left = &status(&env, "gpu")["left_on_device"];
    assert_eq!(left[0]["file"], "4-linked.json", "{left}");
    assert!(
        left[0]["reason"].as_str().unwrap().contains("hard links"),
        "{left}"
    );
    let shown = env.ok("device list", &env.waitpoint(&["device", "list"]));
    assert!(shown.contains("4-linked.json"), "{shown}");
    crate::invariants::report(
        "8-trust-devices",
        &[(
            "trust: a hard-linked device file: left on the device and listed in status.json (real \
             sshd on 127.0.0.1)",
            format!(
                "{} of 1 left, {} counted",
                left.as_array().map_or(0, Vec::len),
                env.state(&id)["counters"]["signals"]
            ),
        )],
    );
}

#[cfg(feature = "failpoints")]
#[test]
fn a_remote_file_swapped_for_a_link_after_the_listing_is_not_followed() {
    use std::io::BufRead;
    let sshd = Sshd::start();
    let env = Env::new();
    add_device(&env, &sshd, "gpu", &["--sweep-ms", "0"]);
    let reply = env.arm("t", &["--device", "gpu"]);
    let (id, secret) = id_secret(&reply);
    // Outside the remote spool: a valid signal, what following the link would copy home.
    let outside = sshd.spool.join("../elsewhere.json");
    let precious = body(&id, &secret, "");
    fs::write(&outside, &precious).unwrap();
    let name = sshd.spool.join("6-swapped.json");
    sshd.drop_remote("6-swapped", &body(&id, &secret, r#","status":"progress""#));
    // A round in this process (no daemon), held for a while once it has listed the spool.
    let mut poll = env
        .command(WAITPOINT)
        .args(["device", "poll", "gpu"])
        .env("RUST_LOG", "waitpoint=debug")
        .env("FAILPOINTS", "device-after-list=sleep(3000)")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let mut lines = std::io::BufReader::new(poll.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        said.push_str(&line);
        said.push('\n');
        if line.contains("listed the remote spool") {
            break;
        }
    }
    assert!(said.contains("listed the remote spool"), "{said}");
    // Listed as a regular file; now a link to the file outside.
    fs::remove_file(&name).unwrap();
    std::os::unix::fs::symlink(&outside, &name).unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status_code = poll.wait().unwrap();
    assert!(status_code.success(), "{said}{}", rest.join("\n"));
    assert_eq!(
        env.state(&id)["counters"]["signals"],
        0,
        "the link was followed"
    );
    assert_eq!(fs::read_to_string(&outside).unwrap(), precious);
    assert!(
        fs::symlink_metadata(&name)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was not given its name back: {:?}",
        sshd.remote_names()
    );
    assert!(
        mirrored(&env, "gpu").is_empty(),
        "{:?}",
        mirrored(&env, "gpu")
    );
    let left = &status(&env, "gpu")["left_on_device"];
    assert!(
        left[0]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("swapped"),
        "{left}"
    );
}
