//! One hop of an upgrade: its session (a hop before the last reads its own
//! bundle and the config at its version), the certificates checked against
//! the hop's longest run, the restore point (taken once per hop, kept), and
//! the hop's pipeline run as an `upgrade` job of the install's machinery.

use std::time::Duration;

use kubexm_bom::upgrade;

use super::super::error::{OpError, op};
use super::{HopDone, UpgradeOptions};
use crate::ops::session::Session;

/// A session for a hop before the last: the hop's bundle (given with
/// `--bundle`, by its path) and the config at the hop's version, its other
/// fields as they are.
pub(super) fn hop_session(session: &Session, o: &UpgradeOptions, hop: &upgrade::Hop) -> anyhow::Result<Session> {
    let Some((path, _)) = o.hop_bundles.get(hop.bundle - 1) else {
        return Err(anyhow::anyhow!("hop {} -> {} names a bundle that was not given", hop.from, hop.to));
    };
    let name = session.config_name().to_string();
    let text = session.config_text().ok_or_else(|| {
        op(
            OpError::Io,
            anyhow::anyhow!("{name} cannot be read again for the hop to {}", hop.to),
        )
    })?;
    let text = with_version(&text, &hop.to.to_string()).map_err(|e| {
        op(
            OpError::Config,
            anyhow::anyhow!("{name}: {e}: a hop to {} needs the config at that version", hop.to),
        )
    })?;
    let config = crate::ops::session::Config::Text {
        name: format!("{name} (at {}, for the hop from {})", hop.to, hop.bundle_name),
        text,
    };
    Session::open(&config, Some(std::path::Path::new(path)), None, session.settings().clone())
}

/// `text` (a cluster config) with its `spec.kubernetes.version` value
/// replaced by `version`, where the text has it, quoting kept; an error
/// when the config does not name one.
pub(crate) fn with_version(text: &str, version: &str) -> Result<String, String> {
    let located = kubexm_bom::yaml::parse(text).map_err(|e| e.message)?;
    let old = located.value["spec"]["kubernetes"]["version"]
        .as_str()
        .ok_or("it names no spec.kubernetes.version")?
        .to_string();
    let pos = located
        .pos("spec.kubernetes.version")
        .ok_or("spec.kubernetes.version has no position")?;
    let line_start: usize = text
        .split_inclusive('\n')
        .take(pos.line.saturating_sub(1) as usize)
        .map(str::len)
        .sum();
    let line = &text[line_start..];
    let col = line
        .char_indices()
        .nth(pos.column.saturating_sub(1) as usize)
        .map(|(i, _)| i)
        .ok_or("spec.kubernetes.version's position is past its line")?;
    // The position is the key's: `version`, its colon, then the value.
    let key = &text[line_start + col..];
    let after_key = key
        .strip_prefix("version")
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix(':'))
        .map(|r| r.trim_start_matches([' ', '\t']))
        .ok_or_else(|| format!("spec.kubernetes.version ({old}) is not where its position says"))?;
    let at = text.len() - after_key.len();
    let rest = after_key;
    let len = ["\"", "'", ""]
        .iter()
        .find(|q| rest.starts_with(&format!("{q}{old}{q}")))
        .map(|q| old.len() + 2 * q.len())
        .ok_or_else(|| format!("spec.kubernetes.version ({old}) is not written as a plain or quoted scalar"))?;
    let quote = &rest[..(len - old.len()) / 2];
    let out = format!("{}{quote}{version}{quote}{}", &text[..at], &text[at + len..]);
    let check = kubexm_bom::yaml::parse(&out).map_err(|e| e.message)?;
    if check.value["spec"]["kubernetes"]["version"].as_str() != Some(version) {
        return Err("spec.kubernetes.version could not be replaced".into());
    }
    Ok(out)
}

