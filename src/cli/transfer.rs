//! `waitpoint export` and `waitpoint import`: waitpoints copied between the store and an
//! ordinary home, one way or the other.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use crate::clock::SystemClock;
use crate::error::{Error, exit};
use crate::home::Home;

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The directory to write the home layout into (new, or without waitpoints)
    // Not `DIR`: that is the global --home's value, and clap's usage line can show both.
    #[arg(value_name = "TARGET_DIR")]
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The home whose waitpoints to copy into the store (--store, or the settings' `store`)
    #[arg(value_name = "HOME")]
    pub from: PathBuf,
}

/// `waitpoint export TARGET_DIR`: every waitpoint of the store, with its records, written as an
/// ordinary home, all read at one revision.
pub fn export(
    engine: &crate::engine::Engine,
    a: ExportArgs,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
    let to = Home::new(a.dir);
    if to
        .waitpoints_dir()
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        return Err(Error::Usage(format!(
            "{} holds waitpoints already; export into a new directory",
            to.waitpoints_dir().display()
        ))
        .into());
    }
    to.ensure()?;
    let files = crate::store::Files::new(to.clone(), Arc::new(SystemClock), Default::default());
    let copied = crate::store::copy_all(engine.store(), &files)?;
    crate::store::Store::rebuild_index(&files)?;
    let at = copied
        .revision
        .map(|r| format!(" at revision {r}"))
        .unwrap_or_default();
    writeln!(
        out,
        "exported {} waitpoints ({} signal records) and {} timers{at} to {}",
        copied.waitpoints,
        copied.records,
        copied.timers,
        to.root().display()
    )?;
    Ok(exit::OK)
}

/// `waitpoint import HOME`: a single machine's waitpoints, with their records, and its timers
/// copied into the store; ids the store has already are left alone and listed. The source is
/// only read ([`crate::store::import`]); what cannot be imported is listed with its reason and
/// makes the exit status 1.
pub fn import(
    engine: &crate::engine::Engine,
    a: ImportArgs,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
    let from = Home::new(a.from);
    if !from.waitpoints_dir().is_dir() {
        return Err(Error::Usage(format!(
            "{} has no waitpoints directory; is it a waitpoint home?",
            from.root().display()
        ))
        .into());
    }
    let (copied, refused) = crate::store::import::import_home(from.root_dir(), engine.store())?;
    for id in &copied.skipped {
        writeln!(out, "skipped {id}: the store has it already")?;
    }
    for r in &refused {
        writeln!(
            out,
            "refused {}: {}",
            crate::operator_view::visible(&r.what),
            crate::operator_view::visible(&r.reason)
        )?;
    }
    writeln!(
        out,
        "imported {} waitpoints ({} signal records) and {} timers from {}; {} skipped, {} refused",
        copied.waitpoints,
        copied.records,
        copied.timers,
        from.root().display(),
        copied.skipped.len(),
        refused.len()
    )?;
    Ok(if refused.is_empty() {
        exit::OK
    } else {
        exit::FAILURE
    })
}
