//! What `apply` is asked to change: a completed config against the record
//! of the cluster's last successful job. Every problem is reported at once,
//! located in the new config like a validation error:
//!
//! - fields that can never change on an installed cluster (its networks,
//!   endpoint mode and name, etcd mode, network plugin), a host whose
//!   address or arch changed under the same name: invalid (exit 3);
//! - what `apply` does not do yet (a version change, which is an upgrade;
//!   removing hosts; a host that changes roles; a new host in a role apply
//!   does not add; any other setting): not supported yet (exit 8).
//!
//! What is left is what apply runs: the hosts the config adds as workers,
//! as control-plane nodes (after the first) and as
//! etcd members where kubexm runs etcd (binary mode), and the registry
//! moved to the host `roleGroups.registry` names instead.

use serde_json::Value;

use crate::config::Cluster;
use crate::diag::{Diagnostic, Diagnostics, Kind, MAX_DIAGNOSTICS};
use crate::record::{ClusterRecord, NodeRecord};
use crate::yaml::Located;

/// Paths that never change once a cluster exists, and why.
const FIXED: &[(&str, &str)] = &[
    (
        "spec.kubernetes.podCIDR",
        "every pod address and the network plugin's config depend on it",
    ),
    (
        "spec.kubernetes.serviceCIDR",
        "every Service's address and the API server's certificate depend on it",
    ),
    (
        "spec.kubernetes.nodeCIDR",
        "the hosts' network, checked against the pod and service networks",
    ),
    ("spec.controlPlaneEndpoint.mode", "every kubeconfig and node points at the endpoint"),
    ("spec.controlPlaneEndpoint.address", "every certificate and kubeconfig names it"),
    ("spec.controlPlaneEndpoint.domain", "every kubeconfig and certificate names it"),
    ("spec.controlPlaneEndpoint.port", "every kubeconfig and node points at it"),
    ("spec.etcd.mode", "the cluster's data lives there"),
    ("spec.network.plugin", "every pod's network is made by it"),
];

/// Settings that only the builder or the installer's own connection reads:
/// a change needs nothing done on the cluster.
/// (`spec.certificates` is read by `certs renew` only.)
const LOCAL: &[&str] = &[
    "spec.bundle",
    "spec.conformance",
    "spec.preflight",
    "spec.hostDefaults",
    "spec.certificates",
    "spec.upgrade",
    "spec.paused",
];

/// Settings apply changes on the hosts (their steps compare what they write).
const APPLIED: &[&str] = &["spec.etcd.backup"];

/// Per-host settings of the installer's connection only.
const HOST_LOCAL: &[&str] = &["port", "user", "auth", "bastion", "hostKey"];

/// What apply will do.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Changes {
    /// Hosts the config adds (as workers), in config order.
    pub added: Vec<String>,
    /// The registry moves (local mode): from the recorded host to another.
    pub registry: Option<(String, String)>,
}

impl Changes {
    /// Nothing to do on the hosts.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.registry.is_none()
    }
}

/// The changes an upgrade to `new`'s Kubernetes version may carry beside
/// it: what the version pairs by default (etcd's, containerd's and the
/// addons' versions) may differ from the record; everything else is held
/// to [`changes`]' rules, so an added host or a moved registry is returned
/// (for the caller to refuse: an upgrade does not add hosts) and a fixed
/// field is invalid.
pub fn upgrade_changes(record: &ClusterRecord, new: &Cluster, located: Option<&Located>, file: &str) -> Result<Changes, Diagnostics> {
    let old = &record.config.spec;
    let mut same = new.clone();
    let s = &mut same.spec;
    s.kubernetes.version = old.kubernetes.version.clone();
    s.etcd.version = old.etcd.version.clone();
    s.container_runtime.version = old.container_runtime.version.clone();
    s.network.version = old.network.version.clone();
    s.network.multus.version = old.network.multus.version.clone();
    s.dns.nodelocaldns.version = old.dns.nodelocaldns.version.clone();
    s.load_balancer_service.metallb.version = old.load_balancer_service.metallb.version.clone();
    s.storage.version = old.storage.version.clone();
    changes(record, &same, located, file)
}

