//! The CLI's hints on the engine's refusals: the flag that sets a request field. The engine's
//! texts name the field, as every front end shows them; only the CLI knows its flags.

/// Each request field the engine may refuse, and the flag that sets it. A test holds every
/// entry to a flag of the command that sends that field, and every field the engine checks to
/// an entry (or a reason it has none).
const FIELD_FLAGS: &[(&str, &str)] = &[
    ("label", "--label"),
    ("intent", "--intent"),
    ("members", "--member"),
    ("quorum", "--quorum"),
    ("max_signals", "--max-signals"),
    ("expires_in_hours", "--expires-in-hours"),
    ("recheck_after_ms", "--recheck-after-ms"),
    ("started_within_s", "--started-within"),
    ("heartbeat_within_s", "--heartbeat-within"),
    ("device", "--device"),
    ("session", "--session"),
    ("channel", "--channel"),
    ("duration_ms", "--after-ms"),
    ("interval_ms", "--every-ms"),
    ("summary", "--summary"),
];

/// The flag that sets a request field the engine refused, if a flag does.
pub fn field_hint(field: &str) -> Option<&'static str> {
    FIELD_FLAGS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, flag)| *flag)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::{FIELD_FLAGS, field_hint};

    /// The commands that build a request from their flags, and the fields of that request the
    /// engine checks.
    const SENDERS: &[(&[&str], &[&str])] = &[
        (
            &["create"],
            &[
                "label",
                "intent",
                "members",
                "quorum",
                "max_signals",
                "expires_in_hours",
                "recheck_after_ms",
                "started_within_s",
                "heartbeat_within_s",
                "device",
                "session",
                "channel",
            ],
        ),
        (
            &["timer", "create"],
            &["duration_ms", "interval_ms", "summary"],
        ),
        // The legacy form, `timer --after-ms N`.
        (&["timer"], &["duration_ms", "interval_ms", "summary"]),
        (&["callback", "create"], &["label"]),
    ];

    /// Fields the engine checks that no flag sets: a positional argument (`ack WAKE_ID`), a
    /// record read from another home (`import`), another front end's own (MCP's `timeout_s`).
    const NO_FLAG: &[&str] = &["wake_id", "id", "timeout_s"];

    /// Fields a flag sets that have no hint yet: `--agent` (timers and callbacks, `agent_id`)
    /// and `adapter claude-resume --resume`. A hint changes what the CLI prints, so adding one
    /// is a change of its own; they are listed so that no new field goes without one unseen.
    const UNHINTED: &[&str] = &["agent_id", "resume"];

    fn command(path: &[&str]) -> clap::Command {
        let mut cmd = super::super::waitpoint_command();
        cmd.build();
        for name in path {
            cmd = cmd
                .find_subcommand(name)
                .unwrap_or_else(|| panic!("no command {path:?}"))
                .clone();
        }
        cmd
    }

    #[test]
    fn every_hint_is_a_flag_of_each_command_that_sends_its_field() {
        for (field, flag) in FIELD_FLAGS {
            let senders: Vec<_> = SENDERS.iter().filter(|(_, f)| f.contains(field)).collect();
            assert!(!senders.is_empty(), "no command sends {field}");
            for (path, _) in senders {
                let long = flag.strip_prefix("--").expect("a long flag");
                let arg = command(path)
                    .get_arguments()
                    .find(|a| a.get_long() == Some(long))
                    .cloned();
                let arg = arg.unwrap_or_else(|| panic!("waitpoint {path:?} has no {flag}"));
                assert!(arg.get_action().takes_values(), "{flag} takes no value");
            }
        }
        for (path, fields) in SENDERS {
            for field in *fields {
                assert!(
                    field_hint(field).is_some(),
                    "{path:?} sends {field}: no hint"
                );
            }
        }
    }

    /// The request fields the library's sources refuse by name: the first argument of
    /// `invalid(…)` and `check_name(…)`, and the silence windows' `("field", req.…)` pairs.
    fn fields_checked_in_the_sources() -> BTreeSet<String> {
        fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    files(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut paths = Vec::new();
        files(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut paths,
        );
        let mut fields = BTreeSet::new();
        for path in paths {
            let text: String = std::fs::read_to_string(&path)
                .unwrap()
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .map(|l| format!("{l}\n"))
                .collect();
            // What follows a call's opening parenthesis, or a pair's.
            let calls = ["invalid(", "check_name("]
                .into_iter()
                .flat_map(|opener| {
                    text.match_indices(opener)
                        .map(move |(i, _)| i + opener.len())
                })
                .map(|at| (text[at..].trim_start(), ","));
            let pairs = text
                .match_indices("(\"")
                .map(|(i, _)| (&text[i + 1..], ", req."));
            for (rest, then) in calls.chain(pairs) {
                let Some((name, after)) = rest.strip_prefix('"').and_then(|l| l.split_once('"'))
                else {
                    continue;
                };
                let plain =
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                if plain && after.starts_with(then) {
                    fields.insert(name.to_owned());
                }
            }
        }
        fields
    }

    #[test]
    fn every_field_the_engine_checks_has_a_hint_or_a_reason_it_has_none() {
        let checked = fields_checked_in_the_sources();
        for (field, _) in FIELD_FLAGS {
            assert!(
                checked.contains(*field),
                "{field} is checked nowhere: {checked:?}"
            );
        }
        for field in &checked {
            assert!(
                field_hint(field).is_some()
                    || NO_FLAG.contains(&field.as_str())
                    || UNHINTED.contains(&field.as_str()),
                "the engine refuses {field}, which has no hint (the flag that sets it)"
            );
        }
    }
}
