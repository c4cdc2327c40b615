//! The `onWake` hook runner: a worker thread that runs hooks (never on the loop) and reports each
//! attempt back as [`Event::HookDone`], and the environment each hook is run with.

use super::{Daemon, Event};
use crate::delivery::{self, hook, hook::HookRun};
use crate::engine::HookJob;
use std::collections::HashSet;
use std::sync::mpsc::{self, Sender};
use std::time::Duration;

/// Runs `onWake` hooks on a worker thread, so a slow hook never stalls the engine loop, and
/// reports each attempt back to the loop as [`Event::HookDone`].
pub(super) struct HookRunner {
    pub(super) jobs: Sender<(HookJob, HookRun)>,
    pub(super) in_flight: HashSet<String>,
}

impl HookRunner {
    pub(super) fn start(events: Sender<Event>) -> Self {
        let (jobs, rx) = mpsc::channel::<(HookJob, HookRun)>();
        std::thread::Builder::new()
            .name("on-wake".into())
            .spawn(move || {
                for (job, run) in rx {
                    let result = hook::run(&run);
                    let _ = events.send(Event::HookDone {
                        owner: job.owner,
                        wake_id: job.wake_id,
                        result,
                    });
                }
            })
            .expect("spawn the hook thread");
        HookRunner {
            jobs,
            in_flight: HashSet::new(),
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
                tracing::warn!(owner = %job.owner, wake = %job.wake_id, "wake no longer in the inbox; not running the hook for it");
                let _ = self.tx.send(Event::HookDone {
                    owner: job.owner,
                    wake_id: job.wake_id,
                    result: Ok(()),
                });
                return;
            }
            Err(e) => {
                tracing::error!(owner = %job.owner, "cannot read wake for the hook: {e}");
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
        };
        runner.in_flight.insert(job.wake_id.clone());
        if runner.jobs.send((job, run)).is_err() {
            tracing::error!("the hook thread is gone; hooks will not run");
        }
    }
}
