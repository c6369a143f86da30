//! The cluster record: what the last job that changed a cluster applied to
//! it (the completed config, each host's roles and address, component
//! versions, artifact digests, the bundle's digest, the job and its
//! result). Written after every install and reset (and, later, after
//! `apply` and every day-2 operation) through the engine's store, shown by
//! `kubexm-install status --cluster NAME`, and typed like the status of the
//! Cluster resource, so the CLI, a worker and the operator read one record.
//!
//! It holds no secret: the config names where its secrets come from
//! (`fromEnv`, `fromFile`), never their values.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::Cluster;
use crate::{Bom, Checksum};

/// The record's format; a record of another version is read as unknown.
pub const RECORD_VERSION: u32 = 1;

/// What a cluster is, as its last job left it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRecord {
    pub version: u32,
    pub name: String,
    /// The job that wrote this record.
    pub job: JobRef,
    /// `sha256:<hex>` of the bundle's signed `bundle.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// `host:port` of the control-plane endpoint and its mode.
    pub endpoint: String,
    pub endpoint_mode: String,
    pub kubernetes: String,
    pub nodes: Vec<NodeRecord>,
    /// Component versions from the bundle's lock (`containerd`, `etcd`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub versions: BTreeMap<String, String>,
    /// Every pinned artifact of the lock with its digest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// The config the job applied, completed (defaults filled in).
    pub config: Cluster,
}

/// A job, as a record names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobRef {
    pub id: i64,
    pub kind: String,
    /// `succeeded`, `failed` or `interrupted`.
    pub status: String,
    /// Milliseconds since the epoch.
    pub finished: i64,
}

impl JobRef {
    /// A reset or a cluster deletion, even a failed one: the hosts are no
    /// longer as an install left them.
    pub fn took_down(&self) -> bool {
        self.kind.starts_with("reset") || self.kind == "delete-cluster"
    }
}

/// One host of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    pub name: String,
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    pub roles: Vec<String>,
    pub state: NodeState,
}

/// Where a host stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// Part of the cluster.
    Member,
    /// Removed while unreachable: it may still hold a valid kubelet
    /// certificate until it is reset.
    RemovedNotReset,
}

/// A pinned artifact of the bundle's lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// `file`, `image`, `chart` or `manifest`.
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    pub digest: String,
}

