//! `kubexm-install certs renew`: the certificates that end within
//! `--within` days (or every one, `--all`) issued again and put in place, one
//! member or node at a time, each waited for.
//!
//! Here, first: the leafs kubexm keeps in the cluster's PKI directory
//! (etcd's members and client, the registry's server and clients) that are
//! due are marked, then issued anew with `certificates.leafDays` as the
//! pipeline is built. One `certs-renew` job, fail-fast, then runs:
//!
//! 1. each etcd member in turn: its files written (only when they changed),
//!    then it must answer `endpoint health` over TLS with them (etcd reads
//!    its certificates again at each new connection: no restart);
//! 2. the registry host's server certificate (the service restarted if it
//!    runs) and every host's registry client certificate;
//! 3. each control-plane node in turn: etcd's client files; kubeadm's leafs
//!    renewed (`kubeadm certs renew all`) when one of them is due (read from
//!    the host: the check is the certificates' own ends); then every static
//!    pod whose container started before one of its files was written is
//!    restarted and waited for, and the node's API server answers again;
//! 4. the admin kubeconfig fetched again from the first control-plane node.
//!
//! Every step checks the host first, so a re-run (or a run after a crash)
//! does only what is still due, and a run with nothing due changes nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::Serialize;

use super::error::{OpError, op};
use super::session::Session;
use crate::engine::files::PutFiles;
use crate::engine::plan::{Check, Pipeline, Scope, Step, StepError, Task};
use crate::engine::run;
use crate::engine::state::Outcome;
use crate::engine::steps::Shell;
use crate::engine::transport::{Transport, shell_quote as q};
use crate::paths::{REGISTRY_CERT, REGISTRY_CLIENT_CERT, REGISTRY_CLIENT_KEY, REGISTRY_KEY};
use crate::pki;
use crate::template::render;

const RESTART: &str = include_str!("../../../manifests/templates/restart-control-plane.sh");

/// Each control-plane static pod and the certificate files it reads at
/// start. Not etcd's client certificate: the API server's etcd client
/// (etcd's `transport.TLSInfo`) reads it again at each new connection.
const STATIC_PODS: &[(&str, &[&str])] = &[
    (
        "kube-apiserver",
        &[
            "/etc/kubernetes/pki/apiserver.crt",
            "/etc/kubernetes/pki/apiserver-kubelet-client.crt",
            "/etc/kubernetes/pki/front-proxy-client.crt",
        ],
    ),
    ("kube-controller-manager", &["/etc/kubernetes/controller-manager.conf"]),
    ("kube-scheduler", &["/etc/kubernetes/scheduler.conf"]),
];

/// kubeadm's leafs on a control-plane node: its PKI's certificates (CAs
/// left out when read) and the kubeconfigs with an embedded client
/// certificate that kubeadm renews (not the kubelet's: the kubelet rotates
/// its own).
const KUBEADM_CERTS: &str = "/etc/kubernetes/pki/*.crt";
const KUBEADM_CONFS: &str = "/etc/kubernetes/admin.conf /etc/kubernetes/super-admin.conf \
                             /etc/kubernetes/controller-manager.conf /etc/kubernetes/scheduler.conf";

/// What a renewal is asked.
#[derive(Debug, Clone)]
pub struct RenewOptions {
    /// Renew what ends within this many days.
    pub within_days: u32,
    /// Renew every leaf, due or not.
    pub all: bool,
}

/// A leaf kubexm issued anew here.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reissued {
    pub file: String,
    /// `YYYY-MM-DD HH:MM:SS UTC`, before and now.
    pub was: String,
    pub now: String,
}

/// What a renewal did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Renewed {
    pub cluster: String,
    pub job: i64,
    pub within_days: u32,
    pub all: bool,
    /// kubexm's leafs issued anew in the cluster's PKI directory.
    pub reissued: Vec<Reissued>,
    /// `host: step: what it did`, for every step that changed a host.
    pub changed: Vec<String>,
    /// Hosts named unreachable: nothing renewed there.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<String>,
}

impl std::fmt::Display for Renewed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.all {
            "every certificate".to_string()
        } else {
            format!("certificates ending within {} days", self.within_days)
        };
        writeln!(f, "certs renew on cluster {} (job {}): {what}", self.cluster, self.job)?;
        for r in &self.reissued {
            writeln!(f, "  issued anew: {} (ended {}, now ends {})", r.file, r.was, r.now)?;
        }
        for c in &self.changed {
            writeln!(f, "  {c}")?;
        }
        if self.reissued.is_empty() && self.changed.is_empty() {
            writeln!(f, "  nothing was due: no host changed")?;
        }
        if !self.unreachable.is_empty() {
            writeln!(
                f,
                "  not renewed on {} (named unreachable): run certs renew again when they are back",
                self.unreachable.join(", ")
            )?;
        }
        Ok(())
    }
}

