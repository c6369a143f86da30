//! `kubexm-install apply -f cluster.yaml --bundle k.tar.zst`: change an
//! installed cluster to what its config now says, running only what the
//! difference needs. The config is checked against the record of the
//! cluster's last successful job first ([`kubexm_bom::changes`]): what can
//! never change is refused (exit 3), what apply does not do yet is refused
//! as not supported yet (exit 8), both before any host is touched. What is
//! left (hosts added as workers; as control-plane nodes, joined with fresh
//! credentials and listed by every load balancer or local proxy; as etcd
//! members in binary mode: each a learner first, promoted once caught up,
//! then every API server told; the registry moved to the host
//! `roleGroups.registry` names, the old one stopped last) runs
//! as an `apply` job of the
//! install's pipeline: the steps earlier installs and applies did are
//! skipped, so the old hosts apply nothing (the first control-plane node
//! makes fresh join credentials when the last ones are too old), and a
//! re-run applies nothing. The record is kept after, as after an install.
//! A config whose Kubernetes version is not the record's is an upgrade:
//! apply runs [`super::upgrade::upgrade`] (from the bundle given), which
//! refuses a version change mixed with hosts added or the registry moved
//! before any host is touched (upgrade first, then apply).

use crate::ops::error::{OpError, op};

use super::install::{self, InstallOptions, InstallReport, Installed};
use super::session::Session;

/// What apply is asked to do.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Print the change and the plan; touch no host.
    pub dry_run: bool,
    /// The bundle a job asked for ([`InstallOptions::expect_digest`]).
    pub expect_digest: Option<String>,
    /// Hosts fetch files from the registry host
    /// ([`InstallOptions::files_from_registry`]).
    pub files_from_registry: bool,
}

/// What apply did, or would do.
#[derive(Debug)]
pub enum ApplyReport {
    /// `dry_run`: the change and the plan.
    Plan { added: Added, plan: String },
    /// The change made.
    Applied { added: Added, installed: Installed },
    /// The config names another Kubernetes version: an upgrade ran (or,
    /// with `dry_run`, was planned).
    Upgraded(Box<super::upgrade::UpgradeReport>),
}

/// The hosts an apply adds, by what they become.
#[derive(Debug, Clone, Default)]
pub struct Added {
    pub workers: Vec<String>,
    /// New control-plane nodes (they join with fresh credentials; every
    /// load balancer and local proxy lists them).
    pub control_plane: Vec<String>,
    /// New etcd members, in the order they join.
    pub etcd: Vec<String>,
    /// The registry moves: from the recorded host to the one named now.
    pub registry: Option<(String, String)>,
}

impl std::fmt::Display for ApplyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let added = match self {
            ApplyReport::Plan { added, .. } | ApplyReport::Applied { added, .. } => added,
            ApplyReport::Upgraded(u) => {
                writeln!(
                    f,
                    "apply: the config names Kubernetes {} and cluster {} runs {}: an upgrade",
                    u.plan.to, u.plan.cluster, u.plan.from
                )?;
                return write!(f, "{u}");
            }
        };
        if added.workers.is_empty() && added.etcd.is_empty() && added.control_plane.is_empty() && added.registry.is_none() {
            writeln!(f, "apply: the config is as recorded; only what is not in place yet runs")?;
        }
        if !added.workers.is_empty() {
            writeln!(f, "apply: adds worker(s) {}", added.workers.join(", "))?;
        }
        if !added.control_plane.is_empty() {
            writeln!(
                f,
                "apply: adds control-plane node(s) {}; every load balancer and local proxy lists them",
                added.control_plane.join(", ")
            )?;
        }
        if !added.etcd.is_empty() {
            writeln!(
                f,
                "apply: adds etcd member(s) {}, one at a time (each a learner, promoted once it has caught up); \
                 then every API server reads them",
                added.etcd.join(", ")
            )?;
        }
        if let Some((from, to)) = &added.registry {
            writeln!(
                f,
                "apply: moves the registry from {from} to {to}: every node's hosts.toml and the addons' images name {to}; \
                 then the registry on {from} stops"
            )?;
        }
        match self {
            ApplyReport::Plan { plan, .. } => write!(f, "{plan}"),
            ApplyReport::Applied { installed, .. } => write!(f, "{installed}"),
            ApplyReport::Upgraded(u) => write!(f, "{u}"),
        }
    }
}

/// A session of `config` with the bundle its cluster's record names, as an
/// earlier install unpacked (and verified) it under the settings' root: an
/// apply without `--bundle`. Refused, saying to pass one, when the record
/// names none or it is not unpacked here.
pub fn recorded_session(config: &super::session::Config, settings: super::session::Settings) -> anyhow::Result<Session> {
    let started = crate::engine::state::now_ms();
    let probe = Session::open(config, None, None, settings.clone())?;
    let name = probe.cluster().metadata.name.clone();
    let usage = |msg: String| op(OpError::Usage, anyhow::anyhow!(msg));
    let record = installed(&probe)?;
    let Some(digest) = record.bundle else {
        return Err(usage(format!(
            "cluster {name}'s record names no bundle (job {}): pass --bundle FILE, the bundle it was installed from",
            record.job.id
        )));
    };
    let Some((opened, cluster)) = super::session::unpacked(config, &settings.root, &digest)? else {
        return Err(usage(format!(
            "cluster {name} was installed from bundle {digest}, which is not unpacked under {} (installed from \
             another machine, or another --root?): pass --bundle FILE",
            settings.root.join("bundles").display()
        )));
    };
    Ok(Session::opened(config, cluster, Some(opened), None, settings, started))
}

