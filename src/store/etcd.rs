//! The etcd store (feature `etcd`): waitpoints on an etcd cluster that several hosts share,
//! each running its own daemon with its own home, drop zone and inboxes (`docs/etcd.md`).
//!
//! This file holds the [`Etcd`] type and what its parts share; each job is a file of its own:
//! - [`keys`]: the key scheme, every key built and read back;
//! - [`client`]: connecting, and the requests every part makes through [`endpoints`];
//! - [`fence`]: the commit, guarded by revisions and a daemon's leadership;
//! - [`election`]: the campaign on a kept-alive lease that makes the leader;
//! - [`watch`]: changes seen in the cluster, as the owner's hints;
//! - [`routing`]: signals handed over to the leader, wakes routed to their host;
//! - [`health`]: `doctor`'s checks of the cluster;
//! - [`waitpoints`], [`txn`], [`docs`]: the [`Store`](crate::store::Store),
//!   [`Txn`](crate::store::Txn) and [`Docs`](crate::store::Docs) implementations.
//!
//! Every write a transaction makes compares the revision of each waitpoint key it read, so a
//! concurrent writer makes it fail ([`Error::Conflict`](crate::error::Error::Conflict))
//! instead of losing an update; a daemon's writes also compare its leadership key (the fence).
//!
//! The client is asynchronous (tonic); the store owns one small tokio runtime and blocks on it,
//! so the engine stays synchronous. Nothing here runs inside another runtime's worker: the MCP
//! front end calls the engine from blocking threads.
//!
//! Each member is reached on its own and a request goes to the next when one does not answer
//! ([`endpoints`]): the store works while a majority of the members does.

mod client;
mod docs;
mod election;
mod endpoints;
mod fence;
mod health;
mod keys;
mod routing;
mod txn;
mod waitpoints;
mod watch;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use etcd_client::ConnectOptions;

use crate::delivery::Inboxes;
use crate::settings::location::EtcdLocation;
use crate::store::Role;
use crate::store::etcd::endpoints::Members;
use crate::store::etcd::fence::Fence;
use crate::store::etcd::keys::Keys;
use crate::sync::MutexExt;

/// The most signals one commit carries: with a record, a state and a wake each, and the
/// handed-over keys deleted after, a batch stays well under etcd's default 128 operations.
pub const MAX_SIGNALS_PER_TXN: usize = 30;
/// How many identity keys [`Etcd`] remembers as forgotten by a commit.
const SETTLED_KEYS: usize = 4096;
/// How many of its own commit revisions a store remembers for its watch.
const OWN_REVISIONS: usize = 1024;

/// Waitpoints on etcd. See the module docs.
pub struct Etcd {
    /// Taken only by `drop` (see there).
    rt: Option<tokio::runtime::Runtime>,
    /// The members, each with its own client (see [`endpoints`]).
    members: Arc<Members>,
    loc: EtcdLocation,
    /// Every key, under the location's prefix.
    keys: Keys,
    host: String,
    /// This host's inboxes: where the wakes for its sessions are delivered.
    inboxes: Inboxes,
    role: Role,
    /// `Some` while this daemon leads.
    fence: Arc<Mutex<Option<Fence>>>,
    /// The revisions of this process's latest commits: the watch leaves their waitpoint
    /// events out, as the files' watch does (changes one makes itself need no hint).
    own: Arc<Mutex<VecDeque<i64>>>,
    /// Identity keys whose `in/` key a commit of this process deleted with the record it
    /// wrote, so forgetting them after costs no transaction (`settle_handed_over`). Emptied
    /// when it grows past [`SETTLED_KEYS`]: a key forgotten here is only deleted once more.
    settled: Mutex<std::collections::HashSet<String>>,
    /// How to reach a member (TLS, user), for `doctor`, which asks each on its own. Never
    /// printed: its `Debug` shows the password.
    options: ConnectOptions,
    /// Channel → host, as read from `chan/` (a channel's host changes only when it arms
    /// elsewhere; a stale entry sends a wake to the old host's inbox, which still has it).
    channels: Mutex<HashMap<String, String>>,
}

impl Etcd {
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
