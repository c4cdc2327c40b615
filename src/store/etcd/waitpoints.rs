//! The etcd store as a [`Store`]: waitpoints read, created, listed and copied whole (an
//! export, an import); what a shared store adds is answered by the file that owns it (the
//! watch, the election, hand-over and routing, health).

use std::collections::HashMap;

use etcd_client::{Compare, CompareOp, TxnOp};

use crate::delivery::Inboxes;
use crate::error::{Error, Result};
use crate::names::is_waitpoint_id;
use crate::records::{Callback, SignalRecord, Timer, Waitpoint, Wake};
use crate::store::etcd::client::to_json;
use crate::store::etcd::fence::Proof;
use crate::store::etcd::txn::EtcdTxn;
use crate::store::etcd::{Etcd, MAX_SIGNALS_PER_TXN};
use crate::store::{Cluster, Docs, Finding, Forwarded, Guard, Hint, Role, Store, Txn};
use crate::sync::MutexExt;

impl Etcd {
    /// A waitpoint's value; one that does not parse is set aside (`None`).
    pub(super) fn parse_wp(&self, key: &[u8], value: &[u8]) -> Result<Option<Waitpoint>> {
        match serde_json::from_slice::<Waitpoint>(value) {
            Ok(wp) => Ok(Some(wp)),
            Err(e) => {
                self.set_aside(key, value, &e.to_string())?;
                Ok(None)
            }
        }
    }
}

