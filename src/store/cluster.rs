//! What a store shared by several hosts adds to [`Store`]: the host's name, the election of the
//! one daemon that applies signals, the signals other hosts hand over to it, the wakes that
//! wait in the store for a host's inboxes, the bound on a transaction, and the store's health.
//! A store of one home has none of it: [`Store::cluster`] is `None`, and the views on
//! `dyn Store` below answer as a cluster of one would (this process applies signals, its
//! daemon always leads, a batch is unbounded).

use super::{Finding, Forwarded, Store};
use crate::error::Result;

/// A store shared by several hosts ([`Store::cluster`]).
pub trait Cluster: Send + Sync {
    /// The name this host goes by. A drop-zone file's identity is qualified with it, so the
    /// same file name on two hosts is two signals (see [`Forwarded`]).
    fn host(&self) -> &str;
    /// Whether this process applies signals now: only the leading daemon does; every other
    /// process hands them over durably with [`forward`](Self::forward).
    fn applies_signals(&self) -> bool;
    /// Keeps signals for the applier, durably when this returns; one key per identity, so a
    /// signal handed over twice is kept once.
    fn forward(&self, items: &[Forwarded]) -> Result<()>;
    /// Up to `max` signals handed over and not yet applied, oldest first.
    fn forwarded(&self, max: usize) -> Result<Vec<Forwarded>>;
    /// Forgets handed-over signals once their verdicts are durable.
    fn settle_forwarded(&self, keys: &[String]) -> Result<()>;
    /// Delivers the wakes that wait in the store for this host's inboxes; returns how many.
    fn deliver_pending(&self) -> Result<usize>;
    /// Campaigns to be the one daemon that applies signals, until the guard drops, telling
    /// `on_change` when this daemon starts (`true`) or stops leading.
    fn lead(&self, on_change: Box<dyn Fn(bool) + Send + Sync>) -> Result<Guard>;
    /// The most signals one commit may carry (the store's transactions are bounded).
    fn max_batch(&self) -> usize;
    /// How the store is (members, leader, space, history), for `doctor`.
    fn health(&self) -> Vec<Finding>;
}

/// Work a store keeps running for its caller (a watch, background work, a campaign) until this
/// is dropped. What it holds is the store's own business.
#[must_use = "the work stops when its guard is dropped"]
pub struct Guard(#[allow(dead_code)] Box<dyn Send>);

impl Guard {
    /// Keeps `held` (threads' stop handles, a client, a task) until the guard drops.
    pub fn new(held: impl Send + 'static) -> Guard {
        Guard(Box::new(held))
    }

    /// A guard for no work at all.
    pub fn nothing() -> Guard {
        Guard(Box::new(()))
    }
}

impl dyn Store + '_ {
    /// This host's name in a shared store; `None` for one home's.
    pub fn host(&self) -> Option<&str> {
        self.cluster().map(|c| c.host())
    }

    /// Whether this process applies signals now (always, on one home's files).
    pub fn applies_signals(&self) -> bool {
        self.cluster().is_none_or(|c| c.applies_signals())
    }

    /// The most signals one commit may carry (unbounded on one home's files).
    pub fn max_batch(&self) -> usize {
        self.cluster().map_or(usize::MAX, |c| c.max_batch())
    }

    /// Campaigns to lead until the guard drops. One home has no election: its daemon always
    /// leads (the home's lock makes it the only one), and is told so at once.
    pub fn lead(&self, on_change: Box<dyn Fn(bool) + Send + Sync>) -> Result<Guard> {
        match self.cluster() {
            Some(c) => c.lead(on_change),
            None => {
                on_change(true);
                Ok(Guard::nothing())
            }
        }
    }
}
