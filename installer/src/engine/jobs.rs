//! Jobs the CLI runs on the engine, and how `status` shows them.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use kubexm_bom::config::Cluster;

use super::facts::{GatherStep, HostFacts};
use super::inventory;
use super::plan::{Module, Pipeline, Task};
use super::run::{self, EngineOptions, Policy};
use super::state::State;

/// Options for connecting to the cluster's hosts.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub accept_new_host_key: bool,
    pub concurrency: usize,
}

/// The facts of every host that answered, and an error line per host that did not.
pub struct FactsReport {
    pub job: i64,
    pub facts: Vec<HostFacts>,
    pub errors: Vec<String>,
}

/// The facts pipeline: one gathering step per host.
pub fn facts_pipeline(hosts: Vec<String>, out: Arc<Mutex<BTreeMap<String, HostFacts>>>) -> Pipeline {
    Pipeline {
        name: "facts".into(),
        modules: vec![Module {
            name: "facts".into(),
            tasks: vec![Task {
                name: "gather".into(),
                hosts,
                steps: vec![Arc::new(GatherStep { out })],
                after: vec![],
            }],
        }],
    }
}

/// Connects to every host and gathers its facts, as a recorded job.
pub async fn facts(cluster: &Cluster, state: Arc<State>, opts: &ConnectOptions, stop: Arc<AtomicBool>) -> anyhow::Result<FactsReport> {
    let (targets, _) = inventory::targets(cluster)?;
    let job = state.begin_job(&cluster.metadata.name, "facts")?;
    let (transports, failures) = inventory::connect_all(&targets, state.clone(), opts.accept_new_host_key, opts.concurrency).await;
    let mut errors: Vec<String> = failures.iter().map(|e| e.to_string()).collect();
    let out = Arc::new(Mutex::new(BTreeMap::new()));
    let hosts: Vec<String> = targets
        .iter()
        .map(|t| t.name.clone())
        .filter(|n| transports.contains_key(n))
        .collect();
    let plan = facts_pipeline(hosts, out.clone()).plan()?;
    let eo = EngineOptions {
        concurrency: opts.concurrency,
        policy: Policy::ContinueOtherHosts,
        ..Default::default()
    };
    let report = run::run(&plan, &transports, &state, &cluster.metadata.name, job, &eo, stop).await;
    errors.extend(report.failures().iter().map(|f| format!("{}: {}", f.host, f.log)));
    if !failures.is_empty() {
        let _ = state.finish_job(job, "failed");
    }
    let facts = out.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
    Ok(FactsReport { job, facts, errors })
}

/// A person's view of a job: per module and host, with the failed steps' log tails.
pub fn describe(state: &State, job: Option<i64>) -> anyhow::Result<String> {
    let Some(j) = state.job(job)? else {
        return Ok(match job {
            Some(id) => format!("no job {id} in the state database\n"),
            None => "no jobs yet\n".into(),
        });
    };
    let steps = state.steps(j.id)?;
    let mut out = String::new();
    let _ = writeln!(out, "job {} ({} of cluster {}): {}", j.id, j.kind, j.cluster, j.status);
    let mut per: BTreeMap<(String, String), HashMap<String, usize>> = BTreeMap::new();
    for s in &steps {
        *per.entry((s.module.clone(), s.host.clone()))
            .or_default()
            .entry(s.status.clone())
            .or_default() += 1;
    }
    for ((module, host), counts) in &per {
        let mut c: Vec<_> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
        c.sort();
        let _ = writeln!(out, "  {module:<16} {host:<16} {}", c.join(", "));
    }
    for s in steps.iter().filter(|s| s.status == "failed") {
        let tail: Vec<&str> = s.log.lines().rev().take(10).collect::<Vec<_>>().into_iter().rev().collect();
        let _ = writeln!(out, "FAILED {} on {}:\n    {}", s.node, s.host, tail.join("\n    "));
    }
    Ok(out)
}
