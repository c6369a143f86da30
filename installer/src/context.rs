//! What every phase reads, in one place: the inputs of a deployment plan
//! (config, lock, bundle, file server, PKI, host arches, phases) and the
//! topology helpers phases share (addresses, first control-plane node,
//! registry host), plus the step that puts a bundle component on a host.
//! Phases import this module, never each other's files or the pipeline
//! that assembles them (`deploy`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use kubexm_bom::{Bom, FileItem};

use crate::engine::files::Unless;
use crate::engine::plan::Step;
use crate::engine::steps::{Distribute, FileCopy, Shell};
use crate::engine::transport::shell_quote as q;
use crate::pki;

/// Where the registry CA goes on every host.
pub const HOST_CA: &str = "/etc/kubexm/pki/registry-ca.crt";

/// The first control-plane node: where kubeadm inits and addons are applied.
pub fn first_control_plane(cluster: &Cluster) -> anyhow::Result<String> {
    cluster
        .spec
        .role_groups
        .control_plane
        .first()
        .cloned()
        .ok_or_else(|| crate::DeployError::Config("roleGroups.control-plane is empty".into()).into())
}

/// A component from the bundle on a host: its archive fetched from the file
/// server (sha256 checked), then each `install` entry extracted into place.
pub fn install_component(file: &FileItem, bundle_dir: &Path, file_server: &str) -> Vec<Arc<dyn Step>> {
    let stash = format!("/var/lib/kubexm/files/{}", file.path.trim_start_matches("files/"));
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
    let stamp = format!("/var/lib/kubexm/installed/{}", file.component);
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
        apply.push_str(&format!(
            "mkdir -p \"$(dirname {to})\"\n{extract}\nchmod 0755 {to}.tmp\nmv -f {to}.tmp {to}\n",
            to = q(&e.to)
        ));
    }
    let id = format!("{} {} {}", file.version, file.arch, fetch.files[0].sha256);
    // The downloaded archive is a temporary file: gone once installed.
    apply.push_str(&format!(
        "mkdir -p /var/lib/kubexm/installed\necho {} > {}\nrm -f {}\n",
        q(&id),
        q(&stamp),
        q(&stash)
    ));
    let targets: Vec<String> = file
        .install
        .iter()
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

impl Inputs<'_> {
    /// The arch of `host` (from facts; amd64 when unknown, as in a dry run).
    pub fn arch_of(&self, host: &str) -> String {
        self.arches.get(host).cloned().unwrap_or_else(|| "amd64".into())
    }

    /// The bundle's `component` for `host`'s arch, or what to do when it is missing.
    pub fn bundle_file(&self, host: &str, component: &str) -> anyhow::Result<&FileItem> {
        let arch = self.arch_of(host);
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

/// Everything a deployment plan needs besides the config.
pub struct Inputs<'a> {
    pub cluster: &'a Cluster,
    pub bom: &'a Bom,
    pub bundle_dir: &'a Path,
    /// The file server as hosts reach it.
    pub file_server: &'a str,
    /// The registry CA certificate (PEM) hosts trust.
    pub ca_pem: &'a [u8],
    /// The installer's PKI (`<root>/pki`), or placeholders in a dry run.
    pub pki: &'a pki::Pki,
    /// Members of the bundle read in memory (a dry run, which unpacks
    /// nothing); otherwise they are read from `bundle_dir`.
    pub members: Option<&'a BTreeMap<String, Vec<u8>>>,
    /// Host name → arch (from facts).
    pub arches: &'a BTreeMap<String, String>,
    pub phases: &'a [String],
    /// The bundle file, its signature and public key (none if unsigned), for the registry host.
    pub bundle: &'a Path,
    pub pubkey: Option<&'a Path>,
    /// The installer binary, which the registry host runs as its registry service.
    pub installer: &'a Path,
    /// The kubeadm config API of the Kubernetes version (from the catalog).
    pub kubeadm_api: &'a str,
    /// Where the admin kubeconfig is written for the user.
    pub kubeconfig: &'a Path,
}

/// The registry host: `roleGroups.registry`, else the first control-plane node.
pub fn registry_host(cluster: &Cluster) -> Option<String> {
    let g = &cluster.spec.role_groups;
    g.registry.first().or_else(|| g.control_plane.first()).cloned()
}

/// `address:port` of the registry service nodes pull from.
pub fn registry_address(cluster: &Cluster) -> Option<String> {
    registry_host(cluster).map(|h| format!("{}:{}", address_of(cluster, &h), cluster.spec.registry.port))
}

pub fn address_of(cluster: &Cluster, host: &str) -> String {
    cluster
        .spec
        .hosts
        .iter()
        .find(|h| h.name == host)
        .map(|h| h.internal_address.clone().unwrap_or_else(|| h.address.clone()))
        .unwrap_or_default()
}
