//! The ready-to-paste `how_to_signal` lines of a `wait_create` reply.
//!
//! Each line is only the signalling part, meant to be appended to the user's own command
//! (`python train.py; <line>`), so every form reads the previous command's exit status from `$?`.
//! Every line is plain POSIX `sh`; tests paste them into `sh -c`.

use serde::Serialize;

use crate::records::Waitpoint;

/// The placeholder a line carries where a member's name goes.
pub const MEMBER_PLACEHOLDER: &str = "MEMBER";
/// The placeholder the `attach_to_pid` line carries where the pid goes.
pub const PID_PLACEHOLDER: &str = "PID";

/// The `how_to_signal` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HowToSignal {
    pub env: String,
    pub cli: String,
    pub curl: String,
    pub shell: String,
    pub attach_to_pid: String,
    /// Which form fits: `shell` when the job runs on a device, else `cli`.
    pub recommended: &'static str,
    /// With members: which names to put where the lines say `MEMBER`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member_note: Option<String>,
    /// When no HTTP shim is listening for this home: what the `curl` line needs first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub curl_note: Option<String>,
    /// With `heartbeat_within` (and no device): the job wrapped in `waitpoint run --heartbeat`,
    /// which reports
    /// `progress` every interval while it lives and the result when it ends (put the command
    /// where the line says `COMMAND`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// The placeholder the `run` line carries where the job's command goes.
pub const COMMAND_PLACEHOLDER: &str = "COMMAND";

/// The `run --heartbeat` interval for a `heartbeat_within` window, as the flag takes it: two
/// thirds of the window (at least a second), so one late beat does not look like silence.
pub fn heartbeat_interval(window_ms: u64) -> String {
    let ms = (window_ms * 2 / 3).max(1_000);
    if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

impl HowToSignal {
    /// The line `recommended` names.
    pub fn recommended_line(&self) -> &String {
        if self.recommended == "shell" {
            &self.shell
        } else {
            &self.cli
        }
    }
}

/// Where the lines send signals.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    /// `Some(home)` when the home is not the default `~/.cortex`, so local lines must name it.
    pub home_override: Option<&'a str>,
    /// The drop zone on this machine.
    pub local_drop_zone: &'a str,
    /// The loopback port of the optional HTTP shim.
    pub webhook_port: u16,
    /// Whether a shim is listening (this home's daemon published it); when not, the `curl`
    /// line carries a note saying what it needs.
    pub shim: ShimState,
    /// For a device-bound waitpoint: the spool directory on the device (`~/` is the login's
    /// home there). `None` means the spec's default, `~/.cortex/tmp/signals`.
    pub device_spool: Option<&'a str>,
}

/// Whether the HTTP shim the `curl` line posts to is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShimState {
    /// Listening: this home's daemon published its address.
    Listening,
    /// Turned on in settings, but no daemon is running it now.
    Configured,
    /// Off (the default: no network listener unless asked for).
    Off,
}

/// Quotes a word for `sh` (single quotes, with embedded ones closed and escaped).
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:@,".contains(&b))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A device's spool path as a shell word that the device's shell expands: a leading `~/` stays
/// unquoted so it means the home there, the rest is quoted.
fn remote_dir_word(path: &str) -> String {
    match path.strip_prefix("~/") {
        Some(rest) => format!("~/{}", sh_quote(rest)),
        None if path == "~" => "~".to_owned(),
        None => sh_quote(path),
    }
}

