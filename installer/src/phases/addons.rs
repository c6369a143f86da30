//! The CNI and the addons (NodeLocalDNS, MetalLB, openebs-localpv), applied
//! from the bundle's manifests with the bundle's kubectl on the first
//! control-plane node. Every image reference the bundle holds is rewritten to
//! the registry (`<registry>/<upstream-host>/<repository>`), and the settings
//! each upstream manifest leaves to the installer (pod CIDR, DNS addresses,
//! storage path) are filled in from cluster.yaml by the patches declared in
//! `manifests/addon-patches.yaml`, each failing the plan when the text it
//! expects is not there. Two phases share this file: `cni` ([`cni`]) and
//! `addons` ([`module`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use kubexm_bom::image::ImageRef;
use kubexm_bom::topology::AddonPhase;
use serde::Deserialize;

use crate::context::Context;
use crate::engine::files::RunWith;
use crate::engine::plan::{Module, Scope, Step, Task};
use crate::engine::transport::shell_quote as q;
use crate::phases::kubeadm::{init_task, node_tasks};
use crate::pipelines::Phase;
use crate::waits;

use crate::paths::{ADDONS_DIR as DIR, APPLIED as APPLIED_STAMPS};

const METALLB_POOL: &str = include_str!("../../../manifests/templates/metallb-pools.yaml");
const PATCHES: &str = include_str!("../../../manifests/addon-patches.yaml");

/// Rewrites every `image:` whose reference the bundle holds to `registry`.
/// Returns the text and the references left alone (not in the bundle).
pub fn rewrite_images(text: &str, bundle: &BTreeSet<String>, registry: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(text.len() + 256);
    let mut foreign = Vec::new();
    for line in text.split_inclusive('\n') {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let (dash, rest) = match body.strip_prefix("- ") {
            Some(r) => ("- ", r.trim_start()),
            None => ("", body),
        };
        let Some(value) = rest.strip_prefix("image:") else {
            out.push_str(line);
            continue;
        };
        let raw = value.trim().trim_matches(|c| c == '"' || c == '\'');
        match ImageRef::parse(raw) {
            Ok(r) if bundle.contains(&r.to_string()) => {
                let mut new = format!("{registry}/{}/{}", r.registry, r.repository);
                if let Some(t) = &r.tag {
                    new.push(':');
                    new.push_str(t);
                }
                if let Some(d) = &r.digest {
                    new.push('@');
                    new.push_str(d);
                }
                let nl = if line.ends_with('\n') { "\n" } else { "" };
                out.push_str(&format!("{indent}{dash}image: \"{new}\"{nl}"));
            }
            _ => {
                if !raw.is_empty() && !raw.starts_with(registry) {
                    foreign.push(raw.to_string());
                }
                out.push_str(line);
            }
        }
    }
    (out, foreign)
}

/// One declared patch of an upstream manifest (`manifests/addon-patches.yaml`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Patch {
    find: String,
    replace: String,
    #[serde(default)]
    when: Option<String>,
    #[serde(default)]
    within: Option<String>,
    #[serde(default)]
    once: bool,
}

/// The declared patches, by addon.
fn patches() -> anyhow::Result<BTreeMap<String, Vec<Patch>>> {
    serde_saphyr::from_str(PATCHES).map_err(|e| anyhow::anyhow!("manifests/addon-patches.yaml: {e}"))
}

/// Fills in what an addon's upstream manifests (file name, text) leave to
/// the installer; a patch whose text none of them holds fails, naming it.
fn settings(addon: &str, manifests: &mut [(String, String)], c: &Cluster, cluster_dns: &str) -> anyhow::Result<()> {
    let k = &c.spec.kubernetes;
    let path = c.spec.storage.base_path.display().to_string();
    let values = [
        ("POD_CIDR", k.pod_cidr.as_str()),
        ("DNS_DOMAIN", k.dns_domain.as_str()),
        ("CLUSTER_DNS", cluster_dns),
        ("NODELOCALDNS_IP", c.spec.dns.nodelocaldns.ip.as_str()),
        ("STORAGE_PATH", path.as_str()),
    ];
    for p in patches()?.remove(addon).unwrap_or_default() {
        let on = match p.when.as_deref() {
            None => true,
            Some("storage.defaultClass") => c.spec.storage.default_class,
            Some(other) => anyhow::bail!("manifests/addon-patches.yaml: {addon}: unknown `when: {other}`"),
        };
        if !on {
            continue;
        }
        let replace = crate::template::render(&format!("addon-patches.yaml ({addon})"), &p.replace, &values, &[])?;
        let mut found = false;
        for (_, text) in manifests.iter_mut() {
            if p.within.as_ref().is_some_and(|w| !text.contains(w.as_str())) || !text.contains(&p.find) {
                continue;
            }
            found = true;
            *text = if p.once {
                text.replacen(&p.find, &replace, 1)
            } else {
                text.replace(&p.find, &replace)
            };
        }
        if !found {
            let names: Vec<&str> = manifests.iter().map(|(n, _)| n.as_str()).collect();
            return Err(crate::DeployError::Config(format!(
                "{addon}: none of its manifests ({}) holds {:?}, which kubexm replaces to apply cluster.yaml's settings; \
                 the upstream manifest changed: update manifests/addon-patches.yaml",
                names.join(", "),
                p.find
            ))
            .into());
        }
    }
    Ok(())
}

