//! Host paths a config names (etcd's data directory, containerd's root,
//! the local storage path): directories kubexm creates on every host it
//! applies to and that reset removes. One rule: absolute, normalized,
//! shell-safe, and never a system directory, an ancestor of one, or inside
//! the system's own trees.

/// Directories a config may never name as a host path, nor an ancestor of:
/// reset removes what a host path names, on every host it applies to.
const SYSTEM_DIRS: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/var/lib",
    "/var/log",
    "/var/cache",
    "/var/tmp",
    "/var/spool",
    "/var/mail",
    "/var/backups",
    "/var/opt",
    "/var/local",
    "/var/lib/kubelet",
    "/var/lib/kubexm",
    "/var/lib/dpkg",
    "/var/lib/apt",
    "/var/lib/systemd",
];

/// Trees no host path may lie inside (the system's own files).
const SYSTEM_TREES: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var/backups",
    "/var/cache",
    "/var/lib/apt",
    "/var/lib/dpkg",
    "/var/lib/kubelet",
    "/var/lib/kubexm",
    "/var/lib/systemd",
    "/var/log",
    "/var/mail",
    "/var/spool",
    "/var/tmp",
];

/// Why `p` cannot be a host path that kubexm creates and may remove, if it
/// cannot: it must be absolute, normalized (no `.`, `..`, `//` or trailing
/// `/`), made of letters, digits, `.`, `_`, `-` and `/`, and neither a
/// system directory, an ancestor of one, nor inside the system's own trees.
pub fn host_path_problem(p: &str) -> Option<String> {
    if !p.starts_with('/') {
        return Some(format!("`{p}` is not an absolute path"));
    }
    if let Some(c) = p
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return Some(format!("`{p}` holds {c:?}; a host path is letters, digits, '.', '_', '-' and '/'"));
    }
    if p == "/" {
        return Some("`/` is the root of the host's file system".into());
    }
    if p.ends_with('/') || p.split('/').skip(1).any(|c| c.is_empty() || c == "." || c == "..") {
        return Some(format!("`{p}` is not a normalized path (no `.`, `..`, `//` or trailing `/`)"));
    }
    let under = |p: &str, d: &str| p.len() > d.len() && p.starts_with(d) && p.as_bytes()[d.len()] == b'/';
    if let Some(d) = SYSTEM_DIRS.iter().find(|d| **d == p || under(d, p)) {
        return Some(format!("`{p}` is or holds the system directory {d}"));
    }
    if let Some(d) = SYSTEM_TREES.iter().find(|d| under(p, d)) {
        return Some(format!("`{p}` lies inside the system directory {d}"));
    }
    None
}
