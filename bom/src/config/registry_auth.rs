//! The rule for `registry.clientAuth`: kubexm issues client certificates
//! for its own registry only; a site registry (mode external) has its own
//! authentication (`registry.username`, its CA).

use super::model::{Registry, RegistryMode};
use crate::diag::{Diagnostic, Kind};

/// The problem with `registry.clientAuth`, if any.
pub fn check(r: &Registry) -> Option<Diagnostic> {
    (r.client_auth && r.mode == RegistryMode::External).then(|| {
        Diagnostic::new(
            Kind::Invalid,
            "spec.registry.clientAuth",
            "clientAuth applies to the local registry (mode local), not to a site registry",
        )
        .hint("remove clientAuth, or use registry.mode: local; a site registry authenticates with its own credentials (registry.username)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_auth_is_for_the_local_registry_only() {
        let mut r = Registry {
            client_auth: true,
            ..Registry::default()
        };
        assert!(check(&r).is_none());
        r.mode = RegistryMode::External;
        assert!(check(&r).is_some_and(|d| d.path == "spec.registry.clientAuth"));
    }
}
