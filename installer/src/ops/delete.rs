//! `kubexm-install delete cluster NAME --yes`: the end of a cluster. Every
//! host its record lists is reset (those named unreachable are not
//! contacted, and the summary says how to reset them later), then the
//! cluster's record is forgotten: `status --cluster` no longer lists it,
//! `apply` refuses it, an install under the same name starts from nothing.
//! Its jobs stay in the state database as history. The admin kubeconfig
//! goes; the PKI, etcd snapshots and conformance results stay unless
//! `purge`, their paths printed either way.

use std::path::PathBuf;

use kubexm_bom::record::NodeState;
use serde::Serialize;

use super::error::{OpError, op};
use super::session::Session;
use crate::engine::run;

/// What `delete cluster` is asked.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// Really delete; without it, the plan and a refusal.
    pub yes: bool,
    /// Remove the cluster's PKI, snapshots and conformance results too.
    pub purge: bool,
    /// Hosts known to be down: never contacted, not reset.
    pub unreachable: Vec<String>,
}

/// What `delete cluster` did, or would do.
#[derive(Debug)]
pub enum DeleteReport {
    NotConfirmed { plan: String, refusal: String },
    Deleted(Deleted),
}

/// A cluster deleted.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    pub cluster: String,
    pub job: i64,
    /// The hosts reset.
    pub reset: Vec<String>,
    /// The hosts not reset: named unreachable, or removed while
    /// unreachable earlier and not listed in the config given.
    pub not_reset: Vec<String>,
    /// What stays on this machine (without `purge`).
    pub kept: Vec<PathBuf>,
    /// What stays on the hosts: `host:directory` of `etcd.backup`'s snapshots.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_on_hosts: Vec<String>,
    /// What was removed from this machine.
    pub removed: Vec<PathBuf>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub timing: String,
}

impl std::fmt::Display for Deleted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "deleted cluster {} (job {}): {} host(s) reset, its record forgotten",
            self.cluster,
            self.job,
            self.reset.len()
        )?;
        if !self.not_reset.is_empty() {
            writeln!(
                f,
                "  NOT reset: {} (they may still run kubelet with a valid certificate); when back, reset them with the \
                 cluster's config: kubexm-install reset -f CONFIG --yes --unreachable <every other host>",
                self.not_reset.join(", ")
            )?;
        }
        for p in &self.removed {
            writeln!(f, "  removed {}", p.display())?;
        }
        for p in &self.kept {
            writeln!(f, "  kept {} (--purge removes it)", p.display())?;
        }
        for p in &self.kept_on_hosts {
            writeln!(
                f,
                "  kept {p} (etcd.backup's snapshots; remove them on the host when no longer needed)"
            )?;
        }
        if !self.timing.is_empty() {
            writeln!(f, "{}", self.timing.trim_end())?;
        }
        Ok(())
    }
}

