//! Links in the home: a directory of the home swapped for a symbolic link (before a command
//! runs, or while the daemon runs) is never followed. Nothing is written, moved or removed
//! outside the home; the link is set aside into `quarantine/` with a reason and the work goes
//! on in a real directory, or, where even that cannot be done, the command is refused.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::helpers::*;

/// A directory outside the home, and a check that nothing ever arrived there.
struct Outside(PathBuf);

impl Outside {
    fn new(env: &Env, name: &str) -> Self {
        let dir = env.home.parent().unwrap().join(name);
        fs::create_dir_all(&dir).unwrap();
        Outside(dir)
    }

    fn assert_untouched(&self, env: &Env, what: &str) {
        let names: Vec<String> = fs::read_dir(&self.0)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.is_empty(),
            "{what}: {} received {names:?}\n{}",
            self.0.display(),
            env.tree()
        );
    }
}

/// Replaces the directory (or file) `rel` of the home by a link to `to` (made when missing
/// first).
fn swap_for_link(env: &Env, rel: &str, to: &Path) {
    let path = env.home.join(rel);
    if path.is_dir() {
        fs::remove_dir_all(&path).unwrap();
    } else if path.exists() {
        fs::remove_file(&path).unwrap();
    } else {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
    }
    symlink(to, &path).unwrap();
}

#[test]
fn paths_swapped_for_links_while_the_daemon_runs_receive_nothing_and_are_set_aside() {
    let env = Env::new();
    let signals_out = Outside::new(&env, "signals-out");
    let inbox_out = Outside::new(&env, "inbox-out");
    let index_out = Outside::new(&env, "index-out");
    let (id, secret) = id_secret(&env.arm("job", &["--session", "s"]));
    let _d = env.daemon();
    // The record log, a file, swapped for a link to a file outside that does not exist yet:
    // an append through it would create it there.
    swap_for_link(
        &env,
        &format!("waitpoints/{id}/signals.jsonl"),
        &signals_out.0.join("victim.jsonl"),
    );
    swap_for_link(&env, "sessions/s/wakes/new", &inbox_out.0);
    swap_for_link(&env, "index/sessions/s", &index_out.0);

    // A second waitpoint of the session writes its index marker; the signal writes a record
    // and a wake.
    let second = id_secret(&env.arm("second", &["--session", "s"])).0;
    env.drop_file("done", &body(&id, &secret, ""));
    env.wait_until("the wake in the real inbox", || {
        !env.inbox("s", "new").is_empty()
    });

    signals_out.assert_untouched(&env, "the signal record");
    inbox_out.assert_untouched(&env, "the wake");
    index_out.assert_untouched(&env, "the index marker");
    let log = fs::symlink_metadata(env.home.join(format!("waitpoints/{id}/signals.jsonl")));
    assert!(
        log.is_ok_and(|m| m.is_file()),
        "the log is a real file again\n{}",
        env.tree()
    );
    for rel in ["sessions/s/wakes/new".to_owned(), "index/sessions/s".into()] {
        let m = fs::symlink_metadata(env.home.join(&rel)).unwrap();
        assert!(
            m.is_dir(),
            "{rel} is a real directory again\n{}",
            env.tree()
        );
    }
    assert_eq!(
        crate::invariants::records_of(&env.home, &id).len(),
        1,
        "the record is in the home\n{}",
        env.tree()
    );
    assert!(
        env.home.join(format!("index/sessions/s/{second}")).exists(),
        "the marker is in the home\n{}",
        env.tree()
    );
    let reasons = env.quarantined_reasons();
    let aside = reasons
        .iter()
        .filter(|r| r.contains("is a symbolic link where the home has a directory"))
        .count();
    assert_eq!(aside, 2, "{reasons:?}");
    let log_aside = reasons
        .iter()
        .filter(|r| r.contains("is not a regular file where the home keeps"))
        .count();
    assert_eq!(log_aside, 1, "{reasons:?}");
    let aside = aside + log_aside;
    crate::invariants::report(
        "trust-links",
        &[(
            "trust: waitpoints/<id>/signals.jsonl, sessions/<s>/wakes/new, index/sessions/<s> \
             swapped \
             for links while running: files outside the home / links set aside with a reason",
            format!("0 / {aside}"),
        )],
    );
}

