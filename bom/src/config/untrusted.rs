//! The rules for a config that arrived as a request (over the API, or
//! through a job database other machines share). Its author is not the
//! worker's operator, so it may name nothing on the worker's machine: no
//! file, no environment variable, no key path, not the SSH agent. Hosts log
//! in with server-side credentials by name (`auth: {credential: NAME}`).
//! Each refusal is reported at its line:column like every other rule.

use super::model::*;
use crate::diag::{Diagnostic, Kind};

const CREDENTIAL: &str =
    "name a server-side credential instead: `auth: {credential: NAME}` (an operator makes one with `kubexm credential create`)";

/// The fields `check` refuses, as paths under `spec` (`[]` for each item of
/// a list): what names a file, a variable or the SSH agent on the machine
/// that reads the config. The Cluster custom resource leaves them out of
/// its schema, for the same reason: its controller runs inside the cluster.
pub const OFF_MACHINE: &[&str] = &[
    "hostDefaults.auth.password",
    "hostDefaults.auth.privateKey",
    "hostDefaults.auth.agent",
    "hostDefaults.bastion.auth.password",
    "hostDefaults.bastion.auth.privateKey",
    "hostDefaults.bastion.auth.agent",
    "hosts[].auth.password",
    "hosts[].auth.privateKey",
    "hosts[].auth.agent",
    "hosts[].bastion.auth.password",
    "hosts[].bastion.auth.privateKey",
    "hosts[].bastion.auth.agent",
    "registry.password",
    "registry.caFile",
    "containerRuntime.auths[].password",
    "etcd.external.caFile",
    "etcd.external.certFile",
    "etcd.external.keyFile",
];

/// Every field of `c` that names a secret, a path or a capability on the worker.
pub fn check(c: &Cluster) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let mut refuse = |path: String, what: &str, hint: &str| {
        out.push(
            Diagnostic::new(
                Kind::Invalid,
                path,
                format!("{what} on the worker's machine, which a config sent as a request may not"),
            )
            .hint(hint),
        );
    };
    let mut auth = |p: &str, a: &Auth| {
        if a.password.is_some() {
            refuse(format!("{p}.password"), "a password read from a file or variable", CREDENTIAL);
        }
        if a.private_key.is_some() {
            refuse(format!("{p}.privateKey"), "a private key file", CREDENTIAL);
        }
        if a.agent == Some(true) {
            refuse(format!("{p}.agent"), "the SSH agent (SSH_AUTH_SOCK)", CREDENTIAL);
        }
    };
    let s = &c.spec;
    if let Some(a) = &s.host_defaults.auth {
        auth("spec.hostDefaults.auth", a);
    }
    if let Some(a) = s.host_defaults.bastion.as_ref().and_then(|b| b.auth.as_ref()) {
        auth("spec.hostDefaults.bastion.auth", a);
    }
    for (i, h) in s.hosts.iter().enumerate() {
        if let Some(a) = &h.auth {
            auth(&format!("spec.hosts[{i}].auth"), a);
        }
        if let Some(a) = h.bastion.as_ref().and_then(|b| b.auth.as_ref()) {
            auth(&format!("spec.hosts[{i}].bastion.auth"), a);
        }
    }
    let not_yet = "not accepted in a request yet: leave it out, or run this install from the worker's machine with kubexm-install";
    if s.registry.password.is_some() {
        refuse(
            "spec.registry.password".into(),
            "a registry password read from a file or variable",
            not_yet,
        );
    }
    if s.registry.ca_file.is_some() {
        refuse("spec.registry.caFile".into(), "a CA file", not_yet);
    }
    for (i, a) in s.container_runtime.auths.iter().enumerate() {
        if a.password.is_some() {
            refuse(
                format!("spec.containerRuntime.auths[{i}].password"),
                "a registry password read from a file or variable",
                not_yet,
            );
        }
    }
    if let Some(e) = &s.etcd.external {
        for (key, f) in [("caFile", &e.ca_file), ("certFile", &e.cert_file), ("keyFile", &e.key_file)] {
            if !f.as_os_str().is_empty() {
                refuse(format!("spec.etcd.external.{key}"), "an etcd client certificate file", not_yet);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `OFF_MACHINE` names exactly what `check` refuses: a config setting
    /// every such field once gets one refusal per entry.
    #[test]
    fn off_machine_lists_every_field_check_refuses() {
        let secret = || SecretRef {
            from_env: Some("X".into()),
            from_file: None,
        };
        let auth = || Auth {
            password: Some(secret()),
            private_key: Some(PrivateKey {
                path: "/k".into(),
                passphrase: None,
            }),
            agent: Some(true),
            credential: None,
        };
        let bastion = || Bastion {
            address: "b".into(),
            auth: Some(auth()),
            ..Default::default()
        };
        let mut c = Cluster::default();
        let s = &mut c.spec;
        s.host_defaults.auth = Some(auth());
        s.host_defaults.bastion = Some(bastion());
        s.hosts.push(Host {
            name: "a".into(),
            auth: Some(auth()),
            bastion: Some(bastion()),
            ..Default::default()
        });
        s.registry.password = Some(secret());
        s.registry.ca_file = Some("/ca".into());
        s.container_runtime.auths.push(RegistryAuth {
            registry: "r".into(),
            username: "u".into(),
            password: Some(secret()),
        });
        s.etcd.external = Some(ExternalEtcd {
            endpoints: vec![],
            ca_file: "/a".into(),
            cert_file: "/b".into(),
            key_file: "/c".into(),
        });
        let mut refused: Vec<String> = check(&c)
            .into_iter()
            .map(|d| d.path.trim_start_matches("spec.").replace("[0]", "[]"))
            .collect();
        refused.sort();
        let mut listed: Vec<String> = OFF_MACHINE.iter().map(|p| p.to_string()).collect();
        listed.sort();
        assert_eq!(refused, listed);
    }
}
