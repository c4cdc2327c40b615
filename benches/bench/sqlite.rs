//! The SQLite peer: the same work as the daemon's ingest done the way an engineer would without
//! us. It reads the drop zone's files, authenticates each (SHA-256 of the secret against the
//! stored hash, compared in constant time), records the signal under its file name as a unique
//! identity, updates the waitpoint's state and writes a wake row, 128 signals to a transaction
//! in SQLite (`journal_mode=WAL`, `synchronous=FULL`), then removes the files it consumed.
//!
//! It runs in this process on files staged exactly as ours are, so the row compares the two
//! designs and nothing else (no process start on either side).

use std::fs;
use std::path::Path;
use std::time::Instant;

use rusqlite::{Connection, params};
use sha2::{Digest, Sha256};

use crate::floor::cpu_secs_self;
use crate::ours::Armed;

/// Signals committed per transaction.
const BATCH: usize = 128;

/// What one run of the peer measured.
pub struct PeerRun {
    /// Signals per second, from the first file renamed into its drop zone to the last removed.
    pub rate: f64,
    /// This process's CPU time per signal (user + system), in microseconds.
    pub cpu_us: f64,
}

fn open(db: &Path, armed: &[Armed]) -> Connection {
    let _ = fs::remove_file(db);
    let c = Connection::open(db).unwrap();
    c.pragma_update(None, "journal_mode", "WAL").unwrap();
    c.pragma_update(None, "synchronous", "FULL").unwrap();
    c.execute_batch(
        "CREATE TABLE waitpoints (
             id TEXT PRIMARY KEY, secret_sha256 TEXT NOT NULL, status TEXT NOT NULL,
             max_signals INTEGER NOT NULL, signals INTEGER NOT NULL DEFAULT 0,
             ok INTEGER NOT NULL DEFAULT 0, fail INTEGER NOT NULL DEFAULT 0,
             wakes INTEGER NOT NULL DEFAULT 0, last_message TEXT);
         CREATE TABLE signals (
             identity TEXT PRIMARY KEY, waitpoint TEXT NOT NULL, seq INTEGER NOT NULL,
             status TEXT NOT NULL, message TEXT, received_at INTEGER NOT NULL);
         CREATE TABLE wakes (
             wake_id TEXT PRIMARY KEY, waitpoint TEXT NOT NULL, channel TEXT NOT NULL,
             text TEXT NOT NULL, created_at INTEGER NOT NULL, read INTEGER NOT NULL DEFAULT 0);",
    )
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    {
        let mut put = tx
            .prepare(
                "INSERT INTO waitpoints (id, secret_sha256, status, max_signals)
                 VALUES (?1, ?2, 'armed', ?3)",
            )
            .unwrap();
        for a in armed {
            put.execute(params![a.wp.id, a.wp.secret_sha256, a.wp.max_signals])
                .unwrap();
        }
    }
    tx.commit().unwrap();
    c
}

/// Runs the peer on `names`, staged in `stage` (renamed into `dir`'s drop zone first, as ours
/// are), against a database of `armed` made under `dir`. Panics unless every signal is
/// recorded exactly once.
pub fn ingest(dir: &Path, stage: &Path, names: &[String], armed: &[Armed]) -> PeerRun {
    let _ = fs::remove_dir_all(dir);
    let drop_zone = dir.join("drop");
    fs::create_dir_all(&drop_zone).unwrap();
    let mut c = open(&dir.join("peer.db"), armed);
    let cpu = cpu_secs_self();
    let t = Instant::now();
    for name in names {
        fs::rename(stage.join(name), drop_zone.join(name)).unwrap();
    }
    let mut listed: Vec<String> = fs::read_dir(&drop_zone)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
        .collect();
    listed.sort();
    for chunk in listed.chunks(BATCH) {
        let tx = c.transaction().unwrap();
        {
            let mut get = tx
                .prepare_cached(
                    "SELECT secret_sha256, status, max_signals, signals FROM \
                                 waitpoints WHERE id = ?1",
                )
                .unwrap();
            let mut record = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO signals (identity, waitpoint, seq, status, message, \
                     received_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .unwrap();
            let mut update = tx
                .prepare_cached(
                    "UPDATE waitpoints SET signals = signals + 1, ok = ok + (?2 = 'ok'),
                     fail = fail + (?2 = 'fail'), wakes = wakes + 1, last_message = ?3,
                     status = CASE WHEN signals + 1 >= max_signals THEN 'resolved' ELSE status END
                     WHERE id = ?1",
                )
                .unwrap();
            let mut wake = tx
                .prepare_cached(
                    "INSERT INTO wakes (wake_id, waitpoint, channel, text, created_at)
                     VALUES (?1, ?2, 'bench', ?3, ?4)",
                )
                .unwrap();
            for name in chunk {
                let bytes = fs::read(drop_zone.join(name)).unwrap();
                let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                let (id, secret) = (v["id"].as_str().unwrap(), v["secret"].as_str().unwrap());
                let status = v["status"].as_str().unwrap_or("ok");
                let message = v["message"].as_str();
                let (hash, state, max, seen): (String, String, u32, u32) = get
                    .query_row(params![id], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })
                    .unwrap();
                let given = hex::encode(Sha256::digest(secret.as_bytes()));
                assert!(
                    constant_time_eq::constant_time_eq(given.as_bytes(), hash.as_bytes()),
                    "the peer authenticates every signal"
                );
                assert_eq!(state, "armed");
                assert!(seen < max);
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64;
                if record
                    .execute(params![name, id, seen + 1, status, message, now])
                    .unwrap()
                    == 1
                {
                    update.execute(params![id, status, message]).unwrap();
                    let text = format!("{id}: {status} ({})", message.unwrap_or(""));
                    wake.execute(params![format!("{id}-{}", seen + 1), id, text, now])
                        .unwrap();
                }
            }
        }
        tx.commit().unwrap();
        for name in chunk {
            fs::remove_file(drop_zone.join(name)).unwrap();
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu_us = (cpu_secs_self() - cpu) * 1e6 / names.len() as f64;
    let recorded: i64 = c
        .query_row("SELECT count(*) FROM signals", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        recorded as usize,
        names.len(),
        "the peer recorded every signal once"
    );
    PeerRun {
        rate: names.len() as f64 / secs,
        cpu_us,
    }
}
