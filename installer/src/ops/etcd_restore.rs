//! `kubexm-install etcd restore --snapshot F --yes`: the cluster's etcd
//! back to a snapshot `etcd snapshot` took.
//!
//! Checked here first, before any host is touched: the snapshot's sidecar
//! (`F.json`) names this cluster, its etcd CA is this cluster's (when the
//! sidecar records it), and the file's sha256 and size are the sidecar's
//! (a damaged file exits 6, another cluster's 2). Every etcd member and
//! control-plane node must be reachable. Then one `etcd-restore` job,
//! fail-fast:
//!
//! 0. every member can restore (etcdutl, or an etcdctl before 3.5);
//! 1. every API server stopped (its static pod manifest moved aside to
//!    `/etc/kubernetes/kubexm-restore/`, its process stopped: 5 s, then
//!    killed);
//! 2. every etcd member stopped;
//! 3. on each member, the snapshot copied and restored into a new data
//!    directory with a new cluster token (`etcdutl`, or `etcdctl` before
//!    etcd 3.5), which then takes the data directory's place; the data
//!    before is kept beside it (`<dataDir>.before-restore-<stamp>`);
//! 4. every member started, the cluster waited for until healthy;
//! 5. every API server's manifest put back, each waited for until it
//!    answers, the controller manager and scheduler restarted (they cached
//!    the state before), then the nodes the install waits for until Ready.
//!
//! The copy on each member is checked against the sidecar's sha256 before
//! it is restored; where etcdutl can, the revision is bumped past every one
//! clients saw and those are marked compacted, so watches start over.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::error::{OpError, op};
use super::etcd::SnapshotInfo;
use super::session::Session;
use crate::engine::files::Upload;
use crate::engine::plan::{Pipeline, Scope, Step, Task};
use crate::engine::run;
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::template::render;

const RESTORE: &str = include_str!("../../../manifests/templates/etcd-restore.sh");

/// Where a member keeps the snapshot until it is restored (root only).
const REMOTE_DIR: &str = "/var/lib/kubexm/etcd-restore";
/// Where the API servers' manifests wait while etcd is restored.
const ASIDE: &str = "/etc/kubernetes/kubexm-restore";
const MANIFEST: &str = "/etc/kubernetes/manifests/kube-apiserver.yaml";
/// Where `etcd-servers` or `certs renew` leave its new manifest when
/// stopped half-way through a replacement (see `static-pod.sh`).
const NEW_MANIFEST: &str = "/etc/kubernetes/manifests/.kube-apiserver.yaml.kubexm";
/// How long the API servers and nodes may take to come back.
const BACK_WAIT: u64 = 300;

/// Sets `restore` to what restores a snapshot on this host (etcdutl;
/// etcdctl before etcd 3.5, whose etcdctl still restores), or fails saying
/// what is missing.
const TOOL: &str = "if command -v etcdutl >/dev/null 2>&1; then restore=etcdutl; \
    elif ETCDCTL_API=3 etcdctl snapshot --help 2>&1 | grep -q '^[[:space:]]*restore'; then restore='env ETCDCTL_API=3 etcdctl'; \
    else echo 'this etcd member has no etcdutl, and its etcdctl does not restore (etcd 3.6): copy etcdutl from the \
    etcd archive of the bundle (files/etcd/VERSION/ARCH/) into /usr/local/bin (installs since this release put it there), \
    then run the restore again' >&2; exit 1; fi";

/// The controller manager and scheduler of a node stopped (procps); the
/// kubelet starts them again.
const RESTART_CONTROLLERS: &str = "for c in kube-controller-manager kube-scheduler; do pkill -f \"^$c( |\\$)\" || true; done";

/// What a restore is asked.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The snapshot file (its sidecar is `<file>.json`).
    pub snapshot: PathBuf,
    /// Without it: the plan, nothing touched.
    pub yes: bool,
}

