//! Deployment phases: each a module of idempotent steps the engine runs.
//!
//! Every phase of [`PHASES`] is built: preflight (facts-based refusals, the
//! registry CA, timezone and NTP), os-packages, the registry service, etcd in
//! binary mode (our PKI, systemd units, a healthy cluster), the loadbalancer
//! (modes A and D, in `endpoint`), containerd, the control plane and workers
//! (kubeadm, in `kubeadm`), the CNI and addons (in `addons`) and the
//! kubeconfig hand-over. This file assembles them into the install pipeline
//! with their ordering rules. Options a phase does not implement are refused
//! while planning with [`crate::DeployError::NotSupported`] (exit 8).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::Bom;
use kubexm_bom::config::Cluster;

pub use crate::context::{HOST_CA, Inputs, address_of, first_control_plane, install_component, registry_address, registry_host};
use crate::engine::facts::HostFacts;
use crate::engine::files::{PutFiles, RunWith, Unless, Upload};
use crate::engine::plan::{Module, Pipeline, Scope, Step, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::os_packages::{repo_for, roles_of};
use crate::pki;
use crate::template::render;

/// The phases, in order.
pub const PHASES: &[&str] = &[
    "preflight",
    "os-packages",
    "registry",
    "etcd",
    "loadbalancer",
    "containerd",
    "control-plane",
    "workers",
    "cni",
    "addons",
    "kubeconfig",
];
/// The phases this release implements.
pub const IMPLEMENTED: &[&str] = PHASES;

const ETCD_PKI: &str = "/etc/kubexm/etcd/pki";
const ETCD_UNIT: &str = include_str!("../../manifests/templates/kubexm-etcd.service");
const CONTAINERD_CONFIG: &str = include_str!("../../manifests/templates/containerd-config.toml");
const CONTAINERD_UNIT: &str = include_str!("../../manifests/templates/containerd.service");
/// Where the registry host keeps the installer and the bundle.
const REMOTE_BUNDLE: &str = "/var/lib/kubexm/upload";

/// The phases asked for, checked: unknown names are a usage error, known but
/// unimplemented ones are returned as the second list.
pub fn select(phases: &[String]) -> Result<(Vec<String>, Vec<String>), String> {
    let mut chosen = Vec::new();
    let mut missing = Vec::new();
    for p in phases {
        if !PHASES.contains(&p.as_str()) {
            return Err(format!("unknown phase `{p}`; phases are: {}", PHASES.join(", ")));
        }
        if IMPLEMENTED.contains(&p.as_str()) {
            chosen.push(p.clone());
        } else {
            missing.push(p.clone());
        }
    }
    Ok((chosen, missing))
}

/// What preflight refuses, one line per host and reason.
pub fn preflight(cluster: &Cluster, bom: &Bom, facts: &[HostFacts], phases: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut names: HashMap<&str, Vec<&str>> = HashMap::new();
    for f in facts {
        names.entry(f.hostname.as_str()).or_default().push(f.host.as_str());
    }
    for (hostname, hosts) in names.iter().filter(|(_, h)| h.len() > 1) {
        out.push(format!(
            "hosts {} share the hostname {hostname}; every node needs its own",
            hosts.join(", ")
        ));
    }
    let max_skew = i64::from(cluster.spec.preflight.max_clock_skew_seconds) * 1000;
    for f in facts {
        if f.os_id != "debian" && f.os_id != "ubuntu" {
            out.push(format!(
                "{}: OS {} {} is not supported (Debian-family hosts only)",
                f.host, f.os_id, f.os_version
            ));
        }
        if !bom.arches.contains(&f.arch) {
            out.push(format!(
                "{}: arch {} has no binaries in the bundle (it has {}); add it to bundle.arches and rebuild",
                f.host,
                f.arch,
                bom.arches.join(", ")
            ));
        }
        if f.clock_offset_ms.abs() > max_skew {
            out.push(format!(
                "{}: clock is {} ms off the installer's (limit {} s); fix NTP on the host",
                f.host,
                f.clock_offset_ms,
                max_skew / 1000
            ));
        }
        if phases.iter().any(|p| p == "os-packages")
            && !bom.os_repos.is_empty()
            && let Err(e) = repo_for(f, &bom.os_repos)
        {
            out.push(e);
        }
        // Leftovers of a Kubernetes install kubexm did not make (no kubexm stamps).
        if f.managed.is_empty()
            && !f.leftovers.is_empty()
            && cluster.spec.preflight.leftovers == kubexm_bom::config::model::LeftoverPolicy::Fail
        {
            out.push(format!(
                "{}: leftovers of an earlier install kubexm did not make: {}; remove them (kubeadm reset, or kubexm-install reset if it was kubexm), or set preflight.leftovers: warn",
                f.host,
                f.leftovers.join(" ")
            ));
        }
        let roles = roles_of(cluster, &f.host);
        if phases.iter().any(|p| p == "etcd") && roles.iter().any(|r| r == "etcd") && !f.managed.iter().any(|l| l == "etcd") {
            for port in [2379u16, 2380] {
                if f.ports.contains(&port) {
                    out.push(format!(
                        "{}: port {port} (etcd) is already in use by something kubexm did not install",
                        f.host
                    ));
                }
            }
        }
    }
    out.sort();
    out
}

/// The deployment pipeline for the chosen phases.
pub fn pipeline(i: &Inputs) -> anyhow::Result<Pipeline> {
    let hosts: Vec<String> = i.cluster.spec.hosts.iter().map(|h| h.name.clone()).collect();
    let mut modules = Vec::new();
    let has = |p: &str| i.phases.iter().any(|x| x == p);
    if has("preflight") {
        modules.push(Module {
            name: "preflight".into(),
            tasks: vec![Task {
                name: "trust-ca".into(),
                hosts: hosts.clone(),
                steps: vec![Arc::new(PutFiles {
                    name: "registry-ca".into(),
                    files: vec![(HOST_CA.into(), i.ca_pem.to_vec(), 0o644)],
                    then: None,
                })],
                after: vec![],
            }],
        });
    }
    if has("preflight") {
        let sys = &i.cluster.spec.system;
        let mut steps: Vec<Arc<dyn Step>> = Vec::new();
        if let Some(tz) = &sys.timezone {
            let zone = format!("/usr/share/zoneinfo/{tz}");
            steps.push(Arc::new(Shell::new(
                "timezone",
                Some(&format!(
                    "[ \"$(readlink -f /etc/localtime)\" = \"$(readlink -f {z})\" ]",
                    z = q(&zone)
                )),
                &format!(
                    "test -f {z} || {{ echo 'timezone {tz} is unknown on this host (no {zone})' >&2; exit 1; }}; \
                     ln -sf {z} /etc/localtime && echo {t} > /etc/timezone",
                    z = q(&zone),
                    t = q(tz)
                ),
            )));
        }
        if !sys.ntp_servers.is_empty() {
            let conf = format!(
                "# kubexm: time servers from cluster.yaml.\n[Time]\nNTP={}\n",
                sys.ntp_servers.join(" ")
            );
            steps.push(Arc::new(RunWith {
                name: "ntp".into(),
                check: format!(
                    "[ \"$(cat /etc/systemd/timesyncd.conf.d/kubexm.conf 2>/dev/null)\" = {} ]",
                    q(conf.trim_end())
                ),
                files: vec![("/etc/systemd/timesyncd.conf.d/kubexm.conf".into(), conf.clone().into_bytes(), 0o644)],
                command: "systemctl cat systemd-timesyncd >/dev/null 2>&1 || { echo 'no systemd-timesyncd to configure NTP with; add systemd-timesyncd to bundle.osPackages.extra' >&2; exit 1; }; \
                          systemctl enable -q systemd-timesyncd 2>/dev/null; systemctl restart systemd-timesyncd"
                    .into(),
                timeout: Duration::from_secs(60),
            }));
        }
        if !steps.is_empty() {
            modules[0].tasks.push(Task {
                name: "time".into(),
                hosts: hosts.clone(),
                steps,
                after: vec![],
            });
        }
    }
    if has("os-packages") && !i.bom.os_repos.is_empty() {
        let after: &[&str] = if has("preflight") { &["trust-ca"] } else { &[] };
        modules.push(crate::os_packages::module(
            i.cluster,
            &hosts,
            &i.bom.os_repos,
            i.file_server,
            Some(HOST_CA.into()),
            after,
        ));
    }
    if has("registry") {
        modules.push(registry_module(i)?);
    }
    if has("etcd") {
        modules.push(etcd_module(i)?);
    }
    if has("loadbalancer") {
        modules.push(crate::endpoint::module(i.cluster)?);
    }
    if has("containerd") {
        modules.push(containerd_module(i, &hosts, has("registry"))?);
    }
    if has("control-plane") || has("workers") {
        let k = crate::kubeadm::KubePki::ensure(i.pki)?;
        if has("control-plane") {
            modules.push(crate::kubeadm::control_plane_module(i, &k)?);
        }
        if has("workers") {
            modules.push(crate::kubeadm::workers_module(i, &k)?);
        }
    }
    let registry = registry_address(i.cluster).unwrap_or_default();
    for phase in ["cni", "addons"] {
        if has(phase) {
            modules.push(crate::addons::module(i, phase, &registry)?);
        }
    }
    if has("kubeconfig") {
        modules.push(crate::kubeadm::handover_module(i)?);
    }
    link(&mut modules);
    Ok(Pipeline {
        name: "install".into(),
        modules,
    })
}

/// Orders the phases: on each host a task waits for the earlier phases'
/// tasks on that host, and the cross-host gates hold (the control plane after
/// etcd's health and the loadbalancers, joins after init, the CNI and addons
/// after the control plane and workers).
fn link(modules: &mut [Module]) {
    // (module index, task, hosts) of every task, in phase order.
    let all: Vec<(usize, String, Vec<String>)> = modules
        .iter()
        .enumerate()
        .flat_map(|(k, m)| m.tasks.iter().map(move |t| (k, t.name.clone(), t.hosts.clone())))
        .collect();
    let names: Vec<String> = modules.iter().map(|m| m.name.clone()).collect();
    let gates: &[(&str, &[&str])] = &[
        ("control-plane", &["etcd", "loadbalancer", "registry"]),
        ("workers", &["control-plane", "registry"]),
        ("cni", &["control-plane", "workers"]),
        ("addons", &["control-plane", "workers", "cni"]),
        ("kubeconfig", &["control-plane", "workers", "cni", "addons"]),
    ];
    for (k, m) in modules.iter_mut().enumerate() {
        let cross: &[&str] = gates.iter().find(|(p, _)| *p == m.name).map(|(_, g)| *g).unwrap_or(&[]);
        for t in &mut m.tasks {
            for (j, task, hosts) in all.iter().filter(|(j, _, _)| *j < k) {
                if t.after.iter().any(|(a, _)| a == task) {
                    continue;
                }
                if cross.contains(&names[*j].as_str()) {
                    t.after.push((task.clone(), Scope::AllHosts));
                } else if hosts.iter().any(|h| t.hosts.contains(h)) {
                    t.after.push((task.clone(), Scope::SameHost));
                }
            }
        }
    }
}

/// etcd in binary mode: per member our certificates, the binaries for its
/// arch, a systemd unit; then the whole cluster healthy over TLS.
fn etcd_module(i: &Inputs) -> anyhow::Result<Module> {
    let members = i.cluster.spec.role_groups.etcd.clone();
    let ca = i.pki.ca("etcd", "kubexm etcd CA")?;
    let ca_pem = ca.cert_pem.clone();
    let initial: Vec<String> = members
        .iter()
        .map(|m| format!("{m}=https://{}:2380", address_of(i.cluster, m)))
        .collect();
    let client = i.pki.cert(&ca, "client", "kubexm-etcd-client", &[], pki::Usage::Client)?;
    let mut tasks = Vec::new();
    for m in &members {
        let addr = address_of(i.cluster, m);
        let names = vec![m.clone(), addr.clone(), "127.0.0.1".into(), "localhost".into()];
        let server = i.pki.cert(&ca, &format!("{m}-server"), m, &names, pki::Usage::ServerAndClient)?;
        let peer = i.pki.cert(&ca, &format!("{m}-peer"), m, &names, pki::Usage::ServerAndClient)?;
        let arch = i.arch_of(m);
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
                ("UNSUPPORTED_ARCH", if arch == "amd64" { "" } else { &arch }),
            ],
            &[],
        )?;
        let mut steps = install_component(file, i.bundle_dir, i.file_server);
        steps.push(Arc::new(PutFiles {
            name: "etcd-pki".into(),
            files: vec![
                (format!("{ETCD_PKI}/ca.crt"), ca_pem.clone(), 0o644),
                (format!("{ETCD_PKI}/server.crt"), server.cert_pem.clone().into_bytes(), 0o644),
                (format!("{ETCD_PKI}/server.key"), server.key_pem.clone().into_bytes(), 0o600),
                (format!("{ETCD_PKI}/peer.crt"), peer.cert_pem.clone().into_bytes(), 0o644),
                (format!("{ETCD_PKI}/peer.key"), peer.key_pem.clone().into_bytes(), 0o600),
                (format!("{ETCD_PKI}/client.crt"), client.cert_pem.clone().into_bytes(), 0o644),
                (format!("{ETCD_PKI}/client.key"), client.key_pem.clone().into_bytes(), 0o600),
            ],
            then: None,
        }));
        steps.push(Arc::new(PutFiles {
            name: "etcd-unit".into(),
            files: vec![("/etc/systemd/system/kubexm-etcd.service".into(), unit.into_bytes(), 0o644)],
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
        tasks.push(Task {
            name: format!("etcd-{m}"),
            hosts: vec![m.clone()],
            steps,
            after: vec![],
        });
    }
    let endpoints: Vec<String> = members
        .iter()
        .map(|m| format!("https://{}:2379", address_of(i.cluster, m)))
        .collect();
    let ctl = format!(
        "ETCDCTL_API=3 etcdctl --endpoints={} --cacert={ETCD_PKI}/ca.crt --cert={ETCD_PKI}/client.crt --key={ETCD_PKI}/client.key",
        endpoints.join(",")
    );
    let health = Shell {
        name: "etcd-healthy".into(),
        check: Some(format!("{ctl} endpoint health >/dev/null 2>&1")),
        apply: format!(
            "for i in $(seq 60); do {ctl} endpoint health 2>&1 && exit 0; sleep 2; done; {ctl} endpoint health; systemctl status kubexm-etcd --no-pager | tail -5; exit 1"
        ),
        timeout: Duration::from_secs(180),
    };
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

/// The bundle's registry as a systemd service on the registry host: the
/// installer binary and the bundle (verified and unpacked there), TLS from
/// the installer's registry CA.
fn registry_module(i: &Inputs) -> anyhow::Result<Module> {
    let host = registry_host(i.cluster)
        .ok_or_else(|| crate::DeployError::Config("no registry host: set roleGroups.registry or control-plane".into()))?;
    let arch = i.arches.get(&host).cloned().unwrap_or_default();
    let mine = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    if arch != mine {
        return Err(crate::DeployError::Config(format!(
            "registry host {host} is {arch}, but this installer is {mine}: it runs the registry there; \
             set roleGroups.registry to a {mine} host"
        ))
        .into());
    }
    let addr = address_of(i.cluster, &host);
    let port = i.cluster.spec.registry.port;
    let ca = i.pki.ca("registry", "kubexm registry CA")?;
    let cert = i.pki.cert(
        &ca,
        &format!("{host}-registry"),
        &host,
        &[addr.clone(), host.clone()],
        pki::Usage::Server,
    )?;
    let bundle_name = i
        .bundle
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bundle.tar.zst".into());
    let remote = format!("{REMOTE_BUNDLE}/{bundle_name}");
    let id = i
        .bundle_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let remote_dir = format!("/var/lib/kubexm/bundles/{id}");
    let unpacked = format!("test -f {remote_dir}/bundle.yaml");
    // The uploaded bundle is a temporary file: removed once unpacked.
    let upload = |name: &str, local: &Path, dest: &str| -> anyhow::Result<Arc<dyn Step>> {
        Ok(Arc::new(Unless {
            check: unpacked.clone(),
            inner: Arc::new(Upload::new(name, local, dest, 0o644)?),
        }))
    };
    let mut steps: Vec<Arc<dyn Step>> = vec![
        Arc::new(Upload::new(
            "installer-binary",
            i.installer,
            "/usr/local/bin/kubexm-install",
            0o755,
        )?),
        upload("bundle", i.bundle, &remote)?,
    ];
    let trust = match i.pubkey {
        Some(k) => {
            let sig = std::path::PathBuf::from(format!("{}.minisig", i.bundle.display()));
            steps.push(upload("bundle-signature", &sig, &format!("{remote}.minisig"))?);
            steps.push(upload("bundle-pubkey", k, &format!("{REMOTE_BUNDLE}/bundle.pub"))?);
            format!("--pubkey {REMOTE_BUNDLE}/bundle.pub")
        }
        None => "--allow-unsigned".into(),
    };
    steps.push(Arc::new(Shell::new(
        "bundle-unpack",
        Some(&unpacked),
        &format!(
            "/usr/local/bin/kubexm-install unpack --bundle {r} {trust} --root /var/lib/kubexm 2>&1 && rm -f {r} {r}.minisig",
            r = q(&remote)
        ),
    )));
    let unit = crate::registry_unit(
        "/usr/local/bin/kubexm-install",
        &remote_dir,
        &format!("0.0.0.0:{port}"),
        "/etc/kubexm/pki/registry.crt",
        "/etc/kubexm/pki/registry.key",
    )?;
    steps.push(Arc::new(PutFiles {
        name: "registry-service".into(),
        files: vec![
            ("/etc/kubexm/pki/registry.crt".into(), cert.cert_pem.into_bytes(), 0o644),
            ("/etc/kubexm/pki/registry.key".into(), cert.key_pem.into_bytes(), 0o600),
            ("/etc/systemd/system/kubexm-registry.service".into(), unit.into_bytes(), 0o644),
        ],
        then: Some("systemctl daemon-reload && systemctl enable -q kubexm-registry && systemctl restart kubexm-registry".into()),
    }));
    let probe = format!("curl -sf --cacert {HOST_CA} https://{addr}:{port}/v2/ >/dev/null");
    steps.push(Arc::new(Shell::new(
        "registry-ready",
        Some(&probe),
        &format!("systemctl start kubexm-registry; for i in $(seq 30); do {probe} && exit 0; sleep 1; done; systemctl status kubexm-registry --no-pager | tail -5; exit 1"),
    )));
    Ok(Module {
        name: "registry".into(),
        tasks: vec![Task {
            name: "registry".into(),
            hosts: vec![host],
            steps,
            after: vec![],
        }],
    })
}

/// containerd on every node from the bundle's binaries for its arch, with
/// runc, crictl and the CNI plugins; `config.toml` with `config_path`, a
/// `hosts.toml` per upstream registry pointing at the bundle's registry, the
/// sandbox image from the bundle, and a systemd unit.
fn containerd_module(i: &Inputs, hosts: &[String], after_registry: bool) -> anyhow::Result<Module> {
    if i.cluster.spec.registry.mode != kubexm_bom::config::model::RegistryMode::Local {
        return Err(crate::DeployError::NotSupported(
            "registry.mode external (the containerd phase needs the bundle's registry; mirror with `kubexm-install mirror` meanwhile)"
                .into(),
        )
        .into());
    }
    let registry = registry_address(i.cluster).ok_or_else(|| anyhow::anyhow!("no registry host"))?;
    let target = crate::hosts::Target {
        registry: registry.clone(),
        prefix: None,
        flatten: false,
        ca: Some(HOST_CA.into()),
        plain_http: false,
    };
    let upstreams: std::collections::BTreeSet<String> = i.bom.images.iter().map(|im| im.reference.registry.clone()).collect();
    let mut files: Vec<(String, Vec<u8>, u32)> = upstreams
        .iter()
        .map(|u| {
            (
                format!("/etc/containerd/certs.d/{u}/hosts.toml"),
                crate::hosts::render(u, &target).into_bytes(),
                0o644,
            )
        })
        .collect();
    // The registry itself, for manifests whose images were rewritten to it.
    files.push((
        format!("/etc/containerd/certs.d/{registry}/hosts.toml"),
        format!(
            "# Written by kubexm: the kubexm registry, trusted by its CA.\nserver = \"https://{registry}\"\n\n[host.\"https://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{HOST_CA}\"\n"
        )
        .into_bytes(),
        0o644,
    ));
    let sandbox = i
        .bom
        .images
        .iter()
        .find(|im| im.reference.repository.ends_with("/pause") || im.reference.repository == "pause")
        .map(|im| im.reference.to_string())
        .ok_or_else(|| anyhow::anyhow!("the bundle has no pause image for the sandbox"))?;
    let version = i
        .bom
        .files
        .iter()
        .find(|f| f.component == "containerd")
        .map(|f| f.version.clone())
        .unwrap_or_default();
    files.push((
        "/etc/containerd/config.toml".into(),
        render(
            "containerd-config.toml",
            CONTAINERD_CONFIG,
            &[("SANDBOX_IMAGE", &sandbox), ("VERSION", &version)],
            &[],
        )?
        .into_bytes(),
        0o644,
    ));
    files.push((
        "/etc/systemd/system/containerd.service".into(),
        CONTAINERD_UNIT.as_bytes().to_vec(),
        0o644,
    ));
    let mut tasks = Vec::new();
    for h in hosts {
        let mut steps: Vec<Arc<dyn Step>> = Vec::new();
        for component in ["runc", "cni-plugins", "crictl", "containerd"] {
            let file = i.bundle_file(h, component)?;
            steps.extend(install_component(file, i.bundle_dir, i.file_server));
        }
        steps.push(Arc::new(PutFiles {
            name: "containerd-config".into(),
            files: files.clone(),
            then: Some("systemctl daemon-reload && systemctl enable -q containerd && systemctl restart containerd".into()),
        }));
        steps.push(Arc::new(Shell::new(
            "containerd-running",
            Some("systemctl is-active -q containerd"),
            "systemctl start containerd",
        )));
        tasks.push(Task {
            name: format!("containerd-{h}"),
            hosts: vec![h.clone()],
            steps,
            after: if after_registry {
                vec![("registry".into(), Scope::AllHosts)]
            } else {
                vec![]
            },
        });
    }
    Ok(Module {
        name: "containerd".into(),
        tasks,
    })
}

const RESET: &str = include_str!("../../manifests/templates/reset.sh");

/// `reset`: every host back to before kubexm (packages stay).
pub fn reset_pipeline(cluster: &Cluster) -> Result<Pipeline, crate::template::Unfilled> {
    let data = q(&cluster.spec.etcd.data_dir.display().to_string());
    let leftovers = format!(
        "for p in /etc/kubexm /var/lib/kubexm /etc/kubernetes /etc/containerd /usr/local/bin/kubelet /usr/local/bin/etcd \
         /etc/systemd/system/kubexm-etcd.service /etc/systemd/system/kubelet.service {data}; do [ -e \"$p\" ] && exit 1; done; \
         ! grep -q '# kubexm control-plane endpoint' /etc/hosts"
    );
    let mut step = Shell::new("reset", Some(&leftovers), &render("reset.sh", RESET, &[("ETCD_DATA", &data)], &[])?);
    step.timeout = Duration::from_secs(300);
    let step: Arc<dyn Step> = Arc::new(step);
    Ok(Pipeline {
        name: "reset".into(),
        modules: vec![Module {
            name: "reset".into(),
            tasks: vec![Task {
                name: "reset".into(),
                hosts: cluster.spec.hosts.iter().map(|h| h.name.clone()).collect(),
                steps: vec![step],
                after: vec![],
            }],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_selected_and_unknown_ones_refused() -> Result<(), Box<dyn std::error::Error>> {
        let (ok, missing) = select(&["preflight".into(), "etcd".into(), "cni".into()])?;
        assert_eq!(ok, ["preflight", "etcd", "cni"]);
        assert!(missing.is_empty());
        assert!(select(&["etdc".into()]).unwrap_err().contains("unknown phase `etdc`"));
        Ok(())
    }

    #[test]
    fn preflight_names_each_host_and_reason() -> Result<(), Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(format!("{}/../examples/ha.yaml", env!("CARGO_MANIFEST_DIR")))?;
        let catalog = kubexm_bom::catalog::Catalog::builtin()?;
        let cluster = kubexm_bom::config::load_str(&text, "ha.yaml", &catalog)?;
        let bom = Bom {
            arches: vec!["amd64".into()],
            ..Default::default()
        };
        let host = |name: &str, hostname: &str, arch: &str, skew: i64, ports: Vec<u16>| HostFacts {
            host: name.into(),
            hostname: hostname.into(),
            os_id: "debian".into(),
            arch: arch.into(),
            clock_offset_ms: skew,
            ports,
            ..Default::default()
        };
        let etcd = cluster.spec.role_groups.etcd[0].clone();
        let facts = [
            host("a", "same", "amd64", 0, vec![]),
            host("b", "same", "arm64", 0, vec![]),
            host("c", "c", "amd64", 600_000, vec![]),
            host(&etcd, &etcd, "amd64", 0, vec![2379]),
            HostFacts {
                leftovers: vec!["/etc/kubernetes/manifests".into()],
                ..host("d", "d", "amd64", 0, vec![])
            },
        ];
        let r = preflight(&cluster, &bom, &facts, &["preflight".into(), "etcd".into()]);
        let all = r.join("\n");
        assert!(all.contains("hosts a, b share the hostname same"), "{all}");
        assert!(all.contains("b: arch arm64 has no binaries in the bundle"), "{all}");
        assert!(all.contains("c: clock is 600000 ms off"), "{all}");
        assert!(all.contains(&format!("{etcd}: port 2379 (etcd) is already in use")), "{all}");
        assert!(
            all.contains("d: leftovers of an earlier install kubexm did not make: /etc/kubernetes/manifests"),
            "{all}"
        );
        Ok(())
    }
}
