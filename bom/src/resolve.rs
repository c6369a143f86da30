//! Resolution: a completed cluster config plus the catalog give the bill of
//! materials (BOM), the list of everything the bundle must carry.
//!
//! The order is deterministic (components in catalog order, then arch in
//! catalog order; images and charts sorted), so the same inputs always give
//! the same BOM and, later, the same bundle bytes. Upstream mirrors are
//! applied here, once: each item keeps its upstream identity and gains the
//! URL it is actually fetched from.

use std::collections::{BTreeMap, BTreeSet};

use crate::bom::{Bom, ChartItem, ChartSource, Checksum, FileItem, ImageItem, ManifestItem, OsRepoItem};
use crate::catalog::{Catalog, render};
use crate::config::model::{Cluster, DeployMode, EndpointMode, EtcdMode, Spec};
use crate::image::ImageRef;
use crate::mirror::Mirrors;

/// Why a config could not be resolved. Validation catches these first; they
/// remain for configs built in code or catalogs overridden after validation.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{component} {version} is not in the catalog; add it with --catalog FILE")]
    UnknownVersion { component: String, version: String },
    #[error("the catalog has no component `{0}`")]
    UnknownComponent(String),
    #[error("{0}")]
    BadImage(#[from] crate::image::BadImageRef),
    #[error("bad mirror: {0}")]
    Mirror(String),
}

/// Components every kubeadm cluster needs on every arch, in BOM order.
const KUBEADM_COMPONENTS: &[&str] = &[
    "kubeadm",
    "kubelet",
    "kubectl",
    "containerd",
    "runc",
    "crictl",
    "cni-plugins",
    "helm",
];

/// Resolves a completed config (see [`crate::config::load_file`]).
pub fn resolve(cluster: &Cluster, catalog: &Catalog, extra_mirrors: &Mirrors) -> Result<Bom, ResolveError> {
    let spec = &cluster.spec;
    let mut mirrors = Mirrors::parse(spec.bundle.mirrors.iter().map(|(k, v)| (k.as_str(), v.as_str()))).map_err(ResolveError::Mirror)?;
    mirrors.extend(extra_mirrors.clone());
    let k8s = spec.kubernetes.version.as_str();
    let arches = arches(spec, catalog);
    let mut files = files(spec, catalog, &mirrors, &arches)?;
    let (manifests, mut charts, mut image_refs) = addon_items(spec, catalog, &mirrors)?;
    conformance(spec, catalog, &mirrors, &arches, &mut files, &mut image_refs)?;
    bundle_charts(spec, &mirrors, &mut charts);
    charts.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    charts.dedup_by(|a, b| a.path == b.path);
    let mut control_plane_only = kubeadm_images(spec, catalog, &mut image_refs)?;
    // The controller's Deployment runs on control-plane nodes.
    if spec.operator.enabled {
        let r = crate::image::controller_image();
        control_plane_only.insert(r.clone());
        image_refs.insert(r);
    }
    for i in &spec.bundle.extra_images {
        image_refs.insert(ImageRef::parse(i)?);
    }
    let images = images(spec, &mirrors, &arches, image_refs, &control_plane_only);
    let minor = catalog.minor(k8s);
    let os_repos = os_repos(cluster, catalog, &arches);
    Ok(Bom {
        cluster: cluster.metadata.name.clone(),
        kubernetes_version: k8s.to_string(),
        arches,
        files,
        manifests,
        images,
        charts,
        notes: minor.map(|m| m.notes.clone()).unwrap_or_default(),
        mirrors: mirrors.entries().into_iter().collect::<BTreeMap<_, _>>(),
        os_repos,
    })
}

/// The bundle's arches plus any host's declared one, in catalog order.
fn arches(spec: &Spec, catalog: &Catalog) -> Vec<String> {
    let wanted: BTreeSet<&str> = spec
        .bundle
        .arches
        .iter()
        .chain(spec.hosts.iter().filter_map(|h| h.arch.as_ref()))
        .map(String::as_str)
        .collect();
    catalog.arches.iter().filter(|a| wanted.contains(a.as_str())).cloned().collect()
}

