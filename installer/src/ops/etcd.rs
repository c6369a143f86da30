//! `kubexm-install etcd snapshot`: a snapshot of the cluster's etcd,
//! taken through a healthy member and copied to this machine, with its
//! sha256 and a sidecar naming the cluster, etcd's cluster ID and its
//! members; the newest `keep` are kept. One engine job (`etcd-snapshot`)
//! with one step on the first etcd member not named unreachable: it asks
//! every member's health, saves the snapshot from a healthy one into a
//! root-only directory on the host, copies it here (whole or not at all,
//! its sha256 checked against the host's) and removes it there.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::error::{OpError, op};
use super::session::Session;
use crate::engine::plan::{Check, Step, StepError};
use crate::engine::run;
use crate::engine::transport::{Transport, shell_quote};
use crate::paths::ETCD_PKI;

/// Where a member keeps a snapshot until it is copied (root only).
const REMOTE_DIR: &str = "/var/lib/kubexm/etcd-snapshots";

/// Snapshots kept unless told otherwise.
pub const KEEP: usize = 5;

/// What a snapshot is asked.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// Snapshots of this cluster kept in `dir` (the newest; at least 1).
    pub keep: usize,
    /// Where they go; `None`: `<root>/clusters/<name>/snapshots`.
    pub dir: Option<PathBuf>,
    /// Ends the file's name (`<cluster>-<stamp>-<label>.db`; letters,
    /// digits, `.` and `-`): a labelled snapshot is not pruned (the
    /// upgrade's restore point, `before-<version>`).
    pub label: Option<String>,
}

/// The sidecar of a snapshot (`<file>.json`): what restore checks first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    /// kubexm's name of the cluster.
    pub cluster: String,
    /// etcd's cluster ID (hex), as `etcdctl member list` gives it.
    pub cluster_id: String,
    /// Every member: `name` and ID (hex).
    pub members: Vec<Member>,
    /// The host it was taken through, and the member it was saved from.
    pub host: String,
    pub endpoint: String,
    /// Milliseconds since the epoch.
    pub taken: i64,
    pub sha256: String,
    pub size: u64,
    /// The sha256 of the cluster's etcd CA certificate (PEM) when it was
    /// taken: restore refuses a snapshot of a cluster with another CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_ca: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    pub id: String,
}

/// A snapshot taken.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    pub job: i64,
    pub file: PathBuf,
    pub info: SnapshotInfo,
    /// Older snapshots removed beyond `keep`.
    pub pruned: Vec<PathBuf>,
}

impl std::fmt::Display for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "etcd snapshot of cluster {} (etcd cluster {}, {} members) from {} via {} (job {}):",
            self.info.cluster,
            self.info.cluster_id,
            self.info.members.len(),
            self.info.endpoint,
            self.info.host,
            self.job
        )?;
        writeln!(
            f,
            "  {} ({} bytes, sha256 {})",
            self.file.display(),
            self.info.size,
            self.info.sha256
        )?;
        for p in &self.pruned {
            writeln!(f, "  removed the older {}", p.display())?;
        }
        Ok(())
    }
}

