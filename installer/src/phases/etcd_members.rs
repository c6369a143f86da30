//! etcd's membership changed on a running cluster (binary mode): a member
//! joins as a learner and is promoted once it has caught up (`apply`, one
//! member at a time), a member leaves through the members that stay, its
//! leadership moved off it first (`remove node`); and what reads the member
//! list follows: every API server's `--etcd-servers`, one control-plane node
//! at a time, and kubeadm's ClusterConfiguration, which a joining
//! control-plane node reads. Each step checks the host first: a re-run
//! (after a crash between the learner's addition and its promotion too)
//! does only what is left.

use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::topology::Topology;

use crate::engine::plan::{Scope, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::paths::{ETCD_INITIAL_ENV, ETCD_PKI};
use crate::template::render;

const JOIN: &str = include_str!("../../../manifests/templates/etcd-member-join.sh");
const LEAVE: &str = include_str!("../../../manifests/templates/etcd-member-remove.sh");
const MOVE_LEADER: &str = include_str!("../../../manifests/templates/etcd-move-leader.sh");
const LEADER_OFF: &str = include_str!("../../../manifests/templates/etcd-leader-off.sh");
const SERVERS: &str = include_str!("../../../manifests/templates/etcd-servers.sh");
const KUBEADM_CONFIG: &str = include_str!("../../../manifests/templates/kubeadm-config-etcd.sh");

/// The API server's static-pod manifest on a control-plane node.
pub const API_SERVER_MANIFEST: &str = "/etc/kubernetes/manifests/kube-apiserver.yaml";

/// How long a learner may take to catch up before its promotion fails.
const PROMOTE_WAIT: u64 = 120;

/// `https://ADDRESS:PORT` of each of `members`.
fn urls(topo: &Topology, members: &[String], port: u16) -> Vec<String> {
    members.iter().map(|m| format!("https://{}:{port}", topo.address(m))).collect()
}

/// Member `m`'s peer URL.
pub fn peer_url(topo: &Topology, m: &str) -> String {
    format!("https://{}:2380", topo.address(m))
}

/// The client URLs of `members`, comma-separated (`--etcd-servers`).
pub fn client_urls(topo: &Topology, members: &[String]) -> String {
    urls(topo, members, 2379).join(",")
}

/// etcdctl speaking TLS with the member's client certificate, no endpoint
/// named (`--endpoints` given once: a second one would add to the first).
fn etcdctl_bare() -> String {
    format!("ETCDCTL_API=3 etcdctl --cacert={ETCD_PKI}/ca.crt --cert={ETCD_PKI}/client.crt --key={ETCD_PKI}/client.key")
}

/// etcdctl speaking TLS to `endpoints` (comma-separated) with the member's
/// client certificate.
pub fn etcdctl(endpoints: &str) -> String {
    format!("{} --endpoints={endpoints}", etcdctl_bare())
}

/// The two parts of member `m` joining the cluster of `before` (its members
/// until now), run on `m`: `add` (a learner, and how it joins written to
/// its environment file) before its unit starts, `promote` after.
pub struct Join {
    pub add: Shell,
    pub promote: Shell,
}

/// Member `m` joining the members `before`.
pub fn join(topo: &Topology, m: &str, before: &[String]) -> anyhow::Result<Join> {
    let endpoints = client_urls(topo, before);
    let (ctl, peer, name_q, wait) = (etcdctl(&endpoints), peer_url(topo, m), q(m), PROMOTE_WAIT.to_string());
    let script = |tail: &str| {
        render(
            "etcd-member-join.sh",
            JOIN,
            &[
                ("CTL", &ctl),
                ("NAME", m),
                ("NAME_Q", &name_q),
                ("PEER", &peer),
                ("ENV", ETCD_INITIAL_ENV),
                ("ENDPOINTS", &endpoints),
                ("WAIT", &wait),
                ("TAIL", tail),
            ],
            &[],
        )
    };
    let add = Shell::new("etcd-member-add", Some(&script("added")?), &script("add")?);
    let mut promote = Shell::new("etcd-member-promote", Some(&script("promoted")?), &script("promote")?);
    promote.timeout = Duration::from_secs(PROMOTE_WAIT + 60);
    Ok(Join { add, promote })
}

/// Member `m` leaving, through the members that `stay`; `answers`: false
/// when `m` is named unreachable (never asked for its leadership).
pub fn leave(topo: &Topology, m: &str, stay: &[String], answers: bool) -> anyhow::Result<Shell> {
    let endpoints = client_urls(topo, stay);
    let (ctl, peer) = (etcdctl(&endpoints), peer_url(topo, m));
    let move_leader = move_leader(topo, m, stay, answers)?;
    let script = |tail: &str| {
        render(
            "etcd-member-remove.sh",
            LEAVE,
            &[
                ("CTL", &ctl),
                ("MOVE_LEADER", &move_leader),
                ("NAME", m),
                ("PEER", &peer),
                ("ENDPOINTS", &endpoints),
                ("TAIL", tail),
            ],
            &[],
        )
    };
    let mut s = Shell::new(&format!("etcd-member-remove-{m}"), Some(&script("gone")?), &script("remove")?);
    s.timeout = Duration::from_secs(120);
    Ok(s)
}

/// The shell functions `leads` and `move_off` for member `m`, handing its
/// leadership to one of `others` (`answers`: false when `m` is not to be
/// asked, so it never leads).
fn move_leader(topo: &Topology, m: &str, others: &[String], answers: bool) -> anyhow::Result<String> {
    let alone = if answers {
        format!("{} --command-timeout=5s", etcdctl(&format!("https://{}:2379", topo.address(m))))
    } else {
        "false".to_string()
    };
    Ok(render(
        "etcd-move-leader.sh",
        MOVE_LEADER,
        &[
            ("CTL_ALONE", &alone),
            ("ETCDCTL", &etcdctl_bare()),
            ("NAME", m),
            ("PEER", &peer_url(topo, m)),
            ("ENDPOINTS", &client_urls(topo, others)),
        ],
        &[],
    )?)
}

/// Member `m` of `members` hands etcd's leadership to another member when
/// it leads (checked first: a follower does nothing); `None` for a
/// cluster of one.
pub fn leader_off(topo: &Topology, m: &str, members: &[String]) -> anyhow::Result<Option<Shell>> {
    let others: Vec<String> = members.iter().filter(|x| *x != m).cloned().collect();
    if others.is_empty() {
        return Ok(None);
    }
    let (ctl, peer) = (etcdctl(&client_urls(topo, members)), peer_url(topo, m));
    let move_leader = move_leader(topo, m, &others, true)?;
    let script = |tail: &str| {
        render(
            "etcd-leader-off.sh",
            LEADER_OFF,
            &[
                ("CTL", &ctl),
                ("MOVE_LEADER", &move_leader),
                ("NAME", m),
                ("PEER", &peer),
                ("TAIL", tail),
            ],
            &[],
        )
    };
    let mut s = Shell::new(&format!("etcd-leader-off-{m}"), Some(&script("! leads")?), &script("move_off")?);
    s.timeout = Duration::from_secs(120);
    Ok(Some(s))
}

/// The tasks that make every API server (on `control_plane`, one node at a
/// time, each after `after`) read etcd at `members`, then kubeadm's
/// ClusterConfiguration list them (through `control_plane`'s first node).
/// The last task's name is [`FOLLOWED`].
pub fn api_servers_follow(
    topo: &Topology,
    members: &[String],
    control_plane: &[String],
    after: &[(String, Scope)],
) -> anyhow::Result<Vec<Task>> {
    let mut tasks = api_servers(topo, members, control_plane, after)?;
    let Some(first) = control_plane.first() else {
        return Ok(tasks);
    };
    let deps = match tasks.last() {
        Some(prev) => vec![(prev.name.clone(), Scope::AllHosts)],
        None => after.to_vec(),
    };
    tasks.push(kubeadm_config(topo, members, first, deps)?);
    Ok(tasks)
}

/// The task (named [`FOLLOWED`]) making kubeadm's ClusterConfiguration
/// list etcd's `members`, through control-plane node `via`, after `after`:
/// what a control-plane node joining reads.
pub fn kubeadm_config(topo: &Topology, members: &[String], via: &str, after: Vec<(String, Scope)>) -> anyhow::Result<Task> {
    let endpoints = urls(topo, members, 2379).join(" ");
    let kubectl = crate::waits::kubectl();
    let script = |tail: &str| {
        render(
            "kubeadm-config-etcd.sh",
            KUBEADM_CONFIG,
            &[("ENDPOINTS", &endpoints), ("KUBECTL", &kubectl), ("TAIL", tail)],
            &[],
        )
    };
    let step = Shell::new("kubeadm-config-etcd", Some(&script("current")?), &script("update")?);
    Ok(Task {
        name: FOLLOWED.into(),
        hosts: vec![via.to_string()],
        steps: vec![Arc::new(step)],
        after,
    })
}

/// The tasks that make every API server on `control_plane` read etcd at
/// `members`: one node at a time, each after `after`.
pub fn api_servers(topo: &Topology, members: &[String], control_plane: &[String], after: &[(String, Scope)]) -> anyhow::Result<Vec<Task>> {
    let servers = q(&client_urls(topo, members));
    let kubectl = crate::waits::kubectl();
    let mut tasks: Vec<Task> = Vec::new();
    for h in control_plane {
        let server = q(&format!("https://{}:6443", topo.address(h)));
        let script = |tail: &str| {
            render(
                "etcd-servers.sh",
                SERVERS,
                &[
                    ("MANIFEST", API_SERVER_MANIFEST),
                    ("SERVERS", &servers),
                    ("KUBECTL", &kubectl),
                    ("SERVER", &server),
                    ("STATIC_POD", crate::template::STATIC_POD),
                    ("TAIL", tail),
                ],
                &[],
            )
        };
        let mut step = Shell::new("etcd-servers", Some(&script("current")?), &script("update")?);
        step.timeout = Duration::from_secs(240);
        let mut deps = after.to_vec();
        if let Some(prev) = tasks.last() {
            deps.push((prev.name.clone(), Scope::AllHosts));
        }
        tasks.push(Task {
            name: format!("etcd-servers-{h}"),
            hosts: vec![h.clone()],
            steps: vec![Arc::new(step)],
            after: deps,
        });
    }
    Ok(tasks)
}

/// The name of the task of [`kubeadm_config`], the last of [`api_servers_follow`].
pub const FOLLOWED: &str = "kubeadm-config-etcd";

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> anyhow::Result<Topology> {
        let f = crate::ops::fixture::Fixture::installed()?;
        let s = f.session(crate::ops::fixture::CONFIG)?;
        Ok(Topology::of(s.cluster())?)
    }

    #[test]
    fn a_learner_joins_through_the_members_before_it_and_is_promoted() -> anyhow::Result<()> {
        let t = topo()?;
        let j = join(&t, "b", &["a".to_string()])?;
        assert!(
            j.add.apply.contains("member add 'b' --peer-urls=https://10.0.0.2:2380 --learner"),
            "{}",
            j.add.apply
        );
        assert!(j.add.apply.contains("--endpoints=https://10.0.0.1:2379"), "{}", j.add.apply);
        assert!(j.add.apply.trim_end().ends_with("add"));
        assert!(j.add.check.as_deref().is_some_and(|c| c.trim_end().ends_with("added")));
        assert!(j.add.apply.contains(ETCD_INITIAL_ENV));
        assert!(j.promote.apply.contains("member promote"));
        assert!(j.promote.check.as_deref().is_some_and(|c| c.trim_end().ends_with("promoted")));
        Ok(())
    }

    #[test]
    fn a_member_leaves_through_those_that_stay() -> anyhow::Result<()> {
        let t = topo()?;
        let stay = ["a".to_string(), "c".to_string()];
        let s = leave(&t, "b", &stay, true)?;
        assert!(
            s.apply.contains("--endpoints=https://10.0.0.1:2379,https://10.0.0.3:2379"),
            "{}",
            s.apply
        );
        assert!(
            s.apply.contains("--endpoints=https://10.0.0.2:2379 --command-timeout"),
            "{}",
            s.apply
        );
        assert!(s.apply.contains("move-leader"));
        let dead = leave(&t, "b", &stay, false)?;
        assert!(!dead.apply.contains("--endpoints=https://10.0.0.2:2379 "), "{}", dead.apply);
        let ctls = s.apply.matches("etcdctl --cacert").count();
        assert_eq!(
            s.apply.matches("--endpoints").count(),
            ctls,
            "one --endpoints per etcdctl: {}",
            s.apply
        );
        Ok(())
    }

    /// Issue 30: before an upgrade restarts a member, a leading member
    /// hands etcd's leadership to another (asked of it alone; the others
    /// take it); a follower does nothing (the check); a cluster of one has
    /// no such step. The scripts are valid sh.
    #[test]
    fn a_leading_member_hands_on_its_leadership_before_it_restarts() -> anyhow::Result<()> {
        let t = topo()?;
        let members = ["a".to_string(), "b".to_string(), "c".to_string()];
        let Some(s) = leader_off(&t, "b", &members)? else {
            anyhow::bail!("no step for a member of three");
        };
        assert!(
            s.apply.trim_end().ends_with("move_off") && s.apply.contains("move-leader"),
            "{}",
            s.apply
        );
        assert!(s.check.as_deref().is_some_and(|c| c.trim_end().ends_with("! leads")));
        assert!(
            s.apply.contains("--endpoints=https://10.0.0.2:2379 --command-timeout"),
            "{}",
            s.apply
        );
        assert!(s.apply.contains(",https://10.0.0.1:2379,https://10.0.0.3:2379,"), "{}", s.apply);
        assert!(leader_off(&t, "a", &["a".to_string()])?.is_none());
        for script in [
            s.apply.as_str(),
            s.check.as_deref().unwrap_or_default(),
            &leave(&t, "b", &members[..1], true)?.apply,
        ] {
            let out = std::process::Command::new("sh").args(["-n", "-c", script]).output()?;
            assert!(out.status.success(), "{}\n{script}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    #[test]
    fn api_servers_follow_one_node_at_a_time_then_kubeadm_config() -> anyhow::Result<()> {
        let t = topo()?;
        let members = ["a".to_string(), "b".to_string(), "c".to_string()];
        let cps = ["a".to_string(), "b".to_string()];
        let after = [("etcd-health".to_string(), Scope::AllHosts)];
        let tasks = api_servers_follow(&t, &members, &cps, &after)?;
        let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["etcd-servers-a", "etcd-servers-b", FOLLOWED]);
        assert_eq!(tasks[1].after.len(), 2, "after etcd-health and the node before");
        assert_eq!(tasks[2].hosts, ["a"]);
        assert_eq!(tasks[0].steps.len(), 1);
        Ok(())
    }
}
