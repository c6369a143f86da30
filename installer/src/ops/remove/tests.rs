//! Tests of `remove node`: refusals, etcd members leaving, workers and
//! control-plane nodes taken out on fake hosts.

use super::*;
use crate::ops::fixture::{CONFIG, Fixture};

impl Fixture {
    fn remove(&self, text: &str, hosts: &[&str], unreachable: &[&str]) -> anyhow::Result<RemoveReport> {
        let o = RemoveOptions {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            unreachable: unreachable.iter().map(|h| h.to_string()).collect(),
            drain_timeout: DRAIN_TIMEOUT,
            force_drain: false,
            dry_run: false,
        };
        remove(&mut self.session(text)?, &o)
    }
}

fn kind(r: anyhow::Result<RemoveReport>) -> (Option<&'static str>, String) {
    let Err(e) = r else {
        return (None, "removed".into());
    };
    let kind = match OpError::find(&e) {
        Some(OpError::Usage(_)) => Some("usage"),
        Some(OpError::Unsupported(_)) => Some("unsupported"),
        Some(OpError::Config(_)) => Some("config"),
        _ => match e.downcast_ref::<kubexm_bom::config::LoadError>() {
            Some(_) => Some("config"),
            None => Some("other"),
        },
    };
    (kind, format!("{e:#}"))
}

/// Issue 29: etcd members leave only to an odd count, unless one
/// leaving is dead (then a warning); never all of them.
#[test]
fn etcd_members_leave_to_an_odd_count_unless_dead() -> anyhow::Result<()> {
    let f = Fixture::installed()?;
    let mut r = f.record()?;
    r.config.spec.role_groups.etcd = vec!["a".into(), "b".into(), "c".into()];
    let names = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let Err(even) = etcd_leave(&r, &names(&["b"]), &[]) else {
        anyhow::bail!("an even count left accepted");
    };
    assert!(format!("{even:#}").contains("2 etcd members, an even count"), "{even:#}");
    let Some(dead) = etcd_leave(&r, &names(&["b"]), &names(&["b"]))? else {
        anyhow::bail!("no etcd member leaving");
    };
    assert_eq!((dead.stay.clone(), dead.via.as_str()), (names(&["a", "c"]), "a"));
    assert!(
        dead.warning.as_deref().is_some_and(|w| w.contains("add a member")),
        "{:?}",
        dead.warning
    );
    let Some(two) = etcd_leave(&r, &names(&["b", "c"]), &[])? else {
        anyhow::bail!("no etcd member leaving");
    };
    assert!(two.warning.is_none());
    let Some(down) = etcd_leave(&r, &names(&["b"]), &names(&["a", "b"]))? else {
        anyhow::bail!("no etcd member leaving");
    };
    assert_eq!(down.via, "c", "through a member that answers");
    assert!(down.control_plane.is_empty(), "an unreachable control-plane node is not told");
    assert!(etcd_leave(&r, &names(&["a", "b", "c"]), &[]).is_err(), "every member removed");
    assert!(etcd_leave(&r, &names(&["d"]), &[])?.is_none(), "a worker is no etcd member");
    Ok(())
}

