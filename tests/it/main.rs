//! The integration suite: real binaries against temp homes. Helpers live in `helpers`; each
//! module covers one area and names its tests after the behaviour they guard.

mod helpers;

mod foundation;
mod http;
mod layouts;
mod recovery;
mod refusals;
mod signal_cli;
