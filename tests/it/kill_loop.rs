//! The kill loop: the real daemon as a child, flooded with signals for many waitpoints (one-shot,
//! barriers with members, monitors; ok, fail and progress), SIGKILLed at random moments and
//! restarted, then checked against every promise in `invariants`.
//!
//! The short form runs in CI; `scripts/reliability` runs the full one (20,000 signals across
//! 1,000 waitpoints, 50 kills) through the `WAITPOINT_KILL_*` knobs. Randomness is seeded: the
//! seed is printed first and in every failure, and `WAITPOINT_KILL_SEED` replays a run.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rustix::process::Signal;
use waitpoint::clock::SystemClock;
use waitpoint::engine::{CreateRequest, Engine, Quorum};
use waitpoint::home::Home;
use waitpoint::settings::Settings;

use crate::helpers::*;
use crate::invariants::{self, Dropped, knob, settled, temp_files};

/// One planned signal: its waitpoint (index), status and member.
#[derive(Debug, Clone)]
struct Planned {
    wp: usize,
    status: &'static str,
    member: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    OneShot,
    Barrier,
    Monitor,
}

struct Armed {
    id: String,
    secret: String,
    kind: Kind,
}

/// Arms `n` waitpoints of mixed kinds and plans about `per` signals for each, in an order that
/// ends each waitpoint's own sequence with the signal that closes it.
fn plan(env: &Env, rng: &mut StdRng, n: usize, per: usize) -> (Vec<Armed>, Vec<Vec<Planned>>) {
    let engine = Engine::new(
        Home::new(&env.home),
        Settings::default(),
        Arc::new(SystemClock),
    );
    let mut armed = Vec::new();
    let mut plans = Vec::new();
    for i in 0..n {
        let kind = match rng.random_range(0..10) {
            0..=3 => Kind::OneShot,
            4..=6 => Kind::Barrier,
            _ => Kind::Monitor,
        };
        let members: Vec<String> = match kind {
            Kind::Barrier => (0..rng.random_range(2..=4))
                .map(|m| format!("arm{m}"))
                .collect(),
            _ => Vec::new(),
        };
        let quorum = match kind {
            Kind::Barrier if rng.random_bool(0.3) => Some(Quorum::Count(members.len() as u32 - 1)),
            _ => None,
        };
        let max_signals = match kind {
            Kind::Monitor => rng.random_range(2..=6),
            _ => 1,
        };
        let created = engine
            .create(CreateRequest {
                members: members.clone(),
                quorum,
                fail_fast: rng.random_bool(0.5),
                max_signals,
                ..CreateRequest::new(format!("kill-loop {i}"), "survive the kill loop", "default")
            })
            .unwrap();
        let terminal = |rng: &mut StdRng| if rng.random_bool(0.8) { "ok" } else { "fail" };
        let mut steps: Vec<Planned> = Vec::new();
        let heartbeat = |member: Option<String>| Planned {
            wp: i,
            status: "progress",
            member,
        };
        match kind {
            Kind::OneShot => steps.push(Planned {
                wp: i,
                status: terminal(rng),
                member: None,
            }),
            Kind::Barrier => {
                for m in &members {
                    steps.push(Planned {
                        wp: i,
                        status: terminal(rng),
                        member: Some(m.clone()),
                    });
                    // Now and then a member reports twice; it counts once.
                    if rng.random_bool(0.2) {
                        steps.push(Planned {
                            wp: i,
                            status: "ok",
                            member: Some(m.clone()),
                        });
                    }
                }
            }
            Kind::Monitor => {
                for _ in 0..max_signals {
                    steps.push(Planned {
                        wp: i,
                        status: terminal(rng),
                        member: None,
                    });
                }
            }
        }
        // Fill up with heartbeats, spread before the terminal signals.
        while steps.len() < per {
            let member = if members.is_empty() {
                None
            } else {
                Some(members[rng.random_range(0..members.len())].clone())
            };
            let at = rng.random_range(0..steps.len());
            steps.insert(at, heartbeat(member));
        }
        armed.push(Armed {
            id: created.waitpoint.id,
            secret: created.secret,
            kind,
        });
        plans.push(steps);
    }
    (armed, plans)
}

