//! The bundle served read-only: an OCI distribution registry over the
//! bundle's image layout, and a file server for its files, manifests, charts
//! and OS repositories. Nothing is re-pushed: the unpacked layout is the
//! registry's storage, so it answers within a moment of starting.
//!
//! Names follow the architecture's rule: the image `registry.k8s.io/pause:3.10`
//! is served as repository `registry.k8s.io/pause`, tag `3.10`. Manifests go
//! out byte for byte with their stored media type and `Docker-Content-Digest`;
//! blobs and files honour single `Range` requests (`bytes=N-M`, `bytes=N-`).
//! Errors are the distribution API's JSON (`MANIFEST_UNKNOWN`, ...).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use kubexm_bundle::layout::{self, LayoutIndex, REF_NAME};
use kubexm_bundle::manifest::{BundleManifest, MANIFEST_NAME};

/// Prefixes of the bundle served by the file server.
const FILE_PREFIXES: &[&str] = &["files/", "manifests/", "charts/", "os/"];

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{path}: {why}")]
    Layout { path: String, why: String },
}

/// What the server knows about an unpacked bundle, read once at start.
#[derive(Debug)]
pub struct Served {
    /// The bundles served, newest first (an upgrade serves the old one
    /// below the new): a tag or file is the first bundle's that has it,
    /// a blob is read from the first that holds it.
    dirs: Vec<PathBuf>,
    /// repository → tag → (digest, media type)
    tags: BTreeMap<String, BTreeMap<String, (String, String)>>,
    /// manifest digest → (media type, repositories it belongs to)
    manifests: HashMap<String, (String, BTreeSet<String>)>,
    /// file path → (sha256, size, index of its bundle in `dirs`)
    files: HashMap<String, (String, u64, usize)>,
}

impl Served {
    /// Reads `bundle.yaml` and `images/index.json` of an unpacked bundle.
    pub fn load(dir: &Path) -> Result<Served, ServeError> {
        Served::load_stack(&[dir.to_path_buf()])
    }

    /// Reads unpacked bundles, the newest first, served as one.
    pub fn load_stack(dirs: &[PathBuf]) -> Result<Served, ServeError> {
        let mut served = Served {
            dirs: dirs.to_vec(),
            tags: BTreeMap::new(),
            manifests: HashMap::new(),
            files: HashMap::new(),
        };
        for (i, dir) in dirs.iter().enumerate() {
            served.add_bundle(i, dir)?;
        }
        Ok(served)
    }

    /// Adds bundle `i` of the stack, below those before it.
    fn add_bundle(&mut self, i: usize, dir: &Path) -> Result<(), ServeError> {
        let bad = |p: &Path, why: String| ServeError::Layout {
            path: p.display().to_string(),
            why,
        };
        let mpath = dir.join(MANIFEST_NAME);
        let text = fs_err::read_to_string(&mpath)
            .map_err(|e| bad(&mpath, format!("{e}; is this an unpacked bundle? Run kubexm-install unpack first")))?;
        let manifest = BundleManifest::from_yaml(&text).map_err(|e| bad(&mpath, e))?;
        for m in manifest
            .members
            .iter()
            .filter(|m| FILE_PREFIXES.iter().any(|p| m.path.starts_with(p)))
        {
            self.files.entry(m.path.clone()).or_insert((m.sha256.clone(), m.size, i));
        }
        let served = self;
        let ipath = dir.join(layout::DIR).join("index.json");
        if !ipath.exists() {
            return Ok(());
        }
        let index: LayoutIndex = serde_json::from_slice(&fs_err::read(&ipath).map_err(|e| bad(&ipath, e.to_string()))?)
            .map_err(|e| bad(&ipath, e.to_string()))?;
        for d in &index.manifests {
            let Some(name) = d.annotations.get(REF_NAME) else { continue };
            let Some((repo, tag)) = split_reference(name) else { continue };
            served
                .tags
                .entry(repo.clone())
                .or_default()
                .entry(tag)
                .or_insert((d.digest.clone(), d.media_type.clone()));
            served.add_manifest(&repo, &d.digest, &d.media_type);
            if layout::is_index(&d.media_type) {
                let blob = blob_in(dir, &d.digest).ok_or_else(|| bad(&ipath, format!("bad digest {}", d.digest)))?;
                let doc: serde_json::Value = serde_json::from_slice(&fs_err::read(&blob).map_err(|e| bad(&blob, e.to_string()))?)
                    .map_err(|e| bad(&blob, e.to_string()))?;
                for child in doc["manifests"].as_array().into_iter().flatten() {
                    if let (Some(digest), Some(mt)) = (child["digest"].as_str(), child["mediaType"].as_str()) {
                        served.add_manifest(&repo, digest, mt);
                    }
                }
            }
        }
        Ok(())
    }

