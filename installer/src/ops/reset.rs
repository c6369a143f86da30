//! `reset`: stop and remove what kubexm installed on every host.

use crate::ops::error::{OpError, op};

use super::session::Session;
use crate::engine::run;

/// What `reset` did.
#[derive(Debug)]
pub enum ResetReport {
    /// Without `yes`: the plan, and why nothing was touched.
    NotConfirmed {
        plan: String,
        refusal: String,
    },
    Done(Reset),
}

/// A reset that succeeded.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reset {
    pub cluster: String,
    pub job: i64,
    /// The hosts reset.
    pub hosts: Vec<String>,
    /// Where the time went ([`crate::engine::timeline::Timeline::summary`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timing: String,
}

impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "reset cluster {} on {} hosts (job {})", self.cluster, self.hosts.len(), self.job)?;
        if !self.timing.is_empty() {
            write!(f, "\n{}", self.timing.trim_end())?;
        }
        Ok(())
    }
}

/// Resets the session's cluster on its reachable hosts (with `yes`), or
/// returns the plan. Only a reset of every host is the cluster's reset (its
/// step state forgotten, its kubeconfig under the settings' root removed);
/// one with hosts named unreachable is recorded as `reset-hosts` and keeps
/// both.
pub fn reset(session: &Session, yes: bool) -> anyhow::Result<ResetReport> {
    let cluster = session.cluster();
    let hosts = session.hosts();
    let pipeline = crate::pipelines::reset::pipeline(cluster, &hosts)?;
    if !yes {
        return Ok(ResetReport::NotConfirmed {
            plan: pipeline.plan()?.describe(),
            refusal: format!(
                "reset deletes cluster {} on {} host(s), etcd data included; nothing was touched. Pass --yes to do it",
                cluster.metadata.name,
                hosts.len()
            ),
        });
    }
    // A reset that leaves hosts out is not the cluster's reset: the step
    // state of the hosts it did not touch, and the kubeconfig, stay.
    let whole = session.unreachable_hosts().is_empty();
    let kind = if whole { "reset" } else { "reset-hosts" };
    let ex = session.execute(kind, run::Policy::ContinueOtherHosts, |_| Ok(pipeline))?;
    let kept = session.keep_record(ex.job, None, &Default::default());
    if !ex.ok() {
        if let Err(e) = &kept {
            tracing::warn!("{e:#}");
        }
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
    kept?;
    let kubeconfig = super::install::kubeconfig_path(session.settings(), cluster);
    if whole && kubeconfig.exists() {
        fs_err::remove_file(&kubeconfig)?;
    }
    Ok(ResetReport::Done(Reset {
        cluster: cluster.metadata.name.clone(),
        job: ex.job,
        hosts,
        timing: session.timing(ex.job),
    }))
}
