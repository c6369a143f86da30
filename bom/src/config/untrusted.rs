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
