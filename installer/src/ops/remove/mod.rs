//! `kubexm-install remove node HOST -f cluster.yaml`: take workers out of
//! an installed cluster. Checked against the cluster's record before any
//! host is touched; then one `remove-node` job: through the first
//! control-plane node's admin kubeconfig each node is cordoned, drained
//! (bounded by the drain timeout; a PodDisruptionBudget that blocks it fails
//! the job naming the pods, `force_drain` deletes them anyway) and its Node
//! deleted; then each removed host is reset. A host named unreachable is
//! never contacted: not drained (its pods go with its Node), not reset, and
//! recorded as "removed, not reset" until a later `remove node` resets it.
//! The record after the job no longer lists the hosts removed, and the steps
//! done on them before no longer count as done (added again, a host gets
//! every step).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use kubexm_bom::record::{ClusterRecord, NodeState};
use serde::Serialize;

use super::error::{OpError, op};
use super::session::Session;
use crate::engine::plan::{Pipeline, Scope, Step, Task};
use crate::engine::run;
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::paths::ADMIN_CONF;
use crate::phases::etcd_members;

const REMOVE_NODE: &str = include_str!("../../../../manifests/templates/remove-node.sh");

/// How long a drain may take unless told otherwise.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

/// The longest drain timeout taken (a day).
pub const MAX_DRAIN_TIMEOUT: u32 = 86_400;

/// What `remove node` is asked.
#[derive(Debug, Clone)]
pub struct RemoveOptions {
    /// The hosts to take out, by name.
    pub hosts: Vec<String>,
    /// Hosts known to be down: never contacted.
    pub unreachable: Vec<String>,
    /// How long a drain may wait for its pods to go.
    pub drain_timeout: Duration,
    /// Delete pods a drain cannot evict (a PodDisruptionBudget, no controller).
    pub force_drain: bool,
    /// Print the plan; touch no host.
    pub dry_run: bool,
}

/// What `remove node` did, or would do.
#[derive(Debug)]
pub enum RemoveReport {
    Plan(String),
    Removed(Removed),
}

/// A removal that succeeded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Removed {
    pub cluster: String,
    pub job: i64,
    pub hosts: Vec<RemovedHost>,
    /// Where the config still lists a removed host (`file:line`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub still_in_config: Vec<String>,
    /// Control-plane nodes left: the hosts whose haproxy (load balancer or
    /// local proxy) now forwards to the nodes that stay.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub proxies: Vec<String>,
    /// What the operator should do next (an even etcd count left).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub timing: String,
}

/// One host taken out.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemovedHost {
    pub name: String,
    /// Its Node was drained (false: unreachable, or removed in an earlier run).
    pub drained: bool,
    /// The host was reset.
    pub reset: bool,
    /// What did not run because the host was named unreachable.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Its etcd member was removed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub left_etcd: bool,
    /// It ran a kubelet (a Node), not only etcd.
    #[serde(skip)]
    pub node: bool,
}

impl std::fmt::Display for Removed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for h in &self.hosts {
            let what = match (h.drained, h.reset) {
                _ if h.left_etcd && !h.node && h.reset => "etcd member removed, host reset",
                _ if h.left_etcd && !h.node => "etcd member removed; host NOT reset (unreachable)",
                (true, true) => "drained, host reset, Node deleted",
                (false, true) => "host reset; its Node deleted if it had registered again",
                (_, false) => "cordoned, Node deleted; host NOT reset (unreachable)",
            };
            let etcd = if h.left_etcd && h.node { "; its etcd member removed" } else { "" };
            writeln!(
                f,
                "removed {} from cluster {} (job {}): {what}{etcd}",
                h.name, self.cluster, self.job
            )?;
            if !h.skipped.is_empty() {
                writeln!(f, "  not run on {} (named unreachable): {}", h.name, h.skipped.join(", "))?;
                writeln!(
                    f,
                    "  {} may still hold a valid kubelet certificate: `status --cluster {}` lists it as removed, not reset; \
                     when it is back, reset it: kubexm-install remove node {} -f CONFIG",
                    h.name, self.cluster, h.name
                )?;
            }
        }
        if !self.proxies.is_empty() {
            writeln!(
                f,
                "haproxy forwards to the control-plane nodes that stay on {}",
                self.proxies.join(", ")
            )?;
        }
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        for at in &self.still_in_config {
            writeln!(f, "{at}: delete this host from the config: an apply with it listed adds it back")?;
        }
        if !self.timing.is_empty() {
            writeln!(f, "{}", self.timing.trim_end())?;
        }
        Ok(())
    }
}

