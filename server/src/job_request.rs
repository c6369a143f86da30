//! A job's body: the installer's typed [`Request`] (what is asked, one
//! definition for the CLI and the API) and, for a job the operator created
//! on this machine with `kubexm create cluster` or `reset cluster`, where
//! it runs ([`Local`]). Stored as the job's kind and options (`local` under
//! its own key); the API never writes `local`. Job rows of the version
//! before are rewritten to this shape by a migration of the job database.

use std::path::PathBuf;

use kubexm_installer::ops::request::Request;
use serde::{Deserialize, Serialize};

/// What the operator's flags say about the machine a job runs on. A field
/// left out is the claiming worker's own (its `--root`, `--advertise`, ...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Local {
    /// The bundle's file (an API job's is found by digest among the
    /// worker's held bundles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pubkey: Option<PathBuf>,
    #[serde(default)]
    pub allow_unsigned: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<std::net::IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
}

impl Local {
    /// Every path made absolute: the worker may see the file system from
    /// another directory.
    pub fn absolute(mut self) -> std::io::Result<Local> {
        let cwd = std::env::current_dir()?;
        for p in [&mut self.bundle, &mut self.pubkey, &mut self.root, &mut self.kubeconfig]
            .into_iter()
            .flatten()
        {
            if p.is_relative() {
                *p = cwd.join(&*p);
            }
        }
        Ok(self)
    }
}

/// The options column of a job asking `request` (with `local`, the
/// operator's own).
pub fn options(request: &Request, local: Option<&Local>) -> serde_json::Value {
    let mut v = request.options();
    if let (Some(m), Some(l)) = (v.as_object_mut(), local) {
        m.insert("local".into(), serde_json::to_value(l).unwrap_or_default());
    }
    v
}

/// A stored job's request, and where it runs when the operator said.
pub fn read(kind: &str, options: &serde_json::Value) -> Result<(Request, Option<Local>), serde_json::Error> {
    let mut options = options.clone();
    let local = options.as_object_mut().and_then(|m| m.remove("local"));
    let request = Request::from_job(kind, &options)?;
    let local = local.map(serde_json::from_value).transpose()?;
    Ok((request, local))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubexm_installer::ops::request::{HostsRequest, InstallRequest};

    /// A request with and without the operator's part reads back the same.
    #[test]
    fn a_job_body_reads_back() -> Result<(), serde_json::Error> {
        let install = Request::Install(InstallRequest {
            bundle: format!("sha256:{}", "b".repeat(64)),
            phases: vec![],
        });
        let local = Local {
            bundle: Some("/srv/k.tar.zst".into()),
            advertise: Some(std::net::Ipv4Addr::LOCALHOST.into()),
            root: Some("/var/lib/kubexm".into()),
            ..Default::default()
        };
        for (r, l) in [
            (install.clone(), Some(local.clone())),
            (install, None),
            (Request::Reset(HostsRequest::default()), Some(local)),
        ] {
            assert_eq!(read(r.kind(), &options(&r, l.as_ref()))?, (r, l));
        }
        Ok(())
    }
}
