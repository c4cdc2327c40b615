//! The election of the daemon that applies signals: a campaign on a kept-alive lease, the
//! fence taken when it wins and dropped the moment the lease may have run out, and the lease's
//! renewals moved to the next member when theirs stops answering. A daemon that stops leading
//! campaigns again on a new lease; dropping the campaign revokes its lease, so a standby takes
//! over at once.

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

use crate::store::etcd::Etcd;
use crate::store::etcd::client::REQUEST_TIMEOUT;
use crate::store::etcd::endpoints::{self, CallError, Members};
use crate::store::etcd::fence::Fence;
use crate::sync::MutexExt;

impl Etcd {
    /// Campaigns for leadership until the guard drops, telling `on_change` each time this
    /// daemon starts or stops leading. The lease is kept alive while the campaign waits; when
    /// a renewal fails or the lease runs out, leadership is given up at once (the fence stops
    /// writes server-side anyway) and a new campaign starts on a new lease.
    pub fn campaign(&self, on_change: Box<dyn Fn(bool) + Send + Sync>) -> Box<dyn Any + Send> {
        let members = Arc::clone(&self.members);
        let fence = Arc::clone(&self.fence);
        let name = self.keys.election();
        let host = self.host.clone();
        let ttl = self.loc.lease_ttl_s as i64;
        let shown = self.loc.display();
        let lease = Arc::new(Mutex::new(None::<i64>));
        let held = Arc::clone(&lease);
        let task = self.rt().spawn(async move {
            loop {
                if let Err(e) =
                    lead_once(&members, &fence, &name, &host, ttl, &held, &on_change).await
                {
                    tracing::warn!(store = %shown, "leadership: {e}; campaigning again");
                }
                if fence.lock_or_recover().take().is_some() {
                    on_change(false);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Box::new(Campaign {
            task: task.abort_handle(),
            lease,
            members: Arc::clone(&self.members),
            handle: self.rt().handle().clone(),
            fence: Arc::clone(&self.fence),
        })
    }
}

/// One lease: campaign on it, lead while it lives.
async fn lead_once(
    members: &Members,
    fence: &Mutex<Option<Fence>>,
    name: &[u8],
    host: &str,
    ttl: i64,
    held: &Mutex<Option<i64>>,
    on_change: &(dyn Fn(bool) + Send + Sync),
) -> std::result::Result<(), String> {
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
        // A campaign waits (for as long as another daemon leads), so it is no request with a
        // time limit: it runs on one member, and when that member fails the campaign ends and
        // the next one, on a new lease, starts on the next member.
        let at = members.preferred();
        let asked = async {
            let mut c = members.client(at).await?;
            c.campaign(name.to_vec(), host.as_bytes().to_vec(), id)
                .await
        };
        let resp = match asked.await {
            Ok(resp) => resp,
            Err(e) => {
                if endpoints::unavailable(&e) {
                    members.failed(at);
                }
                return Err(format!("campaign failed on {}: {e}", members.endpoint(at)));
            }
        };
        let leader = resp.leader().ok_or("the campaign named no leader")?;
        *fence.lock_or_recover() = Some(Fence {
            key: leader.key().to_vec(),
            rev: leader.rev(),
        });
        tracing::info!(lease = id, "leading: this daemon applies signals now");
        on_change(true);
        // Lead until the lease is near its end without a renewal: stop a little before the
        // cluster would let it go, so this daemon never believes it leads past its lease.
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let left = expires
                .lock_or_recover()
                .saturating_duration_since(Instant::now());
            if left < Duration::from_millis(300) {
                return Err::<(), String>("the lease is about to run out unrenewed".into());
            }
            if fence.lock_or_recover().is_none() {
                return Err("a write found the leadership gone".into());
            }
        }
    };
    let result = tokio::select! {
        r = renewals => r,
        r = campaign => r,
    };
    let _ = members
        .run(Duration::from_secs(1), |mut c| async move {
            c.lease_revoke(id).await
        })
        .await;
    result
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
                    tracing::warn!("lease renewal: {e}; trying again while the lease lasts");
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
                    "lease renewals stopped ({why}); renewing through the next member"
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