/// What a restore did, or would do.
#[derive(Debug)]
pub enum RestoreReport {
    NotConfirmed { plan: String, refusal: String },
    Restored(Box<Restored>),
}

/// A restore done.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Restored {
    pub cluster: String,
    pub job: i64,
    pub snapshot: PathBuf,
    pub info: SnapshotInfo,
    /// etcd's new cluster token.
    pub token: String,
    /// `host:path` of each member's data before the restore.
    pub kept: Vec<String>,
}

impl std::fmt::Display for Restored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "etcd of cluster {} restored from {} (taken {} through {}; job {}), cluster token {}",
            self.cluster,
            self.snapshot.display(),
            super::certs::utc(self.info.taken / 1000),
            self.info.host,
            self.job,
            self.token
        )?;
        writeln!(f, "  every API server and node is back; each member's data before is kept:")?;
        for k in &self.kept {
            writeln!(f, "    {k}")?;
        }
        Ok(())
    }
}

/// The sidecar of `file`, checked against the file and `session`'s cluster.
pub fn verify(session: &Session, file: &Path) -> anyhow::Result<SnapshotInfo> {
    let name = &session.cluster().metadata.name;
    let json = super::etcd::sidecar(file, "json");
    let text = fs_err::read_to_string(&json).map_err(|e| {
        op(
            OpError::Usage,
            anyhow::anyhow!("{e}: restore needs the sidecar `etcd snapshot` wrote beside the snapshot"),
        )
    })?;
    let info: SnapshotInfo =
        serde_json::from_str(&text).map_err(|e| op(OpError::Verify, anyhow::anyhow!("{}: not a snapshot sidecar: {e}", json.display())))?;
    if &info.cluster != name {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "{} is a snapshot of cluster {}, not of {name}: name one of {name}'s (under <root>/clusters/{name}/snapshots)",
                file.display(),
                info.cluster
            ),
        ));
    }
    let ca = crate::paths::cluster_pki(&session.settings().root, name).join("etcd/ca.crt");
    if let (Some(want), Ok(have)) = (&info.etcd_ca, fs_err::read(&ca))
        && *want != kubexm_bundle::digest::sha256_hex(&have)
    {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "{} was taken from a cluster named {name} whose etcd CA (sha256 {want}) is not this one's ({}): \
                 it is another cluster's snapshot; name one of this cluster's",
                file.display(),
                ca.display()
            ),
        ));
    }
    let (sha, size) = hash_file(file)?;
    if sha != info.sha256 || size != info.size {
        return Err(op(
            OpError::Verify,
            anyhow::anyhow!(
                "{}: sha256 {sha} ({size} bytes), but its sidecar says {} ({} bytes): the file is damaged; \
                 nothing was touched; restore another snapshot",
                file.display(),
                info.sha256,
                info.size
            ),
        ));
    }
    Ok(info)
}

/// The sha256 and size of a file, read as a stream.
fn hash_file(file: &Path) -> anyhow::Result<(String, u64)> {
    let f = fs_err::File::open(file).map_err(|e| op(OpError::Io, anyhow::Error::from(e)))?;
    let mut h = kubexm_bundle::digest::Hashing::new(f);
    std::io::copy(&mut h, &mut std::io::sink()).map_err(|e| op(OpError::Io, anyhow::anyhow!("reading {}: {e}", file.display())))?;
    let size = h.count();
    Ok((h.finish().0, size))
}

