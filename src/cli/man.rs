//! Manual pages generated from the clap definitions, so options cannot drift from the code:
//! `waitpoint(1)` (every command), `cortex-signal(1)` and `waitpoint-daemon(8)`. The
//! hand-written sections (ENVIRONMENT, FILES, EXIT STATUS, EXAMPLES, SEE ALSO) live here too;
//! EXIT STATUS is built from the exit-code table in `error.rs`.
//!
//! The committed pages under `man/` must equal [`pages`]; `scripts/gen-man` rewrites them.
//! `waitpoint(5)` is hand-written and not generated.

use clap_mangen::Man;
use clap_mangen::roff::{Inline, Roff, bold, italic, roman};

use crate::error::exit;

/// One generated page: its file name under `man/` and its roff source.
#[derive(Debug, Clone)]
pub struct Page {
    pub file: &'static str,
    pub text: String,
}

/// The date on the pages' title lines. Bump it when a page changes in substance.
pub const DATE: &str = "2026-12-01";
const SOURCE: &str = concat!("waitpoint ", env!("CARGO_PKG_VERSION"));

/// The exit status of `waitpoint`, code by code; the same table as `error::exit`.
pub const WAITPOINT_EXIT: &[(u8, &str)] = &[
    (
        exit::OK,
        "Success. For wait, the waitpoint resolved ok. For doctor, no check failed.",
    ),
    (
        exit::FAILURE,
        "A runtime failure: I/O, corrupt state, a daemon already holding the home, or a request \
that conflicts with the current state (such as cancelling a resolved waitpoint). For doctor, \
at least one check failed.",
    ),
    (
        exit::USAGE,
        "A usage error: bad flags or values, a missing id or secret, or a malformed settings file.",
    ),
    (
        exit::NOT_FOUND,
        "No such waitpoint, or not one this session may see.",
    ),
    (
        exit::RESOLVED_FAIL,
        "wait: the waitpoint resolved with a failure.",
    ),
    (exit::EXPIRED, "wait: the waitpoint reached its deadline."),
    (exit::CANCELLED, "wait: the waitpoint was cancelled."),
    (exit::TIMED_OUT, "wait and next: --timeout elapsed first."),
    (
        exit::UNAVAILABLE,
        "On an etcd store: this host's daemon no longer leads the cluster (its leadership lease \
is gone), so nothing was written. Try again after the lease's time (leaseTtlS, 5 s by default), \
when another daemon leads.",
    ),
];

/// The exit status of `cortex-signal`, as the spec gives it.
pub const CORTEX_SIGNAL_EXIT: &[(u8, &str)] = &[
    (
        exit::OK,
        "The signal was accepted, the waitpoint had already resolved, or the signal was spooled \
for the daemon to collect.",
    ),
    (
        exit::FAILURE,
        "The signal was refused, or the daemon could not be reached and --no-spool forbade the \
spool (or the spool could not be written).",
    ),
    (exit::USAGE, "A usage error, or a missing id or secret."),
];

/// Every generated page.
pub fn pages() -> Vec<Page> {
    vec![waitpoint_1(), cortex_signal_1(), waitpoint_daemon_8()]
}

