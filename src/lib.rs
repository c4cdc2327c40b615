//! `waitpoint`: a filesystem-first spool engine for waitpoints, durable "wake me when this
//! finishes" objects.
//!
//! The pipeline, in module order: [`ingress`] (drop zone, device mirrors over SSH, the loopback
//! HTTP shim) turns outside input into signal requests (the [`request`] vocabulary both sides
//! share); the [`engine`] validates, authenticates and applies them through the [`store`] seam
//! (the home's files, or an etcd cluster); the [`journal`] makes each batch of signals durable
//! with one fsync and [`durable`] commits every file atomically; [`delivery`] puts wakes in
//! session inboxes. The [`daemon`] runs that pipeline in one loop. The binaries are thin:
//! [`cli`] holds every clap type and turns arguments into validated requests. See
//! `ARCHITECTURE.md`.

// No unsafe code but in `ingress::device::sftp_long`, the one place that calls a C library
// (libssh2) for what its Rust binding leaves out; every system call goes through rustix or std.
#![deny(unsafe_code)]

pub mod agent_view;
pub mod cli;
pub mod clock;
pub mod daemon;
pub mod delivery;
pub mod doctor;
pub mod durable;
pub mod engine;
pub mod error;
pub mod escape;
pub mod failpoint;
pub mod harness;
pub mod home;
pub mod howto;
pub mod inbox;
pub mod ingress;
pub mod journal;
pub mod mcp;
pub mod names;
pub mod operator_view;
pub mod process;
pub mod records;
pub mod request;
pub mod secret;
pub mod sender;
pub mod settings;
pub mod setup;
pub mod store;
pub mod sync;
