//! The rules a careful operator checks before an install.
//!
//! Each rule looks at the typed config and reports by YAML path; the loader
//! turns paths into line:column. Rules never stop at the first problem.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::defaults::{API_VERSION, KIND};
use super::model::*;
use crate::addons::{network_addon, storage_addon};
use crate::catalog::Catalog;
use crate::diag::{Diagnostic, Kind, MAX_DIAGNOSTICS, did_you_mean};
use crate::image::ImageRef;
use crate::net::{Cidr, is_dns_label, is_host_address};

pub use super::host_paths::host_path_problem;

#[path = "validate_etcd.rs"]
mod etcd;

/// Runs every rule; returns every problem. Without a catalog (operations
/// that only reach hosts, such as reset) versions, arches and OS releases
/// are not checked.
pub fn check(c: &Cluster, catalog: Option<&Catalog>) -> Vec<Diagnostic> {
    check_counted(c, catalog).0
}

/// [`check`], keeping the first [`MAX_DIAGNOSTICS`] problems and counting
/// the rest without building them.
pub fn check_counted(c: &Cluster, catalog: Option<&Catalog>) -> (Vec<Diagnostic>, usize) {
    let mut r = Rules {
        out: Vec::new(),
        catalog,
        more: 0,
    };
    r.document(c);
    r.hosts(&c.spec);
    r.roles(&c.spec);
    r.etcd(&c.spec);
    r.endpoint(&c.spec);
    r.networks(&c.spec);
    r.versions(&c.spec);
    r.kubelet(&c.spec);
    r.registry(&c.spec);
    r.addons(&c.spec);
    r.bundle(&c.spec);
    r.host_paths(&c.spec);
    super::grammar::check(c).into_iter().for_each(|d| r.push(|| d));
    super::bastion::check(c).into_iter().for_each(|d| r.push(|| d));
    super::conformance::check(c, catalog).into_iter().for_each(|d| r.push(|| d));
    (r.out, r.more)
}

struct Rules<'a> {
    out: Vec<Diagnostic>,
    catalog: Option<&'a Catalog>,
    /// Problems past [`MAX_DIAGNOSTICS`], counted only.
    more: usize,
}

