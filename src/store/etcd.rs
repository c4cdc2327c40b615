//! The etcd store (feature `etcd`): waitpoints on an etcd cluster that several hosts share,
//! each running its own daemon with its own home, drop zone and inboxes.
//!
//! Keys, under the location's prefix (see `docs/etcd.md`; values are the JSON of `layouts/`):
//! - `wp/<id>`: the waitpoint's state, `waitpoint.json`;
//! - `rec/<id>/<seq>-<identity>.json`: one signal record each, named as on files;
//! - `idx/<session or channel>/<id>`: who may see it, so a session's list is one range;
//! - `chan/<channel>`: the host whose inbox the channel's wakes go to (the host that armed);
//! - `wake/<host>/<wake id>`: a wake on its way to that host's inbox;
//! - `in/<identity>`: a signal a standby host received, waiting for the leader to apply it;
//! - `bad/<key>`: a value that did not parse, set aside with the reason;
//! - `leader/…`: the election of the daemon that applies signals.
//!
//! Every write a transaction makes compares the revision of each waitpoint key it read, so a
//! concurrent writer makes it fail ([`Error::Conflict`]) instead of losing an update. A
//! daemon's writes also compare its leadership key ([`Fence`]): once its lease has expired
//! (it was paused, partitioned or killed) the key is gone and nothing it sends can commit,
//! whatever it still believes. Commands (`create`, `cancel`, …) write without the fence, under
//! the same revision checks.
//!
//! The client is asynchronous (tonic); the store owns one small tokio runtime and blocks on it,
//! so the engine stays synchronous. Nothing here runs inside another runtime's worker: the MCP
//! front end calls the engine from blocking threads.
//!
//! Each member is reached on its own and a request goes to the next when one does not answer
//! ([`endpoints`]): the store works while a majority of the members does.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions,
    Identity, LeaseKeepAliveStream, LeaseKeeper, SortOrder, SortTarget, TlsOptions,
    Txn as EtcdTxnReq, TxnOp, WatchOptions,
};

use crate::error::{Error, Result};
use crate::home::Home;
use crate::names::is_waitpoint_id;
use crate::records::{Callback, SignalRecord, Timer, Waitpoint, Wake};
use crate::request::{identity_key, identity_of};

mod endpoints;

use endpoints::{CallError, Members};

use super::files::parse_signal_file_name;
use super::location::EtcdLocation;
use super::{
    Change, Check, Doc, DocTxn, Docs, Forwarded, Hint, Level, Role, Store, Txn, Version,
    signal_file_name,
};
use crate::sync::MutexExt;

/// How long one request may take before it counts as failed (a campaign waits longer: it
/// is not a request but a wait for leadership).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The most signals one commit carries: with a record, a state and a wake each, and the
/// handed-over keys deleted after, a batch stays well under etcd's default 128 operations.
pub const MAX_BATCH: usize = 30;
/// A key's value and modification revision, or `None` when it does not exist.
type Fetched = Option<(Vec<u8>, i64)>;

/// How many of its own commit revisions a store remembers for its watch.
const OWN_REVISIONS: usize = 1024;
/// The most operations this store puts in one transaction (etcd's default `--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// The leadership a daemon's writes are fenced by: its election key and that key's creation
/// revision, which no other campaign can reproduce.
#[derive(Clone, Debug)]
struct Fence {
    key: Vec<u8>,
    rev: i64,
}

/// Waitpoints on etcd. See the module docs.
pub struct Etcd {
    /// Taken only by `drop` (see there).
    rt: Option<tokio::runtime::Runtime>,
    /// The members, each with its own client (see [`endpoints`]).
    members: Arc<Members>,
    loc: EtcdLocation,
    host: String,
    /// This host's home: where the wakes for its sessions are delivered.
    home: Home,
    role: Role,
    /// `Some` while this daemon leads.
    fence: Arc<Mutex<Option<Fence>>>,
    /// The revisions of this process's latest commits: the watch leaves their waitpoint
    /// events out, as the files' watch does (changes one makes itself need no hint).
    own: Arc<Mutex<std::collections::VecDeque<i64>>>,
    /// How to reach a member (TLS, user), for `doctor`, which asks each on its own. Never
    /// printed: its `Debug` shows the password.
    options: ConnectOptions,
    /// Channel → host, as read from `chan/` (a channel's host changes only when it arms
    /// elsewhere; a stale entry sends a wake to the old host's inbox, which still has it).
    channels: Mutex<HashMap<String, String>>,
}

fn store_error(loc: &EtcdLocation, what: &str, message: impl std::fmt::Display) -> Error {
    Error::Store {
        store: loc.display(),
        message: format!("{what}: {message}"),
    }
}

/// Reads a credential file, refusing one that other users can change, or, for a `secret` one
/// (the password, the client key), read.
fn read_private(path: &std::path::Path, what: &str, secret: bool) -> Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| Error::io("cannot read", path, e))?;
    let mode = meta.mode() & 0o777;
    if secret && mode & 0o077 != 0 {
        return Err(Error::Insecure {
            path: path.to_owned(),
            message: format!(
                "the etcd {what} file is open to other users (mode {mode:o}); chmod 600 it"
            ),
        });
    }
    if mode & 0o022 != 0 {
        return Err(Error::Insecure {
            path: path.to_owned(),
            message: format!("the etcd {what} file is writable by other users (mode {mode:o})"),
        });
    }
    std::fs::read(path).map_err(|e| Error::io("cannot read", path, e))
}

