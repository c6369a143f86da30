//! The Kubernetes CA, its discovery pin and the join credentials (bootstrap
//! token, certificate key), kept in the installer's PKI directory
//! (`<root>/pki/kubernetes`, 0600); placeholders in a dry run. Made once per
//! run into the [`crate::context::Context`], which the kubeadm phases read.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::pki;

/// The bootstrap token and certificate key are reused this long, then renewed
/// (kubeadm deletes uploaded certificates after two hours).
const CREDENTIALS_FOR_SECS: u64 = 100 * 60;

/// The join credentials, kept in `<root>/clusters/<name>/pki/kubernetes/join.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinCredentials {
    pub token: String,
    pub certificate_key: String,
    pub created: u64,
}

impl JoinCredentials {
    pub fn token_id(&self) -> &str {
        self.token.split('.').next().unwrap_or_default()
    }
}

/// `n` bytes from the kernel's random source.
pub fn random_bytes(n: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut b = vec![0u8; n];
    fs_err::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

/// `len` characters of `[a-z0-9]`, unbiased (rejection sampling).
fn token_part(len: usize) -> std::io::Result<String> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::new();
    while out.len() < len {
        for b in random_bytes(64)? {
            if b < 252 && out.len() < len {
                out.push(ALPHABET[(b % 36) as usize] as char);
            }
        }
    }
    Ok(out)
}

/// The credentials kept in `dir` while they are young enough to reuse;
/// reads only (a dry run's plan names the step a real run would).
pub fn fresh_credentials(dir: &Path) -> Option<JoinCredentials> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    let text = fs_err::read_to_string(dir.join("join.json")).ok()?;
    serde_json::from_str::<JoinCredentials>(&text)
        .ok()
        .filter(|c| now.saturating_sub(c.created) < CREDENTIALS_FOR_SECS)
}

/// The credentials in `dir`, made or renewed when missing or older than the
/// certificate key's life.
pub fn ensure_credentials(dir: &Path) -> anyhow::Result<JoinCredentials> {
    let path = dir.join("join.json");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    if let Some(c) = fresh_credentials(dir) {
        return Ok(c);
    }
    let c = JoinCredentials {
        token: format!("{}.{}", token_part(6)?, token_part(16)?),
        certificate_key: hex::encode(random_bytes(32)?),
        created: now,
    };
    fs_err::create_dir_all(dir)?;
    pki::write_private(&path, serde_json::to_string(&c)?.as_bytes())?;
    Ok(c)
}

/// The Kubernetes CA, its discovery pin and the join credentials, all kept
/// in `<root>/pki/kubernetes`; made once per run and shared by the phases.
pub struct KubePki {
    pub ca: pki::CaPem,
    /// sha256 of the CA's SubjectPublicKeyInfo (kubeadm's `caCertHashes`).
    pub ca_hash: String,
    pub creds: JoinCredentials,
}

impl KubePki {
    /// Made in `<root>/clusters/<name>/pki/kubernetes` on first use; placeholders in a dry run.
    pub fn ensure(pki: &pki::Pki) -> anyhow::Result<KubePki> {
        let ca = pki.ca("kubernetes", "kubernetes")?;
        let creds = match pki.dir("kubernetes") {
            Some(dir) => ensure_credentials(&dir)?,
            None => JoinCredentials {
                token: format!("{g}.{g}", g = pki::GENERATED),
                certificate_key: pki::GENERATED.into(),
                created: 0,
            },
        };
        Ok(KubePki {
            ca_hash: pki.spki_sha256(&ca)?,
            creds,
            ca,
        })
    }
}