/// The changes from `record` (the last successful job's) to `new` (its
/// text indexed by `located`, named `file` in messages); every refusal at
/// once.
pub fn changes(record: &ClusterRecord, new: &Cluster, located: Option<&Located>, file: &str) -> Result<Changes, Diagnostics> {
    let pos = |path: &str| located.and_then(|l| l.pos(path));
    let mut out = Vec::new();
    let old_v = serde_json::to_value(&record.config).unwrap_or_default();
    let new_v = serde_json::to_value(new).unwrap_or_default();
    for (path, why) in FIXED {
        let (a, b) = (at(&old_v, path), at(&new_v, path));
        if a != b {
            out.push(
                Diagnostic::new(
                    Kind::Invalid,
                    *path,
                    format!(
                        "cannot change on an installed cluster ({why}): recorded {}, now {}",
                        show(a),
                        show(b)
                    ),
                )
                .hint("put the recorded value back; a cluster with another value is a new cluster (reset, then install)")
                .at(pos(path)),
            );
        }
    }
    let version = "spec.kubernetes.version";
    if at(&old_v, version) != at(&new_v, version) {
        out.push(
            Diagnostic::new(
                Kind::Unsupported,
                version,
                format!(
                    "changing the Kubernetes version ({} to {}) is an upgrade, not an apply",
                    show(at(&old_v, version)),
                    show(at(&new_v, version))
                ),
            )
            .hint(
                "an upgrade is checked (and, once built, run) by `kubexm-install upgrade -f CONFIG --bundle NEW.tar.zst --dry-run`; \
                 put the recorded version back to apply other changes",
            )
            .at(pos(version)),
        );
    }
    let added = hosts(record, new, &pos, &mut out);
    if record.config.spec.etcd.backup.is_some() && new.spec.etcd.backup.is_none() {
        out.push(
            Diagnostic::new(
                Kind::Unsupported,
                "spec.etcd",
                "removing etcd.backup from an installed cluster is not supported yet (its timers would stay)",
            )
            .hint("put etcd.backup back; another schedule, keep or directory is applied")
            .at(pos("spec.etcd")),
        );
    }
    // Each role group as recorded, order included (the first control-plane
    // node inits; the registry's host serves every node), but for added hosts.
    let (old_g, new_g) = (&record.config.spec.role_groups, &new.spec.role_groups);
    // The registry moves to another host when roleGroups.registry names it:
    // every node is pointed at it, then the old one stops.
    let registry = match (old_g.registry.as_slice(), new_g.registry.as_slice()) {
        ([from], [to]) if from != to => Some((from.clone(), to.clone())),
        _ => None,
    };
    for (group, a, b) in [
        ("etcd", &old_g.etcd, &new_g.etcd),
        ("control-plane", &old_g.control_plane, &new_g.control_plane),
        ("worker", &old_g.worker, &new_g.worker),
        ("loadbalancer", &old_g.loadbalancer, &new_g.loadbalancer),
        ("registry", &old_g.registry, &new_g.registry),
    ] {
        if group == "registry" && registry.is_some() {
            continue;
        }
        // The first control-plane node ran kubeadm init and holds what the
        // others join with: an added node goes after it.
        let kept: Vec<&String> = b.iter().filter(|h| !added.contains(*h)).collect();
        let problem = match (b.first(), a.first()) {
            (Some(first), Some(was)) if group == "control-plane" && added.contains(first) => Some((
                format!(
                    "{first} is added as the first control-plane node: {was} stays first (it ran kubeadm init; \
                     the others join through it)"
                ),
                Some(format!("list {first} after {was}")),
            )),
            _ if kept != a.iter().collect::<Vec<_>>() => Some((
                format!(
                    "changing roleGroups.{group} on an installed cluster is not supported yet (recorded: [{}]; apply adds new hosts, remove node takes hosts out)",
                    a.join(", ")
                ),
                None,
            )),
            _ => None,
        };
        if let Some((message, hint)) = problem {
            let path = format!("spec.roleGroups.{group}");
            let mut d = Diagnostic::new(Kind::Unsupported, path.as_str(), message);
            if let Some(h) = hint {
                d = d.hint(h);
            }
            out.push(d.at(pos(&path)));
        }
    }
    // Everything else must be as recorded.
    let mut rest = Vec::new();
    diff(&strip(old_v), &strip(new_v), "", &mut rest);
    out.extend(rest.iter().map(|path| unchanged(path, pos(path))));
    if out.is_empty() {
        return Ok(Changes { added, registry });
    }
    out.sort_by_key(|d| (d.line.unwrap_or(u32::MAX), d.column));
    let more = out.len().saturating_sub(MAX_DIAGNOSTICS);
    out.truncate(MAX_DIAGNOSTICS);
    Err(Diagnostics {
        file: file.into(),
        diagnostics: out,
        more,
    })
}

