//! `kubexm-install upgrade -f cluster.yaml --bundle new.tar.zst [--bundle
//! hop.tar.zst ...]`: an installed cluster to the Kubernetes version its
//! config now names, one minor at a time. First the version rules
//! ([`kubexm_bom::upgrade`]), before any change: what the cluster runs
//! (its record, and each node's kubelet and readiness read from the API
//! server on the first control-plane node, by an `upgrade-check` job that
//! changes nothing), the bundles given (one per hop; the session's is the
//! target's) and `--skip-not-ready`. `--dry-run` prints the chain of hops.
//! Then the hop: an etcd snapshot (the restore point, its own job), and the
//! hop's pipeline ([`crate::pipelines::upgrade`]) as an `upgrade` job of
//! the install's machinery (the bundle verified, unpacked and served, facts,
//! the record kept after). Several hops run one after the other, each
//! planned again from what the one before left; a hop before the last
//! runs from its own bundle with the config at its version (the text's
//! `spec.kubernetes.version` replaced). A run stopped anywhere continues
//! where it stopped when run again.
//!
//! [`check`] reads the cluster before any change; [`hop`] runs one hop.

use std::path::PathBuf;

use kubexm_bom::upgrade::{self, GivenBundle, PlanInput, UpgradePlan};

mod check;
mod hop;

use check::read_nodes;
pub(crate) use check::unfinished;
use hop::{hop_session, run_hop};

use super::error::{OpError, op};
use super::session::Session;

/// What `upgrade` is asked.
#[derive(Debug, Clone, Default)]
pub struct UpgradeOptions {
    /// The bundles of the hops before the last (the session's bundle is
    /// the target's): each file's name and its lock, read by [`open`].
    pub hop_bundles: Vec<(String, kubexm_bom::Bom)>,
    /// NotReady workers to leave at their version.
    pub skip_not_ready: Vec<String>,
    /// Print the chain of hops; change nothing.
    pub dry_run: bool,
    /// The bundle a job asked for ([`super::install::InstallOptions::expect_digest`]).
    pub expect_digest: Option<String>,
    /// Each drain's time limit in seconds, over the config's
    /// `spec.upgrade.drainTimeoutSeconds`.
    pub drain_timeout: Option<u32>,
}

/// A session of `config` with the bundle of its version (of `bundles`,
/// in any order), and the others' names and locks, the hops' before it
/// (each `bundle.yaml` read once, nothing unpacked).
pub fn open(
    config: &super::session::Config,
    bundles: &[PathBuf],
    settings: super::session::Settings,
) -> anyhow::Result<(Session, Vec<(String, kubexm_bom::Bom)>)> {
    let wanted = config.load_hosts()?.spec.kubernetes.version;
    let parsed = upgrade::Version::parse(&wanted);
    let mut target = None;
    let mut hops = Vec::new();
    for b in bundles {
        let manifest = kubexm_bundle::verify::read_manifest(b).map_err(|e| crate::unpack::UnpackError::from(e).classified())?;
        let same = match (&parsed, upgrade::Version::parse(&manifest.lock.kubernetes_version)) {
            (Some(a), Some(b)) => *a == b,
            _ => manifest.lock.kubernetes_version == wanted,
        };
        if target.is_none() && same {
            target = Some(b.clone());
        } else {
            hops.push((b.display().to_string(), manifest.lock));
        }
    }
    let Some(target) = target else {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "none of the bundles given ({}) carries Kubernetes {wanted}, the version {} names: pass the bundle built for it with --bundle",
                bundles.iter().map(|b| b.display().to_string()).collect::<Vec<_>>().join(", "),
                config.name()
            ),
        ));
    };
    Ok((Session::open(config, Some(&target), None, settings)?, hops))
}

/// The chain of hops and the order of each (its waves); once run, what
/// each hop did.
#[derive(Debug)]
pub struct UpgradeReport {
    pub plan: UpgradePlan,
    pub waves: Vec<Vec<upgrade::order::Wave>>,
    /// The hops run, in order.
    pub ran: Vec<HopDone>,
}