/// Issue 29: what remove node cannot do is refused before any host is
/// touched, each with its reason.
#[test]
fn refusals_come_before_any_host_is_touched() -> anyhow::Result<()> {
    let f = Fixture::installed()?;
    let before = f.connecting.asked().len();
    let moved = CONFIG.replace("10.0.0.2", "10.0.0.9");
    for (text, hosts, unreachable, want, says) in [
        (CONFIG, vec!["z"], vec![], "usage", "record has no host z (its hosts: a, b, c, d)"),
        (CONFIG, vec!["b"], vec!["y"], "usage", "--unreachable y"),
        (CONFIG, vec!["a"], vec![], "usage", "a is the last control-plane node"),
        (
            moved.as_str(),
            vec!["b"],
            vec![],
            "config",
            "host b's address changed: recorded 10.0.0.2, now 10.0.0.9",
        ),
    ] {
        let (got, msg) = kind(f.remove(text, &hosts, &unreachable));
        assert_eq!(got, Some(want), "{hosts:?}: {msg}");
        assert!(msg.contains(says), "{hosts:?}: {msg}");
    }
    let two_cp = CONFIG
        .replace("control-plane: [a]", "control-plane: [a, b]")
        .replace("worker: [b, c, d]", "worker: [c, d]");
    let g = Fixture::installed()?;
    let s = g.session(&two_cp)?;
    let ex = s.execute("install", run::Policy::FailFast, |_| {
        Ok(crate::engine::jobs::one_task("probe", vec![], vec![]))
    })?;
    s.keep_record(ex.job, None, &Default::default())?;
    let (got, msg) = kind(g.remove(&two_cp, &["a"], &[]));
    assert_eq!(got, Some("unsupported"), "{msg}");
    assert!(msg.contains("a is cluster s's first control-plane node"), "{msg}");
    assert_eq!(f.connecting.asked().len(), before, "a host was contacted");
    assert!(f.connecting.log.calls().is_empty(), "a command ran: {:?}", f.connecting.log.calls());
    Ok(())
}

/// Issue 29: b is drained and reset; c, named unreachable, is never
/// contacted and stays in the record as removed, not reset, until a
/// later removal resets it; d, another worker, is not contacted at all.
#[test]
fn a_reachable_and_an_unreachable_worker_are_removed() -> anyhow::Result<()> {
    let f = Fixture::installed()?;
    let before = f.connecting.asked().len();
    let RemoveReport::Removed(r) = f.remove(CONFIG, &["b", "c"], &["c"])? else {
        anyhow::bail!("planned instead of removing");
    };
    assert_eq!(&f.connecting.asked()[before..], ["a", "b"], "hosts connected to");
    let calls = f.connecting.log.calls();
    assert!(calls.iter().all(|(h, _)| h == "a" || h == "b"), "{calls:?}");
    assert!(
        calls.iter().any(|(h, c)| h == "a" && c.contains("get node 'b'")),
        "b's Node was not removed through a: {calls:?}"
    );
    assert!(
        calls.iter().any(|(h, c)| h == "a" && c.contains("get node 'c'")),
        "c's Node was not removed through a: {calls:?}"
    );
    let text = r.to_string();
    assert!(
        text.contains("removed b from cluster s") && text.contains("not run on c (named unreachable): drain, reset"),
        "{text}"
    );
    assert!(
        text.contains("s.yaml:8:5 (b)") && text.contains("delete this host from the config"),
        "{text}"
    );
    let rec = f.record()?;
    assert_eq!((rec.job.kind.as_str(), rec.job.status.as_str()), ("remove-node", "succeeded"));
    let nodes: Vec<(&str, NodeState)> = rec.nodes.iter().map(|n| (n.name.as_str(), n.state)).collect();
    assert_eq!(
        nodes,
        [
            ("a", NodeState::Member),
            ("c", NodeState::RemovedNotReset),
            ("d", NodeState::Member)
        ]
    );
    assert_eq!(rec.config.spec.role_groups.worker, ["d"]);
    assert!(rec.to_string().contains("removed, not reset"), "{rec}");
    // c is back: removing it again resets it, and the record forgets it.
    let RemoveReport::Removed(again) = f.remove(CONFIG, &["c"], &[])? else {
        anyhow::bail!("planned instead of removing");
    };
    assert!(again.hosts[0].reset && !again.hosts[0].drained, "{again:?}");
    assert!(f.connecting.log.calls().iter().any(|(h, _)| h == "c"), "c was not reset");
    let names: Vec<String> = f.record()?.nodes.iter().map(|n| n.name.clone()).collect();
    assert_eq!(names, ["a", "d"]);
    // A host no longer in the record is refused.
    let (got, msg) = kind(f.remove(CONFIG, &["b"], &[]));
    assert_eq!(got, Some("usage"), "{msg}");
    Ok(())
}

