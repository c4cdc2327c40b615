//! Manual pages and completions: the committed pages equal what the generator produces, render
//! with no groff warnings and carry every required section; completions generate for each shell.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::helpers::*;

/// Set this to rewrite `man/` from the generator instead of comparing (`scripts/gen-man`).
const UPDATE: &str = "WAITPOINT_UPDATE_MAN";

fn man_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("man")
}

fn all_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = fs::read_dir(man_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e.to_str().is_some_and(|e| e.len() == 1))
        })
        .collect();
    pages.sort();
    pages
}

#[test]
fn man_pages_are_fresh() {
    let update = std::env::var_os(UPDATE).is_some();
    let mut stale = Vec::new();
    for page in waitpoint::cli::man::pages() {
        let path = man_dir().join(page.file);
        if update {
            fs::write(&path, &page.text).unwrap();
            continue;
        }
        let committed = fs::read_to_string(&path).unwrap_or_default();
        if committed != page.text {
            stale.push(page.file);
        }
    }
    assert!(
        stale.is_empty(),
        "man pages differ from the clap definitions: {stale:?}; run scripts/gen-man and commit"
    );
}

#[test]
fn every_page_has_the_required_sections() {
    let required = [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "ENVIRONMENT",
        "FILES",
        "EXIT STATUS",
        "EXAMPLES",
        "SEE ALSO",
    ];
    let pages = all_pages();
    let names: Vec<String> = pages
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for expected in [
        "waitpoint.1",
        "cortex-signal.1",
        "waitpoint-daemon.8",
        "waitpoint.5",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected} is missing");
    }
    for page in &pages {
        let text = fs::read_to_string(page).unwrap();
        let headings: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix(".SH "))
            .map(|h| h.trim_matches('"').to_owned())
            .collect();
        for section in required {
            assert!(
                headings.iter().any(|h| h == section),
                "{} has no {section} section (has {headings:?})",
                page.display()
            );
        }
    }
}

/// Runs a renderer and returns its diagnostics; a missing tool fails the test (CI installs it).
fn diagnostics(program: &str, args: &[&str], page: &Path) -> String {
    let out = Command::new(program)
        .args(args)
        .arg(page)
        .env("MANWIDTH", "80")
        .env("LANG", "C.UTF-8")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{program} is needed to check the man pages ({e}); scripts/test-deps installs it"
            )
        });
    assert!(
        out.status.success(),
        "{program} failed on {}: {}",
        page.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn man_pages_render_without_groff_warnings() {
    for page in all_pages() {
        let groff = diagnostics("groff", &["-man", "-ww", "-z", "-Tutf8"], &page);
        assert!(groff.is_empty(), "{}: {groff}", page.display());
        let man = diagnostics("man", &["--warnings", "-l"], &page);
        assert!(man.is_empty(), "{}: {man}", page.display());
    }
}

#[test]
fn rendered_waitpoint_page_documents_every_command_and_its_flags() {
    let page = man_dir().join("waitpoint.1");
    let out = Command::new("man")
        .args(["-l", "-P", "cat"])
        .arg(&page)
        .env("MANWIDTH", "200")
        .output()
        .expect("man is installed");
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "waitpoint create",
        "waitpoint run",
        "waitpoint attach",
        "waitpoint doctor",
        "waitpoint completions",
        "--tail-lines",
        "--log-format",
        "--expires-in-hours",
    ] {
        assert!(text.contains(needle), "waitpoint(1) lacks {needle:?}");
    }
}

#[test]
fn completions_generate_for_bash_zsh_and_fish() {
    let env = Env::new();
    for shell in ["bash", "zsh", "fish"] {
        for program in ["waitpoint", "cortex-signal"] {
            let out = env.waitpoint(&["completions", shell, "--program", program]);
            let script = env.ok(&format!("completions {shell} {program}"), &out);
            assert!(script.contains(program), "{shell}: {script}");
            let expected = if program == "waitpoint" {
                "doctor"
            } else {
                "exit-code"
            };
            assert!(
                script.contains(expected),
                "{shell} {program} lacks {expected}"
            );
        }
    }
    let bash = env.ok("bash", &env.waitpoint(&["completions", "bash"]));
    let path = env.home.join("../completion.bash");
    fs::write(&path, bash).unwrap();
    let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    env.expect_code("unknown shell", &env.waitpoint(&["completions", "tcsh"]), 2);
}
