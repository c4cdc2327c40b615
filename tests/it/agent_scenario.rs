//! What the agent-loop tests of every harness share (Claude Code and Codex in `agent_loop`,
//! Gemini CLI in `agent_loop_gemini`, OpenCode in `agent_loop_opencode`): the scripted agent
//! ([`play`]), what it armed read back ([`armed`]), the job's report, the inbox and waiter
//! checks, and the scenarios that run alike in each harness, each harness saying through
//! [`AgentHarness`] how it runs a turn and names a session.

use std::fs;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{CORTEX_SIGNAL, Env, WAITPOINT, cpu_time};
use crate::model_server::{ModelServer, Reply, Request};

/// The bound on each wait here: a hang stops here; nothing is timed.
const LIMIT: Duration = Duration::from_secs(120);

/// What a hook hands an open session: the first line of `adapter::hook_text`.
pub(crate) const HOOK_HEADER: &str = "wake(s) for this session";

/// The scripted agent's turn, whatever the harness: what the user `said` decides it, and
/// `tool` names the MCP server `waitpoint`'s tools the harness's way.
pub(crate) fn play(r: &Request, said: &str, tool: &dyn Fn(&str) -> String) -> Reply {
    if r.tool_result().is_some() {
        return Reply::text("noted; ending my turn");
    }
    if said.contains("Waitpoint wp_") {
        return Reply::text("woken");
    }
    let word_after = |cue: &str| {
        said.split_once(cue)
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .map(str::to_owned)
    };
    if let Some(label) = word_after("arm ") {
        let intent = format!("the job {label}; when it lands, read its result");
        return Reply::tool(
            tool("wait_create"),
            json!({"label": label, "intent": intent}),
        );
    }
    if let Some(id) = word_after("cancel ") {
        return Reply::tool(tool("wait_cancel"), json!({"id": id}));
    }
    if said.contains("check") {
        return Reply::tool(tool("wait_check"), json!({}));
    }
    if said.trim().starts_with("turn ") {
        // A model that thinks a moment: the turn's end (and its hook) comes well after its
        // request, so the test can tell this turn's waiter from the previous one's.
        std::thread::sleep(Duration::from_millis(300));
    }
    Reply::text("ok")
}

/// The first JSON object in a tool result's text (the structured reply; a note follows it).
pub(crate) fn reply_json(text: &str) -> Value {
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in {text}"));
    serde_json::Deserializer::from_str(&text[start..])
        .into_iter::<Value>()
        .next()
        .unwrap()
        .unwrap()
}

/// A waitpoint the agent armed: its id, secret and the harness session that armed it.
pub(crate) struct Armed {
    pub id: String,
    pub secret: String,
    pub harness_session: String,
}

/// Waits for the result of a `wait_create` whose label is `label`.
pub(crate) fn armed(server: &ModelServer, label: &str) -> Armed {
    let (r, v) = armed_reply(server, label);
    armed_as(&v, r.session_id().expect("a session header"))
}

/// The request carrying the result of a `wait_create` whose label is `label`, and the reply.
pub(crate) fn armed_reply(server: &ModelServer, label: &str) -> (Request, Value) {
    let r = server.wait_for_request(
        |r| {
            r.tool_result()
                .is_some_and(|t| t.contains("\"secret\"") && t.contains(label))
        },
        LIMIT,
    );
    let v = reply_json(&r.tool_result().unwrap());
    (r, v)
}

/// The waitpoint a `wait_create` reply `v` armed, in `harness_session`.
pub(crate) fn armed_as(v: &Value, harness_session: &str) -> Armed {
    Armed {
        id: v["id"].as_str().unwrap().to_owned(),
        secret: v["secret"].as_str().unwrap().to_owned(),
        harness_session: harness_session.to_owned(),
    }
}

/// The job's signal line, run as a job runs it: the secret in the environment, never in argv.
pub(crate) fn job_reports(env: &Env, a: &Armed) {
    let out = env
        .command(CORTEX_SIGNAL)
        .env("CORTEX_SIGNAL_ID", &a.id)
        .env("CORTEX_SIGNAL_SECRET", &a.secret)
        .args(["--exit-code", "0", "--message", "exit=0"])
        .output()
        .unwrap();
    env.ok("cortex-signal", &out);
}

/// `waitpoint setup ARGS` as a new user runs it, in the project.
pub(crate) fn setup(env: &Env, project: &Path, args: &[&str]) -> String {
    let out = env
        .command(WAITPOINT)
        .arg("setup")
        .args(args)
        .current_dir(project)
        .output()
        .unwrap();
    env.ok("waitpoint setup", &out)
}

