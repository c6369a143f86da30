//! BOM resolution of the examples, checked against the reference digests.

use std::path::Path;

use kubexm_bom::mirror::Mirrors;
use kubexm_bom::{Checksum, config, resolve::resolve};

use crate::catalog;

fn example(name: &str) -> kubexm_bom::Bom {
    let path = Path::new(&manifest_dir()).join("../examples").join(name);
    let cluster = config::load_file(&path, &catalog()).unwrap();
    resolve(&cluster, &catalog(), &Mirrors::default()).unwrap()
}

#[test]
fn ha_example_bom() {
    insta::assert_json_snapshot!(example("ha.yaml"));
}

#[test]
fn single_node_example_bom() {
    insta::assert_json_snapshot!(example("single-node.yaml"));
}

#[test]
fn ha_bom_has_both_arches_and_the_reference_digests() {
    let bom = example("ha.yaml");
    assert_eq!(bom.arches, ["amd64", "arm64"]);
    // The published upstream digests of the versions the catalog pins, kept
    // with the tests (a subset of a public reference; see tests/fixtures/README.md).
    let reference = Path::new(&manifest_dir()).join("tests/fixtures/upstream-sha256.json");
    let text = std::fs::read_to_string(&reference).unwrap_or_else(|e| panic!("{}: {e}", reference.display()));
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let names = [("cni-plugins", "kubecni")];
    for f in &bom.files {
        let refname = names
            .iter()
            .find(|(n, _)| *n == f.component)
            .map_or(f.component.as_str(), |(_, r)| r);
        let want = reference[refname][&f.arch][&f.version]
            .as_str()
            .unwrap_or_else(|| panic!("{} {} {} not in the reference", f.component, f.version, f.arch));
        assert_eq!(
            f.checksum,
            Checksum::Sha256(want.to_string()),
            "{} {} {}",
            f.component,
            f.version,
            f.arch
        );
        assert!(f.url.starts_with("https://"), "{}", f.url);
    }
    for arch in ["amd64", "arm64"] {
        for c in [
            "kubeadm",
            "kubelet",
            "kubectl",
            "etcd",
            "containerd",
            "runc",
            "crictl",
            "cni-plugins",
            "helm",
        ] {
            assert!(bom.files.iter().any(|f| f.component == c && f.arch == arch), "{c} {arch} missing");
        }
    }
    let images: Vec<String> = bom.images.iter().map(|i| i.reference.to_string()).collect();
    for i in [
        "registry.k8s.io/kube-apiserver:v1.33.4",
        "registry.k8s.io/pause:3.10",
        "registry.k8s.io/coredns/coredns:v1.12.0",
    ] {
        assert!(images.contains(&i.to_string()), "{i} missing from {images:?}");
    }
    let addons: Vec<&str> = bom.manifests.iter().map(|m| m.addon.as_str()).collect();
    for a in ["calico", "nodelocaldns", "metallb", "openebs-localpv"] {
        assert!(addons.contains(&a), "{a} manifest missing");
    }
}

#[test]
fn mirrors_rewrite_sources_but_keep_identities() {
    let path = Path::new(&manifest_dir()).join("../examples/single-node.yaml");
    let cluster = config::load_file(&path, &catalog()).unwrap();
    let m = Mirrors::from_args(&[
        "dl.k8s.io=http://198.18.0.1:8080/dl.k8s.io".into(),
        "registry.k8s.io=http://198.18.0.1:5000/registry.k8s.io".into(),
    ])
    .unwrap();
    let bom = resolve(&cluster, &catalog(), &m).unwrap();
    let kubeadm = bom.files.iter().find(|f| f.component == "kubeadm").unwrap();
    assert_eq!(kubeadm.url, "https://dl.k8s.io/release/v1.33.4/bin/linux/amd64/kubeadm");
    assert_eq!(
        kubeadm.source,
        "http://198.18.0.1:8080/dl.k8s.io/release/v1.33.4/bin/linux/amd64/kubeadm"
    );
    let pause = bom.images.iter().find(|i| i.reference.repository == "pause").unwrap();
    assert_eq!(pause.source.as_deref(), Some("http://198.18.0.1:5000/registry.k8s.io/pause:3.10"));
}

