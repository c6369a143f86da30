//! `kubexm-install conformance`: Kubernetes' own conformance tests, from the
//! bundle, run from the installer host against an installed cluster.
//!
//! Everything is checked before anything runs: the state database knows a
//! successful install of the cluster; its bundle carries the test binaries
//! (`kubernetes-test`: `e2e.test` and `ginkgo`, for this machine's arch) and
//! every image the conformance tests pull; the admin kubeconfig is there.
//! Then `ginkgo` runs `e2e.test` (quick: a listed subset; certified: every
//! conformance spec, serial ones included, which Ginkgo runs last and alone),
//! its output goes to `e2e.log` and a line of progress per finished spec
//! to the terminal; the JUnit report, the log and a summary stay under
//! `<root>/conformance/<cluster>/<time>/`.

pub mod junit;
pub(crate) mod run;
pub mod specs;

use std::path::{Path, PathBuf};

use kubexm_bundle::manifest::{BundleManifest, MANIFEST_NAME};

use crate::engine::state::State;
use crate::ops::error::{OpError, op};

pub use run::{Summary, run};

/// Which specs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The listed subset (`manifests/conformance/quick-<minor>.yaml`).
    Quick,
    /// Every conformance spec, serial ones included, as certification asks.
    Certified,
}

#[derive(Debug, Clone)]
pub struct ConformanceOptions {
    pub cluster: String,
    /// The installer's state root (unpacked bundles, the admin kubeconfig).
    pub root: PathBuf,
    /// The state database that recorded the install.
    pub state: PathBuf,
    /// The unpacked bundle; default: the one under `<root>/bundles` built for the cluster.
    pub bundle_dir: Option<PathBuf>,
    /// Default: `<root>/<cluster>.kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    pub mode: Mode,
    /// Replaces the mode's selection.
    pub focus: Option<String>,
    /// Added to the mode's skip.
    pub skip: Option<String>,
    /// Ginkgo processes (serial specs still run alone).
    pub parallel: usize,
    /// Nodes that may be NotReady (named in the summary).
    pub allow_not_ready: Vec<String>,
    /// Attempts at a failing spec (1: no retry); one that passes on a later
    /// attempt is reported as flaky.
    pub flake_attempts: u32,
}

/// What a run needs, checked: the binaries (unpacked, executable), the
/// kubeconfig, the selection and where the results go.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub cluster: String,
    pub version: String,
    pub e2e: PathBuf,
    pub ginkgo: PathBuf,
    pub kubectl: PathBuf,
    pub kubeconfig: PathBuf,
    pub focus: String,
    pub skip: String,
    pub parallel: usize,
    /// The listed specs of a quick run (each must run and pass).
    pub listed: Vec<specs::Listed>,
    pub out: PathBuf,
    pub allow_not_ready: Vec<String>,
    /// `--skip` was given: a listed spec it skips is not "not run".
    pub user_skip: bool,
    pub flake_attempts: u32,
}

