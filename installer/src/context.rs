//! What every phase reads, in one place: the [`Context`] of a deployment
//! plan (config and its topology, computed once in `kubexm_bom::topology`;
//! lock, bundle, file server, PKI, host arches, phases), plus the step that
//! puts a bundle component on a host. Phases import this module, never each
//! other's files or the pipeline that assembles them (`pipelines`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use kubexm_bom::topology::Topology;
use kubexm_bom::{Bom, FileItem};

use crate::engine::files::Unless;
use crate::engine::plan::Step;
use crate::engine::steps::{Distribute, FileCopy, Shell};
use crate::engine::transport::shell_quote as q;
use crate::pki;

pub use crate::paths::HOST_CA;
use crate::paths::{HOST_FILES, INSTALLED};

/// A component from the bundle on a host: its archive fetched from the file
/// server (sha256 checked), then each `install` entry extracted into place.
pub fn install_component(file: &FileItem, bundle_dir: &Path, file_server: &str) -> Vec<Arc<dyn Step>> {
    let stash = format!("{HOST_FILES}/{}", file.path.trim_start_matches("files/"));
    let fetch = Distribute {
        name: format!("{}-fetch", file.component),
        files: vec![FileCopy {
            url: format!("{}/{}", file_server.trim_end_matches('/'), file.path),
            local: bundle_dir.join(&file.path),
            sha256: match &file.checksum {
                kubexm_bom::Checksum::Sha256(s) => s.clone(),
                _ => String::new(),
            },
            dest: stash.clone(),
            mode: 0o644,
        }],
        ca: Some(HOST_CA.into()),
    };
    let stamp = format!("{INSTALLED}/{}", file.component);
    let mut apply = String::from("set -e\n");
    for e in &file.install {
        if e.from.ends_with('/') {
            // A directory: its contents go into `to`.
            let from = e.from.trim_start_matches("./");
            let strip = from.matches('/').count();
            let member = if from.is_empty() { String::new() } else { format!(" {}", q(from)) };
            apply.push_str(&format!(
                "mkdir -p {to}\ntar -xzf {} -C {to} --no-same-owner --strip-components={strip}{member}\n",
                q(&stash),
                to = q(&e.to)
            ));
            continue;
        }
        let extract = match file.archive {
            kubexm_bom::catalog::ArchiveKind::TarGz => format!("tar -xzOf {} {} > {}.tmp", q(&stash), q(&e.from), q(&e.to)),
            kubexm_bom::catalog::ArchiveKind::None => format!("cp {} {}.tmp", q(&stash), q(&e.to)),
        };
        let install = format!("chmod 0755 {to}.tmp && mv -f {to}.tmp {to}", to = q(&e.to));
        if e.optional {
            // Not in every release's archive: installed when it is there.
            apply.push_str(&format!(
                "mkdir -p \"$(dirname {to})\"\nif {extract} 2>/dev/null; then {install}; else rm -f {to}.tmp; fi\n",
                to = q(&e.to)
            ));
        } else {
            apply.push_str(&format!("mkdir -p \"$(dirname {to})\"\n{extract}\n{install}\n", to = q(&e.to)));
        }
    }
    let id = format!("{} {} {}", file.version, file.arch, fetch.files[0].sha256);
    // The downloaded archive is a temporary file: gone once installed.
    apply.push_str(&format!(
        "mkdir -p {INSTALLED}\necho {} > {}\nrm -f {}\n",
        q(&id),
        q(&stamp),
        q(&stash)
    ));
    let targets: Vec<String> = file
        .install
        .iter()
        .filter(|e| !e.optional)
        .map(|e| {
            if e.to.ends_with('/') {
                format!("test -d {}", q(&e.to))
            } else {
                format!("test -x {}", q(&e.to))
            }
        })
        .collect();
    let check = format!("[ \"$(cat {} 2>/dev/null)\" = {} ] && {}", q(&stamp), q(&id), targets.join(" && "));
    let mut install = Shell::new(&format!("{}-install", file.component), Some(&check), &apply);
    install.timeout = Duration::from_secs(300);
    vec![
        Arc::new(Unless {
            check,
            inner: Arc::new(fetch),
        }),
        Arc::new(install),
    ]
}

