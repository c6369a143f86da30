//! Jobs the CLI runs on the engine, and how `status` shows them.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use kubexm_bom::config::Cluster;

use crate::events::EventSink;
use crate::facts::{GatherStep, HostFacts};
use crate::inventory::{self, Connector};
use crate::plan::{Module, Pipeline, Step, Task};
use crate::run::{self, EngineOptions, Policy};
use crate::ssh::Target;
use crate::state::{Outcome, Span, State, now_ms};
use crate::store::Store;

/// Options for connecting to the cluster's hosts.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub accept_new_host_key: bool,
    pub concurrency: usize,
    /// How long one connection attempt may take, and how many a host gets
    /// (only refused or dropped connections are tried again).
    pub timeout: std::time::Duration,
    pub attempts: u32,
    /// What the run may use of this machine (a request: named credentials
    /// and pinned host keys only).
    pub trust: crate::trust::Trust,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions {
            accept_new_host_key: false,
            concurrency: 20,
            timeout: std::time::Duration::from_secs(15),
            attempts: 3,
            trust: Default::default(),
        }
    }
}

/// The facts of every host that answered, and an error line per host that did not.
pub struct FactsReport {
    pub job: i64,
    pub facts: Vec<HostFacts>,
    pub errors: Vec<String>,
}

/// The facts pipeline: one gathering step per host.
pub fn facts_pipeline(hosts: Vec<String>, out: Arc<Mutex<BTreeMap<String, HostFacts>>>) -> Pipeline {
    one_task("facts", hosts, vec![Arc::new(GatherStep { out })])
}

/// What an executed job did.
pub struct Execution {
    pub job: i64,
    pub report: run::Report,
    /// One line per host that could not be reached; those hosts ran nothing.
    pub connect_errors: Vec<String>,
}

impl Execution {
    /// Every host reached and every step done.
    pub fn ok(&self) -> bool {
        self.connect_errors.is_empty() && self.report.ok()
    }

    /// One line per host that failed: connection errors, failed steps, then
    /// per host the steps not done and why.
    pub fn errors(&self) -> Vec<String> {
        let mut out = self.connect_errors.clone();
        if let Some(e) = &self.report.state_error {
            out.push(format!(
                "the state database: {e}; the run stopped, since a re-run resumes from what it records. Check the disk and the file, then re-run"
            ));
        }
        out.extend(self.report.failures().iter().map(|f| format!("{}: {}: {}", f.host, f.id, f.log)));
        let mut not_done: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for r in self.report.results.iter().filter(|r| r.outcome == Outcome::NotRun) {
            *not_done.entry((r.host.as_str(), r.log.as_str())).or_default() += 1;
        }
        out.extend(not_done.into_iter().map(|((host, why), n)| format!("{host}: {n} step(s) {why}")));
        out
    }
}

/// A pipeline of one module with one task: `steps` in order on every host.
pub fn one_task(name: &str, hosts: Vec<String>, steps: Vec<Arc<dyn Step>>) -> Pipeline {
    Pipeline {
        name: name.into(),
        modules: vec![Module {
            name: name.into(),
            tasks: vec![Task {
                name: name.into(),
                hosts,
                steps,
                after: vec![],
            }],
        }],
    }
}

/// A job's outcome as JSON: counts, failures and connection errors.
pub fn summary(ex: &Execution) -> serde_json::Value {
    let failed: Vec<_> = ex
        .report
        .failures()
        .iter()
        .map(|f| serde_json::json!({"id": f.id, "host": f.host, "log": f.log}))
        .collect();
    serde_json::json!({
        "job": ex.job,
        "applied": ex.report.count(Outcome::Applied),
        "skipped": ex.report.count(Outcome::Skipped),
        "notRun": ex.report.count(Outcome::NotRun),
        "failed": failed,
        "connectErrors": ex.connect_errors,
    })
}

/// The hosts a job may touch: the cluster's name and its SSH targets (a
/// host the caller knows to be unreachable already left out).
#[derive(Clone, Copy)]
pub struct Hosts<'a> {
    pub cluster: &'a str,
    pub targets: &'a [Target],
}

/// A job to run: its kind, and what ran before it (its preamble's spans,
/// recorded with it; the connect is added).
pub struct JobSpec<'a> {
    pub kind: &'a str,
    pub preamble: Vec<Span>,
}

