//! kubexm-builder: the online side. It validates configs, resolves their
//! bill of materials, fetches and verifies everything the BOM names
//! ([`fetch`], into a content-addressed [`cache`]), packs one deterministic
//! bundle and signs it ([`build`], [`sign`]), and checks or lists bundles.
//!
//! Each operation takes validated options and returns data; the
//! `kubexm-bundle` binary only parses flags and prints.

pub mod build;
pub mod cache;
pub mod controller_image;
pub mod error;
pub mod fetch;
pub mod sign;

use std::path::{Path, PathBuf};

use kubexm_bom::Bom;
use kubexm_bom::catalog::Catalog;
use kubexm_bom::config::{self, Cluster};
use kubexm_bom::mirror::Mirrors;

/// The commented example `kubexm-bundle init` writes.
pub const EXAMPLE: &str = include_str!("../../manifests/templates/cluster.example.yaml");

/// Loads the catalog: built-in, then each `--catalog` file over it.
pub fn catalog(overrides: &[PathBuf]) -> anyhow::Result<Catalog> {
    let files: Vec<&Path> = overrides.iter().map(PathBuf::as_path).collect();
    Ok(Catalog::with_overrides(&files)?)
}

/// Reads and validates a config, returning it completed with defaults.
pub fn validate(config: &Path, catalog: &Catalog) -> anyhow::Result<Cluster> {
    Ok(config::load_file(config, catalog)?)
}

/// Resolves a config into its bill of materials.
pub fn bom(config: &Path, catalog: &Catalog, mirrors: &[String]) -> anyhow::Result<Bom> {
    let cluster = validate(config, catalog)?;
    let mirrors = Mirrors::from_args(mirrors)
        .map_err(|e| crate::error::build_err(crate::error::BuildError::Usage, anyhow::anyhow!("--mirror {e}")))?;
    Ok(kubexm_bom::resolve::resolve(&cluster, catalog, &mirrors)?)
}

/// Writes the example config to `path`, never over an existing file unless `force`.
pub fn init(path: &Path, force: bool) -> anyhow::Result<()> {
    if path.exists() && !force {
        anyhow::bail!(
            "{} already exists; pass --force to overwrite it, or choose another path with -f",
            path.display()
        );
    }
    write_atomic(path, EXAMPLE.as_bytes())
}

/// Writes a file whole or not at all (shared with the installer).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(kubexm_bundle::files::write_atomic(path, bytes)?)
}

/// A bundle checked against its signature, every member read.
#[derive(Debug)]
pub struct Checked {
    pub manifest: kubexm_bundle::manifest::BundleManifest,
    /// `sha256:<hex>` of its `bundle.yaml`.
    pub digest: String,
    /// The signature's trusted comment.
    pub comment: String,
}

/// Checks a bundle's signature and every member it carries in one pass.
pub fn verify(bundle: &Path, pubkey: &Path) -> anyhow::Result<Checked> {
    let sig = sign::signature_path(bundle);
    if !sig.exists() {
        return Err(crate::error::build_err(
            crate::error::BuildError::Verify,
            anyhow::anyhow!("{} has no signature beside it ({} is missing)", bundle.display(), sig.display()),
        ));
    }
    let verify_err = |e| crate::error::build_err(crate::error::BuildError::Verify, e);
    let check = kubexm_bundle::verify::SignatureCheck::load(&sig, pubkey).map_err(verify_err)?;
    // One open, one pass: the members checked are the bytes the signature covers.
    let read = kubexm_bundle::verify::read_bundle(bundle, Some(&check), &mut kubexm_bundle::verify::Discard).map_err(verify_err)?;
    Ok(Checked {
        digest: format!("sha256:{}", kubexm_bundle::digest::sha256_hex(read.text.as_bytes())),
        manifest: read.manifest,
        comment: read.comment.unwrap_or_default(),
    })
}

/// [`verify`] of a differential bundle and of its `base` (both with
/// `pubkey`), then the chain between them: the base is the full bundle
/// the differential names and holds every member it takes from it.
pub fn verify_pair(bundle: &Path, base: &Path, pubkey: &Path) -> anyhow::Result<(Checked, Checked)> {
    let diff = verify(bundle, pubkey)?;
    let full = verify(base, pubkey)?;
    let (d, b) = (bundle.display().to_string(), base.display().to_string());
    kubexm_bundle::diff::check_base(&diff.manifest, &d, &full.manifest, &full.digest, &b).map_err(diff_err)?;
    Ok((diff, full))
}

/// A base that does not fit, as a build failure: a chain is not supported
/// yet, anything else fails verification.
pub fn diff_err(e: kubexm_bundle::diff::DiffError) -> anyhow::Error {
    let kind = if e.is_unsupported() {
        crate::error::BuildError::Unsupported
    } else {
        crate::error::BuildError::Verify
    };
    crate::error::build_err(kind, e)
}

