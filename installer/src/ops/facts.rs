//! `kubexm-install facts`: connect to every host of the config and gather
//! its facts (OS, arch, kernel, ports, clock, leftovers) as one engine job,
//! or only the plan (`dry_run`, `graph`), touching no host.

use std::path::{Path, PathBuf};

use super::session::Session;
use crate::engine::facts::HostFacts;

#[derive(Debug, Clone, Default)]
pub struct FactsOptions {
    /// Return the plan only; touch no host.
    pub dry_run: bool,
    /// Write the plan's DAG as Graphviz DOT here.
    pub graph: Option<PathBuf>,
}

/// What `facts` found, or its plan.
#[derive(Debug)]
pub enum FactsReport {
    Plan(String),
    Gathered {
        job: i64,
        facts: Vec<HostFacts>,
        /// One line per host that could not be asked.
        errors: Vec<String>,
    },
}

/// Gathers the facts of the session's reachable hosts, or plans it.
pub fn facts(session: &Session, o: &FactsOptions) -> anyhow::Result<FactsReport> {
    if o.dry_run || o.graph.is_some() {
        let hosts = session.hosts();
        let plan = crate::engine::jobs::facts_pipeline(hosts, Default::default()).plan()?;
        if let Some(g) = &o.graph {
            write_whole(g, plan.to_dot().as_bytes())?;
        }
        if o.dry_run {
            return Ok(FactsReport::Plan(plan.describe()));
        }
    }
    let r = session.facts()?;
    Ok(FactsReport::Gathered {
        job: r.job,
        facts: r.facts,
        errors: r.errors,
    })
}

/// Writes `path` whole or not at all (a temporary file renamed over it).
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("dot.tmp");
    fs_err::write(&tmp, bytes)?;
    fs_err::rename(&tmp, path)
}