/// What the bundle `bom` (its lock) would change of what `record` installed:
/// a component at another version, an artifact with another digest, a
/// component the lock no longer has. Additions (an image more) change
/// nothing installed. One line each; empty: nothing.
pub fn bundle_changes(record: &ClusterRecord, bom: &crate::Bom) -> Vec<String> {
    let mut out = Vec::new();
    let now = crate::record::versions(bom);
    for (c, v) in &record.versions {
        match now.get(c) {
            Some(n) if n != v => out.push(format!("{c} {v} is installed, the bundle has {n}")),
            None => out.push(format!("{c} {v} is installed, the bundle has none")),
            _ => {}
        }
    }
    let artifacts = crate::record::artifacts(bom);
    for a in &record.artifacts {
        if let Some(n) = artifacts.iter().find(|n| n.kind == a.kind && n.name == a.name && n.arch == a.arch)
            && n.digest != a.digest
        {
            let arch = a.arch.as_deref().map(|x| format!(" ({x})")).unwrap_or_default();
            out.push(format!(
                "{} {}{arch}: {} is installed, the bundle has {}",
                a.kind, a.name, a.digest, n.digest
            ));
        }
    }
    out
}

/// The hosts `new` adds; a host removed, changed or given other roles is refused.
fn hosts(record: &ClusterRecord, new: &Cluster, pos: &dyn Fn(&str) -> Option<crate::yaml::Pos>, out: &mut Vec<Diagnostic>) -> Vec<String> {
    let mut added = Vec::new();
    for (i, h) in new.spec.hosts.iter().enumerate() {
        let roles = new.roles_of(&h.name);
        let Some(old) = record.members().find(|n| n.name == h.name) else {
            if record.nodes.iter().any(|n| n.name == h.name) {
                let path = format!("spec.hosts[{i}]");
                out.push(
                    Diagnostic::new(
                        Kind::Invalid,
                        path.as_str(),
                        format!(
                            "host {} was removed while unreachable and never reset: it may still hold a kubelet certificate",
                            h.name
                        ),
                    )
                    .hint(format!(
                        "reset it first: kubexm-install remove node {} -f CONFIG (with the host in CONFIG), then apply",
                        h.name
                    ))
                    .at(pos(&path)),
                );
                // Not reported again as a change of its role groups.
                added.push(h.name.clone());
                continue;
            }
            // Workers, control-plane nodes (etcd is never stacked: kubeadm
            // adds no member), and etcd members where kubexm runs etcd
            // (they join as learners).
            let binary = new.spec.etcd.mode == crate::config::model::EtcdMode::Binary;
            let takes = |r: &str| matches!(r, "worker" | "local-proxy" | "control-plane") || (binary && r == "etcd");
            if !roles.iter().all(|r| takes(r)) {
                let path = format!("spec.hosts[{i}]");
                out.push(
                    Diagnostic::new(
                        Kind::Unsupported,
                        path.as_str(),
                        format!(
                            "adding {} as {} is not supported yet; apply adds workers, control-plane nodes and etcd members (etcd mode binary)",
                            h.name,
                            roles.join(", ")
                        ),
                    )
                    .at(pos(&path)),
                );
            } else {
                added.push(h.name.clone());
            }
            continue;
        };
        identity(i, h, old, record, pos, out);
        if old.roles != roles {
            let path = format!("spec.hosts[{i}]");
            out.push(
                Diagnostic::new(
                    Kind::Unsupported,
                    path.as_str(),
                    format!(
                        "changing {}'s roles ({} to {}) is not supported yet",
                        h.name,
                        old.roles.join(", "),
                        roles.join(", ")
                    ),
                )
                .at(pos(&path)),
            );
        }
        let old_host = record.config.spec.hosts.iter().find(|o| o.name == h.name);
        let (a, b) = (serde_json::to_value(old_host), serde_json::to_value(h));
        if let (Ok(a), Ok(b)) = (a, b) {
            let mut rest = Vec::new();
            diff(&strip_host(a), &strip_host(b), &format!("spec.hosts[{i}]"), &mut rest);
            out.extend(rest.iter().map(|path| unchanged(path, pos(path))));
        }
    }
    for old in record.members() {
        if !new.spec.hosts.iter().any(|h| h.name == old.name) {
            out.push(
                Diagnostic::new(
                    Kind::Unsupported,
                    "spec.hosts",
                    format!("removing host {} ({}) is not done by apply", old.name, old.roles.join(", ")),
                )
                .hint(format!(
                    "remove it with kubexm-install remove node {} -f CONFIG (it drains, deletes and resets the node), \
                     or keep it in the config",
                    old.name
                ))
                .at(pos("spec.hosts")),
            );
        }
    }
    added
}

