//! One invalid config per validation rule; the message is the snapshot.

use kubexm_bom::config::{LoadError, load_str};

use crate::{BASE, catalog};

/// Applies `(old, new)` edits to the base config and returns the error text.
fn errors(edits: &[(&str, &str)]) -> String {
    let mut text = BASE.to_string();
    for (old, new) in edits {
        assert!(text.contains(old), "edit target {old:?} is not in the base config");
        text = text.replacen(old, new, 1);
    }
    match load_str(&text, "cluster.yaml", &catalog()) {
        Ok(_) => panic!("config was accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn base_config_is_valid() {
    load_str(BASE, "cluster.yaml", &catalog()).unwrap();
}

#[test]
fn unknown_key_suggests_the_close_one() {
    insta::assert_snapshot!(errors(&[("    version: v1.33.4", "    verison: v1.33.4")]));
}

#[test]
fn even_etcd_member_count() {
    insta::assert_snapshot!(errors(&[("etcd: [cp1, cp2, cp3]", "etcd: [cp1, cp2]")]));
}

#[test]
fn no_etcd_members() {
    insta::assert_snapshot!(errors(&[("etcd: [cp1, cp2, cp3]", "etcd: []")]));
}

#[test]
fn pod_and_service_cidrs_overlap() {
    insta::assert_snapshot!(errors(&[(
        "    version: v1.33.4",
        "    version: v1.33.4\n    podCIDR: 10.100.0.0/16"
    )]));
}

#[test]
fn node_cidr_overlaps_and_host_inside_service_cidr() {
    insta::assert_snapshot!(errors(&[
        ("    version: v1.33.4", "    version: v1.33.4\n    nodeCIDR: 10.0.0.0/8"),
        ("address: 10.0.0.13", "address: 10.96.0.13"),
    ]));
}

#[test]
fn duplicate_host_names() {
    insta::assert_snapshot!(errors(&[("name: cp2,", "name: cp1,")]));
}

#[test]
fn duplicate_host_addresses() {
    insta::assert_snapshot!(errors(&[("address: 10.0.0.12", "address: 10.0.0.11")]));
}

#[test]
fn role_names_an_unknown_host() {
    insta::assert_snapshot!(errors(&[("control-plane: [cp1, cp2, cp3]", "control-plane: [cp1, cp2, cp4]")]));
}

#[test]
fn mode_a_without_vip() {
    insta::assert_snapshot!(errors(&[("    address: 10.0.0.100\n", "")]));
}

#[test]
fn unknown_arch() {
    insta::assert_snapshot!(errors(&[(
        "{name: lb1, address: 10.0.0.5}",
        "{name: lb1, address: 10.0.0.5, arch: arm46}"
    )]));
}

#[test]
fn unknown_kubernetes_version() {
    insta::assert_snapshot!(errors(&[("version: v1.33.4", "version: v1.33.99")]));
}

#[test]
fn unknown_component_version() {
    insta::assert_snapshot!(errors(&[("  kubernetes:", "  etcd: {version: v3.9.0}\n  kubernetes:")]));
}

#[test]
fn host_without_auth() {
    insta::assert_snapshot!(errors(&[("  hostDefaults:\n    auth: {agent: true}\n", "")]));
}

#[test]
fn two_auth_methods() {
    insta::assert_snapshot!(errors(&[("{agent: true}", "{agent: true, privateKey: {path: /k}}")]));
}

#[test]
fn option_not_supported_yet() {
    insta::assert_snapshot!(errors(&[("mode: haproxy-keepalived", "mode: kube-vip")]));
}

#[test]
fn conformance_for_a_minor_without_its_tests_is_not_supported_yet() {
    insta::assert_snapshot!(errors(&[("  kubernetes:", "  conformance: {enabled: true}\n  kubernetes:")]));
}

#[test]
fn wrong_api_version_and_kind() {
    insta::assert_snapshot!(errors(&[
        ("kubexm.io/v1alpha1", "kubexm.io/v1"),
        ("kind: Cluster", "kind: Clutser")
    ]));
}

#[test]
fn inline_password_is_refused_and_never_echoed() {
    let out = errors(&[("{agent: true}", "{password: hunter2}")]);
    assert!(!out.contains("hunter2"), "the secret leaked into the message:\n{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn value_of_the_wrong_type() {
    insta::assert_snapshot!(errors(&[(
        "{name: lb1, address: 10.0.0.5}",
        "{name: lb1, address: 10.0.0.5, port: twenty}"
    )]));
}

#[test]
fn malformed_cidr() {
    insta::assert_snapshot!(errors(&[(
        "    version: v1.33.4",
        "    version: v1.33.4\n    serviceCIDR: 10.96.0.0/40"
    )]));
}

#[test]
fn external_registry_without_address() {
    insta::assert_snapshot!(errors(&[("  kubernetes:", "  registry: {mode: external}\n  kubernetes:")]));
}

#[test]
fn metallb_without_pool_and_bad_image() {
    insta::assert_snapshot!(errors(&[(
        "  kubernetes:",
        "  loadBalancerService: {metallb: {enabled: true}}\n  bundle: {extraImages: [Not/An/Image]}\n  kubernetes:"
    )]));
}

#[test]
fn every_problem_is_reported_at_once() {
    let out = errors(&[
        ("apiVersion: kubexm.io/v1alpha1", "apiVersoin: kubexm.io/v1alpha1"),
        ("etcd: [cp1, cp2, cp3]", "etcd: [cp1, cp2]"),
        ("address: 10.0.0.12", "address: 10.0.0.11"),
        ("    address: 10.0.0.100\n", ""),
    ]);
    insta::assert_snapshot!(out);
}

#[test]
fn yaml_syntax_error_stops_at_the_first() {
    let err = load_str("apiVersion: x\nspec: [\n  a: b\n", "cluster.yaml", &catalog()).unwrap_err();
    assert!(matches!(err, LoadError::Invalid(_)));
    insta::assert_snapshot!(err.to_string());
}

#[test]
fn duplicate_keys_are_refused() {
    let text = BASE.replace("kind: Cluster\n", "kind: Cluster\nkind: Cluster\n");
    let err = load_str(&text, "cluster.yaml", &catalog()).unwrap_err().to_string();
    assert!(err.contains("cluster.yaml:3:"), "{err}");
}

#[test]
fn kubelet_settings_are_checked() {
    let text = errors(&[(
        "    version: v1.33.4",
        "    version: v1.33.4\n    kubeadm: {ignorePreflightErrors: [\"bad name\"], controlPlaneTimeoutSeconds: 5}",
    )]);
    assert!(text.contains("`bad name` is not a kubeadm preflight check name"), "{text}");
    assert!(text.contains("5 s is outside 30 to 3600"), "{text}");
}

/// Issue 24, item 11: a host path reset would `rm -rf` is refused at its
/// line:column when it is a system directory, relative or not normalized.
#[test]
fn host_paths_never_name_a_system_directory() {
    for (dir, why) in [
        ("/usr", "is or holds the system directory /usr"),
        ("/", "root of the host's file system"),
        ("/var/lib", "is or holds the system directory /var/lib"),
        ("/var", "is or holds the system directory /var"),
        ("/etc/etcd", "lies inside the system directory /etc"),
        ("/var/lib/etcd/../..", "not a normalized path"),
        ("var/lib/etcd", "not an absolute path"),
        ("'/data/etcd;reboot'", "holds ';'"),
    ] {
        let e = errors(&[("  kubernetes:\n", &format!("  etcd: {{dataDir: {dir}}}\n  kubernetes:\n"))]);
        assert!(e.contains("spec.etcd.dataDir") && e.contains(why), "{dir}: {e}");
        assert!(e.contains("cluster.yaml:20:"), "{dir}: no line:column in {e}");
    }
    let e = errors(&[("  kubernetes:\n", "  containerRuntime: {dataRoot: /usr/lib}\n  kubernetes:\n")]);
    assert!(e.contains("spec.containerRuntime.dataRoot"), "{e}");
    let ok = BASE.replace("  kubernetes:\n", "  etcd: {dataDir: /data/etcd}\n  kubernetes:\n");
    load_str(&ok, "cluster.yaml", &catalog()).unwrap();
}
