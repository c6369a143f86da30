//! `kubexm-install mirror`: the bundle's images into a site registry.
//!
//! Every image keeps its digests and its multi-arch index. Names follow the
//! architecture's rule under an optional prefix
//! (`<site>/<prefix>/<upstream-host>/<repository>`), or, with `--flatten`,
//! `<site>/<prefix>/<repository>`, refused when two images would collide.
//! Blobs the target already has are skipped (a HEAD first), so a second run
//! uploads nothing; uploads stream from disk and run in parallel.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::{StreamExt, TryStreamExt, stream};
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use serde::Serialize;

use kubexm_bundle::layout::is_index;

use crate::serve::Served;

/// Options of one mirror run.
#[derive(Debug, Clone)]
pub struct MirrorOptions {
    pub bundle_dir: PathBuf,
    /// `host[:port]`.
    pub registry: String,
    pub prefix: Option<String>,
    pub push: Push,
}

/// How images are pushed: names, credentials, TLS, parallelism.
#[derive(Debug, Clone)]
pub struct Push {
    /// `<prefix>/<repository>`, without the upstream host.
    pub flatten: bool,
    pub username: Option<String>,
    /// Never from the command line.
    pub password: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub insecure: bool,
    pub plain_http: bool,
    /// Images pushed at once.
    pub jobs: usize,
}

/// What a mirror run did.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MirrorSummary {
    pub images: usize,
    pub manifests: usize,
    pub blobs_uploaded: u64,
    pub blobs_present: u64,
    pub bytes_uploaded: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("--flatten would give {target} to both {a} and {b}; mirror without --flatten, or with a prefix that keeps them apart")]
    Collision { target: String, a: String, b: String },
    #[error("image {image}: {what}: {registry} answered: {answer}")]
    Registry {
        image: String,
        what: String,
        registry: String,
        answer: String,
    },
    #[error("{0}")]
    Other(String),
}

/// The target repository for an upstream repository (`registry.k8s.io/pause`).
pub fn target_repository(upstream_repo: &str, prefix: Option<&str>, flatten: bool) -> String {
    let name = if flatten {
        upstream_repo.split_once('/').map_or(upstream_repo, |(_, r)| r)
    } else {
        upstream_repo
    };
    match prefix.map(|p| p.trim_matches('/')).filter(|p| !p.is_empty()) {
        Some(p) => format!("{p}/{name}"),
        None => name.to_string(),
    }
}

