//! Manual pages generated from the clap definitions, so options cannot drift from the code:
//! `waitpoint(1)` (every command), `cortex-signal(1)` and `waitpoint-daemon(8)`. This file is the
//! generator; the hand-written sections (ENVIRONMENT, FILES, EXIT STATUS, EXAMPLES, SEE ALSO)
//! are data in `man/sections.rs`, rendered here with roff's escaping.
//!
//! The committed pages under `man/` must equal [`pages`]; `scripts/gen-man` rewrites them.
//! `waitpoint(5)` is hand-written and not generated.

use clap_mangen::Man;
use clap_mangen::roff::{Inline, Roff, bold, italic, roman};

use crate::error::exit;

mod sections;

/// One generated page: its file name under `man/` and its roff source.
#[derive(Debug, Clone)]
pub struct Page {
    pub file: &'static str,
    pub text: String,
}

/// The date on the pages' title lines. Bump it when a page changes in substance.
pub const DATE: &str = "2026-12-01";
const SOURCE: &str = concat!("waitpoint ", env!("CARGO_PKG_VERSION"));
/// Every generated page.
pub fn pages() -> Vec<Page> {
    vec![waitpoint_1(), cortex_signal_1(), waitpoint_daemon_8()]
}

/// The `waitpoint` command as the pages and completions see it: named, with its subcommands'
/// names and globals resolved.
pub fn waitpoint_command() -> clap::Command {
    let mut cmd = super::waitpoint_command()
        .bin_name("waitpoint")
        .subcommand_value_name("COMMAND")
        .subcommand_help_heading("COMMANDS")
        .disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The `cortex-signal` command, built.
pub fn cortex_signal_command() -> clap::Command {
    let mut cmd = super::cortex_signal_command().bin_name("cortex-signal");
    cmd.build();
    cmd
}

/// Renders one section with clap_mangen, without roff's per-document preamble (the page
/// carries it once).
fn chunk(render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut buf = Vec::new();
    render(&mut buf).expect("rendering into memory cannot fail");
    let text = String::from_utf8(buf).expect("roff output is UTF-8");
    text.strip_prefix(&preamble()).unwrap_or(&text).to_owned()
}

fn preamble() -> String {
    Roff::new().render()
}

/// A chunk with its leading `.SH` line removed, for reuse under another heading.
fn body_of(section: String) -> String {
    match section.split_once('\n') {
        Some((first, rest)) if first.starts_with(".SH") => rest.to_owned(),
        _ => section,
    }
}

fn hide(mut cmd: clap::Command, ids: &[&str]) -> clap::Command {
    for id in ids {
        if cmd.get_arguments().any(|a| a.get_id() == *id) {
            cmd = cmd.mut_arg(*id, |a| a.hide(true));
        }
    }
    cmd
}

fn man(cmd: clap::Command, title: &str, section: &str, manual: &str) -> Man {
    Man::new(cmd)
        .title(title)
        .section(section)
        .date(DATE)
        .source(SOURCE)
        .manual(manual)
}

fn head(page: &Man) -> String {
    let mut s = preamble();
    s += &chunk(|w| page.render_title(w));
    s += &chunk(|w| page.render_name_section(w));
    s
}

fn waitpoint_1() -> Page {
    let cmd = waitpoint_command();
    let page = man(cmd.clone(), "WAITPOINT", "1", "User Commands");
    // In the per-command sections, the options every command shares are documented once, at
    // the top.
    let subs: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| hide(s.clone(), &["home", "help", "version"]))
        .collect();
    let mut s = head(&page);
    s += &chunk(|w| page.render_synopsis_section(w));
    for sub in &subs {
        s += ".br\n";
        s += &body_of(chunk(|w| Man::new(sub.clone()).render_synopsis_section(w)));
    }
    s += &chunk(|w| page.render_description_section(w));
    s += &chunk(|w| page.render_options_section(w));
    s += ".SH COMMANDS\n";
    for sub in &subs {
        let name = format!("waitpoint {}", sub.get_name());
        let mut r = Roff::new();
        r.control("SS", [name.as_str()]);
        s += &chunk(|w| r.to_writer(w));
        let sub_page = Man::new(sub.clone());
        s += &body_of(chunk(|w| sub_page.render_description_section(w)));
        if sub.get_arguments().any(|a| !a.is_hide_set()) {
            s += &body_of(chunk(|w| sub_page.render_options_section(w)));
        }
    }
    s += &Doc::default().blocks(sections::WAITPOINT_1).render_body();
    Page {
        file: "waitpoint.1",
        text: ascii(&s),
    }
}

fn cortex_signal_1() -> Page {
    let cmd = cortex_signal_command();
    let page = man(cmd, "CORTEX-SIGNAL", "1", "User Commands");
    let mut s = head(&page);
    s += &chunk(|w| page.render_synopsis_section(w));
    s += &chunk(|w| page.render_description_section(w));
    s += &chunk(|w| page.render_options_section(w));
    s += &Doc::default()
        .blocks(sections::CORTEX_SIGNAL_1)
        .render_body();
    Page {
        file: "cortex-signal.1",
        text: ascii(&s),
    }
}

fn waitpoint_daemon_8() -> Page {
    let cmd = waitpoint_command();
    let daemon = cmd
        .find_subcommand("daemon")
        .expect("waitpoint has a daemon command")
        .clone();
    let daemon = hide(daemon, &["help", "version"]);
    let page = man(daemon, "WAITPOINT-DAEMON", "8", "System Administration");
    let mut s = head(&page);
    s += &chunk(|w| page.render_synopsis_section(w));
    s += &chunk(|w| page.render_description_section(w));
    s += &chunk(|w| page.render_options_section(w));
    s += &Doc::default()
        .blocks(sections::WAITPOINT_DAEMON_8)
        .render_body();
    Page {
        file: "waitpoint-daemon.8",
        text: ascii(&s),
    }
}

