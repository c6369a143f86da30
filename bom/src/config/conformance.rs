//! `spec.conformance`: Kubernetes' conformance tests exist in the catalog
//! for some minors only; asking for them on another is "not supported yet".

use super::model::Cluster;
use crate::catalog::Catalog;
use crate::diag::{Diagnostic, Kind};

/// The problems with `spec.conformance` against `catalog` (none without one).
pub fn check(c: &Cluster, catalog: Option<&Catalog>) -> Vec<Diagnostic> {
    let s = &c.spec;
    let v = &s.kubernetes.version;
    let Some(catalog) = catalog else { return Vec::new() };
    if !s.conformance.enabled || v.is_empty() || catalog.minor(v).is_none_or(|m| m.conformance.is_some()) {
        return Vec::new();
    }
    let have: Vec<_> = catalog
        .minors
        .iter()
        .filter(|(_, m)| m.conformance.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    vec![
        Diagnostic::new(
            Kind::Unsupported,
            "spec.conformance.enabled",
            format!("conformance tests for Kubernetes {} are not supported yet", Catalog::minor_of(v)),
        )
        .hint(format!("minors with conformance tests: {}", have.join(", "))),
    ]
}