/// Pushes every image of an unpacked bundle.
pub async fn mirror(opts: &MirrorOptions) -> Result<MirrorSummary, MirrorError> {
    let served = Served::load(&opts.bundle_dir).map_err(|e| MirrorError::Other(e.to_string()))?;
    let images = served.images();
    // Names first: a collision refuses the whole run before anything is pushed.
    let mut targets: BTreeMap<String, String> = BTreeMap::new();
    for (repo, tag, _, _) in &images {
        let t = format!("{}:{tag}", target_repository(repo, opts.prefix.as_deref(), opts.push.flatten));
        if let Some(other) = targets.insert(t.clone(), format!("{repo}:{tag}"))
            && other != format!("{repo}:{tag}")
        {
            return Err(MirrorError::Collision {
                target: t,
                a: other,
                b: format!("{repo}:{tag}"),
            });
        }
    }
    let mut config = ClientConfig {
        platform_resolver: None,
        ..Default::default()
    };
    config.protocol = if opts.push.plain_http {
        ClientProtocol::Http
    } else {
        ClientProtocol::Https
    };
    config.accept_invalid_certificates = opts.push.insecure;
    if let Some(ca) = &opts.push.ca_file {
        let data = fs_err::read(ca).map_err(|e| MirrorError::Other(e.to_string()))?;
        config.extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    let client = Client::new(config);
    let auth = match (&opts.push.username, &opts.push.password) {
        (Some(u), Some(p)) => RegistryAuth::Basic(u.clone(), p.clone()),
        _ => RegistryAuth::Anonymous,
    };
    let summary = Arc::new(Counters::default());
    let mut manifests = 0;
    for (repo, tag, digest, media_type) in &images {
        let image = format!("{repo}:{tag}");
        let target = target_repository(repo, opts.prefix.as_deref(), opts.push.flatten);
        let reference = Reference::with_tag(opts.registry.clone(), target.clone(), tag.clone());
        let fail = |what: String, answer: String| MirrorError::Registry {
            image: image.clone(),
            what,
            registry: opts.registry.clone(),
            answer,
        };
        client
            .auth(&reference, &auth, RegistryOperation::Push)
            .await
            .map_err(|e| fail("authenticating for push".into(), kubexm_bom::diag::error_chain(&e)))?;
        // Children before the index, blobs before their manifest.
        let mut order: Vec<(String, String)> = Vec::new();
        if is_index(media_type) {
            let doc = read_json(&served, digest).map_err(|e| fail(format!("reading {digest}"), e))?;
            for c in doc["manifests"].as_array().into_iter().flatten() {
                if let (Some(d), Some(mt)) = (c["digest"].as_str(), c["mediaType"].as_str()) {
                    order.push((d.to_string(), mt.to_string()));
                }
            }
        }
        let mut blobs = BTreeSet::new();
        for (d, _) in order.iter().chain(std::iter::once(&(digest.clone(), media_type.clone()))) {
            let doc = read_json(&served, d).map_err(|e| fail(format!("reading {d}"), e))?;
            for b in std::iter::once(&doc["config"]).chain(doc["layers"].as_array().into_iter().flatten()) {
                if let Some(bd) = b["digest"].as_str() {
                    blobs.insert(bd.to_string());
                }
            }
        }
        stream::iter(blobs)
            .map(|b| {
                let (client, served, reference, summary, fail) = (&client, &served, &reference, summary.clone(), &fail);
                async move {
                    let exists = client
                        .blob_exists(reference, &b)
                        .await
                        .map_err(|e| fail(format!("checking blob {b}"), kubexm_bom::diag::error_chain(&e)))?;
                    if exists {
                        summary.present.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    let file = served
                        .blob_file(&b)
                        .ok_or_else(|| fail(format!("blob {b}"), "missing from the unpacked bundle".into()))?;
                    let size = fs_err::metadata(&file).map_err(|e| fail(format!("blob {b}"), e.to_string()))?.len();
                    let f = tokio::fs::File::open(&file)
                        .await
                        .map_err(|e| fail(format!("blob {b}"), e.to_string()))?;
                    let body = tokio_util::io::ReaderStream::with_capacity(f, 1 << 20)
                        .map(|r| r.map_err(oci_client::errors::OciDistributionError::from));
                    client
                        .push_blob_stream(reference, body, &b, Some(size))
                        .await
                        .map_err(|e| fail(format!("uploading blob {b}"), kubexm_bom::diag::error_chain(&e)))?;
                    summary.uploaded.fetch_add(1, Ordering::Relaxed);
                    summary.bytes.fetch_add(size, Ordering::Relaxed);
                    Ok::<_, MirrorError>(())
                }
            })
            .buffer_unordered(opts.push.jobs.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        for (d, mt) in &order {
            push_manifest(
                &client,
                &served,
                &Reference::with_digest(opts.registry.clone(), target.clone(), d.clone()),
                d,
                mt,
            )
            .await
            .map_err(|e| fail(format!("pushing manifest {d}"), e))?;
            manifests += 1;
        }
        push_manifest(&client, &served, &reference, digest, media_type)
            .await
            .map_err(|e| fail(format!("pushing manifest {digest} as {tag}"), e))?;
        manifests += 1;
        tracing::info!("mirrored {image} to {}/{target}:{tag}", opts.registry);
    }
    Ok(MirrorSummary {
        images: images.len(),
        manifests,
        blobs_uploaded: summary.uploaded.load(Ordering::Relaxed),
        blobs_present: summary.present.load(Ordering::Relaxed),
        bytes_uploaded: summary.bytes.load(Ordering::Relaxed),
    })
}

#[derive(Default)]
struct Counters {
    uploaded: AtomicU64,
    present: AtomicU64,
    bytes: AtomicU64,
}

fn read_json(served: &Served, digest: &str) -> Result<serde_json::Value, String> {
    let file = served.blob_file(digest).ok_or("missing from the unpacked bundle")?;
    serde_json::from_slice(&fs_err::read(file).map_err(|e| e.to_string())?).map_err(|e| e.to_string())
}

async fn push_manifest(client: &Client, served: &Served, reference: &Reference, digest: &str, media_type: &str) -> Result<(), String> {
    let file: &Path = &served.blob_file(digest).ok_or("missing from the unpacked bundle")?;
    let bytes = fs_err::read(file).map_err(|e| e.to_string())?;
    let ct = axum::http::HeaderValue::from_str(media_type).map_err(|e| e.to_string())?;
    client
        .push_manifest_raw(reference, bytes, ct)
        .await
        .map_err(|e| kubexm_bom::diag::error_chain(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::target_repository;

    #[test]
    fn names_under_prefix_and_flattened() {
        assert_eq!(target_repository("registry.k8s.io/pause", None, false), "registry.k8s.io/pause");
        assert_eq!(
            target_repository("registry.k8s.io/pause", Some("/kubexm/"), false),
            "kubexm/registry.k8s.io/pause"
        );
        assert_eq!(target_repository("docker.io/calico/node", Some("site"), true), "site/calico/node");
    }
}
