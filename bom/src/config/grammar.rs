//! The grammar of every cluster.yaml string that reaches a host (issue 25):
//! a time zone name, an interface name, a Kubernetes quantity, a label, a
//! user name, a registry host, a URL, a version. Checked once at
//! validation, each problem at its line:column, so no value can carry
//! quoting, a newline or a placeholder into a shell step or a generated
//! file. The installer still quotes and escapes: this is the first wall,
//! not the only one. Strings that never reach a host are listed, with why,
//! in `manifests/config-strings-off-host.yaml`.

use std::net::IpAddr;

use super::model::*;
use crate::diag::{Diagnostic, Kind};
use crate::net::{is_dns_label, is_host_address};

/// The eviction signals the kubelet knows (KubeletConfiguration
/// `evictionHard`).
pub const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// Every grammar problem in `c`.
pub fn check(c: &Cluster) -> Vec<Diagnostic> {
    let mut g = Grammar(Vec::new());
    g.labels("metadata.labels", &c.metadata.labels);
    let s = &c.spec;
    g.user("spec.hostDefaults.user", s.host_defaults.user.as_deref());
    if let Some(b) = &s.host_defaults.bastion {
        g.user("spec.hostDefaults.bastion.user", b.user.as_deref());
    }
    for (i, h) in s.hosts.iter().enumerate() {
        let p = format!("spec.hosts[{i}]");
        g.user(&format!("{p}.user"), h.user.as_deref());
        if let Some(b) = &h.bastion {
            g.user(&format!("{p}.bastion.user"), b.user.as_deref());
        }
        g.labels(&format!("{p}.labels"), &h.labels);
        if let Some(a) = &h.arch {
            g.rule(&format!("{p}.arch"), a, is_arch, ARCH);
        }
    }
    if let Some(i) = &s.control_plane_endpoint.interface {
        g.rule("spec.controlPlaneEndpoint.interface", i, is_interface_name, INTERFACE);
    }
    if let Some(e) = &s.etcd.external {
        for (i, u) in e.endpoints.iter().enumerate() {
            g.rule(&format!("spec.etcd.external.endpoints[{i}]"), u, is_url, URL);
        }
    }
    for (signal, value) in &s.kubernetes.kubelet.eviction_hard {
        let p = "spec.kubernetes.kubelet.evictionHard";
        if !EVICTION_SIGNALS.contains(&signal.as_str()) {
            g.bad(
                p,
                format!("`{}` is not an eviction signal", shown(signal)),
                format!("use one of {}", EVICTION_SIGNALS.join(", ")),
            );
        }
        g.rule(&format!("{p}.{}", shown(signal)), value, is_threshold, THRESHOLD);
    }
    let rt = &s.container_runtime;
    for (i, r) in rt.insecure_registries.iter().enumerate() {
        g.rule(
            &format!("spec.containerRuntime.insecureRegistries[{i}]"),
            r,
            is_registry_host,
            REGISTRY_HOST,
        );
    }
    for (upstream, mirrors) in &rt.registry_mirrors {
        if !is_registry_host(upstream) {
            g.bad(
                "spec.containerRuntime.registryMirrors",
                format!("`{}` is not a registry host", shown(upstream)),
                REGISTRY_HOST,
            );
        }
        for (i, m) in mirrors.iter().enumerate() {
            g.rule(
                &format!("spec.containerRuntime.registryMirrors.{}[{i}]", shown(upstream)),
                m,
                is_url,
                URL,
            );
        }
    }
    for (i, a) in rt.auths.iter().enumerate() {
        let p = format!("spec.containerRuntime.auths[{i}]");
        g.rule(&format!("{p}.registry"), &a.registry, is_registry_host, REGISTRY_HOST);
        g.rule(&format!("{p}.username"), &a.username, is_user_token, USER_TOKEN);
    }
    for (p, v) in [
        ("spec.network.version", &s.network.version),
        ("spec.network.multus.version", &s.network.multus.version),
        ("spec.dns.coredns.version", &s.dns.coredns.version),
        ("spec.dns.nodelocaldns.version", &s.dns.nodelocaldns.version),
        ("spec.storage.version", &s.storage.version),
        ("spec.loadBalancerService.metallb.version", &s.load_balancer_service.metallb.version),
        ("spec.etcd.version", &s.etcd.version),
        ("spec.containerRuntime.version", &rt.version),
    ] {
        if let Some(v) = v {
            g.rule(p, v, is_version, VERSION);
        }
    }
    if !s.dns.nodelocaldns.ip.is_empty() && s.dns.nodelocaldns.ip.parse::<IpAddr>().is_err() {
        g.bad(
            "spec.dns.nodelocaldns.ip",
            format!("`{}` is not an IP address", shown(&s.dns.nodelocaldns.ip)),
            "write an address such as 169.254.25.10",
        );
    }
    for (i, pool) in s.load_balancer_service.metallb.address_pools.iter().enumerate() {
        g.rule(
            &format!("spec.loadBalancerService.metallb.addressPools[{i}].name"),
            &pool.name,
            is_dns_subdomain,
            "a pool name is a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253",
        );
    }
    let r = &s.registry;
    if let Some(a) = &r.address {
        g.rule("spec.registry.address", a, is_registry_host, REGISTRY_HOST);
    }
    if let Some(p) = &r.prefix {
        g.rule("spec.registry.prefix", p, is_repository_path, REPOSITORY_PATH);
    }
    if let Some(u) = &r.username {
        g.rule("spec.registry.username", u, is_user_token, USER_TOKEN);
    }
    for (i, n) in s.system.ntp_servers.iter().enumerate() {
        g.rule(
            &format!("spec.system.ntpServers[{i}]"),
            n,
            is_host_address,
            "write an IP address or a host name",
        );
    }
    if let Some(tz) = &s.system.timezone {
        g.rule("spec.system.timezone", tz, is_time_zone, TIME_ZONE);
    }
    for (i, f) in s.bundle.files.iter().enumerate() {
        let p = format!("spec.bundle.files[{i}]");
        g.rule(&format!("{p}.name"), &f.name, is_file_name, FILE_NAME);
        g.rule(&format!("{p}.url"), &f.url, is_url, URL);
    }
    bundle(&mut g, &s.bundle);
    g.0
}

