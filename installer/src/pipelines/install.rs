//! The install pipeline: the phases in order, each built by its module in
//! `phases/` from the one [`Context`], and the ordering rules between them
//! (on each host a task waits for the earlier phases' tasks on that host;
//! cross-host gates hold the control plane after etcd and the
//! loadbalancers, joins and the network plugin after init, the CNI's waits
//! and the addons after the nodes).
//! Options a phase does not implement are refused while planning with
//! [`crate::DeployError::NotSupported`] (exit 8).

use super::Phase;
use crate::context::Context;
use crate::engine::plan::{Module, Pipeline};
use crate::phases;

/// The phases, in order.
pub const PHASES: &[Phase] = &[
    Phase::Preflight,
    Phase::OsPackages,
    Phase::Registry,
    Phase::Etcd,
    Phase::Loadbalancer,
    Phase::Containerd,
    Phase::ControlPlane,
    Phase::Workers,
    Phase::Cni,
    Phase::Addons,
    Phase::Kubeconfig,
    Phase::Operator,
];
/// The phases this release implements.
pub const IMPLEMENTED: &[Phase] = PHASES;

/// Phases by name (`--phases`); an unknown name is refused, naming them all.
pub fn parse(names: &[String]) -> Result<Vec<Phase>, String> {
    names
        .iter()
        .map(|n| {
            PHASES
                .iter()
                .copied()
                .find(|p| p.name() == n)
                .ok_or_else(|| format!("unknown phase `{n}`; phases are: {}", super::names(PHASES, ", ")))
        })
        .collect()
}

/// The phases asked for, split into those this release implements and
/// those it does not.
pub fn select(phases: &[Phase]) -> (Vec<Phase>, Vec<Phase>) {
    phases.iter().copied().partition(|p| IMPLEMENTED.contains(p))
}

/// How a phase's module is built from the context.
type Build = fn(&Context) -> anyhow::Result<Module>;

/// Every phase in order, with its module.
const PIPELINE: &[(Phase, Build)] = &[
    (Phase::Preflight, |c| Ok(phases::preflight::module(c))),
    (Phase::OsPackages, phases::os_packages::module),
    (Phase::Registry, phases::registry::module),
    (Phase::Etcd, phases::etcd::module),
    (Phase::Loadbalancer, phases::endpoint::module),
    (Phase::Containerd, phases::containerd::module),
    (Phase::ControlPlane, phases::kubeadm::control_plane),
    (Phase::Workers, phases::kubeadm::workers),
    (Phase::Cni, phases::addons::cni),
    (Phase::Addons, phases::addons::module),
    (Phase::Kubeconfig, phases::kubeadm::kubeconfig),
    (Phase::Operator, phases::operator::module),
];

/// The deployment pipeline for the chosen phases (a phase with nothing to
/// do, such as os-packages for a bundle without repositories, is left out).
pub fn pipeline(ctx: &Context) -> anyhow::Result<Pipeline> {
    let mut modules = Vec::new();
    for (phase, build) in PIPELINE {
        if !ctx.has(*phase) {
            continue;
        }
        if *phase == Phase::OsPackages && ctx.bom.os_repos.is_empty() {
            continue;
        }
        modules.push((*phase, build(ctx)?));
    }
    link(&mut modules);
    // The registry moved: the old one stops once everything else is done
    // (every node's hosts.toml and the addons' images name the new one).
    if let Some(old) = ctx.registry_retired() {
        let all = modules
            .iter()
            .flat_map(|(_, m)| m.tasks.iter().map(|t| (t.name.clone(), crate::engine::plan::Scope::AllHosts)))
            .collect();
        modules.push((
            Phase::Registry,
            Module {
                name: "registry-retired".into(),
                tasks: vec![phases::registry::retired(old, all)],
            },
        ));
    }
    let modules = modules.into_iter().map(|(_, m)| m).collect();
    Ok(Pipeline {
        name: "install".into(),
        modules,
    })
}