    fn add_manifest(&mut self, repo: &str, digest: &str, media_type: &str) {
        self.manifests
            .entry(digest.to_string())
            .or_insert_with(|| (media_type.to_string(), BTreeSet::new()))
            .1
            .insert(repo.to_string());
    }

    /// Repositories served, sorted.
    pub fn repositories(&self) -> Vec<String> {
        self.tags.keys().cloned().collect()
    }

    /// Every image: (repository, tag, top manifest digest, media type), sorted.
    pub fn images(&self) -> Vec<(String, String, String, String)> {
        self.tags
            .iter()
            .flat_map(|(repo, tags)| {
                tags.iter()
                    .map(move |(tag, (d, mt))| (repo.clone(), tag.clone(), d.clone(), mt.clone()))
            })
            .collect()
    }

    /// The file of a blob or manifest: in the first bundle of the stack
    /// that holds it.
    pub fn blob_file(&self, digest: &str) -> Option<PathBuf> {
        self.dirs.iter().filter_map(|d| blob_in(d, digest)).find(|p| p.is_file())
    }
}

/// A blob's path in the bundle unpacked at `dir` (`None`: not a sha256 digest).
fn blob_in(dir: &Path, digest: &str) -> Option<PathBuf> {
    let hex = digest.strip_prefix("sha256:")?;
    kubexm_bundle::digest::is_sha256_hex(hex).then(|| dir.join(layout::blob_path(hex)))
}

/// `registry.k8s.io/pause:3.10` → (`registry.k8s.io/pause`, `3.10`).
fn split_reference(name: &str) -> Option<(String, String)> {
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    let colon = name[slash..].rfind(':')? + slash;
    Some((name[..colon].to_string(), name[colon + 1..].to_string()))
}

/// Which halves to serve.
#[derive(Debug, Clone, Copy)]
pub struct Parts {
    pub registry: bool,
    pub files: bool,
}

/// The HTTP router over a loaded bundle.
pub fn router(served: Arc<Served>, parts: Parts) -> Router {
    let mut r = Router::new();
    if parts.registry {
        r = r
            .route("/v2/", get(v2))
            .route("/v2", get(v2))
            .route("/v2/{*rest}", get(v2_rest).fallback(read_only));
    }
    if parts.files {
        r = r.fallback(file);
    }
    r.with_state(served)
}

async fn v2() -> Response {
    let mut h = HeaderMap::new();
    h.insert("Docker-Distribution-API-Version", HeaderValue::from_static("registry/2.0"));
    (StatusCode::OK, h, axum::Json(serde_json::json!({}))).into_response()
}

async fn read_only() -> Response {
    oci_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "UNSUPPORTED",
        "this registry serves a kubexm bundle read-only",
        serde_json::Value::Null,
    )
}

fn oci_error(status: StatusCode, code: &str, message: &str, detail: serde_json::Value) -> Response {
    let body = serde_json::json!({"errors": [{"code": code, "message": message, "detail": detail}]});
    let mut h = HeaderMap::new();
    h.insert("Docker-Distribution-API-Version", HeaderValue::from_static("registry/2.0"));
    (status, h, axum::Json(body)).into_response()
}

