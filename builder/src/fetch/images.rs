//! Images from registries into the cache, exactly the BOM's platforms.
//!
//! oci-client speaks the distribution protocol (auth, token dance); kubexm
//! never uses its `pull()`, which holds layers in memory, nor its platform
//! resolver, which would pick the build machine's platform. Manifests are
//! fetched raw and kept byte for byte, so their digests stay upstream's.
//! A multi-arch index that lists more platforms than the BOM asks for is
//! rewritten to list only those (its new digest is what the lock pins, the
//! upstream one is kept beside it). Blobs stream to disk with their sha256
//! checked; an interrupted blob resumes with a ranged request.

use std::collections::BTreeMap;
use std::io::Write;

use futures_util::StreamExt;
use oci_client::client::{BlobResponse, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use kubexm_bom::ImageItem;
use kubexm_bundle::digest::sha256_hex;
use kubexm_bundle::layout::{MANIFEST_TYPES, is_index};

use super::{FetchError, error_chain};
use crate::cache::Cache;

const ATTEMPTS: u32 = 5;

/// What an image resolved to, as stored in the cache and the bundle.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pulled {
    /// Digest of the top manifest as the bundle stores it.
    pub digest: String,
    pub media_type: String,
    pub size: u64,
    /// Upstream's digest when the index was narrowed to the BOM's platforms.
    pub upstream_digest: Option<String>,
    /// Every blob (manifests, configs, layers) the image needs, as hex.
    pub blobs: Vec<String>,
    /// Each platform's manifest digest, where `digest` is an index.
    #[serde(default)]
    pub manifests: BTreeMap<String, String>,
}

/// Pulls images with one client shared by all.
pub struct Puller {
    client: Client,
    auths: BTreeMap<String, (String, String)>,
    on_bytes: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
    /// One lock per blob digest: images sharing a layer are pulled side by
    /// side, and each blob is streamed into one partial file, by one pull.
    blob_locks: std::sync::Mutex<BTreeMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>,
}