/// The addons of a phase that cluster.yaml turns on, in apply order.
pub fn enabled(topo: &kubexm_bom::topology::Topology, want: AddonPhase) -> anyhow::Result<Vec<&'static str>> {
    let mut out = Vec::new();
    for a in topo.addons.iter().filter(|a| a.phase == want) {
        if !APPLIED.contains(&a.name) {
            return Err(crate::DeployError::NotSupported(format!("the {} addon", a.name)).into());
        }
        out.push(a.name);
    }
    Ok(out)
}

/// The nodes the install waits for: every node, or the control-plane nodes
/// only with `kubernetes.waitForWorkers: false`.
pub(crate) fn waited_nodes(c: &Cluster) -> Vec<String> {
    let g = &c.spec.role_groups;
    let workers = c.spec.kubernetes.wait_for_workers.unwrap_or(true);
    let nodes: BTreeSet<String> = g.control_plane.iter().chain(g.worker.iter().filter(|_| workers)).cloned().collect();
    nodes.into_iter().collect()
}

/// A short tag of the nodes a wait waits for, in its step's name: when the
/// cluster gains a node (`apply`), the wait is a new step and waits for it
/// too, instead of one an earlier job already did.
fn nodes_tag(nodes: &[String]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(nodes.join(",").as_bytes());
    hex::encode(&digest[..4])
}

/// How long an addon's workloads, the nodes and CoreDNS may take to be ready.
const WORKLOAD_WAIT: u64 = 300;

/// The addons this release applies (the rest are refused by validation first).
const APPLIED: &[&str] = &["calico", "flannel", "nodelocaldns", "metallb", "openebs-localpv"];

/// The manifests of one addon, rendered: (file name, text).
pub fn render(i: &Context, addon: &str, registry: &str) -> anyhow::Result<Vec<(String, String)>> {
    let bundle: BTreeSet<String> = i.bom.images.iter().map(|im| im.reference.to_string()).collect();
    let mut upstream = Vec::new();
    let items: Vec<_> = i.bom.manifests.iter().filter(|m| m.addon == addon).collect();
    if items.is_empty() {
        return Err(crate::DeployError::Config(format!(
            "the bundle has no manifests for {addon}; rebuild it with this cluster.yaml"
        ))
        .into());
    }
    for (n, m) in items.iter().enumerate() {
        let text = match i.members {
            Some(members) => members
                .get(&m.path)
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .ok_or_else(|| anyhow::anyhow!("the bundle has no member {}", m.path))?,
            None => fs_err::read_to_string(i.bundle_dir.join(&m.path))?,
        };
        let base = m.path.rsplit('/').next().unwrap_or("manifest.yaml");
        upstream.push((format!("{n:02}-{base}"), text));
    }
    settings(addon, &mut upstream, i.cluster, &i.topo.cluster_dns)?;
    let mut out = Vec::new();
    for ((name, text), m) in upstream.into_iter().zip(&items) {
        let (text, foreign) = rewrite_images(&text, &bundle, registry);
        for image in foreign {
            // Not in the bundle, so not pullable inside the air gap.
            tracing::warn!(
                "{addon}: {} names {image}, which the bundle does not carry; add it to bundle.extraImages",
                m.path
            );
        }
        out.push((name, text));
    }
    if addon == "metallb" {
        let pools: Vec<String> = i
            .cluster
            .spec
            .load_balancer_service
            .metallb
            .address_pools
            .iter()
            .map(|p| {
                crate::template::render(
                    "metallb-pools.yaml",
                    METALLB_POOL,
                    &[
                        ("NAME", &p.name),
                        (
                            "ADDRESSES",
                            &p.addresses.iter().map(|a| format!("    - {a}")).collect::<Vec<_>>().join("\n"),
                        ),
                    ],
                    &[],
                )
            })
            .collect::<Result<_, _>>()?;
        if !pools.is_empty() {
            out.push((format!("{:02}-address-pools.yaml", out.len()), pools.join("---\n")));
        }
    }
    Ok(out)
}