/// The `waitpoint` command as the pages and completions see it: named, with its subcommands'
/// names and globals resolved.
pub fn waitpoint_command() -> clap::Command {
    let mut cmd = super::waitpoint_command()
        .bin_name("waitpoint")
        .subcommand_value_name("COMMAND")
        .subcommand_help_heading("COMMANDS")
        .disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The `cortex-signal` command, built.
pub fn cortex_signal_command() -> clap::Command {
    let mut cmd = super::cortex_signal_command().bin_name("cortex-signal");
    cmd.build();
    cmd
}

/// Renders one section with clap_mangen, without roff's per-document preamble (the page
/// carries it once).
fn chunk(render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut buf = Vec::new();
    render(&mut buf).expect("rendering into memory cannot fail");
    let text = String::from_utf8(buf).expect("roff output is UTF-8");
    text.strip_prefix(&preamble()).unwrap_or(&text).to_owned()
}

fn preamble() -> String {
    Roff::new().render()
}

/// A chunk with its leading `.SH` line removed, for reuse under another heading.
fn body_of(section: String) -> String {
    match section.split_once('\n') {
        Some((first, rest)) if first.starts_with(".SH") => rest.to_owned(),
        _ => section,
    }
}

fn hide(mut cmd: clap::Command, ids: &[&str]) -> clap::Command {
    for id in ids {
        if cmd.get_arguments().any(|a| a.get_id() == *id) {
            cmd = cmd.mut_arg(*id, |a| a.hide(true));
        }
    }
    cmd
}

fn man(cmd: clap::Command, title: &str, section: &str, manual: &str) -> Man {
    Man::new(cmd)
        .title(title)
        .section(section)
        .date(DATE)
        .source(SOURCE)
        .manual(manual)
}

fn head(page: &Man) -> String {
    let mut s = preamble();
    s += &chunk(|w| page.render_title(w));
    s += &chunk(|w| page.render_name_section(w));
    s
}

fn waitpoint_1() -> Page {
    let cmd = waitpoint_command();
    let page = man(cmd.clone(), "WAITPOINT", "1", "User Commands");
    // In the per-command sections, the options every command shares are documented once, at
    // the top.
    let subs: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| hide(s.clone(), &["home", "help", "version"]))
        .collect();
    let mut s = head(&page);
    s += &chunk(|w| page.render_synopsis_section(w));
    for sub in &subs {
        s += ".br\n";
        s += &body_of(chunk(|w| Man::new(sub.clone()).render_synopsis_section(w)));
    }
    s += &chunk(|w| page.render_description_section(w));
    s += &chunk(|w| page.render_options_section(w));
    s += ".SH COMMANDS\n";
    for sub in &subs {
        let name = format!("waitpoint {}", sub.get_name());
        let mut r = Roff::new();
        r.control("SS", [name.as_str()]);
        s += &chunk(|w| r.to_writer(w));
        let sub_page = Man::new(sub.clone());
        s += &body_of(chunk(|w| sub_page.render_description_section(w)));
        if sub.get_arguments().any(|a| !a.is_hide_set()) {
            s += &body_of(chunk(|w| sub_page.render_options_section(w)));
        }
    }
    s += &waitpoint_1_sections().render_body();
    Page {
        file: "waitpoint.1",
        text: ascii(&s),
    }
}

fn cortex_signal_1() -> Page {
    let cmd = cortex_signal_command();
    let page = man(cmd, "CORTEX-SIGNAL", "1", "User Commands");
    let mut s = head(&page);
    s += &chunk(|w| page.render_synopsis_section(w));
    s += &chunk(|w| page.render_description_section(w));
    s += &chunk(|w| page.render_options_section(w));
    s += &cortex_signal_1_sections().render_body();
    Page {
        file: "cortex-signal.1",
        text: ascii(&s),
    }
}

fn waitpoint_daemon_8() -> Page {
    let cmd = waitpoint_command();
    let daemon = cmd
        .find_subcommand("daemon")
        .expect("waitpoint has a daemon command")
        .clone();
    let daemon = hide(daemon, &["help", "version"]);
    let page = man(daemon, "WAITPOINT-DAEMON", "8", "System Administration");
    let mut s = head(&page);
    s += &chunk(|w| page.render_synopsis_section(w));
    s += &chunk(|w| page.render_description_section(w));
    s += &chunk(|w| page.render_options_section(w));
    s += &waitpoint_daemon_8_sections().render_body();
    Page {
        file: "waitpoint-daemon.8",
        text: ascii(&s),
    }
}

/// Spells every non-ASCII character as a groff escape (`…` becomes `\[u2026]`), so the pages
/// render the same whatever encoding `man` assumes.
fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\[u{:04X}]", c as u32));
        }
    }
    out
}

/// Hand-written sections, built with roff's escaping so text cannot turn into requests.
#[derive(Default)]
struct Doc(Roff);

impl Doc {
    fn section(&mut self, name: &str) -> &mut Self {
        self.0.control("SH", [name]);
        self
    }

    fn para(&mut self, text: &str) -> &mut Self {
        self.0.control("PP", []);
        self.0.text([roman(text)]);
        self
    }

    fn item(&mut self, term: Vec<Inline>, body: &str) -> &mut Self {
        self.0.control("TP", []);
        self.0.text(term);
        self.0.text([roman(body)]);
        self
    }

    fn var(&mut self, name: &str, body: &str) -> &mut Self {
        self.item(vec![bold(name)], body)
    }

    fn file(&mut self, path: &str, body: &str) -> &mut Self {
        self.item(vec![italic(path)], body)
    }

    fn example(&mut self, what: &str, code: &str) -> &mut Self {
        self.para(what);
        self.0.control("PP", []);
        self.0.control("RS", ["4"]);
        self.0.control("nf", []);
        for line in code.lines() {
            self.0.text([roman(line)]);
        }
        self.0.control("fi", []);
        self.0.control("RE", []);
        self
    }