/// Interleaves the waitpoints' sequences at random, each keeping its own order.
fn interleave(rng: &mut StdRng, plans: Vec<Vec<Planned>>) -> Vec<Planned> {
    let mut queues: Vec<std::collections::VecDeque<Planned>> =
        plans.into_iter().map(Into::into).collect();
    let mut out = Vec::new();
    while !queues.is_empty() {
        let i = rng.random_range(0..queues.len());
        out.push(queues[i].pop_front().unwrap());
        if queues[i].is_empty() {
            queues.swap_remove(i);
        }
    }
    out
}

fn signal_body(a: &Armed, p: &Planned, n: usize) -> String {
    let member = p
        .member
        .as_ref()
        .map(|m| format!(r#","member":"{m}""#))
        .unwrap_or_default();
    body(
        &a.id,
        &a.secret,
        &format!(
            r#","status":"{}","message":"signal {n}"{member},"data":{{"n":{n}}}"#,
            p.status
        ),
    )
}

#[test]
fn kill_loop_loses_nothing_and_counts_nothing_twice() {
    let seed = knob("WAITPOINT_KILL_SEED", rand::random::<u32>() as u64);
    let total = knob("WAITPOINT_KILL_SIGNALS", 1_200) as usize;
    let n_wp = knob("WAITPOINT_KILL_WAITPOINTS", 60) as usize;
    let kills = knob("WAITPOINT_KILL_KILLS", 8) as usize;
    let context = format!(
        "kill loop: seed {seed}; replay with WAITPOINT_KILL_SEED={seed} \
         WAITPOINT_KILL_SIGNALS={total} WAITPOINT_KILL_WAITPOINTS={n_wp} WAITPOINT_KILL_KILLS={kills}"
    );
    eprintln!("{context}");
    let mut rng = StdRng::seed_from_u64(seed);
    let env = Env::new();
    let (armed, plans) = plan(&env, &mut rng, n_wp, total.div_ceil(n_wp));
    let order = interleave(&mut rng, plans);

    let mut dropped: Vec<Dropped> = Vec::new();
    let batch = order.len().div_ceil(kills);
    let mut survived = 0;
    for (k, chunk) in order.chunks(batch).enumerate() {
        let mut d = env.daemon_started(&[]);
        for p in chunk {
            let n = dropped.len();
            let name = format!("{n:07}-{k:03}");
            env.drop_file(&name, &signal_body(&armed[p.wp], p, n));
            dropped.push(Dropped {
                name: format!("{name}.json"),
                waitpoint: armed[p.wp].id.clone(),
            });
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..400)));
        assert!(
            d.running(),
            "{context}\nthe daemon died on its own before kill {k}\n{}",
            std::fs::read_to_string(&d.stderr_path).unwrap_or_default()
        );
        d.kill();
        survived += 1;
    }

    // Commits cut short leave temp files; once they are a day old, the daemon removes them: at
    // its first start after a death (this one), then daily.
    let temps = temp_files(&env.home);
    let two_days_ago = SystemTime::now() - Duration::from_secs(2 * 86_400);
    for t in &temps {
        let f = std::fs::File::options().write(true).open(t).unwrap();
        f.set_modified(two_days_ago).unwrap();
    }
    // The last start: everything left drains and every pending wake goes out.
    let mut d = env.daemon_started(&[]);
    let limit = Duration::from_secs(120).max(Duration::from_millis(total as u64 * 30));
    env.wait_until_within("the backlog to drain and wakes to settle", limit, || {
        settled(&env)
    });
    env.wait_until("stale temp files to be removed", || {
        temp_files(&env.home).is_empty()
    });
    d.send(Signal::TERM);
    let (code, stderr) = d.wait_exit();
    assert_eq!(code, Some(0), "{context}\n{stderr}");

    let f = invariants::check(&env, &dropped);
    f.assert_kept(&context);
    assert_eq!(f.dropped, order.len());
    assert_eq!(
        f.recorded + f.late,
        f.dropped,
        "{context}: everything dropped was recorded or answered late"
    );
    let count = |k: Kind| armed.iter().filter(|a| a.kind == k).count();
    invariants::report(
        "1-kill-loop",
        &[
            ("kill loop: seed", seed.to_string()),
            (
                "kill loop: waitpoints (one-shot / barrier / monitor)",
                format!(
                    "{} ({} / {} / {})",
                    f.waitpoints,
                    count(Kind::OneShot),
                    count(Kind::Barrier),
                    count(Kind::Monitor)
                ),
            ),
            (
                "kill loop: SIGKILLs survived",
                format!("{survived} of {survived}"),
            ),
            (
                "kill loop: signals dropped / recorded / answered late / still spooled / parked",
                format!(
                    "{} / {} / {} / {} / {}",
                    f.dropped, f.recorded, f.late, f.spooled, f.parked
                ),
            ),
            ("kill loop: lost", f.lost.len().to_string()),
            (
                "kill loop: duplicates (recorded twice)",
                f.duplicates.len().to_string(),
            ),
            (
                "kill loop: torn files (JSON that does not parse)",
                f.torn.len().to_string(),
            ),
            (
                "kill loop: temp files left by cut commits (all removed by the day-old sweep)",
                temps.len().to_string(),
            ),
            (
                "kill loop: waitpoints whose state differs from the model",
                f.mismatches.len().to_string(),
            ),
            (
                "kill loop: wakes in the inbox (each exactly once)",
                f.wakes.to_string(),
            ),
        ],
    );
}

