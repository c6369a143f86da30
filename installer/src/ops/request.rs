//! What a trigger asks of a cluster, typed: one [`Request`] per operation
//! kind with its options, defined once. The API server and the CLI store a
//! request as a job's body, a worker hands it to [`run`] on a [`Session`]
//! it opened, and every trigger gets a typed [`Report`] back, which the
//! binaries render. A request names no path of the machine that runs it:
//! the bundle by its digest, everything else (root, keys, kubeconfig) comes
//! from the session's settings. A day-2 operation is one more variant here.

use serde::{Deserialize, Serialize};

use super::error::{OpError, op};
use super::session::Session;
use super::{facts, install, reset};
use crate::engine::facts::HostFacts;

/// One operation on a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Request {
    /// Install the cluster from a bundle.
    Install(InstallRequest),
    /// Change the installed cluster to what its config now says (`kubexm
    /// scale`: workers, control-plane nodes and etcd members added), from the bundle it was
    /// installed from.
    Apply(ApplyRequest),
    /// Remove what kubexm installed, on every host that can be reached.
    Reset(HostsRequest),
    /// Gather every host's facts.
    Facts(HostsRequest),
    /// Take a snapshot of the cluster's etcd, kept under the worker's root.
    EtcdSnapshot(SnapshotRequest),
    /// Take workers out of the cluster.
    RemoveNode(RemoveRequest),
    /// Reset every host and forget the cluster.
    DeleteCluster(DeleteRequest),
    /// Read every certificate on the hosts with its expiry.
    CertsCheck(CertsRequest),
    /// Renew the certificates that are due.
    CertsRenew(RenewCertsRequest),
    /// Put etcd back to one of the cluster's snapshots (confirmed by the trigger).
    EtcdRestore(RestoreRequest),
    /// Upgrade the installed cluster to the Kubernetes version its config
    /// now names, from the bundle built for it: one hop (a minor, or a
    /// patch release).
    Upgrade(UpgradeRequest),
}

/// An upgrade's options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeRequest {
    /// The target's bundle, by the `sha256:<hex>` of its signed `bundle.yaml`.
    pub bundle: String,
    /// NotReady workers to leave at their version (hosts of the config).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_not_ready: Vec<String>,
    /// Each drain's time limit in seconds; none: the config's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<u32>,
}

/// An etcd restore's options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestoreRequest {
    /// A snapshot of the cluster by its file name, as `etcd snapshot` named
    /// it (`<cluster>-<stamp>.db`), under the worker's
    /// `<root>/clusters/<cluster>/snapshots`: never a path.
    pub snapshot: String,
}

impl RestoreRequest {
    /// The snapshot's name, checked: letters, digits, `.`, `_`, `-`, ending
    /// in `.db`, not starting with `.`.
    pub fn checked(&self) -> anyhow::Result<&str> {
        let n = &self.snapshot;
        let fine = n.len() <= 200
            && n.ends_with(".db")
            && !n.starts_with('.')
            && n.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if fine {
            Ok(n)
        } else {
            Err(op(
                OpError::Usage,
                anyhow::anyhow!(
                    "snapshot `{}` is not a snapshot's file name (<cluster>-<stamp>.db, as `etcd snapshot` names it)",
                    n.escape_debug()
                ),
            ))
        }
    }
}

/// A certificate renewal's options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewCertsRequest {
    /// Hosts known to be down: never contacted, nothing renewed there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<String>,
    /// Renew what ends within this many days; default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within_days: Option<u32>,
    /// Renew every leaf, due or not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// A certificate check's options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertsRequest {
    /// Hosts known to be down: never contacted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<String>,
    /// The job fails when a certificate expires within this many days; default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn_days: Option<u32>,
}

/// A delete's options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteRequest {
    /// Hosts known to be down: never contacted, not reset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<String>,
    /// Remove the cluster's PKI, snapshots and conformance results under the worker's root.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub purge: bool,
}