/// The wake files of a session's inbox folder (`new` or `cur`) for waitpoint `id`.
pub(crate) fn wakes_of(env: &Env, session: &str, folder: &str, id: &str) -> usize {
    env.inbox(session, folder)
        .iter()
        .filter(|w| w["waitpoint_id"] == id || w["text"].as_str().is_some_and(|t| t.contains(id)))
        .count()
}

/// Waits until `a`'s wake is read in `session`'s inbox, and checks it is read once: in `cur/`
/// exactly once, no longer in `new/`.
pub(crate) fn read_once(env: &Env, session: &str, a: &Armed) {
    env.wait_until("the wake read once", || {
        wakes_of(env, session, "cur", &a.id) == 1
    });
    assert_eq!(wakes_of(env, session, "new", &a.id), 0);
}

/// The model turns (requests offering the agent's tools) whose newest user message holds
/// `needle`.
pub(crate) fn turns_saying(server: &ModelServer, needle: &str) -> Vec<Request> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.offers_tool("mcp__waitpoint__wait_create"))
        .filter(|r| r.last_user_text().contains(needle))
        .collect()
}

/// Waits for the model turn of harness session `session` that carries `a`'s wake.
pub(crate) fn woken_in(server: &ModelServer, session: &str, a: &Armed) -> Request {
    let wake = format!("Waitpoint {}", a.id);
    server.wait_for_request(
        |r| r.session_id() == Some(session) && r.last_user_text().contains(&wake),
        LIMIT,
    )
}

/// The live processes of this home running `adapter` (`adapter claude-hook`, ...).
pub(crate) fn waiters_of(env: &Env, adapter: &str) -> Vec<u32> {
    let home = env.home.display().to_string();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let stat = fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.starts_with(" Z"));
        // The waiter itself, not the `sh -c` Claude Code runs it under.
        let ours = stat.contains("(waitpoint)");
        // Hooks name the home in their command line, the daemon's `onWake` runs in theirs.
        let environ = fs::read(entry.path().join("environ")).unwrap_or_default();
        let in_home = cmdline.contains(&home)
            || String::from_utf8_lossy(&environ)
                .split('\0')
                .any(|v| v == format!("WAITPOINT_HOME={home}"));
        if ours && cmdline.contains(adapter) && in_home && !zombie {
            found.push(pid);
        }
    }
    found
}

/// Clock ticks since boot, the unit of a process's start time.
fn boot_ticks() -> u64 {
    let uptime: f64 = fs::read_to_string("/proc/uptime")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    (uptime * rustix::param::clock_ticks_per_second() as f64) as u64
}

/// When process `pid` started, in clock ticks since boot (`u64::MAX` when it is gone).
fn started_ticks(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_owned();
            rest.split_whitespace().nth(19)?.parse().ok()
        })
        .unwrap_or(u64::MAX)
}

/// Ten turns (`turn(n)` sends turn `n` and returns once the model has it): after each, the
/// session's one waiter (of `waiters`) is the one its end started and the one `waiter.json`
/// names. Then ten seconds of that idle waiter cost under 50 ms of CPU.
pub(crate) fn ten_turns_then_one_idle_waiter(
    env: &Env,
    session: &str,
    waiters: &dyn Fn(&Env) -> Vec<u32>,
    mut turn: impl FnMut(u32),
) {
    let record = env.home.join("sessions").join(session).join("waiter.json");
    let recorded = || {
        fs::read_to_string(&record)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["pid"].as_u64())
            .map(|p| p as u32)
    };
    let mut one = Vec::new();
    for n in 1..=10 {
        turn(n);
        let asked = boot_ticks();
        env.wait_until("the turn's own waiter, alone", || {
            one = waiters(env);
            matches!(one.as_slice(), [p] if started_ticks(*p) > asked && recorded() == Some(*p))
        });
    }
    idle_waiter_spends_almost_nothing(one[0]);
}

/// Ten seconds of the idle waiter `pid` cost under 50 ms of CPU.
pub(crate) fn idle_waiter_spends_almost_nothing(pid: u32) {
    let before = cpu_time(pid);
    // The measurement: ten seconds of an idle waiter.
    std::thread::sleep(Duration::from_secs(10));
    let used = cpu_time(pid) - before;
    assert!(
        used < Duration::from_millis(50),
        "an idle waiter used {used:?} in 10 s"
    );
}

