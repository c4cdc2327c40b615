//! What the CLI takes from the process environment: the home (`--home`, `CORTEX_HOME`,
//! `HOME`), the settings' fallbacks, the login name, the ssh-agent, `WEBHOOK_PORT`, the session
//! a harness started us in, and the context the printed signal lines depend on. The library
//! never reads the environment; these functions turn it into values first.

use std::path::PathBuf;

use crate::agent_view;
use crate::home::Home;
use crate::ingress::http;
use crate::settings::Settings;

/// `--home` > `CORTEX_HOME` > `~/.cortex`.
pub fn resolve_home(flag: Option<PathBuf>) -> Home {
    Home::new(flag.unwrap_or_else(default_home_root))
}

/// `CORTEX_HOME`, else `~/.cortex`.
pub fn default_home_root() -> PathBuf {
    match std::env::var_os("CORTEX_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => home_dir().join(".cortex"),
    }
}

/// Whether `home` is the one a bare `cortex-signal` (no `CORTEX_HOME`) would use.
pub fn is_implicit_default(home: &Home) -> bool {
    home.root() == home_dir().join(".cortex")
}

/// `$HOME`, else `/`.
pub fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// The login name for `device add`'s default `--user`: `$USER`, `$LOGNAME`, else the name of
/// the effective uid in the password database.
pub fn login_name() -> Option<String> {
    for var in ["USER", "LOGNAME"] {
        if let Ok(v) = std::env::var(var)
            && !v.is_empty()
        {
            return Some(v);
        }
    }
    // The password file's line for our uid (`name:x:uid:...`). Users known only to a
    // directory service have $USER set by their login anyway.
    let uid = rustix::process::geteuid().as_raw().to_string();
    std::fs::read_to_string("/etc/passwd")
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)? == uid && !name.is_empty()).then(|| name.to_owned())
        })
}

/// What SSH collectors take from the environment: the ssh-agent's socket.
pub fn ssh_options() -> crate::ingress::device::SshOptions {
    crate::ingress::device::SshOptions {
        agent_socket: std::env::var_os("SSH_AUTH_SOCK")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
    }
}

/// Settings of `home`, with the process environment as the fallback for absent keys.
pub fn load_settings(home: &Home) -> crate::error::Result<Settings> {
    Settings::load(&home.settings_file(), |k| std::env::var(k).ok())
}

/// `WEBHOOK_PORT`, when set: the port the HTTP shim uses unless told otherwise.
pub fn webhook_port_env() -> crate::error::Result<Option<u16>> {
    match std::env::var("WEBHOOK_PORT") {
        Ok(raw) if !raw.trim().is_empty() => raw.trim().parse().map(Some).map_err(|_| {
            crate::error::Error::Usage(format!(
                "environment variable WEBHOOK_PORT must be a port number, not {raw:?}"
            ))
        }),
        _ => Ok(None),
    }
}

/// The session when none is named: the harness's own, when a harness started this process, so
/// that each harness session is a waitpoint session of its own; else `default`.
pub fn default_session() -> String {
    harness_caller().map_or_else(|| "default".to_owned(), |c| c.session())
}

/// The harness session that started this process, if one did: Claude Code's names itself in
/// the environment, Gemini CLI's in its process's record.
pub fn harness_caller() -> Option<crate::harness::Caller> {
    crate::harness::from_env(&env_var).or_else(gemini_caller)
}

/// Inside Gemini CLI (its shell tool sets `GEMINI_CLI=1`), the session its SessionStart hook
/// recorded for the Gemini process above us, in the home the environment names (a session
/// default is needed before `--home` is read; another home finds no record, and `default`
/// stays).
fn gemini_caller() -> Option<crate::harness::Caller> {
    env_var("GEMINI_CLI")?;
    let home = Home::new(default_home_root());
    crate::harness::process_record::caller_of_process(
        &home,
        crate::harness::process_record::starter()?,
    )
}

/// A variable of the process environment; unset and empty are the same.
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// What the reply's lines depend on in this process's environment.
pub(crate) fn line_context(home: &Home) -> anyhow::Result<agent_view::LineContext> {
    Ok(agent_view::LineContext {
        fallback_port: webhook_port_env()?.unwrap_or(http::DEFAULT_PORT),
        home_is_implicit: is_implicit_default(home),
    })
}
