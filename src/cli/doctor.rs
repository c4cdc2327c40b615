//! `waitpoint doctor`: the read-only checks of `crate::doctor` run on the home as it is, one
//! line each.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;

use crate::doctor;
use crate::error::{Error, exit};
use crate::home::Home;

#[derive(Debug, Args)]
pub struct DoctorArgs {}

/// `waitpoint doctor`: one line per check; exit 1 when any check fails.
pub fn run(home: &Home, store: Option<&str>, _a: DoctorArgs) -> anyhow::Result<u8> {
    let mut settings = super::load_settings(home);
    if let (Some(url), Ok(s)) = (store, settings.as_mut()) {
        s.store = crate::settings::location::Location::parse(url)
            .map_err(|e| Error::Usage(format!("--store: {e}")))?;
    }
    let store = settings.as_ref().ok().and_then(|s| {
        crate::store::open_shared(
            &s.store,
            s.host.as_deref(),
            home,
            crate::store::Role::Command,
        )
        .transpose()
        .map(|opened| opened.map(|st| st.cluster().map(|c| c.health()).unwrap_or_default()))
    });
    let checks = doctor::run(&doctor::Inputs {
        home,
        settings: &settings,
        inotify_dir: PathBuf::from("/proc/sys/fs/inotify"),
        inotify_instance: doctor::probe_inotify(home),
        store,
        path: std::env::var_os("PATH"),
    });
    let mut out = io::stdout().lock();
    for check in &checks {
        // A check may name a file of the home, and a name may hold anything.
        writeln!(
            out,
            "{}",
            crate::operator_view::visible_text(&check.to_string())
        )?;
    }
    Ok(if doctor::worst(&checks) == crate::store::Level::Fail {
        exit::FAILURE
    } else {
        exit::OK
    })
}
