//! Host facts, gathered with one command per host: OS, kernel, arch, CPU and
//! memory, listening ports, clock offset from the installer, SELinux and
//! firewall state, the cgroup version, which of curl and wget exist, and leftovers of earlier
//! Kubernetes, etcd, containerd or Docker installs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::transport::{Transport, TransportError};

const SCRIPT: &str = r#"
. /etc/os-release 2>/dev/null
echo "os_id=${ID:-unknown}"; echo "os_version=${VERSION_ID:-unknown}"; echo "os_codename=${VERSION_CODENAME:-unknown}"
echo "kernel=$(uname -r)"; echo "machine=$(uname -m)"; echo "hostname=$(hostname)"
echo "cpus=$(nproc 2>/dev/null || echo 0)"; echo "mem_kb=$(awk '/^MemTotal:/{print $2}' /proc/meminfo)"
echo "ports=$( (ss -Hltn 2>/dev/null || netstat -ltn 2>/dev/null | tail -n +3) | awk '{print $4}' | sed 's/.*://' | sort -un | tr '\n' ' ')"
echo "selinux=$(getenforce 2>/dev/null || echo absent)"
echo "firewall=$(for u in firewalld ufw nftables; do systemctl is-active -q $u 2>/dev/null && printf '%s ' $u; done)"
echo "curl=$(command -v curl)"; echo "wget=$(command -v wget)"
echo "leftovers=$(for p in /etc/kubernetes/manifests /etc/kubernetes/admin.conf /var/lib/etcd/member /var/lib/kubelet/config.yaml /etc/containerd/config.toml /var/lib/docker /usr/bin/dockerd /usr/local/bin/kubelet /usr/bin/kubelet; do [ -e $p ] && printf '%s ' $p; done)"
echo "managed=$(ls /var/lib/kubexm/installed 2>/dev/null | tr '\n' ' ')"
echo "uid=$(id -u)"
echo "cgroupfs=$(stat -fc %T /sys/fs/cgroup 2>/dev/null)"
echo "capbnd=$(awk '/^CapBnd:/{print $2}' /proc/self/status)"
echo "time_ms=$(date +%s%3N)"
"#;

/// What a host is.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HostFacts {
    pub host: String,
    pub os_id: String,
    pub os_version: String,
    /// `VERSION_CODENAME` of /etc/os-release (`bookworm`).
    pub os_codename: String,
    pub kernel: String,
    /// `amd64` or `arm64` (from `uname -m`; other machines are kept as reported).
    pub arch: String,
    pub hostname: String,
    pub cpus: u32,
    pub memory_mb: u64,
    pub ports: Vec<u16>,
    /// Host clock minus installer clock, in milliseconds (at the midpoint of the call).
    pub clock_offset_ms: i64,
    pub selinux: String,
    pub firewall: Vec<String>,
    pub has_curl: bool,
    pub has_wget: bool,
    pub leftovers: Vec<String>,
    /// Components kubexm installed on the host earlier (`/var/lib/kubexm/installed/`).
    pub managed: Vec<String>,
    /// The uid commands run as (0: root, directly or through sudo).
    pub uid: u32,
    /// 2 on a cgroup v2 (unified) host, 1 on cgroup v1 or hybrid, 0 unknown.
    pub cgroup_version: u8,
    /// Whether processes there may hold CAP_SYS_RESOURCE (lower OOM scores);
    /// false inside some containers and VMs.
    pub sys_resource: bool,
}

use crate::state::now_ms;

/// Gathers one host's facts.
pub async fn gather(t: &dyn Transport) -> Result<HostFacts, TransportError> {
    let before = now_ms();
    let out = t.run(SCRIPT, Duration::from_secs(30)).await?;
    let after = now_ms();
    if !out.success() {
        return Err(TransportError::Session {
            host: t.host().into(),
            why: format!("gathering facts failed: {}", out.stderr.trim()),
        });
    }
    Ok(parse(t.host(), &out.stdout, (before + after) / 2))
}

