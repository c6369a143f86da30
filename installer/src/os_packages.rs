//! OS packages from the bundle's Debian repositories (`os/<release>/<arch>/`,
//! served by the file server): the preflight check that a host's release has
//! a repository, and the step that installs a host's packages from it.
//!
//! The step points apt at the bundle's repository only: one source marked
//! `[trusted=yes]` (the bundle's signature and per-member digests already
//! vouch for it) with apt's lists kept apart from the host's own. Every other
//! source is moved aside while it runs and put back after, also after a run
//! that was killed (the next run puts them back first).

use std::time::Duration;

use futures_util::future::BoxFuture;
use kubexm_bom::OsRepoItem;

use crate::engine::facts::HostFacts;
use crate::engine::plan::{Check, Step, StepError};
use crate::engine::transport::{Transport, shell_quote as q};

/// The repository for a host, or why there is none: the preflight check.
pub fn repo_for<'a>(facts: &HostFacts, repos: &'a [OsRepoItem]) -> Result<&'a OsRepoItem, String> {
    let release = format!("{} {} ({})", facts.os_id, facts.os_version, facts.os_codename);
    let same_release: Vec<&OsRepoItem> = repos
        .iter()
        .filter(|r| r.distro == facts.os_id && r.codename == facts.os_codename)
        .collect();
    if same_release.is_empty() {
        let have: Vec<String> = repos.iter().map(|r| format!("{} {}", r.release, r.arch)).collect();
        return Err(format!(
            "{}: OS release {release} has no package repository in the bundle (it has: {}); \
             add its release to bundle.osPackages.releases and rebuild the bundle",
            facts.host,
            if have.is_empty() { "none".to_string() } else { have.join(", ") }
        ));
    }
    same_release.into_iter().find(|r| r.arch == facts.arch).ok_or_else(|| {
        format!(
            "{}: the bundle's repository for {release} has no {} packages; add {} to bundle.osPackages.arches and rebuild",
            facts.host, facts.arch, facts.arch
        )
    })
}

/// Installs packages on a host from one of the bundle's repositories.
pub struct AptInstall {
    pub name: String,
    /// The repository's URL on the file server (`.../os/<release>/<arch>`).
    pub url: String,
    pub packages: Vec<String>,
    /// The file server's CA on the host, for an https URL.
    pub ca: Option<String>,
}

use crate::paths::{APT_ASIDE as ASIDE, APT_LIST as LIST, APT_LISTS as LISTS};