/// Builds every line for `wp` with its plaintext `secret`.
pub fn build(wp: &Waitpoint, secret: &str, target: &Target<'_>) -> HowToSignal {
    let has_members = !wp.members.is_empty();
    let member_flag = if has_members {
        format!(" --member {MEMBER_PLACEHOLDER}")
    } else {
        String::new()
    };
    let member_json = if has_members {
        format!(r#","member":"{MEMBER_PLACEHOLDER}""#)
    } else {
        String::new()
    };
    let home_prefix = target
        .home_override
        .map(|h| format!("CORTEX_HOME={} ", sh_quote(h)))
        .unwrap_or_default();
    // The id and secret go in cortex-signal's environment, never its argv, which any local
    // user can read in /proc for as long as it runs.
    let signal = format!(
        "{home_prefix}CORTEX_SIGNAL_ID={} CORTEX_SIGNAL_SECRET={secret} cortex-signal{member_flag}",
        wp.id
    );
    let env = {
        let mut line = format!(
            "export CORTEX_SIGNAL_ID={} CORTEX_SIGNAL_SECRET={secret}",
            wp.id
        );
        if has_members {
            line.push_str(&format!(" CORTEX_SIGNAL_MEMBER={MEMBER_PLACEHOLDER}"));
        }
        if let Some(h) = target.home_override {
            line.push_str(&format!(" CORTEX_HOME={}", sh_quote(h)));
        }
        line
    };
    let status_of_s = r#"$([ $s -eq 0 ] && echo ok || echo fail)"#;
    // The body goes to curl on stdin (printf is the shell's own), so the secret is in no argv.
    let curl = format!(
        "s=$?; printf \
         '{{\"id\":\"{id}\",\"secret\":\"{secret}\",\"status\":\"%s\",\
         \"message\":\"exit=%s\"{member_json}}}' \
\"{status_of_s}\" \"$s\" | curl -sS -XPOST http://127.0.0.1:{port}/webhook/signal \
-H 'content-type: application/json' --data-binary @-",
        port = target.webhook_port,
        id = wp.id,
    );
    let drop_zone = if wp.device.is_some() {
        remote_dir_word(target.device_spool.unwrap_or("~/.cortex/tmp/signals"))
    } else {
        sh_quote(target.local_drop_zone)
    };
    // A fresh name needs no `$RANDOM` (empty under dash) and no GNU `date +%N` (printed as
    // is elsewhere): eight bytes from /dev/urandom through POSIX `od`, after the seconds (which
    // keep names in arrival order) and the shell's pid.
    let shell = format!(
        "s=$?; d={drop_zone}; f=\"$d/$(date +%s)-$$-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \
         \\n')\"; \
mkdir -p \"$d\"; \
printf '{{\"id\":\"{id}\",\"secret\":\"{secret}\",\"status\":\"%s\",\
\"message\":\"exit=%s\"{member_json}}}' \
\"{status_of_s}\" \"$s\" > \"$f.tmp\" && mv \"$f.tmp\" \"$f.json\"",
        id = wp.id,
    );
    let attach_to_pid = format!(
        "(while kill -0 {PID_PLACEHOLDER} 2>/dev/null; do sleep 5; done; \
{signal} --status ok --message \"pid {PID_PLACEHOLDER} exited\") &"
    );
    // Not for a device: the wrapper would run there, with that machine's home and spool.
    let run = wp
        .silence
        .heartbeat_within_ms
        .filter(|_| wp.device.is_none())
        .map(|window| {
            let env_prefix = signal
                .trim_end_matches(&member_flag)
                .trim_end_matches(" cortex-signal");
            format!(
                "{env_prefix} waitpoint run --heartbeat {}{member_flag} -- {COMMAND_PLACEHOLDER}",
                heartbeat_interval(window)
            )
        });
    HowToSignal {
        run,
        env,
        cli: format!("{signal} --exit-code $?"),
        curl,
        shell,
        attach_to_pid,
        recommended: if wp.device.is_some() { "shell" } else { "cli" },
        member_note: has_members.then(|| {
            format!(
                "replace {MEMBER_PLACEHOLDER} with this job's name, one of: {}",
                wp.members.join(", ")
            )
        }),
        curl_note: match target.shim {
            ShimState::Listening => None,
            ShimState::Configured => Some(format!(
                "the curl line needs the daemon's HTTP shim on port {}: it is turned on in \
settings.json but no daemon is running it now (start one: waitpoint daemon)",
                target.webhook_port
            )),
            ShimState::Off => Some(format!(
                "the curl line needs the daemon's HTTP shim, which is off for this home (the \
default): start the daemon with `waitpoint daemon --http` (port {}), or use the cli or shell line",
                target.webhook_port
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_interval_is_two_thirds_of_the_window_and_at_least_a_second() {
        assert_eq!(heartbeat_interval(90_000), "60s");
        assert_eq!(heartbeat_interval(4_000), "2666ms");
        assert_eq!(heartbeat_interval(1_200), "1s");
    }

    #[test]
    fn sh_quote_leaves_plain_words_and_quotes_the_rest() {
        assert_eq!(sh_quote("/home/a/.cortex"), "/home/a/.cortex");
        assert_eq!(sh_quote("/tmp/it's here"), r"'/tmp/it'\''s here'");
    }

    #[test]
    fn device_spool_keeps_the_remote_tilde_unquoted() {
        assert_eq!(
            remote_dir_word("~/.cortex/tmp/signals"),
            "~/.cortex/tmp/signals"
        );
        assert_eq!(remote_dir_word("~/my spool"), "~/'my spool'");
        assert_eq!(remote_dir_word("/data/sp ool"), "'/data/sp ool'");
    }
}
