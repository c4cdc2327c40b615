//! The members of the etcd cluster as the store reaches them: one client per endpoint, and
//! failover from a member that does not answer to the next, as etcd's own Go client does.
//!
//! `etcd-client` can balance one client over every endpoint, but that client fails a request
//! whenever one endpoint is down (its issue #39): with one member of three SIGKILLed, every
//! request failed `tcp connect error`, although the two others kept the quorum. So each
//! endpoint gets its own client (made on first use), a request goes to the member that answered
//! last, and a transport failure (`Unavailable`, a refused connection, no answer in time) moves
//! it to the next one. A member's refusal (a compacted revision, the space quota, a missing
//! lease) is an answer: another member would give the same, so it is returned at once. A
//! member that gave no answer in time is asked the next time on a new connection: the network
//! may have dropped the old one without a word, and TCP would resend on it only after seconds.
//!
//! Every request the store makes is safe to send twice, which failover may do when a member
//! dies after it received a request and before it answered: reads are idempotent; every write
//! of a waitpoint, timer, callback or record compares revisions, so a second copy of one that
//! committed fails its comparison and the caller reads again and finds it done; the plain puts
//! (a handed-over signal, a wake for another host, a set-aside value, an import's records)
//! write the same value under the same key, and a copy that lands after the first was consumed
//! is applied again as a duplicate of its identity, or delivered again under its wake id, which
//! a reader ignores; deletes and lease revocations are idempotent; a campaign on the same lease
//! finds its own key; a second lease grant leaks a lease that expires after its TTL.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::sync::MutexExt;
use etcd_client::{Client, ConnectOptions};

/// The longest one member is given to answer one request before the next is tried (the last
/// one tried gets what is left of the request's time): a SIGKILLed member refuses the
/// connection at once, but a hung or cut-off one shows only as silence, and so does a follower
/// holding a request it passed to a leader that just died (it waits for its own timeout, over
/// 5 s). A healthy member answers in milliseconds.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a request did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// A member answered with a refusal that any member would give.
    #[error("{0}")]
    Refused(etcd_client::Error),
    /// No member served it: each one tried, with what went wrong there.
    #[error("no member answered: {}", .0.join("; "))]
    Unreachable(Vec<String>),
}

/// The endpoints of one cluster, each with its own client.
pub struct Members {
    endpoints: Vec<String>,
    options: ConnectOptions,
    clients: Vec<Mutex<Option<Client>>>,
    /// The member to ask first: the last one that answered.
    preferred: AtomicUsize,
}

impl Members {
    /// Nothing is connected yet: each member's client is made when it is first asked.
    pub fn new(endpoints: Vec<String>, options: ConnectOptions) -> Members {
        let clients = endpoints.iter().map(|_| Mutex::new(None)).collect();
        Members {
            endpoints,
            options,
            clients,
            preferred: AtomicUsize::new(0),
        }
    }

    /// The endpoint of member `i`, for messages.
    pub fn endpoint(&self, i: usize) -> &str {
        &self.endpoints[i]
    }

    /// The member to ask first.
    pub fn preferred(&self) -> usize {
        self.preferred.load(Ordering::SeqCst)
    }

    /// Member `i` answered: it is asked first from now on.
    pub fn answered(&self, i: usize) {
        self.preferred.store(i, Ordering::SeqCst);
    }

    /// Member `i` did not answer (or a stream from it broke): if it was the one asked first,
    /// the next one is now. One that another request already moved away from stays moved.
    pub fn failed(&self, i: usize) {
        let n = self.endpoints.len();
        let _ = self
            .preferred
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
                Some(after_failure(n, p, i))
            });
    }

    /// Member `i`'s client, made on first use. Making one sends nothing unless the store
    /// authenticates (then it asks the member for a token, and fails as a request would).
    pub async fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        if let Some(c) = lock(&self.clients[i]).as_ref() {
            return Ok(c.clone());
        }
        let made =
            Client::connect([self.endpoints[i].as_str()], Some(self.options.clone())).await?;
        Ok(lock(&self.clients[i]).get_or_insert(made).clone())
    }

    /// Runs `f` on the members in turn, the preferred one first, until one answers or refuses,
    /// within `budget` in all (each member but the last at most [`ATTEMPT_TIMEOUT`]); returns the
    /// answer and which member gave it (for a stream, whose breaking is that member's failure).
    pub async fn run<T, F: Future<Output = Result<T, etcd_client::Error>>>(
        &self,
        budget: Duration,
        f: impl FnMut(Client) -> F,
    ) -> Result<(T, usize), CallError> {
        self.run_noting(budget, f).await.map(|(v, i, _)| (v, i))
    }

    /// [`run`](Self::run), also telling whether a member before the one that answered was
    /// asked and gave no answer: that copy of the request may have been applied all the same
    /// (a member that went silent after it passed the request on, an answer lost on the way),
    /// so a write the answering member refused on its comparisons may be the first copy's own
    /// doing, and is read back before it is called unwritten (`Etcd::commit`).
    pub async fn run_noting<T, F: Future<Output = Result<T, etcd_client::Error>>>(
        &self,
        budget: Duration,
        mut f: impl FnMut(Client) -> F,
    ) -> Result<(T, usize, bool), CallError> {
        let deadline = Instant::now() + budget;
        let mut failures = Vec::new();
        let n = self.endpoints.len();
        for (k, i) in order(n, self.preferred()).enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let limit = if k + 1 == n {
                left
            } else {
                left.min(ATTEMPT_TIMEOUT)
            };
            let attempt = async {
                let c = self.client(i).await?;
                f(c).await
            };
            match tokio::time::timeout(limit, attempt).await {
                Ok(Ok(v)) => {
                    self.answered(i);
                    return Ok((v, i, !failures.is_empty()));
                }
                Ok(Err(e)) if !unavailable(&e) => {
                    self.answered(i);
                    return Err(CallError::Refused(e));
                }
                Ok(Err(e)) => failures.push(format!("{}: {e}", self.endpoints[i])),
                Err(_) => {
                    // Silence on a connection the network dropped without a word: the kernel
                    // resends on it only after a backoff that grows to seconds, so a member
                    // reachable again would go on unheard. The next request to it connects
                    // afresh (streams hold their own connection and are not disturbed).
                    lock(&self.clients[i]).take();
                    failures.push(format!(
                        "{}: no answer within {} ms",
                        self.endpoints[i],
                        limit.as_millis()
                    ))
                }
            }
            self.failed(i);
        }
        if failures.is_empty() {
            failures.push(format!("no answer within {} ms", budget.as_millis()));
        }
        Err(CallError::Unreachable(failures))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock_or_recover()
}