/// A removal's options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoveRequest {
    /// The hosts to take out (hosts of the config).
    pub hosts: Vec<String>,
    /// Hosts known to be down: never contacted (not drained, not reset).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<String>,
    /// Seconds a drain may take; default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<u32>,
    /// Delete the pods a drain cannot evict.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_drain: bool,
}

/// An etcd snapshot's options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Hosts known to be down: never contacted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<String>,
    /// Snapshots of the cluster kept (the newest); default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
}

/// An install's options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstallRequest {
    /// The bundle, by the `sha256:<hex>` of its signed `bundle.yaml`.
    pub bundle: String,
    /// Empty: every phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<crate::pipelines::Phase>,
}

/// An apply's options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplyRequest {
    /// The bundle, by the `sha256:<hex>` of its signed `bundle.yaml`.
    pub bundle: String,
}

/// The options of an operation over the cluster's hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostsRequest {
    /// Hosts known to be down: never contacted, left out of the job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<String>,
}

impl Request {
    /// The kind, as jobs list it (`install`, `reset`, `facts`).
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Install(_) => "install",
            Request::Apply(_) => "apply",
            Request::Reset(_) => "reset",
            Request::Facts(_) => "facts",
            Request::EtcdSnapshot(_) => "etcd-snapshot",
            Request::RemoveNode(_) => "remove-node",
            Request::DeleteCluster(_) => "delete-cluster",
            Request::CertsCheck(_) => "certs-check",
            Request::CertsRenew(_) => "certs-renew",
            Request::EtcdRestore(_) => "etcd-restore",
            Request::Upgrade(_) => "upgrade",
        }
    }

    /// The bundle the request needs, by digest.
    pub fn bundle(&self) -> Option<&str> {
        match self {
            Request::Install(r) => Some(&r.bundle),
            Request::Apply(r) => Some(&r.bundle),
            Request::Upgrade(r) => Some(&r.bundle),
            Request::Reset(_)
            | Request::Facts(_)
            | Request::EtcdSnapshot(_)
            | Request::RemoveNode(_)
            | Request::DeleteCluster(_)
            | Request::CertsCheck(_)
            | Request::CertsRenew(_)
            | Request::EtcdRestore(_) => None,
        }
    }

    /// The hosts the request names unreachable.
    pub fn unreachable(&self) -> &[String] {
        match self {
            Request::Install(_) | Request::Apply(_) | Request::Upgrade(_) => &[],
            Request::Reset(r) | Request::Facts(r) => &r.unreachable,
            Request::EtcdSnapshot(r) => &r.unreachable,
            Request::RemoveNode(r) => &r.unreachable,
            Request::DeleteCluster(r) => &r.unreachable,
            Request::CertsCheck(r) => &r.unreachable,
            Request::CertsRenew(r) => &r.unreachable,
            Request::EtcdRestore(_) => &[],
        }
    }

    /// Every host the request names (to remove, or unreachable): each must
    /// be a host of the config.
    pub fn named_hosts(&self) -> Vec<String> {
        let mut all = self.unreachable().to_vec();
        if let Request::RemoveNode(r) = self {
            all.extend(r.hosts.iter().cloned());
        }
        if let Request::Upgrade(r) = self {
            all.extend(r.skip_not_ready.iter().cloned());
        }
        all
    }

    /// A job's stored request: its `kind` and the JSON of its options.
    pub fn from_job(kind: &str, options: &serde_json::Value) -> Result<Request, serde_json::Error> {
        let mut body = match options {
            serde_json::Value::Object(m) => m.clone(),
            serde_json::Value::Null => serde_json::Map::new(),
            other => return serde_json::from_value(other.clone()),
        };
        body.insert("kind".into(), kind.into());
        serde_json::from_value(serde_json::Value::Object(body))
    }

    /// The JSON of its options, as a job stores them beside its kind.
    pub fn options(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.remove("kind");
        }
        v
    }
}

