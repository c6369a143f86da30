//! The rule for bastions: a bastion without an `auth` of its own may log
//! in as its host does only with a key or the agent (a signature that never
//! leaves this machine). A host's password, or a named credential (which
//! may be one), is never sent to its bastion: that would hand the target's
//! secret to another machine, perhaps someone else's, without a word.

use super::defaults::sends_secret;
use super::model::{Auth, Bastion, Cluster};
use crate::diag::{Diagnostic, Kind};

/// A problem for every bastion without `auth` whose host logs in with a
/// password or a credential.
pub fn check(c: &Cluster) -> Vec<Diagnostic> {
    let s = &c.spec;
    let defaults = s.host_defaults.auth.as_ref();
    let mut out = Vec::new();
    for (i, h) in s.hosts.iter().enumerate() {
        let auth = h.auth.as_ref().or(defaults);
        match &h.bastion {
            Some(b) => out.extend(problem(format!("spec.hosts[{i}].bastion"), b, auth)),
            None => {
                if let Some(b) = &s.host_defaults.bastion {
                    out.extend(problem("spec.hostDefaults.bastion".into(), b, auth));
                }
            }
        }
    }
    out.dedup_by(|a, b| a.path == b.path);
    out
}

fn problem(path: String, b: &Bastion, host_auth: Option<&Auth>) -> Option<Diagnostic> {
    (b.auth.is_none() && host_auth.is_some_and(sends_secret)).then(|| {
        Diagnostic::new(
            Kind::Invalid,
            path,
            format!(
                "bastion {} has no auth of its own, and its host logs in with a password or credential; \
                 kubexm does not send a host's secret to its bastion",
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
    auth: {password: {fromEnv: PW}}
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
    fn a_bastion_without_its_own_auth_is_refused_at_its_line() -> Result<(), Box<dyn std::error::Error>> {
        let e = load_str_hosts(CONFIG, "cluster.yaml").unwrap_err().to_string();
        assert!(e.contains("cluster.yaml:11:"), "{e}");
        assert!(e.contains("spec.hosts[1].bastion"), "{e}");
        assert!(e.contains("bastion 10.0.0.9 has no auth of its own"), "{e}");
        // With the agent, the bastion logs in as its host does.
        let agent = CONFIG.replace("auth: {password: {fromEnv: PW}}", "auth: {agent: true}");
        let c = load_str_hosts(&agent, "cluster.yaml")?;
        let bastion = c.spec.hosts[1].bastion.as_ref().ok_or("no bastion")?;
        assert_eq!(bastion.auth.as_ref().ok_or("no bastion auth")?.agent, Some(true));
        assert!(!e.contains("spec.hosts[2]"), "{e}");
        let fixed = CONFIG.replace("user: jump}", "user: jump, auth: {agent: true}}");
        let c = load_str_hosts(&fixed, "cluster.yaml")?;
        assert_eq!(c.spec.hosts[1].bastion.as_ref().ok_or("no bastion")?.user.as_deref(), Some("jump"));
        Ok(())
    }

    #[test]
    fn a_default_bastion_needs_its_own_auth_too() {
        let text = CONFIG.replace(
            "    auth: {password: {fromEnv: PW}}\n  hosts:",
            "    auth: {password: {fromEnv: PW}}\n    bastion: {address: 10.0.0.8}\n  hosts:",
        );
        let e = load_str_hosts(&text, "cluster.yaml").unwrap_err().to_string();
        assert!(e.contains("spec.hostDefaults.bastion"), "{e}");
        assert!(e.contains("cluster.yaml:7:"), "{e}");
    }
}
