//! Deployment phases, one file each, all of one shape:
//! `fn module(&Context) -> anyhow::Result<Module>` (planning errors carry a
//! typed [`crate::DeployError`]). A mode is a file beside its siblings
//! (`endpoint/haproxy_keepalived.rs`, `endpoint/local_proxy.rs`); a family
//! of phases sharing code is a folder (`kubeadm/`: control-plane, workers,
//! kubeconfig) or one file (`addons.rs`: cni and addons). No phase imports
//! another: what they share comes through [`crate::context::Context`] (the
//! config's topology among it) or [`crate::paths`].

pub mod addons;
pub mod containerd;
pub mod endpoint;
pub mod etcd;
pub mod etcd_members;
pub mod kubeadm;
pub mod operator;
pub mod preflight;
pub mod registry;

/// The `os-packages` phase: each host's OS packages from the bundle's
/// repositories (the step lives in `crate::os_packages`, which the
/// `packages` command runs on its own too).
pub mod os_packages {
    use crate::context::{Context, HOST_CA};
    use crate::engine::plan::Module;

    pub fn module(ctx: &Context) -> anyhow::Result<Module> {
        let hosts: Vec<String> = ctx.cluster.spec.hosts.iter().map(|h| h.name.clone()).collect();
        let after: &[&str] = if ctx.has(crate::pipelines::Phase::Preflight) {
            &["trust-ca"]
        } else {
            &[]
        };
        Ok(crate::os_packages::module(
            ctx.cluster,
            &hosts,
            &ctx.bom.os_repos,
            ctx.file_server,
            Some(HOST_CA.into()),
            after,
        ))
    }
}
