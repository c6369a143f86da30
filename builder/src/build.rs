//! `kubexm-bundle build`: BOM → fetched, verified content → one signed bundle.
//!
//! Stages, each bounded by `--jobs`: files, then manifests (whose pod
//! templates add images to the BOM), then charts, then images. Every URL is
//! checked against `--strict-mirrors` before the first request, and nothing
//! is packed unless every item was fetched and verified, so a failed build
//! never leaves an archive behind. Packing reads only the cache.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use futures_util::{StreamExt, TryStreamExt, stream};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::error::{BuildError, build_err};
use kubexm_bom::image::ImageRef;
use kubexm_bom::mirror::Mirrors;
use kubexm_bom::{Bom, Checksum, ImageItem};
use kubexm_bundle::digest::sha256_hex;
use kubexm_bundle::layout::{self, Descriptor, LayoutIndex};
use kubexm_bundle::manifest::{API_VERSION, BundleManifest, KIND};
use kubexm_bundle::pack::{PackMember, Source};

use crate::cache::Cache;
use crate::fetch::http::Http;
use crate::fetch::images::{Pulled, Puller};
use crate::fetch::{FetchError, charts, checksum, debian, scan};

/// Validated options of one build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub config: PathBuf,
    pub bundle: PathBuf,
    pub key: Option<PathBuf>,
    pub catalogs: Vec<PathBuf>,
    pub mirrors: Vec<String>,
    pub strict_mirrors: bool,
    pub cache_dir: PathBuf,
    pub jobs: usize,
}

/// What a build did, for people (`text`) and tools (`-o json`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildSummary {
    pub bundle: PathBuf,
    pub signature: Option<PathBuf>,
    pub bundle_size: u64,
    pub bundle_yaml_sha256: String,
    pub members: usize,
    pub content_bytes: u64,
    pub files: usize,
    pub manifests: usize,
    pub images: usize,
    pub blobs: usize,
    pub charts: usize,
    /// Requests sent to upstreams (files, manifests, chart indexes); 0 on a warm cache.
    pub upstream_requests: u64,
    /// Bytes downloaded from upstreams and registries.
    pub downloaded_bytes: u64,
    pub seconds: f64,
}

