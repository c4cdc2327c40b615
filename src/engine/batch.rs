//! Group commit: a batch of signals applied with their fsyncs shared.
//!
//! [`Engine::apply_batch`] decides every signal exactly as [`Engine::apply_signal`] would, in
//! order, and then commits the batch in the same phases the single path commits one signal in:
//! every signal record, then every state (with its new wakes in the outbox), then every inbox
//! file, then every state with its outbox cleared. Each phase is one [`store::Batch`] (every
//! file fsynced, renamed, each directory fsynced once), and a phase starts only once the one
//! before it is durable, so the order of the single path holds for each signal: a crash leaves
//! exactly the states the single path can leave, and the same recovery finishes them. The
//! caller removes the spool files only after `apply_batch` returns, so each signal is durable
//! before its file goes.

use std::collections::HashMap;
use std::io;

use crate::error::{Error, Result};
use crate::ingress::{SignalRequest, Source};
use crate::model::{SignalRecord, Status, Waitpoint, WakeKind};
use crate::secret;
use crate::store::{Batch, FileLock, create_dir_private};

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
    /// Applies `items` in order with the verdicts [`apply_signal`](Engine::apply_signal) would
    /// give one by one, sharing each commit phase's fsyncs (see the module docs). One result per
    /// item; an `Err` means nothing was decided for it and its source must be kept.
    pub fn apply_batch(&self, items: &[(SignalRequest, Source)]) -> Vec<Result<Verdict>> {
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
                None => Slot::Done(Ok(Verdict::Refused(Refusal::Unauthorized))),
                Some(g) => self.decide(g, &mut groups[g], req, source),
            });
        }
        if let Err(e) = self.commit_groups(&mut groups) {
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
        if !secret::verify(&req.secret, &group.wp.secret_sha256) {
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
        let identity = source.identity();
        let key = identity_key(&identity);
        if self.seen_contains(&wp.id, &key) || group.fresh.iter().any(|(_, k)| *k == key) {
            return Slot::Done(Ok(Verdict::Duplicate {
                id: wp.id.clone(),
                next_due: next_due(wp),
            }));
        }
        if let Err(r) = rules::check_member(wp, req.member.as_deref()) {
            return Slot::Done(Ok(Verdict::Refused(r)));
        }
        let record = next_record(wp, req, identity, now);
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

    /// The four commit phases, each durable before the next starts.
    fn commit_groups(&self, groups: &mut [Group]) -> Result<()> {
        let live = |g: &&mut Group| !g.fresh.is_empty() && g.failed.is_none();
        let mut records = Batch::new();
        for g in groups.iter_mut().filter(live) {
            let dir = self.home.signals_dir(&g.wp.id);
            create_dir_private(&dir)?;
            for (record, key) in &g.fresh {
                records.stage_json(&dir.join(signal_file_name(record.seq, key)), record)?;
            }
        }
        records.commit()?;
        for g in groups.iter_mut().filter(live) {
            for (_, key) in &g.fresh {
                self.seen_insert(&g.wp.id, key.clone());
            }
        }
        // The state file of the first waitpoint committed, where a failpoint between phases
        // reports its injected fault (the `failpoints` feature only).
        #[cfg(feature = "failpoints")]
        let first_state = groups
            .iter()
            .find(|g| !g.fresh.is_empty() && g.failed.is_none())
            .map(|g| self.home.waitpoint_file(&g.wp.id));
        #[cfg(feature = "failpoints")]
        if let Some(path) = &first_state {
            crate::failpoint!(
                crate::failpoint::ENGINE_AFTER_RECORD,
                "cannot replace",
                path
            );
        }
        let mut states = Batch::new();
        for g in groups.iter_mut().filter(live) {
            states.stage_json(&self.home.waitpoint_file(&g.wp.id), &g.wp)?;
        }
        states.commit()?;
        #[cfg(feature = "failpoints")]
        if let Some(path) = &first_state {
            crate::failpoint!(crate::failpoint::ENGINE_AFTER_STATE, "cannot deliver", path);
        }
        let mut inbox = Batch::new();
        for g in groups.iter_mut().filter(live) {
            for wake in &g.wp.outbox {
                crate::delivery::stage(&self.home, wake, &mut inbox)?;
            }
        }
        #[cfg(feature = "failpoints")]
        let delivering = !inbox.is_empty();
        inbox.commit()?;
        #[cfg(feature = "failpoints")]
        if delivering && let Some(path) = &first_state {
            crate::failpoint!(
                crate::failpoint::ENGINE_AFTER_DELIVERY,
                "cannot replace",
                path
            );
        }
        let mut cleared = Batch::new();
        for g in groups.iter_mut().filter(live) {
            if !g.wp.outbox.is_empty() {
                self.mark_delivered(&mut g.wp);
                cleared.stage_json(&self.home.waitpoint_file(&g.wp.id), &g.wp)?;
            }
        }
        cleared.commit()?;
        for g in groups.iter_mut().filter(live) {
            if g.wp.status != Status::Armed && g.wp.pending_wake.is_none() {
                self.forget(&g.wp.id);
            }
        }
        Ok(())
    }
}