    fn exit_table(&mut self, table: &[(u8, &str)]) -> &mut Self {
        for (code, text) in table {
            self.item(vec![bold(code.to_string())], text);
        }
        self
    }

    fn see_also(&mut self, pages: &[(&str, &str)]) -> &mut Self {
        self.section("SEE ALSO");
        let mut line = Vec::new();
        for (i, (name, section)) in pages.iter().enumerate() {
            line.push(bold(*name));
            let sep = if i + 1 < pages.len() { ", " } else { "" };
            line.push(roman(format!("({section}){sep}")));
        }
        self.0.text(line);
        self
    }

    fn render_body(&self) -> String {
        let text = self.0.render();
        text.strip_prefix(&preamble()).unwrap_or(&text).to_owned()
    }
}

fn common_home_env(d: &mut Doc) {
    d.var(
        "CORTEX_HOME",
        "The home directory holding all state; --home wins over it. Default ~/.cortex.",
    );
    d.var("HOME", "Where the default home ~/.cortex is.");
}

fn settings_env(d: &mut Doc) {
    d.var(
        "CORTEX_WAITPOINT_TTL_MS",
        "Default lifetime of a waitpoint, when settings.json has no waitpointTtlMs.",
    );
    d.var(
        "CORTEX_WAITPOINT_SWEEP_MS",
        "Sweep and collection interval, when settings.json has no waitpointSweepMs.",
    );
    d.var(
        "CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR",
        "Wake cap per waitpoint per sliding hour, when settings.json has no \
waitpointMaxWakesPerHour. An agent's timers and callbacks together may wake it five times \
this often (60 an hour by default): over that, a timer's fire waits until the hour has room \
and a callback is refused with HTTP 429 and its retry_after_s (a spool file stays for a later \
pass).",
    );
}

fn home_files(d: &mut Doc) {
    d.file(
        "$CORTEX_HOME/settings.json",
        "Optional settings; see waitpoint(5).",
    );
    d.file(
        "$CORTEX_HOME/daemon.lock",
        "Held by the running daemon, with its pid inside; emptied on a clean stop.",
    );
    d.file("$CORTEX_HOME/log/daemon.log", "The daemon's log.");
    d.file(
        "$CORTEX_HOME/tmp/signals/",
        "The drop zone, where jobs and cortex-signal leave signal files; refused files are \
parked in bad/ with a .reason file. A signal file's name is at most 128 ASCII letters, digits \
and ._-@+=,:~, not starting with '.', ending in .json; another name is parked unread (the name \
is shown in the wake), and so is a file over 64 KB. bad/ keeps at most the first 64 KB of a file \
parked unread, with anything secret-like redacted.",
    );
}