/// The record of `session`'s installed cluster: its last successful job's,
/// an install's or a change of it, with no reset since (even a failed one
/// left the hosts half undone); refused, saying what to do, otherwise.
pub(crate) fn installed(session: &Session) -> anyhow::Result<kubexm_bom::record::ClusterRecord> {
    let name = &session.cluster().metadata.name;
    let usage = |msg: String| op(OpError::Usage, anyhow::anyhow!(msg));
    let record = session.last_record(true)?.ok_or_else(|| {
        usage(format!(
            "the state database {} records no successful install of cluster {name}: install it first \
             (kubexm-install --bundle ... -f ...), or pass the --state it was installed with; a cluster \
             installed by a kubexm before records gets one when its install is run again (done steps are skipped)",
            session.settings().engine.state.display()
        ))
    })?;
    if !matches!(record.job.kind.as_str(), "install" | "apply" | "remove-node" | "upgrade") {
        return Err(usage(format!(
            "cluster {name}'s last successful job was a {} (job {}): there is no installed cluster to apply to; install it",
            record.job.kind, record.job.id
        )));
    }
    if let Some(last) = session.last_record(false)?
        && last.job.took_down()
    {
        return Err(usage(format!(
            "cluster {name}'s last job was a {} ({}, job {}): its hosts are not as the install left them; \
             finish the reset and install again",
            last.job.kind, last.job.status, last.job.id
        )));
    }
    Ok(record)
}

/// Applies the session's config to its installed cluster.
pub fn apply(session: &Session, o: &ApplyOptions) -> anyhow::Result<ApplyReport> {
    let cluster = session.cluster();
    let name = &cluster.metadata.name;
    let record = installed(session)?;
    if version_changed(&record.config.spec.kubernetes.version, &cluster.spec.kubernetes.version) {
        return upgrade_instead(session, o);
    }
    // Half-upgraded hosts would get the old version's binaries back.
    if let Some(j) = super::upgrade::unfinished(session, &record)? {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "cluster {name}'s upgrade (job {}, {}) did not finish: run it again with the config naming the new version \
                 and its bundle (kubexm-install upgrade) before apply changes anything",
                j.id,
                j.status
            ),
        ));
    }
    // Another bundle may add images; what is installed stays as it is.
    if let Some(b) = session.bundle() {
        let changed = kubexm_bom::changes::bundle_changes(&record, &b.manifest.lock);
        if !changed.is_empty() {
            return Err(op(
                OpError::Unsupported,
                anyhow::anyhow!(
                    "the bundle {} would change what cluster {name} runs at the same Kubernetes version:\n  {}\n\
                     replacing components without a new Kubernetes version is not supported yet (an upgrade needs a \
                     newer version in the config); apply with the bundle it was installed from ({})",
                    b.path.display(),
                    changed.join("\n  "),
                    record.bundle.as_deref().unwrap_or("not recorded")
                ),
            ));
        }
    }
    let located = session.located();
    let changes = kubexm_bom::changes::changes(&record, cluster, located.as_ref(), session.config_name())
        .map_err(kubexm_bom::config::LoadError::Invalid)?;
    if let (Some((_, to)), Some(b)) = (&changes.registry, session.bundle())
        && b.unpacked
    {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "moving cluster {name}'s registry to {to} needs the bundle's file (it is uploaded there): pass --bundle FILE, \
                 the bundle the cluster was installed from ({})",
                b.digest
            ),
        ));
    }
    let opts = InstallOptions {
        dry_run: o.dry_run,
        apply: true,
        expect_digest: o.expect_digest.clone(),
        etcd_before: Some(record.config.spec.role_groups.etcd.clone()),
        files_from_registry: o.files_from_registry,
        ..Default::default()
    };
    let g = &cluster.spec.role_groups;
    let added = Added {
        workers: changes.added.iter().filter(|h| g.worker.contains(*h)).cloned().collect(),
        control_plane: g.control_plane.iter().filter(|h| changes.added.contains(*h)).cloned().collect(),
        etcd: g.etcd.iter().filter(|h| changes.added.contains(*h)).cloned().collect(),
        registry: changes.registry.clone(),
    };
    match install::install(session, &opts)? {
        InstallReport::Plan(plan) => Ok(ApplyReport::Plan { added, plan }),
        InstallReport::Installed(installed) => Ok(ApplyReport::Applied { added, installed }),
    }
}

