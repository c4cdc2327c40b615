//! Applying signals: a batch decided in memory, committed as one journal line, then its files.
//!
//! [`Engine::apply_batch`] decides every signal exactly as one-by-one collection would, in
//! order, against each waitpoint's in-memory state. The batch then becomes one line of the
//! journal (every record, state and wake it changes), fdatasynced: that is the commit. Its
//! files are written after it, atomically but without their own fsync; the journal's
//! checkpoint makes them durable, and after a crash the daemon re-applies the lines left
//! ([`Engine::replay_journal`]) before it reads any state. The caller removes the spool files
//! only after `apply_batch` returns, so each signal is durable before its file goes. See
//! `ARCHITECTURE.md`, "Commit order".

use std::collections::HashMap;
use std::io;

use crate::error::{Error, Result};
use crate::journal::{self, Journal};
use crate::model::{
    JOURNAL_FORMAT, JournalChange, JournalEntry, SignalRecord, Status, Waitpoint, WakeKind,
};
use crate::request::{SignalRequest, Source};
use crate::store::{FileLock, Unsynced, read_json};

use super::{
    Engine, Refusal, Verdict, identity_key, in_grace_window, next_due, next_record, rules,
    signal_file_name,
};

/// The most signals [`Engine::apply_batch`] is given at once by the daemon. It bounds the open
/// files a batch holds (one lock per waitpoint and one temp file per staged file).
pub const MAX_BATCH: usize = 128;

/// One waitpoint touched by the batch, locked until the batch is done.
struct Group {
    _lock: FileLock,
    wp: Waitpoint,
    /// Whether `recover` and the outbox flush have run (once, before the first signal counts).
    ready: bool,
    /// Records decided in this batch, not yet on disk, with their identity keys.
    fresh: Vec<(SignalRecord, String)>,
    failed: Option<String>,
}

impl Group {
    /// Whether the batch commits anything for this waitpoint: signals decided, none failed.
    fn is_live(&self) -> bool {
        !self.fresh.is_empty() && self.failed.is_none()
    }
}

/// Where one item of the batch stands.
enum Slot {
    Done(Result<Verdict>),
    Accepted {
        group: usize,
        seq: u64,
        wake: Option<WakeKind>,
        /// The status right after this signal, as the single path reports it.
        status: Status,
    },
}