/// Renews what is due on the session's cluster.
pub fn renew(session: &Session, o: &RenewOptions) -> anyhow::Result<Renewed> {
    let cluster = session.cluster();
    let name = cluster.metadata.name.clone();
    let settings = session.settings();
    // An old single-cluster root's PKI is moved into place first, as an install does.
    let dir = super::cluster_pki(&settings.root, &name).map_err(|e| op(OpError::Io, e))?;
    if !dir.is_dir() {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "cluster {name} has no PKI under {}: certs renew runs where the cluster was installed, with the same --root",
                settings.root.display()
            ),
        ));
    }
    let now = crate::engine::state::now_ms() / 1000;
    let before = if o.all { i64::MAX } else { now + i64::from(o.within_days) * 86_400 };
    let mut due = Vec::new();
    for sub in ["etcd", "registry"] {
        due.extend(pki::mark_due(&dir.join(sub), before).map_err(|e| op(OpError::Io, anyhow::Error::from(e)))?);
    }
    let topo = kubexm_bom::topology::Topology::of(cluster).map_err(|e| op(OpError::Config, anyhow::Error::from(e)))?;
    let ca = pki::Pki::Dir(dir.clone(), pki::Leaf::of(cluster));
    let unreachable = session.unreachable_hosts().clone();
    let kubeconfig = super::install::kubeconfig_path(settings, cluster);
    let plan = Plan {
        cluster,
        topo: &topo,
        pki: &ca,
        unreachable: &unreachable,
        before: (!o.all).then_some(before),
        kubeconfig,
    };
    let pipeline = plan.pipeline()?;
    let reissued = due
        .iter()
        .map(|d| Reissued {
            file: d.cert.display().to_string(),
            was: super::certs::utc(d.not_after),
            now: fs_err::read(&d.cert).ok().and_then(|p| pki::not_after(&p)).map_or_else(
                || "not issued yet: no host of this run uses it (a host removed, or named unreachable: the next renew issues it)".into(),
                super::certs::utc,
            ),
        })
        .collect();
    // Fail-fast: a host that does not answer stops the job before any step.
    let ex = session.execute("certs-renew", run::Policy::FailFast, move |_| Ok(pipeline))?;
    if !ex.ok() {
        let errors = ex.errors();
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "certs renew of cluster {name} stopped (job {}); what is renewed stays, a re-run does what is left:\n  {}",
                ex.job,
                errors.join("\n  ")
            ),
        ));
    }
    let changed = ex
        .report
        .results
        .iter()
        .filter(|r| r.outcome == Outcome::Applied)
        .map(|r| format!("{}: {}: {}", r.host, step_name(&r.id), r.log.lines().last().unwrap_or("").trim()))
        .collect();
    Ok(Renewed {
        cluster: name,
        job: ex.job,
        within_days: o.within_days,
        all: o.all,
        reissued,
        changed,
        unreachable: unreachable.into_iter().collect(),
    })
}

/// A step's name from its id (`module/task/step@host`).
fn step_name(id: &str) -> &str {
    let id = id.split('@').next().unwrap_or(id);
    id.rsplit('/').next().unwrap_or(id)
}

/// What the renewal pipeline is built from.
struct Plan<'a> {
    cluster: &'a kubexm_bom::config::Cluster,
    topo: &'a kubexm_bom::topology::Topology,
    pki: &'a pki::Pki,
    unreachable: &'a std::collections::BTreeSet<String>,
    /// kubeadm's leafs ending before this are renewed; `None`: all of them.
    before: Option<i64>,
    kubeconfig: std::path::PathBuf,
}

