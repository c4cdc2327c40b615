//! `doctor`'s checks of the cluster: each member asked on its own (who answers, the quorum,
//! the raft leader, the database's size), then the cluster (the space alarm, which daemon
//! leads, uncompacted history) and this host's backlog (signals handed over, wakes waiting),
//! each finding with its fix.

use std::time::Duration;

use etcd_client::{Client, GetOptions};

use crate::store::etcd::Etcd;
use crate::store::etcd::client::REQUEST_TIMEOUT;
use crate::store::etcd::endpoints::CallError;
use crate::store::{Finding, Level};

fn finding(name: &'static str, level: Level, detail: String, fix: Option<&str>) -> Finding {
    Finding {
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
async fn cluster(store: &Etcd) -> Vec<Finding> {
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
            format!(
                "no member of {} answers: {}",
                store.loc.display(),
                silent.join("; ")
            ),
            Some("start the etcd members, or fix `store` in settings.json"),
        ),
        (n, true) => finding(
            "cluster",
            Ok,
            format!("{n} of {total} members answer: {}", answered.join(", ")),
            None,
        ),
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
            Some(
                "restart the silent members: the cluster stays writable only while a majority \
                  answers",
            ),
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
        Err(e) => finding(
            "space",
            Warn,
            format!("{size}; cannot read alarms: {e}"),
            None,
        ),
        Result::Ok(a)
            if a.alarms()
                .iter()
                .any(|m| m.alarm() == etcd_client::AlarmType::Nospace) =>
        {
            finding(
                "space",
                Fail,
                format!(
                    "{size}: the cluster is out of space (NOSPACE): it refuses writes; signals \
                     stay spooled where they arrived"
                ),
                Some(
                    "etcdctl compact <revision>; etcdctl defrag; etcdctl alarm disarm; or raise \
                  --quota-backend-bytes",
                ),
            )
        }
        Result::Ok(_) => finding("space", Ok, format!("{size}, no space alarm"), None),
    });
    let name = store.keys.election();
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

impl Etcd {
    /// Every check, the cluster's first; when no member answers or none has a leader, only
    /// those.
    pub(super) fn checks(&self) -> Vec<Finding> {
        let mut out = self.rt().block_on(cluster(self));
        if out
            .iter()
            .any(|h| matches!(h.name, "cluster" | "raft") && h.level == Level::Fail)
        {
            // No member answers, or none has a leader: there is nothing more to ask.
            return out;
        }
        let now = self.revision().unwrap_or(0);
        let key = self.keys.waitpoints();
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
        let count = |prefix: Vec<u8>| self.range(&prefix, true, 0).map_or(0, |v| v.len());
        let waiting = count(self.keys.all_handed_over());
        let wakes = count(self.keys.wakes_for(&self.host));
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
}