/// The component binaries for every arch, then the config's extra files.
fn files(spec: &Spec, catalog: &Catalog, mirrors: &Mirrors, arches: &[String]) -> Result<Vec<FileItem>, ResolveError> {
    let k8s = spec.kubernetes.version.as_str();
    let mut versions: Vec<(&str, String)> = Vec::new();
    if spec.kubernetes.deploy_mode == DeployMode::Kubeadm {
        for c in KUBEADM_COMPONENTS {
            let v = match *c {
                "kubeadm" | "kubelet" | "kubectl" => Some(k8s.to_string()),
                "containerd" => spec.container_runtime.version.clone(),
                other => catalog.paired_version(k8s, other),
            };
            if let Some(v) = v {
                versions.push((c, v));
            }
        }
    }
    if spec.etcd.mode == EtcdMode::Binary
        && let Some(v) = &spec.etcd.version
    {
        versions.insert(3.min(versions.len()), ("etcd", v.clone()));
    }
    let mut files = Vec::new();
    for (name, version) in &versions {
        files.extend(component_files(catalog, mirrors, name, version, arches)?);
    }
    for f in &spec.bundle.files {
        let arch = f.arch.clone().unwrap_or_else(|| "any".into());
        files.push(FileItem {
            component: f.name.clone(),
            version: "extra".into(),
            path: format!("files/extra/{}/{arch}/{}", f.name, file_name(&f.url)),
            arch,
            source: mirrors.rewrite_url(&f.url),
            url: f.url.clone(),
            checksum: Checksum::Sha256(f.sha256.to_lowercase()),
            checksum_url: None,
            archive: crate::catalog::ArchiveKind::None,
            install: Vec::new(),
        });
    }

    Ok(files)
}

/// One component at one version, a file per arch.
fn component_files(
    catalog: &Catalog,
    mirrors: &Mirrors,
    name: &str,
    version: &str,
    arches: &[String],
) -> Result<Vec<FileItem>, ResolveError> {
    let comp = catalog
        .component(name)
        .ok_or_else(|| ResolveError::UnknownComponent(name.to_string()))?;
    let digests = comp.versions.get(version).ok_or_else(|| ResolveError::UnknownVersion {
        component: name.to_string(),
        version: version.to_string(),
    })?;
    let mut files = Vec::new();
    for arch in arches {
        let url = render(&comp.url, version, arch);
        let (checksum, checksum_url) = match (digests.get(arch), &comp.checksum_url) {
            (Some(d), _) => (Checksum::Sha256(d.clone()), None),
            (None, Some(u)) => {
                let published = render(u, version, arch);
                (Checksum::Published(mirrors.rewrite_url(&published)), Some(published))
            }
            (None, None) => (Checksum::Unknown, None),
        };
        files.push(FileItem {
            component: name.to_string(),
            version: version.to_string(),
            arch: arch.clone(),
            path: format!("files/{name}/{version}/{arch}/{}", file_name(&url)),
            source: mirrors.rewrite_url(&url),
            url,
            checksum,
            checksum_url,
            archive: comp.archive,
            install: comp
                .install
                .iter()
                .map(|e| crate::catalog::InstallEntry {
                    from: render(&e.from, version, arch),
                    to: e.to.clone(),
                    optional: e.optional,
                })
                .collect(),
        });
    }
    Ok(files)
}

/// The component holding `e2e.test` and `ginkgo` (upstream's
/// `kubernetes-test-linux-<arch>.tar.gz`).
pub const CONFORMANCE_COMPONENT: &str = "kubernetes-test";

/// The arch the conformance tests run on: the installer host's, which is the
/// registry host's (the installer runs the registry there) when the config
/// declares it, else the bundle's first arch.
pub fn runner_arch(spec: &Spec, arches: &[String]) -> Option<String> {
    spec.role_groups
        .registry
        .first()
        .and_then(|r| spec.hosts.iter().find(|h| &h.name == r))
        .and_then(|h| h.arch.clone())
        .or_else(|| arches.first().cloned())
}

/// `conformance.enabled`: the test binaries for the runner's arch and the
/// conformance images (for every arch) of the cluster's minor.
fn conformance(
    spec: &Spec,
    catalog: &Catalog,
    mirrors: &Mirrors,
    arches: &[String],
    files: &mut Vec<FileItem>,
    image_refs: &mut BTreeSet<ImageRef>,
) -> Result<(), ResolveError> {
    if !spec.conformance.enabled {
        return Ok(());
    }
    let k8s = spec.kubernetes.version.as_str();
    let set = catalog
        .minor(k8s)
        .and_then(|m| m.conformance.as_ref())
        .ok_or_else(|| ResolveError::UnknownVersion {
            component: "conformance tests".into(),
            version: k8s.to_string(),
        })?;
    let runner: Vec<String> = runner_arch(spec, arches).into_iter().collect();
    files.extend(component_files(catalog, mirrors, CONFORMANCE_COMPONENT, k8s, &runner)?);
    for i in &set.images {
        image_refs.insert(ImageRef::parse(i)?);
    }
    Ok(())
}

