//! Plans: Pipeline → Module → Task → Step, assembled into one DAG of
//! (step × host) nodes.
//!
//! Within a task, a host runs its steps in order. A task may come after other
//! tasks, either on the same host only (containerd before kubelet on each
//! node) or after they finished on every host (etcd healthy before any
//! control plane). Those are the only edges, so independent hosts and tasks
//! run in parallel. A cycle is refused when the plan is built. An
//! all-hosts dependency goes through one barrier node (N + M edges, not
//! N x M: at 5,000 hosts that is 10,000 edges instead of 25 million), which
//! the scheduler passes without running anything.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::transport::{Transport, TransportError};

/// What a step's check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The host is already in the desired state: skip.
    Holds,
    /// It is not: apply.
    Missing,
    /// The step cannot tell; the state database decides (done earlier → skip).
    Unknown,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("{0}")]
    Failed(String),
}

/// One idempotent change on one host.
pub trait Step: Send + Sync {
    fn name(&self) -> &str;
    /// Is the host already in the desired state?
    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>>;
    /// Bring it there; returns a log of what was done.
    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>>;
    /// What it waits for, when it is a wait (polls until something outside
    /// it is ready): a timeline shows its time as waiting, not working.
    fn waits(&self) -> Option<&str> {
        None
    }
}

/// Whether a dependency holds per host or across all hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    SameHost,
    AllHosts,
}

/// Steps run in order on each of a set of hosts.
pub struct Task {
    pub name: String,
    pub hosts: Vec<String>,
    pub steps: Vec<Arc<dyn Step>>,
    /// Tasks (by name, within the pipeline) that must finish first.
    pub after: Vec<(String, Scope)>,
}

/// A phase: a named group of tasks.
pub struct Module {
    pub name: String,
    pub tasks: Vec<Task>,
}

pub struct Pipeline {
    pub name: String,
    pub modules: Vec<Module>,
}

impl Pipeline {
    /// A pipeline of the named modules, in order, those without a task left out.
    pub fn of(name: &str, modules: Vec<(&str, Vec<Task>)>) -> Pipeline {
        Pipeline {
            name: name.into(),
            modules: modules
                .into_iter()
                .filter(|(_, tasks)| !tasks.is_empty())
                .map(|(name, tasks)| Module { name: name.into(), tasks })
                .collect(),
        }
    }
}

/// A node of the DAG: one step on one host, or a barrier.
#[derive(Clone)]
pub struct Node {
    /// `module/task/step@host`: stable across runs, the key of the state.
    pub id: String,
    pub module: String,
    pub host: String,
    pub step: Arc<dyn Step>,
    /// A barrier: done when everything before it is, runs nothing, is not
    /// recorded or reported (`host` is empty).
    pub barrier: bool,
}

/// What a barrier node runs: nothing (the scheduler never calls it).
struct Barrier;

impl Step for Barrier {
    fn name(&self) -> &str {
        "barrier"
    }
    fn check<'a>(&'a self, _: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async { Ok(Check::Holds) })
    }
    fn apply<'a>(&'a self, _: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async { Ok(String::new()) })
    }
}

/// The DAG.
pub struct Plan {
    pub graph: DiGraph<Node, ()>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("task {task} comes after {missing}, which the pipeline does not have")]
    UnknownTask { task: String, missing: String },
    #[error("the plan has a cycle through {0}; a step cannot come after itself")]
    Cycle(String),
}

