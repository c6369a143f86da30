//! Steps built from shell commands: the building block of most phases.

use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::plan::{Check, Step, StepError};
use crate::transport::Transport;

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

/// Runs a check command: [`Check::Holds`] when it exits 0, else [`Check::Missing`].
pub async fn check_by(t: &dyn Transport, cmd: &str, timeout: Duration) -> Result<Check, StepError> {
    Ok(if t.run(cmd, timeout).await?.success() {
        Check::Holds
    } else {
        Check::Missing
    })
}

impl Step for Shell {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            match &self.check {
                None => Ok(Check::Unknown),
                Some(c) => check_by(t, c, self.timeout).await,
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

/// A step that polls until something outside it is ready (an API server,
/// nodes, a rollout): a [`Shell`] naming what it waits for.
pub struct Wait {
    pub what: String,
    pub shell: Shell,
}

impl Step for Wait {
    fn name(&self) -> &str {
        &self.shell.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        self.shell.check(t)
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        self.shell.apply(t)
    }

    fn waits(&self) -> Option<&str> {
        Some(&self.what)
    }
}

/// One file a [`Distribute`] step puts on a host.
#[derive(Debug, Clone)]
pub struct FileCopy {
    /// The file server URL of the file.
    pub url: String,
    /// The file itself, for hosts with neither curl nor wget.
    pub local: std::path::PathBuf,
    pub sha256: String,
    pub dest: String,
    pub mode: u32,
}

/// Files put on a host: fetched in parallel from the bundle's file server with
/// curl or wget when the host has one (SSH only tells it to), else sent over
/// SFTP; each sha256 is checked on the host either way (with openssl when the
/// host has it, several times faster than sha256sum).
pub struct Distribute {
    pub name: String,
    pub files: Vec<FileCopy>,
    /// The file server's CA on the host, for https URLs.
    pub ca: Option<String>,
}

/// A shell function `h FILE` printing the file's sha256.
const HASH_FN: &str = "h() { if command -v openssl >/dev/null; then openssl dgst -sha256 -r \"$1\" 2>/dev/null | cut -d' ' -f1; else sha256sum \"$1\" 2>/dev/null | cut -d' ' -f1; fi; }";

impl Distribute {
    /// A step for a single file.
    pub fn one(name: &str, file: FileCopy) -> Distribute {
        Distribute {
            name: name.into(),
            files: vec![file],
            ca: None,
        }
    }

    /// Where its files come from: the first URL's `scheme://host:port`.
    fn origin(&self) -> &str {
        let Some(url) = self.files.first().map(|c| c.url.as_str()) else {
            return "the file server";
        };
        let host = url.find("://").map_or(0, |i| i + 3);
        let end = url.get(host..).and_then(|rest| rest.find('/')).map_or(url.len(), |i| host + i);
        url.get(..end).unwrap_or(url)
    }

    fn script(&self) -> String {
        use crate::transport::shell_quote as q;
        let ca = self.ca.as_deref().map(|c| format!(" --cacert {}", q(c))).unwrap_or_default();
        let wget_ca = self
            .ca
            .as_deref()
            .map(|c| format!(" --ca-certificate={}", q(c)))
            .unwrap_or_default();
        let mut s = format!(
            "{HASH_FN}\nif command -v curl >/dev/null; then g() {{ curl -fsS --retry 3{ca} -o \"$2\" \"$1\"; }}; \
             elif command -v wget >/dev/null; then g() {{ wget -q{wget_ca} -O \"$2\" \"$1\"; }}; else exit 100; fi\nf=0\n"
        );
        for (i, c) in self.files.iter().enumerate() {
            let (d, t) = (q(&c.dest), q(&format!("{}.kubexm-part", c.dest)));
            s.push_str(&format!(
                "p{i}=\nif [ \"$(h {d})\" != {sha} ]; then mkdir -p \"$(dirname {d})\" && {{ (g {u} {t} && h {t} > {t}.sum) & p{i}=$!; }}; fi\n",
                u = q(&c.url),
                sha = c.sha256
            ));
        }
        for (i, c) in self.files.iter().enumerate() {
            let (d, t) = (q(&c.dest), q(&format!("{}.kubexm-part", c.dest)));
            s.push_str(&format!(
                "if [ -n \"$p{i}\" ]; then if wait $p{i} && [ \"$(cat {t}.sum)\" = {sha} ]; then rm -f {t}.sum && chmod {mode:o} {t} && mv -f {t} {d}; \
                 else echo \"fetching {u} into {d} failed or its sha256 differs\" >&2; rm -f {t} {t}.sum; f=1; fi; \
                 elif [ \"$(h {d})\" != {sha} ]; then echo \"cannot create the folder of {d}\" >&2; f=1; fi\n",
                u = c.url.replace(['"', '`', '$', '\\'], ""),
                sha = c.sha256,
                mode = c.mode
            ));
        }
        s.push_str("exit $f\n");
        s
    }
}

impl Step for Distribute {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            let mut cmd = format!("{HASH_FN}\n");
            for c in &self.files {
                cmd.push_str(&format!(
                    "[ \"$(h {})\" = {} ] || exit 1\n",
                    crate::transport::shell_quote(&c.dest),
                    c.sha256
                ));
            }
            check_by(t, &cmd, Duration::from_secs(300)).await
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let out = t.run(&self.script(), Duration::from_secs(1800)).await?;
            let dests: Vec<&str> = self.files.iter().map(|c| c.dest.as_str()).collect();
            match out.code {
                Some(0) => Ok(format!("fetched {} from {}", dests.join(", "), self.origin())),
                Some(100) => {
                    for c in &self.files {
                        t.put_file(&c.local, &c.sha256, &c.dest, c.mode).await?;
                    }
                    Ok(format!("sent {} over SFTP (no curl or wget on the host)", dests.join(", ")))
                }
                _ => Err(StepError::Failed(out.stderr.trim().to_string())),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fetch names the server it came from (the installer's file server or
    /// the registry host's), never a file's whole path.
    #[test]
    fn a_fetch_names_the_server_it_came_from() {
        let copy = |url: &str| FileCopy {
            url: url.into(),
            local: "/b/f".into(),
            sha256: "0".repeat(64),
            dest: "/d/f".into(),
            mode: 0o644,
        };
        let d = Distribute::one("f", copy("https://198.18.0.11:5000/files/dl.k8s.io/kubelet"));
        assert_eq!(d.origin(), "https://198.18.0.11:5000");
        assert_eq!(Distribute::one("f", copy("https://h:1")).origin(), "https://h:1");
        let none = Distribute {
            name: "f".into(),
            files: vec![],
            ca: None,
        };
        assert_eq!(none.origin(), "the file server");
    }
}
