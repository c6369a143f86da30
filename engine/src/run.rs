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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use petgraph::Direction;
use petgraph::graph::NodeIndex;
use tokio::task::JoinSet;

use crate::events::{Emitter, Event, EventSink, PhaseSize};
use crate::plan::{Check, Plan, StepError};

/// The plan's graph.
type Graph = petgraph::graph::DiGraph<crate::plan::Node, ()>;
use crate::state::{Outcome, Record, now_ms};
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
    // Everything per node and per host is indexed (node index, host
    // index): no hashing or string comparison per scheduling event.
    let mut indegree: Vec<usize> = g
        .node_indices()
        .map(|n| g.neighbors_directed(n, Direction::Incoming).count())
        .collect();
    let (host_names, host_of) = index_hosts(g);
    let hosts = host_names.len();
    let mut report = Report::default();
    let done_before = match state.done_nodes(cluster, job).await {
        Ok(d) => d,
        Err(e) => {
            report.state_error = Some(format!("reading what earlier runs did: {e}"));
            Default::default()
        }
    };
    // Ready nodes wait per host; hosts with ready work and no running step
    // wait in one queue. Every event is O(1), whatever the plan's size.
    let mut q = Queues {
        pending: vec![VecDeque::new(); hosts],
        waiting: VecDeque::new(),
        queued: Flags::new(hosts),
        busy: Flags::new(hosts),
        ready_at: vec![0; g.node_count()],
        trigger: vec![NONE; g.node_count()],
    };
    let mut blocked = Flags::new(g.node_count());
    let mut running: JoinSet<Done> = JoinSet::new();
    // Each host's transport, by host index.
    let links: Vec<Option<Arc<dyn Transport>>> = host_names.iter().map(|h| transports.get(*h).cloned()).collect();
    // Hosts that became unreachable, and why each blocked node was not run.
    let mut lost = Flags::new(hosts);
    let mut why_blocked: HashMap<NodeIndex, String> = HashMap::new();
    // Nodes with a result in the report.
    let mut reported = Flags::new(g.node_count());
    let mut failed = false;
    let events = Emitter::new(opts.events.clone(), job);
    events.emit(|| Event::JobStarted { phases: phases(plan) });
    // Barriers pass as soon as they are ready: what waits on them becomes
    // ready in turn (pushed onto its host's queue).
    let ready: Vec<NodeIndex> = g.node_indices().filter(|n| indegree[n.index()] == 0).collect();
    q.pass_ready(g, ready, NONE, &mut indegree, &host_of);
    loop {
        let stopping = stop.load(Ordering::Relaxed) || (failed && opts.policy == Policy::FailFast) || report.state_error.is_some();
        while !stopping && q.busy.count < opts.concurrency.max(1) {
            let Some(host) = q.waiting.pop_front() else { break };
            q.queued.remove(host);
            let Some(n) = pop_unblocked(&mut q.pending[host], &blocked) else {
                continue;
            };
            let node = &g[n];
            let Some(t) = links[host].clone() else {
                reported.insert(n.index());
                report.results.push(NodeResult {
                    id: node.id.clone(),
                    host: node.host.clone(),
                    outcome: Outcome::Failed,
                    log: format!("no connection to {}", node.host),
                });
                failed = true;
                continue;
            };
            q.busy.insert(host);
            events.emit(|| step_event(g, n, None));
            let done = !done_before.is_empty() && done_before.contains(&node.id);
            running.spawn(run_node(n, node.step.clone(), t, done, opts.attempts.max(1)));
        }
        let Some(first) = running.join_next().await else { break };
        // Everything else that finished meanwhile is recorded in the same
        // transaction. (Tasks catch their steps' panics and are never
        // aborted, so each ends with its node's result.)
        let mut finished: Vec<Done> = first.into_iter().collect();
        while let Some(more) = running.try_join_next() {
            finished.extend(more);
        }
        let records: Vec<Record> = finished.iter().map(|d| d.record(g, &q)).collect();
        if let Err(e) = state.record_many(job, &records).await {
            report.state_error.get_or_insert(format!("recording step results: {e}"));
        }
        #[cfg(feature = "fault-injection")]
        crate::fault::after_applied(
            finished
                .iter()
                .filter(|d| d.outcome == Outcome::Applied)
                .map(|d| g[d.n].id.as_str()),
        );
        for d in &finished {
            let (n, outcome) = (d.n, d.outcome);
            let node = &g[n];
            let host = host_of[n.index()];
            q.busy.remove(host);
            let log = crate::output::bound(&state.redact(&d.log), crate::state::STEP_LOG_KEEP).into_owned();
            if events.wanted() {
                for line in crate::output::bound_lines(&log, crate::output::EVENT_LINES) {
                    events.emit(|| Event::LogLine {
                        node: node.id.clone(),
                        host: node.host.clone(),
                        line: line.clone().into_owned(),
                    });
                }
            }
            events.emit(|| step_event(g, n, Some(outcome)));
            report.results.push(NodeResult {
                id: node.id.clone(),
                host: node.host.clone(),
                outcome,
                log,
            });
            reported.insert(n.index());
            if outcome == Outcome::Failed {
                if !d.host_lost {
                    failed = true;
                }
                let blocks = Blocks {
                    g,
                    host_of: &host_of,
                    host_names: &host_names,
                    reported: &reported,
                };
                blocks.block(n, d.host_lost, &mut lost, &mut blocked, &mut why_blocked);
            } else {
                let next_ready = release(g, n, &mut indegree);
                q.pass_ready(g, next_ready, n.index() as u32, &mut indegree, &host_of);
            }
            if !q.pending[host].is_empty() && q.queued.insert(host) {
                q.waiting.push_back(host);
            }
        }
    }
    report.interrupted = stop.load(Ordering::Relaxed);
    let ended = Ended {
        blocked: &blocked,
        why_blocked: &why_blocked,
        reported: &reported,
    };
    ended.finish(g, state, job, &events, &mut report).await;
    report
}

