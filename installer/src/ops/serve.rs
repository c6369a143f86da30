//! `serve`: an unpacked bundle as an OCI registry and a file server, over
//! TLS with given files or a certificate the installer's CA issues now.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::ops::error::{OpError, op};

use crate::serve::{ConnectionLimits, Parts, ServeOptions, Served, Tls};

#[derive(Debug, Clone)]
pub struct ServeRequest {
    pub bundle_dir: PathBuf,
    /// Older bundles served below it, newest first.
    pub older: Vec<PathBuf>,
    pub listen: SocketAddr,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Names and addresses nodes reach the server by (an issued certificate's).
    pub tls_sans: Vec<String>,
    /// The installer's CA, which issues the certificate.
    pub pki_dir: PathBuf,
    pub plain_http: bool,
    pub parts: Parts,
    pub limits: ConnectionLimits,
    /// Require client certificates signed by this CA.
    pub client_ca: Option<PathBuf>,
}

/// How the server speaks: plain, given files, or issued for the names nodes use.
fn tls(r: &ServeRequest) -> anyhow::Result<Tls> {
    if r.plain_http && r.client_ca.is_some() {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("--client-ca needs TLS: client certificates are checked in the TLS handshake; drop --plain-http"),
        ));
    }
    Ok(match (r.plain_http, &r.tls_cert, &r.tls_key) {
        (true, _, _) => Tls::Plain,
        (false, Some(cert), Some(key)) => Tls::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => {
            let mut names = r.tls_sans.clone();
            if !r.listen.ip().is_unspecified() {
                names.insert(0, r.listen.ip().to_string());
            }
            if names.is_empty() {
                return Err(op(
                    OpError::Usage,
                    anyhow::anyhow!(
                        "listening on {}: pass --tls-san with the address or name nodes use to reach this registry",
                        r.listen
                    ),
                ));
            }
            Tls::Issued {
                pki_dir: r.pki_dir.clone(),
                names,
            }
        }
    })
}

/// Serves until the process ends; `ready` is called once listening, with
/// the CA nodes must trust (when one issued the certificate).
pub fn serve(r: ServeRequest, ready: impl FnOnce(&Served, Option<&Path>)) -> anyhow::Result<()> {
    let opts = ServeOptions {
        tls: tls(&r)?,
        bundle_dir: r.bundle_dir,
        older: r.older,
        listen: r.listen,
        parts: r.parts,
        limits: r.limits,
        client_ca: r.client_ca,
    };
    tokio::runtime::Runtime::new()?.block_on(crate::serve::run(opts, ready))
}
