//! Codex's managed app-server: whether a hook runs under it, and which Codex terminals show a
//! thread it runs.
//!
//! Codex (0.157 and later, `features.daemon_auto_start`) runs the threads of its TUIs in one
//! background `codex app-server … --managed-daemon` per Codex home, which it starts on first use
//! and which outlives every terminal. Hooks and MCP servers are then the app-server's children,
//! so a hook's parent no longer tells whether anyone still looks at the thread: after `/quit`
//! the app-server keeps the thread and its running Stop hook, and a wake handed to that hook
//! would continue the thread where nobody sees it. The Codex terminals are the only witness: a
//! waiter serves the ones that show its thread and leaves when they are gone.
//!
//! Everything here is read from `/proc` (command lines, environments, working directories) of
//! the caller's own processes; nothing is signalled or opened for writing.

use std::path::{Path, PathBuf};

/// Whether process `pid` is a managed Codex app-server (`codex app-server … --managed-daemon`).
pub fn is_managed_app_server(pid: rustix::process::RawPid) -> bool {
    read_nul(&format!("/proc/{pid}/cmdline")).is_some_and(|argv| managed_app_server_argv(&argv))
}

fn managed_app_server_argv(argv: &[String]) -> bool {
    argv.iter().any(|a| a == "app-server") && argv.iter().any(|a| a == "--managed-daemon")
}

/// The Codex terminals of Codex home `codex_home` that may show thread `thread`, whose
/// directory is `cwd`: each running `codex` TUI of this user whose environment names the same
/// home and that was started for this thread (`codex resume THREAD`) or, when started without
/// naming one, in the thread's directory (`-C`/`--cd` counted). Two fresh terminals in one
/// directory cannot be told apart; both count.
pub fn terminals(codex_home: &Path, thread: &str, cwd: &Path) -> Vec<rustix::process::RawPid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let home = canonical(codex_home);
    let cwd = canonical(cwd);
    let me = std::process::id();
    entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .parse::<rustix::process::RawPid>()
                .ok()
        })
        .filter(|&pid| pid as u32 != me && shows(pid, &home, thread, &cwd))
        .collect()
}

/// Whether process `pid` is a Codex terminal of `home` that may show `thread` (in `cwd`).
fn shows(pid: rustix::process::RawPid, home: &Path, thread: &str, cwd: &Path) -> bool {
    let Some(argv) = read_nul(&format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    if !is_terminal(&argv) {
        return false;
    }
    let Some(env) = read_nul(&format!("/proc/{pid}/environ")) else {
        return false;
    };
    if home_of(&env).map(|h| canonical(&h)).as_deref() != Some(home) {
        return false;
    }
    let Ok(started_in) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
        return false;
    };
    match started_for(&argv[1..], thread) {
        Started::This => true,
        Started::Another => false,
        Started::Unnamed => canonical(&directory(&argv[1..], &started_in)) == cwd,
    }
}

/// Whether `argv` runs Codex's terminal UI: the program is `codex` (the native binary; the npm
/// wrapper runs it as `node …/codex`, and one of the two is enough), with no subcommand other
/// than `resume` or `fork`. A prompt given as an argument is never exactly a subcommand's name.
fn is_terminal(argv: &[String]) -> bool {
    const NOT_THE_TUI: [&str; 17] = [
        "exec",
        "e",
        "app-server",
        "mcp",
        "mcp-server",
        "login",
        "logout",
        "apply",
        "a",
        "completion",
        "sandbox",
        "debug",
        "features",
        "cloud",
        "help",
        "responses-api-proxy",
        "stdio-to-uds",
    ];
    let Some(program) = argv.first() else {
        return false;
    };
    Path::new(program).file_name().and_then(|n| n.to_str()) == Some("codex")
        && !argv[1..].iter().any(|a| NOT_THE_TUI.contains(&a.as_str()))
}

/// What a terminal's arguments say about the thread it shows.
#[derive(Debug, PartialEq)]
enum Started {
    /// Started for this thread (`codex resume THREAD`).
    This,
    /// `resume`/`fork` naming another thread by its id.
    Another,
    /// No thread named by id: a new thread, `resume --last`, or one named by its title.
    Unnamed,
}

