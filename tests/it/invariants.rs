//! The promises every crash test checks after the dust settles, and the simple model of the
//! spec they are checked against. Written from the spec, independently of `engine::rules`, so a
//! bug in the rules cannot hide itself.
//!
//! After a run: every signal file dropped is still in the spool, recorded exactly once, or was
//! answered "already resolved" because its waitpoint had closed; every waitpoint's status and
//! counters agree with a replay of its recorded signals through [`Model`]; every wake it
//! counted is in the inbox once, and a resolved waitpoint has exactly one `resolved` wake;
//! every JSON file under the home parses.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::helpers::*;

/// A waitpoint's rules as the spec states them (what `wait_create` was given).
#[derive(Debug, Clone)]
pub struct Rules {
    pub members: Vec<String>,
    pub quorum: u32,
    pub fail_fast: bool,
    pub max_signals: u32,
}

impl Rules {
    pub fn from_state(state: &Value) -> Rules {
        Rules {
            members: state["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_str().unwrap().to_owned())
                .collect(),
            quorum: state["quorum"].as_u64().unwrap() as u32,
            fail_fast: state["fail_fast"].as_bool().unwrap(),
            max_signals: state["max_signals"].as_u64().unwrap() as u32,
        }
    }
}

/// The spec's state machine, as plainly as it can be written: `progress` is a heartbeat; a
/// terminal signal counts toward the round once per member (or once, without members); the round
/// completes at the quorum, or on a `fail` with fail-fast; the `max_signals`th round resolves
/// it, with `fail` as the outcome if any counted signal of that round failed. Signals recorded
/// after it closed (a grace window) are counted and change nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Model {
    pub status: String,
    pub outcome: Option<String>,
    pub signals: u64,
    pub ok: u64,
    pub fail: u64,
    pub progress: u64,
    pub rounds: u64,
    /// Rounds that started a wake of their own (not folded into a held one).
    wakes_started: u64,
    round_members: Vec<String>,
    round_count: u32,
    round_failed: bool,
}

/// What a terminal signal did to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// A round completed; `true` when it resolved the waitpoint.
    Round(bool),
}

impl Model {
    pub fn new() -> Model {
        Model {
            status: "armed".into(),
            ..Model::default()
        }
    }

    /// Applies one recorded signal. `folds` is whether a wake is being held (a grace window or
    /// the hourly cap) when it arrives: a round completed then starts no wake of its own, and
    /// `max_signals` counts wakes. The kill loop's waitpoints never hold one (its monitors
    /// have a quorum of 1 and fewer wakes than the cap), so it passes `false`; the state
    /// machine, which has the clock, models the holds.
    pub fn apply(
        &mut self,
        rules: &Rules,
        status: &str,
        member: Option<&str>,
        folds: bool,
    ) -> Step {
        self.signals += 1;
        match status {
            "ok" => self.ok += 1,
            "fail" => self.fail += 1,
            "progress" => self.progress += 1,
            other => panic!("model: unknown status {other}"),
        }
        if self.status != "armed" || status == "progress" {
            return Step::Nothing;
        }
        if !rules.members.is_empty() {
            let m = member.expect("a member waitpoint only records signals naming a member");
            if self.round_members.iter().any(|x| x == m) {
                return Step::Nothing;
            }
            self.round_members.push(m.to_owned());
        }
        self.round_count += 1;
        self.round_failed |= status == "fail";
        if self.round_count < rules.quorum && !(rules.fail_fast && status == "fail") {
            return Step::Nothing;
        }
        let outcome = if self.round_failed { "fail" } else { "ok" };
        self.rounds += 1;
        self.round_members.clear();
        self.round_count = 0;
        self.round_failed = false;
        if !folds {
            self.wakes_started += 1;
        }
        if !folds && self.wakes_started >= u64::from(rules.max_signals) {
            self.status = "resolved".into();
            self.outcome = Some(outcome.into());
            Step::Round(true)
        } else {
            Step::Round(false)
        }
    }

    /// Whether the stored state agrees with the model; the differences otherwise.
    pub fn diff(&self, state: &Value) -> Vec<String> {
        let mut out = Vec::new();
        let mut same = |what: &str, got: &Value, want: Value| {
            if *got != want {
                out.push(format!("{what}: state says {got}, the model {want}"));
            }
        };
        same("status", &state["status"], Value::from(self.status.clone()));
        same(
            "outcome",
            &state["outcome"],
            self.outcome.clone().map_or(Value::Null, Value::from),
        );
        let c = &state["counters"];
        same("signals", &c["signals"], self.signals.into());
        same("ok", &c["ok"], self.ok.into());
        same("fail", &c["fail"], self.fail.into());
        same("progress", &c["progress"], self.progress.into());
        same("rounds", &c["rounds"], self.rounds.into());
        out
    }
}

/// A signal file a test dropped, and the waitpoint it was for.
#[derive(Debug, Clone)]
pub struct Dropped {
    pub name: String,
    pub waitpoint: String,
}

