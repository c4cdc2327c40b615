//! The integration suite: real binaries against temp homes. Helpers live in `helpers`; each
//! module covers one area and names its tests after the behaviour they guard.

mod helpers;

mod devices;
mod foundation;
mod layouts;
mod man_pages;
mod ops;
mod perf;
mod policy;
mod recovery;
mod refusals;
mod signal_cli;
mod snapshots;
mod sshd;
