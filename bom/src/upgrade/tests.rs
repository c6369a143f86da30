//! The planner's rules on made-up clusters and locks (issue 30): the chain
//! of hops, each refusal with its reason, and the order of what a hop
//! changes.

use super::*;
use crate::catalog::ArchiveKind;
use crate::image::ImageRef;
use crate::record::JobRef;
use crate::{Checksum, FileItem, ImageItem};

type R = Result<(), Box<dyn std::error::Error>>;

/// a: control plane and etcd (amd64); b, c: workers (c arm64).
const CLUSTER: &str = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\nspec:\n  hosts:\n\
    \x20   - {name: a, address: 10.0.0.1, arch: amd64, auth: {agent: true}}\n\
    \x20   - {name: b, address: 10.0.0.2, arch: amd64, auth: {agent: true}}\n\
    \x20   - {name: c, address: 10.0.0.3, arch: arm64, auth: {agent: true}}\n\
    \x20 roleGroups: {control-plane: [a], etcd: [a], worker: [b, c]}\n\
    \x20 controlPlaneEndpoint: {mode: local-proxy}\n\
    \x20 kubernetes: {version: VERSION}\n";

/// A lock for Kubernetes `k8s` with etcd `etcd`, for amd64 and arm64.
fn bom(k8s: &str, etcd: &str) -> Bom {
    let file = |component: &str, version: &str, arch: &str| FileItem {
        component: component.into(),
        version: version.into(),
        arch: arch.into(),
        url: format!("https://example.invalid/{component}-{version}-{arch}"),
        source: format!("https://example.invalid/{component}-{version}-{arch}"),
        checksum: Checksum::Sha256("00".repeat(32)),
        checksum_url: None,
        path: format!("files/{component}-{version}-{arch}"),
        archive: ArchiveKind::None,
        install: vec![],
    };
    let mut files = Vec::new();
    for arch in ["amd64", "arm64"] {
        for c in ["kubeadm", "kubelet", "kubectl"] {
            files.push(file(c, k8s, arch));
        }
        files.push(file("etcd", etcd, arch));
        files.push(file("containerd", "1.7.13", arch));
    }
    let image = |name: &str| ImageItem {
        reference: ImageRef::parse(&format!("registry.k8s.io/{name}:{k8s}")).unwrap_or_else(|e| panic!("{e}")),
        source: None,
        platforms: vec!["linux/amd64".into(), "linux/arm64".into()],
        digest: Some(format!("sha256:{}", "11".repeat(32))),
        upstream_digest: None,
        platform_manifests: Default::default(),
        from_manifest: None,
    };
    Bom {
        cluster: "c".into(),
        kubernetes_version: k8s.into(),
        arches: vec!["amd64".into(), "arm64".into()],
        files,
        manifests: vec![],
        images: ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"]
            .iter()
            .map(|n| image(n))
            .collect(),
        charts: vec![],
        notes: vec![],
        mirrors: Default::default(),
        os_repos: vec![],
    }
}

/// The record of the cluster installed at `k8s` from `bom(k8s, etcd)`.
fn record(k8s: &str, etcd: &str) -> Result<ClusterRecord, Box<dyn std::error::Error>> {
    let cluster = crate::config::load_str_hosts(&CLUSTER.replace("VERSION", k8s), "c.yaml")?;
    let job = JobRef {
        id: 1,
        kind: "install".into(),
        status: "succeeded".into(),
        finished: 0,
    };
    let arches = [("a", "amd64"), ("b", "amd64"), ("c", "arm64")]
        .iter()
        .map(|(h, a)| (h.to_string(), a.to_string()))
        .collect();
    Ok(ClusterRecord::new(&cluster, job, Some(&bom(k8s, etcd)), None, &arches))
}

