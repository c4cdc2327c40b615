//! The dependency rules ARCHITECTURE.md states, checked on the source: every module's imports
//! against one layer table (front ends and ingress -> engine -> store -> durable files), the
//! ingress routes apart, unsafe code in one module, the CLI's command files apart, and signals
//! applied only by the daemon.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Every module of the crate and the modules it imports (`crate::<name>`, comments aside), in
/// layers from the bottom up: front ends and ingress -> engine -> store -> durable files. This
/// table is the drawing in ARCHITECTURE.md; the test below fails when the code has an edge the
/// table lacks, when the table keeps an edge the code no longer has, and when a row names a
/// module of a later row (an edge upwards, or a cycle).
const LAYERS: &[(&str, &[&str])] = &[
    // Leaves: the vocabulary and the tools every layer shares.
    ("error", &[]),
    ("names", &[]),
    ("escape", &[]),
    ("secret", &[]),
    ("sync", &[]),
    ("failpoint", &["error"]),
    ("clock", &["sync"]),
    ("records", &["clock", "names"]),
    (
        "request",
        &["error", "escape", "names", "records", "secret"],
    ),
    ("howto", &["records"]),
    ("process", &["secret"]),
    // Durable files: atomic commits, the home's layout, the journal, the inboxes, settings.
    (
        "durable",
        &["clock", "error", "failpoint", "process", "sync"],
    ),
    ("home", &["durable", "error"]),
    ("journal", &["durable", "error", "failpoint", "sync"]),
    (
        "delivery",
        &[
            "clock", "durable", "error", "home", "names", "process", "records", "secret",
        ],
    ),
    ("settings", &["error"]),
    // The seam: where waitpoints live.
    (
        "store",
        &[
            "clock",
            "delivery",
            "durable",
            "error",
            "failpoint",
            "home",
            "journal",
            "names",
            "records",
            "request",
            "secret",
            "settings",
            "sync",
        ],
    ),
    // The engine: every decision about a waitpoint.
    (
        "engine",
        &[
            "clock",
            "durable",
            "error",
            "escape",
            "failpoint",
            "home",
            "howto",
            "names",
            "records",
            "request",
            "secret",
            "settings",
            "store",
            "sync",
        ],
    ),
    // Ingress and the sending side.
    (
        "ingress",
        &[
            "clock",
            "durable",
            "engine",
            "error",
            "failpoint",
            "home",
            "names",
            "records",
            "request",
            "secret",
            "sync",
        ],
    ),
    (
        "sender",
        &["durable", "error", "home", "names", "records", "request"],
    ),
    // Front ends: what people, agents and harnesses see and run.
    (
        "operator_view",
        &[
            "clock", "delivery", "engine", "escape", "home", "ingress", "records",
        ],
    ),
    (
        "inbox",
        &[
            "delivery",
            "error",
            "failpoint",
            "home",
            "records",
            "request",
            "sync",
        ],
    ),
    (
        "agent_view",
        &[
            "delivery",
            "durable",
            "engine",
            "error",
            "home",
            "howto",
            "ingress",
            "records",
            "operator_view",
            "request",
            "sender",
        ],
    ),
    (
        "harness",
        &[
            "delivery", "durable", "error", "escape", "home", "inbox", "process", "records",
            "request", "secret",
        ],
    ),
    ("setup", &["harness"]),
    (
        "doctor",
        &[
            "clock",
            "durable",
            "error",
            "escape",
            "failpoint",
            "home",
            "ingress",
            "journal",
            "records",
            "settings",
            "store",
        ],
    ),
    (
        "daemon",
        &[
            "agent_view",
            "clock",
            "delivery",
            "durable",
            "engine",
            "error",
            "failpoint",
            "home",
            "ingress",
            "names",
            "records",
            "operator_view",
            "request",
            "secret",
            "settings",
            "store",
            "sync",
        ],
    ),
    (
        "mcp",
        &[
            "agent_view",
            "delivery",
            "engine",
            "error",
            "escape",
            "harness",
            "inbox",
            "records",
            "operator_view",
            "request",
            "sync",
        ],
    ),
    (
        "cli",
        &[
            "agent_view",
            "clock",
            "daemon",
            "delivery",
            "doctor",
            "durable",
            "engine",
            "error",
            "escape",
            "harness",
            "home",
            "inbox",
            "ingress",
            "mcp",
            "process",
            "records",
            "operator_view",
            "request",
            "secret",
            "sender",
            "settings",
            "setup",
            "store",
            "sync",
        ],
    ),
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
        for line in text.lines() {
            // A comment may name any module; only code is an edge.
            let code = line.split("//").next().unwrap_or("");
            for (i, _) in code.match_indices("crate::") {
                let name: String = code[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name != module && !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

/// The crate's top-level modules, from `src/`.
fn modules(src: &Path) -> BTreeSet<String> {
    fs::read_dir(src)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if e.path().is_dir() {
                (name != "bin").then_some(name)
            } else {
                let stem = name.strip_suffix(".rs")?;
                (stem != "lib").then(|| stem.to_owned())
            }
        })
        .collect()
}

#[test]
fn every_module_imports_exactly_what_the_layer_table_allows_and_nothing_upwards() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rows: BTreeSet<String> = LAYERS.iter().map(|(m, _)| (*m).to_owned()).collect();
    assert_eq!(
        modules(&src),
        rows,
        "every module of src/ has one row in LAYERS (place a new module in its layer)"
    );
    let mut problems = Vec::new();
    let mut below = BTreeSet::new();
    for (module, allowed) in LAYERS {
        let allowed: BTreeSet<String> = allowed.iter().map(|d| (*d).to_owned()).collect();
        let actual = imports_of(&src, module);
        for extra in actual.difference(&allowed) {
            problems.push(format!(
                "{module} imports {extra}, which its row does not allow"
            ));
        }
        for stale in allowed.difference(&actual) {
            problems.push(format!(
                "{module}'s row allows {stale}, which it no longer imports: remove it"
            ));
        }
        for d in &allowed {
            if !below.contains(d.as_str()) {
                problems.push(format!(
                    "{module} may import {d}, which is not below it in the table"
                ));
            }
        }
        below.insert(*module);
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn ingress_routes_do_not_reach_into_each_other() {
    // The drop zone, the devices and the shim meet in the engine, not in each other; a device's
    // mirror is a drop zone, so the collector uses the spool's reader.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ingress");
    let allowed: [(&str, &[&str]); 3] = [("spool", &[]), ("device", &["spool"]), ("http", &[])];
    for (route, may) in allowed {
        let mut files = rust_files(&src.join(format!("{route}.rs")));
        files.extend(rust_files(&src.join(route)));
        for f in files {
            let text = fs::read_to_string(&f).unwrap();
            for (other, _) in allowed {
                if other == route || may.contains(&other) {
                    continue;
                }
                let path = format!("crate::ingress::{other}");
                assert!(
                    !text
                        .lines()
                        .any(|l| l.split("//").next().unwrap_or("").contains(&path)),
                    "{} reaches into {path}",
                    f.display()
                );
            }
        }
    }
}

/// An item has one path: a module that is public is not also re-exported from by its parent,
/// or `engine::Refusal` and `engine::rules::Refusal` would name one thing twice.
#[test]
fn no_item_of_a_public_module_is_re_exported_by_its_parent() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut twice = Vec::new();
    for file in rust_files(&src) {
        let text = fs::read_to_string(&file).unwrap();
        let public: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
            .collect();
        for line in text.lines() {
            let Some(used) = line.strip_prefix("pub use ") else {
                continue;
            };
            let module = used.split("::").next().unwrap_or_default();
            if public.contains(&module) {
                twice.push(format!("{}: {line}", file.display()));
            }
        }
    }
    assert!(
        twice.is_empty(),
        "items with two paths:\n{}",
        twice.join("\n")
    );
}

/// rustfmt wraps code at 100 columns but never a comment or a string, so an edit that lengthens
/// one leaves a line that only this look catches (docs/style.md: lines).
#[test]
fn no_line_of_the_library_or_its_page_is_wider_than_100_columns() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wide = Vec::new();
    // The Rust, and the page and plugin the binary carries (`include_str!`).
    let mut files = rust_files(&src);
    for page in ["ingress/http/ui", "harness"] {
        let dir = fs::read_dir(src.join(page))
            .unwrap()
            .flatten()
            .map(|e| e.path());
        files.extend(dir.filter(|p| {
            p.extension()
                .is_some_and(|x| x == "js" || x == "css" || x == "html")
        }));
    }
    for file in files {
        for (n, line) in fs::read_to_string(&file).unwrap().lines().enumerate() {
            let width = line.chars().count();
            if width > 100 {
                wide.push(format!("{}:{}: {width} columns", file.display(), n + 1));
            }
        }
    }
    assert!(
        wide.is_empty(),
        "lines over 100 columns:\n{}",
        wide.join("\n")
    );
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
