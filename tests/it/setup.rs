//! `waitpoint setup`: the real binary on a temp `$HOME`, a project and a home, as a new user runs
//! it. The merge rules themselves are unit-tested in `src/setup.rs`; here, what lands on disk.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::helpers::{Env, WAITPOINT};

fn json_at(path: &std::path::Path) -> Value {
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn setup_writes_each_harness_once_keeps_the_users_own_and_dry_run_writes_nothing() {
    let env = Env::new();
    let claude_settings = env.user_home.join(".claude/settings.json");
    fs::create_dir_all(claude_settings.parent().unwrap()).unwrap();
    fs::write(&claude_settings, r#"{"theme": "dark"}"#).unwrap();

    let dry = env.waitpoint(&["setup", "claude-code", "--dry-run"]);
    let said = env.ok("dry run", &dry);
    assert!(said.contains("nothing written"), "{said}");
    assert_eq!(
        fs::read_to_string(&claude_settings).unwrap(),
        r#"{"theme": "dark"}"#
    );
    assert!(!env.user_home.join(".claude.json").exists());

    let first = env.ok("setup", &env.waitpoint(&["setup", "claude-code"]));
    assert!(first.contains("added a Stop hook"), "{first}");
    let s = json_at(&claude_settings);
    assert_eq!(s["theme"], "dark");
    let stop = s["hooks"]["Stop"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap();
    // The home is not ~/.cortex: the hooks are told which it is.
    assert!(
        stop.contains(&format!("--home {}", env.home.display())) && stop.contains("claude-hook"),
        "{stop}"
    );
    let mcp = json_at(&env.user_home.join(".claude.json"));
    assert_eq!(mcp["mcpServers"]["waitpoint"]["args"][0], "mcp");
    assert_eq!(
        mcp["mcpServers"]["waitpoint"]["env"]["CORTEX_HOME"],
        env.home.display().to_string()
    );
    let home = json_at(&env.home.join("settings.json"));
    // The path it resolved, as in the hooks: the daemon's PATH is not this shell's.
    assert_eq!(
        home["onWake"],
        serde_json::json!([WAITPOINT, "adapter", "resume"])
    );
    assert_eq!(
        home["waitpointSweepMs"], 300,
        "the home's own settings stay"
    );

    let again = env.ok("setup again", &env.waitpoint(&["setup", "claude-code"]));
    assert!(again.contains("nothing changed"), "{again}");

    let codex = env.ok("codex", &env.waitpoint(&["setup", "codex"]));
    assert!(codex.contains("trust"), "{codex}");
    let toml = fs::read_to_string(env.user_home.join(".codex/config.toml")).unwrap();
    assert!(toml.contains("[mcp_servers.waitpoint]"), "{toml}");
    let hooks = json_at(&env.user_home.join(".codex/hooks.json"));
    assert!(
        hooks["hooks"]["Stop"][0]["hooks"][0]["command"]
            .as_str()
            .unwrap()
            .contains("codex-stop-hook")
    );

    // Gemini, for the project: its own file, and how to trust the folder it is read in.
    let project = env.user_home.join("project");
    fs::create_dir_all(&project).unwrap();
    let gemini = env.ok(
        "gemini",
        &env.waitpoint(&[
            "setup",
            "gemini",
            "--project",
            "--project-dir",
            project.to_str().unwrap(),
        ]),
    );
    assert!(
        gemini.contains("trustedFolders.json") && gemini.contains("TRUST_FOLDER"),
        "{gemini}"
    );
    let g = json_at(&project.join(".gemini/settings.json"));
    assert_eq!(g["mcpServers"]["waitpoint"]["trust"], true);
    assert!(
        g["hooks"]["AfterAgent"][0]["hooks"][0]["command"]
            .as_str()
            .unwrap()
            .contains("gemini-hook --timeout 86000")
    );
    assert!(
        !env.user_home.join(".gemini").exists(),
        "the user's files untouched"
    );
}

/// `waitpoint setup ARGS` in `dir`, bounded in time and memory: a setup that hangs on a FIFO or
/// reads a device for ever fails the test instead of wedging it (exit 124: timed out).
fn setup_in(env: &Env, dir: &Path, args: &[&str]) -> Output {
    let mut all = vec![
        "-c",
        "ulimit -v 4000000; exec timeout 100 \"$0\" setup \"$@\"",
        WAITPOINT,
    ];
    all.extend_from_slice(args);
    env.command("sh")
        .args(&all)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// Asserts `out` is a refusal naming `path` and saying `why`, and returns what it said.
fn refused(env: &Env, out: &Output, path: &Path, why: &str) -> String {
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{}", env.report(out));
    assert!(
        said.contains(&path.display().to_string()) && said.contains(why),
        "{path:?} {why:?}\n{}",
        env.report(out)
    );
    said
}

/// Every file beneath `dir` (links not followed) and what it holds.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(contents(&e.path()));
        } else if t.is_file() {
            out.push((e.path(), fs::read(e.path()).unwrap()));
        }
    }
    out
}

#[test]
fn project_setup_never_follows_a_link_nor_opens_what_is_not_a_regular_file() {
    let env = Env::new();
    let secret = "sk-ant-api03-not-for-the-repository";
    let user_config = env.user_home.join(".claude.json");
    let user_text = format!("{{\"primaryApiKey\": \"{secret}\"}}");
    fs::write(&user_config, &user_text).unwrap();
    let project = env.home.parent().unwrap().join("project");
    let elsewhere = env.home.parent().unwrap().join("elsewhere");
    fs::create_dir_all(&project).unwrap();
    fs::create_dir_all(&elsewhere).unwrap();

    // A checkout that commits `.mcp.json -> ../user/.claude.json`.
    let mcp = project.join(".mcp.json");
    symlink("../user/.claude.json", &mcp).unwrap();
    let said = refused(
        &env,
        &setup_in(&env, &project, &["claude-code", "--project"]),
        &mcp,
        "is a symbolic link (to ../user/.claude.json)",
    );
    assert!(said.contains(&format!("rm {}", mcp.display())), "{said}");
    assert!(fs::symlink_metadata(&mcp).unwrap().is_symlink());
    assert_eq!(fs::read_to_string(&user_config).unwrap(), user_text);
    fs::remove_file(&mcp).unwrap();

    // A directory of the project that is a link, for either harness.
    for (harness, dir) in [
        ("claude-code", ".claude"),
        ("codex", ".codex"),
        ("gemini", ".gemini"),
    ] {
        let link = project.join(dir);
        symlink(&elsewhere, &link).unwrap();
        refused(
            &env,
            &setup_in(&env, &project, &[harness, "--project"]),
            &link,
            "is a symbolic link",
        );
        fs::remove_file(&link).unwrap();
    }
    assert!(
        contents(&elsewhere).is_empty(),
        "{:?}",
        contents(&elsewhere)
    );

    // A FIFO, and a link to a device that never ends.
    let settings = project.join(".claude/settings.json");
    fs::create_dir_all(settings.parent().unwrap()).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&settings)
        .status()
        .unwrap();
    assert!(made.success());
    refused(
        &env,
        &setup_in(&env, &project, &["claude-code", "--project"]),
        &settings,
        "is a FIFO, not a regular file",
    );
    fs::remove_file(&settings).unwrap();
    let hooks = project.join(".codex/hooks.json");
    fs::create_dir_all(hooks.parent().unwrap()).unwrap();
    symlink("/dev/zero", &hooks).unwrap();
    refused(
        &env,
        &setup_in(&env, &project, &["codex", "--project"]),
        &hooks,
        "is a symbolic link (to /dev/zero)",
    );
    fs::remove_file(&hooks).unwrap();

    // The home's settings are reached as the daemon reaches them: a link there is refused.
    let home_settings = env.home.join("settings.json");
    let moved = env.home.join("../settings-elsewhere.json");
    fs::rename(&home_settings, &moved).unwrap();
    symlink(&moved, &home_settings).unwrap();
    refused(
        &env,
        &setup_in(&env, &project, &["claude-code", "--project"]),
        &home_settings,
        "is a symbolic link",
    );
    fs::remove_file(&home_settings).unwrap();
    fs::rename(&moved, &home_settings).unwrap();

    // With the links gone, the same setup writes the project's files, none with the secret.
    env.ok(
        "setup",
        &setup_in(&env, &project, &["claude-code", "--project"]),
    );
    let written = contents(&project);
    assert!(written.len() >= 3, "{written:?}");
    for (path, bytes) in written {
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(secret), "{}: {text}", path.display());
    }
    assert_eq!(fs::read_to_string(&user_config).unwrap(), user_text);
}

