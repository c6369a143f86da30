//! `reset`: stop and remove what kubexm installed on every host.

use std::path::Path;

use crate::ops::error::{OpError, op};

use super::{EngineSettings, engine_context};
use crate::engine::{jobs, run};

/// What `reset` did.
#[derive(Debug)]
pub enum ResetReport {
    /// Without `--yes`: the plan, and why nothing was touched.
    NotConfirmed { plan: String, refusal: String },
    /// The line saying what was reset.
    Done(String),
}

/// Resets the cluster of `file` on its hosts (with `yes`), or returns the plan.
pub fn reset(file: &Path, yes: bool, root: &Path, engine: &EngineSettings) -> anyhow::Result<ResetReport> {
    let cluster = kubexm_bom::config::load_file_hosts(file)?;
    let pipeline = crate::pipelines::reset::pipeline(&cluster)?;
    if !yes {
        return Ok(ResetReport::NotConfirmed {
            plan: pipeline.plan()?.describe(),
            refusal: format!(
                "reset deletes cluster {} on {} host(s), etcd data included; nothing was touched. Pass --yes to do it",
                cluster.metadata.name,
                cluster.spec.hosts.len()
            ),
        });
    }
    let (state, stop, rt) = engine_context(&cluster, engine)?;
    let connect = engine.connect();
    let eo = engine.options(run::Policy::ContinueOtherHosts);
    let ex = rt.block_on(jobs::execute(&cluster, state, "reset", &connect, &eo, stop, |_| Ok(pipeline)))?;
    if !ex.ok() {
        let errors = ex.errors();
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "reset failed on {} host(s) (job {}); run it again:\n  {}",
                errors.len(),
                ex.job,
                errors.join("\n  ")
            ),
        ));
    }
    let kubeconfig = root.join(format!("{}.kubeconfig", cluster.metadata.name));
    if kubeconfig.exists() {
        fs_err::remove_file(&kubeconfig)?;
    }
    Ok(ResetReport::Done(format!(
        "reset cluster {} on {} hosts (job {})",
        cluster.metadata.name,
        cluster.spec.hosts.len(),
        ex.job
    )))
}
