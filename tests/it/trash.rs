//! The trash (`tmp/trash/`): a daemon frees nothing while it commits a batch. A replaced state's
//! old file is moved there (same inode, so no block is freed) and a reaper thread removes it
//! moments later; a daemon that died leaves them to the next start. A consumed spool file is
//! removed where it is consumed, once its batch is committed: one unlink in the drop zone costs
//! less than a rename across two directories and a wake of the reaper. In the daemon that
//! removal happens behind the batch, on the reaper's thread, and a sweep waits for it.

use std::fs;
use std::os::unix::fs::MetadataExt;

use waitpoint::durable::Reaper;
use waitpoint::engine::Engine;
use waitpoint::ingress::spool::{FileOutcome, Spool};

use crate::helpers::*;

fn monitor(e: &Engine) -> (String, String) {
    Arming::new("trash").max_signals(10).no_fail_fast().on(e)
}

fn inodes(env: &Env) -> Vec<u64> {
    let mut v: Vec<u64> = env
        .trashed()
        .iter()
        .map(|p| fs::metadata(p).unwrap().ino())
        .collect();
    v.sort();
    v
}

#[test]
fn a_batch_moves_the_old_state_to_the_trash_and_the_consumed_file_there_only_on_a_discard_mount() {
    let env = Env::new();
    let e = env.engine();
    e.open_trash().unwrap();
    let (id, secret) = monitor(&e);
    let state = env.home.join(format!("waitpoints/{id}/waitpoint.json"));
    let old_state = fs::metadata(&state).unwrap().ino();
    env.drop_file("job", &body(&id, &secret, r#","status":"progress""#));
    let spool_file = fs::metadata(env.drop_zone().join("job.json"))
        .unwrap()
        .ino();

    let spool = Spool::new(&waitpoint::home::Home::new(&env.home));
    let outcome = waitpoint::daemon::collect_file(&spool, &e, "job.json").unwrap();
    assert!(matches!(outcome, FileOutcome::Consumed(_)), "{outcome:?}");

    assert!(
        env.spooled().is_empty(),
        "the consumed file left the drop zone"
    );
    // No reaper runs yet, so whatever the batch put in the trash is still there. The consumed
    // file is there too only where freeing it would wait for the device (a `discard` mount,
    // as this machine's root may be); elsewhere it was unlinked in place.
    let mut expected = vec![old_state];
    if waitpoint::durable::frees_wait_for_device(&env.home) {
        expected.push(spool_file);
    }
    expected.sort();
    assert_eq!(
        inodes(&env),
        expected,
        "the trash holds the old state, and the consumed file (inode {spool_file}) only on a \
         discard mount"
    );
    assert_eq!(
        env.state(&id)["counters"]["signals"],
        1,
        "the new state is in place"
    );

    // The reaper empties what is there as soon as it starts, and whatever arrives later.
    let reaper = Reaper::start(e.open_trash().unwrap());
    env.wait_trash_emptied();
    env.drop_file("again", &body(&id, &secret, r#","status":"progress""#));
    waitpoint::daemon::collect_file(&spool, &e, "again.json").unwrap();
    env.wait_trash_emptied();
    drop(reaper);
    assert_eq!(env.state(&id)["counters"]["signals"], 2);
}

#[test]
fn without_a_trash_a_command_frees_files_in_place() {
    // `device poll` applies signals with no daemon, hence no reaper: nothing may pile up.
    let env = Env::new();
    let e = env.engine();
    let (id, secret) = monitor(&e);
    env.drop_file("job", &body(&id, &secret, ""));
    let spool = Spool::new(&waitpoint::home::Home::new(&env.home));
    let outcome = waitpoint::daemon::collect_file(&spool, &e, "job.json").unwrap();
    assert!(matches!(outcome, FileOutcome::Consumed(_)), "{outcome:?}");
    assert!(env.spooled().is_empty());
    assert!(env.trashed().is_empty(), "{:?}", env.trashed());
}

#[test]
fn the_daemon_empties_a_trash_left_by_a_dead_daemon_and_what_its_own_batches_put_there() {
    let env = Env::new();
    env.write(
        "tmp/trash/00000000000000aa",
        b"{\"secret\":\"left by a crash\"}",
    );
    env.write("tmp/trash/00000000000000ab", b"");
    let reply = env.arm("m", &["--max-signals", "50"]);
    let (id, secret) = id_secret(&reply);
    let _d = env.daemon_with_env(&[("RUST_LOG", "debug")]);
    env.wait_trash_emptied();
    let log = env.home.join("log/daemon.log");
    let emptied = || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("emptied the trash"))
            .count()
    };
    env.wait_until("the leftovers' emptying to be logged", || emptied() >= 1);
    let before = emptied();
    // One signal a batch: a state rewritten again before its spare has rested is a new file,
    // and the old one goes to the trash. A few batches are enough; the bound is the arming's.
    let mut sent = 0;
    while emptied() == before {
        assert!(sent < 50, "50 batches and no emptying of the trash logged");
        env.drop_file(
            &format!("s{sent:02}"),
            &body(&id, &secret, r#","status":"progress""#),
        );
        sent += 1;
        env.wait_until("the signal recorded", || {
            env.state(&id)["counters"]["signals"] == sent
        });
    }
    // The batches' replaced states went through the trash, and left it.
    env.wait_trash_emptied();
}

#[test]
fn the_daemon_removes_consumed_files_behind_its_batches_and_a_sweep_never_collects_them_again() {
    // tmpfs: freeing waits for no device, so the removals go behind the batches (on this
    // machine's discard mount they go to the trash instead). A sweep every 20 ms meets
    // batches whose removals are still queued: it must wait for them, not read the files
    // again as duplicates.
    let env = Env::on_tmpfs(r#"{"waitpointSweepMs": 20}"#);
    let e = env.engine();
    let armed: Vec<(String, String)> = (0..5)
        .map(|_| {
            Arming::new("behind")
                .max_signals(1_000)
                .no_fail_fast()
                .on(&e)
        })
        .collect();
    let _d = env.daemon();
    for round in 0..400 {
        for (i, (id, secret)) in armed.iter().enumerate() {
            let progress = r#","status":"progress""#;
            env.drop_file(&format!("r{round:03}-{i}"), &body(id, secret, progress));
        }
    }
    env.wait_until("every signal counted and the drop zone drained", || {
        env.spooled().is_empty()
            && armed
                .iter()
                .all(|(id, _)| env.state(id)["counters"]["signals"] == 400)
    });
    let log = env.daemon_log_tail(usize::MAX);
    let again: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("duplicate signal"))
        .collect();
    assert!(again.is_empty(), "collected again: {again:#?}");
    assert_eq!(log.matches("signal accepted").count(), 2_000);
}
