//! kubexm-installer: the offline side.
//!
//! Verify and unpack a bundle ([`unpack`]), serve it as a registry and file
//! server ([`serve`], TLS from the installer's CA in [`pki`]) or push its
//! images into a site registry ([`mirror`]), write containerd `hosts.toml`
//! files that send nodes to it ([`hosts`]), and deploy the cluster over SSH
//! in phases ([`pipelines`] of [`phases`], run by the [`engine`]).

pub mod context;
pub mod endpoint_name;
pub mod hosts;
pub mod kube_pki;
pub mod limits;
pub mod mirror;
pub mod ops;
pub mod os_packages;
pub mod paths;
pub mod phases;
pub mod pipelines;
pub mod pki;
pub mod serve;
pub mod template;
pub mod unpack;
pub mod waits;

/// The control-plane endpoint phase (its modes in `phases/endpoint/`).
pub use phases::endpoint;

/// The engine the phases run on (its own crate; re-exported for the binary and tests).
pub use kubexm_engine as engine;

/// What planning a deployment can refuse, typed so the binary maps it to
/// its exit code (8 for "not supported yet", 3 for a config the bundle or
/// the installer cannot serve) rather than calling it a bug.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("{0} is not supported yet")]
    NotSupported(String),
    #[error("{0}")]
    Config(String),
}

/// This machine's arch as the bundle names arches (`amd64`, `arm64`).
pub fn installer_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The installer's state root (`/var/lib/kubexm`).
pub use paths::{ROOT, SERVE_PORT};

/// The systemd unit that keeps the registry serving after the installer exits.
pub const REGISTRY_UNIT: &str = include_str!("../../manifests/templates/kubexm-registry.service");

/// What the registry unit runs.
#[derive(Debug, Clone)]
pub struct RegistryService<'a> {
    pub binary: &'a str,
    pub bundle_dir: &'a str,
    /// `ADDR:PORT`: the registry host's address as the nodes reach it.
    pub listen: &'a str,
    /// The certificate and key on the host, handed to the service as credentials.
    pub cert: &'a str,
    pub key: &'a str,
    /// The CA client certificates must be signed by (`registry.clientAuth`).
    pub client_ca: Option<&'a str>,
    pub limits: &'a serve::ConnectionLimits,
    /// Older unpacked bundles on the host served below `bundle_dir` (an
    /// upgrade's hop: nodes pull the old version or the new).
    pub older: &'a [String],
}

/// The unit text for a registry host.
pub fn registry_unit(s: &RegistryService<'_>) -> Result<String, template::Unfilled> {
    let mut args = String::new();
    for d in s.older {
        args.push_str(&format!(" --older-bundle-dir {d}"));
    }
    for n in &s.limits.nodes {
        args.push_str(&format!(" --node {n}"));
    }
    let client_ca = match s.client_ca {
        Some(ca) => {
            args.push_str(" --client-ca %d/client-ca.crt");
            format!("LoadCredential=client-ca.crt:{ca}")
        }
        None => String::new(),
    };
    template::render(
        "kubexm-registry.service",
        REGISTRY_UNIT,
        &[
            ("BINARY", s.binary),
            ("BUNDLE_DIR", s.bundle_dir),
            ("LISTEN", s.listen),
            ("CERT", s.cert),
            ("KEY", s.key),
            ("CLIENT_CA_CREDENTIAL", &client_ca),
            ("MAX_CONNECTIONS", &s.limits.max.to_string()),
            ("MAX_PER_SOURCE", &s.limits.per_source.to_string()),
            ("ARGS", &args),
            ("NOFILE", &s.limits.open_files().to_string()),
        ],
        &[],
    )
}