#[test]
fn a_linked_quarantine_or_inbox_moves_nothing_out_of_the_home() {
    let env = Env::new();
    let cur_out = Outside::new(&env, "cur-out");
    let quarantine_out = Outside::new(&env, "quarantine-out");
    env.timer_now("s", "ring");
    {
        let _d = env.daemon();
        env.wait_until("the timer's wake", || !env.inbox("s", "new").is_empty());
    }
    // `next` moves the wake to `cur/`: a link there is set aside, the wake stays home.
    swap_for_link(&env, "sessions/s/wakes/cur", &cur_out.0);
    let next = env.waitpoint(&["next", "--session", "s", "--timeout", "0"]);
    env.ok("next", &next);
    cur_out.assert_untouched(&env, "next");
    assert_eq!(env.inbox("s", "cur").len(), 1, "{}", env.tree());

    // A record that does not parse would be set aside into a quarantine that is a link: it
    // stays where it is, skipped, and nothing moves out of the home.
    swap_for_link(&env, "quarantine", &quarantine_out.0);
    fs::write(env.home.join("timers/tm_00000000abcd.json"), "{ torn").unwrap();
    let list = env.waitpoint(&["timer", "list", "--session", "s", "--json"]);
    env.ok("timer list", &list);
    quarantine_out.assert_untouched(&env, "timer list");
    assert!(env.home.join("timers/tm_00000000abcd.json").exists());
    let dst = Env::new();
    let out = dst.waitpoint(&["import", env.home.to_str().unwrap()]);
    dst.expect_code("import of a home with a torn timer", &out, 1);
    quarantine_out.assert_untouched(&env, "import");
}

#[test]
fn a_spare_planted_as_a_link_or_a_hard_link_is_set_aside_and_nothing_outside_is_written() {
    let env = Env::new();
    let outside = Outside::new(&env, "spare-out");
    let precious = b"precious\n";
    let (by_link, by_hard_link) = (outside.0.join("by-link"), outside.0.join("by-hard-link"));
    fs::write(&by_link, precious).unwrap();
    fs::write(&by_hard_link, precious).unwrap();
    let spare = waitpoint::durable::spare_name("waitpoint.json");
    let spare_of = |id: &str| env.home.join("waitpoints").join(id).join(&spare);
    let a = id_secret(&env.arm("a", &["--session", "s"]));
    let b = id_secret(&env.arm("b", &["--session", "s"]));
    fs::remove_file(spare_of(&a.0)).unwrap();
    symlink(&by_link, spare_of(&a.0)).unwrap();
    fs::remove_file(spare_of(&b.0)).unwrap();
    fs::hard_link(&by_hard_link, spare_of(&b.0)).unwrap();
    // Rested, so the state's rewrite would go over the spare if it were usable.
    std::thread::sleep(waitpoint::durable::SPARE_REST);

    let _d = env.daemon();
    for (name, (id, secret)) in [("a", &a), ("b", &b)] {
        env.drop_file(name, &body(id, secret, r#","status":"ok""#));
    }
    env.wait_until("both signals counted", || {
        [&a, &b]
            .iter()
            .all(|(id, _)| env.state(id)["counters"]["signals"] == 1)
    });

    for file in [&by_link, &by_hard_link] {
        assert_eq!(
            fs::read(file).unwrap(),
            precious,
            "{} was written through a spare\n{}",
            file.display(),
            env.tree()
        );
    }
    use std::os::unix::fs::MetadataExt;
    for id in [&a.0, &b.0] {
        let m = fs::symlink_metadata(spare_of(id)).unwrap();
        assert!(
            m.is_file() && m.nlink() == 1,
            "the old state is the spare now\n{}",
            env.tree()
        );
    }
    let reasons = env.quarantined_reasons();
    assert!(
        reasons.iter().any(|r| r.contains("is not a regular file"))
            && reasons.iter().any(|r| r.contains("with one link")),
        "{reasons:?}"
    );
}

#[test]
fn a_daemon_log_planted_as_a_link_is_set_aside_and_the_file_it_names_gets_no_line() {
    let env = Env::new();
    let outside = Outside::new(&env, "log-out");
    let target = outside.0.join("victim.log");
    fs::write(&target, "").unwrap();
    fs::create_dir_all(env.home.join("log")).unwrap();
    symlink(&target, env.home.join("log/daemon.log")).unwrap();
    {
        let _d = env.daemon();
        env.wait_until("the daemon's log", || {
            fs::read_to_string(env.home.join("log/daemon.log"))
                .is_ok_and(|log| log.contains("daemon starting"))
        });
    }
    assert_eq!(
        fs::read_to_string(&target).unwrap(),
        "",
        "nothing was written through the link\n{}",
        env.tree()
    );
    let log = fs::symlink_metadata(env.home.join("log/daemon.log")).unwrap();
    assert!(log.is_file(), "a real log was made\n{}", env.tree());
    env.assert_set_aside_as_not_regular("log/daemon.log", "the planted log");
}
