//! The rule for bastions: each has its own `auth`. A bastion without one
//! used to get the host's password or key, sending the target's secret to
//! another machine (one that may belong to someone else) without a word.

use super::model::{Bastion, Cluster};
use crate::diag::{Diagnostic, Kind};

/// A problem for every bastion without an `auth` of its own.
pub fn check(c: &Cluster) -> Vec<Diagnostic> {
    let s = &c.spec;
    let hosts = s
        .hosts
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.bastion.as_ref().map(|b| (format!("spec.hosts[{i}].bastion"), b)));
    let defaults = s
        .host_defaults
        .bastion
        .as_ref()
        .map(|b| ("spec.hostDefaults.bastion".to_string(), b));
    hosts.chain(defaults).filter_map(|(p, b)| problem(p, b)).collect()
}

fn problem(path: String, b: &Bastion) -> Option<Diagnostic> {
    b.auth.is_none().then(|| {
        Diagnostic::new(
            Kind::Invalid,
            path,
            format!(
                "bastion {} has no auth of its own; kubexm does not send a host's password or key to its bastion",
                b.address
            ),
        )
        .hint("set the bastion's auth (password, privateKey, agent: true or credential); repeat the host's only if the bastion is meant to have it")
    })
}

#[cfg(test)]
mod tests {
    use crate::config::load_str_hosts;

    const CONFIG: &str = "apiVersion: kubexm.io/v1alpha1
kind: Cluster
metadata: {name: c}
spec:
  hostDefaults:
    auth: {agent: true}
  hosts:
    - {name: a, address: 10.0.0.1}
    - name: b
      address: 10.0.0.2
      bastion: {address: 10.0.0.9, user: jump}
    - {name: c, address: 10.0.0.3, bastion: {address: 10.0.0.9, auth: {agent: true}}}
  roleGroups: {etcd: [a], control-plane: [a]}
  controlPlaneEndpoint: {mode: local-proxy}
";

    /// A bastion without auth got the host's credential (defaults.rs copied it).
    #[test]
    fn a_bastion_without_its_own_auth_is_refused_at_its_line() {
        let e = load_str_hosts(CONFIG, "cluster.yaml").unwrap_err().to_string();
        assert!(e.contains("cluster.yaml:11:"), "{e}");
        assert!(e.contains("spec.hosts[1].bastion"), "{e}");
        assert!(e.contains("bastion 10.0.0.9 has no auth of its own"), "{e}");
        assert!(!e.contains("spec.hosts[2]"), "{e}");
        let fixed = CONFIG.replace("user: jump}", "user: jump, auth: {agent: true}}");
        let c = load_str_hosts(&fixed, "cluster.yaml").unwrap();
        assert_eq!(c.spec.hosts[1].bastion.as_ref().unwrap().user.as_deref(), Some("jump"));
    }

    #[test]
    fn a_default_bastion_needs_its_own_auth_too() {
        let text = CONFIG.replace(
            "    auth: {agent: true}\n  hosts:",
            "    auth: {agent: true}\n    bastion: {address: 10.0.0.8}\n  hosts:",
        );
        let e = load_str_hosts(&text, "cluster.yaml").unwrap_err().to_string();
        assert!(e.contains("spec.hostDefaults.bastion"), "{e}");
        assert!(e.contains("cluster.yaml:7:"), "{e}");
    }
}
