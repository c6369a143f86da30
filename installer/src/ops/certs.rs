//! `kubexm-install certs check`: every certificate kubexm or kubeadm issued
//! on the cluster's hosts, with its expiry. One `certs-check` job with one
//! step on every host not named unreachable: it prints the certificate
//! blocks (never a key: only what lies between `BEGIN CERTIFICATE` and `END
//! CERTIFICATE`) of kubeadm's PKI, etcd's, the registry's, kubelet's and the
//! client certificates embedded in kubeconfigs; they are read here with
//! x509-parser. Exits non-zero (a host failure, 7) when one expires within
//! `warn_days`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::Serialize;

use super::error::{OpError, op};
use super::session::Session;
use crate::engine::plan::{Check, Step, StepError};
use crate::engine::run;
use crate::engine::transport::Transport;

/// Days before expiry a certificate is flagged unless told otherwise.
pub const WARN_DAYS: u32 = 30;

/// Where certificates live on a host: files (globs) and kubeconfigs.
const FILES: &[&str] = &[
    "/etc/kubernetes/pki/*.crt",
    "/etc/kubernetes/pki/etcd/*.crt",
    "/etc/kubexm/etcd/pki/*.crt",
    "/etc/kubexm/pki/*.crt",
    "/var/lib/kubelet/pki/kubelet-client-current.pem",
    "/var/lib/kubelet/pki/kubelet.crt",
    "/etc/containerd/certs.d/kubexm-registry-client.crt",
];
const KUBECONFIGS: &str = "/etc/kubernetes/*.conf";

/// One certificate found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertInfo {
    pub host: String,
    /// The file it was read from (a kubeconfig: its embedded client certificate).
    pub path: String,
    pub subject: String,
    pub issuer: String,
    /// A CA (basicConstraints CA:true).
    pub ca: bool,
    /// Seconds since the epoch.
    pub not_after: i64,
    /// `YYYY-MM-DD HH:MM:SS UTC`.
    pub expires: String,
    /// Whole days left (negative: expired).
    pub days_left: i64,
}

/// What `certs check` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertsReport {
    pub cluster: String,
    pub job: i64,
    pub warn_days: u32,
    pub certs: Vec<CertInfo>,
    /// Those that expire within `warn_days` (or have).
    pub expiring: usize,
}

impl std::fmt::Display for CertsReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.certs.iter().map(|c| c.host.len()).max().unwrap_or(4);
        let p = self.certs.iter().map(|c| c.path.len()).max().unwrap_or(4);
        writeln!(f, "{:w$}  {:p$}  {:23}  {:>5}  SUBJECT", "HOST", "PATH", "EXPIRES", "DAYS")?;
        for c in &self.certs {
            let flag = if c.days_left < i64::from(self.warn_days) {
                "  <-- renew"
            } else {
                ""
            };
            let ca = if c.ca { " (CA)" } else { "" };
            writeln!(
                f,
                "{:w$}  {:p$}  {:23}  {:>5}  {}{ca}{flag}",
                c.host, c.path, c.expires, c.days_left, c.subject
            )?;
        }
        writeln!(
            f,
            "{} certificate(s) on cluster {} (job {}); {} expire within {} days",
            self.certs.len(),
            self.cluster,
            self.job,
            self.expiring,
            self.warn_days
        )
    }
}

impl CertsReport {
    /// An error (a host failure, exit 7) naming what expires within
    /// `warn_days`, when something does.
    pub fn expiring_error(&self) -> anyhow::Result<()> {
        if self.expiring == 0 {
            return Ok(());
        }
        let soon: Vec<String> = self
            .certs
            .iter()
            .filter(|c| c.days_left < i64::from(self.warn_days))
            .map(|c| format!("{} {} ({}, {} days)", c.host, c.path, c.expires, c.days_left))
            .collect();
        Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "{} certificate(s) of cluster {} expire within {} days: renew them:\n  {}",
                self.expiring,
                self.cluster,
                self.warn_days,
                soon.join("\n  ")
            ),
        ))
    }
}

/// Reads every certificate of the session's cluster.
pub fn check(session: &Session, warn_days: u32) -> anyhow::Result<CertsReport> {
    let step = Arc::new(ReadCerts::default());
    let s: Arc<dyn Step> = step.clone();
    let ex = session.execute("certs-check", run::Policy::ContinueOtherHosts, move |hosts| {
        Ok(crate::engine::jobs::one_task("certs-check", hosts, vec![s]))
    })?;
    if !ex.ok() {
        let errors = ex.errors();
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "the certificates of {} host(s) could not be read (job {}); name a dead host with --unreachable:\n  {}",
                errors.len(),
                ex.job,
                errors.join("\n  ")
            ),
        ));
    }
    let now = crate::engine::state::now_ms() / 1000;
    let read = std::mem::take(&mut *step.read.lock().unwrap_or_else(|e| e.into_inner()));
    let mut certs = Vec::new();
    for (host, out) in read {
        certs.extend(parse(&host, &out, now));
    }
    certs.sort_by(|a, b| (&a.host, &a.path, a.not_after).cmp(&(&b.host, &b.path, b.not_after)));
    let expiring = certs.iter().filter(|c| c.days_left < i64::from(warn_days)).count();
    Ok(CertsReport {
        cluster: session.cluster().metadata.name.clone(),
        job: ex.job,
        warn_days,
        certs,
        expiring,
    })
}