impl Pipeline {
    /// Assembles the DAG and checks it for cycles.
    pub fn plan(&self) -> Result<Plan, PlanError> {
        let mut g: DiGraph<Node, ()> = DiGraph::new();
        // task name → host → (first node, last node)
        let mut ends: HashMap<&str, BTreeMap<&str, (NodeIndex, NodeIndex)>> = HashMap::new();
        for m in &self.modules {
            for t in &m.tasks {
                let mut per_host = BTreeMap::new();
                for h in &t.hosts {
                    let mut prev: Option<NodeIndex> = None;
                    let mut first = None;
                    for s in &t.steps {
                        let n = g.add_node(Node {
                            id: format!("{}/{}/{}@{h}", m.name, t.name, s.name()),
                            module: m.name.clone(),
                            host: h.clone(),
                            step: s.clone(),
                            barrier: false,
                        });
                        if let Some(p) = prev {
                            g.add_edge(p, n, ());
                        }
                        first.get_or_insert(n);
                        prev = Some(n);
                    }
                    if let (Some(f), Some(l)) = (first, prev) {
                        per_host.insert(h.as_str(), (f, l));
                    }
                }
                ends.insert(t.name.as_str(), per_host);
            }
        }
        // One barrier per task waited for on all hosts, shared by its waiters.
        let mut barriers: HashMap<&str, NodeIndex> = HashMap::new();
        for m in &self.modules {
            for t in &m.tasks {
                for (dep, scope) in &t.after {
                    let Some(before) = ends.get(dep.as_str()) else {
                        return Err(PlanError::UnknownTask {
                            task: t.name.clone(),
                            missing: dep.clone(),
                        });
                    };
                    let Some(mine) = ends.get(t.name.as_str()) else { continue };
                    let barrier = match scope {
                        Scope::SameHost => None,
                        Scope::AllHosts => Some(*barriers.entry(dep.as_str()).or_insert_with(|| {
                            let b = g.add_node(Node {
                                id: format!("after {dep} on every host"),
                                module: m.name.clone(),
                                host: String::new(),
                                step: Arc::new(Barrier),
                                barrier: true,
                            });
                            for (_, last) in before.values() {
                                g.add_edge(*last, b, ());
                            }
                            b
                        })),
                    };
                    for (host, (first, _)) in mine {
                        match barrier {
                            None => {
                                if let Some((_, last)) = before.get(host) {
                                    g.add_edge(*last, *first, ());
                                }
                            }
                            Some(b) => {
                                g.add_edge(b, *first, ());
                            }
                        }
                    }
                }
            }
        }
        if let Err(c) = petgraph::algo::toposort(&g, None) {
            return Err(PlanError::Cycle(g[c.node_id()].id.clone()));
        }
        Ok(Plan { graph: g })
    }
}

impl Plan {
    /// Steps × hosts (barriers not counted).
    pub fn len(&self) -> usize {
        self.graph.node_weights().filter(|n| !n.barrier).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Modules in order, then steps per host (for `--dry-run`).
    pub fn describe(&self) -> String {
        self.describe_without(&Default::default())
    }

    /// [`Plan::describe`] without the steps in `done` (earlier jobs did
    /// them: a run skips them), and a last line counting them.
    pub fn describe_without(&self, done: &std::collections::HashSet<String>) -> String {
        let order = petgraph::algo::toposort(&self.graph, None).unwrap_or_default();
        let mut modules: Vec<String> = Vec::new();
        let mut by: BTreeMap<(usize, String), Vec<String>> = BTreeMap::new();
        let mut skipped = 0;
        for n in order {
            let node = &self.graph[n];
            if node.barrier {
                continue;
            }
            if done.contains(&node.id) {
                skipped += 1;
                continue;
            }
            let mi = match modules.iter().position(|m| *m == node.module) {
                Some(i) => i,
                None => {
                    modules.push(node.module.clone());
                    modules.len() - 1
                }
            };
            by.entry((mi, node.host.clone()))
                .or_default()
                .push(node.id.split('@').next().unwrap_or_default().to_string());
        }
        let mut out = String::new();
        for (i, m) in modules.iter().enumerate() {
            let _ = writeln!(out, "{m}");
            for ((_, host), steps) in by.range((i, String::new())..(i + 1, String::new())) {
                let _ = writeln!(out, "  {host}: {}", steps.join(", "));
            }
        }
        if skipped > 0 {
            let _ = writeln!(out, "({skipped} steps done by earlier jobs are skipped)");
        }
        out
    }

    /// The DAG in Graphviz DOT.
    pub fn to_dot(&self) -> String {
        let mut out = String::from("digraph plan {\n  rankdir=LR;\n");
        for n in self.graph.node_indices() {
            let _ = writeln!(out, "  n{} [label=\"{}\"];", n.index(), self.graph[n].id.replace('"', "'"));
        }
        for e in self.graph.edge_indices() {
            if let Some((a, b)) = self.graph.edge_endpoints(e) {
                let _ = writeln!(out, "  n{} -> n{};", a.index(), b.index());
            }
        }
        out.push_str("}\n");
        out
    }
}
