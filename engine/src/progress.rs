//! Progress of an engine run: on a terminal, one bar per phase (module) with
//! hosts done over total and the hosts in progress; otherwise plain lines, one
//! per host finishing a phase and one per failed step.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::plan::{Node, Plan};
use crate::state::Outcome;

/// How a run shows its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// Nothing (tests, examples, machine output).
    #[default]
    Off,
    /// Plain lines on stderr (logs, CI).
    Lines,
    /// Bars on stderr (a terminal).
    Bars,
}

impl ProgressMode {
    /// Bars on a terminal, lines otherwise.
    pub fn for_stderr() -> ProgressMode {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
            ProgressMode::Bars
        } else {
            ProgressMode::Lines
        }
    }
}

struct Phase {
    name: String,
    hosts: usize,
    done: usize,
    /// host → nodes of this phase not finished yet
    left: HashMap<String, usize>,
    running: BTreeSet<String>,
    bar: Option<ProgressBar>,
}

impl Phase {
    fn redraw(&self) {
        if let Some(bar) = &self.bar {
            bar.set_position(self.done as u64);
            let now: Vec<&str> = self.running.iter().map(String::as_str).take(6).collect();
            let more = self.running.len().saturating_sub(now.len());
            let mut msg = now.join(" ");
            if more > 0 {
                msg.push_str(&format!(" +{more}"));
            }
            bar.set_message(msg);
        }
    }
}

/// Tracks a run and draws it.
pub struct Progress {
    mode: ProgressMode,
    _multi: Option<MultiProgress>,
    phases: Mutex<Vec<Phase>>,
}

impl Progress {
    pub fn new(plan: &Plan, mode: ProgressMode) -> Progress {
        let mut phases: Vec<Phase> = Vec::new();
        for n in plan.graph.node_indices() {
            let node = &plan.graph[n];
            let i = match phases.iter().position(|p| p.name == node.module) {
                Some(i) => i,
                None => {
                    phases.push(Phase {
                        name: node.module.clone(),
                        hosts: 0,
                        done: 0,
                        left: HashMap::new(),
                        running: BTreeSet::new(),
                        bar: None,
                    });
                    phases.len() - 1
                }
            };
            *phases[i].left.entry(node.host.clone()).or_default() += 1;
        }
        let width = phases.iter().map(|p| p.name.len()).max().unwrap_or(0);
        let multi = (mode == ProgressMode::Bars).then(|| {
            let m = MultiProgress::new();
            m.set_draw_target(ProgressDrawTarget::stderr());
            m
        });
        for p in &mut phases {
            p.hosts = p.left.len();
            if let Some(m) = &multi {
                let bar = m.add(ProgressBar::new(p.hosts as u64));
                let style = ProgressStyle::with_template(&format!(
                    "{{prefix:>{width}}} [{{bar:30}}] {{pos}}/{{len}} hosts {{elapsed}} {{msg}}"
                ))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
                bar.set_style(style);
                bar.set_prefix(p.name.clone());
                p.bar = Some(bar);
            }
        }
        Progress {
            mode,
            _multi: multi,
            phases: Mutex::new(phases),
        }
    }

    fn with_phase(&self, node: &Node, f: impl FnOnce(&mut Phase)) {
        if self.mode == ProgressMode::Off {
            return;
        }
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = phases.iter_mut().find(|p| p.name == node.module) {
            f(p);
        }
    }

    /// A node started on its host.
    pub fn started(&self, node: &Node) {
        self.with_phase(node, |p| {
            p.running.insert(node.host.clone());
            p.redraw();
        });
    }

    /// A node finished; a host is done with a phase when its last node there finished.
    pub fn finished(&self, node: &Node, outcome: Outcome) {
        let lines = self.mode == ProgressMode::Lines;
        self.with_phase(node, |p| {
            if outcome == Outcome::Failed {
                let step = node.id.split('@').next().unwrap_or_default();
                let line = format!("{}: {} failed on {}", p.name, step, node.host);
                match &p.bar {
                    Some(bar) => bar.println(line),
                    None => eprintln!("{line}"),
                }
            }
            let left = p.left.entry(node.host.clone()).or_default();
            *left = left.saturating_sub(1);
            if *left == 0 {
                p.running.remove(&node.host);
                if outcome != Outcome::Failed && outcome != Outcome::NotRun {
                    p.done += 1;
                    if lines {
                        eprintln!("{}: {} done ({}/{})", p.name, node.host, p.done, p.hosts);
                    }
                }
            }
            p.redraw();
        });
    }

    /// Per phase: name, hosts done, hosts in it.
    pub fn counts(&self) -> Vec<(String, usize, usize)> {
        let phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        phases.iter().map(|p| (p.name.clone(), p.done, p.hosts)).collect()
    }

    /// The run ended: bars stay on screen with their final counts.
    pub fn end(&self) {
        let phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        for p in phases.iter() {
            if let Some(bar) = &p.bar {
                bar.set_message("");
                bar.abandon();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::plan::{Module, Pipeline, Task};
    use crate::steps::Shell;

    #[test]
    fn a_host_counts_once_its_last_step_of_a_phase_finished() -> Result<(), Box<dyn std::error::Error>> {
        let hosts = vec!["a".to_string(), "b".to_string()];
        let steps = |n: &str| -> Vec<Arc<dyn crate::plan::Step>> {
            vec![
                Arc::new(Shell::new(&format!("{n}1"), None, "true")),
                Arc::new(Shell::new(&format!("{n}2"), None, "true")),
            ]
        };
        let module = |name: &str| Module {
            name: name.into(),
            tasks: vec![Task {
                name: name.into(),
                hosts: hosts.clone(),
                steps: steps(name),
                after: vec![],
            }],
        };
        let plan = Pipeline {
            name: "p".into(),
            modules: vec![module("etcd"), module("containerd")],
        }
        .plan()?;
        let p = Progress::new(&plan, ProgressMode::Lines);
        let node = |id: &str| {
            plan.graph
                .node_weights()
                .find(|n| n.id == id)
                .ok_or_else(|| format!("no node {id}"))
        };
        p.started(node("etcd/etcd/etcd1@a")?);
        p.finished(node("etcd/etcd/etcd1@a")?, Outcome::Applied);
        assert_eq!(p.counts()[0], ("etcd".into(), 0, 2));
        p.finished(node("etcd/etcd/etcd2@a")?, Outcome::Skipped);
        p.finished(node("etcd/etcd/etcd1@b")?, Outcome::Failed);
        p.finished(node("etcd/etcd/etcd2@b")?, Outcome::NotRun);
        assert_eq!(p.counts(), vec![("etcd".into(), 1, 2), ("containerd".into(), 0, 2)]);
        Ok(())
    }
}
