//! What an upgrade reads before it changes anything, in one `upgrade-check`
//! job that changes nothing: each node's kubelet and readiness from the API
//! server (on the first control-plane node), what every host's kubeadm,
//! etcd and containerd binaries say their versions are, and etcd's health
//! (through the first member that answered); and whether the cluster's last
//! upgrade did not finish.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use kubexm_bom::upgrade::NodeNow;

use super::super::error::{OpError, op};
use super::super::session::Session;
use crate::engine::plan::{Check, Step, StepError};
use crate::engine::run;
use crate::engine::transport::Transport;
use crate::paths::ADMIN_CONF;

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
pub(super) fn read_nodes(session: &Session, record: &kubexm_bom::record::ClusterRecord) -> anyhow::Result<(Vec<NodeNow>, Vec<Installed>)> {
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
            // Asked again for up to 2 minutes while the API server cannot
            // answer yet (a run killed mid-upgrade left its static pod restarting).
            let cmd = format!("kubectl --kubeconfig {ADMIN_CONF} get nodes -o json");
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            let out = loop {
                let out = t.run(&cmd, Duration::from_secs(60)).await?;
                if out.success() || !crate::waits::not_yet(&out.stderr) || std::time::Instant::now() >= deadline {
                    break out;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            };
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
