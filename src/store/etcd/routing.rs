//! Hand-over and wake routing across hosts: a signal a standby received kept in `in/` for the
//! leader (and forgotten once applied); a wake sent to the host that armed its channel (the
//! channel's host read from `chan/` and remembered), kept under `wake/<host>/` until that
//! host's daemon has delivered it into the session's inbox.

use etcd_client::{GetOptions, SortOrder, SortTarget, Txn as EtcdTxnReq, TxnOp};

use crate::error::Result;
use crate::records::Wake;
use crate::store::Forwarded;
use crate::store::etcd::Etcd;
use crate::store::etcd::client::{MAX_TXN_BYTES, MAX_TXN_OPS, to_json};
use crate::sync::MutexExt;

impl Etcd {
    /// The host whose inbox `channel`'s wakes go to.
    pub(super) fn host_of(&self, channel: &str) -> Result<String> {
        if let Some(h) = self.channels.lock_or_recover().get(channel) {
            return Ok(h.clone());
        }
        let host = match self.get_value(self.keys.channel(channel))? {
            Some((v, _)) => String::from_utf8_lossy(&v).into_owned(),
            // Armed before hosts were recorded (an import): the applying host keeps it.
            None => self.host.clone(),
        };
        self.channels
            .lock_or_recover()
            .insert(channel.to_owned(), host.clone());
        Ok(host)
    }

    pub(super) fn wake_op(&self, wake: &Wake) -> Result<TxnOp> {
        let host = self.host_of(&wake.channel)?;
        let key = self.keys.wake(&host, &wake.wake_id);
        Ok(TxnOp::put(key, to_json(wake), None))
    }

    /// Delivers every wake waiting for this host into its home's inboxes, each durably before
    /// its key goes: a crash in between delivers it again under the same name, which is a
    /// no-op for a reader. Returns how many it delivered.
    pub(super) fn deliver_pending_here(&self) -> Result<usize> {
        let prefix = self.keys.wakes_for(&self.host);
        let mut n = 0;
        for (key, value) in self.range(&prefix, false, 0)? {
            match serde_json::from_slice::<Wake>(&value) {
                Ok(wake) => self.inboxes.deliver(&wake)?,
                Err(e) => self.set_aside(&key, &value, &e.to_string())?,
            }
            self.call("cannot settle a delivered wake", |mut c| {
                let key = key.clone();
                async move { c.delete(key, None).await }
            })?;
            n += 1;
        }
        Ok(n)
    }

    /// Keeps signals for the leader under `in/<identity>`, in as few transactions as take
    /// them: at most [`MAX_TXN_OPS`] keys and [`MAX_TXN_BYTES`] of values each (a signal may
    /// carry 64 KiB, and etcd refuses a request past 1.5 MiB unless told otherwise).
    ///
    /// One identity goes once: a sender's retry that arrives while its first copy waits in the
    /// same batch (the nemesis's clients, after a timeout) is the same signal, and etcd refuses
    /// a whole transaction that names a key twice, which failed every signal of the batch.
    pub(super) fn hand_over(&self, items: &[Forwarded]) -> Result<()> {
        let send = |ops: Vec<TxnOp>| {
            self.txn("cannot hand signals over", EtcdTxnReq::new().and_then(ops))
                .map(drop)
        };
        let (mut ops, mut bytes) = (Vec::new(), 0);
        let mut seen = std::collections::HashSet::new();
        for f in items.iter().filter(|f| seen.insert(f.key.as_str())) {
            let value = to_json(f);
            if !ops.is_empty() && (ops.len() == MAX_TXN_OPS || bytes + value.len() > MAX_TXN_BYTES)
            {
                send(std::mem::take(&mut ops))?;
                bytes = 0;
            }
            bytes += value.len();
            ops.push(TxnOp::put(self.keys.handed_over(&f.key), value, None));
        }
        if !ops.is_empty() {
            send(ops)?;
        }
        Ok(())
    }

    /// Up to `max` signals handed over, the oldest first; one that does not parse is set
    /// aside.
    pub(super) fn handed_over(&self, max: usize) -> Result<Vec<Forwarded>> {
        let prefix = self.keys.all_handed_over();
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Mod, SortOrder::Ascend)
            .with_limit(max as i64);
        let mut resp = self.read("cannot read handed-over signals", &prefix, Some(options))?;
        let mut out = Vec::new();
        for kv in resp.take_kvs() {
            match serde_json::from_slice::<Forwarded>(kv.value()) {
                Ok(f) => out.push(f),
                Err(e) => self.set_aside(kv.key(), kv.value(), &e.to_string())?,
            }
        }
        Ok(out)
    }

    /// Forgets signals handed over once applied: those whose record's commit deleted their
    /// key already (see `EtcdTxn::commit`) cost nothing, the others one delete each, in as few
    /// transactions as fit.
    pub(super) fn settle_handed_over(&self, keys: &[String]) -> Result<()> {
        let ops: Vec<TxnOp> = {
            let mut settled = self.settled.lock_or_recover();
            keys.iter()
                .filter(|k| !settled.remove(*k))
                .map(|k| TxnOp::delete(self.keys.handed_over(k), None))
                .collect()
        };
        self.in_chunks("cannot settle handed-over signals", ops)
    }

    /// Notes the identity keys whose `in/` keys a commit deleted with their records.
    pub(super) fn settled_by_commit(&self, keys: Vec<String>) {
        let mut settled = self.settled.lock_or_recover();
        if settled.len() + keys.len() > super::SETTLED_KEYS {
            settled.clear();
        }
        settled.extend(keys);
    }

    /// Delivers a wake here when its channel's host is this one; otherwise keeps it for that
    /// host.
    pub(super) fn send_wake(&self, wake: &Wake) -> Result<()> {
        if self.host_of(&wake.channel)? == self.host {
            return self.inboxes.deliver(wake);
        }
        let op = self.wake_op(wake)?;
        let req = EtcdTxnReq::new().and_then(vec![op]);
        self.txn("cannot send a wake", req)?;
        Ok(())
    }
}