impl Rules<'_> {
    /// Whether the report is full: later problems are only counted.
    fn full(&self) -> bool {
        self.out.len() >= MAX_DIAGNOSTICS
    }

    fn push(&mut self, d: impl FnOnce() -> Diagnostic) {
        if self.full() {
            self.more += 1;
        } else {
            self.out.push(d());
        }
    }

    fn err(&mut self, path: impl Into<String>, msg: impl Into<String>) {
        self.push(|| Diagnostic::new(Kind::Invalid, path, msg));
    }

    fn hinted(&mut self, path: impl Into<String>, msg: impl Into<String>, hint: impl Into<String>) {
        self.push(|| Diagnostic::new(Kind::Invalid, path, msg).hint(hint));
    }

    fn document(&mut self, c: &Cluster) {
        if c.api_version.is_empty() {
            self.hinted(
                "apiVersion",
                "apiVersion is missing",
                format!("start the file with `apiVersion: {API_VERSION}`"),
            );
        } else if c.api_version != API_VERSION {
            self.hinted(
                "apiVersion",
                format!("apiVersion is `{}`; this release reads `{API_VERSION}`", c.api_version),
                format!("write `apiVersion: {API_VERSION}`"),
            );
        }
        if c.kind.is_empty() {
            self.hinted("kind", "kind is missing", format!("write `kind: {KIND}`"));
        } else if c.kind != KIND {
            self.hinted(
                "kind",
                format!("kind is `{}`; expected `{KIND}`", c.kind),
                format!("write `kind: {KIND}`"),
            );
        }
        if !is_dns_label(&c.metadata.name) {
            self.hinted(
                "metadata.name",
                format!("cluster name `{}` is not a DNS label", c.metadata.name),
                "use 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
            );
        }
    }

    fn hosts(&mut self, s: &Spec) {
        if s.hosts.is_empty() {
            self.hinted("spec.hosts", "no hosts are listed", "list at least one host under spec.hosts");
        }
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        let mut addrs: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, h) in s.hosts.iter().enumerate() {
            let p = format!("spec.hosts[{i}]");
            if !is_dns_label(&h.name) {
                self.hinted(
                    format!("{p}.name"),
                    format!("host name `{}` is not a DNS label", h.name),
                    "Kubernetes node names are lowercase letters, digits and '-'",
                );
            } else if let Some(first) = names.insert(&h.name, i) {
                self.err(
                    format!("{p}.name"),
                    format!("duplicate host name `{}` (also spec.hosts[{first}])", h.name),
                );
            }
            if !is_host_address(&h.address) {
                self.err(format!("{p}.address"), format!("`{}` is not an IP address or host name", h.address));
            }
            let internal = h.internal_address.as_deref().unwrap_or(&h.address);
            if h.internal_address.is_some() && internal.parse::<IpAddr>().is_err() {
                self.err(format!("{p}.internalAddress"), format!("`{internal}` is not an IP address"));
            }
            for (field, a) in [("address", h.address.as_str()), ("internalAddress", internal)] {
                if field == "internalAddress" && (h.internal_address.is_none() || internal == h.address) {
                    continue;
                }
                if let Some(first) = addrs.insert(a, i).filter(|f| *f != i) {
                    self.err(
                        format!("{p}.{field}"),
                        format!("duplicate address {a} (also used by spec.hosts[{first}] `{}`)", s.hosts[first].name),
                    );
                }
            }
            if let Some(arch) = &h.arch {
                self.arch(&format!("{p}.arch"), arch);
            }
            if h.port == Some(0) {
                self.err(format!("{p}.port"), "port 0 is not a valid SSH port");
            }
            if let Some(key) = &h.host_key
                && let Err(why) = crate::net::host_key(key)
            {
                self.hinted(
                    format!("{p}.hostKey"),
                    format!("host `{}`'s hostKey is not an SSH public key: {why}", h.name),
                    "give TYPE BASE64, the first two fields of the host's /etc/ssh/ssh_host_ed25519_key.pub",
                );
            }
            match h.auth.as_ref().or(s.host_defaults.auth.as_ref()) {
                None => self.hinted(
                    p.clone(),
                    format!("host `{}` has no auth method", h.name),
                    "set auth.password, auth.privateKey, auth.agent or auth.credential on the host, or once under spec.hostDefaults.auth",
                ),
                Some(a) if h.auth.is_some() => self.auth(&format!("{p}.auth"), a),
                Some(_) => {}
            }
            if let Some(b) = &h.bastion {
                self.bastion(&format!("{p}.bastion"), b);
            }
        }
        if let Some(a) = &s.host_defaults.auth {
            self.auth("spec.hostDefaults.auth", a);
        }
        if let Some(b) = &s.host_defaults.bastion {
            self.bastion("spec.hostDefaults.bastion", b);
        }
    }

    fn bastion(&mut self, p: &str, b: &Bastion) {
        if !is_host_address(&b.address) {
            self.err(
                format!("{p}.address"),
                format!("bastion address `{}` is not an IP address or host name", b.address),
            );
        }
        if let Some(a) = &b.auth {
            self.auth(&format!("{p}.auth"), a);
        }
    }

    fn auth(&mut self, p: &str, a: &Auth) {
        let methods = [
            a.password.is_some(),
            a.private_key.is_some(),
            a.agent == Some(true),
            a.credential.is_some(),
        ];
        match methods.iter().filter(|m| **m).count() {
            0 => self.hinted(
                p,
                "no auth method is set",
                "set one of password, privateKey, agent: true or credential",
            ),
            1 => {}
            _ => self.hinted(
                p,
                "more than one auth method is set",
                "keep exactly one of password, privateKey, agent and credential",
            ),
        }
        if let Some(name) = &a.credential
            && !is_dns_label(name)
        {
            self.hinted(
                format!("{p}.credential"),
                format!("credential name `{name}` is not a DNS label"),
                "credentials are named with lowercase letters, digits and '-' (`kubexm credential list`)",
            );
        }
        if let Some(s) = &a.password {
            self.secret(&format!("{p}.password"), s);
        }
        if let Some(k) = &a.private_key {
            if k.path.as_os_str().is_empty() {
                self.err(format!("{p}.privateKey.path"), "privateKey needs a path");
            }
            if let Some(s) = &k.passphrase {
                self.secret(&format!("{p}.privateKey.passphrase"), s);
            }
        }
    }

    fn secret(&mut self, p: &str, s: &SecretRef) {
        match (&s.from_env, &s.from_file) {
            (Some(_), None) | (None, Some(_)) => {}
            _ => self.hinted(
                p,
                "a secret needs exactly one source",
                "write either `fromEnv: VARIABLE` or `fromFile: PATH`",
            ),
        }
    }

    /// What to add to a "not in the catalog" hint: where more versions come from.
    fn more(&self) -> &'static str {
        match self.catalog.and_then(|c| c.origin.as_deref()) {
            Some(_) => "the bundle carries only what it was built for: use that, or rebuild the bundle with kubexm-bundle",
            None => "or add it with --catalog FILE",
        }
    }

    fn arch(&mut self, p: &str, arch: &str) {
        let Some(catalog) = self.catalog else { return };
        if !catalog.arches.iter().any(|a| a == arch) {
            let known = catalog.arches.join(", ");
            let mut msg = format!("arch `{arch}` has no binaries in the catalog (known: {known})");
            if let Some(m) = did_you_mean(arch, catalog.arches.iter().map(String::as_str)) {
                msg.push_str(&format!("; did you mean `{m}`?"));
            }
            self.err(p, msg);
        }
    }

    fn roles(&mut self, s: &Spec) {
        let names: Vec<&str> = s.hosts.iter().map(|h| h.name.as_str()).collect();
        let g = &s.role_groups;
        let groups = [
            ("etcd", &g.etcd),
            ("control-plane", &g.control_plane),
            ("worker", &g.worker),
            ("loadbalancer", &g.loadbalancer),
            ("registry", &g.registry),
        ];
        for (group, members) in groups {
            let mut seen = Vec::new();
            for (i, m) in members.iter().enumerate() {
                let p = format!("spec.roleGroups.{group}[{i}]");
                if !names.contains(&m.as_str()) {
                    if self.full() {
                        self.more += 1;
                        continue;
                    }
                    let mut msg = format!("role group {group} names host `{m}`, which is not in spec.hosts");
                    if let Some(d) = did_you_mean(m, names.iter().copied()) {
                        msg.push_str(&format!("; did you mean `{d}`?"));
                    }
                    self.err(p, msg);
                } else if seen.contains(&m) {
                    self.err(p, format!("host `{m}` is listed twice in role group {group}"));
                }
                seen.push(m);
            }
        }
        if g.control_plane.is_empty() {
            self.hinted(
                "spec.roleGroups",
                "no control-plane hosts",
                "list at least one host under roleGroups.control-plane",
            );
        }
        if g.registry.len() > 1 {
            self.hinted(
                "spec.roleGroups.registry",
                "more than one registry host",
                "list one host; the registry serves every node",
            );
        }
    }

    /// Directories on the hosts that kubexm creates, fills and may remove.
    fn host_paths(&mut self, s: &Spec) {
        let paths = [
            ("spec.etcd.dataDir", &s.etcd.data_dir),
            ("spec.containerRuntime.dataRoot", &s.container_runtime.data_root),
            ("spec.storage.basePath", &s.storage.base_path),
        ];
        for (p, dir) in paths {
            if let Some(why) = host_path_problem(&dir.to_string_lossy()) {
                self.hinted(
                    p,
                    format!("{why}; kubexm creates this directory on the hosts and reset removes it"),
                    "name a directory of its own, such as /var/lib/etcd or /data/etcd",
                );
            }
        }
    }

    fn endpoint(&mut self, s: &Spec) {
        let e = &s.control_plane_endpoint;
        let p = "spec.controlPlaneEndpoint";
        let needs_address = matches!(
            e.mode,
            EndpointMode::HaproxyKeepalived | EndpointMode::KubeVip | EndpointMode::External
        );
        match (&e.address, needs_address) {
            (None, true) => {
                let what = if e.mode == EndpointMode::External {
                    "the load balancer's address"
                } else {
                    "a virtual IP (VIP)"
                };
                self.hinted(
                    p,
                    format!("endpoint mode {} needs {what}", mode_name(e.mode)),
                    "set controlPlaneEndpoint.address to a free address in the hosts' network",
                );
            }
            (Some(a), _) => {
                let vip_mode = matches!(e.mode, EndpointMode::HaproxyKeepalived | EndpointMode::KubeVip);
                if vip_mode && a.parse::<IpAddr>().is_err() {
                    self.err(format!("{p}.address"), format!("the VIP `{a}` is not an IP address"));
                } else if !is_host_address(a) {
                    self.err(format!("{p}.address"), format!("`{a}` is not an IP address or host name"));
                }
                if vip_mode && let Some(h) = s.hosts.iter().find(|h| &h.address == a || h.internal_address.as_ref() == Some(a)) {
                    self.err(
                        format!("{p}.address"),
                        format!("the VIP {a} is already host `{}`'s address", h.name),
                    );
                }
                if e.mode == EndpointMode::LocalProxy {
                    self.err(
                        format!("{p}.address"),
                        "endpoint mode local-proxy uses 127.0.0.1 on every node; remove address",
                    );
                }
            }
            (None, false) => {}
        }
        if e.port == 0 {
            self.err(format!("{p}.port"), "port 0 is not a valid API server port");
        }
        if e.mode == EndpointMode::HaproxyKeepalived && s.role_groups.loadbalancer.is_empty() {
            self.hinted(
                "spec.roleGroups.loadbalancer",
                "endpoint mode haproxy-keepalived needs loadbalancer hosts",
                "list two or more hosts under roleGroups.loadbalancer to hold the VIP",
            );
        }
        if !is_host_address(&e.domain) {
            self.err(format!("{p}.domain"), format!("`{}` is not a DNS name", e.domain));
        }
    }

    fn networks(&mut self, s: &Spec) {
        let k = &s.kubernetes;
        let mut blocks = Vec::new();
        for (field, text) in [
            ("serviceCIDR", Some(&k.service_cidr)),
            ("podCIDR", Some(&k.pod_cidr)),
            ("nodeCIDR", k.node_cidr.as_ref()),
        ] {
            let Some(text) = text else { continue };
            match Cidr::parse(text) {
                Some(c) => blocks.push((field, text, c)),
                None => self.err(
                    format!("spec.kubernetes.{field}"),
                    format!("`{text}` is not a CIDR (address/prefix)"),
                ),
            }
        }
        for (i, (fa, ta, a)) in blocks.iter().enumerate() {
            for (fb, tb, b) in &blocks[i + 1..] {
                if a.overlaps(b) {
                    self.hinted(
                        format!("spec.kubernetes.{fb}"),
                        format!("{fb} {tb} overlaps {fa} {ta}"),
                        "pod, service and node networks must not share addresses",
                    );
                }
            }
        }
        for (i, h) in s.hosts.iter().enumerate() {
            let Ok(ip) = h.internal_address.as_deref().unwrap_or(&h.address).parse::<IpAddr>() else {
                continue;
            };
            for (field, text, c) in blocks.iter().filter(|b| b.0 != "nodeCIDR") {
                if c.contains(ip) {
                    self.err(
                        format!("spec.hosts[{i}].address"),
                        format!("host `{}` address {ip} is inside {field} {text}", h.name),
                    );
                }
            }
        }
        if let Some(vip) = s.control_plane_endpoint.address.as_deref().and_then(|a| a.parse::<IpAddr>().ok()) {
            for (field, text, c) in blocks.iter().filter(|b| b.0 != "nodeCIDR") {
                if c.contains(vip) {
                    self.err(
                        "spec.controlPlaneEndpoint.address",
                        format!("the endpoint address {vip} is inside {field} {text}"),
                    );
                }
            }
        }
        if !is_host_address(&k.dns_domain) {
            self.err("spec.kubernetes.dnsDomain", format!("`{}` is not a DNS domain", k.dns_domain));
        }
    }

    fn versions(&mut self, s: &Spec) {
        let Some(catalog) = self.catalog else { return };
        let v = &s.kubernetes.version;
        if !v.is_empty() && !catalog.kubernetes_versions().contains(v) {
            let known = catalog.kubernetes_versions();
            let minor = Catalog::minor_of(v);
            let same_minor: Vec<_> = known.iter().filter(|k| Catalog::minor_of(k) == minor).cloned().collect();
            let hint = if same_minor.is_empty() {
                format!("known minors: {}", catalog.minors.keys().cloned().collect::<Vec<_>>().join(", "))
            } else {
                format!("{minor} versions the catalog has: {}", same_minor.join(", "))
            };
            self.hinted(
                "spec.kubernetes.version",
                format!("Kubernetes {v} is not in the catalog"),
                format!("{hint}; {}", self.more()),
            );
        }
        let etcd = s.etcd.version.as_deref().filter(|_| s.etcd.mode == EtcdMode::Binary);
        let runtime = s.container_runtime.version.as_deref();
        for (path, component, version) in [
            ("spec.etcd.version", "etcd", etcd),
            ("spec.containerRuntime.version", "containerd", runtime),
        ] {
            let Some(version) = version else { continue };
            let Some(comp) = catalog.component(component) else { continue };
            if !comp.versions.contains_key(version) {
                let known: Vec<_> = comp.versions.keys().rev().take(6).cloned().collect();
                self.hinted(
                    path,
                    format!("{component} {version} is not in the catalog"),
                    format!("newest known: {}; {}", known.join(", "), self.more()),
                );
            }
        }
        for (i, arch) in s.bundle.arches.iter().enumerate() {
            self.arch(&format!("spec.bundle.arches[{i}]"), arch);
        }
        if s.bundle.arches.is_empty() {
            self.hinted("spec.bundle.arches", "no arches", "list amd64, arm64 or both");
        }
    }

    fn kubelet(&mut self, s: &Spec) {
        let k = &s.kubernetes;
        if k.kubelet.cgroup_v1 && kubernetes_minor(&k.version).is_some_and(|m| m >= 38) {
            self.hinted(
                "spec.kubernetes.kubelet.cgroupV1",
                format!(
                    "kubelet {} no longer runs on cgroup v1 hosts (1.37 is the last that can)",
                    k.version
                ),
                "move the hosts to cgroup v2 (systemd.unified_cgroup_hierarchy=1), or use Kubernetes 1.37",
            );
        }
        for (i, name) in k.kubeadm.ignore_preflight_errors.iter().enumerate() {
            let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
            if !ok {
                self.hinted(
                    format!("spec.kubernetes.kubeadm.ignorePreflightErrors[{i}]"),
                    format!("`{name}` is not a kubeadm preflight check name"),
                    "use kubeadm's names, e.g. SystemVerification or FileContent--proc-sys-net-ipv4-ip_forward",
                );
            }
        }
        if let Some(t) = k.kubeadm.control_plane_timeout_seconds
            && !(30..=3600).contains(&t)
        {
            self.err(
                "spec.kubernetes.kubeadm.controlPlaneTimeoutSeconds",
                format!("{t} s is outside 30 to 3600"),
            );
        }
    }

    fn addon_version(&mut self, path: &str, addon: &str, version: Option<&str>) {
        let (Some(v), Some(a)) = (version, self.catalog.and_then(|c| c.addon(addon))) else {
            return;
        };
        if !a.versions.iter().any(|k| k == v) {
            self.hinted(
                path,
                format!("{addon} {v} is not in the catalog"),
                format!("known: {}; {}", a.versions.join(", "), self.more()),
            );
        }
    }

    fn addons(&mut self, s: &Spec) {
        self.addon_version(
            "spec.network.version",
            network_addon(s.network.plugin),
            s.network.version.as_deref(),
        );
        self.addon_version("spec.network.multus.version", "multus", s.network.multus.version.as_deref());
        self.addon_version(
            "spec.dns.nodelocaldns.version",
            "nodelocaldns",
            s.dns.nodelocaldns.version.as_deref(),
        );
        self.addon_version(
            "spec.loadBalancerService.metallb.version",
            "metallb",
            s.load_balancer_service.metallb.version.as_deref(),
        );
        if let Some(name) = storage_addon(s.storage.provider) {
            self.addon_version("spec.storage.version", name, s.storage.version.as_deref());
        }
        if s.dns.nodelocaldns.enabled && s.dns.nodelocaldns.ip.parse::<IpAddr>().is_err() {
            self.err(
                "spec.dns.nodelocaldns.ip",
                format!("`{}` is not an IP address", s.dns.nodelocaldns.ip),
            );
        }
        let m = &s.load_balancer_service.metallb;
        if m.enabled && m.address_pools.iter().all(|p| p.addresses.is_empty()) {
            self.hinted(
                "spec.loadBalancerService.metallb",
                "MetalLB is enabled with no address pool",
                "add addressPools with a name and CIDRs or first-last ranges",
            );
        }
        for (i, pool) in m.address_pools.iter().enumerate() {
            for (j, a) in pool.addresses.iter().enumerate() {
                let ok = Cidr::parse(a).is_some()
                    || a.split_once('-')
                        .is_some_and(|(x, y)| x.parse::<IpAddr>().is_ok() && y.parse::<IpAddr>().is_ok());
                if !ok {
                    self.err(
                        format!("spec.loadBalancerService.metallb.addressPools[{i}].addresses[{j}]"),
                        format!("`{a}` is neither a CIDR nor a first-last range"),
                    );
                }
            }
        }
    }

    fn registry(&mut self, s: &Spec) {
        let r = &s.registry;
        super::registry_auth::check(r).into_iter().for_each(|d| self.push(|| d));
        match r.mode {
            RegistryMode::External if r.address.as_deref().is_none_or(str::is_empty) => {
                self.hinted(
                    "spec.registry",
                    "registry mode external needs an address",
                    "set registry.address to host[:port] of the site registry",
                );
            }
            RegistryMode::Local if r.port == 0 => {
                self.err("spec.registry.port", "port 0 is not a valid registry port");
            }
            _ => {}
        }
        if let Some(pw) = &r.password {
            self.secret("spec.registry.password", pw);
        }
        for (i, a) in s.container_runtime.auths.iter().enumerate() {
            if let Some(pw) = &a.password {
                self.secret(&format!("spec.containerRuntime.auths[{i}].password"), pw);
            }
        }
    }

    fn bundle(&mut self, s: &Spec) {
        let b = &s.bundle;
        for (i, img) in b.extra_images.iter().enumerate() {
            if let Err(e) = ImageRef::parse(img) {
                self.err(format!("spec.bundle.extraImages[{i}]"), e.to_string());
            }
        }
        for (i, c) in b.charts.iter().enumerate() {
            let p = format!("spec.bundle.charts[{i}]");
            let sources = [c.repo.is_some(), c.url.is_some(), c.oci.is_some()].iter().filter(|x| **x).count();
            if sources != 1 {
                self.hinted(
                    p.clone(),
                    format!("chart `{}` needs exactly one source", c.name),
                    "set one of repo (a chart repository), url (a .tgz) or oci (oci://...)",
                );
            }
            let pinned = c
                .sha256
                .as_deref()
                .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()));
            if c.url.is_some() && !pinned {
                self.hinted(
                    format!("{p}.sha256"),
                    format!("chart `{}` comes from a plain URL and needs its sha256 (64 hex digits)", c.name),
                    "nothing is carried into the bundle unverified; repositories and OCI registries supply digests themselves",
                );
            }
            if c.name.is_empty() || c.version.is_empty() {
                self.err(p, "a chart needs a name and a version");
            }
        }
        for (i, f) in b.files.iter().enumerate() {
            let p = format!("spec.bundle.files[{i}]");
            if f.sha256.len() != 64 || !f.sha256.bytes().all(|c| c.is_ascii_hexdigit()) {
                self.hinted(
                    format!("{p}.sha256"),
                    format!("file `{}` needs a sha256 of 64 hex digits", f.name),
                    "nothing is carried into the bundle unverified",
                );
            }
            if let Some(a) = &f.arch {
                self.arch(&format!("{p}.arch"), a);
            }
        }
        if let Some(os) = &b.os_packages {
            self.os_packages(os);
        }
        for (from, to) in &b.mirrors {
            let p = format!("spec.bundle.mirrors.{from}");
            if from.contains("://") || from.is_empty() {
                self.err(
                    p.clone(),
                    format!("mirror key `{from}` must be an upstream host, optionally with a path (dl.k8s.io, github.com/org)"),
                );
            }
            if !(to.starts_with("https://") || to.starts_with("http://")) {
                self.err(p, format!("mirror `{to}` must be an http:// or https:// base URL"));
            }
        }
    }
}

