//! `kubexm-install packages`: the OS packages step on every host, from an
//! unpacked bundle's repositories served by a file server.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::ops::error::{OpError, op};

use super::EngineSettings;
use super::session::{Session, Settings};
use crate::engine::plan::Pipeline;
use crate::engine::{run, state::Outcome};

#[derive(Debug, Clone)]
pub struct PackagesOptions {
    pub file: PathBuf,
    /// An unpacked bundle (`<root>/bundles/<id>`).
    pub bundle_dir: PathBuf,
    /// The file server serving it, as hosts reach it.
    pub file_server: String,
    /// The CA hosts check the file server with (a path on the hosts).
    pub host_ca: Option<String>,
    pub dry_run: bool,
    pub engine: EngineSettings,
}

/// What `packages` did: per host what it installed (or the plan), and the
/// failures, if any.
#[derive(Debug)]
pub struct PackagesReport {
    pub text: String,
    pub errors: Option<String>,
}

pub fn packages(o: &PackagesOptions) -> anyhow::Result<PackagesReport> {
    let fs = &o.file_server;
    // The hosts' apt source is `[trusted=yes]` (apt checks no signature of
    // its own): TLS to the file server is what keeps a machine in the
    // middle from handing the hosts packages of its choosing.
    if fs.starts_with("http://") {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "--file-server {fs}: plain HTTP is refused: the hosts install these packages as root from an apt source \
                 that checks no signature, so only TLS vouches for them; serve the bundle over https \
                 (`kubexm-install serve` issues a certificate from the installer's CA) and pass \
                 --file-server https://HOST:PORT --host-ca PATH (that CA on the hosts)"
            ),
        ));
    }
    if !fs.starts_with("https://") {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("--file-server {fs}: expected https://HOST:PORT"),
        ));
    }
    let mpath = o.bundle_dir.join(kubexm_bundle::manifest::MANIFEST_NAME);
    let manifest = kubexm_bundle::manifest::BundleManifest::from_yaml(&fs_err::read_to_string(&mpath)?)
        .map_err(|e| op(OpError::Io, anyhow::anyhow!("{}: {e}", mpath.display())))?;
    let cluster = kubexm_bom::config::load_file(&o.file, &super::lock_catalog(&manifest, &o.bundle_dir)?)?;
    let repos = manifest.lock.os_repos;
    if repos.is_empty() {
        return Err(op(
            OpError::Config,
            anyhow::anyhow!(
                "the bundle in {} carries no OS package repositories; set bundle.osPackages in cluster.yaml and rebuild it",
                o.bundle_dir.display()
            ),
        ));
    }
    let pipeline = |hosts: Vec<String>| {
        Ok(Pipeline {
            name: "os-packages".into(),
            modules: vec![crate::os_packages::module(&cluster, &hosts, &repos, fs, o.host_ca.clone(), &[])],
        })
    };
    if o.dry_run {
        let hosts = cluster.spec.hosts.iter().map(|h| h.name.clone()).collect();
        return Ok(PackagesReport {
            text: pipeline(hosts)?.plan()?.describe(),
            errors: None,
        });
    }
    let session = Session::of(
        cluster.clone(),
        o.file.display().to_string(),
        Settings::engine_only(o.engine.clone()),
    );
    let ex = session.execute("os-packages", run::Policy::ContinueOtherHosts, pipeline)?;
    let mut text = String::new();
    for r in &ex.report.results {
        if let Some(installed) = r.log.split("installed:\n").nth(1) {
            let _ = writeln!(text, "{}: {}", r.host, installed.trim().replace('\n', ", "));
        } else if r.outcome == Outcome::Skipped {
            let _ = writeln!(text, "{}: already installed", r.host);
        }
    }
    let errors = (!ex.ok()).then(|| {
        let errors = ex.errors();
        format!("{} host(s) failed (job {}):\n  {}", errors.len(), ex.job, errors.join("\n  "))
    });
    Ok(PackagesReport { text, errors })
}
