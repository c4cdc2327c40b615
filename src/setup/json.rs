//! A harness's JSON file edited in place: the merge decides the value after, and only the parts
//! of the text whose value changed are rewritten. Everything else (the user's entries, their
//! order, spacing and number spelling: a 30-digit integer, `1.50`) stays byte for byte, which a
//! parse and print would not keep.
//!
//! A file with a key twice in one object is refused: which of the two a harness reads is its
//! own business, and either way an edit would silently drop the other.

use std::collections::HashSet;

use serde::Serialize;
use serde_json::Value;

/// Where a value is in the text, and where the values inside it are.
#[derive(Debug)]
struct Node {
    start: usize,
    end: usize,
    kind: Kind,
}

/// One member of an object: its key (decoded), where the key's text is, and its value.
#[derive(Debug)]
struct Member {
    key: String,
    key_start: usize,
    key_end: usize,
    value: Node,
}

#[derive(Debug)]
enum Kind {
    Object(Vec<Member>),
    Array(Vec<Node>),
    Scalar,
}

/// `text` parsed as JSON (`Err`: why not, as it would be said of the file).
pub(super) fn parse(text: &str) -> Result<Value, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("is not JSON ({e})"))?;
    // serde_json keeps the last of two equal keys; the span parser finds them.
    Spans::new(text).document()?;
    Ok(value)
}

/// The text of `before` (which parses to `old`) changed to hold `new`: each value that differs
/// is rewritten where it stands, new members and items are added after the last one, in the
/// file's own indentation.
pub(super) fn edit(before: &str, old: &Value, new: &Value) -> Result<String, String> {
    let root = Spans::new(before).document()?;
    let mut edits = Vec::new();
    diff(before, &root, old, new, &mut edits);
    edits.sort_by_key(|e| e.0);
    let mut out = String::with_capacity(before.len() + 1024);
    let mut at = 0;
    for (start, end, text) in edits {
        out.push_str(&before[at..start]);
        out.push_str(&text);
        at = end;
    }
    out.push_str(&before[at..]);
    // What was written must read back as the merge's value, or nothing is written.
    match serde_json::from_str::<Value>(&out) {
        Ok(v) if v == *new => Ok(out),
        _ => Err("cannot be edited in place without changing what is not ours".into()),
    }
}

type Replace = (usize, usize, String);

fn diff(text: &str, node: &Node, old: &Value, new: &Value, edits: &mut Vec<Replace>) {
    if old == new {
        return;
    }
    match (&node.kind, old, new) {
        (Kind::Object(members), Value::Object(o), Value::Object(n))
            if !members.is_empty() && o.keys().all(|k| n.contains_key(k)) =>
        {
            let mut added = Vec::new();
            for (key, value) in n {
                match members.iter().find(|m| m.key == *key) {
                    Some(m) => diff(text, &m.value, &o[key], value, edits),
                    None => added.push((key, value)),
                }
            }
            if !added.is_empty() {
                let starts: Vec<(usize, usize)> =
                    members.iter().map(|m| (m.key_start, m.value.end)).collect();
                let layout = Layout::of(text, node.start, &starts);
                let first = &members[0];
                let colon = &text[first.key_end..first.value.start];
                let mut insert = String::new();
                for (key, value) in added {
                    insert.push(',');
                    insert.push_str(layout.sep);
                    insert.push_str(&serde_json::to_string(key).expect("a string prints"));
                    insert.push_str(colon);
                    insert.push_str(&layout.print(value));
                }
                let last = members[members.len() - 1].value.end;
                edits.push((last, last, insert));
            }
        }
        (Kind::Array(items), Value::Array(o), Value::Array(n))
            if !items.is_empty() && n.len() >= o.len() =>
        {
            if n[..o.len()] == o[..] {
                let starts: Vec<(usize, usize)> = items.iter().map(|i| (i.start, i.end)).collect();
                let layout = Layout::of(text, node.start, &starts);
                let mut insert = String::new();
                for value in &n[o.len()..] {
                    insert.push(',');
                    insert.push_str(layout.sep);
                    insert.push_str(&layout.print(value));
                }
                let last = items[items.len() - 1].end;
                edits.push((last, last, insert));
            } else if n.len() == o.len() {
                for ((child, o), n) in items.iter().zip(o).zip(n) {
                    diff(text, child, o, n, edits);
                }
            } else {
                replace(text, node, new, edits);
            }
        }
        _ => replace(text, node, new, edits),
    }
}