impl Store for Etcd {
    fn begin(&self) -> Result<Box<dyn Txn + '_>> {
        Ok(Box::new(EtcdTxn::new(self)))
    }

    fn begin_batch(&self) -> Result<Box<dyn Txn + '_>> {
        self.begin()
    }

    fn get(&self, id: &str) -> Result<Option<Waitpoint>> {
        if !is_waitpoint_id(id) {
            return Ok(None);
        }
        let key = self.keys.waitpoint(id);
        match self.get_value(key.clone())? {
            Some((v, _)) => self.parse_wp(&key, &v),
            None => Ok(None),
        }
    }

    fn get_many(&self, ids: &[&str]) -> Result<Vec<Option<Waitpoint>>> {
        let valid: Vec<&str> = ids.iter().copied().filter(|i| is_waitpoint_id(i)).collect();
        let mut found = valid.iter().zip(self.fetch(&valid)?);
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if !is_waitpoint_id(id) {
                out.push(None);
                continue;
            }
            let (_, got) = found.next().expect("one answer per valid id");
            out.push(match got {
                Some((v, _)) => self.parse_wp(&self.keys.waitpoint(id), &v)?,
                None => None,
            });
        }
        Ok(out)
    }

    fn create(&self, wp: &Waitpoint) -> Result<()> {
        let key = self.keys.waitpoint(&wp.id);
        let mut ops = vec![
            TxnOp::put(key.clone(), to_json(wp), None),
            TxnOp::put(self.keys.visible(&wp.session, &wp.id), Vec::new(), None),
            TxnOp::put(
                self.keys.channel(&wp.channel),
                self.host.as_bytes().to_vec(),
                None,
            ),
        ];
        if wp.channel != wp.session {
            ops.push(TxnOp::put(
                self.keys.visible(&wp.channel, &wp.id),
                Vec::new(),
                None,
            ));
        }
        let absent = vec![Compare::version(key, CompareOp::Equal, 0)];
        // A command arms; the fence is a daemon's (an import runs as a command too).
        // A waitpoint's id is random: its key there shows this create committed.
        let mut proof = Proof::default();
        proof.key(self.keys.waitpoint(&wp.id));
        self.guarded("cannot create a waitpoint", absent, ops, &proof)?;
        self.channels
            .lock_or_recover()
            .insert(wp.channel.clone(), self.host.clone());
        Ok(())
    }

    /// Both ranges at one revision, so the waitpoints and records agree.
    fn for_each_whole(
        &self,
        f: &mut dyn FnMut(Waitpoint, Vec<SignalRecord>) -> Result<()>,
    ) -> Result<Option<i64>> {
        let at = self.revision()?;
        let mut records: HashMap<String, Vec<SignalRecord>> = HashMap::new();
        for (k, v) in self.range(&self.keys.records(), false, at)? {
            let Some(id) = self.keys.record_owner(&k) else {
                continue;
            };
            match serde_json::from_slice::<SignalRecord>(&v) {
                Ok(r) => records.entry(id).or_default().push(r),
                Err(e) => {
                    tracing::warn!(
                        key = %String::from_utf8_lossy(&k),
                        error = %e,
                        "skipping a record that does not parse",
                    )
                }
            }
        }
        for (k, v) in self.range(&self.keys.waitpoints(), false, at)? {
            let Ok(wp) = serde_json::from_slice::<Waitpoint>(&v) else {
                tracing::warn!(
                    key = %String::from_utf8_lossy(&k),
                    "skipping a waitpoint that does not parse",
                );
                continue;
            };
            let mut recs = records.remove(&wp.id).unwrap_or_default();
            recs.sort_by_key(|r| r.seq);
            f(wp, recs)?;
        }
        Ok(Some(at))
    }

    /// The records first, in transactions of their own (invisible without the state), then
    /// the state and its index keys, guarded by the id being free.
    fn put_whole(&self, wp: &Waitpoint, records: &[SignalRecord]) -> Result<bool> {
        let key = self.keys.waitpoint(&wp.id);
        if self.get_value(key.clone())?.is_some() {
            return Ok(false);
        }
        let ops = records
            .iter()
            .map(|r| TxnOp::put(self.keys.record_of(&wp.id, r), to_json(r), None))
            .collect();
        self.in_chunks("cannot import records", ops)?;
        match self.create(wp) {
            Ok(()) => Ok(true),
            Err(Error::Conflict(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn timers(&self) -> &dyn Docs<Timer> {
        self
    }

    fn callbacks(&self) -> &dyn Docs<Callback> {
        self
    }

    fn identities(&self, id: &str) -> Result<Vec<(u64, String)>> {
        Ok(self
            .range(&self.keys.records_of(id), true, 0)?
            .into_iter()
            .filter_map(|(k, _)| self.keys.record_name(id, &k))
            .collect())
    }

    fn record(&self, id: &str, seq: u64, key: &str) -> Result<Option<SignalRecord>> {
        let k = self.keys.record(id, seq, key);
        match self.get_value(k.clone())? {
            Some((v, _)) => match serde_json::from_slice(&v) {
                Ok(r) => Ok(Some(r)),
                Err(e) => Err(Error::Corrupt {
                    path: String::from_utf8_lossy(&k).into_owned().into(),
                    message: e.to_string(),
                }),
            },
            None => Ok(None),
        }
    }

    fn for_each(&self, f: &mut dyn FnMut(Waitpoint) -> Result<()>) -> Result<()> {
        for (k, v) in self.range(&self.keys.waitpoints(), false, 0)? {
            if let Some(wp) = self.parse_wp(&k, &v)? {
                f(wp)?;
            }
        }
        Ok(())
    }

    fn list_visible(&self, session: &str) -> Result<Vec<Waitpoint>> {
        let ids: Vec<String> = self
            .range(&self.keys.visible_to(session), true, 0)?
            .into_iter()
            .filter_map(|(k, _)| self.keys.visible_id(session, &k))
            .collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut out: Vec<Waitpoint> = self
            .get_many(&ids)?
            .into_iter()
            .flatten()
            .filter(|wp| wp.visible_to(session))
            .collect();
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    /// The index keys are written in the transaction that creates the waitpoint.
    fn index_is_complete(&self) -> bool {
        true
    }

    fn rebuild_index(&self) -> Result<usize> {
        Ok(0)
    }

    fn watch(&self, hint: Box<dyn Fn(Hint) + Send>) -> Result<Guard> {
        self.watch_all(hint)
    }

    // Recovery, checkpoint and background work: the trait's defaults, since a transaction
    // here is whole or absent and durable once it returns.

    fn cluster(&self) -> Option<&dyn Cluster> {
        Some(self)
    }

    fn inboxes(&self) -> &Inboxes {
        &self.inboxes
    }

    fn deliver(&self, wake: &Wake) -> Result<()> {
        self.send_wake(wake)
    }
}

impl Cluster for Etcd {
    fn host(&self) -> &str {
        &self.host
    }

    fn applies_signals(&self) -> bool {
        self.role == Role::Daemon && self.fence_rev().is_some()
    }

    fn forward(&self, items: &[Forwarded]) -> Result<()> {
        self.hand_over(items)
    }

    fn forwarded(&self, max: usize) -> Result<Vec<Forwarded>> {
        self.handed_over(max)
    }

    fn settle_forwarded(&self, keys: &[String]) -> Result<()> {
        self.settle_handed_over(keys)
    }

    fn deliver_pending(&self) -> Result<usize> {
        self.deliver_pending_here()
    }

    fn health(&self) -> Vec<Finding> {
        self.checks()
    }

    fn lead(&self, on_change: Box<dyn Fn(bool) + Send + Sync>) -> Result<Guard> {
        match self.role {
            Role::Daemon => Ok(self.campaign(on_change)),
            Role::Command => Err(Error::Conflict("only a daemon leads".into())),
        }
    }

    fn max_batch(&self) -> usize {
        MAX_SIGNALS_PER_TXN
    }
}
