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

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use kubexm_bom::upgrade::{self, GivenBundle, NodeNow, PlanInput, UpgradePlan};

use super::error::{OpError, op};
use super::session::Session;
use crate::engine::plan::{Check, Step, StepError};
use crate::engine::run;
use crate::engine::transport::Transport;
use crate::paths::ADMIN_CONF;

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
        let (manifest, _) = kubexm_bundle::verify::read_manifest_digest(b).map_err(|e| crate::unpack::UnpackError::from(e).classified())?;
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
    let mut p = plan(session, o)?;
    if o.dry_run || p.plan.hops.is_empty() {
        return Ok(p);
    }
    refuse_unsupported(session)?;
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
                hop_session(session, o, &hop).and_then(|s| run_hop(&s, None, o.drain_timeout, hop, waves))
            }
        },
        |h: &HopDone| format!("{} (job {}, restore point {})", h.to, h.installed.job, h.snapshot.file.display()),
    )?;
    Ok(p)
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

/// A session for a hop before the last: the hop's bundle (given with
/// `--bundle`, by its path) and the config at the hop's version, its other
/// fields as they are.
fn hop_session(session: &Session, o: &UpgradeOptions, hop: &upgrade::Hop) -> anyhow::Result<Session> {
    let Some((path, _)) = o.hop_bundles.get(hop.bundle - 1) else {
        return Err(anyhow::anyhow!("hop {} -> {} names a bundle that was not given", hop.from, hop.to));
    };
    let name = session.config_name().to_string();
    let text = session.config_text().ok_or_else(|| {
        op(
            OpError::Io,
            anyhow::anyhow!("{name} cannot be read again for the hop to {}", hop.to),
        )
    })?;
    let text = with_version(&text, &hop.to.to_string()).map_err(|e| {
        op(
            OpError::Config,
            anyhow::anyhow!("{name}: {e}: a hop to {} needs the config at that version", hop.to),
        )
    })?;
    let config = super::session::Config::Text {
        name: format!("{name} (at {}, for the hop from {})", hop.to, hop.bundle_name),
        text,
    };
    Session::open(&config, Some(std::path::Path::new(path)), None, session.settings().clone())
}

/// `text` (a cluster config) with its `spec.kubernetes.version` value
/// replaced by `version`, where the text has it, quoting kept; an error
/// when the config does not name one.
pub(crate) fn with_version(text: &str, version: &str) -> Result<String, String> {
    let located = kubexm_bom::yaml::parse(text).map_err(|e| e.message)?;
    let old = located.value["spec"]["kubernetes"]["version"]
        .as_str()
        .ok_or("it names no spec.kubernetes.version")?
        .to_string();
    let pos = located
        .pos("spec.kubernetes.version")
        .ok_or("spec.kubernetes.version has no position")?;
    let line_start: usize = text
        .split_inclusive('\n')
        .take(pos.line.saturating_sub(1) as usize)
        .map(str::len)
        .sum();
    let line = &text[line_start..];
    let col = line
        .char_indices()
        .nth(pos.column.saturating_sub(1) as usize)
        .map(|(i, _)| i)
        .ok_or("spec.kubernetes.version's position is past its line")?;
    // The position is the key's: `version`, its colon, then the value.
    let key = &text[line_start + col..];
    let after_key = key
        .strip_prefix("version")
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix(':'))
        .map(|r| r.trim_start_matches([' ', '\t']))
        .ok_or_else(|| format!("spec.kubernetes.version ({old}) is not where its position says"))?;
    let at = text.len() - after_key.len();
    let rest = after_key;
    let len = ["\"", "'", ""]
        .iter()
        .find(|q| rest.starts_with(&format!("{q}{old}{q}")))
        .map(|q| old.len() + 2 * q.len())
        .ok_or_else(|| format!("spec.kubernetes.version ({old}) is not written as a plain or quoted scalar"))?;
    let quote = &rest[..(len - old.len()) / 2];
    let out = format!("{}{quote}{version}{quote}{}", &text[..at], &text[at + len..]);
    let check = kubexm_bom::yaml::parse(&out).map_err(|e| e.message)?;
    if check.value["spec"]["kubernetes"]["version"].as_str() != Some(version) {
        return Err("spec.kubernetes.version could not be replaced".into());
    }
    Ok(out)
}

