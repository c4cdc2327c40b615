//! The operations on paths outside every home, named so: a harness's own files (its
//! transcript), a user's file named on the command line, a test's temp directory. Each path is
//! used as given, links followed as the kernel does; a path under a home never comes here (it
//! goes through the home's [`Root`](super::Root), which reaches it without following a link).

use std::path::Path;

use super::beneath::Place;
use crate::error::Result;

/// [`Root::read_tail`](super::Root::read_tail) of `path`, a file outside every home, as given.
pub fn read_tail(path: &Path, cap: u64) -> Result<Option<(Vec<u8>, bool)>> {
    super::read::read_tail_in(Place::Outside, path, cap)
}
