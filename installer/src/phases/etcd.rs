//! The etcd phase, binary mode: per member our certificates, the binaries
//! for its arch and a systemd unit (and, with `etcd.backup`, a timer that
//! snapshots the member); then the whole cluster healthy over TLS.

use std::sync::Arc;
use std::time::Duration;

use crate::context::{Context, install_component};
use crate::engine::files::PutFiles;
use crate::engine::plan::{Module, Scope, Step, Task};
use crate::engine::steps::Shell;
use crate::pki;
use crate::template::render;

use crate::paths::ETCD_UNIT as ETCD_UNIT_PATH;
use crate::paths::{ETCD_BACKUP_SCRIPT, ETCD_BACKUP_SERVICE, ETCD_BACKUP_TIMER, ETCD_PKI};
const ETCD_UNIT: &str = include_str!("../../../manifests/templates/kubexm-etcd.service");
const BACKUP_SCRIPT: &str = include_str!("../../../manifests/templates/etcd-backup.sh");
const BACKUP_SERVICE: &str = include_str!("../../../manifests/templates/kubexm-etcd-backup.service");
const BACKUP_TIMER: &str = include_str!("../../../manifests/templates/kubexm-etcd-backup.timer");

/// A PKI file on a host: its path, content and mode.
pub type HostFile = (String, Vec<u8>, u32);

/// The etcd client files an API server uses: etcd's CA and the client pair.
pub fn client_files(pki: &pki::Pki) -> anyhow::Result<Vec<HostFile>> {
    let ca = pki.ca("etcd", "kubexm etcd CA")?;
    let client = pki.cert(&ca, "client", "kubexm-etcd-client", &[], pki::Usage::Client)?;
    Ok(vec![
        (format!("{ETCD_PKI}/ca.crt"), ca.cert_pem, 0o644),
        (format!("{ETCD_PKI}/client.crt"), client.cert_pem.into_bytes(), 0o644),
        (format!("{ETCD_PKI}/client.key"), client.key_pem.into_bytes(), 0o600),
    ])
}

/// The etcd PKI files of member `m`: the client files, and its server and
/// peer pairs for its name and address.
pub fn member_files(pki: &pki::Pki, topo: &kubexm_bom::topology::Topology, m: &str) -> anyhow::Result<Vec<HostFile>> {
    let ca = pki.ca("etcd", "kubexm etcd CA")?;
    let names = vec![m.to_string(), topo.address(m).to_string(), "127.0.0.1".into(), "localhost".into()];
    let server = pki.cert(&ca, &format!("{m}-server"), m, &names, pki::Usage::ServerAndClient)?;
    let peer = pki.cert(&ca, &format!("{m}-peer"), m, &names, pki::Usage::ServerAndClient)?;
    let mut files = client_files(pki)?;
    files.extend([
        (format!("{ETCD_PKI}/server.crt"), server.cert_pem.into_bytes(), 0o644),
        (format!("{ETCD_PKI}/server.key"), server.key_pem.into_bytes(), 0o600),
        (format!("{ETCD_PKI}/peer.crt"), peer.cert_pem.into_bytes(), 0o644),
        (format!("{ETCD_PKI}/peer.key"), peer.key_pem.into_bytes(), 0o600),
    ]);
    Ok(files)
}

/// etcd in binary mode: per member our certificates, the binaries for its
/// arch, a systemd unit; then the whole cluster healthy over TLS.
pub fn module(i: &Context) -> anyhow::Result<Module> {
    let members = i.cluster.spec.role_groups.etcd.clone();
    let initial: Vec<String> = members.iter().map(|m| format!("{m}=https://{}:2380", i.topo.address(m))).collect();
    let mut tasks = Vec::new();
    for m in &members {
        let addr = i.topo.address(m).to_string();
        let pki_files = member_files(i.pki, &i.topo, m)?;
        let arch = i.arch_of(m)?;
        let file = i.bundle_file(m, "etcd")?;
        let unit = render(
            "kubexm-etcd.service",
            ETCD_UNIT,
            &[
                ("NAME", m),
                ("ADDRESS", &addr),
                ("INITIAL_CLUSTER", &initial.join(",")),
                ("DATA_DIR", &i.cluster.spec.etcd.data_dir.display().to_string()),
                ("PKI", ETCD_PKI),
                ("UNSUPPORTED_ARCH", if arch == "amd64" { "" } else { arch }),
            ],
            &[],
        )?;
        let mut steps = install_component(file, i.bundle_dir, i.file_server);
        steps.push(Arc::new(PutFiles {
            name: "etcd-pki".into(),
            files: pki_files,
            then: None,
        }));
        steps.push(Arc::new(PutFiles {
            name: "etcd-unit".into(),
            files: vec![(ETCD_UNIT_PATH.into(), unit.into_bytes(), 0o644)],
            then: Some("systemctl daemon-reload && systemctl enable -q kubexm-etcd && systemctl restart --no-block kubexm-etcd".into()),
        }));
        // Started without waiting: a member is ready only once a quorum runs.
        steps.push(Arc::new(Shell::new(
            "etcd-start",
            Some(
                "systemctl is-enabled -q kubexm-etcd && systemctl show -p ActiveState --value kubexm-etcd | grep -Eqx 'active|activating'",
            ),
            "systemctl start --no-block kubexm-etcd",
        )));
        if let Some(b) = &i.cluster.spec.etcd.backup {
            steps.extend(backup(m, b)?);
        }
        tasks.push(Task {
            name: format!("etcd-{m}"),
            hosts: vec![m.clone()],
            steps,
            after: vec![],
        });
    }
    let health = healthy("etcd-healthy", &i.topo, &members);
    let after: Vec<(String, Scope)> = members.iter().map(|m| (format!("etcd-{m}"), Scope::AllHosts)).collect();
    if let Some(first) = members.first() {
        tasks.push(Task {
            name: "etcd-health".into(),
            hosts: vec![first.clone()],
            steps: vec![Arc::new(health)],
            after,
        });
    }
    Ok(Module {
        name: "etcd".into(),
        tasks,
    })
}