/// Deletes the session's cluster. `file`: whether the session's config is
/// the operator's (its hosts' connection settings are used) or the record's.
pub fn delete(session: &mut Session, file: bool, o: &DeleteOptions) -> anyhow::Result<DeleteReport> {
    let name = session.cluster().metadata.name.clone();
    let record = session.last_record(false)?.ok_or_else(|| {
        op(
            OpError::Usage,
            anyhow::anyhow!(
                "the state database {} has no record of cluster {name}: nothing to delete. \
                 To reset the hosts of a cluster kubexm has no record of: kubexm-install reset -f CONFIG --yes",
                session.settings().engine.state.display()
            ),
        )
    })?;
    let given = session.cluster().clone();
    if file {
        // A name the record knows is the machine it recorded: never reset another.
        let names: Vec<String> = record.nodes.iter().map(|n| n.name.clone()).collect();
        let located = session.located();
        kubexm_bom::changes::same_hosts(&record, &given, &names, located.as_ref(), session.config_name())
            .map_err(kubexm_bom::config::LoadError::Invalid)?;
    }
    let mut cluster = super::remove::recorded_cluster(&record, file.then_some(&given));
    let mut not_reset: Vec<String> = Vec::new();
    for n in record.nodes.iter().filter(|n| n.state == NodeState::RemovedNotReset) {
        match given.spec.hosts.iter().find(|h| h.name == n.name && file) {
            Some(h) => cluster.spec.hosts.push(h.clone()),
            None => not_reset.push(n.name.clone()),
        }
    }
    session.use_cluster(cluster);
    session.unreachable(&o.unreachable)?;
    let hosts = session.hosts();
    let pipeline = crate::pipelines::reset::pipeline(session.cluster(), &hosts)?;
    if !o.yes {
        return Ok(DeleteReport::NotConfirmed {
            plan: pipeline.plan()?.describe(),
            refusal: format!(
                "delete resets cluster {name} on {} host(s), etcd data included, and forgets it; nothing was touched. \
                 Pass --yes to do it",
                hosts.len()
            ),
        });
    }
    let ex = session.execute("delete-cluster", run::Policy::ContinueOtherHosts, |_| Ok(pipeline))?;
    if !ex.ok() {
        session.keep_unchanged(ex.job, &record);
        let errors = ex.errors();
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "deleting cluster {name} failed on {} host(s) (job {}); its record is kept. Fix what is named and run it \
                 again, or name a dead host with --unreachable:\n  {}",
                errors.len(),
                ex.job,
                errors.join("\n  ")
            ),
        ));
    }
    session.forget()?;
    not_reset.extend(o.unreachable.iter().cloned());
    let settings = session.settings();
    let kubeconfig = super::install::kubeconfig_path(settings, session.cluster());
    let mut removed = Vec::new();
    if kubeconfig.exists() {
        fs_err::remove_file(&kubeconfig).map_err(|e| op(OpError::Io, e))?;
        removed.push(kubeconfig);
    }
    let mut kept = Vec::new();
    for dir in [
        settings.root.join("clusters").join(&name),
        settings.root.join("conformance").join(&name),
    ] {
        if !dir.exists() {
            continue;
        }
        if o.purge {
            fs_err::remove_dir_all(&dir).map_err(|e| op(OpError::Io, e))?;
            removed.push(dir);
        } else {
            kept.push(dir);
        }
    }
    let kept_on_hosts = match &record.config.spec.etcd.backup {
        Some(b) => record
            .config
            .spec
            .role_groups
            .etcd
            .iter()
            .map(|h| format!("{h}:{}", b.directory.display()))
            .collect(),
        None => Vec::new(),
    };
    Ok(DeleteReport::Deleted(Deleted {
        kept_on_hosts,
        cluster: name,
        job: ex.job,
        reset: hosts,
        not_reset,
        kept,
        removed,
        timing: session.timing(ex.job),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fixture::{CONFIG, Fixture};

    /// Issue 29: without --yes nothing is touched; with it every host the
    /// record lists but the one named unreachable is reset, the record is
    /// forgotten (status no longer lists the cluster), the kubeconfig goes
    /// and the PKI stays unless purged.
    #[test]
    fn delete_resets_every_host_and_forgets_the_record() -> anyhow::Result<()> {
        let f = Fixture::installed()?;
        let root = f.dir.path().join("root");
        let pki = crate::paths::cluster_pki(&root, "s");
        std::fs::create_dir_all(&pki)?;
        // A kubeconfig whose API server does not answer: acted on without the Lease.
        std::fs::write(
            root.join("s.kubeconfig"),
            "apiVersion: v1\nkind: Config\ncurrent-context: s\n\
             clusters: [{name: s, cluster: {server: 'https://127.0.0.1:1'}}]\n\
             users: [{name: s, user: {token: t}}]\n\
             contexts: [{name: s, context: {cluster: s, user: s}}]\n",
        )?;
        let before = f.connecting.log.calls().len();
        let o = |yes: bool, purge: bool| DeleteOptions {
            yes,
            purge,
            unreachable: vec!["d".into()],
        };
        let DeleteReport::NotConfirmed { refusal, .. } = delete(&mut f.session(CONFIG)?, true, &o(false, false))? else {
            anyhow::bail!("deleted without --yes");
        };
        assert!(refusal.contains("Pass --yes"), "{refusal}");
        assert_eq!(f.connecting.log.calls().len(), before, "a host was touched");
        let DeleteReport::Deleted(d) = delete(&mut f.session(CONFIG)?, true, &o(true, false))? else {
            anyhow::bail!("not deleted");
        };
        assert_eq!(
            (d.reset.clone(), d.not_reset.clone()),
            (vec!["a".into(), "b".into(), "c".into()], vec!["d".to_string()])
        );
        let calls = f.connecting.log.calls();
        assert!(calls[before..].iter().all(|(h, _)| h != "d"), "d was contacted");
        for h in ["a", "b", "c"] {
            assert!(calls[before..].iter().any(|(x, _)| x == h), "{h} was not reset");
        }
        let Err(e) = f.record() else {
            anyhow::bail!("the record is still there");
        };
        assert!(format!("{e:#}").contains("no record of cluster s"), "{e:#}");
        assert!(!root.join("s.kubeconfig").exists());
        assert_eq!(d.kept, [root.join("clusters").join("s")]);
        assert!(pki.exists());
        let text = d.to_string();
        assert!(text.contains("NOT reset: d") && text.contains("--purge removes it"), "{text}");
        // Gone: a second delete has nothing to delete.
        let Err(e) = delete(&mut f.session(CONFIG)?, true, &o(true, true)) else {
            anyhow::bail!("a forgotten cluster was deleted again");
        };
        assert!(format!("{e:#}").contains("has no record of cluster s"), "{e:#}");
        Ok(())
    }
}