fn waitpoint_1_sections() -> Doc {
    let mut d = Doc::default();
    d.section("ENVIRONMENT");
    common_home_env(&mut d);
    d.var(
        "CORTEX_SESSION",
        "The session acting, for create, check, cancel, next, mcp and the adapters. Default: \
the harness's own session when a harness started the command (see below), else \"default\". \
A session name is 1-128 letters, digits, '.', '_', '-' or '@', and does not start with '-' (it \
may reach a harness's command line).",
    );
    d.var(
        "CLAUDE_CODE_SESSION_ID, CLAUDE_PROJECT_DIR",
        "Set by Claude Code for the MCP servers and hooks it starts: the session is then \
claude-<id>, and mcp and the hooks remember the id and the project directory in \
sessions/<session>/harness.json for adapter resume. A Codex thread names itself in each MCP \
call instead (codex-<thread>).",
    );
    d.var(
        "CLAUDE_CODE_ENTRYPOINT",
        "Set by Claude Code; when it names an SDK run (sdk-cli: claude -p), adapter claude-hook \
returns at once, since Claude Code then runs asynchronous hooks synchronously.",
    );
    d.var(
        "WAITPOINT_WAKE_ID, WAITPOINT_CHANNEL",
        "Given by the daemon to an onWake command: the defaults of ack.",
    );
    d.var(
        "WAITPOINT_RESUMING",
        "Set by adapter resume in the resumed harness's environment; the harness's own hooks \
then take no wake.",
    );
    d.var(
        "CORTEX_SIGNAL_ID, CORTEX_SIGNAL_SECRET, CORTEX_SIGNAL_MEMBER",
        "The waitpoint run and attach signal, as for cortex-signal(1).",
    );
    settings_env(&mut d);
    d.var(
        "WEBHOOK_PORT",
        "The port written into the curl line create prints. Default 3001.",
    );
    d.var(
        "RUST_LOG",
        "Log filter (e.g. debug); commands log warnings and the daemon info by default.",
    );
    d.section("FILES");
    home_files(&mut d);
    d.file(
        "$CORTEX_HOME/waitpoints/<id>/",
        "A waitpoint's state (waitpoint.json) and its accepted signals (signals/).",
    );
    d.file(
        "$CORTEX_HOME/sessions/<channel>/wakes/new/",
        "Wakes not yet read; next moves each to cur/ as it prints it.",
    );
    d.file(
        "$CORTEX_HOME/sessions/<session>/harness.json",
        "The harness session the session was last seen in (harness, session_id, project_dir), \
for adapter resume.",
    );
    d.file(
        "$CORTEX_HOME/sessions/<session>/waiter.json, waiter.lock",
        "The session's live waiter (a hook handing wakes to an open harness session): its pid, \
and a lock it holds while it lives, which adapter resume yields to.",
    );
    d.section("EXIT STATUS");
    d.exit_table(WAITPOINT_EXIT);
    d.para(
        "run exits with the command's own status: 128+N when signal N killed it, 127 when it \
cannot be found and 126 when it cannot be run; 2 when the id or secret is missing or malformed \
(the command is then not run).",
    );
    d.para(
        "adapter claude-hook exits 2 when it hands wakes to Claude Code (the status an \
asyncRewake hook wakes the session on) and 0 when its timeout passed with none; adapter \
resume, claude-resume and codex-resume exit 1 when the harness failed (or a live waiter did not \
take the wake in time), leaving the wake unread for the daemon to retry. ack exits 3 when the \
session has no such wake.",
    );
    d.section("EXAMPLES");
    d.example(
        "Arm a waitpoint, then run the job so that it signals with its exit code and log tail:",
        "eval \"$(waitpoint create --label build --intent 'the release build; when it lands, \
publish it' --print env)\"\nwaitpoint run -- make -j8 release",
    );
    d.example(
        "Be told when a process that is already running ends:",
        "waitpoint attach --pid 12345 &",
    );
    d.example(
        "Block until it resolves, at most an hour, and act on the outcome:",
        "waitpoint wait wp_1a2b3c4d5e6f --timeout 3600; echo \"exit $?\"",
    );
    d.example(
        "Print wakes as they arrive, one JSON object per line:",
        "waitpoint next --follow --json | jq -r .summary",
    );
    d.example(
        "Give Claude Code the agent tools, acting for session nightly:",
        "claude mcp add waitpoint -e CORTEX_SESSION=nightly -- waitpoint mcp",
    );
    d.example(
        "Check the installation; install bash completions:",
        "waitpoint doctor\nwaitpoint completions bash > ~/.local/share/bash-completion/completions/waitpoint",
    );
    d.see_also(&[
        ("cortex-signal", "1"),
        ("waitpoint-daemon", "8"),
        ("waitpoint", "5"),
    ]);
    d
}

fn cortex_signal_1_sections() -> Doc {
    let mut d = Doc::default();
    d.section("ENVIRONMENT");
    d.var("CORTEX_SIGNAL_ID", "Default for --id.");
    d.var("CORTEX_SIGNAL_SECRET", "Default for --secret.");
    d.var("CORTEX_SIGNAL_MEMBER", "Default for --member.");
    common_home_env(&mut d);
    d.var(
        "WEBHOOK_PORT",
        "The port of the default --url (default 3001). cortex-signal posts there only while this \
home's daemon has published that address (webhook.json, with the daemon holding daemon.lock); \
otherwise it writes to the spool, so the secret never reaches another program on the port.",
    );
    d.section("FILES");
    d.file(
        "$CORTEX_HOME/tmp/signals/",
        "The spool: each signal is written as a fresh *.tmp file and renamed to *.json, which \
the daemon collects.",
    );
    d.section("EXIT STATUS");
    d.exit_table(CORTEX_SIGNAL_EXIT);
    d.section("EXAMPLES");
    d.example(
        "Report a job's result with its exit code:",
        "export CORTEX_SIGNAL_ID=wp_1a2b3c4d5e6f CORTEX_SIGNAL_SECRET=...\npython train.py; \
cortex-signal --exit-code $?",
    );
    d.example(
        "Attach the end of the log, from a file or from standard input:",
        "cortex-signal --exit-code $? --data @train.log.tail\ntail -c 8000 train.log | \
cortex-signal --exit-code $? --data -",
    );
    d.example(
        "A heartbeat that is recorded without waking anyone:",
        "while :; do sleep 1800; cortex-signal --status progress --message \"$(tail -1 \
train.log)\"; done &",
    );
    d.example(
        "One member of a barrier:",
        "cortex-signal --member arm2 --exit-code $?",
    );
    d.see_also(&[
        ("waitpoint", "1"),
        ("waitpoint-daemon", "8"),
        ("waitpoint", "5"),
    ]);
    d
}