/// A step waiting (up to 120 s) until every one of `members` answers
/// `endpoint health` over TLS (checked first: a healthy cluster skips it).
pub fn healthy(name: &str, topo: &kubexm_bom::topology::Topology, members: &[String]) -> Shell {
    let endpoints: Vec<String> = members.iter().map(|m| format!("https://{}:2379", topo.address(m))).collect();
    let ctl = format!(
        "ETCDCTL_API=3 etcdctl --endpoints={} --cacert={ETCD_PKI}/ca.crt --cert={ETCD_PKI}/client.crt --key={ETCD_PKI}/client.key",
        endpoints.join(",")
    );
    Shell {
        name: name.into(),
        check: Some(format!("{ctl} endpoint health >/dev/null 2>&1")),
        apply: format!(
            "for i in $(seq 60); do {ctl} endpoint health 2>&1 && exit 0; sleep 2; done; {ctl} endpoint health; systemctl status kubexm-etcd --no-pager | tail -5; exit 1"
        ),
        timeout: Duration::from_secs(180),
    }
}

/// `etcd.backup` on member `m`: the snapshot script, its service and the
/// timer that runs it; then the timer enabled and running (checked on its
/// own: a timer stopped by hand is started again).
fn backup(m: &str, b: &kubexm_bom::config::model::EtcdBackup) -> anyhow::Result<Vec<Arc<dyn Step>>> {
    let keep = b.keep.to_string();
    let quote = crate::engine::transport::shell_quote;
    let dir = quote(&b.directory.display().to_string());
    let name = quote(m);
    let values = [
        ("NAME", m),
        ("NAME_Q", name.as_str()),
        ("DIR", dir.as_str()),
        ("KEEP", keep.as_str()),
        ("PKI", ETCD_PKI),
        ("SCRIPT", ETCD_BACKUP_SCRIPT),
        ("SCHEDULE", b.schedule.as_str()),
    ];
    let file = |name: &str, text: &str| render(name, text, &values, &[]).map(String::into_bytes);
    // The schedule's characters are checked by validation (it also goes into
    // the timer unit); what systemd makes of it, here, before the timer starts.
    let calendar = format!(
        "systemd-analyze calendar {s} >/dev/null 2>&1 || {{ echo etcd.backup.schedule {s} is not a calendar \
         expression systemd takes \\(systemd-analyze calendar\\) >&2; exit 1; }}",
        s = quote(&b.schedule)
    );
    let files = PutFiles {
        // Its check compares the files: other settings apply again.
        name: "etcd-backup".into(),
        files: vec![
            (ETCD_BACKUP_SCRIPT.into(), file("etcd-backup.sh", BACKUP_SCRIPT)?, 0o700),
            (
                ETCD_BACKUP_SERVICE.into(),
                file("kubexm-etcd-backup.service", BACKUP_SERVICE)?,
                0o644,
            ),
            (ETCD_BACKUP_TIMER.into(), file("kubexm-etcd-backup.timer", BACKUP_TIMER)?, 0o644),
        ],
        then: Some(format!(
            "{calendar}; systemctl daemon-reload && systemctl restart kubexm-etcd-backup.timer 2>/dev/null; true"
        )),
    };
    let timer = Shell::new(
        "etcd-backup-timer",
        Some("systemctl is-enabled -q kubexm-etcd-backup.timer && systemctl is-active -q kubexm-etcd-backup.timer"),
        &format!("{calendar}; systemctl daemon-reload && systemctl enable -q --now kubexm-etcd-backup.timer"),
    );
    Ok(vec![Arc::new(files), Arc::new(timer)])
}