/// One hop on `session` (its bundle the hop's): the certificates checked,
/// the etcd snapshot, then the hop's pipeline as an `upgrade` job.
fn run_hop(
    session: &Session,
    expect_digest: Option<String>,
    drain_timeout: Option<u32>,
    hop: upgrade::Hop,
    waves: Vec<upgrade::order::Wave>,
) -> anyhow::Result<HopDone> {
    let record = super::apply::installed(session)?;
    let spec = &session.cluster().spec;
    // Every certificate valid until the hop can have ended (kubeadm renews
    // the control plane's as it upgrades each node; not the CAs, etcd's or
    // the kubeconfigs of nodes not reached yet).
    let budget = hop_budget(&waves, drain_timeout.unwrap_or(spec.upgrade.drain_timeout_seconds));
    let certs = super::certs::check(session, 0)?;
    certs_last(&certs, crate::engine::state::now_ms() / 1000, budget)?;
    // The restore point: taken before the hop's first run, kept (not
    // pruned), and not taken again by a re-run of the same hop.
    let to = hop.to.to_string();
    let (snapshot, snapshot_reused) = match earlier_restore_point(session, &record, &to) {
        Some(s) => (s, true),
        None => {
            let o = super::etcd::SnapshotOptions {
                keep: super::etcd::KEEP,
                dir: None,
                label: Some(format!("before-{to}")),
            };
            (super::etcd::snapshot(session, &o)?, false)
        }
    };
    let now = session.bundle().map(|b| b.digest.clone());
    let older = record
        .bundle
        .as_deref()
        .filter(|d| Some(*d) != now.as_deref())
        .and_then(|d| d.strip_prefix("sha256:"))
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|h| vec![h.to_string()])
        .unwrap_or_default();
    let run = crate::pipelines::upgrade::HopRun {
        hop,
        waves,
        old_images: record
            .artifacts
            .iter()
            .filter(|a| a.kind == "image")
            .map(|a| a.name.clone())
            .collect(),
        older,
        drain_timeout,
    };
    let opts = super::install::InstallOptions {
        apply: true,
        expect_digest,
        etcd_before: Some(record.config.spec.role_groups.etcd.clone()),
        upgrade: Some(run),
        ..Default::default()
    };
    match super::install::install(session, &opts)? {
        super::install::InstallReport::Installed(installed) => Ok(HopDone {
            to,
            snapshot,
            snapshot_reused,
            installed,
        }),
        super::install::InstallReport::Plan(_) => Err(anyhow::anyhow!("an upgrade planned instead of upgrading")),
    }
}

/// The snapshot an earlier run of the hop to `to` took before changing
/// anything (`<cluster>-<stamp>-before-<to>.db` with its sidecar, taken
/// after the record's job ended), the newest; none when there is none.
fn earlier_restore_point(session: &Session, record: &kubexm_bom::record::ClusterRecord, to: &str) -> Option<super::etcd::Snapshot> {
    let name = &session.cluster().metadata.name;
    let dir = session.settings().root.join("clusters").join(name).join("snapshots");
    let suffix = format!("-before-{to}.db");
    let mut found: Vec<std::path::PathBuf> = fs_err::read_dir(&dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{name}-")) && n.ends_with(&suffix))
        })
        .collect();
    found.sort();
    found.into_iter().rev().find_map(|file| {
        let text = fs_err::read_to_string(super::etcd::sidecar(&file, "json")).ok()?;
        let info: super::etcd::SnapshotInfo = serde_json::from_str(&text).ok()?;
        (info.cluster == *name && info.taken >= record.job.finished).then_some(super::etcd::Snapshot {
            job: 0,
            file,
            info,
            pruned: Vec::new(),
        })
    })
}