/// Parses the script's `key=value` lines.
pub fn parse(host: &str, text: &str, local_midpoint_ms: i64) -> HostFacts {
    let kv: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let get = |k: &str| kv.get(k).copied().unwrap_or_default().to_string();
    let list = |k: &str| {
        kv.get(k)
            .map(|v| v.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    HostFacts {
        host: host.into(),
        os_id: get("os_id"),
        os_version: get("os_version"),
        os_codename: get("os_codename"),
        kernel: get("kernel"),
        arch: match get("machine").as_str() {
            "x86_64" => "amd64".into(),
            "aarch64" | "arm64" => "arm64".into(),
            other => other.into(),
        },
        hostname: get("hostname"),
        cpus: get("cpus").parse().unwrap_or(0),
        memory_mb: get("mem_kb").parse::<u64>().unwrap_or(0) / 1024,
        ports: kv
            .get("ports")
            .map(|v| v.split_whitespace().filter_map(|p| p.parse().ok()).collect())
            .unwrap_or_default(),
        clock_offset_ms: get("time_ms").parse::<i64>().map(|t| t - local_midpoint_ms).unwrap_or(0),
        selinux: get("selinux"),
        firewall: list("firewall"),
        has_curl: !get("curl").is_empty(),
        has_wget: !get("wget").is_empty(),
        leftovers: list("leftovers"),
        managed: list("managed"),
        uid: get("uid").parse().unwrap_or(u32::MAX),
        // Bit 24 of the bounding set is CAP_SYS_RESOURCE; unknown counts as present.
        sys_resource: u64::from_str_radix(&get("capbnd"), 16).map_or(true, |b| b & (1 << 24) != 0),
        cgroup_version: match get("cgroupfs").as_str() {
            "cgroup2fs" => 2,
            "tmpfs" => 1,
            _ => 0,
        },
    }
}

/// A step that gathers facts into a shared map (so gathering is a recorded job).
pub struct GatherStep {
    pub out: std::sync::Arc<std::sync::Mutex<BTreeMap<String, HostFacts>>>,
}

impl crate::plan::Step for GatherStep {
    fn name(&self) -> &str {
        "facts"
    }

    fn check<'a>(
        &'a self,
        _t: &'a dyn Transport,
    ) -> futures_util::future::BoxFuture<'a, Result<crate::plan::Check, crate::plan::StepError>> {
        Box::pin(async { Ok(crate::plan::Check::Missing) })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> futures_util::future::BoxFuture<'a, Result<String, crate::plan::StepError>> {
        Box::pin(async move {
            let f = gather(t).await?;
            let line = format!(
                "{} {} {} {}, {} CPUs, {} MB",
                f.hostname, f.os_id, f.os_version, f.arch, f.cpus, f.memory_mb
            );
            self.out.lock().unwrap_or_else(|e| e.into_inner()).insert(f.host.clone(), f);
            Ok(line)
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_script_output() {
        let text = "os_id=debian\nos_version=12\nkernel=6.1.0\nmachine=aarch64\nhostname=lab3\ncpus=2\nmem_kb=2048000\nports=22 6443 \ncgroupfs=tmpfs\ncapbnd=000001fffeffffff\nselinux=absent\nfirewall=\ncurl=/usr/bin/curl\nwget=\nleftovers=/etc/kubernetes/manifests \ntime_ms=1000500\n";
        let f = super::parse("lab3", text, 1_000_000);
        assert_eq!((f.arch.as_str(), f.cpus, f.memory_mb, f.clock_offset_ms), ("arm64", 2, 2000, 500));
        assert_eq!(f.ports, [22, 6443]);
        assert!(f.has_curl && !f.has_wget);
        assert_eq!(f.leftovers, ["/etc/kubernetes/manifests"]);
        assert_eq!(f.cgroup_version, 1);
        assert!(!f.sys_resource, "bit 24 (CAP_SYS_RESOURCE) is clear in 000001fffeffffff");
    }
}
