//! The install pipeline: the phases in order, each built by its module in
//! `phases/` from the one [`Context`], and the ordering rules between them
//! (on each host a task waits for the earlier phases' tasks on that host;
//! cross-host gates hold the control plane after etcd and the
//! loadbalancers, joins after init, the CNI and addons after the nodes).
//! Options a phase does not implement are refused while planning with
//! [`crate::DeployError::NotSupported`] (exit 8).

use crate::context::Context;
use crate::engine::plan::{Module, Pipeline, Scope};
use crate::phases;

/// The phases, in order.
pub const PHASES: &[&str] = &[
    "preflight",
    "os-packages",
    "registry",
    "etcd",
    "loadbalancer",
    "containerd",
    "control-plane",
    "workers",
    "cni",
    "addons",
    "kubeconfig",
];
/// The phases this release implements.
pub const IMPLEMENTED: &[&str] = PHASES;

/// The phases asked for, checked: unknown names are a usage error, known but
/// unimplemented ones are returned as the second list.
pub fn select(phases: &[String]) -> Result<(Vec<String>, Vec<String>), String> {
    let mut chosen = Vec::new();
    let mut missing = Vec::new();
    for p in phases {
        if !PHASES.contains(&p.as_str()) {
            return Err(format!("unknown phase `{p}`; phases are: {}", PHASES.join(", ")));
        }
        if IMPLEMENTED.contains(&p.as_str()) {
            chosen.push(p.clone());
        } else {
            missing.push(p.clone());
        }
    }
    Ok((chosen, missing))
}

/// How a phase's module is built from the context.
type Build = fn(&Context) -> anyhow::Result<Module>;

/// Every phase in order, with its module.
const PIPELINE: &[(&str, Build)] = &[
    ("preflight", |c| Ok(phases::preflight::module(c))),
    ("os-packages", phases::os_packages::module),
    ("registry", phases::registry::module),
    ("etcd", phases::etcd::module),
    ("loadbalancer", phases::endpoint::module),
    ("containerd", phases::containerd::module),
    ("control-plane", phases::kubeadm::control_plane),
    ("workers", phases::kubeadm::workers),
    ("cni", phases::addons::cni),
    ("addons", phases::addons::module),
    ("kubeconfig", phases::kubeadm::kubeconfig),
];

/// The deployment pipeline for the chosen phases (a phase with nothing to
/// do, such as os-packages for a bundle without repositories, is left out).
pub fn pipeline(ctx: &Context) -> anyhow::Result<Pipeline> {
    let mut modules = Vec::new();
    for (name, build) in PIPELINE {
        if !ctx.phases.iter().any(|p| p == name) {
            continue;
        }
        if *name == "os-packages" && ctx.bom.os_repos.is_empty() {
            continue;
        }
        modules.push(build(ctx)?);
    }
    link(&mut modules);
    Ok(Pipeline {
        name: "install".into(),
        modules,
    })
}

/// Orders the phases: on each host a task waits for the earlier phases'
/// tasks on that host, and the cross-host gates hold (the control plane after
/// etcd's health and the loadbalancers, joins after init, the CNI and addons
/// after the control plane and workers).
fn link(modules: &mut [Module]) {
    // (module index, task, hosts) of every task, in phase order.
    let all: Vec<(usize, String, Vec<String>)> = modules
        .iter()
        .enumerate()
        .flat_map(|(k, m)| m.tasks.iter().map(move |t| (k, t.name.clone(), t.hosts.clone())))
        .collect();
    let names: Vec<String> = modules.iter().map(|m| m.name.clone()).collect();
    let gates: &[(&str, &[&str])] = &[
        ("control-plane", &["etcd", "loadbalancer", "registry"]),
        ("workers", &["control-plane", "registry"]),
        ("cni", &["control-plane", "workers"]),
        ("addons", &["control-plane", "workers", "cni"]),
        ("kubeconfig", &["control-plane", "workers", "cni", "addons"]),
    ];
    for (k, m) in modules.iter_mut().enumerate() {
        let cross: &[&str] = gates.iter().find(|(p, _)| *p == m.name).map(|(_, g)| *g).unwrap_or(&[]);
        for t in &mut m.tasks {
            for (j, task, hosts) in all.iter().filter(|(j, _, _)| *j < k) {
                if t.after.iter().any(|(a, _)| a == task) {
                    continue;
                }
                if cross.contains(&names[*j].as_str()) {
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

    #[test]
    fn phases_are_selected_and_unknown_ones_refused() -> Result<(), Box<dyn std::error::Error>> {
        let (ok, missing) = select(&["preflight".into(), "etcd".into(), "cni".into()])?;
        assert_eq!(ok, ["preflight", "etcd", "cni"]);
        assert!(missing.is_empty());
        assert!(select(&["etdc".into()]).unwrap_err().contains("unknown phase `etdc`"));
        Ok(())
    }
}

#[test]
fn the_pipeline_lists_every_phase_in_order() {
    let names: Vec<&str> = PIPELINE.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, PHASES);
}