/// Rewrites `node` whole as `new`, indented as the line it starts on.
fn replace(text: &str, node: &Node, new: &Value, edits: &mut Vec<Replace>) {
    let layout = Layout {
        sep: if text.contains('\n') { "\n" } else { "" },
        indent: line_indent(text, node.start),
        unit: unit_of(text),
    };
    edits.push((node.start, node.end, layout.print(new)));
}

/// How the members of one object (or the items of one array) are laid out.
struct Layout<'a> {
    /// What stands between one member and the next after the comma: `\n    `, ` `, or nothing.
    sep: &'a str,
    /// The indentation of a member's line.
    indent: &'a str,
    /// One level of indentation in this file.
    unit: &'a str,
}

impl<'a> Layout<'a> {
    /// The layout of the container opening at `open` whose members (or items) span `spans`
    /// (from a member's first byte to its value's last): as between its first two members, else
    /// as between the bracket and its only one.
    fn of(text: &'a str, open: usize, spans: &[(usize, usize)]) -> Layout<'a> {
        let sep = match spans {
            [a, b, ..] => {
                let between = text[a.1..b.0].trim_start_matches([' ', '\t', '\r', '\n']);
                between.strip_prefix(',').unwrap_or(between)
            }
            [a] => &text[open + 1..a.0],
            [] => "",
        };
        let indent = if sep.contains('\n') {
            sep.rsplit('\n').next().unwrap_or_default()
        } else {
            ""
        };
        Layout {
            sep,
            indent,
            unit: unit_of(text),
        }
    }

    /// `value` printed to stand at this layout's indentation: over several lines in a file
    /// laid out so, on one line otherwise.
    fn print(&self, value: &Value) -> String {
        if !self.sep.contains('\n') {
            return serde_json::to_string(value).expect("JSON values print");
        }
        let mut out = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(self.unit.as_bytes());
        let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
        value.serialize(&mut ser).expect("JSON values print");
        let printed = String::from_utf8(out).expect("JSON is UTF-8");
        printed.replace('\n', &format!("\n{}", self.indent))
    }
}

/// The file's indentation unit: the indentation of its first indented line ("  " if none).
fn unit_of(text: &str) -> &str {
    text.lines()
        .map(|l| &l[..l.len() - l.trim_start_matches([' ', '\t']).len()])
        .find(|w| !w.is_empty())
        .unwrap_or("  ")
}

/// The whitespace that starts the line `at` is on.
fn line_indent(text: &str, at: usize) -> &str {
    let line = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let rest = &text[line..];
    &rest[..rest.len() - rest.trim_start_matches([' ', '\t']).len()]
}

/// A recursive-descent reader of JSON text that notes where each value is. It runs only on text
/// serde_json has already read (so the depth is bounded by serde_json's limit), and finds what
/// serde_json lets through: a key twice in one object.
struct Spans<'a> {
    text: &'a str,
    at: usize,
    /// The keys on the way to the value being read, to name where a duplicate is.
    path: Vec<String>,
}

impl<'a> Spans<'a> {
    fn new(text: &'a str) -> Self {
        Spans {
            text,
            at: 0,
            path: Vec::new(),
        }
    }

