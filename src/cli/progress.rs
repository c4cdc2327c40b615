//! Terminal progress for the daemon's startup drain, and the stderr writer that keeps log lines
//! from tearing the bar. Only used when stderr is a terminal; logs and files never see a bar.

use std::io::{self, Write};
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

use crate::daemon::DrainProgress;

/// The bar being drawn, if any; log lines are written "around" it.
static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// A [`DrainProgress`] that draws an indicatif bar on stderr.
pub struct DrainBar;

impl DrainProgress for DrainBar {
    fn start(&mut self, total: usize) {
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "draining backlog {bar:30} {pos}/{len} files ({per_sec}, eta {eta})",
            )
            .expect("a valid template"),
        );
        *ACTIVE.lock().expect("progress lock") = Some(bar);
    }

    fn advance(&mut self, done: usize) {
        if let Some(bar) = ACTIVE.lock().expect("progress lock").as_ref() {
            bar.set_position(done as u64);
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = ACTIVE.lock().expect("progress lock").take() {
            bar.finish_and_clear();
        }
    }
}

/// Stderr for the log layer: while a bar is drawn, each write first lifts the bar so the log
/// line lands above it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let guard = ACTIVE.lock().expect("progress lock");
        match guard.as_ref() {
            Some(bar) => bar
                .suspend(|| io::stderr().write_all(buf))
                .map(|()| buf.len()),
            None => io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