/// Checks everything a run needs and unpacks the test binaries. Paths are
/// made absolute first: ginkgo runs e2e.test in another directory, where a
/// relative `--root root` names nothing.
pub fn prepare(o: &ConformanceOptions) -> anyhow::Result<Prepared> {
    let absolute = |p: &Path| std::path::absolute(p).map_err(|e| op(OpError::Io, anyhow::anyhow!("{}: {e}", p.display())));
    let o = &ConformanceOptions {
        root: absolute(&o.root)?,
        state: absolute(&o.state)?,
        bundle_dir: o.bundle_dir.as_deref().map(absolute).transpose()?,
        kubeconfig: o.kubeconfig.as_deref().map(absolute).transpose()?,
        ..o.clone()
    };
    let recorded = known_cluster(&o.state, &o.cluster)?;
    let bundle = match &o.bundle_dir {
        Some(d) => d.clone(),
        None => find_bundle(&o.root, &o.cluster, recorded.as_deref())?,
    };
    let manifest = read_manifest(&bundle)?;
    if manifest.name != o.cluster {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("{} was built for cluster {}, not {}", bundle.display(), manifest.name, o.cluster),
        ));
    }
    let lock = &manifest.lock;
    let arch = crate::installer_arch();
    let tests = lock
        .files
        .iter()
        .find(|f| f.component == kubexm_bom::resolve::CONFORMANCE_COMPONENT)
        .ok_or_else(|| {
            op(
                OpError::Config,
                anyhow::anyhow!(
                    "the bundle {} carries no conformance tests (kubernetes-test: e2e.test and ginkgo); \
                     rebuild it with `conformance: {{enabled: true}}` in cluster.yaml",
                    bundle.display()
                ),
            )
        })?;
    if tests.arch != arch {
        return Err(op(
            OpError::Unsupported,
            anyhow::anyhow!(
                "the bundle's conformance tests are built for {}, and this machine is {arch}: run them from a {} host, \
                 or rebuild the bundle with the registry host (the installer host) declared as {arch}",
                tests.arch,
                tests.arch
            ),
        ));
    }
    missing_images(&manifest, &bundle)?;
    let kubectl = lock
        .files
        .iter()
        .find(|f| f.component == "kubectl" && f.arch == arch)
        .ok_or_else(|| {
            op(
                OpError::Config,
                anyhow::anyhow!("the bundle {} has no kubectl for {arch}", bundle.display()),
            )
        })?;
    let kubeconfig = o
        .kubeconfig
        .clone()
        .unwrap_or_else(|| o.root.join(format!("{}.kubeconfig", o.cluster)));
    if !kubeconfig.is_file() {
        return Err(op(
            OpError::Io,
            anyhow::anyhow!(
                "no admin kubeconfig at {} (the install writes it there); pass --kubeconfig",
                kubeconfig.display()
            ),
        ));
    }
    let bin = unpack_binaries(&o.root.join("conformance").join("bin"), &bundle, tests, kubectl)?;
    let (focus, skip, listed) = selection(o, &lock.kubernetes_version)?;
    Ok(Prepared {
        cluster: o.cluster.clone(),
        version: lock.kubernetes_version.clone(),
        e2e: bin.join("e2e.test"),
        ginkgo: bin.join("ginkgo"),
        kubectl: bin.join("kubectl"),
        kubeconfig,
        focus,
        skip,
        parallel: o.parallel.max(1),
        listed,
        out: o.root.join("conformance").join(&o.cluster).join(stamp()),
        allow_not_ready: o.allow_not_ready.clone(),
        user_skip: o.skip.is_some(),
        flake_attempts: o.flake_attempts.max(1),
    })
}

/// Refused unless the cluster's record says its last successful job
/// installed it (an install or apply, not a reset); a state database of a
/// kubexm before records: unless it has a successful install since the
/// last reset. Returns the digest of the bundle the record names.
fn known_cluster(state: &Path, cluster: &str) -> anyhow::Result<Option<String>> {
    let unknown = || {
        op(
            OpError::Usage,
            anyhow::anyhow!(
                "the state database {} records no successful install of cluster {cluster}: \
                 install it with kubexm-install first, or pass the --state it was installed with",
                state.display()
            ),
        )
    };
    if !state.is_file() {
        return Err(unknown());
    }
    let st = State::open(state, vec![])?;
    let (known, recorded) = match st.last_record(cluster, true)? {
        Some((job, body)) => {
            let r = crate::ops::status::parse_record(cluster, job, &body)?;
            (matches!(r.job.kind.as_str(), "install" | "apply"), r.bundle)
        }
        None => (st.installed(cluster)?.is_some(), None),
    };
    if known { Ok(recorded) } else { Err(unknown()) }
}

/// The unpacked bundle the cluster's record names (`recorded`, its
/// digest), or else the one unpacked bundle built for `cluster` under
/// `<root>/bundles` (a differential bundle's base beside it is another).
fn find_bundle(root: &Path, cluster: &str, recorded: Option<&str>) -> anyhow::Result<PathBuf> {
    let dir = root.join("bundles");
    if let Some(hex) = recorded.and_then(|d| d.strip_prefix("sha256:"))
        && hex.len() == 64
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && dir.join(hex).join(crate::unpack::COMPLETE).is_file()
    {
        return Ok(dir.join(hex));
    }
    let mut found = Vec::new();
    if let Ok(entries) = fs_err::read_dir(&dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.join(crate::unpack::COMPLETE).is_file() && read_manifest(&p).is_ok_and(|m| m.name == cluster) {
                found.push(p);
            }
        }
    }
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "no unpacked bundle for cluster {cluster} under {}: unpack it with `kubexm-install unpack --bundle FILE`",
                dir.display()
            ),
        )),
        _ => Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "{} bundles for cluster {cluster} under {}; name one with --bundle-dir: {}",
                found.len(),
                dir.display(),
                found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