impl Plan<'_> {
    fn reachable<'b>(&self, hosts: &'b [String]) -> impl Iterator<Item = &'b String> {
        hosts.iter().filter(|h| !self.unreachable.contains(*h))
    }

    fn pipeline(&self) -> anyhow::Result<Pipeline> {
        let mut modules = Vec::new();
        let etcd = self.etcd()?;
        let last_etcd = etcd.last().map(|t| t.name.clone());
        modules.push(("renew-etcd", etcd));
        modules.push(("renew-registry", self.registry()?));
        let cp = self.control_plane(last_etcd)?;
        modules.push(("renew-control-plane", cp));
        Ok(Pipeline::of("certs-renew", modules))
    }

    /// Each etcd member in turn (binary mode: kubexm runs them).
    fn etcd(&self) -> anyhow::Result<Vec<Task>> {
        let mut tasks: Vec<Task> = Vec::new();
        if self.cluster.spec.etcd.mode != kubexm_bom::config::model::EtcdMode::Binary {
            return Ok(tasks);
        }
        for m in self.reachable(&self.cluster.spec.role_groups.etcd) {
            let healthy = crate::phases::etcd::healthy("etcd-member-healthy", self.topo, std::slice::from_ref(m));
            let steps: Vec<Arc<dyn Step>> = vec![
                // etcd reads its certificates again at each new connection
                // (etcd's transport.TLSInfo): no restart; the health check
                // below dials it with the new files.
                Arc::new(PutFiles {
                    name: "etcd-pki".into(),
                    files: crate::phases::etcd::member_files(self.pki, self.topo, m)?,
                    then: None,
                }),
                Arc::new(healthy),
            ];
            tasks.push(Task {
                name: format!("renew-etcd-{m}"),
                hosts: vec![m.clone()],
                steps,
                after: tasks.last().map(|t| (t.name.clone(), Scope::AllHosts)).into_iter().collect(),
            });
        }
        Ok(tasks)
    }

    /// The registry's server certificate on its host, and every host's client one.
    fn registry(&self) -> anyhow::Result<Vec<Task>> {
        let mut tasks = Vec::new();
        let Some(reg) = self.topo.registry.as_ref() else {
            return Ok(tasks);
        };
        if self.cluster.spec.registry.mode != kubexm_bom::config::model::RegistryMode::Local {
            return Ok(tasks);
        }
        let hosts: Vec<String> = self.cluster.spec.hosts.iter().map(|h| h.name.clone()).collect();
        for h in self.reachable(&hosts) {
            let mut steps: Vec<Arc<dyn Step>> = Vec::new();
            if &reg.host == h {
                let c = crate::phases::registry::server_cert(self.pki, self.topo, h)?;
                steps.push(Arc::new(PutFiles {
                    name: "registry-server-cert".into(),
                    files: vec![
                        (REGISTRY_CERT.into(), c.cert_pem.into_bytes(), 0o644),
                        (REGISTRY_KEY.into(), c.key_pem.into_bytes(), 0o600),
                    ],
                    then: Some("systemctl try-restart kubexm-registry".into()),
                }));
            }
            if let Some(c) = crate::phases::registry::client_cert(self.pki, self.cluster, h)? {
                steps.push(Arc::new(PutFiles {
                    name: "registry-client-cert".into(),
                    files: vec![
                        (REGISTRY_CLIENT_CERT.into(), c.cert_pem.into_bytes(), 0o644),
                        (REGISTRY_CLIENT_KEY.into(), c.key_pem.into_bytes(), 0o600),
                    ],
                    then: None,
                }));
            }
            if !steps.is_empty() {
                tasks.push(Task {
                    name: format!("renew-registry-{h}"),
                    hosts: vec![h.clone()],
                    steps,
                    after: vec![],
                });
            }
        }
        Ok(tasks)
    }

    /// Each control-plane node in turn, after etcd; then the admin kubeconfig.
    fn control_plane(&self, after_etcd: Option<String>) -> anyhow::Result<Vec<Task>> {
        let mut tasks: Vec<Task> = Vec::new();
        let binary = self.cluster.spec.etcd.mode == kubexm_bom::config::model::EtcdMode::Binary;
        let client = if binary {
            crate::phases::etcd::client_files(self.pki)?
        } else {
            Vec::new()
        };
        for h in self.reachable(&self.cluster.spec.role_groups.control_plane) {
            let mut steps: Vec<Arc<dyn Step>> = Vec::new();
            if !client.is_empty() {
                steps.push(Arc::new(PutFiles {
                    name: "etcd-client-certs".into(),
                    files: client.clone(),
                    then: None,
                }));
            }
            steps.push(Arc::new(KubeadmLeafs {
                before: self.before,
                read: Mutex::default(),
            }));
            steps.push(Arc::new(restart_static_pods(&format!("https://{}:6443", self.topo.address(h)))?));
            let after = tasks
                .last()
                .map(|t| t.name.clone())
                .or_else(|| after_etcd.clone())
                .map(|t| (t, Scope::AllHosts));
            tasks.push(Task {
                name: format!("renew-control-plane-{h}"),
                hosts: vec![h.clone()],
                steps,
                after: after.into_iter().collect(),
            });
        }
        let first = &self.topo.first_control_plane;
        if !self.unreachable.contains(first) {
            tasks.push(Task {
                name: "admin-kubeconfig".into(),
                hosts: vec![first.clone()],
                steps: vec![Arc::new(crate::phases::kubeadm::kubeconfig::FetchKubeconfig {
                    local: self.kubeconfig.clone(),
                    server: self.topo.external_server.clone(),
                })],
                after: tasks.last().map(|t| (t.name.clone(), Scope::AllHosts)).into_iter().collect(),
            });
        }
        Ok(tasks)
    }
}

