//! The etcd store's client: connecting (credentials read from files only their owner can
//! change), and the requests every other part of the store makes through the members (one
//! request, a transaction, a range read in pages, waitpoints fetched at one revision), each on
//! the store's runtime within [`REQUEST_TIMEOUT`]; and setting aside a value that does not
//! parse, so it stops nothing else.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, TlsOptions, Txn as EtcdTxnReq, TxnOp,
};

use crate::error::{Error, Result};
use crate::home::Home;
use crate::settings::location::EtcdLocation;
use crate::store::Role;
use crate::store::etcd::Etcd;
use crate::store::etcd::endpoints::Members;
use crate::store::etcd::keys::{Keys, prefix_end};

/// How long one request may take before it counts as failed (a campaign waits longer: it
/// is not a request but a wait for leadership).
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The most operations this store puts in one transaction (etcd's default `--max-txn-ops`).
pub(super) const MAX_TXN_OPS: usize = 128;
/// The most bytes of values a transaction of many keys is given, well under etcd's default
/// request limit (1.5 MiB), which keys and framing share.
pub(super) const MAX_TXN_BYTES: usize = 1 << 20;
/// A key's value and modification revision, or `None` when it does not exist.
pub(super) type Fetched = Option<(Vec<u8>, i64)>;

pub(super) fn store_error(
    loc: &EtcdLocation,
    what: &str,
    message: impl std::fmt::Display,
) -> Error {
    Error::Store {
        store: loc.display(),
        message: format!("{what}: {message}"),
    }
}

pub(super) fn to_json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("our records always serialise")
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
            keys: Keys::new(&loc.prefix),
            host: host.to_owned(),
            inboxes: crate::delivery::Inboxes::new(home),
            role,
            options: probe,
            fence: Arc::new(Mutex::new(None)),
            own: Arc::new(Mutex::new(std::collections::VecDeque::new())),
            settled: Mutex::new(Default::default()),
            channels: Mutex::new(HashMap::new()),
        })
    }

    /// Runs one request on the runtime, on the first member that answers, within
    /// [`REQUEST_TIMEOUT`]. `f` may run more than once (see
    /// [`endpoints`](crate::store::etcd::endpoints) on why every request of this store may).
    pub(super) fn call<T, F: Future<Output = std::result::Result<T, etcd_client::Error>>>(
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
    pub(super) fn txn(&self, what: &str, req: EtcdTxnReq) -> Result<etcd_client::TxnResponse> {
        self.call(what, |mut c| {
            let req = req.clone();
            async move { c.txn(req).await }
        })
    }

    /// One transaction, through the members as [`call`](Self::call) sends it, and whether a
    /// member asked before the one that answered went without an answer (so an earlier copy
    /// of it may have committed: see [`Members::run_noting`]).
    pub(super) fn txn_noting(
        &self,
        what: &str,
        req: EtcdTxnReq,
    ) -> Result<(etcd_client::TxnResponse, bool)> {
        self.rt()
            .block_on(self.members.run_noting(REQUEST_TIMEOUT, |mut c| {
                let req = req.clone();
                async move { c.txn(req).await }
            }))
            .map(|(v, _, retried)| (v, retried))
            .map_err(|e| store_error(&self.loc, what, e))
    }

    /// Sends `ops` in transactions of at most [`MAX_TXN_OPS`] each, one after the other: for
    /// writes that need not be whole (each op stands alone and is safe to send twice).
    pub(super) fn in_chunks(&self, what: &str, ops: Vec<TxnOp>) -> Result<()> {
        for chunk in ops.chunks(MAX_TXN_OPS) {
            self.txn(what, EtcdTxnReq::new().and_then(chunk.to_vec()))?;
        }
        Ok(())
    }

    /// One range read, through [`call`](Self::call).
    pub(super) fn read(
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

    pub(super) fn get_value(&self, key: Vec<u8>) -> Result<Fetched> {
        let mut resp = self.read("cannot read", &key, None)?;
        Ok(resp
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    /// The values and revisions of waitpoints `ids`, one etcd transaction of gets (all at one
    /// revision) per [`MAX_TXN_OPS`]; `None` for one that does not exist.
    pub(super) fn fetch(&self, ids: &[&str]) -> Result<Vec<Fetched>> {
        let keys: Vec<Vec<u8>> = ids.iter().map(|id| self.keys.waitpoint(id)).collect();
        self.get_keys("cannot read waitpoints", &keys)
    }

    /// Each key's value and modification revision (`None` for one absent), read by
    /// transactions of at most [`MAX_TXN_OPS`] gets each.
    pub(super) fn get_keys(&self, what: &str, keys: &[Vec<u8>]) -> Result<Vec<Fetched>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(MAX_TXN_OPS) {
            let ops = chunk
                .iter()
                .map(|k| TxnOp::get(k.clone(), None))
                .collect::<Vec<_>>();
            let resp = self.txn(what, EtcdTxnReq::new().and_then(ops))?;
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
        let key = self.keys.waitpoints();
        let resp = self.read(
            "cannot read",
            &key,
            Some(GetOptions::new().with_count_only()),
        )?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }

    /// Moves a value that does not parse to `bad/`, with the reason, so it stops nothing else.
    pub(super) fn set_aside(&self, key: &[u8], value: &[u8], reason: &str) -> Result<()> {
        let name = String::from_utf8_lossy(key).into_owned();
        tracing::warn!(key = %name, reason = %reason, "set aside a value that does not parse");
        let record = serde_json::json!({
            "key": name,
            "reason": reason,
            "value": String::from_utf8_lossy(value),
        });
        let req = EtcdTxnReq::new().and_then(vec![
            TxnOp::put(self.keys.set_aside(key), to_json(&record), None),
            TxnOp::delete(key.to_vec(), None),
        ]);
        self.txn("cannot set aside", req)?;
        Ok(())
    }
}