/// Issue 29: a dead control-plane node (b) is taken out: never contacted,
/// its Node deleted through a, and every local proxy (c, d) forwards to a
/// only; the live one after it is drained and reset only after the proxies.
#[test]
fn control_plane_nodes_leave_and_the_proxies_follow() -> anyhow::Result<()> {
    let three_cp = CONFIG.replace("control-plane: [a]", "control-plane: [a, b, e]").replace(
        "  roleGroups:",
        "  - {name: e, address: 10.0.0.5, auth: {agent: true}}\n  roleGroups:",
    );
    let f = Fixture::installed()?;
    let s = f.session(&three_cp)?;
    let ex = s.execute("install", run::Policy::FailFast, |_| {
        Ok(crate::engine::jobs::one_task("probe", vec![], vec![]))
    })?;
    s.keep_record(ex.job, None, &Default::default())?;
    let before = f.connecting.asked().len();
    // d, a local proxy, is down too: named unreachable, it is left alone.
    let RemoveReport::Removed(r) = f.remove(&three_cp, &["b"], &["b", "d"])? else {
        anyhow::bail!("planned instead of removing");
    };
    let mut asked = f.connecting.asked()[before..].to_vec();
    asked.sort();
    assert_eq!(asked, ["a", "c"], "hosts connected to");
    let calls = f.connecting.log.calls();
    // The proxies' config is checked against one forwarding to a and e, not b.
    let after = crate::ops::remove::recorded_cluster(&f.record()?, None);
    let cfg = crate::phases::endpoint::local_proxy::config(&after, &kubexm_bom::topology::Topology::of(&after)?)?;
    assert!(
        cfg.contains("server a 10.0.0.1:6443") && cfg.contains("server e 10.0.0.5:6443") && !cfg.contains("server b "),
        "{cfg}"
    );
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(cfg.as_bytes()))
    };
    assert!(
        calls
            .iter()
            .any(|(h, c)| h == "c" && c.contains(crate::paths::HAPROXY_CFG) && c.contains(&sha)),
        "c: {calls:?}"
    );
    assert!(calls.iter().any(|(h, c)| h == "a" && c.contains("get node 'b'")), "{calls:?}");
    assert_eq!(r.proxies, ["c"]);
    let text = r.to_string();
    for want in [
        "haproxy forwards to the control-plane nodes that stay on c",
        "haproxy on d (named unreachable) still lists",
        "b still hold(s) the cluster's keys",
        "removed b from cluster s (job",
    ] {
        assert!(text.contains(want), "no {want:?} in {text}");
    }
    let rec = f.record()?;
    assert_eq!(rec.config.spec.role_groups.control_plane, ["a", "e"]);
    // e is drained, then reset once the proxies forward to a only.
    let Pipeline { modules, .. } = {
        let mut s = f.session(&three_cp)?;
        let o = RemoveOptions {
            hosts: vec!["e".into()],
            unreachable: vec![],
            drain_timeout: DRAIN_TIMEOUT,
            force_drain: false,
            dry_run: true,
        };
        let plan = check(&mut s, &o)?;
        pipeline(s.cluster(), &plan, s.unreachable_hosts(), &o)?
    };
    let task = |name: &str| modules.iter().flat_map(|m| &m.tasks).find(|t| t.name == name);
    let reset = task("reset-e").ok_or_else(|| anyhow::anyhow!("no reset of e"))?;
    let after: Vec<&str> = reset.after.iter().map(|(t, _)| t.as_str()).collect();
    assert!(
        after.contains(&"drain-e") && after.contains(&"haproxy-backends-c") && after.contains(&"haproxy-backends-d"),
        "{after:?}"
    );
    Ok(())
}