/// Whether `now` names another Kubernetes version than `recorded` (`v` or
/// not).
fn version_changed(recorded: &str, now: &str) -> bool {
    use kubexm_bom::upgrade::Version;
    match (Version::parse(recorded), Version::parse(now)) {
        (Some(a), Some(b)) => a != b,
        _ => recorded != now,
    }
}

/// The config names another version: an upgrade (which refuses, before
/// any change, a config that changes more than the version).
fn upgrade_instead(session: &Session, o: &ApplyOptions) -> anyhow::Result<ApplyReport> {
    if o.files_from_registry {
        return Err(op(
            OpError::Unsupported,
            anyhow::anyhow!(
                "the config names another Kubernetes version (an upgrade): files from the registry host in an upgrade are \
                 not supported yet (its hosts fetch the new bundle's files before the registry serves it); run it with --advertise ADDR"
            ),
        ));
    }
    let u = super::upgrade::upgrade(
        session,
        &super::upgrade::UpgradeOptions {
            dry_run: o.dry_run,
            expect_digest: o.expect_digest.clone(),
            ..Default::default()
        },
    )?;
    Ok(ApplyReport::Upgraded(Box::new(u)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fixture::{CONFIG, Fixture};
    use crate::ops::session::Config;

    /// Issue 29: apply without --bundle takes the bundle the record names
    /// as unpacked under the root, or says to pass one.
    #[test]
    fn without_a_bundle_the_recorded_one_is_taken_or_asked_for() -> anyhow::Result<()> {
        let f = Fixture::installed()?;
        let config = Config::File(f.dir.path().join("s.yaml"));
        let err = |r: anyhow::Result<Session>| match r {
            Ok(_) => "opened".to_string(),
            Err(e) => format!("{e:#}"),
        };
        let e = err(recorded_session(&config, f.settings()));
        assert!(e.contains("record names no bundle") && e.contains("pass --bundle FILE"), "{e}");
        let hex = "ab".repeat(32);
        let s = f.session(CONFIG)?;
        let rec = f.record()?;
        s.put_record(rec.job.id, &[], |job| kubexm_bom::record::ClusterRecord {
            job,
            bundle: Some(format!("sha256:{hex}")),
            ..rec.clone()
        })?;
        let e = err(recorded_session(&config, f.settings()));
        assert!(e.contains(&format!("sha256:{hex}, which is not unpacked under")), "{e}");
        let dir = f.settings().root.join("bundles").join(&hex);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(crate::unpack::COMPLETE), "")?;
        std::fs::write(dir.join("bundle.yaml"), "changed\n")?;
        let e = err(recorded_session(&config, f.settings()));
        assert!(e.contains("the unpacked bundle was changed"), "{e}");
        Ok(())
    }

    /// Issue 30: a config naming another Kubernetes version is an upgrade:
    /// apply takes that path (here it asks for the target's bundle) and
    /// refuses a version change mixed with an added host, both before any
    /// host is asked anything.
    #[test]
    fn a_version_change_is_routed_to_the_upgrade() -> anyhow::Result<()> {
        let f = Fixture::installed()?;
        let jobs_before = f.record()?.job.id;
        let asked_before = f.connecting.asked().len();
        let err = |text: &str| -> anyhow::Result<String> {
            Ok(match apply(&f.session(text)?, &ApplyOptions::default()) {
                Ok(r) => format!("applied: {r}"),
                Err(e) => format!("{e:#}"),
            })
        };
        let newer = format!("{CONFIG}\x20 kubernetes: {{version: v1.38.0}}\n");
        let e = err(&newer)?;
        assert!(e.contains("pass --bundle with the bundle built for v1.38.0"), "{e}");
        let more = newer
            .replace(
                "\x20 roleGroups:",
                "\x20 - {name: e, address: 10.0.0.5, auth: {agent: true}}\n\x20 roleGroups:",
            )
            .replace("worker: [b, c, d]", "worker: [b, c, d, e]");
        let e = err(&more)?;
        assert!(
            e.contains("an upgrade of cluster s") && e.contains("host e added") && e.contains("not supported yet"),
            "{e}"
        );
        assert_eq!(f.record()?.job.id, jobs_before);
        assert_eq!(f.connecting.asked().len(), asked_before, "a host was asked");
        Ok(())
    }

    /// Issue 30: after an upgrade that did not finish (here killed: its
    /// job left running), apply with the recorded version is refused
    /// (half-upgraded hosts would get the old binaries back), saying to
    /// run the upgrade again.
    #[test]
    fn an_unfinished_upgrade_blocks_apply() -> anyhow::Result<()> {
        let f = Fixture::installed()?;
        {
            let state = crate::engine::state::State::open(&f.dir.path().join("state.db"), vec![])?;
            state.begin_job("s", "upgrade")?;
        }
        let e = match apply(&f.session(CONFIG)?, &ApplyOptions::default()) {
            Ok(r) => format!("applied: {r}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            e.contains("upgrade (job") && e.contains("running") && e.contains("did not finish"),
            "{e}"
        );
        Ok(())
    }
}