/// What an operation did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Report {
    Install(install::Installed),
    Apply(install::Installed),
    Reset(reset::Reset),
    Facts(Gathered),
    EtcdSnapshot(super::etcd::Snapshot),
    RemoveNode(super::remove::Removed),
    DeleteCluster(super::delete::Deleted),
    CertsCheck(super::certs::CertsReport),
    CertsRenew(super::certs_renew::Renewed),
    EtcdRestore(super::etcd_restore::Restored),
    Upgrade(super::upgrade::Upgraded),
}

/// The facts of every host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gathered {
    pub job: i64,
    pub facts: Vec<HostFacts>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Report::Install(r) | Report::Apply(r) => write!(f, "{r}"),
            Report::Reset(r) => writeln!(f, "{r}"),
            Report::Facts(g) => {
                for h in &g.facts {
                    writeln!(
                        f,
                        "{}: {} {} {}, kernel {}, {} CPUs, {} MB",
                        h.host, h.os_id, h.os_version, h.arch, h.kernel, h.cpus, h.memory_mb
                    )?;
                }
                writeln!(f, "facts of {} host(s) gathered", g.facts.len())
            }
            Report::EtcdSnapshot(s) => write!(f, "{s}"),
            Report::RemoveNode(r) => write!(f, "{r}"),
            Report::DeleteCluster(d) => write!(f, "{d}"),
            Report::CertsCheck(c) => write!(f, "{c}"),
            Report::CertsRenew(r) => write!(f, "{r}"),
            Report::EtcdRestore(r) => write!(f, "{r}"),
            Report::Upgrade(u) => write!(f, "{u}"),
        }
    }
}