/// What is taken out, once checked.
struct Plan {
    record: ClusterRecord,
    /// The hosts to take out that are Nodes (drained, Node deleted).
    members: Vec<String>,
    /// The etcd members to take out, and how etcd goes on without them.
    etcd: Option<EtcdLeave>,
    /// The hosts that ran an etcd member: their data directory goes with
    /// the reset (a removed member's copy of the cluster's data, Secrets
    /// included, does not stay behind).
    etcd_data: Vec<String>,
    /// Every host to take out, members and those removed before, not reset.
    hosts: Vec<String>,
    /// The control-plane node the Nodes are removed through.
    via: String,
    /// The cluster without the hosts taken out, when control-plane nodes
    /// leave: its load balancers (mode A) or local proxies (mode D) forward
    /// to the others only.
    backends: Option<Cluster>,
    /// The hosts the operator's config lists, in its order.
    file_hosts: Vec<String>,
    /// The config's text, indexed (`None` when it cannot be read again).
    located: Option<kubexm_bom::yaml::Located>,
}

/// etcd members leaving (binary mode): through which member, which stay,
/// and the control-plane nodes whose API servers are told.
struct EtcdLeave {
    leaving: Vec<String>,
    stay: Vec<String>,
    via: String,
    control_plane: Vec<String>,
    /// An even count left (a dead member removed): what to do about it.
    warning: Option<String>,
}

