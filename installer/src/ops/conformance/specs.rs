//! Which specs a run selects: the quick subset (a list of exact spec names
//! per Kubernetes minor, kept in `manifests/conformance/`) or every
//! conformance spec, as Ginkgo focus and skip expressions.

use serde::Deserialize;

/// The quick subsets this release knows, by minor.
const QUICK: &[(&str, &str)] = &[("v1.37", include_str!("../../../../manifests/conformance/quick-v1.37.yaml"))];

/// One listed spec.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listed {
    /// What it covers (DNS, Services, ...).
    pub area: String,
    /// The exact spec name (conformance.yaml's `codename`).
    pub name: String,
    /// The test images it pulls.
    pub images: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuickFile {
    version: String,
    specs: Vec<Listed>,
}

/// The quick subset for the Kubernetes version `version` (`v1.37.2`), or
/// `None` when this release has none for its minor.
pub fn quick(version: &str) -> Result<Option<Vec<Listed>>, String> {
    let minor: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
    let Some((_, text)) = QUICK.iter().find(|(m, _)| *m == minor) else {
        return Ok(None);
    };
    let f: QuickFile = serde_saphyr::from_str(text).map_err(|e| format!("manifests/conformance/quick-{minor}.yaml: {e}"))?;
    if f.version != minor {
        return Err(format!("manifests/conformance/quick-{minor}.yaml names {}", f.version));
    }
    Ok(Some(f.specs))
}

/// The minors with a quick subset.
pub fn quick_minors() -> Vec<&'static str> {
    QUICK.iter().map(|(m, _)| *m).collect()
}

/// A Ginkgo focus matching exactly `names`. Ginkgo matches it against
/// "Kubernetes e2e suite " followed by the spec's name, so it is anchored
/// by the space before and the end after, not by `^`.
pub fn focus_exactly<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let alts: Vec<String> = names.into_iter().map(escape).collect();
    format!(" ({})$", alts.join("|"))
}

/// `s` with the characters RE2 gives a meaning escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Every conformance spec.
pub const CERTIFIED_FOCUS: &str = r"\[Conformance\]";
/// What the quick subset never runs.
pub const QUICK_SKIP: &str = r"\[Serial\]|\[Disruptive\]";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_subset_covers_every_area_ci_asks_for_and_runs_nothing_serial() -> Result<(), String> {
        let specs = quick("v1.37.2")?.ok_or("no quick subset for v1.37")?;
        assert!(specs.len() >= 40, "{}", specs.len());
        for area in [
            "DNS",
            "Services",
            "Pod networking",
            "HostPort",
            "API server proxy",
            "Aggregator",
            "Admission webhook",
            "kubectl",
            "exec/logs",
            "Pods",
            "Probes",
        ] {
            assert!(specs.iter().any(|s| s.area == area), "no spec for {area}");
        }
        for s in &specs {
            assert!(s.name.contains("[Conformance]"), "{}", s.name);
            assert!(!s.name.contains("[Serial]") && !s.name.contains("[Disruptive]"), "{}", s.name);
        }
        let mut names: Vec<_> = specs.iter().map(|s| &s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), specs.len(), "a spec is listed twice");
        assert!(specs.iter().any(|s| s.name.contains("session affinity")));
        assert!(specs.iter().any(|s| s.name.contains("NodePort")));
        assert!(quick("v1.36.3")?.is_none());
        Ok(())
    }

    #[test]
    fn the_focus_matches_exactly_the_names_given() {
        let f = focus_exactly([
            r#"[sig-node] Probing container should be restarted with a exec "cat /tmp/health" liveness probe [Conformance] [NodeConformance]"#,
            "a (b) c",
        ]);
        assert_eq!(
            f,
            r#" (\[sig-node\] Probing container should be restarted with a exec "cat /tmp/health" liveness probe \[Conformance\] \[NodeConformance\]|a \(b\) c)$"#
        );
    }
}