/// Runs `request` on the cluster `session` opened. Fails as the CLI's
/// command would: a host that could not be asked fails a facts request.
pub fn run(session: &mut Session, request: &Request) -> anyhow::Result<Report> {
    session.unreachable(request.unreachable())?;
    match request {
        Request::Install(r) => {
            let o = install::InstallOptions {
                phases: r.phases.clone(),
                expect_digest: Some(r.bundle.clone()),
                ..Default::default()
            };
            match install::install(session, &o)? {
                install::InstallReport::Installed(i) => Ok(Report::Install(i)),
                install::InstallReport::Plan(_) => Err(anyhow::anyhow!("an install request planned instead of installing")),
            }
        }
        Request::Apply(r) => {
            let o = super::apply::ApplyOptions {
                dry_run: false,
                expect_digest: Some(r.bundle.clone()),
                ..Default::default()
            };
            match super::apply::apply(session, &o)? {
                super::apply::ApplyReport::Applied { installed, .. } => Ok(Report::Apply(installed)),
                super::apply::ApplyReport::Upgraded(u) => Ok(Report::Upgrade(u.done())),
                super::apply::ApplyReport::Plan { .. } => Err(anyhow::anyhow!("an apply request planned instead of applying")),
            }
        }
        Request::Upgrade(r) => {
            let o = super::upgrade::UpgradeOptions {
                hop_bundles: Vec::new(),
                skip_not_ready: r.skip_not_ready.clone(),
                dry_run: false,
                expect_digest: Some(r.bundle.clone()),
                drain_timeout: r.drain_timeout.filter(|t| *t > 0),
            };
            Ok(Report::Upgrade(super::upgrade::upgrade(session, &o)?.done()))
        }
        Request::Reset(_) => match reset::reset(session, true)? {
            reset::ResetReport::Done(r) => Ok(Report::Reset(r)),
            reset::ResetReport::NotConfirmed { refusal, .. } => Err(op(OpError::Usage, anyhow::anyhow!(refusal))),
        },
        Request::Facts(_) => match facts::facts(session, &facts::FactsOptions::default())? {
            facts::FactsReport::Gathered { job, facts, errors } if errors.is_empty() => Ok(Report::Facts(Gathered { job, facts })),
            facts::FactsReport::Gathered { errors, .. } => Err(op(
                OpError::Host,
                anyhow::anyhow!("facts of {} host(s) could not be gathered:\n{}", errors.len(), errors.join("\n")),
            )),
            facts::FactsReport::Plan(_) => Err(anyhow::anyhow!("a facts request planned instead of gathering")),
        },
        Request::EtcdSnapshot(r) => {
            let o = super::etcd::SnapshotOptions {
                keep: r.keep.map_or(super::etcd::KEEP, |k| k as usize),
                dir: None,
                label: None,
            };
            Ok(Report::EtcdSnapshot(super::etcd::snapshot(session, &o)?))
        }
        Request::RemoveNode(r) => {
            let o = super::remove::RemoveOptions {
                hosts: r.hosts.clone(),
                unreachable: r.unreachable.clone(),
                drain_timeout: r
                    .drain_timeout
                    .map_or(super::remove::DRAIN_TIMEOUT, |s| std::time::Duration::from_secs(s.into())),
                force_drain: r.force_drain,
                dry_run: false,
            };
            match super::remove::remove(session, &o)? {
                super::remove::RemoveReport::Removed(r) => Ok(Report::RemoveNode(r)),
                super::remove::RemoveReport::Plan(_) => Err(anyhow::anyhow!("a removal planned instead of removing")),
            }
        }
        Request::DeleteCluster(r) => {
            let o = super::delete::DeleteOptions {
                yes: true,
                purge: r.purge,
                unreachable: r.unreachable.clone(),
            };
            match super::delete::delete(session, true, &o)? {
                super::delete::DeleteReport::Deleted(d) => Ok(Report::DeleteCluster(d)),
                super::delete::DeleteReport::NotConfirmed { refusal, .. } => Err(op(OpError::Usage, anyhow::anyhow!(refusal))),
            }
        }
        Request::CertsCheck(r) => {
            let report = super::certs::check(session, r.warn_days.unwrap_or(super::certs::WARN_DAYS))?;
            // Expiring certificates fail the job, as they fail the command (exit 7).
            report.expiring_error()?;
            Ok(Report::CertsCheck(report))
        }
        Request::CertsRenew(r) => {
            let o = super::certs_renew::RenewOptions {
                within_days: r.within_days.unwrap_or(super::certs::WARN_DAYS),
                all: r.all,
            };
            Ok(Report::CertsRenew(super::certs_renew::renew(session, &o)?))
        }
        Request::EtcdRestore(r) => {
            let name = session.cluster().metadata.name.clone();
            let o = super::etcd_restore::RestoreOptions {
                snapshot: session
                    .settings()
                    .root
                    .join("clusters")
                    .join(name)
                    .join("snapshots")
                    .join(r.checked()?),
                yes: true,
            };
            match super::etcd_restore::restore(session, &o)? {
                super::etcd_restore::RestoreReport::Restored(r) => Ok(Report::EtcdRestore(*r)),
                super::etcd_restore::RestoreReport::NotConfirmed { refusal, .. } => Err(op(OpError::Usage, anyhow::anyhow!(refusal))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 26: every kind round-trips through JSON, and through a job's
    /// (kind, options) columns.
    #[test]
    fn every_request_round_trips_through_json() -> Result<(), Box<dyn std::error::Error>> {
        let digest = format!("sha256:{}", "a".repeat(64));
        let all = [
            Request::Install(InstallRequest {
                bundle: digest.clone(),
                phases: vec![crate::pipelines::Phase::Etcd, crate::pipelines::Phase::ControlPlane],
            }),
            Request::Install(InstallRequest {
                bundle: digest.clone(),
                phases: vec![],
            }),
            Request::Apply(ApplyRequest { bundle: digest }),
            Request::Reset(HostsRequest {
                unreachable: vec!["worker2".into()],
            }),
            Request::Reset(HostsRequest::default()),
            Request::Facts(HostsRequest {
                unreachable: vec!["a".into(), "b".into()],
            }),
            Request::Facts(HostsRequest::default()),
            Request::EtcdSnapshot(SnapshotRequest {
                unreachable: vec!["a".into()],
                keep: Some(3),
            }),
            Request::EtcdSnapshot(SnapshotRequest::default()),
            Request::RemoveNode(RemoveRequest {
                hosts: vec!["w1".into(), "w2".into()],
                unreachable: vec!["w2".into()],
                drain_timeout: Some(30),
                force_drain: true,
            }),
            Request::RemoveNode(RemoveRequest {
                hosts: vec!["w1".into()],
                ..Default::default()
            }),
            Request::DeleteCluster(DeleteRequest {
                unreachable: vec!["w2".into()],
                purge: true,
            }),
            Request::DeleteCluster(DeleteRequest::default()),
            Request::CertsCheck(CertsRequest {
                unreachable: vec!["w3".into()],
                warn_days: Some(400),
            }),
            Request::CertsCheck(CertsRequest::default()),
            Request::CertsRenew(RenewCertsRequest {
                unreachable: vec!["w3".into()],
                within_days: Some(60),
                all: true,
            }),
            Request::CertsRenew(RenewCertsRequest::default()),
            Request::EtcdRestore(RestoreRequest {
                snapshot: "lab-20261127T001200.000Z.db".into(),
            }),
            Request::Upgrade(UpgradeRequest {
                bundle: format!("sha256:{}", "c".repeat(64)),
                skip_not_ready: vec!["w4".into()],
                drain_timeout: Some(120),
            }),
            Request::Upgrade(UpgradeRequest {
                bundle: format!("sha256:{}", "c".repeat(64)),
                skip_not_ready: vec![],
                drain_timeout: None,
            }),
        ];
        for r in all {
            let text = serde_json::to_string(&r)?;
            assert_eq!(serde_json::from_str::<Request>(&text)?, r, "{text}");
            assert_eq!(Request::from_job(r.kind(), &r.options())?, r, "{text}");
        }
        Ok(())
    }

    /// A snapshot is named by its file name only: a path or anything a shell
    /// reads is refused.
    #[test]
    fn a_restore_names_a_snapshot_file_only() {
        let r = |s: &str| RestoreRequest { snapshot: s.into() }.checked().is_ok();
        assert!(r("lab-20261127T001200.000Z.db"));
        for bad in ["../x.db", "/etc/x.db", ".x.db", "x.db;rm", "x", "a b.db", ""] {
            assert!(!r(bad), "{bad}");
        }
    }

    /// A request naming a path, or an option of another kind, is refused.
    #[test]
    fn unknown_fields_are_refused() {
        for (kind, options) in [
            ("install", serde_json::json!({"bundle": "sha256:x", "root": "/etc"})),
            ("install", serde_json::json!({"bundle": "sha256:x", "phases": ["etdc"]})),
            ("reset", serde_json::json!({"root": "/"})),
            ("facts", serde_json::json!({"phases": []})),
            ("delete", serde_json::json!({})),
            ("remove-node", serde_json::json!({})),
            ("delete-cluster", serde_json::json!({"root": "/"})),
            ("remove-node", serde_json::json!({"hosts": ["a"], "state": "/etc/passwd"})),
            ("certs-renew", serde_json::json!({"pki": "/etc"})),
            ("etcd-restore", serde_json::json!({})),
            ("etcd-restore", serde_json::json!({"snapshot": "a.db", "root": "/"})),
            ("upgrade", serde_json::json!({})),
            (
                "upgrade",
                serde_json::json!({"bundle": "sha256:x", "hopBundles": ["/tmp/x.tar.zst"]}),
            ),
        ] {
            assert!(Request::from_job(kind, &options).is_err(), "{kind} {options} was accepted");
        }
    }
}