/// Hosts by index, and each node's host index: everything per host is
/// indexed, no hashing or string comparison per scheduling event.
fn index_hosts(g: &Graph) -> (Vec<&str>, Vec<usize>) {
    let mut host_names: Vec<&str> = Vec::new();
    let mut ix: HashMap<&str, usize> = HashMap::new();
    let host_of = g
        .node_weights()
        .map(|node| {
            *ix.entry(node.host.as_str()).or_insert_with(|| {
                host_names.push(node.host.as_str());
                host_names.len() - 1
            })
        })
        .collect();
    (host_names, host_of)
}

/// A step's event: started (no outcome yet) or finished.
fn step_event(g: &Graph, n: NodeIndex, outcome: Option<Outcome>) -> Event {
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
}

/// The next node of a host's queue that nothing blocked.
fn pop_unblocked(q: &mut VecDeque<NodeIndex>, blocked: &Flags) -> Option<NodeIndex> {
    while let Some(n) = q.pop_front() {
        if !blocked.contains(n.index()) {
            return Some(n);
        }
    }
    None
}

/// Runs one node's step; a step that panics is a failed step, with the
/// panic's message.
async fn run_node(n: NodeIndex, step: Arc<dyn crate::plan::Step>, t: Arc<dyn Transport>, done: bool, attempts: u32) -> Done {
    use futures_util::FutureExt;
    let started = now_ms();
    let ran = std::panic::AssertUnwindSafe(execute(step.as_ref(), t.as_ref(), done, attempts))
        .catch_unwind()
        .await;
    let (outcome, log, host_lost) = match ran {
        Ok(r) => r,
        Err(panic) => (Outcome::Failed, format!("the step panicked: {}", panic_message(&*panic)), false),
    };
    Done {
        n,
        outcome,
        log,
        host_lost,
        started,
        duration_ms: now_ms() - started,
    }
}

/// `n` finished: its successors whose every dependency is done.
fn release(g: &Graph, n: NodeIndex, indegree: &mut [usize]) -> Vec<NodeIndex> {
    let mut ready = Vec::new();
    for next in g.neighbors_directed(n, Direction::Outgoing) {
        indegree[next.index()] -= 1;
        if indegree[next.index()] == 0 {
            ready.push(next);
        }
    }
    ready
}

/// No node (a trigger of a node ready from the start).
const NONE: u32 = u32::MAX;

/// Ready nodes wait per host; hosts with ready work and no running step
/// wait in one queue. Every event is O(1), whatever the plan's size.
struct Queues {
    pending: Vec<VecDeque<NodeIndex>>,
    waiting: VecDeque<usize>,
    queued: Flags,
    busy: Flags,
    /// Per node: when it became ready (ms since the epoch), and the node
    /// whose end made it ready (through barriers; [`NONE`] at the start),
    /// the edge a timeline's critical path follows.
    ready_at: Vec<i64>,
    trigger: Vec<u32>,
}

impl Queues {
    /// Queues `ready` nodes, made ready by the end of `by`, on their hosts;
    /// a barrier passes at once and its successors are ready in turn, made
    /// ready by the same node.
    fn pass_ready(&mut self, g: &Graph, ready: Vec<NodeIndex>, by: u32, indegree: &mut [usize], host_of: &[usize]) {
        let now = now_ms();
        let mut ready: Vec<(NodeIndex, u32)> = ready.into_iter().map(|n| (n, by)).collect();
        while let Some((n, by)) = ready.pop() {
            if g[n].barrier {
                ready.extend(release(g, n, indegree).into_iter().map(|m| (m, by)));
                continue;
            }
            self.ready_at[n.index()] = now;
            self.trigger[n.index()] = by;
            let h = host_of[n.index()];
            self.pending[h].push_back(n);
            if !self.busy.contains(h) && self.queued.insert(h) {
                self.waiting.push_back(h);
            }
        }
    }
}