fn started_for(args: &[String], thread: &str) -> Started {
    if args.iter().any(|a| a == thread) {
        return Started::This;
    }
    let Some(at) = args.iter().position(|a| a == "resume" || a == "fork") else {
        return Started::Unnamed;
    };
    match args[at + 1..].iter().find(|a| !a.starts_with('-')) {
        Some(id) if is_thread_id(id) => Started::Another,
        _ => Started::Unnamed,
    }
}

/// Codex's thread ids are UUIDs (`01a241be-8bbb-7a02-b0b9-bb32f797645a`).
fn is_thread_id(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The directory a terminal works in: its `-C`/`--cd` argument (relative to where it was
/// started) or where it was started.
fn directory(args: &[String], started_in: &Path) -> PathBuf {
    let mut given = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "-C" || a == "--cd" {
            given = it.next().cloned();
        } else if let Some(d) = a.strip_prefix("--cd=") {
            given = Some(d.to_owned());
        } else if let Some(d) = a.strip_prefix("-C").filter(|d| !d.is_empty()) {
            given = Some(d.to_owned());
        }
    }
    match given {
        Some(d) => started_in.join(d),
        None => started_in.to_owned(),
    }
}

/// The Codex home an environment names: `CODEX_HOME`, else `$HOME/.codex`.
fn home_of(env: &[String]) -> Option<PathBuf> {
    let var = |name: &str| {
        env.iter()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .filter(|v| !v.is_empty())
    };
    match var("CODEX_HOME") {
        Some(h) => Some(PathBuf::from(h)),
        None => var("HOME").map(|h| Path::new(h).join(".codex")),
    }
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}

/// A `/proc` file of NUL-separated strings (argv, the environment); at most 1 MiB is read.
fn read_nul(path: &str) -> Option<Vec<String>> {
    use std::io::Read;
    let mut raw = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(1 << 20)
        .read_to_end(&mut raw)
        .ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    const THREAD: &str = "01a241be-8bbb-7a02-b0b9-bb32f797645a";

    #[test]
    fn the_app_server_and_the_terminal_are_told_apart_from_other_codex_runs() {
        assert!(managed_app_server_argv(&args(
            "/h/.codex/packages/bin/codex app-server --listen unix:// --managed-daemon"
        )));
        assert!(!managed_app_server_argv(&args(
            "codex app-server --listen stdio://"
        )));
        assert!(is_terminal(&args("/usr/lib/codex/bin/codex")));
        assert!(is_terminal(&args("codex --model m resume --last")));
        // A prompt is one argument, never a bare subcommand name.
        assert!(is_terminal(&[
            "codex".to_owned(),
            "fix the exec bug".to_owned()
        ]));
        for other in [
            "codex exec --json resume x -",
            "/h/.codex/packages/bin/codex app-server daemon pid-update-loop",
            "codex mcp-server",
            "node /usr/bin/codex",
            "codexx",
        ] {
            assert!(!is_terminal(&args(other)), "{other}");
        }
    }

    #[test]
    fn a_terminal_shows_the_thread_it_names_and_otherwise_the_one_of_its_directory() {
        assert_eq!(
            started_for(&args(&format!("resume {THREAD}")), THREAD),
            Started::This
        );
        let other = "01a241be-8bbb-7a02-b0b9-bb32f7976400";
        assert_eq!(
            started_for(&args(&format!("resume {other}")), THREAD),
            Started::Another
        );
        assert_eq!(
            started_for(&args("resume --last"), THREAD),
            Started::Unnamed
        );
        assert_eq!(
            started_for(&args("resume my-title"), THREAD),
            Started::Unnamed
        );
        assert_eq!(started_for(&[], THREAD), Started::Unnamed);
        let start = Path::new("/p");
        assert_eq!(directory(&[], start), Path::new("/p"));
        assert_eq!(directory(&args("-C sub"), start), Path::new("/p/sub"));
        assert_eq!(directory(&args("--cd /q"), start), Path::new("/q"));
        assert_eq!(directory(&args("--cd=/q"), start), Path::new("/q"));
        assert_eq!(directory(&args("-C/r"), start), Path::new("/r"));
    }

    #[test]
    fn the_codex_home_is_codex_home_else_dot_codex_under_home() {
        let env = args("HOME=/u CODEX_HOME=/c");
        assert_eq!(home_of(&env), Some(PathBuf::from("/c")));
        assert_eq!(
            home_of(&args("HOME=/u CODEX_HOME=")),
            Some(PathBuf::from("/u/.codex"))
        );
        assert_eq!(home_of(&args("PATH=/bin")), None);
    }
}
