//! The dependency rules ARCHITECTURE.md states, checked on the source: the pipeline's modules
//! form no cycle (ingress and front ends -> engine -> store), and the vocabulary they share is a
//! leaf.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The pipeline's modules, whose imports must form no cycle.
const PIPELINE: [&str; 9] = [
    "request", "engine", "ingress", "delivery", "store", "durable", "journal", "process", "signal",
];

fn rust_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if root.is_file() {
        out.push(root.to_owned());
    } else if let Ok(rd) = fs::read_dir(root) {
        for e in rd.flatten() {
            out.extend(rust_files(&e.path()));
        }
    }
    out.retain(|p| p.extension().is_some_and(|x| x == "rs"));
    out
}

/// The crate's top-level modules `module` refers to (`crate::<name>`), itself excluded.
fn imports_of(src: &Path, module: &str) -> BTreeSet<String> {
    let mut files = rust_files(&src.join(format!("{module}.rs")));
    files.extend(rust_files(&src.join(module)));
    let mut out = BTreeSet::new();
    for f in files {
        let text = fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != module && !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn the_pipeline_modules_import_each_other_without_a_cycle_and_the_vocabulary_is_a_leaf() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph: BTreeMap<&str, BTreeSet<String>> = PIPELINE
        .iter()
        .map(|m| {
            let deps = imports_of(&src, m)
                .into_iter()
                .filter(|d| PIPELINE.contains(&d.as_str()))
                .collect();
            (*m, deps)
        })
        .collect();
    // Depth-first search for a cycle, reporting the path.
    fn visit<'a>(
        m: &'a str,
        graph: &'a BTreeMap<&str, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(i) = path.iter().position(|p| *p == m) {
            panic!(
                "an import cycle: {}",
                [&path[i..], &[m]].concat().join(" -> ")
            );
        }
        if done.contains(m) {
            return;
        }
        path.push(m);
        for d in &graph[m] {
            visit(d.as_str(), graph, path, done);
        }
        path.pop();
        done.insert(m);
    }
    let mut done = BTreeSet::new();
    for m in PIPELINE {
        visit(m, &graph, &mut Vec::new(), &mut done);
    }
    // The engine reaches waitpoints through the store seam, never the journal or the files.
    assert!(
        !graph["engine"].contains("journal"),
        "engine imports the journal: {:?}",
        graph["engine"]
    );
    assert!(
        graph["request"].is_empty(),
        "request must be a leaf: {:?}",
        graph["request"]
    );
    assert!(
        !graph["engine"].contains("ingress"),
        "the engine never imports ingress"
    );
    // The rules for ids and names are applied by requests and by records read back alike, so
    // they depend on nothing.
    let names = imports_of(&src, "names");
    assert!(names.is_empty(), "names must be a leaf: {names:?}");
}

#[test]
fn unsafe_code_is_denied_everywhere_but_the_one_ffi_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap();
    assert!(
        lib.contains("#![deny(unsafe_code)]"),
        "lib.rs must deny unsafe code"
    );
    let allowed: Vec<PathBuf> = rust_files(&src)
        .into_iter()
        .filter(|f| {
            fs::read_to_string(f)
                .unwrap()
                .contains("#[allow(unsafe_code)]")
        })
        .collect();
    assert_eq!(
        allowed,
        [src.join("ingress/device/mod.rs")],
        "who allows unsafe code"
    );
    let ingress = fs::read_to_string(src.join("ingress/device/mod.rs")).unwrap();
    assert!(
        ingress.contains("#[allow(unsafe_code)]\nmod sftp_long;"),
        "only the libssh2 module may hold unsafe code"
    );
}

#[test]
fn no_cli_module_reaches_into_a_sibling() {
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cli");
    let siblings: Vec<String> = rust_files(&cli)
        .iter()
        .filter_map(|f| f.file_stem()?.to_str().map(str::to_owned))
        .filter(|m| m != "mod")
        .collect();
    for f in rust_files(&cli) {
        if f.ends_with("mod.rs") {
            continue;
        }
        let text = fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            if let Some(i) = line.find("super::") {
                let rest = &line[i + 7..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    !(siblings.contains(&name) && rest[name.len()..].starts_with("::")),
                    "{}:{}: reaches into the sibling `{name}`: {line}",
                    f.display(),
                    n + 1
                );
            }
        }
    }
}

#[test]
fn only_the_daemon_applies_batches_of_signals() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut callers = Vec::new();
    for f in rust_files(&src) {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        if rel.starts_with("engine/") || rel.starts_with("daemon/") {
            continue;
        }
        let text = fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains(".apply_batch(") || code.contains(".apply_signal(") {
                callers.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        callers.is_empty(),
        "signals applied outside the daemon: {callers:#?}"
    );
}