/// A regular file another user owns: one given away when the tests run as root, else one of
/// the system's.
fn foreign_file(env: &Env) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let probe = env.home.join("../probe");
    fs::write(&probe, "{}").unwrap();
    if fs::metadata(&probe).unwrap().uid() != 0 {
        return PathBuf::from("/etc/hostname");
    }
    std::os::unix::fs::chown(&probe, Some(65534), Some(65534)).unwrap();
    probe
}

#[test]
fn user_setup_writes_through_a_link_to_the_users_own_file_and_says_so_and_refuses_any_other() {
    let env = Env::new();
    let dotfiles = env.user_home.join("dotfiles");
    fs::create_dir_all(dotfiles.join("claude")).unwrap();
    fs::write(dotfiles.join("claude.json"), "{\"theme\": \"dark\"}\n").unwrap();
    let config = env.user_home.join(".claude.json");
    symlink("dotfiles/claude.json", &config).unwrap();
    symlink(dotfiles.join("claude"), env.user_home.join(".claude")).unwrap();

    let said = env.ok("setup", &setup_in(&env, &env.user_home, &["claude-code"]));
    let real = fs::canonicalize(dotfiles.join("claude.json")).unwrap();
    assert!(
        said.contains(&format!(
            "{} is a link to {}, your own regular file",
            config.display(),
            real.display()
        )),
        "{said}"
    );
    assert!(said.contains("your own directory"), "{said}");
    // The links stay links; what they lead to holds the merge.
    assert!(fs::symlink_metadata(&config).unwrap().is_symlink());
    let merged = json_at(&dotfiles.join("claude.json"));
    assert_eq!(merged["theme"], "dark");
    assert_eq!(merged["mcpServers"]["waitpoint"]["args"][0], "mcp");
    assert!(dotfiles.join("claude/settings.json").is_file());

    // A link to a device, or to a file that is not the user's: said, and refused.
    fs::remove_file(&config).unwrap();
    symlink("/dev/zero", &config).unwrap();
    let said = refused(
        &env,
        &setup_in(&env, &env.user_home, &["claude-code"]),
        &config,
        "is a symbolic link to /dev/zero",
    );
    assert!(said.contains("a character device"), "{said}");
    fs::remove_file(&config).unwrap();
    let foreign = foreign_file(&env);
    symlink(&foreign, &config).unwrap();
    let said = refused(
        &env,
        &setup_in(&env, &env.user_home, &["claude-code"]),
        &config,
        &format!("is a symbolic link to {}", foreign.display()),
    );
    assert!(said.contains("not yours"), "{said}");
    assert!(
        said.contains("only to a regular file of your own"),
        "{said}"
    );
    // So is a FIFO in the user's directory, and a file too large to be a configuration.
    fs::remove_file(&config).unwrap();
    let toml = env.user_home.join(".codex/config.toml");
    fs::create_dir_all(toml.parent().unwrap()).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&toml)
            .status()
            .unwrap()
            .success()
    );
    refused(
        &env,
        &setup_in(&env, &env.user_home, &["codex"]),
        &toml,
        "is a FIFO",
    );
    fs::remove_file(&toml).unwrap();
    let big = fs::File::create(&toml).unwrap();
    big.set_len(waitpoint::setup::MAX_FILE_BYTES + 1).unwrap();
    refused(
        &env,
        &setup_in(&env, &env.user_home, &["codex"]),
        &toml,
        "is larger than 32 MiB",
    );
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn setup_keeps_what_is_not_ours_byte_for_byte_and_the_modes_or_refuses_saying_why() {
    let env = Env::new();
    let project = env.home.parent().unwrap().join("project");
    let settings = project.join(".claude/settings.json");
    fs::create_dir_all(settings.parent().unwrap()).unwrap();

    // A hook list of another shape, and a key twice: refused by name, the file untouched.
    for (text, why) in [
        (
            r#"{"hooks": {"Stop": {"hooks": [{"type": "command", "command": "notify-send"}]}}}"#,
            "hooks.Stop is an object, not an array",
        ),
        (
            r#"{"model": "opus", "model": "sonnet"}"#,
            "has the key model twice",
        ),
        (
            r#"{"permissions": {"allow": "Bash"}}"#,
            "permissions.allow is a string",
        ),
    ] {
        fs::write(&settings, text).unwrap();
        refused(
            &env,
            &setup_in(&env, &project, &["claude-code", "--project"]),
            &settings,
            why,
        );
        assert_eq!(fs::read_to_string(&settings).unwrap(), text);
        // One file refused, none written: not the project's .mcp.json planned before it.
        assert!(!project.join(".mcp.json").exists());
    }

    // Numbers as written, the file's own layout, its mode: all kept.
    let text = "{\n    \"big\": 123456789012345678901234567890,\n    \"ratio\": 1.50,\n    \
                \"env\": {\"A\": \"1\"},\n    \"hooks\": {\n        \"Stop\": []\n    }\n}\n";
    fs::write(&settings, text).unwrap();
    chmod(&settings, 0o644);
    let user_config = env.user_home.join(".claude.json");
    fs::write(
        &user_config,
        "{\"n\": 123456789012345678901234567890, \"z\": -0.0}",
    )
    .unwrap();
    chmod(&user_config, 0o640);
    env.ok(
        "project setup",
        &setup_in(&env, &project, &["claude-code", "--project"]),
    );
    env.ok("user setup", &setup_in(&env, &project, &["claude-code"]));
    let after = fs::read_to_string(&settings).unwrap();
    assert!(
        after.starts_with(
            "{\n    \"big\": 123456789012345678901234567890,\n    \"ratio\": 1.50,\n    \
             \"env\": {\"A\": \"1\"},\n    \"hooks\": {\n        \"Stop\": [\n            {\n"
        ),
        "{after}"
    );
    assert_eq!(mode_of(&settings), 0o644);
    let after = fs::read_to_string(&user_config).unwrap();
    assert!(
        after.starts_with("{\"n\": 123456789012345678901234567890, \"z\": -0.0, \"mcpServers\": {"),
        "{after}"
    );
    assert_eq!(mode_of(&user_config), 0o640);
}