impl Etcd {
    /// Connects to the cluster (lazily: the first request finds out which members are up).
    pub fn connect(loc: &EtcdLocation, host: &str, home: Home, role: Role) -> Result<Etcd> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd")
            .enable_all()
            .build()
            .map_err(|e| store_error(loc, "cannot start the client", e))?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            // etcd answers pings more often than every 5 s (its --grpc-keepalive-min-time)
            // with GOAWAY, which would break every waiting campaign and watch.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        if let (Some(user), Some(file)) = (&loc.user, &loc.password_file) {
            let text = read_private(file, "password", true)?;
            let password = String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            options = options.with_user(user.clone(), password);
        }
        if loc.tls {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &loc.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read_private(ca, "CA", false)?));
            }
            if let (Some(cert), Some(key)) = (&loc.cert_file, &loc.key_file) {
                tls = tls.identity(Identity::from_pem(
                    read_private(cert, "certificate", false)?,
                    read_private(key, "key", true)?,
                ));
            }
            if let Some(d) = &loc.tls_domain {
                tls = tls.domain_name(d.clone());
            }
            options = options.with_tls(tls);
        }
        let probe = options.clone();
        // A member cut off from the others answers "no leader" at once (and ends its watches)
        // instead of serving stale reads or holding a request: the store moves to another.
        let members = Members::new(loc.endpoints.clone(), options.with_require_leader(true));
        Ok(Etcd {
            rt: Some(rt),
            members: Arc::new(members),
            loc: loc.clone(),
            host: host.to_owned(),
            home,
            role,
            options: probe,
            fence: Arc::new(Mutex::new(None)),
            own: Arc::new(Mutex::new(std::collections::VecDeque::new())),
            channels: Mutex::new(HashMap::new()),
        })
    }

    /// Makes this store believe it leads under `key` created at `rev`, as a daemon paused
    /// before it could notice its lease lapse does: for the tests of the fence, which must
    /// stop its writes at the cluster whatever it believes.
    #[doc(hidden)]
    pub fn believe_leading(&self, key: Vec<u8>, rev: i64) {
        *self.fence.lock_or_recover() = Some(Fence { key, rev });
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt
            .as_ref()
            .expect("the runtime lives as long as the store")
    }

    /// Where it is, for messages (no credentials).
    pub fn location(&self) -> &EtcdLocation {
        &self.loc
    }

    fn key(&self, rest: &str) -> Vec<u8> {
        format!("{}{rest}", self.loc.prefix).into_bytes()
    }
    fn wp_key(&self, id: &str) -> Vec<u8> {
        self.key(&format!("wp/{id}"))
    }
    fn rec_prefix(&self, id: &str) -> Vec<u8> {
        self.key(&format!("rec/{id}/"))
    }
    fn idx_key(&self, who: &str, id: &str) -> Vec<u8> {
        self.key(&format!("idx/{}/{id}", identity_key(who)))
    }
    fn election(&self) -> Vec<u8> {
        self.key("leader")
    }

    /// Runs one request on the runtime, on the first member that answers, within
    /// [`REQUEST_TIMEOUT`]. `f` may run more than once (see [`endpoints`] on why every request
    /// of this store may).
    fn call<T, F: Future<Output = std::result::Result<T, etcd_client::Error>>>(
        &self,
        what: &str,
        f: impl FnMut(Client) -> F,
    ) -> Result<T> {
        self.rt()
            .block_on(self.members.run(REQUEST_TIMEOUT, f))
            .map(|(v, _)| v)
            .map_err(|e| store_error(&self.loc, what, e))
    }

    /// One transaction, through [`call`](Self::call).
    fn txn(&self, what: &str, req: EtcdTxnReq) -> Result<etcd_client::TxnResponse> {
        self.call(what, |mut c| {
            let req = req.clone();
            async move { c.txn(req).await }
        })
    }

    /// One range read, through [`call`](Self::call).
    fn read(
        &self,
        what: &str,
        key: &[u8],
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse> {
        self.call(what, |mut c| {
            let (key, options) = (key.to_vec(), options.clone());
            async move { c.get(key, options).await }
        })
    }

    fn get_value(&self, key: Vec<u8>) -> Result<Fetched> {
        let mut resp = self.read("cannot read", &key, None)?;
        Ok(resp
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    /// The values and revisions of waitpoints `ids`, one etcd transaction of gets (all at one
    /// revision) per [`MAX_TXN_OPS`]; `None` for one that does not exist.
    fn fetch(&self, ids: &[&str]) -> Result<Vec<Fetched>> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_TXN_OPS) {
            let ops = chunk
                .iter()
                .map(|id| TxnOp::get(self.wp_key(id), None))
                .collect::<Vec<_>>();
            let req = EtcdTxnReq::new().and_then(ops);
            let resp = self.txn("cannot read waitpoints", req)?;
            out.extend(resp.op_responses().into_iter().map(|r| {
                match r {
                    etcd_client::TxnOpResponse::Get(g) => g
                        .kvs()
                        .first()
                        .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
                    _ => None,
                }
            }));
        }
        Ok(out)
    }

    /// Every key and value under `prefix`, in key order, read in pages; `at` pins one revision
    /// (0: the newest).
    pub fn range(
        &self,
        prefix: &[u8],
        keys_only: bool,
        at: i64,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let end = prefix_end(prefix);
        let mut from = prefix.to_vec();
        let mut out = Vec::new();
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(500);
            if keys_only {
                options = options.with_keys_only();
            }
            if at > 0 {
                options = options.with_revision(at);
            }
            let mut resp = self.read("cannot list", &from, Some(options))?;
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(last) = kvs.last().map(|kv| kv.key().to_vec()) else {
                break;
            };
            out.extend(kvs.into_iter().map(|kv| kv.into_key_value()));
            if !more {
                break;
            }
            from = last;
            from.push(0);
        }
        Ok(out)
    }

    /// The newest revision of the cluster (what an export reads at).
    pub fn revision(&self) -> Result<i64> {
        let key = self.key("wp/");
        let resp = self.read(
            "cannot read",
            &key,
            Some(GetOptions::new().with_count_only()),
        )?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }

    /// Commits `ops` if `compares` hold and, for a `fenced` write of a daemon, its leadership
    /// does too; returns the new revision. A daemon that does not lead is refused without a
    /// request; one whose lease lapsed is refused by the cluster and stops believing it leads.
    fn commit(
        &self,
        what: &str,
        mut compares: Vec<Compare>,
        ops: Vec<TxnOp>,
        fenced: bool,
    ) -> Result<i64> {
        if ops.len() > MAX_TXN_OPS {
            return Err(store_error(
                &self.loc,
                what,
                format!("{} operations, more than one transaction takes", ops.len()),
            ));
        }
        let fence = match (fenced, self.role) {
            (true, Role::Daemon) => Some(
                self.fence
                    .lock_or_recover()
                    .clone()
                    .ok_or_else(not_leading)?,
            ),
            _ => None,
        };
        if let Some(f) = &fence {
            compares.push(Compare::create_revision(
                f.key.clone(),
                CompareOp::Equal,
                f.rev,
            ));
        }
        // etcd-client takes the parts in this order only: when, and_then, or_else.
        let mut req = EtcdTxnReq::new().when(compares).and_then(ops);
        if let Some(f) = &fence {
            // On failure, the leadership key as it is now: whose comparison failed.
            req = req.or_else(vec![TxnOp::get(f.key.clone(), None)]);
        }
        let resp = self.txn(what, req)?;
        if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            let mut own = self.own.lock_or_recover();
            if own.len() >= OWN_REVISIONS {
                own.pop_front();
            }
            own.push_back(rev);
            return Ok(rev);
        }
        if let Some(f) = &fence {
            let still_leads = resp.op_responses().into_iter().any(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => {
                    g.kvs().iter().any(|kv| kv.create_revision() == f.rev)
                }
                _ => false,
            });
            if !still_leads {
                self.lose_leadership();
                return Err(not_leading());
            }
        }
        Err(Error::Conflict(format!(
            "{what}: it changed since it was read; read it again"
        )))
    }

    /// [`commit`](Self::commit), fenced: a waitpoint's or a timer's write.
    fn guarded(&self, what: &str, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<i64> {
        self.commit(what, compares, ops, true)
    }

    fn fence_rev(&self) -> Option<i64> {
        self.fence.lock_or_recover().as_ref().map(|f| f.rev)
    }
    fn lose_leadership(&self) {
        *self.fence.lock_or_recover() = None;
    }

    /// The host whose inbox `channel`'s wakes go to.
    fn host_of(&self, channel: &str) -> Result<String> {
        if let Some(h) = self.channels.lock_or_recover().get(channel) {
            return Ok(h.clone());
        }
        let host = match self.get_value(self.key(&format!("chan/{}", identity_key(channel))))? {
            Some((v, _)) => String::from_utf8_lossy(&v).into_owned(),
            // Armed before hosts were recorded (an import): the applying host keeps it.
            None => self.host.clone(),
        };
        self.channels
            .lock_or_recover()
            .insert(channel.to_owned(), host.clone());
        Ok(host)
    }

    fn wake_op(&self, wake: &Wake) -> Result<TxnOp> {
        let host = self.host_of(&wake.channel)?;
        let key = self.key(&format!("wake/{host}/{}", wake.wake_id));
        Ok(TxnOp::put(key, to_json(wake), None))
    }

    /// Delivers every wake waiting for this host into its home's inboxes, each durably before
    /// its key goes: a crash in between delivers it again under the same name, which is a
    /// no-op for a reader. Returns how many it delivered.
    fn deliver_pending_here(&self) -> Result<usize> {
        let home = &self.home;
        let prefix = self.key(&format!("wake/{}/", self.host));
        let mut n = 0;
        for (key, value) in self.range(&prefix, false, 0)? {
            match serde_json::from_slice::<Wake>(&value) {
                Ok(wake) => crate::delivery::deliver(home, &wake)?,
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

    /// Moves a value that does not parse to `bad/`, with the reason, so it stops nothing else.
    fn set_aside(&self, key: &[u8], value: &[u8], reason: &str) -> Result<()> {
        let name = String::from_utf8_lossy(key).into_owned();
        tracing::warn!(key = %name, "set aside a value that does not parse: {reason}");
        let rest = name.strip_prefix(&self.loc.prefix).unwrap_or(&name);
        let record = serde_json::json!({
            "key": name,
            "reason": reason,
            "value": String::from_utf8_lossy(value),
        });
        let req = EtcdTxnReq::new().and_then(vec![
            TxnOp::put(self.key(&format!("bad/{rest}")), to_json(&record), None),
            TxnOp::delete(key.to_vec(), None),
        ]);
        self.txn("cannot set aside", req)?;
        Ok(())
    }

    fn parse_wp(&self, key: &[u8], value: &[u8]) -> Result<Option<Waitpoint>> {
        match serde_json::from_slice::<Waitpoint>(value) {
            Ok(wp) => Ok(Some(wp)),
            Err(e) => {
                self.set_aside(key, value, &e.to_string())?;
                Ok(None)
            }
        }
    }

    /// Campaigns for leadership until the guard drops, telling `on_change` each time this
    /// daemon starts or stops leading. The lease is kept alive while the campaign waits; when
    /// a renewal fails or the lease runs out, leadership is given up at once (the fence stops
    /// writes server-side anyway) and a new campaign starts on a new lease.
    pub fn campaign(&self, on_change: Box<dyn Fn(bool) + Send + Sync>) -> Box<dyn Any + Send> {
        let members = Arc::clone(&self.members);
        let fence = Arc::clone(&self.fence);
        let name = self.election();
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

fn finding(name: &'static str, level: Level, detail: String, fix: Option<&str>) -> Check {
    Check {
        name,
        level,
        detail,
        fix: fix.map(str::to_owned),
    }
}

/// History this long without a compaction is worth a warning: etcd keeps every revision
/// until compacted, and its space quota counts them.
const UNCOMPACTED_WARN: i64 = 100_000;

/// The checks of `doctor` on the cluster: each member asked on its own, then the cluster.
async fn health(store: &Etcd) -> Vec<Check> {
    use Level::{Fail, Ok, Warn};
    let mut out = Vec::new();
    let total = store.loc.endpoints.len();
    let mut answered = Vec::new();
    let mut silent = Vec::new();
    let mut leaders = std::collections::HashSet::new();
    let mut db = 0;
    for ep in &store.loc.endpoints {
        let opts = store
            .options
            .clone()
            .with_connect_timeout(Duration::from_secs(2));
        let asked = async {
            let mut c = Client::connect([ep.as_str()], Some(opts)).await?;
            c.status().await
        };
        match tokio::time::timeout(Duration::from_secs(3), asked).await {
            Result::Ok(Result::Ok(st)) => {
                answered.push(format!("{ep} (v{})", st.version()));
                if st.leader() != 0 {
                    leaders.insert(st.leader());
                }
                db = db.max(st.db_size());
            }
            Result::Ok(Err(e)) => silent.push(format!("{ep}: {e}")),
            Err(_) => silent.push(format!("{ep}: no answer within 3 s")),
        }
    }
    let majority = total / 2 + 1;
    out.push(match (answered.len(), silent.is_empty()) {
        (0, _) => finding(
            "cluster",
            Fail,
            format!("no member of {} answers: {}", store.loc.display(), silent.join("; ")),
            Some("start the etcd members, or fix `store` in settings.json"),
        ),
        (n, true) => finding("cluster", Ok, format!("{n} of {total} members answer: {}", answered.join(", ")), None),
        (n, false) if n < majority => finding(
            "cluster",
            Fail,
            format!(
                "quorum lost: {n} of {total} members answer ({}), and the cluster needs \
                 {majority}; not: {}. Nothing can be written: signals stay spooled where they \
                 arrived and are applied once a majority answers again",
                answered.join(", "),
                silent.join("; ")
            ),
            Some("restart the silent members"),
        ),
        (n, false) => finding(
            "cluster",
            Warn,
            format!("{n} of {total} members answer; not: {}", silent.join("; ")),
            Some("restart the silent members: the cluster stays writable only while a majority answers"),
        ),
    });
    if answered.is_empty() {
        return out;
    }
    out.push(match leaders.len() {
        0 => finding(
            "raft",
            Fail,
            format!(
                "no member leads the cluster ({} of {total} answer, none has a leader): every \
                 write fails and signals stay spooled where they arrived",
                answered.len()
            ),
            Some("bring a majority of the members up"),
        ),
        1 => finding("raft", Ok, "one member leads the cluster".into(), None),
        _ => finding(
            "raft",
            Warn,
            "members name different leaders (an election in progress?)".into(),
            Some("run doctor again in a few seconds"),
        ),
    });
    if leaders.is_empty() {
        // The checks below ask the cluster, which cannot answer without a leader.
        return out;
    }
    let alarms = store
        .members
        .run(REQUEST_TIMEOUT, |mut c| async move {
            c.alarm(
                etcd_client::AlarmAction::Get,
                etcd_client::AlarmType::None,
                None,
            )
            .await
        })
        .await
        .map(|(a, _)| a);
    let size = format!("database {} kB", db / 1024);
    out.push(match alarms {
        Err(e) => finding("space", Warn, format!("{size}; cannot read alarms: {e}"), None),
        Result::Ok(a) if a.alarms().iter().any(|m| m.alarm() == etcd_client::AlarmType::Nospace) => finding(
            "space",
            Fail,
            format!("{size}: the cluster is out of space (NOSPACE): it refuses writes; signals stay spooled where they arrived"),
            Some("etcdctl compact <revision>; etcdctl defrag; etcdctl alarm disarm; or raise --quota-backend-bytes"),
        ),
        Result::Ok(_) => finding("space", Ok, format!("{size}, no space alarm"), None),
    });
    let name = store.election();
    let leading = store
        .members
        .run(REQUEST_TIMEOUT, |mut c| {
            let name = name.clone();
            async move { c.leader(name).await }
        })
        .await;
    out.push(match leading {
        Result::Ok((l, _)) => {
            let host = l
                .kv()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                .unwrap_or_default();
            finding(
                "daemons",
                Ok,
                format!("the daemon on host {host:?} applies signals"),
                None,
            )
        }
        // etcd answers an election without a leader with a plain error (code `Unknown`, which
        // is also how a lost connection shows), so it is known by its text.
        Err(e)
            if matches!(e, CallError::Refused(_))
                || e.to_string().contains("election: no leader") =>
        {
            finding(
                "daemons",
                Warn,
                "no daemon leads: signals are kept, but nobody applies them".into(),
                Some("start `waitpoint daemon` on a host of the cluster"),
            )
        }
        Err(e) => finding(
            "daemons",
            Warn,
            format!("cannot ask which daemon leads: {e}"),
            Some("run doctor again in a few seconds"),
        ),
    });
    out
}

/// The store may be dropped inside another runtime's task (the MCP front end drops its engine
/// there), where a runtime may not block to shut down: its tasks (watches, the campaign) are
/// cancelled without waiting.
impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
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

/// Aborts a task of the store's runtime when dropped (a watch).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn not_leading() -> Error {
    Error::Conflict(
        "this daemon does not lead the cluster (now); its writes are refused and another daemon \
         applies them"
            .into(),
    )
}

fn to_json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("our records always serialise")
}

/// The key just past every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Store for Etcd {
    fn begin(&self) -> Result<Box<dyn Txn + '_>> {
        Ok(Box::new(EtcdTxn {
            store: self,
            read: HashMap::new(),
            fetched: HashMap::new(),
        }))
    }

    fn begin_batch(&self) -> Result<Box<dyn Txn + '_>> {
        self.begin()
    }

    fn get(&self, id: &str) -> Result<Option<Waitpoint>> {
        if !is_waitpoint_id(id) {
            return Ok(None);
        }
        let key = self.wp_key(id);
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
                Some((v, _)) => self.parse_wp(&self.wp_key(id), &v)?,
                None => None,
            });
        }
        Ok(out)
    }

    fn create(&self, wp: &Waitpoint) -> Result<()> {
        let key = self.wp_key(&wp.id);
        let mut ops = vec![
            TxnOp::put(key.clone(), to_json(wp), None),
            TxnOp::put(self.idx_key(&wp.session, &wp.id), Vec::new(), None),
            TxnOp::put(
                self.key(&format!("chan/{}", identity_key(&wp.channel))),
                self.host.as_bytes().to_vec(),
                None,
            ),
        ];
        if wp.channel != wp.session {
            ops.push(TxnOp::put(
                self.idx_key(&wp.channel, &wp.id),
                Vec::new(),
                None,
            ));
        }
        let absent = vec![Compare::version(key, CompareOp::Equal, 0)];
        // A command arms; the fence is a daemon's (an import runs as a command too).
        self.guarded("cannot create a waitpoint", absent, ops)?;
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
        let rec = self.key("rec/");
        let mut records: HashMap<String, Vec<SignalRecord>> = HashMap::new();
        for (k, v) in self.range(&rec, false, at)? {
            let rest = String::from_utf8_lossy(&k[rec.len()..]).into_owned();
            let Some((id, _)) = rest.split_once('/') else {
                continue;
            };
            match serde_json::from_slice::<SignalRecord>(&v) {
                Ok(r) => records.entry(id.to_owned()).or_default().push(r),
                Err(e) => {
                    tracing::warn!(key = %String::from_utf8_lossy(&k), "skipping a record that does not parse: {e}")
                }
            }
        }
        for (k, v) in self.range(&self.key("wp/"), false, at)? {
            let Ok(wp) = serde_json::from_slice::<Waitpoint>(&v) else {
                tracing::warn!(key = %String::from_utf8_lossy(&k), "skipping a waitpoint that does not parse");
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
        let key = self.wp_key(&wp.id);
        if self.get_value(key.clone())?.is_some() {
            return Ok(false);
        }
        for chunk in records.chunks(MAX_TXN_OPS) {
            let ops = chunk
                .iter()
                .map(|r| {
                    let mut k = self.rec_prefix(&wp.id);
                    let name = signal_file_name(r.seq, &identity_key(&identity_of(&r.source)));
                    k.extend_from_slice(name.as_bytes());
                    TxnOp::put(k, to_json(r), None)
                })
                .collect::<Vec<_>>();
            let req = EtcdTxnReq::new().and_then(ops);
            self.txn("cannot import records", req)?;
        }
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
        let prefix = self.rec_prefix(id);
        Ok(self
            .range(&prefix, true, 0)?
            .into_iter()
            .filter_map(|(k, _)| {
                let name = String::from_utf8_lossy(&k[prefix.len()..]).into_owned();
                parse_signal_file_name(&name)
            })
            .collect())
    }

    fn record(&self, id: &str, seq: u64, key: &str) -> Result<Option<SignalRecord>> {
        let mut k = self.rec_prefix(id);
        k.extend_from_slice(signal_file_name(seq, key).as_bytes());
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
        for (k, v) in self.range(&self.key("wp/"), false, 0)? {
            if let Some(wp) = self.parse_wp(&k, &v)? {
                f(wp)?;
            }
        }
        Ok(())
    }

    fn list_visible(&self, session: &str) -> Result<Vec<Waitpoint>> {
        let prefix = self.key(&format!("idx/{}/", identity_key(session)));
        let ids: Vec<String> = self
            .range(&prefix, true, 0)?
            .into_iter()
            .map(|(k, _)| String::from_utf8_lossy(&k[prefix.len()..]).into_owned())
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

    /// One watch on the whole prefix: waitpoints that changed, signals handed over, wakes for
    /// this host. A watch that ends (a member restarted) is resumed from the revision after
    /// the last one it reported, so nothing between is missed; only when that history is
    /// compacted away does the owner hear a resync (as after an inotify overflow). The first
    /// watch needs none: its owner reads everything after starting it. A watch that broke is
    /// resumed on the next member; one that was cancelled because its member lost the leader
    /// too (the members are asked to require one).
    fn watch(&self, hint: Box<dyn Fn(Hint) + Send>) -> Result<Box<dyn Any + Send>> {
        let members = Arc::clone(&self.members);
        let prefix = self.loc.prefix.clone();
        let wakes = format!("{prefix}wake/{}/", self.host);
        let own = Arc::clone(&self.own);
        let task = self.rt().spawn(async move {
            // The first revision the next watch must report; 0: from now.
            let mut next = 0;
            loop {
                let mut opts = WatchOptions::new().with_prefix();
                if next > 0 {
                    opts = opts.with_start_revision(next);
                }
                let opened = members
                    .run(REQUEST_TIMEOUT, |mut c| {
                        let (prefix, opts) = (prefix.clone(), opts.clone());
                        async move { c.watch(prefix, Some(opts)).await }
                    })
                    .await;
                if let Ok((mut stream, at)) = opened {
                    // A watch from now starts after the revision its first answer names.
                    let mut from_now = next == 0;
                    // Whether the watch ended through its member's failure (the stream broke,
                    // the member lost its leader) rather than a compaction.
                    let mut failed = true;
                    while let Ok(Some(resp)) = stream.message().await {
                        if resp.canceled() {
                            if resp.compact_revision() > 0 {
                                // What happened since `next` is gone: read everything again.
                                next = 0;
                                failed = false;
                                hint(Hint::Resync);
                            }
                            break;
                        }
                        if from_now && let Some(h) = resp.header() {
                            next = h.revision() + 1;
                            from_now = false;
                        }
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            next = next.max(kv.mod_revision() + 1);
                            let key = String::from_utf8_lossy(kv.key());
                            let Some(rest) = key.strip_prefix(&prefix) else {
                                continue;
                            };
                            if let Some(id) = rest.strip_prefix("wp/") {
                                let mine = own.lock_or_recover().contains(&kv.mod_revision());
                                if ev.event_type() == EventType::Put && !mine {
                                    hint(Hint::Changed(id.to_owned()));
                                }
                            } else if let Some(id) = rest.strip_prefix("tm/") {
                                hint(Hint::Timer(id.to_owned()));
                            } else if let Some(id) = rest.strip_prefix("cb/") {
                                hint(Hint::Callback(id.to_owned()));
                            } else if rest.starts_with("in/") {
                                if ev.event_type() == EventType::Put {
                                    hint(Hint::Forwarded);
                                }
                            } else if key.starts_with(&wakes) && ev.event_type() == EventType::Put {
                                hint(Hint::Wakes);
                            }
                        }
                    }
                    if failed {
                        members.failed(at);
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Ok(Box::new(AbortOnDrop(task.abort_handle())))
    }

    fn needs_recovery(&self) -> bool {
        false
    }

    /// Nothing to finish: a transaction is whole or absent.
    fn recover(&self) -> Result<usize> {
        Ok(0)
    }

    fn checkpoint(&self) -> Result<()> {
        Ok(())
    }

    fn background(&self) -> Result<Box<dyn Any + Send>> {
        Ok(Box::new(()))
    }

    fn host(&self) -> Option<&str> {
        Some(&self.host)
    }

    fn applies_signals(&self) -> bool {
        self.role == Role::Daemon && self.fence_rev().is_some()
    }

    fn forward(&self, items: &[Forwarded]) -> Result<()> {
        for chunk in items.chunks(MAX_TXN_OPS) {
            let ops = chunk
                .iter()
                .map(|f| TxnOp::put(self.key(&format!("in/{}", f.key)), to_json(f), None))
                .collect::<Vec<_>>();
            let req = EtcdTxnReq::new().and_then(ops);
            self.txn("cannot hand signals over", req)?;
        }
        Ok(())
    }

    fn forwarded(&self, max: usize) -> Result<Vec<Forwarded>> {
        let prefix = self.key("in/");
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

    fn settle_forwarded(&self, keys: &[String]) -> Result<()> {
        for chunk in keys.chunks(MAX_TXN_OPS) {
            let ops = chunk
                .iter()
                .map(|k| TxnOp::delete(self.key(&format!("in/{k}")), None))
                .collect::<Vec<_>>();
            let req = EtcdTxnReq::new().and_then(ops);
            self.txn("cannot settle handed-over signals", req)?;
        }
        Ok(())
    }

    fn deliver(&self, home: &Home, wake: &Wake) -> Result<()> {
        if self.host_of(&wake.channel)? == self.host {
            return crate::delivery::deliver(home, wake);
        }
        let op = self.wake_op(wake)?;
        let req = EtcdTxnReq::new().and_then(vec![op]);
        self.txn("cannot send a wake", req)?;
        Ok(())
    }

    fn deliver_pending(&self) -> Result<usize> {
        self.deliver_pending_here()
    }

    fn health(&self) -> Vec<Check> {
        let mut out = self.rt().block_on(health(self));
        if out
            .iter()
            .any(|h| matches!(h.name, "cluster" | "raft") && h.level == Level::Fail)
        {
            // No member answers, or none has a leader: there is nothing more to ask.
            return out;
        }
        let now = self.revision().unwrap_or(0);
        let key = self.key("wp/");
        let first = self.read(
            "cannot read",
            &key,
            Some(GetOptions::new().with_revision(1).with_count_only()),
        );
        out.push(match first {
            Ok(_) if now > UNCOMPACTED_WARN => finding(
                "history",
                Level::Warn,
                format!(
                    "revision {now} and nothing compacted: the history grows until it fills \
                     the quota"
                ),
                Some(
                    "run etcd with --auto-compaction-mode=periodic --auto-compaction-retention=1h",
                ),
            ),
            Ok(_) => finding("history", Level::Ok, format!("revision {now}"), None),
            Err(_) => finding(
                "history",
                Level::Ok,
                format!("revision {now}, older history compacted"),
                None,
            ),
        });
        let count = |rest: &str| self.range(&self.key(rest), true, 0).map_or(0, |v| v.len());
        let waiting = count("in/");
        let wakes = count(&format!("wake/{}/", self.host));
        let idle = waiting + wakes == 0;
        out.push(finding(
            "backlog",
            if idle { Level::Ok } else { Level::Warn },
            format!(
                "{waiting} signals handed over and not yet applied; {wakes} wakes waiting for \
                 this host ({})",
                self.host
            ),
            (!idle).then_some("they drain while a daemon leads and this host's daemon runs"),
        ));
        out
    }

    fn lead(&self, on_change: Box<dyn Fn(bool) + Send + Sync>) -> Result<Box<dyn Any + Send>> {
        match self.role {
            Role::Daemon => Ok(self.campaign(on_change)),
            Role::Command => Err(Error::Conflict("only a daemon leads".into())),
        }
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }
}

impl Etcd {
    fn doc_key(&self, kind: super::DocKind, id: &str) -> Vec<u8> {
        self.key(&format!("{}{id}", kind.prefix()))
    }

    /// One record of a kind with its key's revision; one that does not parse is set aside.
    fn read_doc<T: Doc>(&self, id: &str) -> Result<Option<(T, i64)>> {
        if !T::KIND.is_id(id) {
            return Ok(None);
        }
        let key = self.doc_key(T::KIND, id);
        match self.get_value(key.clone())? {
            None => Ok(None),
            Some((v, rev)) => match serde_json::from_slice(&v) {
                Ok(t) => Ok(Some((t, rev))),
                Err(e) => {
                    self.set_aside(&key, &v, &e.to_string())?;
                    Ok(None)
                }
            },
        }
    }
}

impl<T: Doc> Docs<T> for Etcd {
    fn get_doc(&self, id: &str) -> Result<Option<T>> {
        Ok(self.read_doc(id)?.map(|(t, _)| t))
    }

    fn all_docs(&self) -> Result<Vec<T>> {
        let mut out = Vec::new();
        for (k, v) in self.range(&self.key(T::KIND.prefix()), false, 0)? {
            match serde_json::from_slice::<T>(&v) {
                Ok(t) => out.push(t),
                Err(e) => self.set_aside(&k, &v, &e.to_string())?,
            }
        }
        Ok(out)
    }

    fn begin_docs(&self) -> Result<Box<dyn DocTxn<T> + '_>> {
        Ok(Box::new(EtcdDocs::new(self)))
    }
}

/// Timers or callbacks: each write compares the revision read (or that the key is new, which
/// also records the session's host, where its wakes go). A timer's write is fenced like a
/// waitpoint's; a callback's is not ([`super::DocKind::fenced`]).
struct EtcdDocs<'a, T> {
    store: &'a Etcd,
    read: HashMap<String, i64>,
    kind: std::marker::PhantomData<T>,
}

impl<'a, T> EtcdDocs<'a, T> {
    fn new(store: &'a Etcd) -> Self {
        EtcdDocs {
            store,
            read: HashMap::new(),
            kind: std::marker::PhantomData,
        }
    }
}

impl<T: Doc> DocTxn<T> for EtcdDocs<'_, T> {
    fn read(&mut self, id: &str) -> Result<Option<T>> {
        Ok(self.store.read_doc::<T>(id)?.map(|(t, rev)| {
            self.read.insert(id.to_owned(), rev);
            t
        }))
    }

    fn put(&mut self, doc: &T) -> Result<()> {
        self.put_all(std::slice::from_ref(doc))
    }

    /// Every document's write and its check in one etcd transaction.
    fn put_all(&mut self, docs: &[T]) -> Result<()> {
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        let mut channels = std::collections::HashSet::new();
        for doc in docs {
            let key = self.store.doc_key(T::KIND, doc.id());
            ops.push(TxnOp::put(key.clone(), to_json(doc), None));
            compares.push(match self.read.get(doc.id()) {
                Some(rev) => Compare::mod_revision(key, CompareOp::Equal, *rev),
                None => {
                    // One put per key: etcd refuses a transaction naming a key twice.
                    if channels.insert(doc.session().to_owned()) {
                        ops.push(TxnOp::put(
                            self.store
                                .key(&format!("chan/{}", identity_key(doc.session()))),
                            self.store.host.as_bytes().to_vec(),
                            None,
                        ));
                    }
                    Compare::version(key, CompareOp::Equal, 0)
                }
            });
        }
        let what = "cannot write a timer or callback";
        let rev = self.store.commit(what, compares, ops, T::KIND.fenced())?;
        for doc in docs {
            self.read.insert(doc.id().to_owned(), rev);
        }
        Ok(())
    }
}

/// A transaction: the revisions it read, which every write compares.
struct EtcdTxn<'a> {
    store: &'a Etcd,
    read: HashMap<String, i64>,
    /// Waitpoints fetched ahead by [`Txn::prefetch`], each taken by its first read: its
    /// value and revision, or `None` when it does not exist.
    fetched: HashMap<String, Fetched>,
}

impl EtcdTxn<'_> {
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
        let key = self.store.wp_key(id);
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
        let key = self.store.wp_key(&wp.id);
        let compares = vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)];
        let new = self.store.guarded(
            "cannot write a waitpoint",
            compares,
            vec![TxnOp::put(key, to_json(wp), None)],
        )?;
        self.read.insert(wp.id.clone(), new);
        Ok(())
    }

    fn remove(&mut self, wp: &Waitpoint) -> Result<()> {
        let rev = self.read_rev(&wp.id)?;
        let key = self.store.wp_key(&wp.id);
        let compares = vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)];
        let mut ops = vec![
            TxnOp::delete(key, None),
            TxnOp::delete(
                self.store.rec_prefix(&wp.id),
                Some(DeleteOptions::new().with_prefix()),
            ),
            TxnOp::delete(self.store.idx_key(&wp.session, &wp.id), None),
        ];
        if wp.channel != wp.session {
            ops.push(TxnOp::delete(self.store.idx_key(&wp.channel, &wp.id), None));
        }
        self.store
            .guarded("cannot remove a waitpoint", compares, ops)?;
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
        for c in changes {
            let id = &c.change.state.id;
            let rev = self.read_rev(id)?;
            if rev as u64 != c.expect.0 {
                return Err(Error::Conflict(format!(
                    "{id} changed since it was read (revision {} then, {rev} now)",
                    c.expect.0
                )));
            }
            let key = self.store.wp_key(id);
            compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, rev));
            ops.push(TxnOp::put(key, to_json(&c.change.state), None));
            for r in &c.change.records {
                let mut k = self.store.rec_prefix(id);
                let name = signal_file_name(r.seq, &identity_key(&identity_of(&r.source)));
                k.extend_from_slice(name.as_bytes());
                compares.push(Compare::version(k.clone(), CompareOp::Equal, 0));
                ops.push(TxnOp::put(k, to_json(r), None));
            }
            for w in &c.change.wakes {
                ops.push(self.store.wake_op(w)?);
            }
        }
        let rev = self.store.guarded("cannot commit signals", compares, ops)?;
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
            tracing::warn!("wakes stay in the store for the next delivery: {e}");
        }
        Ok(())
    }

    fn replayed(&self) -> bool {
        false
    }
}
