//! The CNI and the addons (NodeLocalDNS, MetalLB, openebs-localpv), applied
//! from the bundle's manifests with the bundle's kubectl on the first
//! control-plane node. Every image reference the bundle holds is rewritten to
//! the registry (`<registry>/<upstream-host>/<repository>`), and the settings
//! each upstream manifest leaves to the installer (pod CIDR, DNS addresses,
//! storage path) are filled in from cluster.yaml.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use kubexm_bom::image::ImageRef;
use kubexm_bom::topology::{AddonPhase, enabled_addons};

use crate::context::Inputs;
use crate::engine::files::RunWith;
use crate::engine::plan::{Module, Task};
use crate::engine::transport::shell_quote as q;

const METALLB_POOL: &str = include_str!("../../manifests/templates/metallb-pools.yaml");
/// Where applied manifests are kept on the first control-plane node.
pub const DIR: &str = "/etc/kubexm/addons";
const KUBECTL: &str = "kubectl --kubeconfig /etc/kubernetes/admin.conf";

/// The cluster DNS service address: the tenth of the service CIDR.
pub fn cluster_dns_ip(service_cidr: &str) -> String {
    let base = service_cidr.split('/').next().unwrap_or_default();
    match base.parse::<Ipv4Addr>() {
        Ok(a) => Ipv4Addr::from(u32::from(a) + 10).to_string(),
        Err(_) => "10.96.0.10".into(),
    }
}

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

/// Fills in what an upstream manifest leaves to the installer.
fn settings(addon: &str, text: &str, c: &Cluster) -> String {
    let k = &c.spec.kubernetes;
    match addon {
        "calico" => text.replace(
            "# - name: CALICO_IPV4POOL_CIDR\n            #   value: \"192.168.0.0/16\"",
            &format!("- name: CALICO_IPV4POOL_CIDR\n              value: \"{}\"", k.pod_cidr),
        ),
        "flannel" => text.replace("\"Network\": \"10.244.0.0/16\"", &format!("\"Network\": \"{}\"", k.pod_cidr)),
        "nodelocaldns" => text
            .replace("__PILLAR__LOCAL__DNS__", &c.spec.dns.nodelocaldns.ip)
            .replace("__PILLAR__DNS__DOMAIN__", &k.dns_domain)
            .replace("__PILLAR__DNS__SERVER__", &cluster_dns_ip(&k.service_cidr)),
        "openebs-localpv" => {
            let mut t = text.replace("/var/openebs/local", &c.spec.storage.base_path.display().to_string());
            if c.spec.storage.default_class && t.contains("kind: StorageClass") {
                t = t.replacen(
                    "  annotations:\n",
                    "  annotations:\n    storageclass.kubernetes.io/is-default-class: \"true\"\n",
                    1,
                );
            }
            t
        }
        _ => text.to_string(),
    }
}

/// The addons of a phase that cluster.yaml turns on, in apply order.
pub fn enabled(c: &Cluster, phase: &str) -> anyhow::Result<Vec<&'static str>> {
    let want = if phase == "cni" { AddonPhase::Cni } else { AddonPhase::Addons };
    let mut out = Vec::new();
    for a in enabled_addons(&c.spec).into_iter().filter(|a| a.phase == want) {
        if !APPLIED.contains(&a.name) {
            return Err(crate::DeployError::NotSupported(format!("the {} addon", a.name)).into());
        }
        out.push(a.name);
    }
    Ok(out)
}

/// The addons this release applies (the rest are refused by validation first).
const APPLIED: &[&str] = &["calico", "flannel", "nodelocaldns", "metallb", "openebs-localpv"];

/// The manifests of one addon, rendered: (file name, text).
pub fn render(i: &Inputs, addon: &str, registry: &str) -> anyhow::Result<Vec<(String, String)>> {
    let bundle: BTreeSet<String> = i.bom.images.iter().map(|im| im.reference.to_string()).collect();
    let mut out = Vec::new();
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
        let (text, foreign) = rewrite_images(&settings(addon, &text, i.cluster), &bundle, registry);
        for image in foreign {
            // Not in the bundle, so not pullable inside the air gap.
            tracing::warn!(
                "{addon}: {} names {image}, which the bundle does not carry; add it to bundle.extraImages",
                m.path
            );
        }
        let base = m.path.rsplit('/').next().unwrap_or("manifest.yaml");
        out.push((format!("{n:02}-{base}"), text));
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

/// The `cni` or `addons` phase on the first control-plane node.
pub fn module(i: &Inputs, phase: &str, registry: &str) -> anyhow::Result<Module> {
    let first = crate::context::first_control_plane(i.cluster)?;
    let mut tasks = Vec::new();
    let mut previous: Option<String> = None;
    for addon in enabled(i.cluster, phase)? {
        let files = render(i, addon, registry)?;
        let mut all = String::new();
        for (_, t) in &files {
            all.push_str(t);
        }
        let digest = kubexm_bundle::digest::sha256_hex(all.as_bytes());
        let stamp = format!("/var/lib/kubexm/applied/{addon}");
        let mut cmd = String::from("set -e\n");
        for (name, _) in &files {
            if addon == "metallb" && name.ends_with("address-pools.yaml") {
                // The pools are CRs: MetalLB's webhook must be up to take them.
                cmd.push_str(&format!(
                    "{KUBECTL} -n metallb-system wait --for=condition=Available deployment/controller --timeout=300s\n"
                ));
            }
            cmd.push_str(&format!("{KUBECTL} apply -f {}\n", q(&format!("{DIR}/{addon}/{name}"))));
        }
        cmd.push_str(&format!("mkdir -p /var/lib/kubexm/applied\necho {digest} > {stamp}\n"));
        let name = format!("{phase}-{addon}");
        tasks.push(Task {
            name: name.clone(),
            hosts: vec![first.clone()],
            steps: vec![Arc::new(RunWith {
                name: format!("apply-{addon}"),
                check: format!("grep -qx {digest} {stamp} 2>/dev/null"),
                files: files
                    .into_iter()
                    .map(|(n, t)| (format!("{DIR}/{addon}/{n}"), t.into_bytes(), 0o644))
                    .collect(),
                command: cmd,
                timeout: Duration::from_secs(600),
            })],
            after: previous.iter().map(|p| (p.clone(), crate::engine::plan::Scope::AllHosts)).collect(),
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

    #[test]
    fn dns_address_is_the_tenth_of_the_service_range() {
        assert_eq!(cluster_dns_ip("10.96.0.0/12"), "10.96.0.10");
        assert_eq!(cluster_dns_ip("10.233.0.0/18"), "10.233.0.10");
    }
}
