//! `hosts-toml`: containerd `hosts.toml` files that point every upstream
//! registry of an unpacked bundle at one registry (kubexm's or the site's).

use std::path::PathBuf;

use crate::ops::error::{OpError, op};
use kubexm_bundle::manifest::{BundleManifest, MANIFEST_NAME};

use crate::hosts::{Target, write_all};

#[derive(Debug, Clone)]
pub struct HostsTomlOptions {
    /// An unpacked bundle (its `bundle.yaml` names the upstream registries).
    pub bundle_dir: PathBuf,
    /// `host[:port][/prefix]`, with or without a scheme.
    pub registry: String,
    pub flatten: bool,
    /// The CA file path on the node.
    pub ca: Option<String>,
    pub plain_http: bool,
    /// Where the `<upstream host>/hosts.toml` files go.
    pub out: PathBuf,
}

/// Writes the files; returns their paths.
pub fn hosts_toml(o: &HostsTomlOptions) -> anyhow::Result<Vec<PathBuf>> {
    let text = fs_err::read_to_string(o.bundle_dir.join(MANIFEST_NAME))?;
    let m = BundleManifest::from_yaml(&text).map_err(|e| op(OpError::Verify, anyhow::anyhow!("{}: {e}", o.bundle_dir.display())))?;
    let (registry, prefix) = super::split_registry(&o.registry);
    Ok(write_all(
        &o.out,
        &m,
        &Target {
            registry,
            prefix,
            flatten: o.flatten,
            ca: o.ca.clone(),
            plain_http: o.plain_http,
            client: None,
        },
    )?)
}