/// The certificates in a host's output: `==> PATH` lines, each followed by
/// the PEM certificate blocks read from it. A block that does not parse is
/// logged and left out; the others are still shown.
pub(super) fn parse(host: &str, out: &str, now: i64) -> Vec<CertInfo> {
    let mut found = Vec::new();
    for section in out.split("==> ").filter(|s| !s.trim().is_empty()) {
        let (path, pems) = section.split_once('\n').unwrap_or((section, ""));
        let path = path.trim();
        for block in pems.split_inclusive("-----END CERTIFICATE-----") {
            let Some(start) = block.find("-----BEGIN CERTIFICATE-----") else {
                continue;
            };
            match cert_info(&block.as_bytes()[start..], now) {
                Ok(mut c) => {
                    c.host = host.to_string();
                    c.path = crate::ops::conformance::run::printable(path);
                    found.push(c);
                }
                Err(e) => tracing::warn!("{host}: {}: {e}", crate::ops::conformance::run::printable(path)),
            }
        }
    }
    found
}

/// One PEM certificate, read (its host and path left for the caller).
fn cert_info(pem: &[u8], now: i64) -> Result<CertInfo, String> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| format!("not a PEM certificate: {e}"))?;
    let cert = p.parse_x509().map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let not_after = cert.validity().not_after.timestamp();
    Ok(CertInfo {
        host: String::new(),
        path: String::new(),
        subject: crate::ops::conformance::run::printable(&cert.subject().to_string()),
        issuer: crate::ops::conformance::run::printable(&cert.issuer().to_string()),
        ca: cert.is_ca(),
        not_after,
        expires: utc(not_after),
        days_left: (not_after - now).div_euclid(86_400),
    })
}

/// `YYYY-MM-DD HH:MM:SS UTC` of `secs` since the epoch.
pub(super) fn utc(secs: i64) -> String {
    let stamp = super::etcd::utc_stamp(secs * 1000);
    // YYYYmmddTHHMMSS.mmmZ
    format!(
        "{}-{}-{} {}:{}:{} UTC",
        &stamp[0..4],
        &stamp[4..6],
        &stamp[6..8],
        &stamp[9..11],
        &stamp[11..13],
        &stamp[13..15]
    )
}

/// Prints every certificate of a host (never a key) and keeps what it printed.
#[derive(Default)]
struct ReadCerts {
    read: Mutex<Vec<(String, String)>>,
}

impl ReadCerts {
    fn script() -> String {
        read_script(&FILES.join(" "), KUBECONFIGS)
    }
}

/// A script printing, for each of `files` (PEM, globs) and `kubeconfigs`
/// (their embedded client certificate) that exists, `==> PATH` and its
/// certificate blocks: never a key.
pub(super) fn read_script(files: &str, kubeconfigs: &str) -> String {
    format!(
        "for f in {files}; do [ -f \"$f\" ] || continue; echo \"==> $f\"; \
         sed -n '/-----BEGIN CERTIFICATE-----/,/-----END CERTIFICATE-----/p' \"$f\"; done; \
         for k in {kubeconfigs}; do [ -f \"$k\" ] || continue; \
         d=$(sed -n 's/^ *client-certificate-data: *//p' \"$k\"); [ -n \"$d\" ] || continue; \
         echo \"==> $k\"; echo \"$d\" | base64 -d | sed -n '/-----BEGIN CERTIFICATE-----/,/-----END CERTIFICATE-----/p'; done; true"
    )
}

impl Step for ReadCerts {
    fn name(&self) -> &str {
        "read-certificates"
    }

    fn check<'a>(&'a self, _: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async { Ok(Check::Missing) })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let out = t.run(&Self::script(), Duration::from_secs(60)).await?;
            if !out.success() {
                return Err(StepError::Failed(format!("reading certificates: {}", out.stderr.trim())));
            }
            let n = out.stdout.matches("-----BEGIN CERTIFICATE-----").count();
            self.read
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((t.host().to_string(), out.stdout));
            Ok(format!("{n} certificate(s) read"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate issued here, read back from a host's output: its
    /// subject, issuer, expiry and days left; a kubeconfig's too.
    #[test]
    fn certificates_in_a_hosts_output_are_read_with_their_expiry() -> anyhow::Result<()> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec!["x".into()])?;
        params.distinguished_name.push(rcgen::DnType::CommonName, "kube-apiserver");
        params.not_after = rcgen::date_time_ymd(2030, 1, 2);
        let cert = params.self_signed(&key)?;
        let pem = cert.pem();
        let out = format!("==> /etc/kubernetes/pki/apiserver.crt\n{pem}==> /etc/kubernetes/admin.conf\n{pem}{pem}");
        let now = 1_893_456_000; // 2030-01-01 00:00:00 UTC
        let found = parse("cp1", &out, now);
        assert_eq!(found.len(), 3, "{found:?}");
        let c = &found[0];
        assert_eq!(
            (c.host.as_str(), c.path.as_str(), c.days_left, c.expires.as_str()),
            ("cp1", "/etc/kubernetes/pki/apiserver.crt", 1, "2030-01-02 00:00:00 UTC")
        );
        assert!(c.subject.contains("CN=kube-apiserver"), "{}", c.subject);
        assert_eq!(found[2].path, "/etc/kubernetes/admin.conf");
        // A key never travels: the script prints certificate blocks only.
        assert!(!ReadCerts::script().contains("PRIVATE"), "{}", ReadCerts::script());
        Ok(())
    }
}