/// Spells every non-ASCII character as a groff escape (`…` becomes `\[u2026]`), so the pages
/// render the same whatever encoding `man` assumes.
fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\[u{:04X}]", c as u32));
        }
    }
    out
}

/// One piece of a hand-written section, as `man/sections.rs` writes them.
enum Block {
    /// A section heading (`.SH`).
    Section(&'static str),
    /// A paragraph.
    Para(&'static str),
    /// An environment variable (in bold) and what it does.
    Var(&'static str, &'static str),
    /// A path (in italics) and what it holds.
    File(&'static str, &'static str),
    /// A sentence, then lines of shell set as they are.
    Example(&'static str, &'static str),
    /// Exit statuses, code by code.
    Exit(&'static [(u8, &'static str)]),
    /// `waitpoint`'s exit statuses: the library's table, `error::exit::TABLE`.
    ExitCodes,
    /// Other pages, by name and section.
    SeeAlso(&'static [(&'static str, &'static str)]),
    /// Blocks several pages share.
    Include(&'static [Block]),
}

/// Hand-written sections, built with roff's escaping so text cannot turn into requests.
#[derive(Default)]
struct Doc(Roff);

impl Doc {
    fn section(&mut self, name: &str) -> &mut Self {
        self.0.control("SH", [name]);
        self
    }

    fn para(&mut self, text: &str) -> &mut Self {
        self.0.control("PP", []);
        self.0.text([roman(text)]);
        self
    }

    fn item(&mut self, term: Vec<Inline>, body: &str) -> &mut Self {
        self.0.control("TP", []);
        self.0.text(term);
        self.0.text([roman(body)]);
        self
    }

    fn var(&mut self, name: &str, body: &str) -> &mut Self {
        self.item(vec![bold(name)], body)
    }

    fn file(&mut self, path: &str, body: &str) -> &mut Self {
        self.item(vec![italic(path)], body)
    }

    fn example(&mut self, what: &str, code: &str) -> &mut Self {
        self.para(what);
        self.0.control("PP", []);
        self.0.control("RS", ["4"]);
        self.0.control("nf", []);
        for line in code.lines() {
            self.0.text([roman(line)]);
        }
        self.0.control("fi", []);
        self.0.control("RE", []);
        self
    }

    fn exit_table(&mut self, table: &[(u8, &str)]) -> &mut Self {
        for (code, text) in table {
            self.item(vec![bold(code.to_string())], text);
        }
        self
    }

    fn exit_codes(&mut self) -> &mut Self {
        for row in exit::TABLE {
            self.item(vec![bold(row.code.to_string())], row.meaning);
        }
        self
    }

    fn see_also(&mut self, pages: &[(&str, &str)]) -> &mut Self {
        self.section("SEE ALSO");
        let mut line = Vec::new();
        for (i, (name, section)) in pages.iter().enumerate() {
            line.push(bold(*name));
            let sep = if i + 1 < pages.len() { ", " } else { "" };
            line.push(roman(format!("({section}){sep}")));
        }
        self.0.text(line);
        self
    }

    fn blocks(&mut self, blocks: &[Block]) -> &mut Self {
        for block in blocks {
            match *block {
                Block::Section(name) => self.section(name),
                Block::Para(text) => self.para(text),
                Block::Var(name, body) => self.var(name, body),
                Block::File(path, body) => self.file(path, body),
                Block::Example(what, code) => self.example(what, code),
                Block::Exit(table) => self.exit_table(table),
                Block::ExitCodes => self.exit_codes(),
                Block::SeeAlso(pages) => self.see_also(pages),
                Block::Include(shared) => self.blocks(shared),
            };
        }
        self
    }

    fn render_body(&self) -> String {
        let text = self.0.render();
        text.strip_prefix(&preamble()).unwrap_or(&text).to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn each_arg(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let helped = arg
                .get_help()
                .or(arg.get_long_help())
                .is_some_and(|h| !h.to_string().trim().is_empty());
            if !helped {
                out.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_about().is_none() {
                out.push(format!("{path} {} (the command itself)", sub.get_name()));
            }
            each_arg(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_flag_and_command_has_help_text() {
        let mut missing = Vec::new();
        each_arg(&waitpoint_command(), "waitpoint", &mut missing);
        each_arg(&cortex_signal_command(), "cortex-signal", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    #[test]
    fn exit_status_documents_every_code_of_the_table() {
        let codes: Vec<u8> = exit::TABLE.iter().map(|row| row.code).collect();
        assert!(
            codes.windows(2).all(|w| w[0] < w[1]),
            "the table's codes are distinct and in order: {codes:?}"
        );
        let page = waitpoint_1().text;
        let exit_status = page
            .split(".SH \"EXIT STATUS\"")
            .nth(1)
            .expect("an EXIT STATUS section");
        for row in exit::TABLE {
            let code = row.code;
            assert!(exit_status.contains(&format!("\\fB{code}\\fR")), "{code}");
            let first_words: String = row.meaning.split(' ').take(3).collect::<Vec<_>>().join(" ");
            assert!(
                exit_status.contains(&first_words),
                "{}: {first_words}",
                row.name
            );
        }
    }

    #[test]
    fn every_command_has_its_own_section_in_waitpoint_1() {
        let page = waitpoint_1().text;
        for sub in waitpoint_command().get_subcommands() {
            let heading = format!(".SS \"waitpoint {}\"", sub.get_name());
            assert!(page.contains(&heading), "missing {heading}");
        }
    }
}