fn read_manifest(bundle: &Path) -> anyhow::Result<BundleManifest> {
    let path = bundle.join(MANIFEST_NAME);
    let text = fs_err::read_to_string(&path).map_err(|e| op(OpError::Io, e))?;
    BundleManifest::from_yaml(&text).map_err(|e| op(OpError::Io, anyhow::anyhow!("{}: {e}", path.display())))
}

/// Refused, naming each, when an image the conformance tests pull is not in
/// the bundle.
fn missing_images(manifest: &BundleManifest, bundle: &Path) -> anyhow::Result<()> {
    let wanted = manifest
        .catalog
        .as_ref()
        .and_then(|c| c.minor(&manifest.lock.kubernetes_version))
        .and_then(|m| m.conformance.as_ref())
        .map(|c| c.images.clone())
        .unwrap_or_default();
    let have: Vec<String> = manifest.lock.images.iter().map(|i| i.reference.to_string()).collect();
    let missing: Vec<&String> = wanted.iter().filter(|w| !have.iter().any(|h| h == *w)).collect();
    if wanted.is_empty() || !missing.is_empty() {
        let what = if wanted.is_empty() {
            "its lock lists no conformance images".to_string()
        } else {
            format!("it lacks {}", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))
        };
        return Err(op(
            OpError::Config,
            anyhow::anyhow!(
                "the bundle {} cannot run the conformance tests: {what}; rebuild it with `conformance: {{enabled: true}}`",
                bundle.display()
            ),
        ));
    }
    Ok(())
}

/// The sha256 the lock pins for `f`: 64 lowercase hex digits, or refused.
fn pinned(f: &kubexm_bom::FileItem) -> anyhow::Result<String> {
    match &f.checksum {
        kubexm_bom::Checksum::Sha256(h) if h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => Ok(h.clone()),
        _ => Err(op(
            OpError::Verify,
            anyhow::anyhow!(
                "the bundle's lock pins no sha256 for {}",
                crate::ops::conformance::run::printable(&f.path)
            ),
        )),
    }
}

/// `f`'s file in the unpacked bundle: a path inside it, or refused.
fn in_bundle(bundle: &Path, f: &kubexm_bom::FileItem) -> anyhow::Result<PathBuf> {
    let rel = Path::new(&f.path);
    if rel.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
        return Ok(bundle.join(rel));
    }
    Err(op(
        OpError::Verify,
        anyhow::anyhow!(
            "the bundle's lock names {} outside the bundle",
            crate::ops::conformance::run::printable(&f.path)
        ),
    ))
}