    fn document(mut self) -> Result<Node, String> {
        self.ws();
        let node = self.value()?;
        Ok(node)
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn ws(&mut self) {
        while self
            .bytes()
            .get(self.at)
            .is_some_and(|b| b" \t\r\n".contains(b))
        {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Result<(), String> {
        self.ws();
        if self.bytes().get(self.at) == Some(&b) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!(
                "is not JSON (expected {:?} at byte {})",
                b as char, self.at
            ))
        }
    }

    fn value(&mut self) -> Result<Node, String> {
        self.ws();
        let start = self.at;
        let kind = match self.bytes().get(self.at) {
            Some(b'{') => self.object()?,
            Some(b'[') => self.array()?,
            Some(b'"') => {
                self.string()?;
                Kind::Scalar
            }
            Some(_) => {
                while self
                    .bytes()
                    .get(self.at)
                    .is_some_and(|b| !b" \t\r\n,]}".contains(b))
                {
                    self.at += 1;
                }
                Kind::Scalar
            }
            None => return Err("is not JSON (it ends early)".into()),
        };
        Ok(Node {
            start,
            end: self.at,
            kind,
        })
    }

    fn string(&mut self) -> Result<String, String> {
        let start = self.at;
        self.at += 1;
        loop {
            match self.bytes().get(self.at) {
                Some(b'\\') => self.at += 2,
                Some(b'"') => break,
                Some(_) => self.at += 1,
                None => return Err("is not JSON (a string does not end)".into()),
            }
        }
        self.at += 1;
        serde_json::from_str(&self.text[start..self.at]).map_err(|e| format!("is not JSON ({e})"))
    }

    fn object(&mut self) -> Result<Kind, String> {
        self.at += 1;
        let mut members = Vec::new();
        let mut seen = HashSet::new();
        self.ws();
        if self.bytes().get(self.at) == Some(&b'}') {
            self.at += 1;
            return Ok(Kind::Object(members));
        }
        loop {
            self.ws();
            let key_start = self.at;
            let key = self.string()?;
            let key_end = self.at;
            if !seen.insert(key.clone()) {
                self.path.push(key);
                return Err(format!(
                    "has the key {} twice in one object, and a harness reads only one of \
                     them; keep one",
                    self.path.join(".")
                ));
            }
            self.eat(b':')?;
            self.path.push(key.clone());
            let value = self.value()?;
            self.path.pop();
            members.push(Member {
                key,
                key_start,
                key_end,
                value,
            });
            self.ws();
            match self.bytes().get(self.at) {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Kind::Object(members));
                }
                _ => return Err(format!("is not JSON (at byte {})", self.at)),
            }
        }
    }

    fn array(&mut self) -> Result<Kind, String> {
        self.at += 1;
        let mut items = Vec::new();
        self.ws();
        if self.bytes().get(self.at) == Some(&b']') {
            self.at += 1;
            return Ok(Kind::Array(items));
        }
        loop {
            self.path.push(items.len().to_string());
            items.push(self.value()?);
            self.path.pop();
            self.ws();
            match self.bytes().get(self.at) {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Kind::Array(items));
                }
                _ => return Err(format!("is not JSON (at byte {})", self.at)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn edited(before: &str, f: impl FnOnce(&mut Value)) -> String {
        let old = parse(before).unwrap();
        let mut new = old.clone();
        f(&mut new);
        edit(before, &old, &new).unwrap()
    }

    #[test]
    fn what_is_not_ours_stays_byte_for_byte() {
        let before = "{\n    \"big\": 123456789012345678901234567890,\n    \"f\": 1.50,\n    \
                      \"list\": [1,2],\n    \"s\": {\"a\": 1}\n}\n";
        let after = edited(before, |v| {
            v["s"]["b"] = json!(2);
            v["new"] = json!({"k": [true]});
            v["list"].as_array_mut().unwrap().push(json!(3));
        });
        assert!(
            after.starts_with("{\n    \"big\": 123456789012345678901234567890,\n    \"f\": 1.50,"),
            "{after}"
        );
        assert!(after.contains("\"list\": [1,2,3]"), "{after}");
        assert!(after.contains("\"s\": {\"a\": 1,\"b\": 2}"), "{after}");
        assert!(
            after.ends_with(
                ",\n    \"new\": {\n        \"k\": [\n            true\n        ]\n    }\n}\n"
            ),
            "{after}"
        );
    }

    #[test]
    fn an_empty_object_or_a_changed_value_is_rewritten_where_it_stands() {
        let after = edited("{\n  \"a\": {},\n  \"b\": 1\n}", |v| {
            v["a"]["x"] = json!(1);
            v["b"] = json!(2);
        });
        assert_eq!(after, "{\n  \"a\": {\n    \"x\": 1\n  },\n  \"b\": 2\n}");
        let after = edited("{}", |v| v["x"] = json!([1]));
        assert_eq!(after, "{\"x\":[1]}");
    }

    #[test]
    fn a_key_twice_in_one_object_is_refused_by_its_path() {
        let e = parse(r#"{"hooks": {"Stop": [], "Stop": [1]}}"#).unwrap_err();
        assert!(e.contains("hooks.Stop twice"), "{e}");
        assert!(parse(r#"{"a": {"k": 1}, "b": {"k": 2}}"#).is_ok());
        assert!(parse(r#"{"a": "\"k\"", "k": 1}"#).is_ok());
    }
}