/// A hop that ran: its version, the restore point taken before it, its job.
#[derive(Debug, Clone)]
pub struct HopDone {
    pub to: String,
    pub snapshot: super::etcd::Snapshot,
    /// The restore point was taken by an earlier run of this hop.
    pub snapshot_reused: bool,
    pub installed: super::install::Installed,
}

/// What an upgrade did, as a job reports it: the report's text, and the
/// hop's job when one ran.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Upgraded {
    pub cluster: String,
    pub from: String,
    pub to: String,
    /// The hop's job (none: nothing to do).
    pub installed: Option<super::install::Installed>,
    pub text: String,
}

impl std::fmt::Display for Upgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl UpgradeReport {
    /// The report of what ran, for a job.
    pub fn done(self) -> Upgraded {
        Upgraded {
            cluster: self.plan.cluster.clone(),
            from: self.plan.from.to_string(),
            to: self.plan.to.to_string(),
            text: self.to_string(),
            installed: self.ran.into_iter().last().map(|h| h.installed),
        }
    }
}

impl std::fmt::Display for UpgradeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.plan)?;
        for (i, waves) in self.waves.iter().enumerate() {
            writeln!(f, "hop {} in order (each line once the one before is done):", i + 1)?;
            for w in waves {
                writeln!(f, "  {}: {}", w.action, w.hosts.join(", "))?;
            }
        }
        for h in &self.ran {
            let u = &h.installed;
            if h.snapshot_reused {
                writeln!(
                    f,
                    "restore point (taken by an earlier run of this hop): {} (sha256 {})",
                    h.snapshot.file.display(),
                    h.snapshot.info.sha256
                )?;
            } else {
                write!(f, "restore point: {}", h.snapshot)?;
            }
            writeln!(
                f,
                "upgraded cluster {} to {} on {} hosts (job {}): {} steps applied, {} already in place",
                u.cluster, h.to, u.hosts, u.job, u.applied, u.skipped
            )?;
            write!(f, "{}", u.timing)?;
        }
        Ok(())
    }
}

/// The chain of hops from what the session's cluster runs to its config's
/// version, or every reason to refuse it (a config error, exit 3), read
/// and checked before any change.
pub fn plan(session: &Session, o: &UpgradeOptions) -> anyhow::Result<UpgradeReport> {
    let cluster = session.cluster();
    let record = super::apply::installed(session)?;
    // The config may change nothing but the version (and what it pairs).
    let located = session.located();
    let changed = kubexm_bom::changes::upgrade_changes(&record, cluster, located.as_ref(), session.config_name())
        .map_err(kubexm_bom::config::LoadError::Invalid)?;
    if !changed.is_empty() {
        let mut others: Vec<String> = changed.added.iter().map(|h| format!("host {h} added")).collect();
        if let Some((from, to)) = &changed.registry {
            others.push(format!("the registry moved from {from} to {to}"));
        }
        return Err(op(
            OpError::Unsupported,
            anyhow::anyhow!(
                "an upgrade of cluster {} (recorded at {}, the config names {}) changes the version and what it pairs, \
                 but the config also changes more ({}): that in the same run is not supported yet; upgrade with the \
                 recorded hosts and registry first, then apply the rest",
                cluster.metadata.name,
                record.config.spec.kubernetes.version,
                cluster.spec.kubernetes.version,
                others.join(", ")
            ),
        ));
    }
    let Some(target) = session.bundle() else {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("pass --bundle with the bundle built for {}", cluster.spec.kubernetes.version),
        ));
    };
    let target_name = target.path.display().to_string();
    let mut bundles = vec![GivenBundle {
        name: &target_name,
        bom: &target.manifest.lock,
    }];
    bundles.extend(o.hop_bundles.iter().map(|(name, bom)| GivenBundle { name, bom }));
    let (nodes, installed) = read_nodes(session, &record)?;
    let input = PlanInput {
        record: &record,
        nodes,
        target: &cluster.spec.kubernetes.version,
        bundles,
        skip_not_ready: o.skip_not_ready.clone(),
        resuming: unfinished(session, &record)?.is_some(),
        installed,
    };
    let plan = upgrade::plan(&input).map_err(|e| op(OpError::Config, anyhow::Error::new(e)))?;
    let skipped: Vec<String> = plan.skipped.iter().map(|(n, _)| n.clone()).collect();
    let waves = plan
        .hops
        .iter()
        .map(|h| upgrade::order::waves(&record, h, cluster.spec.upgrade.max_unavailable as usize, &skipped))
        .collect();
    Ok(UpgradeReport {
        plan,
        waves,
        ran: Vec::new(),
    })
}