async fn v2_rest(State(s): State<Arc<Served>>, UrlPath(rest): UrlPath<String>, method: Method, headers: HeaderMap) -> Response {
    if rest == "_catalog" {
        return axum::Json(serde_json::json!({"repositories": s.repositories()})).into_response();
    }
    if let Some(name) = rest.strip_suffix("/tags/list") {
        return match s.tags.get(name) {
            Some(t) => axum::Json(serde_json::json!({"name": name, "tags": t.keys().collect::<Vec<_>>()})).into_response(),
            None => oci_error(
                StatusCode::NOT_FOUND,
                "NAME_UNKNOWN",
                "repository name not known to registry",
                serde_json::json!({"name": name}),
            ),
        };
    }
    if let Some((name, reference)) = rest.rsplit_once("/manifests/") {
        return manifest(&s, name, reference, &method).await;
    }
    if let Some((name, digest)) = rest.rsplit_once("/blobs/") {
        if !s.tags.contains_key(name) {
            return oci_error(
                StatusCode::NOT_FOUND,
                "NAME_UNKNOWN",
                "repository name not known to registry",
                serde_json::json!({"name": name}),
            );
        }
        let Some(path) = s.blob_file(digest) else {
            return oci_error(
                StatusCode::NOT_FOUND,
                "BLOB_UNKNOWN",
                "blob unknown to registry",
                serde_json::json!({"digest": digest}),
            );
        };
        let mut extra = HeaderMap::new();
        extra.insert(
            "Docker-Content-Digest",
            HeaderValue::from_str(digest).unwrap_or(HeaderValue::from_static("")),
        );
        return send_file(&path, "application/octet-stream", &headers, extra, &method).await;
    }
    oci_error(
        StatusCode::NOT_FOUND,
        "NAME_UNKNOWN",
        "unknown registry path",
        serde_json::json!({"path": rest}),
    )
}

async fn manifest(s: &Served, name: &str, reference: &str, method: &Method) -> Response {
    let found = if reference.starts_with("sha256:") {
        s.manifests
            .get(reference)
            .filter(|(_, repos)| repos.contains(name))
            .map(|(mt, _)| (reference.to_string(), mt.clone()))
    } else {
        s.tags.get(name).and_then(|t| t.get(reference)).cloned()
    };
    let Some((digest, media_type)) = found else {
        return oci_error(
            StatusCode::NOT_FOUND,
            "MANIFEST_UNKNOWN",
            "manifest unknown",
            serde_json::json!({"name": name, "reference": reference}),
        );
    };
    let Some(path) = s.blob_file(&digest) else {
        return oci_error(
            StatusCode::NOT_FOUND,
            "MANIFEST_UNKNOWN",
            "manifest blob missing from the bundle",
            serde_json::json!({"digest": digest}),
        );
    };
    let bytes = match tokio::fs::read(&path).await {
        Ok(b) => b,
        Err(_) => {
            return oci_error(
                StatusCode::NOT_FOUND,
                "MANIFEST_UNKNOWN",
                "manifest blob missing from the bundle",
                serde_json::json!({"digest": digest}),
            );
        }
    };
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&media_type).unwrap_or(HeaderValue::from_static("application/json")),
    );
    h.insert(
        "Docker-Content-Digest",
        HeaderValue::from_str(&digest).unwrap_or(HeaderValue::from_static("")),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    if method == Method::HEAD {
        return (StatusCode::OK, h).into_response();
    }
    (StatusCode::OK, h, bytes).into_response()
}

/// A request path as a member path: percent-decoded (apt sends `+` as
/// `%2b`), with empty and `.` segments dropped (apt asks flat repositories for
/// `./Packages`). It is only ever looked up among the bundle's members.
fn file_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(h) = raw.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(h, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out)
        .split('/')
        .filter(|seg| !seg.is_empty() && *seg != ".")
        .collect::<Vec<_>>()
        .join("/")
}

async fn file(State(s): State<Arc<Served>>, method: Method, headers: HeaderMap, req: Request) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return (StatusCode::METHOD_NOT_ALLOWED, "read-only file server\n").into_response();
    }
    let path = file_path(req.uri().path());
    if let Some(base) = path.strip_suffix(".sha256")
        && let Some((sha, _, _)) = s.files.get(base)
    {
        let name = base.rsplit('/').next().unwrap_or(base);
        return (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], format!("{sha}  {name}\n")).into_response();
    }
    let Some((sha, _, i)) = s.files.get(&path) else {
        return (StatusCode::NOT_FOUND, format!("{path}: not in this bundle\n")).into_response();
    };
    let mut extra = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&format!("sha256={sha}")) {
        extra.insert("X-Checksum-Sha256", v);
    }
    let Some(dir) = s.dirs.get(*i) else {
        return (StatusCode::NOT_FOUND, format!("{path}: not in this bundle\n")).into_response();
    };
    send_file(&dir.join(&path), "application/octet-stream", &headers, extra, &method).await
}