/// Restores the session's cluster's etcd from `o.snapshot`.
pub fn restore(session: &Session, o: &RestoreOptions) -> anyhow::Result<RestoreReport> {
    let cluster = session.cluster();
    let name = cluster.metadata.name.clone();
    if cluster.spec.etcd.mode != kubexm_bom::config::model::EtcdMode::Binary {
        return Err(op(
            OpError::Unsupported,
            anyhow::anyhow!("etcd restore runs the members kubexm runs (etcd mode binary): not supported yet for this mode"),
        ));
    }
    let info = verify(session, &o.snapshot)?;
    let g = &cluster.spec.role_groups;
    let needed: Vec<&String> = g.etcd.iter().chain(g.control_plane.iter()).collect();
    if let Some(h) = needed.iter().find(|h| session.unreachable_hosts().contains(**h)) {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("{h} is named unreachable: restore stops and restores every etcd member and API server; bring it back first"),
        ));
    }
    let topo = kubexm_bom::topology::Topology::of(cluster).map_err(|e| op(OpError::Config, anyhow::Error::from(e)))?;
    let stamp = super::etcd::utc_stamp(crate::engine::state::now_ms());
    let token = format!("kubexm-{name}-{}", stamp.to_lowercase().replace('.', ""));
    let pipeline = pipeline(session, &o.snapshot, &topo, &token, &stamp, &info.sha256)?;
    if !o.yes {
        return Ok(RestoreReport::NotConfirmed {
            plan: pipeline.plan()?.describe(),
            refusal: format!(
                "restore stops every API server and etcd member of cluster {name} and puts etcd back to {} (taken {}): \
                 what changed since is lost; nothing was touched. Pass --yes to do it",
                o.snapshot.display(),
                super::certs::utc(info.taken / 1000)
            ),
        });
    }
    let ex = session.execute("etcd-restore", run::Policy::FailFast, move |_| Ok(pipeline))?;
    if !ex.ok() {
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "etcd restore of cluster {name} stopped (job {}):\n  {}\nfix the cause and run it again (it starts over; \
                 each member's data before stays beside it); an API server's manifest waits in {ASIDE} on its node",
                ex.job,
                ex.errors().join("\n  ")
            ),
        ));
    }
    let data = cluster.spec.etcd.data_dir.display().to_string();
    Ok(RestoreReport::Restored(Box::new(Restored {
        cluster: name,
        job: ex.job,
        snapshot: o.snapshot.clone(),
        info,
        token,
        kept: g.etcd.iter().map(|m| format!("{m}:{data}.before-restore-{stamp}")).collect(),
    })))
}