/// The order in which `n` members are asked: `preferred` first, then the ones after it,
/// wrapping around, each once.
pub fn order(n: usize, preferred: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (preferred + k) % n)
}

/// The member to ask first once `failed` did not answer while `preferred` was the first.
pub fn after_failure(n: usize, preferred: usize, failed: usize) -> usize {
    if preferred == failed {
        (failed + 1) % n
    } else {
        preferred
    }
}

/// Whether `e` says the member could not serve the request (down, unreachable, without a
/// leader, the connection lost) rather than refused it: then another member may serve it.
/// etcd answers `Unavailable` for "no leader", "leader changed" and its own timeouts; tonic
/// reports a connection lost mid-request as `Unknown`, `Internal` or `Cancelled`.
pub fn unavailable(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        E::GRpcStatus(s) => matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unknown
                | Code::Internal
                | Code::Aborted
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preferred_member_is_asked_first_then_each_other_once_in_turn() {
        assert_eq!(order(3, 0).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(order(3, 1).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(order(3, 2).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(order(1, 0).collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn a_failure_moves_the_first_choice_on_only_when_it_was_the_first_choice() {
        assert_eq!(after_failure(3, 0, 0), 1);
        assert_eq!(after_failure(3, 2, 2), 0);
        // Another request already moved on to 2: a late report about 0 changes nothing.
        assert_eq!(after_failure(3, 2, 0), 2);
        assert_eq!(after_failure(1, 0, 0), 0);
    }

    #[test]
    fn transport_failures_move_on_and_refusals_do_not() {
        use etcd_client::Error as E;
        use tonic::{Code, Status};
        let status = |code, text: &str| E::GRpcStatus(Status::new(code, text));
        assert!(unavailable(&status(Code::Unavailable, "tcp connect error")));
        assert!(unavailable(&status(
            Code::Unavailable,
            "etcdserver: no leader"
        )));
        assert!(unavailable(&status(Code::Unknown, "transport error")));
        assert!(unavailable(&E::WatchError("stream closed".into())));
        assert!(!unavailable(&status(
            Code::ResourceExhausted,
            "etcdserver: mvcc: database space exceeded"
        )));
        assert!(!unavailable(&status(
            Code::OutOfRange,
            "required revision has been compacted"
        )));
        assert!(!unavailable(&status(
            Code::PermissionDenied,
            "permission denied"
        )));
        assert!(!unavailable(&E::LeaseKeepAliveError(
            "lease not found".into()
        )));
    }

    /// Every member down: each is tried once, the error names each, and the next request
    /// starts where this one ended.
    #[test]
    fn with_no_member_up_each_is_tried_once_and_named() {
        let ports: Vec<u16> = (0..3)
            .map(|_| {
                std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port()
            })
            .collect();
        let eps: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let members = Members::new(
            eps.clone(),
            ConnectOptions::new().with_connect_timeout(Duration::from_millis(500)),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut asked = 0;
        let got = rt.block_on(members.run(Duration::from_secs(5), |mut c| {
            asked += 1;
            async move { c.get("k", None).await }
        }));
        assert_eq!(asked, 3);
        let Err(CallError::Unreachable(why)) = got else {
            panic!("{got:?}")
        };
        assert_eq!(why.len(), 3, "{why:?}");
        for (w, ep) in why.iter().zip(&eps) {
            assert!(w.starts_with(ep.as_str()), "{w}");
        }
        // Each failure moved the first choice on, around to where it started.
        assert_eq!(members.preferred(), 0);
    }
}
