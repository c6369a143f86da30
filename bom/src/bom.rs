//! The bill of materials: every file, manifest, image and chart a bundle carries.
//!
//! A BOM from [`crate::resolve::resolve`] lists what is known before any
//! fetch. The builder later pins image digests and adds the images it finds
//! in manifests; that pinned BOM is the bundle's lock.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::catalog::{ArchiveKind, InstallEntry};
use crate::image::ImageRef;

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bom {
    pub cluster: String,
    pub kubernetes_version: String,
    pub arches: Vec<String>,
    pub files: Vec<FileItem>,
    pub manifests: Vec<ManifestItem>,
    pub images: Vec<ImageItem>,
    pub charts: Vec<ChartItem>,
    /// Catalog notes on version pairings for this Kubernetes minor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Upstream rewriting in force: `host[/path]` → base URL.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mirrors: BTreeMap<String, String>,
    /// OS package repositories: one per release and arch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub os_repos: Vec<OsRepoItem>,
}

/// A flat Debian package repository the bundle carries, for one release and arch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsRepoItem {
    /// The catalog's release name, e.g. `debian-bookworm`.
    pub release: String,
    /// `ID` and `VERSION_CODENAME` of /etc/os-release on hosts of this release.
    pub distro: String,
    pub codename: String,
    pub component: String,
    pub arch: String,
    /// The mirror the packages come from, as configured.
    pub mirror: String,
    /// Where the repository lives in the bundle (`os/<release>/<arch>`).
    pub path: String,
    /// Packages asked for, per role (`all` goes to every host).
    pub roles: BTreeMap<String, Vec<String>>,
    /// Every package in the repository, pinned when the bundle is built.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<DebItem>,
}

/// One `.deb` in a bundle's repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DebItem {
    pub name: String,
    pub version: String,
    pub arch: String,
    /// The file name inside the repository folder.
    pub file: String,
    pub size: u64,
    pub sha256: String,
}

impl OsRepoItem {
    /// Packages a host with `roles` installs from this repository.
    pub fn packages_for(&self, roles: &[&str]) -> Vec<String> {
        let mut out: Vec<String> = self
            .roles
            .iter()
            .filter(|(r, _)| r.as_str() == "all" || roles.contains(&r.as_str()))
            .flat_map(|(_, p)| p.iter().cloned())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// A binary or archive for one arch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileItem {
    pub component: String,
    pub version: String,
    pub arch: String,
    /// The upstream URL, as published.
    pub url: String,
    /// Where it is fetched from: `url` after mirror rewriting.
    pub source: String,
    pub checksum: Checksum,
    /// The upstream's published checksum file its sha256 was checked
    /// against, as published (before mirror rewriting); `None`: the catalog
    /// or the config pins the sha256. Kept after the build pins it, for the
    /// bills of materials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_url: Option<String>,
    /// Path inside the bundle.
    pub path: String,
    pub archive: ArchiveKind,
    /// Where its contents install on a host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub install: Vec<InstallEntry>,
}

/// How a file's content is verified. Nothing is taken unverified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Checksum {
    /// A sha256 the catalog pins.
    Sha256(String),
    /// No pinned digest: the upstream's published checksum file decides.
    Published(String),
    /// Neither; the builder refuses such a file.
    Unknown,
}

/// An upstream manifest of an addon; its images are found at build time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestItem {
    pub addon: String,
    pub version: String,
    pub url: String,
    pub source: String,
    pub path: String,
    /// sha256 of the fetched manifest, pinned by the builder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// A container image with the platforms to keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageItem {
    /// The full upstream reference; the image's name everywhere.
    pub reference: ImageRef,
    /// Pull location when a mirror applies (`https://harbor.local/proxy/pause:3.10`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub platforms: Vec<String>,
    /// Pinned manifest digest, set by the builder: what the bundle stores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Upstream's digest, where the builder narrowed a multi-arch index to `platforms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_digest: Option<String>,
    /// The manifest digest of each platform (`linux/amd64`), where `digest`
    /// is an index: set by the builder.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub platform_manifests: BTreeMap<String, String>,
    /// The manifest that named this image, for images found at build time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_manifest: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartItem {
    pub name: String,
    pub version: String,
    /// The upstream repository, URL or OCI reference, as configured.
    pub upstream: String,
    /// Where it is fetched from (after mirror rewriting).
    pub source: ChartSource,
    pub path: String,
    /// sha256 of the `.tgz`: from the config for URLs, pinned by the builder otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum ChartSource {
    /// An HTTP chart repository with `index.yaml`.
    Repo { repo: String },
    /// A plain `.tgz` URL.
    Url { url: String },
    /// An OCI registry reference.
    Oci { reference: String },
}

impl Bom {
    /// A plain-text table, one section per kind of item.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "cluster {}  kubernetes {}  arches {}\n",
            self.cluster,
            self.kubernetes_version,
            self.arches.join(",")
        ));
        out.push_str(&format!("\nFILES ({})\n", self.files.len()));
        let rows: Vec<[String; 5]> = self
            .files
            .iter()
            .map(|f| {
                let sum = match &f.checksum {
                    Checksum::Sha256(d) => format!("sha256:{}…", &d[..12.min(d.len())]),
                    Checksum::Published(_) => "not pinned: upstream's checksum".into(),
                    Checksum::Unknown => "UNVERIFIABLE".into(),
                };
                [f.component.clone(), f.version.clone(), f.arch.clone(), sum, f.source.clone()]
            })
            .collect();
        table(&mut out, ["COMPONENT", "VERSION", "ARCH", "CHECKSUM", "URL"], &rows);
        out.push_str(&format!("\nMANIFESTS ({})\n", self.manifests.len()));
        let rows: Vec<[String; 3]> = self
            .manifests
            .iter()
            .map(|m| [m.addon.clone(), m.version.clone(), m.source.clone()])
            .collect();
        table(&mut out, ["ADDON", "VERSION", "URL"], &rows);
        out.push_str(&format!("\nIMAGES ({})\n", self.images.len()));
        let rows: Vec<[String; 2]> = self
            .images
            .iter()
            .map(|i| [i.reference.to_string(), i.platforms.join(",")])
            .collect();
        table(&mut out, ["IMAGE", "PLATFORMS"], &rows);
        out.push_str(&format!("\nCHARTS ({})\n", self.charts.len()));
        let rows: Vec<[String; 3]> = self
            .charts
            .iter()
            .map(|c| {
                let src = match &c.source {
                    ChartSource::Repo { repo } => format!("repo {repo}"),
                    ChartSource::Url { url } => url.clone(),
                    ChartSource::Oci { reference } => reference.clone(),
                };
                [c.name.clone(), c.version.clone(), src]
            })
            .collect();
        table(&mut out, ["CHART", "VERSION", "SOURCE"], &rows);
        if !self.notes.is_empty() {
            out.push_str("\nNOTES\n");
            for n in &self.notes {
                out.push_str(&format!("  - {n}\n"));
            }
        }
        out
    }
}

fn table<const N: usize>(out: &mut String, head: [&str; N], rows: &[[String; N]]) {
    let mut width = head.map(|h| h.chars().count());
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from(" ");
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == N {
                s.push_str(&format!(" {c}"));
            } else {
                s.push_str(&format!(" {c:<w$}", w = width[i]));
            }
        }
        s.push('\n');
        s
    };
    out.push_str(&line(head.to_vec()));
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
}
