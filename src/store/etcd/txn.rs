//! A transaction on the etcd store's waitpoints (the [`Txn`] implementation): the revisions it
//! read, which every write compares; a batch's commit is one etcd transaction, fenced.

use std::collections::HashMap;

use etcd_client::{Compare, CompareOp, DeleteOptions, TxnOp};

use crate::error::{Error, Result};
use crate::names::is_waitpoint_id;
use crate::records::Waitpoint;
use crate::request::record_key;
use crate::store::etcd::Etcd;
use crate::store::etcd::client::{Fetched, MAX_TXN_OPS, to_json};
use crate::store::etcd::fence::Proof;
use crate::store::{Change, Txn, Version};

/// A transaction: the revisions it read, which every write compares.
pub(super) struct EtcdTxn<'a> {
    store: &'a Etcd,
    read: HashMap<String, i64>,
    /// Waitpoints fetched ahead by [`Txn::prefetch`], each taken by its first read: its
    /// value and revision, or `None` when it does not exist.
    fetched: HashMap<String, Fetched>,
}

impl<'a> EtcdTxn<'a> {
    pub(super) fn new(store: &'a Etcd) -> Self {
        EtcdTxn {
            store,
            read: HashMap::new(),
            fetched: HashMap::new(),
        }
    }

    fn read_rev(&self, id: &str) -> Result<i64> {
        self.read.get(id).copied().ok_or_else(|| {
            Error::Conflict(format!(
                "{id} was not read for update before it was written"
            ))
        })
    }
}

impl Txn for EtcdTxn<'_> {
    fn prefetch(&mut self, ids: &[&str]) -> Result<()> {
        let ids: Vec<&str> = ids.iter().copied().filter(|i| is_waitpoint_id(i)).collect();
        for (id, found) in ids.iter().zip(self.store.fetch(&ids)?) {
            self.fetched.insert((*id).to_owned(), found);
        }
        Ok(())
    }

    fn read(&mut self, id: &str) -> Result<Option<(Waitpoint, Version)>> {
        if !is_waitpoint_id(id) {
            return Ok(None);
        }
        let key = self.store.keys.waitpoint(id);
        let got = match self.fetched.remove(id) {
            Some(got) => got,
            None => self.store.get_value(key.clone())?,
        };
        let Some((value, rev)) = got else {
            self.read.remove(id);
            return Ok(None);
        };
        let Some(wp) = self.store.parse_wp(&key, &value)? else {
            return Ok(None);
        };
        self.read.insert(id.to_owned(), rev);
        Ok(Some((wp, Version(rev as u64))))
    }

    fn version(&self, id: &str) -> Option<Version> {
        self.read.get(id).map(|r| Version(*r as u64))
    }

    fn put(&mut self, wp: &Waitpoint) -> Result<()> {
        let rev = self.read_rev(&wp.id)?;
        let key = self.store.keys.waitpoint(&wp.id);
        let compares = vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)];
        let mut proof = Proof::default();
        proof.value(key.clone(), to_json(wp));
        let new = self.store.guarded(
            "cannot write a waitpoint",
            compares,
            vec![TxnOp::put(key, to_json(wp), None)],
            &proof,
        )?;
        self.read.insert(wp.id.clone(), new);
        Ok(())
    }

    fn remove(&mut self, wp: &Waitpoint) -> Result<()> {
        let rev = self.read_rev(&wp.id)?;
        let key = self.store.keys.waitpoint(&wp.id);
        let compares = vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)];
        let mut ops = vec![
            TxnOp::delete(key, None),
            TxnOp::delete(
                self.store.keys.records_of(&wp.id),
                Some(DeleteOptions::new().with_prefix()),
            ),
            TxnOp::delete(self.store.keys.visible(&wp.session, &wp.id), None),
        ];
        if wp.channel != wp.session {
            ops.push(TxnOp::delete(
                self.store.keys.visible(&wp.channel, &wp.id),
                None,
            ));
        }
        // A removal leaves nothing only it could have left: a refusal stands as it is (the
        // waitpoint, read again, is gone or changed either way).
        self.store.guarded(
            "cannot remove a waitpoint",
            compares,
            ops,
            &Proof::default(),
        )?;
        self.read.remove(&wp.id);
        Ok(())
    }

    /// One etcd transaction for the whole batch: every waitpoint still at the revision read,
    /// the fence still this daemon's, then every state, record and wake. The wakes for this
    /// host are delivered at once after it and their keys removed; the others wait for their
    /// host's daemon (and these too, if this one dies in between).
    fn commit(&mut self, changes: &[Change]) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        // The records: written once, each with its sequence number and arrival time, so
        // finding them as written shows this commit was applied.
        let mut proof = Proof::default();
        for c in changes {
            let id = &c.change.state.id;
            let rev = self.read_rev(id)?;
            if rev as u64 != c.expect.0 {
                return Err(Error::Conflict(format!(
                    "{id} changed since it was read (revision {} then, {rev} now)",
                    c.expect.0
                )));
            }
            let key = self.store.keys.waitpoint(id);
            compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, rev));
            ops.push(TxnOp::put(key, to_json(&c.change.state), None));
            for r in &c.change.records {
                let k = self.store.keys.record_of(id, r);
                compares.push(Compare::version(k.clone(), CompareOp::Equal, 0));
                proof.value(k.clone(), to_json(r));
                ops.push(TxnOp::put(k, to_json(r), None));
            }
            for w in &c.change.wakes {
                ops.push(self.store.wake_op(w)?);
            }
        }
        // A signal another host handed over is forgotten by the transaction that records it:
        // applied and forgotten at once, one quorum write instead of two. (For a signal
        // dropped here the key is not there, and deleting it costs nothing.) Only when the
        // deletes fit in the transaction; otherwise the daemon's settle deletes them after.
        let recorded: Vec<String> = changes
            .iter()
            .flat_map(|c| &c.change.records)
            .map(record_key)
            .collect();
        let forgets = ops.len() + recorded.len() <= MAX_TXN_OPS;
        if forgets {
            ops.extend(
                recorded
                    .iter()
                    .map(|k| TxnOp::delete(self.store.keys.handed_over(k), None)),
            );
        }
        if proof.0.is_empty() {
            // A batch that records nothing (a deadline, a cancel) is shown by its states.
            for c in changes {
                let id = &c.change.state.id;
                proof.value(self.store.keys.waitpoint(id), to_json(&c.change.state));
            }
        }
        let rev = self
            .store
            .guarded("cannot commit signals", compares, ops, &proof)?;
        if forgets {
            self.store.settled_by_commit(recorded);
        }
        for c in changes {
            self.read.insert(c.change.state.id.clone(), rev);
        }
        // The fast path for this host's own wakes; the keys are the durable copy.
        let ours = changes.iter().flat_map(|c| &c.change.wakes).any(|w| {
            self.store
                .host_of(&w.channel)
                .is_ok_and(|h| h == self.store.host)
        });
        if ours && let Err(e) = self.store.deliver_pending_here() {
            tracing::warn!(error = %e, "wakes stay in the store for the next delivery");
        }
        Ok(())
    }

    fn replayed(&self) -> bool {
        false
    }
}
