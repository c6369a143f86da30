//! The reset pipeline: every host back to before kubexm (packages stay),
//! one idempotent step per host. etcd's data directory is removed only on
//! the hosts that run etcd, and only when it holds etcd's `member/`.

use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use kubexm_bom::config::model::EtcdMode;

use crate::engine::plan::{Module, Pipeline, Step, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::paths::{
    ETCD_BACKUP_SERVICE, ETCD_BACKUP_TIMER, ETCD_BIN, ETCD_UNIT, HOST_ETC, HOST_STATE, KUBELET_BIN, KUBELET_UNIT, KUBERNETES_DIR,
};
use crate::template::render;

const RESET: &str = include_str!("../../../manifests/templates/reset.sh");

/// The hosts whose etcd data directory is theirs to remove.
fn etcd_hosts(cluster: &Cluster) -> Vec<String> {
    match cluster.spec.etcd.mode {
        EtcdMode::External => Vec::new(),
        EtcdMode::Binary | EtcdMode::Kubeadm => cluster.spec.role_groups.etcd.clone(),
    }
}

/// The reset step: on an etcd host (`etcd`) it also removes the etcd data
/// directory, if that holds etcd's `member/`.
pub(crate) fn step(cluster: &Cluster, etcd: bool) -> Result<Shell, crate::template::Unfilled> {
    let data = q(&cluster.spec.etcd.data_dir.display().to_string());
    let (wipe, left) = if etcd {
        (
            format!("if [ -d {data}/member ]; then rm -rf {data}; fi"),
            format!("[ -d {data}/member ] && exit 1; "),
        )
    } else {
        (String::new(), String::new())
    };
    let leftovers = format!(
        "{left}for p in {HOST_ETC} {HOST_STATE} {KUBERNETES_DIR} {containerd} {KUBELET_BIN} {ETCD_BIN} \
         {ETCD_UNIT} {KUBELET_UNIT} {ETCD_BACKUP_SERVICE} {ETCD_BACKUP_TIMER}; do [ -e \"$p\" ] && exit 1; done; \
         ! grep -q '# kubexm control-plane endpoint' /etc/hosts",
        containerd = "/etc/containerd"
    );
    let mut step = Shell::new("reset", Some(&leftovers), &render("reset.sh", RESET, &[("ETCD_WIPE", &wipe)], &[])?);
    step.timeout = Duration::from_secs(300);
    Ok(step)
}

/// `reset`: the `hosts` given (every host of the cluster, or those that
/// can be reached) back to before kubexm (packages stay).
pub fn pipeline(cluster: &Cluster, hosts: &[String]) -> Result<Pipeline, crate::template::Unfilled> {
    let etcd = etcd_hosts(cluster);
    let (with, without): (Vec<String>, Vec<String>) = hosts.iter().cloned().partition(|h| etcd.contains(h));
    let mut tasks = Vec::new();
    for (name, hosts, etcd) in [("reset-etcd-host", with, true), ("reset", without, false)] {
        if !hosts.is_empty() {
            tasks.push(Task {
                name: name.into(),
                hosts,
                steps: vec![Arc::new(step(cluster, etcd)?) as Arc<dyn Step>],
                after: vec![],
            });
        }
    }
    Ok(Pipeline {
        name: "reset".into(),
        modules: vec![Module {
            name: super::Phase::Reset.name().into(),
            tasks,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 24, item 11: the etcd data directory is removed only on etcd
    /// hosts and only when it holds `member/`; no other host's script names it.
    #[test]
    fn etcd_data_is_removed_only_on_etcd_hosts_holding_member() -> Result<(), Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(format!("{}/../examples/ha.yaml", env!("CARGO_MANIFEST_DIR")))?;
        let mut c = kubexm_bom::config::load_str_hosts(&text, "ha.yaml")?;
        c.spec.etcd.data_dir = "/data/etcd-x".into();
        let all: Vec<String> = c.spec.hosts.iter().map(|h| h.name.clone()).collect();
        let p = pipeline(&c, &all)?;
        let tasks = &p.modules[0].tasks;
        let etcd = tasks.iter().find(|t| t.name == "reset-etcd-host").ok_or("no etcd task")?;
        assert_eq!(etcd.hosts, c.spec.role_groups.etcd);
        let wipe = step(&c, true)?;
        assert!(
            wipe.apply
                .contains("if [ -d '/data/etcd-x'/member ]; then rm -rf '/data/etcd-x'; fi"),
            "{}",
            wipe.apply
        );
        let other = step(&c, false)?;
        assert!(!other.apply.contains("/data/etcd-x") && !other.check.unwrap_or_default().contains("/data/etcd-x"));
        assert!(tasks.iter().any(|t| t.name == "reset" && t.hosts.contains(&"worker1".to_string())));
        Ok(())
    }
}