/// What the checks found. Every count that is a broken promise must be zero.
#[derive(Debug, Default, Clone)]
pub struct Findings {
    pub waitpoints: usize,
    pub dropped: usize,
    pub recorded: usize,
    pub spooled: usize,
    /// Consumed and answered "already resolved" (their waitpoint had closed).
    pub late: usize,
    pub parked: usize,
    /// Broken promises, each described.
    pub lost: Vec<String>,
    pub duplicates: Vec<String>,
    pub torn: Vec<String>,
    pub mismatches: Vec<String>,
    pub wake_errors: Vec<String>,
    pub wakes: usize,
    /// `*.tmp` files left under the home (commits cut short).
    pub temps: usize,
}

impl Findings {
    pub fn broken(&self) -> usize {
        self.lost.len()
            + self.duplicates.len()
            + self.torn.len()
            + self.mismatches.len()
            + self.wake_errors.len()
    }

    /// Panics with every broken promise (and `context`, e.g. the seed) when there is one.
    pub fn assert_kept(&self, context: &str) {
        if self.broken() == 0 {
            return;
        }
        let mut text = format!("{context}\n{} promise(s) broken:\n", self.broken());
        for (what, list) in [
            ("lost", &self.lost),
            ("duplicate", &self.duplicates),
            ("torn", &self.torn),
            ("state differs from the model", &self.mismatches),
            ("wakes", &self.wake_errors),
        ] {
            for line in list.iter().take(20) {
                text.push_str(&format!("  {what}: {line}\n"));
            }
        }
        panic!("{text}");
    }
}

/// Runs every check on `env`'s home, which must be settled (no daemon mid-work). `dropped` are
/// the files the test put into the drop zone.
pub fn check(env: &Env, dropped: &[Dropped]) -> Findings {
    let mut f = Findings {
        dropped: dropped.len(),
        ..Findings::default()
    };
    check_json_parses(&env.home, &mut f);
    let spooled: std::collections::HashSet<String> = env.spooled().into_iter().collect();
    let parked: std::collections::HashSet<String> = list_names(&env.drop_zone().join("bad"))
        .into_iter()
        .filter_map(|n| n.strip_suffix(".reason").map(|s| format!("{s}.json")))
        .collect();

    // Every record, by waitpoint, and every identity with where it was recorded.
    let mut identities: HashMap<String, Vec<String>> = HashMap::new();
    let mut states: BTreeMap<String, Value> = BTreeMap::new();
    let mut closed_by: HashMap<String, String> = HashMap::new();
    // Every wake in every inbox, by waitpoint, read once.
    let mut wakes_of: HashMap<String, Vec<Value>> = HashMap::new();
    for channel in list_names(&env.home.join("sessions")) {
        for w in [env.inbox(&channel, "new"), env.inbox(&channel, "cur")].concat() {
            let id = w["waitpoint"]["id"].as_str().unwrap_or_default().to_owned();
            wakes_of.entry(id).or_default().push(w);
        }
    }
    for id in list_names(&env.home.join("waitpoints")) {
        if !id.starts_with("wp_") {
            continue;
        }
        let state = env.state(&id);
        let records = records_of(&env.home, &id);
        let wakes = wakes_of.remove(&id).unwrap_or_default();
        if let Some(closer) = check_waitpoint(&id, &state, &records, &wakes, &mut f) {
            closed_by.insert(id.clone(), closer);
        }
        for r in &records {
            // By identity, not by origin: a sender's POST and its spooled fallback are one
            // signal, and both recorded would be a signal counted twice.
            identities
                .entry(waitpoint::request::identity_of(
                    r["source"].as_str().unwrap(),
                ))
                .or_default()
                .push(id.clone());
        }
        states.insert(id, state);
    }
    f.waitpoints = states.len();
    for (identity, ids) in &identities {
        if ids.len() > 1 {
            f.duplicates
                .push(format!("{identity} recorded {} times ({ids:?})", ids.len()));
        }
    }
    for d in dropped {
        let identity = format!("spool:{}", d.name);
        match identities.get(&identity) {
            Some(ids) if ids.iter().all(|i| *i == d.waitpoint) => f.recorded += 1,
            Some(ids) => f.mismatches.push(format!(
                "{} recorded on {ids:?}, not {}",
                d.name, d.waitpoint
            )),
            None if spooled.contains(&d.name) => f.spooled += 1,
            None if parked.contains(&d.name) => f.parked += 1,
            None => match states.get(&d.waitpoint) {
                // Late is only late if it was dropped after the signal that closed its waitpoint
                // (files are collected in name order, and tests name them in drop order).
                Some(s) if s["status"] != "armed" => match closed_by.get(&d.waitpoint) {
                    Some(closer) if *closer < d.name => f.late += 1,
                    closer => f.lost.push(format!(
                        "{} (for {}) was dropped before the signal that closed it ({closer:?}) \
                         and is neither spooled, recorded nor parked",
                        d.name, d.waitpoint
                    )),
                },
                _ => f.lost.push(format!(
                    "{} (for {}) is neither spooled, recorded nor parked, and its waitpoint is \
                     still armed",
                    d.name, d.waitpoint
                )),
            },
        }
    }
    f.temps = temp_files(&env.home).len();
    f
}

