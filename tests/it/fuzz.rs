//! Property-based fuzzing of the parse and validate path every route shares
//! (`ingress::parse_signal`) and of the drop zone's read path (`Spool::collect`): random bytes
//! and near-valid signals never panic, what is accepted obeys every cap, refusals never echo the
//! secret, and allocation stays bounded however large the input (a counting allocator measures
//! it). `PROPTEST_CASES` sets the parse cases (100,000 in the full run), and
//! `WAITPOINT_SPOOL_FUZZ_CASES` the spool cases (each is a real file and real commits).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fs;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use waitpoint::clock::SystemClock;
use waitpoint::engine::{CreateRequest, Engine};
use waitpoint::home::Home;
use waitpoint::ingress::spool::{FileOutcome, Spool};
use waitpoint::ingress::{data_chars, parse_signal};
use waitpoint::request::{MAX_BODY_BYTES, MAX_DATA_CHARS, MAX_MEMBER_CHARS, MAX_MESSAGE_CHARS};
use waitpoint::settings::Settings;

use crate::invariants::{self, knob};

/// Counts the bytes this thread has allocated and not freed, and the peak, while metering.
struct Meter;

thread_local! {
    // (metering, live bytes, peak bytes). Const-initialised and without a destructor, so the
    // allocator can use it without allocating itself.
    static METER: Cell<(bool, usize, usize)> = const { Cell::new((false, 0, 0)) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the meter only counts.
unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let _ = METER.try_with(|m| {
                let (on, live, peak) = m.get();
                if on {
                    let live = live + layout.size();
                    m.set((on, live, peak.max(live)));
                }
            });
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        let _ = METER.try_with(|m| {
            let (on, live, peak) = m.get();
            if on {
                m.set((on, live.saturating_sub(layout.size()), peak));
            }
        });
    }
}

#[global_allocator]
static METERED: Meter = Meter;

/// Runs `f` and returns its result and the peak bytes it held allocated at once.
fn metered<T>(f: impl FnOnce() -> T) -> (T, usize) {
    METER.with(|m| m.set((true, 0, 0)));
    let out = f();
    let peak = METER.with(|m| {
        let (_, _, peak) = m.get();
        m.set((false, 0, 0));
        peak
    });
    (out, peak)
}

const ID: &str = "wp_0123456789ab";
const SECRET: &str = "S3CRET-9f8e7d6c5b4a39281706f5e4d3c2b1a0";

/// Any JSON value, nested a little.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        (0usize..20_000).prop_map(|n| Value::from("d".repeat(n))),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::btree_map(".{0,10}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn sometimes<S: Strategy<Value = Value>>(p: f64, s: S) -> impl Strategy<Value = Option<Value>> {
    prop::option::weighted(p, s)
}

/// A signal body that is valid, or nearly: every field drawn from good and bad values.
fn near_signal() -> impl Strategy<Value = Vec<u8>> {
    let id = prop_oneof![
        12 => Just(Value::from(ID)),
        1 => "wp_[0-9a-fA-F]{10,14}".prop_map(Value::from),
        1 => ".{0,30}".prop_map(Value::from),
        1 => any_json(),
    ];
    let secret = prop_oneof![
        12 => Just(Value::from(SECRET)),
        1 => Just(Value::from("")),
        1 => any_json(),
    ];
    let status = prop_oneof![
        3 => Just(Value::from("ok")),
        3 => Just(Value::from("fail")),
        3 => Just(Value::from("progress")),
        1 => Just(Value::from("OK")),
        1 => any_json(),
    ];
    let text = |max: usize| {
        prop_oneof![
            6 => ".{0,60}".prop_map(Value::from),
            1 => (max - 2..max + 3).prop_map(|n| Value::from("m".repeat(n))),
            1 => any_json(),
        ]
    };
    let extra_key = prop::option::weighted(0.05, "[a-z]{1,8}");
    (
        sometimes(0.97, id),
        sometimes(0.97, secret),
        sometimes(0.7, status),
        sometimes(0.5, text(MAX_MESSAGE_CHARS)),
        sometimes(0.2, text(MAX_MEMBER_CHARS)),
        sometimes(0.5, any_json()),
        extra_key,
        any::<bool>(),
    )
        .prop_map(
            |(id, secret, status, message, member, data, extra, pretty)| {
                let mut obj = serde_json::Map::new();
                for (k, v) in [
                    ("id", id),
                    ("secret", secret),
                    ("status", status),
                    ("message", message),
                    ("member", member),
                    ("data", data),
                ] {
                    if let Some(v) = v {
                        obj.insert(k.into(), v);
                    }
                }
                if let Some(k) = extra {
                    obj.insert(k, json!(1));
                }
                let v = Value::Object(obj);
                if pretty {
                    serde_json::to_vec_pretty(&v).unwrap()
                } else {
                    serde_json::to_vec(&v).unwrap()
                }
            },
        )
}

/// Random bytes, near-valid signals, and near-valid signals with bytes flipped or cut.
fn any_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        near_signal(),
        (near_signal(), any::<usize>(), any::<u8>()).prop_map(|(mut b, at, byte)| {
            if !b.is_empty() {
                let i = at % b.len();
                b[i] = byte;
            }
            b
        }),
        (near_signal(), any::<usize>()).prop_map(|(mut b, at)| {
            b.truncate(at % (b.len() + 1));
            b
        }),
        (near_signal(), 0usize..100_000).prop_map(|(mut b, pad)| {
            // Whitespace padding around the cap: same body, more bytes.
            b.splice(0..0, std::iter::repeat_n(b' ', pad));
            b
        }),
    ]
}