impl Puller {
    /// `http_hosts` are registries reached over plain HTTP (mirrors given as `http://`).
    pub fn new(http_hosts: Vec<String>, on_bytes: std::sync::Arc<dyn Fn(u64) + Send + Sync>) -> Puller {
        let config = ClientConfig {
            protocol: if http_hosts.is_empty() {
                ClientProtocol::Https
            } else {
                ClientProtocol::HttpsExcept(http_hosts)
            },
            platform_resolver: None,
            read_timeout: Some(std::time::Duration::from_secs(60)),
            connect_timeout: Some(std::time::Duration::from_secs(15)),
            ..Default::default()
        };
        Puller {
            client: Client::new(config),
            auths: docker_auths(),
            on_bytes,
            blob_locks: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// The lock of the blob `hex`.
    fn blob_lock(&self, hex: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.blob_locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(hex.to_string()).or_default().clone()
    }

    /// A manifest, raw, retried with backoff: registries and networks hiccup.
    async fn manifest(&self, reference: &Reference, auth: &RegistryAuth, accept: &[&str]) -> Result<(Vec<u8>, String), String> {
        let mut last = String::new();
        for attempt in 1..=3u32 {
            match self.client.pull_manifest_raw(reference, auth, accept).await {
                Ok((bytes, digest)) => return Ok((bytes.to_vec(), digest)),
                Err(e) => {
                    last = error_chain(&e);
                    // An answer from the registry (unknown, denied) will not change on retry.
                    if last.contains("OCI API error") {
                        break;
                    }
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(300 << attempt)).await;
        }
        Err(last)
    }

    fn auth(&self, registry: &str) -> RegistryAuth {
        match self.auths.get(registry) {
            Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    /// Pulls one image into the cache (or finds it there).
    pub async fn pull(&self, cache: &Cache, item: &ImageItem) -> Result<Pulled, FetchError> {
        let artifact = format!("image {}", item.reference);
        let location = pull_location(item);
        // v2: with each platform's manifest digest.
        let key = format!("v2|{location}|{}", item.platforms.join(","));
        if let Some(p) = cache.get_ref::<Pulled>("images", &key)
            && p.blobs.iter().all(|b| cache.has(b))
        {
            return Ok(p);
        }
        let err = |why: String| FetchError::Image {
            artifact: artifact.clone(),
            why,
        };
        let reference: Reference = location.parse().map_err(|e| err(format!("{location} is not a reference: {e}")))?;
        let auth = self.auth(reference.resolve_registry());
        let (bytes, digest) = self
            .manifest(&reference, &auth, MANIFEST_TYPES)
            .await
            .map_err(|e| err(format!("cannot read {location}: {e}")))?;
        let top_hex = verify(&bytes, &digest).map_err(&err)?;
        let doc: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| err(format!("{location}: the manifest is not JSON: {e}")))?;
        let media_type = media_type_of(&doc);
        let mut blobs = Vec::new();
        let mut upstream_digest = None;
        let mut manifests = BTreeMap::new();
        let stored: Vec<u8>;
        if is_index(&media_type) {
            let entries = doc["manifests"].as_array().cloned().unwrap_or_default();
            let mut keep = Vec::new();
            for platform in &item.platforms {
                let (os, arch) = platform.split_once('/').unwrap_or(("linux", platform));
                let found = entries
                    .iter()
                    .find(|e| e["platform"]["os"] == os && e["platform"]["architecture"] == arch);
                let Some(entry) = found else {
                    let have: Vec<String> = entries
                        .iter()
                        .map(|e| {
                            format!(
                                "{}/{}",
                                e["platform"]["os"].as_str().unwrap_or("?"),
                                e["platform"]["architecture"].as_str().unwrap_or("?")
                            )
                        })
                        .collect();
                    return Err(err(format!(
                        "{location} has no {platform} image (it has {}); drop that arch or use another image",
                        have.join(", ")
                    )));
                };
                keep.push(entry.clone());
                manifests.insert(platform.clone(), entry["digest"].as_str().unwrap_or_default().to_string());
            }
            for entry in &keep {
                let child = entry["digest"].as_str().unwrap_or_default().to_string();
                let child_ref = Reference::with_digest(reference.registry().to_string(), reference.repository().to_string(), child.clone());
                let (cbytes, cdigest) = self
                    .manifest(&child_ref, &auth, MANIFEST_TYPES)
                    .await
                    .map_err(|e| err(format!("cannot read {location}@{child}: {e}")))?;
                let hex = verify(&cbytes, &cdigest).map_err(&err)?;
                if format!("sha256:{hex}") != child {
                    return Err(err(format!("{location}: the index names {child} but the registry served {hex}")));
                }
                cache.put_bytes(&cbytes).map_err(FetchError::io("cache"))?;
                blobs.push(hex);
                let cdoc: serde_json::Value =
                    serde_json::from_slice(&cbytes).map_err(|e| err(format!("{location}@{child}: not JSON: {e}")))?;
                blobs.extend(self.pull_blobs(cache, &child_ref, &cdoc, &artifact).await?);
            }
            if keep.len() < entries.len() {
                let mut narrowed = doc.clone();
                narrowed["manifests"] = serde_json::Value::Array(keep);
                stored = serde_json::to_vec(&narrowed).map_err(|e| err(e.to_string()))?;
                upstream_digest = Some(format!("sha256:{top_hex}"));
            } else {
                stored = bytes.to_vec();
            }
        } else {
            stored = bytes.to_vec();
            blobs.extend(self.pull_blobs(cache, &reference, &doc, &artifact).await?);
        }
        let hex = cache.put_bytes(&stored).map_err(FetchError::io("cache"))?;
        blobs.push(hex.clone());
        blobs.sort();
        blobs.dedup();
        let pulled = Pulled {
            digest: format!("sha256:{hex}"),
            media_type,
            size: stored.len() as u64,
            upstream_digest,
            blobs,
            manifests,
        };
        cache.set_ref("images", &key, &pulled).map_err(FetchError::io("cache"))?;
        Ok(pulled)
    }

    /// The layer of `media_type` in the manifest at `location` (an OCI artifact
    /// such as a Helm chart), into the cache; returns its sha256.
    pub async fn chart_layer(&self, cache: &Cache, location: &str, media_type: &str) -> Result<String, String> {
        let reference: Reference = location.parse().map_err(|e| format!("{location} is not a reference: {e}"))?;
        let auth = self.auth(reference.resolve_registry());
        let (bytes, digest) = self
            .manifest(&reference, &auth, &[kubexm_bundle::layout::OCI_MANIFEST])
            .await
            .map_err(|e| format!("cannot read {location}: {e}"))?;
        verify(&bytes, &digest)?;
        let doc: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| format!("{location}: not JSON: {e}"))?;
        let layer = doc["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["mediaType"] == media_type)
            .and_then(|l| l["digest"].as_str())
            .ok_or_else(|| format!("{location} has no {media_type} layer; is it a Helm chart?"))?;
        let artifact = format!("chart {location}");
        if let Some(hex) = layer.strip_prefix("sha256:").filter(|h| !cache.has(h)) {
            self.blob(cache, &reference, layer, &artifact).await.map_err(|e| e.to_string())?;
            return Ok(hex.to_string());
        }
        Ok(layer.trim_start_matches("sha256:").to_string())
    }

    async fn pull_blobs(
        &self,
        cache: &Cache,
        reference: &Reference,
        manifest: &serde_json::Value,
        artifact: &str,
    ) -> Result<Vec<String>, FetchError> {
        let mut out = Vec::new();
        let descriptors = std::iter::once(&manifest["config"]).chain(manifest["layers"].as_array().into_iter().flatten());
        for d in descriptors {
            let Some(digest) = d["digest"].as_str() else { continue };
            let hex = digest.strip_prefix("sha256:").ok_or_else(|| FetchError::Image {
                artifact: artifact.into(),
                why: format!("unsupported digest {digest}"),
            })?;
            // Another image's pull may be streaming the same blob: wait for
            // it, then find it in the cache.
            let lock = self.blob_lock(hex);
            let _one_at_a_time = lock.lock().await;
            if !cache.has(hex) {
                self.blob(cache, reference, digest, artifact).await?;
            }
            out.push(hex.to_string());
        }
        Ok(out)
    }

    /// Streams one blob to disk, resuming after interruptions.
    async fn blob(&self, cache: &Cache, reference: &Reference, digest: &str, artifact: &str) -> Result<(), FetchError> {
        let hex = &digest["sha256:".len()..];
        let part = cache.partial(digest);
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            let offset = fs_err::metadata(&part).map(|m| m.len()).unwrap_or(0);
            let resp = self.client.pull_blob_stream_partial(reference, digest, offset, None).await;
            let (mut file, mut hasher, stream) = match resp {
                Ok(BlobResponse::Partial(s)) if offset > 0 => {
                    let mut h = Sha256::new();
                    h.update(fs_err::read(&part).map_err(FetchError::io(part.display()))?);
                    (
                        fs_err::OpenOptions::new()
                            .append(true)
                            .open(&part)
                            .map_err(FetchError::io(part.display()))?,
                        h,
                        s,
                    )
                }
                Ok(BlobResponse::Full(s)) | Ok(BlobResponse::Partial(s)) => (
                    fs_err::File::create(&part).map_err(FetchError::io(part.display()))?,
                    Sha256::new(),
                    s,
                ),
                Err(e) => {
                    last = error_chain(&e);
                    tokio::time::sleep(std::time::Duration::from_millis(250 << attempt)).await;
                    continue;
                }
            };
            let mut stream = stream.stream;
            let mut broken = None;
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(c) => {
                        file.write_all(&c).map_err(FetchError::io(part.display()))?;
                        hasher.update(&c);
                        (self.on_bytes)(c.len() as u64);
                    }
                    Err(e) => {
                        broken = Some(e.to_string());
                        break;
                    }
                }
            }
            if let Some(why) = broken {
                last = why;
                continue;
            }
            let actual = hex::encode(hasher.finalize());
            if actual != hex {
                let _ = fs_err::remove_file(&part);
                return Err(FetchError::Image {
                    artifact: artifact.into(),
                    why: format!("blob {digest} from {reference}: sha256 is {actual}; nothing was kept"),
                });
            }
            cache.commit(&part, hex).map_err(FetchError::io(part.display()))?;
            return Ok(());
        }
        Err(FetchError::Image {
            artifact: artifact.into(),
            why: format!("blob {digest} from {reference}: failed after {ATTEMPTS} attempts: {last}"),
        })
    }
}

/// Where an image is pulled from: its mirror, or its own reference.
pub fn pull_location(item: &ImageItem) -> String {
    match &item.source {
        Some(s) => s.split_once("://").map_or(s.as_str(), |(_, r)| r).to_string(),
        None => item.reference.to_string(),
    }
}

/// Registries reached over plain HTTP, from `http://` mirrors.
pub fn http_hosts(items: &[ImageItem]) -> Vec<String> {
    let mut hosts: Vec<String> = items
        .iter()
        .filter_map(|i| i.source.as_deref())
        .filter_map(|s| s.strip_prefix("http://"))
        .filter_map(|r| r.split('/').next())
        .map(str::to_string)
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

fn verify(bytes: &[u8], digest: &str) -> Result<String, String> {
    let hex = sha256_hex(bytes);
    match digest.strip_prefix("sha256:") {
        Some(d) if d == hex => Ok(hex),
        Some(d) => Err(format!("manifest digest mismatch: registry says {d}, content is {hex}")),
        None => Err(format!("unsupported digest algorithm in {digest}")),
    }
}

fn media_type_of(doc: &serde_json::Value) -> String {
    match doc["mediaType"].as_str() {
        Some(m) => m.to_string(),
        None if doc.get("manifests").is_some() => kubexm_bundle::layout::OCI_INDEX.into(),
        None => kubexm_bundle::layout::OCI_MANIFEST.into(),
    }
}

/// Credentials from docker's `config.json` (`$DOCKER_CONFIG` or `~/.docker`).
fn docker_auths() -> BTreeMap<String, (String, String)> {
    let dir = std::env::var_os("DOCKER_CONFIG")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".docker")));
    let Some(text) = dir.and_then(|d| fs_err::read(d.join("config.json")).ok()) else {
        return BTreeMap::new();
    };
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&text) else {
        tracing::warn!("docker config.json is not JSON; pulling anonymously");
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for (host, entry) in doc["auths"].as_object().into_iter().flatten() {
        let host = host
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default();
        let host = if host == "index.docker.io" || host == "registry-1.docker.io" {
            "docker.io"
        } else {
            host
        };
        let pair = match (entry["username"].as_str(), entry["password"].as_str(), entry["auth"].as_str()) {
            (Some(u), Some(p), _) => Some((u.to_string(), p.to_string())),
            (_, _, Some(a)) => kubexm_bom::net::base64_decode(a)
                .and_then(|d| String::from_utf8(d).ok())
                .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_string(), p.to_string()))),
            _ => None,
        };
        if let Some(p) = pair {
            out.insert(host.to_string(), p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_as_docker_writes_it() {
        assert_eq!(kubexm_bom::net::base64_decode("dXNlcjpwYXNz").unwrap_or_default(), b"user:pass");
        assert_eq!(kubexm_bom::net::base64_decode("YTpi").unwrap_or_default(), b"a:b");
        assert_eq!(kubexm_bom::net::base64_decode("YTpiYw==").unwrap_or_default(), b"a:bc");
        assert!(kubexm_bom::net::base64_decode("!!").is_none());
    }
}
