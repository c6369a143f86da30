//! The engine: runs a plan's ready nodes in parallel, at most `concurrency`
//! hosts at once and one step at a time per host, and records every result.
//!
//! The shape follows cargo's dependency queue: an in-degree per node, a ready
//! set, results fed back as they arrive. Each node checks first and applies
//! only when its check does not hold (or, for a step that cannot check,
//! when no earlier run of this cluster completed it), so a re-run after a
//! crash or a failure resumes where it stopped. Transient transport failures
//! are retried with backoff. Fail-fast stops starting new nodes after the
//! first failure; continue-other-hosts only stops what depends on it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use petgraph::Direction;
use petgraph::graph::NodeIndex;
use tokio::task::JoinSet;

use super::plan::{Check, Plan, StepError};
use super::progress::{Progress, ProgressMode};
use super::state::{Outcome, Record, State};
use super::transport::Transport;

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    FailFast,
    ContinueOtherHosts,
}

#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Hosts worked on at once.
    pub concurrency: usize,
    pub policy: Policy,
    /// Attempts for a step whose transport failed transiently.
    pub attempts: u32,
    pub progress: ProgressMode,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            concurrency: 20,
            policy: Policy::FailFast,
            attempts: 3,
            progress: ProgressMode::Off,
        }
    }
}

/// One node's result.
#[derive(Debug, Clone)]
pub struct NodeResult {
    pub id: String,
    pub host: String,
    pub outcome: Outcome,
    pub log: String,
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub results: Vec<NodeResult>,
    pub interrupted: bool,
}

impl Report {
    pub fn count(&self, o: Outcome) -> usize {
        self.results.iter().filter(|r| r.outcome == o).count()
    }

    pub fn failures(&self) -> Vec<&NodeResult> {
        self.results.iter().filter(|r| r.outcome == Outcome::Failed).collect()
    }

