//! The deployment engine: a [`transport::Transport`] per host (SSH for real,
//! a recording fake in unit tests), plans of idempotent steps assembled into
//! one DAG ([`plan`]), a scheduler that runs them in parallel and resumes
//! ([`run`]), an SQLite state database ([`state`]), and host facts
//! ([`facts`]) gathered concurrently.

pub mod facts;
pub mod fake;
pub mod inventory;
pub mod jobs;
pub mod plan;
pub mod progress;
pub mod run;
pub mod ssh;
pub mod state;
pub mod steps;
pub mod transport;