/// Takes a snapshot of the session's cluster.
pub fn snapshot(session: &Session, o: &SnapshotOptions) -> anyhow::Result<Snapshot> {
    let cluster = session.cluster();
    let name = cluster.metadata.name.clone();
    let topo = kubexm_bom::topology::Topology::of(cluster).map_err(|e| op(OpError::Config, anyhow::Error::from(e)))?;
    let members = &cluster.spec.role_groups.etcd;
    let Some(via) = members.iter().find(|m| !session.unreachable_hosts().contains(*m)).cloned() else {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "cluster {name} has no etcd member to take a snapshot through: roleGroups.etcd is empty{}",
                if members.is_empty() {
                    ""
                } else {
                    " once the hosts named --unreachable are left out; name fewer"
                }
            ),
        ));
    };
    let dir = o
        .dir
        .clone()
        .unwrap_or_else(|| session.settings().root.join("clusters").join(&name).join("snapshots"));
    // Snapshots hold every Secret of the cluster: the directory is the owner's only.
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| op(OpError::Io, anyhow::anyhow!("creating {}: {e}", dir.display())))?;
    }
    let now = super::super::engine::state::now_ms();
    let stamp = utc_stamp(now);
    let label = match o.label.as_deref() {
        Some(l) if !l.is_empty() && l.len() <= 64 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-') => {
            format!("-{l}")
        }
        Some(l) => return Err(anyhow::anyhow!("a snapshot label must be letters, digits, '.' and '-': {l:?}")),
        None => String::new(),
    };
    let file = dir.join(format!("{name}-{stamp}{label}.db"));
    let step = Arc::new(SaveSnapshot {
        name: format!("etcd-snapshot-{stamp}"),
        endpoints: members.iter().map(|m| format!("https://{}:2379", topo.address(m))).collect(),
        // Two snapshots in the same millisecond through one host: another process.
        remote: format!("{REMOTE_DIR}/{name}-{stamp}-{}.db", std::process::id()),
        local: file.clone(),
        taken: Mutex::new(None),
    });
    let s: Arc<dyn Step> = step.clone();
    // Other hosts that do not answer do not matter: only `via` works.
    let ex = session.execute("etcd-snapshot", run::Policy::ContinueOtherHosts, move |_| {
        Ok(crate::engine::jobs::one_task("etcd-snapshot", vec![via], vec![s]))
    })?;
    let Some(taken) = step.taken.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "the etcd snapshot failed (job {}):\n  {}\nname a dead member with --unreachable to take it through another",
                ex.job,
                ex.errors().join("\n  ")
            ),
        ));
    };
    let size = fs_err::metadata(&file).map_err(|e| op(OpError::Io, e))?.len();
    let info = SnapshotInfo {
        cluster: name.clone(),
        cluster_id: taken.cluster_id,
        members: taken.members,
        host: taken.host,
        endpoint: taken.endpoint,
        taken: now,
        sha256: taken.sha256,
        size,
        etcd_ca: fs_err::read(crate::paths::cluster_pki(&session.settings().root, &name).join("etcd/ca.crt"))
            .ok()
            .map(|pem| kubexm_bundle::digest::sha256_hex(&pem)),
    };
    let write = |path: PathBuf, bytes: Vec<u8>| {
        kubexm_bundle::files::write_atomic(&path, &bytes).map_err(|e| op(OpError::Io, anyhow::anyhow!("writing {}: {e}", path.display())))
    };
    let file_name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    write(sidecar(&file, "sha256"), format!("{}  {file_name}\n", info.sha256).into_bytes())?;
    write(sidecar(&file, "json"), serde_json::to_vec_pretty(&info)?)?;
    let pruned = prune(&dir, &name, o.keep.max(1))?;
    Ok(Snapshot {
        job: ex.job,
        file,
        info,
        pruned,
    })
}

/// `file` with `.ext` added (`x.db` → `x.db.json`).
pub(super) fn sidecar(file: &Path, ext: &str) -> PathBuf {
    let mut p = file.as_os_str().to_owned();
    p.push(format!(".{ext}"));
    p.into()
}

/// A copy older than this that never became whole (its process died) is removed.
const STALE_PARTIAL: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes `cluster`'s snapshots in `dir` beyond the newest `keep`, with
/// their sidecars, and copies of its that never became whole and are older
/// than an hour (a running copy is younger); the snapshots removed.
fn prune(dir: &Path, cluster: &str, keep: usize) -> anyhow::Result<Vec<PathBuf>> {
    let prefix = format!("{cluster}-");
    let named = |p: &Path, ext: &str| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(ext) && n.len() == prefix.len() + 20 + ext.len())
    };
    let entries: Vec<PathBuf> = fs_err::read_dir(dir)?.flatten().map(|e| e.path()).collect();
    // A partial file of a labelled snapshot (`<cluster>-<stamp>-<label>.db.partial`) too.
    let partial = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".db.partial"))
    };
    for p in entries.iter().filter(|p| partial(p)) {
        let age = fs_err::metadata(p)
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a > STALE_PARTIAL) {
            let _ = fs_err::remove_file(p);
        }
    }
    let mut found: Vec<PathBuf> = entries.into_iter().filter(|p| named(p, ".db")).collect();
    found.sort();
    let old = found.len().saturating_sub(keep);
    let mut removed = Vec::new();
    for p in found.into_iter().take(old) {
        for extra in [sidecar(&p, "sha256"), sidecar(&p, "json")] {
            let _ = fs_err::remove_file(extra);
        }
        fs_err::remove_file(&p)?;
        removed.push(p);
    }
    Ok(removed)
}

/// `YYYYmmddTHHMMSS.mmmZ` of `ms` since the epoch (UTC): names that sort by time.
pub(crate) fn utc_stamp(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        ms.rem_euclid(1000)
    )
}

/// What the step learnt.
struct Taken {
    host: String,
    endpoint: String,
    cluster_id: String,
    members: Vec<Member>,
    sha256: String,
}