/// The bundle's own strings: read by the builder on the online side, where
/// they name files, URLs and packages.
fn bundle(g: &mut Grammar, b: &BundleSpec) {
    for (i, a) in b.arches.iter().enumerate() {
        g.rule(&format!("spec.bundle.arches[{i}]"), a, is_arch, ARCH);
    }
    for (i, f) in b.files.iter().enumerate() {
        if let Some(a) = &f.arch {
            g.rule(&format!("spec.bundle.files[{i}].arch"), a, is_arch, ARCH);
        }
    }
    for (i, c) in b.charts.iter().enumerate() {
        let p = format!("spec.bundle.charts[{i}]");
        g.rule(&format!("{p}.name"), &c.name, is_chart_name, CHART_NAME);
        g.rule(&format!("{p}.version"), &c.version, is_version, VERSION);
        for (field, v) in [("repo", &c.repo), ("url", &c.url)] {
            if let Some(v) = v {
                g.rule(&format!("{p}.{field}"), v, is_url, URL);
            }
        }
        if let Some(h) = &c.sha256 {
            g.rule(&format!("{p}.sha256"), h, is_sha256, "a sha256 is 64 hex digits");
        }
        if let Some(o) = &c.oci {
            g.rule(&format!("{p}.oci"), o, is_oci_ref, "write oci://host[:port]/path");
        }
    }
    for (from, to) in &b.mirrors {
        if !is_upstream_prefix(from) {
            g.bad(
                "spec.bundle.mirrors",
                format!("`{}` is not an upstream host with an optional path", shown(from)),
                "write dl.k8s.io or github.com/org",
            );
        } else {
            g.rule(&format!("spec.bundle.mirrors.{from}"), to, is_url, URL);
        }
    }
    if let Some(os) = &b.os_packages {
        for (i, name) in os.extra.iter().enumerate() {
            g.rule(
                &format!("spec.bundle.osPackages.extra[{i}]"),
                name,
                is_package_name,
                "a Debian package name: lowercase letters, digits, '+', '-' and '.'",
            );
        }
        if !os.mirror.is_empty() {
            g.rule("spec.bundle.osPackages.mirror", &os.mirror, is_url, URL);
        }
    }
}

