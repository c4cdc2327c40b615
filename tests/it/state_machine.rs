//! A property test of the state machine: random waitpoints, then random sequences of signals
//! (fresh and repeated file names, right and wrong secrets, listed, unlisted and missing
//! members), cancels, restarts (a new engine on the same home) and clock steps, applied to the
//! real engine on a temp home with a manual clock, and to a plain model of the spec. After
//! every step the engine's verdict, each waitpoint's status, outcome and counters, whether a
//! wake is held back, and the wakes in the inbox must equal the model's.
//!
//! The model adds to `invariants::Model` (rounds, quorum, members) what happens over time: the
//! three-second grace window of a waitpoint that needs several signals, the sliding-hour wake
//! cap that folds later rounds into one held wake, the deadline, and cancellation. Time moves
//! only when the test says; after each step every waitpoint is serviced, as an on-time daemon
//! would. `WAITPOINT_MODEL_CASES` sets the number of sequences.

use std::collections::HashSet;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use waitpoint::clock::{Clock, ManualClock};
use waitpoint::engine::rules::Refusal;
use waitpoint::engine::{CreateRequest, Engine, Quorum, Verdict};
use waitpoint::home::Home;
use waitpoint::records::{SignalStatus, Status};
use waitpoint::request::{SignalRequest, Source};
use waitpoint::settings::Settings;

use crate::helpers::T0;
use crate::invariants::{self, Model, Rules, Step, knob};

const GRACE_MS: i64 = 3_000;
const HOUR_MS: i64 = 3_600_000;
const CAP: u32 = 2;

#[derive(Debug, Clone)]
struct Spec {
    members: usize,
    quorum: Option<u32>,
    fail_fast: bool,
    max_signals: u32,
    hours: f64,
}

#[derive(Debug, Clone)]
enum Op {
    Signal {
        wp: usize,
        status: SignalStatus,
        /// 0: none; 1..=3: that member; 4: one not on the list.
        member: usize,
        /// Reuse an earlier file name of this waitpoint (if any) instead of a fresh one.
        reuse: bool,
        wrong_secret: bool,
    },
    Cancel(usize),
    Restart,
    Step(i64),
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0usize..=3,
        any::<bool>(),
        1u32..=4,
        prop::sample::select(vec![0.5, 1.0, 2.0, 24.0]),
    )
        .prop_flat_map(|(members, fail_fast, max_signals, hours)| {
            let quorum = if members == 0 {
                prop::option::of(1u32..=3).boxed()
            } else {
                prop::option::of(1u32..=members as u32).boxed()
            };
            quorum.prop_map(move |quorum| Spec {
                members,
                quorum,
                fail_fast,
                max_signals,
                hours,
            })
        })
}

fn op(n_wp: usize) -> impl Strategy<Value = Op> {
    let status = prop::sample::select(vec![
        SignalStatus::Ok,
        SignalStatus::Fail,
        SignalStatus::Progress,
    ]);
    prop_oneof![
        10 => (0..n_wp, status, 0usize..=4, prop::bool::weighted(0.15), prop::bool::weighted(0.05))
            .prop_map(|(wp, status, member, reuse, wrong_secret)| Op::Signal { wp, status, member, reuse, wrong_secret }),
        1 => (0..n_wp).prop_map(Op::Cancel),
        1 => Just(Op::Restart),
        4 => prop::sample::select(vec![200i64, 1_000, 2_500, 3_500, 600_000, 3_700_000]).prop_map(Op::Step),
    ]
}

fn scenario() -> impl Strategy<Value = (Vec<Spec>, Vec<Op>)> {
    prop::collection::vec(spec(), 1..=4).prop_flat_map(|specs| {
        let n = specs.len();
        (Just(specs), prop::collection::vec(op(n), 1..40))
    })
}

/// One waitpoint as the model sees it.
struct MWp {
    id: String,
    secret: String,
    rules: Rules,
    expires_at: i64,
    m: Model,
    wakes: u64,
    /// A held wake: when it is due, and whether it is a grace window (else the cap).
    pending: Option<(i64, bool)>,
    recent: Vec<i64>,
    names: Vec<String>,
    recorded: HashSet<String>,
}

