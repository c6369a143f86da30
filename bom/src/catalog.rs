//! The component catalog: what kubexm can fetch, from where, and with what digest.
//!
//! The catalog is data in `manifests/catalog/` compiled into the binary. A
//! user's `--catalog FILE` has the same shape; it is deep-merged over the
//! built-in one (maps merge key by key, anything else is replaced), so a file
//! holding one new version of one component adds just that.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::yaml;

const COMPONENTS: &str = include_str!("../../manifests/catalog/components.yaml");
const KUBERNETES: &str = include_str!("../../manifests/catalog/kubernetes.yaml");
const ADDONS: &str = include_str!("../../manifests/catalog/addons.yaml");
const OS: &str = include_str!("../../manifests/catalog/os.yaml");
/// Built-in archive keyrings, by the name a release's `keyring` uses.
const KEYRINGS: &[(&str, &str)] = &[("debian-bookworm", include_str!("../../manifests/keys/debian-bookworm.asc"))];

/// Errors reading or merging a catalog.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("{file}{}: {message}", pos.map(|p| format!(":{p}")).unwrap_or_default())]
    Parse {
        file: String,
        pos: Option<yaml::Pos>,
        message: String,
    },
    #[error("cannot read catalog {file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

/// The merged catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Catalog {
    /// Arches the catalog has binaries for, in BOM order.
    pub arches: Vec<String>,
    pub components: BTreeMap<String, Component>,
    pub default: String,
    pub minors: BTreeMap<String, Minor>,
    pub addons: BTreeMap<String, Addon>,
    #[serde(default)]
    pub os: OsCatalog,
    /// Where this catalog came from when it is not the built-in one with
    /// `--catalog` files: e.g. a bundle's lock, which holds only what the
    /// bundle was built for. Names it in hints; never serialized.
    #[serde(skip)]
    pub origin: Option<String>,
}

/// OS releases with package repositories, and the packages each role needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OsCatalog {
    #[serde(default)]
    pub releases: BTreeMap<String, OsRelease>,
    /// role (`all`, `etcd`, `control-plane`, `worker`, `loadbalancer`) → packages.
    #[serde(default)]
    pub roles: BTreeMap<String, Vec<String>>,
}

/// One OS release's archive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OsRelease {
    /// Package format; `deb` is the only one so far.
    pub format: String,
    /// `debian`: what /etc/os-release calls `ID`.
    pub distro: String,
    /// `bookworm`: `VERSION_CODENAME`, and the archive's `dists/` name.
    pub codename: String,
    pub component: String,
    /// A built-in keyring name, or the path of an armored keyring file.
    pub keyring: String,
    /// Priorities every host of the release has installed; their packages and
    /// what those depend on are not carried.
    #[serde(default = "default_base_priorities")]
    pub base_priorities: Vec<String>,
}

fn default_base_priorities() -> Vec<String> {
    vec!["required".into(), "important".into()]
}

impl OsRelease {
    /// The armored archive keys this release's `InRelease` must be signed with.
    pub fn keyring_text(&self) -> Result<String, CatalogError> {
        if let Some((_, text)) = KEYRINGS.iter().find(|(n, _)| *n == self.keyring) {
            return Ok(text.to_string());
        }
        fs_err::read_to_string(&self.keyring).map_err(|source| CatalogError::Read {
            file: self.keyring.clone(),
            source,
        })
    }
}