#[test]
fn resolution_is_deterministic() {
    assert_eq!(example("ha.yaml"), example("ha.yaml"));
}

/// The package's folder, read when the test runs: a test binary reused from a
/// checkout elsewhere (a shared CARGO_TARGET_DIR) must not point there.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR")
}

#[test]
fn control_plane_images_are_carried_for_the_control_plane_arches_only() {
    let path = Path::new(&manifest_dir()).join("../examples/ha.yaml");
    let mut cluster = config::load_file(&path, &catalog()).unwrap();
    let platforms = |c: &kubexm_bom::config::Cluster, image: &str| -> Vec<String> {
        let bom = resolve(c, &catalog(), &Mirrors::default()).unwrap();
        let item = bom.images.iter().find(|i| i.reference.repository.ends_with(image)).unwrap();
        item.platforms.clone()
    };
    // Arches unknown until install: every bundle arch.
    assert_eq!(platforms(&cluster, "kube-apiserver"), ["linux/amd64", "linux/arm64"]);
    let cp = cluster.spec.role_groups.control_plane.clone();
    for h in cluster.spec.hosts.iter_mut() {
        h.arch = Some(if cp.contains(&h.name) { "amd64" } else { "arm64" }.into());
    }
    for image in ["kube-apiserver", "kube-controller-manager", "kube-scheduler"] {
        assert_eq!(platforms(&cluster, image), ["linux/amd64"], "{image}");
    }
    for image in ["kube-proxy", "pause", "coredns"] {
        assert_eq!(platforms(&cluster, image), ["linux/amd64", "linux/arm64"], "{image}");
    }
}