/// Checks one parse: what is accepted obeys every rule, a refusal never echoes the secret, and
/// the parse held at most a bounded amount of memory.
fn check_parse(input: &[u8]) -> Result<(), TestCaseError> {
    let (result, peak) = metered(|| parse_signal(input));
    // The parser's working set is a constant factor of what it may read; past the cap it reads
    // nothing at all.
    let bound = 64 * input.len().min(MAX_BODY_BYTES) + 64 * 1024;
    prop_assert!(
        peak <= bound,
        "{peak} bytes held for a {}-byte input",
        input.len()
    );
    if input.len() > MAX_BODY_BYTES {
        prop_assert!(
            peak < 4096,
            "an oversized body is refused before parsing ({peak} bytes)"
        );
    }
    match result {
        Ok(r) => {
            prop_assert!(input.len() <= MAX_BODY_BYTES);
            prop_assert!(waitpoint::names::is_waitpoint_id(&r.id));
            prop_assert!(!r.secret.is_empty());
            if let Some(m) = &r.message {
                prop_assert!(m.chars().count() <= MAX_MESSAGE_CHARS);
            }
            if let Some(m) = &r.member {
                prop_assert!(!m.is_empty() && m.chars().count() <= MAX_MEMBER_CHARS);
                prop_assert!(!m.chars().any(char::is_control));
            }
            if let Some(d) = &r.data {
                prop_assert!(data_chars(d) <= MAX_DATA_CHARS);
                prop_assert!(!d.is_null());
            }
        }
        Err(reason) => {
            prop_assert!(!reason.is_empty());
            prop_assert!(
                !reason.contains(SECRET),
                "the reason echoes the secret: {reason}"
            );
        }
    }
    Ok(())
}

#[test]
fn parsing_any_input_never_panics_obeys_the_caps_and_allocates_a_bounded_amount() {
    // The meter sees this thread's allocations (or the bound below would prove nothing).
    let ((), peak) = metered(|| drop(std::hint::black_box(vec![0u8; 10_000])));
    assert!(peak >= 10_000, "the allocation meter counts ({peak})");
    let cases = knob("PROPTEST_CASES", 2_000) as u32;
    let run = AtomicUsize::new(0);
    let accepted = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&any_input(), |input| {
            run.fetch_add(1, Ordering::Relaxed);
            if parse_signal(&input).is_ok() {
                accepted.fetch_add(1, Ordering::Relaxed);
            }
            check_parse(&input)
        })
        .unwrap();
    // A 10 MB body too: refused by size, never parsed.
    check_parse(&vec![b'{'; 10 * 1024 * 1024]).unwrap();
    let run = run.load(Ordering::Relaxed);
    let accepted = accepted.load(Ordering::Relaxed);
    assert!(
        accepted > 0 && accepted < run,
        "the generator reaches both outcomes"
    );
    invariants::report(
        "5-fuzz-parse",
        &[(
            "fuzz: parse/validate cases (no panic, caps held, allocation bounded)",
            format!("{run} ({accepted} well-formed)"),
        )],
    );
}

#[test]
fn the_drop_zone_read_path_takes_any_file_without_panicking_or_losing_it() {
    let cases = knob("WAITPOINT_SPOOL_FUZZ_CASES", 48) as u32;
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path().join("home"));
    home.ensure().unwrap();
    let engine = Engine::new(home.clone(), Settings::default(), Arc::new(SystemClock));
    let created = engine
        .create(CreateRequest {
            fail_fast: false,
            max_signals: 10_000,
            ..CreateRequest::new("fuzz", "i", "default")
        })
        .unwrap();
    let (id, secret) = (created.waitpoint.id, created.secret);
    let spool = Spool::new(&home);
    let n = AtomicUsize::new(0);
    let consumed = AtomicUsize::new(0);
    let parked = AtomicUsize::new(0);
    // Aim the near-valid bodies at the real waitpoint, so some are accepted.
    let input = any_input().prop_map(|b| {
        String::from_utf8(b.clone())
            .map(|s| s.replace(ID, &id).replace(SECRET, &secret).into_bytes())
            .unwrap_or(b)
    });
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&input, |bytes| {
            let name = format!("{:06}.json", n.fetch_add(1, Ordering::Relaxed));
            let path = home.drop_zone().join(&name);
            fs::write(&path, &bytes).unwrap();
            // Old enough that an unparseable file is parked now rather than deferred.
            let old = SystemTime::now() - Duration::from_secs(3600);
            fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(old)
                .unwrap();
            let outcome = waitpoint::daemon::collect_file(&spool, &engine, &name);
            prop_assert!(outcome.is_ok(), "{outcome:?}");
            match outcome.unwrap() {
                FileOutcome::Consumed(_) => consumed.fetch_add(1, Ordering::Relaxed),
                FileOutcome::Parked(_) => {
                    let stem = name.trim_end_matches(".json");
                    let reason = spool.bad.join(format!("{stem}.reason"));
                    let copy = spool.bad.join(format!("{stem}.json"));
                    prop_assert!(reason.exists() && copy.exists(), "{name} parked");
                    parked.fetch_add(1, Ordering::Relaxed)
                }
                other => return Err(TestCaseError::fail(format!("{other:?}"))),
            };
            prop_assert!(!path.exists(), "the file left the spool");
            Ok(())
        })
        .unwrap();
    let (n, consumed, parked) = (
        n.load(Ordering::Relaxed),
        consumed.load(Ordering::Relaxed),
        parked.load(Ordering::Relaxed),
    );
    let state = engine.load(&id).unwrap().unwrap();
    assert_eq!(
        state.counters.signals as usize, consumed,
        "every consumed file was counted once"
    );
    invariants::report(
        "5-fuzz-spool",
        &[(
            "fuzz: drop-zone files (real files, real commits; none lost, none panicked)",
            format!("{n} ({consumed} recorded, {parked} parked)"),
        )],
    );
}