/// `h` (the config's `i`th host) is still the machine recorded as `old`:
/// the same address, internal address and arch, or a refusal (exit 3) each.
fn identity(
    i: usize,
    h: &crate::config::model::Host,
    old: &NodeRecord,
    record: &ClusterRecord,
    pos: &dyn Fn(&str) -> Option<crate::yaml::Pos>,
    out: &mut Vec<Diagnostic>,
) {
    if old.address != h.address {
        let path = format!("spec.hosts[{i}].address");
        out.push(
            Diagnostic::new(
                Kind::Invalid,
                path.as_str(),
                format!("host {}'s address changed: recorded {}, now {}", h.name, old.address, h.address),
            )
            .hint("a host keeps its name and address: remove it, and add the new machine under a new name")
            .at(pos(&path)),
        );
    }
    let old_host = record.config.spec.hosts.iter().find(|o| o.name == h.name);
    let internal = |x: &crate::config::model::Host| x.internal_address.clone().unwrap_or_else(|| x.address.clone());
    if old.address == h.address
        && let Some(o) = old_host
        && internal(o) != internal(h)
    {
        let path = format!("spec.hosts[{i}].internalAddress");
        out.push(
            Diagnostic::new(
                Kind::Invalid,
                path.as_str(),
                format!(
                    "host {}'s internal address changed: recorded {}, now {}",
                    h.name,
                    internal(o),
                    internal(h)
                ),
            )
            .hint("the cluster's components know the host by it: remove it, and add the machine under a new name")
            .at(pos(&path)),
        );
    }
    if let (Some(a), Some(b)) = (&old.arch, &h.arch)
        && a != b
    {
        let path = format!("spec.hosts[{i}].arch");
        out.push(
            Diagnostic::new(
                Kind::Invalid,
                path.as_str(),
                format!("host {}'s arch changed: recorded {a}, now {b}", h.name),
            )
            .hint("a host keeps its arch: remove it, and add the new machine under a new name")
            .at(pos(&path)),
        );
    }
}

