//! kubexm-installer: the offline side.
//!
//! This release does the first half of an install: verify and unpack a bundle
//! ([`unpack`]), serve it as a registry and file server ([`serve`], TLS from
//! the installer's CA in [`pki`]), or push its images into a site registry
//! ([`mirror`]), and write containerd `hosts.toml` files that send nodes to
//! it ([`hosts`]). Deploying the cluster over SSH comes with the engine and
//! phases; until then `kubexm-install -f cluster.yaml` refuses with
//! "not supported yet".

pub mod addons;
pub mod deploy;
pub mod endpoint;
pub mod engine;
pub mod hosts;
pub mod kubeadm;
pub mod mirror;
pub mod os_packages;
pub mod pki;
pub mod serve;
pub mod unpack;

/// The installer's state root (`/var/lib/kubexm`).
pub const ROOT: &str = "/var/lib/kubexm";

/// The systemd unit that keeps the registry serving after the installer exits.
/// Placeholders: `{{BINARY}}`, `{{BUNDLE_DIR}}`, `{{LISTEN}}`, `{{CERT}}`, `{{KEY}}`.
pub const REGISTRY_UNIT: &str = include_str!("../../manifests/templates/kubexm-registry.service");

/// The unit text for a registry host.
pub fn registry_unit(binary: &str, bundle_dir: &str, listen: &str, cert: &str, key: &str) -> String {
    REGISTRY_UNIT
        .replace("{{BINARY}}", binary)
        .replace("{{BUNDLE_DIR}}", bundle_dir)
        .replace("{{LISTEN}}", listen)
        .replace("{{CERT}}", cert)
        .replace("{{KEY}}", key)
}