impl MWp {
    fn cap_frees_at(&mut self, now: i64) -> Option<i64> {
        self.recent.retain(|t| now - t < HOUR_MS);
        let n = self.recent.len();
        (n >= CAP as usize).then(|| self.recent[n - CAP as usize] + HOUR_MS)
    }

    fn wake(&mut self, now: i64) {
        self.wakes += 1;
        self.recent.push(now);
    }

    fn in_grace(&self, now: i64) -> bool {
        self.m.status == "resolved" && self.pending.is_some_and(|(due, grace)| grace && now < due)
    }

    /// A completed round's wake: folded into a held one, held for the grace window (not after a
    /// fail-fast failure) or the cap, or sent now.
    fn schedule(&mut self, now: i64, failed_fast: bool) {
        if self.pending.is_some() {
            return;
        }
        if self.rules.quorum > 1 && !failed_fast {
            self.pending = Some((now + GRACE_MS, true));
        } else if let Some(at) = self.cap_frees_at(now) {
            self.pending = Some((at, false));
        } else {
            self.wake(now);
        }
    }

    /// What an on-time daemon does at `now`: a held wake whose time came goes out (or waits
    /// for the cap), and a passed deadline expires it with a wake of its own.
    fn service(&mut self, now: i64) {
        if let Some((due, _)) = self.pending
            && due <= now
        {
            match self.cap_frees_at(now) {
                Some(at) => self.pending = Some((at, false)),
                None => {
                    self.pending = None;
                    self.wake(now);
                }
            }
        }
        if self.m.status == "armed" && now >= self.expires_at {
            self.m.status = "expired".into();
            self.pending = None;
            self.wake(now);
        }
    }
}

/// The verdict as the model predicts it, in the engine's words.
#[derive(Debug, PartialEq, Eq)]
enum Want {
    Accepted,
    Duplicate,
    Closed,
    Unauthorized,
    MemberMissing,
    MemberUnknown,
}

fn verdict_kind(v: &Verdict) -> Want {
    match v {
        Verdict::Accepted { .. } => Want::Accepted,
        Verdict::Duplicate { .. } => Want::Duplicate,
        Verdict::Closed { .. } => Want::Closed,
        Verdict::Refused(Refusal::MemberMissing { .. }) => Want::MemberMissing,
        Verdict::Refused(Refusal::MemberUnknown { .. }) => Want::MemberUnknown,
        Verdict::Refused(_) => Want::Unauthorized,
        Verdict::Queued { .. } => panic!("a store of one home hands nothing over"),
    }
}