/// Checks one waitpoint; returns the name of the spool file whose signal closed it, if one did.
fn check_waitpoint(
    id: &str,
    state: &Value,
    records: &[Value],
    wakes: &[Value],
    f: &mut Findings,
) -> Option<String> {
    let rules = Rules::from_state(state);
    let mut model = Model::new();
    let mut expected_resolved_wakes = 0;
    let mut closer = None;
    for (i, r) in records.iter().enumerate() {
        let seq = r["seq"].as_u64().unwrap();
        if seq != i as u64 + 1 {
            f.mismatches
                .push(format!("{id}: record #{} has seq {seq}", i + 1));
        }
        let step = model.apply(
            &rules,
            r["status"].as_str().unwrap(),
            r["member"].as_str(),
            false,
        );
        if step == Step::Round(true) {
            expected_resolved_wakes += 1;
            closer = r["source"]
                .as_str()
                .and_then(|s| s.strip_prefix("spool:"))
                .map(str::to_owned);
        }
    }
    for d in model.diff(state) {
        f.mismatches.push(format!("{id}: {d}"));
    }
    if !state["outbox"].as_array().unwrap().is_empty() || !state["pending_wake"].is_null() {
        f.wake_errors
            .push(format!("{id}: a wake is still pending or in the outbox"));
    }
    f.wakes += wakes.len();
    let counted = state["counters"]["wakes"].as_u64().unwrap();
    let mut ids: Vec<&str> = wakes
        .iter()
        .map(|w| w["wake_id"].as_str().unwrap())
        .collect();
    ids.sort();
    let want: Vec<String> = (1..=counted)
        .map(|n| format!("wk_{}_{n:04}", &id[3..]))
        .collect();
    if ids != want {
        f.wake_errors.push(format!(
            "{id}: counted {counted} wakes, the inbox holds {ids:?}"
        ));
    }
    // No cap folding happens in these runs, so every round woke the session once.
    if counted != model.rounds {
        f.wake_errors.push(format!(
            "{id}: {} rounds completed but {counted} wakes were sent",
            model.rounds
        ));
    }
    let resolved = wakes.iter().filter(|w| w["kind"] == "resolved").count();
    if resolved != expected_resolved_wakes {
        f.wake_errors.push(format!(
            "{id}: {resolved} `resolved` wakes in the inbox, expected {expected_resolved_wakes}"
        ));
    }
    closer
}

/// The records of a waitpoint, in seq order: every complete line of its log (a last line an
/// append left unfinished is not a record yet), and any record file of the older form.
pub fn records_of(home: &Path, id: &str) -> Vec<Value> {
    let dir = home.join("waitpoints").join(id);
    let mut records = match fs::read_to_string(dir.join("signals.jsonl")) {
        Ok(text) => text
            .split_inclusive('\n')
            .filter_map(|l| l.strip_suffix('\n'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{id}'s log: {l:?}: {e}")))
            .collect(),
        Err(_) => Vec::new(),
    };
    if dir.join("signals").is_dir() {
        records.extend(read_json_dir(&dir.join("signals")));
    }
    records.sort_by_key(|r| r["seq"].as_u64().unwrap());
    records
}

fn check_json_parses(home: &Path, f: &mut Findings) {
    for path in all_files(home) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".json") || name.starts_with('.') {
            continue;
        }
        // Parked files are whatever a job wrote; they are kept as they came.
        if path.starts_with(home.join("tmp/signals/bad")) {
            continue;
        }
        let bytes = fs::read(&path).unwrap_or_default();
        if serde_json::from_slice::<Value>(&bytes).is_err() {
            f.torn.push(format!("{} does not parse", path.display()));
        }
    }
}

/// Every `*.tmp` file under `root`.
pub fn temp_files(root: &Path) -> Vec<PathBuf> {
    all_files(root)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect()
}

/// Every regular file under `root`, symlinks not followed.
pub fn all_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

fn list_names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether every waitpoint has delivered what it owes (no outbox, no pending wake).
pub fn settled(env: &Env) -> bool {
    env.spooled().is_empty()
        && list_names(&env.home.join("waitpoints"))
            .iter()
            .filter(|id| id.starts_with("wp_"))
            .all(|id| {
                let s = env.state(id);
                s["outbox"].as_array().is_some_and(|o| o.is_empty()) && s["pending_wake"].is_null()
            })
}

/// Appends rows (`| what | figure |`) to the reliability report, when `scripts/reliability`
/// asked for one (`WAITPOINT_REPORT_DIR`). `suite` names the fragment; rows keep their order.
pub fn report(suite: &str, rows: &[(&str, String)]) {
    let Some(dir) = std::env::var_os("WAITPOINT_REPORT_DIR") else {
        return;
    };
    let mut text = String::new();
    for (what, figure) in rows {
        text.push_str(&format!("| {what} | {figure} |\n"));
    }
    fs::write(Path::new(&dir).join(format!("{suite}.md")), text).unwrap();
}

/// A setting for the size of a run, from the environment (the full run sets them).
pub fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
        .unwrap_or(default)
}