/// A downloadable component (kubeadm, etcd, containerd, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Component {
    /// URL template with `{version}` and `{arch}`.
    pub url: String,
    /// Upstream's published checksum file, same placeholders.
    pub checksum_url: Option<String>,
    pub archive: ArchiveKind,
    /// Where each archive member (or the file itself) goes on a host. A
    /// `from` ending in `/` installs that directory's contents.
    pub install: Vec<InstallEntry>,
    /// version → arch → sha256 (hex). A version may list no digest.
    pub versions: BTreeMap<String, BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArchiveKind {
    None,
    #[serde(rename = "tar.gz")]
    TarGz,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallEntry {
    pub from: String,
    pub to: String,
    /// Installed when the archive has it (etcdutl: etcd 3.5 and later).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// What a Kubernetes minor pairs with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Minor {
    pub kubeadm_api_version: String,
    /// pause, etcd and coredns image references kubeadm uses by default.
    pub images: BTreeMap<String, String>,
    /// component → version.
    pub components: BTreeMap<String, String>,
    #[serde(default)]
    pub notes: Vec<String>,
    /// Kubernetes' conformance tests for this minor, when the catalog has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conformance: Option<ConformanceSet>,
}

/// What `conformance.enabled` adds for a minor: the e2e test binaries come
/// from the `kubernetes-test` component; the images are listed here, as
/// `e2e.test --list-images` names them (upstream names, so the nodes' mirror
/// serves every reference the tests hard-code).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConformanceSet {
    /// Every image a conformance spec pulls.
    pub images: Vec<String>,
    /// Images `e2e.test --list-images` names that no conformance spec pulls,
    /// each with the reason it is left out.
    #[serde(default)]
    pub left_out: BTreeMap<String, String>,
}

/// A CNI plugin or addon, installed from upstream manifests (or a chart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Addon {
    pub kind: String,
    pub default: String,
    pub versions: Vec<String>,
    #[serde(default)]
    pub manifests: Vec<String>,
    pub chart: Option<String>,
    #[serde(default)]
    pub images: Vec<String>,
}

impl Catalog {
    /// The catalog compiled into the binary.
    pub fn builtin() -> Result<Catalog, CatalogError> {
        Self::from_layers(&[])
    }

    /// The built-in catalog with each file merged over it, in order.
    pub fn with_overrides(files: &[&Path]) -> Result<Catalog, CatalogError> {
        let mut layers = Vec::new();
        for f in files {
            let name = f.display().to_string();
            let text = fs_err::read_to_string(f).map_err(|source| CatalogError::Read {
                file: name.clone(),
                source,
            })?;
            layers.push((name, text));
        }
        Self::from_layers(&layers)
    }

    fn from_layers(layers: &[(String, String)]) -> Result<Catalog, CatalogError> {
        let builtin = [
            ("manifests/catalog/components.yaml", COMPONENTS),
            ("manifests/catalog/kubernetes.yaml", KUBERNETES),
            ("manifests/catalog/addons.yaml", ADDONS),
            ("manifests/catalog/os.yaml", OS),
        ];
        let mut merged = serde_json::Value::Object(Default::default());
        let mut docs = Vec::new();
        for (file, text) in builtin
            .iter()
            .map(|(f, t)| (f.to_string(), *t))
            .chain(layers.iter().map(|(f, t)| (f.clone(), t.as_str())))
        {
            let doc = yaml::parse(text).map_err(|e| CatalogError::Parse {
                file: file.clone(),
                pos: e.pos,
                message: e.message,
            })?;
            merge(&mut merged, doc.value.clone());
            docs.push((file, doc));
        }
        serde_path_to_error::deserialize(&merged).map_err(|e| {
            let path = e.path().to_string();
            // Point at the last file that mentions the failing path.
            let (file, pos) = docs
                .iter()
                .rev()
                .find_map(|(f, d)| d.pos(&path).map(|p| (f.clone(), Some(p))))
                .unwrap_or_else(|| ("catalog".into(), None));
            CatalogError::Parse {
                file,
                pos,
                message: format!("{path}: {}", e.inner()),
            }
        })
    }