/// How long a hop of `waves` may take at most: per wave, the drain's time
/// limit and 15 minutes (the node's kubeadm, kubelet and Ready), and 30
/// minutes more (pulls, addons).
fn hop_budget(waves: &[upgrade::order::Wave], drain_timeout_seconds: u32) -> Duration {
    let per_wave = u64::from(drain_timeout_seconds) + 15 * 60;
    Duration::from_secs(30 * 60 + per_wave * waves.len() as u64)
}

/// Refused (a host failure, exit 7) when a certificate of `certs` expires
/// before `now` plus `budget`, the hop's longest run: each one named, and
/// what to do.
fn certs_last(certs: &super::certs::CertsReport, now: i64, budget: Duration) -> anyhow::Result<()> {
    let end = now + budget.as_secs() as i64;
    let short: Vec<String> = certs
        .certs
        .iter()
        .filter(|c| c.not_after < end)
        .map(|c| format!("{} {} (expires {})", c.host, c.path, c.expires))
        .collect();
    if short.is_empty() {
        return Ok(());
    }
    Err(op(
        OpError::Host,
        anyhow::anyhow!(
            "{} certificate(s) of cluster {} expire before the hop could end (it may take up to {} min): renew them first \
             (kubexm-install certs renew), then run the upgrade again; nothing was changed:\n  {}",
            short.len(),
            certs.cluster,
            budget.as_secs() / 60,
            short.join("\n  ")
        ),
    ))
}

/// The cluster's last upgrade job when it did not finish (failed,
/// interrupted, or killed and left `running`) after the record's job.
pub(crate) fn unfinished(
    session: &Session,
    record: &kubexm_bom::record::ClusterRecord,
) -> anyhow::Result<Option<crate::engine::state::JobRecord>> {
    Ok(session
        .last_job("upgrade")?
        .filter(|j| j.status != "succeeded" && j.id > record.job.id))
}

/// Each node's kubelet and readiness, as the API server reports them,
/// read on the first control-plane node.
/// Each node's kubelet and readiness, as the API server reports them,
/// read on the first control-plane node; and what every host's kubeadm,
/// etcd and containerd say their versions are (a host that cannot be
/// asked says nothing).
fn read_nodes(session: &Session, record: &kubexm_bom::record::ClusterRecord) -> anyhow::Result<(Vec<NodeNow>, Vec<Installed>)> {
    let name = &session.cluster().metadata.name;
    let Some(first) = record.config.spec.role_groups.control_plane.first().cloned() else {
        return Err(op(
            OpError::Config,
            anyhow::anyhow!("cluster {name}'s record names no control-plane node to read its nodes from"),
        ));
    };
    let step = Arc::new(ReadNodes::default());
    let versions = Arc::new(ReadVersions::default());
    let (s, v): (Arc<dyn Step>, Arc<dyn Step>) = (step.clone(), versions.clone());
    let on = first.clone();
    // Every etcd member healthy (binary etcd; asked through the first member
    // that answered SSH).
    let members = record.config.spec.role_groups.etcd.clone();
    let health_wanted = record.config.spec.etcd.mode == kubexm_bom::config::model::EtcdMode::Binary && !members.is_empty();
    let health: Option<Arc<dyn Step>> = if health_wanted {
        let topo = kubexm_bom::topology::Topology::of(&record.config).map_err(|e| op(OpError::Config, anyhow::Error::from(e)))?;
        Some(Arc::new(crate::phases::etcd::healthy(ETCD_HEALTHY, &topo, &members)))
    } else {
        None
    };
    let asked = Arc::new(Mutex::new(None::<String>));
    let (asked_in, members_in) = (asked.clone(), members.clone());
    let ex = session.execute("upgrade-check", run::Policy::ContinueOtherHosts, move |hosts| {
        let mut p = crate::engine::jobs::one_task("upgrade-check", hosts.iter().filter(|h| **h == on).cloned().collect(), vec![s]);
        let via = members_in.iter().find(|m| hosts.contains(m)).cloned();
        let t = crate::engine::jobs::one_task("upgrade-versions", hosts, vec![v]);
        p.modules.extend(t.modules);
        if let (Some(step), Some(m)) = (health, via) {
            *asked_in.lock().unwrap_or_else(|e| e.into_inner()) = Some(m.clone());
            p.modules
                .extend(crate::engine::jobs::one_task("upgrade-etcd-health", vec![m], vec![step]).modules);
        }
        Ok(p)
    })?;
    let via = asked.lock().unwrap_or_else(|e| e.into_inner()).take();
    let etcd_refusal = |why: String| {
        op(
            OpError::Host,
            anyhow::anyhow!(
                "etcd of cluster {name} is not healthy (job {}): every member must answer before an upgrade; nothing was changed:\n  {why}",
                ex.job
            ),
        )
    };
    let unhealthy: Vec<String> = ex
        .report
        .failures()
        .iter()
        .filter(|f| f.id.contains(ETCD_HEALTHY))
        .map(|f| format!("{}: {}", f.host, f.log.trim()))
        .collect();
    let installed = std::mem::take(&mut *versions.read.lock().unwrap_or_else(|e| e.into_inner()));
    let read = step.read.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(json) = read else {
        let mut why = ex.errors();
        why.extend(ex.connect_errors.iter().cloned());
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "the nodes of cluster {name} could not be read on {first} (job {}): the upgrade needs its API server; {}",
                ex.job,
                why.join("; ")
            ),
        ));
    };
    let nodes = parse_nodes(&json).map_err(|e| op(OpError::Host, anyhow::anyhow!("{first}: kubectl get nodes: {e}")))?;
    if !unhealthy.is_empty() {
        return Err(etcd_refusal(unhealthy.join("\n  ")));
    }
    if health_wanted && via.is_none() {
        return Err(etcd_refusal(format!("no etcd member ({}) answered over SSH", members.join(", "))));
    }
    Ok((nodes, installed))
}

