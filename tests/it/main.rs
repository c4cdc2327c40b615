//! The integration suite: real binaries against temp homes. Helpers live in `helpers`; each
//! module covers one area and names its tests after the behaviour they guard.

mod helpers;

mod adapters;
mod agent_loop;
mod agent_loop_gemini;
mod agent_loop_opencode;
mod agent_scenario;
mod architecture;
#[cfg(feature = "failpoints")]
mod crash_points;
mod devices;
mod doc_paths;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
pub(crate) mod etcd_cluster;
#[cfg(feature = "etcd")]
mod etcd_nemesis;
#[cfg(feature = "etcd")]
mod etcd_security;
mod events;
#[cfg(feature = "failpoints")]
mod faults;
mod flood;
mod foundation;
mod fuzz;
mod harness;
mod harness_smoke;
mod help_text;
mod hostile;
pub(crate) mod http;
mod http_transport;
mod import;
mod invariants;
mod journal;
mod kill_loop;
mod layouts;
mod links;
mod man_pages;
mod mcp;
pub(crate) mod mcp_raw;
mod model_server;
mod operator_view;
mod ops;
mod perf;
mod policy;
mod recovery;
mod refusals;
mod security;
mod sender_text;
mod setup;
mod signal_cli;
mod silence;
mod snapshots;
mod spec;
mod sshd;
mod state_machine;
mod store_seam;
mod trash;
mod ui;
mod waiters;
