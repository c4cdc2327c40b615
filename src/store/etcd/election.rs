//! The election of the daemon that applies signals: a campaign on a kept-alive lease, the
//! fence taken when it wins and dropped the moment the lease may have run out, and the lease's
//! renewals moved to the next member when theirs stops answering. The campaign is etcd's
//! election made of bounded requests (a candidate key per lease, the oldest leads), each on the
//! first member that answers, so no member that went silent holds it (issue 40: a campaign
//! waiting on a cut-off member kept every daemon from leading for 15 s). The leader renews a
//! liveness mark (its key rewritten) and a candidate that reads the same mark for a whole lease
//! deposes it, conditioned on that mark: a new raft leader gives every lease its whole TTL
//! again, so a leader cut off with the raft leader member kept its key past the lease (issue
//! 40's missed failover target). A daemon that stops
//! leading campaigns again on a new lease; its old lease is revoked, again and again while the
//! cluster has no quorum, and dropping the campaign revokes its lease, so a standby takes over
//! at once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

use crate::store::etcd::Etcd;
use crate::store::etcd::client::REQUEST_TIMEOUT;
use crate::store::etcd::endpoints::{ATTEMPT_TIMEOUT, CallError, Members};
use crate::store::etcd::fence::Fence;
use crate::sync::MutexExt;

impl Etcd {
    /// Campaigns for leadership until the guard drops, telling `on_change` each time this
    /// daemon starts or stops leading. The lease is kept alive while the campaign waits; when
    /// a renewal fails or the lease runs out, leadership is given up at once (the fence stops
    /// writes server-side anyway) and a new campaign starts on a new lease.
    pub fn campaign(&self, on_change: Box<dyn Fn(bool) + Send + Sync>) -> crate::store::Guard {
        let members = Arc::clone(&self.members);
        let fence = Arc::clone(&self.fence);
        let name = self.keys.election();
        let host = self.host.clone();
        let ttl = self.loc.lease_ttl_s as i64;
        let shown = self.loc.display();
        let lease = Arc::new(Mutex::new(None::<i64>));
        let held = Arc::clone(&lease);
        let task = self.rt().spawn(async move {
            // The oldest other candidate's mark as this daemon read it, kept across its own
            // leases: a standby whose lease lapsed (its renewals were on the cut-off raft
            // leader) counts the leader's silence on from where it was, not from its new lease.
            let seen = Mutex::new(None);
            loop {
                let who = Candidate {
                    name: &name,
                    host: &host,
                    ttl,
                };
                if let Err(e) = lead_once(&members, &fence, who, &held, &seen, &on_change).await {
                    tracing::warn!(
                        store = %shown,
                        error = %e,
                        "leadership lost; campaigning again",
                    );
                }
                if fence.lock_or_recover().take().is_some() {
                    on_change(false);
                }
                // As often as the campaign reads: after a quorum returns, the next lease is
                // asked for within one poll.
                tokio::time::sleep(CAMPAIGN_POLL).await;
            }
        });
        crate::store::Guard::new(Campaign {
            task: task.abort_handle(),
            lease,
            members: Arc::clone(&self.members),
            handle: self.rt().handle().clone(),
            fence: Arc::clone(&self.fence),
        })
    }
}

/// Who campaigns: the election's name, this host, the lease's TTL in seconds.
#[derive(Clone, Copy)]
struct Candidate<'a> {
    name: &'a [u8],
    host: &'a str,
    ttl: i64,
}