/// Plans the upgrade; with `dry_run`, that is all. Otherwise hop after
/// hop runs, each planned again from the record and the nodes as the hop
/// before left them (a run stopped anywhere goes on from there): the
/// target's hop with the session, an earlier one with a session of its own
/// bundle and the config at its version.
pub fn upgrade(session: &Session, o: &UpgradeOptions) -> anyhow::Result<UpgradeReport> {
    differentials(session, o)?;
    let mut p = plan(session, o)?;
    if o.dry_run || p.plan.hops.is_empty() {
        return Ok(p);
    }
    refuse_unsupported(session)?;
    // One Lease for every hop: never handed back between two.
    session.own()?;
    // Each earlier hop's bundle and the config at its version, checked
    // before the first hop changes anything.
    for hop in p.plan.hops.iter().filter(|h| h.bundle != 0) {
        hop_session(session, o, hop)?;
    }
    p.ran = chain(
        (p.plan.hops.clone(), p.waves.clone()),
        || plan(session, o).map(|r| (r.plan.hops, r.waves)),
        |hop, waves| {
            if hop.bundle == 0 {
                run_hop(session, o.expect_digest.clone(), o.drain_timeout, hop, waves)
            } else {
                hop_session(session, o, &hop).and_then(|s| {
                    s.share_lease(session);
                    run_hop(&s, None, o.drain_timeout, hop, waves)
                })
            }
        },
        |h: &HopDone| format!("{} (job {}, restore point {})", h.to, h.installed.job, h.snapshot.file.display()),
    )?;
    Ok(p)
}

/// Every differential bundle of the chain and its base (`--base`) verified
/// and checked to fit, before anything is written or a host touched.
fn differentials(session: &Session, o: &UpgradeOptions) -> anyhow::Result<()> {
    let settings = session.settings();
    let trust = crate::unpack::Trust::of(settings.pubkey.as_deref());
    let mut bundles: Vec<PathBuf> = o.hop_bundles.iter().map(|(p, _)| PathBuf::from(p)).collect();
    if let Some(b) = session.bundle().filter(|b| !b.unpacked) {
        bundles.push(b.path.clone());
    }
    for b in &bundles {
        let m = kubexm_bundle::verify::read_manifest(b).map_err(|e| crate::unpack::UnpackError::from(e).classified())?;
        let base = settings.base.as_deref().filter(|_| m.base.is_some());
        crate::unpack::check_deploy(b, &m, base, &trust, true).map_err(crate::unpack::UnpackError::classified)?;
    }
    Ok(())
}

/// The hops left, each with its waves.
type Chain = (Vec<upgrade::Hop>, Vec<Vec<upgrade::order::Wave>>);

