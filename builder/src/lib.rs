//! kubexm-builder: the online side. Today it validates configs, prints their
//! bill of materials and writes an example config; fetching, packing and
//! signing land with the builder issue.
//!
//! Each operation takes validated options and returns data; the
//! `kubexm-bundle` binary only parses flags and prints.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
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
    let mirrors =
        Mirrors::from_args(mirrors).map_err(|e| kubexm_cli::classified(kubexm_cli::Class::Usage, anyhow::anyhow!("--mirror {e}")))?;
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

/// Writes a file whole or not at all: a temporary file beside it, then rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().context("the target path has no file name")?.to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = fs_err::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs_err::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs_err::remove_file(&tmp);
    }
    Ok(result?)
}