/// The kill loop's HTTP senders: `cortex-signal` processes POST to the shim while the daemon is
/// SIGKILLed at random moments, and, in a failpoints build (`scripts/reliability`), also kills
/// itself right after a batch is committed and before any reply goes out, one commit in ten.
/// A sender that hears no answer falls back to the spool under the same key. Every sender must
/// exit 0 and its signal be recorded exactly once, whichever copy arrived first.
#[test]
fn http_senders_through_kills_are_each_recorded_exactly_once() {
    let seed = knob("WAITPOINT_KILL_SEED", rand::random::<u32>() as u64);
    let senders = knob("WAITPOINT_KILL_HTTP_SENDERS", 48) as usize;
    let kills = knob("WAITPOINT_KILL_HTTP_KILLS", 4) as usize;
    let context = format!(
        "http kill loop: seed {seed}; replay with WAITPOINT_KILL_SEED={seed} \
         WAITPOINT_KILL_HTTP_SENDERS={senders} WAITPOINT_KILL_HTTP_KILLS={kills}"
    );
    eprintln!("{context}");
    let mut rng = StdRng::seed_from_u64(seed);
    let env = Env::new();
    let monitors: Vec<(String, String)> = (0..4)
        .map(|i| {
            let label = format!("m{i}");
            id_secret(&env.create(&["--label", &label, "--intent", "i", "--max-signals", "10000"]))
        })
        .collect();
    // Inert without the failpoints feature.
    let crash_after_commit = [("FAILPOINTS", "engine-after-journal=10%return(crash)")];
    let mut said: Vec<(String, Option<i32>)> = Vec::new();
    for chunk in (0..senders)
        .collect::<Vec<_>>()
        .chunks(senders.div_ceil(kills))
    {
        // The address file of the daemon killed last round names a dead listener; wait for
        // this daemon's own, so most senders find the shim.
        let published = env.home.join("webhook.json");
        let _ = std::fs::remove_file(&published);
        // Not waiting for "ready": a daemon that kills itself while draining never gets there.
        let mut d = env.daemon_spawned(&["--http", "--port", "0"], &crash_after_commit);
        env.wait_until("the shim's address, or the daemon's death", || {
            published.exists() || !d.running()
        });
        // The daemon dies while the senders start: those started just before are mid-request.
        let kill_at = rng.random_range(0..=chunk.len());
        let mut d = Some(d);
        let children: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                if i == kill_at {
                    d.take().map(DaemonGuard::kill);
                }
                let (id, secret) = &monitors[n % monitors.len()];
                env.command(CORTEX_SIGNAL)
                    .args(["--status", "progress", "--message", &format!("sender {n}")])
                    .env("CORTEX_SIGNAL_ID", id)
                    .env("CORTEX_SIGNAL_SECRET", secret)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn cortex-signal")
            })
            .collect();
        if let Some(d) = d {
            std::thread::sleep(Duration::from_millis(rng.random_range(0..50)));
            d.kill();
        }
        for c in children {
            let out = c.wait_with_output().unwrap();
            said.push((
                String::from_utf8_lossy(&out.stderr).into_owned(),
                out.status.code(),
            ));
        }
    }
    let mut d = env.daemon_started(&[]);
    env.wait_until("the spooled copies to drain", || settled(&env));
    d.send(Signal::TERM);
    let (code, stderr) = d.wait_exit();
    assert_eq!(code, Some(0), "{context}\n{stderr}");

    let f = invariants::check(&env, &[]);
    f.assert_kept(&context);
    let records: Vec<Value> = monitors
        .iter()
        .flat_map(|(id, _)| invariants::records_of(&env.home, id))
        .collect();
    let (mut lost, mut doubled, mut answered, mut unanswered, mut unreachable, mut cut) =
        (0, 0, 0, 0, 0, 0);
    for (n, (stderr, code)) in said.iter().enumerate() {
        assert_eq!(*code, Some(0), "{context}: sender {n}: {stderr}");
        let mine: Vec<&Value> = records
            .iter()
            .filter(|r| r["message"] == format!("sender {n}"))
            .collect();
        match mine.len() {
            0 => lost += 1,
            1 => {}
            _ => doubled += 1,
        }
        if stderr.contains("did not answer") {
            unanswered += 1;
            // The POST was recorded, but its answer never came: the daemon died between the
            // commit and the reply, and the spooled copy was found a duplicate.
            if mine
                .iter()
                .any(|r| r["source"].as_str().unwrap().starts_with("http:"))
            {
                cut += 1;
            }
        } else if stderr.contains("spooled") {
            unreachable += 1;
        } else if stderr.contains("accepted") {
            answered += 1;
        }
    }
    assert_eq!((lost, doubled), (0, 0), "{context}: lost, doubled");
    invariants::report(
        "1b-kill-loop-http",
        &[
            (
                "kill loop over HTTP: `cortex-signal` senders (answered 202 / no answer, spooled \
                 / shim down, spooled)",
                format!("{} ({answered} / {unanswered} / {unreachable})", said.len()),
            ),
            (
                "kill loop over HTTP: daemon killed between the commit and the reply (the spooled \
                 copy found a duplicate)",
                cut.to_string(),
            ),
            (
                "kill loop over HTTP: lost / recorded twice",
                format!("{lost} / {doubled}"),
            ),
        ],
    );
}