/// Each of `hosts` that `new` (the operator's config, text indexed by
/// `located`, named `file`) still lists is the machine the record knows by
/// that name: its address and arch changed are refused (exit 3), both
/// values named.
pub fn same_hosts(
    record: &ClusterRecord,
    new: &Cluster,
    hosts: &[String],
    located: Option<&Located>,
    file: &str,
) -> Result<(), Diagnostics> {
    let pos = |path: &str| located.and_then(|l| l.pos(path));
    let mut out = Vec::new();
    for (i, h) in new.spec.hosts.iter().enumerate().filter(|(_, h)| hosts.contains(&h.name)) {
        if let Some(old) = record.nodes.iter().find(|n| n.name == h.name) {
            identity(i, h, old, record, &pos, &mut out);
        }
    }
    if out.is_empty() {
        return Ok(());
    }
    Err(Diagnostics {
        file: file.into(),
        diagnostics: out,
        more: 0,
    })
}

/// A setting at `path` changed that apply does not change yet.
fn unchanged(path: &str, pos: Option<crate::yaml::Pos>) -> Diagnostic {
    Diagnostic::new(
        Kind::Unsupported,
        path,
        "changing this on an installed cluster is not supported by apply yet",
    )
    .hint("put the recorded value back (kubexm-install status --cluster NAME -o json shows it)")
    .at(pos)
}

/// The value at a dotted path.
fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn show(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "(unset)".into(),
    }
}

/// The config without what [`changes`] checks itself and what needs nothing done.
fn strip(mut v: Value) -> Value {
    let fixed = FIXED.iter().map(|(p, _)| *p);
    for path in fixed.chain(LOCAL.iter().copied()).chain(APPLIED.iter().copied()).chain([
        "spec.kubernetes.version",
        "spec.hosts",
        "spec.roleGroups",
    ]) {
        let (parent, key) = path.rsplit_once('.').unwrap_or(("", path));
        let target = if parent.is_empty() {
            Some(&mut v)
        } else {
            parent.split('.').try_fold(&mut v, |v, k| v.get_mut(k))
        };
        if let Some(Value::Object(m)) = target {
            m.remove(key);
        }
    }
    v
}

/// A host without what [`hosts`] checks itself and its connection settings.
fn strip_host(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        for k in HOST_LOCAL.iter().chain(&["name", "address", "internalAddress", "arch"]) {
            m.remove(*k);
        }
    }
    v
}