/// Connects to `hosts`, builds the pipeline for the hosts that answered,
/// and runs it as a recorded job. Under fail-fast a host that cannot be
/// reached stops the job before anything runs.
pub async fn execute(
    hosts: Hosts<'_>,
    state: Arc<dyn Store>,
    spec: JobSpec<'_>,
    connector: &dyn Connector,
    engine: &EngineOptions,
    stop: Arc<AtomicBool>,
    pipeline: impl FnOnce(Vec<String>) -> anyhow::Result<Pipeline>,
) -> anyhow::Result<Execution> {
    let job = state.begin_job(hosts.cluster, spec.kind).await?;
    let mut preamble = spec.preamble;
    let connect_started = now_ms();
    let connecting = connector.connect(hosts.targets, state.clone());
    // A cancel (or Ctrl-C) ends the connect phase within a fraction of a
    // second, however many hosts never answer.
    let watch = async {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    let (transports, failures) = tokio::select! {
        r = connecting => r,
        () = watch => {
            state.finish_job(job, "failed").await?;
            anyhow::bail!("stopped while connecting to the hosts: nothing ran; run again to resume");
        }
    };
    preamble.push(Span::since("connect", connect_started));
    state.record_spans(job, &preamble).await?;
    let connect_errors: Vec<String> = failures.iter().map(|e| e.to_string()).collect();
    if !connect_errors.is_empty() && engine.policy == Policy::FailFast {
        state.finish_job(job, "failed").await?;
        return Ok(Execution {
            job,
            report: run::Report::default(),
            connect_errors,
        });
    }
    let reached: Vec<String> = hosts
        .targets
        .iter()
        .map(|t| t.name.clone())
        .filter(|n| transports.contains_key(n))
        .collect();
    let plan = pipeline(reached)?.plan()?;
    let report = run::run(&plan, &transports, state.as_ref(), hosts.cluster, job, engine, stop).await;
    if !connect_errors.is_empty() {
        state.finish_job(job, "failed").await?;
    }
    Ok(Execution {
        job,
        report,
        connect_errors,
    })
}

/// Runs `steps` in order on every host of `cluster` as one job, on a runtime
/// of its own, accepting new host keys: for test and bench drivers.
pub fn run_steps_blocking(
    cluster: &Cluster,
    state: Arc<dyn Store>,
    kind: &str,
    steps: Vec<Arc<dyn Step>>,
    concurrency: usize,
    policy: Policy,
) -> anyhow::Result<Execution> {
    let connect = ConnectOptions {
        accept_new_host_key: true,
        concurrency,
        ..Default::default()
    };
    let opts = EngineOptions {
        concurrency,
        policy,
        ..Default::default()
    };
    let (targets, _) = inventory::targets(cluster, &connect.trust)?;
    let hosts = Hosts {
        cluster: &cluster.metadata.name,
        targets: &targets,
    };
    let rt = tokio::runtime::Runtime::new()?;
    let spec = JobSpec { kind, preamble: vec![] };
    rt.block_on(execute(
        hosts,
        state,
        spec,
        &inventory::Ssh(connect),
        &opts,
        Arc::new(AtomicBool::new(false)),
        |hosts| Ok(one_task(kind, hosts, steps)),
    ))
}

/// Connects to every host and gathers its facts, as a recorded job.
pub async fn facts(
    hosts: Hosts<'_>,
    state: Arc<dyn Store>,
    connector: &dyn Connector,
    concurrency: usize,
    events: Option<Arc<dyn EventSink>>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<FactsReport> {
    let out = Arc::new(Mutex::new(BTreeMap::new()));
    let eo = EngineOptions {
        concurrency,
        policy: Policy::ContinueOtherHosts,
        events,
        ..Default::default()
    };
    let sink = out.clone();
    let spec = JobSpec {
        kind: "facts",
        preamble: vec![],
    };
    let ex = execute(hosts, state, spec, connector, &eo, stop, |reached| {
        Ok(facts_pipeline(reached, sink))
    })
    .await?;
    let facts = out.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
    Ok(FactsReport {
        job: ex.job,
        facts,
        errors: ex.errors(),
    })
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