/// Removes `o.hosts` from the session's installed cluster.
pub fn remove(session: &mut Session, o: &RemoveOptions) -> anyhow::Result<RemoveReport> {
    let plan = check(session, o)?;
    if let Some(w) = plan.etcd.as_ref().and_then(|e| e.warning.as_ref()) {
        tracing::warn!("{w}");
    }
    let pipeline = pipeline(session.cluster(), &plan, session.unreachable_hosts(), o)?;
    if o.dry_run {
        return Ok(RemoveReport::Plan(pipeline.plan()?.describe()));
    }
    let mut once = Some(pipeline);
    let ex = session.execute("remove-node", run::Policy::FailFast, |_| {
        once.take().ok_or_else(|| anyhow::anyhow!("the pipeline was asked for twice"))
    })?;
    let unreachable = session.unreachable_hosts().clone();
    let done = if ex.ok() {
        plan.hosts.clone()
    } else {
        removed_in(&ex.report, &plan.hosts)
    };
    let without = |job| {
        let mut r = ClusterRecord {
            job,
            ..plan.record.clone()
        };
        for h in &done {
            r = r.without(h, !unreachable.contains(h), r.job.clone());
        }
        r
    };
    if !ex.ok() {
        if let Err(e) = session.put_record(ex.job, &done, without) {
            tracing::warn!("{e:#}");
        }
        let removed = if done.is_empty() {
            "nothing is recorded as removed".to_string()
        } else {
            format!("{} removed all the same", done.join(", "))
        };
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "removing {} failed (job {}); {removed}. Fix what is named and run it again \
                 (what is done is checked and skipped); name a dead host with --unreachable:\n  {}",
                plan.hosts.join(", "),
                ex.job,
                ex.errors().join("\n  ")
            ),
        ));
    }
    session.put_record(ex.job, &plan.hosts, without)?;
    let located = &plan.located;
    let still_in_config = plan
        .hosts
        .iter()
        .filter_map(|h| {
            let i = plan.file_hosts.iter().position(|n| n == h)?;
            let at = located
                .as_ref()
                .and_then(|l| l.pos(&format!("spec.hosts[{i}]")))
                .map(|p| format!(":{p}"))
                .unwrap_or_default();
            Some(format!("{}{at} ({h})", session.config_name()))
        })
        .collect();
    let proxies = plan.backends.as_ref().map(crate::phases::endpoint::proxy_hosts).unwrap_or_default();
    let mut warnings: Vec<String> = plan.etcd.iter().filter_map(|e| e.warning.clone()).collect();
    let stale: Vec<&String> = proxies.iter().filter(|p| unreachable.contains(*p)).collect();
    if !stale.is_empty() {
        warnings.push(format!(
            "haproxy on {} (named unreachable) still lists the control-plane node(s) removed (its health checks mark \
             them down): run kubexm-install apply once it is back",
            stale.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    let dead_cp: Vec<&String> = plan
        .hosts
        .iter()
        .filter(|h| unreachable.contains(*h) && plan.record.config.spec.role_groups.control_plane.contains(*h))
        .collect();
    if !dead_cp.is_empty() {
        warnings.push(format!(
            "{} still hold(s) the cluster's keys (CA, service-account and front-proxy keys, admin.conf, etcd's client \
             certificate) and would start a control plane when booted: keep it off the network or wipe its disk; \
             when it is back, reset it first (kubexm-install remove node HOST -f CONFIG)",
            dead_cp.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    let hosts = plan
        .hosts
        .iter()
        .map(|h| {
            let out = unreachable.contains(h);
            let member = plan.members.contains(h);
            let skipped: &[&str] = match (out, member) {
                (false, _) => &[],
                (true, true) => &["drain", "reset"],
                (true, false) => &["reset"],
            };
            RemovedHost {
                name: h.clone(),
                drained: member && !out,
                reset: !out,
                skipped: skipped.iter().map(|s| s.to_string()).collect(),
                left_etcd: plan.etcd.as_ref().is_some_and(|e| e.leaving.contains(h)),
                node: member,
            }
        })
        .collect();
    Ok(RemoveReport::Removed(Removed {
        cluster: session.cluster().metadata.name.clone(),
        job: ex.job,
        hosts,
        still_in_config,
        proxies: proxies.iter().filter(|p| !unreachable.contains(*p)).cloned().collect(),
        warnings,
        timing: session.timing(ex.job),
    }))
}

/// Refuses, before any host is touched, what cannot be removed, and points
/// the session at the recorded cluster (with the hosts' connection settings
/// from the operator's config where it lists them).
fn check(session: &mut Session, o: &RemoveOptions) -> anyhow::Result<Plan> {
    let name = session.cluster().metadata.name.clone();
    let usage = |msg: String| op(OpError::Usage, anyhow::anyhow!(msg));
    if o.hosts.is_empty() {
        return Err(usage(
            "name the host(s) to remove: kubexm-install remove node HOST -f CONFIG".into(),
        ));
    }
    let record = session.last_record(true)?.ok_or_else(|| {
        usage(format!(
            "the state database {} records no install of cluster {name}: there is nothing to remove from \
             (pass the --state it was installed with)",
            session.settings().engine.state.display()
        ))
    })?;
    let last = session.last_record(false)?;
    for r in [Some(&record), last.as_ref()].into_iter().flatten() {
        if r.job.took_down() {
            return Err(usage(format!(
                "cluster {name}'s last job was a {} ({}, job {}): there is no installed cluster to remove a node from",
                r.job.kind, r.job.status, r.job.id
            )));
        }
    }
    let file = session.cluster().clone();
    let located = session.located();
    kubexm_bom::changes::same_hosts(&record, &file, &o.hosts, located.as_ref(), session.config_name())
        .map_err(kubexm_bom::config::LoadError::Invalid)?;
    let mut cluster = recorded_cluster(&record, Some(&file));
    let known: Vec<&str> = record.nodes.iter().map(|n| n.name.as_str()).collect();
    if let Some(u) = o.unreachable.iter().find(|u| !known.contains(&u.as_str())) {
        return Err(usage(format!(
            "--unreachable {u}: cluster {name}'s record has no such host (its hosts: {})",
            known.join(", ")
        )));
    }
    let topo = kubexm_bom::topology::Topology::of(&record.config).map_err(|e| op(OpError::Config, anyhow::Error::from(e)))?;
    let mut members = Vec::new();
    let mut hosts = Vec::new();
    let etcd_data: Vec<String> = record
        .nodes
        .iter()
        .filter(|n| o.hosts.contains(&n.name) && n.roles.iter().any(|r| r == "etcd"))
        .map(|n| n.name.clone())
        .collect();
    for h in o.hosts.iter().collect::<BTreeSet<_>>() {
        let Some(node) = record.nodes.iter().find(|n| &n.name == h) else {
            return Err(usage(format!(
                "cluster {name}'s record has no host {h} (its hosts: {}); `kubexm-install status --cluster {name}` shows them",
                known.join(", ")
            )));
        };
        if node.state == NodeState::RemovedNotReset {
            if o.unreachable.contains(h) {
                return Err(usage(format!(
                    "{h} was removed from cluster {name} already and is still unreachable: nothing to do until it is back"
                )));
            }
            let Some(entry) = file.spec.hosts.iter().find(|f| &f.name == h) else {
                return Err(usage(format!(
                    "{h} was removed from cluster {name} while unreachable; to reset it, list it in {} \
                     (its address {} and how to log in) and run this again",
                    session.config_name(),
                    node.address
                )));
            };
            cluster.spec.hosts.push(entry.clone());
            hosts.push(h.clone());
            continue;
        }
        refuse_role(&record, &topo, h, &node.roles)?;
        if node.roles.iter().any(|r| r == "worker" || r == "control-plane") {
            members.push(h.clone());
        }
        hosts.push(h.clone());
    }
    let etcd = etcd_leave(&record, &hosts, &o.unreachable)?;
    let g = &record.config.spec.role_groups;
    let backends = hosts
        .iter()
        .any(|h| g.control_plane.contains(h))
        .then(|| hosts.iter().fold(record.clone(), |r, h| r.without(h, true, r.job.clone())).config);
    let proxies = match &backends {
        Some(c) => crate::phases::endpoint::proxy_hosts(c),
        None => Vec::new(),
    };
    let via = g
        .control_plane
        .iter()
        .find(|c| !o.unreachable.contains(*c) && !hosts.contains(*c))
        .cloned()
        .ok_or_else(|| {
            usage(format!(
                "no control-plane node of cluster {name} that stays is reachable (the others are removed or named \
                 unreachable): the Nodes cannot be removed through one"
            ))
        })?;
    // Only the hosts the job works on are connected to: another host down
    // does not stop a removal.
    // etcd's members leave through one that stays; every API server is told.
    let also: Vec<&String> = etcd
        .iter()
        .flat_map(|e| e.control_plane.iter().chain([&e.via]))
        .chain(&proxies)
        .collect();
    cluster
        .spec
        .hosts
        .retain(|c| c.name == via || hosts.contains(&c.name) || also.contains(&&c.name));
    // Removed hosts named unreachable are never contacted; so are local
    // proxies or load balancers named so (their haproxy keeps the old
    // list, its health checks mark the node gone down; apply updates it).
    let unreachable: Vec<String> = o
        .unreachable
        .iter()
        .filter(|u| cluster.spec.hosts.iter().any(|c| &c.name == *u))
        .cloned()
        .collect();
    session.use_cluster(cluster);
    session.unreachable(&unreachable)?;
    Ok(Plan {
        record,
        members,
        etcd,
        etcd_data,
        hosts,
        via,
        backends,
        file_hosts: file.spec.hosts.iter().map(|h| h.name.clone()).collect(),
        located,
    })
}

/// The etcd members among `hosts` and how the others go on: refused when
/// none would stay, or an even count would (no more failures tolerated than
/// one member fewer) unless a member leaving is `unreachable` (dead: then a
/// warning says to add one).
fn etcd_leave(record: &ClusterRecord, hosts: &[String], unreachable: &[String]) -> anyhow::Result<Option<EtcdLeave>> {
    let g = &record.config.spec.role_groups;
    let name = &record.name;
    let leaving: Vec<String> = g.etcd.iter().filter(|m| hosts.contains(*m)).cloned().collect();
    if leaving.is_empty() {
        return Ok(None);
    }
    let usage = |msg: String| op(OpError::Usage, anyhow::anyhow!(msg));
    let stay: Vec<String> = g.etcd.iter().filter(|m| !leaving.contains(*m)).cloned().collect();
    let Some(via) = stay.iter().find(|m| !unreachable.contains(*m)).cloned() else {
        return Err(usage(format!(
            "removing {} would leave cluster {name} no etcd member that answers: the cluster's data lives there \
             (kubexm-install delete cluster {name} --yes takes the whole cluster down)",
            leaving.join(", ")
        )));
    };
    let dead: Vec<&String> = leaving.iter().filter(|m| unreachable.contains(*m)).collect();
    let mut warning = None;
    if stay.len().is_multiple_of(2) {
        let what = format!(
            "removing {} leaves cluster {name} {} etcd members, an even count: it tolerates {} failed member(s), no more than {} would",
            leaving.join(", "),
            stay.len(),
            (stay.len() - 1) / 2,
            stay.len() - 1
        );
        if dead.is_empty() {
            return Err(usage(format!(
                "{what}; remove one member more, or add one first (list it under roleGroups.etcd and apply)"
            )));
        }
        warning = Some(format!(
            "{what}: add a member (list a host under roleGroups.etcd and run kubexm-install apply) to make it odd again"
        ));
    }
    Ok(Some(EtcdLeave {
        leaving,
        stay,
        via,
        // Only the API servers that stay are told.
        control_plane: g
            .control_plane
            .iter()
            .filter(|c| !unreachable.contains(*c) && !hosts.contains(*c))
            .cloned()
            .collect(),
        warning,
    }))
}

/// The cluster as `record` has it, each host reached as the operator's
/// config `file` says when it lists the same machine (name and address):
/// how to log in is the operator's to change.
pub(crate) fn recorded_cluster(record: &ClusterRecord, file: Option<&Cluster>) -> Cluster {
    let mut cluster = record.config.clone();
    for h in &mut cluster.spec.hosts {
        if let Some(f) = file.and_then(|f| f.spec.hosts.iter().find(|f| f.name == h.name && f.address == h.address)) {
            *h = f.clone();
        }
    }
    cluster
}

/// Refuses taking out `host` with `roles` that remove node does not take out.
fn refuse_role(record: &ClusterRecord, topo: &kubexm_bom::topology::Topology, host: &str, roles: &[String]) -> anyhow::Result<()> {
    let name = &record.name;
    let g = &record.config.spec.role_groups;
    if roles.iter().any(|r| r == "control-plane") && g.control_plane.len() == 1 {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "{host} is the last control-plane node of cluster {name}: to take the whole cluster down, \
                 kubexm-install delete cluster {name} --yes"
            ),
        ));
    }
    if topo.first_control_plane == host {
        return Err(op(
            OpError::Unsupported,
            anyhow::anyhow!(
                "{host} is cluster {name}'s first control-plane node (it ran kubeadm init; the others join through it \
                 and kubexm reaches the cluster through it): removing it is not supported yet; remove another one"
            ),
        ));
    }
    if topo.registry.as_ref().is_some_and(|r| r.host == host) {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "{host} serves cluster {name}'s registry (every node pulls its images from it): it cannot be removed \
                 while it does; move the registry first: name another host under roleGroups.registry and apply \
                 (with --bundle), then remove {host}"
            ),
        ));
    }
    // etcd members leave where kubexm runs etcd.
    let binary = record.config.spec.etcd.mode == kubexm_bom::config::model::EtcdMode::Binary;
    let other: Vec<&str> = roles
        .iter()
        .map(String::as_str)
        .filter(|r| !(matches!(*r, "worker" | "local-proxy" | "control-plane") || (binary && *r == "etcd")))
        .collect();
    if !other.is_empty() {
        return Err(op(
            OpError::Unsupported,
            anyhow::anyhow!(
                "removing a {} node ({host}) is not supported yet: remove node takes out workers, control-plane nodes \
                 (not the first) and etcd members (binary mode)",
                other.join(" and ")
            ),
        ));
    }
    Ok(())
}