/// How a harness runs the shared scenarios: a headless turn, and how its requests and inboxes
/// name a session.
pub(crate) trait AgentHarness {
    /// The harness's name in a waitpoint session: `claude` in `claude-<session id>`.
    fn name(&self) -> &'static str;
    /// The harness's name in the session's `harness.json` (what the daemon resumes).
    fn recorded_name(&self) -> &'static str {
        self.name()
    }
    /// How a headless run is told the session to go on in: `--resume`, `resume`, `--session`.
    fn resume_flag(&self) -> &'static str;
    /// Runs the harness headless with `args`, saying `prompt`; what it printed is not judged
    /// here (the model's requests are).
    fn run_headless(&self, prompt: &str, args: &[&str]);
    /// One turn saying `prompt`, in a new session or in harness session `session`.
    fn turn(&self, prompt: &str, session: Option<&str>) {
        match session {
            Some(s) => self.run_headless(prompt, &[self.resume_flag(), s]),
            None => self.run_headless(prompt, &[]),
        }
    }
    /// The waitpoint `label` the agent armed; by default the harness session is the one
    /// the request that carried the reply names.
    fn armed(&self, server: &ModelServer, label: &str) -> Armed {
        armed(server, label)
    }
    /// The waitpoint session (its inbox's name) of a harness session.
    fn channel(&self, harness_session: &str) -> String {
        format!("{}-{harness_session}", self.name())
    }
    /// Whether `r` is a turn of the conversation that armed `a`.
    fn in_conversation(&self, r: &Request, a: &Armed) -> bool {
        r.session_id() == Some(a.harness_session.as_str())
    }
    /// What the user said last in `r`.
    fn said(&self, r: &Request) -> String {
        r.last_user_text()
    }
    /// Whether `r` is one of the agent's turns (it offers the waitpoint tools), not a request
    /// the harness makes on the side (a title for the conversation, say).
    fn is_agent_turn(&self, r: &Request) -> bool {
        r.offers_tool("mcp__waitpoint__wait_create")
    }
}

/// After `a` was armed in a headless turn of `harness` in `project`, now closed, and with a
/// daemon started elsewhere: the session's harness and project were recorded when it armed,
/// the job's wake reaches the model as a resume's prompt in `a`'s conversation (not as a
/// hook's text), in exactly one turn, and is read once.
pub(crate) fn a_closed_session_is_resumed_once(
    env: &Env,
    server: &ModelServer,
    harness: &dyn AgentHarness,
    project: &Path,
    a: &Armed,
) {
    let session = harness.channel(&a.harness_session);
    let record = env
        .home
        .join("sessions")
        .join(&session)
        .join("harness.json");
    let seen: Value = serde_json::from_str(&fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(
        (seen["harness"].as_str(), seen["project_dir"].as_str()),
        (Some(harness.recorded_name()), project.to_str()),
        "{seen}"
    );
    job_reports(env, a);
    let wake = format!("Waitpoint {}", a.id);
    let resumed = server.wait_for_request(
        |r| harness.in_conversation(r, a) && harness.said(r).contains(&wake),
        LIMIT,
    );
    assert!(!harness.said(&resumed).contains(HOOK_HEADER));
    read_once(env, &session, a);
    let turns = server
        .requests()
        .into_iter()
        .filter(|r| harness.is_agent_turn(r) && harness.said(r).contains(&wake))
        .count();
    assert_eq!(turns, 1, "{}", server.summary());
}

/// Two sessions of one project, each armed in a turn of its own: B lists only its own
/// waitpoint and may not cancel A's; A's wake reaches A's conversation, never B's, and is
/// read once.
pub(crate) fn two_sessions_each_see_and_get_only_their_own(
    env: &Env,
    server: &ModelServer,
    harness: &dyn AgentHarness,
) {
    harness.turn("arm iso-a", None);
    let a = harness.armed(server, "iso-a");
    harness.turn("arm iso-b", None);
    let b = harness.armed(server, "iso-b");
    assert_ne!(a.harness_session, b.harness_session);
    let in_b = Some(b.harness_session.as_str());
    harness.turn("check what I wait on", in_b);
    let listed = server.wait_for_request(
        |r| r.tool_result().is_some_and(|t| t.contains("\"waiting\"")),
        LIMIT,
    );
    let listed = listed.tool_result().unwrap();
    assert!(
        listed.contains(&b.id) && !listed.contains(&a.id),
        "{listed}"
    );
    harness.turn(&format!("cancel {}", a.id), in_b);
    server.wait_for_request(
        |r| {
            r.tool_result()
                .is_some_and(|t| t.contains("not this session's"))
        },
        LIMIT,
    );
    assert_eq!(env.state(&a.id)["status"], "armed");

    job_reports(env, &a);
    let wake = format!("Waitpoint {}", a.id);
    server.wait_for_request(
        |r| harness.in_conversation(r, &a) && harness.said(r).contains(&wake),
        LIMIT,
    );
    let wrong = server
        .requests()
        .into_iter()
        .filter(|r| harness.in_conversation(r, &b))
        .any(|r| harness.said(&r).contains(&wake));
    assert!(!wrong, "B was woken with A's wake:\n{}", server.summary());
    read_once(env, &harness.channel(&a.harness_session), &a);
}