/// The preflight's etcd health step.
const ETCD_HEALTHY: &str = "etcd-healthy-before-upgrade";

/// `(host, component, version as its binary prints it)`.
type Installed = (String, String, String);

/// The first line of what `kubeadm version -o short`, `etcd --version` and
/// `containerd --version` print on a host, where each is installed.
const VERSIONS: &str = "for b in kubeadm etcd containerd; do\n\
  p=$(command -v \"$b\" 2>/dev/null) || p=\n\
  [ -x \"/usr/local/bin/$b\" ] && p=\"/usr/local/bin/$b\"\n\
  [ -n \"$p\" ] || continue\n\
  case $b in kubeadm) v=$(\"$p\" version -o short 2>/dev/null) ;; *) v=$(\"$p\" --version 2>/dev/null | head -1) ;; esac\n\
  printf '%s=%s\\n' \"$b\" \"$v\"\n\
done";

/// Reads [`VERSIONS`] on every host: `(host, component, what it printed)`.
#[derive(Default)]
struct ReadVersions {
    read: Mutex<Vec<Installed>>,
}

impl Step for ReadVersions {
    fn name(&self) -> &str {
        "read-versions"
    }

    fn check<'a>(&'a self, _: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async { Ok(Check::Missing) })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let out = t.run(VERSIONS, Duration::from_secs(60)).await?;
            let found = parse_versions(t.host(), &out.stdout);
            let said = found.iter().map(|(_, c, v)| format!("{c} {v}")).collect::<Vec<_>>().join(", ");
            self.read.lock().unwrap_or_else(|e| e.into_inner()).extend(found);
            Ok(said)
        })
    }
}

/// `component=version` lines of [`VERSIONS`]' output, for `host` (empty
/// versions and other components left out).
fn parse_versions(host: &str, out: &str) -> Vec<Installed> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(c, v)| ["kubeadm", "etcd", "containerd"].contains(c) && !v.trim().is_empty())
        .map(|(c, v)| (host.to_string(), c.to_string(), v.trim().chars().take(200).collect()))
        .collect()
}

/// `kubectl get nodes -o json` → each node's name, kubelet and Ready.
pub(crate) fn parse_nodes(json: &str) -> Result<Vec<NodeNow>, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let items = v["items"].as_array().ok_or("no items")?;
    items
        .iter()
        .map(|n| {
            let name = n["metadata"]["name"].as_str().ok_or("a node without a name")?;
            let kubelet = n["status"]["nodeInfo"]["kubeletVersion"].as_str().map(str::to_string);
            let ready = n["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
            Ok(NodeNow {
                name: name.to_string(),
                kubelet,
                ready,
                cordoned: n["spec"]["unschedulable"].as_bool().unwrap_or(false),
            })
        })
        .collect()
}