/// A whole file, or the single range asked for.
async fn send_file(path: &Path, content_type: &str, req: &HeaderMap, mut h: HeaderMap, method: &Method) -> Response {
    let Ok(mut f) = tokio::fs::File::open(path).await else {
        return (StatusCode::NOT_FOUND, "missing from the unpacked bundle\n").into_response();
    };
    let size = match f.metadata().await {
        Ok(m) => m.len(),
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(content_type).unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let (status, start, len) = match req.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        None => (StatusCode::OK, 0, size),
        Some(r) => match parse_range(r, size) {
            Some((a, b)) => {
                h.insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes {a}-{b}/{size}")).unwrap_or(HeaderValue::from_static("")),
                );
                (StatusCode::PARTIAL_CONTENT, a, b - a + 1)
            }
            None => {
                h.insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes */{size}")).unwrap_or(HeaderValue::from_static("")),
                );
                return (StatusCode::RANGE_NOT_SATISFIABLE, h).into_response();
            }
        },
    };
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if *method == Method::HEAD {
        return (status, h).into_response();
    }
    if start > 0 && f.seek(std::io::SeekFrom::Start(start)).await.is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(f.take(len), 256 * 1024));
    (status, h, body).into_response()
}

/// `bytes=N-M` or `bytes=N-` (or `bytes=-N`, the last N bytes) within `size`.
fn parse_range(value: &str, size: u64) -> Option<(u64, u64)> {
    let spec = value.strip_prefix("bytes=")?;
    if spec.contains(',') || size == 0 {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            (size.saturating_sub(n), size - 1)
        }
        (a, "") => (a.parse().ok()?, size - 1),
        (a, b) => (a.parse().ok()?, b.parse::<u64>().ok()?.min(size - 1)),
    };
    (start <= end && start < size).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_paths_are_decoded_and_dot_segments_dropped() {
        assert_eq!(
            file_path("/os/debian-bookworm/amd64/./Packages"),
            "os/debian-bookworm/amd64/Packages"
        );
        assert_eq!(
            file_path("/os/x/haproxy_2.6.12-1%2bdeb12u1_amd64.deb"),
            "os/x/haproxy_2.6.12-1+deb12u1_amd64.deb"
        );
        // `..` stays a segment and matches no member.
        assert_eq!(file_path("/files/../bundle.yaml"), "files/../bundle.yaml");
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), Some((0, 9)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=90-200", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=-10", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=100-", 100), None);
        assert_eq!(parse_range("bytes=5-1", 100), None);
        assert_eq!(parse_range("bytes=0-1,3-4", 100), None);
        assert_eq!(parse_range("items=0-1", 100), None);
    }

    #[test]
    fn references_split_at_the_tag() {
        assert_eq!(
            split_reference("registry.k8s.io/pause:3.10"),
            Some(("registry.k8s.io/pause".into(), "3.10".into()))
        );
        assert_eq!(
            split_reference("localhost:5000/a/b:v1"),
            Some(("localhost:5000/a/b".into(), "v1".into()))
        );
        assert_eq!(split_reference("registry.k8s.io/pause"), None);
    }
}

/// How the server speaks.
#[derive(Debug, Clone)]
pub enum Tls {
    /// Plain HTTP (tests, or behind a TLS proxy).
    Plain,
    /// A certificate and key in PEM files.
    Files { cert: PathBuf, key: PathBuf },
    /// A certificate issued now by the installer's CA in `pki_dir` for `names`.
    Issued { pki_dir: PathBuf, names: Vec<String> },
}

/// How many connections the server holds, and from whom.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections open at once from sources other than `nodes`.
    pub max: usize,
    /// Connections one address may hold (nodes too).
    pub per_source: usize,
    /// The nodes' addresses: outside `max`, so others filling it never
    /// leave a node without room to pull.
    pub nodes: Vec<std::net::IpAddr>,
}

/// Connections from non-node sources unless told otherwise.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections one address may hold unless told otherwise (containerd
/// pulls a few layers at once per image; kubelet a few images at once).
pub const MAX_PER_SOURCE: usize = 64;

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max: MAX_CONNECTIONS,
            per_source: MAX_PER_SOURCE,
            nodes: Vec::new(),
        }
    }
}

impl ConnectionLimits {
    /// The defaults, with the addresses of `topo`'s hosts as the nodes.
    pub fn for_nodes(topo: &kubexm_bom::topology::Topology) -> ConnectionLimits {
        ConnectionLimits {
            nodes: topo.addresses.values().filter_map(|a| a.parse().ok()).collect(),
            ..ConnectionLimits::default()
        }
    }