/// Every node Ready at `kubelet`.
fn ready(kubelet: &str) -> Vec<NodeNow> {
    ["a", "b", "c"]
        .iter()
        .map(|n| NodeNow {
            name: n.to_string(),
            kubelet: Some(kubelet.into()),
            ready: true,
            cordoned: false,
        })
        .collect()
}

fn input<'a>(record: &'a ClusterRecord, target: &'a str, bundles: &'a [(String, Bom)]) -> PlanInput<'a> {
    PlanInput {
        record,
        nodes: ready(&record.kubernetes),
        target,
        bundles: bundles.iter().map(|(name, bom)| GivenBundle { name, bom }).collect(),
        skip_not_ready: vec![],
        resuming: false,
        installed: vec![],
    }
}

fn given(list: &[(&str, &str)]) -> Vec<(String, Bom)> {
    list.iter()
        .map(|(k8s, etcd)| (format!("k-{k8s}.tar.zst"), bom(k8s, etcd)))
        .collect()
}

fn refused(r: Result<UpgradePlan, Refused>) -> String {
    match r {
        Ok(p) => format!("planned:\n{p}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn versions_parse_and_order() {
    let v = |s: &str| Version::parse(s).unwrap_or_else(|| panic!("{s}"));
    assert!(v("v1.36.3") < v("v1.37.0-rc.1"));
    assert!(v("v1.37.0-rc.1") < v("v1.37.0"));
    assert!(v("1.37.2") < v("v1.37.10"));
    assert!(v("v1.37.0-rc.2") < v("v1.37.0-rc.10"));
    assert!(v("v1.37.0-alpha.1") < v("v1.37.0-rc.0"));
    assert_eq!(v("v1.30.2+k3s1"), v("v1.30.2"));
    assert_eq!(v("v1.37.2").to_string(), "v1.37.2");
    assert_eq!(v("v1.37.0-rc.1").to_string(), "v1.37.0-rc.1");
    for bad in ["", "v1.37", "v1.37.2.1", "latest", "v1.x.2"] {
        assert_eq!(Version::parse(bad), None, "{bad}");
    }
}

/// One minor: one hop; etcd's change is named for its own step; a patch
/// upgrade is one hop marked as such.
#[test]
fn one_minor_is_one_hop_and_a_patch_is_a_patch() -> R {
    let rec = record("v1.36.3", "v3.6.8")?;
    let b = given(&[("v1.37.2", "v3.6.16")]);
    let p = plan(&input(&rec, "v1.37.2", &b))?;
    assert_eq!(p.hops.len(), 1);
    let h = &p.hops[0];
    assert_eq!(
        (h.from.to_string(), h.to.to_string(), h.bundle),
        ("v1.36.3".into(), "v1.37.2".into(), 0)
    );
    assert!(!h.is_patch());
    assert_eq!(h.change("etcd"), Some(("v3.6.8", "v3.6.16")));
    assert_eq!(h.change("kubeadm"), Some(("v1.36.3", "v1.37.2")));
    assert_eq!(h.change("containerd"), None);
    let text = p.to_string();
    assert!(
        text.contains("hop 1: v1.36.3 -> v1.37.2, from k-v1.37.2.tar.zst") && text.contains("etcd v3.6.8 -> v3.6.16"),
        "{text}"
    );

    let rec = record("v1.37.1", "v3.6.16")?;
    let p = plan(&input(&rec, "v1.37.2", &b))?;
    assert_eq!(p.hops.len(), 1);
    assert!(p.hops[0].is_patch() && p.to_string().contains("(patch)"));
    // Already there: nothing to do, not an error.
    let rec = record("v1.37.2", "v3.6.16")?;
    let p = plan(&input(&rec, "v1.37.2", &b))?;
    assert!(p.hops.is_empty() && p.to_string().contains("already runs v1.37.2"), "{p}");
    Ok(())
}

/// Two minors need the middle one's bundle: without it the refusal names
/// the skipped minor; with it, two hops in order (bundles given in any
/// order), the newest patch of the middle minor taken, the older noted.
#[test]
fn a_minor_jump_needs_every_hop_s_bundle() -> R {
    let rec = record("v1.35.4", "v3.6.8")?;
    let only_target = given(&[("v1.37.2", "v3.6.16")]);
    let e = refused(plan(&input(&rec, "v1.37.2", &only_target)));
    assert!(
        e.contains("v1.35.4 -> v1.37.2 skips v1.36") && e.contains("once per hop") && !e.contains("planned"),
        "{e}"
    );
    let chain = given(&[("v1.37.2", "v3.6.16"), ("v1.36.1", "v3.6.8"), ("v1.36.3", "v3.6.8")]);
    let p = plan(&input(&rec, "v1.37.2", &chain))?;
    let ends: Vec<(String, String)> = p.hops.iter().map(|h| (h.to.to_string(), h.bundle_name.clone())).collect();
    assert_eq!(
        ends,
        [
            ("v1.36.3".to_string(), "k-v1.36.3.tar.zst".to_string()),
            ("v1.37.2".into(), "k-v1.37.2.tar.zst".into())
        ]
    );
    assert_eq!(p.hops[0].from.to_string(), "v1.35.4");
    assert_eq!(p.hops[1].from.to_string(), "v1.36.3");
    assert_eq!(p.hops[0].change("etcd"), None);
    assert_eq!(p.hops[1].change("etcd"), Some(("v3.6.8", "v3.6.16")));
    assert_eq!(p.unused.len(), 1);
    assert!(
        p.unused[0].contains("k-v1.36.1.tar.zst") && p.unused[0].contains("older patch of v1.36"),
        "{p}"
    );
    let text = p.to_string();
    assert!(text.contains("in 2 hop(s)") && text.contains("hop 2: v1.36.3 -> v1.37.2"), "{text}");
    Ok(())
}

/// A downgrade, a target no bundle carries, a version given twice.
#[test]
fn downgrades_and_missing_or_doubled_bundles_are_refused() -> R {
    let rec = record("v1.37.2", "v3.6.16")?;
    let b = given(&[("v1.36.3", "v3.6.8")]);
    let e = refused(plan(&input(&rec, "v1.36.3", &b)));
    assert!(e.contains("v1.36.3 is older than the v1.37.2") && e.contains("no downgrade"), "{e}");
    let rec = record("v1.36.3", "v3.6.8")?;
    let e = refused(plan(&input(&rec, "v1.37.2", &b)));
    assert!(e.contains("no bundle given carries Kubernetes v1.37.2"), "{e}");
    let twice = given(&[("v1.37.2", "v3.6.16"), ("v1.37.2", "v3.6.16")]);
    let e = refused(plan(&input(&rec, "v1.37.2", &twice)));
    assert!(e.contains("both carry Kubernetes v1.37.2"), "{e}");
    Ok(())
}

/// A NotReady node is refused unless a worker named by --skip-not-ready;
/// a skipped node keeps its kubelet, checked against every hop; a
/// control-plane node cannot be skipped, nor a Ready one.
#[test]
fn not_ready_nodes_and_the_skew_of_skipped_ones() -> R {
    let rec = record("v1.36.3", "v3.6.8")?;
    let b = given(&[("v1.37.2", "v3.6.16")]);
    let mut i = input(&rec, "v1.37.2", &b);
    i.nodes[2].ready = false;
    i.nodes[0].ready = false;
    let e = refused(plan(&i));
    assert!(
        e.contains("node c is NotReady")
            && e.contains("--skip-not-ready c")
            && e.contains("node a is NotReady: bring it back, or take it out first"),
        "{e}"
    );
    i.skip_not_ready = vec!["c".into(), "a".into(), "b".into(), "zz".into()];
    let e = refused(plan(&i));
    assert!(e.contains("--skip-not-ready a: a is a control-plane node"), "{e}");
    assert!(e.contains("--skip-not-ready b: b is Ready"), "{e}");
    assert!(e.contains("--skip-not-ready zz: the API server knows no node zz"), "{e}");
    i.nodes[0].ready = true;
    i.skip_not_ready = vec!["c".into()];
    let p = plan(&i)?;
    assert_eq!(p.skipped, [("c".to_string(), "v1.36.3".to_string())]);
    assert!(
        p.to_string()
            .contains("left alone (NotReady, --skip-not-ready): c, its kubelet stays v1.36.3")
    );

    // A skipped node at v1.34 is 3 behind v1.37: allowed; at v1.33 it is
    // 4 behind the last hop's API server: refused, naming the hop.
    let rec = record("v1.35.4", "v3.6.8")?;
    let chain = given(&[("v1.36.3", "v3.6.8"), ("v1.37.2", "v3.6.16")]);
    let mut i = input(&rec, "v1.37.2", &chain);
    i.nodes[2] = NodeNow {
        name: "c".into(),
        kubelet: Some("v1.34.9".into()),
        ready: false,
        cordoned: false,
    };
    i.skip_not_ready = vec!["c".into()];
    assert_eq!(plan(&i)?.hops.len(), 2);
    i.nodes[2].kubelet = Some("v1.33.9".into());
    let e = refused(plan(&i));
    assert!(
        e.contains("node c: its kubelet v1.33.9 would be 4 minors older than the API server at v1.37.2")
            && e.contains("left alone by --skip-not-ready"),
        "{e}"
    );
    Ok(())
}

/// A kubelet newer than the target, or so old that the first hop's API
/// server would be more than three minors ahead of it.
#[test]
fn kubelets_outside_the_skew_policy_are_refused() -> R {
    let rec = record("v1.36.3", "v3.6.8")?;
    let b = given(&[("v1.37.2", "v3.6.16")]);
    let mut i = input(&rec, "v1.37.2", &b);
    i.nodes[1].kubelet = Some("v1.38.0".into());
    i.nodes[2].kubelet = Some("v1.33.1".into());
    let e = refused(plan(&i));
    assert!(e.contains("node b: its kubelet v1.38.0 is newer than v1.37.2"), "{e}");
    assert!(
        e.contains("node c: its kubelet v1.33.1 would be 4 minors older than the API server at v1.37.2")
            && e.contains("moves the API server before the kubelets"),
        "{e}"
    );
    i.nodes[2].kubelet = Some("v1.34.1".into());
    i.nodes[1].kubelet = Some("v1.36.3".into());
    assert_eq!(plan(&i)?.hops.len(), 1);
    Ok(())
}

/// What a hop installs must be in its bundle: a lock without the arm64
/// kubelet, without kube-proxy's image, or with OS packages for arm64
/// only, is refused naming each.
#[test]
fn an_artifact_missing_from_a_hop_s_bundle_is_named() -> R {
    let rec = record("v1.36.3", "v3.6.8")?;
    let mut b = given(&[("v1.37.2", "v3.6.16")]);
    b[0].1.files.retain(|f| !(f.component == "kubelet" && f.arch == "arm64"));
    b[0].1.images.retain(|i| i.reference.repository != "kube-proxy");
    b[0].1.images[0].platforms = vec!["linux/arm64".into()];
    // OS packages for arm64 only: the amd64 nodes lack theirs.
    b[0].1.os_repos = vec![crate::bom::OsRepoItem {
        release: "debian-bookworm".into(),
        distro: "debian".into(),
        codename: "bookworm".into(),
        component: "main".into(),
        arch: "arm64".into(),
        mirror: "https://example.invalid/debian".into(),
        path: "os/debian-bookworm/arm64".into(),
        roles: Default::default(),
        packages: vec![],
    }];
    let e = refused(plan(&input(&rec, "v1.37.2", &b)));
    assert!(
        e.contains("k-v1.37.2.tar.zst (Kubernetes v1.37.2) lacks what its hop installs")
            && e.contains("kubelet v1.37.2 for arm64")
            && e.contains("image registry.k8s.io/kube-proxy:v1.37.2")
            && e.contains("image registry.k8s.io/kube-apiserver:v1.37.2 for amd64")
            && e.contains("OS packages for amd64")
            && !e.contains("OS packages for arm64")
            && !e.contains("kubelet v1.37.2 for amd64"),
        "{e}"
    );
    Ok(())
}

/// A skipped node whose kubelet the API server does not report cannot be
/// checked; a member the API server has no Node for is named; a kubelet
/// newer than an intermediate hop's API server is caught there, while one
/// a patch ahead of its API server is within the policy.
#[test]
fn unknown_kubelets_missing_nodes_and_the_middle_hop_s_skew() -> R {
    let rec = record("v1.36.3", "v3.6.8")?;
    let b = given(&[("v1.37.2", "v3.6.16")]);
    let mut i = input(&rec, "v1.37.2", &b);
    i.nodes[2] = NodeNow {
        name: "c".into(),
        kubelet: None,
        ready: false,
        cordoned: false,
    };
    i.skip_not_ready = vec!["c".into()];
    let e = refused(plan(&i));
    assert!(e.contains("node c: the API server reports no kubelet version"), "{e}");
    i.nodes.remove(2);
    i.skip_not_ready.clear();
    let e = refused(plan(&i));
    assert!(e.contains("c is a node of the record, but the API server has no Node c"), "{e}");

    let rec = record("v1.35.4", "v3.6.8")?;
    let chain = given(&[("v1.36.3", "v3.6.8"), ("v1.37.2", "v3.6.16")]);
    let mut i = input(&rec, "v1.37.2", &chain);
    i.nodes[1].kubelet = Some("v1.37.0".into());
    let e = refused(plan(&i));
    assert!(
        e.contains("node b: its kubelet v1.37.0 is newer than v1.36.3, the API server of a hop"),
        "{e}"
    );
    i.nodes[1].kubelet = Some("v1.35.9".into());
    assert_eq!(plan(&i)?.hops.len(), 2, "a kubelet a patch ahead of the API server is allowed");
    Ok(())
}

/// The middle hop's bundle is checked like the last's: etcd missing for
/// arm64 (the cluster runs it there) is named with that bundle.
#[test]
fn a_middle_hop_s_bundle_is_checked_too() -> R {
    let rec = record("v1.35.4", "v3.6.8")?;
    let mut chain = given(&[("v1.36.3", "v3.6.8"), ("v1.37.2", "v3.6.16")]);
    chain[0].1.files.retain(|f| !(f.component == "etcd" && f.arch == "arm64"));
    let e = refused(plan(&input(&rec, "v1.37.2", &chain)));
    assert!(
        e.contains("k-v1.36.3.tar.zst (Kubernetes v1.36.3) lacks what its hop installs: etcd for arm64")
            && !e.contains("k-v1.37.2.tar.zst (Kubernetes"),
        "{e}"
    );
    // A patch of the running minor is not a hop.
    let extra = given(&[("v1.35.5", "v3.6.8"), ("v1.36.3", "v3.6.8"), ("v1.37.2", "v3.6.16")]);
    let p = plan(&input(&rec, "v1.37.2", &extra))?;
    assert_eq!(p.hops.len(), 2);
    assert!(p.unused[0].contains("a patch of the running v1.35"), "{:?}", p.unused);
    Ok(())
}

/// `spec.upgrade`: workers at once and the drain's time limit, checked
/// where they are written; an upgrade's defaults are one worker and 600 s.
#[test]
fn upgrade_settings_are_validated() -> R {
    let c = crate::config::load_str_hosts(&CLUSTER.replace("VERSION", "v1.37.2"), "c.yaml")?;
    assert_eq!((c.spec.upgrade.max_unavailable, c.spec.upgrade.drain_timeout_seconds), (1, 600));
    let bad = CLUSTER.replace("VERSION", "v1.37.2") + "  upgrade: {maxUnavailable: 0, drainTimeoutSeconds: 5}\n";
    let e = match crate::config::load_str_hosts(&bad, "c.yaml") {
        Ok(_) => "accepted".to_string(),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("spec.upgrade.maxUnavailable")
            && e.contains("maxUnavailable 0 is outside 1..100")
            && e.contains("drainTimeoutSeconds 5"),
        "{e}"
    );
    let ok = CLUSTER.replace("VERSION", "v1.37.2") + "  upgrade: {maxUnavailable: 2}\n";
    assert_eq!(crate::config::load_str_hosts(&ok, "c.yaml")?.spec.upgrade.max_unavailable, 2);
    Ok(())
}

/// Issue 30: a run that resumes an upgrade which stopped with a node
/// NotReady and cordoned (its new kubelet failed) upgrades that node again;
/// without an unfinished upgrade, or uncordoned, it is refused as before.
#[test]
fn a_resumed_upgrade_takes_a_node_it_left_cordoned_and_not_ready() -> R {
    let rec = record("v1.36.3", "v3.6.8")?;
    let b = given(&[("v1.37.2", "v3.6.16")]);
    let mut i = input(&rec, "v1.37.2", &b);
    i.nodes[1].ready = false;
    i.nodes[1].cordoned = true;
    let e = refused(plan(&i));
    assert!(e.contains("node b is NotReady"), "{e}");
    i.resuming = true;
    let p = plan(&i)?;
    assert_eq!((p.hops.len(), p.resumed.clone()), (1, vec!["b".to_string()]));
    assert!(
        p.to_string().contains("NotReady and cordoned by the upgrade that stopped: b"),
        "{p}"
    );
    i.nodes[1].cordoned = false;
    assert!(refused(plan(&i)).contains("node b is NotReady"));
    Ok(())
}

/// Issue 30: what the hosts' binaries say is checked against the record
/// and the hops: a version neither names is refused (changed outside
/// kubexm), one a stopped run already put in passes; versions are read
/// from each binary's own output.
#[test]
fn a_host_running_a_version_nobody_installed_is_refused() -> R {
    assert_eq!(release("v1.36.3").as_deref(), Some("1.36.3"));
    assert_eq!(
        release("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1").as_deref(),
        Some("1.6.20")
    );
    assert_eq!(release("etcd Version: 3.6.8").as_deref(), Some("3.6.8"));
    assert_eq!(release("containerd containerd.io v1.7.13 7c3aca7").as_deref(), Some("1.7.13"));
    assert_eq!(release("no version here 1.2"), None);
    let rec = record("v1.36.3", "v3.6.8")?;
    let b = given(&[("v1.37.2", "v3.6.16")]);
    let mut i = input(&rec, "v1.37.2", &b);
    let at = |h: &str, c: &str, v: &str| (h.to_string(), c.to_string(), v.to_string());
    i.installed = vec![
        at("a", "etcd", "etcd Version: 3.6.8"),
        at("b", "etcd", "etcd Version: 3.6.16"),
        at("c", "kubeadm", "garbage"),
    ];
    assert_eq!(plan(&i)?.hops.len(), 1);
    i.installed.push(at("c", "etcd", "etcd Version: 3.5.9"));
    let e = refused(plan(&i));
    assert!(e.contains("c runs etcd 3.5.9, but the record says v3.6.8"), "{e}");
    // A NotReady worker left alone keeps what it runs.
    i.installed = vec![at("c", "kubeadm", "v1.35.4")];
    assert!(refused(plan(&i)).contains("c runs kubeadm 1.35.4"));
    i.nodes[2].ready = false;
    i.skip_not_ready = vec!["c".into()];
    assert_eq!(plan(&i)?.hops.len(), 1);
    Ok(())
}