/// Every path where `a` and `b` differ (whole arrays, leaf values).
fn diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match (x.get(k), y.get(k)) {
                    (Some(a), Some(b)) => diff(a, b, &p, out),
                    _ => out.push(p),
                }
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::JobRef;

    const BASE: &str = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\nspec:\n  hosts:\n\
        \x20   - {name: a, address: 10.0.0.1, arch: amd64, auth: {agent: true}}\n\
        \x20   - {name: b, address: 10.0.0.2, auth: {agent: true}}\n\
        \x20 roleGroups: {control-plane: [a], etcd: [a], worker: [b]}\n\
        \x20 controlPlaneEndpoint: {mode: local-proxy}\n\
        \x20 kubernetes: {version: v1.37.2}\n";

    fn load(text: &str) -> Result<Cluster, Box<dyn std::error::Error>> {
        Ok(crate::config::load_str_hosts(text, "c.yaml")?)
    }

    fn record(text: &str) -> Result<ClusterRecord, Box<dyn std::error::Error>> {
        let job = JobRef {
            id: 1,
            kind: "install".into(),
            status: "succeeded".into(),
            finished: 0,
        };
        Ok(ClusterRecord::new(&load(text)?, job, None, None, &Default::default()))
    }

    fn check(new: &str) -> Result<Result<Changes, Diagnostics>, Box<dyn std::error::Error>> {
        let located = crate::yaml::parse(new).map_err(|e| e.to_string())?;
        Ok(changes(&record(BASE)?, &load(new)?, Some(&located), "c.yaml"))
    }

    /// Issue 30: an upgrade's config may change the version and what it
    /// pairs (etcd's, containerd's, the network plugin's versions); a fixed
    /// field is still invalid, and an added host is still an add.
    #[test]
    fn an_upgrade_changes_the_version_and_what_it_pairs_only() -> Result<(), Box<dyn std::error::Error>> {
        let old = format!("{BASE}\x20 etcd: {{version: v3.6.8}}\n\x20 containerRuntime: {{version: 1.7.13}}\n");
        let new = old
            .replace("v1.37.2", "v1.38.0")
            .replace("v3.6.8", "v3.6.16")
            .replace("1.7.13", "2.3.4");
        let up = |text: &str| -> Result<Result<Changes, Diagnostics>, Box<dyn std::error::Error>> {
            let located = crate::yaml::parse(text).map_err(|e| e.to_string())?;
            Ok(upgrade_changes(&record(&old)?, &load(text)?, Some(&located), "c.yaml"))
        };
        assert_eq!(up(&new)?.map_err(|e| e.to_string())?, Changes::default());
        // Without the upgrade's allowance, the same config is refused.
        let located = crate::yaml::parse(&new).map_err(|e| e.to_string())?;
        assert!(changes(&record(&old)?, &load(&new)?, Some(&located), "c.yaml").is_err());
        let cidr = new.replace(
            "kubernetes: {version: v1.38.0}",
            "kubernetes: {version: v1.38.0, podCIDR: 10.200.0.0/16}",
        );
        let e = up(&cidr)?.err().map(|d| d.to_string()).unwrap_or_default();
        assert!(e.contains("spec.kubernetes.podCIDR"), "{e}");
        let added = new.replace(
            "  roleGroups: {control-plane: [a], etcd: [a], worker: [b]}",
            "    - {name: d, address: 10.0.0.4, auth: {agent: true}}\n  roleGroups: {control-plane: [a], etcd: [a], worker: [b, d]}",
        );
        assert_eq!(up(&added)?.map_err(|e| e.to_string())?.added, ["d"]);
        Ok(())
    }

    /// The same config is no change; a new worker and a new login are an add.
    #[test]
    fn an_added_worker_is_the_only_change() -> Result<(), Box<dyn std::error::Error>> {
        assert_eq!(check(BASE)?.map_err(|e| e.to_string())?, Changes::default());
        let new = BASE
            .replace(
                "  roleGroups: {control-plane: [a], etcd: [a], worker: [b]}",
                "    - {name: d, address: 10.0.0.4, auth: {agent: true}}\n  roleGroups: {control-plane: [a], etcd: [a], worker: [b, d]}",
            )
            .replace(
                "{name: b, address: 10.0.0.2, auth: {agent: true}}",
                "{name: b, address: 10.0.0.2, user: ops, auth: {agent: true}}",
            );
        let c = check(&new)?.map_err(|e| e.to_string())?;
        assert_eq!(c.added, ["d"]);
        // A host key given (or dropped) is a connection setting too.
        let keyed = BASE.replace(
            "{name: b, address: 10.0.0.2, auth: {agent: true}}",
            "{name: b, address: 10.0.0.2, auth: {agent: true}, hostKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl}",
        );
        assert_ne!(keyed, BASE);
        assert_eq!(check(&keyed)?.map_err(|e| e.to_string())?, Changes::default());
        Ok(())
    }

    /// Issue 29: etcd members are added where kubexm runs etcd (binary
    /// mode); control-plane nodes after the first.
    #[test]
    fn etcd_members_and_control_plane_nodes_are_added() -> Result<(), Box<dyn std::error::Error>> {
        let hosts = "    - {name: d, address: 10.0.0.4, auth: {agent: true}}\n    - {name: e, address: 10.0.0.5, auth: {agent: true}}\n";
        let new = BASE.replace(
            "  roleGroups: {control-plane: [a], etcd: [a], worker: [b]}",
            &format!("{hosts}  roleGroups: {{control-plane: [a], etcd: [a, d, e], worker: [b]}}"),
        );
        let c = check(&new)?.map_err(|e| e.to_string())?;
        assert_eq!(c.added, ["d", "e"]);
        let cp = new.replace("control-plane: [a]", "control-plane: [a, d]");
        assert_eq!(check(&cp)?.map_err(|e| e.to_string())?.added, ["d", "e"]);
        let first = new.replace("control-plane: [a]", "control-plane: [d, a]");
        let Err(d) = check(&first)? else {
            return Err("a control-plane node added first".into());
        };
        assert!(
            d.to_string().contains("d is added as the first control-plane node: a stays first"),
            "{d}"
        );
        Ok(())
    }

    /// Issue 29: the registry moves to the host roleGroups.registry names.
    #[test]
    fn the_registry_moves_to_another_host() -> Result<(), Box<dyn std::error::Error>> {
        let with = |g: &str| BASE.replace("worker: [b]}", &format!("worker: [b], registry: [{g}]}}"));
        let located = crate::yaml::parse(&with("b")).map_err(|e| e.to_string())?;
        let c = changes(&record(&with("a"))?, &load(&with("b"))?, Some(&located), "c.yaml").map_err(|e| e.to_string())?;
        assert_eq!(c.registry, Some(("a".to_string(), "b".to_string())));
        assert!(c.added.is_empty() && !c.is_empty());
        assert_eq!(check(&with("a"))?.map_err(|e| e.to_string())?.registry, None);
        Ok(())
    }

    /// Issue 29: `etcd.backup` is applied when added or changed, refused
    /// (not supported yet) when removed.
    #[test]
    fn etcd_backup_is_applied_but_not_removed() -> Result<(), Box<dyn std::error::Error>> {
        let with = BASE.replace(
            "  kubernetes:",
            "  etcd: {backup: {schedule: daily, keep: 2, directory: /var/lib/etcd-backups}}\n  kubernetes:",
        );
        assert_eq!(check(&with)?.map_err(|e| e.to_string())?, Changes::default());
        let located = crate::yaml::parse(BASE).map_err(|e| e.to_string())?;
        let Err(d) = changes(&record(&with)?, &load(BASE)?, Some(&located), "c.yaml") else {
            return Err("removing etcd.backup was taken".into());
        };
        assert!(d.to_string().contains("removing etcd.backup"), "{d}");
        let other = with.replace("keep: 2", "keep: 3");
        let located = crate::yaml::parse(&other).map_err(|e| e.to_string())?;
        assert!(changes(&record(&with)?, &load(&other)?, Some(&located), "c.yaml").is_ok());
        Ok(())
    }

    fn file(component: &str, version: &str, sha: &str) -> crate::FileItem {
        crate::FileItem {
            component: component.into(),
            version: version.into(),
            arch: "amd64".into(),
            url: String::new(),
            source: String::new(),
            checksum: crate::Checksum::Sha256(sha.into()),
            checksum_url: None,
            path: String::new(),
            archive: crate::catalog::ArchiveKind::None,
            install: vec![],
        }
    }

    /// A role group reordered (another first control-plane node) and an
    /// internal address changed are refused; a bundle with another version
    /// or digest of what is installed is named, an added image is not.
    #[test]
    fn role_groups_internal_addresses_and_the_bundle_are_as_recorded() -> Result<(), Box<dyn std::error::Error>> {
        let two = BASE.replace("control-plane: [a]", "control-plane: [a, b]");
        let located = crate::yaml::parse(&two).map_err(|e| e.to_string())?;
        let swapped = two.replace("control-plane: [a, b]", "control-plane: [b, a]");
        let moved = two.replace(
            "{name: b, address: 10.0.0.2,",
            "{name: b, address: 10.0.0.2, internalAddress: 10.1.0.2,",
        );
        for (new, want) in [
            (&swapped, "spec.roleGroups.control-plane: changing roleGroups.control-plane"),
            (&moved, "host b's internal address changed: recorded 10.0.0.2, now 10.1.0.2"),
        ] {
            let l = crate::yaml::parse(new).map_err(|e| e.to_string())?;
            let Err(d) = changes(&record(&two)?, &load(new)?, Some(&l), "c.yaml") else {
                return Err(format!("accepted:\n{new}").into());
            };
            assert!(d.to_string().contains(want), "no {want:?} in {d}");
        }
        assert!(changes(&record(&two)?, &load(&two)?, Some(&located), "c.yaml").is_ok());
        let old = crate::Bom {
            files: vec![file("etcd", "v3.6.1", "aa"), file("runc", "v1.1.12", "bb")],
            ..Default::default()
        };
        let mut r = record(&two)?;
        r.versions = crate::record::versions(&old);
        r.artifacts = crate::record::artifacts(&old);
        let mut new = old.clone();
        assert!(bundle_changes(&r, &new).is_empty());
        new.files[0] = file("etcd", "v3.6.2", "cc");
        new.files[1] = file("runc", "v1.1.12", "dd");
        new.files.push(file("helm", "v3.20.2", "ee"));
        let got = bundle_changes(&r, &new);
        assert_eq!(
            got,
            [
                "etcd v3.6.1 is installed, the bundle has v3.6.2",
                "file etcd (amd64): sha256:aa is installed, the bundle has sha256:cc",
                "file runc (amd64): sha256:bb is installed, the bundle has sha256:dd",
            ]
        );
        Ok(())
    }

    /// Fixed fields and a moved host are invalid (exit 3), a version change,
    /// a removed host, an etcd member added and any other setting are not
    /// supported yet; all at once, each at its line.
    #[test]
    fn every_refusal_is_reported_at_once_with_its_line() -> Result<(), Box<dyn std::error::Error>> {
        let new = BASE
            .replace(
                "kubernetes: {version: v1.37.2}",
                "kubernetes: {version: v1.38.0, podCIDR: 10.244.0.0/17}",
            )
            .replace("address: 10.0.0.1, arch: amd64", "address: 10.0.0.9, arch: arm64")
            .replace(
                "    - {name: b, address: 10.0.0.2, auth: {agent: true}}\n",
                "    - {name: e, address: 10.0.0.5, auth: {agent: true}}\n",
            )
            .replace(
                "etcd: [a], worker: [b]}",
                "etcd: [e], worker: [e]}\n  dns: {coredns: {enabled: false}}",
            );
        let Err(d) = check(&new)? else {
            return Err("accepted".into());
        };
        let text = d.to_string();
        for want in [
            "spec.kubernetes.podCIDR: cannot change on an installed cluster",
            "spec.kubernetes.version: changing the Kubernetes version (v1.37.2 to v1.38.0)",
            "spec.hosts[0].address: host a's address changed: recorded 10.0.0.1, now 10.0.0.9",
            "spec.hosts[0].arch: host a's arch changed: recorded amd64, now arm64",
            "spec.roleGroups.etcd: changing roleGroups.etcd",
            "removing host b (worker, local-proxy)",
            "spec.dns.coredns.enabled: changing this on an installed cluster",
        ] {
            assert!(text.contains(want), "no {want:?} in:\n{text}");
        }
        assert!(
            text.contains("c.yaml:12:34: spec.kubernetes.podCIDR"),
            "no line of the kubernetes setting:\n{text}"
        );
        assert!(
            !text.contains("internalAddress"),
            "a moved host's default internal address reported:\n{text}"
        );
        let kinds: Vec<Kind> = d.diagnostics.iter().map(|d| d.kind).collect();
        assert!(kinds.contains(&Kind::Invalid) && kinds.contains(&Kind::Unsupported));
        Ok(())
    }
}