/// Saves a snapshot from a healthy member and copies it to `local`.
struct SaveSnapshot {
    name: String,
    endpoints: Vec<String>,
    remote: String,
    local: PathBuf,
    taken: Mutex<Option<Taken>>,
}

impl SaveSnapshot {
    fn ctl(endpoints: &str) -> String {
        format!(
            "ETCDCTL_API=3 etcdctl --endpoints={} --cacert={ETCD_PKI}/ca.crt --cert={ETCD_PKI}/client.crt --key={ETCD_PKI}/client.key",
            shell_quote(endpoints)
        )
    }

    async fn run(&self, t: &dyn Transport) -> Result<String, StepError> {
        let fail = |what: &str, out: &crate::engine::transport::CmdOutput| {
            StepError::Failed(format!("{what}: {}{}", out.stdout.trim(), out.stderr.trim()))
        };
        let all = Self::ctl(&self.endpoints.join(","));
        let health = t
            .run(&format!("{all} endpoint health -w json 2>/dev/null; true"), Duration::from_secs(60))
            .await?;
        let healthy = healthy_endpoint(&health.stdout).ok_or_else(|| fail("no etcd member is healthy", &health))?;
        let members = t.run(&format!("{all} member list -w json"), Duration::from_secs(60)).await?;
        if !members.success() {
            return Err(fail("etcdctl member list", &members));
        }
        let (cluster_id, list) = member_list(&members.stdout).ok_or_else(|| fail("etcdctl member list: unreadable", &members))?;
        let one = Self::ctl(&healthy);
        let r = shell_quote(&self.remote);
        let saved = t
            .run(
                &format!("set -e; umask 077; mkdir -p {REMOTE_DIR}; {one} snapshot save {r} >/dev/null"),
                Duration::from_secs(600),
            )
            .await;
        let got = match saved {
            Ok(out) if out.success() => t.get_file(&self.remote, &self.local).await.map_err(StepError::from),
            Ok(out) => Err(fail("etcdctl snapshot save", &out)),
            Err(e) => Err(e.into()),
        };
        // Whatever happened, no copy of etcd stays on the host (etcdctl
        // writes `.part` first).
        let _ = t.run(&format!("rm -f {r} {r}.part"), Duration::from_secs(30)).await;
        let sha256 = got?;
        *self.taken.lock().unwrap_or_else(|e| e.into_inner()) = Some(Taken {
            host: t.host().to_string(),
            endpoint: healthy.clone(),
            cluster_id,
            members: list,
            sha256: sha256.clone(),
        });
        Ok(format!("snapshot from {healthy}: {} (sha256 {sha256})", self.local.display()))
    }
}

impl Step for SaveSnapshot {
    fn name(&self) -> &str {
        &self.name
    }
    fn check<'a>(&'a self, _: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async { Ok(Check::Missing) })
    }
    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(self.run(t))
    }
}

/// The first healthy endpoint in `etcdctl endpoint health -w json`.
fn healthy_endpoint(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json.trim()).ok()?;
    v.as_array()?
        .iter()
        .find(|e| e["health"].as_bool() == Some(true))
        .and_then(|e| e["endpoint"].as_str())
        .map(str::to_string)
}