impl AptInstall {
    fn script(&self) -> String {
        let pkgs: Vec<String> = self.packages.iter().map(|p| q(p)).collect();
        let pkgs = pkgs.join(" ");
        let ca = self
            .ca
            .as_deref()
            .map(|c| format!(" -o Acquire::https::CAInfo={}", q(c)))
            .unwrap_or_default();
        let apt = format!("-o Dir::State::Lists={LISTS} -o Acquire::Languages=none -o Acquire::Retries=3{ca}");
        format!(
            r#"set -e
restore() {{
  for f in {ASIDE}/*; do
    [ -e "$f" ] || continue
    case "${{f##*/}}" in sources.list) mv -f "$f" /etc/apt/sources.list ;; *) mv -f "$f" /etc/apt/sources.list.d/ ;; esac
  done
  rm -f {LIST}
}}
restore
mkdir -p {ASIDE} {LISTS}/partial
trap restore EXIT
[ ! -e /etc/apt/sources.list ] || mv -f /etc/apt/sources.list {ASIDE}/
for f in /etc/apt/sources.list.d/*; do [ -e "$f" ] && mv -f "$f" {ASIDE}/; done
echo {source} > {LIST}
log={LISTS}/last.log
apt-get {apt} -q update > $log 2>&1 || {{ tail -n 20 $log; exit 1; }}
DEBIAN_FRONTEND=noninteractive apt-get {apt} -q -y --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold install {pkgs} > $log 2>&1 || {{ tail -n 40 $log; exit 1; }}
echo "installed:"
dpkg-query -W -f='${{Package}} ${{Version}}\n' {pkgs}
"#,
            source = q(&format!("deb [trusted=yes] {} ./", self.url.trim_end_matches('/'))),
        )
    }
}

impl Step for AptInstall {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            let pkgs: Vec<String> = self.packages.iter().map(|p| q(p)).collect();
            let cmd = format!(
                "test \"$(dpkg-query -W -f='${{Status}}\\n' {} 2>/dev/null | grep -c '^install ok installed$')\" = {}",
                pkgs.join(" "),
                self.packages.len()
            );
            crate::engine::steps::check_by(t, &cmd, Duration::from_secs(60)).await
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let out = t.run(&self.script(), Duration::from_secs(1800)).await?;
            if out.success() {
                Ok(out.stdout)
            } else {
                Err(StepError::Failed(format!(
                    "installing {} from {} failed (other apt sources were put back):\n{}{}",
                    self.packages.join(" "),
                    self.url,
                    out.stdout
                        .lines()
                        .rev()
                        .take(15)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n"),
                    out.stderr
                )))
            }
        })
    }
}

/// A host's OS packages: finds the repository for the host's release and
/// arch (refusing a release the bundle has none for), then installs what the
/// host's roles need from it with [`AptInstall`].
pub struct HostPackages {
    pub repos: Vec<OsRepoItem>,
    /// The file server's base URL (`http(s)://host:port`).
    pub file_server: String,
    pub roles: Vec<String>,
    pub ca: Option<String>,
}

impl HostPackages {
    async fn install(&self, t: &dyn Transport) -> Result<AptInstall, StepError> {
        let facts = crate::engine::facts::gather(t).await?;
        let repo = repo_for(&facts, &self.repos).map_err(StepError::Failed)?;
        let roles: Vec<&str> = self.roles.iter().map(String::as_str).collect();
        Ok(AptInstall {
            name: "os-packages".into(),
            url: format!("{}/{}", self.file_server.trim_end_matches('/'), repo.path),
            packages: repo.packages_for(&roles),
            ca: self.ca.clone(),
        })
    }
}

impl Step for HostPackages {
    fn name(&self) -> &str {
        "os-packages"
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            let apt = self.install(t).await?;
            if apt.packages.is_empty() {
                return Ok(Check::Holds);
            }
            apt.check(t).await
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let apt = self.install(t).await?;
            apt.apply(t).await
        })
    }
}

/// The role groups a host belongs to.
pub fn roles_of(cluster: &kubexm_bom::config::Cluster, host: &str) -> Vec<String> {
    cluster.roles_of(host)
}

/// The os-packages module: one task per set of roles (hosts with the same
/// roles install the same packages), each after `after` on the same host.
/// Used by the install pipeline and by `kubexm-install packages`.
pub fn module(
    cluster: &kubexm_bom::config::Cluster,
    hosts: &[String],
    repos: &[OsRepoItem],
    file_server: &str,
    ca: Option<String>,
    after: &[&str],
) -> crate::engine::plan::Module {
    use crate::engine::plan::{Scope, Step, Task};
    let mut by_roles: std::collections::BTreeMap<Vec<String>, Vec<String>> = std::collections::BTreeMap::new();
    for h in hosts {
        by_roles.entry(roles_of(cluster, h)).or_default().push(h.clone());
    }
    let tasks = by_roles
        .into_iter()
        .map(|(roles, hosts)| Task {
            name: format!("packages-{}", if roles.is_empty() { "other".into() } else { roles.join("+") }),
            hosts,
            steps: vec![std::sync::Arc::new(HostPackages {
                repos: repos.to_vec(),
                file_server: file_server.to_string(),
                roles,
                ca: ca.clone(),
            }) as std::sync::Arc<dyn Step>],
            after: after.iter().map(|a| (a.to_string(), Scope::SameHost)).collect(),
        })
        .collect();
    crate::engine::plan::Module {
        name: "os-packages".into(),
        tasks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(release: &str, codename: &str, arch: &str) -> OsRepoItem {
        OsRepoItem {
            release: release.into(),
            distro: "debian".into(),
            codename: codename.into(),
            component: "main".into(),
            arch: arch.into(),
            mirror: "http://m".into(),
            path: format!("os/{release}/{arch}"),
            roles: Default::default(),
            packages: vec![],
        }
    }

    fn facts(codename: &str, arch: &str) -> HostFacts {
        HostFacts {
            host: "node1".into(),
            os_id: "debian".into(),
            os_version: "12".into(),
            os_codename: codename.into(),
            arch: arch.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_host_whose_release_has_no_repository_is_refused_by_name() -> Result<(), Box<dyn std::error::Error>> {
        let repos = [repo("debian-bookworm", "bookworm", "amd64")];
        assert_eq!(repo_for(&facts("bookworm", "amd64"), &repos)?.arch, "amd64");
        let e = repo_for(&facts("trixie", "amd64"), &repos).unwrap_err();
        assert!(
            e.contains("node1") && e.contains("debian 12 (trixie)") && e.contains("debian-bookworm amd64"),
            "{e}"
        );
        let e = repo_for(&facts("bookworm", "arm64"), &repos).unwrap_err();
        assert!(e.contains("no arm64 packages"), "{e}");
        Ok(())
    }

    /// Issue 25: the file server's URL was pasted unquoted inside the
    /// double-quoted `echo` of the apt source: `$(...)` in it ran as root.
    #[test]
    fn the_file_server_url_stays_data_in_the_apt_source() {
        let step = AptInstall {
            name: "os-packages".into(),
            url: "https://10.0.0.1:8443/os/$(touch /tmp/kubexm-marker)".into(),
            packages: vec!["conntrack".into()],
            ca: None,
        };
        let script = step.script();
        assert!(
            script.contains("echo 'deb [trusted=yes] https://10.0.0.1:8443/os/$(touch /tmp/kubexm-marker) ./' >"),
            "{script}"
        );
    }
}
