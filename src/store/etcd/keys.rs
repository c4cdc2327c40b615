//! The etcd store's key scheme: every key it reads or writes, built here and nowhere else, and
//! read back where a key carries what it names (see `docs/etcd.md`; values are the JSON of
//! `layouts/`). Under the location's prefix:
//! - `wp/<id>`: the waitpoint's state, `waitpoint.json`;
//! - `rec/<id>/<seq>-<identity>.json`: one signal record each, named as on files;
//! - `idx/<session or channel>/<id>`: who may see it, so a session's list is one range;
//! - `chan/<channel>`: the host whose inbox the channel's wakes go to (the host that armed);
//! - `wake/<host>/<wake id>`: a wake on its way to that host's inbox;
//! - `tm/<id>`, `cb/<id>`: a timer, a callback;
//! - `in/<identity>`: a signal a standby host received, waiting for the leader to apply it;
//! - `bad/<key>`: a value that did not parse, set aside with the reason;
//! - `leader/…`: the election of the daemon that applies signals.
//!
//! A session, channel or signal identity reaches a key only through
//! [`identity_key`](crate::request::identity_key), which escapes `/`, so no name can reach
//! under another's prefix; waitpoint, timer, callback and wake ids are checked by their
//! `names` rules before they are looked up.

use crate::records::SignalRecord;
use crate::request::{identity_key, record_key};
use crate::store::DocKind;
use crate::store::files::parse_signal_file_name;
use crate::store::signal_file_name;

/// The keys of one deployment: each built under its prefix.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    /// Ends in `/` (the location's prefix).
    prefix: String,
}

/// What a key seen by the watch is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Watched {
    /// `wp/<id>`.
    Waitpoint(String),
    /// `tm/<id>`.
    Timer(String),
    /// `cb/<id>`.
    Callback(String),
    /// `in/…`: a signal handed over.
    HandedOver,
    /// `wake/<this host>/…`.
    WakeHere,
}