/// A harness rewriting `~/.claude.json` as Claude Code does (read, change, write a temp file,
/// rename), every ten milliseconds (far more often than Claude Code) until told to stop: each
/// rewrite adds its number to `seen`.
const REWRITER: &str = r#"
import json, os, sys, time
path, stop = sys.argv[1], sys.argv[2]
n = 0
while not os.path.exists(stop):
    with open(path) as f:
        v = json.load(f)
    v["seen"].append(n)
    with open(path + ".tmp", "w") as f:
        json.dump(v, f)
    os.rename(path + ".tmp", path)
    n += 1
    time.sleep(0.01)
print(n)
"#;

#[test]
fn setup_racing_a_harness_that_rewrites_claude_json_loses_none_of_its_writes() {
    let env = Env::new();
    let config = env.user_home.join(".claude.json");
    let stop = env.home.join("../stop");
    let (mut lost, mut merged_again, mut most, mut ours_gone) = (Vec::new(), 0, 1, 0);
    for trial in 0..30 {
        fs::write(&config, r#"{"seen": []}"#).unwrap();
        let _ = fs::remove_file(&stop);
        let rewriter = std::process::Command::new("/usr/bin/python3")
            .args(["-c", REWRITER])
            .arg(&config)
            .arg(&stop)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        env.wait_until("the harness rewriting", || {
            fs::read_to_string(&config).is_ok_and(|t| t.contains("[0, 1"))
        });
        let said = env.ok("setup", &setup_in(&env, &env.user_home, &["claude-code"]));
        fs::write(&stop, "").unwrap();
        let out = rewriter.wait_with_output().unwrap();
        let rewrites: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        if let Some(n) = said
            .split_once("merged again over its new text (")
            .and_then(|(_, rest)| rest.split_once(' '))
            .and_then(|(n, _)| n.parse::<usize>().ok())
        {
            merged_again += 1;
            most = most.max(n);
        }
        let seen = json_at(&config)["seen"].clone();
        // Not asserted: a rewrite begun before setup's write and ended after its read-back
        // drops the entry after setup saw it on disk, which no writer without a lock can
        // prevent.
        ours_gone += usize::from(json_at(&config)["mcpServers"]["waitpoint"].is_null());
        if seen != serde_json::json!((0..rewrites).collect::<Vec<_>>()) {
            lost.push((trial, said));
        }
    }
    // The race was run, not dodged: some setups had to merge again.
    eprintln!(
        "{merged_again} of 30 setups merged again over the harness's write, in {most} attempts \
         at most; the entry set, then dropped by a rewrite that read before it, in {ours_gone}"
    );
    assert!(lost.is_empty(), "the harness's writes lost in {lost:#?}");
}

#[test]
fn on_wake_runs_the_path_setup_resolved_from_a_daemon_without_waitpoint_on_its_path() {
    let env = Env::new();
    env.ok("setup", &setup_in(&env, &env.user_home, &["claude-code"]));
    let on_wake = json_at(&env.home.join("settings.json"))["onWake"].clone();
    let hook = json_at(&env.user_home.join(".claude/settings.json"))["hooks"]["Stop"][0]["hooks"]
        [0]["command"]
        .as_str()
        .unwrap()
        .to_owned();
    let program = on_wake[0].as_str().unwrap();
    assert!(Path::new(program).is_absolute(), "{on_wake}");
    assert!(hook.starts_with(program), "{hook} {on_wake}");

    // A daemon whose PATH lacks waitpoint (as under systemd) still runs it.
    let daemon_path = [("PATH", "/usr/bin:/bin")];
    let _daemon = env.daemon_with_env(&daemon_path);
    let reply = env.arm("eval", &["--session", "agent"]);
    let id = reply["id"].as_str().unwrap().to_owned();
    let line = reply["how_to_signal"]["cli"].as_str().unwrap().to_owned();
    env.ok("job", &env.job_then(true, &line, None));
    env.wait_until("the onWake run recorded", || {
        let d = &env.state(&id)["hook_deliveries"][0];
        d["delivered_at"].is_string() || d["last_error"].is_string()
    });
    let d = env.state(&id)["hook_deliveries"][0].clone();
    assert!(d["delivered_at"].is_string(), "{d}");

    // doctor says the program resolves, and which it is.
    let doctor = env
        .command(WAITPOINT)
        .env("PATH", "/usr/bin:/bin")
        .arg("doctor")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout).into_owned();
    let row = said
        .lines()
        .find(|l| l.contains("on-wake"))
        .unwrap_or_default();
    assert!(row.contains("OK") && row.contains(program), "{said}");
}