/// The checks themselves can fail: a home with a lost, a doubled and a torn file, and a wake
/// gone missing, is reported on every count.
#[test]
fn the_checks_catch_lost_doubled_and_torn_files_and_missing_wakes() {
    let env = Env::new();
    let (id, secret) = id_secret(&env.arm("t", &["--max-signals", "5"]));
    let mut dropped = Vec::new();
    for n in 0..3 {
        let name = format!("{n:03}");
        env.drop_file(&name, &body(&id, &secret, r#","status":"ok""#));
        dropped.push(Dropped {
            name: format!("{name}.json"),
            waitpoint: id.clone(),
        });
    }
    let d = env.daemon();
    env.wait_until("settled", || settled(&env));
    d.kill();
    let clean = invariants::check(&env, &dropped);
    clean.assert_kept("the untouched home");
    assert_eq!(clean.recorded, 3);

    let log = env.home.join("waitpoints").join(&id).join("signals.jsonl");
    let first = invariants::records_of(&env.home, &id).remove(0);
    let mut doubled = first.clone();
    doubled["seq"] = 4.into();
    let mut logged = std::fs::read_to_string(&log).unwrap();
    logged.push_str(&format!("{doubled}\n"));
    std::fs::write(&log, logged).unwrap();
    std::fs::write(
        env.home.join("waitpoints").join(&id).join("torn.json"),
        "{\"id\":",
    )
    .unwrap();
    dropped.push(Dropped {
        name: "never-recorded.json".into(),
        waitpoint: id.clone(),
    });
    let wake = env
        .home
        .join("sessions/default/wakes/new")
        .join(format!("wk_{}_0002.json", &id[3..]));
    std::fs::remove_file(wake).unwrap();
    let f = invariants::check(&env, &dropped);
    assert_eq!(f.lost.len(), 1, "{f:?}");
    assert_eq!(f.duplicates.len(), 1, "{f:?}");
    assert_eq!(f.torn.len(), 1, "{f:?}");
    assert!(
        !f.mismatches.is_empty(),
        "the counters no longer match: {f:?}"
    );
    assert!(
        !f.wake_errors.is_empty(),
        "a counted wake is missing: {f:?}"
    );
    let broken = std::panic::catch_unwind(|| f.assert_kept("fabricated"));
    assert!(broken.is_err(), "assert_kept fails on broken promises");
}