/// Runs a build.
pub fn build(opts: &BuildOptions) -> anyhow::Result<BuildSummary> {
    let start = Instant::now();
    let catalog = crate::catalog(&opts.catalogs)?;
    let cluster = crate::validate(&opts.config, &catalog)?;
    let config_bytes = fs_err::read(&opts.config)?;
    let cli_mirrors = Mirrors::from_args(&opts.mirrors).map_err(|e| build_err(BuildError::Usage, anyhow::anyhow!("--mirror {e}")))?;
    let mut mirrors = Mirrors::parse(cluster.spec.bundle.mirrors.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| build_err(BuildError::Config, anyhow::anyhow!(e)))?;
    mirrors.extend(cli_mirrors.clone());
    let mut bom = kubexm_bom::resolve::resolve(&cluster, &catalog, &cli_mirrors)?;
    if opts.strict_mirrors {
        strict_check(&bom, &mirrors)?;
    }
    let cache = Cache::open(&opts.cache_dir).with_context(|| format!("opening the cache {}", opts.cache_dir.display()))?;
    let progress = Progress::new();
    let downloaded = Arc::new(AtomicU64::new(0));
    let on_bytes: Arc<dyn Fn(u64) + Send + Sync> = {
        let d = downloaded.clone();
        let bar = progress.bytes.clone();
        Arc::new(move |n| {
            d.fetch_add(n, Ordering::Relaxed);
            bar.inc(n);
        })
    };
    let http = Http::new(on_bytes.clone()).context("creating the HTTP client")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let jobs = opts.jobs.max(1);
    let (pulled, repos) = rt
        .block_on(fetch_all(
            &mut bom,
            &cache,
            &http,
            &mirrors,
            opts.strict_mirrors,
            jobs,
            on_bytes,
            &progress,
            &catalog,
        ))
        .map_err(classify)?;
    progress.finish();

    // Assemble: every member comes from the cache, sorted by path.
    let mut members: BTreeMap<String, PackMember> = BTreeMap::new();
    let add_blob = |members: &mut BTreeMap<String, PackMember>, path: String, hex: &str| -> anyhow::Result<bool> {
        if members.contains_key(&path) {
            return Ok(false);
        }
        let file = cache.blob(hex);
        let size = fs_err::metadata(&file)?.len();
        members.insert(
            path.clone(),
            PackMember {
                path,
                source: Source::File(file),
                size,
                sha256: hex.to_string(),
            },
        );
        Ok(true)
    };
    for f in &bom.files {
        let Checksum::Sha256(hex) = &f.checksum else {
            bail!("{} {} {}: no verified digest", f.component, f.version, f.arch)
        };
        add_blob(&mut members, f.path.clone(), hex)?;
    }
    for m in &bom.manifests {
        add_blob(&mut members, m.path.clone(), m.sha256.as_deref().unwrap_or_default())?;
    }
    for c in &bom.charts {
        add_blob(&mut members, c.path.clone(), c.sha256.as_deref().unwrap_or_default())?;
    }
    for r in &repos {
        for (file, sha) in &r.debs {
            add_blob(&mut members, format!("{}/{file}", r.path), sha)?;
        }
        for (name, bytes) in &r.index_files {
            let path = format!("{}/{name}", r.path);
            members.insert(
                path.clone(),
                PackMember {
                    path,
                    size: bytes.len() as u64,
                    source: Source::Bytes(bytes.clone()),
                    sha256: sha256_hex(bytes),
                },
            );
        }
    }
    let mut index_entries = Vec::new();
    let mut blob_count = 0;
    for (item, p) in bom.images.iter().zip(&pulled) {
        for b in &p.blobs {
            if add_blob(&mut members, layout::blob_path(b), b)? {
                blob_count += 1;
            }
        }
        let desc = Descriptor {
            media_type: p.media_type.clone(),
            digest: p.digest.clone(),
            size: p.size,
            annotations: Default::default(),
        };
        index_entries.push((item.reference.to_string(), desc));
    }
    if !bom.images.is_empty() {
        for (path, bytes) in [
            (format!("{}/oci-layout", layout::DIR), layout::OCI_LAYOUT.as_bytes().to_vec()),
            (format!("{}/index.json", layout::DIR), LayoutIndex::new(index_entries).to_bytes()),
        ] {
            let sha256 = sha256_hex(&bytes);
            members.insert(
                path.clone(),
                PackMember {
                    path,
                    size: bytes.len() as u64,
                    source: Source::Bytes(bytes),
                    sha256,
                },
            );
        }
    }
    let members: Vec<PackMember> = members.into_values().collect();
    let manifest = BundleManifest {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        name: cluster.metadata.name.clone(),
        created_by: concat!("kubexm-bundle ", env!("CARGO_PKG_VERSION")).into(),
        config_digest: format!("sha256:{}", sha256_hex(&config_bytes)),
        lock: bom.clone(),
        catalog: Some(catalog.locked_for(&cluster, &bom)),
        members: kubexm_bundle::pack::listing(&members),
    };
    let yaml_sha = sha256_hex(
        manifest
            .to_yaml()
            .map_err(|e| anyhow::anyhow!("encoding bundle.yaml: {e}"))?
            .as_bytes(),
    );
    let content: u64 = members.iter().map(|m| m.size).sum();
    let pack_bar = progress.pack_bar(content);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
    let size = kubexm_bundle::pack::pack(&opts.bundle, &manifest, &members, workers, &|n| pack_bar.set_position(n))?;
    pack_bar.finish_and_clear();
    tracing::info!("wrote {} ({} bytes, {} members)", opts.bundle.display(), size, members.len() + 1);

    let signature = match &opts.key {
        Some(key) => {
            let sig = crate::sign::signature_path(&opts.bundle);
            let comment = format!("kubexm bundle {} bundle.yaml sha256:{yaml_sha}", manifest.name);
            crate::sign::sign(&opts.bundle, key, &comment)?;
            Some(sig)
        }
        None => None,
    };
    Ok(BuildSummary {
        bundle: opts.bundle.clone(),
        signature,
        bundle_size: size,
        bundle_yaml_sha256: yaml_sha,
        members: members.len() + 1,
        content_bytes: content,
        files: bom.files.len(),
        manifests: bom.manifests.len(),
        images: bom.images.len(),
        blobs: blob_count,
        charts: bom.charts.len(),
        upstream_requests: http.requests(),
        downloaded_bytes: downloaded.load(Ordering::Relaxed),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Tags fetch failures with their exit class: a digest that does not match
/// is a verification failure, anything else a fetch failure.
fn classify(e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<FetchError>() {
        Some(FetchError::BadDigest { .. }) => build_err(BuildError::Verify, e),
        Some(FetchError::Io { .. }) => build_err(BuildError::Io, e),
        Some(_) => build_err(BuildError::Fetch, e),
        None => e,
    }
}

/// Every URL and image the BOM would touch must have a mirror mapping.
fn strict_check(bom: &Bom, mirrors: &Mirrors) -> anyhow::Result<()> {
    let mut unmapped = Vec::new();
    let mut url = |what: String, u: &str| {
        if !mirrors.covers_url(u) {
            unmapped.push(format!("{what}: {u}"));
        }
    };
    for f in &bom.files {
        url(format!("{} {} {}", f.component, f.version, f.arch), &f.url);
        if let Checksum::Published(c) = &f.checksum {
            // Resolution already pointed the checksum at the mirror that
            // serves the file when a mapping covered it.
            let origin = |u: &str| u.split_once("://").map(|(_, r)| r.split('/').next().unwrap_or("").to_string());
            let rewritten = f.source != f.url && origin(c) == origin(&f.source);
            if !rewritten {
                url(format!("{} checksum", f.component), c);
            }
        }
    }
    for m in &bom.manifests {
        url(format!("manifest {} {}", m.addon, m.version), &m.url);
    }
    for c in &bom.charts {
        let upstream = c
            .upstream
            .strip_prefix("oci://")
            .map(|r| format!("https://{r}"))
            .unwrap_or_else(|| c.upstream.clone());
        url(format!("chart {}", c.name), &upstream);
    }
    for i in &bom.images {
        if !mirrors.covers_image(&i.reference) {
            unmapped.push(format!("image {}", i.reference));
        }
    }
    if unmapped.is_empty() {
        return Ok(());
    }
    Err(build_err(
        BuildError::Usage,
        anyhow::anyhow!(
            "--strict-mirrors: {} upstream(s) have no mirror mapping; add --mirror UPSTREAM=URL for each:\n  {}",
            unmapped.len(),
            unmapped.join("\n  ")
        ),
    ))
}

#[allow(clippy::too_many_arguments)]
async fn fetch_all(
    bom: &mut Bom,
    cache: &Cache,
    http: &Http,
    mirrors: &Mirrors,
    strict: bool,
    jobs: usize,
    on_bytes: Arc<dyn Fn(u64) + Send + Sync>,
    progress: &Progress,
    catalog: &kubexm_bom::catalog::Catalog,
) -> anyhow::Result<(Vec<Pulled>, Vec<debian::Repo>)> {
    // Files: pinned digest, or the upstream's published checksum (remembered per URL).
    let bar = progress.stage("files", bom.files.len());
    let files = std::mem::take(&mut bom.files);
    bom.files = stream::iter(files)
        .map(|mut f| {
            let bar = bar.clone();
            async move {
                let artifact = format!("{} {} {}", f.component, f.version, f.arch);
                let expected = match &f.checksum {
                    Checksum::Sha256(h) => h.clone(),
                    Checksum::Published(sum_url) => published(http, cache, &artifact, sum_url, &f.url).await?,
                    Checksum::Unknown => {
                        return Err(FetchError::NoChecksum {
                            artifact,
                            url: f.url.clone(),
                            file: "(no pinned digest and no published checksum URL)".into(),
                        });
                    }
                };
                http.fetch(cache, &artifact, &f.source, &expected).await?;
                f.checksum = Checksum::Sha256(expected);
                bar.inc(1);
                Ok::<_, FetchError>(f)
            }
        })
        .buffered(jobs)
        .try_collect()
        .await?;
    bar.finish();

    // Manifests: fetched (remembered per URL), then scanned for images.
    let bar = progress.stage("manifests", bom.manifests.len());
    let mut found: Vec<(String, String)> = Vec::new();
    for m in &mut bom.manifests {
        let artifact = format!("manifest {} {}", m.addon, m.version);
        let hex = match cache.get_ref::<String>("manifests", &m.source).filter(|h| cache.has(h)) {
            Some(h) => h,
            None => {
                let bytes = http.get_bytes(&artifact, &m.source).await?;
                let h = cache.put_bytes(&bytes).map_err(FetchError::io("cache"))?;
                cache.set_ref("manifests", &m.source, &h).map_err(FetchError::io("cache"))?;
                h
            }
        };
        let text = String::from_utf8(cache.read(&hex)?).map_err(|_| anyhow::anyhow!("{artifact}: {} is not UTF-8 text", m.url))?;
        let images = scan::images(&text).map_err(|e| {
            build_err(
                BuildError::Fetch,
                anyhow::anyhow!("{artifact}: {} is not a readable manifest: {e}", m.url),
            )
        })?;
        for i in images {
            found.push((i, format!("{}/{}", m.addon, m.version)));
        }
        m.sha256 = Some(hex);
        bar.inc(1);
    }
    bar.finish();
    let platforms: Vec<String> = bom.arches.iter().map(|a| format!("linux/{a}")).collect();
    for (image, from) in found {
        let reference = ImageRef::parse(&image).map_err(|e| build_err(BuildError::Fetch, anyhow::anyhow!("manifest {from}: {e}")))?;
        if strict && !mirrors.covers_image(&reference) {
            bail!(build_err(
                BuildError::Usage,
                anyhow::anyhow!("--strict-mirrors: image {reference} (named by manifest {from}) has no mirror mapping")
            ));
        }
        if !bom.images.iter().any(|i| i.reference == reference) {
            bom.images.push(ImageItem {
                source: mirrors.rewrite_image(&reference),
                reference,
                platforms: platforms.clone(),
                digest: None,
                upstream_digest: None,
                from_manifest: Some(from),
            });
        }
    }
    bom.images.sort_by(|a, b| a.reference.cmp(&b.reference));

    // Charts and images share one registry client.
    let puller = Puller::new(
        crate::fetch::images::http_hosts(&bom.images)
            .into_iter()
            .chain(chart_http_hosts(bom))
            .collect(),
        on_bytes,
    );
    let bar = progress.stage("charts", bom.charts.len());
    for c in &mut bom.charts {
        c.sha256 = Some(charts::fetch(http, &puller, cache, c).await?);
        bar.inc(1);
    }
    bar.finish();
    let bar = progress.stage("images", bom.images.len());
    let pulled: Vec<Pulled> = stream::iter(bom.images.iter())
        .map(|i| {
            let bar = bar.clone();
            let puller = &puller;
            async move {
                let p = puller.pull(cache, i).await;
                bar.inc(1);
                p
            }
        })
        .buffered(jobs)
        .try_collect()
        .await?;
    bar.finish();
    for (i, p) in bom.images.iter_mut().zip(&pulled) {
        i.digest = Some(p.digest.clone());
        i.upstream_digest = p.upstream_digest.clone();
    }

    // OS package repositories: verified mirror, resolved, every .deb fetched.
    let bar = progress.stage("os repos", bom.os_repos.len());
    let mut repos = Vec::new();
    for item in &mut bom.os_repos {
        let release = catalog
            .os
            .releases
            .get(&item.release)
            .ok_or_else(|| anyhow::anyhow!("OS release {} is not in the catalog", item.release))?;
        let keys = release.keyring_text()?;
        let (repo, in_base) = debian::build_repo(http, cache, item, &keys, &release.base_priorities, jobs)
            .await
            .map_err(debian_error)?;
        if !in_base.is_empty() {
            tracing::info!(
                "{} {}: {} already on every host of the release (its base set); not carried",
                item.release,
                item.arch,
                in_base.join(", ")
            );
        }
        repos.push(repo);
        bar.inc(1);
    }
    bar.finish();
    Ok((pulled, repos))
}

/// Tags repository failures with their exit class.
fn debian_error(e: debian::DebianError) -> anyhow::Error {
    use debian::DebianError as D;
    match e {
        D::Fetch(f) => anyhow::Error::new(f),
        e @ (D::BadSignature { .. } | D::IndexDigest { .. }) => build_err(BuildError::Verify, e),
        e @ D::Unresolvable(..) => build_err(BuildError::Config, e),
        e @ (D::Keyring { .. } | D::BadIndex { .. }) => build_err(BuildError::Fetch, e),
    }
}

fn chart_http_hosts(bom: &Bom) -> Vec<String> {
    bom.charts
        .iter()
        .filter_map(|c| match &c.source {
            kubexm_bom::ChartSource::Oci { reference } => reference
                .strip_prefix("http://")
                .and_then(|r| r.split('/').next())
                .map(str::to_string),
            _ => None,
        })
        .collect()
}

/// The sha256 a published checksum file gives for `url`, remembered per
/// checksum file (one file often lists every arch).
async fn published(http: &Http, cache: &Cache, artifact: &str, sum_url: &str, url: &str) -> Result<String, FetchError> {
    // The checksum file is cached whole: several artifacts share one (etcd's
    // SHA256SUMS lists every arch) and are verified at the same time, so a
    // per-artifact entry would be a read-modify-write race that loses one.
    let text: String = match cache.get_ref("checksum-files", sum_url) {
        Some(t) => t,
        None => {
            let t = String::from_utf8_lossy(&http.get_bytes(artifact, sum_url).await?).into_owned();
            cache.set_ref("checksum-files", sum_url, &t).map_err(FetchError::io("cache"))?;
            t
        }
    };
    let file = url.rsplit('/').next().unwrap_or(url);
    checksum::find(&text, file).ok_or_else(|| FetchError::NoChecksum {
        artifact: artifact.into(),
        url: sum_url.into(),
        file: file.into(),
    })
}

/// Progress: bars on a terminal, log lines otherwise.
struct Progress {
    multi: MultiProgress,
    tty: bool,
    bytes: ProgressBar,
}

impl Progress {
    fn new() -> Progress {
        let tty = std::io::stderr().is_terminal();
        let multi = MultiProgress::new();
        if !tty {
            multi.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let bytes = multi.add(ProgressBar::no_length());
        bytes.set_style(
            ProgressStyle::with_template("  downloaded {bytes} ({bytes_per_sec})").unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Progress { multi, tty, bytes }
    }

    fn stage(&self, name: &str, total: usize) -> Stage {
        let bar = self.multi.add(ProgressBar::new(total as u64));
        bar.set_style(
            ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(name.to_string());
        Stage {
            bar,
            name: name.to_string(),
            tty: self.tty,
            total,
        }
    }

    fn pack_bar(&self, total: u64) -> ProgressBar {
        if !self.tty {
            tracing::info!("packing {total} bytes");
        }
        let bar = self.multi.add(ProgressBar::new(total));
        bar.set_style(
            ProgressStyle::with_template("{prefix:>10} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix("pack");
        bar
    }

    fn finish(&self) {
        self.bytes.finish_and_clear();
    }
}

#[derive(Clone)]
struct Stage {
    bar: ProgressBar,
    name: String,
    tty: bool,
    total: usize,
}

impl Stage {
    fn inc(&self, n: u64) {
        self.bar.inc(n);
    }
    fn finish(&self) {
        self.bar.finish();
        if !self.tty {
            tracing::info!("{}: {} done", self.name, self.total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_mirrors_accept_the_mirrored_checksum_of_an_unpinned_file_and_name_an_unmapped_one() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/single-node.yaml")).unwrap();
        let catalog = kubexm_bom::catalog::Catalog::builtin().unwrap();
        let mut cluster = kubexm_bom::config::load_str(&text, "single-node.yaml", &catalog).unwrap();
        cluster.spec.kubernetes.version = "v1.37.2".into(); // not pinned: upstream's .sha256
        let all = Mirrors::parse([
            ("dl.k8s.io", "http://m.example/dl.k8s.io"),
            ("github.com", "http://m.example/github.com"),
            ("get.helm.sh", "http://m.example/get.helm.sh"),
            ("raw.githubusercontent.com", "http://m.example/raw"),
            ("registry.k8s.io", "http://m.example:5000/registry.k8s.io"),
            ("docker.io", "http://m.example:5000/docker.io"),
            ("quay.io", "http://m.example:5000/quay.io"),
        ])
        .unwrap();
        let bom = kubexm_bom::resolve::resolve(&cluster, &catalog, &all).unwrap();
        assert!(bom.files.iter().any(|f| matches!(f.checksum, Checksum::Published(_))));
        strict_check(&bom, &all).unwrap();
        // Without a mapping for dl.k8s.io, the file and its checksum are named.
        let some = Mirrors::parse([("github.com", "http://m.example/github.com")]).unwrap();
        let bom = kubexm_bom::resolve::resolve(&cluster, &catalog, &some).unwrap();
        let err = strict_check(&bom, &some).unwrap_err().to_string();
        assert!(
            err.contains("kubeadm checksum: https://dl.k8s.io/release/v1.37.2/bin/linux/"),
            "{err}"
        );
    }
}