/// One lease: campaign on it, lead while it lives.
async fn lead_once(
    members: &Arc<Members>,
    fence: &Mutex<Option<Fence>>,
    who: Candidate<'_>,
    held: &Mutex<Option<i64>>,
    seen: &Mutex<Option<Seen>>,
    on_change: &(dyn Fn(bool) + Send + Sync),
) -> std::result::Result<(), String> {
    let Candidate { name, host, ttl } = who;
    let asked = Instant::now();
    let (grant, _) = members
        .run(REQUEST_TIMEOUT, |mut c| async move {
            c.lease_grant(ttl, None).await
        })
        .await
        .map_err(|e| format!("cannot take a lease: {e}"))?;
    let id = grant.id();
    *held.lock_or_recover() = Some(id);
    // Counted from before the grant was asked for: the lease cannot outlive that.
    let expires = Mutex::new(asked + Duration::from_secs(ttl as u64));
    let renewals = keep_alive(members, id, ttl, &expires);
    let campaign = async {
        // The campaign is etcd's election done here, one bounded request at a time, each on
        // the first member that answers: this lease's key under the election's name (created
        // once), then the oldest key under the name, read again every [`CAMPAIGN_POLL`] until
        // it is this one. etcd's own Campaign call waits on one member; when that member was
        // cut off, the wait sat there (for HTTP/2's keep-alive, 15 s) while the lease, renewed
        // through another member, kept this key the oldest, and no daemon led.
        let ours = candidate_key(name, id);
        let lease_ttl = Duration::from_secs(ttl as u64);
        let leader = loop {
            match oldest_candidate(members, name, &ours, host, id).await {
                Ok(Some(o)) if o.key == ours => {
                    break Fence {
                        key: o.key,
                        rev: o.create,
                    };
                }
                Ok(Some(o)) => {
                    let from = {
                        let mut seen = seen.lock_or_recover();
                        // Read after the answer came: the mark committed before this.
                        let next = next_seen(seen.as_ref(), &o, Instant::now());
                        let from = next.from;
                        *seen = Some(next);
                        from
                    };
                    if from.elapsed() >= lease_ttl {
                        depose(members, &o.key, o.modified, o.version).await;
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "campaign: asking again"),
            }
            tokio::time::sleep(CAMPAIGN_POLL).await;
        };
        // A leader marks itself alive twice before it acts, and believes it leads only until a
        // lease after it sent the mark before its latest (less 300 ms): a candidate counts from
        // its first reading of that earlier mark at the latest (see `next_seen`), which came
        // after the mark was sent, so the belief ends before any count does.
        let mut last: Option<Instant> = None;
        let marked = loop {
            match mark(members, &leader, host, id, lease_ttl).await {
                Ok(sent) => {
                    if let Some(before) = last.replace(sent) {
                        // The latest mark's sending, and the end of this daemon's belief.
                        break Mutex::new((sent, before + lease_ttl));
                    }
                }
                Err(Marking::Deposed) => {
                    return Err::<(), String>("deposed before it could lead".into());
                }
                Err(Marking::Unanswered(e)) => {
                    tracing::debug!(error = %e, "the first liveness marks: asking again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        *fence.lock_or_recover() = Some(leader.clone());
        tracing::info!(lease = id, "leading: this daemon applies signals now");
        on_change(true);
        // Lead until the lease or the liveness mark is near its end unrenewed: stop a little
        // before the cluster would let the lease go, or a candidate would depose this daemon,
        // so it never believes it leads past either.
        let watchdog = async {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = Instant::now();
                let lease_left = expires.lock_or_recover().saturating_duration_since(now);
                let mark_left = marked.lock_or_recover().1.saturating_duration_since(now);
                if lease_left < Duration::from_millis(300) {
                    return Err::<(), String>("the lease is about to run out unrenewed".into());
                }
                if mark_left < Duration::from_millis(300) {
                    return Err("the liveness mark is about to go stale unrenewed".into());
                }
                if fence.lock_or_recover().is_none() {
                    return Err("a write found the leadership gone".into());
                }
            }
        };
        let refresh = async {
            let mut wait = mark_every(lease_ttl);
            loop {
                tokio::time::sleep(wait).await;
                // A mark that went unanswered is sent again at once: its member is left for
                // the next one (`Members::run`), which answers well within the lease.
                wait = Duration::from_millis(50);
                match mark(members, &leader, host, id, lease_ttl).await {
                    Ok(sent) => {
                        let mut m = marked.lock_or_recover();
                        *m = (sent, m.0 + lease_ttl);
                        wait = mark_every(lease_ttl);
                    }
                    Err(Marking::Deposed) => {
                        return Err::<(), String>(
                            "deposed: a candidate found this daemon's liveness mark stale".into(),
                        );
                    }
                    Err(Marking::Unanswered(e)) => {
                        tracing::warn!(error = %e, "the liveness mark was not renewed");
                    }
                }
            }
        };
        tokio::select! {
            r = watchdog => r,
            r = refresh => r,
        }
    };
    let result = tokio::select! {
        r = renewals => r,
        r = campaign => r,
    };
    // The lease goes at once, so another daemon leads without waiting for it to run out; a
    // cluster without a quorum cannot revoke it, and a new raft leader gives every lease its
    // whole TTL again, so the revoke is tried until it is done (or the lease is gone), in
    // the background: the next campaign need not wait for it.
    tokio::spawn(revoke_until_done(Arc::clone(members), id));
    result
}

/// The oldest other candidate as this daemon last read it.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    key: Vec<u8>,
    /// Its liveness mark: the key's modification revision, and its version (how many times
    /// the key was written), which tells the mark that came right after another.
    modified: i64,
    version: i64,
    /// When this daemon first read that mark.
    first: Instant,
    /// Whence its silence is counted: the first reading of the mark before this one when this
    /// one came right after it (the leader's belief ends a lease after it sent that one), else
    /// the first reading of this one.
    from: Instant,
}

/// What a candidate knows after reading `o` as the oldest candidate at `now`, having known
/// `before`. A leader believes it leads until a lease after it sent the mark before its latest,
/// so the count may start at the first reading of that earlier mark: a leader cut off just
/// after a mark the standby never read is deposed a lease after the mark the standby did read,
/// not a lease after the standby could read again (etcd's own election in the majority, a
/// silent member's timeout).
fn next_seen(before: Option<&Seen>, o: &Oldest, now: Instant) -> Seen {
    match before {
        Some(b) if b.key == o.key && b.modified == o.modified => b.clone(),
        Some(b) if b.key == o.key && o.version == b.version + 1 => Seen {
            key: o.key.clone(),
            modified: o.modified,
            version: o.version,
            first: now,
            from: b.first,
        },
        _ => Seen {
            key: o.key.clone(),
            modified: o.modified,
            version: o.version,
            first: now,
            from: now,
        },
    }
}

/// How often a candidate reads whether its key is now the oldest.
const CAMPAIGN_POLL: Duration = Duration::from_millis(200);

/// The key of the candidate on lease `id` under the election `name`, as etcd's own election
/// names it (`<name>/<lease in hex>`), so `doctor`'s leader query reads it.
fn candidate_key(name: &[u8], id: i64) -> Vec<u8> {
    let mut key = name.to_vec();
    key.extend_from_slice(format!("/{id:x}").as_bytes());
    key
}

/// The oldest candidate as read: its key, the revision that created it (the fence it leads
/// under) and the one that last wrote it (its liveness mark).
struct Oldest {
    key: Vec<u8>,
    create: i64,
    modified: i64,
    version: i64,
}

/// Puts this candidate's key (under its lease, once: a key already there is kept with its
/// creation revision) and reads the oldest candidate, in one transaction on the first member
/// that answers (each member given at most its attempt timeout).
async fn oldest_candidate(
    members: &Members,
    name: &[u8],
    ours: &[u8],
    host: &str,
    id: i64,
) -> std::result::Result<Option<Oldest>, String> {
    use etcd_client::{
        Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
        TxnOpResponse,
    };
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    let oldest = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let req = Txn::new()
        .when(vec![Compare::create_revision(
            ours.to_vec(),
            CompareOp::Equal,
            0,
        )])
        .and_then(vec![
            TxnOp::put(
                ours.to_vec(),
                host.as_bytes().to_vec(),
                Some(PutOptions::new().with_lease(id)),
            ),
            TxnOp::get(prefix.clone(), Some(oldest.clone())),
        ])
        .or_else(vec![TxnOp::get(prefix, Some(oldest))]);
    let (resp, _) = members
        .run(REQUEST_TIMEOUT, |mut c| {
            let req = req.clone();
            async move { c.txn(req).await }
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| Oldest {
            key: kv.key().to_vec(),
            create: kv.create_revision(),
            modified: kv.mod_revision(),
            version: kv.version(),
        }),
        _ => None,
    }))
}

/// How often a leader renews its liveness mark: five times a lease, at most every second
/// (one small write), at least every 200 ms.
fn mark_every(lease_ttl: Duration) -> Duration {
    (lease_ttl / 5).clamp(Duration::from_millis(200), Duration::from_secs(1))
}

/// Why a liveness mark was not renewed.
enum Marking {
    /// The leader's key is gone or is another campaign's: it was deposed, or its lease ended.
    Deposed,
    /// No member answered in time; the mark may or may not have been written.
    Unanswered(String),
}

/// Renews the leader's liveness mark: its election key written again (the same value, the
/// same lease; its creation revision, the fence, unchanged, its modification revision new),
/// only while the key is still the one it leads under. Returns when the write was sent.
async fn mark(
    members: &Members,
    leader: &Fence,
    host: &str,
    id: i64,
    lease_ttl: Duration,
) -> std::result::Result<Instant, Marking> {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let req = Txn::new()
        .when(vec![Compare::create_revision(
            leader.key.clone(),
            CompareOp::Equal,
            leader.rev,
        )])
        .and_then(vec![TxnOp::put(
            leader.key.clone(),
            host.as_bytes().to_vec(),
            Some(PutOptions::new().with_lease(id)),
        )]);
    let sent = Instant::now();
    // A quarter of a lease at most: a silent member is left for the next one while the mark
    // written before still stands, with time to spare for the next one to answer.
    let budget = (lease_ttl / 4).min(ATTEMPT_TIMEOUT);
    let answer = members
        .run(budget, |mut c| {
            let req = req.clone();
            async move { c.txn(req).await }
        })
        .await;
    match answer {
        Ok((resp, _)) if resp.succeeded() => Ok(sent),
        Ok(_) => Err(Marking::Deposed),
        Err(e) => Err(Marking::Unanswered(e.to_string())),
    }
}

/// Deposes the leader whose key `key` still carries the liveness mark `modified` this
/// candidate read a whole lease ago by its own clock: the key is deleted in one transaction
/// conditioned on that modification revision, so a leader that renewed its mark since (a live
/// one that this candidate read late) is never deposed. Its fenced writes then fail, and it
/// stops leading. etcd cannot be left to end that lease: a member elected raft leader gives
/// every lease its whole TTL again (its lessor's promotion adds the election timeout on top),
/// so a leader cut off with the old raft leader kept its key for a lease after the new
/// election.
async fn depose(members: &Members, key: &[u8], modified: i64, version: i64) {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let req = Txn::new()
        .when(vec![Compare::mod_revision(
            key.to_vec(),
            CompareOp::Equal,
            modified,
        )])
        .and_then(vec![TxnOp::delete(key.to_vec(), None)]);
    let answer = members
        .run(ATTEMPT_TIMEOUT, |mut c| {
            let req = req.clone();
            async move { c.txn(req).await }
        })
        .await;
    match answer {
        Ok((resp, _)) if resp.succeeded() => tracing::warn!(
            leader = %String::from_utf8_lossy(key),
            mark = modified,
            version,
            revision = resp.header().map_or(0, |h| h.revision()),
            "deposed the leader: its liveness mark went unrenewed for a lease",
        ),
        Ok(_) => tracing::debug!("the leader renewed its liveness mark: not deposed"),
        Err(e) => tracing::debug!(error = %e, "deposing the leader: no answer"),
    }
}

/// Revokes lease `id`, again every 250 ms while no member can (no quorum), for at most a
/// minute; a lease the cluster no longer has is done.
async fn revoke_until_done(members: Arc<Members>, id: i64) {
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        match members
            .run(Duration::from_secs(2), |mut c| async move {
                c.lease_revoke(id).await
            })
            .await
        {
            Ok(_) | Err(CallError::Refused(_)) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Renews lease `id` while it lives, moving `expires` on with each renewal. The renewals run
/// on one member's stream; when that member stops answering (its stream breaks, a renewal
/// goes unanswered for a third of the TTL), the stream is opened again on the next member,
/// the same lease, so leadership survives the loss of any member but a majority. Ends when the
/// cluster says the lease is gone or no member renewed it in time.
async fn keep_alive(
    members: &Members,
    id: i64,
    ttl: i64,
    expires: &Mutex<Instant>,
) -> std::result::Result<(), String> {
    let every = Duration::from_millis((ttl as u64 * 1000 / 3).max(200));
    // Longer than this unanswered, a renewal is tried on another member.
    let patience = every.max(Duration::from_millis(500));
    let left = || {
        expires
            .lock_or_recover()
            .saturating_duration_since(Instant::now())
    };
    let renewed = |at: Instant, ttl: i64| {
        *expires.lock_or_recover() = at + Duration::from_secs(ttl.max(0) as u64);
    };
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream, usize)> = None;
    loop {
        if left().is_zero() {
            return Err("the lease expired unrenewed".into());
        }
        let Some((keeper, replies, at)) = stream.as_mut() else {
            // Opening the stream renews the lease once (its first request).
            let sent = Instant::now();
            match members
                .run(left(), |mut c| async move { c.lease_keep_alive(id).await })
                .await
            {
                Ok(((keeper, replies), at)) => {
                    renewed(sent, ttl);
                    stream = Some((keeper, replies, at));
                    tokio::time::sleep(every).await;
                }
                Err(CallError::Refused(e)) => {
                    return Err(format!("cannot keep the lease alive: {e}"));
                }
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        "lease renewal failed; trying again while the lease lasts",
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            continue;
        };
        let sent = Instant::now();
        let answer = tokio::time::timeout(patience, async {
            keeper.keep_alive().await?;
            replies.message().await
        })
        .await;
        match answer {
            Ok(Ok(Some(r))) if r.ttl() > 0 => renewed(sent, r.ttl()),
            Ok(Ok(Some(_))) => return Err("the lease expired".into()),
            broken => {
                let why = match broken {
                    Ok(Err(e)) => e.to_string(),
                    Ok(_) => "the stream ended".into(),
                    Err(_) => format!("no answer within {} ms", patience.as_millis()),
                };
                tracing::warn!(
                    member = members.endpoint(*at),
                    why = %why,
                    "lease renewals stopped; renewing through the next member"
                );
                members.failed(*at);
                stream = None;
                continue;
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// A running campaign; dropping it ends the leadership at once (its lease is revoked), so a
/// standby takes over without waiting for the lease to run out.
struct Campaign {
    task: tokio::task::AbortHandle,
    lease: Arc<Mutex<Option<i64>>>,
    members: Arc<Members>,
    handle: tokio::runtime::Handle,
    fence: Arc<Mutex<Option<Fence>>>,
}

impl Drop for Campaign {
    fn drop(&mut self) {
        self.task.abort();
        *self.fence.lock_or_recover() = None;
        if let Some(id) = self.lease.lock_or_recover().take() {
            let revoke = self
                .members
                .run(Duration::from_secs(2), |mut c| async move {
                    c.lease_revoke(id).await
                });
            let _ = self.handle.block_on(revoke);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oldest(key: &[u8], modified: i64, version: i64) -> Oldest {
        Oldest {
            key: key.to_vec(),
            create: 10,
            modified,
            version,
        }
    }

    #[test]
    fn a_leaders_silence_is_counted_from_the_first_reading_of_the_mark_before_its_latest() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let first = next_seen(None, &oldest(b"l/1", 20, 3), at(0));
        assert_eq!((first.first, first.from), (at(0), at(0)));
        // The same mark read again: nothing moves.
        assert_eq!(
            next_seen(Some(&first), &oldest(b"l/1", 20, 3), at(900)),
            first
        );
        // The mark right after it (version 4): counted from the first reading of version 3.
        let next = next_seen(Some(&first), &oldest(b"l/1", 31, 4), at(1000));
        assert_eq!((next.first, next.from), (at(1000), at(0)));
        let again = next_seen(Some(&next), &oldest(b"l/1", 31, 4), at(4000));
        assert_eq!(again.from, at(0));
        // A mark two writes on (one this daemon never read): counted from now.
        let skipped = next_seen(Some(&next), &oldest(b"l/1", 50, 6), at(2000));
        assert_eq!((skipped.first, skipped.from), (at(2000), at(2000)));
        // Another candidate's key, whatever its version: counted from now.
        let other = next_seen(Some(&next), &oldest(b"l/2", 60, 5), at(2100));
        assert_eq!(other.from, at(2100));
    }
}
