//! The upgrade's version rules, checked before any host is touched: from
//! what a cluster runs (its record, and each node's kubelet and readiness
//! as the API server reports them) and what the operator gives (the
//! config's version, one bundle per hop), the chain of hops, one minor at
//! a time, or every reason it is refused, all at once:
//!
//! - a downgrade (there is none: an etcd snapshot is the way back);
//! - a minor skipped: each minor between the running one and the target
//!   needs a bundle of its own (`--bundle` once per hop), since kubeadm
//!   upgrades one minor at a time;
//! - a kubelet that would end newer than the API server, or more than
//!   three minors older than it at any hop (Kubernetes' version skew
//!   policy), including a node left alone by `--skip-not-ready`, which
//!   keeps its kubelet through every hop;
//! - an artifact a hop needs missing from its bundle (kubeadm, kubelet and
//!   kubectl for each node's arch, the control-plane and kube-proxy images);
//! - a node NotReady, unless named by `--skip-not-ready` (a worker only:
//!   every control-plane node and etcd member takes part).
//!
//! A patch upgrade within a minor is one hop with no hop checks.

use std::collections::BTreeMap;
use std::fmt;

use crate::Bom;
use crate::record::ClusterRecord;

pub mod order;

/// The newest kubelet minor may be this many minors older than the API
/// server (Kubernetes' version skew policy since v1.28).
pub const KUBELET_SKEW: u32 = 3;

/// A Kubernetes release, `vMAJOR.MINOR.PATCH`: a pre-release (`-rc.1`)
/// sorts before its release, identifiers compared as numbers where they
/// are; build metadata (`+k3s1`) is ignored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    pre: PreRelease,
}

/// Declared so that any pre-release sorts before the release.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum PreRelease {
    Some(Vec<Ident>),
    None,
}

/// A pre-release identifier: numbers sort before words, as in semver.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Ident {
    Num(u64),
    Word(String),
}

impl Version {
    /// `v1.37.2` (the `v` optional; `-rc.1` and `+build` allowed).
    pub fn parse(s: &str) -> Option<Version> {
        let t = s.trim().trim_start_matches('v');
        let t = t.split_once('+').map_or(t, |(v, _)| v);
        let (core, pre) = match t.split_once('-') {
            Some((c, p)) if !p.is_empty() => (
                c,
                PreRelease::Some(
                    p.split('.')
                        .map(|i| i.parse().map_or_else(|_| Ident::Word(i.to_string()), Ident::Num))
                        .collect(),
                ),
            ),
            Some(_) => return None,
            None => (t, PreRelease::None),
        };
        let mut it = core.split('.').map(|p| p.parse::<u32>().ok());
        let v = Version {
            major: it.next()??,
            minor: it.next()??,
            patch: it.next()??,
            pre,
        };
        it.next().is_none().then_some(v)
    }

    /// `v1.37`.
    pub fn minor_name(&self) -> String {
        format!("v{}.{}", self.major, self.minor)
    }

    /// The same major and minor.
    fn same_minor(&self, other: &Version) -> bool {
        self.major == other.major && self.minor == other.minor
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)?;
        if let PreRelease::Some(ids) = &self.pre {
            let ids: Vec<String> = ids
                .iter()
                .map(|i| match i {
                    Ident::Num(n) => n.to_string(),
                    Ident::Word(w) => w.clone(),
                })
                .collect();
            write!(f, "-{}", ids.join("."))?;
        }
        Ok(())
    }
}

/// A node as the API server reports it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNow {
    pub name: String,
    /// `status.nodeInfo.kubeletVersion`; `None`: not registered.
    pub kubelet: Option<String>,
    pub ready: bool,
    /// `spec.unschedulable`: cordoned.
    pub cordoned: bool,
}

/// A bundle given for the upgrade: what messages call it, and its lock.
#[derive(Debug, Clone, Copy)]
pub struct GivenBundle<'a> {
    pub name: &'a str,
    pub bom: &'a Bom,
}

/// What the planner is asked.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// The cluster as its last successful job left it.
    pub record: &'a ClusterRecord,
    /// Every node the API server knows.
    pub nodes: Vec<NodeNow>,
    /// The version the config asks for.
    pub target: &'a str,
    /// Every bundle given, in any order.
    pub bundles: Vec<GivenBundle<'a>>,
    /// NotReady workers to leave alone.
    pub skip_not_ready: Vec<String>,
    /// The cluster's last job was an upgrade that did not finish: a node it
    /// left cordoned and NotReady (its kubelet failed after the new one was
    /// put in) is upgraded again, not refused.
    pub resuming: bool,
    /// What the hosts run, as their binaries say: `(host, component,
    /// version)` for kubeadm, etcd and containerd where installed.
    pub installed: Vec<(String, String, String)>,
}