/// Runs hop after hop, from the chain `first`: `run` does one; once it is
/// done, `replan` reads the chain left (from what the hop left: the record
/// and the nodes). Ends after the hop to the chain's last version. An
/// error after finished hops names them (`done` says each), as the
/// cluster now runs the last one's version.
fn chain<R>(
    first: Chain,
    mut replan: impl FnMut() -> anyhow::Result<Chain>,
    mut run: impl FnMut(upgrade::Hop, Vec<upgrade::order::Wave>) -> anyhow::Result<R>,
    done: impl Fn(&R) -> String,
) -> anyhow::Result<Vec<R>> {
    let mut ran: Vec<R> = Vec::new();
    let stopped = |e: anyhow::Error, ran: &[R]| {
        if ran.is_empty() {
            return e;
        }
        let said: Vec<String> = ran.iter().map(&done).collect();
        e.context(format!(
            "the upgrade stopped after {} hop(s) that finished: {}; run it again to go on",
            said.len(),
            said.join(", ")
        ))
    };
    let mut now = first;
    while let (Some(hop), Some(waves)) = (now.0.first().cloned(), now.1.first().cloned()) {
        let last = now.0.len() == 1;
        match run(hop, waves) {
            Ok(r) => ran.push(r),
            Err(e) => return Err(stopped(e, &ran)),
        }
        if last {
            break;
        }
        now = replan().map_err(|e| stopped(e, &ran))?;
    }
    Ok(ran)
}

/// Refused before anything runs: what a hop does not do yet.
fn refuse_unsupported(session: &Session) -> anyhow::Result<()> {
    let spec = &session.cluster().spec;
    if spec.etcd.mode != kubexm_bom::config::model::EtcdMode::Binary {
        return Err(op(
            OpError::Unsupported,
            anyhow::anyhow!("upgrading a cluster whose etcd.mode is not binary is not supported yet (its snapshot and etcd's own upgrade)"),
        ));
    }
    if spec.registry.mode != kubexm_bom::config::model::RegistryMode::Local {
        return Err(op(
            OpError::Unsupported,
            anyhow::anyhow!("upgrading with registry.mode external is not supported yet"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 30: a chain runs hop after hop, planned again after each from
    /// what it left (a hop already done is not run again); an error after a
    /// finished hop names it; an error in the first hop is the hop's own.
    #[test]
    fn a_chain_runs_hop_after_hop_planned_again_after_each() -> anyhow::Result<()> {
        let v = |s: &str| upgrade::Version::parse(s).ok_or_else(|| anyhow::anyhow!("{s}"));
        let hop = |a: &str, b: &str, bundle: usize| -> anyhow::Result<upgrade::Hop> {
            Ok(upgrade::Hop {
                from: v(a)?,
                to: v(b)?,
                bundle,
                bundle_name: format!("k-{b}.tar.zst"),
                changes: vec![],
            })
        };
        let wave = vec![upgrade::order::Wave {
            action: upgrade::order::Action::Addons,
            hosts: vec!["a".into()],
        }];
        let first = (
            vec![hop("v1.35.4", "v1.36.3", 1)?, hop("v1.36.3", "v1.37.2", 0)?],
            vec![wave.clone(), wave.clone()],
        );
        let rest = (vec![hop("v1.36.3", "v1.37.2", 0)?], vec![wave.clone()]);
        let replans = std::cell::Cell::new(0);
        let ran = chain(
            first.clone(),
            || {
                replans.set(replans.get() + 1);
                Ok(rest.clone())
            },
            |h, _| Ok(h.to.to_string()),
            |s: &String| s.clone(),
        )?;
        assert_eq!((ran, replans.get()), (vec!["v1.36.3".to_string(), "v1.37.2".to_string()], 1));
        let e = chain(
            first.clone(),
            || Ok(rest.clone()),
            |h, _| {
                if h.to.to_string() == "v1.37.2" {
                    anyhow::bail!("drain of w2 timed out")
                }
                Ok(h.to.to_string())
            },
            |s: &String| format!("{s} (job 7)"),
        )
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
        assert!(
            e.contains("stopped after 1 hop(s) that finished: v1.36.3 (job 7)") && e.contains("drain of w2 timed out"),
            "{e}"
        );
        let e = chain(
            first,
            || Ok(rest.clone()),
            |_, _| -> anyhow::Result<String> { anyhow::bail!("etcd") },
            |s| s.clone(),
        )
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
        assert_eq!(e, "etcd");
        Ok(())
    }
}
