//! Snapshots of the human output of `check` and `show` with a fixed clock, so a change to what
//! an operator reads is a reviewed change. Ids, secrets' traces and times are made stable.

use std::sync::Arc;

use waitpoint::clock::{Clock, ManualClock};
use waitpoint::engine::{Engine, Quorum};
use waitpoint::home::Home;
use waitpoint::ingress::parse_signal;
use waitpoint::operator_view::{self, Style};
use waitpoint::request::Source;
use waitpoint::settings::Settings;

use crate::helpers::*;

/// The intent every waitpoint of these snapshots carries.
const INTENT: &str = "the 33k-step run; when it lands, compare the loss curve against the baseline";

fn setup() -> (Env, Engine, Arc<ManualClock>) {
    let env = Env::new();
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::new(Home::new(&env.home), Settings::default(), clock.clone());
    (env, engine, clock)
}

fn signal(engine: &Engine, id: &str, secret: &str, name: &str, extra: &str) {
    let text = body(id, secret, extra);
    engine
        .apply_signal(
            &parse_signal(text.as_bytes()).unwrap(),
            &Source::Spool(name.into()),
        )
        .unwrap();
}

fn stable(text: &str, ids: &[&str]) -> String {
    let mut t = text.to_owned();
    for (n, id) in ids.iter().enumerate() {
        t = t.replace(&id[3..], &format!("{:012}", n + 1));
    }
    t
}

#[test]
fn check_table_with_badges() {
    let (env, engine, clock) = setup();
    let (a, asec) = Arming::new("T2 ladder")
        .intent(INTENT)
        .members(&["arm2", "arm6", "arm8"])
        .quorum(Quorum::All)
        .expires_in_hours(3.0)
        .on(&engine);
    clock.advance_ms(1_000);
    let (b, bsec) = Arming::new("nightly monitor")
        .intent(INTENT)
        .max_signals(24)
        .expires_in_hours(3.0)
        .on(&engine);
    clock.advance_ms(60_000);
    signal(
        &engine,
        &a,
        &asec,
        "a1.json",
        r#","member":"arm2","status":"ok""#,
    );
    signal(
        &engine,
        &b,
        &bsec,
        "b1.json",
        r#","status":"fail","message":"loss is NaN""#,
    );
    clock.advance_ms(30 * 60_000);
    let home = Home::new(&env.home);
    let items = engine.list().unwrap();
    let rows = operator_view::check_items(&home, &items, &[], 12, clock.now());
    let table = operator_view::check_table("default", &rows, Style { color: false });
    insta::assert_snapshot!(stable(&table, &[&a, &b]));
    insta::assert_snapshot!("check_brief", operator_view::check_brief(&rows));
}

#[test]
fn show_with_members_and_signals() {
    let (env, engine, clock) = setup();
    let (a, asec) = Arming::new("T2 ladder")
        .intent(INTENT)
        .members(&["arm2", "arm6"])
        .quorum(Quorum::All)
        .expires_in_hours(3.0)
        .on(&engine);
    clock.advance_ms(5 * 60_000);
    signal(
        &engine,
        &a,
        &asec,
        "p1.json",
        r#","member":"arm6","status":"progress","message":"step 12000""#,
    );
    clock.advance_ms(5 * 60_000);
    signal(
        &engine,
        &a,
        &asec,
        "a1.json",
        r#","member":"arm2","status":"ok","message":"exit=0""#,
    );
    let wp = engine.load(&a).unwrap().unwrap();
    let signals = engine.read_signals(&a, 1).unwrap();
    let home = Home::new(&env.home);
    let badges = operator_view::badges(&home, &wp, 12, clock.now());
    let text = operator_view::show_text(&wp, &signals, &badges, clock.now());
    insta::assert_snapshot!(stable(&text, &[&a]));
}