/// Issue 31: `operator.enabled: true` adds the controller's image, for the
/// control-plane arches, never pulled through a mirror.
#[test]
fn operator_enabled_adds_the_controller_s_image_for_the_control_plane_arches() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(Path::new(&manifest_dir()).join("../examples/ha.yaml")).unwrap();
    let path = dir.path().join("ha.yaml");
    std::fs::write(&path, text.replace("\nspec:\n", "\nspec:\n  operator: {enabled: true}\n")).unwrap();
    let mut cluster = config::load_file(&path, &catalog()).unwrap();
    let mirrors = Mirrors::from_args(&["kubexm.io=https://harbor.local/kubexm".into()]).unwrap();
    let image = |c: &kubexm_bom::config::Cluster| {
        let bom = resolve(c, &catalog(), &mirrors).unwrap();
        bom.images.into_iter().find(|i| i.reference.is_controller()).unwrap()
    };
    let item = image(&cluster);
    assert_eq!(
        item.reference.to_string(),
        format!("kubexm.io/kubexm:{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(item.source, None);
    assert_eq!(item.platforms, ["linux/amd64", "linux/arm64"]);
    let cp = cluster.spec.role_groups.control_plane.clone();
    for h in cluster.spec.hosts.iter_mut() {
        h.arch = Some(if cp.contains(&h.name) { "arm64" } else { "amd64" }.into());
    }
    assert_eq!(image(&cluster).platforms, ["linux/arm64"]);
    // Off (the default): no image.
    let plain = config::load_file(&Path::new(&manifest_dir()).join("../examples/ha.yaml"), &catalog()).unwrap();
    let bom = resolve(&plain, &catalog(), &Mirrors::default()).unwrap();
    assert!(!bom.images.iter().any(|i| i.reference.is_controller()));
}

#[test]
fn conformance_adds_the_test_binaries_for_the_runner_and_its_images_for_every_arch() {
    let path = Path::new(&manifest_dir()).join("../examples/ha.yaml");
    let mut cluster = config::load_file(&path, &catalog()).unwrap();
    cluster.spec.kubernetes.version = "v1.37.2".into();
    let without = resolve(&cluster, &catalog(), &Mirrors::default()).unwrap();
    assert!(!without.files.iter().any(|f| f.component == "kubernetes-test"));
    assert!(!without.images.iter().any(|i| i.reference.repository.ends_with("agnhost")));

    cluster.spec.conformance.enabled = true;
    let bom = resolve(&cluster, &catalog(), &Mirrors::default()).unwrap();
    let tests: Vec<_> = bom.files.iter().filter(|f| f.component == "kubernetes-test").collect();
    assert_eq!(tests.len(), 1, "one arch: the installer host's");
    assert_eq!(tests[0].arch, "amd64");
    assert_eq!(tests[0].url, "https://dl.k8s.io/release/v1.37.2/kubernetes-test-linux-amd64.tar.gz");
    assert_eq!(
        tests[0].checksum,
        Checksum::Published("https://dl.k8s.io/release/v1.37.2/kubernetes-test-linux-amd64.tar.gz.sha256".into())
    );
    assert!(tests[0].install.is_empty(), "never installed on a node");
    let set = catalog().minor("v1.37.2").unwrap().conformance.clone().unwrap();
    for want in &set.images {
        let item = bom
            .images
            .iter()
            .find(|i| i.reference.to_string() == *want)
            .unwrap_or_else(|| panic!("{want} is not in the BOM"));
        assert_eq!(item.platforms, ["linux/amd64", "linux/arm64"], "{want}");
    }
    for left_out in set.left_out.keys() {
        assert!(!bom.images.iter().any(|i| i.reference.to_string() == *left_out), "{left_out}");
    }

    // The installer host is the registry host: its arch when declared.
    let registry = cluster.spec.role_groups.registry[0].clone();
    for h in cluster.spec.hosts.iter_mut().filter(|h| h.name == registry) {
        h.arch = Some("arm64".into());
    }
    let bom = resolve(&cluster, &catalog(), &Mirrors::default()).unwrap();
    let arches: Vec<_> = bom
        .files
        .iter()
        .filter(|f| f.component == "kubernetes-test")
        .map(|f| f.arch.as_str())
        .collect();
    assert_eq!(arches, ["arm64"]);
}

/// Issue 29: the cluster record of the HA example carries each host's roles,
/// one version per component and every pinned file's digest, and reads back
/// equal from its JSON (the completed config included).
#[test]
fn the_cluster_record_of_the_ha_example_round_trips() -> Result<(), Box<dyn std::error::Error>> {
    use kubexm_bom::record::{ClusterRecord, JobRef, NodeState};
    let path = Path::new(&manifest_dir()).join("../examples/ha.yaml");
    let cluster = config::load_file(&path, &catalog())?;
    let bom = resolve(&cluster, &catalog(), &Mirrors::default())?;
    let job = JobRef {
        id: 7,
        kind: "install".into(),
        status: "succeeded".into(),
        finished: 1,
    };
    let r = ClusterRecord::new(&cluster, job, Some(&bom), Some("sha256:00"), &Default::default());
    assert_eq!(r.nodes.len(), cluster.spec.hosts.len());
    assert!(r.nodes.iter().all(|n| n.state == NodeState::Member && !n.roles.is_empty()));
    assert_eq!(r.members().count(), r.nodes.len());
    let pinned = bom.files.iter().filter(|f| matches!(f.checksum, Checksum::Sha256(_))).count();
    assert_eq!(r.artifacts.iter().filter(|a| a.kind == "file").count(), pinned);
    for c in ["kubeadm", "kubelet", "etcd", "containerd"] {
        assert!(r.versions.contains_key(c), "no {c} in {:?}", r.versions);
    }
    let back: ClusterRecord = serde_json::from_str(&serde_json::to_string(&r)?)?;
    assert_eq!(back, r);
    Ok(())
}