/// The restore's modules, in order: API servers down, etcd down, members
/// restored, etcd up and healthy, API servers up, nodes Ready.
fn pipeline(
    session: &Session,
    snapshot: &Path,
    topo: &kubexm_bom::topology::Topology,
    token: &str,
    stamp: &str,
    sha256: &str,
) -> anyhow::Result<Pipeline> {
    let cluster = session.cluster();
    let g = &cluster.spec.role_groups;
    let after_all = |prefix: &str, hosts: &[String]| -> Vec<(String, Scope)> {
        hosts.iter().map(|h| (format!("{prefix}-{h}"), Scope::AllHosts)).collect()
    };
    let task = |name: &str, h: &str, steps: Vec<Arc<dyn Step>>, after: Vec<(String, Scope)>| Task {
        name: format!("{name}-{h}"),
        hosts: vec![h.to_string()],
        steps,
        after,
    };
    // One shell step named `name` on each of `hosts`, each after every task
    // of `after`.
    let on_each = |name: &str, hosts: &[String], cmd: &str, after: Vec<(String, Scope)>| -> Vec<Task> {
        hosts
            .iter()
            .map(|h| task(name, h, vec![Arc::new(Shell::new(name, None, cmd))], after.clone()))
            .collect()
    };
    // Its manifest aside (a new one left beside by a replacement stopped
    // half-way taken first), the kubelet stops the pod; the process (procps: its
    // command line starts with its name) gets 5 s for what it serves, then it
    // is killed (it would finish its watches for up to a minute, and nothing
    // may write to etcd while it is restored).
    let stop_api = format!(
        "set -e; mkdir -p {ASIDE}; \
         if [ ! -f {MANIFEST} ] && [ -f {NEW_MANIFEST} ]; then mv {NEW_MANIFEST} {MANIFEST}; fi; \
         if [ -f {MANIFEST} ]; then mv {MANIFEST} {ASIDE}/; fi; \
         pkill -f '^kube-apiserver( |$)' || true; \
         for i in $(seq 5); do pgrep -f '^kube-apiserver( |$)' >/dev/null || exit 0; sleep 1; done; \
         pkill -9 -f '^kube-apiserver( |$)' || true; \
         for i in $(seq 60); do pgrep -f '^kube-apiserver( |$)' >/dev/null || exit 0; sleep 1; done; \
         echo 'the API server still runs 65 s after its manifest was moved aside and it was killed' >&2; exit 1"
    );
    // Every member can restore before anything stops.
    let tools = on_each("restore-tool", &g.etcd, &format!("{TOOL}; echo \"restores with $restore\""), vec![]);
    let stop_apis = on_each("stop-api-server", &g.control_plane, &stop_api, after_all("restore-tool", &g.etcd));
    let stop_etcd = on_each(
        "stop-etcd",
        &g.etcd,
        "systemctl stop kubexm-etcd",
        after_all("stop-api-server", &g.control_plane),
    );
    let initial: Vec<String> = g.etcd.iter().map(|m| format!("{m}=https://{}:2380", topo.address(m))).collect();
    let file = snapshot.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let remote = format!("{REMOTE_DIR}/{file}");
    let data = cluster.spec.etcd.data_dir.display().to_string();
    let mut restores = Vec::new();
    for m in &g.etcd {
        let script = render(
            "etcd-restore.sh",
            RESTORE,
            &[
                ("NAME", m),
                ("SNAPSHOT", &q(&remote)),
                ("DATA_DIR", &q(&data)),
                ("INITIAL_CLUSTER", &q(&initial.join(","))),
                ("TOKEN", &q(token)),
                ("ADDRESS", topo.address(m)),
                ("STAMP", stamp),
                ("TOOL", TOOL),
                ("SHA256", sha256),
            ],
            &[],
        )?;
        let mut restore = Shell::new("etcd-restore", None, &script);
        restore.timeout = std::time::Duration::from_secs(600);
        let steps: Vec<Arc<dyn Step>> = vec![
            Arc::new(Shell::new("snapshot-dir", None, &format!("install -d -m 0700 {REMOTE_DIR}"))),
            Arc::new(Upload::new("snapshot-copy", snapshot, &remote, 0o600)?),
            Arc::new(restore),
        ];
        restores.push(task("restore-etcd", m, steps, after_all("stop-etcd", &g.etcd)));
    }
    let starts = on_each(
        "start-etcd",
        &g.etcd,
        "systemctl start --no-block kubexm-etcd",
        after_all("restore-etcd", &g.etcd),
    );
    let mut health = Vec::new();
    if let Some(first) = g.etcd.first() {
        let h = crate::phases::etcd::healthy("etcd-healthy", topo, &g.etcd);
        health.push(task("etcd-health", first, vec![Arc::new(h)], after_all("start-etcd", &g.etcd)));
    }
    let back = format!("set -e; if [ -f {ASIDE}/kube-apiserver.yaml ]; then mv {ASIDE}/kube-apiserver.yaml {MANIFEST}; fi");
    let mut apis = Vec::new();
    for h in &g.control_plane {
        let own = format!("https://{}:6443", topo.address(h));
        let steps: Vec<Arc<dyn Step>> = vec![
            Arc::new(Shell::new("start-api-server", None, &back)),
            crate::waits::wait(
                "api-server-ready",
                &format!("the API server on {h}"),
                &crate::waits::api_server(Some(&own)),
                BACK_WAIT,
            ),
            // They cached the state before: stopped, the kubelet starts them
            // again and they read it anew.
            Arc::new(Shell::new("controllers-restarted", None, RESTART_CONTROLLERS)),
        ];
        let after = health.iter().map(|t: &Task| (t.name.clone(), Scope::AllHosts)).collect();
        apis.push(task("start-api-server", h, steps, after));
    }
    let mut nodes = Vec::new();
    if let Some(first) = g.control_plane.first() {
        // The nodes the install waits for (`kubernetes.waitForWorkers`).
        let waited = crate::phases::addons::waited_nodes(cluster);
        let w = crate::waits::wait("nodes-ready", "the nodes", &crate::waits::nodes_ready(&waited), BACK_WAIT);
        nodes.push(task("nodes-ready", first, vec![w], after_all("start-api-server", &g.control_plane)));
    }
    Ok(Pipeline::of(
        "etcd-restore",
        vec![
            ("restore-tools", tools),
            ("stop-api-servers", stop_apis),
            ("stop-etcd", stop_etcd),
            ("restore-etcd", restores),
            ("start-etcd", starts),
            ("etcd-health", health),
            ("start-api-servers", apis),
            ("nodes-ready", nodes),
        ],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fixture::{CONFIG, Fixture};

    /// Issue 29: a snapshot is checked before anything is touched: its
    /// sidecar must name this cluster and its etcd CA, and the file must be
    /// the one the sidecar describes; without --yes, the plan only.
    #[test]
    fn a_snapshot_is_checked_before_any_host_is_touched() -> anyhow::Result<()> {
        let f = Fixture::installed()?;
        let session = f.session(CONFIG)?;
        let ca_dir = crate::paths::cluster_pki(&session.settings().root, "s").join("etcd");
        let ca = crate::pki::ensure_ca(&ca_dir, "kubexm etcd CA")?;
        let file = f.dir.path().join("s-20261127T000000.000Z.db");
        std::fs::write(&file, b"etcd snapshot bytes")?;
        let info = |cluster: &str, sha: &str, ca: &str| SnapshotInfo {
            cluster: cluster.into(),
            cluster_id: "ff".into(),
            members: vec![],
            host: "a".into(),
            endpoint: "https://10.0.0.1:2379".into(),
            taken: 0,
            sha256: sha.into(),
            size: 19,
            etcd_ca: Some(ca.into()),
        };
        let good_sha = kubexm_bundle::digest::sha256_hex(b"etcd snapshot bytes");
        let good_ca = kubexm_bundle::digest::sha256_hex(&std::fs::read(&ca.cert)?);
        let sidecar = super::super::etcd::sidecar(&file, "json");
        let before = f.connecting.log.calls().len();
        let refused = |i: &SnapshotInfo| -> anyhow::Result<String> {
            std::fs::write(&sidecar, serde_json::to_vec(i)?)?;
            let o = RestoreOptions {
                snapshot: file.clone(),
                yes: true,
            };
            Ok(format!(
                "{:#}",
                restore(&session, &o).err().ok_or_else(|| anyhow::anyhow!("accepted"))?
            ))
        };
        let other = refused(&info("other", &good_sha, &good_ca))?;
        assert!(other.contains("a snapshot of cluster other, not of s"), "{other}");
        let other_ca = refused(&info("s", &good_sha, &"0".repeat(64)))?;
        assert!(other_ca.contains("another cluster's snapshot"), "{other_ca}");
        let damaged = refused(&info("s", &"1".repeat(64), &good_ca))?;
        assert!(damaged.contains("the file is damaged"), "{damaged}");
        std::fs::write(&sidecar, serde_json::to_vec(&info("s", &good_sha, &good_ca))?)?;
        let o = RestoreOptions {
            snapshot: file.clone(),
            yes: false,
        };
        let RestoreReport::NotConfirmed { plan, refusal } = restore(&session, &o)? else {
            anyhow::bail!("restored without --yes");
        };
        assert!(refusal.contains("Pass --yes"), "{refusal}");
        for step in [
            "restore-tool",
            "stop-api-server",
            "stop-etcd",
            "etcd-restore",
            "start-etcd",
            "nodes-ready",
        ] {
            assert!(plan.contains(step), "{step}: {plan}");
        }
        assert_eq!(f.connecting.log.calls().len(), before, "a host was touched");
        Ok(())
    }
}
