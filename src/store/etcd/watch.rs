//! The etcd store's watch: one watch on the whole prefix, turned into the owner's hints
//! (waitpoints that changed, timers, callbacks, signals handed over, wakes for this host),
//! resumed where it broke off on the next member (when its stream breaks, or its member
//! answers nothing, not even a progress request, for [`WATCH_SILENCE`]: a cut-off or paused
//! member is otherwise noticed only by HTTP/2's keep-alive, 15 s later), and a resync only when
//! the history it missed was compacted away.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchOptions};

use crate::error::Result;
use crate::store::Hint;
use crate::store::etcd::Etcd;
use crate::store::etcd::client::REQUEST_TIMEOUT;
use crate::store::etcd::keys::Watched;
use crate::sync::MutexExt;

/// How often a watch asks its member for progress (an answer with the member's revision).
const WATCH_PROBE: Duration = Duration::from_millis(500);
/// How long a watch waits with nothing from its member (no event, no progress answer) before
/// it resumes on the next member: a healthy member answers a progress request in milliseconds.
const WATCH_SILENCE: Duration = Duration::from_millis(2000);

impl Etcd {
    /// One watch on the whole prefix: waitpoints that changed, signals handed over, wakes for
    /// this host. A watch that ends (a member restarted) is resumed from the revision after
    /// the last one it reported, so nothing between is missed; only when that history is
    /// compacted away does the owner hear a resync (as after an inotify overflow). The first
    /// watch needs none: it starts after the revision read here, before this returns, so a
    /// change between the owner's next read and the watch reaching its member is still
    /// reported (a watch "from now" would miss it). A watch that broke is resumed on the next
    /// member; one that was cancelled because its member lost the leader too (the members are
    /// asked to require one).
    pub(super) fn watch_all(&self, hint: Box<dyn Fn(Hint) + Send>) -> Result<crate::store::Guard> {
        let members = Arc::clone(&self.members);
        let keys = self.keys.clone();
        let prefix = keys.prefix().to_owned();
        let host = self.host.clone();
        let own = Arc::clone(&self.own);
        let start = self.revision()? + 1;
        let task = self.rt().spawn(async move {
            // The first revision the next watch must report.
            let mut next = start;
            loop {
                let opts = WatchOptions::new().with_prefix().with_start_revision(next);
                let opened = members
                    .run(REQUEST_TIMEOUT, |mut c| {
                        let (prefix, opts) = (prefix.clone(), opts.clone());
                        async move { c.watch(prefix, Some(opts)).await }
                    })
                    .await;
                if let Ok((stream, at)) = opened {
                    // Whether the watch ended through its member's failure (the stream broke,
                    // the member lost its leader, it went silent) rather than a compaction.
                    let mut failed = true;
                    // A member cut off from this host, or paused, shows only as silence, which
                    // HTTP/2's keep-alive takes 15 s to call broken: progress is asked for
                    // every WATCH_PROBE, and a member that answers nothing for WATCH_SILENCE
                    // is left for the next.
                    let (mut asker, mut replies) = stream.split();
                    let mut heard = Instant::now();
                    let mut probe = tokio::time::interval(WATCH_PROBE);
                    loop {
                        let resp = tokio::select! {
                            r = replies.message() => match r {
                                Ok(Some(resp)) => resp,
                                Ok(None) => break,
                                Err(e) => {
                                    tracing::warn!(
                                        member = members.endpoint(at),
                                        revision = next,
                                        error = %e,
                                        "the watch broke; resuming it on the next member",
                                    );
                                    break;
                                }
                            },
                            _ = probe.tick() => {
                                if heard.elapsed() > WATCH_SILENCE {
                                    tracing::warn!(
                                        member = members.endpoint(at),
                                        revision = next,
                                        "the watch heard nothing for {} ms; resuming it on the \
                                         next member",
                                        WATCH_SILENCE.as_millis()
                                    );
                                    break;
                                }
                                let _ = asker.request_progress().await;
                                continue;
                            }
                        };
                        heard = Instant::now();
                        if resp.canceled() {
                            if resp.compact_revision() > 0 {
                                // What happened before the compaction is gone: the owner reads
                                // everything again, and the next watch reports all after it.
                                next = resp.compact_revision();
                                failed = false;
                                hint(Hint::Resync);
                            }
                            break;
                        }
                        // One hint for every signal handed over in this response: the
                        // leader reads them all at once, and a hint per key would send it to
                        // find nothing left after the first.
                        let mut handed_over = false;
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            next = next.max(kv.mod_revision() + 1);
                            let put = ev.event_type() == EventType::Put;
                            match keys.watched(kv.key(), &host) {
                                Some(Watched::Waitpoint(id)) => {
                                    let mine = own.lock_or_recover().contains(&kv.mod_revision());
                                    if put && !mine {
                                        hint(Hint::Changed(id));
                                    }
                                }
                                Some(Watched::Timer(id)) => hint(Hint::Timer(id)),
                                Some(Watched::Callback(id)) => hint(Hint::Callback(id)),
                                Some(Watched::HandedOver) if put => handed_over = true,
                                Some(Watched::WakeHere) if put => hint(Hint::Wakes),
                                _ => {}
                            }
                        }
                        if handed_over {
                            hint(Hint::Forwarded);
                        }
                    }
                    if failed {
                        members.failed(at);
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Ok(crate::store::Guard::new(AbortOnDrop(task.abort_handle())))
    }
}

/// Aborts a task of the store's runtime when dropped (a watch).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
