//! The fenced commit: every write of the etcd store goes out as one transaction guarded by the
//! revisions it read and, for a daemon's write of a waitpoint or timer, by the daemon's
//! leadership (the [`Fence`]).
//!
//! The fence compares the creation revision of the daemon's election key: once its lease has
//! expired (it was paused, partitioned or killed) the key is gone, or another campaign's key
//! stands in its place with another revision, so nothing the daemon sends can commit, whatever
//! it still believes. Commands (`create`, `cancel`, …) write without the fence, under the same
//! revision checks. What a transaction carries and how its refusal is read are pure functions
//! ([`fence_for`], [`fenced_txn`], [`refusal`]), tested without a server.

use etcd_client::{Compare, CompareOp, Txn as EtcdTxnReq, TxnOp};

use crate::error::{Error, Result};
use crate::store::Role;
use crate::store::etcd::client::{MAX_TXN_OPS, store_error};
use crate::store::etcd::{Etcd, OWN_REVISIONS};
use crate::sync::MutexExt;

/// The leadership a daemon's writes are fenced by: its election key and that key's creation
/// revision, which no other campaign can reproduce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Fence {
    pub(super) key: Vec<u8>,
    pub(super) rev: i64,
}

/// The fence a write carries: a daemon's `fenced` write carries the one it holds, and is
/// refused without a request when it holds none (it does not lead: [`Error::LeaseLost`], to
/// be tried again after `lease_ttl_s`); a command's write, and a daemon's unfenced one (a
/// callback), carry none.
pub(super) fn fence_for(
    fenced: bool,
    role: Role,
    held: Option<Fence>,
    lease_ttl_s: u64,
) -> Result<Option<Fence>> {
    match (fenced, role) {
        (true, Role::Daemon) => held.map(Some).ok_or(Error::LeaseLost {
            retry_after_s: lease_ttl_s,
        }),
        _ => Ok(None),
    }
}

/// The transaction of a commit: `ops` if `compares` hold and, under a fence, the election key
/// still has the creation revision the fence holds; on failure, under a fence, the election key
/// as it is now, which tells a lost leadership from a stale read ([`refusal`]).
pub(super) fn fenced_txn(
    mut compares: Vec<Compare>,
    ops: Vec<TxnOp>,
    fence: Option<&Fence>,
) -> EtcdTxnReq {
    if let Some(f) = fence {
        compares.push(Compare::create_revision(
            f.key.clone(),
            CompareOp::Equal,
            f.rev,
        ));
    }
    // etcd-client takes the parts in this order only: when, and_then, or_else.
    let mut req = EtcdTxnReq::new().when(compares).and_then(ops);
    if let Some(f) = fence {
        req = req.or_else(vec![TxnOp::get(f.key.clone(), None)]);
    }
    req
}

/// Why a commit's transaction was refused, given the creation revisions of the election key
/// its failure branch read (`leader_now`; empty when the key is gone): the leadership
/// ([`Error::LeaseLost`], to be tried again after `lease_ttl_s`), when the fence's key is no
/// longer there at its revision; otherwise a stale read ([`Error::Conflict`]).
pub(super) fn refusal(
    what: &str,
    fence: Option<&Fence>,
    leader_now: &[i64],
    lease_ttl_s: u64,
) -> Error {
    match fence {
        Some(f) if !leader_now.contains(&f.rev) => Error::LeaseLost {
            retry_after_s: lease_ttl_s,
        },
        _ => Error::Conflict(format!(
            "{what}: it changed since it was read; read it again"
        )),
    }
}

/// What only a commit's own transaction leaves in the cluster: keys it creates that nobody
/// else would (a new waitpoint's random id: `None`, any value) or values nobody else would
/// write (a record with its sequence number and arrival time, a state or timer as this commit
/// decided it). A transaction whose first copy went unanswered and whose second copy failed
/// its comparisons is read back through these before it is called unwritten: if the first
/// copy committed, the second failed because of it.
#[derive(Clone, Debug, Default)]
pub(super) struct Proof(pub(super) Vec<(Vec<u8>, Option<Vec<u8>>)>);

impl Proof {
    pub(super) fn key(&mut self, key: Vec<u8>) {
        self.0.push((key, None));
    }

    pub(super) fn value(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.0.push((key, Some(value)));
    }
}

