//! The etcd phase, binary mode: per member our certificates, the binaries
//! for its arch, how it first joined (written once) and a systemd unit
//! (and, with `etcd.backup`, a timer that snapshots the member); then the
//! whole cluster healthy over TLS. In an apply, members the cluster's record
//! does not list join the running cluster one at a time
//! ([`crate::phases::etcd_members`]).

use std::sync::Arc;
use std::time::Duration;

use crate::context::{Context, install_component};
use crate::engine::files::{PutFiles, RunWith};
use crate::engine::plan::{Module, Scope, Step, Task};
use crate::engine::steps::Shell;
use crate::pki;
use crate::template::render;

use crate::paths::ETCD_UNIT as ETCD_UNIT_PATH;
use crate::paths::{ETCD_BACKUP_SCRIPT, ETCD_BACKUP_SERVICE, ETCD_BACKUP_TIMER, ETCD_INITIAL_ENV, ETCD_PKI};
use crate::phases::etcd_members;
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
/// arch, how it joins (written once), a systemd unit; then the whole cluster
/// healthy over TLS. In an apply, the members the record does not list join
/// the running cluster one at a time, after the others: each added as a
/// learner, started, promoted once it has caught up
/// ([`crate::phases::etcd_members`]).
pub fn module(i: &Context) -> anyhow::Result<Module> {
    let members = i.cluster.spec.role_groups.etcd.clone();
    let joining = i.etcd_joining();
    let joins = |m: &String| joining.contains(m);
    // A new cluster's members all start together, each listing all.
    let initial: Vec<String> = members
        .iter()
        .map(|m| format!("{m}={}", etcd_members::peer_url(&i.topo, m)))
        .collect();
    let initial = format!("KUBEXM_INITIAL_CLUSTER={}\nKUBEXM_INITIAL_CLUSTER_STATE=new\n", initial.join(","));
    let mut tasks = Vec::new();
    let mut cluster: Vec<String> = members.iter().filter(|m| !joins(m)).cloned().collect();
    let staying: Vec<(String, Scope)> = cluster.iter().map(|m| (format!("etcd-{m}"), Scope::AllHosts)).collect();
    let mut previous: Option<String> = None;
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
                ("INITIAL_ENV", ETCD_INITIAL_ENV),
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
        let join = if joins(m) {
            let j = etcd_members::join(&i.topo, m, &cluster)?;
            cluster.push(m.clone());
            steps.push(Arc::new(j.add));
            Some(j.promote)
        } else {
            steps.push(Arc::new(RunWith {
                name: "etcd-initial".into(),
                check: format!("test -s {ETCD_INITIAL_ENV}"),
                files: vec![(format!("{ETCD_INITIAL_ENV}.new"), initial.clone().into_bytes(), 0o600)],
                command: format!("mv -f {ETCD_INITIAL_ENV}.new {ETCD_INITIAL_ENV}"),
                timeout: Duration::from_secs(30),
            }));
            None
        };
        steps.push(Arc::new(PutFiles {
            name: "etcd-unit".into(),
            files: vec![(ETCD_UNIT_PATH.into(), unit.into_bytes(), 0o644)],
            then: Some(restart(i, m, &members)),
        }));
        // Started without waiting: a member is ready only once a quorum runs.
        steps.push(Arc::new(Shell::new(
            "etcd-start",
            Some(
                "systemctl is-enabled -q kubexm-etcd && systemctl show -p ActiveState --value kubexm-etcd | grep -Eqx 'active|activating'",
            ),
            "systemctl start --no-block kubexm-etcd",
        )));
        let after = match (&join, &previous) {
            (None, _) => vec![],
            // A joining member waits for the others, and for the one before.
            (Some(_), prev) => staying
                .iter()
                .cloned()
                .chain(prev.iter().map(|p| (p.clone(), Scope::AllHosts)))
                .collect(),
        };
        if let Some(promote) = join {
            steps.push(Arc::new(promote));
            previous = Some(format!("etcd-{m}"));
        }
        if let Some(b) = &i.cluster.spec.etcd.backup {
            steps.extend(backup(m, b)?);
        }
        tasks.push(Task {
            name: format!("etcd-{m}"),
            hosts: vec![m.clone()],
            steps,
            after,
        });
    }
    let health = healthy("etcd-healthy", &i.topo, &members);
    let after: Vec<(String, Scope)> = members.iter().map(|m| (format!("etcd-{m}"), Scope::AllHosts)).collect();
    if let Some(first) = members.first() {
        tasks.push(Task {
            name: HEALTH_TASK.into(),
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

/// What runs after member `m`'s unit is written: a member that is not
/// running yet (or has no data) is started without waiting (a new cluster's
/// members start together); a running member (its unit changed by another
/// kubexm) is restarted only once the others answer, the members one after
/// another (10 s apart by their place in the list), so the cluster keeps
/// its quorum.
fn restart(i: &Context, m: &str, members: &[String]) -> String {
    let data = crate::engine::transport::shell_quote(&i.cluster.spec.etcd.data_dir.display().to_string());
    let others: Vec<String> = members.iter().filter(|o| *o != m).cloned().collect();
    let place = members.iter().position(|o| o == m).unwrap_or_default();
    let start = "systemctl daemon-reload && systemctl enable -q kubexm-etcd";
    if others.is_empty() {
        return format!("{start} && systemctl restart --no-block kubexm-etcd");
    }
    let ctl = etcd_members::etcdctl(&etcd_members::client_urls(&i.topo, &others));
    format!(
        "{start} || exit 1; if [ -d {data}/member ] && systemctl is-active -q kubexm-etcd; then sleep {pause}; \
         for _ in $(seq 30); do {ctl} --command-timeout=3s endpoint health >/dev/null 2>&1 && break; sleep 1; done; \
         systemctl restart kubexm-etcd; else systemctl restart --no-block kubexm-etcd; fi",
        pause = place * 10
    )
}

/// The etcd phase's last task: every member healthy.
pub const HEALTH_TASK: &str = "etcd-health";

/// A step waiting (up to 120 s) until every one of `members` answers
/// `endpoint health` over TLS (checked first: a healthy cluster skips it).
pub fn healthy(name: &str, topo: &kubexm_bom::topology::Topology, members: &[String]) -> Shell {
    let ctl = etcd_members::etcdctl(&etcd_members::client_urls(topo, members));
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
