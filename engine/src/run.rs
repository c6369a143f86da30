//! The engine: runs a plan's ready nodes in parallel, at most `concurrency`
//! hosts at once and one step at a time per host, and records every result.
//!
//! The shape follows cargo's dependency queue: an in-degree per node, a ready
//! set, results fed back as they arrive. Each node checks first and applies
//! only when its check does not hold (or, for a step that cannot check,
//! when no earlier run of this cluster completed it), so a re-run after a
//! crash or a failure resumes where it stopped. Transient transport failures
//! are retried with backoff. Fail-fast stops starting new nodes after the
//! first failure; continue-other-hosts only stops what depends on it. A host
//! that became unreachable is not a failure of a step: under either policy
//! nothing more runs on it, nor anything that waits on it, and every other
//! host goes on; the report says which steps were not done and why.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use petgraph::Direction;
use petgraph::graph::NodeIndex;
use tokio::task::JoinSet;

use crate::events::{Emitter, Event, EventSink, PhaseSize};
use crate::plan::{Check, Plan, StepError};
use crate::state::{Outcome, Record};
use crate::store::Store;
use crate::transport::{Transport, TransportError};

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    FailFast,
    ContinueOtherHosts,
}

#[derive(Clone)]
pub struct EngineOptions {
    /// Hosts worked on at once.
    pub concurrency: usize,
    pub policy: Policy,
    /// Attempts for a step whose transport failed transiently.
    pub attempts: u32,
    /// Where the run's events go (progress on a terminal, a job database).
    pub events: Option<Arc<dyn EventSink>>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            concurrency: 20,
            policy: Policy::FailFast,
            attempts: 3,
            events: None,
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
    /// A write to the state database failed: the run stopped, since a
    /// resume depends on what it records.
    pub state_error: Option<String>,
}

impl Report {
    pub fn count(&self, o: Outcome) -> usize {
        self.results.iter().filter(|r| r.outcome == o).count()
    }

    pub fn failures(&self) -> Vec<&NodeResult> {
        self.results.iter().filter(|r| r.outcome == Outcome::Failed).collect()
    }

