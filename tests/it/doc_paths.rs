//! The map cannot drift: every file path and every `crate::` symbol that ARCHITECTURE.md and
//! `docs/` cite must exist, as the man-page test keeps the pages fresh.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents that cite the code: ARCHITECTURE.md and every page of `docs/`.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("ARCHITECTURE.md")];
    for e in fs::read_dir(root().join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            docs.push(e.path());
        }
    }
    docs.sort();
    docs
}

/// The texts between backticks.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// `a/{b,c}.rs` as `a/b.rs` and `a/c.rs`.
fn expand(path: &str) -> Vec<String> {
    match (path.find('{'), path.find('}')) {
        (Some(i), Some(j)) if i < j => path[i + 1..j]
            .split(',')
            .flat_map(|alt| expand(&format!("{}{}{}", &path[..i], alt, &path[j + 1..])))
            .collect(),
        _ => vec![path.to_owned()],
    }
}

const TREES: [&str; 9] = [
    "src/", "tests/", "docs/", "layouts/", "scripts/", "man/", "benches/", "spool/", ".ci/",
];

/// Whether `path` exists; a `*` in its last component matches any text.
fn exists(path: &str) -> bool {
    let full = root().join(path);
    let name = full.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match name.split_once('*') {
        None => full.exists(),
        Some((head, tail)) => fs::read_dir(full.parent().unwrap())
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.len() >= head.len() + tail.len() && n.starts_with(head) && n.ends_with(tail)
            }),
    }
}

/// Outside crates and std, whose paths the documents may cite as they are.
const FOREIGN: [&str; 19] = [
    "std",
    "core",
    "serde",
    "serde_json",
    "tokio",
    "hyper",
    "hyper_util",
    "rmcp",
    "notify",
    "rustix",
    "clap",
    "ssh2",
    "etcd_client",
    "tracing",
    "http",
    "fail",
    "tonic",
    "sha2",
    "rand",
];

/// Every cited path of the repository that does not exist, with the document citing it.
fn missing_paths(doc: &Path, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for q in quoted(text) {
        let q = q.trim_end_matches(['.', ',', ':']);
        if !TREES.iter().any(|t| q.starts_with(t))
            || q.contains(char::is_whitespace)
            || q.contains('<')
        {
            continue;
        }
        for p in expand(q) {
            let p = p.split(':').next().unwrap_or(&p);
            if !exists(p) {
                out.push(format!("{}: `{p}`", doc.display()));
            }
        }
    }
    out
}

/// The files of module path `segments` (`["store", "etcd"]` -> `src/store/etcd.rs` and all
/// under `src/store/etcd/`), and how many segments named modules.
fn module_files(segments: &[&str]) -> (Vec<PathBuf>, usize) {
    let mut dir = root().join("src");
    let mut used = 0;
    for s in segments {
        let file = dir.join(format!("{s}.rs"));
        let sub = dir.join(s);
        if file.is_file() || sub.is_dir() {
            dir = sub;
            used += 1;
        } else {
            break;
        }
    }
    if used == 0 && !segments.is_empty() {
        return (Vec::new(), 0);
    }
    let mut files = Vec::new();
    let file = dir.with_extension("rs");
    if file.is_file() {
        files.push(file);
    }
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else if e.path().extension().is_some_and(|x| x == "rs") {
                files.push(e.path());
            }
        }
    }
    (files, used)
}

/// Whether `name` is declared (an item, a method, a variant, a field or a macro arm) in `text`.
fn declares(text: &str, name: &str) -> bool {
    let kinds = [
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "const ",
        "static ",
        "type ",
        "mod ",
        "macro_rules! ",
    ];
    kinds
        .iter()
        .any(|k| contains_word(text, &format!("{k}{name}")))
        || text.lines().any(|l| {
            let l = l.trim_start();
            // An enum variant or a field (`Name,` `Name(` `Name {` `name:`), or a constant a
            // table macro declares (`NAME = 0:`).
            l.strip_prefix(name).is_some_and(|rest| {
                rest.starts_with([',', '(', ' ', ':', '='])
                    && !l.starts_with("//")
                    && l.chars().next().is_some_and(char::is_alphabetic)
            }) || l.starts_with(&format!("pub {name}:"))
        })
}

/// Whether `name` is declared in `text` as a free item (a function, a macro, a module or a
/// static at the start of a line, not indented into an `impl`), or re-exported by name.
fn declares_free(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        let item = ["pub(crate) ", "pub(super) ", "pub "]
            .iter()
            .find_map(|v| l.strip_prefix(v))
            .unwrap_or(l);
        let item = item
            .strip_prefix("const ")
            .or_else(|| item.strip_prefix("async "))
            .unwrap_or(item);
        ["fn ", "macro_rules! ", "mod ", "static "]
            .iter()
            .any(|k| contains_word(item, &format!("{k}{name}")) && item.starts_with(k))
            || (l.starts_with("pub use ") && contains_word(l, name))
    })
}