/// One hop on `session` (its bundle the hop's): the certificates checked,
/// the etcd snapshot, then the hop's pipeline as an `upgrade` job.
pub(super) fn run_hop(
    session: &Session,
    expect_digest: Option<String>,
    drain_timeout: Option<u32>,
    hop: upgrade::Hop,
    waves: Vec<upgrade::order::Wave>,
) -> anyhow::Result<HopDone> {
    let record = crate::ops::apply::installed(session)?;
    let spec = &session.cluster().spec;
    // Every certificate valid until the hop can have ended (kubeadm renews
    // the control plane's as it upgrades each node; not the CAs, etcd's or
    // the kubeconfigs of nodes not reached yet).
    let budget = hop_budget(&waves, drain_timeout.unwrap_or(spec.upgrade.drain_timeout_seconds));
    let certs = crate::ops::certs::check(session, 0)?;
    certs_last(&certs, crate::engine::state::now_ms() / 1000, budget)?;
    // The restore point: taken before the hop's first run, kept (not
    // pruned), and not taken again by a re-run of the same hop.
    let to = hop.to.to_string();
    let (snapshot, snapshot_reused) = match earlier_restore_point(session, &record, &to) {
        Some(s) => (s, true),
        None => {
            let o = crate::ops::etcd::SnapshotOptions {
                keep: crate::ops::etcd::KEEP,
                dir: None,
                label: Some(format!("before-{to}")),
            };
            (crate::ops::etcd::snapshot(session, &o)?, false)
        }
    };
    let now = session.bundle().map(|b| b.digest.clone());
    let older = record
        .bundle
        .as_deref()
        .filter(|d| Some(*d) != now.as_deref())
        .and_then(|d| d.strip_prefix("sha256:"))
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|h| vec![h.to_string()])
        .unwrap_or_default();
    let run = crate::pipelines::upgrade::HopRun {
        hop,
        waves,
        old_images: record
            .artifacts
            .iter()
            .filter(|a| a.kind == "image")
            .map(|a| a.name.clone())
            .collect(),
        older,
        drain_timeout,
    };
    let opts = crate::ops::install::InstallOptions {
        apply: true,
        expect_digest,
        etcd_before: Some(record.config.spec.role_groups.etcd.clone()),
        upgrade: Some(run),
        ..Default::default()
    };
    match crate::ops::install::install(session, &opts)? {
        crate::ops::install::InstallReport::Installed(installed) => Ok(HopDone {
            to,
            snapshot,
            snapshot_reused,
            installed,
        }),
        crate::ops::install::InstallReport::Plan(_) => Err(anyhow::anyhow!("an upgrade planned instead of upgrading")),
    }
}

/// The snapshot an earlier run of the hop to `to` took before changing
/// anything (`<cluster>-<stamp>-before-<to>.db` with its sidecar, taken
/// after the record's job ended), the newest; none when there is none.
fn earlier_restore_point(session: &Session, record: &kubexm_bom::record::ClusterRecord, to: &str) -> Option<crate::ops::etcd::Snapshot> {
    let name = &session.cluster().metadata.name;
    let dir = session.settings().root.join("clusters").join(name).join("snapshots");
    let suffix = format!("-before-{to}.db");
    let mut found: Vec<std::path::PathBuf> = fs_err::read_dir(&dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{name}-")) && n.ends_with(&suffix))
        })
        .collect();
    found.sort();
    found.into_iter().rev().find_map(|file| {
        let text = fs_err::read_to_string(crate::ops::etcd::sidecar(&file, "json")).ok()?;
        let info: crate::ops::etcd::SnapshotInfo = serde_json::from_str(&text).ok()?;
        (info.cluster == *name && info.taken >= record.job.finished).then_some(crate::ops::etcd::Snapshot {
            job: 0,
            file,
            info,
            pruned: Vec::new(),
        })
    })
}

/// How long a hop of `waves` may take at most: per wave, the drain's time
/// limit and 15 minutes (the node's kubeadm, kubelet and Ready), and 30
/// minutes more (pulls, addons).
fn hop_budget(waves: &[upgrade::order::Wave], drain_timeout_seconds: u32) -> Duration {
    let per_wave = u64::from(drain_timeout_seconds) + 15 * 60;
    Duration::from_secs(30 * 60 + per_wave * waves.len() as u64)
}