/// The step restarting, one by one, the static pods that started before one
/// of their files was written; then the node's API server (`server`) answers.
fn restart_static_pods(server: &str) -> anyhow::Result<Shell> {
    let pods = STATIC_PODS
        .iter()
        .map(|(pod, files)| format!("{pod}={}", files.join(",")))
        .collect::<Vec<_>>()
        .join(" ");
    let script = |tail: &str| {
        render(
            "restart-control-plane.sh",
            RESTART,
            &[
                ("PODS", &pods),
                ("MANIFESTS", crate::paths::STATIC_POD_MANIFESTS),
                ("KUBECTL", &crate::waits::kubectl()),
                ("SERVER", &q(server)),
                ("STATIC_POD", crate::template::STATIC_POD),
                ("TAIL", tail),
            ],
            &[],
        )
    };
    let mut s = Shell::new("static-pods-restarted", Some(&script("[ -z \"$(stale)\" ]")?), &script("restart")?);
    // Per pod: 5 s to stop, 15 s for the kubelet to finish it, 180 s to run
    // again, with room; then 180 s for /readyz.
    s.timeout = Duration::from_secs(STATIC_PODS.len() as u64 * 240 + 240);
    Ok(s)
}

/// kubeadm's leafs on a control-plane node, renewed when one ends before
/// `before` (always with `None`): read from the host, never a key.
struct KubeadmLeafs {
    before: Option<i64>,
    /// The ends found by the last check, for its log.
    read: Mutex<BTreeMap<String, i64>>,
}

impl KubeadmLeafs {
    /// Each kubeadm leaf on the host (path → end).
    async fn ends(&self, t: &dyn Transport) -> Result<BTreeMap<String, i64>, StepError> {
        let script = super::certs::read_script(KUBEADM_CERTS, KUBEADM_CONFS);
        let out = t.run(&script, Duration::from_secs(60)).await?;
        if !out.success() {
            return Err(StepError::Failed(format!("reading kubeadm's certificates: {}", out.stderr.trim())));
        }
        let now = crate::engine::state::now_ms() / 1000;
        let mut ends = BTreeMap::new();
        for c in super::certs::parse(t.host(), &out.stdout, now) {
            if !c.ca {
                let e = ends.entry(c.path).or_insert(c.not_after);
                *e = (*e).min(c.not_after);
            }
        }
        Ok(ends)
    }
}