/// Whether `text` holds `word` not followed by another identifier character: `fn foo` is in
/// `fn foo(` but not in `fn foobar(`.
fn contains_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        !text[at + word.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Every cited `crate::…` path, or `module::Symbol` of one of our modules, that names nothing.
fn missing_symbols(doc: &Path, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for q in quoted(text) {
        let q = q.trim_end_matches("()").trim_end_matches(['.', ',']);
        let path = q.strip_prefix("crate::").unwrap_or(q);
        if !path.contains("::")
            || !path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            continue;
        }
        // `names::` cites a module: its segments are the names before the last `::`.
        let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        let test_module = root().join(format!("tests/it/{}.rs", segments[0]));
        let (files, used) = if segments[0].starts_with(char::is_uppercase) {
            // `Type::member`: declared somewhere in the crate or the test helpers.
            let (mut files, _) = module_files(&[]);
            files.push(root().join("tests/it/helpers.rs"));
            (files, 0)
        } else {
            match module_files(&segments) {
                (_, 0) if test_module.is_file() => (vec![test_module.clone()], 1),
                found => found,
            }
        };
        let foreign = used == 0 && !segments[0].starts_with(char::is_uppercase);
        if foreign {
            // Not one of our modules: fine for an outside crate's path (`serde_json::Value`).
            if !FOREIGN.contains(&segments[0]) {
                out.push(format!("{}: `{q}` (no such module)", doc.display()));
            }
            continue;
        }
        let mut texts: Vec<String> = files
            .iter()
            .map(|f| fs::read_to_string(f).unwrap())
            .collect();
        // A test module may share its name with the module it tests (`setup::a_test_name`).
        if used == 1 && test_module.is_file() && files.first() != Some(&test_module) {
            texts.push(fs::read_to_string(&test_module).unwrap());
        }
        // `module::function`: a free function of that module, not a method somewhere in it
        // (`durable::commit` is stale once `commit` is `Root::commit`).
        if let [name] = &segments[used..]
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && !texts.iter().any(|t| declares_free(t, name))
        {
            out.push(format!(
                "{}: `{q}` ({name} is no free item there; a method is cited by its type)",
                doc.display()
            ));
            continue;
        }
        for name in &segments[used..] {
            if !texts.iter().any(|t| declares(t, name)) {
                out.push(format!(
                    "{}: `{q}` ({name} is not declared there)",
                    doc.display()
                ));
                break;
            }
        }
    }
    out
}

#[test]
fn every_path_and_symbol_the_architecture_and_docs_cite_exists() {
    let mut missing = Vec::new();
    for doc in documents() {
        let text = fs::read_to_string(&doc).unwrap();
        missing.extend(missing_paths(&doc, &text));
        missing.extend(missing_symbols(&doc, &text));
    }
    assert!(
        missing.is_empty(),
        "cited but missing (update the document or the code):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_citation_check_catches_a_stale_path_and_a_stale_symbol() {
    let doc = Path::new("probe.md");
    let text = "`src/ingress/http.rs` `src/durable/{dir,gone}.rs` `durable::NoSuchThing` \
                `crate::nowhere::X` `src/store/etcd/keys.rs` `engine::Engine::apply_batch` \
                `src/bin/*.rs` `serde_json::Value`";
    let paths = missing_paths(doc, text);
    assert_eq!(
        paths,
        [
            "probe.md: `src/ingress/http.rs`",
            "probe.md: `src/durable/gone.rs`"
        ]
    );
    let symbols = missing_symbols(doc, text);
    assert_eq!(symbols.len(), 2, "{symbols:?}");
    assert!(symbols[0].contains("NoSuchThing") && symbols[1].contains("crate::nowhere::X"));
    let stale = missing_symbols(doc, "`Engine::no_such_method` `links::no_such_test`");
    assert_eq!(stale.len(), 2, "{stale:?}");
    // A method cited as if it were its module's function.
    let method = missing_symbols(doc, "`journal::append` `journal::read_segment`");
    assert_eq!(method.len(), 1, "{method:?}");
    assert!(method[0].contains("`journal::append`"), "{method:?}");
}

/// The `.rs` paths a line comment of `text` names (`// … see store/files.rs`).
fn commented_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((_, comment)) = line.split_once("//") else {
            continue;
        };
        for word in comment.split(|c: char| !(c.is_alphanumeric() || "_/.-*{},".contains(c))) {
            let word = word.trim_end_matches(['.', ',']);
            if word.ends_with(".rs") && !word.starts_with('.') && !word.contains(['*', '{']) {
                out.push(word.to_owned());
            }
        }
    }
    out
}

/// Whether `cited`, named in a comment of `file`, is a file: relative to the crate, `src/`,
/// `tests/`, the file's own folder, its module's folder or the folder above.
fn resolves(file: &Path, cited: &str) -> bool {
    let dir = file.parent().unwrap();
    let module = file.with_extension("");
    [
        root(),
        root().join("src"),
        root().join("tests"),
        dir.to_owned(),
        module,
        dir.parent().unwrap().to_owned(),
    ]
    .iter()
    .any(|base| base.join(cited).is_file())
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_source_path_a_code_comment_cites_exists() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    sources(&root().join("tests"), &mut files);
    let mut missing = Vec::new();
    // This file's own examples of stale paths are not citations.
    files.retain(|f| !f.ends_with("tests/it/doc_paths.rs"));
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for cited in commented_paths(&text) {
            if !resolves(&file, &cited) {
                missing.push(format!("{}: `{cited}`", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "comments cite files that do not exist (update the comment):\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_declared_name_matches_whole_and_a_stale_comment_path_is_caught() {
    assert!(declares("pub fn commit_notify(&self)", "commit_notify"));
    assert!(!declares("pub fn commit_notify(&self)", "commit"));
    let file = root().join("src/engine/batch.rs");
    let cited = commented_paths("// the journal line's commit lives in state/files.rs, see it");
    assert_eq!(cited, ["state/files.rs"]);
    assert!(!resolves(&file, &cited[0]));
    assert!(resolves(&file, "store/files.rs"));
}