    pub fn ok(&self) -> bool {
        !self.interrupted && self.count(Outcome::Failed) == 0 && self.count(Outcome::NotRun) == 0
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs `plan` with a transport per host. `stop` ends the run cleanly (Ctrl-C):
/// nothing new starts, running steps finish and are recorded.
pub async fn run(
    plan: &Plan,
    transports: &HashMap<String, Arc<dyn Transport>>,
    state: &State,
    cluster: &str,
    job: i64,
    opts: &EngineOptions,
    stop: Arc<AtomicBool>,
) -> Report {
    let g = &plan.graph;
    let mut indegree: HashMap<NodeIndex, usize> = g
        .node_indices()
        .map(|n| (n, g.neighbors_directed(n, Direction::Incoming).count()))
        .collect();
    let done_before = state.done_nodes(cluster).unwrap_or_default();
    // Ready nodes wait per host; hosts with ready work and no running step
    // wait in one queue. Every event is O(1), whatever the plan's size.
    let mut pending: HashMap<&str, VecDeque<NodeIndex>> = HashMap::new();
    let mut waiting: VecDeque<&str> = VecDeque::new();
    let mut queued: HashSet<&str> = HashSet::new();
    let mut busy: HashSet<&str> = HashSet::new();
    let mut blocked: HashSet<NodeIndex> = HashSet::new();
    let mut report = Report::default();
    let mut running: JoinSet<(NodeIndex, Outcome, String, i64, i64)> = JoinSet::new();
    let mut failed = false;
    let progress = Progress::new(plan, opts.progress);
    for n in g.node_indices().filter(|n| indegree[n] == 0) {
        let host = g[n].host.as_str();
        pending.entry(host).or_default().push_back(n);
        if queued.insert(host) {
            waiting.push_back(host);
        }
    }
    loop {
        let stopping = stop.load(Ordering::Relaxed) || (failed && opts.policy == Policy::FailFast);
        while !stopping && busy.len() < opts.concurrency.max(1) {
            let Some(host) = waiting.pop_front() else { break };
            queued.remove(host);
            let Some(n) = pending.get_mut(host).and_then(|q| {
                while let Some(n) = q.pop_front() {
                    if !blocked.contains(&n) {
                        return Some(n);
                    }
                }
                None
            }) else {
                continue;
            };
            let node = &g[n];
            let Some(t) = transports.get(&node.host).cloned() else {
                report.results.push(NodeResult {
                    id: node.id.clone(),
                    host: node.host.clone(),
                    outcome: Outcome::Failed,
                    log: format!("no connection to {}", node.host),
                });
                failed = true;
                continue;
            };
            busy.insert(host);
            progress.started(node);
            let step = node.step.clone();
            let done = done_before.contains(&node.id);
            let attempts = opts.attempts.max(1);
            running.spawn(async move {
                let started = now_ms();
                let (outcome, log) = execute(step.as_ref(), t.as_ref(), done, attempts).await;
                (n, outcome, log, started, now_ms() - started)
            });
        }
        let Some(first) = running.join_next().await else { break };
        // Everything else that finished meanwhile is recorded in the same transaction.
        let mut finished = vec![first];
        while let Some(more) = running.try_join_next() {
            finished.push(more);
        }
        let finished: Vec<_> = finished.into_iter().filter_map(Result::ok).collect();
        let records: Vec<Record> = finished
            .iter()
            .map(|(n, outcome, log, started, duration_ms)| {
                let node = &g[*n];
                Record {
                    node: &node.id,
                    module: &node.module,
                    host: &node.host,
                    outcome: *outcome,
                    started: *started,
                    duration_ms: *duration_ms,
                    log,
                }
            })
            .collect();
        let _ = state.record_many(job, &records);
        for (n, outcome, log, _, _) in &finished {
            let (n, outcome) = (*n, *outcome);
            let node = &g[n];
            let host = node.host.as_str();
            busy.remove(host);
            progress.finished(node, outcome);
            report.results.push(NodeResult {
                id: node.id.clone(),
                host: node.host.clone(),
                outcome,
                log: state.redact(log),
            });
            if outcome == Outcome::Failed {
                failed = true;
                // Everything that depends on it cannot run.
                let mut dfs = petgraph::visit::Dfs::new(g, n);
                while let Some(d) = dfs.next(g) {
                    if d != n {
                        blocked.insert(d);
                    }
                }
            } else {
                for next in g.neighbors_directed(n, Direction::Outgoing) {
                    if let Some(d) = indegree.get_mut(&next) {
                        *d -= 1;
                        if *d == 0 {
                            pending.entry(g[next].host.as_str()).or_default().push_back(next);
                        }
                    }
                }
            }
            if pending.get(host).is_some_and(|q| !q.is_empty()) && queued.insert(host) {
                waiting.push_back(host);
            }
        }
        // A host may have work now because of another host's step.
        for (n, _, _, _, _) in &finished {
            for next in g.neighbors_directed(*n, Direction::Outgoing) {
                let h = g[next].host.as_str();
                if !busy.contains(h) && pending.get(h).is_some_and(|q| !q.is_empty()) && queued.insert(h) {
                    waiting.push_back(h);
                }
            }
        }
    }
    report.interrupted = stop.load(Ordering::Relaxed);
    let finished: HashSet<&str> = report.results.iter().map(|r| r.id.as_str()).collect::<HashSet<_>>();
    let missing: Vec<NodeIndex> = g.node_indices().filter(|n| !finished.contains(g[*n].id.as_str())).collect();
    let mut records = Vec::new();
    for n in &missing {
        let node = &g[*n];
        let why = if blocked.contains(n) {
            "an earlier step it depends on failed"
        } else {
            "the run stopped before it"
        };
        progress.finished(node, Outcome::NotRun);
        records.push(Record {
            node: &node.id,
            module: &node.module,
            host: &node.host,
            outcome: Outcome::NotRun,
            started: now_ms(),
            duration_ms: 0,
            log: why,
        });
    }
    let _ = state.record_many(job, &records);
    for r in records {
        report.results.push(NodeResult {
            id: r.node.to_string(),
            host: r.host.to_string(),
            outcome: Outcome::NotRun,
            log: r.log.into(),
        });
    }
    let status = if report.ok() {
        "succeeded"
    } else if report.interrupted {
        "interrupted"
    } else {
        "failed"
    };
    let _ = state.finish_job(job, status);
    progress.end();
    report
}

/// check, then apply if needed; transient transport errors are retried.
async fn execute(step: &dyn super::plan::Step, t: &dyn Transport, done_before: bool, attempts: u32) -> (Outcome, String) {
    let mut last = String::new();
    for attempt in 1..=attempts {
        let result: Result<(Outcome, String), StepError> = async {
            match step.check(t).await? {
                Check::Holds => Ok((Outcome::Skipped, "check holds: already in the desired state".to_string())),
                Check::Unknown if done_before => Ok((Outcome::Skipped, "completed by an earlier run".to_string())),
                Check::Missing | Check::Unknown => Ok((Outcome::Applied, step.apply(t).await?)),
            }
        }
        .await;
        match result {
            Ok((o, log)) => return (o, log),
            Err(StepError::Transport(e)) if e.transient() && attempt < attempts => {
                last = e.to_string();
                tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
            }
            Err(e) => return (Outcome::Failed, e.to_string()),
        }
    }
    (Outcome::Failed, last)
}
