//! Commands the help and the manual pages tell you to run exist: every `waitpoint …` and
//! `cortex-signal …` mentioned in any command's `--help` and in `man/*` names subcommands and
//! flags the clap tree has (a text that says `check --all` when there is no `--all` sends the
//! reader to an error), and no help shows an unset variable as `[env: NAME=]`.

use std::fs;
use std::path::Path;

use clap::Command;

/// The two programs as clap builds them.
fn programs() -> [(&'static str, Command); 2] {
    [
        ("waitpoint", waitpoint::cli::man::waitpoint_command()),
        (
            "cortex-signal",
            waitpoint::cli::man::cortex_signal_command(),
        ),
    ]
}

/// Every command of the tree with its path (`waitpoint timer show`), the root first.
fn commands(path: String, cmd: &Command, out: &mut Vec<(String, Command)>) {
    out.push((path.clone(), cmd.clone()));
    for sub in cmd.get_subcommands() {
        commands(format!("{path} {}", sub.get_name()), sub, out);
    }
}

/// Roff as a reader sees it: font changes dropped, escapes turned back into their characters.
fn unroff(text: &str) -> String {
    text.replace("\\fB", "")
        .replace("\\fR", "")
        .replace("\\fI", "")
        .replace("\\fP", "")
        .replace("\\-", "-")
        .replace("\\*(Aq", "'")
        .replace("\\(aq", "'")
        .replace("\\&", "")
        .replace("\\e", "\\")
}

/// Where a command may start inside a span: at its start, or after a shell separator.
fn starts_in(span: &str, out: &mut Vec<String>) {
    for program in ["waitpoint ", "cortex-signal "] {
        for (at, _) in span.match_indices(program) {
            let before = span[..at].chars().next_back();
            if before.is_none_or(|c| " ;|&(`$".contains(c)) {
                out.push(span[at..].to_owned());
            }
        }
    }
}

/// The command lines a text mentions: in backticks anywhere; in a manual page also in example
/// blocks (`.nf` … `.fi`) and bold or italic lines (`.B waitpoint doctor`).
fn mentions(text: &str, man: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 1 {
            starts_in(span, &mut out);
        }
    }
    if man {
        let mut example = false;
        for line in text.lines() {
            match line {
                ".nf" => example = true,
                ".fi" => example = false,
                _ if example => starts_in(line, &mut out),
                _ => {
                    for macro_ in [".B ", ".BR ", ".I ", ".IR "] {
                        if let Some(arg) = line.strip_prefix(macro_) {
                            let arg = arg.trim_start_matches('"');
                            let arg = arg.split('"').next().unwrap_or(arg);
                            if arg.starts_with("waitpoint ") || arg.starts_with("cortex-signal ") {
                                out.push(arg.to_owned());
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// A word that stands for a value the reader fills in (`ID`, `<DIR>`, `wp_…`, `$ID`, `5000`),
/// not a subcommand.
fn is_placeholder(word: &str) -> bool {
    !word.split('|').all(|w| {
        !w.is_empty()
            && w.starts_with(|c: char| c.is_ascii_lowercase())
            && w.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    }) || ["wp_", "tm_", "cb_", "wk_"]
        .iter()
        .any(|p| word.starts_with(p))
}

/// What is wrong with one mentioned command line, checked against the tree: each subcommand
/// named must exist, and each flag must be one of the command it follows (globals included).
fn check_line(line: &str, programs: &[(&'static str, Command)]) -> Option<String> {
    let mut words = line.split_whitespace();
    let first = words.next()?;
    let (_, root) = programs.iter().find(|(name, _)| *name == first)?;
    let mut cmd = root;
    let mut path = first.to_owned();
    let mut positional = false;
    let mut words = words.peekable();
    while let Some(raw) = words.next() {
        if ["&&", "||", ";", "|", "&", "--", ">", "2>"].contains(&raw) || raw.starts_with('>') {
            break;
        }
        // Punctuation the sentence or the shell wraps around a word, and optional brackets.
        let ends = raw.ends_with([';', ')', ',', '.']) && !raw.ends_with("...");
        let word = raw
            .trim_start_matches(['[', '('])
            .trim_end_matches([']', ')', ',', ';', '.']);
        if let Some(flag) = word.strip_prefix("--") {
            let (name, inline) = match flag.split_once('=') {
                Some((n, _)) => (n, true),
                None => (flag, false),
            };
            if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
                if ends {
                    break;
                }
                continue;
            }
            let arg = cmd.get_arguments().find(|a| {
                a.get_long() == Some(name)
                    || a.get_all_aliases().is_some_and(|al| al.contains(&name))
            });
            match arg {
                Some(a) => {
                    if a.get_action().takes_values() && !inline && !ends {
                        words.next();
                    }
                }
                None if ["help", "version"].contains(&name) => {}
                None => return Some(format!("`{path}` has no flag --{name}")),
            }
        } else if word.starts_with('-') {
            // A short flag or `-` for standard input: not worth a rule of its own.
        } else if cmd.has_subcommands() && !positional {
            if is_placeholder(word) {
                positional = true;
            } else {
                for alt in word.split('|') {
                    let sub = cmd
                        .get_subcommands()
                        .find(|s| s.get_name() == alt || s.get_all_aliases().any(|a| a == alt));
                    match sub {
                        Some(s) if !word.contains('|') => {
                            cmd = s;
                            path = format!("{path} {alt}");
                        }
                        Some(_) => {}
                        None if alt == "help" => {}
                        None => return Some(format!("`{path}` has no subcommand {alt}")),
                    }
                }
                if word.contains('|') {
                    break;
                }
            }
        }
        if ends {
            break;
        }
    }
    None
}

/// Every problem in the mentions of `text` (from `source`).
fn problems(text: &str, man: bool, source: &str) -> Vec<String> {
    let programs = programs();
    mentions(text, man)
        .iter()
        .filter_map(|m| check_line(m, &programs).map(|why| format!("{source}: {m:?}: {why}")))
        .collect()
}

#[test]
fn the_checker_catches_a_missing_flag_and_a_made_up_subcommand() {
    let text = "run `waitpoint --home /tmp/x check --all`, then `waitpoint frobnicate now`, \
`waitpoint timer shw tm_1`, or `cortex-signal --home /tmp`; but `waitpoint timer show ID \
--agent a1 --json` and `waitpoint setup claude-code|codex` exist.";
    let found = problems(text, false, "sample");
    assert_eq!(found.len(), 4, "{found:#?}");
    for (what, why) in [
        ("check --all", "has no flag --all"),
        ("frobnicate", "has no subcommand frobnicate"),
        ("timer shw", "has no subcommand shw"),
        ("cortex-signal --home", "`cortex-signal` has no flag --home"),
    ] {
        assert!(
            found.iter().any(|f| f.contains(what) && f.contains(why)),
            "{what}: {found:#?}"
        );
    }
    // The manual's forms too: example blocks and bold lines.
    let man = ".B waitpoint frobnicate\n.nf\nsleep 1; waitpoint check \\-\\-all\n.fi\n";
    assert_eq!(problems(&unroff(man), true, "man").len(), 2);
}

#[test]
fn every_command_the_help_and_the_manual_pages_name_exists() {
    let mut found = Vec::new();
    let mut mentioned = 0;
    for (name, root) in programs() {
        let mut all = Vec::new();
        commands(name.to_owned(), &root, &mut all);
        for (path, mut cmd) in all {
            let help = cmd.render_long_help().to_string();
            mentioned += mentions(&help, false).len();
            found.extend(problems(&help, false, &format!("{path} --help")));
        }
    }
    let man = Path::new(env!("CARGO_MANIFEST_DIR")).join("man");
    for entry in fs::read_dir(&man).unwrap().flatten() {
        let text = unroff(&fs::read_to_string(entry.path()).unwrap());
        mentioned += mentions(&text, true).len();
        found.extend(problems(&text, true, &entry.file_name().to_string_lossy()));
    }
    assert!(
        mentioned > 50,
        "only {mentioned} mentions found: is the parser blind?"
    );
    assert!(found.is_empty(), "{found:#?}");
}

/// Clap prints `[env: NAME=value]` for a flag with an environment default, and `NAME=` when the
/// variable is unset, which reads like a variable set to nothing. Every such flag hides its
/// value (or the whole note, when the help says where the default comes from).
#[test]
fn no_help_shows_an_unset_variable_as_set_to_nothing() {
    for (name, root) in programs() {
        let mut all = Vec::new();
        commands(name.to_owned(), &root, &mut all);
        for (path, mut cmd) in all {
            let help = cmd.render_long_help().to_string();
            for note in help.split("[env: ").skip(1) {
                let note = note.split(']').next().unwrap_or(note);
                assert!(!note.contains('='), "{path} --help shows [env: {note}]");
            }
        }
    }
}

/// Clap's usage line names what was given and what is missing by value name; a positional
/// named like a flag's value reads `timer show --agent <ID> --json <ID>`, two IDs for two
/// different things. No positional shares its value name with a flag of its command.
#[test]
fn no_positional_shares_its_value_name_with_a_flag() {
    for (name, root) in programs() {
        let mut all = Vec::new();
        commands(name.to_owned(), &root, &mut all);
        for (path, cmd) in all {
            let names = |positional: bool| -> Vec<String> {
                cmd.get_arguments()
                    .filter(|a| a.is_positional() == positional)
                    .flat_map(|a| a.get_value_names().unwrap_or_default().to_vec())
                    .map(|n| n.to_string())
                    .collect()
            };
            let flags = names(false);
            for p in names(true) {
                assert!(
                    !flags.contains(&p),
                    "{path}: the positional <{p}> is named like a flag's value"
                );
            }
        }
    }
}

/// cortex-signal(1) and `cortex-signal --help` name only flags cortex-signal has: its page once
/// said `--home` wins over CORTEX_HOME, and `cortex-signal --home` is a usage error.
#[test]
fn cortex_signals_page_and_help_name_only_its_own_flags() {
    let mut cmd = waitpoint::cli::man::cortex_signal_command();
    let own: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .chain(["help".to_owned(), "version".to_owned()])
        .collect();
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("man/cortex-signal.1");
    let help = cmd.render_long_help().to_string();
    for (source, text) in [
        (
            "cortex-signal.1",
            unroff(&fs::read_to_string(page).unwrap()),
        ),
        ("cortex-signal --help", help),
    ] {
        for (at, _) in text.match_indices("--") {
            let name: String = text[at + 2..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            assert!(
                name.is_empty() || own.contains(&name),
                "{source} names --{name}, which cortex-signal does not take"
            );
        }
    }
}
