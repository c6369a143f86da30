//! `kubexm-install conformance` refuses, before running anything, a cluster
//! the state database does not know, a bundle without the test binaries and
//! one that lacks an image the tests pull (named).

use std::path::Path;

use assert_cmd::Command;
use kubexm_bom::{Checksum, FileItem, ImageItem, catalog::Catalog, image::ImageRef};
use kubexm_installer::engine::state::State;

fn conformance(root: &Path, cluster: &str) -> (Option<i32>, String) {
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["conformance", "--cluster", cluster, "--root"])
        .arg(root)
        .arg("--state")
        .arg(root.join("state.db"))
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// An unpacked bundle of cluster `t` (Kubernetes v1.37.2, the catalog's
/// conformance list) with the test archive when `tests`, and these images.
fn unpacked(root: &Path, tests: bool, images: &[&str]) {
    let mut m = kubexm_bundle::testing::manifest(vec![]);
    m.lock.kubernetes_version = "v1.37.2".into();
    m.catalog = Some(Catalog::builtin().unwrap());
    let file = |component: &str, name: &str| {
        let arch = kubexm_installer::installer_arch();
        let url = format!("https://dl.k8s.io/release/v1.37.2/{name}");
        FileItem {
            component: component.into(),
            version: "v1.37.2".into(),
            arch: arch.into(),
            path: format!("files/{component}/v1.37.2/{arch}/{name}"),
            source: url.clone(),
            url,
            checksum: Checksum::Sha256("00".repeat(32)),
            checksum_url: None,
            archive: kubexm_bom::catalog::ArchiveKind::None,
            install: vec![],
        }
    };
    if tests {
        m.lock.files.push(file("kubernetes-test", "kubernetes-test-linux-amd64.tar.gz"));
        m.lock.files.push(file("kubectl", "kubectl"));
    }
    for i in images {
        let reference = ImageRef::parse(i).unwrap();
        m.lock.images.push(ImageItem {
            source: None,
            reference,
            platforms: vec!["linux/amd64".into()],
            digest: None,
            upstream_digest: None,
            platform_manifests: Default::default(),
            from_manifest: None,
        });
    }
    let dir = root.join("bundles").join("b1");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("bundle.yaml"), m.to_yaml().unwrap()).unwrap();
    std::fs::write(dir.join(".kubexm-complete"), "b1\n").unwrap();
}

fn installed(root: &Path, cluster: &str) {
    let st = State::open(&root.join("state.db"), vec![]).unwrap();
    let job = st.begin_job(cluster, "install").unwrap();
    st.finish_job(job, "succeeded").unwrap();
}

#[test]
fn refusals_come_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();

    let (code, err) = conformance(root, "t");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("records no successful install of cluster t"), "{err}");

    installed(root, "t");
    unpacked(root, false, &[]);
    let (code, err) = conformance(root, "t");
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("carries no conformance tests") && err.contains("conformance: {enabled: true}"),
        "{err}"
    );

    let set = Catalog::builtin().unwrap().minor("v1.37.2").unwrap().conformance.clone().unwrap();
    let all: Vec<&str> = set.images.iter().map(String::as_str).collect();
    let without_busybox: Vec<&str> = all.iter().copied().filter(|i| !i.contains("/busybox:")).collect();
    unpacked(root, true, &without_busybox);
    let (code, err) = conformance(root, "t");
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("it lacks registry.k8s.io/e2e-test-images/busybox:1.37.0-2"), "{err}");

    // Everything in the bundle: next is the admin kubeconfig.
    unpacked(root, true, &all);
    let (code, err) = conformance(root, "t");
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("no admin kubeconfig at"), "{err}");

    let (code, err) = conformance(root, "other");
    assert_eq!(code, Some(2), "{err}");
}