const ARCH: &str = "an arch is a Go architecture name such as amd64 or arm64";
const CHART_NAME: &str = "a chart name is lowercase letters, digits, '-', '.' and '_'";
const INTERFACE: &str = "a network interface name is 1 to 15 letters, digits, '.', '_' and '-' (such as eth0 or ens3.100)";
const URL: &str = "write an http:// or https:// URL of letters, digits and - . _ ~ : / @ % + = , ! * ( ) [ ] ? &";
const THRESHOLD: &str = "a threshold is a quantity (100Mi, 1Gi, 500) or a percentage (10%)";
const REGISTRY_HOST: &str = "write a registry as host or host:port (registry.example.com:5000, 10.0.0.5:5000)";
const USER_TOKEN: &str = "a user name is 1 to 256 letters, digits and . _ @ + - $ (Harbor's robot$project+name)";
const VERSION: &str = "a version is letters, digits, '.', '+', '-' and '_' (such as v1.33.4 or 3.6.5)";
const REPOSITORY_PATH: &str = "a repository prefix is lowercase path components of letters, digits, '.', '_' and '-' joined by '/'";
const TIME_ZONE: &str = "write a tz database name such as Etc/UTC or Europe/Berlin";
const FILE_NAME: &str = "a file name is letters, digits, '.', '_' and '-', not starting with '.'";
const LABEL_KEY: &str = "a label key is [prefix/]name: name up to 63 letters, digits, '-', '_' and '.', starting and ending alphanumeric";
const LABEL_VALUE: &str = "a label value is up to 63 letters, digits, '-', '_' and '.', starting and ending alphanumeric, or empty";
const USER: &str = "a login name is 1 to 256 letters, digits and . _ @ + -, starting with a letter, digit or '_'";

struct Grammar(Vec<Diagnostic>);

impl Grammar {
    fn bad(&mut self, path: &str, msg: String, hint: impl Into<String>) {
        self.0.push(Diagnostic::new(Kind::Invalid, path, msg).hint(hint));
    }

    fn rule(&mut self, path: &str, v: &str, ok: fn(&str) -> bool, hint: &str) {
        if !ok(v) {
            let field = path.rsplit('.').next().unwrap_or(path);
            self.bad(path, format!("`{}` is not a valid {}", shown(v), describe(field)), hint);
        }
    }

    fn user(&mut self, path: &str, u: Option<&str>) {
        if let Some(u) = u {
            self.rule(path, u, is_user_name, USER);
        }
    }

    fn labels(&mut self, path: &str, labels: &std::collections::BTreeMap<String, String>) {
        for (k, v) in labels {
            if !is_label_key(k) {
                self.bad(path, format!("`{}` is not a valid label key", shown(k)), LABEL_KEY);
            } else {
                self.rule(&format!("{path}.{k}"), v, is_label_value, LABEL_VALUE);
            }
        }
    }
}

/// A field's name in words for a message (`ntpServers[0]` → NTP server).
fn describe(field: &str) -> &'static str {
    let f = field.split('[').next().unwrap_or(field);
    match f {
        "interface" => "network interface name",
        "endpoints" | "url" => "URL",
        "insecureRegistries" | "registry" | "address" => "registry host",
        "username" => "user name",
        "version" => "version",
        "name" => "name",
        "prefix" => "repository prefix",
        "ntpServers" => "NTP server",
        "timezone" => "time zone",
        _ if f.contains("available") || f.contains("inodes") => "eviction threshold",
        _ => "value",
    }
}

/// A value as a message shows it: control characters escaped, long ones cut.
fn shown(v: &str) -> String {
    let mut out: String = v.chars().take(80).flat_map(char::escape_default).collect();
    if v.chars().count() > 80 {
        out.push('…');
    }
    out
}

fn all(v: &str, ok: impl Fn(u8) -> bool) -> bool {
    v.bytes().all(ok)
}

/// A Linux interface name: at most 15 bytes (IFNAMSIZ less the NUL).
pub fn is_interface_name(v: &str) -> bool {
    (1..=15).contains(&v.len()) && all(v, |b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) && v != "." && v != ".."
}