impl Keys {
    pub(super) fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    /// Every key of the deployment starts with it (the watch's range).
    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, rest: &str) -> Vec<u8> {
        format!("{}{rest}", self.prefix).into_bytes()
    }

    /// `wp/<id>`.
    pub(super) fn waitpoint(&self, id: &str) -> Vec<u8> {
        self.key(&format!("wp/{id}"))
    }
    /// `wp/`: every waitpoint.
    pub(super) fn waitpoints(&self) -> Vec<u8> {
        self.key("wp/")
    }

    /// `rec/<id>/`: a waitpoint's records.
    pub(super) fn records_of(&self, id: &str) -> Vec<u8> {
        self.key(&format!("rec/{id}/"))
    }
    /// `rec/`: every record.
    pub(super) fn records(&self) -> Vec<u8> {
        self.key("rec/")
    }
    /// `rec/<id>/<seq>-<key>.json`: the record of identity key `key` (already escaped).
    pub(super) fn record(&self, id: &str, seq: u64, key: &str) -> Vec<u8> {
        let mut k = self.records_of(id);
        k.extend_from_slice(signal_file_name(seq, key).as_bytes());
        k
    }
    /// The key of record `r` of waitpoint `id`, named by its source's identity.
    pub(super) fn record_of(&self, id: &str, r: &SignalRecord) -> Vec<u8> {
        self.record(id, r.seq, &record_key(r))
    }
    /// The waitpoint id a key under [`records`](Self::records) belongs to.
    pub(super) fn record_owner(&self, key: &[u8]) -> Option<String> {
        let rest = strip(key, &self.records())?;
        rest.split_once('/').map(|(id, _)| id.to_owned())
    }
    /// `(seq, identity key)` of a key under [`records_of`](Self::records_of)`(id)`.
    pub(super) fn record_name(&self, id: &str, key: &[u8]) -> Option<(u64, String)> {
        parse_signal_file_name(&strip(key, &self.records_of(id))?)
    }

    /// `idx/<who>/<id>`: `who` (a session or channel) may see waitpoint `id`.
    pub(super) fn visible(&self, who: &str, id: &str) -> Vec<u8> {
        let mut k = self.visible_to(who);
        k.extend_from_slice(id.as_bytes());
        k
    }
    /// `idx/<who>/`: what `who` may see.
    pub(super) fn visible_to(&self, who: &str) -> Vec<u8> {
        self.key(&format!("idx/{}/", identity_key(who)))
    }
    /// The waitpoint id of a key under [`visible_to`](Self::visible_to)`(who)`.
    pub(super) fn visible_id(&self, who: &str, key: &[u8]) -> Option<String> {
        strip(key, &self.visible_to(who))
    }

    /// `chan/<channel>`: the host a channel's wakes go to.
    pub(super) fn channel(&self, channel: &str) -> Vec<u8> {
        self.key(&format!("chan/{}", identity_key(channel)))
    }

    /// `wake/<host>/<wake id>`.
    pub(super) fn wake(&self, host: &str, wake_id: &str) -> Vec<u8> {
        let mut k = self.wakes_for(host);
        k.extend_from_slice(wake_id.as_bytes());
        k
    }
    /// `wake/<host>/`: the wakes on their way to `host`.
    pub(super) fn wakes_for(&self, host: &str) -> Vec<u8> {
        self.key(&format!("wake/{host}/"))
    }

    /// `tm/<id>` or `cb/<id>`.
    pub(super) fn doc(&self, kind: DocKind, id: &str) -> Vec<u8> {
        self.key(&format!("{}{id}", kind.prefix()))
    }
    /// `tm/` or `cb/`: every one of a kind.
    pub(super) fn docs(&self, kind: DocKind) -> Vec<u8> {
        self.key(kind.prefix())
    }

    /// `in/<key>`: the signal of identity key `key` (already escaped), handed over.
    pub(super) fn handed_over(&self, key: &str) -> Vec<u8> {
        self.key(&format!("in/{key}"))
    }
    /// `in/`: every signal handed over.
    pub(super) fn all_handed_over(&self) -> Vec<u8> {
        self.key("in/")
    }

    /// `bad/<rest>`: where the value of `key` (`<prefix><rest>`) is set aside.
    pub(super) fn set_aside(&self, key: &[u8]) -> Vec<u8> {
        let name = String::from_utf8_lossy(key);
        let rest = name.strip_prefix(&self.prefix).unwrap_or(&name);
        self.key(&format!("bad/{rest}"))
    }

    /// `leader`: the election's name (its candidates' keys are `leader/<lease>`).
    pub(super) fn election(&self) -> Vec<u8> {
        self.key("leader")
    }

    /// What a key the watch reports is about, for host `host`; `None` for a key nobody needs
    /// to hear about (an index, a record, another host's wake, the election).
    pub(super) fn watched(&self, key: &[u8], host: &str) -> Option<Watched> {
        let key = String::from_utf8_lossy(key);
        let rest = key.strip_prefix(&self.prefix)?;
        if let Some(id) = rest.strip_prefix("wp/") {
            Some(Watched::Waitpoint(id.to_owned()))
        } else if let Some(id) = rest.strip_prefix(DocKind::Timer.prefix()) {
            Some(Watched::Timer(id.to_owned()))
        } else if let Some(id) = rest.strip_prefix(DocKind::Callback.prefix()) {
            Some(Watched::Callback(id.to_owned()))
        } else if rest.starts_with("in/") {
            Some(Watched::HandedOver)
        } else if key.as_bytes().starts_with(&self.wakes_for(host)) {
            Some(Watched::WakeHere)
        } else {
            None
        }
    }
}

/// What follows `prefix` in `key`, as text; `None` when `key` does not start with it.
fn strip(key: &[u8], prefix: &[u8]) -> Option<String> {
    key.strip_prefix(prefix)
        .map(|rest| String::from_utf8_lossy(rest).into_owned())
}