impl Engine {
    /// Applies `items` in order with the verdicts they would get one by one, committed together
    /// as one journal line (see the module docs). One result per item; an `Err` means nothing
    /// was decided for it and its source must be kept.
    pub fn apply_batch(&self, items: &[(SignalRequest, Source)]) -> Vec<Result<Verdict>> {
        let shared = match self.journal() {
            Ok(j) => j,
            Err(e) => return self.fail_all(items.len(), "cannot open the journal:", &e),
        };
        let mut journal = journal::lock(shared);
        if journal.needs_replay()
            && let Err(e) = self.replay_locked(&mut journal)
        {
            let why = "cannot apply signals before the journal is replayed:";
            return self.fail_all(items.len(), why, &e);
        }
        let mut groups: Vec<Group> = Vec::new();
        // `None`: no such waitpoint (every item naming it is refused).
        let mut by_id: HashMap<&str, Option<usize>> = HashMap::new();
        let mut slots = Vec::with_capacity(items.len());
        for (req, source) in items {
            let g = match by_id.get(req.id.as_str()) {
                Some(g) => *g,
                None => match self.open_group(&req.id) {
                    Ok(group) => {
                        let g = group.map(|group| {
                            groups.push(group);
                            groups.len() - 1
                        });
                        by_id.insert(&req.id, g);
                        g
                    }
                    Err(e) => {
                        slots.push(Slot::Done(Err(e)));
                        continue;
                    }
                },
            };
            slots.push(match g {
                None => Slot::Done(Ok(Verdict::Refused(Refusal::UnknownId))),
                Some(g) => self.decide(g, &mut groups[g], req, source),
            });
        }
        if let Err(e) = self.commit_groups(&mut journal, &mut groups) {
            let message = e.to_string();
            for (id, g) in &by_id {
                if let Some(g) = g
                    && !groups[*g].fresh.is_empty()
                {
                    groups[*g].failed.get_or_insert_with(|| message.clone());
                    // Records may be on disk without the state: the next attempt must recover.
                    self.forget(id);
                }
            }
        }
        slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Done(r) => r,
                Slot::Accepted {
                    group,
                    seq,
                    wake,
                    status,
                } => {
                    let g = &groups[group];
                    match &g.failed {
                        Some(m) => Err(Error::io(
                            "cannot apply a batch of signals to",
                            self.home.waitpoint_dir(&g.wp.id),
                            io::Error::other(m.clone()),
                        )),
                        // Every item of a waitpoint carries its final next due time: the daemon
                        // applies them in order, so the last one is what counts.
                        None => Ok(Verdict::Accepted {
                            next_due: next_due(&g.wp),
                            id: g.wp.id.clone(),
                            seq,
                            wake,
                            status,
                        }),
                    }
                }
            })
            .collect()
    }

    /// The same failure for each of `n` items (nothing was decided for any of them).
    fn fail_all(&self, n: usize, why: &'static str, e: &Error) -> Vec<Result<Verdict>> {
        let message = e.to_string();
        (0..n)
            .map(|_| {
                Err(Error::io(
                    why,
                    self.home.journal_dir(),
                    io::Error::other(message.clone()),
                ))
            })
            .collect()
    }

    fn open_group(&self, id: &str) -> Result<Option<Group>> {
        let Some(lock) = self.lock(id)? else {
            return Ok(None);
        };
        Ok(self.load(id)?.map(|wp| Group {
            _lock: lock,
            wp,
            ready: false,
            fresh: Vec::new(),
            failed: None,
        }))
    }

    /// The single path's decisions for one signal, against the group's in-memory state.
    fn decide(&self, g: usize, group: &mut Group, req: &SignalRequest, source: &Source) -> Slot {
        if let Some(m) = &group.failed {
            return Slot::Done(Err(Error::io(
                "cannot apply a signal to",
                self.home.waitpoint_dir(&group.wp.id),
                io::Error::other(m.clone()),
            )));
        }
        if !req.secret.verify(&group.wp.secret_sha256) {
            return Slot::Done(Ok(Verdict::Refused(Refusal::Unauthorized)));
        }
        if !group.ready {
            let prepared = self
                .recover(&mut group.wp)
                .and_then(|()| self.flush_outbox(&mut group.wp));
            if let Err(e) = prepared {
                group.failed = Some(e.to_string());
                return Slot::Done(Err(e));
            }
            group.ready = true;
        }
        let wp = &mut group.wp;
        let now = self.clock.now();
        if wp.status != Status::Armed && !in_grace_window(wp, now) {
            return Slot::Done(Ok(Verdict::Closed {
                id: wp.id.clone(),
                status: wp.status,
                next_due: next_due(wp),
            }));
        }
        let key = identity_key(&source.identity());
        if self.seen_contains(&wp.id, &key) || group.fresh.iter().any(|(_, k)| *k == key) {
            return Slot::Done(Ok(Verdict::Duplicate {
                id: wp.id.clone(),
                next_due: next_due(wp),
            }));
        }
        if let Err(r) = rules::check_member(wp, req.member.as_deref()) {
            return Slot::Done(Ok(Verdict::Refused(r)));
        }
        let record = next_record(wp, req, source.origin(), now);
        let seq = record.seq;
        group.fresh.push((record.clone(), key));
        let fresh: Vec<SignalRecord> = group.fresh.iter().map(|(r, _)| r.clone()).collect();
        match self.step_with(&mut group.wp, &record, &fresh) {
            Ok(wake) => Slot::Accepted {
                group: g,
                seq,
                wake,
                status: group.wp.status,
            },
            Err(e) => {
                group.failed = Some(e.to_string());
                Slot::Done(Err(e))
            }
        }
    }

    /// Commits the batch: one journal entry with every change, fdatasynced, then the files it
    /// describes written without their own fsync (the checkpoint syncs them). The caller holds
    /// `journal` from before the decisions until this returns, so the checkpointer never runs
    /// between an entry and its files.
    fn commit_groups(&self, journal: &mut Journal, groups: &mut [Group]) -> Result<()> {
        let mut changes = Vec::new();
        for g in groups.iter_mut().filter(|g| g.is_live()) {
            let wakes = g.wp.outbox.clone();
            self.mark_delivered(&mut g.wp);
            changes.push(JournalChange {
                state: g.wp.clone(),
                records: g.fresh.iter().map(|(r, _)| r.clone()).collect(),
                wakes,
            });
        }
        if changes.is_empty() {
            return Ok(());
        }
        let entry = JournalEntry {
            journal: JOURNAL_FORMAT,
            committed_at: self.clock.now(),
            changes,
        };
        journal.append(&serde_json::to_vec(&entry).expect("our records always serialise"))?;
        for g in groups.iter().filter(|g| g.is_live()) {
            for (_, key) in &g.fresh {
                self.seen_insert(&g.wp.id, key.clone());
            }
        }
        if let Err(e) = self.write_journaled(&entry.changes) {
            // Committed, but not every file is written: the next batch re-applies the journal
            // before it decides anything, and the signals of this one then count as duplicates.
            journal.set_needs_replay(true);
            return Err(e);
        }
        for g in groups.iter().filter(|g| g.is_live()) {
            if g.wp.status != Status::Armed && g.wp.pending_wake.is_none() {
                self.forget(&g.wp.id);
            }
        }
        Ok(())
    }

    /// Writes a just-committed entry's files.
    fn write_journaled(&self, changes: &[JournalChange]) -> Result<()> {
        crate::failpoint!(
            crate::failpoint::ENGINE_AFTER_JOURNAL,
            "cannot write the files of",
            &self.home.journal_dir()
        );
        self.write_changes(changes, false)
    }

    /// Writes the files `changes` describe, atomically but without fsync. A `replay` writes only
    /// what is missing or older on disk: a state whose signal count is below the entry's, a
    /// record or wake that is absent or unreadable. A waitpoint whose directory is gone
    /// (retention, a deleted session) is skipped.
    fn write_changes(&self, changes: &[JournalChange], replay: bool) -> Result<()> {
        let mut files = Unsynced::new();
        for change in changes {
            let id = &change.state.id;
            if replay && !self.home.waitpoint_dir(id).is_dir() {
                continue;
            }
            // The wakes first: a small batch is written in this order, and the wake is what a
            // waiting reader looks for.
            for wake in &change.wakes {
                if !replay || !crate::delivery::is_intact_in_new(&self.home, wake) {
                    crate::delivery::stage(&self.home, wake, &mut files);
                }
            }
            let dir = self.home.signals_dir(id);
            for record in &change.records {
                let identity = crate::request::identity_of(&record.source);
                let path = dir.join(signal_file_name(record.seq, &identity_key(&identity)));
                if !replay || !matches!(read_json::<SignalRecord>(&path), Ok(Some(_))) {
                    files.add_json(&path, record);
                }
            }
            let state = self.home.waitpoint_file(id);
            let stale = |disk: Waitpoint| disk.counters.signals < change.state.counters.signals;
            if !replay || read_json::<Waitpoint>(&state).map_or(true, |d| d.is_none_or(stale)) {
                files.replace_json(&state, &change.state);
            }
        }
        files.commit(self.trash())
    }

    /// Re-applies every entry left in the journal (after a crash, or a batch whose files could
    /// not all be written), then checkpoints it. Returns how many entries there were.
    pub(super) fn replay_locked(&self, journal: &mut Journal) -> Result<usize> {
        let entries = journal.entries()?;
        for e in &entries {
            let entry: JournalEntry =
                serde_json::from_slice(&e.bytes).map_err(|err| Error::Corrupt {
                    path: e.segment.clone(),
                    message: format!("line {}: {err}", e.line),
                })?;
            if entry.journal != JOURNAL_FORMAT {
                return Err(Error::Corrupt {
                    path: e.segment.clone(),
                    message: format!(
                        "line {}: journal format {} (this build reads {JOURNAL_FORMAT})",
                        e.line, entry.journal
                    ),
                });
            }
            self.write_changes(&entry.changes, true)?;
        }
        if !entries.is_empty() {
            tracing::warn!(
                entries = entries.len(),
                "replayed the journal a crash or a failed write left"
            );
        }
        // What this process believed about any waitpoint may predate the replayed records.
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
        journal.set_needs_replay(false);
        journal.checkpoint()?;
        Ok(entries.len())
    }
}
