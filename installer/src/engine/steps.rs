//! Steps built from shell commands: the building block of most phases.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::plan::{Check, Step, StepError};
use super::transport::Transport;

/// A step whose check and apply are shell commands. The check holds when it
/// exits 0; without a check, the state database decides.
pub struct Shell {
    pub name: String,
    pub check: Option<String>,
    pub apply: String,
    pub timeout: Duration,
}

impl Shell {
    pub fn new(name: &str, check: Option<&str>, apply: &str) -> Shell {
        Shell {
            name: name.into(),
            check: check.map(str::to_string),
            apply: apply.into(),
            timeout: Duration::from_secs(300),
        }
    }
}

impl Step for Shell {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            match &self.check {
                None => Ok(Check::Unknown),
                Some(c) => Ok(if t.run(c, self.timeout).await?.success() {
                    Check::Holds
                } else {
                    Check::Missing
                }),
            }
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let out = t.run(&self.apply, self.timeout).await?;
            let log = format!("{}{}", out.stdout, out.stderr);
            if out.success() {
                Ok(log)
            } else {
                let how = match out.code {
                    Some(c) => format!("exited with {c}"),
                    None => "was cut off (the host went down, or the command was killed)".to_string(),
                };
                Err(StepError::Failed(format!(
                    "`{}` {how}: {}",
                    self.apply.chars().take(200).collect::<String>(),
                    out.stderr.trim()
                )))
            }
        })
    }
}

/// A file put on a host: fetched from the bundle's file server with curl or
/// wget when the host has one (SSH only tells it to), else sent over SFTP;
/// the sha256 is checked on the host either way.
pub struct Distribute {
    pub name: String,
    /// The file server URL of the file.
    pub url: String,
    /// The file itself, for hosts with neither curl nor wget.
    pub local: std::path::PathBuf,
    pub sha256: String,
    pub dest: String,
    pub mode: u32,
    /// The file server's CA on the host, for https URLs.
    pub ca: Option<String>,
}

impl Step for Distribute {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            let cmd = format!(
                "test \"$(sha256sum {} 2>/dev/null | cut -d' ' -f1)\" = {}",
                super::transport::shell_quote(&self.dest),
                self.sha256
            );
            Ok(if t.run(&cmd, Duration::from_secs(120)).await?.success() {
                Check::Holds
            } else {
                Check::Missing
            })
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            use super::transport::shell_quote as q;
            let tmp = format!("{}.kubexm-part", self.dest);
            let ca = self.ca.as_deref().map(|c| format!(" --cacert {}", q(c))).unwrap_or_default();
            let wget_ca = self
                .ca
                .as_deref()
                .map(|c| format!(" --ca-certificate={}", q(c)))
                .unwrap_or_default();
            let fetch = format!(
                "mkdir -p \"$(dirname {d})\" && if command -v curl >/dev/null; then curl -fsS --retry 3{ca} -o {t} {u}; elif command -v wget >/dev/null; then wget -q{wget_ca} -O {t} {u}; else exit 100; fi && \
                 test \"$(sha256sum {t} | cut -d' ' -f1)\" = {sha} && chmod {mode:o} {t} && mv -f {t} {d}",
                d = q(&self.dest),
                t = q(&tmp),
                u = q(&self.url),
                sha = self.sha256,
                mode = self.mode
            );
            let out = t.run(&fetch, Duration::from_secs(600)).await?;
            match out.code {
                Some(0) => Ok(format!("fetched {} from {}", self.dest, self.url)),
                Some(100) => {
                    let data = fs_err::read(&self.local).map_err(|e| StepError::Failed(e.to_string()))?;
                    t.put(&data, &self.dest, self.mode).await?;
                    Ok(format!("sent {} over SFTP (no curl or wget on the host)", self.dest))
                }
                _ => {
                    let _ = t.run(&format!("rm -f {}", q(&tmp)), Duration::from_secs(30)).await;
                    Err(StepError::Failed(format!(
                        "fetching {} into {} failed or its sha256 differs: {}",
                        self.url,
                        self.dest,
                        out.stderr.trim()
                    )))
                }
            }
        })
    }
}
