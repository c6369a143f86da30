//! Operations: one per command, shared by every trigger (the CLI today;
//! API workers and day-2 commands later). Each takes typed options and
//! returns a report; none prints. Progress goes through the engine's
//! progress lines on stderr.

pub mod install;
pub mod packages;
pub mod reset;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kubexm_cli::{Class, classified};

use crate::engine::state::State;

/// How an operation runs its engine job.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// The state database.
    pub state: PathBuf,
    /// Accept a host key that differs from the one pinned at first contact.
    pub accept_new_host_key: bool,
    /// Hosts worked on at once.
    pub concurrency: usize,
}

/// The state database, a Ctrl-C flag and a runtime for an engine job.
pub fn engine_context(
    cluster: &kubexm_bom::config::Cluster,
    engine: &EngineSettings,
) -> anyhow::Result<(Arc<State>, Arc<AtomicBool>, tokio::runtime::Runtime)> {
    let (_, secrets) = crate::engine::inventory::targets(cluster).map_err(|e| classified(Class::Config, e))?;
    let state = Arc::new(crate::engine::state::State::open(&engine.state, secrets)?);
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Runtime::new()?;
    let stopper = stop.clone();
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stopper.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    Ok((state, stop, rt))
}