/// etcd's cluster ID and members (hex IDs) from `etcdctl member list -w json`.
fn member_list(json: &str) -> Option<(String, Vec<Member>)> {
    let v: serde_json::Value = serde_json::from_str(json.trim()).ok()?;
    let id = v["header"]["cluster_id"].as_u64()?;
    let members = v["members"]
        .as_array()?
        .iter()
        .map(|m| Member {
            name: m["name"].as_str().unwrap_or_default().to_string(),
            id: format!("{:x}", m["ID"].as_u64().unwrap_or_default()),
        })
        .collect();
    Some((format!("{id:x}"), members))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_and_sort_by_time() {
        assert_eq!(utc_stamp(0), "19700101T000000.000Z");
        assert_eq!(utc_stamp(1_795_712_588_042), "20261126T170308.042Z");
        assert!(utc_stamp(1_000) < utc_stamp(1_001) && utc_stamp(1_999) < utc_stamp(60_000));
    }

    /// etcdctl's JSON: the healthy endpoint, the cluster ID and members in hex.
    #[test]
    fn etcdctl_answers_are_read() -> Result<(), Box<dyn std::error::Error>> {
        let health = r#"[{"endpoint":"https://10.0.0.2:2379","health":false,"error":"x"},{"endpoint":"https://10.0.0.3:2379","health":true,"took":"1ms"}]"#;
        assert_eq!(healthy_endpoint(health).as_deref(), Some("https://10.0.0.3:2379"));
        assert_eq!(healthy_endpoint("[]"), None);
        let list = r#"{"header":{"cluster_id":17237436991929493444,"member_id":1,"raft_term":2},"members":[{"ID":9372538179322589801,"name":"lab1","peerURLs":["https://10.0.0.1:2380"]}]}"#;
        let (id, members) = member_list(list).ok_or("unread")?;
        assert_eq!(id, "ef37ad9dc622a7c4");
        assert_eq!(
            members,
            [Member {
                name: "lab1".into(),
                id: "8211f1d0f64f3269".into()
            }]
        );
        Ok(())
    }

    /// The step asks every member's health, saves from the healthy one,
    /// copies the file here and removes it on the host; what it learnt is
    /// kept for the sidecar.
    #[tokio::test]
    async fn the_snapshot_is_saved_from_a_healthy_member_and_copied() -> Result<(), Box<dyn std::error::Error>> {
        use crate::engine::fake::{Fake, Log};
        use crate::engine::transport::CmdOutput;
        let dir = tempfile::tempdir()?;
        let log = Log::default();
        let answer = |out: &str| {
            Ok(CmdOutput {
                code: Some(0),
                stdout: out.to_string(),
                ..Default::default()
            })
        };
        let fake = Fake {
            host: "lab1".into(),
            script: std::sync::Arc::new(move |_, cmd: &str| {
                if cmd.contains("endpoint health") {
                    answer(r#"[{"endpoint":"https://10.0.0.2:2379","health":false},{"endpoint":"https://10.0.0.3:2379","health":true}]"#)
                } else if cmd.contains("member list") {
                    answer(r#"{"header":{"cluster_id":255},"members":[{"ID":16,"name":"lab2"},{"ID":17,"name":"lab3"}]}"#)
                } else if cmd.starts_with("get ") {
                    answer("SNAPSHOT")
                } else {
                    answer("")
                }
            }),
            log: log.clone(),
            latency: Duration::ZERO,
        };
        let step = SaveSnapshot {
            name: "s".into(),
            endpoints: vec!["https://10.0.0.2:2379".into(), "https://10.0.0.3:2379".into()],
            remote: format!("{REMOTE_DIR}/c-x.db"),
            local: dir.path().join("c-x.db"),
            taken: Mutex::new(None),
        };
        step.run(&fake).await?;
        assert_eq!(std::fs::read_to_string(dir.path().join("c-x.db"))?, "SNAPSHOT");
        let t = step.taken.lock().unwrap_or_else(|e| e.into_inner()).take().ok_or("nothing taken")?;
        assert_eq!(
            (t.endpoint.as_str(), t.cluster_id.as_str(), t.members.len()),
            ("https://10.0.0.3:2379", "ff", 2)
        );
        let calls: Vec<String> = log.calls().into_iter().map(|(_, c)| c).collect();
        let save = calls.iter().position(|c| c.contains("snapshot save")).ok_or("no save")?;
        assert!(calls[save].contains("--endpoints='https://10.0.0.3:2379'"), "{}", calls[save]);
        let got = calls.iter().position(|c| c.starts_with("get ")).ok_or("no copy")?;
        assert!(save < got && calls[got + 1].starts_with("rm -f "), "{calls:?}");
        Ok(())
    }

    /// Only this cluster's snapshots beyond the newest `keep` go, sidecars too.
    #[test]
    fn pruning_keeps_the_newest() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        for s in ["20260101T000000.000Z", "20260102T000000.000Z", "20260103T000000.000Z"] {
            std::fs::write(dir.path().join(format!("c-{s}.db")), s)?;
            std::fs::write(dir.path().join(format!("c-{s}.db.json")), s)?;
        }
        std::fs::write(dir.path().join("other-20250101T000000.000Z.db"), "x")?;
        // A copy that never became whole: removed once older than an hour.
        let stale = dir.path().join("c-20251231T000000.000Z.db.partial");
        let fresh = dir.path().join("c-20260104T000000.000Z.db.partial");
        std::fs::write(&stale, "x")?;
        std::fs::write(&fresh, "x")?;
        std::fs::File::options()
            .write(true)
            .open(&stale)?
            .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(7200))?;
        let removed = prune(dir.path(), "c", 2)?;
        assert_eq!(removed, [dir.path().join("c-20260101T000000.000Z.db")]);
        assert!(!stale.exists() && fresh.exists(), "only the stale partial copy goes");
        assert!(!dir.path().join("c-20260101T000000.000Z.db.json").exists());
        assert!(dir.path().join("c-20260102T000000.000Z.db").exists() && dir.path().join("other-20250101T000000.000Z.db").exists());
        Ok(())
    }
}