/// The revision at which `proof`'s transaction committed, given each of its keys as read back
/// at one revision (its value and modification revision; `None` when absent), or `None` when
/// that is not shown: a key missing, a value that differs. With nothing to read back (an empty
/// proof), nothing is shown.
pub(super) fn committed_at(proof: &Proof, found: &[Option<(Vec<u8>, i64)>]) -> Option<i64> {
    if proof.0.is_empty() || found.len() != proof.0.len() {
        return None;
    }
    let mut at = 0;
    for ((_, want), got) in proof.0.iter().zip(found) {
        let (value, rev) = got.as_ref()?;
        if want.as_ref().is_some_and(|w| w != value) {
            return None;
        }
        at = at.max(*rev);
    }
    Some(at)
}

impl Etcd {
    /// Commits `ops` if `compares` hold and, for a `fenced` write of a daemon, its leadership
    /// does too; returns the new revision. A daemon that does not lead is refused without a
    /// request; one whose lease lapsed is refused by the cluster and stops believing it leads.
    ///
    /// A refusal that came after a member went silent holding an earlier copy of the same
    /// transaction is read back through `proof` (one read of its keys, at one revision) before
    /// it is answered: when the earlier copy committed, the commit is answered as done, never
    /// as "nothing was written".
    pub(super) fn commit(
        &self,
        what: &str,
        compares: Vec<Compare>,
        ops: Vec<TxnOp>,
        fenced: bool,
        proof: &Proof,
    ) -> Result<i64> {
        if ops.len() > MAX_TXN_OPS {
            return Err(store_error(
                &self.loc,
                what,
                format!("{} operations, more than one transaction takes", ops.len()),
            ));
        }
        let held = self.fence.lock_or_recover().clone();
        let fence = fence_for(fenced, self.role, held, self.loc.lease_ttl_s)?;
        let (resp, retried) = self.txn_noting(what, fenced_txn(compares, ops, fence.as_ref()))?;
        let done = if resp.succeeded() {
            Some(resp.header().map_or(0, |h| h.revision()))
        } else if retried {
            let rev = self.read_back(what, proof)?;
            if let Some(r) = rev {
                tracing::info!(
                    revision = r,
                    "{what}: an earlier copy of this transaction, sent to a member that gave no \
                     answer, had committed; read back, it is answered as done"
                );
            }
            rev
        } else {
            None
        };
        if let Some(rev) = done {
            let mut own = self.own.lock_or_recover();
            if own.len() >= OWN_REVISIONS {
                own.pop_front();
            }
            own.push_back(rev);
            return Ok(rev);
        }
        let leader_now: Vec<i64> = resp
            .op_responses()
            .into_iter()
            .flat_map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => {
                    g.kvs().iter().map(|kv| kv.create_revision()).collect()
                }
                _ => Vec::new(),
            })
            .collect();
        let err = refusal(what, fence.as_ref(), &leader_now, self.loc.lease_ttl_s);
        if matches!(err, Error::LeaseLost { .. }) {
            self.lose_leadership();
        }
        Err(err)
    }

    /// Reads `proof`'s keys back at one revision: the revision its transaction committed at,
    /// if it did ([`committed_at`]).
    fn read_back(&self, what: &str, proof: &Proof) -> Result<Option<i64>> {
        if proof.0.is_empty() {
            return Ok(None);
        }
        let keys: Vec<Vec<u8>> = proof.0.iter().map(|(k, _)| k.clone()).collect();
        let found = self.get_keys(what, &keys)?;
        Ok(committed_at(proof, &found))
    }

    /// [`commit`](Self::commit), fenced: a waitpoint's or a timer's write.
    pub(super) fn guarded(
        &self,
        what: &str,
        compares: Vec<Compare>,
        ops: Vec<TxnOp>,
        proof: &Proof,
    ) -> Result<i64> {
        self.commit(what, compares, ops, true, proof)
    }

    /// The creation revision of the election key this daemon leads under, if it leads.
    pub(super) fn fence_rev(&self) -> Option<i64> {
        self.fence.lock_or_recover().as_ref().map(|f| f.rev)
    }

    pub(super) fn lose_leadership(&self) {
        *self.fence.lock_or_recover() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence() -> Fence {
        Fence {
            key: b"t/leader/694d7a1b2c3d4e5f".to_vec(),
            rev: 42,
        }
    }

    fn read_at(rev: i64) -> Vec<Compare> {
        vec![Compare::mod_revision(
            b"t/wp/wp_0123456789ab".to_vec(),
            CompareOp::Equal,
            rev,
        )]
    }

    fn put() -> Vec<TxnOp> {
        vec![TxnOp::put(
            b"t/wp/wp_0123456789ab".to_vec(),
            b"{}".to_vec(),
            None,
        )]
    }

    #[test]
    fn a_fenced_commit_also_compares_the_leader_keys_creation_revision_and_reads_it_on_failure() {
        let f = fence();
        let sent = fenced_txn(read_at(7), put(), Some(&f));
        let mut compares = read_at(7);
        compares.push(Compare::create_revision(
            f.key.clone(),
            CompareOp::Equal,
            42,
        ));
        let expected = EtcdTxnReq::new()
            .when(compares)
            .and_then(put())
            .or_else(vec![TxnOp::get(f.key.clone(), None)]);
        assert_eq!(format!("{sent:?}"), format!("{expected:?}"));
        // The creation revision, which names one campaign (see `Fence`), and not the
        // modification revision.
        let by_mod = EtcdTxnReq::new()
            .when({
                let mut c = read_at(7);
                c.push(Compare::mod_revision(f.key.clone(), CompareOp::Equal, 42));
                c
            })
            .and_then(put())
            .or_else(vec![TxnOp::get(f.key.clone(), None)]);
        assert_ne!(format!("{sent:?}"), format!("{by_mod:?}"));
    }

    #[test]
    fn a_commit_is_shown_done_only_when_every_key_of_its_proof_is_there_as_it_wrote_it() {
        let mut proof = Proof::default();
        proof.key(b"wp/new".to_vec());
        proof.value(b"rec/1".to_vec(), b"record".to_vec());
        let found = |a: Option<(&[u8], i64)>, b: Option<(&[u8], i64)>| {
            [a, b].map(|x| x.map(|(v, r)| (v.to_vec(), r))).to_vec()
        };
        // A created key shows with any value; a written one only with its value.
        assert_eq!(
            committed_at(
                &proof,
                &found(Some((b"changed since", 9)), Some((b"record", 7)))
            ),
            Some(9)
        );
        assert_eq!(
            committed_at(&proof, &found(None, Some((b"record", 7)))),
            None
        );
        assert_eq!(
            committed_at(
                &proof,
                &found(Some((b"x", 7)), Some((b"another record", 7)))
            ),
            None
        );
        assert_eq!(committed_at(&proof, &found(Some((b"x", 7)), None)), None);
        // Nothing to read back shows nothing.
        assert_eq!(committed_at(&Proof::default(), &[]), None);
    }

    #[test]
    fn an_unfenced_commit_compares_only_what_it_read() {
        let sent = fenced_txn(read_at(7), put(), None);
        let expected = EtcdTxnReq::new().when(read_at(7)).and_then(put());
        assert_eq!(format!("{sent:?}"), format!("{expected:?}"));
    }

    #[test]
    fn a_daemon_holding_no_fence_is_refused_before_any_request_as_a_lost_lease() {
        let refused = fence_for(true, Role::Daemon, None, 5).unwrap_err();
        assert!(
            matches!(refused, Error::LeaseLost { retry_after_s: 5 }),
            "{refused:?}"
        );
        assert_eq!(
            fence_for(true, Role::Daemon, Some(fence()), 5).unwrap(),
            Some(fence())
        );
        // A command, and a daemon's callback write, go out without the fence.
        assert_eq!(fence_for(true, Role::Command, None, 5).unwrap(), None);
        assert_eq!(
            fence_for(false, Role::Daemon, Some(fence()), 5).unwrap(),
            None
        );
        assert_eq!(fence_for(false, Role::Daemon, None, 5).unwrap(), None);
    }

    #[test]
    fn a_refusal_is_a_lost_lease_only_when_the_leader_key_is_gone_or_another_campaigns() {
        let f = fence();
        for leader_now in [&[][..], &[43][..]] {
            let e = refusal("cannot commit signals", Some(&f), leader_now, 9);
            assert!(matches!(e, Error::LeaseLost { retry_after_s: 9 }), "{e:?}");
        }
        // The fence held, so a revision this transaction read moved: a stale read.
        let stale = refusal("cannot commit signals", Some(&f), &[42], 9);
        assert!(matches!(stale, Error::Conflict(_)), "{stale:?}");
        assert!(stale.to_string().contains("read it again"), "{stale}");
        let unfenced = refusal("cannot write a timer or callback", None, &[], 9);
        assert!(matches!(unfenced, Error::Conflict(_)), "{unfenced:?}");
    }
}
