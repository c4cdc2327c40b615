//! Applying signals: a batch decided in memory, then committed all or nothing.
//!
//! [`Engine::apply_batch`] decides every signal exactly as one-by-one collection would, in
//! order, against each waitpoint's state as its transaction read it. The batch then becomes one
//! [`Txn::commit`] (every record, state and wake it changes), guarded by the versions read: on
//! the home's files, one fdatasynced journal line (see `store/files.rs`). The caller removes
//! the spool files only after `apply_batch` returns, so each signal is durable before its file
//! goes. See `ARCHITECTURE.md`, "Commit order".

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::records::{JournalChange, SignalRecord, Status, Waitpoint, WakeKind};
use crate::request::{SignalRequest, Source};
use crate::store::{Change, Txn, Version};

use super::rules::Refusal;
use super::{Engine, Verdict, in_grace_window, next_due, next_record, rules};
use crate::request::identity_key;

/// The most signals the daemon collects and hands to [`Engine::apply_batch`] at once. A batch
/// is committed in as few commits as the two bounds below allow: a burst to a few busy
/// waitpoints (a job's progress reports) becomes one commit of up to this many, which rewrites
/// each waitpoint's state and log once instead of once per 128 signals.
pub const MAX_BATCH: usize = 512;
/// The most waitpoints one commit touches. It bounds the open files a commit holds: one lock
/// per waitpoint, and one directory handle per directory its files are written in.
pub const MAX_WAITPOINTS_PER_COMMIT: usize = 128;
/// The most signals of one waitpoint one commit decides: the state's folded identities
/// ([`rules::LOG_KEYS`]) remember twice as many, so a crash that brings back every file of a
/// commit finds each a duplicate.
pub const MAX_SIGNALS_PER_WAITPOINT: usize = 128;
const _: () = assert!(rules::LOG_KEYS >= 2 * MAX_SIGNALS_PER_WAITPOINT);

/// Cuts `items` into the runs, in order, that are each one commit: at most `max` signals (what
/// the store takes in one transaction) and [`MAX_BATCH`], at most [`MAX_WAITPOINTS_PER_COMMIT`]
/// waitpoints, at most [`MAX_SIGNALS_PER_WAITPOINT`] signals of one waitpoint.
fn commit_runs(items: &[(SignalRequest, Source)], max: usize) -> Vec<std::ops::Range<usize>> {
    let max = max.clamp(1, MAX_BATCH);
    let mut runs = Vec::new();
    let mut start = 0;
    let mut per: HashMap<&str, usize> = HashMap::new();
    for (i, (req, _)) in items.iter().enumerate() {
        let full = i - start == max
            || per.get(req.id.as_str()) == Some(&MAX_SIGNALS_PER_WAITPOINT)
            || (per.len() == MAX_WAITPOINTS_PER_COMMIT && !per.contains_key(req.id.as_str()));
        if full {
            runs.push(start..i);
            start = i;
            per.clear();
        }
        *per.entry(req.id.as_str()).or_default() += 1;
    }
    if start < items.len() {
        runs.push(start..items.len());
    }
    runs
}

/// One waitpoint touched by the batch, held by the batch's transaction until it is done.
struct Group {
    wp: Waitpoint,
    /// The version the transaction read it at, which the commit must still match.
    version: Version,
    /// Whether `recover` and the outbox flush have run (once, before the first signal counts).
    ready: bool,
    /// Records decided in this batch that the log keeps whole, not yet on disk.
    kept: Vec<SignalRecord>,
    /// The identity keys of every signal decided in this batch, kept or folded.
    keys: Vec<String>,
    /// Why the batch failed for this waitpoint, kept as the error it was (a lost lease stays
    /// one), for every item of the group.
    failed: Option<Error>,
}