impl ClusterRecord {
    /// The record of `job` over `cluster`, from the bundle's lock `bom` (when
    /// the job had one) and each host's arch as gathered (`arches`; the
    /// config's where a host was not asked).
    pub fn new(
        cluster: &Cluster,
        job: JobRef,
        bom: Option<&Bom>,
        bundle: Option<&str>,
        arches: &BTreeMap<String, String>,
    ) -> ClusterRecord {
        let e = &cluster.spec.control_plane_endpoint;
        let nodes = cluster
            .spec
            .hosts
            .iter()
            .map(|h| NodeRecord {
                name: h.name.clone(),
                address: h.address.clone(),
                arch: arches.get(&h.name).cloned().or_else(|| h.arch.clone()),
                roles: cluster.roles_of(&h.name),
                state: NodeState::Member,
            })
            .collect();
        ClusterRecord {
            version: RECORD_VERSION,
            name: cluster.metadata.name.clone(),
            job,
            bundle: bundle.map(str::to_string),
            endpoint: format!("{}:{}", e.domain, e.port),
            endpoint_mode: serde_json::to_value(e.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            kubernetes: cluster.spec.kubernetes.version.clone(),
            nodes,
            versions: bom.map(versions).unwrap_or_default(),
            artifacts: bom.map(artifacts).unwrap_or_default(),
            config: cluster.clone(),
        }
    }

    /// The hosts that are members of the cluster.
    pub fn members(&self) -> impl Iterator<Item = &NodeRecord> {
        self.nodes.iter().filter(|n| n.state == NodeState::Member)
    }

    /// The record after `host` left the cluster in `job`: gone from the
    /// config (its hosts and every role group); gone from the nodes when it
    /// was reset, else kept there as removed, not reset.
    pub fn without(&self, host: &str, reset: bool, job: JobRef) -> ClusterRecord {
        let mut r = self.clone();
        r.job = job;
        r.config.spec.hosts.retain(|h| h.name != host);
        let g = &mut r.config.spec.role_groups;
        for group in [
            &mut g.etcd,
            &mut g.control_plane,
            &mut g.worker,
            &mut g.loadbalancer,
            &mut g.registry,
        ] {
            group.retain(|h| h != host);
        }
        if reset {
            r.nodes.retain(|n| n.name != host);
        } else if let Some(n) = r.nodes.iter_mut().find(|n| n.name == host) {
            n.state = NodeState::RemovedNotReset;
        }
        r
    }

    /// `self` with the hosts `prev` holds as removed, not reset, that this
    /// record does not list: a later job keeps saying they wait for a reset.
    pub fn keeping_removed(mut self, prev: &ClusterRecord) -> ClusterRecord {
        for n in prev.nodes.iter().filter(|n| n.state == NodeState::RemovedNotReset) {
            if !self.nodes.iter().any(|m| m.name == n.name) {
                self.nodes.push(n.clone());
            }
        }
        self
    }
}

/// Each component's version in the lock (one per component: the lock pins
/// one version of a component for every arch).
pub fn versions(bom: &Bom) -> BTreeMap<String, String> {
    let mut v: BTreeMap<String, String> = bom.files.iter().map(|f| (f.component.clone(), f.version.clone())).collect();
    v.extend(bom.manifests.iter().map(|m| (m.addon.clone(), m.version.clone())));
    v.extend(bom.charts.iter().map(|c| (format!("chart/{}", c.name), c.version.clone())));
    v
}

/// Every artifact of the lock that has a digest.
pub fn artifacts(bom: &Bom) -> Vec<Artifact> {
    let one = |kind: &str, name: &str, arch: Option<&str>, digest: String| Artifact {
        kind: kind.into(),
        name: name.into(),
        arch: arch.map(str::to_string),
        digest,
    };
    let files = bom.files.iter().filter_map(|f| match &f.checksum {
        Checksum::Sha256(d) => Some(one("file", &f.component, Some(&f.arch), format!("sha256:{d}"))),
        _ => None,
    });
    // The controller's image is not installed on hosts: the operator phase
    // rolls its Deployment out to whatever the bundle carries (a rebuild on
    // a machine with other C libraries gives it another digest).
    let images = bom.images.iter().filter(|i| !i.reference.is_controller()).filter_map(|i| {
        let d = i.digest.clone()?;
        Some(one("image", &i.reference.to_string(), None, d))
    });
    let charts = bom
        .charts
        .iter()
        .filter_map(|c| Some(one("chart", &c.name, None, format!("sha256:{}", c.sha256.as_ref()?))));
    let manifests = bom
        .manifests
        .iter()
        .filter_map(|m| Some(one("manifest", &m.addon, None, format!("sha256:{}", m.sha256.as_ref()?))));
    files.chain(images).chain(charts).chain(manifests).collect()
}

impl std::fmt::Display for ClusterRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "cluster {}: last job {} ({}, {})",
            self.name, self.job.id, self.job.kind, self.job.status
        )?;
        writeln!(f, "  kubernetes {}", self.kubernetes)?;
        writeln!(f, "  endpoint   {} ({})", self.endpoint, self.endpoint_mode)?;
        if let Some(b) = &self.bundle {
            writeln!(f, "  bundle     {b}")?;
        }
        let width = self.nodes.iter().map(|n| n.name.len()).max().unwrap_or(0);
        writeln!(f, "  nodes:")?;
        for n in &self.nodes {
            let state = match n.state {
                NodeState::Member => String::new(),
                NodeState::RemovedNotReset => format!(
                    "  removed, not reset: when it is back, `kubexm-install remove node {} -f CONFIG` resets it",
                    n.name
                ),
            };
            writeln!(
                f,
                "    {:width$}  {:15}  {:5}  {}{state}",
                n.name,
                n.address,
                n.arch.as_deref().unwrap_or("?"),
                n.roles.join(","),
            )?;
        }
        if !self.versions.is_empty() {
            let list: Vec<String> = self.versions.iter().map(|(k, v)| format!("{k} {v}")).collect();
            writeln!(f, "  versions:  {}", list.join(", "))?;
        }
        Ok(())
    }
}
