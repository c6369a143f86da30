//! Pipelines: each a plain list of phases (modules from `phases/`) with
//! their ordering rules. `install` deploys a cluster, `reset` undoes it; the
//! day-2 operations add theirs here.

pub mod install;
pub mod reset;

/// A phase of a pipeline, by the name users type (`--phases etcd,cni`) and
/// requests carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Preflight,
    OsPackages,
    Registry,
    Etcd,
    Loadbalancer,
    Containerd,
    ControlPlane,
    Workers,
    Cni,
    Addons,
    Kubeconfig,
    /// Every host back to before kubexm (the reset pipeline's one phase).
    Reset,
}

impl Phase {
    /// Its name (`control-plane`), the module's name too.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Preflight => "preflight",
            Phase::OsPackages => "os-packages",
            Phase::Registry => "registry",
            Phase::Etcd => "etcd",
            Phase::Loadbalancer => "loadbalancer",
            Phase::Containerd => "containerd",
            Phase::ControlPlane => "control-plane",
            Phase::Workers => "workers",
            Phase::Cni => "cni",
            Phase::Addons => "addons",
            Phase::Kubeconfig => "kubeconfig",
            Phase::Reset => "reset",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Names of `phases`, joined with `sep`.
pub fn names(phases: &[Phase], sep: &str) -> String {
    phases.iter().map(|p| p.name()).collect::<Vec<_>>().join(sep)
}

/// Orders a pipeline's phases, given in order: on each host a task waits
/// for the earlier phases' tasks on that host, and a phase listed in
/// `gates` waits for every host's tasks of the phases listed with it.
pub fn link(modules: &mut [(Phase, crate::engine::plan::Module)], gates: &[(Phase, &[Phase])]) {
    use crate::engine::plan::Scope;
    // (module index, task, hosts) of every task, in phase order.
    let all: Vec<(usize, String, Vec<String>)> = modules
        .iter()
        .enumerate()
        .flat_map(|(k, (_, m))| m.tasks.iter().map(move |t| (k, t.name.clone(), t.hosts.clone())))
        .collect();
    let phases: Vec<Phase> = modules.iter().map(|(p, _)| *p).collect();
    for (k, (phase, m)) in modules.iter_mut().enumerate() {
        let cross: &[Phase] = gates.iter().find(|(p, _)| p == phase).map(|(_, g)| *g).unwrap_or(&[]);
        for t in &mut m.tasks {
            for (j, task, hosts) in all.iter().filter(|(j, _, _)| *j < k) {
                if t.after.iter().any(|(a, _)| a == task) {
                    continue;
                }
                if cross.contains(&phases[*j]) {
                    t.after.push((task.clone(), Scope::AllHosts));
                } else if hosts.iter().any(|h| t.hosts.contains(h)) {
                    t.after.push((task.clone(), Scope::SameHost));
                }
            }
        }
    }
}