/// Reads a bundle's manifest without unpacking anything.
pub fn inspect(bundle: &Path) -> anyhow::Result<kubexm_bundle::manifest::BundleManifest> {
    kubexm_bundle::verify::read_manifest(bundle).map_err(|e| crate::error::build_err(crate::error::BuildError::Verify, e))
}

/// The bill of materials in `format` that `bundle` (whose bundle.yaml is
/// `m`) carries, written again from `m` alone: the same bytes, checked
/// against the sha256 bundle.yaml lists for it. A bundle built before
/// bundles carried one gets it with a warning that it is not signed; one
/// whose bill this kubexm-bundle writes differently (another version's)
/// is refused, naming how to read the carried one.
pub fn carried_bill(
    bundle: &Path,
    m: &kubexm_bundle::manifest::BundleManifest,
    format: kubexm_bundle::sbom::Format,
) -> anyhow::Result<Vec<u8>> {
    let bill = kubexm_bundle::sbom::write(m, format);
    let name = format.file_name();
    match m.members.iter().find(|x| x.path == name) {
        None => {
            tracing::warn!(
                "{}: built by {}, it carries no {name}: this one is written from its bundle.yaml, not signed with it",
                bundle.display(),
                m.created_by
            );
            Ok(bill)
        }
        Some(x) if x.sha256 == kubexm_bundle::digest::sha256_hex(&bill) => Ok(bill),
        Some(_) => Err(crate::error::build_err(
            crate::error::BuildError::Verify,
            anyhow::anyhow!(
                "{}: built by {}, its {name} is not what this kubexm-bundle writes from its bundle.yaml; \
                 read the one it carries with `tar --zstd -xOf {} {name}` (after `kubexm-bundle verify`)",
                bundle.display(),
                m.created_by,
                bundle.display()
            ),
        )),
    }
}

/// A person's view of a bundle's contents.
pub fn describe(m: &kubexm_bundle::manifest::BundleManifest) -> String {
    use std::fmt::Write as _;
    let size: std::collections::HashMap<&str, u64> = m.members.iter().map(|x| (x.path.as_str(), x.size)).collect();
    let mut out = String::new();
    let lock = &m.lock;
    let _ = writeln!(
        out,
        "bundle {} ({}), Kubernetes {}, arches {}",
        m.name,
        m.created_by,
        lock.kubernetes_version,
        lock.arches.join(", ")
    );
    let _ = writeln!(
        out,
        "config {}; {} members, {} bytes of content",
        m.config_digest,
        m.members.len() + 1,
        m.total_size()
    );
    if let Some(b) = &m.base {
        let carried = m.carried().count();
        let _ = writeln!(
            out,
            "differential bundle of base {} ({}): it carries {} members ({} bytes); {} members ({} bytes) are taken from the base",
            b.digest,
            b.created_by,
            carried + 1,
            m.carried_size(),
            m.members.len() - carried,
            m.total_size() - m.carried_size()
        );
    }
    for arch in lock.arches.iter().map(String::as_str).chain(["any"]) {
        let files: Vec<_> = lock.files.iter().filter(|f| f.arch == arch).collect();
        if files.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\nFILES {arch}");
        for f in files {
            let _ = writeln!(
                out,
                "  {:<12} {:<12} {:>11}  {}",
                f.component,
                f.version,
                size.get(f.path.as_str()).copied().unwrap_or(0),
                f.path
            );
        }
    }
    let _ = writeln!(out, "\nMANIFESTS");
    for x in &lock.manifests {
        let _ = writeln!(
            out,
            "  {:<16} {:<10} {:>9}  {}",
            x.addon,
            x.version,
            size.get(x.path.as_str()).copied().unwrap_or(0),
            x.path
        );
    }
    let _ = writeln!(out, "\nIMAGES");
    for i in &lock.images {
        let _ = writeln!(
            out,
            "  {}  {}  {}",
            i.reference,
            i.platforms.join(","),
            i.digest.as_deref().unwrap_or("(unpinned)")
        );
    }
    let _ = writeln!(out, "\nCHARTS");
    for c in &lock.charts {
        let _ = writeln!(
            out,
            "  {} {} {:>9}  {}",
            c.name,
            c.version,
            size.get(c.path.as_str()).copied().unwrap_or(0),
            c.path
        );
    }
    let os: Vec<_> = m.members.iter().filter(|x| x.path.starts_with("os/")).collect();
    let _ = writeln!(out, "\nOS REPOSITORIES{}", if os.is_empty() { " (none)" } else { "" });
    for x in os {
        let _ = writeln!(out, "  {} {}", x.path, x.size);
    }
    out
}
