//! `bundle.yaml`: the first member of every bundle.

use serde::{Deserialize, Serialize};

use kubexm_bom::Bom;

/// The name of the first member.
pub const MANIFEST_NAME: &str = "bundle.yaml";
pub const API_VERSION: &str = "kubexm.io/v1alpha1";
pub const KIND: &str = "Bundle";

/// What a bundle holds: the lock and every member's digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BundleManifest {
    pub api_version: String,
    pub kind: String,
    /// The cluster the bundle was built for.
    pub name: String,
    /// The builder and its version.
    pub created_by: String,
    /// sha256 of the cluster.yaml bytes the bundle was built from.
    pub config_digest: String,
    /// The resolved BOM with every digest pinned.
    pub lock: Bom,
    /// The slice of the catalog the bundle was built with (the Kubernetes
    /// minor and its kubeadm API, the component and addon versions it holds):
    /// the offline side validates and completes cluster.yaml against it and
    /// needs no catalog of its own. Bundles built before it existed lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<kubexm_bom::catalog::Catalog>,
    /// A differential bundle's base: the full bundle that carries the
    /// members marked `fromBase` (see [`crate::diff`]). `None`: a full bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<Base>,
    /// Every other member of the full content, in archive order; a
    /// differential bundle's archive holds those not marked `fromBase`.
    pub members: Vec<Member>,
}

/// The full bundle a differential one was built against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Base {
    /// `sha256:<hex>` of the base's `bundle.yaml`: its id, the directory it
    /// unpacks to.
    pub digest: String,
    /// The base's `createdBy`, for people.
    pub created_by: String,
    /// `sha256:<hex>` of the full bundle's `bundle.yaml` this one stands
    /// for (this one's without `base` and the marks): its content's id,
    /// checked by every reader that computes it again.
    pub content_digest: String,
}

/// One archive member, as the manifest promises it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// In the base bundle, not in this (differential) bundle's archive.
    #[serde(default, rename = "fromBase", skip_serializing_if = "std::ops::Not::not")]
    pub from_base: bool,
}

impl BundleManifest {
    pub fn to_yaml(&self) -> Result<String, serde_saphyr::ser::Error> {
        serde_saphyr::to_string(self)
    }

    /// Parses `bundle.yaml`; bounded by the parser's budgets.
    pub fn from_yaml(text: &str) -> Result<Self, String> {
        let m: BundleManifest = serde_saphyr::from_str(text).map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())?;
        if m.api_version != API_VERSION || m.kind != KIND {
            return Err(format!(
                "not a kubexm bundle manifest ({} {}); expected {API_VERSION} {KIND}",
                m.api_version, m.kind
            ));
        }
        match &m.base {
            None if m.members.iter().any(|x| x.from_base) => {
                return Err("members are marked fromBase but no base is named".into());
            }
            Some(b) if !crate::diff::is_digest(&b.digest) || !crate::diff::is_digest(&b.content_digest) => {
                return Err(format!(
                    "base.digest {:?} or base.contentDigest {:?} is not sha256:<64 hex digits>",
                    b.digest, b.content_digest
                ));
            }
            _ => {}
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = m.members.iter().find(|x| !seen.insert(x.path.as_str())) {
            return Err(format!("member {} is listed twice", twice.path));
        }
        Ok(m)
    }

    /// Total size of all members of the full content (saturating: the
    /// sizes are read from the archive before any signature is checked).
    pub fn total_size(&self) -> u64 {
        self.members.iter().fold(0u64, |n, m| n.saturating_add(m.size))
    }

    /// The members the archive holds (all of them, but for a differential
    /// bundle's `fromBase` ones).
    pub fn carried(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| !m.from_base)
    }

    /// Total size of the members the archive holds (saturating).
    pub fn carried_size(&self) -> u64 {
        self.carried().fold(0u64, |n, m| n.saturating_add(m.size))
    }
}