#[test]
fn doctor_fails_an_on_wake_program_the_daemon_cannot_start_and_says_how_to_fix_it() {
    let env = Env::with_settings(r#"{"onWake": ["waitpoint", "adapter", "resume"]}"#);
    let doctor = |path: &str| {
        let out = env
            .command(WAITPOINT)
            .env("PATH", path)
            .arg("doctor")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Not on the PATH the daemon would have: a FAIL naming the fix.
    let said = doctor("/usr/bin:/bin");
    let row: Vec<&str> = said
        .lines()
        .skip_while(|l| !l.contains("on-wake"))
        .take(2)
        .collect();
    assert!(
        row[0].contains("FAIL") && row[0].contains("\"waitpoint\", which is not on"),
        "{said}"
    );
    assert!(said.contains("waitpoint setup"), "{said}");
    // On it: OK, saying where it was found.
    let bin = Path::new(WAITPOINT).parent().unwrap();
    let said = doctor(&format!("{}:/usr/bin", bin.display()));
    let row = said.lines().find(|l| l.contains("on-wake")).unwrap();
    assert!(row.contains("OK") && row.contains(WAITPOINT), "{said}");
    // A relative path, which the daemon would resolve against its own directory.
    fs::write(
        env.home.join("settings.json"),
        r#"{"onWake": ["bin/waitpoint", "adapter", "resume"]}"#,
    )
    .unwrap();
    let said = doctor(&format!("{}:/usr/bin", bin.display()));
    let row = said.lines().find(|l| l.contains("on-wake")).unwrap();
    assert!(
        row.contains("FAIL") && row.contains("a relative path"),
        "{said}"
    );
    // An absolute path that is not executable.
    let notes = env.home.join("notes.txt");
    fs::write(&notes, "not a program").unwrap();
    chmod(&notes, 0o644);
    let settings = format!(r#"{{"onWake": ["{}"]}}"#, notes.display());
    fs::write(env.home.join("settings.json"), settings).unwrap();
    let said = doctor("/usr/bin:/bin");
    let row = said.lines().find(|l| l.contains("on-wake")).unwrap();
    assert!(
        row.contains("FAIL") && row.contains("not executable"),
        "{said}"
    );
}

#[test]
fn codex_setup_writes_where_codex_home_says_and_tells_a_project_it_must_be_trusted() {
    let env = Env::new();
    let codex_home = env.user_home.join("elsewhere/codex");
    fs::create_dir_all(&codex_home).unwrap();
    let out = env
        .command(WAITPOINT)
        .args(["setup", "codex"])
        .env("CODEX_HOME", &codex_home)
        .output()
        .unwrap();
    env.ok("setup codex", &out);
    let toml = fs::read_to_string(codex_home.join("config.toml")).unwrap();
    assert!(toml.contains("[mcp_servers.waitpoint]"), "{toml}");
    let hooks = json_at(&codex_home.join("hooks.json"));
    assert!(hooks["hooks"]["Stop"][0]["hooks"][0]["command"].is_string());
    assert!(
        !env.user_home.join(".codex").exists(),
        "~/.codex written though CODEX_HOME names another place"
    );

    let project = env.user_home.join("proj");
    fs::create_dir_all(&project).unwrap();
    let out = env
        .command(WAITPOINT)
        .args(["setup", "codex", "--project"])
        .env("CODEX_HOME", &codex_home)
        .current_dir(&project)
        .output()
        .unwrap();
    let said = env.ok("setup codex --project", &out);
    let table = format!("[projects.\"{}\"]", project.display());
    assert!(
        said.contains("only in a trusted project")
            && said.contains(&table)
            && said.contains(&codex_home.join("config.toml").display().to_string()),
        "{said}"
    );
}
