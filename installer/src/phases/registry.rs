//! The registry phase: the bundle's registry as a systemd service on the
//! registry host.

use std::path::Path;
use std::sync::Arc;

use crate::context::{Context, HOST_CA};
use crate::engine::files::{PutFiles, Unless, Upload};
use crate::engine::plan::{Module, Step, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::pki;

use crate::paths::{HOST_BUNDLES, REGISTRY_CERT, REGISTRY_KEY, REGISTRY_UPLOAD as REMOTE_BUNDLE, ROOT};
use crate::paths::{HOST_INSTALLER, REGISTRY_UNIT};

/// The bundle's registry as a systemd service on the registry host: the
/// installer binary and the bundle (verified and unpacked there), TLS from
/// the installer's registry CA.
pub fn module(i: &Context) -> anyhow::Result<Module> {
    let host = i.registry()?.host.clone();
    let arch = i.arch_of(&host)?;
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
    let addr = i.topo.address(&host).to_string();
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
    let remote_dir = format!("{HOST_BUNDLES}/{id}");
    let unpacked = format!("test -f {remote_dir}/bundle.yaml");
    // The uploaded bundle is a temporary file: removed once unpacked.
    let upload = |name: &str, local: &Path, dest: &str| -> anyhow::Result<Arc<dyn Step>> {
        Ok(Arc::new(Unless {
            check: unpacked.clone(),
            inner: Arc::new(Upload::new(name, local, dest, 0o644)?),
        }))
    };
    let mut steps: Vec<Arc<dyn Step>> = vec![
        Arc::new(Upload::new("installer-binary", i.installer, HOST_INSTALLER, 0o755)?),
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
            "{HOST_INSTALLER} unpack --bundle {r} {trust} --root {ROOT} 2>&1 && rm -f {r} {r}.minisig",
            r = q(&remote)
        ),
    )));
    let unit = crate::registry_unit(HOST_INSTALLER, &remote_dir, &format!("0.0.0.0:{port}"), REGISTRY_CERT, REGISTRY_KEY)?;
    steps.push(Arc::new(PutFiles {
        name: "registry-service".into(),
        files: vec![
            (REGISTRY_CERT.into(), cert.cert_pem.into_bytes(), 0o644),
            (REGISTRY_KEY.into(), cert.key_pem.into_bytes(), 0o600),
            (REGISTRY_UNIT.into(), unit.into_bytes(), 0o644),
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