impl Group {
    /// Whether the batch commits anything for this waitpoint: signals decided, none failed.
    fn is_live(&self) -> bool {
        !self.keys.is_empty() && self.failed.is_none()
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

/// The same failure for each of `n` items (nothing was decided for any of them), of the kind
/// it was: a lost lease is answered as one (exit 75, HTTP 503 with `Retry-After`).
fn fail_all(n: usize, e: &Error) -> Vec<Result<Verdict>> {
    (0..n).map(|_| Err(e.replicate())).collect()
}

/// The verdict of an accepted slot, given what became of its group; `None` for a slot decided
/// without one.
fn verdict_of(slot: &Slot, groups: &[Group]) -> Option<Result<Verdict>> {
    let Slot::Accepted {
        group,
        seq,
        wake,
        status,
    } = slot
    else {
        return None;
    };
    let g = &groups[*group];
    Some(match &g.failed {
        Some(e) => Err(e.replicate()),
        // Every item of a waitpoint carries its final next due time: the daemon applies them
        // in order, so the last one is what counts.
        None => Ok(Verdict::Accepted {
            next_due: next_due(&g.wp),
            id: g.wp.id.clone(),
            seq: *seq,
            wake: *wake,
            status: *status,
        }),
    })
}

/// A drop-zone file named by its host, unless its name is a key `cortex-signal` minted (that
/// key is the signal's identity on every host and every route).
fn qualify(source: &Source, host: &str) -> Source {
    match source {
        Source::Spool(name)
            if !crate::request::identity_of(&source.origin()).starts_with("key:") =>
        {
            Source::Spool(format!("{name}@{host}"))
        }
        other => other.clone(),
    }
}

impl Engine {
    /// Applies `items` in order with the verdicts they would get one by one, committed together
    /// as one journal line (see the module docs). One result per item; an `Err` means nothing
    /// was decided for it and its source must be kept.
    ///
    /// On a store shared by several hosts, a drop-zone file's identity is qualified with this
    /// host (the same name on two hosts is two signals), a batch is cut to what one of its
    /// transactions takes, and a process that does not apply signals hands them over to the
    /// one that does ([`Verdict::Queued`]).
    pub fn apply_batch(&self, items: &[(SignalRequest, Source)]) -> Vec<Result<Verdict>> {
        self.apply_batch_notify(items, &mut |_, _| {})
    }

    /// [`Engine::apply_batch`], telling `durable` the verdict of each item (by its index in
    /// `items`) as soon as the commit holding it is durable, before its files are written. An
    /// item told there is durable whatever the returned result says of it later: a failure to
    /// write the files after the commit is repaired by the store, and a retry of the signal is
    /// then a duplicate. Items not told (refused before any commit, or in a batch that failed)
    /// have only the returned result.
    pub fn apply_batch_notify(
        &self,
        items: &[(SignalRequest, Source)],
        durable: &mut dyn FnMut(usize, &Verdict),
    ) -> Vec<Result<Verdict>> {
        let qualified;
        let items = match self.store.host() {
            None => items,
            Some(host) => {
                qualified = items
                    .iter()
                    .map(|(r, s)| (r.clone(), qualify(s, host)))
                    .collect::<Vec<_>>();
                &qualified[..]
            }
        };
        let mut out = Vec::with_capacity(items.len());
        // Applying a signal writes several keys, and the store says how many signals fit in
        // one of its transactions. Handing one over writes one key: a standby hands the
        // whole batch over at once (the store cuts it to what a transaction takes). Decided
        // once for the batch, so a leadership that changes meanwhile never has a leader apply
        // a chunk cut for handing over (a standby that became the leader hands over to itself,
        // which is harmless).
        let applies = self.store.applies_signals();
        let size = match applies {
            true => self.store.max_batch(),
            false => MAX_BATCH,
        };
        for run in commit_runs(items, size) {
            let chunk = &items[run];
            if applies {
                let offset = out.len();
                out.extend(self.apply_chunk(chunk, &mut |i, v| durable(offset + i, v)));
            } else {
                out.extend(self.forward_chunk(chunk));
            }
        }
        out
    }

    /// Applies handed-over signals (the leading daemon of a shared store): their sources are
    /// qualified already.
    pub fn apply_forwarded(&self, items: &[(SignalRequest, Source)]) -> Vec<Result<Verdict>> {
        commit_runs(items, self.store.max_batch())
            .into_iter()
            .flat_map(|run| self.apply_chunk(&items[run], &mut |_, _| {}))
            .collect()
    }

    /// Checks each signal's id and secret here (a refusal is parked on this host, as always)
    /// and hands the rest over, durably, with the secret as its hash.
    fn forward_chunk(&self, items: &[(SignalRequest, Source)]) -> Vec<Result<Verdict>> {
        let host = self.store.host().unwrap_or("").to_owned();
        let now = self.clock.now();
        let ids: Vec<&str> = items.iter().map(|(r, _)| r.id.as_str()).collect();
        let read = match self.store.get_many(&ids) {
            Ok(read) => read,
            Err(e) => return fail_all(items.len(), &e),
        };
        let mut verdicts = Vec::with_capacity(items.len());
        let mut handed = Vec::new();
        for ((req, source), wp) in items.iter().zip(read) {
            let verdict = match wp {
                None => Ok(Verdict::Refused(Refusal::UnknownId)),
                Some(wp) if !req.secret.verify(&wp.secret_sha256) => {
                    Ok(Verdict::Refused(Refusal::Unauthorized))
                }
                Some(wp) if wp.status != Status::Armed && !in_grace_window(&wp, now) => {
                    // A retry of a signal that counted is a duplicate, as where it is applied.
                    let key = identity_key(&source.identity());
                    match self.store.identities(&wp.id) {
                        Err(e) => Err(e),
                        Ok(ids)
                            if rules::is_folded(&wp, &key)
                                || ids.iter().any(|(_, k)| *k == key) =>
                        {
                            Ok(Verdict::Duplicate {
                                id: wp.id,
                                next_due: None,
                            })
                        }
                        Ok(_) => Ok(Verdict::Closed {
                            id: wp.id,
                            status: wp.status,
                            next_due: None,
                        }),
                    }
                }
                Some(wp) if let Err(r) = rules::check_member(&wp, req.member.as_deref()) => {
                    Ok(Verdict::Refused(r))
                }
                Some(_) => {
                    handed.push(crate::store::Forwarded::new(req, source, &host, now));
                    Ok(Verdict::Queued { id: req.id.clone() })
                }
            };
            verdicts.push(verdict);
        }
        let forwarded = match self.store.cluster() {
            Some(cluster) => cluster.forward(&handed),
            None if handed.is_empty() => Ok(()),
            None => Err(crate::error::Error::Conflict(
                "this store applies signals where they arrive; there is nobody to forward to"
                    .into(),
            )),
        };
        if let Err(e) = forwarded {
            for v in &mut verdicts {
                if matches!(v, Ok(Verdict::Queued { .. })) {
                    *v = Err(e.replicate());
                }
            }
        }
        verdicts
    }

    fn apply_chunk(
        &self,
        items: &[(SignalRequest, Source)],
        durable: &mut dyn FnMut(usize, &Verdict),
    ) -> Vec<Result<Verdict>> {
        let mut txn = match self.store.begin_batch() {
            Ok(t) => t,
            Err(e) => return fail_all(items.len(), &e),
        };
        if txn.replayed() {
            // What this process believed about any waitpoint may predate the replayed records.
            self.forget_all();
        }
        let txn = txn.as_mut();
        let mut ids: Vec<&str> = items.iter().map(|(r, _)| r.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        if let Err(e) = txn.prefetch(&ids) {
            return fail_all(items.len(), &e);
        }
        let mut groups: Vec<Group> = Vec::new();
        // `None`: no such waitpoint (every item naming it is refused).
        let mut by_id: HashMap<&str, Option<usize>> = HashMap::new();
        let mut slots = Vec::with_capacity(items.len());
        for (req, source) in items {
            let g = match by_id.get(req.id.as_str()) {
                Some(g) => *g,
                None => match self.open_group(txn, &req.id) {
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
                Some(g) => self.decide(txn, g, &mut groups[g], req, source),
            });
        }
        let told = &mut |groups: &[Group]| {
            for (i, slot) in slots.iter().enumerate() {
                match slot {
                    Slot::Done(Ok(v)) => durable(i, v),
                    Slot::Done(Err(_)) => {}
                    accepted => {
                        if let Some(Ok(v)) = verdict_of(accepted, groups) {
                            durable(i, &v);
                        }
                    }
                }
            }
        };
        if let Err(e) = self.commit_groups(txn, &mut groups, told) {
            for (id, g) in &by_id {
                if let Some(g) = g
                    && !groups[*g].keys.is_empty()
                {
                    groups[*g].failed.get_or_insert_with(|| e.replicate());
                    // Records may be on disk without the state: the next attempt must recover.
                    self.forget(id);
                }
            }
        }
        slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Done(r) => r,
                accepted => verdict_of(&accepted, &groups).expect("an accepted slot"),
            })
            .collect()
    }

    fn open_group(&self, txn: &mut dyn Txn, id: &str) -> Result<Option<Group>> {
        Ok(txn.read(id)?.map(|(wp, version)| Group {
            wp,
            version,
            ready: false,
            kept: Vec::new(),
            keys: Vec::new(),
            failed: None,
        }))
    }

    /// The single path's decisions for one signal, against the group's in-memory state.
    fn decide(
        &self,
        txn: &mut dyn Txn,
        g: usize,
        group: &mut Group,
        req: &SignalRequest,
        source: &Source,
    ) -> Slot {
        if let Some(e) = &group.failed {
            return Slot::Done(Err(e.replicate()));
        }
        if !req.secret.verify(&group.wp.secret_sha256) {
            return Slot::Done(Ok(Verdict::Refused(Refusal::Unauthorized)));
        }
        if !group.ready {
            let prepared = self
                .recover(txn, &mut group.wp)
                .and_then(|()| self.flush_outbox(txn, &mut group.wp));
            if let Err(e) = prepared {
                group.failed = Some(e.replicate());
                return Slot::Done(Err(e));
            }
            // Recovery and the flush may have written the state; the commit is checked against
            // what they left (no second read: the transaction knows its own writes).
            match txn.version(&group.wp.id) {
                Some(version) => group.version = version,
                None => {
                    let e = Error::not_found("waitpoint", &group.wp.id);
                    group.failed = Some(e.replicate());
                    return Slot::Done(Err(e));
                }
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
        if self.seen_contains(&wp.id, &key)
            || group.keys.contains(&key)
            || rules::is_folded(wp, &key)
        {
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
        // Among the batch's records for the log while it is decided; the step leaves it as
        // the log keeps it (whole, without its data, or taken out again when folded).
        group.kept.push(record);
        let stepped = self.step_with(&mut group.wp, &key, &mut group.kept);
        group.keys.push(key);
        match stepped {
            Ok(wake) => Slot::Accepted {
                group: g,
                seq,
                wake,
                status: group.wp.status,
            },
            Err(e) => {
                group.failed = Some(e.replicate());
                Slot::Done(Err(e))
            }
        }
    }

    /// Commits the batch: one [`Txn::commit`] with every live group's change, each guarded by
    /// the version its state was read at. The transaction holds every group from before the
    /// decisions until this returns.
    fn commit_groups(
        &self,
        txn: &mut dyn Txn,
        groups: &mut [Group],
        durable: &mut dyn FnMut(&[Group]),
    ) -> Result<()> {
        let mut changes = Vec::new();
        for g in groups.iter_mut().filter(|g| g.is_live()) {
            let wakes = g.wp.outbox.clone();
            self.mark_delivered(&mut g.wp);
            changes.push(Change {
                expect: g.version,
                change: JournalChange {
                    state: g.wp.clone(),
                    records: g.kept.clone(),
                    wakes,
                },
            });
        }
        if changes.is_empty() {
            return Ok(());
        }
        let groups: &[Group] = groups;
        txn.commit_notify(&changes, &mut || durable(groups))?;
        for g in groups.iter().filter(|g| g.is_live()) {
            // Only what the log keeps: a folded signal is remembered by the state's bounded
            // `log.keys`, so a flood grows neither the log nor this process's memory.
            for record in &g.kept {
                self.seen_insert(&g.wp.id, crate::request::record_key(record));
            }
            if g.wp.status != Status::Armed && g.wp.pending_wake.is_none() {
                self.forget(&g.wp.id);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::SignalStatus;
    use crate::secret::Secret;

    /// A signal to `id` for [`commit_runs`], which looks at nothing else.
    fn to(id: String) -> (SignalRequest, Source) {
        let req = SignalRequest {
            id,
            secret: Secret::new("s"),
            status: SignalStatus::Progress,
            message: None,
            member: None,
            data: None,
        };
        (req, Source::Spool("f.json".into()))
    }

    fn lengths(items: &[(SignalRequest, Source)], max: usize) -> Vec<usize> {
        let runs = commit_runs(items, max);
        // The runs cover the items in order, each once.
        let mut next = 0;
        for run in &runs {
            assert_eq!(run.start, next);
            assert!(!run.is_empty());
            next = run.end;
        }
        assert_eq!(next, items.len());
        runs.iter().map(|r| r.len()).collect()
    }

    #[test]
    fn a_burst_to_a_few_waitpoints_is_one_commit_of_up_to_a_batch() {
        let items: Vec<_> = (0..600).map(|i| to(format!("wp_{}", i % 50))).collect();
        assert_eq!(lengths(&items, usize::MAX), [512, 88]);
        // A store that takes fewer signals in one transaction (etcd) cuts there.
        assert_eq!(lengths(&items[..100], 40), [40, 40, 20]);
    }

    #[test]
    fn a_commit_touches_at_most_its_share_of_waitpoints() {
        let items: Vec<_> = (0..300).map(|i| to(format!("wp_{i}"))).collect();
        assert_eq!(lengths(&items, usize::MAX), [128, 128, 44]);
        // A waitpoint met again within the commit does not count twice.
        let mut again: Vec<_> = (0..128).map(|i| to(format!("wp_{i}"))).collect();
        again.push(to("wp_0".into()));
        again.push(to("wp_new".into()));
        assert_eq!(lengths(&again, usize::MAX), [129, 1]);
    }

    #[test]
    fn a_commit_decides_at_most_its_share_of_one_waitpoints_signals() {
        let mut items: Vec<_> = (0..300).map(|_| to("wp_busy".into())).collect();
        items.insert(10, to("wp_other".into()));
        assert_eq!(lengths(&items, usize::MAX), [129, 128, 44]);
    }
}
