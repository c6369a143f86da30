//! Steps that put files on a host: bytes the installer holds ([`PutFiles`],
//! [`RunWith`] with a command after them), a local file ([`Upload`]), and
//! [`Unless`], which wraps a step that is done once a check holds.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::plan::{Check, Step, StepError};
use crate::steps::check_by;
use crate::transport::{Transport, shell_quote as q};

/// Creates each file's directory, then puts the file (mode, sha256 checked).
pub async fn put_all(t: &dyn Transport, files: &[(String, Vec<u8>, u32)]) -> Result<(), StepError> {
    for (path, data, mode) in files {
        t.run(&format!("mkdir -p \"$(dirname {})\"", q(path)), Duration::from_secs(30))
            .await?;
        t.put(data, path, *mode).await?;
    }
    Ok(())
}

/// Files put on a host over SFTP, each checked by sha256 first.
pub struct PutFiles {
    pub name: String,
    /// (path on the host, content, mode)
    pub files: Vec<(String, Vec<u8>, u32)>,
    /// Run after any file changed (e.g. `systemctl daemon-reload`).
    pub then: Option<String>,
}

impl Step for PutFiles {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            let mut cmd = String::new();
            for (path, data, _) in &self.files {
                cmd.push_str(&format!(
                    "[ \"$(sha256sum {} 2>/dev/null | cut -d' ' -f1)\" = {} ] || exit 1\n",
                    q(path),
                    kubexm_bundle::digest::sha256_hex(data)
                ));
            }
            check_by(t, &cmd, Duration::from_secs(60)).await
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            put_all(t, &self.files).await?;
            if let Some(cmd) = &self.then {
                let out = t.run(cmd, Duration::from_secs(120)).await?;
                if !out.success() {
                    return Err(StepError::Failed(format!("`{cmd}` failed: {}", out.stderr.trim())));
                }
            }
            Ok(format!(
                "wrote {}",
                self.files.iter().map(|f| f.0.as_str()).collect::<Vec<_>>().join(", ")
            ))
        })
    }
}

/// Files put on a host, then a command, both only when `check` fails: for
/// commands whose inputs may be gone once done (kubeadm configs, applied
/// manifests) so the check is about the result, not the files.
pub struct RunWith {
    pub name: String,
    pub check: String,
    /// (path on the host, content, mode)
    pub files: Vec<(String, Vec<u8>, u32)>,
    pub command: String,
    pub timeout: Duration,
}

impl Step for RunWith {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move { check_by(t, &self.check, Duration::from_secs(60)).await })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            put_all(t, &self.files).await?;
            let out = t.run(&self.command, self.timeout).await?;
            if !out.success() {
                return Err(StepError::Failed(format!(
                    "{}{}",
                    out.stderr.trim(),
                    if out.stderr.trim().is_empty() { out.stdout.trim() } else { "" }
                )));
            }
            Ok(out.stdout.trim().to_string())
        })
    }
}

/// A step that is done when `check` passes on the host, else whatever the
/// inner step says: a download whose file was consumed and removed once the
/// thing it carried is installed.
pub struct Unless {
    pub check: String,
    pub inner: Arc<dyn Step>,
}

impl Step for Unless {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            match check_by(t, &self.check, Duration::from_secs(60)).await? {
                Check::Holds => Ok(Check::Holds),
                _ => self.inner.check(t).await,
            }
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        self.inner.apply(t)
    }
}

/// A local file put on a host over SFTP (the installer binary, the bundle),
/// checked by sha256 first; streamed, never read whole into memory. The
/// local file's digest is computed when a check or an upload first needs it
/// (off the blocking pool), not while planning: a step skipped (the bundle
/// already unpacked on the host) never reads the file.
pub struct Upload {
    pub name: String,
    pub local: std::path::PathBuf,
    pub dest: String,
    pub mode: u32,
    sha256: tokio::sync::OnceCell<String>,
}

impl Upload {
    pub fn new(name: &str, local: &Path, dest: &str, mode: u32) -> anyhow::Result<Upload> {
        // Refused while planning when it is not a readable file.
        if !fs_err::File::open(local)?.metadata()?.is_file() {
            anyhow::bail!("{} is not a regular file; name the file itself", local.display());
        }
        Ok(Upload {
            name: name.into(),
            local: local.to_path_buf(),
            dest: dest.into(),
            mode,
            sha256: tokio::sync::OnceCell::new(),
        })
    }

    /// The local file's sha256, computed once.
    async fn digest(&self) -> Result<&str, StepError> {
        let digest = self
            .sha256
            .get_or_try_init(|| async {
                let local = self.local.clone();
                let failed = |e: &dyn std::fmt::Display| StepError::Failed(format!("hashing {}: {e}", self.local.display()));
                tokio::task::spawn_blocking(move || -> std::io::Result<String> {
                    let mut f = fs_err::File::open(&local)?;
                    let mut h = kubexm_bundle::digest::Hashing::new(std::io::sink());
                    std::io::copy(&mut f, &mut h)?;
                    Ok(h.finish().0)
                })
                .await
                .map_err(|e| failed(&e))?
                .map_err(|e| failed(&e))
            })
            .await?;
        Ok(digest)
    }
}

impl Step for Upload {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            let cmd = format!(
                "[ \"$(sha256sum {} 2>/dev/null | cut -d' ' -f1)\" = {} ]",
                q(&self.dest),
                self.digest().await?
            );
            check_by(t, &cmd, Duration::from_secs(120)).await
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let size = fs_err::metadata(&self.local).map_err(|e| StepError::Failed(e.to_string()))?.len();
            t.run(&format!("mkdir -p \"$(dirname {})\"", q(&self.dest)), Duration::from_secs(30))
                .await?;
            t.put_file(&self.local, self.digest().await?, &self.dest, self.mode).await?;
            Ok(format!("uploaded {} ({size} bytes)", self.dest))
        })
    }
}