fn run_case(specs: &[Spec], ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path().join("home"));
    home.ensure().unwrap();
    let settings = Settings {
        max_wakes_per_hour: CAP,
        ..Settings::default()
    };
    let clock = Arc::new(ManualClock::new(T0));
    let new_engine = || Engine::new(home.clone(), settings.clone(), clock.clone());
    let mut engine = new_engine();
    let now = || clock.now().as_millis();
    let mut wps: Vec<MWp> = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let members: Vec<String> = (1..=s.members).map(|m| format!("arm{m}")).collect();
        let c = engine
            .create(CreateRequest {
                members: members.clone(),
                quorum: s.quorum.map(Quorum::Count),
                fail_fast: s.fail_fast,
                max_signals: s.max_signals,
                expires_in_hours: Some(s.hours),
                ..CreateRequest::new(format!("model {i}"), "i", "default")
            })
            .unwrap();
        let quorum = s.quorum.unwrap_or(s.members.max(1) as u32);
        wps.push(MWp {
            id: c.waitpoint.id.clone(),
            secret: c.secret,
            rules: Rules {
                members,
                quorum,
                fail_fast: s.fail_fast,
                max_signals: s.max_signals,
            },
            expires_at: c.waitpoint.expires_at.as_millis(),
            m: Model::new(),
            wakes: 0,
            pending: None,
            recent: Vec::new(),
            names: Vec::new(),
            recorded: HashSet::new(),
        });
    }
    let mut fresh = 0;
    for (step, op) in ops.iter().enumerate() {
        let at = format!("step {step} ({op:?})");
        match op {
            Op::Signal {
                wp,
                status,
                member,
                reuse,
                wrong_secret,
            } => {
                let w = &mut wps[*wp];
                let name = match (reuse, w.names.last()) {
                    (true, Some(n)) => n.clone(),
                    _ => {
                        fresh += 1;
                        let n = format!("{fresh:04}.json");
                        w.names.push(n.clone());
                        n
                    }
                };
                let member_name = match member {
                    0 => None,
                    4 => Some("arm9".to_owned()),
                    m => Some(format!("arm{m}")),
                };
                let req = SignalRequest {
                    id: w.id.clone(),
                    secret: if *wrong_secret {
                        "0".repeat(64).into()
                    } else {
                        w.secret.clone().into()
                    },
                    status: *status,
                    message: None,
                    member: member_name.clone(),
                    data: None,
                };
                let t = now();
                let want = if *wrong_secret {
                    Want::Unauthorized
                } else if w.m.status != "armed" && !w.in_grace(t) {
                    Want::Closed
                } else if w.recorded.contains(&name) {
                    Want::Duplicate
                } else if !w.rules.members.is_empty() && member_name.is_none() {
                    Want::MemberMissing
                } else if !w.rules.members.is_empty()
                    && !w.rules.members.contains(member_name.as_ref().unwrap())
                {
                    Want::MemberUnknown
                } else {
                    Want::Accepted
                };
                let got = engine
                    .apply_signal(&req, &Source::Spool(name.clone()))
                    .unwrap();
                prop_assert_eq!(verdict_kind(&got), want, "{}: {:?}", at, got);
                if verdict_kind(&got) == Want::Accepted {
                    w.recorded.insert(name);
                    let rules = w.rules.clone();
                    let folds = w.pending.is_some();
                    if let Step::Round(_) =
                        w.m.apply(&rules, status.as_str(), member_name.as_deref(), folds)
                    {
                        // The spec: "the first failure wakes you immediately (fail_fast)".
                        w.schedule(t, rules.fail_fast && status.as_str() == "fail");
                    }
                }
            }
            Op::Cancel(i) => {
                let w = &mut wps[*i];
                let got = engine.cancel(&w.id, "default");
                match w.m.status.as_str() {
                    "armed" | "cancelled" => {
                        prop_assert!(got.is_ok(), "{}: {:?}", at, got.err());
                        if w.m.status == "armed" {
                            w.m.status = "cancelled".into();
                            w.pending = None;
                        }
                    }
                    _ => prop_assert!(got.is_err(), "{}: cancelling a closed one", at),
                }
            }
            Op::Restart => engine = new_engine(),
            Op::Step(ms) => clock.advance_ms(*ms),
        }
        let t = now();
        for w in &mut wps {
            engine.service(&w.id).unwrap();
            w.service(t);
        }
        for w in &wps {
            let s = engine.load(&w.id).unwrap().unwrap();
            let state = serde_json::to_value(&s).unwrap();
            let diffs = w.m.diff(&state);
            prop_assert!(diffs.is_empty(), "{} {}: {:?}", at, w.id, diffs);
            prop_assert_eq!(s.counters.wakes, w.wakes, "{} {}: wakes", at, &w.id);
            prop_assert_eq!(
                s.pending_wake.is_some(),
                w.pending.is_some(),
                "{} {}: held wake {:?}",
                at,
                &w.id,
                &s.pending_wake
            );
            prop_assert!(s.outbox.is_empty(), "{}: the outbox was delivered", at);
            let inbox = waitpoint::delivery::unread(&home, "default")
                .unwrap()
                .into_iter()
                .filter(|x| x.waitpoint.as_ref().is_some_and(|s| s.id == w.id))
                .count() as u64;
            prop_assert_eq!(inbox, w.wakes, "{} {}: wakes in the inbox", at, &w.id);
            if s.status == Status::Armed {
                prop_assert_eq!(w.m.status.as_str(), "armed");
            }
        }
    }
    Ok(())
}

#[test]
fn the_engine_matches_a_model_of_the_spec_through_signals_restarts_cancels_and_time() {
    let cases = knob("WAITPOINT_MODEL_CASES", 24) as u32;
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let steps = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(&scenario(), |(specs, ops)| {
            steps.fetch_add(ops.len(), std::sync::atomic::Ordering::Relaxed);
            run_case(&specs, &ops)
        })
        .unwrap();
    invariants::report(
        "6-model",
        &[(
            "state machine vs. model of the spec: sequences (steps), all equal",
            format!(
                "{cases} ({})",
                steps.load(std::sync::atomic::Ordering::Relaxed)
            ),
        )],
    );
}
