//! Operations: one per command, shared by every trigger (the CLI today;
//! API workers and day-2 commands later). Each takes typed options and
//! returns a report; none prints. Engine jobs (install, reset, packages,
//! facts), status, and the bundle's own commands (unpack, serve, mirror,
//! hosts-toml). Progress goes out as the engine's events, to the sink the
//! caller gives (the CLI's printer).

pub mod apply;
pub mod certs;
pub mod certs_renew;
pub mod conformance;
pub mod delete;
pub mod error;
pub mod etcd;
pub mod etcd_restore;
pub mod facts;
#[cfg(test)]
pub(crate) mod fixture;
pub mod hosts_toml;
pub mod install;
pub mod mirror;
pub mod owner;
pub mod packages;
pub mod remove;
pub mod request;
pub mod reset;
pub mod serve;
pub mod session;
pub mod status;
pub mod upgrade;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::ops::error::{OpError, op};

use crate::engine::events::EventSink;
use crate::engine::{jobs, run};

/// How an operation runs its engine job.
#[derive(Clone)]
pub struct EngineSettings {
    /// The state database.
    pub state: PathBuf,
    /// Accept a host key that differs from the one pinned at first contact.
    pub accept_new_host_key: bool,
    /// Hosts worked on at once.
    pub concurrency: usize,
    /// Where the job's events go (the CLI's progress printer).
    pub events: Option<Arc<dyn EventSink>>,
    /// Set to stop scheduling new steps (running ones finish): a job's
    /// cancel. Ctrl-C sets it too. `None`: a flag of the operation's own.
    pub stop: Option<Arc<AtomicBool>>,
    /// What the run may use of this machine: the operator's own config
    /// (local), or a request's (named credentials, pinned host keys only).
    pub trust: crate::engine::trust::Trust,
    /// One SSH connection attempt's time limit, and the attempts per host.
    pub connect_timeout: std::time::Duration,
    pub connect_attempts: u32,
    /// Who a job that changes a cluster in operator mode acts as (its
    /// controller's Lease, [`owner`]).
    pub owner: owner::Ownership,
}

/// One SSH connection attempt's time limit unless told otherwise.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// Connection attempts per host unless told otherwise.
pub const CONNECT_ATTEMPTS: u32 = 3;

impl EngineSettings {
    /// How hosts are connected to.
    pub fn connect(&self) -> jobs::ConnectOptions {
        jobs::ConnectOptions {
            accept_new_host_key: self.accept_new_host_key,
            concurrency: self.concurrency,
            timeout: self.connect_timeout,
            attempts: self.connect_attempts,
            trust: self.trust.clone(),
        }
    }

    /// How the engine runs a job under `policy`.
    pub fn options(&self, policy: run::Policy) -> run::EngineOptions {
        run::EngineOptions {
            concurrency: self.concurrency,
            policy,
            events: self.events.clone(),
            ..Default::default()
        }
    }
}

impl std::fmt::Debug for EngineSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineSettings")
            .field("state", &self.state)
            .field("accept_new_host_key", &self.accept_new_host_key)
            .field("concurrency", &self.concurrency)
            .field("events", &self.events.is_some())
            .field("stop", &self.stop.is_some())
            .field("trust", &self.trust)
            .field("owner", &self.owner)
            .finish()
    }
}

/// The catalog a bundle's lock carries, which the offline side validates
/// and completes cluster.yaml against (it needs no catalog of its own); a
/// bundle built before the lock carried it is refused.
pub fn lock_catalog(
    manifest: &kubexm_bundle::manifest::BundleManifest,
    bundle: &std::path::Path,
) -> anyhow::Result<kubexm_bom::catalog::Catalog> {
    let Some(catalog) = &manifest.catalog else {
        return Err(op(
            OpError::Config,
            anyhow::anyhow!(
                "{}: this bundle was built by an older kubexm-bundle ({}) and its lock carries no catalog; rebuild it with this kubexm-bundle",
                bundle.display(),
                manifest.created_by
            ),
        ));
    };
    let mut catalog = catalog.clone();
    catalog.origin = Some(bundle.display().to_string());
    Ok(catalog)
}

/// The PKI directory of cluster `name` under `root`: `<root>/clusters/<name>/pki`,
/// one CA and join token per cluster. A root from before held one
/// `<root>/pki` that all its clusters shared: each of them (those whose
/// `<root>/<name>.kubeconfig` is there) gets a copy on first use, so none
/// loses the CA its nodes trust; a cluster new to the root gets its own.
pub fn cluster_pki(root: &std::path::Path, name: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = crate::paths::cluster_pki(root, name);
    let old = root.join("pki");
    if !dir.exists() && old.is_dir() && root.join(format!("{name}.kubeconfig")).exists() {
        let tmp = root.join("clusters").join(format!(".{name}.pki.tmp"));
        if tmp.exists() {
            fs_err::remove_dir_all(&tmp)?;
        }
        copy_tree(&old, &tmp)?;
        fs_err::create_dir_all(root.join("clusters").join(name))?;
        fs_err::rename(&tmp, &dir)?;
        tracing::warn!(
            "cluster {name}: its PKI was copied from {} (shared by the clusters this root installed before per-cluster PKI); they keep sharing that CA until its certificates are renewed",
            old.display()
        );
    }
    Ok(dir)
}

/// Copies the directory `from` to `to` (made), keeping file modes.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs_err::create_dir_all(to)?;
    fs_err::set_permissions(to, std::fs::Permissions::from_mode(0o700))?;
    for e in fs_err::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type()?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            fs_err::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// `unpack`: verifies a bundle and unpacks it under `root` (once: an
/// unpacked bundle is reused), its errors classified for their exit code.
pub fn unpack(bundle: &std::path::Path, trust: &crate::unpack::Trust, root: &std::path::Path) -> anyhow::Result<crate::unpack::Unpacked> {
    crate::unpack::unpack(bundle, trust, root).map_err(crate::unpack::UnpackError::classified)
}

/// `host[:port]/prefix` (with or without a scheme) → (`host[:port]`, `prefix`).
pub fn split_registry(r: &str) -> (String, Option<String>) {
    let r = r.trim_start_matches("https://").trim_start_matches("http://");
    match r.split_once('/') {
        Some((h, p)) => (h.to_string(), Some(p.trim_matches('/').to_string()).filter(|p| !p.is_empty())),
        None => (r.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    /// Issue 24, item 2: two clusters on one root get different CAs and
    /// join tokens; an old root's shared PKI is copied to its clusters.
    #[test]
    fn each_cluster_has_its_own_ca_and_join_token() -> anyhow::Result<()> {
        let root = tempfile::tempdir()?;
        let old = crate::pki::Pki::Dir(root.path().join("pki"), Default::default());
        let a_before = crate::kube_pki::KubePki::ensure(&old)?;
        std::fs::write(root.path().join("a.kubeconfig"), "")?;
        let (a, b) = (super::cluster_pki(root.path(), "a")?, super::cluster_pki(root.path(), "b")?);
        assert!(a.is_dir(), "the old root was not copied to cluster a");
        let ka = crate::kube_pki::KubePki::ensure(&crate::pki::Pki::Dir(a, Default::default()))?;
        let kb = crate::kube_pki::KubePki::ensure(&crate::pki::Pki::Dir(b, Default::default()))?;
        assert_eq!(ka.ca.cert_pem, a_before.ca.cert_pem, "cluster a lost its CA in the copy");
        assert_ne!(ka.ca.cert_pem, kb.ca.cert_pem);
        assert_ne!(ka.creds.token, kb.creds.token);
        Ok(())
    }
}