/// A cluster of two hosts (cp1, the registry too; w1) for unit tests of
/// plans.
#[cfg(test)]
pub const TWO_HOSTS: &str = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: s\nspec:\n  hosts:\n\
    \x20   - {name: cp1, address: 10.0.0.1, auth: {agent: true}}\n\
    \x20   - {name: w1, address: 10.0.0.4, auth: {agent: true}}\n\
    \x20 roleGroups: {control-plane: [cp1], etcd: [cp1], worker: [w1], registry: [cp1]}\n\
    \x20 controlPlaneEndpoint: {mode: local-proxy}\n\
    \x20 kubernetes: {version: v1.37.2}\n";

#[cfg(test)]
impl<'a> Context<'a> {
    /// A context for unit tests of a plan's steps: `cluster` and its lock,
    /// every host amd64, a dry-run PKI, no bundle file, an install.
    pub fn testing(
        cluster: &'a Cluster,
        bom: &'a Bom,
        dir: &'a Path,
        pki: &'a pki::Pki,
        installer: &'a Path,
    ) -> anyhow::Result<Context<'a>> {
        Ok(Context {
            cluster,
            topo: Topology::of(cluster)?,
            bom,
            bundle_dir: dir,
            file_server: "https://10.0.0.100:5443",
            ca_pem: b"ca",
            pki,
            kube: None,
            members: None,
            arches: cluster.spec.hosts.iter().map(|h| (h.name.clone(), "amd64".to_string())).collect(),
            phases: crate::pipelines::install::PHASES,
            bundle: None,
            base: None,
            digest: None,
            written: None,
            operation: "install",
            pubkey: None,
            installer,
            kubeadm_api: "kubeadm.k8s.io/v1beta4",
            kubeconfig: Path::new("/tmp/s.kubeconfig"),
            server_dry_run: false,
            etcd_before: None,
            registry_before: None,
            files_from_registry: false,
        })
    }
}

impl Context<'_> {
    /// The registry host that serves no more (the registry moved), if any.
    pub fn registry_retired(&self) -> Option<&str> {
        let now = self.topo.registry.as_ref().map(|r| r.host.as_str());
        self.registry_before.as_deref().filter(|old| Some(*old) != now)
    }

    /// Whether this run includes `phase`.
    pub fn has(&self, phase: crate::pipelines::Phase) -> bool {
        self.phases.contains(&phase)
    }

    /// The arch of `host`: from facts, or from the config in a dry run.
    pub fn arch_of(&self, host: &str) -> anyhow::Result<&str> {
        self.arches.get(host).map(String::as_str).ok_or_else(|| {
            crate::DeployError::Config(format!(
                "{host}: its arch is unknown (no facts); set hosts[].arch in cluster.yaml or let the install gather facts"
            ))
            .into()
        })
    }

    /// The Kubernetes CA and join credentials (made when a kubeadm phase is chosen).
    pub fn kube(&self) -> anyhow::Result<&crate::kube_pki::KubePki> {
        self.kube
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the Kubernetes PKI was not prepared for this plan"))
    }

    /// The registry service (`host`, `address:port`), or what to do without one.
    pub fn registry(&self) -> anyhow::Result<&kubexm_bom::topology::RegistryAt> {
        if self.cluster.spec.registry.mode != kubexm_bom::config::model::RegistryMode::Local {
            return Err(crate::DeployError::NotSupported(
                "registry.mode external (the registry, containerd and addon phases need the bundle's registry; \
                 mirror with `kubexm-install mirror` meanwhile)"
                    .into(),
            )
            .into());
        }
        self.topo
            .registry
            .as_ref()
            .ok_or_else(|| crate::DeployError::Config("no registry host: set roleGroups.registry (registry.mode: local)".into()).into())
    }

    /// The bundle's `component` for `host`'s arch, or what to do when it is missing.
    pub fn bundle_file(&self, host: &str, component: &str) -> anyhow::Result<&FileItem> {
        let arch = self.arch_of(host)?;
        self.bom
            .files
            .iter()
            .find(|f| f.component == component && f.arch == arch)
            .ok_or_else(|| {
                crate::DeployError::Config(format!(
                    "{host}: the bundle has no {component} for {arch}; add {arch} to bundle.arches and rebuild the bundle"
                ))
                .into()
            })
    }
}

