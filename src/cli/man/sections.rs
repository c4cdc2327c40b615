//! The hand-written sections of the generated pages, as data: each page's ENVIRONMENT, FILES,
//! EXIT STATUS, EXAMPLES and SEE ALSO (and the daemon's SIGNALS), in the order they are printed.
//! `man.rs` renders them after the parts it generates from clap. waitpoint(1)'s exit codes are
//! the library's table (`error::exit::TABLE`); the other pages say what the codes mean for
//! their programs.

use super::Block::{self, Example, Exit, ExitCodes, File, Include, Para, Section, SeeAlso, Var};
use crate::error::exit;

/// The exit status of `cortex-signal`, as the spec gives it.
pub(super) const CORTEX_SIGNAL_EXIT: &[(u8, &str)] = &[
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

/// The home's variables, which waitpoint's pages list (its --home wins over CORTEX_HOME).
pub(super) const HOME_ENV: &[Block] = &[
    Var(
        "CORTEX_HOME",
        "The home directory holding all state; --home wins over it. Default ~/.cortex.",
    ),
    Include(DEFAULT_HOME_ENV),
];

/// The home's variables as cortex-signal(1) lists them: it takes the spec's flags, and no
/// --home among them.
pub(super) const SIGNAL_HOME_ENV: &[Block] = &[
    Var(
        "CORTEX_HOME",
        "The home directory whose daemon and spool cortex-signal uses; it has no flag for \
it. Default ~/.cortex.",
    ),
    Include(DEFAULT_HOME_ENV),
];

const DEFAULT_HOME_ENV: &[Block] = &[Var("HOME", "Where the default home ~/.cortex is.")];

/// The variables settings.json falls back on.
pub(super) const SETTINGS_ENV: &[Block] = &[
    Var(
        "CORTEX_WAITPOINT_TTL_MS",
        "Default lifetime of a waitpoint, when settings.json has no waitpointTtlMs.",
    ),
    Var(
        "CORTEX_WAITPOINT_SWEEP_MS",
        "Sweep and collection interval, when settings.json has no waitpointSweepMs.",
    ),
    Var(
        "CORTEX_WAITPOINT_MAX_WAKES_PER_HOUR",
        "Wake cap per waitpoint per sliding hour, when settings.json has no \
waitpointMaxWakesPerHour. An agent's timers and callbacks together may wake it five times \
this often (60 an hour by default): over that, a timer's fire waits until the hour has room \
and a callback is refused with HTTP 429 and its retry_after_s (a spool file stays for a later \
pass).",
    ),
];

/// The home's files every page lists.
pub(super) const HOME_FILES: &[Block] = &[
    File(
        "$CORTEX_HOME/settings.json",
        "Optional settings; see waitpoint(5).",
    ),
    File(
        "$CORTEX_HOME/daemon.lock",
        "Held by the running daemon, with its pid inside; emptied on a clean stop.",
    ),
    File("$CORTEX_HOME/log/daemon.log", "The daemon's log."),
    File(
        "$CORTEX_HOME/tmp/signals/",
        "The drop zone, where jobs and cortex-signal leave signal files; refused files are \
parked in bad/ with a .reason file. A signal file's name is at most 128 ASCII letters, digits \
and ._-@+=,:~, not starting with '.', ending in .json; another name is parked unread (the name \
is shown in the wake), and so is a file over 64 KB. bad/ keeps at most the first 64 KB of a file \
parked unread, with anything secret-like redacted.",
    ),
];

/// waitpoint(1): ENVIRONMENT, FILES, EXIT STATUS, EXAMPLES, SEE ALSO.
pub(super) const WAITPOINT_1: &[Block] = &[
    Section("ENVIRONMENT"),
    Include(HOME_ENV),
    Var(
        "CORTEX_SESSION",
        "The session acting, for create, check, cancel, next, mcp and the adapters. Default: \
the harness's own session when a harness started the command (see below), else \"default\". \
A session name is 1-128 letters, digits, '.', '_', '-' or '@', and does not start with '-' (it \
may reach a harness's command line).",
    ),
    Var(
        "CLAUDE_CODE_SESSION_ID, CLAUDE_PROJECT_DIR",
        "Set by Claude Code for the MCP servers and hooks it starts: the session is then \
claude-<id>, and mcp and the hooks remember the id and the project directory in \
sessions/<session>/harness.json for adapter resume. A Codex thread names itself in each MCP \
call instead (codex-<thread>).",
    ),
    Var(
        "CLAUDE_CODE_ENTRYPOINT",
        "Set by Claude Code; when it names an SDK run (sdk-cli: claude -p), adapter claude-hook \
returns at once, since Claude Code then runs asynchronous hooks synchronously.",
    ),
    Var(
        "WAITPOINT_WAKE_ID, WAITPOINT_CHANNEL",
        "Given by the daemon to an onWake command: the defaults of ack.",
    ),
    Var(
        "WAITPOINT_RESUMING",
        "Set by adapter resume in the resumed harness's environment; the harness's own hooks \
then take no wake.",
    ),
    Var(
        "CORTEX_SIGNAL_ID, CORTEX_SIGNAL_SECRET, CORTEX_SIGNAL_MEMBER",
        "The waitpoint run and attach signal, as for cortex-signal(1).",
    ),
    Include(SETTINGS_ENV),
    Var(
        "WEBHOOK_PORT",
        "The port written into the curl line create prints. Default 3001.",
    ),
    Var(
        "RUST_LOG",
        "Log filter (e.g. debug); commands log warnings and the daemon info by default.",
    ),
    Section("FILES"),
    Include(HOME_FILES),
    File(
        "$CORTEX_HOME/waitpoints/<id>/",
        "A waitpoint's state (waitpoint.json) and its accepted signals (signals/).",
    ),
    File(
        "$CORTEX_HOME/sessions/<channel>/wakes/new/",
        "Wakes not yet read; next moves each to cur/ as it prints it.",
    ),
    File(
        "$CORTEX_HOME/sessions/<session>/harness.json",
        "The harness session the session was last seen in (harness, session_id, project_dir), \
for adapter resume.",
    ),
    File(
        "$CORTEX_HOME/sessions/<session>/waiter.json, waiter.lock",
        "The session's live waiter (a hook handing wakes to an open harness session): its pid, \
and a lock it holds while it lives, which adapter resume yields to.",
    ),
    File(
        "$CORTEX_HOME/ui-login.json",
        "The SHA-256 of the one-time login code ui printed, and when it expires; removed when \
the code is used.",
    ),
    Section("EXIT STATUS"),
    ExitCodes,
    Para(
        "run exits with the command's own status: 128+N when signal N killed it, 127 when it \
cannot be found and 126 when it cannot be run; 2 when the id or secret is missing or malformed \
(the command is then not run).",
    ),
    Para(
        "adapter claude-hook exits 2 when it hands wakes to Claude Code (the status an \
asyncRewake hook wakes the session on) and 0 when its timeout passed with none; adapter \
resume, claude-resume and codex-resume exit 1 when the harness failed (or a live waiter did not \
take the wake in time), leaving the wake unread for the daemon to retry. ack exits 3 when the \
session has no such wake.",
    ),
    Section("EXAMPLES"),
    Example(
        "Arm a waitpoint, then run the job so that it signals with its exit code and log tail:",
        "eval \"$(waitpoint create --label build --intent 'the release build; when it lands, \
publish it' --print env)\"\nwaitpoint run -- make -j8 release",
    ),
    Example(
        "Be told when a process that is already running ends:",
        "waitpoint attach --pid 12345 &",
    ),
    Example(
        "Block until it resolves, at most an hour, and act on the outcome:",
        "waitpoint wait wp_1a2b3c4d5e6f --timeout 3600; echo \"exit $?\"",
    ),
    Example(
        "Print wakes as they arrive, one JSON object per line:",
        "waitpoint next --follow --json | jq -r .summary",
    ),
    Example(
        "Give Claude Code the agent tools, acting for session nightly:",
        "claude mcp add waitpoint -e CORTEX_SESSION=nightly -- waitpoint mcp",
    ),
    Example(
        "Watch every session in a browser: the daemon with its HTTP shim, then a one-time \
login address for the operator page:",
        "waitpoint daemon --http &\nwaitpoint ui",
    ),
    Example(
        "Check the installation; install bash completions:",
        "waitpoint doctor\nwaitpoint completions bash > \
         ~/.local/share/bash-completion/completions/waitpoint",
    ),
    SeeAlso(&[
        ("cortex-signal", "1"),
        ("waitpoint-daemon", "8"),
        ("waitpoint", "5"),
    ]),
];

/// cortex-signal(1): ENVIRONMENT, FILES, EXIT STATUS, EXAMPLES, SEE ALSO.
pub(super) const CORTEX_SIGNAL_1: &[Block] = &[
    Section("ENVIRONMENT"),
    Var("CORTEX_SIGNAL_ID", "Default for --id."),
    Var("CORTEX_SIGNAL_SECRET", "Default for --secret."),
    Var("CORTEX_SIGNAL_MEMBER", "Default for --member."),
    Include(SIGNAL_HOME_ENV),
    Var(
        "WEBHOOK_PORT",
        "The port of the default --url (default 3001). cortex-signal posts there only while this \
home's daemon has published that address (webhook.json, with the daemon holding daemon.lock); \
otherwise it writes to the spool, so the secret never reaches another program on the port.",
    ),
    Section("FILES"),
    File(
        "$CORTEX_HOME/tmp/signals/",
        "The spool: each signal is written as a fresh *.tmp file and renamed to *.json, which \
the daemon collects.",
    ),
    Section("EXIT STATUS"),
    Exit(CORTEX_SIGNAL_EXIT),
    Section("EXAMPLES"),
    Example(
        "Report a job's result with its exit code:",
        "export CORTEX_SIGNAL_ID=wp_1a2b3c4d5e6f CORTEX_SIGNAL_SECRET=...\npython train.py; \
cortex-signal --exit-code $?",
    ),
    Example(
        "Attach the end of the log, from a file or from standard input:",
        "cortex-signal --exit-code $? --data @train.log.tail\ntail -c 8000 train.log | \
cortex-signal --exit-code $? --data -",
    ),
    Example(
        "A heartbeat that is recorded without waking anyone:",
        "while :; do sleep 1800; cortex-signal --status progress --message \"$(tail -1 \
train.log)\"; done &",
    ),
    Example(
        "One member of a barrier:",
        "cortex-signal --member arm2 --exit-code $?",
    ),
    SeeAlso(&[
        ("waitpoint", "1"),
        ("waitpoint-daemon", "8"),
        ("waitpoint", "5"),
    ]),
];

/// waitpoint-daemon(8): SIGNALS, ENVIRONMENT, FILES, EXIT STATUS, EXAMPLES, SEE ALSO.
pub(super) const WAITPOINT_DAEMON_8: &[Block] = &[
    Section("SIGNALS"),
    Var(
        "SIGTERM, SIGINT",
        "Stop cleanly: the file or event in hand is finished, files not yet collected stay in \
the spool for the next start, the lock is released and emptied, and the exit status is 0.",
    ),
    Var(
        "SIGHUP",
        "Re-read settings.json and the environment. A malformed file is logged and the current \
settings are kept.",
    ),
    Section("ENVIRONMENT"),
    Include(HOME_ENV),
    Include(SETTINGS_ENV),
    Var(
        "CORTEX_WEBHOOK_TOKEN",
        "The operator token (at least 16 characters). With --http, it turns on the control \
routes (POST /api/control/agents/:agent_id/reset-callback, POST /api/control/agents/:id/timers, \
GET /api/agents/:id/timers, GET /api/agents/:id/timers/:timer_id, \
POST /api/control/agents/:id/timers/:timer_id/cancel), which then need \
Authorization: Bearer <token> and answer 401 without it; unset, they answer 404. The daemon keeps \
only its SHA-256, compares it in constant time, and removes it from the environment of every \
onWake hook. The signal route never accepts it: a waitpoint's secret is the only credential \
there.",
    ),
    Var(
        "RUST_LOG",
        "Log filter; default info. Every line about a waitpoint carries its id in the \
waitpoint field.",
    ),
    Section("FILES"),
    Include(HOME_FILES),
    File(
        "scripts/waitpoint.service",
        "A systemd user unit that runs the daemon with Restart=on-failure.",
    ),
    Section("EXIT STATUS"),
    Exit(&[
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
    ]),
    Section("EXAMPLES"),
    Example(
        "Run it in the foreground with machine-readable logs:",
        "waitpoint daemon --log-format json 2>&1 | jq -c 'select(.fields.waitpoint)'",
    ),
    Example(
        "Run it as a systemd user service:",
        "install -Dm644 scripts/waitpoint.service ~/.config/systemd/user/waitpoint.service\n\
systemctl --user daemon-reload\nsystemctl --user enable --now waitpoint\njournalctl --user -u \
waitpoint -f",
    ),
    Example(
        "Apply an edited settings.json without a restart:",
        "systemctl --user reload waitpoint    # or: kill -HUP \"$(cat ~/.cortex/daemon.lock)\"",
    ),
    SeeAlso(&[
        ("waitpoint", "1"),
        ("cortex-signal", "1"),
        ("waitpoint", "5"),
        ("systemd.service", "5"),
    ]),
];