/// `--server-dry-run`: an addon's rendered manifests checked by the API
/// server without changing what runs. What the check itself needs exists for
/// real: the CustomResourceDefinitions and Namespaces the manifests define
/// are applied (server-side, so a re-run is a no-op) and the CRDs waited for,
/// since a resource of a dry-run CRD or in a dry-run Namespace cannot be
/// checked. Everything else goes through `kubectl apply --dry-run=server`:
/// admission, validation and defaulting run, nothing is stored. No stamp is
/// written, so the step runs every time.
fn server_dry_run(addon: &str, files: &[(String, String)], kubectl: &str) -> RunWith {
    let dir = format!("{DIR}/server-dry-run/{addon}");
    let mut out = Vec::new();
    let mut cmd = String::from("set -e\n");
    for (name, text) in files {
        let (mut crds, mut namespaces, mut rest) = (String::new(), String::new(), String::new());
        for (doc, v) in waits::documents(text) {
            let into = match v.get("kind").and_then(|k| k.as_str()) {
                Some("CustomResourceDefinition") => &mut crds,
                Some("Namespace") => &mut namespaces,
                _ => &mut rest,
            };
            into.push_str("---\n");
            into.push_str(doc.trim_start_matches('\n'));
            into.push('\n');
        }
        let stem = name.trim_end_matches(".yaml").trim_end_matches(".yml");
        for (part, text) in [("namespaces", namespaces), ("crds", crds), ("checked", rest)] {
            if text.is_empty() {
                continue;
            }
            let path = format!("{dir}/{stem}.{part}.yaml");
            cmd.push_str(&match part {
                "checked" => format!("{kubectl} apply --dry-run=server -f {}\n", q(&path)),
                "crds" => format!(
                    "{kubectl} apply --server-side --force-conflicts -f {p}\n{kubectl} wait --for=condition=Established --timeout=120s -f {p}\n",
                    p = q(&path)
                ),
                _ => format!("{kubectl} apply --server-side --force-conflicts -f {}\n", q(&path)),
            });
            out.push((path, text.into_bytes(), 0o644));
        }
    }
    RunWith {
        name: format!("server-dry-run-{addon}"),
        check: "false".into(),
        files: out,
        command: cmd,
        timeout: Duration::from_secs(300),
    }
}

/// The `cni` phase: the network plugin (and multus) on the first control-plane node.
pub fn cni(i: &Context) -> anyhow::Result<Module> {
    phase(i, "cni", AddonPhase::Cni)
}

/// The `addons` phase: NodeLocalDNS, MetalLB, the storage provider.
pub fn module(i: &Context) -> anyhow::Result<Module> {
    phase(i, "addons", AddonPhase::Addons)
}

