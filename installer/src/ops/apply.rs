//! `kubexm-install apply -f cluster.yaml --bundle k.tar.zst`: change an
//! installed cluster to what its config now says, running only what the
//! difference needs. The config is checked against the record of the
//! cluster's last successful job first ([`kubexm_bom::changes`]): what can
//! never change is refused (exit 3), what apply does not do yet is refused
//! as not supported yet (exit 8), both before any host is touched. What is
//! left (today: hosts added as workers) runs as an `apply` job of the
//! install's pipeline: the steps earlier installs and applies did are
//! skipped, so the old hosts apply nothing (the first control-plane node
//! makes fresh join credentials when the last ones are too old), and a
//! re-run applies nothing. The record is kept after, as after an install.

use crate::ops::error::{OpError, op};

use super::install::{self, InstallOptions, InstallReport, Installed};
use super::session::Session;

/// What apply is asked to do.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Print the change and the plan; touch no host.
    pub dry_run: bool,
}

/// What apply did, or would do.
#[derive(Debug)]
pub enum ApplyReport {
    /// `dry_run`: the change and the plan.
    Plan { added: Vec<String>, plan: String },
    /// The change made.
    Applied { added: Vec<String>, installed: Installed },
}

impl std::fmt::Display for ApplyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ApplyReport::Plan { added, .. } | ApplyReport::Applied { added, .. }) = self;
        if added.is_empty() {
            writeln!(f, "apply: the config is as recorded; only what is not in place yet runs")?;
        } else {
            writeln!(f, "apply: adds worker(s) {}", added.join(", "))?;
        }
        match self {
            ApplyReport::Plan { plan, .. } => write!(f, "{plan}"),
            ApplyReport::Applied { installed, .. } => write!(f, "{installed}"),
        }
    }
}

/// Applies the session's config to its installed cluster.
pub fn apply(session: &Session, o: &ApplyOptions) -> anyhow::Result<ApplyReport> {
    let cluster = session.cluster();
    let name = &cluster.metadata.name;
    let state = &session.settings().engine.state;
    let record = session.last_record(true)?.ok_or_else(|| {
        op(
            OpError::Usage,
            anyhow::anyhow!(
                "the state database {} records no successful install of cluster {name}: install it first \
                 (kubexm-install --bundle ... -f ...), or pass the --state it was installed with",
                state.display()
            ),
        )
    })?;
    if !matches!(record.job.kind.as_str(), "install" | "apply") {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "cluster {name}'s last successful job was a {} (job {}): there is no installed cluster to apply to; install it",
                record.job.kind,
                record.job.id
            ),
        ));
    }
    let located = session.located();
    let changes = kubexm_bom::changes::changes(&record, cluster, located.as_ref(), session.config_name())
        .map_err(kubexm_bom::config::LoadError::Invalid)?;
    let opts = InstallOptions {
        dry_run: o.dry_run,
        apply: true,
        ..Default::default()
    };
    let added = changes.added;
    match install::install(session, &opts)? {
        InstallReport::Plan(plan) => Ok(ApplyReport::Plan { added, plan }),
        InstallReport::Installed(installed) => Ok(ApplyReport::Applied { added, installed }),
    }
}