    /// The part of this catalog a bundle built for `cluster` (resolved into
    /// `bom`) carries in its lock, so that the offline side validates and
    /// completes the same config without a catalog of its own: the
    /// Kubernetes minor (with its kubeadm API), each component and addon at
    /// the versions the bundle holds, and the OS releases it carries.
    pub fn locked_for(&self, cluster: &crate::config::Cluster, bom: &crate::Bom) -> Catalog {
        let spec = &cluster.spec;
        let mut components = BTreeMap::new();
        for f in &bom.files {
            let Some(c) = self.components.get(&f.component) else { continue };
            let entry = components.entry(f.component.clone()).or_insert_with(|| Component {
                versions: BTreeMap::new(),
                ..c.clone()
            });
            // The digests the bundle verified, arch by arch.
            let held = entry.versions.entry(f.version.clone()).or_default();
            if let crate::Checksum::Sha256(h) = &f.checksum {
                held.insert(f.arch.clone(), h.clone());
            }
        }
        let minor = Self::minor_of(&spec.kubernetes.version);
        let addons = crate::addons::enabled_addons(spec)
            .into_iter()
            .filter_map(|a| {
                let version = a.version?;
                let addon = self.addons.get(a.name)?;
                Some((
                    a.name.to_string(),
                    Addon {
                        default: version.clone(),
                        versions: vec![version],
                        ..addon.clone()
                    },
                ))
            })
            .collect();
        let releases = spec.bundle.os_packages.as_ref().map(|o| o.releases.clone()).unwrap_or_default();
        Catalog {
            arches: bom.arches.clone(),
            components,
            default: spec.kubernetes.version.clone(),
            minors: self
                .minors
                .iter()
                .filter(|(k, _)| **k == minor)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            addons,
            os: OsCatalog {
                releases: self
                    .os
                    .releases
                    .iter()
                    .filter(|(k, _)| releases.contains(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                roles: self.os.roles.clone(),
            },
            origin: None,
        }
    }

    pub fn default_kubernetes(&self) -> &str {
        &self.default
    }

    /// `v1.33.4` → `v1.33`.
    pub fn minor_of(version: &str) -> String {
        version.split('.').take(2).collect::<Vec<_>>().join(".")
    }

    pub fn minor(&self, kubernetes_version: &str) -> Option<&Minor> {
        self.minors.get(&Self::minor_of(kubernetes_version))
    }

    /// The version of `component` the catalog pairs with a Kubernetes version.
    pub fn paired_version(&self, kubernetes_version: &str, component: &str) -> Option<String> {
        self.minor(kubernetes_version)?.components.get(component).cloned()
    }

    pub fn component(&self, name: &str) -> Option<&Component> {
        self.components.get(name)
    }

    pub fn addon(&self, name: &str) -> Option<&Addon> {
        self.addons.get(name)
    }

    /// Kubernetes versions usable with kubeadm: every component and the minor are known.
    pub fn kubernetes_versions(&self) -> Vec<String> {
        let Some(kubeadm) = self.components.get("kubeadm") else {
            return Vec::new();
        };
        kubeadm
            .versions
            .keys()
            .filter(|v| self.minor(v).is_some())
            .filter(|v| {
                ["kubelet", "kubectl"]
                    .iter()
                    .all(|c| self.components.get(*c).is_some_and(|c| c.versions.contains_key(*v)))
            })
            .cloned()
            .collect()
    }
}

/// Deep merge: maps key by key, everything else replaced.
fn merge(base: &mut serde_json::Value, overlay: serde_json::Value) {
    match (base, overlay) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Fills `{version}`, `{semver}` (no leading `v`) and `{arch}` in a template.
pub fn render(template: &str, version: &str, arch: &str) -> String {
    template
        .replace("{version}", version)
        .replace("{semver}", version.strip_prefix('v').unwrap_or(version))
        .replace("{arch}", arch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn todays_minors_resolve_with_kubeadms_images_and_unpinned_binaries() -> Result<(), Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(format!("{}/../examples/ha.yaml", env!("CARGO_MANIFEST_DIR")))?;
        let catalog = Catalog::builtin()?;
        for (v, pause, etcd) in [
            ("v1.35.4", "3.10.1", "v3.6.6"),
            ("v1.36.3", "3.10.2", "v3.6.8"),
            ("v1.37.2", "3.10.2", "v3.7.0"),
        ] {
            let c = crate::config::load_str(&text.replace("version: v1.33.4", &format!("version: {v}")), "ha.yaml", &catalog)?;
            assert_eq!(c.spec.etcd.version.as_deref(), Some(etcd), "{v}");
            let bom = crate::resolve::resolve(&c, &catalog, &Default::default())?;
            let kubeadm = bom.files.iter().find(|f| f.component == "kubeadm").ok_or("no kubeadm")?;
            assert!(
                matches!(kubeadm.checksum, crate::Checksum::Published(_)),
                "{v}: {:?}",
                kubeadm.checksum
            );
            assert!(
                bom.images
                    .iter()
                    .any(|i| i.reference.to_string() == format!("registry.k8s.io/pause:{pause}")),
                "{v}"
            );
            assert!(bom.to_table().contains("not pinned: upstream's checksum"), "{v}");
        }
        Ok(())
    }

    #[test]
    fn a_bundles_locked_catalog_completes_the_same_config_and_refuses_another_version() -> Result<(), Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(format!("{}/../examples/ha.yaml", env!("CARGO_MANIFEST_DIR")))?;
        let full = Catalog::builtin()?;
        let cluster = crate::config::load_str(&text, "ha.yaml", &full)?;
        let bom = crate::resolve::resolve(&cluster, &full, &Default::default())?;
        let mut locked = full.locked_for(&cluster, &bom);
        // It travels as YAML in bundle.yaml and reads back the same.
        let back: Catalog = serde_saphyr::from_str(&serde_saphyr::to_string(&locked)?)?;
        assert_eq!(back, locked);
        assert_eq!(locked.minors.len(), 1);
        assert!(
            locked
                .minor("v1.33.4")
                .is_some_and(|m| m.kubeadm_api_version.starts_with("kubeadm.k8s.io/"))
        );
        // The offline side completes the config exactly as the builder did.
        assert_eq!(crate::config::load_str(&text, "ha.yaml", &locked)?, cluster);
        locked.origin = Some("k.tar.zst".into());
        let other = text.replace("version: v1.33.4", "version: v1.33.1");
        let err = crate::config::load_str(&other, "ha.yaml", &locked).unwrap_err().to_string();
        assert!(err.contains("Kubernetes v1.33.1 is not in the catalog"), "{err}");
        assert!(err.contains("the bundle carries only what it was built for"), "{err}");
        Ok(())
    }

    #[test]
    fn builtin_catalog_reads() {
        let c = Catalog::builtin().unwrap();
        assert_eq!(c.arches, ["amd64", "arm64"]);
        assert!(c.kubernetes_versions().contains(&"v1.33.4".to_string()));
        assert_eq!(c.paired_version("v1.33.4", "etcd").as_deref(), Some("v3.5.22"));
        // Every paired version exists in the components table.
        for (minor, m) in &c.minors {
            for (comp, v) in &m.components {
                assert!(
                    c.components[comp].versions.contains_key(v),
                    "{minor} pairs {comp} {v}, which the catalog lacks"
                );
            }
        }
        for (name, a) in &c.addons {
            assert!(
                a.versions.contains(&a.default),
                "addon {name} default {} is not among its versions",
                a.default
            );
        }
    }

    #[test]
    fn reference_digests_are_copied_not_invented() {
        let c = Catalog::builtin().unwrap();
        let kubeadm = &c.components["kubeadm"].versions["v1.33.4"];
        assert_eq!(kubeadm.len(), 2);
        assert!(kubeadm.values().all(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit())));
    }

    #[test]
    fn overlay_adds_a_version_and_keeps_the_rest() {
        let layer = (
            "extra.yaml".to_string(),
            "components:\n  etcd:\n    versions:\n      v3.5.99: {}\n".to_string(),
        );
        let c = Catalog::from_layers(&[layer]).unwrap();
        assert!(c.components["etcd"].versions["v3.5.99"].is_empty());
        assert!(c.components["etcd"].versions.contains_key("v3.5.22"));
    }

    #[test]
    fn overlay_errors_name_the_file_and_line() {
        let layer = ("extra.yaml".to_string(), "components:\n  etcd:\n    archive: zip\n".to_string());
        let err = Catalog::from_layers(&[layer]).unwrap_err().to_string();
        assert!(
            err.starts_with("extra.yaml:3:5: components.etcd.archive: unknown variant `zip`"),
            "{err}"
        );
    }
}
