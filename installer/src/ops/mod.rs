//! Operations: one per command, shared by every trigger (the CLI today;
//! API workers and day-2 commands later). Each takes typed options and
//! returns a report; none prints. Progress goes out as the engine's events,
//! to the sink the caller gives (the CLI's printer).

pub mod install;
pub mod packages;
pub mod reset;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kubexm_cli::{Class, classified};

use crate::engine::events::EventSink;
use crate::engine::state::State;
use crate::engine::{jobs, run};

/// How an operation runs its engine job.
#[derive(Clone)]
pub struct EngineSettings {
    /// The state database.
    pub state: PathBuf,
    /// Accept a host key that differs from the one pinned at first contact.
    pub accept_new_host_key: bool,
    /// Hosts worked on at once.
    pub concurrency: usize,
    /// Where the job's events go (the CLI's progress printer).
    pub events: Option<Arc<dyn EventSink>>,
}

impl EngineSettings {
    /// How hosts are connected to.
    pub fn connect(&self) -> jobs::ConnectOptions {
        jobs::ConnectOptions {
            accept_new_host_key: self.accept_new_host_key,
            concurrency: self.concurrency,
        }
    }

    /// How the engine runs a job under `policy`.
    pub fn options(&self, policy: run::Policy) -> run::EngineOptions {
        run::EngineOptions {
            concurrency: self.concurrency,
            policy,
            events: self.events.clone(),
            ..Default::default()
        }
    }
}

impl std::fmt::Debug for EngineSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineSettings")
            .field("state", &self.state)
            .field("accept_new_host_key", &self.accept_new_host_key)
            .field("concurrency", &self.concurrency)
            .field("events", &self.events.is_some())
            .finish()
    }
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
