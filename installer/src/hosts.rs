//! containerd `hosts.toml` files that send every upstream registry to ours.
//!
//! One file per upstream registry host named in the bundle's lock, at
//! `<dir>/<upstream-host>/hosts.toml`, for containerd's `config_path`. Each
//! points at `https://<registry>/v2/<prefix>/<upstream-host>` with
//! `override_path = true`: the architecture's naming rule, so
//! `registry.k8s.io/pause:3.10` is pulled as `<registry>/registry.k8s.io/pause:3.10`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kubexm_bundle::manifest::BundleManifest;

/// Where nodes pull from.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host[:port]` of the registry.
    pub registry: String,
    /// Path prefix under which images live in a site registry.
    pub prefix: Option<String>,
    /// Flattened names (`<prefix>/<repository>`, without the upstream host).
    pub flatten: bool,
    /// The CA file path *on the node*, if the registry's certificate needs one.
    pub ca: Option<String>,
    /// Plain HTTP (never for production registries).
    pub plain_http: bool,
    /// The client certificate and key paths *on the node*, for a registry
    /// that requires one.
    pub client: Option<(String, String)>,
}

/// The upstream registry hosts the bundle's images come from.
pub fn upstream_hosts(m: &BundleManifest) -> Vec<String> {
    let hosts: BTreeSet<String> = m.lock.images.iter().map(|i| i.reference.registry.clone()).collect();
    hosts.into_iter().collect()
}

/// The text of one `hosts.toml`.
pub fn render(upstream: &str, t: &Target) -> String {
    let server = if upstream == "docker.io" {
        "https://registry-1.docker.io".to_string()
    } else {
        format!("https://{upstream}")
    };
    let scheme = if t.plain_http { "http" } else { "https" };
    let mut path = String::from("/v2");
    if let Some(p) = t.prefix.as_deref().map(|p| p.trim_matches('/')).filter(|p| !p.is_empty()) {
        path.push('/');
        path.push_str(p);
    }
    if !t.flatten {
        path.push('/');
        path.push_str(upstream);
    }
    let mut s = format!(
        "# Written by kubexm: {upstream} is served from the kubexm registry.\nserver = \"{server}\"\n\n[host.\"{scheme}://{}{path}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  override_path = true\n",
        t.registry
    );
    if let Some(ca) = &t.ca {
        s.push_str(&format!("  ca = \"{ca}\"\n"));
    }
    if let Some((cert, key)) = &t.client {
        s.push_str(&format!("  client = [[\"{cert}\", \"{key}\"]]\n"));
    }
    s
}

/// Writes one `hosts.toml` per upstream host under `dir`; returns the files.
pub fn write_all(dir: &Path, m: &BundleManifest, t: &Target) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for host in upstream_hosts(m) {
        let d = dir.join(&host);
        fs_err::create_dir_all(&d)?;
        let f = d.join("hosts.toml");
        let tmp = d.join(".hosts.toml.tmp");
        fs_err::write(&tmp, render(&host, t))?;
        fs_err::rename(&tmp, &f)?;
        out.push(f);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_path_under_the_upstream_host() {
        let t = Target {
            registry: "198.18.0.1:5443".into(),
            prefix: None,
            flatten: false,
            ca: Some("/etc/containerd/certs.d/kubexm-ca.crt".into()),
            plain_http: false,
            client: Some(("/etc/kubexm/c.crt".into(), "/etc/kubexm/c.key".into())),
        };
        let text = render("registry.k8s.io", &t);
        assert!(text.contains("server = \"https://registry.k8s.io\""));
        assert!(text.contains("[host.\"https://198.18.0.1:5443/v2/registry.k8s.io\"]"));
        assert!(text.contains("override_path = true") && text.contains("ca = \"/etc/containerd/certs.d/kubexm-ca.crt\""));
        assert!(text.contains("  client = [[\"/etc/kubexm/c.crt\", \"/etc/kubexm/c.key\"]]\n"));
        let site = Target {
            registry: "harbor.local".into(),
            prefix: Some("/kubexm/".into()),
            flatten: false,
            ca: None,
            plain_http: false,
            client: None,
        };
        assert!(render("docker.io", &site).contains("[host.\"https://harbor.local/v2/kubexm/docker.io\"]"));
        assert!(render("docker.io", &site).contains("server = \"https://registry-1.docker.io\""));
        let flat = Target { flatten: true, ..site };
        assert!(render("quay.io", &flat).contains("[host.\"https://harbor.local/v2/kubexm\"]"));
    }
}
