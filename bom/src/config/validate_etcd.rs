//! The etcd part of the config's rules: the members for each mode, and
//! `etcd.backup` (its schedule goes into a systemd unit and its directory
//! into a script, so both are checked strictly), and the lifetime of the
//! leaf certificates kubexm issues (etcd's and the registry's).

use super::Rules;
use crate::config::host_paths::host_path_problem;
use crate::config::model::*;

impl Rules<'_> {
    pub(super) fn etcd(&mut self, s: &Spec) {
        let n = s.role_groups.etcd.len();
        match s.etcd.mode {
            EtcdMode::External => {
                let ext = s.etcd.external.as_ref();
                if ext.is_none_or(|e| e.endpoints.is_empty()) {
                    self.hinted(
                        "spec.etcd",
                        "etcd mode external needs endpoints",
                        "set etcd.external.endpoints, caFile, certFile and keyFile",
                    );
                }
                if n > 0 {
                    self.err("spec.roleGroups.etcd", "etcd hosts are listed, but etcd mode is external");
                }
            }
            EtcdMode::Binary | EtcdMode::Kubeadm if n == 0 => {
                self.hinted(
                    "spec.roleGroups.etcd",
                    "no etcd members",
                    "list 1, 3 or 5 hosts under roleGroups.etcd, or use etcd mode external",
                );
            }
            _ if n.is_multiple_of(2) => {
                self.hinted(
                    "spec.roleGroups.etcd",
                    format!("{n} etcd members; an even count tolerates no more failures than one member fewer and risks split votes"),
                    "use an odd number of members: 1, 3 or 5",
                );
            }
            _ => {}
        }
        if let Some(b) = &s.etcd.backup {
            self.etcd_backup(s, b);
        }
        if !(1..=3650).contains(&s.certificates.leaf_days) {
            self.hinted(
                "spec.certificates.leafDays",
                format!("leafDays {} is outside 1..3650", s.certificates.leaf_days),
                "leave it out for a year, or give the days a leaf certificate kubexm issues is valid",
            );
        }
        if !(1..=100).contains(&s.upgrade.max_unavailable) {
            self.hinted(
                "spec.upgrade.maxUnavailable",
                format!("maxUnavailable {} is outside 1..100", s.upgrade.max_unavailable),
                "leave it out for one worker at a time, or give how many workers may be out of service at once",
            );
        }
        if !(30..=86_400).contains(&s.upgrade.drain_timeout_seconds) {
            self.hinted(
                "spec.upgrade.drainTimeoutSeconds",
                format!("drainTimeoutSeconds {} is outside 30..86400", s.upgrade.drain_timeout_seconds),
                "leave it out for 600, or give the seconds a node's drain may take",
            );
        }
        if s.etcd.mode == EtcdMode::Kubeadm {
            for (i, m) in s.role_groups.etcd.iter().enumerate() {
                if !s.role_groups.control_plane.contains(m) {
                    self.err(
                        format!("spec.roleGroups.etcd[{i}]"),
                        format!("etcd mode kubeadm stacks etcd on control-plane nodes, but `{m}` is not one"),
                    );
                }
            }
        }
    }

    /// `etcd.backup`: binary mode only; its schedule goes into a systemd
    /// unit and its directory into a script, so both are checked strictly.
    fn etcd_backup(&mut self, s: &Spec, b: &EtcdBackup) {
        if s.etcd.mode != EtcdMode::Binary {
            self.err("spec.etcd.backup", "etcd.backup needs etcd mode binary (kubexm runs those members)");
        }
        let calendar = |c: char| c.is_ascii_alphanumeric() || " *:/,.~-".contains(c);
        if b.schedule.trim().is_empty() || b.schedule.len() > 64 || !b.schedule.chars().all(calendar) {
            self.hinted(
                "spec.etcd.backup.schedule",
                format!("`{}` is not a systemd calendar expression kubexm takes", b.schedule.escape_debug()),
                "write one like daily, hourly or *-*-* 02:30:00 (letters, digits, spaces and * : / , . ~ -)",
            );
        }
        if !(1..=1000).contains(&b.keep) {
            self.err("spec.etcd.backup.keep", format!("keep {} is outside 1..1000", b.keep));
        }
        let dir = b.directory.to_string_lossy();
        // Reset removes these (and etcd's data directory): backups kept there would go with them.
        let wiped = [
            s.etcd.data_dir.to_string_lossy().into_owned(),
            s.container_runtime.data_root.to_string_lossy().into_owned(),
            "/var/lib/containerd".into(),
            "/var/lib/cni".into(),
        ];
        let within = |d: &str| dir == d || dir.starts_with(&format!("{d}/"));
        let why = host_path_problem(&dir).or_else(|| {
            wiped
                .iter()
                .find(|d| within(d))
                .map(|d| format!("`{dir}` lies in {d}, which reset removes"))
        });
        if let Some(why) = why {
            self.hinted(
                "spec.etcd.backup.directory",
                format!("{why}; kubexm creates this directory on the etcd hosts and keeps it"),
                "name a directory of its own, such as /var/lib/etcd-backups",
            );
        }
    }
}