/// The enabled addons' manifests, charts and fixed images (images in the
/// manifests are found at build time).
#[allow(clippy::type_complexity)]
fn addon_items(
    spec: &Spec,
    catalog: &Catalog,
    mirrors: &Mirrors,
) -> Result<(Vec<ManifestItem>, Vec<ChartItem>, BTreeSet<ImageRef>), ResolveError> {
    let mut addons: Vec<(&str, String)> = crate::addons::enabled_addons(spec)
        .into_iter()
        .filter_map(|a| a.version.map(|v| (a.name, v)))
        .collect();
    if spec.control_plane_endpoint.mode == EndpointMode::KubeVip
        && let Some(a) = catalog.addon("kube-vip")
    {
        addons.push(("kube-vip", a.default.clone()));
    }
    let mut manifests = Vec::new();
    let mut charts = Vec::new();
    let mut image_refs: BTreeSet<ImageRef> = BTreeSet::new();
    for (name, version) in &addons {
        let Some(addon) = catalog.addon(name) else {
            return Err(ResolveError::UnknownComponent(name.to_string()));
        };
        for t in &addon.manifests {
            let url = render(t, version, "");
            manifests.push(ManifestItem {
                addon: name.to_string(),
                version: version.clone(),
                path: format!("manifests/{name}/{version}/{}", file_name(&url)),
                source: mirrors.rewrite_url(&url),
                url,
                sha256: None,
            });
        }
        if let Some(t) = &addon.chart {
            let url = render(t, version, "");
            charts.push(ChartItem {
                name: name.to_string(),
                version: version.clone(),
                path: format!("charts/{name}-{version}.tgz"),
                upstream: url.clone(),
                source: ChartSource::Url {
                    url: mirrors.rewrite_url(&url),
                },
                sha256: None,
            });
        }
        for t in &addon.images {
            image_refs.insert(ImageRef::parse(&render(t, version, ""))?);
        }
    }
    Ok((manifests, charts, image_refs))
}

/// The config's own charts (`bundle.charts`).
fn bundle_charts(spec: &Spec, mirrors: &Mirrors, charts: &mut Vec<ChartItem>) {
    for c in &spec.bundle.charts {
        let source = match (&c.repo, &c.url, &c.oci) {
            (Some(r), _, _) => ChartSource::Repo {
                repo: mirrors.rewrite_url(r),
            },
            (_, Some(u), _) => ChartSource::Url {
                url: mirrors.rewrite_url(u),
            },
            (_, _, Some(o)) => ChartSource::Oci { reference: o.clone() },
            _ => continue,
        };
        charts.push(ChartItem {
            name: c.name.clone(),
            version: c.version.clone(),
            path: format!("charts/{}-{}.tgz", c.name, c.version),
            upstream: c
                .repo
                .clone()
                .or_else(|| c.url.clone())
                .or_else(|| c.oci.clone())
                .unwrap_or_default(),
            source,
            sha256: c.sha256.as_ref().map(|s| s.to_lowercase()),
        });
    }
}

