//! The one printer of engine events: on a terminal, one bar per phase
//! (module) with hosts done over total and the hosts in progress; otherwise
//! plain lines, one per host finishing a phase and one per failed step. A
//! command may run several jobs (facts, then the install); each job's
//! `JobStarted` starts its own set of phases.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use kubexm_engine::events::{Event, EventSink, Numbered, PhaseSize};
use kubexm_engine::state::Outcome;

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

#[derive(Default)]
struct Job {
    _multi: Option<MultiProgress>,
    phases: Vec<Phase>,
}

/// Renders events as progress on stderr.
pub struct Printer {
    mode: ProgressMode,
    job: Mutex<Job>,
}

impl Printer {
    pub fn new(mode: ProgressMode) -> Printer {
        Printer {
            mode,
            job: Mutex::new(Job::default()),
        }
    }

    /// Bars on a terminal, lines otherwise.
    pub fn for_stderr() -> Printer {
        Printer::new(ProgressMode::for_stderr())
    }

    fn start(&self, sizes: &[PhaseSize]) {
        let width = sizes.iter().map(|p| p.module.len()).max().unwrap_or(0);
        let multi = (self.mode == ProgressMode::Bars).then(|| {
            let m = MultiProgress::new();
            m.set_draw_target(ProgressDrawTarget::stderr());
            m
        });
        let phases = sizes
            .iter()
            .map(|s| {
                let bar = multi.as_ref().map(|m| {
                    let bar = m.add(ProgressBar::new(s.nodes_per_host.len() as u64));
                    let style = ProgressStyle::with_template(&format!(
                        "{{prefix:>{width}}} [{{bar:30}}] {{pos}}/{{len}} hosts {{elapsed}} {{msg}}"
                    ))
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
                    bar.set_style(style);
                    bar.set_prefix(s.module.clone());
                    bar
                });
                Phase {
                    name: s.module.clone(),
                    hosts: s.nodes_per_host.len(),
                    done: 0,
                    left: s.nodes_per_host.iter().cloned().collect(),
                    running: BTreeSet::new(),
                    bar,
                }
            })
            .collect();
        *self.job.lock().unwrap_or_else(|e| e.into_inner()) = Job { _multi: multi, phases };
    }

    fn with_phase(&self, module: &str, f: impl FnOnce(&mut Phase)) {
        let mut job = self.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = job.phases.iter_mut().find(|p| p.name == module) {
            f(p);
        }
    }

    fn finished(&self, node: &str, module: &str, host: &str, outcome: Outcome) {
        let lines = self.mode == ProgressMode::Lines;
        self.with_phase(module, |p| {
            if outcome == Outcome::Failed {
                let step = node.split('@').next().unwrap_or_default();
                let line = format!("{}: {} failed on {}", p.name, step, host);
                match &p.bar {
                    Some(bar) => bar.println(line),
                    None => eprintln!("{line}"),
                }
            }
            let left = p.left.entry(host.to_string()).or_default();
            *left = left.saturating_sub(1);
            if *left == 0 {
                p.running.remove(host);
                if outcome != Outcome::Failed && outcome != Outcome::NotRun {
                    p.done += 1;
                    if lines {
                        eprintln!("{}: {} done ({}/{})", p.name, host, p.done, p.hosts);
                    }
                }
            }
            p.redraw();
        });
    }

    /// Per phase of the current job: name, hosts done, hosts in it.
    pub fn counts(&self) -> Vec<(String, usize, usize)> {
        let job = self.job.lock().unwrap_or_else(|e| e.into_inner());
        job.phases.iter().map(|p| (p.name.clone(), p.done, p.hosts)).collect()
    }

    /// The job ended: bars stay on screen with their final counts.
    fn end(&self) {
        let job = self.job.lock().unwrap_or_else(|e| e.into_inner());
        for p in &job.phases {
            if let Some(bar) = &p.bar {
                bar.set_message("");
                bar.abandon();
            }
        }
    }
}

impl EventSink for Printer {
    fn emit(&self, e: &Numbered) {
        if self.mode == ProgressMode::Off {
            return;
        }
        match &e.event {
            Event::JobStarted { phases } => self.start(phases),
            Event::StepStarted { module, host, .. } => self.with_phase(module, |p| {
                p.running.insert(host.clone());
                p.redraw();
            }),
            Event::StepFinished {
                node,
                module,
                host,
                outcome,
            } => self.finished(node, module, host, *outcome),
            Event::JobFinished { .. } => self.end(),
            // A step's output is shown by `status` and on failure, not as progress.
            Event::LogLine { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_counts_once_its_last_step_of_a_phase_finished() {
        let size = |m: &str| PhaseSize {
            module: m.into(),
            nodes_per_host: vec![("a".into(), 2), ("b".into(), 2)],
        };
        let p = Printer::new(ProgressMode::Lines);
        let mut seq = 0;
        let mut emit = |event: Event| {
            seq += 1;
            p.emit(&Numbered { seq, job: 1, event });
        };
        let fin = |node: &str, host: &str, outcome| Event::StepFinished {
            node: node.into(),
            module: "etcd".into(),
            host: host.into(),
            outcome,
        };
        emit(Event::JobStarted {
            phases: vec![size("etcd"), size("containerd")],
        });
        emit(Event::StepStarted {
            node: "etcd/etcd/etcd1@a".into(),
            module: "etcd".into(),
            host: "a".into(),
        });
        emit(fin("etcd/etcd/etcd1@a", "a", Outcome::Applied));
        assert_eq!(p.counts()[0], ("etcd".into(), 0, 2));
        emit(fin("etcd/etcd/etcd2@a", "a", Outcome::Skipped));
        emit(fin("etcd/etcd/etcd1@b", "b", Outcome::Failed));
        emit(fin("etcd/etcd/etcd2@b", "b", Outcome::NotRun));
        assert_eq!(p.counts(), vec![("etcd".into(), 1, 2), ("containerd".into(), 0, 2)]);
    }
}