/// Reads `kubectl get nodes -o json` with the admin kubeconfig.
#[derive(Default)]
struct ReadNodes {
    read: Mutex<Option<String>>,
}

impl Step for ReadNodes {
    fn name(&self) -> &str {
        "read-nodes"
    }

    fn check<'a>(&'a self, _: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async { Ok(Check::Missing) })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let out = t
                .run(
                    &format!("kubectl --kubeconfig {ADMIN_CONF} get nodes -o json"),
                    Duration::from_secs(60),
                )
                .await?;
            if !out.success() {
                return Err(StepError::Failed(format!("kubectl get nodes: {}", out.stderr.trim())));
            }
            let n = parse_nodes(&out.stdout).map(|n| n.len()).unwrap_or(0);
            *self.read.lock().unwrap_or_else(|e| e.into_inner()) = Some(out.stdout);
            Ok(format!("{n} node(s) read"))
        })
    }
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

    /// Issue 30: a hop before the last reads the config at its version: the
    /// text's `spec.kubernetes.version` replaced where it stands (block or
    /// flow style, quoted or not, a comment after it kept), nothing else.
    #[test]
    fn the_config_of_a_hop_names_the_hops_version_and_nothing_else_changes() -> Result<(), String> {
        let head = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n";
        for (kubernetes, want) in [
            (
                "  kubernetes:\n    version: v1.38.1   # the target\n",
                "  kubernetes:\n    version: v1.37.2   # the target\n",
            ),
            ("  kubernetes: {version: \"v1.38.1\"}\n", "  kubernetes: {version: \"v1.37.2\"}\n"),
            (
                "  kubernetes: {clusterName: x, version: 'v1.38.1'}\n",
                "  kubernetes: {clusterName: x, version: 'v1.37.2'}\n",
            ),
        ] {
            let text = format!("{head}{kubernetes}  upgrade: {{maxUnavailable: 1}}\n");
            let out = with_version(&text, "v1.37.2")?;
            assert_eq!(out, format!("{head}{want}  upgrade: {{maxUnavailable: 1}}\n"));
        }
        let e = with_version(&format!("{head}  upgrade: {{maxUnavailable: 1}}\n"), "v1.37.2")
            .err()
            .unwrap_or_default();
        assert!(e.contains("names no spec.kubernetes.version"), "{e}");
        Ok(())
    }

    /// Issue 30: a re-run of a hop keeps the restore point its first run
    /// took (labelled, after the record's job), not one of another hop or
    /// from before the record.
    #[test]
    fn a_rerun_of_a_hop_finds_the_restore_point_its_first_run_took() -> anyhow::Result<()> {
        let f = crate::ops::fixture::Fixture::installed()?;
        let s = f.session(crate::ops::fixture::CONFIG)?;
        let record = f.record()?;
        let dir = f.settings().root.join("clusters/s/snapshots");
        std::fs::create_dir_all(&dir)?;
        let put = |stamp: &str, label: &str, taken: i64| -> anyhow::Result<()> {
            let file = dir.join(format!("s-{stamp}{label}.db"));
            std::fs::write(&file, "db")?;
            let info = super::super::etcd::SnapshotInfo {
                cluster: "s".into(),
                cluster_id: "1".into(),
                members: vec![],
                host: "a".into(),
                endpoint: "https://10.0.0.1:2379".into(),
                taken,
                sha256: "00".into(),
                size: 2,
                etcd_ca: None,
            };
            std::fs::write(super::super::etcd::sidecar(&file, "json"), serde_json::to_string(&info)?)?;
            Ok(())
        };
        let after = record.job.finished + 1;
        put("20261128T080000.000Z", "", after)?;
        put("20261128T080100.000Z", "-before-v1.38.0", after)?;
        put("20200101T000000.000Z", "-before-v1.37.2", record.job.finished - 1)?;
        assert!(earlier_restore_point(&s, &record, "v1.37.2").is_none());
        put("20261128T080200.000Z", "-before-v1.37.2", after)?;
        put("20261128T080300.000Z", "-before-v1.37.2", after + 5)?;
        let found = earlier_restore_point(&s, &record, "v1.37.2").map(|s| s.file);
        assert_eq!(found, Some(dir.join("s-20261128T080300.000Z-before-v1.37.2.db")));
        Ok(())
    }

    /// Issue 30: the hop's preflight refuses a certificate that would expire
    /// before the hop could end, naming it, and passes one that outlasts it.
    #[test]
    fn a_certificate_expiring_within_the_hops_budget_is_refused() {
        let wave = |h: &str| upgrade::order::Wave {
            action: upgrade::order::Action::KubeadmNode { runtime: false },
            hosts: vec![h.into()],
        };
        let budget = hop_budget(&[wave("a"), wave("b")], 600);
        assert_eq!(budget, Duration::from_secs(30 * 60 + 2 * (600 + 900)));
        let cert = |path: &str, not_after: i64| super::super::certs::CertInfo {
            host: "a".into(),
            path: path.into(),
            subject: "CN=x".into(),
            issuer: "CN=ca".into(),
            ca: false,
            not_after,
            expires: format!("t{not_after}"),
            days_left: 0,
        };
        let now = 1_000_000;
        let report = |certs| super::super::certs::CertsReport {
            cluster: "lab".into(),
            job: 1,
            warn_days: 0,
            certs,
            expiring: 0,
        };
        let ends = now + budget.as_secs() as i64;
        assert!(certs_last(&report(vec![cert("/etc/kubernetes/pki/ca.crt", ends + 1)]), now, budget).is_ok());
        let e = certs_last(
            &report(vec![
                cert("/etc/kubernetes/pki/ca.crt", ends + 1),
                cert("/etc/kubexm/etcd/pki/peer.crt", ends - 1),
            ]),
            now,
            budget,
        )
        .map_err(|e| format!("{e:#}"))
        .err()
        .unwrap_or_default();
        assert!(
            e.contains("1 certificate(s) of cluster lab") && e.contains("a /etc/kubexm/etcd/pki/peer.crt") && !e.contains("ca.crt"),
            "{e}"
        );
        assert!(e.contains("up to 80 min") && e.contains("certs renew"), "{e}");
    }

    /// What the hosts' binaries print is read per component; nothing else.
    #[test]
    fn versions_are_read_from_each_binarys_output() {
        let out = "kubeadm=v1.36.3\netcd=etcd Version: 3.6.8\ncontainerd=\nrunc=1.1.12\nnoise\n";
        assert_eq!(
            parse_versions("a", out),
            [
                ("a".to_string(), "kubeadm".to_string(), "v1.36.3".to_string()),
                ("a".to_string(), "etcd".to_string(), "etcd Version: 3.6.8".to_string())
            ]
        );
    }

    /// The API server's node list: names, kubelets and the Ready condition.
    #[test]
    fn nodes_are_read_from_the_api_server_s_list() -> Result<(), String> {
        let json = r#"{"items": [
            {"metadata": {"name": "a"}, "spec": {"unschedulable": true}, "status": {"nodeInfo": {"kubeletVersion": "v1.36.3"},
             "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]}},
            {"metadata": {"name": "b"}, "status": {"nodeInfo": {"kubeletVersion": "v1.36.3"},
             "conditions": [{"type": "Ready", "status": "Unknown"}]}},
            {"metadata": {"name": "c"}, "status": {}}
        ]}"#;
        let n = parse_nodes(json)?;
        let got: Vec<(&str, Option<&str>, bool)> = n.iter().map(|n| (n.name.as_str(), n.kubelet.as_deref(), n.ready)).collect();
        assert_eq!(n.iter().map(|n| n.cordoned).collect::<Vec<_>>(), [true, false, false]);
        assert_eq!(
            got,
            [("a", Some("v1.36.3"), true), ("b", Some("v1.36.3"), false), ("c", None, false)]
        );
        assert!(parse_nodes("{}").is_err());
        Ok(())
    }
}