/// A tz database name: components of letters, digits, '_', '+' and '-'
/// joined by '/' (Etc/GMT+5, America/Argentina/Buenos_Aires, UTC).
pub fn is_time_zone(v: &str) -> bool {
    (1..=64).contains(&v.len())
        && v.split('/').all(|c| {
            !c.is_empty()
                && c.as_bytes()[0].is_ascii_alphabetic()
                && all(c, |b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-'))
        })
}

/// A Kubernetes quantity (`100Mi`, `1.5Gi`, `500`, `2k`) or a percentage
/// (`10%`, `5.5%`), as an eviction threshold.
pub fn is_threshold(v: &str) -> bool {
    let number = |n: &str| {
        let mut parts = n.splitn(2, '.');
        let whole = parts.next().unwrap_or("");
        let frac = parts.next();
        !whole.is_empty() && all(whole, |b| b.is_ascii_digit()) && frac.is_none_or(|f| !f.is_empty() && all(f, |b| b.is_ascii_digit()))
    };
    if let Some(n) = v.strip_suffix('%') {
        return number(n);
    }
    let suffix = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "m", ""]
        .iter()
        .find(|s| v.ends_with(*s) && number(&v[..v.len() - s.len()]));
    v.len() <= 32 && suffix.is_some()
}

/// `host` or `host:port`, the host an IP address or DNS name (IPv6 in
/// brackets with a port).
pub fn is_registry_host(v: &str) -> bool {
    if is_host_address(v) {
        return true;
    }
    let Some((host, port)) = v.rsplit_once(':') else { return false };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    is_host_address(host) && port.parse::<u16>().is_ok_and(|p| p > 0)
}

/// An http(s) URL of URL characters only: no quote, backslash, space,
/// `$`, backquote, `{`, `}`, `<`, `>`, `|`, `^`, `;`, `!`, `*`, `(`, `)`
/// or control character. Still not shell-safe (`&`, `?`, `#`): kubexm
/// quotes every argument it builds.
pub fn is_url(v: &str) -> bool {
    let rest = v.strip_prefix("https://").or_else(|| v.strip_prefix("http://"));
    rest.is_some_and(|r| {
        let host = r.split(['/', '?', '#']).next().unwrap_or("");
        !host.is_empty()
            && v.len() <= 2048
            && all(v, |b| {
                b.is_ascii_alphanumeric()
                    || matches!(
                        b,
                        b'-' | b'.' | b'_' | b'~' | b':' | b'/' | b'@' | b'%' | b'+' | b'=' | b',' | b'[' | b']' | b'?' | b'&' | b'#'
                    )
            })
    })
}

/// An upstream host with an optional path, as `bundle.mirrors` keys it
/// (`dl.k8s.io`, `github.com/org`).
pub fn is_upstream_prefix(v: &str) -> bool {
    let (host, path) = v.split_once('/').unwrap_or((v, ""));
    is_registry_host(host)
        && v.len() <= 512
        && (path.is_empty()
            || path.split('/').all(|c| {
                !c.is_empty() && c != "." && c != ".." && all(c, |b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            }))
}

/// A chart name as Helm writes them: lowercase letters, digits, '-', '.' and '_'.
pub fn is_chart_name(v: &str) -> bool {
    (1..=253).contains(&v.len())
        && v.as_bytes()[0].is_ascii_alphanumeric()
        && all(v, |b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_')
        })
}

/// An OCI reference to a chart: `oci://host[:port]/path`.
pub fn is_oci_ref(v: &str) -> bool {
    v.strip_prefix("oci://").is_some_and(|r| is_upstream_prefix(r) && r.contains('/'))
}

/// A Go architecture name (`amd64`, `arm64`, `ppc64le`).
pub fn is_arch(v: &str) -> bool {
    (1..=16).contains(&v.len()) && all(v, |b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// A sha256 in hex.
pub fn is_sha256(v: &str) -> bool {
    v.len() == 64 && all(v, |b| b.is_ascii_hexdigit())
}

/// A Debian package name (policy 5.6.1).
pub fn is_package_name(v: &str) -> bool {
    (2..=128).contains(&v.len())
        && (v.as_bytes()[0].is_ascii_lowercase() || v.as_bytes()[0].is_ascii_digit())
        && all(v, |b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.')
        })
}

/// A registry login: letters, digits and `. _ @ + - $` (Harbor's robot
/// accounts are `robot$project+name`).
pub fn is_user_token(v: &str) -> bool {
    (1..=256).contains(&v.len())
        && all(v, |b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'+' | b'-' | b'$')
        })
}