    pub fn ok(&self) -> bool {
        !self.interrupted && self.state_error.is_none() && self.count(Outcome::Failed) == 0 && self.count(Outcome::NotRun) == 0
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
    state: &dyn Store,
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
    let mut report = Report::default();
    let done_before = match state.done_nodes(cluster).await {
        Ok(d) => d,
        Err(e) => {
            report.state_error = Some(format!("reading what earlier runs did: {e}"));
            Default::default()
        }
    };
    // Ready nodes wait per host; hosts with ready work and no running step
    // wait in one queue. Every event is O(1), whatever the plan's size.
    let mut pending: HashMap<&str, VecDeque<NodeIndex>> = HashMap::new();
    let mut waiting: VecDeque<&str> = VecDeque::new();
    let mut queued: HashSet<&str> = HashSet::new();
    let mut busy: HashSet<&str> = HashSet::new();
    let mut blocked: HashSet<NodeIndex> = HashSet::new();
    let mut running: JoinSet<Done> = JoinSet::new();
    // Which node each running task is, to name a step that panicked.
    let mut tasks: HashMap<tokio::task::Id, (NodeIndex, i64)> = HashMap::new();
    // Hosts that became unreachable, and why each blocked node was not run.
    let mut lost: HashSet<&str> = HashSet::new();
    let mut why_blocked: HashMap<NodeIndex, String> = HashMap::new();
    let mut finished_nodes: HashSet<NodeIndex> = HashSet::new();
    let mut failed = false;
    let events = Emitter::new(opts.events.clone(), job);
    events.emit(|| Event::JobStarted { phases: phases(plan) });
    let step_event = |n: NodeIndex, outcome: Option<Outcome>| {
        let node = &g[n];
        let (node_id, module, host) = (node.id.clone(), node.module.clone(), node.host.clone());
        match outcome {
            None => Event::StepStarted {
                node: node_id,
                module,
                host,
            },
            Some(outcome) => Event::StepFinished {
                node: node_id,
                module,
                host,
                outcome,
            },
        }
    };
    for n in g.node_indices().filter(|n| indegree[n] == 0) {
        let host = g[n].host.as_str();
        pending.entry(host).or_default().push_back(n);
        if queued.insert(host) {
            waiting.push_back(host);
        }
    }
    loop {
        let stopping = stop.load(Ordering::Relaxed) || (failed && opts.policy == Policy::FailFast) || report.state_error.is_some();
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
            events.emit(|| step_event(n, None));
            let step = node.step.clone();
            let done = done_before.contains(&node.id);
            let attempts = opts.attempts.max(1);
            let task = running.spawn(async move {
                let started = now_ms();
                let (outcome, log, host_lost) = execute(step.as_ref(), t.as_ref(), done, attempts).await;
                Done {
                    n,
                    outcome,
                    log,
                    host_lost,
                    started,
                    duration_ms: now_ms() - started,
                }
            });
            tasks.insert(task.id(), (n, now_ms()));
        }
        let Some(first) = running.join_next_with_id().await else { break };
        // Everything else that finished meanwhile is recorded in the same transaction.
        let mut finished = vec![first];
        while let Some(more) = running.try_join_next_with_id() {
            finished.push(more);
        }
        // A step that panicked is a failed step, with the panic's message.
        let finished: Vec<_> = finished
            .into_iter()
            .filter_map(|r| match r {
                Ok((id, done)) => {
                    tasks.remove(&id);
                    Some(done)
                }
                Err(e) => {
                    let (n, started) = tasks.remove(&e.id())?;
                    let why = if e.is_panic() {
                        panic_message(e.into_panic())
                    } else {
                        "it was cancelled".into()
                    };
                    Some(Done {
                        n,
                        outcome: Outcome::Failed,
                        log: format!("the step panicked: {why}"),
                        host_lost: false,
                        started,
                        duration_ms: now_ms() - started,
                    })
                }
            })
            .collect();
        let records: Vec<Record> = finished
            .iter()
            .map(|d| {
                let node = &g[d.n];
                Record {
                    node: &node.id,
                    module: &node.module,
                    host: &node.host,
                    outcome: d.outcome,
                    started: d.started,
                    duration_ms: d.duration_ms,
                    log: &d.log,
                }
            })
            .collect();
        if let Err(e) = state.record_many(job, &records).await {
            report.state_error.get_or_insert(format!("recording step results: {e}"));
        }
        for d in &finished {
            let (n, outcome) = (d.n, d.outcome);
            let node = &g[n];
            let host = node.host.as_str();
            busy.remove(host);
            let log = state.redact(&d.log);
            if events.wanted() {
                for line in log.lines() {
                    events.emit(|| Event::LogLine {
                        node: node.id.clone(),
                        host: node.host.clone(),
                        line: line.to_string(),
                    });
                }
            }
            events.emit(|| step_event(n, Some(outcome)));
            report.results.push(NodeResult {
                id: node.id.clone(),
                host: node.host.clone(),
                outcome,
                log,
            });
            finished_nodes.insert(n);
            if outcome == Outcome::Failed {
                let lost_host = d.host_lost;
                let mut roots = vec![n];
                if !lost_host {
                    failed = true;
                } else if lost.insert(host) {
                    // Nothing more can run on the host: its other nodes are blocked too.
                    roots.extend(g.node_indices().filter(|m| g[*m].host == host && !finished_nodes.contains(m)));
                }
                let waits = if lost_host {
                    format!("not done: it waits on {host}, which became unreachable")
                } else {
                    format!("not done: it waits on {} on {host}, which failed", node.id)
                };
                // Everything that depends on them cannot run.
                for root in roots {
                    let mut dfs = petgraph::visit::Dfs::new(g, root);
                    while let Some(d) = dfs.next(g) {
                        if d != n && blocked.insert(d) {
                            let why = if lost_host && g[d].host == host {
                                format!("not done: {host} became unreachable")
                            } else {
                                waits.clone()
                            };
                            why_blocked.insert(d, why);
                        }
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
        for d in &finished {
            for next in g.neighbors_directed(d.n, Direction::Outgoing) {
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
        let why = match why_blocked.get(n) {
            Some(why) => why.as_str(),
            None if blocked.contains(n) => "not done: an earlier step it depends on failed",
            None => "not done: the run stopped before it",
        };
        events.emit(|| step_event(*n, Some(Outcome::NotRun)));
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
    if let Err(e) = state.record_many(job, &records).await {
        report.state_error.get_or_insert(format!("recording the steps not done: {e}"));
    }
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
    if let Err(e) = state.finish_job(job, status).await {
        report.state_error.get_or_insert(format!("recording the job's end: {e}"));
    }
    events.emit(|| Event::JobFinished { status: status.into() });
    report
}

/// The plan's phases (modules, in order of first appearance) and their nodes per host.
fn phases(plan: &Plan) -> Vec<PhaseSize> {
    let mut index: HashMap<&str, (usize, HashMap<&str, usize>)> = HashMap::new();
    let mut out: Vec<PhaseSize> = Vec::new();
    for node in plan.graph.node_weights() {
        let (i, hosts) = index.entry(node.module.as_str()).or_insert_with(|| {
            out.push(PhaseSize {
                module: node.module.clone(),
                nodes_per_host: Vec::new(),
            });
            (out.len() - 1, HashMap::new())
        });
        let list = &mut out[*i].nodes_per_host;
        let at = *hosts.entry(node.host.as_str()).or_insert_with(|| {
            list.push((node.host.clone(), 0));
            list.len() - 1
        });
        list[at].1 += 1;
    }
    out
}

/// The text of a panic's payload.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// A node's run, as the scheduler gets it back.
struct Done {
    n: NodeIndex,
    outcome: Outcome,
    log: String,
    /// It failed because its host became unreachable.
    host_lost: bool,
    started: i64,
    duration_ms: i64,
}

/// check, then apply if needed; transient transport errors are retried.
/// Returns the outcome, the log, and whether the host became unreachable.
async fn execute(step: &dyn crate::plan::Step, t: &dyn Transport, done_before: bool, attempts: u32) -> (Outcome, String, bool) {
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
            Ok((o, log)) => return (o, log, false),
            Err(StepError::Transport(e)) if e.transient() && attempt < attempts => {
                last = e.to_string();
                tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
            }
            Err(StepError::Transport(e)) if e.lost() => return (Outcome::Failed, e.to_string(), true),
            Err(e) => {
                if t.going_away().await {
                    let lost = TransportError::Lost {
                        host: t.host().to_string(),
                        why: format!("it was shutting down; the step had failed with: {e}"),
                    };
                    return (Outcome::Failed, lost.to_string(), true);
                }
                return (Outcome::Failed, e.to_string(), false);
            }
        }
    }
    (Outcome::Failed, last, false)
}
