//! `waitpoint import`: a copy that reads its source within limits, never changes it, keeps
//! every path it writes inside the destination home, and lets one bad record cost only its
//! own waitpoint or timer.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::helpers::*;

/// Every path under `root` with its kind, size and modification time, links not followed.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (String, u64, i64)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_owned()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let m = fs::symlink_metadata(e.path()).unwrap();
            let kind = format!("{:?}", m.file_type());
            if m.is_dir() {
                todo.push(e.path());
            }
            out.insert(
                e.path().strip_prefix(root).unwrap().to_owned(),
                (kind, m.len(), m.mtime_nsec() + m.mtime() * 1_000_000_000),
            );
        }
    }
    out
}

fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    f(&mut v);
    fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn import_refuses_ids_that_lead_outside_the_home_and_bad_records_one_by_one_and_never_changes_its_source()
 {
    let src = Env::new();
    let outside = src.home.parent().unwrap().to_owned();
    let precious = outside.join("precious");
    fs::create_dir_all(precious.join("keep")).unwrap();
    fs::write(precious.join("keep/data"), "mine").unwrap();

    let ids: Vec<String> = (0..6)
        .map(|i| id_secret(&src.arm(&format!("job{i}"), &[])).0)
        .collect();
    let wp_file = |id: &str| src.home.join("waitpoints").join(id).join("waitpoint.json");
    // An id that walks out of the home (the staging clean-up removed `precious` before).
    edit_json(&wp_file(&ids[0]), |v| {
        v["id"] = "y/../../../precious".into()
    });
    // A session that walks out (files were made outside the home before).
    edit_json(&wp_file(&ids[1]), |v| {
        v["session"] = "../../../outside-sess".into()
    });
    // A record far over the cap, sparse (import took 624 MB of memory for one before).
    let signals = src.home.join("waitpoints").join(&ids[2]).join("signals");
    fs::create_dir_all(&signals).unwrap();
    fs::File::create(signals.join("000001-key%3Abig.json"))
        .unwrap()
        .set_len(600 << 20)
        .unwrap();
    // A truncated state among the rest (the import stopped at it on every retry before).
    let bytes = fs::read(wp_file(&ids[3])).unwrap();
    fs::write(wp_file(&ids[3]), &bytes[..bytes.len() / 2]).unwrap();
    // A timer owned by an agent whose name walks out (its wakes were written outside before).
    for agent in ["s1", "s2"] {
        let create = [
            "timer",
            "create",
            "--after-ms",
            "3600000",
            "--session",
            agent,
        ];
        src.ok("timer create", &src.waitpoint(&create));
    }
    let mut timers: Vec<PathBuf> = fs::read_dir(src.home.join("timers"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("tm_") && name.ends_with(".json")
        })
        .collect();
    timers.sort();
    assert_eq!(timers.len(), 2, "{}", src.tree());
    edit_json(&timers[0], |v| v["agent_id"] = "../../timer-outside".into());
    let before = snapshot(&src.home);

    let dst = Env::new();
    let out = dst.waitpoint(&["import", src.home.to_str().unwrap()]);
    let said = dst.expect_code("import with refusals", &out, 1);

    assert!(
        said.contains("imported 2 waitpoints (0 signal records) and 1 timers"),
        "{said}"
    );
    // Four waitpoints and the timer whose agent walks out.
    assert!(said.contains("; 0 skipped, 5 refused"), "{said}");
    let timer_id = timers[0]
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(said.contains(&format!("refused {timer_id}: ")), "{said}");
    for id in &ids[..4] {
        assert!(said.contains(&format!("refused {id}: ")), "{id}: {said}");
    }
    assert!(said.contains("more than a record may be"), "{said}");
    assert!(said.contains("does not parse"), "{said}");
    for id in &ids[4..] {
        assert!(
            dst.home
                .join("waitpoints")
                .join(id)
                .join("waitpoint.json")
                .is_file(),
            "{id} was not imported: {said}\n{}",
            dst.tree()
        );
    }
    for id in &ids[..4] {
        assert!(
            !dst.home.join("waitpoints").join(id).exists(),
            "{id} was imported: {said}"
        );
    }
    assert_eq!(
        fs::read_to_string(precious.join("keep/data")).unwrap(),
        "mine",
        "a directory outside the home was touched"
    );
    for place in [&outside, &dst.home.parent().unwrap().to_owned()] {
        for name in ["outside-sess", "timer-outside"] {
            assert!(
                !place.join(name).exists(),
                "{} made",
                place.join(name).display()
            );
        }
    }
    assert_eq!(
        snapshot(&src.home),
        before,
        "the source home changed: {said}"
    );
    crate::invariants::report(
        "trust-import",
        &[(
            "trust: import of a home with traversal ids and names, a 600 MB sparse record, a torn \
             state: waitpoints refused / imported / source paths changed / paths outside touched",
            "4 / 2 / 0 / 0".into(),
        )],
    );

    // The daemon on the destination finds nothing to set aside: what was imported is whole.
    let _d = dst.daemon();
    let check = dst.waitpoint(&["doctor"]);
    let doc = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(!doc.contains("quarantine"), "{doc}");
}

#[test]
fn a_record_with_an_id_that_leads_outside_is_set_aside_when_listed_not_followed() {
    // The same rules hold for the home's own records: a state rewritten by hand to name
    // `../..` does not parse and is set aside, so the daemon never builds a path from it.
    let env = Env::new();
    let id = id_secret(&env.arm("job", &[])).0;
    let file = env.home.join("waitpoints").join(&id).join("waitpoint.json");
    edit_json(&file, |v| v["channel"] = "../../escape".into());
    let out = env.waitpoint(&["check", "--json"]);
    let listed = env.ok("check", &out);
    assert!(!listed.contains(&id), "{listed}");
    let parked: Vec<String> = fs::read_dir(env.home.join("quarantine"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        parked
            .iter()
            .any(|n| n.contains(&id) && n.ends_with(".reason")),
        "{parked:?}\n{}",
        env.tree()
    );
    let reason = fs::read_to_string(
        env.home
            .join("quarantine")
            .join(parked.iter().find(|n| n.ends_with(".reason")).unwrap()),
    )
    .unwrap();
    assert!(reason.contains("is not a valid name"), "{reason}");
    assert!(!env.home.parent().unwrap().join("escape").exists());
}
