//! Which options this release implements.
//!
//! The model reads every option of the architecture; `manifests/support.yaml`
//! lists those the installer does not implement yet. A config that uses one
//! is refused with "not supported yet" instead of being half-honoured.

use serde::Deserialize;

use super::model::Cluster;
use crate::diag::{Diagnostic, Kind};

const SUPPORT: &str = include_str!("../../../manifests/support.yaml");

/// One option this release refuses.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unsupported {
    pub path: String,
    #[serde(default)]
    pub value: Option<serde_json::Value>,
    #[serde(default)]
    pub set: bool,
    pub what: String,
}

#[derive(Deserialize)]
struct Table {
    unsupported: Vec<Unsupported>,
}

/// The table of unsupported options.
pub fn unsupported() -> Vec<Unsupported> {
    // The table is compiled in and covered by a unit test, so a parse
    // failure here is a build defect, not a user error.
    serde_saphyr::from_str::<Table>(SUPPORT).map(|t| t.unsupported).unwrap_or_default()
}

/// Diagnostics for every unsupported option the config uses.
pub fn check(cluster: &Cluster) -> Vec<Diagnostic> {
    let Ok(value) = serde_json::to_value(cluster) else {
        return Vec::new();
    };
    unsupported()
        .into_iter()
        .filter(|u| {
            let found = u.path.split('.').try_fold(&value, |v, key| v.get(key));
            match (found, &u.value) {
                (Some(v), Some(want)) => v == want,
                (Some(v), None) => u.set && !v.is_null(),
                (None, _) => false,
            }
        })
        .map(|u| {
            Diagnostic::new(Kind::Unsupported, u.path.clone(), format!("{} is not supported yet", u.what))
                .hint("this release refuses it rather than half-implement it; see \"Not supported yet\" in the README")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_parses() {
        assert!(super::unsupported().len() >= 10);
    }
}