/// The key just past every key starting with `prefix` (the end of its range).
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "wp_0123456789ab";

    fn keys() -> Keys {
        Keys::new("team/a/")
    }

    fn text(key: Vec<u8>) -> String {
        String::from_utf8(key).expect("keys are text")
    }

    fn record(seq: u64, source: &str) -> SignalRecord {
        crate::records::test_record(seq, source)
    }

    #[test]
    fn every_key_sits_under_the_prefix_in_the_documented_layout() {
        let k = keys();
        let cases = [
            (k.waitpoint(ID), "team/a/wp/wp_0123456789ab"),
            (k.waitpoints(), "team/a/wp/"),
            (k.records_of(ID), "team/a/rec/wp_0123456789ab/"),
            (k.records(), "team/a/rec/"),
            (
                k.record(ID, 7, "key:cs-1"),
                "team/a/rec/wp_0123456789ab/000007-key:cs-1.json",
            ),
            (k.visible("s1", ID), "team/a/idx/s1/wp_0123456789ab"),
            (k.visible_to("s1"), "team/a/idx/s1/"),
            (k.channel("ch"), "team/a/chan/ch"),
            (k.wake("b", "wk_1_2"), "team/a/wake/b/wk_1_2"),
            (k.wakes_for("b"), "team/a/wake/b/"),
            (
                k.doc(DocKind::Timer, "tm_0123456789ab"),
                "team/a/tm/tm_0123456789ab",
            ),
            (k.docs(DocKind::Timer), "team/a/tm/"),
            (
                k.doc(DocKind::Callback, "cb_0123456789ab"),
                "team/a/cb/cb_0123456789ab",
            ),
            (k.docs(DocKind::Callback), "team/a/cb/"),
            (k.handed_over("key:cs-1"), "team/a/in/key:cs-1"),
            (k.all_handed_over(), "team/a/in/"),
            (
                k.set_aside(b"team/a/wp/wp_0123456789ab"),
                "team/a/bad/wp/wp_0123456789ab",
            ),
            (k.election(), "team/a/leader"),
        ];
        for (key, expected) in cases {
            assert_eq!(text(key), expected);
        }
        assert_eq!(k.prefix(), "team/a/");
    }

    #[test]
    fn a_record_key_is_named_as_its_file_on_the_files_store() {
        let k = keys();
        let r = record(3, "spool:done.json@b");
        let name = signal_file_name(3, &record_key(&r));
        assert_eq!(text(k.record_of(ID, &r)), format!("team/a/rec/{ID}/{name}"));
        // A cortex-signal key is the same signal on every host: named by the key alone.
        let sent = record(4, "http:cs-0123456789abcdef0123456789abcdef");
        assert_eq!(
            text(k.record_of(ID, &sent)),
            format!("team/a/rec/{ID}/000004-key:cs-0123456789abcdef0123456789abcdef.json")
        );
    }

    #[test]
    fn names_with_slashes_cannot_reach_under_another_prefix() {
        let k = keys();
        let visible = text(k.visible("../other/s1", ID));
        assert_eq!(visible, format!("team/a/idx/..%2Fother%2Fs1/{ID}"));
        assert!(!visible.starts_with(&text(k.visible_to(".."))));
        assert_eq!(text(k.channel("a/b")), "team/a/chan/a%2Fb");
        // A record's identity comes from the wire; whatever it holds, the record stays one
        // key under its waitpoint's records.
        let hostile = record(1, "spool:../../wp/wp_ffffffffffff");
        let key = text(k.record_of(ID, &hostile));
        let name = key
            .strip_prefix(&text(k.records_of(ID)))
            .expect("under its waitpoint");
        assert!(!name.contains('/'), "{name}");
        assert_eq!(k.record_owner(key.as_bytes()).as_deref(), Some(ID));
    }

    #[test]
    fn keys_read_back_to_what_they_were_built_from() {
        let k = keys();
        let key = k.record(ID, 12, "key:cs-1");
        assert_eq!(k.record_owner(&key).as_deref(), Some(ID));
        assert_eq!(k.record_name(ID, &key), Some((12, "key:cs-1".to_owned())));
        assert_eq!(
            k.record_name("wp_ffffffffffff", &key),
            None,
            "another's records"
        );
        assert_eq!(k.record_owner(&k.waitpoint(ID)), None, "not a record");
        let listed = k.visible("s/1", ID);
        assert_eq!(k.visible_id("s/1", &listed).as_deref(), Some(ID));
        assert_eq!(k.visible_id("s", &listed), None);
    }

    #[test]
    fn the_watch_hears_waitpoints_timers_callbacks_hand_overs_and_this_hosts_wakes_only() {
        let k = keys();
        let seen = |key: Vec<u8>| k.watched(&key, "b");
        assert_eq!(seen(k.waitpoint(ID)), Some(Watched::Waitpoint(ID.into())));
        let timer = k.doc(DocKind::Timer, "tm_0123456789ab");
        assert_eq!(seen(timer), Some(Watched::Timer("tm_0123456789ab".into())));
        let callback = k.doc(DocKind::Callback, "cb_0123456789ab");
        assert_eq!(
            seen(callback),
            Some(Watched::Callback("cb_0123456789ab".into()))
        );
        assert_eq!(seen(k.handed_over("key:cs-1")), Some(Watched::HandedOver));
        assert_eq!(seen(k.wake("b", "wk_1_2")), Some(Watched::WakeHere));
        for quiet in [
            k.wake("bb", "wk_1_2"),
            k.wake("a", "wk_1_2"),
            k.record(ID, 1, "x"),
            k.visible("s1", ID),
            k.channel("ch"),
            k.election(),
            Keys::new("team/b/").waitpoint(ID),
        ] {
            assert_eq!(seen(quiet.clone()), None, "{}", text(quiet));
        }
    }

    #[test]
    fn a_prefix_range_ends_just_past_its_last_key() {
        assert_eq!(prefix_end(b"wp/"), b"wp0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        let k = keys();
        let end = prefix_end(&k.records_of(ID));
        let inside = k.record(ID, 999_999, "~~~~");
        assert!(k.records_of(ID) <= inside && inside < end);
        assert!(
            k.records_of("wp_0123456789ac") >= end,
            "the next waitpoint's records"
        );
    }
}