/// Refused unless the file at `path` hashes to `sha256`.
fn verify(path: &Path, sha256: &str) -> anyhow::Result<()> {
    let f = fs_err::File::open(path).map_err(|e| op(OpError::Io, e))?;
    let mut h = kubexm_bundle::digest::Hashing::new(std::io::BufReader::new(f));
    std::io::copy(&mut h, &mut std::io::sink()).map_err(|e| op(OpError::Io, anyhow::anyhow!("reading {}: {e}", path.display())))?;
    let (got, _) = h.finish();
    if got != sha256 {
        return Err(op(
            OpError::Verify,
            anyhow::anyhow!(
                "{} has sha256 {got}, the bundle's lock pins {sha256}: the unpacked bundle was changed; unpack it again",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// `e2e.test`, `ginkgo` (from the test archive) and `kubectl`, executable,
/// in a directory named by the archive's digest: unpacked once, atomically,
/// from files whose sha256 matched the lock's.
fn unpack_binaries(under: &Path, bundle: &Path, tests: &kubexm_bom::FileItem, kubectl: &kubexm_bom::FileItem) -> anyhow::Result<PathBuf> {
    let digest = pinned(tests)?;
    let dir = under.join(&digest[..16]);
    if dir.join("e2e.test").is_file() && dir.join("ginkgo").is_file() && dir.join("kubectl").is_file() {
        return Ok(dir);
    }
    let (archive, kubectl_file) = (in_bundle(bundle, tests)?, in_bundle(bundle, kubectl)?);
    verify(&archive, &digest)?;
    verify(&kubectl_file, &pinned(kubectl)?)?;
    fs_err::create_dir_all(under).map_err(|e| op(OpError::Io, e))?;
    let tmp = under.join(format!(".{}.tmp-{}", &digest[..16], std::process::id()));
    let _ = fs_err::remove_dir_all(&tmp);
    fs_err::create_dir_all(&tmp).map_err(|e| op(OpError::Io, e))?;
    let result = extract(&archive, &tmp).and_then(|()| {
        fs_err::copy(&kubectl_file, tmp.join("kubectl")).map_err(|e| op(OpError::Io, e))?;
        for b in ["e2e.test", "ginkgo", "kubectl"] {
            make_executable(&tmp.join(b))?;
        }
        let _ = fs_err::remove_dir_all(&dir);
        fs_err::rename(&tmp, &dir).map_err(|e| op(OpError::Io, e))
    });
    if result.is_err() {
        let _ = fs_err::remove_dir_all(&tmp);
    }
    result.map(|()| dir)
}

/// `kubernetes/test/bin/{e2e.test,ginkgo}` of upstream's test archive into `to`.
fn extract(archive: &Path, to: &Path) -> anyhow::Result<()> {
    let f = fs_err::File::open(archive).map_err(|e| op(OpError::Io, e))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut found = Vec::new();
    let entries = tar
        .entries()
        .map_err(|e| op(OpError::Io, anyhow::anyhow!("{}: {e}", archive.display())))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| op(OpError::Io, anyhow::anyhow!("{}: {e}", archive.display())))?;
        let path = entry.path().map(|p| p.to_path_buf()).unwrap_or_default();
        let name = path.to_string_lossy().trim_start_matches("./").to_string();
        for b in ["e2e.test", "ginkgo"] {
            if name == format!("kubernetes/test/bin/{b}") && entry.header().entry_type().is_file() {
                let mut out = fs_err::File::create(to.join(b)).map_err(|e| op(OpError::Io, e))?;
                std::io::copy(&mut entry, &mut out).map_err(|e| op(OpError::Io, anyhow::anyhow!("{}: {e}", archive.display())))?;
                found.push(b);
            }
        }
    }
    for b in ["e2e.test", "ginkgo"] {
        if !found.contains(&b) {
            return Err(op(
                OpError::Verify,
                anyhow::anyhow!("{} has no kubernetes/test/bin/{b}", archive.display()),
            ));
        }
    }
    Ok(())
}

fn make_executable(p: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs_err::set_permissions(p, std::fs::Permissions::from_mode(0o755)).map_err(|e| op(OpError::Io, e))
}

/// The focus, the skip and the listed specs of the run `o` asks for.
fn selection(o: &ConformanceOptions, version: &str) -> anyhow::Result<(String, String, Vec<specs::Listed>)> {
    let (focus, skip, listed) =
        match o.mode {
            Mode::Certified => (specs::CERTIFIED_FOCUS.to_string(), String::new(), Vec::new()),
            Mode::Quick => {
                let listed = specs::quick(version).map_err(|e| op(OpError::Io, anyhow::anyhow!(e)))?.ok_or_else(|| {
                op(
                    OpError::Unsupported,
                    anyhow::anyhow!(
                        "no quick subset for Kubernetes {version} yet (this release has one for {}); use --mode certified or --focus",
                        specs::quick_minors().join(", ")
                    ),
                )
            })?;
                let focus = specs::focus_exactly(listed.iter().map(|s| s.name.as_str()));
                (focus, specs::QUICK_SKIP.to_string(), listed)
            }
        };
    let (focus, listed) = match &o.focus {
        Some(f) => (f.clone(), Vec::new()),
        None => (focus, listed),
    };
    let skip = match (&o.skip, skip.is_empty()) {
        (Some(s), true) => s.clone(),
        (Some(s), false) => format!("{skip}|{s}"),
        (None, _) => skip,
    };
    Ok((focus, skip, listed))
}

/// Now, UTC, as `20261126T120000Z`.
fn stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = crate::pki::civil_date(days as i64);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(mode: Mode) -> ConformanceOptions {
        ConformanceOptions {
            cluster: "c".into(),
            root: "/nonexistent".into(),
            state: "/nonexistent/state.db".into(),
            bundle_dir: None,
            kubeconfig: None,
            mode,
            focus: None,
            skip: None,
            parallel: 4,
            allow_not_ready: vec![],
            flake_attempts: 1,
        }
    }

    #[test]
    fn quick_focuses_on_the_listed_specs_and_certified_on_every_conformance_spec() -> anyhow::Result<()> {
        let (focus, skip, listed) = selection(&options(Mode::Quick), "v1.37.2")?;
        assert!(listed.len() >= 40);
        assert!(focus.starts_with(" (\\[sig-") && focus.ends_with(")$"), "{focus}");
        assert_eq!(skip, r"\[Serial\]|\[Disruptive\]");
        let (focus, skip, listed) = selection(&options(Mode::Certified), "v1.37.2")?;
        assert_eq!((focus.as_str(), skip.as_str(), listed.len()), (r"\[Conformance\]", "", 0));
        let mut o = options(Mode::Quick);
        o.focus = Some("DNS".into());
        o.skip = Some("Slow".into());
        let (focus, skip, listed) = selection(&o, "v1.37.2")?;
        assert_eq!(
            (focus.as_str(), skip.as_str(), listed.len()),
            ("DNS", r"\[Serial\]|\[Disruptive\]|Slow", 0)
        );
        let e = selection(&options(Mode::Quick), "v1.36.3")
            .err()
            .ok_or_else(|| anyhow::anyhow!("v1.36 was accepted"))?;
        assert!(matches!(OpError::find(&e), Some(OpError::Unsupported(_))), "{e:#}");
        Ok(())
    }

    #[test]
    fn a_cluster_the_state_database_does_not_know_is_refused() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let e = known_cluster(&dir.path().join("none.db"), "c")
            .err()
            .ok_or_else(|| anyhow::anyhow!("accepted"))?;
        assert!(matches!(OpError::find(&e), Some(OpError::Usage(_))));
        assert!(format!("{e:#}").contains("records no successful install of cluster c"), "{e:#}");
        let db = dir.path().join("state.db");
        let st = State::open(&db, vec![])?;
        let failed = st.begin_job("c", "install")?;
        st.finish_job(failed, "failed")?;
        assert!(known_cluster(&db, "c").is_err(), "a failed install is not an installed cluster");
        let ok = st.begin_job("c", "install")?;
        st.finish_job(ok, "succeeded")?;
        known_cluster(&db, "c")?;
        assert!(known_cluster(&db, "other").is_err());
        let reset = st.begin_job("c", "reset")?;
        st.finish_job(reset, "succeeded")?;
        assert!(known_cluster(&db, "c").is_err(), "reset since");
        // Issue 29: with records, the last successful job's record decides.
        let record = |id: i64, kind: &str| -> anyhow::Result<()> {
            let cluster = kubexm_bom::config::load_str_hosts(
                "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata: {name: d}\nspec:\n  hosts: [{name: a, address: 10.0.0.1, auth: {agent: true}}]\n  roleGroups: {control-plane: [a], etcd: [a], worker: [a]}\n  controlPlaneEndpoint: {mode: local-proxy}\n",
                "d.yaml",
            )?;
            let job = kubexm_bom::record::JobRef {
                id,
                kind: kind.into(),
                status: "succeeded".into(),
                finished: 0,
            };
            let r = kubexm_bom::record::ClusterRecord::new(&cluster, job, None, None, &Default::default());
            st.put_record(id, "d", "succeeded", &serde_json::to_string(&r)?)?;
            Ok(())
        };
        record(100, "apply")?;
        known_cluster(&db, "d")?;
        record(101, "reset")?;
        assert!(known_cluster(&db, "d").is_err(), "a cluster whose record says reset");
        Ok(())
    }

    #[test]
    fn relative_paths_are_made_absolute_before_anything_reads_them() -> anyhow::Result<()> {
        let mut o = options(Mode::Quick);
        o.state = "relative/state.db".into();
        let e = prepare(&o).err().ok_or_else(|| anyhow::anyhow!("accepted"))?;
        let want = std::env::current_dir()?.join("relative/state.db");
        assert!(format!("{e:#}").contains(&format!("{} records", want.display())), "{e:#}");
        Ok(())
    }

    #[test]
    fn stamps_are_utc_times() {
        let s = stamp();
        assert_eq!(s.len(), "20261126T120000Z".len(), "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z') && s.as_bytes()[8] == b'T', "{s}");
    }
}
