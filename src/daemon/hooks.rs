//! The `onWake` hook runner: runs hooks off the loop, a session at a time and sessions side by
//! side, reports each attempt back as [`Event::HookDone`], and the environment each hook is run
//! with.

use super::{Daemon, Event};
use crate::delivery::{self, hook, hook::HookRun};
use crate::engine::HookJob;
use std::collections::{HashSet, VecDeque};
use std::sync::mpsc::Sender;
use std::time::Duration;

/// How many `onWake` runs go at once. A resumed agent turn takes minutes, so runs are not
/// queued behind one another; the bound keeps a burst of wakes from starting a harness per
/// session all at once.
const MAX_RUNNING: usize = 8;

/// Runs `onWake` hooks, each on a thread of its own (never on the loop), and reports each
/// attempt back to the loop as [`Event::HookDone`]. Runs of different sessions go side by side:
/// one session's long turn never holds up another's wake. A session has one run at a time, so
/// its wakes reach it in order and its harness session is never resumed twice at once.
pub(super) struct HookRunner {
    events: Sender<Event>,
    /// Wakes whose run is going or queued: a wake is never run twice at once.
    in_flight: HashSet<String>,
    /// Sessions with a run going.
    busy: HashSet<String>,
    queued: VecDeque<(HookJob, HookRun)>,
}

impl HookRunner {
    pub(super) fn start(events: Sender<Event>) -> Self {
        HookRunner {
            events,
            in_flight: HashSet::new(),
            busy: HashSet::new(),
            queued: VecDeque::new(),
        }
    }

    fn submit(&mut self, job: HookJob, run: HookRun) {
        self.in_flight.insert(job.wake_id.clone());
        self.queued.push_back((job, run));
        self.start_ready();
    }

    /// A run ended (its [`Event::HookDone`] arrived): its session may run its next.
    pub(super) fn finished(&mut self, channel: &str, wake_id: &str) {
        self.in_flight.remove(wake_id);
        self.busy.remove(channel);
        self.start_ready();
    }

    /// Starts queued runs, oldest first, whose session has none going, while fewer than
    /// [`MAX_RUNNING`] go.
    fn start_ready(&mut self) {
        let mut i = 0;
        while i < self.queued.len() && self.busy.len() < MAX_RUNNING {
            if self.busy.contains(&self.queued[i].0.channel) {
                i += 1;
                continue;
            }
            let (job, run) = self.queued.remove(i).expect("an index inside the queue");
            self.busy.insert(job.channel.clone());
            let events = self.events.clone();
            let done = move |job: HookJob, result| {
                let _ = events.send(Event::HookDone {
                    owner: job.owner,
                    wake_id: job.wake_id,
                    channel: Some(job.channel),
                    result,
                });
            };
            let (for_thread, spare) = (job.clone(), done.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("on-wake {}", job.channel))
                .spawn(move || done(for_thread, hook::run(&run)));
            if let Err(e) = spawned {
                spare(job, Err(format!("cannot start a thread for the hook: {e}")));
            }
        }
    }
}

impl Daemon {
    pub(super) fn start_hook(&mut self, job: HookJob) {
        let Some(runner) = &mut self.hooks else {
            return;
        };
        if runner.in_flight.contains(&job.wake_id) {
            return;
        }
        let settings = self.engine.settings();
        let Some(argv) = settings.on_wake.clone() else {
            return;
        };
        let home = self.engine.home();
        let stdin = match delivery::read_delivered(home, &job.channel, &job.wake_id) {
            Ok(Some(b)) => b,
            Ok(None) => {
                tracing::warn!(
                    owner = %job.owner,
                    wake = %job.wake_id,
                    "wake no longer in the inbox; not running the hook for it",
                );
                let _ = self.tx.send(Event::HookDone {
                    owner: job.owner,
                    wake_id: job.wake_id,
                    channel: None,
                    result: Ok(()),
                });
                return;
            }
            Err(e) => {
                tracing::error!(owner = %job.owner, error = %e, "cannot read wake for the hook");
                return;
            }
        };
        let wake_file = home
            .inbox_new(&job.channel)
            .join(format!("{}.json", job.wake_id));
        let env = vec![
            ("WAITPOINT_ID".to_owned(), job.owner.clone()),
            ("WAITPOINT_WAKE_ID".to_owned(), job.wake_id.clone()),
            ("WAITPOINT_CHANNEL".to_owned(), job.channel.clone()),
            ("WAITPOINT_ATTEMPT".to_owned(), job.attempt.to_string()),
            (
                "WAITPOINT_HOME".to_owned(),
                home.root().display().to_string(),
            ),
            (
                "WAITPOINT_WAKE_FILE".to_owned(),
                wake_file.display().to_string(),
            ),
        ];
        let run = HookRun {
            argv,
            stdin,
            env,
            cwd: None,
            timeout: Duration::from_millis(settings.on_wake_timeout_ms),
            stop_on_signals: false,
        };
        runner.submit(job, run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn job(channel: &str, n: u32) -> HookJob {
        HookJob {
            owner: format!("wp_{n}"),
            channel: channel.to_owned(),
            wake_id: format!("wk_0000000000{n:02}_0001"),
            attempt: 1,
        }
    }

    /// A run that fails when another run of the same mark is going: `mkdir` is the test.
    fn run(mark: &std::path::Path) -> HookRun {
        let m = mark.display();
        HookRun {
            argv: vec![
                "sh".into(),
                "-c".into(),
                format!("mkdir '{m}' || exit 1; sleep 0.3; rmdir '{m}'"),
            ],
            stdin: Vec::new(),
            env: Vec::new(),
            cwd: None,
            timeout: Duration::from_secs(30),
            stop_on_signals: false,
        }
    }

    fn next_done(rx: &mpsc::Receiver<Event>) -> (String, Result<(), String>) {
        match rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a run ends")
        {
            Event::HookDone {
                channel, result, ..
            } => (channel.expect("a run"), result),
            _ => panic!("not a hook's end"),
        }
    }

    #[test]
    fn a_session_has_one_run_at_a_time_and_sessions_run_side_by_side() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let mut runner = HookRunner::start(tx);
        let same = dir.path().join("a");
        runner.submit(job("a", 1), run(&same));
        runner.submit(job("a", 2), run(&same));
        // Another session's run goes at once, beside the first.
        runner.submit(job("b", 3), run(&dir.path().join("b")));
        assert_eq!(runner.busy.len(), 2);
        let mut ended = Vec::new();
        while ended.len() < 3 {
            let (channel, result) = next_done(&rx);
            assert_eq!(result, Ok(()), "two runs of session {channel} at once");
            runner.finished(&channel, &format!("wk_{}", ended.len()));
            ended.push(channel);
        }
        assert_eq!(ended.iter().filter(|c| *c == "a").count(), 2);
    }
}