fn phase(i: &Context, phase: &str, want: AddonPhase) -> anyhow::Result<Module> {
    let first = i.topo.first_control_plane.clone();
    let registry = i.registry()?.address.clone();
    let kubectl = waits::kubectl();
    let nodes = waited_nodes(i.cluster);
    let tag = nodes_tag(&nodes);
    let mut tasks = Vec::new();
    let mut previous: Option<String> = None;
    for addon in enabled(&i.topo, want)? {
        let files = render(i, addon, &registry)?;
        if i.server_dry_run {
            let name = format!("{phase}-{addon}");
            tasks.push(Task {
                name: name.clone(),
                hosts: vec![first.clone()],
                steps: vec![Arc::new(server_dry_run(addon, &files, &kubectl))],
                after: previous.iter().map(|p| (p.clone(), Scope::AllHosts)).collect(),
            });
            previous = Some(name);
            continue;
        }
        let mut all = String::new();
        for (_, t) in &files {
            all.push_str(t);
        }
        let digest = kubexm_bundle::digest::sha256_hex(all.as_bytes());
        let stamp = format!("{APPLIED_STAMPS}/{addon}");
        let mut cmd = String::from("set -e\n");
        for (name, _) in &files {
            if addon == "metallb" && name.ends_with("address-pools.yaml") {
                // The pools are CRs: MetalLB's webhook must be up to take them.
                cmd.push_str(&format!(
                    "{kubectl} -n metallb-system wait --for=condition=Available deployment/controller --timeout=300s\n"
                ));
            }
            cmd.push_str(&format!("{kubectl} apply -f {}\n", q(&format!("{DIR}/{addon}/{name}"))));
        }
        // The stamp names the cluster it was applied to (kube-system's uid):
        // a cluster made anew under it (kubeadm reset by hand, then an
        // install) gets the addon again. No uid (the API server does not
        // answer) never matches, and the apply fails rather than write one.
        let uid = format!("uid=$({kubectl} get namespace kube-system -o jsonpath='{{.metadata.uid}}' --request-timeout=10s 2>/dev/null)");
        cmd.push_str(&format!(
            "{uid} || uid=\n[ -n \"$uid\" ] || {{ echo \"{addon} applied, but the API server did not give kube-system's uid to record it; check it answers ({kubectl} get namespace kube-system) and run again\" >&2; exit 1; }}\n\
             mkdir -p {APPLIED_STAMPS}\necho \"{digest} $uid\" > {stamp}\n"
        ));
        let name = format!("{phase}-{addon}");
        let mut steps: Vec<Arc<dyn Step>> = vec![Arc::new(RunWith {
            name: format!("apply-{addon}"),
            check: format!("{uid} && [ -n \"$uid\" ] && [ \"$(cat {stamp} 2>/dev/null)\" = \"{digest} $uid\" ]"),
            files: files
                .into_iter()
                .map(|(n, t)| (format!("{DIR}/{addon}/{n}"), t.into_bytes(), 0o644))
                .collect(),
            command: cmd,
            timeout: Duration::from_secs(600),
        })];
        // Bounded waits: the addon's Deployments roll out and its
        // DaemonSets run on every node waited for; after the CNI those nodes
        // are Ready and CoreDNS (kubeadm's) is available.
        for (kind, ns, workload) in waits::workloads(&all) {
            let (probe, name) = if kind == "daemonset" {
                (
                    waits::daemonset_on(&ns, &workload, &nodes),
                    format!("{addon}-{workload}-ready-{tag}"),
                )
            } else {
                (waits::deployment_available(&ns, &workload), format!("{addon}-{workload}-ready"))
            };
            steps.push(waits::wait(
                &name,
                &format!("{addon}'s {kind} {ns}/{workload}"),
                &probe,
                WORKLOAD_WAIT,
            ));
        }
        if want == AddonPhase::Cni {
            steps.push(waits::wait(
                &format!("nodes-ready-{tag}"),
                "nodes",
                &waits::nodes_ready(&nodes),
                WORKLOAD_WAIT,
            ));
            steps.push(waits::wait(
                "coredns-ready",
                "CoreDNS",
                &waits::deployment_available("kube-system", "coredns"),
                WORKLOAD_WAIT,
            ));
        }
        let mut after: Vec<(String, Scope)> = previous.iter().map(|p| (p.clone(), Scope::AllHosts)).collect();
        if want == AddonPhase::Cni && previous.is_none() {
            // The network plugin goes on right after the init, as kubeadm's
            // own guide has it: its pods start on each node as the node
            // joins. Its waits (on every node) wait for every join.
            let apply = format!("{name}-apply");
            let mut apply_after = Vec::new();
            if i.has(Phase::ControlPlane) {
                apply_after.push((init_task(&first), Scope::AllHosts));
            }
            tasks.push(Task {
                name: apply.clone(),
                hosts: vec![first.clone()],
                steps: vec![steps.remove(0)],
                after: apply_after,
            });
            after.push((apply, Scope::AllHosts));
            after.extend(node_tasks(i).into_iter().map(|t| (t, Scope::AllHosts)));
        }
        tasks.push(Task {
            name: name.clone(),
            hosts: vec![first.clone()],
            steps,
            after,
        });
        previous = Some(name);
    }
    Ok(Module { name: phase.into(), tasks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_in_the_bundle_point_at_the_registry_and_others_are_reported() {
        let bundle: BTreeSet<String> = [
            "docker.io/calico/cni:v3.28.1".to_string(),
            "registry.k8s.io/dns/k8s-dns-node-cache:1.23.1".into(),
        ]
        .into_iter()
        .collect();
        let text = "spec:\n  containers:\n    - image: calico/cni:v3.28.1\n      name: a\n    - name: b\n      image: \"registry.k8s.io/dns/k8s-dns-node-cache:1.23.1\"\n    - image: quay.io/other/x:1\n";
        let (out, foreign) = rewrite_images(text, &bundle, "10.0.0.1:5000");
        assert!(
            out.contains("    - image: \"10.0.0.1:5000/docker.io/calico/cni:v3.28.1\"\n      name: a"),
            "{out}"
        );
        assert!(
            out.contains("      image: \"10.0.0.1:5000/registry.k8s.io/dns/k8s-dns-node-cache:1.23.1\""),
            "{out}"
        );
        assert_eq!(foreign, ["quay.io/other/x:1"]);
    }

    /// CRDs and Namespaces are created for real (the check of what uses them
    /// needs them), everything else only checked; each kind in its own file.
    #[test]
    fn a_server_dry_run_creates_crds_and_namespaces_and_checks_the_rest() -> Result<(), Box<dyn std::error::Error>> {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: metallb-system}\n---\n\
                    apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: ipaddresspools.metallb.io}\n\
                    --- # a comment\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: controller, namespace: metallb-system}\n---\n";
        let step = server_dry_run("metallb", &[("00-metallb-native.yaml".into(), text.into())], "kubectl");
        let files: Vec<(&str, String)> = step
            .files
            .iter()
            .map(|(p, t, _)| (p.as_str(), String::from_utf8_lossy(t).into_owned()))
            .collect();
        let d = format!("{DIR}/server-dry-run/metallb/00-metallb-native");
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[0].0, format!("{d}.namespaces.yaml"));
        assert!(files[0].1.contains("kind: Namespace") && !files[0].1.contains("Deployment"));
        assert_eq!(files[1].0, format!("{d}.crds.yaml"));
        assert!(files[1].1.contains("ipaddresspools.metallb.io") && !files[1].1.contains("Namespace"));
        assert_eq!(files[2].0, format!("{d}.checked.yaml"));
        assert!(files[2].1.contains("kind: Deployment") && !files[2].1.contains("CustomResourceDefinition"));
        let c = &step.command;
        let (ns, crd, wait, check) = (
            c.find(&format!("kubectl apply --server-side --force-conflicts -f '{d}.namespaces.yaml'"))
                .ok_or("command missing")?,
            c.find(&format!("kubectl apply --server-side --force-conflicts -f '{d}.crds.yaml'"))
                .ok_or("command missing")?,
            c.find(&format!(
                "kubectl wait --for=condition=Established --timeout=120s -f '{d}.crds.yaml'"
            ))
            .ok_or("command missing")?,
            c.find(&format!("kubectl apply --dry-run=server -f '{d}.checked.yaml'"))
                .ok_or("command missing")?,
        );
        assert!(ns < crd && crd < wait && wait < check, "{c}");
        assert_eq!(step.check, "false", "a server dry run always runs");
        Ok(())
    }

    #[test]
    fn addon_patches_fill_settings_and_fail_loudly_when_upstream_changed() -> Result<(), Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(format!("{}/../examples/ha.yaml", env!("CARGO_MANIFEST_DIR")))?;
        let c = kubexm_bom::config::load_str(&text, "ha.yaml", &kubexm_bom::catalog::Catalog::builtin()?)?;
        let upstream = "          env:\n            # - name: CALICO_IPV4POOL_CIDR\n            #   value: \"192.168.0.0/16\"\n";
        let mut m = vec![("00-calico.yaml".to_string(), upstream.to_string())];
        settings("calico", &mut m, &c, "10.96.0.10")?;
        assert!(
            m[0].1.contains(&format!(
                "- name: CALICO_IPV4POOL_CIDR\n              value: \"{}\"",
                c.spec.kubernetes.pod_cidr
            )),
            "{}",
            m[0].1
        );
        let mut changed = vec![("00-calico.yaml".to_string(), "env: []\n".to_string())];
        let err = settings("calico", &mut changed, &c, "10.96.0.10").unwrap_err().to_string();
        assert!(err.contains("calico: none of its manifests (00-calico.yaml) holds"), "{err}");
        assert!(err.contains("update manifests/addon-patches.yaml"), "{err}");
        // Every declared patch parses and names a known switch.
        assert!(patches()?.contains_key("openebs-localpv"));
        Ok(())
    }
}
