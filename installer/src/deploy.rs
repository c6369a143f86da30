//! Deployment phases: each a module of idempotent steps the engine runs.
//!
//! Every phase of [`PHASES`] is built: preflight (facts-based refusals, the
//! registry CA, timezone and NTP), os-packages, the registry service, etcd in
//! binary mode (our PKI, systemd units, a healthy cluster), the loadbalancer
//! (modes A and D, in `endpoint`), containerd, the control plane and workers
//! (kubeadm, in `kubeadm`), the CNI and addons (in `addons`) and the
//! kubeconfig hand-over. This file assembles them into the install pipeline
//! with their ordering rules. Options a phase does not implement are refused
//! while planning with [`crate::DeployError::NotSupported`] (exit 8).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::Bom;
use kubexm_bom::config::Cluster;

pub use crate::context::{HOST_CA, Inputs, address_of, first_control_plane, install_component, registry_address, registry_host};
use crate::engine::facts::HostFacts;
use crate::engine::files::{PutFiles, RunWith};
use crate::engine::plan::{Module, Pipeline, Scope, Step, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::os_packages::{repo_for, roles_of};
use crate::template::render;

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

/// What preflight refuses, one line per host and reason.
pub fn preflight(cluster: &Cluster, bom: &Bom, facts: &[HostFacts], phases: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut names: HashMap<&str, Vec<&str>> = HashMap::new();
    for f in facts {
        names.entry(f.hostname.as_str()).or_default().push(f.host.as_str());
    }
    for (hostname, hosts) in names.iter().filter(|(_, h)| h.len() > 1) {
        out.push(format!(
            "hosts {} share the hostname {hostname}; every node needs its own",
            hosts.join(", ")
        ));
    }
    let max_skew = i64::from(cluster.spec.preflight.max_clock_skew_seconds) * 1000;
    for f in facts {
        if f.os_id != "debian" && f.os_id != "ubuntu" {
            out.push(format!(
                "{}: OS {} {} is not supported (Debian-family hosts only)",
                f.host, f.os_id, f.os_version
            ));
        }
        if !bom.arches.contains(&f.arch) {
            out.push(format!(
                "{}: arch {} has no binaries in the bundle (it has {}); add it to bundle.arches and rebuild",
                f.host,
                f.arch,
                bom.arches.join(", ")
            ));
        }
        if f.clock_offset_ms.abs() > max_skew {
            out.push(format!(
                "{}: clock is {} ms off the installer's (limit {} s); fix NTP on the host",
                f.host,
                f.clock_offset_ms,
                max_skew / 1000
            ));
        }
        if phases.iter().any(|p| p == "os-packages")
            && !bom.os_repos.is_empty()
            && let Err(e) = repo_for(f, &bom.os_repos)
        {
            out.push(e);
        }
        // Leftovers of a Kubernetes install kubexm did not make (no kubexm stamps).
        if f.managed.is_empty()
            && !f.leftovers.is_empty()
            && cluster.spec.preflight.leftovers == kubexm_bom::config::model::LeftoverPolicy::Fail
        {
            out.push(format!(
                "{}: leftovers of an earlier install kubexm did not make: {}; remove them (kubeadm reset, or kubexm-install reset if it was kubexm), or set preflight.leftovers: warn",
                f.host,
                f.leftovers.join(" ")
            ));
        }
        let roles = roles_of(cluster, &f.host);
        if phases.iter().any(|p| p == "etcd") && roles.iter().any(|r| r == "etcd") && !f.managed.iter().any(|l| l == "etcd") {
            for port in [2379u16, 2380] {
                if f.ports.contains(&port) {
                    out.push(format!(
                        "{}: port {port} (etcd) is already in use by something kubexm did not install",
                        f.host
                    ));
                }
            }
        }
    }
    out.sort();
    out
}

/// The deployment pipeline for the chosen phases.
pub fn pipeline(i: &Inputs) -> anyhow::Result<Pipeline> {
    let hosts: Vec<String> = i.cluster.spec.hosts.iter().map(|h| h.name.clone()).collect();
    let mut modules = Vec::new();
    let has = |p: &str| i.phases.iter().any(|x| x == p);
    if has("preflight") {
        modules.push(Module {
            name: "preflight".into(),
            tasks: vec![Task {
                name: "trust-ca".into(),
                hosts: hosts.clone(),
                steps: vec![Arc::new(PutFiles {
                    name: "registry-ca".into(),
                    files: vec![(HOST_CA.into(), i.ca_pem.to_vec(), 0o644)],
                    then: None,
                })],
                after: vec![],
            }],
        });
    }
    if has("preflight") {
        let sys = &i.cluster.spec.system;
        let mut steps: Vec<Arc<dyn Step>> = Vec::new();
        if let Some(tz) = &sys.timezone {
            let zone = format!("/usr/share/zoneinfo/{tz}");
            steps.push(Arc::new(Shell::new(
                "timezone",
                Some(&format!(
                    "[ \"$(readlink -f /etc/localtime)\" = \"$(readlink -f {z})\" ]",
                    z = q(&zone)
                )),
                &format!(
                    "test -f {z} || {{ echo 'timezone {tz} is unknown on this host (no {zone})' >&2; exit 1; }}; \
                     ln -sf {z} /etc/localtime && echo {t} > /etc/timezone",
                    z = q(&zone),
                    t = q(tz)
                ),
            )));
        }
        if !sys.ntp_servers.is_empty() {
            let conf = format!(
                "# kubexm: time servers from cluster.yaml.\n[Time]\nNTP={}\n",
                sys.ntp_servers.join(" ")
            );
            steps.push(Arc::new(RunWith {
                name: "ntp".into(),
                check: format!(
                    "[ \"$(cat /etc/systemd/timesyncd.conf.d/kubexm.conf 2>/dev/null)\" = {} ]",
                    q(conf.trim_end())
                ),
                files: vec![("/etc/systemd/timesyncd.conf.d/kubexm.conf".into(), conf.clone().into_bytes(), 0o644)],
                command: "systemctl cat systemd-timesyncd >/dev/null 2>&1 || { echo 'no systemd-timesyncd to configure NTP with; add systemd-timesyncd to bundle.osPackages.extra' >&2; exit 1; }; \
                          systemctl enable -q systemd-timesyncd 2>/dev/null; systemctl restart systemd-timesyncd"
                    .into(),
                timeout: Duration::from_secs(60),
            }));
        }
        if !steps.is_empty() {
            modules[0].tasks.push(Task {
                name: "time".into(),
                hosts: hosts.clone(),
                steps,
                after: vec![],
            });
        }
    }
    if has("os-packages") && !i.bom.os_repos.is_empty() {
        let after: &[&str] = if has("preflight") { &["trust-ca"] } else { &[] };
        modules.push(crate::os_packages::module(
            i.cluster,
            &hosts,
            &i.bom.os_repos,
            i.file_server,
            Some(HOST_CA.into()),
            after,
        ));
    }
    if has("registry") {
        modules.push(crate::phases::registry::module(i)?);
    }
    if has("etcd") {
        modules.push(crate::phases::etcd::module(i)?);
    }
    if has("loadbalancer") {
        modules.push(crate::endpoint::module(i.cluster)?);
    }
    if has("containerd") {
        modules.push(crate::phases::containerd::module(i, &hosts, has("registry"))?);
    }
    if has("control-plane") || has("workers") {
        let k = crate::kubeadm::KubePki::ensure(i.pki)?;
        if has("control-plane") {
            modules.push(crate::kubeadm::control_plane_module(i, &k)?);
        }
        if has("workers") {
            modules.push(crate::kubeadm::workers_module(i, &k)?);
        }
    }
    let registry = registry_address(i.cluster).unwrap_or_default();
    for phase in ["cni", "addons"] {
        if has(phase) {
            modules.push(crate::addons::module(i, phase, &registry)?);
        }
    }
    if has("kubeconfig") {
        modules.push(crate::kubeadm::handover_module(i)?);
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

const RESET: &str = include_str!("../../manifests/templates/reset.sh");

/// `reset`: every host back to before kubexm (packages stay).
pub fn reset_pipeline(cluster: &Cluster) -> Result<Pipeline, crate::template::Unfilled> {
    let data = q(&cluster.spec.etcd.data_dir.display().to_string());
    let leftovers = format!(
        "for p in /etc/kubexm /var/lib/kubexm /etc/kubernetes /etc/containerd /usr/local/bin/kubelet /usr/local/bin/etcd \
         /etc/systemd/system/kubexm-etcd.service /etc/systemd/system/kubelet.service {data}; do [ -e \"$p\" ] && exit 1; done; \
         ! grep -q '# kubexm control-plane endpoint' /etc/hosts"
    );
    let mut step = Shell::new("reset", Some(&leftovers), &render("reset.sh", RESET, &[("ETCD_DATA", &data)], &[])?);
    step.timeout = Duration::from_secs(300);
    let step: Arc<dyn Step> = Arc::new(step);
    Ok(Pipeline {
        name: "reset".into(),
        modules: vec![Module {
            name: "reset".into(),
            tasks: vec![Task {
                name: "reset".into(),
                hosts: cluster.spec.hosts.iter().map(|h| h.name.clone()).collect(),
                steps: vec![step],
                after: vec![],
            }],
        }],
    })
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

    #[test]
    fn preflight_names_each_host_and_reason() -> Result<(), Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(format!("{}/../examples/ha.yaml", env!("CARGO_MANIFEST_DIR")))?;
        let catalog = kubexm_bom::catalog::Catalog::builtin()?;
        let cluster = kubexm_bom::config::load_str(&text, "ha.yaml", &catalog)?;
        let bom = Bom {
            arches: vec!["amd64".into()],
            ..Default::default()
        };
        let host = |name: &str, hostname: &str, arch: &str, skew: i64, ports: Vec<u16>| HostFacts {
            host: name.into(),
            hostname: hostname.into(),
            os_id: "debian".into(),
            arch: arch.into(),
            clock_offset_ms: skew,
            ports,
            ..Default::default()
        };
        let etcd = cluster.spec.role_groups.etcd[0].clone();
        let facts = [
            host("a", "same", "amd64", 0, vec![]),
            host("b", "same", "arm64", 0, vec![]),
            host("c", "c", "amd64", 600_000, vec![]),
            host(&etcd, &etcd, "amd64", 0, vec![2379]),
            HostFacts {
                leftovers: vec!["/etc/kubernetes/manifests".into()],
                ..host("d", "d", "amd64", 0, vec![])
            },
        ];
        let r = preflight(&cluster, &bom, &facts, &["preflight".into(), "etcd".into()]);
        let all = r.join("\n");
        assert!(all.contains("hosts a, b share the hostname same"), "{all}");
        assert!(all.contains("b: arch arm64 has no binaries in the bundle"), "{all}");
        assert!(all.contains("c: clock is 600000 ms off"), "{all}");
        assert!(all.contains(&format!("{etcd}: port 2379 (etcd) is already in use")), "{all}");
        assert!(
            all.contains("d: leftovers of an earlier install kubexm did not make: /etc/kubernetes/manifests"),
            "{all}"
        );
        Ok(())
    }
}
