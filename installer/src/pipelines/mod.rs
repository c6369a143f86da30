//! Pipelines: each a plain list of phases (modules from `phases/`) with
//! their ordering rules. `install` deploys a cluster, `reset` undoes it; the
//! day-2 operations add theirs here.

pub mod install;
pub mod reset;
pub mod upgrade;

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
    /// The cluster written into itself as a Cluster object, with its status.
    Operator,
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
            Phase::Operator => "operator",
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

/// Tasks whose name starts with this only ready their own host (binaries,
/// settings, files: nothing another host needs or provides): the phase's
/// cross-host gates do not hold them, so they run while earlier phases'
/// gates are still closed (a worker fetches kubelet while etcd starts).
pub const PREPARE: &str = "prepare-";

/// Orders a pipeline's phases, given in order: on each host a task waits
/// for the earlier phases' tasks on that host, and a phase listed in
/// `gates` waits for every host's tasks of the phases listed with it,
/// except that a task naming some tasks of a gating phase itself waits for
/// those alone (workers wait for the first control-plane node's init, not
/// for every join), and a [`PREPARE`] task waits for no other host.
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
            let prepare = t.name.starts_with(PREPARE);
            // Gating phases (by module index) the task already names a task of.
            let named: Vec<usize> = all
                .iter()
                .filter(|(j, task, _)| *j < k && t.after.iter().any(|(a, _)| a == task))
                .map(|(j, _, _)| *j)
                .collect();
            for (j, task, hosts) in all.iter().filter(|(j, _, _)| *j < k) {
                if t.after.iter().any(|(a, _)| a == task) {
                    continue;
                }
                let gated = cross.contains(&phases[*j]) && !prepare;
                if gated && !named.contains(j) {
                    t.after.push((task.clone(), Scope::AllHosts));
                } else if hosts.iter().any(|h| t.hosts.contains(h)) {
                    t.after.push((task.clone(), Scope::SameHost));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::plan::{Module, Scope, Task};

    pub(super) fn task(name: &str, host: &str, after: &[(&str, Scope)]) -> Task {
        Task {
            name: name.into(),
            hosts: vec![host.into()],
            steps: vec![],
            after: after.iter().map(|(a, s)| (a.to_string(), *s)).collect(),
        }
    }

    pub(super) fn module(name: &str, tasks: Vec<Task>) -> Module {
        Module { name: name.into(), tasks }
    }

    /// What task `name` waits for once linked, sorted by name.
    pub(super) fn after_of(modules: &[(Phase, Module)], name: &str) -> Vec<(String, Scope)> {
        let mut a = modules
            .iter()
            .flat_map(|(_, m)| &m.tasks)
            .find(|t| t.name == name)
            .map(|t| t.after.clone())
            .unwrap_or_else(|| panic!("no task {name}"));
        a.sort_by(|x, y| x.0.cmp(&y.0));
        a
    }

    /// A prepare task waits for no other host; a task naming one task of a
    /// gating phase waits for that one alone; the others for every task of
    /// their gating phases; every task for the earlier phases on its host.
    #[test]
    fn gates_hold_all_but_prepare_tasks_and_a_named_task_narrows_its_phase() {
        let mut modules = vec![
            (
                Phase::Containerd,
                module("containerd", vec![task("containerd-w", "w", &[]), task("containerd-c", "c", &[])]),
            ),
            (
                Phase::ControlPlane,
                module(
                    "control-plane",
                    vec![task("init-c", "c", &[]), task("join-d", "d", &[("init-c", Scope::AllHosts)])],
                ),
            ),
            (
                Phase::Workers,
                module(
                    "workers",
                    vec![
                        task(&format!("{PREPARE}w"), "w", &[]),
                        task("join-w", "w", &[("init-c", Scope::AllHosts)]),
                        task("join-v", "v", &[]),
                    ],
                ),
            ),
        ];
        link(&mut modules, &[(Phase::Workers, &[Phase::ControlPlane])]);
        let after = |name: &str| after_of(&modules, name);
        let s = |n: &str, sc: Scope| (n.to_string(), sc);
        assert_eq!(after(&format!("{PREPARE}w")), [s("containerd-w", Scope::SameHost)]);
        assert_eq!(
            after("join-w"),
            [s("containerd-w", Scope::SameHost), s("init-c", Scope::AllHosts)],
            "named init-c: not join-d"
        );
        assert_eq!(after("join-v"), [s("init-c", Scope::AllHosts), s("join-d", Scope::AllHosts)]);
    }
}