/// Refused (a host failure, exit 7) when a certificate of `certs` expires
/// before `now` plus `budget`, the hop's longest run: each one named, and
/// what to do.
fn certs_last(certs: &crate::ops::certs::CertsReport, now: i64, budget: Duration) -> anyhow::Result<()> {
    let end = now + budget.as_secs() as i64;
    let short: Vec<String> = certs
        .certs
        .iter()
        .filter(|c| c.not_after < end)
        .map(|c| format!("{} {} (expires {})", c.host, c.path, c.expires))
        .collect();
    if short.is_empty() {
        return Ok(());
    }
    Err(op(
        OpError::Host,
        anyhow::anyhow!(
            "{} certificate(s) of cluster {} expire before the hop could end (it may take up to {} min): renew them first \
             (kubexm-install certs renew), then run the upgrade again; nothing was changed:\n  {}",
            short.len(),
            certs.cluster,
            budget.as_secs() / 60,
            short.join("\n  ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 30: a hop before the last reads the config at its version: the
    /// text's `spec.kubernetes.version` replaced where it stands (block or
    /// flow style, quoted or not, a comment after it kept), nothing else.
    #[test]
    fn the_config_of_a_hop_names_the_hops_version_and_nothing_else_changes() -> Result<(), String> {
        let head = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n";
        for (kubernetes, want) in [
            (
                "  kubernetes:\n    version: v1.38.1   # the target\n",
                "  kubernetes:\n    version: v1.37.2   # the target\n",
            ),
            ("  kubernetes: {version: \"v1.38.1\"}\n", "  kubernetes: {version: \"v1.37.2\"}\n"),
            (
                "  kubernetes: {clusterName: x, version: 'v1.38.1'}\n",
                "  kubernetes: {clusterName: x, version: 'v1.37.2'}\n",
            ),
        ] {
            let text = format!("{head}{kubernetes}  upgrade: {{maxUnavailable: 1}}\n");
            let out = with_version(&text, "v1.37.2")?;
            assert_eq!(out, format!("{head}{want}  upgrade: {{maxUnavailable: 1}}\n"));
        }
        let e = with_version(&format!("{head}  upgrade: {{maxUnavailable: 1}}\n"), "v1.37.2")
            .err()
            .unwrap_or_default();
        assert!(e.contains("names no spec.kubernetes.version"), "{e}");
        Ok(())
    }

    /// Issue 30: a re-run of a hop keeps the restore point its first run
    /// took (labelled, after the record's job), not one of another hop or
    /// from before the record.
    #[test]
    fn a_rerun_of_a_hop_finds_the_restore_point_its_first_run_took() -> anyhow::Result<()> {
        let f = crate::ops::fixture::Fixture::installed()?;
        let s = f.session(crate::ops::fixture::CONFIG)?;
        let record = f.record()?;
        let dir = f.settings().root.join("clusters/s/snapshots");
        std::fs::create_dir_all(&dir)?;
        let put = |stamp: &str, label: &str, taken: i64| -> anyhow::Result<()> {
            let file = dir.join(format!("s-{stamp}{label}.db"));
            std::fs::write(&file, "db")?;
            let info = crate::ops::etcd::SnapshotInfo {
                cluster: "s".into(),
                cluster_id: "1".into(),
                members: vec![],
                host: "a".into(),
                endpoint: "https://10.0.0.1:2379".into(),
                taken,
                sha256: "00".into(),
                size: 2,
                etcd_ca: None,
            };
            std::fs::write(crate::ops::etcd::sidecar(&file, "json"), serde_json::to_string(&info)?)?;
            Ok(())
        };
        let after = record.job.finished + 1;
        put("20261128T080000.000Z", "", after)?;
        put("20261128T080100.000Z", "-before-v1.38.0", after)?;
        put("20200101T000000.000Z", "-before-v1.37.2", record.job.finished - 1)?;
        assert!(earlier_restore_point(&s, &record, "v1.37.2").is_none());
        put("20261128T080200.000Z", "-before-v1.37.2", after)?;
        put("20261128T080300.000Z", "-before-v1.37.2", after + 5)?;
        let found = earlier_restore_point(&s, &record, "v1.37.2").map(|s| s.file);
        assert_eq!(found, Some(dir.join("s-20261128T080300.000Z-before-v1.37.2.db")));
        Ok(())
    }

    /// Issue 30: the hop's preflight refuses a certificate that would expire
    /// before the hop could end, naming it, and passes one that outlasts it.
    #[test]
    fn a_certificate_expiring_within_the_hops_budget_is_refused() {
        let wave = |h: &str| upgrade::order::Wave {
            action: upgrade::order::Action::KubeadmNode { runtime: false },
            hosts: vec![h.into()],
        };
        let budget = hop_budget(&[wave("a"), wave("b")], 600);
        assert_eq!(budget, Duration::from_secs(30 * 60 + 2 * (600 + 900)));
        let cert = |path: &str, not_after: i64| crate::ops::certs::CertInfo {
            host: "a".into(),
            path: path.into(),
            subject: "CN=x".into(),
            issuer: "CN=ca".into(),
            ca: false,
            not_after,
            expires: format!("t{not_after}"),
            days_left: 0,
        };
        let now = 1_000_000;
        let report = |certs| crate::ops::certs::CertsReport {
            cluster: "lab".into(),
            job: 1,
            warn_days: 0,
            certs,
            expiring: 0,
        };
        let ends = now + budget.as_secs() as i64;
        assert!(certs_last(&report(vec![cert("/etc/kubernetes/pki/ca.crt", ends + 1)]), now, budget).is_ok());
        let e = certs_last(
            &report(vec![
                cert("/etc/kubernetes/pki/ca.crt", ends + 1),
                cert("/etc/kubexm/etcd/pki/peer.crt", ends - 1),
            ]),
            now,
            budget,
        )
        .map_err(|e| format!("{e:#}"))
        .err()
        .unwrap_or_default();
        assert!(
            e.contains("1 certificate(s) of cluster lab") && e.contains("a /etc/kubexm/etcd/pki/peer.crt") && !e.contains("ca.crt"),
            "{e}"
        );
        assert!(e.contains("up to 80 min") && e.contains("certs renew"), "{e}");
    }
}
