//! The registry phase: the bundle's registry as a systemd service on the
//! registry host.

use std::path::Path;
use std::sync::Arc;

use crate::context::{Context, HOST_CA};
use crate::engine::files::{PutFiles, Unless, Upload};
use crate::engine::plan::{Module, Scope, Step, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::pki;

use crate::paths::{HOST_BUNDLES, REGISTRY_CERT, REGISTRY_KEY, REGISTRY_UPLOAD as REMOTE_BUNDLE, ROOT};
use crate::paths::{HOST_INSTALLER, REGISTRY_CLIENT_CA, REGISTRY_CLIENT_CERT, REGISTRY_CLIENT_KEY, REGISTRY_UNIT};

/// The bundle's registry as a systemd service on the registry host: the
/// installer binary and the bundle (verified and unpacked there), TLS from
/// the installer's registry CA.
pub fn module(i: &Context) -> anyhow::Result<Module> {
    serving(i, &[])
}

/// [`module`], the registry serving below the bundle the older ones
/// `older` names (their directory names on the host, the sha256 of their
/// `bundle.yaml`, unpacked there by the installs before): an upgrade's hop.
pub fn serving(i: &Context, older: &[String]) -> anyhow::Result<Module> {
    let host = i.registry()?.host.clone();
    let arch = i.arch_of(&host)?;
    let mine = crate::installer_arch();
    if arch != mine {
        return Err(crate::DeployError::Config(format!(
            "registry host {host} is {arch}, but this installer is {mine}: it runs the registry there; \
             set roleGroups.registry to a {mine} host"
        ))
        .into());
    }
    let addr = i.topo.address(&host).to_string();
    let port = i.cluster.spec.registry.port;
    let cert = server_cert(i.pki, &i.topo, &host)?;
    let bundle_name = i
        .bundle
        .and_then(Path::file_name)
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
    let mut steps: Vec<Arc<dyn Step>> = vec![Arc::new(Upload::new("installer-binary", i.installer, HOST_INSTALLER, 0o755)?)];
    steps.extend(bundle_steps(i, &unpacked, &remote, &id)?);
    // The service runs as a dynamic user (never root): the bundle must be
    // readable by any user, and the directories above it traversable.
    let readable = format!("runuser -u nobody -- test -r {dir}/bundle.yaml", dir = q(&remote_dir));
    steps.push(Arc::new(Shell::new(
        "bundle-readable",
        Some(&readable),
        &format!("chmod o+x {ROOT} {HOST_BUNDLES} && chmod -R o+rX {}", q(&remote_dir)),
    )));
    // The service would not start without them: said before its unit changes.
    for id in older {
        let dir = format!("{HOST_BUNDLES}/{id}");
        steps.push(Arc::new(Shell::new(
            "older-bundle-unpacked",
            Some(&format!("test -f {}/bundle.yaml", q(&dir))),
            &format!(
                "echo \"the registry host has no unpacked bundle {id} (under {HOST_BUNDLES}), the one the cluster runs now: \
                 unpack it there (kubexm-install unpack --bundle FILE --root {ROOT}) and run the upgrade again\" >&2; exit 1"
            ),
        )));
    }
    let client_auth = i.cluster.spec.registry.client_auth;
    let limits = crate::serve::ConnectionLimits::for_nodes(&i.topo);
    let unit = crate::registry_unit(&crate::RegistryService {
        binary: HOST_INSTALLER,
        bundle_dir: &remote_dir,
        // The address the nodes use; a host known by name only (no
        // internalAddress) listens on every address, as before.
        listen: &std::net::SocketAddr::new(addr.parse().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()), port).to_string(),
        cert: REGISTRY_CERT,
        key: REGISTRY_KEY,
        client_ca: client_auth.then_some(REGISTRY_CLIENT_CA),
        limits: &limits,
        older: &older.iter().map(|id| format!("{HOST_BUNDLES}/{id}")).collect::<Vec<_>>(),
    })?;
    let mut files = vec![
        (REGISTRY_CERT.into(), cert.cert_pem.into_bytes(), 0o644),
        (REGISTRY_KEY.into(), cert.key_pem.into_bytes(), 0o600),
        (REGISTRY_UNIT.into(), unit.into_bytes(), 0o644),
    ];
    // The probe below authenticates as this host, with the certificate the
    // containerd phase gives it too.
    let mut probe_auth = String::new();
    if let Some(c) = client_cert(i.pki, i.cluster, &host)? {
        files.push((REGISTRY_CLIENT_CA.into(), i.ca_pem.to_vec(), 0o644));
        files.push((REGISTRY_CLIENT_CERT.into(), c.cert_pem.into_bytes(), 0o644));
        files.push((REGISTRY_CLIENT_KEY.into(), c.key_pem.into_bytes(), 0o600));
        probe_auth = format!(" --cert {REGISTRY_CLIENT_CERT} --key {REGISTRY_CLIENT_KEY}");
    }
    steps.push(Arc::new(PutFiles {
        name: "registry-service".into(),
        files,
        then: Some("systemctl daemon-reload && systemctl enable -q kubexm-registry && systemctl restart kubexm-registry".into()),
    }));
    let probe = format!("curl -sf --cacert {HOST_CA}{probe_auth} https://{addr}:{port}/v2/ >/dev/null");
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

/// The bundle on the registry host, unpacked (`unpacked`: the check that it
/// is) from the file uploaded to `remote` and removed after. An apply from
/// the bundle unpacked on this machine has no file: the registry host must
/// have bundle `id` unpacked already.
fn bundle_steps(i: &Context, unpacked: &str, remote: &str, id: &str) -> anyhow::Result<Vec<Arc<dyn Step>>> {
    let Some(bundle) = i.bundle else {
        return Ok(vec![Arc::new(Shell::new(
            "bundle-unpack",
            Some(unpacked),
            &format!(
                "echo \"the registry host has no unpacked bundle {id} (under {HOST_BUNDLES}): pass --bundle FILE, the bundle the cluster was installed from\" >&2; exit 1"
            ),
        ))]);
    };
    let upload = |name: &str, local: &Path, dest: &str| -> anyhow::Result<Arc<dyn Step>> {
        Ok(Arc::new(Unless {
            check: unpacked.to_string(),
            inner: Arc::new(Upload::new(name, local, dest, 0o644)?),
        }))
    };
    let mut steps = vec![upload("bundle", bundle, remote)?];
    let sig = |b: &Path| std::path::PathBuf::from(format!("{}.minisig", b.display()));
    let trust = match i.pubkey {
        Some(k) => {
            steps.push(upload("bundle-signature", &sig(bundle), &format!("{remote}.minisig"))?);
            steps.push(upload("bundle-pubkey", k, &format!("{REMOTE_BUNDLE}/bundle.pub"))?);
            format!("--pubkey {REMOTE_BUNDLE}/bundle.pub")
        }
        None => "--allow-unsigned".into(),
    };
    let r = q(remote);
    let unpack = |extra: &str| format!("{HOST_INSTALLER} unpack --bundle {r}{extra} {trust} --root {ROOT}");
    let mut command = format!("{} 2>&1 && rm -f {r} {r}.minisig", unpack(""));
    // A differential bundle's base goes beside it unless the host has it
    // unpacked (always signed: an install refuses --base under --allow-unsigned).
    if let (Some((base, digest)), Some(_)) = (i.base, i.pubkey) {
        let name = base.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let remote_base = format!("{REMOTE_BUNDLE}/base-{name}");
        let b = q(&remote_base);
        let done = format!("{HOST_BUNDLES}/{}/{}", kubexm_bundle::diff::hex(digest), crate::unpack::COMPLETE);
        let held = format!("test -f {}", q(&done));
        let uploads = [
            ("bundle-base", base.to_path_buf(), remote_base.clone()),
            ("bundle-base-signature", sig(base), format!("{remote_base}.minisig")),
        ];
        for (name, local, dest) in uploads {
            steps.push(Arc::new(Unless {
                check: format!("{unpacked} || {held}"),
                inner: Arc::new(Upload::new(name, &local, &dest, 0o644)?),
            }));
        }
        command = format!(
            "if {held}; then {}; else {}; fi 2>&1 && rm -f {r} {r}.minisig {b} {b}.minisig",
            unpack(""),
            unpack(&format!(" --base {b}"))
        );
    }
    steps.push(Arc::new(Shell::new("bundle-unpack", Some(unpacked), &command)));
    Ok(steps)
}

/// The task stopping the registry on `old`, the host that served it before
/// it moved, after `after` (everything else): its service stopped and
/// disabled, its unit removed (the bundle unpacked there stays until the
/// host is reset).
pub fn retired(old: &str, after: Vec<(String, Scope)>) -> Task {
    let step = Shell::new(
        "registry-stopped",
        Some(&format!("! systemctl is-active -q kubexm-registry && ! test -e {REGISTRY_UNIT}")),
        &format!("systemctl disable --now -q kubexm-registry 2>/dev/null; rm -f {REGISTRY_UNIT} && systemctl daemon-reload"),
    );
    Task {
        name: format!("registry-retired-{old}"),
        hosts: vec![old.to_string()],
        steps: vec![Arc::new(step)],
        after,
    }
}

/// The registry's server certificate on `host`, for its address and name:
/// issued by the registry CA once and reused.
pub fn server_cert(pki: &pki::Pki, topo: &kubexm_bom::topology::Topology, host: &str) -> anyhow::Result<pki::ServerCert> {
    let ca = pki.ca("registry", "kubexm registry CA")?;
    let names = [topo.address(host).to_string(), host.to_string()];
    Ok(pki.cert(&ca, &format!("{host}-registry"), host, &names, pki::Usage::Server)?)
}

/// `host`'s client certificate for the registry (CN the host's name) when
/// `registry.clientAuth` is on: issued by the registry CA once and reused.
pub fn client_cert(pki: &pki::Pki, cluster: &kubexm_bom::config::Cluster, host: &str) -> anyhow::Result<Option<pki::ServerCert>> {
    if !cluster.spec.registry.client_auth {
        return Ok(None);
    }
    let ca = pki.ca("registry", "kubexm registry CA")?;
    Ok(Some(pki.cert(
        &ca,
        &format!("{host}-registry-client"),
        host,
        &[],
        pki::Usage::Client,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::context::TWO_HOSTS as CLUSTER;

    /// Issue 33: a differential bundle's base goes to the registry host
    /// beside it, uploaded unless that host has the content or the base
    /// unpacked, and named to its unpack there only when it lacks the base.
    #[test]
    fn a_differential_bundles_base_goes_to_the_registry_host_that_lacks_it() -> anyhow::Result<()> {
        let catalog = kubexm_bom::catalog::Catalog::builtin()?;
        let cluster = kubexm_bom::config::load_str(CLUSTER, "s.yaml", &catalog)?;
        let bom = kubexm_bom::resolve::resolve(&cluster, &catalog, &Default::default())?;
        let pki = crate::pki::Pki::DryRun;
        let dir = tempfile::tempdir()?;
        let file = |n: &str| -> anyhow::Result<std::path::PathBuf> {
            let p = dir.path().join(n);
            std::fs::write(&p, n)?;
            Ok(p)
        };
        let (installer, bundle, base, pubkey) = (
            file("kubexm-install")?,
            file("new.tar.zst")?,
            file("old 1.tar.zst")?,
            file("k.pub")?,
        );
        file("new.tar.zst.minisig")?;
        file("old 1.tar.zst.minisig")?;
        let hex = "ab".repeat(32);
        let digest = format!("sha256:{hex}");
        let ctx = Context {
            bundle: Some(&bundle),
            base: Some((&base, &digest)),
            pubkey: Some(&pubkey),
            ..Context::testing(&cluster, &bom, dir.path(), &pki, &installer)?
        };
        let m = module(&ctx)?;
        let steps = &m.tasks[0].steps;
        let names: Vec<&str> = steps.iter().map(|s| s.name()).collect();
        for want in ["bundle", "bundle-base", "bundle-base-signature", "bundle-unpack"] {
            assert!(names.contains(&want), "{want} missing: {names:?}");
        }
        let log = crate::engine::fake::Log::default();
        let fake = crate::engine::fake::Fake::ok("cp1", log.clone());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        for name in ["bundle-base", "bundle-unpack"] {
            let step = steps.iter().find(|s| s.name() == name).ok_or_else(|| anyhow::anyhow!("{name}"))?;
            rt.block_on(step.apply(&fake))?;
        }
        let calls: Vec<String> = log.calls().into_iter().map(|(_, c)| c).collect();
        let remote = format!("{REMOTE_BUNDLE}/base-old 1.tar.zst");
        assert!(calls.iter().any(|c| *c == format!("put {remote}")), "{calls:?}");
        let unpack = calls.last().cloned().unwrap_or_default();
        let held = format!("test -f '{HOST_BUNDLES}/{hex}/.kubexm-complete'");
        assert!(unpack.contains(&format!("if {held}; then")), "{unpack}");
        assert!(unpack.contains(&format!("--base '{remote}'")), "{unpack}");
        assert!(unpack.contains(&format!("rm -f '{REMOTE_BUNDLE}/new.tar.zst'")), "{unpack}");
        Ok(())
    }
}