    /// The open files the server may need: every connection it admits, with
    /// a file open for each, and a margin.
    pub fn open_files(&self) -> usize {
        (self.max + self.nodes.len() * self.per_source) * 2 + 1024
    }
}

/// Options of `kubexm-install serve`.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub bundle_dir: PathBuf,
    /// Older bundles served below it (an upgrade's: nodes pull either).
    pub older: Vec<PathBuf>,
    pub listen: std::net::SocketAddr,
    pub tls: Tls,
    pub parts: Parts,
    pub limits: ConnectionLimits,
    /// Require a client certificate signed by this CA (PEM file).
    pub client_ca: Option<PathBuf>,
}

/// The rustls configuration: `cert_pem`/`key_pem`, and when `client_ca` is
/// given, a client certificate signed by it required in the handshake.
fn tls_config(cert_pem: &[u8], key_pem: &[u8], client_ca: Option<&Path>) -> anyhow::Result<rustls::ServerConfig> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .context("reading the TLS certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).context("reading the TLS key")?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).with_context(|| format!("reading the client CA {}", ca.display()))? {
                roots
                    .add(c.with_context(|| format!("reading the client CA {}", ca.display()))?)
                    .with_context(|| format!("the client CA {}", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .with_context(|| format!("the client CA {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).context("the TLS certificate and key")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves until Ctrl-C or SIGTERM. `ready` is called once the socket listens.
///
/// Each connection is admitted under [`crate::limits`] by its source
/// address, then (TLS) handshaken within 10 s; its request head must
/// arrive within [`crate::limits::IDLE`] and it is closed once idle that long.
pub async fn run(opts: ServeOptions, ready: impl FnOnce(&Served, Option<&Path>)) -> anyhow::Result<()> {
    use crate::limits::{Admit, Limits};
    use anyhow::Context;
    let dirs: Vec<PathBuf> = std::iter::once(opts.bundle_dir.clone()).chain(opts.older.iter().cloned()).collect();
    let served = Arc::new(Served::load_stack(&dirs)?);
    let app = router(served.clone(), opts.parts);
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {},
        }
        stopper.graceful_shutdown(Some(std::time::Duration::from_secs(5)));
    });
    let l = &opts.limits;
    let limits = Limits::with_sources(l.max, crate::limits::IDLE, l.per_source, l.nodes.iter().copied());
    let listener = crate::limits::listener(opts.listen, l.max).with_context(|| format!("cannot listen on {}", opts.listen))?;
    let server = axum_server::from_tcp(listener)?.handle(handle.clone());
    let (cert_pem, key_pem, ca) = match &opts.tls {
        Tls::Plain => {
            let mut server = server
                .acceptor(Admit::new(axum_server::accept::DefaultAcceptor, limits))
                .http1_only();
            crate::limits::http1_timeouts(&mut server);
            let fut = tokio::spawn(async move { server.serve(app.into_make_service()).await });
            handle.listening().await.context(format!("cannot listen on {}", opts.listen))?;
            ready(&served, None);
            return Ok(fut.await??);
        }
        Tls::Files { cert, key } => (fs_err::read(cert)?, fs_err::read(key)?, None),
        Tls::Issued { pki_dir, names } => {
            let ca = crate::pki::ensure_ca(pki_dir, "kubexm registry CA")?;
            let s = crate::pki::server_cert(&ca, names)?;
            (s.cert_pem.into_bytes(), s.key_pem.into_bytes(), Some(ca.cert))
        }
    };
    let config = tls_config(&cert_pem, &key_pem, opts.client_ca.as_deref())?;
    let tls = axum_server::tls_rustls::RustlsAcceptor::new(axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config)))
        .handshake_timeout(std::time::Duration::from_secs(10));
    // HTTP/1.1 only (set after the acceptor, which resets it): over h2 one
    // connection carries 200 streams, each with a file open, past the cap,
    // the per-source limit and LimitNOFILE, and hyper's request-head timeout
    // covers HTTP/1 only. containerd, curl and wget all speak HTTP/1.1.
    let mut server = server.acceptor(Admit::new(tls, limits)).http1_only();
    crate::limits::http1_timeouts(&mut server);
    let fut = tokio::spawn(async move { server.serve(app.into_make_service()).await });
    handle
        .listening()
        .await
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    ready(&served, ca.as_deref());
    Ok(fut.await??)
}