/// The job: for each host a chain of its own (one blocked drain does not
/// hold the others back): its Node cordoned and drained through `via`, the
/// host reset (its kubelet stopped: it cannot register the Node again),
/// then the Node deleted through `via`. A host named unreachable is only
/// cordoned and its Node deleted; one removed earlier while unreachable is
/// reset and its Node deleted, in case it registered again.
fn pipeline(cluster: &Cluster, plan: &Plan, unreachable: &BTreeSet<String>, o: &RemoveOptions) -> anyhow::Result<Pipeline> {
    let node_gone = |h: &str| format!("kubectl --kubeconfig {ADMIN_CONF} get node {} 2>&1 | grep -q NotFound", q(h));
    let mut drains = Vec::new();
    let mut resets = Vec::new();
    let mut deletes = Vec::new();
    let (mut follow, mut leave) = (Vec::new(), Vec::new());
    if let Some(e) = &plan.etcd {
        // Every API server stops reading the members leaving, then each
        // leaves through one that stays, then its host is reset.
        let topo = kubexm_bom::topology::Topology::of(&plan.record.config)?;
        follow = etcd_members::api_servers_follow(&topo, &e.stay, &e.control_plane, &[])?;
        let mut after: Vec<(String, Scope)> = follow.last().map(|t| (t.name.clone(), Scope::AllHosts)).into_iter().collect();
        for h in &e.leaving {
            let step = etcd_members::leave(&topo, h, &e.stay, !unreachable.contains(h))?;
            let name = format!("etcd-leave-{h}");
            leave.push(Task {
                name: name.clone(),
                hosts: vec![e.via.clone()],
                steps: vec![Arc::new(step)],
                after: after.clone(),
            });
            after = vec![(name, Scope::AllHosts)];
        }
    }
    // The load balancers or local proxies forward to the nodes that stay
    // before a leaving node's API server stops.
    let mut backends = match &plan.backends {
        Some(c) => crate::phases::endpoint::backends(c, &kubexm_bom::topology::Topology::of(c)?)?,
        None => Vec::new(),
    };
    backends.retain(|t| !t.hosts.iter().any(|h| unreachable.contains(h)));
    let proxied: Vec<(String, Scope)> = backends.iter().map(|t| (t.name.clone(), Scope::AllHosts)).collect();
    for h in &plan.hosts {
        let out = unreachable.contains(h);
        let mut before = None;
        if plan.members.contains(h) {
            let timeout = o.drain_timeout.as_secs().max(1).to_string();
            let script = crate::template::render(
                "remove-node.sh",
                REMOVE_NODE,
                &[
                    ("NODE", &q(h)),
                    ("ADMIN_CONF", ADMIN_CONF),
                    ("DRAIN", if out { "no" } else { "yes" }),
                    ("TIMEOUT", &timeout),
                    ("FORCE", if o.force_drain { "--disable-eviction --force" } else { "" }),
                ],
                &[],
            )?;
            let mut step = Shell::new(&format!("drain-{h}"), Some(&node_gone(h)), &script);
            step.timeout = o.drain_timeout.saturating_add(Duration::from_secs(120));
            // Not while the API servers restart to read etcd without the
            // members leaving (the drain goes through one of them).
            drains.push(Task {
                name: format!("drain-{h}"),
                hosts: vec![plan.via.clone()],
                steps: vec![Arc::new(step)],
                after: follow.last().map(|t| (t.name.clone(), Scope::AllHosts)).into_iter().collect(),
            });
            before = Some(format!("drain-{h}"));
        }
        let left_etcd = leave.iter().find(|t| t.name == format!("etcd-leave-{h}")).map(|t| t.name.clone());
        if !out {
            resets.push(Task {
                name: format!("reset-{h}"),
                hosts: vec![h.clone()],
                steps: vec![Arc::new(crate::pipelines::reset::step(cluster, plan.etcd_data.contains(h))?) as Arc<dyn Step>],
                after: before
                    .iter()
                    .chain(left_etcd.iter())
                    .map(|b| (b.clone(), Scope::AllHosts))
                    .chain(proxied.iter().cloned())
                    .collect(),
            });
            before = Some(format!("reset-{h}"));
        }
        let delete = Shell::new(
            &format!("delete-node-{h}"),
            Some(&node_gone(h)),
            &format!(
                "kubectl --kubeconfig {ADMIN_CONF} delete node {} --ignore-not-found --wait=true",
                q(h)
            ),
        );
        // After the member left etcd too: a host counts as removed once this
        // step is done, and a dead member's removal must not be skipped past.
        deletes.push(Task {
            name: format!("delete-node-{h}"),
            hosts: vec![plan.via.clone()],
            steps: vec![Arc::new(delete)],
            after: before
                .iter()
                .chain(left_etcd.iter())
                .map(|b| (b.clone(), Scope::AllHosts))
                .collect(),
        });
    }
    Ok(Pipeline::of(
        "remove-node",
        vec![
            ("etcd-servers", follow),
            ("etcd-member-remove", leave),
            ("loadbalancer", backends),
            ("drain", drains),
            (crate::pipelines::Phase::Reset.name(), resets),
            ("delete-node", deletes),
        ],
    ))
}

/// The hosts whose Node deletion completed in a removal's run (a failed
/// run may have removed some).
fn removed_in(report: &crate::engine::run::Report, hosts: &[String]) -> Vec<String> {
    use crate::engine::state::Outcome;
    hosts
        .iter()
        .filter(|h| {
            report
                .results
                .iter()
                .any(|r| r.id.contains(&format!("/delete-node-{h}@")) && matches!(r.outcome, Outcome::Applied | Outcome::Skipped))
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests;
