//! The install pipeline: the phases in order, each built by its module in
//! `phases/` from the one [`Context`], and the ordering rules between them
//! (on each host a task waits for the earlier phases' tasks on that host;
//! cross-host gates hold the control plane after etcd and the
//! loadbalancers, joins after init, the CNI and addons after the nodes).
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
    let modules = modules.into_iter().map(|(_, m)| m).collect();
    Ok(Pipeline {
        name: "install".into(),
        modules,
    })
}

/// The install's cross-host gates: a phase's tasks wait for every host's
/// tasks of the phases listed (the control plane after etcd's health and
/// the loadbalancers, joins after init, the CNI and addons after the
/// control plane and workers).
const GATES: &[(Phase, &[Phase])] = {
    use Phase::*;
    &[
        (ControlPlane, &[Etcd, Loadbalancer, Registry]),
        (Workers, &[ControlPlane, Registry]),
        (Cni, &[ControlPlane, Workers]),
        (Addons, &[ControlPlane, Workers, Cni]),
        (Kubeconfig, &[ControlPlane, Workers, Cni, Addons]),
    ]
};

/// Orders the phases ([`super::link`] with the install's gates).
fn link(modules: &mut [(Phase, Module)]) {
    super::link(modules, GATES);
}

#[cfg(test)]
mod tests {
    use super::*;

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