/// A login name as SSH and a directory service write it (`ops`,
/// `John.Doe`, `jdoe@corp.example`, `svc_deploy`).
pub fn is_user_name(v: &str) -> bool {
    (1..=256).contains(&v.len())
        && (v.as_bytes()[0].is_ascii_alphanumeric() || v.as_bytes()[0] == b'_')
        && all(v, |b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'+' | b'-'))
}

/// A version as the catalog writes them (`v1.33.4`, `3.6.5`, `1.7.27+k3s1`).
pub fn is_version(v: &str) -> bool {
    (1..=64).contains(&v.len())
        && v.as_bytes()[0].is_ascii_alphanumeric()
        && all(v, |b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b'_'))
}

/// A repository path prefix (`mirror/kubexm`).
pub fn is_repository_path(v: &str) -> bool {
    (1..=255).contains(&v.len())
        && v.split('/').all(|c| {
            !c.is_empty()
                && c.as_bytes()[0].is_ascii_alphanumeric()
                && all(c, |b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
                })
        })
}

/// A file name of its own (no directory, not hidden).
pub fn is_file_name(v: &str) -> bool {
    (1..=255).contains(&v.len()) && !v.starts_with('.') && all(v, |b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A DNS-1123 subdomain (a Kubernetes object name): DNS labels joined by '.'.
pub fn is_dns_subdomain(v: &str) -> bool {
    v.len() <= 253 && v.split('.').all(is_dns_label)
}

fn is_label_name(v: &str) -> bool {
    (1..=63).contains(&v.len())
        && v.as_bytes()[0].is_ascii_alphanumeric()
        && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric()
        && all(v, |b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A Kubernetes label key: `[prefix/]name`, the prefix a DNS subdomain.
pub fn is_label_key(v: &str) -> bool {
    match v.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(v),
    }
}

/// A Kubernetes label value: empty, or a label name.
pub fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_label_name(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammars_take_real_values_and_refuse_code() {
        for tz in ["Etc/UTC", "UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires", "Etc/GMT+5"] {
            assert!(is_time_zone(tz), "{tz}");
        }
        for bad in ["x'; id; '", "../../etc/shadow", "Etc/", "/UTC", "a b", "Etc/UTC\n"] {
            assert!(!is_time_zone(bad), "{bad:?}");
        }
        for i in ["eth0", "ens3.100", "br-lab", "enp0s31f6"] {
            assert!(is_interface_name(i), "{i}");
        }
        for bad in ["x/;e id #", "eth0\nnotify", "", "sixteen_chars_xx", "a b", ".."] {
            assert!(!is_interface_name(bad), "{bad:?}");
        }
        for t in ["100Mi", "1.5Gi", "10%", "5.5%", "500", "2k"] {
            assert!(is_threshold(t), "{t}");
        }
        for bad in ["10%\"\nx: y", "Mi", "%", "1.Gi", "{{TOKEN}}", "-1"] {
            assert!(!is_threshold(bad), "{bad:?}");
        }
        assert!(is_registry_host("r.example:5000") && is_registry_host("10.0.0.5") && is_registry_host("[fd00::1]:5000"));
        assert!(!is_registry_host("r.example:0") && !is_registry_host("r'x"));
        assert!(is_url("https://mirror.example/v2/?a=b&c=d") && !is_url("https://x/$(id)") && !is_url("ftp://x"));
        assert!(is_label_key("node-role.kubernetes.io/edge") && is_label_value("") && !is_label_value("a b"));
        assert!(is_user_name("kubexm") && is_user_name("John.Doe") && is_user_name("jdoe@corp.example"));
        assert!(!is_user_name("root;id") && !is_user_name("-oProxyCommand=x") && !is_user_name("a b"));
        assert!(is_user_token("robot$proj+ci") && !is_user_token("$(id)"));
        for tz in ["America/Port-au-Prince", "Etc/GMT-14"] {
            assert!(is_time_zone(tz), "{tz}");
        }
        assert!(is_interface_name("bond0.100") && is_dns_subdomain("pool.a") && !is_url("https://x/(a)"));
    }
}
