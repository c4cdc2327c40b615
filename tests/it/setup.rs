//! `waitpoint setup`: the real binary on a temp `$HOME`, a project and a home, as a new user runs
//! it. The merge rules themselves are unit-tested in `src/setup.rs`; here, what lands on disk.

use std::fs;

use serde_json::Value;

use crate::helpers::Env;

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
    assert_eq!(
        home["onWake"],
        serde_json::json!(["waitpoint", "adapter", "resume"])
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
}
