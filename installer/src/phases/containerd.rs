//! The containerd phase: containerd, runc, crictl and the CNI plugins on
//! every node, pulling through the bundle's registry.

use std::sync::Arc;

use crate::context::{Context, HOST_CA, install_component};
use crate::engine::files::PutFiles;
use crate::engine::plan::{Module, Scope, Step, Task};
use crate::engine::steps::Shell;
use crate::paths::{CONTAINERD_CERTS_D, CONTAINERD_CONFIG as CONTAINERD_CONFIG_PATH, CONTAINERD_UNIT as CONTAINERD_UNIT_PATH};
use crate::paths::{REGISTRY_CLIENT_CERT, REGISTRY_CLIENT_KEY};
use crate::template::render;

const CONTAINERD_CONFIG: &str = include_str!("../../../manifests/templates/containerd-config.toml");
/// containerd 2.x's own layout (config version 3: the CRI plugin split into
/// images and runtime).
const CONTAINERD_CONFIG_V3: &str = include_str!("../../../manifests/templates/containerd-config-v3.toml");
const CONTAINERD_UNIT: &str = include_str!("../../../manifests/templates/containerd.service");

/// containerd on every node from the bundle's binaries for its arch, with
/// runc, crictl and the CNI plugins; `config.toml` with `config_path`, a
/// `hosts.toml` per upstream registry pointing at the bundle's registry, the
/// sandbox image from the bundle, and a systemd unit.
pub fn module(i: &Context) -> anyhow::Result<Module> {
    // registry.mode external is refused there, as "not supported yet".
    let registry = i.registry()?.address.clone();
    let hosts: Vec<String> = i.cluster.spec.hosts.iter().map(|h| h.name.clone()).collect();
    let after_registry = i.has(crate::pipelines::Phase::Registry);
    let client_auth = i.cluster.spec.registry.client_auth;
    let target = crate::hosts::Target {
        registry: registry.clone(),
        prefix: None,
        flatten: false,
        ca: Some(HOST_CA.into()),
        plain_http: false,
        client: client_auth.then(|| (REGISTRY_CLIENT_CERT.to_string(), REGISTRY_CLIENT_KEY.to_string())),
    };
    let upstreams: std::collections::BTreeSet<String> = i.bom.images.iter().map(|im| im.reference.registry.clone()).collect();
    let mut files: Vec<(String, Vec<u8>, u32)> = upstreams
        .iter()
        .map(|u| {
            (
                format!("{CONTAINERD_CERTS_D}/{u}/hosts.toml"),
                crate::hosts::render(u, &target).into_bytes(),
                0o644,
            )
        })
        .collect();
    // The registry itself, for manifests whose images were rewritten to it.
    let mut own = format!(
        "# Written by kubexm: the kubexm registry, trusted by its CA.\nserver = \"https://{registry}\"\n\n[host.\"https://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{HOST_CA}\"\n"
    );
    if client_auth {
        own.push_str(&format!("  client = [[\"{REGISTRY_CLIENT_CERT}\", \"{REGISTRY_CLIENT_KEY}\"]]\n"));
    }
    files.push((format!("{CONTAINERD_CERTS_D}/{registry}/hosts.toml"), own.into_bytes(), 0o644));
    let sandbox = i
        .bom
        .images
        .iter()
        .find(|im| im.reference.repository.ends_with("/pause") || im.reference.repository == "pause")
        .map(|im| im.reference.to_string())
        .ok_or_else(|| anyhow::anyhow!("the bundle has no pause image for the sandbox"))?;
    let version = i
        .bom
        .files
        .iter()
        .find(|f| f.component == "containerd")
        .map(|f| f.version.clone())
        .unwrap_or_default();
    let config = Config {
        version: &version,
        sandbox: &sandbox,
        restrict_oom_score_adj: i.cluster.spec.container_runtime.restrict_oom_score_adj,
        systemd_cgroup: matches!(
            i.cluster.spec.kubernetes.kubelet.cgroup_driver,
            kubexm_bom::config::model::CgroupDriver::Systemd
        ),
    };
    files.push((CONTAINERD_CONFIG_PATH.into(), config.render()?.into_bytes(), 0o644));
    files.push((CONTAINERD_UNIT_PATH.into(), CONTAINERD_UNIT.as_bytes().to_vec(), 0o644));
    let mut tasks = Vec::new();
    for h in &hosts {
        let mut steps: Vec<Arc<dyn Step>> = Vec::new();
        for component in ["runc", "cni-plugins", "crictl", "containerd"] {
            let file = i.bundle_file(h, component)?;
            steps.extend(install_component(file, i.bundle_dir, i.file_server));
        }
        let mut files = files.clone();
        // Its own client certificate for the registry, beside the hosts.toml files.
        if let Some(c) = super::registry::client_cert(i.pki, i.cluster, h)? {
            files.push((REGISTRY_CLIENT_CERT.into(), c.cert_pem.into_bytes(), 0o644));
            files.push((REGISTRY_CLIENT_KEY.into(), c.key_pem.into_bytes(), 0o600));
        }
        steps.push(Arc::new(PutFiles {
            name: "containerd-config".into(),
            files,
            then: Some("systemctl daemon-reload && systemctl enable -q containerd && systemctl restart containerd".into()),
        }));
        steps.push(Arc::new(Shell::new(
            "containerd-running",
            Some("systemctl is-active -q containerd"),
            "systemctl start containerd",
        )));
        tasks.push(Task {
            name: format!("containerd-{h}"),
            hosts: vec![h.clone()],
            steps,
            after: if after_registry {
                vec![("registry".into(), Scope::AllHosts)]
            } else {
                vec![]
            },
        });
    }
    Ok(Module {
        name: "containerd".into(),
        tasks,
    })
}