/// What a failed node blocks: everything that depends on it, and when its
/// host became unreachable, everything else on that host.
struct Blocks<'a> {
    g: &'a Graph,
    host_of: &'a [usize],
    host_names: &'a [&'a str],
    reported: &'a Flags,
}

impl Blocks<'_> {
    fn block(&self, n: NodeIndex, lost_host: bool, lost: &mut Flags, blocked: &mut Flags, why_blocked: &mut HashMap<NodeIndex, String>) {
        let (g, host_of) = (self.g, self.host_of);
        let node = &g[n];
        let host = host_of[n.index()];
        let mut roots = vec![n];
        if lost_host && lost.insert(host) {
            // Nothing more can run on the host: its other nodes are blocked too.
            roots.extend(
                g.node_indices()
                    .filter(|m| host_of[m.index()] == host && !self.reported.contains(m.index())),
            );
        }
        let name = self.host_names[host];
        let waits = if lost_host {
            format!("not done: it waits on {name}, which became unreachable")
        } else {
            format!("not done: it waits on {} on {name}, which failed", node.id)
        };
        // Everything that depends on them cannot run.
        for root in roots {
            let mut dfs = petgraph::visit::Dfs::new(g, root);
            while let Some(d) = dfs.next(g) {
                if d != n && blocked.insert(d.index()) {
                    let why = if lost_host && host_of[d.index()] == host {
                        format!("not done: {name} became unreachable")
                    } else {
                        waits.clone()
                    };
                    why_blocked.insert(d, why);
                }
            }
        }
    }
}

/// What the scheduler knows at the end: to record the nodes not run.
struct Ended<'a> {
    blocked: &'a Flags,
    why_blocked: &'a HashMap<NodeIndex, String>,
    reported: &'a Flags,
}

impl Ended<'_> {
    /// Records every node not run, with why, then the job's end.
    async fn finish(&self, g: &Graph, state: &dyn Store, job: i64, events: &Emitter, report: &mut Report) {
        let missing: Vec<NodeIndex> = g
            .node_indices()
            .filter(|n| !g[*n].barrier && !self.reported.contains(n.index()))
            .collect();
        let mut records = Vec::new();
        for n in &missing {
            let node = &g[*n];
            let why = match self.why_blocked.get(n) {
                Some(why) => why.as_str(),
                None if self.blocked.contains(n.index()) => "not done: an earlier step it depends on failed",
                None => "not done: the run stopped before it",
            };
            events.emit(|| step_event(g, *n, Some(Outcome::NotRun)));
            let now = now_ms();
            records.push(Record {
                node: &node.id,
                module: &node.module,
                host: &node.host,
                outcome: Outcome::NotRun,
                ready: now,
                started: now,
                duration_ms: 0,
                after: None,
                waits: None,
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
    }
}

impl Done {
    fn record<'a>(&'a self, g: &'a Graph, q: &Queues) -> Record<'a> {
        let node = &g[self.n];
        let i = self.n.index();
        let after = q.trigger[i];
        Record {
            node: &node.id,
            module: &node.module,
            host: &node.host,
            outcome: self.outcome,
            ready: q.ready_at[i],
            started: self.started,
            duration_ms: self.duration_ms,
            after: (after != NONE).then(|| g[NodeIndex::new(after as usize)].id.as_str()),
            waits: node.step.waits(),
            log: &self.log,
        }
    }
}

/// A set of small indices (nodes, hosts), with its size.
struct Flags {
    set: Vec<bool>,
    count: usize,
}

impl Flags {
    fn new(n: usize) -> Flags {
        Flags {
            set: vec![false; n],
            count: 0,
        }
    }

    /// Whether it was not there.
    fn insert(&mut self, i: usize) -> bool {
        let new = !std::mem::replace(&mut self.set[i], true);
        self.count += usize::from(new);
        new
    }

    fn remove(&mut self, i: usize) {
        if std::mem::replace(&mut self.set[i], false) {
            self.count -= 1;
        }
    }

    fn contains(&self, i: usize) -> bool {
        self.set[i]
    }
}

/// The plan's phases (modules, in order of first appearance) and their nodes per host.
fn phases(plan: &Plan) -> Vec<PhaseSize> {
    let mut index: HashMap<&str, (usize, HashMap<&str, usize>)> = HashMap::new();
    let mut out: Vec<PhaseSize> = Vec::new();
    for node in plan.graph.node_weights().filter(|n| !n.barrier) {
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

/// The text of a panic's payload ("" when it carries none).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default()
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