/// One hop: the whole cluster from one version to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub from: Version,
    pub to: Version,
    /// The index in [`PlanInput::bundles`] of the bundle it installs from.
    pub bundle: usize,
    /// The bundle's name, for messages.
    pub bundle_name: String,
    /// Components whose version changes in this hop, `(name, from, to)`:
    /// etcd and containerd among them get their own node-by-node step.
    pub changes: Vec<(String, String, String)>,
}

impl Hop {
    /// Within one minor: no hop checks, nothing but patch releases.
    pub fn is_patch(&self) -> bool {
        self.from.major == self.to.major && self.from.minor == self.to.minor
    }

    /// The change of `component` in this hop, if any.
    pub fn change(&self, component: &str) -> Option<(&str, &str)> {
        self.changes
            .iter()
            .find(|(c, _, _)| c == component)
            .map(|(_, a, b)| (a.as_str(), b.as_str()))
    }
}

/// The chain of hops, and what it leaves alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradePlan {
    pub cluster: String,
    pub from: Version,
    pub to: Version,
    pub hops: Vec<Hop>,
    /// NotReady workers left alone, with the kubelet they keep.
    pub skipped: Vec<(String, String)>,
    /// NotReady nodes the unfinished upgrade left cordoned: upgraded again.
    pub resumed: Vec<String>,
    /// Bundles given that no hop uses, and why.
    pub unused: Vec<String>,
}

impl fmt::Display for UpgradePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.hops.is_empty() {
            return writeln!(f, "upgrade: cluster {} already runs {}: nothing to do", self.cluster, self.to);
        }
        writeln!(
            f,
            "upgrade: cluster {} from {} to {} in {} hop(s), one minor at a time:",
            self.cluster,
            self.from,
            self.to,
            self.hops.len()
        )?;
        for (i, h) in self.hops.iter().enumerate() {
            let kind = if h.is_patch() { " (patch)" } else { "" };
            writeln!(f, "  hop {}: {} -> {}{kind}, from {}", i + 1, h.from, h.to, h.bundle_name)?;
            for (c, a, b) in &h.changes {
                writeln!(f, "      {c} {a} -> {b}")?;
            }
        }
        for (n, v) in &self.skipped {
            writeln!(f, "  left alone (NotReady, --skip-not-ready): {n}, its kubelet stays {v}")?;
        }
        for n in &self.resumed {
            writeln!(f, "  NotReady and cordoned by the upgrade that stopped: {n}, upgraded again")?;
        }
        for u in &self.unused {
            writeln!(f, "  not used: {u}")?;
        }
        Ok(())
    }
}