impl Step for KubeadmLeafs {
    fn name(&self) -> &str {
        "kubeadm-certs-renewed"
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            let Some(before) = self.before else {
                return Ok(Check::Missing);
            };
            let ends = self.ends(t).await?;
            let holds = ends.values().all(|end| *end >= before);
            *self.read.lock().unwrap_or_else(|e| e.into_inner()) = ends;
            Ok(if holds { Check::Holds } else { Check::Missing })
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let due: Vec<String> = {
                let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
                read.iter()
                    .filter(|(_, end)| self.before.is_none_or(|b| **end < b))
                    .map(|(p, _)| p.clone())
                    .collect()
            };
            let out = t.run("kubeadm certs renew all", Duration::from_secs(120)).await?;
            if !out.success() {
                return Err(StepError::Failed(format!("kubeadm certs renew all failed: {}", out.stderr.trim())));
            }
            let ends = self.ends(t).await?;
            let soonest = ends.values().min().copied().map(super::certs::utc).unwrap_or_default();
            Ok(if due.is_empty() {
                format!("kubeadm's leafs renewed; the first now ends {soonest}")
            } else {
                format!(
                    "kubeadm's leafs renewed ({} were due); the first now ends {soonest}",
                    due.join(", ")
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::transport::CmdOutput;
    use crate::ops::fixture::Fixture;

    /// A certificate PEM ending `days` from now.
    fn pem(days: i64) -> anyhow::Result<String> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec!["x".into()])?;
        let (y, m, d) = pki::civil_date(crate::engine::state::now_ms() / 86_400_000 + days);
        params.not_after = rcgen::date_time_ymd(y as i32, m, d);
        Ok(params.self_signed(&key)?.pem())
    }

    /// Issue 29: without the cluster's PKI here, renew is refused. With
    /// 5-day leafs and kubeadm's ending in 10 days, a renewal within 30 days
    /// issues kubexm's again, puts the etcd member's before kubeadm's
    /// leafs are renewed and the static pods restarted, then fetches the
    /// admin kubeconfig; the workers get nothing (no registry client auth).
    #[test]
    fn renew_puts_etcd_first_then_kubeadm_then_the_kubeconfig() -> anyhow::Result<()> {
        let mut f = Fixture::installed()?;
        let o = RenewOptions {
            within_days: 30,
            all: false,
        };
        let err = renew(&f.session(crate::ops::fixture::CONFIG)?, &o).unwrap_err();
        assert!(format!("{err:#}").contains("has no PKI under"), "{err:#}");
        let session = f.session(crate::ops::fixture::CONFIG)?;
        let dir = crate::paths::cluster_pki(&session.settings().root, "s");
        let five = pki::Pki::Dir(dir.clone(), pki::Leaf { days: 5 });
        let topo = kubexm_bom::topology::Topology::of(session.cluster())?;
        crate::phases::etcd::member_files(&five, &topo, "a")?;
        crate::phases::registry::server_cert(&five, &topo, "a")?;
        let kubeadm = pem(10)?;
        f.connecting = Arc::new(crate::engine::fake::Connecting {
            script: Some(Arc::new(move |_, cmd: &str| {
                let (code, stdout) = if cmd.contains("client-certificate-data") {
                    (0, format!("==> /etc/kubernetes/pki/apiserver.crt\n{kubeadm}"))
                } else if cmd.contains("sha256sum") || cmd.ends_with("[ -z \"$(stale)\" ]\n") {
                    (1, String::new())
                } else {
                    (0, String::new())
                };
                Ok(CmdOutput {
                    code: Some(code),
                    stdout,
                    ..Default::default()
                })
            })),
            ..Default::default()
        });
        let session = f.session(crate::ops::fixture::CONFIG)?;
        let r = renew(&session, &o)?;
        let files: Vec<&str> = r.reissued.iter().map(|x| x.file.rsplit('/').next().unwrap_or(&x.file)).collect();
        assert_eq!(files, ["a-peer.crt", "a-server.crt", "client.crt", "a-registry.crt"], "{r}");
        assert!(
            r.reissued.iter().all(|x| x
                .now
                .starts_with(&(pki::civil_date(crate::engine::state::now_ms() / 86_400_000 + 365).0.to_string()))),
            "{r}"
        );
        let calls: Vec<String> = f.connecting.log.calls().into_iter().map(|(h, c)| format!("{h} {c}")).collect();
        let at = |what: &str| {
            calls
                .iter()
                .position(|c| c.contains(what))
                .unwrap_or_else(|| panic!("no {what}: {calls:#?}"))
        };
        assert!(at("a put /etc/kubexm/etcd/pki/server.crt") < at("a kubeadm certs renew all"));
        assert!(at("a kubeadm certs renew all") < at("cat /etc/kubernetes/admin.conf"));
        assert!(calls.iter().any(|c| c.starts_with("a ") && c.contains("restart\n")), "{calls:#?}");
        assert!(!calls.iter().any(|c| c.starts_with("b ") || c.starts_with("c ")), "{calls:#?}");
        for step in ["etcd-pki", "kubeadm-certs-renewed", "static-pods-restarted", "admin-kubeconfig"] {
            assert!(r.changed.iter().any(|c| c.starts_with(&format!("a: {step}: "))), "{step}: {r}");
        }
        Ok(())
    }

    /// The restart script is whole (every value filled) and its check only
    /// asks which pods are stale.
    #[test]
    fn the_restart_step_names_every_static_pod_and_its_files() -> anyhow::Result<()> {
        let s = restart_static_pods("https://10.0.0.1:6443")?;
        let check = s.check.clone().unwrap_or_default();
        assert!(check.ends_with("[ -z \"$(stale)\" ]\n"), "{check}");
        assert!(s.apply.ends_with("restart\n"), "{}", s.apply);
        for (pod, files) in STATIC_PODS {
            assert!(s.apply.contains(&format!("{pod}={}", files.join(","))), "{pod}");
        }
        assert!(!s.apply.contains("{{"), "{}", s.apply);
        assert_eq!(step_name("renew-etcd/renew-etcd-a/etcd-pki@a"), "etcd-pki");
        Ok(())
    }
}