/// Adds the images kubeadm pulls, known before any manifest is read, and
/// returns those only a control-plane node runs.
fn kubeadm_images(spec: &Spec, catalog: &Catalog, image_refs: &mut BTreeSet<ImageRef>) -> Result<BTreeSet<ImageRef>, ResolveError> {
    let k8s = spec.kubernetes.version.as_str();
    // Images kubeadm pulls, known before any manifest is read. Those only a
    // control-plane node runs are carried for the control-plane nodes'
    // arches when every one of them is known (an arm64 worker needs no arm64
    // API server); for all the bundle's arches otherwise.
    let mut control_plane_only = BTreeSet::new();
    if spec.kubernetes.deploy_mode == DeployMode::Kubeadm {
        for c in ["kube-apiserver", "kube-controller-manager", "kube-scheduler"] {
            let r = ImageRef::parse(&format!("registry.k8s.io/{c}:{k8s}"))?;
            control_plane_only.insert(r.clone());
            image_refs.insert(r);
        }
        image_refs.insert(ImageRef::parse(&format!("registry.k8s.io/kube-proxy:{k8s}"))?);
        if let Some(minor) = catalog.minor(k8s) {
            let mut wanted = vec!["pause"];
            if spec.dns.coredns.enabled {
                wanted.push("coredns");
            }
            if spec.etcd.mode == EtcdMode::Kubeadm {
                wanted.push("etcd");
            }
            for w in wanted {
                if let Some(r) = minor.images.get(w) {
                    let r = ImageRef::parse(r)?;
                    if w == "etcd" {
                        control_plane_only.insert(r.clone());
                    }
                    image_refs.insert(r);
                }
            }
        }
    }
    Ok(control_plane_only)
}

/// Every image with its platforms: those only a control-plane node runs
/// for the control-plane nodes' arches when every one of them is known.
fn images(
    spec: &Spec,
    mirrors: &Mirrors,
    arches: &[String],
    image_refs: BTreeSet<ImageRef>,
    control_plane_only: &BTreeSet<ImageRef>,
) -> Vec<ImageItem> {
    let platforms: Vec<String> = arches.iter().map(|a| format!("linux/{a}")).collect();
    let control_plane_arches: Option<BTreeSet<&str>> = spec
        .role_groups
        .control_plane
        .iter()
        .map(|n| spec.hosts.iter().find(|h| &h.name == n).and_then(|h| h.arch.as_deref()))
        .collect();
    let control_plane_platforms: Vec<String> = match control_plane_arches {
        Some(known) if !known.is_empty() => platforms
            .iter()
            .filter(|p| known.iter().any(|a| p.as_str() == format!("linux/{a}")))
            .cloned()
            .collect(),
        _ => platforms.clone(),
    };
    image_refs
        .into_iter()
        .map(|r| ImageItem {
            // The controller's image is built, never pulled: no mirror applies.
            source: if r.is_controller() { None } else { mirrors.rewrite_image(&r) },
            platforms: if control_plane_only.contains(&r) {
                control_plane_platforms.clone()
            } else {
                platforms.clone()
            },
            reference: r,
            digest: None,
            upstream_digest: None,
            platform_manifests: Default::default(),
            from_manifest: None,
        })
        .collect()
}

/// One repository per release and arch, with the packages each role present
/// in the cluster needs, and the extras for every host.
fn os_repos(cluster: &Cluster, catalog: &Catalog, bundle_arches: &[String]) -> Vec<OsRepoItem> {
    let Some(os) = &cluster.spec.bundle.os_packages else {
        return Vec::new();
    };
    let g = &cluster.spec.role_groups;
    let present = [
        ("etcd", !g.etcd.is_empty()),
        ("control-plane", !g.control_plane.is_empty()),
        ("worker", !g.worker.is_empty()),
        ("loadbalancer", !g.loadbalancer.is_empty()),
        ("local-proxy", !cluster.local_proxy_hosts().is_empty()),
        ("all", true),
    ];
    let mut roles: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (role, here) in present {
        if !here {
            continue;
        }
        let mut p = catalog.os.roles.get(role).cloned().unwrap_or_default();
        if role == "all" {
            p.extend(os.extra.iter().cloned());
        }
        p.sort();
        p.dedup();
        if !p.is_empty() {
            roles.insert(role.to_string(), p);
        }
    }
    let arches = if os.arches.is_empty() {
        bundle_arches.to_vec()
    } else {
        os.arches.clone()
    };
    let mut out = Vec::new();
    for name in &os.releases {
        let Some(r) = catalog.os.releases.get(name) else { continue };
        for arch in &arches {
            out.push(OsRepoItem {
                release: name.clone(),
                distro: r.distro.clone(),
                codename: r.codename.clone(),
                component: r.component.clone(),
                arch: arch.clone(),
                mirror: os.mirror.trim_end_matches('/').to_string(),
                path: format!("os/{name}/{arch}"),
                roles: roles.clone(),
                packages: Vec::new(),
            });
        }
    }
    out
}

fn file_name(url: &str) -> &str {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/').next().filter(|s| !s.is_empty()).unwrap_or("download")
}