/// What `config.toml` says, for the containerd `version` the bundle holds.
struct Config<'a> {
    version: &'a str,
    sandbox: &'a str,
    restrict_oom_score_adj: bool,
    systemd_cgroup: bool,
}

impl Config<'_> {
    /// containerd 1.x reads config version 2; 2.x version 3 (2.0 still takes
    /// a single CNI `bin_dir`, 2.1 and later `bin_dirs`). A version that does
    /// not parse is taken as 1.x, what kubexm wrote before 2.x existed.
    fn render(&self) -> anyhow::Result<String> {
        let v = self.version.trim_start_matches('v');
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        let flag = |b: bool| if b { "true" } else { "false" };
        let mut values = vec![
            ("SANDBOX_IMAGE", self.sandbox),
            ("RESTRICT_OOM_SCORE_ADJ", flag(self.restrict_oom_score_adj)),
            ("VERSION", self.version),
            ("SYSTEMD_CGROUP", flag(self.systemd_cgroup)),
        ];
        let (name, template) = if major >= 2 {
            let dirs = if minor >= 1 || major > 2 {
                "bin_dirs = [\"/opt/cni/bin\"]"
            } else {
                "bin_dir = \"/opt/cni/bin\""
            };
            values.push(("CNI_BIN_DIRS", dirs));
            ("containerd-config-v3.toml", CONTAINERD_CONFIG_V3)
        } else {
            ("containerd-config.toml", CONTAINERD_CONFIG)
        };
        Ok(render(name, template, &values, &[])?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(version: &str) -> anyhow::Result<String> {
        Config {
            version,
            sandbox: "registry.k8s.io/pause:3.10",
            restrict_oom_score_adj: true,
            systemd_cgroup: false,
        }
        .render()
    }

    /// containerd 1.x gets config version 2 with the one CRI plugin; 2.x
    /// version 3 with the images and runtime plugins, the same sandbox
    /// image, registry directory, cgroup driver and OOM setting; the CNI
    /// binaries' directory as each 2.x minor names it.
    #[test]
    fn the_config_follows_the_containerd_major_version() -> anyhow::Result<()> {
        let one = config("1.7.13")?;
        assert!(
            one.contains("version = 2\n") && one.contains("[plugins.\"io.containerd.grpc.v1.cri\"]"),
            "{one}"
        );
        assert!(one.contains("sandbox_image = \"registry.k8s.io/pause:3.10\""), "{one}");
        for (version, cni) in [
            ("2.3.4", "bin_dirs = [\"/opt/cni/bin\"]"),
            ("v2.1.0", "bin_dirs = [\"/opt/cni/bin\"]"),
            ("2.0.5", "bin_dir = \"/opt/cni/bin\""),
        ] {
            let three = config(version)?;
            assert!(three.contains("version = 3\n") && !three.contains("grpc.v1.cri"), "{three}");
            for line in [
                "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
                "sandbox = \"registry.k8s.io/pause:3.10\"",
                "config_path = \"/etc/containerd/certs.d\"",
                "restrict_oom_score_adj = true",
                "SystemdCgroup = false",
                cni,
                "conf_dir = \"/etc/cni/net.d\"",
            ] {
                assert!(three.lines().any(|l| l.trim() == line), "{version}: no {line}:\n{three}");
            }
        }
        Ok(())
    }
}