fn waitpoint_daemon_8_sections() -> Doc {
    let mut d = Doc::default();
    d.section("SIGNALS");
    d.var(
        "SIGTERM, SIGINT",
        "Stop cleanly: the file or event in hand is finished, files not yet collected stay in \
the spool for the next start, the lock is released and emptied, and the exit status is 0.",
    );
    d.var(
        "SIGHUP",
        "Re-read settings.json and the environment. A malformed file is logged and the current \
settings are kept.",
    );
    d.section("ENVIRONMENT");
    common_home_env(&mut d);
    settings_env(&mut d);
    d.var(
        "CORTEX_WEBHOOK_TOKEN",
        "The operator token (at least 16 characters). With --http, it turns on the control \
routes (POST /api/control/agents/:agent_id/reset-callback, POST /api/control/agents/:id/timers, \
GET /api/agents/:id/timers, GET /api/agents/:id/timers/:timer_id, \
POST /api/control/agents/:id/timers/:timer_id/cancel), which then need \
Authorization: Bearer <token> and answer 401 without it; unset, they answer 404. The daemon keeps \
only its SHA-256, compares it in constant time, and removes it from the environment of every \
onWake hook. The signal route never accepts it: a waitpoint's secret is the only credential \
there.",
    );
    d.var(
        "RUST_LOG",
        "Log filter; default info. Every line about a waitpoint carries its id in the \
waitpoint field.",
    );
    d.section("FILES");
    home_files(&mut d);
    d.file(
        "scripts/waitpoint.service",
        "A systemd user unit that runs the daemon with Restart=on-failure.",
    );
    d.section("EXIT STATUS");
    d.exit_table(&[
        (
            exit::OK,
            "Stopped on request (SIGTERM, SIGINT or the control handle).",
        ),
        (
            exit::FAILURE,
            "Could not start: another daemon holds the home's lock, the file watcher could not \
be set up, or the home could not be created.",
        ),
        (exit::USAGE, "A usage error or a malformed settings file."),
    ]);
    d.section("EXAMPLES");
    d.example(
        "Run it in the foreground with machine-readable logs:",
        "waitpoint daemon --log-format json 2>&1 | jq -c 'select(.fields.waitpoint)'",
    );
    d.example(
        "Run it as a systemd user service:",
        "install -Dm644 scripts/waitpoint.service ~/.config/systemd/user/waitpoint.service\n\
systemctl --user daemon-reload\nsystemctl --user enable --now waitpoint\njournalctl --user -u \
waitpoint -f",
    );
    d.example(
        "Apply an edited settings.json without a restart:",
        "systemctl --user reload waitpoint    # or: kill -HUP \"$(cat ~/.cortex/daemon.lock)\"",
    );
    d.see_also(&[
        ("waitpoint", "1"),
        ("cortex-signal", "1"),
        ("waitpoint", "5"),
        ("systemd.service", "5"),
    ]);
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn each_arg(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let helped = arg
                .get_help()
                .or(arg.get_long_help())
                .is_some_and(|h| !h.to_string().trim().is_empty());
            if !helped {
                out.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_about().is_none() {
                out.push(format!("{path} {} (the command itself)", sub.get_name()));
            }
            each_arg(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_flag_and_command_has_help_text() {
        let mut missing = Vec::new();
        each_arg(&waitpoint_command(), "waitpoint", &mut missing);
        each_arg(&cortex_signal_command(), "cortex-signal", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    #[test]
    fn exit_status_documents_every_code_of_the_table() {
        for code in exit::ALL {
            assert!(
                WAITPOINT_EXIT.iter().any(|(c, _)| *c == code),
                "exit code {code} is not documented in waitpoint(1)"
            );
        }
        let page = waitpoint_1().text;
        let exit_status = page
            .split(".SH \"EXIT STATUS\"")
            .nth(1)
            .expect("an EXIT STATUS section");
        for code in exit::ALL {
            assert!(exit_status.contains(&format!("\\fB{code}\\fR")), "{code}");
        }
    }

    #[test]
    fn every_command_has_its_own_section_in_waitpoint_1() {
        let page = waitpoint_1().text;
        for sub in waitpoint_command().get_subcommands() {
            let heading = format!(".SS \"waitpoint {}\"", sub.get_name());
            assert!(page.contains(&heading), "missing {heading}");
        }
    }
}