/// The install's cross-host gates: a phase's tasks wait for every host's
/// tasks of the phases listed (the control plane after etcd's health and
/// the loadbalancers, joins after init, the network plugin after init and
/// its waits after every join (named by the cni phase), the addons after
/// the control plane, workers and CNI; the Cluster object last).
const GATES: &[(Phase, &[Phase])] = {
    use Phase::*;
    &[
        (ControlPlane, &[Etcd, Loadbalancer, Registry]),
        (Workers, &[ControlPlane, Registry]),
        (Cni, &[ControlPlane]),
        (Addons, &[ControlPlane, Workers, Cni]),
        (Kubeconfig, &[ControlPlane, Workers, Cni, Addons]),
        (Operator, &[ControlPlane, Workers, Cni, Addons, Kubeconfig]),
    ]
};

/// Orders the phases ([`super::link`] with the install's gates).
fn link(modules: &mut [(Phase, Module)]) {
    super::link(modules, GATES);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under the install's gates, the network plugin (its apply naming the
    /// init) goes on right after the first control-plane node's init, beside
    /// the joins; its waits (naming every join) wait for every node; the
    /// workers join after the init, not after every control-plane join.
    #[test]
    fn the_network_plugin_goes_on_after_the_init_and_its_waits_after_every_join() {
        use super::super::tests::{after_of, module, task};
        use crate::engine::plan::Scope::AllHosts;
        let mut modules = vec![
            (
                Phase::ControlPlane,
                module(
                    "control-plane",
                    vec![
                        task("init-a", "a", &[]),
                        task("join-b", "b", &[("init-a", AllHosts)]),
                        task("join-c", "c", &[("init-a", AllHosts)]),
                    ],
                ),
            ),
            (
                Phase::Workers,
                module("workers", vec![task("join-w", "w", &[("init-a", AllHosts)])]),
            ),
            (
                Phase::Cni,
                module(
                    "cni",
                    vec![
                        task("cni-apply", "a", &[("init-a", AllHosts)]),
                        task(
                            "cni-ready",
                            "a",
                            &[
                                ("cni-apply", AllHosts),
                                ("init-a", AllHosts),
                                ("join-b", AllHosts),
                                ("join-c", AllHosts),
                                ("join-w", AllHosts),
                            ],
                        ),
                    ],
                ),
            ),
            (Phase::Addons, module("addons", vec![task("addon", "a", &[])])),
        ];
        link(&mut modules);
        let s = |n: &str, sc| (n.to_string(), sc);
        assert_eq!(after_of(&modules, "cni-apply"), [s("init-a", AllHosts)]);
        assert_eq!(after_of(&modules, "join-w"), [s("init-a", AllHosts)]);
        assert_eq!(after_of(&modules, "cni-ready").len(), 5);
        assert_eq!(
            after_of(&modules, "addon"),
            [
                s("cni-apply", AllHosts),
                s("cni-ready", AllHosts),
                s("init-a", AllHosts),
                s("join-b", AllHosts),
                s("join-c", AllHosts),
                s("join-w", AllHosts)
            ]
        );
    }

    #[test]
    fn phases_are_selected_and_unknown_ones_refused() -> Result<(), Box<dyn std::error::Error>> {
        let (ok, missing) = select(&parse(&["preflight".into(), "etcd".into(), "cni".into()])?);
        assert_eq!(ok, [Phase::Preflight, Phase::Etcd, Phase::Cni]);
        assert!(missing.is_empty());
        assert!(parse(&["etdc".into()]).unwrap_err().contains("unknown phase `etdc`"));
        Ok(())
    }
}

#[test]
fn the_pipeline_lists_every_phase_in_order() {
    let phases: Vec<Phase> = PIPELINE.iter().map(|(p, _)| *p).collect();
    assert_eq!(phases, PHASES);
}