/// Everything a deployment plan reads, built once per run.
pub struct Context<'a> {
    pub cluster: &'a Cluster,
    /// The config's topology: addresses, first control-plane node,
    /// registry, endpoint, cluster DNS, addons.
    pub topo: Topology,
    pub bom: &'a Bom,
    pub bundle_dir: &'a Path,
    /// The file server as hosts reach it.
    pub file_server: &'a str,
    /// The registry CA certificate (PEM) hosts trust.
    pub ca_pem: &'a [u8],
    /// The installer's PKI (`<root>/pki`), or placeholders in a dry run.
    pub pki: &'a pki::Pki,
    /// The Kubernetes CA and join credentials, when a kubeadm phase runs.
    pub kube: Option<crate::kube_pki::KubePki>,
    /// Members of the bundle read in memory (a dry run, which unpacks
    /// nothing); otherwise they are read from `bundle_dir`.
    pub members: Option<&'a BTreeMap<String, Vec<u8>>>,
    /// Host name → arch (from facts; from the config in a dry run).
    pub arches: BTreeMap<String, String>,
    pub phases: &'a [crate::pipelines::Phase],
    /// The bundle file, its signature and public key (none if unsigned), for
    /// the registry host; `None`: an apply from the bundle unpacked here
    /// (the registry host must have it unpacked too).
    pub bundle: Option<&'a Path>,
    /// A differential bundle's base file (with its signature beside it) and
    /// digest, for a registry host that does not have it unpacked.
    pub base: Option<(&'a Path, &'a str)>,
    /// cluster.yaml's spec as written (before defaults), for the Cluster
    /// object; `None`: the completed one is used.
    pub written: Option<kubexm_bom::config::model::Spec>,
    /// The operation the run is: `install`, `apply` or `upgrade`.
    pub operation: &'static str,
    /// The bundle's digest (`sha256:...`), for the Cluster object's status.
    pub digest: Option<&'a str>,
    pub pubkey: Option<&'a Path>,
    /// The installer binary, which the registry host runs as its registry service.
    pub installer: &'a Path,
    /// The kubeadm config API of the Kubernetes version (from the bundle's lock).
    pub kubeadm_api: &'a str,
    /// Where the admin kubeconfig is written for the user.
    pub kubeconfig: &'a Path,
    /// `--server-dry-run`: the cni and addons phases have the API server
    /// check their manifests instead of applying them.
    pub server_dry_run: bool,
    /// In an apply, etcd's members as recorded: the config's others join
    /// the running cluster (`None`: an install, every member starts new).
    pub etcd_before: Option<Vec<String>>,
    /// The registry's host as recorded, when the cluster is installed: when
    /// the config names another, the old one's service stops once every
    /// node pulls from the new one.
    pub registry_before: Option<String>,
    /// `file_server` is the registry host's `kubexm-registry` (an installed
    /// cluster's, serving this bundle), not a server of this run: the
    /// registry phase runs before the OS packages', and every later task,
    /// on every host, waits for it (it may restart the service).
    pub files_from_registry: bool,
}

impl Context<'_> {
    /// The etcd members an apply adds to the running cluster, in order.
    pub fn etcd_joining(&self) -> Vec<String> {
        let Some(before) = &self.etcd_before else { return vec![] };
        self.cluster
            .spec
            .role_groups
            .etcd
            .iter()
            .filter(|m| !before.contains(*m))
            .cloned()
            .collect()
    }
}
