//! The API server's TLS: a CA kept in its TLS directory (generated on first
//! start, or the operator's own `ca.crt` and `ca.key` put there before), a
//! server certificate it signs for the names the server is reached by, and
//! client certificates it signs for people and automation. A client may
//! present a certificate: one signed by this CA authenticates it; one signed
//! by any other CA fails the handshake. A client without one must send a
//! bearer token.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Extension;
use axum_server::accept::Accept;
use axum_server::tls_rustls::RustlsAcceptor;
use futures_util::future::BoxFuture;
use kubexm_installer::pki::{self, PkiError, Usage};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tower_layer::Layer;

use crate::jobdb::Scope;
use kubexm_installer::limits::{Guarded, Limits};

/// Where the API server keeps its CA and certificate unless told otherwise.
pub const TLS_DIR: &str = "/var/lib/kubexm/api";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error("{path}: {why}")]
    Bad { path: String, why: String },
}

/// The server's CA, its certificate and key, PEM.
pub struct ServerTls {
    pub ca_cert: PathBuf,
    pub config: rustls::ServerConfig,
}

fn bad(path: &Path, why: impl ToString) -> TlsError {
    TlsError::Bad {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The CA of `dir`, made on first use.
pub fn ca(dir: &Path) -> Result<pki::Ca, TlsError> {
    Ok(pki::ensure_ca(dir, "kubexm API CA")?)
}

/// The TLS configuration for `names` (DNS names and addresses clients use),
/// the CA and server certificate made or reused in `dir` (valid ten years;
/// issued anew at a start within 30 days of its end).
pub fn server(dir: &Path, names: &[String]) -> Result<ServerTls, TlsError> {
    let ca = ca(dir)?;
    let soon = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
        + 30 * 86_400;
    pki::mark_due(dir, soon)?;
    let ten_years = pki::Leaf { days: 3650 };
    let cert = pki::ensure_cert(&ca, dir, "server", "kubexm-api-server", names, Usage::Server, ten_years)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&dir.join("server.crt"), e))?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).map_err(|e| bad(&dir.join("server.key"), e))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca.cert).map_err(|e| bad(&ca.cert, e))? {
        roots.add(c.map_err(|e| bad(&ca.cert, e))?).map_err(|e| bad(&ca.cert, e))?;
    }
    let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| bad(&ca.cert, e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(dir, e))?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain, key)
        .map_err(|e| bad(&dir.join("server.crt"), e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(ServerTls { ca_cert: ca.cert, config })
}

/// A client certificate `<out>/<name>.crt` and `.key` signed by the CA in
/// `dir`, its scopes in its subject (`O=kubexm:<scope>,...`), valid for `days`;
/// returns the two paths.
pub fn client_cert(dir: &Path, name: &str, out: &Path, scopes: &[Scope], days: i64) -> Result<(PathBuf, PathBuf), TlsError> {
    if !kubexm_bom::net::is_dns_label(name) || matches!(name, "ca" | "server") {
        return Err(bad(
            out,
            format!("client name {name:?}: use 1 to 63 lowercase letters, digits and '-', other than ca and server"),
        ));
    }
    let same = |a: &Path, b: &Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b);
    if same(dir, out) {
        return Err(bad(
            out,
            "this is the server's TLS directory: write client certificates elsewhere (--out DIR)",
        ));
    }
    let ca = ca(dir)?;
    fs_err::create_dir_all(out).map_err(|e| bad(out, e))?;
    let orgs = vec![format!("kubexm:{}", Scope::join(scopes))];
    pki::client_cert(&ca, out, name, name, &orgs, days)?;
    Ok((out.join(format!("{name}.crt")), out.join(format!("{name}.key"))))
}

/// Who a client certificate names: its `CN`, its scopes (`O=kubexm:read,create`)
/// and its sha256 (what a revocation lists).
#[derive(Debug, Clone)]
pub struct CertIdentity {
    pub name: String,
    pub scopes: Vec<Scope>,
    pub fingerprint: String,
}

impl CertIdentity {
    /// The identity in a DER certificate, if it parses.
    pub fn of(der: &[u8]) -> Option<CertIdentity> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let name = subject.iter_common_name().next()?.as_str().ok()?.to_string();
        let scopes = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok()?.strip_prefix("kubexm:").map(str::to_string))
            .collect::<Vec<_>>()
            .join(",");
        Some(CertIdentity {
            name,
            scopes: Scope::parse_list(&scopes).unwrap_or_default(),
            fingerprint: kubexm_bundle::digest::sha256_hex(der),
        })
    }

    /// The identity of a PEM certificate file (for `kubexm client-cert revoke`).
    pub fn of_pem_file(path: &Path) -> Result<CertIdentity, TlsError> {
        let der = CertificateDer::from_pem_file(path).map_err(|e| bad(path, e))?;
        CertIdentity::of(&der).ok_or_else(|| bad(path, "not a client certificate with a common name"))
    }
}

/// Set on a request whose connection presented a certificate this server's
/// CA signed (the handshake refuses any other): who it names.
#[derive(Debug, Clone)]
pub struct ClientCertificate(pub Option<CertIdentity>);

/// The TLS acceptor, marking each connection's requests with whether the
/// client authenticated with a certificate.
/// Each connection is first admitted under the server's [`Limits`] (the
/// cap, the idle timeout), then handshaken (10 s at most).
#[derive(Clone)]
pub struct Acceptor {
    inner: RustlsAcceptor,
    limits: Arc<Limits>,
}

impl Acceptor {
    pub fn new(config: rustls::ServerConfig, limits: Arc<Limits>) -> Acceptor {
        Acceptor {
            inner: RustlsAcceptor::new(axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config)))
                .handshake_timeout(std::time::Duration::from_secs(10)),
            limits,
        }
    }
}

impl<I, S> Accept<I, S> for Acceptor
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Send + 'static,
{
    type Stream = TlsStream<Guarded<I>>;
    type Service = axum::middleware::AddExtension<S, ClientCertificate>;
    type Future = BoxFuture<'static, std::io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let inner = self.inner.clone();
        let admitted = self.limits.admit(stream);
        Box::pin(async move {
            let (stream, service) = inner.accept(admitted?, service).await?;
            let presented = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| CertIdentity::of(c.as_ref()));
            Ok((stream, Extension(ClientCertificate(presented)).layer(service)))
        })
    }
}
