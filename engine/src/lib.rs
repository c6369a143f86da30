//! kubexm-engine: runs plans of idempotent steps on hosts. A
//! [`transport::Transport`] per host (SSH for real, a recording fake in unit
//! tests), plans assembled into one DAG ([`plan`]), a scheduler that runs
//! them in parallel and resumes ([`run`]), its jobs and results behind the
//! async [`store::Store`] (SQLite now: [`state`]), host facts ([`facts`]) gathered concurrently, each job's [`timeline`]
//! (drawn as SVG), and the generic
//! steps every trigger builds on ([`steps`], [`files`]).
//!
//! It knows no phase and no installer: the installer, and every later
//! trigger (API workers, day-2 operations), assemble pipelines from their
//! own phases and hand them to this crate.

pub mod events;
pub mod facts;
pub mod fake;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod files;
pub mod inventory;
pub mod jobs;
pub mod journal;
pub mod output;
pub mod plan;
pub mod run;
pub mod ssh;
pub mod state;
pub mod steps;
pub mod store;
pub mod timeline;
pub mod transport;
pub mod trust;