impl Rules<'_> {
    fn os_packages(&mut self, os: &OsPackages) {
        let p = "spec.bundle.osPackages";
        if os.releases.is_empty() {
            self.hinted(
                format!("{p}.releases"),
                "osPackages needs at least one release",
                format!("known releases: {}", self.os_release_names()),
            );
        }
        for (i, r) in os.releases.iter().enumerate() {
            if self.catalog.is_some_and(|c| !c.os.releases.contains_key(r)) {
                self.hinted(
                    format!("{p}.releases[{i}]"),
                    format!("unknown OS release `{r}`"),
                    format!("known releases: {}", self.os_release_names()),
                );
            }
        }
        for (i, a) in os.arches.iter().enumerate() {
            self.arch(&format!("{p}.arches[{i}]"), a);
        }
        for (i, n) in os.extra.iter().enumerate() {
            let ok = n.len() >= 2
                && n.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
            if !ok {
                self.err(
                    format!("{p}.extra[{i}]"),
                    format!("`{n}` is not a Debian package name (lower case letters, digits, + - .)"),
                );
            }
        }
        if !(os.mirror.starts_with("http://") || os.mirror.starts_with("https://")) {
            self.hinted(
                format!("{p}.mirror"),
                "osPackages needs the http:// or https:// URL of a Debian mirror",
                "the URL whose dists/<codename>/InRelease the builder reads, e.g. your site's Debian mirror",
            );
        }
    }

    fn os_release_names(&self) -> String {
        self.catalog
            .into_iter()
            .flat_map(|c| c.os.releases.keys())
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn mode_name(m: EndpointMode) -> &'static str {
    match m {
        EndpointMode::HaproxyKeepalived => "haproxy-keepalived",
        EndpointMode::KubeVip => "kube-vip",
        EndpointMode::External => "external",
        EndpointMode::LocalProxy => "local-proxy",
    }
}

/// `v1.37.2` → 37.
pub fn kubernetes_minor(version: &str) -> Option<u32> {
    version.trim_start_matches('v').split('.').nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_on_cgroup_v1_ends_with_1_37() -> Result<(), Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(format!("{}/../examples/ha.yaml", env!("CARGO_MANIFEST_DIR")))?;
        let mut c = crate::config::load_str(&text, "ha.yaml", &Catalog::builtin()?)?;
        c.spec.kubernetes.kubelet.cgroup_v1 = true;
        c.spec.kubernetes.version = "v1.37.2".into();
        assert!(!check(&c, None).iter().any(|d| d.path == "spec.kubernetes.kubelet.cgroupV1"));
        c.spec.kubernetes.version = "v1.38.0".into();
        let d = check(&c, None);
        let d = d
            .iter()
            .find(|d| d.path == "spec.kubernetes.kubelet.cgroupV1")
            .ok_or("no diagnostic")?;
        assert!(d.message.contains("kubelet v1.38.0 no longer runs on cgroup v1"), "{}", d.message);
        assert_eq!(kubernetes_minor("v1.37.2"), Some(37));
        Ok(())
    }
}
