//! `kubexm-bundle build`: BOM → fetched, verified content → one signed bundle.
//!
//! Stages, each bounded by `--jobs`: files, then manifests (whose pod
//! templates add images to the BOM), then charts, then images. Every URL is
//! checked against `--strict-mirrors` before the first request, and nothing
//! is packed unless every item was fetched and verified, so a failed build
//! never leaves an archive behind. Packing reads only the cache.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
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
    /// Build a differential bundle against this full bundle, verified first
    /// with `pubkey`.
    pub base: Option<PathBuf>,
    /// The base's minisign public key (required with `base`).
    pub pubkey: Option<PathBuf>,
    /// `--controller-binary ARCH=FILE`: the `kubexm` binaries the
    /// controller's image is made of ([`crate::controller_image`]).
    pub controller_binaries: Vec<String>,
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
    /// A differential bundle's base (`sha256:<hex>` of its bundle.yaml).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Members (and their bytes) a differential bundle takes from its base.
    pub from_base_members: usize,
    pub from_base_bytes: u64,
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
    // Before anything is fetched: building from an unverifiable base is refused.
    let base = opts
        .base
        .as_deref()
        .map(|b| verified_base(b, opts.pubkey.as_deref(), opts.key.as_deref()))
        .transpose()?;
    let (cli_mirrors, mirrors) = mirrors_of(opts, &cluster)?;
    let controller_binaries = crate::controller_image::binaries(&opts.controller_binaries).map_err(|e| build_err(BuildError::Usage, e))?;
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
    let fetch = Fetch {
        cache: &cache,
        http: &http,
        mirrors: &mirrors,
        strict: opts.strict_mirrors,
        jobs: opts.jobs.max(1),
        progress: &progress,
        catalog: &catalog,
        controller_binaries: &controller_binaries,
    };
    let (pulled, repos) = rt.block_on(fetch.all(&mut bom, on_bytes)).map_err(classify)?;
    progress.finish();

    let (mut members, blob_count) = assemble(&cache, &bom, &pulled, &repos)?;
    let mut manifest = BundleManifest {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        name: cluster.metadata.name.clone(),
        created_by: concat!("kubexm-bundle ", env!("CARGO_PKG_VERSION")).into(),
        config_digest: format!("sha256:{}", sha256_hex(&config_bytes)),
        lock: bom.clone(),
        catalog: Some(catalog.locked_for(&cluster, &bom)),
        base: None,
        members: kubexm_bundle::pack::listing(&members),
    };
    // The bills of materials, from bundle.yaml as it lists every other member.
    for format in kubexm_bundle::sbom::FORMATS {
        let bytes = kubexm_bundle::sbom::write(&manifest, format);
        members.push(PackMember {
            path: format.file_name().into(),
            size: bytes.len() as u64,
            sha256: sha256_hex(&bytes),
            source: Source::Bytes(bytes),
        });
    }
    members.sort_by(|a, b| a.path.cmp(&b.path));
    manifest.members = kubexm_bundle::pack::listing(&members);
    if let Some(b) = &base {
        kubexm_bundle::diff::make_differential(&mut manifest, &b.manifest, &b.digest).map_err(|e| anyhow::anyhow!(e))?;
        let taken: std::collections::HashSet<&str> = manifest.members.iter().filter(|m| m.from_base).map(|m| m.path.as_str()).collect();
        members.retain(|m| !taken.contains(m.path.as_str()));
    }
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
    let signature = sign_bundle(opts, &manifest.name, &yaml_sha)?;
    if let (Some(pubkey), Some(_)) = (&opts.pubkey, &base) {
        same_key(&opts.bundle, pubkey)?;
    }
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
        base: base.map(|b| b.digest),
        from_base_members: manifest.members.len() - members.len(),
        from_base_bytes: manifest.total_size() - content,
        upstream_requests: http.requests(),
        downloaded_bytes: downloaded.load(Ordering::Relaxed),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The `--mirror` flags, and every mirror the build uses (the config's
/// `bundle.mirrors` with the flags over them).
fn mirrors_of(opts: &BuildOptions, cluster: &kubexm_bom::config::Cluster) -> anyhow::Result<(Mirrors, Mirrors)> {
    let cli = Mirrors::from_args(&opts.mirrors).map_err(|e| build_err(BuildError::Usage, anyhow::anyhow!("--mirror {e}")))?;
    let mut all = Mirrors::parse(cluster.spec.bundle.mirrors.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| build_err(BuildError::Config, anyhow::anyhow!(e)))?;
    all.extend(cli.clone());
    Ok((cli, all))
}

/// The bundle's members, every one from the cache (or, for index files
/// made here, from memory), sorted by path; and how many image blobs.
fn assemble(cache: &Cache, bom: &Bom, pulled: &[Pulled], repos: &[debian::Repo]) -> anyhow::Result<(Vec<PackMember>, usize)> {
    let mut members = Members {
        cache,
        by_path: BTreeMap::new(),
    };
    for f in &bom.files {
        let Checksum::Sha256(hex) = &f.checksum else {
            bail!("{} {} {}: no verified digest", f.component, f.version, f.arch)
        };
        members.blob(f.path.clone(), hex)?;
    }
    for m in &bom.manifests {
        members.blob(m.path.clone(), m.sha256.as_deref().unwrap_or_default())?;
    }
    for c in &bom.charts {
        members.blob(c.path.clone(), c.sha256.as_deref().unwrap_or_default())?;
    }
    for r in repos {
        for (file, sha) in &r.debs {
            members.blob(format!("{}/{file}", r.path), sha)?;
        }
        for (name, bytes) in &r.index_files {
            members.bytes(format!("{}/{name}", r.path), bytes.clone());
        }
    }
    let mut index_entries = Vec::new();
    let mut blob_count = 0;
    for (item, p) in bom.images.iter().zip(pulled) {
        for b in &p.blobs {
            if members.blob(layout::blob_path(b), b)? {
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
        members.bytes(format!("{}/oci-layout", layout::DIR), layout::OCI_LAYOUT.as_bytes().to_vec());
        members.bytes(format!("{}/index.json", layout::DIR), LayoutIndex::new(index_entries).to_bytes());
    }
    Ok((members.by_path.into_values().collect(), blob_count))
}

/// Members being gathered, by path.
struct Members<'a> {
    cache: &'a Cache,
    by_path: BTreeMap<String, PackMember>,
}

impl Members<'_> {
    /// The cached blob `hex` at `path`; false when the path is already there.
    fn blob(&mut self, path: String, hex: &str) -> anyhow::Result<bool> {
        if self.by_path.contains_key(&path) {
            return Ok(false);
        }
        let file = self.cache.blob(hex);
        let size = fs_err::metadata(&file)?.len();
        let member = PackMember {
            path: path.clone(),
            source: Source::File(file),
            size,
            sha256: hex.to_string(),
        };
        self.by_path.insert(path, member);
        Ok(true)
    }

    /// `bytes` made here at `path`.
    fn bytes(&mut self, path: String, bytes: Vec<u8>) {
        let member = PackMember {
            path: path.clone(),
            size: bytes.len() as u64,
            sha256: sha256_hex(&bytes),
            source: Source::Bytes(bytes),
        };
        self.by_path.insert(path, member);
    }
}

/// The base of a differential build, checked against its signature with
/// `pubkey` (an unsigned base is never accepted); a differential base is
/// refused as not supported yet.
fn verified_base(base: &Path, pubkey: Option<&Path>, key: Option<&Path>) -> anyhow::Result<crate::Checked> {
    let Some(pubkey) = pubkey else {
        return Err(crate::error::build_err(
            crate::error::BuildError::Usage,
            anyhow::anyhow!(
                "--base {} needs --pubkey FILE: a base is always verified against its signature",
                base.display()
            ),
        ));
    };
    if key.is_none() {
        return Err(crate::error::build_err(
            crate::error::BuildError::Usage,
            anyhow::anyhow!(
                "--base {} needs --key FILE: an install verifies a differential bundle and its base with one --pubkey, so both are signed",
                base.display()
            ),
        ));
    }
    let checked = crate::verify(base, pubkey)?;
    if let Some(of) = &checked.manifest.base {
        return Err(crate::diff_err(kubexm_bundle::diff::DiffError::Chain {
            base: base.display().to_string(),
            of: of.digest.clone(),
        }));
    }
    Ok(checked)
}

/// Refuses a differential `bundle` that `pubkey` (its base's key) does not
/// verify, removing it: an install checks both with one key.
fn same_key(bundle: &Path, pubkey: &Path) -> anyhow::Result<()> {
    let sig = crate::sign::signature_path(bundle);
    let verified = kubexm_bundle::verify::SignatureCheck::load(&sig, pubkey).and_then(|c| c.verify_file(bundle));
    if let Err(e) = verified {
        let _ = fs_err::remove_file(bundle);
        let _ = fs_err::remove_file(&sig);
        return Err(build_err(
            BuildError::Usage,
            anyhow::anyhow!(
                "{} is signed with a key that --pubkey {} (the base's) does not verify ({e}); an install checks a differential \
                 bundle and its base with one key: sign with the base's --key. Nothing was kept",
                bundle.display(),
                pubkey.display()
            ),
        ));
    }
    Ok(())
}

/// Signs the written bundle with `--key`, its trusted comment naming
/// bundle.yaml's sha256; the signature's path, or none without a key.
fn sign_bundle(opts: &BuildOptions, name: &str, yaml_sha: &str) -> anyhow::Result<Option<PathBuf>> {
    let Some(key) = &opts.key else { return Ok(None) };
    let comment = format!("kubexm bundle {name} bundle.yaml sha256:{yaml_sha}");
    crate::sign::sign(&opts.bundle, key, &comment)?;
    Ok(Some(crate::sign::signature_path(&opts.bundle)))
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
    for i in bom.images.iter().filter(|i| !i.reference.is_controller()) {
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

/// What the fetch stages share.
struct Fetch<'a> {
    cache: &'a Cache,
    http: &'a Http,
    mirrors: &'a Mirrors,
    strict: bool,
    jobs: usize,
    progress: &'a Progress,
    catalog: &'a kubexm_bom::catalog::Catalog,
    controller_binaries: &'a [crate::controller_image::Binary],
}

impl Fetch<'_> {
    /// Every stage in order; the BOM completed with what was verified.
    async fn all(&self, bom: &mut Bom, on_bytes: Arc<dyn Fn(u64) + Send + Sync>) -> anyhow::Result<(Vec<Pulled>, Vec<debian::Repo>)> {
        self.files(bom).await?;
        self.manifests(bom).await?;
        let pulled = self.charts_and_images(bom, on_bytes).await?;
        let repos = self.os_repos(bom).await?;
        Ok((pulled, repos))
    }

    /// Files: pinned digest, or the upstream's published checksum (remembered per URL).
    async fn files(&self, bom: &mut Bom) -> anyhow::Result<()> {
        let bar = self.progress.stage("files", bom.files.len());
        let files = std::mem::take(&mut bom.files);
        bom.files = stream::iter(files)
            .map(|mut f| {
                let bar = bar.clone();
                async move {
                    let artifact = format!("{} {} {}", f.component, f.version, f.arch);
                    let expected = match &f.checksum {
                        Checksum::Sha256(h) => h.clone(),
                        Checksum::Published(sum_url) => published(self.http, self.cache, &artifact, sum_url, &f.url).await?,
                        Checksum::Unknown => {
                            return Err(FetchError::NoChecksum {
                                artifact,
                                url: f.url.clone(),
                                file: "(no pinned digest and no published checksum URL)".into(),
                            });
                        }
                    };
                    self.http.fetch(self.cache, &artifact, &f.source, &expected).await?;
                    f.checksum = Checksum::Sha256(expected);
                    bar.inc(1);
                    Ok::<_, FetchError>(f)
                }
            })
            .buffered(self.jobs)
            .try_collect()
            .await?;
        bar.finish();

        Ok(())
    }

    /// Manifests: fetched (remembered per URL), then scanned for images,
    /// which join the BOM's.
    async fn manifests(&self, bom: &mut Bom) -> anyhow::Result<()> {
        let bar = self.progress.stage("manifests", bom.manifests.len());
        let mut found: Vec<(String, String)> = Vec::new();
        for m in &mut bom.manifests {
            let artifact = format!("manifest {} {}", m.addon, m.version);
            let hex = match self.cache.get_ref::<String>("manifests", &m.source).filter(|h| self.cache.has(h)) {
                Some(h) => h,
                None => {
                    let bytes = self.http.get_bytes(&artifact, &m.source).await?;
                    let h = self.cache.put_bytes(&bytes).map_err(FetchError::io("cache"))?;
                    self.cache.set_ref("manifests", &m.source, &h).map_err(FetchError::io("cache"))?;
                    h
                }
            };
            let text = String::from_utf8(self.cache.read(&hex)?).map_err(|_| anyhow::anyhow!("{artifact}: {} is not UTF-8 text", m.url))?;
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
            if self.strict && !self.mirrors.covers_image(&reference) {
                bail!(build_err(
                    BuildError::Usage,
                    anyhow::anyhow!("--strict-mirrors: image {reference} (named by manifest {from}) has no mirror mapping")
                ));
            }
            if !bom.images.iter().any(|i| i.reference == reference) {
                bom.images.push(ImageItem {
                    source: self.mirrors.rewrite_image(&reference),
                    reference,
                    platforms: platforms.clone(),
                    digest: None,
                    upstream_digest: None,
                    platform_manifests: Default::default(),
                    from_manifest: Some(from),
                });
            }
        }
        bom.images.sort_by(|a, b| a.reference.cmp(&b.reference));

        Ok(())
    }

    /// Charts and images, sharing one registry client.
    async fn charts_and_images(&self, bom: &mut Bom, on_bytes: Arc<dyn Fn(u64) + Send + Sync>) -> anyhow::Result<Vec<Pulled>> {
        let puller = Puller::new(
            crate::fetch::images::http_hosts(&bom.images)
                .into_iter()
                .chain(chart_http_hosts(bom))
                .collect(),
            on_bytes,
        );
        let bar = self.progress.stage("charts", bom.charts.len());
        for c in &mut bom.charts {
            c.sha256 = Some(charts::fetch(self.http, &puller, self.cache, c).await?);
            bar.inc(1);
        }
        bar.finish();
        let bar = self.progress.stage("images", bom.images.len());
        // The controller's image is made here, from kubexm's own binary.
        let mut own = None;
        if let Some(i) = bom.images.iter_mut().find(|i| i.reference.is_controller()) {
            let (p, platforms) = crate::controller_image::build(self.cache, i, self.controller_binaries).map_err(|e| {
                let kind = match e {
                    crate::controller_image::ImageError::Io { .. } => BuildError::Io,
                    _ => BuildError::Usage,
                };
                build_err(kind, e)
            })?;
            i.platforms = platforms;
            own = Some(p);
        }
        let pulled: Vec<Pulled> = stream::iter(bom.images.iter())
            .map(|i| {
                let bar = bar.clone();
                let puller = &puller;
                let own = own.clone();
                async move {
                    let p = match own.filter(|_| i.reference.is_controller()) {
                        Some(p) => Ok(p),
                        None => puller.pull(self.cache, i).await,
                    };
                    bar.inc(1);
                    p
                }
            })
            .buffered(self.jobs)
            .try_collect()
            .await?;
        bar.finish();
        for (i, p) in bom.images.iter_mut().zip(&pulled) {
            i.digest = Some(p.digest.clone());
            i.upstream_digest = p.upstream_digest.clone();
            i.platform_manifests = p.manifests.clone();
        }

        Ok(pulled)
    }

    /// OS package repositories: verified mirror, resolved, every .deb fetched.
    async fn os_repos(&self, bom: &mut Bom) -> anyhow::Result<Vec<debian::Repo>> {
        let bar = self.progress.stage("os repos", bom.os_repos.len());
        let mut repos = Vec::new();
        for item in &mut bom.os_repos {
            let release = self
                .catalog
                .os
                .releases
                .get(&item.release)
                .ok_or_else(|| anyhow::anyhow!("OS release {} is not in the catalog", item.release))?;
            let keys = release.keyring_text()?;
            let (repo, in_base) = debian::build_repo(self.http, self.cache, item, &keys, &release.base_priorities, self.jobs)
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
        Ok(repos)
    }
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