/// Why an upgrade is refused: every reason found, each saying what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub cluster: String,
    pub reasons: Vec<String>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the upgrade of cluster {} is refused before any host is touched:", self.cluster)?;
        for r in &self.reasons {
            write!(f, "\n  - {r}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {}

/// The chain of hops from what `input.record` runs to `input.target`, or
/// every reason not to start.
pub fn plan(input: &PlanInput<'_>) -> Result<UpgradePlan, Refused> {
    let record = input.record;
    let mut reasons = Vec::new();
    let refused = |reasons: Vec<String>| Refused {
        cluster: record.name.clone(),
        reasons,
    };
    let from = Version::parse(&record.kubernetes).ok_or_else(|| {
        refused(vec![format!(
            "the record's Kubernetes version {:?} is not a version",
            record.kubernetes
        )])
    })?;
    let to = Version::parse(input.target).ok_or_else(|| {
        refused(vec![format!(
            "spec.kubernetes.version {:?} is not a version (vMAJOR.MINOR.PATCH)",
            input.target
        )])
    })?;
    if to < from {
        return Err(refused(vec![format!(
            "{to} is older than the {from} the cluster runs: there is no downgrade (kubeadm has none); \
             to go back, restore the etcd snapshot taken before the upgrade on a cluster reinstalled at {from}"
        )]));
    }
    if to.major != from.major {
        return Err(refused(vec![format!("{from} -> {to} changes the major version: not supported")]));
    }
    if to == from {
        return Ok(UpgradePlan {
            cluster: record.name.clone(),
            from,
            to,
            hops: vec![],
            skipped: vec![],
            resumed: vec![],
            unused: vec![],
        });
    }
    // Each bundle's version; the same version twice is ambiguous.
    let mut by_version: BTreeMap<Version, usize> = BTreeMap::new();
    let mut unused = Vec::new();
    for (i, b) in input.bundles.iter().enumerate() {
        match Version::parse(&b.bom.kubernetes_version) {
            None => reasons.push(format!(
                "{}: its lock's Kubernetes version {:?} is not a version",
                b.name, b.bom.kubernetes_version
            )),
            Some(v) => {
                if let Some(j) = by_version.insert(v.clone(), i) {
                    reasons.push(format!(
                        "{} and {} both carry Kubernetes {v}: give each version once",
                        input.bundles[j].name, b.name
                    ));
                }
            }
        }
    }
    // The hops' ends: the newest patch given of each minor after the
    // running one, the target's own version last.
    let mut ends: Vec<(Version, usize)> = Vec::new();
    if !by_version.contains_key(&to) {
        reasons.push(format!(
            "no bundle given carries Kubernetes {to}, the version the config asks for: pass --bundle with the bundle built for {to}"
        ));
    }
    for minor in from.minor..=to.minor {
        if minor == to.minor {
            if let Some(&i) = by_version.get(&to) {
                ends.push((to.clone(), i));
            }
            continue;
        }
        if minor == from.minor {
            continue;
        }
        let newest = by_version.iter().rfind(|(v, _)| v.major == to.major && v.minor == minor);
        match newest {
            Some((v, &i)) => ends.push((v.clone(), i)),
            None => reasons.push(format!(
                "{from} -> {to} skips v{}.{minor}: kubeadm upgrades one minor at a time; build a bundle for \
                 the newest v{}.{minor} patch and pass it with --bundle too (once per hop)",
                to.major, to.major
            )),
        }
    }
    let used: Vec<usize> = ends.iter().map(|(_, i)| *i).collect();
    for (v, &i) in &by_version {
        if !used.contains(&i) {
            let why = if *v <= from {
                format!("not newer than the {from} the cluster runs")
            } else if *v > to {
                format!("newer than the {to} the config asks for")
            } else if v.same_minor(&from) {
                format!(
                    "a patch of the running {}: the first hop goes from {from} straight to the next minor",
                    from.minor_name()
                )
            } else {
                format!("an older patch of {} than the hop's", v.minor_name())
            };
            unused.push(format!("{} (Kubernetes {v}): {why}", input.bundles[i].name));
        }
    }
    // Nodes: readiness, and each kubelet against every hop's API server.
    let skipped = nodes(input, &to, &ends, &mut reasons);
    drift(input, &ends, &mut reasons);
    // What each hop installs must be in its bundle.
    for (v, i) in &ends {
        missing(record, &input.bundles[*i], v, &mut reasons);
    }
    if !reasons.is_empty() {
        return Err(refused(reasons));
    }
    let mut hops = Vec::new();
    let mut prev = (from.clone(), record.versions.clone());
    for (v, i) in ends {
        let b = &input.bundles[i];
        let now = crate::record::versions(b.bom);
        let changes = now
            .iter()
            .filter_map(|(c, n)| {
                let o = prev.1.get(c)?;
                (o != n).then(|| (c.clone(), o.clone(), n.clone()))
            })
            .collect();
        hops.push(Hop {
            from: prev.0.clone(),
            to: v.clone(),
            bundle: i,
            bundle_name: b.name.to_string(),
            changes,
        });
        prev = (v, now);
    }
    Ok(UpgradePlan {
        cluster: record.name.clone(),
        from,
        to,
        hops,
        skipped,
        resumed: resumed(input),
        unused,
    })
}

/// The NotReady nodes an unfinished upgrade left cordoned, which a run
/// that resumes it upgrades again.
fn resumed(input: &PlanInput<'_>) -> Vec<String> {
    input
        .nodes
        .iter()
        .filter(|n| input.resuming && n.cordoned && !n.ready && !input.skip_not_ready.contains(&n.name))
        .map(|n| n.name.clone())
        .collect()
}

/// Checks every node the API server and the record know; returns the
/// NotReady workers left alone.
fn nodes(input: &PlanInput<'_>, to: &Version, ends: &[(Version, usize)], reasons: &mut Vec<String>) -> Vec<(String, String)> {
    let record = input.record;
    let g = &record.config.spec.role_groups;
    let needed = |h: &str| g.control_plane.iter().chain(&g.etcd).any(|x| x == h);
    let mut skipped = Vec::new();
    for s in &input.skip_not_ready {
        match input.nodes.iter().find(|n| &n.name == s) {
            None => reasons.push(format!(
                "--skip-not-ready {s}: the API server knows no node {s} (its nodes: {})",
                input.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", ")
            )),
            Some(n) if n.ready => reasons.push(format!(
                "--skip-not-ready {s}: {s} is Ready; only a NotReady node is left alone (drop the flag and it is upgraded)"
            )),
            Some(_) if needed(s) => reasons.push(format!(
                "--skip-not-ready {s}: {s} is a control-plane node or etcd member, which every hop needs; \
                 bring it back, or take it out first (kubexm-install remove node {s} --unreachable {s})"
            )),
            Some(_) => {}
        }
    }
    // A member that runs a kubelet but has no Node: neither Ready nor checkable.
    for m in record.members() {
        let kubelet = g.control_plane.contains(&m.name) || g.worker.contains(&m.name);
        if kubelet && !input.nodes.iter().any(|n| n.name == m.name) {
            reasons.push(format!(
                "{} is a node of the record, but the API server has no Node {}: bring its kubelet back, \
                 or take it out first (kubexm-install remove node {} --unreachable {})",
                m.name, m.name, m.name, m.name
            ));
        }
    }
    for n in &input.nodes {
        let skip = input.skip_not_ready.contains(&n.name);
        let resumed = input.resuming && n.cordoned;
        if !n.ready && !skip && !resumed {
            let hint = if needed(&n.name) {
                format!(
                    "bring it back, or take it out first (kubexm-install remove node {} --unreachable {})",
                    n.name, n.name
                )
            } else {
                format!(
                    "bring it back, or pass --skip-not-ready {} to leave it at its version (checked against every hop's skew)",
                    n.name
                )
            };
            reasons.push(format!("node {} is NotReady: {hint}", n.name));
        }
        let parsed = n.kubelet.as_deref().map(|kv| (kv, Version::parse(kv)));
        let k = match parsed {
            Some((_, Some(k))) => k,
            Some((kv, None)) => {
                reasons.push(format!(
                    "node {}: its kubelet version {kv:?} is not a version: its skew cannot be checked",
                    n.name
                ));
                continue;
            }
            None => {
                if skip || n.ready {
                    reasons.push(format!(
                        "node {}: the API server reports no kubelet version: its skew cannot be checked; \
                         bring its kubelet back, or take it out first (kubexm-install remove node {} --unreachable {})",
                        n.name, n.name, n.name
                    ));
                }
                continue;
            }
        };
        if k.major != to.major {
            reasons.push(format!(
                "node {}: its kubelet {k} is of another major version than {to}: not supported",
                n.name
            ));
            continue;
        }
        // Before each hop's control plane moves, a node's kubelet is at the
        // hop's start (its own version before the first hop; a skipped node
        // stays at its own through all of them). Minors only: a kubelet a
        // patch ahead of its API server is within the policy.
        let mut at = k.clone();
        for (v, _) in ends {
            if at.minor > v.minor {
                reasons.push(format!(
                    "node {}: its kubelet {at} is newer than {v}, the API server {} (a kubelet is never newer \
                     than its API server)",
                    n.name,
                    if v == to { "the upgrade ends at" } else { "of a hop" }
                ));
                break;
            }
            let behind = v.minor - at.minor;
            if behind > KUBELET_SKEW {
                let why = if skip {
                    "it is left alone by --skip-not-ready".to_string()
                } else {
                    format!("the hop to {v} moves the API server before the kubelets")
                };
                reasons.push(format!(
                    "node {}: its kubelet {at} would be {behind} minors older than the API server at {v} ({why}); \
                     the skew policy allows {KUBELET_SKEW}: upgrade that node's kubelet first, or remove it",
                    n.name
                ));
                break;
            }
            if !skip {
                at = v.clone();
            }
        }
        if skip {
            skipped.push((n.name.clone(), k.to_string()));
        }
    }
    skipped
}

/// A component a host runs at a version neither the record nor any hop
/// installs: changed outside kubexm, so the plan would start from an
/// unknown state. (A host a stopped run already moved runs a hop's.)
fn drift(input: &PlanInput<'_>, ends: &[(Version, usize)], reasons: &mut Vec<String>) {
    let hops: Vec<BTreeMap<String, String>> = ends.iter().map(|(_, i)| crate::record::versions(input.bundles[*i].bom)).collect();
    // A NotReady worker left alone keeps its old versions (its kubelet's
    // skew is checked on its own).
    for (host, component, found) in input.installed.iter().filter(|(h, ..)| !input.skip_not_ready.contains(h)) {
        let Some(recorded) = input.record.versions.get(component) else {
            continue;
        };
        let Some(f) = release(found) else {
            continue;
        };
        let known = std::iter::once(recorded)
            .chain(hops.iter().filter_map(|h| h.get(component)))
            .any(|v| release(v).as_deref() == Some(f.as_str()));
        if !known {
            reasons.push(format!(
                "{host} runs {component} {f}, but the record says {recorded} and no hop installs {f}: it was changed \
                 outside kubexm; put {recorded} back on {host} (or reinstall it) before upgrading"
            ));
        }
    }
}

/// The release a version string names (`v1.36.3`, `1.6.20~ds1`, `etcd
/// Version: 3.6.8`, `containerd github.com/containerd/containerd v1.7.13
/// abc` → `1.36.3`, `1.6.20`, `3.6.8`, `1.7.13`): the first word that
/// starts with `MAJOR.MINOR.PATCH`.
pub fn release(s: &str) -> Option<String> {
    s.split_whitespace().find_map(|w| {
        let w = w.strip_prefix('v').unwrap_or(w);
        let end = w.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(w.len());
        let r = w[..end].trim_end_matches('.');
        let parts: Vec<&str> = r.split('.').collect();
        (parts.len() >= 3 && parts.iter().all(|p| !p.is_empty())).then(|| parts[..3].join("."))
    })
}

/// What a hop to `v` installs that `bundle` lacks: every component file the
/// cluster runs, for each arch it was installed for (kubeadm, kubelet and
/// kubectl at `v`); the control-plane images for the control-plane nodes'
/// arches and kube-proxy's for every node's (every arch installed where a
/// node's is not known).
fn missing(record: &ClusterRecord, bundle: &GivenBundle<'_>, v: &Version, reasons: &mut Vec<String>) {
    let bom = bundle.bom;
    let version = v.to_string();
    let g = &record.config.spec.role_groups;
    let mut installed: Vec<(String, String)> = record
        .artifacts
        .iter()
        .filter(|a| a.kind == "file")
        .filter_map(|a| Some((a.name.clone(), a.arch.clone()?)))
        .collect();
    installed.sort();
    installed.dedup();
    let mut all_arches: Vec<String> = installed.iter().map(|(_, a)| a.clone()).collect();
    all_arches.extend(record.members().filter_map(|n| n.arch.clone()));
    all_arches.sort();
    all_arches.dedup();
    let arches_of = |hosts: &mut dyn Iterator<Item = &String>| -> Vec<String> {
        let mut out = Vec::new();
        for h in hosts {
            match record.members().find(|n| &n.name == h).and_then(|n| n.arch.clone()) {
                Some(a) => out.push(a),
                None => out.extend(all_arches.iter().cloned()),
            }
        }
        out.sort();
        out.dedup();
        out
    };
    let node_arches = arches_of(&mut record.members().map(|n| &n.name));
    let cp_arches = arches_of(&mut g.control_plane.iter());
    let mut lacks = Vec::new();
    for c in ["kubeadm", "kubelet", "kubectl"] {
        for a in &node_arches {
            if !bom.files.iter().any(|f| f.component == c && &f.arch == a && f.version == version) {
                lacks.push(format!("{c} {version} for {a}"));
            }
        }
    }
    for (c, a) in installed
        .iter()
        .filter(|(c, _)| !matches!(c.as_str(), "kubeadm" | "kubelet" | "kubectl"))
    {
        if !bom.files.iter().any(|f| &f.component == c && &f.arch == a) {
            lacks.push(format!("{c} for {a}"));
        }
    }
    let image = |name: &str, arches: &[String], lacks: &mut Vec<String>| {
        let wanted = format!("registry.k8s.io/{name}:{version}");
        match bom.images.iter().find(|i| i.reference.to_string() == wanted) {
            None => lacks.push(format!("image {wanted}")),
            Some(i) => {
                for a in arches {
                    if !i.platforms.iter().any(|p| p == &format!("linux/{a}") || p == a) {
                        lacks.push(format!("image {wanted} for {a}"));
                    }
                }
            }
        }
    };
    if record.config.spec.kubernetes.deploy_mode == crate::config::model::DeployMode::Kubeadm {
        for c in ["kube-apiserver", "kube-controller-manager", "kube-scheduler"] {
            image(c, &cp_arches, &mut lacks);
        }
        image("kube-proxy", &node_arches, &mut lacks);
    }
    // A bundle with OS packages serves every node's arch (the install's
    // preflight refuses a node without them, after the snapshot).
    if !bom.os_repos.is_empty() {
        for a in &node_arches {
            if !bom.os_repos.iter().any(|r| &r.arch == a) {
                lacks.push(format!("OS packages for {a}"));
            }
        }
    }
    if !lacks.is_empty() {
        reasons.push(format!(
            "{} (Kubernetes {version}) lacks what its hop installs: {}; rebuild it with kubexm-bundle build (every node's arch in spec.bundle.arches)",
            bundle.name,
            lacks.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests;
